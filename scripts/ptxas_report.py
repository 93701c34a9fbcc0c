"""Reading ptxas -v reports (the compile check's ``--spills``): plain text in, numbers out,
so it is testable without a GPU or the compile check's environment."""

from __future__ import annotations

import re


def spill_report(log: str) -> str:
    """ptxas -v's last 'stack frame, spill stores, spill loads' line, shortened: the kernel's
    own summary (a warp-specialized kernel's partitions are all in that one function;
    ptxas lists called functions before it)."""
    lines = [line for line in log.splitlines() if "spill stores" in line]
    if not lines:
        return "spills: no report"
    frame, stores, loads = (int(n) for n in re.findall(r"(\d+) bytes", lines[-1])[:3])
    return f"stack {frame} B, spill stores {stores} B, spill loads {loads} B"
