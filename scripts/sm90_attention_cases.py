"""The attention kernels' cases for ``scripts/sm90_compile_check.py``: the Triton forward,
dK/dV, dQ and preprocess kernels (and dQ from stored dS), and the warp-specialized (Gluon)
ones. Each case: (label, kernel, signature, constexprs, warps, stages[, attrs, source])."""

from __future__ import annotations

import itertools
import re

import torch
import triton
from triton.experimental.gluon._runtime import GluonASTSource  # (private: Gluon's AST source)

from tilesparse.kernels import attention as attn
from tilesparse.kernels import attention_stored_ds

def _attention_signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ("lse_ptr", "delta_ptr", "dq_acc_ptr"):
            sig[name] = "*fp32"
        elif name == "kpm_ptr":
            sig[name] = "*u8"
        elif name == "stamp_ptr":
            sig[name] = "*i64"
        elif name.endswith(("ptr_ptr", "cols_ptr", "rows_ptr", "slots_ptr", "sched_ptr", "order_ptr", "ranks_ptr",
                            "sem_ptr")):
            sig[name] = "*i32"
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        elif name in ("qk_scale", "scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _aligned(fn, sig: dict) -> dict:
    """Triton's attrs for the pointer arguments of ``sig`` and the operands' strides: 16-byte
    aligned, multiples of 16, as the launches' tensors and strides are (Triton specializes on
    both; without them stores compile element by element)."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
            if sig.get(name, "").startswith("*") or (sig.get(name) == "i32" and re.fullmatch(r"(s[a-z]{1,2}|dq)[bhs]", name))}


def attention_cases(quick: bool):
    shapes = ((128, 128), (16, 32)) if quick else ((128, 128), (128, 96), (64, 64), (32, 64), (16, 32))
    flags = ((True, True),) if quick else ((False, False), (True, False), (False, True), (True, True))
    preprocessed = set()
    for block, head_dim in shapes:
        d_tile = max(16, triton.next_power_of_2(head_dim))
        # tensor-descriptor (TMA) loads where D fills the box
        for (causal, kpm), tma in itertools.product(flags, (False, True) if head_dim == d_tile else (False,)):
            common = dict(BS=block, D=head_dim, D_TILE=d_tile, CAUSAL=causal, HAS_KPM=kpm, INPUT_PRECISION="ieee",
                          TMA=tma)
            for kind, fn in (("fwd", attn._fwd_kernel), ("dkdv", attn._bwd_dkdv_kernel), ("dq", attn._bwd_dq_kernel)):
                cfg = attn.attention_config(kind, block, head_dim, torch.bfloat16)
                # variants: dQ by atomics (deterministic=False) and the two-pass dK/dV walk
                # (AttentionConfig.two_pass), alone and together; the forward's split-off last block
                variants = {"dkdv": ((), ("atomic_dq",), ("two_pass",), ("store_ds",),
                                     ("two_pass", "atomic_dq"))[:3 if quick else 5],
                            "fwd": ((),) if kpm else ((), ("split_last",))}.get(kind, ((),))
                for variant in variants:
                    const = dict(common, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
                    if kind == "dkdv":  # a constexpr left out would compile as a runtime int
                        atomic = "atomic_dq" in variant
                        const.update(ATOMIC_DQ=atomic, TMA_REDUCE=atomic and tma, TWO_PASS="two_pass" in variant,
                                     STORE_DS="store_ds" in variant)
                    elif kind == "fwd":
                        const.update(SPLIT_LAST="split_last" in variant)
                    name = "".join(f" {v}" for v in variant)
                    yield (f"attention {kind} b{block} D{head_dim} causal={causal} kpm={kpm} tma={tma}{name}", fn,
                           _attention_signature(fn, "bf16", const), const, cfg.num_warps, cfg.num_stages)
        if not quick:  # dQ from the stored dS (attention_stored_ds), at the dQ kernel's tiles
            cfg = attn.attention_config("dq", block, head_dim, torch.bfloat16)
            const = dict(BS=block, D=head_dim, D_TILE=d_tile, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                         INPUT_PRECISION="ieee")
            fn = attention_stored_ds._bwd_dq_from_ds_kernel
            yield (f"attention dq from stored dS b{block} D{head_dim}", fn, _attention_signature(fn, "bf16", const),
                   const, cfg.num_warps, cfg.num_stages)
        if head_dim not in preprocessed:  # (its constants do not depend on the block: one case per head dim)
            preprocessed.add(head_dim)
            const = dict(D=head_dim, D_TILE=d_tile, BLOCK_M=64)
            fn = attn._bwd_preprocess_kernel
            yield f"attention preprocess D{head_dim}", fn, _attention_signature(fn, "bf16", const), const, 4, 2
    if not quick:  # the two-pass dK/dV kernel at other tiles than the measured config's (b 128, D 128)
        fn = attn._bwd_dkdv_kernel
        for block_m, block_n, warps in ((64, 128, 4), (128, 128, 8), (64, 64, 4), (64, 64, 8)):
            const = dict(BS=128, D=128, D_TILE=128, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=True, HAS_KPM=False,
                         INPUT_PRECISION="ieee", TMA=True, ATOMIC_DQ=False, TMA_REDUCE=False, TWO_PASS=True,
                         STORE_DS=False)
            yield (f"attention dkdv b128 D128 causal=True kpm=False tma=True two_pass {block_m}x{block_n} w{warps}",
                   fn, _attention_signature(fn, "bf16", const), const, warps, 2)


def _desc_type(dtype: str, rows: int, cols: int, layout) -> str:
    """A host-built descriptor's signature type, as the runtime writes it: dtype, [1, 1,
    rows, cols] box, shared-memory layout."""
    return f"tensordesc<{dtype}[1, 1, {rows}, {cols}],{layout!r}>"


def _host_desc_types(sig: dict, q_rows: int, kv_rows: int, head_dim: int, qo, kv) -> None:
    """A backward kernel's q, k, v and do arguments typed as host-built descriptors
    (``host_descs``), bf16."""
    for name, rows, layout in (("q_ptr", q_rows, qo), ("k_ptr", kv_rows, kv), ("v_ptr", kv_rows, kv),
                               ("do_ptr", q_rows, qo)):
        sig[name] = _desc_type("bf16", rows, head_dim, layout)


def _dkdv_case(fn, mode: int, block: int, head_dim: int, stages: int, causal: bool, kpm: bool, consumers: int,
                    overlap, stats: bool, mma_regs: int = 232, load_regs: int = 40, staged: bool = False,
                    host: bool = False, persistent: bool = False, ordered: bool = False, store_ds: bool = False,
                    ordered_dq: int = 0, first_store: bool = False, stamps: bool = False,
                    last_uncounted: bool = False):
    """One compile case of the dK/dV kernel, block_m 64, adding dQ by TMA reductions where
    ATOMIC_DQ ``mode`` is 1 (each consumer's share) or 2 (shared dSᵀ tiles, half of D per
    consumer; 0: deterministic, no dQ);
    ``overlap`` 2: FlashAttention-3's order (``DkdvWsConfig.fa3_order``); ``staged``: dK and dV
    stored through the staging tiles (``staged_stores``); ``host``: host-built descriptors
    (``host_descs``) in place of q, k, v, dO and dQ's buffer; ``persistent``: items in turn;
    ``ordered``: a 1-D grid in the launch-order table's order (``balanced``); ``store_ds``
    (mode 0): each dSᵀ tile also stored to the workspace; ``ordered_dq`` (mode 2, ordered): dQ's
    shares added in a fixed order behind semaphores, by a dQ writer warp (1 or 2: which writer);
    ``first_store``: each query tile's first share stored, not added; ``last_uncounted``: its
    last not counted; ``stamps``: each program's SM and time stamps written (a probe's)."""
    from tilesparse.kernels import attention_ws_base
    from tilesparse.kernels.attention_ws_dq_adds import _dq_layout, _ds_smem_layout, _out_smem_layout, dq_tile_cols

    qo, kv = attention_ws_base._layouts(64, block, head_dim, torch.bfloat16)
    const = dict(BS=block, D=head_dim, BLOCK_M=64, STAGES=stages, CAUSAL=causal, HAS_KPM=kpm, LOAD_REGS=load_regs,
                 STORE_DS=store_ds, qo_layout=qo, kv_layout=kv, num_warps=block // 16 // consumers,
                 CONSUMERS=consumers, MMA_REGS=mma_regs, OVERLAP=overlap, STATS_SMEM=stats, ATOMIC_DQ=mode,
                 dq_layout=_dq_layout(64, head_dim, mode == 2),
                 ds_smem_layout=_ds_smem_layout(block, 64, torch.bfloat16) if mode == 2 else None,
                 STAGED_STORES=staged,
                 out_smem_layout=_out_smem_layout(block // consumers, head_dim, torch.bfloat16) if staged else None,
                 HOST_DESCS=host, PERSISTENT=persistent, ORDERED=ordered, ORDERED_DQ=ordered_dq or False,
                 FIRST_STORE=first_store, STAMPS=stamps, LAST_UNCOUNTED=last_uncounted)
    sig = _attention_signature(fn, "bf16", const)
    if host:  # the descriptors' types, as the runtime writes them: dtype, box, shared-memory layout
        _host_desc_types(sig, 64, block, head_dim, qo, kv)
        if mode:  # (mode 0: no dQ buffer; the pointer argument stays)
            sig["dq_acc_ptr"] = _desc_type("fp32", 64, dq_tile_cols(head_dim, mode == 2), const["dq_layout"])
    label = (f"ws attention dK/dV{' atomic_dq' if mode else ''}{' shared_ds' if mode == 2 else ''} b{block} D{head_dim} "
             f"causal={causal} "
             f"kpm={kpm}" + (" two consumers" if consumers == 2 else "")
             + {0: "", 1: " overlap", 2: " fa3_order"}[int(overlap)] + (" stats_in_smem" if stats else "")
             + (f" regs {mma_regs}/{load_regs}" if (mma_regs, load_regs) != (232, 40) else "")
             + {0: "", 1: " staged_stores", 2: " ring_stores"}[int(staged)] + (" host_descs" if host else "")
             + (" persistent" if persistent else "") + (" ordered" if ordered else "")
             + (" store_ds" if store_ds else "") + (f" ordered_dq={ordered_dq}" if ordered_dq else "") + (" first_store" if first_store else "")
             + (" last_uncounted" if last_uncounted else "") + (" stamps" if stamps else ""))
    return label, fn, sig, const, const["num_warps"], stages, _aligned(fn, sig), GluonASTSource


def attention_ws_cases(quick: bool):
    """The warp-specialized attention kernels (Gluon, ``attention_ws``: forward, dK/dV,
    dQ): b 128 and 64, D 128 and 64, causal or not, key padding."""
    from tilesparse.kernels import attention_ws, attention_ws_base, attention_ws_dkdv, attention_ws_dq

    fn = attention_ws_dkdv._bwd_dkdv_ws_kernel
    # (block, D, block_m, stages, causal, key padding, STORE_DS: dS into the workspace)
    cases = ((128, 128, 64, 2, True, False, False),) if quick else \
        ((128, 128, 64, 2, True, False, False), (128, 128, 64, 3, False, True, False), (64, 64, 64, 2, True, True, False),
         (128, 64, 64, 2, False, False, False), (128, 128, 64, 2, True, False, True), (64, 64, 64, 2, False, True, True))
    # two consumer warpgroups (half the keys each) at blocks of 128
    cases = tuple((*case, 1) for case in cases) + (((128, 128, 64, 2, True, False, False, 2),) if quick else
                                                   ((128, 128, 64, 2, True, False, False, 2),
                                                    (128, 128, 64, 2, False, True, True, 2),
                                                    (128, 64, 64, 2, True, False, True, 2)))
    # OVERLAP: the elementwise work under asynchronous wgmma (two consumers, with and without dS stores)
    cases = tuple((*case, False) for case in cases) + (((128, 128, 64, 2, True, False, False, 2, True),) if quick else
                                                       ((128, 128, 64, 2, True, False, False, 2, True),
                                                        (128, 128, 64, 2, False, True, True, 2, True),
                                                        (128, 64, 64, 2, True, True, False, 2, True),
                                                        (64, 64, 64, 2, True, True, False, 1, True)))
    # STATS_SMEM: lse and delta through the ring stage (cp.async), synchronous and overlapped
    cases = tuple((*case, False) for case in cases) + (((128, 128, 64, 2, True, False, False, 2, False, True),) if quick
                                                       else ((128, 128, 64, 2, True, False, False, 2, False, True),
                                                             (128, 128, 64, 2, False, True, False, 2, True, True),
                                                             (64, 64, 64, 3, True, True, False, 1, False, True)))
    for block, head_dim, block_m, stages, causal, kpm, store_ds, consumers, overlap, stats in cases:
        qo, kv = attention_ws_base._layouts(block_m, block, head_dim, torch.bfloat16)
        const = dict(BS=block, D=head_dim, BLOCK_M=block_m, STAGES=stages, CAUSAL=causal, HAS_KPM=kpm, LOAD_REGS=40,
                     STORE_DS=store_ds, qo_layout=qo, kv_layout=kv, num_warps=block // 16 // consumers,
                     CONSUMERS=consumers, MMA_REGS=232, OVERLAP=overlap, STATS_SMEM=stats, ATOMIC_DQ=0,
                     dq_layout=None, ds_smem_layout=None, STAGED_STORES=False, out_smem_layout=None,
                     HOST_DESCS=False, PERSISTENT=False, ORDERED=False, ORDERED_DQ=False, FIRST_STORE=False,
                     STAMPS=False, LAST_UNCOUNTED=False)
        sig = _attention_signature(fn, "bf16", const)
        yield (f"ws attention dK/dV b{block} D{head_dim} causal={causal} kpm={kpm}" + (" store_ds" if store_ds else "")
               + (" two consumers" if consumers == 2 else "") + (" overlap" if overlap else "")
               + (" stats_in_smem" if stats else ""), fn, sig, const, const["num_warps"], stages, _aligned(fn, sig),
               GluonASTSource)
    # ATOMIC_DQ: dQ's share added by TMA reductions (block_m 64; per case: block, D, stages, causal, key padding,
    # consumers, overlap, stats in shared memory)
    atomic = ((128, 128, 2, True, False, 2, False, True),) if quick else \
        ((128, 128, 2, True, False, 2, False, True), (128, 128, 2, False, True, 2, True, False),
         (128, 64, 2, True, False, 2, True, False), (128, 64, 3, False, False, 2, False, True),
         (64, 64, 2, True, True, 1, False, False), (64, 128, 2, False, False, 1, False, True))
    # mode 2 (shared_ds): the two consumers share each dSᵀ tile, each adds half of dQ's columns
    shared = ((128, 128, 2, True, False, 2, False, True),) if quick else \
        ((128, 128, 2, True, False, 2, False, True), (128, 128, 2, False, True, 2, True, False),
         (128, 64, 2, True, True, 2, True, True))
    for mode, cases in ((1, atomic), (2, shared)):
        for block, head_dim, stages, causal, kpm, consumers, overlap, stats in cases:
            yield _dkdv_case(fn, mode, block, head_dim, stages, causal, kpm, consumers, overlap, stats)
    # fa3_order (shared dS, every wgmma asynchronous) at FlashAttention-3's register split 240 / 24
    fa3 = ((128, 128, True, False, True),) if quick else \
        ((128, 128, True, False, True), (128, 128, False, True, True), (128, 128, False, False, False),
         (128, 64, True, True, True))
    for block, head_dim, causal, kpm, stats in fa3:
        yield _dkdv_case(fn, 2, block, head_dim, 2, causal, kpm, 2, 2, stats, mma_regs=240, load_regs=24)
    # staged_stores: dK and dV through the idle staging tiles (both modes, both head dims, one consumer at b 64)
    staged = ((2, 128, 128, True, False, 2, 2, True, 240, 24),) if quick else \
        ((2, 128, 128, True, False, 2, 2, True, 240, 24), (2, 128, 128, False, True, 2, False, True, 232, 40),
         (2, 128, 64, True, True, 2, False, True, 232, 40), (1, 128, 64, False, False, 2, False, True, 232, 40),
         (1, 64, 128, True, True, 1, False, False, 232, 40), (1, 64, 64, False, False, 1, False, True, 232, 40))
    for mode, block, head_dim, causal, kpm, consumers, overlap, stats, mma_regs, load_regs in staged:
        yield _dkdv_case(fn, mode, block, head_dim, 2, causal, kpm, consumers, overlap, stats, mma_regs=mma_regs,
                              load_regs=load_regs, staged=True)
    # host_descs: the descriptors built on the host (shared dS at D 128 / 64, the plain mode at D 64)
    # (mode 0: the deterministic kernel, no dQ buffer)
    host = ((2, 128, True, True),) if quick else ((2, 128, True, True), (2, 64, False, False), (1, 64, True, False),
                                                  (0, 128, True, False))
    for mode, head_dim, causal, fa3 in host:
        yield _dkdv_case(fn, mode, 128, head_dim, 2, causal, False, 2, 2 if fa3 else False, True,
                              mma_regs=240 if fa3 else 232, load_regs=24 if fa3 else 40, staged=fa3, host=True)
    # persistent: items of (key block, batch * kv head) in turn (mode 0: deterministic; per case: mode, D, causal,
    # key padding, FlashAttention-3's order with staged stores and host descriptors)
    # (+ scheduled: each program's share of the balanced schedule, persistent with balanced)
    persistent = ((2, 128, True, False, False, False),) if quick else \
        ((2, 128, True, False, False, False), (0, 128, False, True, False, False), (2, 128, True, False, True, False),
         (1, 64, False, True, False, False), (2, 64, True, False, True, False), (0, 128, False, False, False, True),
         (0, 64, True, False, False, True), (2, 128, False, False, True, True))
    for mode, head_dim, causal, kpm, fa3, scheduled in persistent:
        yield _dkdv_case(fn, mode, 128, head_dim, 2, causal, kpm, 2, 2 if fa3 else False, True,
                              mma_regs=240 if fa3 else 232, load_regs=24 if fa3 else 40, staged=fa3, host=fa3 or scheduled,
                              persistent=True, ordered=scheduled)
    if not quick:  # scheduled with one consumer (D 64, as its GPU test runs it) and in atomic mode 1
        yield _dkdv_case(fn, 0, 128, 64, 2, False, True, 1, False, True, persistent=True, ordered=True)
        yield _dkdv_case(fn, 1, 128, 64, 2, True, False, 2, False, True, persistent=True, ordered=True)
    # balanced: the programs in the launch-order table's order (the shipped modes: deterministic with host
    # descriptors; shared dS in FlashAttention-3's order, staged, host; D 64's plain mode staged, host)
    # (per case: mode, D, causal, key padding, overlap, stats in smem, registers, staged stores, host
    # descriptors, dS stored)
    ordered = ((2, 128, True, False, 2, True, (240, 24), True, True, False),) if quick else \
        ((0, 128, True, False, False, True, (232, 40), False, True, False),
         (2, 128, False, False, 2, True, (240, 24), True, True, False),
         (1, 64, True, False, False, True, (232, 40), True, True, False),
         (0, 64, False, False, True, False, (232, 40), False, True, False),
         (0, 128, False, True, False, True, (232, 40), False, True, False),  # key padding
         (2, 128, True, True, 2, True, (240, 24), True, False, False),  # device-built descriptors
         (0, 128, True, False, False, True, (232, 40), False, False, True))  # dS stored
    for mode, head_dim, causal, kpm, overlap, stats, (mma_regs, load_regs), staged, host, store_ds in ordered:
        yield _dkdv_case(fn, mode, 128, head_dim, 2, causal, kpm, 2, overlap, stats, mma_regs=mma_regs,
                         load_regs=load_regs, staged=staged, host=host, ordered=True, store_ds=store_ds)
    # ordered_dq: the shared-dS shares added in a fixed order by a dQ writer warp (the deterministic 5-product
    # backward; per case: D, causal, key padding, FlashAttention-3's order)
    # (per case: D, causal, key padding, overlap: 2 FlashAttention-3's order, host descriptors)
    ordered_dq = ((128, True, False, 2, True),) if quick else \
        ((128, True, False, 2, True), (128, False, True, 2, True), (128, True, False, False, True),
         (64, False, False, 2, True), (128, False, False, 2, False), (128, True, True, True, False))
    from tilesparse.kernels.attention_ws_dkdv import ORDERED_DQ_WRITER
    for head_dim, causal, kpm, overlap, host in ordered_dq:
        yield _dkdv_case(fn, 2, 128, head_dim, 2, causal, kpm, 2, overlap, True,
                         mma_regs=240 if overlap == 2 else 232, load_regs=24 if overlap == 2 else 40, host=host,
                         ordered=True, ordered_dq=ORDERED_DQ_WRITER)
    if not quick:  # dK and dV stored through the staging tiles once the dQ writer frees them (staged_stores)
        yield _dkdv_case(fn, 2, 128, 128, 2, True, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         staged=True, ordered=True, ordered_dq=ORDERED_DQ_WRITER)
    if not quick:  # each query tile's first share stored, not added (first_share_stored)
        yield _dkdv_case(fn, 2, 128, 128, 2, True, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         ordered=True, ordered_dq=ORDERED_DQ_WRITER, first_store=True)
    if not quick:  # dK and dV stored through the drained Q / dO ring (ring_stores, STAGED_STORES 2): the
        # deterministic D 128 default, the shipped deterministic=False mode, the ordered one, D 64's
        yield _dkdv_case(fn, 0, 128, 128, 2, True, True, 2, False, True, host=True, ordered=True, staged=2)
        yield _dkdv_case(fn, 2, 128, 128, 2, False, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         ordered=True, staged=2)
        yield _dkdv_case(fn, 2, 128, 128, 2, True, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         ordered=True, ordered_dq=ORDERED_DQ_WRITER, first_store=True, staged=2)
        yield _dkdv_case(fn, 0, 128, 64, 2, False, False, 2, True, False, host=True, ordered=True, staged=2)
    if not quick:  # each query tile's last share not counted (last_uncounted): the ordered default with it,
        # with the other dQ writer, and with dK / dV through the staging tiles the writer frees
        yield _dkdv_case(fn, 2, 128, 128, 2, True, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         ordered=True, ordered_dq=ORDERED_DQ_WRITER, first_store=True, staged=2, last_uncounted=True)
        yield _dkdv_case(fn, 2, 128, 128, 2, False, True, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         ordered=True, ordered_dq=3 - ORDERED_DQ_WRITER, last_uncounted=True)
        yield _dkdv_case(fn, 2, 128, 128, 2, True, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         staged=True, ordered=True, ordered_dq=ORDERED_DQ_WRITER, last_uncounted=True)
    if not quick:  # a probe's time stamps per program, in the shipped deterministic=False mode at D 128
        yield _dkdv_case(fn, 2, 128, 128, 2, False, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         staged=True, ordered=True, stamps=True)
    if not quick:  # the other dQ writer (ORDERED_DQ 1: the counters read once the shares are handed over)
        yield _dkdv_case(fn, 2, 128, 128, 2, True, False, 2, 2, True, mma_regs=240, load_regs=24, host=True,
                         ordered=True, ordered_dq=3 - ORDERED_DQ_WRITER)
    if not quick:  # one head (and S 1): Triton makes such arguments compile-time constants
        label, fn, sig, const, warps, stages, *extra = _dkdv_case(fn, 1, 64, 128, 2, False, False, 1, False, True)
        const = dict(const, H=1, S=1)
        yield ("ws attention dK/dV atomic_dq H=1 S=1 (constants)", fn, _attention_signature(fn, "bf16", const), const,
               warps, stages, *extra)
    # the row walks: dQ (per case: block, D, block_m, block_n, stages, causal, key padding), then the forward
    row_cases = {
        "dQ": (attention_ws_dq._bwd_dq_ws_kernel, ((128, 128, 128, 64, 2, True, False),) if quick else
               ((128, 128, 128, 64, 2, True, False), (128, 128, 128, 128, 2, False, True), (64, 64, 64, 64, 3, True, True))),
        "fwd": (attention_ws._fwd_ws_kernel, ((128, 128, 128, 128, 2, True, False),) if quick else
                ((128, 128, 128, 128, 2, True, False), (128, 128, 128, 64, 3, False, True), (64, 64, 64, 64, 2, True, True))),
    }
    from tilesparse.kernels import attention_ws_persistent

    row_cases["persistent fwd"] = (attention_ws_persistent._fwd_ws_persistent_kernel,
                                   ((128, 128, 128, 128, 2, True, False),) if quick else
                                   ((128, 128, 128, 128, 2, True, False), (128, 128, 128, 64, 3, False, True),
                                    (64, 64, 64, 64, 2, True, True)))
    # the persistent forward with the softmax under the P V wgmma (OVERLAP)
    row_cases["persistent fwd overlap"] = (attention_ws_persistent._fwd_ws_persistent_kernel,
                                           ((128, 128, 128, 128, 2, True, False),) if quick else
                                           ((128, 128, 128, 128, 2, True, False), (128, 128, 128, 128, 2, False, False),
                                            (128, 128, 128, 64, 3, False, True), (64, 64, 64, 64, 2, True, True)))
    row_cases["dQ two consumers"] = (attention_ws_dq._bwd_dq_ws_kernel, ((128, 128, 128, 128, 2, True, False),) if quick
                                     else ((128, 128, 128, 128, 2, True, False), (128, 64, 128, 64, 3, False, True)))
    # S and dP as asynchronous wgmma, P under dP's
    row_cases["dQ overlap two consumers"] = (attention_ws_dq._bwd_dq_ws_kernel, ((128, 128, 128, 128, 2, True, False),)
                                             if quick else ((128, 128, 128, 128, 2, True, False),
                                                            (128, 64, 128, 64, 3, False, True)))
    row_cases["dQ overlap"] = (attention_ws_dq._bwd_dq_ws_kernel, () if quick else ((64, 64, 64, 64, 3, True, True),))
    # host-built descriptors (DqWsConfig.host_descs), with the default's two consumers and overlap
    row_cases["dQ overlap two consumers host_descs"] = (attention_ws_dq._bwd_dq_ws_kernel,
                                                        ((128, 128, 128, 128, 2, True, False),) if quick else
                                                        ((128, 128, 128, 128, 2, True, False),
                                                         (128, 64, 128, 128, 2, False, True)))
    # launched in the launch-order table's order (DqWsConfig.balanced), as the default
    row_cases["dQ overlap two consumers host_descs ordered"] = (attention_ws_dq._bwd_dq_ws_kernel,
                                                                ((128, 128, 128, 128, 2, True, False),) if quick else
                                                                ((128, 128, 128, 128, 2, True, False),
                                                                 (128, 64, 128, 128, 2, False, True)))
    # the default's: delta = rowsum(dO · O) computed in the kernel (DqWsConfig.delta)
    row_cases["dQ overlap two consumers host_descs ordered delta"] = (
        attention_ws_dq._bwd_dq_ws_kernel, ((128, 128, 128, 128, 2, True, False),) if quick else
        ((128, 128, 128, 128, 2, True, False), (128, 64, 128, 128, 2, False, True)))
    row_cases["dQ delta"] = (attention_ws_dq._bwd_dq_ws_kernel, () if quick else ((64, 64, 64, 64, 3, True, True),))
    # dQ stored through each consumer's rows of the Q tile (DqWsConfig.staged_stores): the D 128 default
    row_cases["dQ overlap two consumers host_descs ordered delta staged"] = (
        attention_ws_dq._bwd_dq_ws_kernel, ((128, 128, 128, 128, 2, True, False),) if quick else
        ((128, 128, 128, 128, 2, True, False), (128, 64, 128, 128, 2, False, True)))
    row_cases["dQ staged"] = (attention_ws_dq._bwd_dq_ws_kernel, () if quick else ((64, 64, 64, 64, 3, True, True),))
    row_cases["persistent fwd overlap two consumers"] = (attention_ws_persistent._fwd_ws_persistent_kernel,
                                                         ((128, 128, 128, 128, 2, True, False),) if quick else
                                                         ((128, 128, 128, 128, 2, True, False),
                                                          (128, 64, 128, 64, 3, False, True),
                                                          (128, 64, 128, 128, 2, True, False)))
    # the default persistent forward with O stored through the consumers' Q rows (FwdWsConfig.staged_stores)
    row_cases["persistent fwd overlap two consumers staged"] = (
        attention_ws_persistent._fwd_ws_persistent_kernel, () if quick else
        ((128, 128, 128, 128, 2, True, False), (128, 64, 128, 64, 3, False, True)))
    for kind, (fn, cases) in row_cases.items():
        for block, head_dim, block_m, block_n, stages, causal, kpm in cases:
            qo, kv = attention_ws_base._layouts(block_m, block_n, head_dim, torch.bfloat16)
            const = dict(BS=block, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                         HAS_KPM=kpm, LOAD_REGS=40, qo_layout=qo, kv_layout=kv, num_warps=block_m // 16)
            if "CONSUMERS" in fn.arg_names:  # the defaulted constexprs, named (else typed as runtime ints)
                const.update(CONSUMERS=1, MMA_REGS=232)
            if kind.startswith("dQ"):
                const.update(OVERLAP="overlap" in kind, HOST_DESCS="host_descs" in kind,
                             ORDERED=" ordered" in kind, DELTA=" delta" in kind, STAGED_STORES=kind.endswith("staged"))
            if kind.startswith("persistent"):  # with the balanced schedule: the two-consumer ones and the
                # synchronous b 128 one
                const.update(OVERLAP=False, SCHEDULED=kind.endswith(("two consumers", "staged")) or
                             (kind == "persistent fwd" and block == 128 and block_n == 64),
                             STAGED_STORES=kind.endswith("staged"))
            if kind.endswith("overlap"):
                const["OVERLAP"] = True
            if "two consumers" in kind:  # a warpgroup each, half the rows
                const.update(CONSUMERS=2, num_warps=block_m // 32)
                if kind.startswith("persistent"):
                    const["OVERLAP"] = True
            sig = _attention_signature(fn, "bf16", const)
            if const.get("HOST_DESCS"):
                _host_desc_types(sig, block_m, block_n, head_dim, qo, kv)
                if const.get("DELTA"):  # the output's tile too
                    sig["o_ptr"] = _desc_type("bf16", block_m, head_dim, qo)
            yield (f"ws attention {kind} b{block} D{head_dim} m{block_m} n{block_n} causal={causal} kpm={kpm}", fn,
                   sig, const, const["num_warps"], stages, _aligned(fn, sig), GluonASTSource)
