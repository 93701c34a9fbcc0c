"""Fingerprints of the sm_90 PTX of the compile check's cases, for refactors of kernel code
that must not change what runs: compile before and after, compare.

A fingerprint is a hash of the PTX without its debug information (``.loc`` lines,
comments, the ``.file`` / DWARF sections and the inlined-scope labels ``$L__tmpN``), which
move with line numbers and helper functions but do not change an instruction.

    python scripts/sm90_ptx_fingerprints.py --out before.json [--match "ws attention"]
    (edit)
    python scripts/sm90_ptx_fingerprints.py --out after.json --compare before.json   # exits 1 on a difference

Compiling needs TRITON_INTERPRET unset (as the compile check does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys

_LABEL = re.compile(r"\$L__tmp\d+")


def fingerprint(ptx: str) -> str:
    """The hash of ``ptx``'s instructions and declarations, debug information left out."""
    code = ptx.split("\t.file")[0]
    lines = (_LABEL.sub("$L__tmp", line.split("//")[0]) for line in code.splitlines()
             if not line.strip().startswith((".loc", "//")) and not _LABEL.fullmatch(line.strip().rstrip(":")))
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def cases():
    """Every case of the compile check, in its order (the FMA and LSTM cell kernels' too, which an
    older copy of the list here left out)."""
    from sm90_cases import all_cases  # this folder's (refuses to load under TRITON_INTERPRET)

    yield from all_cases(quick=False)


def main() -> int:
    import triton
    from sm90_cases import TARGET
    from triton.compiler import ASTSource

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON: label -> fingerprint")
    parser.add_argument("--match", default=None, help="only the cases whose label matches this regular expression")
    parser.add_argument("--compare", default=None, help="an earlier --out to compare with")
    args = parser.parse_args()
    prints = {}
    for label, fn, signature, constexprs, warps, stages, *extra in cases():
        if args.match and not re.search(args.match, label):
            continue
        source = (extra[1] if len(extra) > 1 else ASTSource)(fn=fn, signature=signature, constexprs=constexprs,
                                                              attrs=extra[0] if extra else None)
        compiled = triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": stages})
        prints[label] = fingerprint(compiled.asm["ptx"])
    with open(args.out, "w") as f:
        json.dump(prints, f, indent=1)
    print(f"{len(prints)} case(s) -> {args.out}")
    if args.compare is None:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    changed = sorted(label for label in prints.keys() & before.keys() if prints[label] != before[label])
    for label in changed:
        print(f"changed  {label}")
    for label in sorted(before.keys() ^ prints.keys()):
        print(f"only in {'before' if label in before else 'after'}  {label}")
    print(f"{len(changed)} of {len(prints.keys() & before.keys())} compared case(s) changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
