"""Shared by the LSTM tests: a float64 BlockSparseLSTM on a random or small-world layout."""

import torch

from tilesparse import BlockSparseLSTM, layouts

F64 = torch.float64


def build_lstm(input_size, hidden_size, block_size, *, layout_kind="random", sparse_input=False, **kwargs):
    H = hidden_size
    if layout_kind == "small_world":
        layout = layouts.small_world(4 * H, H, block_size, density=0.3, rewire_p=0.2, seed=3)
        return BlockSparseLSTM(input_size, H, block_size=block_size, layout=layout, sparse_input=sparse_input,
                               input_density=0.5 if sparse_input else None, dtype=F64, **kwargs)
    return BlockSparseLSTM(input_size, H, block_size=block_size, density=0.4, sparse_input=sparse_input,
                           dtype=F64, **kwargs)
