"""Write docs/api.md: the API reference of every public name, from the docstrings.

    python scripts/gen_api_docs.py            # rewrite docs/api.md
    python scripts/gen_api_docs.py --check    # exit 1 if docs/api.md is out of date

tests/test_docs.py runs the check, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api.md"
# (module, heading): each module's __all__ is documented in this order.
MODULES = [
    ("tilesparse", "Top level"),
    ("tilesparse.layouts", "Layouts"),
    ("tilesparse.attention", "Block-sparse attention"),
    ("tilesparse.attention.layouts", "Attention layouts"),
    ("tilesparse.semi24", "2:4 semi-structured sparsity"),
    ("tilesparse.sparsity", "Sparsity recipes"),
    ("tilesparse.integrations.huggingface", "Hugging Face"),
    ("tilesparse.kernels.tuned", "Tuned launch configs"),
    ("tilesparse.ops.lstm_graphs", "The LSTM's time loops from CUDA graphs"),
    ("tilesparse.ops.linear_plans", "A linear layer's forwards without autograd, dispatched once"),
]
SKIP = {"attention", "layouts", "semi24", "sparsity", "__version__",  # submodules and constants documented elsewhere
        "GRAPHS", "PLANS"}  # (read from the environment: the guide's table of switches gives it)


def _signature(obj) -> str:
    """The signature, with default values that are functions named instead of printed
    with their memory address (so the file is the same on every run)."""
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def render(undocumented: list | None = None) -> str:
    """The reference as markdown; names without a docstring are appended to ``undocumented``."""
    undocumented = [] if undocumented is None else undocumented
    lines = ["# API reference", "",
             "Generated from the docstrings by `scripts/gen_api_docs.py` (checked by the tests).", ""]
    for module_name, heading in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## {heading} (`{module_name}`)", ""]
        for name in module.__all__:
            if name in SKIP:
                continue
            obj = getattr(module, name)
            if not callable(obj):  # a constant: its value (its meaning is in the module's docs)
                lines += [f"### `{name} = {obj!r}`", "", "*constant*", ""]
                continue
            kind = "class" if inspect.isclass(obj) else "function"
            if not _doc(obj):
                undocumented.append(f"{module_name}.{name}")
            lines += [f"### `{name}{_signature(obj)}`", "", f"*{kind}*", "", _doc(obj), ""]
            if inspect.isclass(obj):
                # its own members and those of its private bases (the public class is the interface)
                owners = [c for c in obj.__mro__ if c is obj or (c.__name__.startswith("_")
                                                                 and c.__module__.startswith("tilesparse"))]
                for member_name, member in inspect.getmembers(obj):
                    if member_name.startswith("_") or not any(member_name in c.__dict__ for c in owners):
                        continue
                    if not (inspect.isfunction(member) or isinstance(inspect.getattr_static(obj, member_name),
                                                                     (classmethod, staticmethod, property))):
                        continue
                    target = member.fget if isinstance(member, property) else member
                    signature = "" if isinstance(member, property) else _signature(target)
                    if not _doc(target):
                        undocumented.append(f"{module_name}.{name}.{member_name}")
                    lines += [f"#### `{name}.{member_name}{signature}`", "", _doc(target), ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    undocumented: list = []
    text = render(undocumented)
    if undocumented:
        print("public names without a docstring: " + ", ".join(undocumented), file=sys.stderr)
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/gen_api_docs.py", file=sys.stderr)
            return 1
        return 1 if undocumented else 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
