"""The environment a benchmark ran in: device, versions, commit, copy bandwidth.

Every result row carries the GPU name, versions and commit, so CSVs from different
machines and days can be compared (or refused) without guessing.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

__all__ = [
    "has_cuda", "device_name", "device_slug", "versions", "commit", "repo_root",
    "copy_bandwidth_gbs", "host_launch_us", "l2_cache_bytes", "environment", "paths", "clock_state",
    "parse_clock_state", "nvidia_smi_target", "CLOCK_QUERY",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device_name() -> str:
    """The GPU's marketing name (e.g. 'NVIDIA H200'), or 'cpu'."""
    return torch.cuda.get_device_name() if has_cuda() else "cpu"


def device_slug(name: str | None = None) -> str:
    """A file-name-safe form of the device name: 'NVIDIA H200' -> 'nvidia-h200' (the form
    the tuned-config tables key GPUs by)."""
    from ..kernels.tuned import gpu_slug

    return gpu_slug(name or device_name())


def versions() -> dict[str, str]:
    import numpy
    import triton

    from .. import __version__

    return {
        "tilesparse": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
    }


def repo_root() -> Path | None:
    """The source checkout tilesparse runs from (the folder holding pyproject.toml), if any."""
    root = _PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


def _git(*args: str) -> str:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("not a source checkout")
    return subprocess.run(  # safe.directory: a copied tree may belong to another user
        ["git", "-c", "safe.directory=*", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
    ).stdout.strip()


def commit() -> str:
    """`git rev-parse --short HEAD`, with '+dirty' when tracked files changed; 'unknown'
    without git. Untracked files (e.g. fresh results) do not count as dirty.
    TILESPARSE_COMMIT overrides it, for copies of the tree that travel without .git."""
    if os.environ.get("TILESPARSE_COMMIT"):
        return os.environ["TILESPARSE_COMMIT"]
    try:
        sha = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        sha = _head_from_files()
        return f"{sha}+?" if sha else "unknown"  # no git program: cannot tell if dirty
    return f"{sha}+dirty" if dirty else sha


def _head_from_files() -> str | None:
    """HEAD's short sha read from .git directly (machines without the git program)."""
    root = repo_root()
    git_dir = root / ".git" if root else None
    try:
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        if (git_dir / ref).is_file():
            return (git_dir / ref).read_text().strip()[:7]
        for line in (git_dir / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:7]
    except (OSError, TypeError):
        return None
    return None


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float | None:
    """Device-to-device copy bandwidth in GB/s (bytes read + written per second), timed
    with do_bench; the roofline against which memory-bound cases are judged. None on CPU."""
    if not has_cuda():
        return None
    from .timing import bench_ms

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), cuda=True)
    return 2 * nbytes / (ms * 1e-3) / 1e9  # the 2 GiB go back to torch's cache on return


def host_launch_us(calls: int = 500) -> float | None:
    """Host microseconds per launch of a trivial kernel (an in-place add on one element),
    back to back with the GPU idle between the syncs: how fast this machine's host feeds
    the GPU. Eager rows whose kernels take less than their calls' host time are
    host-bound, and lent machines' hosts differ (~0.06-0.1 ms per block-sparse call seen
    on H200 machines); recorded so that eager results can be read against it. None on CPU."""
    if not has_cuda():
        return None
    t = torch.zeros(1, device="cuda")
    for _ in range(20):
        t.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        t.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def l2_cache_bytes() -> int | None:
    """The GPU's L2 cache size in bytes (what an operand must exceed to be read from HBM
    under graph replay, which does not flush L2); None on CPU."""
    if not has_cuda():
        return None
    return int(torch.cuda.get_device_properties(0).L2_cache_size)


# nvidia-smi's fields for clock_state; bit 0x4 of the throttle reasons is the software power cap
CLOCK_QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"
_SW_POWER_CAP = 0x4
_clocks_unavailable = False  # set once nvidia-smi is missing, hangs or refuses every query


def _number(text: str, base: int = 10):
    """A field of nvidia-smi's csv as a number, or None ("N/A", "[N/A]", empty)."""
    try:
        return float(text) if base == 10 else int(text, base)
    except ValueError:
        return None


def parse_clock_state(line: str) -> dict | None:
    """{"sm_mhz", "watts", "power_capped"} from one csv line nvidia-smi printed for
    ``CLOCK_QUERY`` (no header, no units); a field it reports as N/A is None, and a line
    without a number at all (or short of fields) gives None."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) < 3:
        return None
    mhz, watts, reasons = _number(parts[0]), _number(parts[1]), _number(parts[2], 16)
    if mhz is None and watts is None and reasons is None:
        return None
    return {"sm_mhz": mhz, "watts": watts, "power_capped": None if reasons is None else bool(reasons & _SW_POWER_CAP)}


def nvidia_smi_target(device: int | None = None) -> list[str] | None:
    """nvidia-smi's arguments naming torch's current (or ``device``'s) GPU by its UUID, since
    torch's index is not nvidia-smi's under CUDA_VISIBLE_DEVICES; [] where torch gives no
    UUID and there is one GPU; None where it gives none and there are several."""
    try:
        index = torch.cuda.current_device() if device is None else device
        return [f"--id=GPU-{torch.cuda.get_device_properties(index).uuid}"]
    except Exception:  # noqa: BLE001 (no UUID from this build or device)
        return [] if torch.cuda.device_count() == 1 else None


def clock_state(device: int | None = None) -> dict | None:
    """The current GPU's SM clock, board power and whether the software power cap is
    holding the clock down, one nvidia-smi reading taken right after a timing; None
    without a GPU or nvidia-smi. Why: under the 700 W cap of an H200 the same kernels ran
    10-13 % slower after a few hundred ms of back-to-back calls (SM clock 1770 against
    1980 MHz), and FlexAttention's less so: the timing's clock says which of two rows paid
    for it. Never raises; gives up for the process once nvidia-smi is missing, hangs or
    fails (a suite asks after every row)."""
    global _clocks_unavailable
    if not has_cuda() or _clocks_unavailable:
        return None
    target = nvidia_smi_target(device)
    if target is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={CLOCK_QUERY}", "--format=csv,noheader,nounits", *target],
                             capture_output=True, text=True, timeout=5, errors="replace")
    except (OSError, subprocess.SubprocessError):
        _clocks_unavailable = True
        return None
    state = parse_clock_state(out.stdout) if out.returncode == 0 else None
    if state is None:
        _clocks_unavailable = True
    return state


def paths() -> dict[str, str | bool]:
    """Which compute paths and peers are available (for `tilesparse info`)."""
    from .peers import stk_available, torch_bsr_available

    bsr_ok, bsr_why = torch_bsr_available()
    stk_ok, stk_why = stk_available()
    return {
        "compute path": "triton kernels (CUDA)" if has_cuda() else "PyTorch reference (CPU)",
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "unset"),
        "torch BSR (bsr_dense_mm)": "importable" if bsr_ok else f"not importable ({bsr_why})",
        "stk": "importable" if stk_ok else f"not importable ({stk_why})",
        "tuned configs": tuned_configs_summary(),
    }


def tuned_configs_summary() -> str:
    """How many measured launch configs the kernels will find, and where they come from."""
    from ..kernels import tuned

    path = tuned.user_path()
    if path is None:
        return "off (TILESPARSE_TUNED=off): heuristics only"
    try:
        count = len(tuned._table())
    except ValueError as exc:  # a broken shipped table: say so rather than fail `info`
        return f"unreadable: {exc}"
    return f"{count} entries (shipped tables + {path}{'' if path.is_file() else ', absent'})"


def environment(bandwidth: bool = True) -> dict:
    """Everything the JSON sidecar records."""
    env = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "gpu": device_name()}
    env.update(versions())
    env["commit"] = commit()
    if has_cuda():
        props = torch.cuda.get_device_properties(0)
        env["sm_count"] = props.multi_processor_count
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["cuda"] = torch.version.cuda
        env["l2_cache_bytes"] = l2_cache_bytes()
        env["copy_bandwidth_gbs"] = copy_bandwidth_gbs() if bandwidth else None
        env["host_launch_us"] = host_launch_us()
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return env
