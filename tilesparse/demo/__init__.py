"""`tilesparse demo`: the paper's claim on real text. At equal parameter count, does a
wider model with block-sparse weights model bytes better than a dense one?"""

from .run import run_demo

__all__ = ["run_demo"]
