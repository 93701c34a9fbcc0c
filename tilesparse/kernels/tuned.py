"""Measured launch configs, looked up by problem: the cache that `tilesparse tune` fills.

The launchers use a heuristic config (``bsmm.dds_config`` / ``sdd_config``) unless a
measured one is known for the problem at hand. A measured config is keyed by

    (GPU, op, dtype, block size, M bucket, density bucket[, weight shape])

op: ``fprop`` (dds through the row table), ``bprop`` (dds through the column table),
``updat`` (sdd). dtype: bf16, fp16, and for float32 ``tf32`` or ``fp32`` after the
float32 matmul precision (the kernels differ); fp16 falls back to bf16's entries. M
bucket: the power of two at or above M (M is the activations' row count for dds, the
reduction length for sdd). Density bucket: one of 0.5, 0.25, 0.1,
0.05, 0.03, 0.01 (the nearest on a log scale). Weight shape (optional, ``w{N}x{K}`` of
the block-sparse W [N, K]): an entry for that weight only (``tilesparse tune
--per-shape``), preferred over the shape-free entry when both exist; the best tiles and
splits depend on how many output tiles the weight makes. A config is one of the launchers' kinds:
``KernelConfig`` (tiles), ``SmallConfig`` (small-batch streaming), ``PanelConfig``
(small blocks, several output block-columns per program), ``WsConfig`` (Hopper
warp-specialized), ``SddGroupConfig`` (updat, several blocks of a block-row per program),
``SddTileConfig`` (updat, a dense tile of several blocks per program, only stored blocks written),
``ResidentConfig`` (fprop at <= 64 rows, the activations held in shared memory; a bprop or a
larger M that meets one runs the other kernels).

Sources, later ones overriding earlier: the tables shipped with the package
(``tilesparse/kernels/tuned/*.json``), then the user's file (``$TILESPARSE_TUNED`` or
``~/.cache/tilesparse/tuned.json``), the one ``tilesparse tune`` writes by default. A
lookup tries the user's table (the weight shape's entry, then the shape-free one) before
the shipped ones. A GPU with no entry of its own for a problem takes the shipped entry of a
GPU of the same chip: same compute capability and SM count, as a shipped file's ``device``
header names them (an H100 SXM, 132 SMs of sm_90, takes the H200's; the kernels' tiles,
shared memory and wave counts are the same there, only HBM is slower).
``TILESPARSE_TUNED=off`` turns lookups off (heuristics only). Files are read once per
process (``reload()`` re-reads them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import warnings
from importlib import resources
from pathlib import Path

import torch

from .._env import normalized

__all__ = ["DENSITY_BUCKETS", "density_bucket", "device_header", "generation", "gpu_slug", "m_bucket", "key",
           "lookup_keys", "lookup", "lookup_entry", "record", "reload", "same_chip_slugs", "user_path", "weight_shape"]

DENSITY_BUCKETS = (0.5, 0.25, 0.1, 0.05, 0.03, 0.01)
OPS = ("fprop", "bprop", "updat")
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
FORMAT = 1


def m_bucket(m: int) -> int:
    """The power of two at or above ``m`` (1 for m <= 1)."""
    return 1 << max(0, (max(1, m) - 1).bit_length())


def density_bucket(density: float) -> float:
    """The bucket nearest to ``density`` on a log scale."""
    density = max(density, 1e-6)
    return min(DENSITY_BUCKETS, key=lambda d: abs(math.log(density / d)))


def dtype_name(dtype: torch.dtype) -> str:
    """bf16 / fp16 / tf32 / fp32: float32 is named by the precision its products run at."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return DTYPE_NAMES.get(dtype, str(dtype))


def key(gpu: str, op: str, dtype: torch.dtype, block: int, m: int, density: float,
        weight: tuple[int, int] | None = None) -> str:
    """The table key of a problem, as stored in the JSON files; with ``weight`` (N, K),
    the key of an entry for that weight shape only."""
    general = f"{gpu}|{op}|{dtype_name(dtype)}|{block}|{m_bucket(m)}|{density_bucket(density):g}"
    return general if weight is None else f"{general}|w{int(weight[0])}x{int(weight[1])}"


def weight_shape(block_rows: int, block_cols: int, block: int) -> tuple[int, int]:
    """W's (N, K) as keys name it: the block grid times the block size."""
    return block_rows * block, block_cols * block


def user_path() -> Path | None:
    """The user's tuned-config file, or None when lookups are off."""
    setting = os.environ.get("TILESPARSE_TUNED")
    if _lookups_off():
        return None
    if setting:
        return Path(setting)
    return Path.home() / ".cache" / "tilesparse" / "tuned.json"


def gpu_slug(name: str) -> str:
    """A GPU's name as the tables key it (and name their files): "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


@functools.lru_cache(maxsize=None)
def _gpu_slug(index: int) -> str:
    return gpu_slug(torch.cuda.get_device_name(index))


def device_header(index: int) -> dict:
    """What a table file records of the GPU it was measured on: its name slug and its chip
    (compute capability, SM count), by which other GPUs of the same chip find its entries."""
    props = torch.cuda.get_device_properties(index)
    return {"gpu": _gpu_slug(index), "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count}


def _chip(header: dict) -> tuple:
    return str(header.get("capability")), int(header.get("sms", -1))


@functools.lru_cache(maxsize=None)
def _device_chip(index: int) -> tuple:
    return _chip(device_header(index))


# --------------------------------------------------------------------------- (de)serialization


def _kinds() -> dict:
    from . import (bsmm, bsmm_gemv, bsmm_panel, bsmm_resident, bsmm_sdd_group, bsmm_sdd_tile,  # late: bsmm imports this
                   bsmm_small, bsmm_ws, bsmm_ws_group, bsmm_ws_sdd_group, bsmm_ws_sdd_rows)

    return {"tile": bsmm.KernelConfig, "small": bsmm_small.SmallConfig, "panel": bsmm_panel.PanelConfig,
            "ws": bsmm_ws.WsConfig, "ws_group": bsmm_ws_group.WsGroupConfig, "sdd_group": bsmm_sdd_group.SddGroupConfig,
            "sdd_tile": bsmm_sdd_tile.SddTileConfig, "ws_sdd_group": bsmm_ws_sdd_group.WsSddGroupConfig,
            "ws_sdd_rows": bsmm_ws_sdd_rows.WsSddRowsConfig, "resident": bsmm_resident.ResidentConfig,
            "gemv": bsmm_gemv.GemvConfig}


def to_json(config) -> dict:
    """A config as a JSON object, its kind named."""
    for kind, cls in _kinds().items():
        if isinstance(config, cls):
            return {"kind": kind, **dataclasses.asdict(config)}
    raise TypeError(f"not a launch config: {config!r}")


def from_json(obj: dict):
    """The config a JSON object names; ValueError on an unknown kind or field."""
    fields = dict(obj)
    kind = fields.pop("kind", None)
    cls = _kinds().get(kind)
    if cls is None:
        raise ValueError(f"unknown config kind {kind!r}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"bad {kind} config {obj!r}: {exc}") from None


# --------------------------------------------------------------------------- tables


def _read(text: str, origin: str) -> dict:
    data = json.loads(text)
    if data.get("format") != FORMAT:
        raise ValueError(f"{origin}: unknown tuned-config format {data.get('format')!r}")
    return {k: from_json(v["config"]) for k, v in data.get("entries", {}).items()}


def _shipped_files():
    shipped = resources.files(__package__).joinpath("tuned")
    if shipped.is_dir():
        yield from (entry for entry in sorted(shipped.iterdir(), key=lambda p: p.name) if entry.name.endswith(".json"))


def _read_shipped() -> dict:
    """The tables shipped in ``tilesparse/kernels/tuned/*.json``, merged."""
    table: dict = {}
    for entry in _shipped_files():
        table.update(_read(entry.read_text(), entry.name))
    return table


@functools.lru_cache(maxsize=1)
def _shipped_chips() -> dict:
    """GPU slug -> chip (capability, SM count) of each shipped file with a ``device`` header."""
    chips = {}
    for entry in _shipped_files():
        header = json.loads(entry.read_text()).get("device")
        if header:
            chips[header["gpu"]] = _chip(header)
    return chips


def same_chip_slugs(gpu: str, chip: tuple) -> tuple[str, ...]:
    """The other GPUs whose shipped tables were measured on this chip (capability, SMs)."""
    return tuple(sorted(slug for slug, other in _shipped_chips().items() if slug != gpu and other == chip))


@functools.lru_cache(maxsize=1)
def _tables() -> tuple[dict, dict]:
    """(the user's table, the shipped tables merged), each read once."""
    user: dict = {}
    path = user_path()
    if path is not None and path.is_file():
        try:
            user = _read(path.read_text(), str(path))
        except (ValueError, KeyError, TypeError) as exc:  # incl. JSON syntax errors
            warnings.warn(f"ignoring the tuned-config file {path}: {exc}", stacklevel=2)
    return user, _read_shipped()


def _table() -> dict:
    """Every entry, the user's overriding the shipped ones."""
    user, shipped = _tables()
    return {**shipped, **user}


_GENERATION = [0]  # bumped by reload(): whoever remembers a dispatch made from the tables compares it


def generation() -> int:
    """How many times :func:`reload` ran: a remembered dispatch made at another generation is stale."""
    return _GENERATION[0]


def reload() -> None:
    """Forget the tables read so far (the next lookup reads the files again)."""
    _GENERATION[0] += 1
    _tables.cache_clear()
    _shipped_chips.cache_clear()
    _lookup_cached.cache_clear()


def lookup(op: str, dtype: torch.dtype, block: int, m: int, density: float, device: torch.device,
           weight: tuple[int, int] | None = None):
    """The measured config for this problem on this GPU, or None (use the heuristic):
    the entry for this weight shape (N, K) if there is one, else the shape-free entry; with
    neither, the shipped entry of a GPU of the same chip (see the module docstring).
    Every launch asks, so answers are remembered per problem (building a key costs
    several microseconds of host time)."""
    return lookup_entry(op, dtype, block, m, density, device, weight)[0]


def lookup_entry(op: str, dtype: torch.dtype, block: int, m: int, density: float, device: torch.device,
                 weight: tuple[int, int] | None = None) -> tuple[object, bool]:
    """(:func:`lookup`'s config, whether it is an entry for this weight shape): such an entry was
    measured on this very grid (``tilesparse tune`` records one per shape), so the dispatcher's
    adjustments for grids unlike the measured one leave it alone."""
    if device.type != "cuda" or _lookups_off():
        return None, False
    index = device.index if device.index is not None else torch.cuda.current_device()
    precision = torch.get_float32_matmul_precision() if dtype == torch.float32 else ""
    return _lookup_cached(op, dtype, block, m, density, index, precision, weight)


def _lookups_off() -> bool:
    return normalized("TILESPARSE_TUNED") == "off"


@functools.lru_cache(maxsize=4096)
def _lookup_cached(op, dtype, block, m, density, index, precision, weight):
    # `precision` is in the cache key: key() names fp32 by it (tf32 / fp32). The user's
    # table first (their own measurements, shape-specific then shape-free), then the shipped
    # ones, then the shipped entries of GPUs of the same chip (asked only when needed: the
    # chip comes from the device's properties)
    user, shipped = _tables()
    gpu = _gpu_slug(index)
    own = lookup_keys(gpu, op, dtype, block, m, density, weight)
    for table in (user, shipped):
        for k in own:
            found = table.get(k)
            if found is not None:
                return found, k.rsplit("|", 1)[-1].startswith("w")
    for sibling in same_chip_slugs(gpu, _device_chip(index)):
        for k in lookup_keys(sibling, op, dtype, block, m, density, weight):
            found = shipped.get(k)
            if found is not None:
                return found, k.rsplit("|", 1)[-1].startswith("w")
    return None, False


def lookup_keys(gpu, op, dtype, block, m, density, weight) -> list[str]:
    """The keys a lookup tries, in order: fp16 without entries of its own takes bf16's (same
    element size, same tensor-core rate, every kernel kind runs both; the tables are tuned
    in bf16); the weight shape's entry before the shape-free one."""
    keys = []
    for dt in (dtype, torch.bfloat16) if dtype == torch.float16 else (dtype,):
        if weight is not None:
            keys.append(key(gpu, op, dt, block, m, density, weight))
        keys.append(key(gpu, op, dt, block, m, density))
    return keys


def record(entries: dict, path: Path, notes: dict | None = None, device: dict | None = None) -> Path:
    """Merge ``entries`` (key -> config) into the JSON file at ``path`` (created if
    missing), with optional per-key ``notes`` (timings), and forget cached tables.
    ``device`` (:func:`device_header`): the GPU measured, kept as the file's header where
    it has none (a shipped file's header lets GPUs of the same chip use its entries)."""
    data = {"format": FORMAT, "entries": {}}
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: unknown tuned-config format {data.get('format')!r}")
    if device is not None:
        data.setdefault("device", device)
    for k, config in entries.items():
        data["entries"][k] = {"config": to_json(config), **((notes or {}).get(k, {}))}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)  # readers never see half a file
    reload()
    return path
