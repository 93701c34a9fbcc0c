"""Shared by the LSTM tests: a float64 BlockSparseLSTM on a random or small-world layout; a compiled
module's training steps against the eager one's."""

import torch

from tilesparse import BlockSparseLSTM, layouts
from tolerances import REL_TOL, rel_error

F64 = torch.float64


def build_lstm(input_size, hidden_size, block_size, *, layout_kind="random", sparse_input=False, **kwargs):
    H = hidden_size
    if layout_kind == "small_world":
        # (0.5: on the small grids here, 8 x 2 blocks, density 0.3 comes closest to an empty layout, refused)
        layout = layouts.small_world(4 * H, H, block_size, density=0.5, rewire_p=0.2, seed=3)
        return BlockSparseLSTM(input_size, H, block_size=block_size, layout=layout, sparse_input=sparse_input,
                               input_density=0.5 if sparse_input else None, dtype=F64, **kwargs)
    return BlockSparseLSTM(input_size, H, block_size=block_size, density=0.4, sparse_input=sparse_input,
                           dtype=F64, **kwargs)


def check_training_steps_match(eager, compiled_model, compiled, input_shape, steps=4, dtype=torch.bfloat16):
    """``steps`` training steps of ``eager`` and ``compiled`` (a compiled ``compiled_model``, a copy of
    ``eager``) on the same fresh inputs: outputs and every parameter's gradient within ``dtype``'s
    tolerance at each step."""
    device = next(eager.parameters()).device
    for step in range(steps):
        x = torch.randn(*input_shape, device=device, dtype=dtype)
        for m in (eager, compiled_model):
            m.zero_grad(set_to_none=True)
        out_e, _ = eager(x)
        out_c, _ = compiled(x)
        out_e.float().square().sum().backward()
        out_c.float().square().sum().backward()
        assert rel_error(out_c, out_e) <= REL_TOL[dtype], f"step {step}"
        for (name, p_e), (_, p_c) in zip(eager.named_parameters(), compiled_model.named_parameters()):
            assert rel_error(p_c.grad, p_e.grad) <= REL_TOL[dtype], f"step {step}: {name}"
