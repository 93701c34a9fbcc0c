"""On / off switches and choices read from the environment (``TILESPARSE_*``): one spelling rule for all
of them, and an error naming the variable for a value it does not know (a typo would otherwise leave the
setting at its default without a word)."""

from __future__ import annotations

import os

__all__ = ["ON", "OFF", "choice", "normalized", "switch"]

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def _raw(name: str) -> str | None:
    """``os.environ.get(name)``, without its cost for an unset variable (~1 µs: ``Mapping.get`` catches a
    KeyError), which is what most switches are: read the mapping's own store by its encoded key, the
    lookup ``os.environ[name]`` itself makes. Some switches are read on every eager call."""
    environ = os.environ
    store = getattr(environ, "_data", None)
    encode, decode = getattr(environ, "encodekey", None), getattr(environ, "decodevalue", None)
    if store is None or encode is None or decode is None:  # not CPython's os._Environ
        return environ.get(name)
    value = store.get(encode(name))
    return None if value is None else decode(value)


def normalized(name: str) -> str | None:
    """The variable's value lower-cased without surrounding spaces; None when unset or blank."""
    value = _raw(name)
    return value.strip().lower() or None if value else None


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
