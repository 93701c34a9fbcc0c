"""The 'semi24' suite: 2:4 semi-structured sparsity against dense cuBLAS.

Three kinds of case, from ``cases/semi24.json``:

* ``gemm`` shapes [M, N, K] (X [M, K], W [N, K]), op ``fprop``: Y = X (W⊙M)^T through
  a :class:`~tilesparse.SemiSparseLinear` layer at inference (no grad) with
  ``mode="sparse"`` (cuSPARSELt; the layer compresses W⊙M on its first call and keeps
  it) and ``mode="auto"`` (the dispatcher's choice; where that is dense the layer keeps
  W⊙M instead; methods ``tilesparse`` and ``tilesparse_auto``), against
  ``F.linear`` on the dense weight;
* ``ffn`` blocks {tokens, dim, hidden}, ops ``fwd``, ``fwd_bwd`` (named ``ffn_fwd``,
  ``ffn_step`` and ``ffn_train_step`` in the CSV; weights fixed) and ``train_step``
  (fwd_bwd after an in-place weight update, as an optimizer step makes it; mask
  recomputation every ``mask_every`` steps not included). A training forward now
  repacks its 2:4 weights on every call (FSDP2 rewrites W without a version bump), so
  ``ffn_step`` pays the repacking too and differs from ``ffn_train_step`` only by the
  weight update; results up to 9b25e99 are from when ``ffn_step`` reused the packs:
  Linear -> GELU ->
  Linear with both weights 2:4 (:class:`~tilesparse.SemiSparseLinear`, modes sparse and
  auto), and the squared-ReLU FFN with 2:4 activations
  (:class:`~tilesparse.semi24.SquaredReLUFFN`, method ``tilesparse_act24``; its dense twin is
  ``act_dense``), against the dense FFN;
* ``prep`` shapes [N, K], ops ``mask`` (transposable 2:4 mask + W⊙M + (W⊙M)^T in one pass,
  ``transposable_prune``) and ``compress`` (``torch._cslt_compress`` of W, method
  ``cusparselt``; W with Wᵀ by compression, ``pair``, and by the value-map gather that
  repacks them under an unchanged mask, ``map_pair``): what a mask
  update costs, next to one fprop of that weight at the table's ``prep_tokens`` rows.

Columns as the other suites (``block`` 0, ``density`` 0.5 for 2:4 rows and 1 for dense);
extras ``case`` (gemm / ffn / prep), ``rel_err`` (against the dense product on the
masked weight) and ``note``. ``tflops_nnz`` counts the kept weights' flops (half of
dense's for 2:4 rows); the issue's goals read ``speedup_vs_dense``.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from . import base_row, case_table, register
from .matmul import DTYPES, SUSPECT_REL_ERR, RunContext, positive_int, rel_err
from .timing import bench_ms_noted

__all__ = ["OPS", "resolve_table", "prepare", "run"]

OPS = ("fprop", "fwd", "fwd_bwd", "train_step", "train_loop", "mask", "compress")
# the FFN block's ops as the CSV names them (the issue's `ffn_step` is forward + backward)
FFN_OPS = {"fwd": "ffn_fwd", "fwd_bwd": "ffn_step", "train_step": "ffn_train_step", "train_loop": "ffn_train_loop"}
TRAIN_LOOPS = 2  # timed loops of mask_every steps each (after one untimed loop)


def resolve_table(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """The case table ``name`` of cases/semi24.json with --quick's subset and overrides
    (``shapes`` from --shape replace the gemm shapes) applied; ValueError naming the
    bad entry."""
    overrides = dict(overrides or {})
    shapes = overrides.pop("shapes", None)
    table = case_table("semi24", name, quick=quick, overrides=overrides)
    if shapes:
        table["gemms"] = [list(s) for s in shapes]
    for d in table["dtypes"]:
        if d not in ("bf16", "fp16"):
            raise ValueError(f"semi24 dtype must be bf16 or fp16 (cuSPARSELt's 16-bit types), got {d!r}")
    for m, n, k in table.get("gemms", []):
        for v, what in ((m, "M"), (n, "N"), (k, "K")):
            positive_int(v, f"gemm {what}")
        if n % 16 or k % 16:
            raise ValueError(f"gemm {m}x{n}x{k}: N and K must be multiples of 16 for cuSPARSELt")
    for ffn in table.get("ffns", []):
        for key in ("tokens", "dim", "hidden"):
            positive_int(ffn.get(key), f"ffn {key}")
    for n, k in table.get("prep", []):
        if n % 4 or k % 4:
            raise ValueError(f"prep weight [{n}, {k}]: both sides must be multiples of 4")
    return table


def prepare(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    return resolve_table(name, quick=quick, overrides=overrides)


def _row(suite, case, op, method, dtype_name, shape, density, ms, dense_ms, flops, err, note, ctx) -> dict:
    row = base_row(suite, op, method, dtype_name, *shape, 0, density, ms, flops, dense_ms, ctx.stamp)
    row.update({"case": case, "rel_err": err, "note": note})
    return row


def _time(fn, ctx):
    try:
        fn()
        if ctx.cuda:
            torch.cuda.synchronize()
        return (*bench_ms_noted(fn, cuda=ctx.cuda, graph=ctx.graph), None)
    except Exception as exc:  # a failing method gets an error row, the suite goes on
        return None, "", _error_note(exc)


def _error_note(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _layer_defaults() -> tuple[int, str]:
    """SemiSparseLinear's default (mask_every, method): what a training loop of it runs."""
    import inspect

    from ..semi24 import SemiSparseLinear

    params = inspect.signature(SemiSparseLinear.__init__).parameters
    return params["mask_every"].default, params["method"].default


def _update_and_step(model, x, params, grad, weights):
    """One training step as the benchmarks time it: an in-place update of every weight
    (a new version, so packed copies are stale), then forward + backward."""
    with torch.no_grad():
        for w in weights:
            w.mul_(1.0)
    return torch.autograd.grad(model(x), params, grad)


def _decision_note(op, m, n, k, dtype, device):
    """What the 2:4 dispatcher chose for this problem and the times it chose by."""
    from ..semi24 import dispatch

    key = dispatch.Semi24Dispatcher.key(op, m, n, k, dtype, dispatch.gpu_name(device))
    entry = dispatch.default_dispatcher().entry(key)
    if entry is None:
        return f"dispatch: no {op} decision"
    if not all(isinstance(entry.get(t), (int, float)) for t in ("sparse_ms", "dense_ms")):
        return f"dispatch: {entry['choice']} (times not recorded)"
    return (f"dispatch: {entry['choice']} (sparse {entry['sparse_ms']:.3f} ms, "
            f"dense {entry['dense_ms']:.3f} ms, back to back)")


def _log(ctx, row):
    if row["ms"] is None:
        ctx.log(f"  {row['case']:4} {row['op']:8} {row['method']:10} [red]{row['note']}[/]")
    else:
        x = f"{row['speedup_vs_dense']:5.2f}x" if row["speedup_vs_dense"] else "     "
        note = f"  {row['note']}" if row["note"] else ""
        ctx.log(f"  {row['case']:4} {row['op']:8} {row['method']:10} {row['ms']:8.3f} ms {x}{note}")


def _gemm(suite, table, dtype_name, shape, ctx, rows):
    from ..semi24 import SemiSparseLinear, transposable_mask

    m, n, k = shape
    dtype, device = DTYPES[dtype_name], torch.device("cuda" if ctx.cuda else "cpu")
    gen = torch.Generator(device=device).manual_seed(table["seed"])
    x = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * k ** -0.5).to(dtype)
    mask = transposable_mask(w)
    wm = torch.where(mask, w, torch.zeros_like(w))
    ref = F.linear(x.float(), wm.float())
    dense_ms, note, error = _time(lambda: F.linear(x, w), ctx)
    rows.append(_row(suite, "gemm", "fprop", "dense", dtype_name, shape, 1.0, dense_ms, dense_ms, 2.0 * m * n * k,
                     None, error or note, ctx))
    _log(ctx, rows[-1])
    for method, mode in (("tilesparse", "sparse"), ("tilesparse_auto", "auto")):
        layer = SemiSparseLinear(k, n, bias=False, device=device, dtype=dtype, mode=mode).eval()
        with torch.no_grad():
            layer.weight.copy_(w)
            layer.mask.copy_(mask)

        @torch.no_grad()
        def fn(layer=layer):
            return layer(x)

        ms, note, error = _time(fn, ctx)
        err = rel_err(fn(), ref) if error is None else None
        if err is not None and err > SUSPECT_REL_ERR:
            note = "; ".join(filter(None, [note, f"suspect: rel_err above {SUSPECT_REL_ERR:.0e}"]))
        if mode == "auto" and ctx.cuda:
            note = "; ".join(filter(None, [note, _decision_note("fprop", m, n, k, dtype, device)]))
        rows.append(_row(suite, "gemm", "fprop", method, dtype_name, shape, 0.5, ms, dense_ms, 1.0 * m * n * k, err,
                         error or note, ctx))
        _log(ctx, rows[-1])


class _DenseFFN(nn.Module):
    def __init__(self, dim, hidden, act, **factory):
        super().__init__()
        self.up, self.down, self.act = nn.Linear(dim, hidden, **factory), nn.Linear(hidden, dim, **factory), act

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def _ffn(suite, table, dtype_name, spec, ctx, rows):
    from ..semi24 import SemiSparseLinear, SquaredReLUFFN

    tokens, dim, hidden = spec["tokens"], spec["dim"], spec["hidden"]
    dtype, device = DTYPES[dtype_name], torch.device("cuda" if ctx.cuda else "cpu")
    factory = {"device": device, "dtype": dtype}
    torch.manual_seed(table["seed"])
    x = torch.randn(tokens, dim, **factory).requires_grad_()
    grad = torch.randn(tokens, dim, **factory)
    shape = (tokens, hidden, dim)
    dense = _DenseFFN(dim, hidden, nn.GELU(), **factory)
    models = {"dense": dense}
    for method, mode in (("tilesparse", "sparse"), ("tilesparse_auto", "auto")):
        sparse = _DenseFFN(dim, hidden, nn.GELU(), **factory)
        sparse.up = SemiSparseLinear.from_dense(dense.up, mode=mode)
        sparse.down = SemiSparseLinear.from_dense(dense.down, mode=mode)
        models[method] = sparse
    models["act_dense"] = SquaredReLUFFN(dim, hidden, sparse=False, **factory)
    models["tilesparse_act24"] = SquaredReLUFFN(dim, hidden, sparse=True, **factory)
    models["tilesparse_act24"].load_state_dict(models["act_dense"].state_dict())
    base = {}
    for method, model in models.items():
        for op in table["ops"]:
            if op not in FFN_OPS or (op == "train_loop" and "act" in method):
                continue
            if op == "train_loop":
                ms, note, error = _train_loop_ms(model, x, grad, ctx)
                density = 1.0 if method == "dense" else 0.5
                if method == "dense":
                    base[("dense", op)] = ms
                rows.append(_row(suite, "ffn", FFN_OPS[op], method, dtype_name, shape, density, ms,
                                 base.get(("dense", op)), 3.0 * 2.0 * 2 * tokens * dim * hidden * density, None,
                                 error or note, ctx))
                _log(ctx, rows[-1])
                continue
            params = [x, *model.parameters()]
            if op == "fwd":
                def fn(model=model):
                    with torch.no_grad():
                        return model(x)
            elif op == "fwd_bwd":
                def fn(model=model, params=params):
                    return torch.autograd.grad(model(x), params, grad)
            else:
                weights = [m.weight for m in model.modules() if isinstance(m, (nn.Linear, SemiSparseLinear))]

                def fn(model=model, params=params, weights=weights):
                    return _update_and_step(model, x, params, grad, weights)
            ms, note, error = _time(fn, ctx)
            baseline = "act_dense" if "act" in method else "dense"
            if method == baseline:
                base[(baseline, op)] = ms
            density = 1.0 if method in ("dense", "act_dense") else 0.5
            mult = 1.0 if op == "fwd" else 3.0
            flops = mult * 2.0 * 2 * tokens * dim * hidden * density
            rows.append(_row(suite, "ffn", FFN_OPS[op], method, dtype_name, shape, density, ms, base.get((baseline, op)),
                             flops, None, error or note, ctx))
            _log(ctx, rows[-1])


def _train_loop_ms(model, x, grad, ctx):
    """(ms per step, note, error) of training steps as a loop runs them: an in-place
    weight update, forward + backward, then each 2:4 layer's ``step()``, which
    recomputes its mask every ``mask_every`` steps (and the next forward learns the new
    mask's value maps). Timed over TRAIN_LOOPS loops of ``mask_every`` steps after one
    untimed loop: the per-step cost of mask updates included, amortized as in training."""
    from ..semi24 import SemiSparseLinear

    semis = [m for m in model.modules() if isinstance(m, SemiSparseLinear)]
    weights = [m.weight for m in model.modules() if isinstance(m, (nn.Linear, SemiSparseLinear))]
    params = [x, *model.parameters()]
    steps = semis[0].mask_every if semis else _layer_defaults()[0]  # the dense model runs the same loop
    updates = []

    def loop():
        recomputed = 0
        for _ in range(steps):
            _update_and_step(model, x, params, grad, weights)
            recomputed += sum(bool(layer.step()) for layer in semis)
        updates.append(recomputed)

    try:
        loop()
        times = []
        for _ in range(TRAIN_LOOPS):
            if ctx.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            loop()
            if ctx.cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3 / steps)
    except Exception as exc:
        return None, "", _error_note(exc)
    lo, hi = min(updates[1:]), max(updates[1:])
    counted = (f", {lo if lo == hi else f'{lo}-{hi}'} mask updates per timed loop" if semis else "")
    return min(times), f"{steps} steps per loop, best of {TRAIN_LOOPS} loops{counted}", None


def _prep_share(suite, table, dtype_name, ctx, rows):
    """The per-step cost of keeping the FFN's 2:4 weights packed, from this run's rows:
    both weights repacked by gather every step (``map_pair``) plus, every ``mask_every``
    steps, each weight's new mask (the layer's default method) and its value maps
    (``learn_maps``); as a share of the dense FFN training step (issue 7: <= 5 %)."""
    mask_every, method = _layer_defaults()

    def ms_of(op, meth, shape):
        for r in rows:
            if (r["op"] == op and r["method"] == meth and r["dtype"] == dtype_name
                    and (r["M"], r["N"], r["K"]) == shape and r["ms"] is not None):
                return r["ms"]
        return None

    for spec in table.get("ffns", []):
        t, d, h = spec["tokens"], spec["dim"], spec["hidden"]
        dense = ms_of("ffn_train_step", "dense", (t, h, d))  # the FFN rows are named (tokens, hidden, dim)
        m = table.get("prep_tokens", 8192)
        shapes = [(m, h, d), (m, d, h)]  # the up and down weights, as the prep rows name them
        parts = [(ms_of("compress", "map_pair", s), ms_of("mask", method, s), ms_of("compress", "learn_maps", s))
                 for s in shapes]
        if dense is None or any(v is None for part in parts for v in part):
            ctx.log(f"  prep per step of the FFN {d} -> {h} -> {d}: not computed (needs its dense training step "
                    f"and the map_pair, {method} mask and learn_maps rows of [{h}, {d}] and [{d}, {h}])")
            continue
        per_step = sum(pair + (mask + learn) / mask_every for pair, mask, learn in parts)
        share = per_step / dense
        note = (f"{100 * share:.1f} % of the dense FFN training step ({dense:.2f} ms): both weights' map_pair "
                f"every step + ({method} mask + learn_maps)/{mask_every} per weight")
        row = _row(suite, "prep", "prep_per_step", "tilesparse", dtype_name, (t, h, d), 0.5, per_step, None, None,
                   None, note, ctx)
        rows.append(row)
        ctx.log(f"  prep per step {per_step:.3f} ms: {note}")


def _prep(suite, table, dtype_name, nk, ctx, rows):
    from ..semi24 import transposable_prune

    n, k = nk
    m = table.get("prep_tokens", 8192)
    dtype, device = DTYPES[dtype_name], torch.device("cuda" if ctx.cuda else "cpu")
    w = torch.randn(n, k, device=device, dtype=dtype)
    x = torch.randn(m, k, device=device, dtype=dtype)
    fprop_ms, _, _ = _time(lambda: F.linear(x, w), ctx)
    shape = (m, n, k)
    for method, fn in (("optimal", lambda: transposable_prune(w, "optimal")),
                       ("greedy", lambda: transposable_prune(w, "greedy"))):
        ms, note, error = _time(fn, ctx)
        rows.append(_row(suite, "prep", "mask", method, dtype_name, shape, 0.5, ms, fprop_ms, None, None,
                         error or note or "speedup_vs_dense: one dense fprop's time over this", ctx))
        _log(ctx, rows[-1])
    if ctx.cuda:
        wm, _, mask = transposable_prune(w)  # the mask itself: randn has exact zeros at kept entries
        ms, note, error = _time(lambda: torch._cslt_compress(wm), ctx)
        rows.append(_row(suite, "prep", "compress", "cusparselt", dtype_name, shape, 0.5, ms, fprop_ms, None, None,
                         error or note or "W only (bprop's Wᵀ costs the same again)", ctx))
        _log(ctx, rows[-1])
        from ..semi24.packing import compress_pair

        pair = lambda: compress_pair(wm, transposable=True, want_t=True)  # noqa: E731
        pair()  # an opt-in one-pass packer checks itself against _cslt_compress on first use
        ms, note, error = _time(pair, ctx)
        rows.append(_row(suite, "prep", "compress", "pair", dtype_name, shape, 0.5, ms, fprop_ms, None, None,
                         error or note or "W and Wᵀ by compression (a new mask's first step)", ctx))
        _log(ctx, rows[-1])
        from ..semi24.value_map import maps_for

        ms, note, error = _time(lambda: maps_for(mask, wm.dtype, want_t=True), ctx)
        rows.append(_row(suite, "prep", "compress", "learn_maps", dtype_name, shape, 0.5, ms, fprop_ms, None, None,
                         error or note or "learning the placement for W and Wᵀ, once per mask (median: the one-pass learn of a shape already decoded row-major)", ctx))
        _log(ctx, rows[-1])
        maps = maps_for(mask, wm.dtype, want_t=True)
        if maps is None or maps[1] is None:
            ctx.log("  [yellow]value maps could not be learned on this GPU[/]")
        else:
            ms, note, error = _time(lambda: (maps[0].pack(w), maps[1].pack(w)), ctx)
            rows.append(_row(suite, "prep", "compress", "map_pair", dtype_name, shape, 0.5, ms, fprop_ms, None, None,
                             error or note or "W and Wᵀ by gather under an unchanged mask (every other step)", ctx))
            _log(ctx, rows[-1])


def run(suite: str, table: dict, ctx: RunContext) -> list[dict]:
    """Every dtype: the gemm shapes, the FFN blocks, the mask/compress costs."""
    rows: list[dict] = []
    for dtype_name in table["dtypes"]:
        start = time.perf_counter()
        ctx.log(f"[bold]{suite} {dtype_name}[/]")
        if "fprop" in table["ops"]:
            for shape in table.get("gemms", []):
                _gemm(suite, table, dtype_name, tuple(shape), ctx, rows)
                ctx.checkpoint(rows)
        for spec in table.get("ffns", []):
            _ffn(suite, table, dtype_name, spec, ctx, rows)
            ctx.checkpoint(rows)
        if "mask" in table["ops"]:
            for nk in table.get("prep", []):
                _prep(suite, table, dtype_name, tuple(nk), ctx, rows)
                ctx.checkpoint(rows)
            _prep_share(suite, table, dtype_name, ctx, rows)
        ctx.log(f"  ({time.perf_counter() - start:.0f} s)")
    return rows


for _name in ("semi24", "semi24-cpu"):
    register(_name, prepare=prepare, run=run)
