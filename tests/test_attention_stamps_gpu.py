"""The dK/dV kernel's per-program time stamps (``launch_dkdv_ws(stamps=...)``, a probe's:
``scripts/probes/attention_dkdv_timeline.py``) on CUDA: every program writes its row, the
times in order, and the gradients are the bits of the launch without stamps. Marked
``gpu``; skipped on GPUs other than sm90."""

import pytest
import torch

from attention_cases import make_inputs
from tilesparse.attention import layouts
from tilesparse.attention.layout import attention_table_views
from tilesparse.kernels import attention as kernels
from tilesparse.kernels import attention_ws
from tilesparse.kernels._stamps import STAMP_COLUMNS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
    reason="the Gluon kernel is written for sm90")]


@pytest.mark.parametrize("mode", ["deterministic", "atomic", "ordered"])
def test_stamps_fill_every_program_and_leave_the_gradients(mode):
    S, D, block = 2000, 128, 128
    layout = layouts.local(S, block, 512)
    q, k, v = make_inputs(2, 4, 2, S, D, torch.bfloat16, device="cuda")
    dout = torch.randn_like(q)
    nb, lh = -(-S // block), layout.layout_heads
    meta = layout.meta_on(q.device, False)
    out, lse = kernels.attention_forward(q, k, v, meta, None, lh, block, False, D ** -0.5)
    delta = (out.float() * dout.float()).sum(-1)
    _, col_ptr, _, col_rows = attention_table_views(meta, lh, nb)
    cfg = {"deterministic": attention_ws.default_config("dkdv", q, k, v, dout, block, lh),
           "atomic": attention_ws.default_config("dkdv", q, k, v, dout, block, lh, deterministic=False),
           "ordered": attention_ws.ordered_default(q, k, v, dout, block, meta, lh, nb)}[mode]
    assert cfg is not None
    programs = nb * 2 * 2  # key blocks x (batch * kv head)
    stamps = torch.zeros(programs, STAMP_COLUMNS, dtype=torch.int64, device="cuda")

    def run(with_stamps):
        dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device="cuda") if cfg.atomic_dq else None
        attention_ws.launch_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, None, col_ptr, col_rows, nb, lh, block,
                                    False, False, D ** -0.5, cfg, dq_acc=dq_acc, meta=meta,
                                    stamps=stamps if with_stamps else None)
        return dk, dv, dq_acc

    want, got = run(False), run(True)
    torch.cuda.synchronize()
    if mode != "atomic":  # (the atomic adds land in any order: dQ's bits vary)
        assert all(a is None and b is None or torch.equal(a, b) for a, b in zip(got, want))
    else:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    sm, t0, t1, t2, t3 = (stamps[:, i] for i in range(5))
    assert bool((sm >= 0).all()) and int(sm.max()) < torch.cuda.get_device_properties(0).multi_processor_count
    assert bool((t0 > 0).all()) and bool((t0 <= t1).all()) and bool((t1 <= t2).all()) and bool((t2 <= t3).all())
    assert bool((stamps[:, 5:] == 0).all())  # (columns the kernel does not write)
