"""The demo's text: by default the CPython standard library's own sources (no download),
or any file given with --data."""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Corpus:
    train: torch.Tensor  # uint8 bytes
    val: torch.Tensor
    description: str


def stdlib_bytes(limit: int | None) -> tuple[bytes, str]:
    """The .py files under the running interpreter's stdlib, concatenated in sorted path
    order (so the corpus is fixed for a given Python version), up to ``limit`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if limit is not None and total >= limit:
            break
    text = b"".join(chunks)[:limit]
    return text, f"CPython {sysconfig.get_python_version()} stdlib sources ({root}), {len(text)} bytes"


def load(data: str | None, limit: int | None, val_fraction: float = 0.1) -> Corpus:
    """Bytes of ``data`` (a file path) or of the stdlib, split into train and validation
    (the last ``val_fraction`` of the bytes)."""
    if data is None:
        raw, description = stdlib_bytes(limit)
    else:
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"--data {data!r} is not a file")
        raw = path.read_bytes()[:limit]
        description = f"{path} ({len(raw)} bytes)"
    if len(raw) < 10_000:
        raise ValueError(f"the corpus has only {len(raw)} bytes; the demo needs at least 10000")
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    split = int(len(tokens) * (1 - val_fraction))
    return Corpus(tokens[:split].clone(), tokens[split:].clone(), description)


def batch(tokens: torch.Tensor, batch_size: int, context: int, generator: torch.Generator, device) -> tuple:
    """Random windows: inputs [B, T] and next-byte targets [B, T], as int64 on ``device``."""
    starts = torch.randint(0, len(tokens) - context - 1, (batch_size,), generator=generator)
    offsets = torch.arange(context + 1)
    windows = tokens[starts[:, None] + offsets].long().to(device)
    return windows[:, :-1], windows[:, 1:]
