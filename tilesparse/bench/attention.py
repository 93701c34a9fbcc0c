"""The 'attention' suite: fused block-sparse attention against FlexAttention on the
identical block mask, and against SDPA (FlashAttention) where the pattern is dense.

For every dtype, shape (B, H, S, D), block size and layout pattern of
``cases/attention.json`` the suite builds the pattern with
:mod:`tilesparse.attention.layouts`, then times two ops per method:

* ``fwd``: the forward pass under ``torch.no_grad``;
* ``fwd_bwd``: forward and ``torch.autograd.grad`` of the output for a fixed random
  output gradient, w.r.t. q, k and v.

Methods: ``tilesparse`` (:func:`tilesparse.attention.block_sparse_attention`; on a dense
pattern it hands no-grad calls to SDPA, see its ``dense_fallback``), ``tilesparse_atomic``
(``deterministic=False``: also hands the backward of a dense pattern to SDPA),
``tilesparse_kernel`` (``dense_fallback=False``, dense patterns only: the block-sparse
kernels themselves), ``flex``
(``torch.compile(flex_attention)`` with a BlockMask made by ``create_block_mask`` from
the same layout, so both visit exactly the same blocks and mask the same elements) and
``sdpa`` (``F.scaled_dot_product_attention``, only for the dense patterns: causal and
full). Every row's ``speedup_vs_dense`` is against SDPA at the same shape and causality
(dense attention: what a sparse pattern has to beat), and ``speedup_vs_flex`` against
FlexAttention on the same pattern.

Columns: M = B * H * S (query rows), N = S (keys), K = D (head dim), ``block``,
``density`` (fraction of the layout's blocks that are active); extras ``layout`` (the
pattern's name, e.g. causal, local1024, strided, bigbird, random10), ``batch``,
``heads``, ``seq``, ``head_dim``, ``causal``, ``speedup_vs_flex``, ``peak_mib`` (GPU memory a forward + backward
allocates beyond its inputs, at its peak), ``rel_err`` (the forward output against
FlexAttention's, or SDPA's for dense patterns), ``note``, and ``sm_mhz`` / ``power_capped``
(the SM clock right after the timing and whether the board's software power cap held it
down: on the H200 our kernels timed at 1700-1800 MHz under the 700 W cap, Flex's at
1900-1965, so at equal energy per call the faster kernel loses part of its lead; see
``scripts/probes/attention_power.py``).
``tflops_nnz`` counts 4 * b^2 * D flops per active block and (batch, head) for the
forward (Q K^T and P V), 2.5x that for the backward, so fwd_bwd counts 3.5x: masked
elements inside diagonal blocks are counted as work, as FlashAttention counts them.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from . import base_row, case_table, register
from .matmul import DTYPES, SUSPECT_REL_ERR, RunContext, positive_int, rel_err
from .env import clock_state
from .timing import bench_ms_noted

__all__ = ["OPS", "METHODS", "resolve_table", "suite_patterns", "probe_main", "prepare", "run", "plot_attention", "flops"]

OPS = ("fwd", "fwd_bwd")
# _atomic: deterministic=False; _kernel: dense_fallback=False, timed on the dense patterns only
# (there tilesparse hands no-grad and deterministic=False calls to SDPA)
METHODS = ("tilesparse", "tilesparse_atomic", "tilesparse_kernel", "flex", "sdpa")
DENSE_PATTERNS = ("causal", "full")  # patterns SDPA computes without a mask


def resolve_table(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """The case table ``name`` of cases/attention.json with --quick's subset and overrides
    (any table key; ``shapes`` from --shape are taken as [B*H, S, D] with H from the
    table) applied; ValueError naming the bad entry."""
    overrides = dict(overrides or {})
    cli_shapes = overrides.pop("shapes", None)
    table = case_table("attention", name, quick=quick, overrides=overrides)
    if cli_shapes:
        heads = table["shapes"][0][1]
        table["shapes"] = [[max(1, m // heads), heads, n, k] for m, n, k in cli_shapes]
    for d in table["dtypes"]:
        if d not in DTYPES or d == "fp32":
            raise ValueError(f"attention dtype must be bf16 or fp16, got {d!r}")
    for op in table["ops"]:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    for method in table["methods"]:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    table["shapes"] = [tuple(positive_int(v, "a shape entry (B, H, S, D)") for v in s) for s in table["shapes"]]
    for shape in table["shapes"]:
        if len(shape) != 4:
            raise ValueError(f"an attention shape is [B, H, S, D], got {list(shape)}")
    for b in table["blocks"]:
        positive_int(b, "block")
    names = set()
    for spec in table["layouts"]:
        if "name" not in spec or "builder" not in spec:
            raise ValueError(f"a layout entry needs 'name' and 'builder', got {spec!r}")
        if spec["name"] in names:
            raise ValueError(f"layout name {spec['name']!r} appears twice")
        names.add(spec["name"])
    return table


def prepare(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    return resolve_table(name, quick=quick, overrides=overrides)


def flops(op: str, nnz_blocks: int, block: int, head_dim: int, batch: int) -> float:
    """Nominal flops of ``op`` on ``nnz_blocks`` active blocks (summed over heads)."""
    fwd = 4.0 * nnz_blocks * block * block * head_dim * batch
    return fwd * (3.5 if op == "fwd_bwd" else 1.0)


# --------------------------------------------------------------------------- layouts


def suite_patterns(name: str = "attention") -> tuple[int, int, int, int, int, dict]:
    """(B, H, S, D, block, {pattern name: spec}) of table ``name``'s first shape and block
    size: the cases the attention probes (scripts/probes/attention_*.py) time."""
    table = resolve_table(name)
    B, H, S, D = table["shapes"][0]
    return B, H, S, D, table["blocks"][0], {spec["name"]: spec for spec in table["layouts"]}


def probe_inputs(spec: dict, B: int, H: int, S: int, D: int, block: int, tensors: int = 3):
    """A probe pattern's setup: (layout, causal, ``tensors`` random bf16 [B, H, S, D] CUDA
    tensors (q, k, v, then dO), the layout's tables on the GPU, scale, the row started with
    the pattern's name and density)."""
    import torch

    layout = build_layout(spec, S, block, H)
    causal = bool(spec.get("causal", False))
    inputs = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(tensors)]
    row = {"pattern": spec["name"], "density": layout.density}
    return layout, causal, inputs, layout.meta_on(inputs[0].device, causal), D ** -0.5, row


def probe_flex_times(row: dict, q, k, v, layout, causal: bool, pattern: str, grad_out) -> None:
    """FlexAttention on a probe's inputs (compiled on the same mask), into ``row``:
    ``flex_fwd_ms`` and ``flex_fwd_bwd_ms`` where it runs, nothing where it cannot."""
    from .timing import bench_ms

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    fns, _ = _make_fns("flex", *leaves, layout, causal, pattern, grad_out)
    if fns:
        row["flex_fwd_ms"], row["flex_fwd_bwd_ms"] = bench_ms(fns[0], cuda=True), bench_ms(fns[1], cuda=True)


def probe_times(row: dict) -> str:
    """A probe row's timings (its ``*_ms`` entries) as one printable line."""
    return "  ".join(f"{key[:-3]}: {value:.3f}" for key, value in row.items() if key.endswith("_ms"))


def probe_main(description: str, run_pattern, describe, flex_help: str) -> None:
    """The attention probes' command line (scripts/probes/attention_*.py): ``--patterns``
    (of the suite's first shape, :func:`suite_patterns`; ``--head-dim`` to change D),
    ``--flex`` (``flex_help``),
    ``--out`` JSON rewritten after each pattern; ``run_pattern(spec, B, H, S, D, block,
    flex)`` gives a pattern's row, ``describe(name, row)`` its printed line."""
    import argparse
    import json

    import torch

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--patterns", nargs="+", default=["local1024", "strided", "bigbird", "random10", "causal"])
    p.add_argument("--flex", action="store_true", help=flex_help)
    p.add_argument("--head-dim", type=int, default=None, help="head dim instead of the suite's")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    B, H, S, D, block, specs = suite_patterns()
    D = args.head_dim or D
    rows = []
    for name in args.patterns:
        row = run_pattern(specs[name], B, H, S, D, block, args.flex)
        print(describe(name, row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


def build_layout(spec: dict, seq: int, block: int, heads: int):
    """The pattern ``spec`` ({"name", "builder", "args", "causal", "per_head"}) as an
    AttentionLayout (per-head random patterns draw one layout per head)."""
    from ..attention import layouts as attention_layouts

    builder = getattr(attention_layouts, spec["builder"], None)
    if builder is None:
        raise ValueError(f"layout {spec['name']!r}: no builder tilesparse.attention.layouts.{spec['builder']}")
    args = dict(spec.get("args", {}))
    if spec.get("per_head"):
        args["num_heads"] = heads
    return builder(seq, block, **args)


def _mask_mod(block_mask: torch.Tensor, block: int, causal: bool):
    """FlexAttention's mask_mod for a [H, nb, nb] block mask (and causality): the same
    elements our kernel keeps. A [1, nb, nb] mask is shared by every head (FlexAttention
    still calls the mask_mod with each head's index)."""
    if block_mask.dim() == 3 and block_mask.shape[0] == 1:
        block_mask = block_mask[0]
    shared = block_mask.dim() == 2

    def mask_mod(b, h, q, kv):
        keep = block_mask[q // block, kv // block] if shared else block_mask[h, q // block, kv // block]
        return keep & (q >= kv) if causal else keep

    return mask_mod


# --------------------------------------------------------------------------- methods


def _make_fns(method: str, q, k, v, layout, causal: bool, pattern: str, grad_out):
    """(forward fn, fwd+bwd fn) of one method, or (None, reason) when it cannot run."""
    if method in ("tilesparse", "tilesparse_atomic", "tilesparse_kernel"):
        from ..attention import block_sparse_attention

        if method == "tilesparse_kernel" and pattern not in DENSE_PATTERNS:
            return None, "same as tilesparse: only a dense pattern is handed to SDPA"
        kernel_only = method == "tilesparse_kernel"

        def fwd():
            return block_sparse_attention(q, k, v, layout, causal=causal, deterministic=method != "tilesparse_atomic",
                                          dense_fallback=not kernel_only)
    elif method == "flex":
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as exc:
            return None, f"FlexAttention not importable: {exc}"
        if not q.is_cuda:
            return None, "FlexAttention is timed on the GPU only"
        heads, seq = q.shape[1], q.shape[2]
        mask = layout.mask.to(q.device)  # [1 or H, nb, nb]
        block = layout.block_size
        block_mask = create_block_mask(_mask_mod(mask, block, causal), None, None if mask.shape[0] == 1 else heads,
                                       seq, seq, device=q.device, BLOCK_SIZE=block, _compile=True)
        compiled = torch.compile(flex_attention)
        enable_gqa = q.shape[1] != k.shape[1]

        def fwd():
            return compiled(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    else:  # sdpa
        if pattern not in DENSE_PATTERNS:
            return None, "SDPA has no block-sparse mode (dense patterns only)"
        enable_gqa = q.shape[1] != k.shape[1]

        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=enable_gqa)

    def fwd_no_grad():
        with torch.no_grad():
            return fwd()

    def fwd_bwd():
        out = fwd()
        return torch.autograd.grad(out, (q, k, v), grad_out)

    return (fwd_no_grad, fwd_bwd), ""


# --------------------------------------------------------------------------- the suite


def _row(suite, op, method, dtype_name, shape, block, density, pattern, causal, ms, ref_ms, flex_ms, err, note,
         nnz_blocks, ctx) -> dict:
    batch, heads, seq, head_dim = shape
    row = base_row(suite, op, method, dtype_name, batch * heads * seq, seq, head_dim, block, density, ms,
                   flops(op, nnz_blocks, block, head_dim, batch), ref_ms, ctx.stamp)
    row.update({"rel_err": err, "note": note, "layout": pattern, "batch": batch, "heads": heads, "seq": seq,
                "head_dim": head_dim, "causal": causal,
                "speedup_vs_flex": flex_ms / ms if ms and flex_ms else None})
    return row


def _progress(row: dict) -> str:
    head = f"  {row['op']:7} {row['method']:10} {row['layout']:12} b={row['block']:<3} d={row['density']:.3f}"
    if row["ms"] is None:
        return f"{head} [red]{row['note']}[/]"
    text = f"{head} {row['ms']:9.3f} ms {row['tflops_nnz']:7.1f} TFLOP/s"
    if row.get("speedup_vs_flex"):
        text += f" {row['speedup_vs_flex']:5.2f}x vs flex"
    return text


def _run_case(suite, table, dtype_name, shape, block, spec, ctx, rows, sdpa_ms: dict) -> None:
    """Rows for one (dtype, shape, block, pattern)."""
    batch, heads, seq, head_dim = shape
    kv_heads = table.get("kv_heads") or heads
    dtype = DTYPES[dtype_name]
    device = torch.device("cuda" if ctx.cuda else "cpu")
    gen = torch.Generator(device=device).manual_seed(table["seed"])

    def tensor(h):
        return torch.randn(batch, h, seq, head_dim, generator=gen, device=device, dtype=dtype).requires_grad_()

    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    grad_out = torch.randn(batch, heads, seq, head_dim, generator=gen, device=device, dtype=dtype)
    pattern, causal = spec["name"], bool(spec.get("causal", False))
    layout = build_layout(spec, seq, block, heads)
    # the fraction of (query block, key block) pairs computed, causal trimming included;
    # the mask is [1 or H, nb, nb], and a shared one counts the same for every head
    blocks = layout.block_mask(causal)
    density = blocks.float().mean().item()
    nnz_blocks = int(blocks.sum()) * (heads if blocks.shape[0] == 1 else 1)  # summed over the query heads

    results: dict[str, dict] = {}
    outputs: dict[str, torch.Tensor] = {}
    peak_mib: dict[str, float] = {}
    clocks: dict[str, dict] = {}  # method -> op -> the GPU's clock state right after the timing
    for method in table["methods"]:
        fns, why = _make_fns(method, q, k, v, layout, causal, pattern, grad_out)
        if fns is None:
            ctx.skipped.setdefault(f"{method}/{pattern}", why)
            continue
        try:
            if ctx.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            outputs[method] = fns[0]()
            if ctx.cuda:
                fns[1]()  # one forward + backward: its peak is the op's working memory
                torch.cuda.synchronize()
                peak_mib[method] = (torch.cuda.max_memory_allocated() - base) / 2**20
            for op, fn in zip(OPS, fns):
                if op in table["ops"]:
                    ms, note = bench_ms_noted(fn, cuda=ctx.cuda, graph=ctx.graph)
                    results.setdefault(method, {})[op] = (ms, note)
                    clocks.setdefault(method, {})[op] = clock_state() if ctx.cuda else None
        except Exception as exc:  # a peer that fails is skipped; tilesparse gets an error row
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            if method.startswith("tilesparse"):
                results[method] = {op: (None, f"error: {msg}") for op in table["ops"]}
            else:
                ctx.skipped.setdefault(f"{method}/{pattern}", f"failed: {msg}")
                ctx.log(f"  [yellow]skip {method} {pattern}: {msg}[/]")
    if pattern in DENSE_PATTERNS and "sdpa" in results:
        for op, (ms, _) in results["sdpa"].items():
            sdpa_ms[(shape, causal, op)] = ms
    # correctness of the forward: against flex on the same mask, else SDPA on a dense pattern
    reference = outputs.get("flex", outputs.get("sdpa") if pattern in DENSE_PATTERNS else None)
    for method, per_op in results.items():
        err = None
        if method.startswith("tilesparse") and method in outputs and reference is not None:
            err = rel_err(outputs[method], reference.float())
        for op, (ms, note) in per_op.items():
            if err is not None and not math.isfinite(err):
                note = "; ".join(filter(None, [note, "error: NaN/Inf in the output"]))
            elif err is not None and err > SUSPECT_REL_ERR:
                note = "; ".join(filter(None, [note, f"suspect: rel_err above {SUSPECT_REL_ERR:.0e}"]))
            flex_ms = results.get("flex", {}).get(op, (None,))[0]
            row = _row(suite, op, method, dtype_name, shape, block, density, pattern, causal, ms,
                       sdpa_ms.get((shape, causal, op)), flex_ms, err, note, nnz_blocks, ctx)
            row["peak_mib"] = peak_mib.get(method)
            state = clocks.get(method, {}).get(op) or {}
            row["sm_mhz"], row["power_capped"] = state.get("sm_mhz"), state.get("power_capped")
            rows.append(row)
            ctx.log(_progress(row))
    del q, k, v, grad_out, outputs
    ctx.checkpoint(rows)


def run(suite: str, table: dict, ctx: RunContext) -> list[dict]:
    """Every (dtype, shape, block, pattern) of ``table``; dense patterns first, so that
    SDPA's time is there for every sparse row's speedup_vs_dense."""
    rows: list[dict] = []
    specs = sorted(table["layouts"], key=lambda s: s["name"] not in DENSE_PATTERNS)
    for dtype_name in table["dtypes"]:
        for shape in table["shapes"]:
            start = time.perf_counter()
            sdpa_ms: dict = {}
            if not any(s["name"] in DENSE_PATTERNS for s in specs) or "sdpa" not in table["methods"]:
                ctx.log("  [yellow]no dense pattern with sdpa in this table: speedup_vs_dense stays empty[/]")
            ctx.log(f"[bold]{suite} {dtype_name} B={shape[0]} H={shape[1]} S={shape[2]} D={shape[3]}[/]")
            for block in table["blocks"]:
                for spec in specs:
                    _run_case(suite, table, dtype_name, shape, block, spec, ctx, rows, sdpa_ms)
            ctx.log(f"  ({time.perf_counter() - start:.0f} s)")
            if ctx.cuda:
                torch.cuda.empty_cache()
    return rows


def plot_attention(rows: list[dict], path, title: str = ""):
    """Time against density (log-log), one panel per (dtype, op, shape): tilesparse and
    FlexAttention per pattern (points labelled by pattern), SDPA as horizontal lines.
    Returns None when nothing was timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("ms")]
    if not timed:
        return None
    panels = list(dict.fromkeys((r["dtype"], r["op"], r["batch"], r["heads"], r["seq"], r["head_dim"]) for r in timed))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.4), squeeze=False, layout="constrained")
    styles = {"tilesparse": ("o", "tab:blue"), "tilesparse_atomic": ("^", "tab:green"),
              "tilesparse_kernel": ("v", "tab:purple"), "flex": ("s", "tab:orange")}
    for ax, key in zip(axes[0], panels):
        mine = [r for r in timed if (r["dtype"], r["op"], r["batch"], r["heads"], r["seq"], r["head_dim"]) == key]
        for method, (marker, color) in styles.items():
            pts = sorted((r["density"], r["ms"], r["layout"]) for r in mine if r["method"] == method)
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=method, zorder=3)
                if method == "tilesparse":
                    for d, ms, name in pts:
                        ax.annotate(name, (d, ms), fontsize=6, xytext=(3, 3), textcoords="offset points")
        for r in mine:
            if r["method"] == "sdpa":
                ax.axhline(r["ms"], color="black", ls="--" if r["causal"] else ":", lw=1,
                           label=f"SDPA {'causal' if r['causal'] else 'full'}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density (fraction of blocks)")
        ax.set_ylabel("ms")
        dtype, op, b, h, s, d = key
        ax.set_title(f"{op} {dtype} B={b} H={h} S={s} D={d}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


for _name in ("attention", "attention-long", "attention-cpu"):
    register(_name, prepare=prepare, run=run, plot=plot_attention)
