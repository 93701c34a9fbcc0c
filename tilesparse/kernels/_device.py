"""Device facts the launchers consult on every call, read once per device.

torch.cuda.get_device_capability / get_device_properties cost microseconds per call;
on a launch path that runs three times per training step that adds up (see
docs/performance.md, host overhead)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _cuda_facts(index: int) -> tuple[int, int, int]:
    props = torch.cuda.get_device_properties(index)
    # opt-in shared memory per block; 99 KiB (the smallest of sm80-sm90 parts) if unknown
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 101376
    return props.major, props.multi_processor_count, smem


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 for any other device)."""
    return _cuda_facts(_index(device))[1] if device.type == "cuda" else 1


def shared_memory_bytes(device: torch.device) -> int:
    """Shared memory a kernel may use per block on a CUDA device (228 KiB on the H200
    minus the reserve; 99 KiB on sm86/sm89 parts); a large number for other devices."""
    return _cuda_facts(_index(device))[2] if device.type == "cuda" else 1 << 30


def capability_major(device: torch.device) -> int:
    """Major compute capability of a CUDA device (0 for any other device)."""
    return _cuda_facts(_index(device))[0] if device.type == "cuda" else 0


def current_stream_handle(device: torch.device) -> int:
    """The raw handle of ``device``'s current CUDA stream (what Triton's launcher reads): a key for
    per-stream caches at ~0.3 µs a call, where ``torch.cuda.current_stream(device)`` builds a
    Stream object (~3 µs on the H200's host)."""
    return torch._C._cuda_getCurrentRawStream(_index(device))


_SIDE_STREAMS: dict = {}  # (purpose, device index) -> stream


def side_stream(device: torch.device, purpose: str, create: bool = True):
    """The CUDA stream of ``device`` kept for ``purpose`` (e.g. ``"tables"``, ``"attention-dq"``,
    ``"lstm-capture"``), made on first use. Each purpose has its own: work on one must neither queue
    behind another's nor be recorded into a capture running there. With ``create=False``, None where
    it is not made yet (callers that may run inside a CUDA-graph capture make none there)."""
    key = (purpose, _index(device))
    stream = _SIDE_STREAMS.get(key)
    if stream is None and create:
        stream = _SIDE_STREAMS.setdefault(key, torch.cuda.Stream(device=key[1]))
    return stream


def build_outside_graph_pools(device: torch.device, build):
    """``build()``'s tensors, complete, made on a side stream (CUDA) that first waits for
    the current one: their memory comes from the caching allocator's ordinary pool even
    where the current stream allocates into a CUDA graph's private pool (torch.compile's
    reduce-overhead warm-up, whose blocks later replays overwrite), and they are finished
    before any other stream can read them. For tables cached on a layout for its life.
    ``build`` returns a tensor, a tuple of tensors, or a host value (a number or flag read
    from the tables, which needs no stream); on other devices it just runs. Not
    during a CUDA-graph capture (the side stream's sync would break it): callers build in
    place there, uncached."""
    if device.type != "cuda":
        return build()
    current = torch.cuda.current_stream(device)
    side = side_stream(device, "tables")
    side.wait_stream(current)
    with torch.cuda.stream(side):
        out = build()
    for t in out if isinstance(out, tuple) else (out,):
        if isinstance(t, torch.Tensor):
            t.record_stream(current)  # the kernels that read it run on the current stream
    side.synchronize()  # complete (and any pinned host source no longer needed)
    return out


def cached_table(owner: torch.Tensor, name: str, key, build, build_while_capturing: bool = True):
    """``build()`` remembered on ``owner`` (a layout's table tensor, never written after it
    is built) under ``name`` and ``key``: built once by :func:`build_outside_graph_pools`;
    while a CUDA graph is being captured, built in place and not remembered (or, with
    ``build_while_capturing=False``, for builds that read tables to the host: None)."""
    cache = owner.__dict__.get(name)
    if cache is not None and key in cache:
        return cache[key]
    if owner.is_cuda and torch.cuda.is_current_stream_capturing():
        return build() if build_while_capturing else None
    table = build_outside_graph_pools(owner.device, build)
    owner.__dict__.setdefault(name, {})[key] = table
    return table
