"""On / off switches and choices read from the environment (``TILESPARSE_*``): one spelling rule for all
of them, and an error naming the variable for a value it does not know (a typo would otherwise leave the
setting at its default without a word)."""

from __future__ import annotations

import os

__all__ = ["ON", "OFF", "choice", "normalized", "switch"]

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def normalized(name: str) -> str | None:
    """The variable's value lower-cased without surrounding spaces; None when unset or blank."""
    return os.environ.get(name, "").strip().lower() or None


def switch(name: str, default: bool) -> bool:
    """The environment variable ``name`` as a bool: ``default`` when unset or blank, True for
    1 / on / true / yes, False for 0 / off / false / no (any case, spaces ignored); anything else
    raises ValueError naming ``name``."""
    value = normalized(name)
    if value is None:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"{name} must be one of {' / '.join(ON)} (on) or {' / '.join(OFF)} (off), "
                     f"got {os.environ[name]!r}")


def choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    """The environment variable ``name`` as one of ``allowed`` (lower-cased, spaces ignored): ``default``
    when unset or blank; anything else raises ValueError naming ``name``."""
    value = normalized(name)
    if value is None:
        return default
    if value not in allowed:
        raise ValueError(f"{name} must be one of {' / '.join(allowed)}, got {os.environ[name]!r}")
    return value
