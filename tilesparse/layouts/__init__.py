"""Layout generators: each returns a :class:`tilesparse.BlockLayout`, seeded and reproducible."""

from .magnitude import from_dense
from .uniform import balanced, random

__all__ = ["random", "balanced", "from_dense"]
