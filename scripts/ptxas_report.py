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


def loop_report(sass: str, top: int = 8) -> str:
    """The longest loop of an nvdisasm listing (the span from a label to the last branch
    back to it): its instruction count and most frequent opcodes, predicates and modifiers
    dropped. Counting a kernel's steady-state loop on the CPU says what a change costs per
    step before any device time is spent (FFMA against PRMT / IMAD / BAR, say)."""
    labels, ops = {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ops)
            continue
        instr = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if instr:
            ops.append(instr.group(1))
    best = None
    for end, text in enumerate(ops):
        target = re.search(r"\bBRA\b.*?\.?(L_x_\d+)", text)
        if target and labels.get(target.group(1), end + 1) <= end:
            start = labels[target.group(1)]
            if best is None or end - start > best[1] - best[0]:
                best = (start, end)
    if best is None:
        return "loop: none found"
    body = ops[best[0]:best[1] + 1]
    counts: dict[str, int] = {}
    for text in body:
        opcode = re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0].split(".")[0]
        counts[opcode] = counts.get(opcode, 0) + 1
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return f"loop {len(body)} instructions: " + ", ".join(f"{op} {n}" for op, n in common)
