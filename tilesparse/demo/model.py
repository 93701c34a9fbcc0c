"""A small byte-level GPT whose MLPs are dense or block-sparse.

At equal parameter count the sparse variant keeps the model width and attention, and
widens each MLP's hidden layer by 1 / density, so its stored (nonzero) MLP weights
match the dense model's: the paper's "wider but sparse" at the MLPs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import BlockSparseLinear


def sparse_hidden(dense_hidden: int, density: float, block_size: int) -> int:
    """Hidden width whose ``density`` fraction equals ``dense_hidden``, in whole blocks."""
    return max(block_size, round(dense_hidden / density / block_size) * block_size)


class MLP(nn.Module):
    """up -> GELU -> down; dense, block-sparse (``density`` of ``block_size`` blocks), or
    2:4 (``semi24``: SemiSparseLinear options, e.g. transposable masks recomputed every
    few steps)."""

    def __init__(self, d_model: int, hidden: int, *, block_size: int | None, density: float | None, seed: int,
                 semi24: dict | None = None):
        super().__init__()
        if semi24 is not None:
            from ..semi24 import SemiSparseLinear

            self.up = SemiSparseLinear(d_model, hidden, **semi24)
            self.down = SemiSparseLinear(hidden, d_model, **semi24)
        elif density is None:
            self.up, self.down = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)
        else:
            self.up = BlockSparseLinear(d_model, hidden, block_size=block_size, density=density, seed=seed)
            self.down = BlockSparseLinear(hidden, d_model, block_size=block_size, density=density, seed=seed + 1)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mlp: MLP, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.drop = nn.Dropout(dropout)  # on each residual branch
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = mlp

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.drop(self.proj(attn.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class ByteGPT(nn.Module):
    """Next-byte model over 256 symbols with learned positions and a tied output layer.
    ``dropout`` (embeddings and residual branches) keeps a small corpus from being
    memorised over several epochs."""

    def __init__(self, *, d_model: int, n_layers: int, n_heads: int, context: int, mlp_hidden: int,
                 block_size: int | None = None, density: float | None = None, seed: int = 0, dropout: float = 0.0,
                 semi24: dict | None = None):
        super().__init__()
        self.embed = nn.Embedding(256, d_model)
        self.drop = nn.Dropout(dropout)
        self.pos = nn.Parameter(torch.zeros(context, d_model))
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, MLP(d_model, mlp_hidden, block_size=block_size, density=density, seed=seed + 2 * i,
                                        semi24=semi24), dropout)
            for i in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, idx):
        x = self.drop(self.embed(idx) + self.pos[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.embed.weight.t()


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(dense-equivalent parameters, nonzero parameters). A block-sparse layer stores only
    its blocks; its dense equivalent is in_features x out_features. A 2:4 layer counts
    half its weight as nonzero."""
    from ..semi24 import SemiSparseLinear

    stored = sum(p.numel() for p in model.parameters())
    dense_equivalent = stored
    for module in model.modules():
        if isinstance(module, BlockSparseLinear):
            dense_equivalent += module.in_features * module.out_features - module.weight.numel()
        elif isinstance(module, SemiSparseLinear) and not module.densified:
            stored -= module.weight.numel() // 2  # half of a 2:4 weight is kept (W is held dense for the STE)
    return dense_equivalent, stored


class ByteLSTM(nn.Module):
    """The paper's model: bytes -> embedding -> LSTM -> next-byte logits. With ``density``
    set, the recurrent weight W_hh is block-sparse (small-world layout, as the paper's best
    runs used), so the model can be wider at the same stored parameters. The input weight
    W_ih [4H, embed] stays dense: it is thin (embed 64 is one block column at b = 64), and
    a block-sparse one would cut whole gate blocks off the input (the H200 run of
    2026-11-29 with a sparse W_ih at density 0.25 left 3/4 of the gates without input and
    lost to dense by 0.09 bits/byte)."""

    def __init__(self, *, embed: int, hidden: int, block_size: int | None = None, density: float | None = None,
                 seed: int = 0):
        super().__init__()
        from .. import layouts
        from ..nn import BlockSparseLSTM

        self.embed = nn.Embedding(256, embed)
        if density is None:
            self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        else:
            recurrent = layouts.small_world(4 * hidden, hidden, block_size, density=density, seed=seed, diagonal=True)
            self.lstm = BlockSparseLSTM(embed, hidden, block_size=block_size, layout=recurrent, batch_first=True,
                                        seed=seed)
        self.head = nn.Linear(hidden, 256)

    def forward(self, idx):
        out, _ = self.lstm(self.embed(idx))
        return self.head(out)


def lstm_sparse_hidden(embed: int, dense_hidden: int, density: float, block_size: int) -> int:
    """The hidden width (whole blocks) whose block-sparse LSTM + head stores about as many
    parameters as a dense LSTM of ``dense_hidden``."""

    def stored(hidden: int, d: float) -> float:  # W_ih (dense), W_hh (density d), bias, head
        return 4 * hidden * embed + 4 * hidden * hidden * d + 4 * hidden + 257 * hidden

    target = stored(dense_hidden, 1.0) + 4 * dense_hidden  # nn.LSTM has two bias vectors
    candidates = range(block_size, 64 * dense_hidden, block_size)
    return min(candidates, key=lambda h: abs(stored(h, density) - target))
