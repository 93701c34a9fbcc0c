"""The named launch configs that ``small_threshold.py`` sweeps (``--variants``) and that
``scripts/measure_small_crossover.py --adopt``, ``scripts/gen_small_speedups.py`` and
``dispatch_one.py`` read back by name: each name is a small-kernel, panel, grouped,
resident or FMA config, or a change to the dispatcher's or the heuristic's config for the
problem at hand ("auto" / "heuristic" entries, resolved by the sweep). Kept apart from the
sweep so the table (most of the lines, one comment per experiment) reads on its own."""

from __future__ import annotations

from tilesparse.kernels import bsmm_gemv as GV
from tilesparse.kernels.bsmm_config import KernelConfig
from tilesparse.kernels import bsmm_panel as P
from tilesparse.kernels import bsmm_resident as RS
from tilesparse.kernels import bsmm_small as S
from tilesparse.kernels import bsmm_ws_group as WG

# name -> (sub, block_k, num_stages, num_warps[, splits[, chunks[, longest_first[, swap[, m_inner[, block_m
# [, prefetch[, l2_ahead]]]]]]]]); block_m follows M unless given (None: follows M). The other
# fields take SmallConfig's defaults: spread_index is on since the forty-first session, so sweeps
# before it timed these names with one index load per lane.
# ("auto", n): the dispatcher's own small-kernel config (tuned table, else the heuristic) with
# L2 prefetch hints n blocks ahead; ("heuristic", n): the heuristic's (bprop's multi-block steps
# take no hints: skipped); ("auto", "spread") / ("heuristic", "spread"): those configs with each
# multi-block step's indices loaded once per block (SmallConfig.spread_index; skipped where the
# config is not the small kernel's or its steps are within one block)
ALL_VARIANTS = {
    "s32k64st4": (32, 64, 4, 4),
    "s16k64st6": (16, 64, 6, 4),
    "s32k128st4": (32, 128, 4, 4),
    "s64k64st4": (64, 64, 4, 4),
    "s64k128st3": (64, 128, 3, 8),
    "s32k64st8": (32, 64, 8, 4),
    "s128k64st4": (128, 64, 4, 8),
    # deeper pipelines and narrower slices (more loads in flight, more programs)
    "s32k64st12": (32, 64, 12, 4),
    "s32k64st16": (32, 64, 16, 4),
    "s16k64st8": (16, 64, 8, 4),
    "s16k64st12": (16, 64, 12, 4),
    "s32k128st8": (32, 128, 8, 4),
    # reduction steps across several consecutive blocks (block_k past the tile), 2026-11-30
    "s16k16st8": (16, 16, 8, 4),  # b = 16's config before the multi-block steps
    "s16k128st8": (16, 128, 8, 4),
    "s16k128st12": (16, 128, 12, 4),
    "s32k128st6": (32, 128, 6, 4),
    "s32k128st12": (32, 128, 12, 4),
    # fewer stages or wider slices where M 32-64 activations fill shared memory
    "s32k64st6": (32, 64, 6, 4),
    "s64k64st6": (64, 64, 6, 4),
    "s32k32st8": (32, 32, 8, 4),
    "s32k32st12": (32, 32, 12, 4),
    # b 128 at two blocks per step (256-deep steps, G = 2; fiftieth session): half the steps per
    # block-row, for the random layout's long rows (the timeline: a program's time follows its
    # steps, ~600 ns each in the tail whatever the ring's depth)
    "s32k256st6w2": (32, 256, 6, 2),
    "s32k256st8w2": (32, 256, 8, 2),
    "s32k256st4w2": (32, 256, 4, 2),
    "s16k256st8w2": (16, 256, 8, 2),
    "s32k256st8": (32, 256, 8, 4),
    # b 128 one block per step with deeper rings that keep 3 programs per SM at M <= 16 (12 KB a stage;
    # 10 / 12 / 14 stages keep 4 / 5 / 6 buffers: 48-72 KB; 16 and 24 stages had lost residency)
    "s32k128st10w2": (32, 128, 10, 2),
    "s32k128st12w2": (32, 128, 12, 2),
    "s32k128st14w2": (32, 128, 14, 2),
    # b >= 64 at few rows on wgmma without the swap: 64-wide weight slices as the MMA's M side, the activation
    # rows (padded to 16) as N (sm_90 compile: 8 wgmma per 128-deep step, no ldmatrix, 117 instructions per
    # warp and step for 16 KB of weight where the shipped 32-wide mma.sync slice issues 122 for 8 KB)
    "s64k128st6w4": (64, 128, 6, 4),
    "s64k128st8w4": (64, 128, 8, 4),
    "s64k64st8w4": (64, 64, 8, 4),
    # only the block-rows longer than the mean cut in up to 2 or 3 chunks, summed in-kernel
    # (the 6th field: chunks)
    "s32k128st8c2": (32, 128, 8, 4, 1, 2),
    "s32k128st8c3": (32, 128, 8, 4, 1, 3),
    "s32k64st12c2": (32, 64, 12, 4, 1, 2),
    "s32k32st12c2": (32, 32, 12, 4, 1, 2),
    "s16k64st8c2": (16, 64, 8, 4, 1, 2),
    # the activation rows as the MMA's M side (wgmma at M 33-64), 2026-11-30 (eighth session)
    "s32k128st8S": (32, 128, 8, 4, 1, 1, False, True),
    "s32k64st12S": (32, 64, 12, 4, 1, 1, False, True),
    "s32k32st12S": (32, 32, 12, 4, 1, 1, False, True),
    "s16k64st8S": (16, 64, 8, 4, 1, 1, False, True),
    # swapped, ninth session: two warpgroups, deeper pipelines, wider and narrower slices
    "s32k64st12Sw8": (32, 64, 12, 8, 1, 1, False, True),
    "s32k64st16S": (32, 64, 16, 4, 1, 1, False, True),
    "s64k64st8S": (64, 64, 8, 4, 1, 1, False, True),
    "s64k64st8Sw8": (64, 64, 8, 8, 1, 1, False, True),
    "s16k64st12S": (16, 64, 12, 4, 1, 1, False, True),
    # programs take the block-rows longest first (7th field), with and without chunks
    "s32k128st8L": (32, 128, 8, 4, 1, 1, True),
    "s32k128st8c2L": (32, 128, 8, 4, 1, 2, True),
    "s32k64st12L": (32, 64, 12, 4, 1, 1, True),
    "s32k64st12c2L": (32, 64, 12, 4, 1, 2, True),
    "s32k32st12L": (32, 32, 12, 4, 1, 1, True),
    "s16k64st8L": (16, 64, 8, 4, 1, 1, True),
    # M 64: wider slices read each activation tile for more features (less L2 traffic per
    # weight byte); chunks make up for the fewer programs
    "s64k64st6c2": (64, 64, 6, 4, 1, 2),
    "s64k64st6c2L": (64, 64, 6, 4, 1, 2, True),
    "s128k64st4w8": (128, 64, 4, 8),
    "s128k64st4w8c3": (128, 64, 4, 8, 1, 3),
    # every block-row split in 2 or 3 runs (fp32 partials, fixed-order sum): more programs,
    # shorter chains behind the longest block-row (docs/performance.md, sixth session)
    "s32k64st8x2": (32, 64, 8, 4, 2),
    "s32k64st8x3": (32, 64, 8, 4, 3),
    # M 128-512 (thirteenth session): a row tile's weight slice was read from HBM once per
    # row tile (the row tiles of one slice ran a whole wave apart). 'I' (9th field,
    # m_inner): the row tiles of a slice are consecutive programs, sharing it through L2.
    # 'm128' (10th field): 128 activation rows per program, two warpgroups; wider slices
    # read each activation tile for more features (the L2 traffic of activations is
    # M / sub times the weight bytes); 'x2': every run split in 2 (fp32 partials) to keep
    # 96-192 wide programs from underfilling 132 SMs.
    "s32k64st12SI": (32, 64, 12, 4, 1, 1, False, True, True),
    "s64k64st8SI": (64, 64, 8, 4, 1, 1, False, True, True),
    "s32k64st8Sw8m128I": (32, 64, 8, 8, 1, 1, False, True, True, 128),
    "s64k64st6Sw8m128I": (64, 64, 6, 8, 1, 1, False, True, True, 128),
    "s64k64st6Sw8m128Ix2": (64, 64, 6, 8, 2, 1, False, True, True, 128),
    "s128k64st4Sw8m128I": (128, 64, 4, 8, 1, 1, False, True, True, 128),
    "s128k64st4Sw8m128Ix2": (128, 64, 4, 8, 2, 1, False, True, True, 128),
    "s16k64st8I": (16, 64, 8, 4, 1, 1, False, False, True),
    # b 64 / 128 at 32-64 rows (forty-sixth session): 64-wide swapped slices read the activations once per
    # 64 features (ratio 1 against 32-wide slices' 2); every run split in 2 to keep ~384 programs
    "s64k64st8Sx2": (64, 64, 8, 4, 2, 1, False, True),
    "s64k64st8SIx2": (64, 64, 8, 4, 2, 1, False, True, True),
    "s64k64st12Sx2": (64, 64, 12, 4, 2, 1, False, True),
    "s64k128st6Sx2": (64, 128, 6, 4, 2, 1, False, True),
    # 'P' (11th field, prefetch): each step's block index two steps ahead and its
    # activation tile one step ahead (the TTGIR showed both as synchronous loads in the
    # loop, the weight tile alone pipelined; thirteenth session)
    "s32k128st8P": (32, 128, 8, 4, 1, 1, False, False, False, None, True),
    "s32k64st12P": (32, 64, 12, 4, 1, 1, False, False, False, None, True),
    "s32k32st12P": (32, 32, 12, 4, 1, 1, False, False, False, None, True),
    "s16k64st8P": (16, 64, 8, 4, 1, 1, False, False, False, None, True),
    "s16k128st8P": (16, 128, 8, 4, 1, 1, False, False, False, None, True),
    "s32k64st12SP": (32, 64, 12, 4, 1, 1, False, True, False, None, True),
    "s32k32st12SP": (32, 32, 12, 4, 1, 1, False, True, False, None, True),
    "s64k64st8SIP": (64, 64, 8, 4, 1, 1, False, True, True, None, True),
    "s64k64st6Sw8m128IP": (64, 64, 6, 8, 1, 1, False, True, True, 128, True),
    # panels (kernels/bsmm_panel.py; fourteenth session): G output block-columns per program
    # sharing each activation tile, for b 16 / 32 at M 128-512, where the one-block-row
    # slices read the activations M / b times the weight's bytes from L2.
    # ("panel", G, block_m, warps, stages); run where G * b <= 128
    "pG2m128w4st3": ("panel", 2, 128, 4, 3),
    "pG4m128w4st3": ("panel", 4, 128, 4, 3),
    "pG4m128w8st3": ("panel", 4, 128, 8, 3),
    "pG2m64w4st4": ("panel", 2, 64, 4, 4),
    "pG4m64w4st4": ("panel", 4, 64, 4, 4),
    "pG8m128w4st3": ("panel", 8, 128, 4, 3),
    "pG8m128w8st3": ("panel", 8, 128, 8, 3),
    "pG8m64w4st4": ("panel", 8, 64, 4, 4),
    # ... with the reduction split over programs (PanelConfig.splits, fp32 partials summed in
    # a fixed order; twentieth session): ("panel", G, block_m, warps, stages, group_m, splits)
    "pG8m16w4st4x8": ("panel", 8, 16, 4, 4, 8, 8),
    "pG8m32w4st4x8": ("panel", 8, 32, 4, 4, 8, 8),
    "pG8m64w4st4x8": ("panel", 8, 64, 4, 4, 8, 8),
    "pG8m64w4st4x16": ("panel", 8, 64, 4, 4, 8, 16),
    "pG8m64w8st4x8": ("panel", 8, 64, 8, 4, 8, 8),
    "pG4m64w4st4x8": ("panel", 4, 64, 4, 4, 8, 8),
    # deep steps and the features as the MMA's M side (thirty-sixth session):
    # ("panel", G, block_m, warps, stages, group_m, splits, entries, swap); G is for b 16 (halved at b 32)
    "pG8m16x4e4S": ("panel", 8, 16, 4, 4, 8, 4, 4, True),
    "pG8m16x2e4S": ("panel", 8, 16, 4, 4, 8, 2, 4, True),
    "pG8m16x4e8S": ("panel", 8, 16, 4, 4, 8, 4, 8, True),
    "pG8m32x4e4S": ("panel", 8, 32, 4, 4, 8, 4, 4, True),
    "pG8m64x4e4S": ("panel", 8, 64, 4, 4, 8, 4, 4, True),
    "pG8m64x2e4S": ("panel", 8, 64, 4, 4, 8, 2, 4, True),
    "pG8m64x8e4S": ("panel", 8, 64, 4, 4, 8, 8, 4, True),
    "pG8m64w8x4e4S": ("panel", 8, 64, 8, 4, 8, 4, 4, True),
    "pG4m64x4e4S": ("panel", 4, 64, 4, 4, 8, 4, 4, True),
    "pG8m64x4e8S": ("panel", 8, 64, 4, 4, 8, 4, 8, True),
    "pG8m16st2x4e4S": ("panel", 8, 16, 4, 2, 8, 4, 4, True),
    "pG8m16st6x4e4S": ("panel", 8, 16, 4, 6, 8, 4, 4, True),
    "pG8m16st6x4e8S": ("panel", 8, 16, 4, 6, 8, 4, 8, True),
    "pG8m16st6x8e8S": ("panel", 8, 16, 4, 6, 8, 8, 8, True),
    "pG16m16x4e4S": ("panel", 16, 16, 4, 4, 8, 4, 4, True),
    "pG16m16w8x4e4S": ("panel", 16, 16, 8, 4, 8, 4, 4, True),
    "pG8m16x8e8S": ("panel", 8, 16, 4, 4, 8, 8, 8, True),
    "pG8m32x4e8S": ("panel", 8, 32, 4, 4, 8, 4, 8, True),
    "pG8m32x8e8S": ("panel", 8, 32, 4, 4, 8, 8, 8, True),
    "pG8m64x8e8S": ("panel", 8, 64, 4, 4, 8, 8, 8, True),
    "pG4m16x4e8S": ("panel", 4, 16, 4, 4, 8, 4, 8, True),
    # after the swizzled 2-D tiles (994902d): 64-wide panels, more splits, fewer stages, 32-deep steps
    "pG4m16x4e4S": ("panel", 4, 16, 4, 4, 8, 4, 4, True),
    "pG4m32x4e4S": ("panel", 4, 32, 4, 4, 8, 4, 4, True),
    "pG4m64x8e4S": ("panel", 4, 64, 4, 4, 8, 8, 4, True),
    "pG8m16x8e4S": ("panel", 8, 16, 4, 4, 8, 8, 4, True),
    "pG8m32x8e4S": ("panel", 8, 32, 4, 4, 8, 8, 4, True),
    "pG8m32st3x4e4S": ("panel", 8, 32, 4, 3, 8, 4, 4, True),
    "pG8m64st3x4e4S": ("panel", 8, 64, 4, 3, 8, 4, 4, True),
    "pG8m64x4e2S": ("panel", 8, 64, 4, 4, 8, 4, 2, True),
    # longer runs of one block-row per step in fprop (4 rows x 8 entries, 128-deep)
    "pG4m32x4e8S": ("panel", 4, 32, 4, 4, 8, 4, 8, True),
    "pG4m64x4e8S": ("panel", 4, 64, 4, 4, 8, 4, 8, True),
    "pG4m16x8e8S": ("panel", 4, 16, 4, 4, 8, 8, 8, True),
    # the shipped deep panels with the split partials summed in-kernel (fused_sum: two
    # fewer kernels per call); the 10th field
    "pG8m16x4e4SF": ("panel", 8, 16, 4, 3, 8, 4, 4, True, True),
    "pG8m32x4e4SF": ("panel", 8, 32, 4, 3, 8, 4, 4, True, True),
    "pG8m64x4e4SF": ("panel", 8, 64, 4, 3, 8, 4, 4, True, True),
    "pG4m32x4e4SF": ("panel", 4, 32, 4, 3, 8, 4, 4, True, True),
    "pG4m64x4e4SF": ("panel", 4, 64, 4, 3, 8, 4, 4, True, True),
    "pG8m64x8e4SF": ("panel", 8, 64, 4, 3, 8, 8, 4, True, True),
    # deep panels at 128-512 rows (thirty-seventh session), where b 16 ran 3.5-4x slower than
    # dense: 128 x 128 tiles over 64-deep steps; the union of 8 random block-rows is nearly
    # full at density 0.5, so the work approaches dense's FLOPs on half its weight bytes
    "pG8m128x1e4": ("panel", 8, 128, 4, 3, 8, 1, 4, False),
    "pG8m128x2e4F": ("panel", 8, 128, 4, 3, 8, 2, 4, False, True),
    "pG8m128x4e4F": ("panel", 8, 128, 4, 3, 8, 4, 4, False, True),
    "pG8m128w8x2e4F": ("panel", 8, 128, 8, 3, 8, 2, 4, False, True),
    "pG8m128x2e2F": ("panel", 8, 128, 4, 4, 8, 2, 2, False, True),
    "pG8m128x2e4SF": ("panel", 8, 128, 4, 3, 8, 2, 4, True, True),
    "pG8m64x2e4SF": ("panel", 8, 64, 4, 3, 8, 2, 4, True, True),
    "pG4m128x2e4F": ("panel", 4, 128, 4, 3, 8, 2, 4, False, True),
    # ... and past them (after pG8m128w8x2e4F / pG4m128x2e4F won at 1.5x dense): 256 features
    # (the activation tile shared twice as far), 256 rows, deeper pipelines, more splits
    "pG16m128w8x2e4F": ("panel", 16, 128, 8, 3, 8, 2, 4, False, True),
    "pG16m64w8x2e4F": ("panel", 16, 64, 8, 3, 8, 2, 4, False, True),
    "pG8m256w8x2e4F": ("panel", 8, 256, 8, 3, 8, 2, 4, False, True),
    "pG8m128w8st4x2e4F": ("panel", 8, 128, 8, 4, 8, 2, 4, False, True),
    "pG4m128w8x2e4F": ("panel", 4, 128, 8, 3, 8, 2, 4, False, True),
    "pG4m128x4e4F": ("panel", 4, 128, 4, 3, 8, 4, 4, False, True),
    "pG8m128w8x4e2F": ("panel", 8, 128, 8, 4, 8, 4, 2, False, True),
    # the column-grouped warp-specialized kernel (kernels/bsmm_ws_group.py, shipped at M >= 513)
    # at 16-64 rows, thirtieth session: G output block-columns share each activation tile, so
    # the activations' L2 traffic (M / b times the weight's bytes at one block-column per
    # program) falls by the stored blocks per union entry; 128-row tiles (the rows past M
    # zero-filled by TMA). ("group", G, stages, entries per stage, producer registers)
    "gG8st3e4": ("group", 8, 3, 4, 96),
    "gG4st3e4": ("group", 4, 3, 4, 96),
    "gG2st3e4": ("group", 2, 3, 4, 96),
    "gG8st4e1": ("group", 8, 4, 1, 40),
    "gG8st3e2": ("group", 8, 3, 2, 56),
    "gG4st3e2": ("group", 4, 3, 2, 56),
    "gG2st4e2": ("group", 2, 4, 2, 56),
    # the activations resident in shared memory (kernels/bsmm_resident.py, fprop at <= 64 rows,
    # thirtieth session): R block-rows per program stream their contiguous blocks past each
    # chunk of activations. ("resident", rows, splits, chunk, weight stages); the v1 / v2
    # kernels' results (...-small-resident-v1/v2.json) had a box field before the weight stages
    "rR12x2": ("resident", 12, 2, 32, 4),
    "rR12x1": ("resident", 12, 1, 32, 4),
    "rR8x2": ("resident", 8, 2, 32, 4),
    "rR16x3": ("resident", 16, 3, 32, 3),
    "rR12x4": ("resident", 12, 4, 32, 4),
    "rR6x1": ("resident", 6, 1, 32, 4),
    "rR6x2b32": ("resident", 6, 2, 16, 2),
    "rR8x3b32": ("resident", 8, 3, 16, 2),
    "rR4x2b32": ("resident", 4, 2, 16, 3),
    "rR2x2b64": ("resident", 2, 2, 4, 2),
    "rR4x2b64": ("resident", 4, 2, 4, 2),
    # low density: a stage holds few of its chunk's slots, so shorter chunks and more weight
    # stages keep more bytes in flight
    "rR12x2c8w16": ("resident", 12, 2, 8, 16),
    "rR12x2c16w8": ("resident", 12, 2, 16, 8),
    "rR6x2c8w8b32": ("resident", 6, 2, 8, 8),
    # (a sixth field: the loops' unroll; 4 unless given)
    "rR12x2u1": ("resident", 12, 2, 32, 4, 1),
    "rR12x2u8": ("resident", 12, 2, 32, 4, 8),
    "rR6x2c8w8b32u2": ("resident", 6, 2, 8, 8, 2),
    # the column-major variant (kernels/bsmm_resident_columns.py; seventh and eighth fields:
    # columns, box): its fifth field is the number of stages, each a chunk's tiles and all rows'
    # blocks of it
    "rC6x1": ("resident", 6, 1, 16, 2, 4, True, 8),
    "rC8x1": ("resident", 8, 1, 16, 2, 4, True, 8),
    "rC6x1k4": ("resident", 6, 1, 16, 2, 4, True, 4),
    "rC12x2c8": ("resident", 12, 2, 8, 2, 4, True, 8),
    "rC4x1c24": ("resident", 4, 1, 24, 2, 4, True, 8),
    "rC3x1b32": ("resident", 3, 1, 8, 2, 4, True, 8),
    "rC4x2b32": ("resident", 4, 2, 8, 2, 4, True, 8),
    "rC2x1b64": ("resident", 2, 1, 4, 2, 4, True, 4),
    # deeper rings of shorter chunks (2026-12-02: no faster; the time follows bytes landed)
    "rC6x1c8s4": ("resident", 6, 1, 8, 4, 4, True, 8),
    "rC6x1c4s8": ("resident", 6, 1, 4, 8, 4, True, 4),
    "rC8x1c8s4": ("resident", 8, 1, 8, 4, 4, True, 8),
    "rC12x2c4s6": ("resident", 12, 2, 4, 6, 4, True, 4),
    # smaller boxes: fewer bytes over-read past a row's blocks (the kernel's time follows the
    # bytes its copies land)
    "rC12x2c8k4": ("resident", 12, 2, 8, 2, 4, True, 4),
    "rC12x2c8k2": ("resident", 12, 2, 8, 2, 4, True, 2),
    # the FMA kernel (kernels/bsmm_gemv.py, thirty-fourth session) at 1-8 rows: no activation
    # tile padded to 16 rows and staged through shared memory (ncu at b 16, M 1: the shared
    # pipe 81 % busy, HBM 38 %). ("gemv", sub, block_k, reduce_each_step, warps)
    "v16k128": ("gemv", 16, 128, False, 4),
    "v16k256": ("gemv", 16, 256, False, 4),
    "v16k512r": ("gemv", 16, 512, True, 4),
    "v16k128r": ("gemv", 16, 128, True, 4),
    "v16k64r": ("gemv", 16, 64, True, 4),
    "v32k128": ("gemv", 32, 128, False, 4),
    "v32k256r": ("gemv", 32, 256, True, 4),
    "v32k64r": ("gemv", 32, 64, True, 4),
    "v32k64": ("gemv", 32, 64, False, 4),
    "v32k128r": ("gemv", 32, 128, True, 4),
    "v32k32r": ("gemv", 32, 32, True, 4),
    "v64k128r": ("gemv", 64, 128, True, 4),
    # M 2-4 (b 16 at M 4 fprop: 84 us against the dispatcher's 80): 8 warps, shorter steps
    "v16k64": ("gemv", 16, 64, False, 4),
    # M 5-8: 32-wide steps keep the accumulator at 71 registers (64-wide: 112, two programs' waves);
    # timed in the thirty-fifth session at 102-112 us against the MMA kernel's 66-81: not adopted
    "v16k32": ("gemv", 16, 32, False, 4),
    "v16k128w8": ("gemv", 16, 128, False, 8),
    "v16k256w8": ("gemv", 16, 256, False, 8),
    # b 16 launches only 768 programs on a 12288-wide weight (0.83 of a wave at M 8, ncu):
    # half-block slices double the programs, each a 2 KB step at 128 wide (level at M 1, slower
    # at 2-8: not adopted)
    "v8k128": ("gemv", 8, 128, False, 4),
    "v8k256": ("gemv", 8, 256, False, 4),
    "v8k128w8": ("gemv", 8, 128, False, 8),
    "v8k64": ("gemv", 8, 64, False, 4),
    # the deep panels with deeper cp.async pipelines (fortieth session): at 3-4 stages Triton
    # keeps two buffers and waits for every copy at each step's top (one step's loads in
    # flight, ~1.3 us a step whatever its bytes); 5-6 stages keep two steps in flight, 8 three
    "pG8m16st6x4e4SF": ("panel", 8, 16, 4, 6, 8, 4, 4, True, True),
    "pG8m32st6x4e4SF": ("panel", 8, 32, 4, 6, 8, 4, 4, True, True),
    "pG8m64st6x4e4SF": ("panel", 8, 64, 4, 6, 8, 4, 4, True, True),
    "pG8m16st8x4e4SF": ("panel", 8, 16, 4, 8, 8, 4, 4, True, True),
    "pG8m32st8x4e4SF": ("panel", 8, 32, 4, 8, 8, 4, 4, True, True),
    "pG8m64st8x4e4SF": ("panel", 8, 64, 4, 8, 8, 4, 4, True, True),
    "pG4m16st6x4e4SF": ("panel", 4, 16, 4, 6, 8, 4, 4, True, True),
    "pG4m32st6x4e4SF": ("panel", 4, 32, 4, 6, 8, 4, 4, True, True),
    "pG4m64st6x4e4SF": ("panel", 4, 64, 4, 6, 8, 4, 4, True, True),
    "pG4m16st8x4e4SF": ("panel", 4, 16, 4, 8, 8, 4, 4, True, True),
    "pG4m32st8x4e4SF": ("panel", 4, 32, 4, 8, 8, 4, 4, True, True),
    "pG4m64st8x4e4SF": ("panel", 4, 64, 4, 8, 8, 4, 4, True, True),
    "pG8m16st8x2e4SF": ("panel", 8, 16, 4, 8, 8, 2, 4, True, True),
    "pG8m32st8x2e4SF": ("panel", 8, 32, 4, 8, 8, 2, 4, True, True),
    # more programs for the deep panels at 32-64 rows (fortieth session: 2.9 programs per SM,
    # 18 % occupancy, 0.58 waves at 4 splits): 8 splits at 6 stages
    "pG8m32st6x8e4SF": ("panel", 8, 32, 4, 6, 8, 8, 4, True, True),
    "pG8m64st6x8e4SF": ("panel", 8, 64, 4, 6, 8, 8, 4, True, True),
    "pG4m32st6x8e4SF": ("panel", 4, 32, 4, 6, 8, 8, 4, True, True),
    "pG4m64st6x8e4SF": ("panel", 4, 64, 4, 6, 8, 8, 4, True, True),
    # 256-feature panels at 32-64 rows (forty-first session): the activation tile shared by
    # 16 block-rows, its L2 bytes half the weight's (nearly free, l2_ingest); 8 warps for the
    # [256, M] accumulator; shallower rings or steps to fit shared memory
    "pG16m64w8st5x4e4SF": ("panel", 16, 64, 8, 5, 8, 4, 4, True, True),
    "pG16m64w8st6x4e2SF": ("panel", 16, 64, 8, 6, 8, 4, 2, True, True),
    "pG16m32w8st6x4e2SF": ("panel", 16, 32, 8, 6, 8, 4, 2, True, True),
    "pG16m64w8st6x8e2SF": ("panel", 16, 64, 8, 6, 8, 8, 2, True, True),
    # 128-deep steps after the slot fix (the per-step cost over twice the bytes), rings that fit
    "pG8m16st5x4e8SF": ("panel", 8, 16, 4, 5, 8, 4, 8, True, True),
    "pG8m32st5x4e8SF": ("panel", 8, 32, 4, 5, 8, 4, 8, True, True),
    "pG8m64st4x4e8SF": ("panel", 8, 64, 4, 4, 8, 4, 8, True, True),
    "v8k32": ("gemv", 8, 32, False, 4),
    # L2 prefetch hints ahead of the ring (SmallConfig.l2_ahead), on the dispatcher's config
    "autoL2": ("auto", 2), "autoL4": ("auto", 4), "autoL8": ("auto", 8), "autoL16": ("auto", 16),
    "autoL32": ("auto", 32), "autoL64": ("auto", 64),
    # and on the heuristic's (b 16 at 5-64 rows runs other kernels by default)
    "defaultL8": ("heuristic", 8), "defaultL16": ("heuristic", 16), "defaultL32": ("heuristic", 32),
    # the small kernel's multi-block steps with one index load per block (fortieth session)
    "autoS": ("auto", "spread"), "defaultS": ("heuristic", "spread"),
    # the dispatcher's / heuristic's config with n pipeline stages (forty-first session, found in
    # the TTGIR on the CPU): where a step's weight address comes from a load in the loop (bprop's
    # slots, or the index gathers without prefetch) Triton's pipeliner spaces the dependent loads
    # out, so 8 stages keep a ring of 3 weight buffers (12: 5, 16: 7, 24: 11), not 7
    "autoSt12": ("auto", "stages", 12), "autoSt16": ("auto", "stages", 16), "autoSt24": ("auto", "stages", 24),
    # ... and shallower (forty-second session: 12-24 stages were 2-68 % slower at every b 16 point)
    "autoSt4": ("auto", "stages", 4), "autoSt6": ("auto", "stages", 6),
    "defaultSt12": ("heuristic", "stages", 12), "defaultSt16": ("heuristic", "stages", 16),
    # ... and the deep panels (slots loaded in the loop: 6 stages keep 3 buffers, 8 four, 10 five,
    # 12 six; at 64 rows 74 / 99 / 123 / 148 KB of shared memory)
    "pG8m16st10x4e4SF": ("panel", 8, 16, 4, 10, 8, 4, 4, True, True),
    "pG8m32st10x4e4SF": ("panel", 8, 32, 4, 10, 8, 4, 4, True, True),
    "pG8m64st10x4e4SF": ("panel", 8, 64, 4, 10, 8, 4, 4, True, True),
    "pG8m16st12x4e4SF": ("panel", 8, 16, 4, 12, 8, 4, 4, True, True),
    "pG8m32st12x4e4SF": ("panel", 8, 32, 4, 12, 8, 4, 4, True, True),
    "pG8m64st12x4e4SF": ("panel", 8, 64, 4, 12, 8, 4, 4, True, True),
    # ("auto" / "heuristic", "kmajor"): that small-kernel config with the activations stored K-major
    # (A^T contiguous; forty-second session: ncu found the L1/TEX pipe 81 % busy at b 16, density 0.1, M 32,
    # where each block's activation tile is M rows of 32 bytes, one line per row; K-major it is 16 rows of
    # M contiguous elements: compiled for sm_90 with M divisible by 16, still 16-byte cp.async)
    "autoKmajor": ("auto", "kmajor"), "defaultKmajor": ("heuristic", "kmajor"),
    # ("auto" / "heuristic", "kmajorT"[, stages]): the same, with the transpose of the row-major
    # activations inside the timed call (what a wrapper that transposes for the kernel pays; forty-third
    # session: K-major alone took b 16, density 0.1, M 64 from 42 to 22 µs)
    "autoKmajorT": ("auto", "kmajorT"), "defaultKmajorT": ("heuristic", "kmajorT"),
    "defaultKmajorSt4": ("heuristic", "kmajor", 4), "defaultKmajorSt12": ("heuristic", "kmajor", 12),
    # kmajorTT: the transpose through the library's tiled copy (bsmm_kmajor.as_kmajor), as the dispatcher
    # does; "autoRowMajor": the dispatcher with bsmm.KMAJOR_SMALL off (the row-major baseline, same run)
    "autoKmajorTT": ("auto", "kmajorTT"), "defaultKmajorTT": ("heuristic", "kmajorTT"),
    "autoRowMajor": ("auto", "rowmajor"),
    # K-major configs of their own (forty-fourth session: the table's configs were tuned row-major, and the
    # heuristic beat them by 12 % at b 16 fprop, density 0.1, M 32): reduction depth, warps, stages, row tiles
    # of 32 at 64 rows (two programs per slice, run together), the step's index loaded ahead
    "defaultKmajorK32": ("heuristic", "kmajor", {"block_k": 32}),
    "defaultKmajorK128": ("heuristic", "kmajor", {"block_k": 128, "num_stages": 6}),
    "defaultKmajorW2": ("heuristic", "kmajor", {"num_warps": 2}),
    "defaultKmajorW8": ("heuristic", "kmajor", {"num_warps": 8}),
    "defaultKmajorSt6": ("heuristic", "kmajor", 6),
    "defaultKmajorM32": ("heuristic", "kmajor", {"block_m": 32, "m_inner": True}),
    "defaultKmajorPf": ("heuristic", "kmajor", {"prefetch": True}),
    # fewer warps per program (forty-fourth session: 2 warps beat 4 at every b 16 K-major point, 5-28 %; the
    # small kernel had only ever run 4 or 8): the dispatcher's / heuristic's config row-major, and K-major
    "autoW1": ("auto", "warps", 1), "autoW2": ("auto", "warps", 2),
    # ... and at 4 again, for weights smaller than the 12288² the 1-2 warp entries were measured on (forty-fifth
    # session: at 4096², 128 programs at b >= 32, some points ran 10-20 % slower than at 4 warps)
    "autoW4": ("auto", "warps", 4),
    "defaultW1": ("heuristic", "warps", 1), "defaultW2": ("heuristic", "warps", 2),
    # ... and the dispatcher's deep panel / FMA kernel at 1 / 2 / 8 warps (same argument: few rows per program)
    "autoKW1": ("auto", "kwarps", 1), "autoKW2": ("auto", "kwarps", 2), "autoKW8": ("auto", "kwarps", 8),
    # ... and at 33-64 rows, b >= 32, where the swapped wgmma tile keeps 4 warps: unswapped 32-wide slices at
    # 2 / 4 warps, or two 32-row programs per slice run together (each at 2 warps)
    "defaultNoSwapW2": ("heuristic", "set", {"swap": False, "num_warps": 2}),
    "defaultNoSwapW4": ("heuristic", "set", {"swap": False, "num_warps": 4}),
    "defaultM32W2": ("heuristic", "set", {"swap": False, "num_warps": 2, "block_m": 32, "m_inner": True}),
    "defaultKmajorW1": ("heuristic", "kmajor", {"num_warps": 1}),
    "defaultKmajorW2St12": ("heuristic", "kmajor", {"num_warps": 2, "num_stages": 12}),
    # two warpgroups (64 features each as the wgmma's M side) and 2-3 splits at 32-64 rows (forty-second
    # session: never timed since the slot fix; 6-12 stages, 8 splits, G 16 and 128-deep steps all lost)
    "pG8m32w8st6x4e4SF": ("panel", 8, 32, 8, 6, 8, 4, 4, True, True),
    "pG8m64w8st6x4e4SF": ("panel", 8, 64, 8, 6, 8, 4, 4, True, True),
    "pG8m32st6x2e4SF": ("panel", 8, 32, 4, 6, 8, 2, 4, True, True),
    "pG8m64st6x2e4SF": ("panel", 8, 64, 4, 6, 8, 2, 4, True, True),
    "pG8m32st6x3e4SF": ("panel", 8, 32, 4, 6, 8, 3, 4, True, True),
    "pG8m64st6x3e4SF": ("panel", 8, 64, 4, 6, 8, 3, 4, True, True),
    # ("tma", block_m, warps, stages): the large-batch kernel's device-descriptor TMA path
    # (kernels/bsmm_tma.py, one block per step, acc [block_m, b]) at few rows (forty-second
    # session: ncu found b 16's small kernel bound on the L1/TEX pipe, 81 % busy with DRAM at 20 %;
    # TMA copies skip the LSU, the activation gather and the layout conversion through registers);
    # block_m 0: variant_block_m(M); 64 rows run wgmma (rows past M zero-filled, never read from HBM)
    "tmaM0w4st8": ("tma", 0, 4, 8), "tmaM0w4st12": ("tma", 0, 4, 12), "tmaM0w4st16": ("tma", 0, 4, 16),
    "tmaM0w1st8": ("tma", 0, 1, 8), "tmaM0w2st12": ("tma", 0, 2, 12),
    "tmaM64w4st8": ("tma", 64, 4, 8), "tmaM64w4st12": ("tma", 64, 4, 12),
}
SMALL_VARIANTS = {k: ALL_VARIANTS[k] for k in ("s32k64st4", "s16k64st6")}


def variant_block_m(m: int) -> int:
    """The activation rows per program of a variant that gives none: M's power of two, 16
    to 64 (the fixed rule, not the heuristic's choice, so a name always means one config)."""
    return S.rows_per_program(m)


def variant_config(fields: tuple, block_m: int, block: int = 16) -> (S.SmallConfig | P.PanelConfig | WG.WsGroupConfig
                                                                     | RS.ResidentConfig | GV.GemvConfig | KernelConfig):
    """The SmallConfig (PanelConfig for a "panel" entry, WsGroupConfig for a "group" one,
    the large kernel's TMA KernelConfig for a "tma" one) of
    an ALL_VARIANTS entry, for ``block_m`` activation rows (unless the entry gives its own).
    A deep-step panel's G and entries are b 16's: scaled to ``block`` (same features and depth)."""
    if fields[0] == "panel" and len(fields) > 7:
        group, own_block_m, warps, stages, group_m, splits, entries, swap, *fused = fields[1:]
        return P.PanelConfig(max(1, group * 16 // block), own_block_m, warps, stages, group_m, splits,
                             max(1, entries * 16 // block), swap, *fused)
    if fields[0] == "panel":
        return P.PanelConfig(*fields[1:])
    if fields[0] == "resident":
        rows, splits, chunk, w_stages, *more = fields[1:]
        unroll, columns, box = (list(more) + [4, False, 8][len(more):])[:3]
        return RS.ResidentConfig(rows=rows, splits=splits, chunk=chunk, w_stages=w_stages, unroll=unroll,
                                 columns=columns, box=box)
    if fields[0] == "tma":
        own_block_m, warps, stages = fields[1:]
        return KernelConfig(own_block_m or block_m, min(block, 64), warps, stages, tma=True)
    if fields[0] == "gemv":
        sub, block_k, reduce_each_step, warps = fields[1:]
        return GV.GemvConfig(sub, block_k, num_warps=warps, reduce_each_step=reduce_each_step)
    if fields[0] == "group":
        group, stages, entries, load_regs = fields[1:]
        return WG.WsGroupConfig(group, stages, load_regs=load_regs, entries_per_stage=entries)
    sub, block_k, stages, warps, *more = fields
    defaults = [1, 1, False, False, False, block_m, False, 0]
    splits, chunks, longest_first, swap, m_inner, own_block_m, prefetch, l2_ahead = \
        (list(more) + defaults[len(more):])[:8]
    return S.SmallConfig(sub, block_k, own_block_m or block_m, warps, stages, splits=splits, chunks=chunks,
                         longest_first=longest_first, swap=swap, m_inner=m_inner, prefetch=prefetch,
                         l2_ahead=l2_ahead)
