"""Shared builders for the block-sparse matmul tests: layouts of each shape class,
inputs of each memory layout, and float64 dense references built with
``layout.to_dense`` (never with the library's reference kernels).

Used by test_bsmm_reference.py (CPU path), test_bsmm_interpreter.py (Triton launchers
under the interpreter) and test_bsmm_gpu.py (CUDA).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tilesparse import BlockLayout, layouts
from tilesparse.kernels import bsmm as kernels
from tolerances import assert_close

# Layout classes that stress different table shapes:
#   empty            nnz = 0: every ptr range is empty, outputs are bias only
#   full             every block stored: the dense case
#   random           uniform random, density 1/2
#   empty_rows_cols  random, with one whole block-row and one whole block-col empty
#                    (exercises repeated ptr entries in both the row and column table)
LAYOUT_KINDS = ["empty", "full", "random", "empty_rows_cols"]

# Marks of a test that runs Triton kernels under the interpreter (triton's interpreter
# trips a NumPy 1.25 deprecation on every scalar index; not ours).
INTERPRETER_MARKS = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"),
]


def count_triton_runs(monkeypatch) -> list:
    """The names of the kernels launched through Triton's own launch path (``JITFunction.run``) from
    now on: a prepared launch that skips it leaves the list empty."""
    from triton.runtime.jit import JITFunction

    seen = []
    original = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: seen.append(self.fn.__name__) or original(
        self, *a, **k))
    return seen


TRANS_CASES = [("T", True), ("N", False)]


def pairwise(*axes: list[tuple[str, object]]) -> list:
    """pytest params that hold every pair of values of any two axes at least once (greedy all-pairs).

    Each axis is a list of (id, value). The full product of four or five knobs runs hundreds
    of interpreter cases; the kernel bugs found so far came from two knobs meeting (orientation
    with a split, a layout class with a step width), which covering every pair catches at a
    fraction of the cost. Deterministic: the same cases, in the same order, on every run."""
    if not all(axes):
        raise ValueError("pairwise: every axis needs at least one value")
    combos = list(itertools.product(*(range(len(axis)) for axis in axes)))

    def pairs(combo):
        return {(i, combo[i], j, combo[j]) for i, j in itertools.combinations(range(len(combo)), 2)}

    uncovered = set().union(*map(pairs, combos))
    chosen = [] if len(axes) > 1 else combos  # (one axis: no pairs; every value)
    while uncovered:
        best = max(combos, key=lambda combo: len(pairs(combo) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return [pytest.param(*(axes[k][i][1] for k, i in enumerate(combo)),
                         id="-".join(axes[k][i][0] for k, i in enumerate(combo))) for combo in sorted(chosen)]


def hopper() -> bool:
    """Whether a CUDA device of compute capability 9 (sm90, what the Gluon kernels are written for) is present."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not hopper(), reason="the Gluon kernel is written for sm90")


def _seed() -> int:
    # Drawn from the global generator, which the autouse fixture seeds per test.
    return int(torch.randint(0, 2**31 - 1, ()))


def make_layout(kind: str, block_rows: int, block_cols: int, block_size: int) -> BlockLayout:
    if kind == "empty":
        return BlockLayout(torch.zeros(block_rows, block_cols, dtype=torch.bool), block_size)
    if kind == "full":
        return BlockLayout(torch.ones(block_rows, block_cols, dtype=torch.bool), block_size)
    if kind == "random":
        layout = layouts.random(block_rows * block_size, block_cols * block_size, block_size, 0.5, seed=_seed())
        assert layout.nnz > 0
        return layout
    if kind == "empty_rows_cols":
        assert block_rows >= 2 and block_cols >= 2, "need room for an empty row and column"
        mask = torch.rand(block_rows, block_cols) < 0.6
        mask[block_rows // 2, :] = False  # an empty block-row in the middle
        mask[:, 0] = False  # the first block-col empty
        mask[0, block_cols - 1] = True  # at least one block
        return BlockLayout(mask, block_size)
    raise ValueError(kind)


# Memory layouts of a 2-D (or 3-D) activation [..., features]:
#   contiguous   plain row-major
#   transposed   a column-major view (stride along features != 1)
#   sliced       every other column of a wider tensor (inner stride 2)
#   3d           [2, m, features] batch
#   3d_strided   [2, m, features] that is a transposed view of [m, 2, features]
INPUT_KINDS = ["contiguous", "transposed", "sliced", "3d", "3d_strided"]


def make_input(kind: str, m: int, features: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """A leaf tensor (requires_grad) of logical shape [m, features] (or [2, m, features])
    with the given memory layout."""
    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)

    if kind == "contiguous":
        x = rand(m, features)
    elif kind == "transposed":
        x = rand(features, m).t()
    elif kind == "sliced":
        x = rand(m, 2 * features)[:, ::2]
    elif kind == "3d":
        x = rand(2, m, features)
    elif kind == "3d_strided":
        x = rand(m, 2, features).transpose(0, 1)
    else:
        raise ValueError(kind)
    if kind in ("transposed", "sliced", "3d_strided") and m > 1:
        assert not x.is_contiguous()
    return x.detach().requires_grad_()


def random_values(layout: BlockLayout, dtype: torch.dtype, device="cpu", scale: float | None = None) -> torch.Tensor:
    """Block values scaled so outputs stay O(1) whatever the fan-in (keeps fp16 in range)."""
    b = layout.block_size
    if scale is None:
        scale = 1.0 / max(1.0, (layout.block_cols * b * max(layout.density, 1e-3)) ** 0.5)
    values = torch.randn(layout.nnz, b, b, device=device, dtype=torch.float32) * scale
    return values.to(dtype)


def linear_reference(x, weight, layout: BlockLayout, bias, grad_y):
    """float64 CPU (y, dx, dweight, dbias) of y = x W^T + bias with W = to_dense(weight)."""
    out_features, in_features = layout.shape
    xd = x.detach().double().cpu()
    w = layout.to_dense(weight.detach().double().cpu())
    y = xd @ w.t()
    if bias is not None:
        y = y + bias.detach().double().cpu()
    g = grad_y.detach().double().cpu()
    dx = g @ w
    g2 = g.reshape(-1, out_features)
    x2 = xd.reshape(-1, in_features)
    dweight = layout.gather(g2.t() @ x2)
    dbias = g2.sum(0) if bias is not None else None
    return y, dx, dweight, dbias


def dds_against_reference(layout: BlockLayout, dtype: torch.dtype, trans: bool, m: int, config, bias: bool = True,
                          device="cuda"):
    """(dds's output on ``device`` with ``config``, its float64 CPU reference) for fresh
    random activations, blocks and bias: A [m, cols] @ S^T (trans, fprop) or A [m, rows] @ S."""
    from tilesparse.kernels import bsmm

    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows, device=device).to(dtype)
    values = random_values(layout, dtype, device)
    b = torch.randn(rows if trans else cols, device=device).to(dtype) if bias else None
    out = bsmm.dds(a, values, layout.meta_on(device), b, layout.block_rows, layout.block_cols, trans, config=config)
    s = dense_of(values, layout)
    expected = a.double().cpu() @ (s.t() if trans else s)
    if b is not None:
        expected = expected + b.double().cpu()
    return out, expected


def dense_of(values, layout: BlockLayout) -> torch.Tensor:
    """The dense float64 CPU matrix of a block-sparse operand."""
    return layout.to_dense(values.detach().double().cpu())


def assert_sdd_falls_back_to_the_heuristic(monkeypatch, tuned_config, launcher_module, launcher_name: str) -> None:
    """A tuned updat entry that cannot run this call (``tuned_config``, launched by
    ``launcher_module.launcher_name``) makes ``bsmm.sdd`` (fp32, b 128) use its one-block
    heuristic instead, never the entry's launcher."""
    from tilesparse.kernels import bsmm as kernels

    layout = make_layout("random", 3, 3, 128)
    monkeypatch.setattr(kernels.tuned, "lookup", lambda *args, **kwargs: tuned_config)
    calls = []
    monkeypatch.setattr(launcher_module, launcher_name, lambda *args: calls.append(args))
    monkeypatch.setattr(kernels, "launch", lambda *args, **kwargs: calls.append("heuristic"))
    dy, x = torch.randn(8, 3 * 128), torch.randn(8, 3 * 128)
    kernels.sdd(dy.t(), x, layout.meta_on("cpu"), 128, 3, 3)
    assert calls and all(c == "heuristic" for c in calls)


def sdd_against_reference(kind: str, dtype: torch.dtype, m: int, config, block_rows: int, block_cols: int,
                          block_size: int = 64):
    """sdd forced by ``config`` on the GPU (dY [m, R*b], X [m, C*b], fresh normal inputs)
    against the float64 product gathered on the layout: (got, expected, (dy, x, meta, layout))."""
    from tilesparse.kernels import bsmm as kernels

    layout = make_layout(kind, block_rows, block_cols, block_size)
    rows, cols = layout.shape
    dy = torch.randn(m, rows, device="cuda").to(dtype)
    x = torch.randn(m, cols, device="cuda").to(dtype)
    meta = layout.meta_on("cuda")
    got = kernels.sdd(dy.t(), x, meta, block_size, block_rows, block_cols, config=config)
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    assert got.shape == expected.shape == (int(layout.mask.sum()), block_size, block_size)
    return got, expected, (dy, x, meta, layout)


def assert_sdd_matches_reference(kind: str, dtype: torch.dtype, config, ms, name: str, block_rows: int = 7,
                                 block_cols: int = 11) -> None:
    """sdd forced by ``config`` matches its float64 reference (:func:`sdd_against_reference`)
    at each M of ``ms``; ``name`` (the kernel) labels a failure."""
    for m in ms:
        got, expected, _ = sdd_against_reference(kind, dtype, m, config, block_rows, block_cols)
        if expected.numel():
            assert_close(got, expected, dtype, f"{name} {kind} m{m} {block_rows} x {block_cols} blocks {config}")


def assert_sdd_refuses_the_config_off_hopper(config, kernel_name: str) -> None:
    """Off sm90, sdd forced by ``config`` raises a ValueError that the ``kernel_name`` needs
    an sm90 GPU (skips on one)."""
    from tilesparse.kernels import bsmm as kernels

    if hopper():
        pytest.skip("runs on sm90")
    layout = make_layout("random", 2, 2, 64)
    dy, x = torch.randn(64, 128).to(torch.bfloat16), torch.randn(64, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match=f"{kernel_name} needs an sm90"):
        kernels.sdd(dy.t(), x, layout.meta_on("cpu"), 64, 2, 2, config=config)


def assert_sdd_is_deterministic_and_captures(config) -> None:
    """Two runs of sdd under ``config`` agree bitwise, and so does a CUDA-graph replay."""
    from tilesparse.kernels import bsmm as kernels

    got, _, (dy, x, meta, layout) = sdd_against_reference("random", torch.bfloat16, 2048, config, 7, 11)
    again = kernels.sdd(dy.t(), x, meta, 64, layout.block_rows, layout.block_cols, config=config)
    assert torch.equal(got, again)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernels.sdd(dy.t(), x, meta, 64, layout.block_rows, layout.block_cols, config=config)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, got)


def assert_tuned_entry_runs_only_from_its_density(monkeypatch, tuned_config, launcher_module, launcher_name: str,
                                                  density: float, used: bool) -> None:
    """A b 64 sdd whose tuned entry is ``tuned_config`` launches ``launcher_module.launcher_name``
    exactly when ``used`` (a tuned bucket's low end is refused below the kernel's measured
    density), and either way returns the float64 reference's blocks."""
    import tilesparse
    from tilesparse.kernels import bsmm as kernels

    monkeypatch.setattr(kernels.tuned, "lookup", lambda *args, **kwargs: tuned_config)
    launched = []
    real = getattr(launcher_module, launcher_name)
    monkeypatch.setattr(launcher_module, launcher_name, lambda *args: launched.append(real(*args)))
    layout = tilesparse.layouts.random(16 * 64, 16 * 64, 64, density, seed=3)
    dy = torch.randn(1024, 16 * 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1024, 16 * 64, device="cuda", dtype=torch.bfloat16)
    got = kernels.sdd(dy.t(), x, layout.meta_on("cuda"), 64, 16, 16)
    assert bool(launched) == used
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    assert_close(got, expected, torch.bfloat16, f"sdd after a tuned {tuned_config} at density {density}")

# --------------------------------------------------------------------------- dds under test
# The launcher called directly, its float64 reference and inputs: shared by the
# interpreter files (test_bsmm_interpreter.py, test_bsmm_panel_interpreter.py).


def run_dds(layout, a, values, bias, trans, config=None):
    return kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans, config=config)


def dds_expected(layout, a, values, bias, trans):
    s = dense_of(values, layout)
    out = a.double() @ (s.t() if trans else s)
    if bias is not None:
        out = out + bias.double()
    return out


def dds_inputs(layout, m, dtype, trans, with_bias):
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows).to(dtype)
    values = random_values(layout, dtype)
    n_out = rows if trans else cols
    bias = torch.randn(n_out).to(dtype) if with_bias else None
    return a, values, bias


def check_dds(layout, a, values, bias, trans, dtype, config=None):
    out = run_dds(layout, a, values, bias, trans, config)
    assert out.dtype == dtype
    assert_close(out, dds_expected(layout, a, values, bias, trans), dtype, "dds")
