"""Layout generators: each returns a :class:`tilesparse.BlockLayout`, seeded and
reproducible where random, for square and non-square matrices.

- ``random``, ``balanced``: uniformly random blocks (``balanced``: the same count per block-row).
- ``from_dense``: the blocks of a dense weight with the largest L2 norm.
- ``small_world``, ``barabasi_albert``: networkx Watts-Strogatz and Barabasi-Albert graphs.
- ``banded``, ``block_diagonal``: blocks within a bandwidth of the (stretched) diagonal.
- ``plot``: draw a layout's mask with matplotlib.

Non-square grids: the structured and graph layouts read the grid as a graph on
``max(block_rows, block_cols)`` nodes stretched onto it; see :mod:`._grid`.
"""

from .bands import banded, block_diagonal
from .graph import barabasi_albert, small_world
from .magnitude import from_dense
from .plotting import plot
from .uniform import balanced, random

__all__ = ["random", "balanced", "from_dense", "small_world", "barabasi_albert", "banded", "block_diagonal", "plot"]
