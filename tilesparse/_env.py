"""On / off switches and choices read from the environment (``TILESPARSE_*``): one spelling rule for all
of them, and an error naming the variable for a value it does not know (a typo would otherwise leave the
setting at its default without a word)."""

from __future__ import annotations

import os

__all__ = ["ON", "OFF", "choice", "switch"]

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def switch(name: str, default: bool) -> bool:
    """The environment variable ``name`` as a bool: ``default`` when unset or blank, True for
    1 / on / true / yes, False for 0 / off / false / no (any case, spaces ignored); anything else
    raises ValueError naming ``name``."""
    setting = os.environ.get(name)
    if setting is None or not setting.strip():
        return default
    value = setting.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"{name} must be one of {' / '.join(ON)} (on) or {' / '.join(OFF)} (off), got {setting!r}")


def choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    """The environment variable ``name`` as one of ``allowed`` (lower-cased, spaces ignored): ``default``
    when unset or blank; anything else raises ValueError naming ``name``."""
    setting = os.environ.get(name)
    if setting is None or not setting.strip():
        return default
    value = setting.strip().lower()
    if value not in allowed:
        raise ValueError(f"{name} must be one of {' / '.join(allowed)}, got {setting!r}")
    return value
