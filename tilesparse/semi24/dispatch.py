"""Sparse-or-dense dispatch for the 2:4 products on a GPU.

For each problem key (op, M bucket, N, K, dtype, device name, torch version) the
dispatcher times the cuSPARSELt product against the dense product on a held W⊙M once
(back to back, host cost included; in the order sparse, dense, dense, sparse, each the
mean of its two), keeps sparse if it is more than 3 % faster (else dense) in memory and in a JSON file, and
answers from the cache afterwards. M is bucketed to the next power of two (batch sizes
vary; their crossover does not move much within a factor of two -- to be measured). ``mode="sparse"`` or ``"dense"``
overrides; on the CPU the answer is always ``"dense"`` (the reference) and nothing is
timed.

The cache file is ``$TILESPARSE_SEMI24_CACHE`` or ``~/.cache/tilesparse/semi24_dispatch.json``:
``{"version": 3, "entries": {key: {"choice": "sparse"|"dense", "sparse_ms": float,
"dense_ms": float}}}``. A file that cannot be read or parsed is ignored with a warning
(and overwritten by the next decision).

Everything except the timing itself is plain Python, so tests drive it with a fake
``timer(fn) -> milliseconds``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from ..kernels._tiles import next_power_of_2

MODES = ("auto", "sparse", "dense")
# "train_step_*": one training step of a layer whose weight changes every step (pack W and
# Wᵀ, by value-map gather or by compression, then fprop and bprop), against the dense
# fprop and bprop (updat is dense in both)
OPS = ("fprop", "bprop", "train_step_map", "train_step_compress")
# sparse must beat dense by more than 3 % to be chosen: a near tie gains little, and a timing
# error the other way would make the layer slower than dense
SPARSE_MARGIN = 0.97
CACHE_VERSION = 3  # 2: timed back to back (host cost included); 3: A B B A with a 3 % margin; older ones are timed again


def default_cache_path() -> Path:
    env = os.environ.get("TILESPARSE_SEMI24_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "tilesparse" / "semi24_dispatch.json"


def _do_bench(fn: Callable[[], object], trials: int = 5, trial_s: float = 0.02) -> float:
    """Milliseconds per call of ``fn`` run back to back (median of ``trials`` runs of
    ~``trial_s`` each): the steady state of eager code, the slower of the host's cost of
    a call and the GPU's. On the H200 ``torch._cslt_sparse_mm`` spent ~0.55 ms of host
    time per call (scripts/probes/semi24_host_overhead.py): a 0.32 ms sparse product of
    8192x4096x4096 then ran at 0.5 ms against dense's 0.39. do_bench, which lets the
    host run ahead during its L2 flush, had timed it 0.32 ms and picked it."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = max(3, min(200, int(trial_s / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / reps)
    return statistics.median(times) * 1e3


@functools.lru_cache(maxsize=None)
def gpu_name(device: torch.device) -> str:
    """The GPU's name (part of every decision's key), asked of the driver once per device."""
    return torch.cuda.get_device_name(device)


def check_mode(mode: str, name: str = "mode") -> str:
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {MODES}, got {mode!r}")
    return mode


def _decisions(raw: dict) -> dict[str, dict]:
    """The well-formed entries of a cache file's ``entries`` object (a choice of sparse or dense)."""
    return {key: value for key, value in raw.items()
            if isinstance(value, dict) and value.get("choice") in ("sparse", "dense")}


class Semi24Dispatcher:
    """Chooses ``"sparse"`` (cuSPARSELt) or ``"dense"`` (masked dense matmul) per problem.

    ``timer(fn)`` returns milliseconds (default: do_bench's median); ``cache_path``
    defaults to :func:`default_cache_path` at first use; ``persist=False`` keeps the
    decisions in memory only."""

    def __init__(self, cache_path: str | os.PathLike | None = None, timer=None, persist: bool = True):
        self._path = Path(cache_path) if cache_path is not None else None
        self.timer = timer or _do_bench
        self.persist = persist
        self._entries: dict[str, dict] | None = None  # loaded lazily
        self._lock = threading.Lock()
        self.timings = 0  # how many problems were timed (for tests and logs)
        self._key_locks: dict[str, threading.Lock] = {}

    @property
    def cache_path(self) -> Path:
        return self._path if self._path is not None else default_cache_path()

    @staticmethod
    def key(op: str, m: int, n: int, k: int, dtype: torch.dtype, device_name: str) -> str:
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {op!r}")
        dtype_name = str(dtype).replace("torch.", "")
        return f"{op}|m{next_power_of_2(max(1, m))}|n{n}|k{k}|{dtype_name}|{device_name}|torch{torch.__version__}"

    # ----------------------------------------------------------------- cache file
    def _load(self) -> dict[str, dict]:
        if self._entries is not None:
            return self._entries
        entries: dict[str, dict] = {}
        path = self.cache_path
        if self.persist and path.exists():
            try:
                data = json.loads(path.read_text())
                version = data.get("version") if isinstance(data, dict) else None
                if isinstance(version, int) and 0 < version < CACHE_VERSION:
                    data = {"entries": {}}  # an older timing method: decide again, quietly
                elif version != CACHE_VERSION:
                    raise ValueError(f"unknown format (version {version!r}, expected {CACHE_VERSION})")
                raw = data.get("entries")
                if not isinstance(raw, dict):
                    raise ValueError("no 'entries' object")
                entries = _decisions(raw)
            except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
                warnings.warn(f"tilesparse: ignoring the 2:4 dispatch cache {path}: {err}", stacklevel=3)
                entries = {}
        self._entries = entries
        return entries

    def _save(self) -> None:
        if not self.persist:
            return
        path = self.cache_path
        try:  # keep what other processes decided since this one read the file (this one's entries win)
            on_disk = json.loads(path.read_text()) if path.exists() else {}
            if isinstance(on_disk, dict) and on_disk.get("version") == CACHE_VERSION and isinstance(
                    on_disk.get("entries"), dict):
                self._entries = {**_decisions(on_disk["entries"]), **self._entries}
        except (OSError, ValueError):
            pass  # unreadable: overwritten below
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            payload = json.dumps({"version": CACHE_VERSION, "entries": self._entries}, indent=1, sort_keys=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(payload)
            os.replace(tmp, path)  # atomic: concurrent readers see the old or the new file
        except OSError as err:
            warnings.warn(f"tilesparse: could not write the 2:4 dispatch cache {path}: {err}", stacklevel=3)

    # ----------------------------------------------------------------- decisions
    def lookup(self, key: str) -> str | None:
        entry = self.entry(key)
        return entry["choice"] if entry else None

    def entry(self, key: str) -> dict | None:
        """The cached decision for ``key`` (choice, sparse_ms, dense_ms), or None."""
        with self._lock:
            entry = self._load().get(key)
        return dict(entry) if entry else None

    def choose(
        self,
        op: str,
        m: int,
        n: int,
        k: int,
        dtype: torch.dtype,
        device: torch.device | str,
        sparse_fn: Callable[[], object] | None,
        dense_fn: Callable[[], object] | None,
        mode: str = "auto",
        device_name: str | None = None,
    ) -> str:
        """``"sparse"`` or ``"dense"`` for this problem. ``sparse_fn``/``dense_fn`` run
        one product each (timed only when the key is not cached); ``sparse_fn=None``
        means the sparse path is unavailable."""
        check_mode(mode)
        device = torch.device(device)
        if device.type != "cuda":
            return "dense"
        if mode != "auto":
            return mode
        if sparse_fn is None:
            return "dense"
        if device_name is None:
            device_name = gpu_name(device)
        key = self.key(op, m, n, k, dtype, device_name)
        cached = self.lookup(key)
        if cached is not None:
            return cached
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one timing per key: threads asking at once wait for it instead of timing alongside
            cached = self.lookup(key)
            if cached is not None:
                return cached
            return self._time_and_store(key, device, sparse_fn, dense_fn)

    def _time_and_store(self, key, device, sparse_fn, dense_fn) -> str:
        on_device = (torch.cuda.device(device) if device.index is not None and torch.cuda.is_available()
                     else contextlib.nullcontext())  # the timer synchronizes the current device
        with on_device:  # A B B A: a drift in clocks or host load over the timing falls on both alike
            first_sparse, first_dense = float(self.timer(sparse_fn)), float(self.timer(dense_fn))
            dense_ms = (first_dense + float(self.timer(dense_fn))) / 2
            sparse_ms = (first_sparse + float(self.timer(sparse_fn))) / 2
        choice = "sparse" if sparse_ms < SPARSE_MARGIN * dense_ms else "dense"
        with self._lock:
            self._load()[key] = {"choice": choice, "sparse_ms": sparse_ms, "dense_ms": dense_ms}
            self.timings += 1
            self._save()
        return choice


_DEFAULT: Semi24Dispatcher | None = None


def default_dispatcher() -> Semi24Dispatcher:
    """The process-wide dispatcher (cache file from :func:`default_cache_path`)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Semi24Dispatcher()
    return _DEFAULT
