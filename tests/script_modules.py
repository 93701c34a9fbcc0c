"""Repository scripts and examples loaded as modules, for the tests of their functions
(they are files, not packages: ``scripts/probes/x.py`` cannot be imported by name)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """The module of the file at ``relative`` (to the repository root), executed once per call."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
