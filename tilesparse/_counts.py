"""The count check shared by the public entry points (sizes, block sizes, heads, windows), so
that a bad count reads the same wherever it is given. Its own module because ``layout``
uses it and ``_checks`` imports ``layout``."""

from __future__ import annotations

import numbers


def check_count(name: str, value, minimum: int = 0, *, or_none: bool = False) -> int:
    """``value`` as an int >= ``minimum``: numpy's integers are taken, bools and floats are
    not (``True`` or ``2.0`` would otherwise pass silently). A ValueError names ``name``;
    ``or_none`` only adds "or None" to the message, for arguments whose callers take None
    before checking."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ValueError(f"{name} must be {kind}{' or None' if or_none else ''}, got {value!r}")
    return int(value)
