"""The kernel cases that ``scripts/sm90_compile_check.py`` compiles for sm_90 (and
``sm90_ptx_fingerprints.py`` hashes): the 2:4, small-batch, FMA, panel, LSTM cell, sdd and
warp-specialized / resident (Gluon) kernels here, the attention kernels in
``sm90_attention_cases.py``. Each case: (label, kernel, signature, constexprs, warps, stages[, attrs,
source]). :func:`all_cases` lists every one in the check's order."""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    raise ImportError("sm90_cases needs TRITON_INTERPRET unset: the interpreter replaces the kernels to compile")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402  (private: Gluon's AST source)

from sm90_attention_cases import attention_cases, attention_ws_cases  # noqa: E402  (this folder's)

from tilesparse.kernels import block_scatter  # noqa: E402
from tilesparse.kernels import bsmm_gemv  # noqa: E402
from tilesparse.kernels import bsmm_panel  # noqa: E402
from tilesparse.kernels import bsmm_resident, bsmm_resident_columns  # noqa: E402
from tilesparse.kernels import bsmm_sdd_group  # noqa: E402
from tilesparse.kernels import bsmm_sdd_tile  # noqa: E402
from tilesparse.kernels import bsmm_small  # noqa: E402
from tilesparse.kernels import lstm_cell  # noqa: E402
from tilesparse.kernels import bsmm_ws  # noqa: E402
from tilesparse.kernels import bsmm_ws_group  # noqa: E402
from tilesparse.kernels import bsmm_ws_sdd_group  # noqa: E402
from tilesparse.kernels import bsmm_ws_sdd_rows  # noqa: E402
from tilesparse.kernels import bsmm_ws_sdd  # noqa: E402
from tilesparse.kernels import semi24  # noqa: E402
from tilesparse.kernels import semi24_pack  # noqa: E402
from tilesparse.kernels import transpose  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def semi24_cases(quick: bool):
    for dt in (("bf16",) if quick else ("fp32", "fp16", "bf16")):
        yield (f"2:4 prune rows {dt}", semi24._prune_rows_kernel,
               {"w_ptr": f"*{dt}", "out_ptr": f"*{dt}", "mask_ptr": "*u8", "n_groups": "i64", "BLOCK_G": "constexpr"},
               {"BLOCK_G": 256}, 4, 2)
        for greedy in ((False,) if quick else (False, True)):
            for values in ((True,) if quick else (False, True)):
                const = {"BLOCK_T": 64, "GREEDY": greedy, "WRITE_VALUES": values}
                yield (f"2:4 transposable {dt} greedy={greedy} values={values}", semi24._transposable_kernel,
                       {"w_ptr": f"*{dt}", "mask_ptr": "*u8", "out_ptr": f"*{dt}", "out_t_ptr": f"*{dt}",
                        "rows_table_ptr": "*i32", "bits_table_ptr": "*i32", "N": "i32", "K": "i32", "n_tiles": "i64",
                        "tiles_per_row": "i32", "BLOCK_T": "constexpr", "GREEDY": "constexpr",
                        "WRITE_VALUES": "constexpr"}, const, 4, 2)
        if dt != "fp32":  # the pack kernel moves 16-bit patterns (cuSPARSELt's 2:4 dtypes)
            yield (f"2:4 pack kept rows {dt}", semi24_pack._pack_kept_rows_kernel,
                   {"w_ptr": f"*{dt}", "m_ptr": "*u8", "out_ptr": f"*{dt}", "R": "i32", "C": "i32", "swr": "i32",
                    "swc": "i32", "smr": "i32", "smc": "i32", "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"},
                   {"BLOCK_R": 32, "BLOCK_C": 128}, 4, 2)
        yield (f"transpose copy {dt}", transpose._transpose_kernel,
               {"src": f"*{dt}", "dst": f"*{dt}", "rows": "i32", "cols": "i32", "src_stride": "i32",
                "dst_stride": "i32", "TILE": "constexpr"}, {"TILE": 64}, 4, 2)
        for b in ((16,) if quick else (16, 48, 128)):  # the dense path's block copies
            bp, g = triton.next_power_of_2(b), block_scatter._group(b)
            yield (f"block scatter {dt} b{b}", block_scatter._scatter_kernel,
                   {"values": f"*{dt}", "slots": "*i32", "dense": f"*{dt}", "C": "i32", "n_groups": "i32", "ld": "i32",
                    "B": "constexpr", "BP": "constexpr", "G": "constexpr"}, {"B": b, "BP": bp, "G": g},
                   block_scatter._warps(b), 2)
            yield (f"block gather {dt} b{b}", block_scatter._gather_kernel,
                   {"dense": f"*{dt}", "row_of": "*i32", "col_of": "*i32", "values": f"*{dt}", "nnz": "i32",
                    "ld": "i32", "B": "constexpr", "BP": "constexpr", "G": "constexpr"}, {"B": b, "BP": bp, "G": g},
                   block_scatter._warps(b), 2)
        yield (f"2:4 apply+transpose {dt}", semi24._apply_transpose_kernel,
               {"w_ptr": f"*{dt}", "mask_ptr": "*u8", "out_ptr": f"*{dt}", "out_t_ptr": f"*{dt}", "N": "i32",
                "K": "i32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}, {"BLOCK_N": 64, "BLOCK_K": 64}, 4, 2)


def small_cases(quick: bool):
    """The small-batch dds kernel at M 64 (b 128 and 16, fprop and bprop): the default
    orientation (mma.sync at 32-wide slices) and the swapped one (wgmma expected); and its
    feature-major tiles at large M (b 64 / 32 / 16, 256 activation rows per program); the
    128-row, row-tiles-inner programs for M 128-512."""
    fn = bsmm_small._dds_small_kernel
    # (block, sub, block_k, stages, trans, block_m, warps, swap variants[, M_INNER[, PREFETCH]])
    cases = ((128, 32, 128, 8, True, 64, 4, (False, True)), (16, 16, 64, 8, False, 64, 4, (False, True))) if quick else \
        ((128, 32, 128, 8, True, 64, 4, (False, True)), (128, 32, 128, 8, False, 64, 4, (False, True)),
         (64, 32, 64, 12, False, 64, 4, (False, True)), (16, 16, 64, 8, True, 64, 4, (False, True)),
         (64, 64, 64, 3, True, 256, 8, (False,)), (64, 64, 64, 3, False, 256, 8, (False,)),
         (32, 32, 64, 4, True, 256, 4, (False,)), (16, 16, 64, 4, False, 256, 4, (False,)),
         # M 128-512: 128 activation rows per program, two warpgroups, the row tiles inner (M_INNER)
         (128, 128, 64, 4, True, 128, 8, (True,), True), (128, 128, 64, 4, False, 128, 8, (True,), True),
         (64, 64, 64, 6, True, 128, 8, (True,), True), (128, 32, 64, 8, True, 128, 8, (True,), True),
         (128, 32, 64, 12, False, 64, 4, (True,), True),  # the swap default's 64-row tiles
         # PREFETCH (block indices two steps ahead, activation tiles one): M 1 and 64, b 128 and 16
         (128, 32, 128, 8, True, 16, 4, (False,), False, True), (16, 16, 64, 8, True, 16, 4, (False,), False, True),
         (128, 32, 64, 12, True, 64, 4, (True,), False, True), (64, 32, 64, 12, False, 64, 4, (True,), False, True),
         # L2_AHEAD (bulk L2 prefetches of the weight ahead of the ring), fprop: slices that are whole
         # blocks (b 32, and b 16's steps over 4 blocks) and slices of wider blocks (b 128, b 64 swapped)
         (32, 32, 32, 12, True, 16, 4, (False,), False, False, 16), (16, 16, 64, 8, True, 16, 4, (False,), False, True, 16),
         (128, 32, 128, 8, True, 16, 4, (False,), False, False, 8), (64, 32, 64, 12, True, 64, 4, (True,), False, False, 8),
         # and bprop (slot tables: whole blocks, slots loaded a block ahead)
         (32, 32, 32, 12, False, 16, 4, (False,), False, False, 16), (128, 32, 128, 8, False, 16, 4, (False,), False, False, 8),
         (64, 32, 64, 12, False, 64, 4, (True,), False, True, 8),
         # SPREAD_INDEX (b 16's steps over 4 / 8 blocks: one index and slot load per block, not per
         # lane), the shipped b 16 configs: prefetch fprop and bprop at 16 rows, plain at 64
         (16, 16, 64, 8, True, 16, 4, (False,), False, True, 0, True),
         (16, 16, 128, 8, False, 16, 4, (False,), False, True, 0, True),
         (16, 16, 64, 8, True, 64, 4, (False,), False, False, 0, True),
         (16, 16, 128, 8, False, 64, 4, (False,), False, False, 0, True))
    for block, sub, block_k, stages, trans, block_m, warps, swaps, *flags in cases:
        m_inner, prefetch, l2_ahead, spread = (list(flags) + [False, False, 0, False])[:4]
        for swap in swaps:
            # the first case also as a programmatic dependent launch (mode 2, the default on sm90)
            pdl = 2 if (block, trans, block_m, swap, m_inner, prefetch) == (128, True, 64, False, False, False) else 0
            const = dict(B=block, TILE_B=block, SUB=sub, BLOCK_K=block_k, BLOCK_M=block_m, SPLITS=1, CHUNKS=1,
                         LONGEST_FIRST=False, SWAP=swap, M_INNER=m_inner, PREFETCH=prefetch, TRANS_V=trans, HAS_SLOT=not trans, HAS_BIAS=True,
                         INPUT_PRECISION="ieee", stride_ak=1, stride_cn=1, PDL=pdl, L2_AHEAD=l2_ahead,
                         SPREAD_INDEX=spread)
            # pointers 16-byte aligned, as the launches' tensors are (Triton specializes on it), and
            # the row strides multiples of 16, as at every width the suites run (K, N = 4096-12288):
            # without the strides' divisibility the activation gather compiles to eight 2-byte loads
            # per thread and step instead of one 16-byte load (b 16 with prefetch: 520 lines of
            # SASS instead of 320), which is not what runs
            sig, aligned = bf16_signature(fn, const, ("ptr_ptr", "idx_ptr", "slot_ptr", "sem_ptr", "order_ptr"),
                                          fp32=("ws_ptr",))
            yield (f"small dds b{block} sub{sub} M{block_m} {'fprop' if trans else 'bprop'} swap={swap}"
                   + (" m_inner" if m_inner else "") + (" prefetch" if prefetch else "")
                   + (f" l2_ahead{l2_ahead}" if l2_ahead else "") + (" spread_index" if spread else "")
                   + (" pdl" if pdl else ""), fn, sig,
                   const, warps, stages, aligned)


def signature(fn, const: dict, int32: tuple[str, ...] = (), fp32: tuple[str, ...] = (), dtype: str = "bf16") -> dict:
    """The argument types of ``fn`` with constexprs ``const``: the ``int32`` pointers (index
    tables, counters) int32, the ``fp32`` ones fp32 (split partials, workspaces), every other
    pointer ``dtype``, other arguments i32."""
    return {name: "constexpr" if name in const else "*i32" if name in int32 else "*fp32" if name in fp32
            else f"*{dtype}" if name.endswith("_ptr") else "i32" for name in fn.arg_names}


def bf16_signature(fn, const: dict, tables: tuple[str, ...], aligned_ints: tuple[str, ...] = ("stride_am", "stride_cm"),
                   fp32: tuple[str, ...] = ()):
    """(signature, attrs) of ``fn`` with constexprs ``const``: :func:`signature` with the
    index ``tables`` int32 and the rest bf16; the pointers and ``aligned_ints`` divisible
    by 16, as launches with 16-byte aligned tensors and row strides specialize them."""
    sig = signature(fn, const, tables, fp32)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if name.endswith("_ptr") or name in aligned_ints}
    return sig, aligned


def lstm_cell_cases(quick: bool):
    """The LSTM cell's forward (with the gates' second operand, the previous state and the saved gates;
    with and without h^T for a K-major recurrent product) and backward kernels, bf16, PDL off and on."""
    fwd, bwd = lstm_cell._lstm_cell_fwd_kernel, lstm_cell._lstm_cell_bwd_kernel
    for write_ht, pdl in ((True, 0),) if quick else ((True, 0), (False, 0), (True, 2)):
        const = dict(HAS_G2=True, HAS_C_PREV=True, SAVE_ACTS=True, WRITE_HT=write_ht, BLOCK_B=8, BLOCK_H=128,
                     PDL=pdl)
        yield ("lstm cell fwd" + (" ht" if write_ht else "") + (f" (pdl mode {pdl})" if pdl else ""), fwd, signature(fwd, const),
               const, 4, 1, None)
    if not quick:
        const = dict(HAS_DH2=True, HAS_DC=True, HAS_C_PREV=True, WRITE_DC_PREV=True, BLOCK_B=8, BLOCK_H=128, PDL=0)
        yield "lstm cell bwd", bwd, signature(bwd, const), const, 4, 1, None


def gemv_cases(quick: bool):
    """The few-row FMA dds (``bsmm_gemv``): steps over several b 16 blocks and within a b 128
    block, 1-8 rows, both table directions, both accumulator forms, the H200's shipped
    configs (b 16: 128-wide steps and 8 warps at 1 row, 64-wide at 2-4) and half-block slices."""
    fn = bsmm_gemv._dds_gemv_kernel
    cases = ((16, 16, 256, 1, True, False, 4),) if quick else (
        (16, 16, 256, 1, True, False, 4), (16, 16, 512, 1, False, True, 4), (16, 16, 64, 8, True, True, 4),
        (32, 32, 128, 1, True, False, 4), (128, 32, 64, 4, False, True, 4), (128, 32, 32, 8, True, True, 4),
        (16, 16, 128, 1, True, False, 8), (16, 16, 64, 4, False, False, 4), (16, 8, 128, 1, True, False, 4),
        # L2 prefetch hints (fprop): whole blocks over multi-block steps, slices of a b 128 block
        (16, 16, 128, 1, True, False, 8, 16), (16, 16, 64, 4, True, False, 4, 32), (128, 32, 32, 8, True, True, 4, 8))
    for block, sub, block_k, m_pad, trans, reduce_each_step, warps, *l2 in cases:
        l2_ahead = l2[0] if l2 else 0
        const = dict(B=block, TILE_B=block, SUB=sub, BLOCK_K=block_k, M_PAD=m_pad, TRANS_V=trans, HAS_SLOT=not trans,
                     HAS_BIAS=True, REDUCE_EACH_STEP=reduce_each_step, stride_ak=1, stride_cn=1, PDL=0,
                     L2_AHEAD=l2_ahead)
        sig, aligned = bf16_signature(fn, const, ("ptr_ptr", "idx_ptr", "slot_ptr"))
        yield (f"gemv dds b{block} sub{sub} k{block_k} M{m_pad} {'fprop' if trans else 'bprop'}"
               + (" reduce" if reduce_each_step else "") + (f" w{warps}" if warps != 4 else "")
               + (f" l2_ahead{l2_ahead}" if l2_ahead else ""),
               fn, sig, const, warps, 1, aligned)


def panel_cases(quick: bool):
    """The panel dds (``bsmm_panel``, b 16, G 8: 128-column panels) at 16-64 activation
    rows, with and without splits of the reduction (fp32 partials)."""
    fn = bsmm_panel._dds_panel_kernel
    cases = ((64, 8),) if quick else ((64, 1), (64, 8), (32, 8), (16, 8))
    for block_m, splits in cases:
        const = dict(B=16, G=8, BLOCK_M=block_m, SPLITS=splits, TRANS_V=True, HAS_BIAS=True, GROUP_M=8,
                     INPUT_PRECISION="ieee", ENTRIES=1, SWAP=False, FUSED_SUM=False, stride_ak=1, stride_cn=1, L2_AHEAD=0)
        sig = signature(fn, const, ("pptr_ptr", "pk_ptr", "pslots_ptr", "sem_ptr"),
                        ("c_ptr", "ws_ptr") if splits > 1 else ("ws_ptr",))
        yield f"panel dds b16 G8 M{block_m} splits {splits}", fn, sig, const, 4, 4
    # deep steps with the features on the MMA's M side (few rows): expected wgmma, cp.async
    # (the last two: the split partials summed in-kernel by each tile's last split, FUSED_SUM)
    deep = ((64, True, 4, False),) if quick else ((64, True, 4, False), (32, True, 4, False), (16, True, 4, False),
                                                  (64, False, 4, False), (16, True, 8, False), (16, False, 4, True),
                                                  (64, True, 4, True),
                                                  # L2 prefetch hints of the union's blocks ahead (the 5th field)
                                                  (32, True, 4, False, 16), (64, False, 4, True, 8), (16, True, 8, False, 32))
    for block_m, trans_v, entries, fused, *l2 in deep:
        l2_ahead = l2[0] if l2 else 0
        const = dict(B=16, G=8, BLOCK_M=block_m, SPLITS=4, TRANS_V=trans_v, HAS_BIAS=True, GROUP_M=8,
                     INPUT_PRECISION="ieee", ENTRIES=entries, SWAP=True, FUSED_SUM=fused, stride_ak=1, stride_cn=1,
                     L2_AHEAD=l2_ahead)
        sig, aligned = bf16_signature(fn, const, ("pptr_ptr", "pk_ptr", "pslots_ptr", "sem_ptr"),
                                      fp32=("ws_ptr",) if fused else ("c_ptr", "ws_ptr"))
        yield (f"panel dds b16 G8 M{block_m} e{entries} swap {'fprop' if trans_v else 'bprop'}"
               + (" fused sum" if fused else "") + (f" l2_ahead{l2_ahead}" if l2_ahead else ""), fn, sig, const, 4, 4,
               aligned)


def sdd_group_cases(quick: bool):
    """The grouped sdd (``bsmm_sdd_group``): several blocks of a block-row per program,
    bf16; expected: wgmma (the swapped orientation at b < 64) and cp.async pipelining
    (M and the row strides divisible by 16, as Triton specializes them at launch)."""
    fn = bsmm_sdd_group._sdd_group_kernel
    # (block, group, swap, warps, stages)
    cases = ((64, 4, False, 8, 3), (16, 16, True, 8, 3)) if quick else \
        ((64, 4, False, 8, 3), (64, 4, True, 8, 3), (64, 2, False, 4, 4), (32, 8, True, 8, 3), (32, 4, True, 4, 4),
         (16, 16, True, 8, 3), (16, 8, True, 4, 4), (8, 8, True, 4, 3), (128, 2, False, 8, 3))
    for block, group, swap, warps, stages in cases:
        const = dict(B=block, TILE_B=max(16, block), GROUP=group, BLOCK_M=64, SWAP=swap, INPUT_PRECISION="ieee",
                     stride_ar=1, stride_bc=1)
        sig, aligned = bf16_signature(fn, const, ("starts_ptr", "row_ptr_ptr", "row_of_ptr", "cols_ptr"),
                                      ("M", "m_per_split", "stride_am", "stride_bm"))
        yield f"sdd group b{block} G{group} swap={swap}", fn, sig, const, warps, stages, aligned


def sdd_tile_cases(quick: bool):
    """The dense-tile sdd (``bsmm_sdd_tile``): a tile of blocks per program, bf16; expected:
    wgmma and cp.async pipelining (M and the strides along M divisible by 16)."""
    fn = bsmm_sdd_tile._sdd_tile_kernel
    # (block, tile rows, tile cols, block_m, warps, stages)
    cases = ((16, 128, 128, 64, 8, 3),) if quick else \
        ((16, 128, 128, 64, 8, 3), (16, 128, 128, 32, 4, 4), (32, 64, 128, 64, 4, 3), (32, 64, 64, 64, 4, 3),
         (64, 128, 128, 64, 8, 3), (16, 256, 128, 32, 8, 4), (32, 128, 256, 32, 8, 4))
    persistent = bsmm_sdd_tile._sdd_tile_persistent_kernel  # the same tiles over a fixed grid
    cases = [(fn, *case) for case in cases] + [(persistent, 16, 128, 128, 32, 4, 4), (persistent, 16, 128, 128, 64, 8, 3)]
    for kernel, block, rows, cols, block_m, warps, stages in cases:
        const = dict(B=block, TILE_R=rows, TILE_C=cols, BLOCK_M=block_m, INPUT_PRECISION="ieee",
                     stride_ar=1, stride_bc=1)
        sig, aligned = bf16_signature(kernel, const, ("slots_ptr", "order_ptr"), ("M", "stride_am", "stride_bm"))
        name = "persistent " if kernel is persistent else ""
        yield f"sdd tile {name}b{block} {rows}x{cols} m{block_m}", kernel, sig, const, warps, stages, aligned


def ws_cases(quick: bool):
    """The warp-specialized persistent kernels (Gluon, ``bsmm_ws``): dds fprop and bprop at
    b 128 and 64 (bf16; fp32 as TF32), sdd at b 128 and 64; expected: wgmma, and the
    producer warp's register budget (setmaxnreg)."""
    # (block, block_m, block_k, warps, stages, trans, pingpong, dtype, balanced schedule)
    cases = ((128, 128, 64, 8, 4, True, False, "bf16", False), (128, 128, 64, 4, 4, True, True, "bf16", False),
             (128, 128, 32, 8, 4, True, False, "fp32", False), (128, 128, 64, 8, 5, True, False, "bf16", True)) \
        if quick else \
        ((128, 128, 64, 8, 4, True, False, "bf16", False), (128, 128, 64, 8, 4, False, False, "bf16", False),
         (128, 256, 64, 8, 3, True, False, "bf16", False), (64, 128, 64, 4, 4, False, False, "bf16", False),
         (128, 128, 64, 4, 4, True, True, "bf16", False), (64, 128, 64, 4, 4, False, True, "bf16", False),
         (128, 128, 32, 8, 4, True, False, "fp32", False), (64, 128, 32, 4, 4, True, False, "fp32", False),
         (128, 128, 64, 8, 5, True, False, "bf16", True), (64, 128, 64, 4, 4, False, True, "bf16", True),
         (32, 128, 32, 8, 12, True, False, "bf16", False), (32, 256, 32, 8, 10, False, False, "bf16", False),
         (16, 128, 16, 8, 16, True, False, "bf16", False), (16, 128, 16, 8, 16, False, False, "bf16", False),
         (128, 128, 64, 4, 5, True, True, "bf16", True))
    fn = bsmm_ws._dds_ws_kernel
    for block, block_m, block_k, warps, stages, trans, pingpong, dt, balanced in cases:
        cfg = bsmm_ws.WsConfig(block_m, block_k, warps, stages, pingpong=pingpong, balanced=balanced)
        lay = bsmm_ws._layouts(cfg, block, trans, {"bf16": torch.bfloat16, "fp32": torch.float32}[dt])
        const = dict(B=block, BLOCK_M=block_m, BLOCK_K=block_k, STAGES=stages, TRANS_V=trans, HAS_SLOT=not trans,
                     HAS_BIAS=True, GROUP_M=8, LOAD_REGS=cfg.load_regs, PINGPONG=pingpong, MMA_REGS=cfg.mma_regs,
                     SCHEDULED=balanced, a_layout=lay.a, v_layout=lay.v,
                     c_layout=lay.c, num_warps=warps)
        sig = signature(fn, const, ("ptr_ptr", "idx_ptr", "slot_ptr", "sched_ptr"), dtype=dt)
        suffix = ("" if dt == "bf16" else f" {dt}") + (" balanced" if balanced else "")
        yield (f"ws dds b{block} m{block_m} w{warps} {'fprop' if trans else 'bprop'} pingpong={pingpong}{suffix}", fn,
               sig, const, warps, stages, None, GluonASTSource)
    sdd = bsmm_ws_sdd._sdd_ws_kernel
    for block, block_m, warps, stages in ((128, 64, 8, 5),) if quick else ((128, 64, 8, 5), (64, 64, 4, 5), (128, 128, 8, 3)):
        lay_ab, lay_out = bsmm_ws_sdd._sdd_layouts(block_m, block, torch.bfloat16)
        const = dict(B=block, BLOCK_M=block_m, STAGES=stages, LOAD_REGS=40, ab_layout=lay_ab, out_layout=lay_out,
                     num_warps=warps)
        sig = signature(sdd, const, ("rows_ptr", "cols_ptr"))
        yield f"ws sdd b{block} m{block_m} w{warps}", sdd, sig, const, warps, stages, None, GluonASTSource


def ws_group_cases(quick: bool):
    """The column-grouped warp-specialized dds (Gluon, ``bsmm_ws_group``): G output
    block-columns per tile, the activation from registers or from shared memory, one or
    two union entries per ring stage, fprop and bprop; expected: wgmma and setmaxnreg."""
    # (block, group, stages, trans, activation from registers, entries per stage)
    cases = ((32, 8, 4, True, True, 1), (64, 4, 3, False, True, 1), (64, 2, 4, False, False, 1),
             (32, 8, 3, True, True, 2)) if quick else \
        ((32, 8, 4, True, True, 1), (32, 4, 6, False, True, 1), (16, 8, 8, True, True, 1), (64, 4, 3, True, True, 1),
         (64, 2, 4, False, False, 1), (32, 2, 8, True, False, 1), (16, 1, 8, False, False, 1),
         (32, 8, 3, True, True, 2), (16, 8, 4, False, True, 2), (64, 2, 2, True, True, 2), (32, 1, 4, False, True, 2),
         (32, 4, 3, True, True, 4), (32, 8, 2, False, True, 3), (16, 8, 3, True, True, 4))
    fn = bsmm_ws_group._dds_ws_group_kernel
    for block, group, stages, trans, a_regs, entries in cases:
        # E entries' tables in flight: the producer needs 56 registers at E 2 (40 spills ~40 B),
        # 72 at E 3-4 (G 8 / E 3 spills 16 B at 56), 96 at b 16 / G 8 / E 4 (124 B at 72)
        load_regs = {1: 40, 2: 56}.get(entries, 96 if block == 16 else 72)
        cfg = bsmm_ws_group.WsGroupConfig(group, stages, a_from_registers=a_regs, entries_per_stage=entries,
                                          load_regs=load_regs)
        lay = bsmm_ws_group._layouts(block, torch.bfloat16)
        const = dict(B=block, G=group, BLOCK_M=cfg.block_m, STAGES=stages, TRANS_V=trans, HAS_BIAS=True, GROUP_M=8,
                     LOAD_REGS=cfg.load_regs, MMA_REGS=cfg.mma_regs, A_REGS=a_regs, E=entries, a_layout=lay.a,
                     v_layout=lay.v, c_layout=lay.c, num_warps=4)
        sig = signature(fn, const, ("pptr_ptr", "pk_ptr", "pslots_ptr", "pmask_ptr"))
        yield (f"ws group dds b{block} G{group} st{stages} {'fprop' if trans else 'bprop'} "
               f"a_from_registers={a_regs} entries_per_stage={entries}", fn, sig, const, 4, stages, None,
               GluonASTSource)


def ws_sdd_group_cases(quick: bool):
    """The grouped warp-specialized sdd (Gluon, ``bsmm_ws_sdd_group``, b 64): two block-rows
    x G block-columns per tile; expected: wgmma and setmaxnreg, no serialization."""
    # (group, block_k, stages, overlap): G 4 with overlap serializes (C7515) and is left out
    cases = ((4, 64, 3, False),) if quick else ((4, 64, 3, False), (2, 64, 4, True), (4, 32, 6, False),
                                                (1, 64, 4, True), (2, 64, 4, False))
    fn = bsmm_ws_sdd_group._sdd_ws_group_kernel
    for group, block_k, stages, overlap in cases:
        cfg = bsmm_ws_sdd_group.WsSddGroupConfig(group, block_k, stages, overlap=overlap)
        lay_in, lay_out = bsmm_ws_sdd._sdd_layouts(block_k, 64, torch.bfloat16)
        const = dict(B=64, G=group, BLOCK_K=block_k, STAGES=stages, GROUP_M=8, LOAD_REGS=cfg.load_regs,
                     MMA_REGS=cfg.mma_regs, OVERLAP=overlap, in_layout=lay_in, out_layout=lay_out, num_warps=4)
        sig = signature(fn, const, ("slots_ptr",))
        yield f"ws group sdd b64 G{group} k{block_k} st{stages} overlap={overlap}", fn, sig, const, 4, stages, None, GluonASTSource


def ws_sdd_rows_cases(quick: bool):
    """The row-run warp-specialized sdd (Gluon, ``bsmm_ws_sdd_rows``, b 64): units of 2G
    blocks of one block-row; expected: wgmma and setmaxnreg, no serialization."""
    # (group, block_k, stages, dY tile from registers, overlap)
    cases = ((4, 32, 4, False, False),) if quick else \
        ((4, 32, 4, False, False), (4, 32, 4, True, False), (4, 64, 2, False, False), (2, 64, 3, False, True),
         (2, 64, 3, True, False), (1, 64, 4, False, True))
    fn = bsmm_ws_sdd_rows._sdd_ws_rows_kernel
    for group, block_k, stages, a_regs, overlap in cases:
        cfg = bsmm_ws_sdd_rows.WsSddRowsConfig(group, block_k, stages, a_from_registers=a_regs, overlap=overlap)
        lay_in, lay_out = bsmm_ws_sdd._sdd_layouts(block_k, 64, torch.bfloat16)
        const = dict(B=64, G=group, BLOCK_K=block_k, STAGES=stages, LOAD_REGS=cfg.load_regs, MMA_REGS=cfg.mma_regs,
                     A_REGS=a_regs, OVERLAP=overlap, in_layout=lay_in, out_layout=lay_out, num_warps=4)
        sig = signature(fn, const, ("units_ptr", "row_ptr_ptr", "row_cols_ptr"))
        yield (f"ws group sdd rows b64 G{group} k{block_k} st{stages} a_from_registers={a_regs} overlap={overlap}",
               fn, sig, const, 4, stages, None, GluonASTSource)


def _resident_signature(fn, const: dict, split: bool, dt: str) -> dict:
    """The argument types of a resident kernel (both variants share their arguments): int32
    tables and semaphores, an fp32 workspace with splits (an int32 stand-in without), ``dt``
    operands."""
    return signature(fn, const, ("sem_ptr", "first_ptr", "mask_ptr") + (() if split else ("ws_ptr",)),
                     ("ws_ptr",) if split else (), dt)


def resident_cases(quick: bool):
    """The small-batch fprop with the activations resident in shared memory (Gluon,
    ``bsmm_resident``): b 16 / 32 / 64, with and without bias and splits; expected: wgmma."""
    # (block, rows, chunk, weight stages, bias, split, dtype)
    cases = ((16, 12, 32, 4, True, True, "bf16"),) if quick else \
        ((16, 12, 32, 4, True, True, "bf16"), (16, 12, 32, 4, True, False, "bf16"), (16, 8, 32, 4, False, True, "bf16"),
         (16, 16, 32, 3, True, True, "bf16"), (32, 6, 16, 2, True, False, "bf16"), (32, 4, 12, 3, False, True, "bf16"),
         (64, 2, 4, 2, True, True, "bf16"), (16, 1, 3, 2, True, True, "bf16"), (16, 12, 8, 16, True, True, "bf16"),
         (32, 6, 8, 8, True, True, "bf16"), (16, 12, 32, 4, True, True, "fp16"))
    fn = bsmm_resident._dds_resident_kernel
    for block, rows, chunk, w_stages, bias, split, dt in cases:
        cfg = bsmm_resident.ResidentConfig(rows=rows, chunk=chunk, w_stages=w_stages)
        x_layout, v_layout = bsmm_resident._layouts(block, torch.float16 if dt == "fp16" else torch.bfloat16)
        const = dict(B=block, CHUNK=chunk, CHUNK_BITS=chunk.bit_length(), R=rows, U=cfg.unroll, W_STAGES=w_stages,
                     HAS_BIAS=bias, SPLIT=split,
                     LOAD_REGS=cfg.load_regs, x_layout=x_layout, v_layout=v_layout, num_warps=4)
        yield (f"resident dds b{block} R{rows} chunk{chunk} w_stages{w_stages} bias={bias} split={split} {dt}",
               fn, _resident_signature(fn, const, split, dt), const, 4, 1, None, GluonASTSource)
    # the column-major variant (bsmm_resident_columns): (block, rows, chunk, box, stages, bias, split,
    # activation rows per copy: 64, or 16 / 32 where M is that short)
    columns = ((16, 6, 16, 8, 2, True, True, 64),) if quick else \
        ((16, 6, 16, 8, 2, True, True, 64), (16, 8, 16, 8, 2, False, False, 64), (16, 2, 32, 16, 2, True, True, 64),
         (32, 4, 8, 8, 2, True, True, 64), (64, 2, 4, 4, 2, True, False, 64), (16, 1, 3, 1, 3, True, True, 16),
         (32, 3, 6, 2, 2, False, True, 64), (16, 8, 16, 4, 2, True, True, 64), (16, 12, 8, 8, 2, True, True, 64),
         (16, 16, 8, 8, 2, True, True, 64), (32, 8, 4, 4, 2, True, True, 64), (16, 4, 24, 8, 2, True, True, 64),
         (16, 12, 4, 4, 6, True, True, 32), (16, 6, 16, 4, 2, False, False, 16), (32, 4, 8, 8, 2, True, True, 32),
         (64, 2, 4, 4, 2, True, True, 16))
    fn = bsmm_resident_columns._dds_columns_kernel
    for block, rows, chunk, box, stages, bias, split, x_rows in columns:
        cfg = bsmm_resident.ResidentConfig(rows=rows, chunk=chunk, w_stages=stages, columns=True, box=box)
        x_layout, v_layout = bsmm_resident._layouts(block, torch.bfloat16)
        const = dict(B=block, CHUNK=chunk, R=rows, BOX=box, BOX_BITS=(rows * chunk // box).bit_length(),
                     STAGES=stages, HAS_BIAS=bias, SPLIT=split, LOAD_REGS=cfg.load_regs, X_ROWS=x_rows,
                     x_layout=x_layout, v_layout=v_layout, num_warps=4)
        yield (f"resident columns dds b{block} R{rows} chunk{chunk} box{box} stages{stages} bias={bias} split={split} "
               f"x_rows{x_rows}", fn, _resident_signature(fn, const, split, "bf16"), const, 4, 1, None, GluonASTSource)


def all_cases(quick: bool):
    """Every case, in the compile check's order; ``quick``: one variant of each kernel."""
    for make in (attention_cases, semi24_cases, small_cases, gemv_cases, panel_cases, lstm_cell_cases, sdd_group_cases,
                 sdd_tile_cases, ws_cases, ws_group_cases, resident_cases, ws_sdd_group_cases, ws_sdd_rows_cases,
                 attention_ws_cases):
        yield from make(quick)

