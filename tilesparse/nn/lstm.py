"""BlockSparseLSTM: a one-layer LSTM whose recurrent weight W_hh is block-sparse.

The 2017 blocksparse paper's sparse RNNs (hidden sizes up to 18432 at ~97% sparsity)
spend nearly all their time in the recurrent product h_{t-1} W_hh^T, which cannot be
batched over time. The input product x_t W_ih^T can: it is done for all timesteps in
one large product before the time loop. The loop itself is one autograd Function
(:func:`tilesparse.ops.lstm.lstm_sequence`): a fused cell kernel per step, and in
backward a single weight-gradient product for W_hh over all timesteps, as the paper did.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from .. import layouts as layout_generators
from .._checks import check_flags, check_module_input
from .._counts import check_count
from ..layout import BlockLayout
from ..ops.bsmm import block_sparse_linear
from ..ops.lstm import lstm_sequence
from .linear import BlockSparseLinear

__all__ = ["BlockSparseLSTM"]


class BlockSparseLSTM(nn.Module):
    """One-layer, unidirectional LSTM with a block-sparse recurrent weight.

    Args:
        input_size, hidden_size: I and H. H (and I when ``sparse_input``) must be
            divisible by ``block_size``.
        block_size: side b of the square blocks.
        density: fraction of W_hh's blocks kept, laid out by ``layout_fn`` (default
            :func:`tilesparse.layouts.random`); or give
        layout: an explicit :class:`~tilesparse.BlockLayout` of shape (4H, H) for W_hh
            (any generator's, e.g. ``layouts.small_world(4 * H, H, b, density=0.03)``).
        layout_fn: ``layout_fn(rows, cols, block_size, density=..., seed=...)`` building a
            layout from ``density`` (``layouts.random``, ``balanced``, ``small_world``,
            ``barabasi_albert`` all fit).
        sparse_input: make W_ih [4H, I] block-sparse too (dense otherwise), with
            ``input_density`` (default: ``density``, via ``layout_fn`` with seed
            ``seed + 1``) or ``input_layout`` of shape (4H, I).
        bias: one bias [4H] (nn.LSTM's b_ih + b_hh, which are redundant), added in the
            input projection.
        batch_first: input and output are [B, T, *] instead of [T, B, *].
        seed: seeds the generated layouts (not the weights: those use the global RNG,
            like nn.LSTM).

    forward(x, (h0, c0)=None) -> (output, (h_n, c_n)) exactly like nn.LSTM with one layer:
    x [T, B, I] ([B, T, I] if batch_first, or unbatched [T, I]); h0, c0 [1, B, H] (or
    [1, H] unbatched; [B, H] is accepted too); output [T, B, H]; h_n, c_n [1, B, H].
    Under autocast everything (input projection, recurrence, states) runs in the autocast
    dtype, with fp32 math inside the cell; outputs and states come back in that dtype.
    The output is saved for backward (as cuDNN's LSTM saves it): modify a copy, not it.

    Parameters: ``hh.weight`` [nnz, b, b] (W_hh, a :class:`BlockSparseLinear` without bias,
    its layout saved in the state_dict as ``hh.layout_mask``), ``weight_ih`` [4H, I] or
    ``ih.weight`` [nnz_ih, b, b] (+ ``ih.layout_mask``) with ``sparse_input``, and ``bias``.

    Init follows nn.LSTM, uniform(-1/sqrt(H), 1/sqrt(H)), except that a block-sparse
    matrix uses each row's actual fan-in (stored blocks in its block-row times b) in place
    of H, as :class:`BlockSparseLinear` does, so a sparse row's pre-activation variance
    matches a dense one's. The dense W_ih and the bias use 1/sqrt(H) like nn.LSTM.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        block_size: int,
        density: float | None = None,
        layout: BlockLayout | None = None,
        layout_fn: Optional[Callable[..., BlockLayout]] = None,
        sparse_input: bool = False,
        input_density: float | None = None,
        input_layout: BlockLayout | None = None,
        bias: bool = True,
        batch_first: bool = False,
        seed: int = 0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        input_size = check_count("input_size", input_size, 1)
        hidden_size = check_count("hidden_size", hidden_size, 1)
        block_size = check_count("block_size", block_size, 1)
        check_flags(sparse_input=sparse_input, bias=bias, batch_first=batch_first)
        if hidden_size % block_size:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by block_size={block_size}")
        if sparse_input and input_size % block_size:
            raise ValueError(
                f"input_size={input_size} is not divisible by block_size={block_size} (needed with sparse_input=True)"
            )
        if not sparse_input and (input_density is not None or input_layout is not None):
            raise ValueError("input_density / input_layout need sparse_input=True")
        layout_fn = layout_generators.random if layout_fn is None else layout_fn
        H, I = hidden_size, input_size
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.block_size = block_size
        self.batch_first = batch_first
        self.sparse_input = sparse_input
        factory = {"device": device, "dtype": dtype}

        hh_layout = self._make_layout(
            "layout", layout, density, layout_fn, (4 * H, H), block_size, seed, "W_hh (4*hidden_size, hidden_size)"
        )
        self.hh = BlockSparseLinear(H, 4 * H, block_size=block_size, layout=hh_layout, bias=False, **factory)
        if sparse_input:
            if input_layout is None and input_density is None:
                input_density = density
            ih_layout = self._make_layout(
                "input_layout", input_layout, input_density, layout_fn, (4 * H, I), block_size, seed + 1,
                "W_ih (4*hidden_size, input_size)",
            )
            self.ih = BlockSparseLinear(I, 4 * H, block_size=block_size, layout=ih_layout, bias=False, **factory)
            self.register_parameter("weight_ih", None)
        else:
            self.ih = None
            self.weight_ih = nn.Parameter(torch.empty(4 * H, I, **factory))
        self.bias = nn.Parameter(torch.empty(4 * H, **factory)) if bias else None
        self.reset_parameters()

    @staticmethod
    def _make_layout(name, layout, density, layout_fn, shape, block_size, seed, what) -> BlockLayout:
        if layout is None:
            if density is None:
                raise ValueError(f"give either density or {name}")
            layout = layout_fn(shape[0], shape[1], block_size, density=density, seed=seed)
            if not isinstance(layout, BlockLayout):
                raise TypeError(f"layout_fn must return a tilesparse.BlockLayout, got {type(layout).__name__}")
        elif density is not None:
            raise ValueError(f"give density or {name}, not both")
        elif not isinstance(layout, BlockLayout):
            raise TypeError(f"{name} must be a tilesparse.BlockLayout, got {type(layout).__name__}")
        if layout.shape != shape:
            raise ValueError(f"{name} has shape {layout.shape} but {what} is {shape}")
        if layout.block_size != block_size:
            raise ValueError(f"{name} has block_size={layout.block_size} but block_size={block_size}")
        return layout

    def reset_parameters(self) -> None:
        """Re-draw the weights (nn.LSTM's uniform init, fan-in of each sparse row)."""
        self.hh.reset_parameters()  # per-row actual fan-in
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            if self.ih is not None:
                self.ih.reset_parameters()
            else:
                self.weight_ih.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    # ----------------------------------------------------------------- properties
    @property
    def layout(self) -> BlockLayout:
        """W_hh's layout, on the module's device."""
        return self.hh.layout

    @property
    def input_layout(self) -> BlockLayout | None:
        """W_ih's layout with sparse_input, else None."""
        return self.ih.layout if self.ih is not None else None

    # ----------------------------------------------------------------- forward
    def _input_projection(self, x: torch.Tensor) -> torch.Tensor:
        """x W_ih^T + bias for every timestep at once: one large product [T, B, 4H]."""
        if self.ih is not None:
            return block_sparse_linear(x, self.ih.weight, self.ih.layout, self.bias)  # autocasts like nn.Linear
        return F.linear(x, self.weight_ih, self.bias)

    def _check_state(self, t: torch.Tensor, name: str, batch: int, batched: bool) -> torch.Tensor:
        H = self.hidden_size
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if batched:
            if t.dim() == 3 and tuple(t.shape) == (1, batch, H):
                return t[0]
            if t.dim() == 2 and tuple(t.shape) == (batch, H):
                return t
            raise ValueError(f"{name} must have shape (1, {batch}, {H}) (or ({batch}, {H})), got {tuple(t.shape)}")
        if tuple(t.shape) == (1, H):
            return t
        if tuple(t.shape) == (H,):
            return t.unsqueeze(0)
        raise ValueError(f"{name} must have shape (1, {H}) for unbatched input, got {tuple(t.shape)}")

    def forward(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Like nn.LSTM.forward with one layer: (output, (h_n, c_n))."""
        check_module_input(x, "x", self.hh.weight, "BlockSparseLSTM")
        if x.dim() not in (2, 3):
            raise ValueError(f"x must be [T, B, I], [B, T, I] (batch_first) or unbatched [T, I], got {tuple(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"x.shape[-1] is {x.shape[-1]} but input_size is {self.input_size}")
        batched = x.dim() == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        steps, batch = x.shape[0], x.shape[1]
        if steps == 0:
            raise ValueError("x has no timesteps (T = 0)")

        if hx is None:
            h = c = None
        else:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError("hx must be a pair (h0, c0)")
            h = self._check_state(hx[0], "h0", batch, batched)
            c = self._check_state(hx[1], "c0", batch, batched)

        gates_x = self._input_projection(x)  # [T, B, 4H]: all timesteps in one product
        # The recurrence as one autograd Function (tilesparse.ops.lstm): per step one
        # recurrent product and one fused cell launch; backward one bprop product per
        # step and ONE weight-gradient product over the whole sequence.
        output, h_n, c_n = lstm_sequence(gates_x, self.hh.weight, self.hh.layout, h, c)
        h_n, c_n = h_n.unsqueeze(0), c_n.unsqueeze(0)
        if not batched:
            return output.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (h_n, c_n)

    # ----------------------------------------------------------------- conversions
    def to_dense_lstm(self) -> nn.LSTM:
        """An equivalent torch.nn.LSTM with the dense (zero-filled) weights, copies (for
        testing and inspection). Its bias_ih holds the bias and its bias_hh is zero."""
        weight_hh = self.hh.to_dense()
        weight_ih = self.ih.to_dense() if self.ih is not None else self.weight_ih.detach()
        lstm = nn.LSTM(
            self.input_size,
            self.hidden_size,
            bias=self.bias is not None,
            batch_first=self.batch_first,
            device=weight_hh.device,
            dtype=weight_hh.dtype,
        )
        with torch.no_grad():
            lstm.weight_hh_l0.copy_(weight_hh)
            lstm.weight_ih_l0.copy_(weight_ih)
            if self.bias is not None:
                lstm.bias_ih_l0.copy_(self.bias.detach())
                lstm.bias_hh_l0.zero_()
        return lstm

    @classmethod
    def from_dense(
        cls,
        lstm: nn.LSTM,
        *,
        block_size: int,
        density: float,
        sparse_input: bool = False,
        input_density: float | None = None,
    ) -> "BlockSparseLSTM":
        """A BlockSparseLSTM pruned from a one-layer ``nn.LSTM``: W_hh keeps its ``density``
        fraction of blocks with the largest L2 norm (and W_ih too with ``sparse_input``, at
        ``input_density``, default ``density``); the kept blocks are copied, the two bias
        vectors summed. At density 1 the result computes what ``lstm`` computes."""
        if not isinstance(lstm, nn.LSTM):
            raise TypeError(f"lstm must be a torch.nn.LSTM, got {type(lstm).__name__}")
        if lstm.num_layers != 1 or lstm.bidirectional or lstm.proj_size:
            raise ValueError(f"only one-layer, unidirectional LSTMs without projections convert, got num_layers="
                             f"{lstm.num_layers}, bidirectional={lstm.bidirectional}, proj_size={lstm.proj_size}")
        weight_hh, weight_ih = lstm.weight_hh_l0.detach(), lstm.weight_ih_l0.detach()
        hh_layout = layout_generators.from_dense(weight_hh, block_size, density)
        kwargs = {}
        if sparse_input:
            ih_layout = layout_generators.from_dense(weight_ih, block_size,
                                                     density if input_density is None else input_density)
            kwargs = dict(sparse_input=True, input_layout=ih_layout)
        module = cls(lstm.input_size, lstm.hidden_size, block_size=block_size, layout=hh_layout, bias=lstm.bias,
                     batch_first=lstm.batch_first, device=weight_hh.device, dtype=weight_hh.dtype, **kwargs)
        with torch.no_grad():
            module.hh.weight.copy_(hh_layout.gather(weight_hh))
            if sparse_input:
                module.ih.weight.copy_(module.ih.layout.gather(weight_ih))
            else:
                module.weight_ih.copy_(weight_ih)
            if lstm.bias:
                module.bias.copy_(lstm.bias_ih_l0.detach() + lstm.bias_hh_l0.detach())
        return module

    def extra_repr(self) -> str:
        """Sizes, block size, densities and layout facts, for print(module)."""
        hh = self.hh._layout
        text = (
            f"{self.input_size}, {self.hidden_size}, block_size={self.block_size}, "
            f"density={hh.density:.3f}, nnz_blocks={hh.nnz}"
        )
        if self.ih is not None:
            text += f", sparse_input=True, input_density={self.ih._layout.density:.3f}"
        return text + f", bias={self.bias is not None}, batch_first={self.batch_first}"
