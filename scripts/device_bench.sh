#!/usr/bin/env bash
# One device call for benchmarks: the steps named in STEPS (default "large dtypes graph"),
# each under its own timeout, results under $OUT. TILESPARSE_COMMIT names the commit.
#   large  - the 'large' suite, bf16, every shape, peers side by side (eager timing)
#   dtypes - fp16 and fp32 (TF32) rows on the main shape, b = 128 and 64
#   graph  - kernel time (CUDA-graph replay) on the main shape
#   ceiling - the Triton GEMM-ceiling probe
#   small  - the 'small' suite (batch 1..512, achieved bandwidth; SMALL_ARGS, e.g. --quick)
#   small-a, small-a2, small-b - the small suite in three steps (M 1-8, M 16-64, then M 128-512:
#            the whole suite needs more than one 300 s step), merged into $OUT/small-m1-512.csv after small-b
#            (from whichever of small-a / small-a2 ran in the same call)
#   lstm   - the 'lstm' suite (BlockSparseLSTM vs cuDNN; LSTM_ARGS, e.g. "--quick --cuda-graph")
#   attention - the 'attention' suite (vs FlexAttention and SDPA; ATTN_ARGS, e.g. --quick)
#   attention-long - the 'attention-long' suite (S 131072 at 2-5 % of blocks: time and peak memory)
#   semi24 - the 'semi24' suite (2:4 GEMMs and the FFN block vs dense; SEMI24_ARGS, e.g. --quick)
#   attn-stored-ds - attention forward + backward with dQ recomputed (default) against dQ from the
#            dS the dK/dV kernel stores (kernels/attention_stored_ds.py); STORED_DS_ARGS e.g. --flex,
#            STORED_DS_ENERGY=3: also each mode's energy per call at the power cap
#   attn-fwd-persistent - the attention forward: Triton, warp-specialized, and the persistent
#            warp-specialized kernel (kernels/attention_ws_persistent.py); FWD_PERSISTENT_ARGS e.g. --flex
#   attn-tma-dq - the warp-specialized dK/dV kernel adding dQ by TMA reductions (atomic_dq,
#            deterministic=False) and its modes (fa3_order, staged_stores, host_descs): their GPU tests
#            (8 shards), then scripts/probes/attention_tma_dq.py against the
#            deterministic default and the Triton kernel's atomics (TMA_DQ_ARGS e.g. --flex)
#   attn-tests - the attention GPU tests (ATTN_TESTS, default the warp-specialized, ring / staged,
#            ordered, module and op files) in 8 shards of ATTN_TEST_TIMEOUT s (280: at 220 two shards ran out
#            while compiling, thirtieth session), logs in $OUT/attn-tests.log
#   attn-probe - scripts/probes/attention_tma_dq.py at each head dim of PROBE_DIMS (default 128),
#            host variants PROBE_HOST (TMA_DQ_HOST; "none": no host rows), dK/dV variants PROBE_VARIANTS
#            (TMA_DQ_VARIANTS, default none), patterns PROBE_PATTERNS, PROBE_ROUNDS (5), no passes /
#            concurrent rows: $OUT/attention-probe-d<D>.json and .log (e.g. the staged dQ / forward stores:
#            STEPS="attn-tests attn-probe" ATTN_TESTS=tests/test_attention_ring_stores_gpu.py
#            PROBE_HOST=dq_plain,dq_staged; the fwd_shipped / fwd_staged rows come with every run);
#            TMA_DQ_ENERGY=<s> adds each backward row's energy per call under sustained load
#   attn-configs - sweep the attention kernels' launch configs (scripts/probes/attention_configs.py)
#   tune   - `tilesparse tune` with TUNE_ARGS, winners in $OUT/tuned.json
#   tune-11008 - per-shape tune of b 128 updat on W [11008, 4096] and its transpose (where the
#            shape-free entries left updat at 0.85-1.00x of stk's), winners in $OUT/tuned-11008.json
#   graph-11008 - kernel time (CUDA-graph replay) on the two 11008 shapes, b 128 and 64
#   small-variants - small-batch kernel configs (deeper pipelines, narrow slices, splits) vs the default
#   small-chunks - the small-batch kernel with long block-rows cut in chunks and/or taken longest
#            first, vs whole rows in table order
#   small-chunks-ba - the same on Barabasi-Albert layouts (hub block-rows several times the mean)
#   small-mid - M 128-512 (where the small suite of 4f17400 fell to 0.6-0.8x dense at density 0.5):
#            the small kernel with a slice's row tiles as consecutive programs (m_inner), 128-row
#            programs, wider slices and 2 splits, against the tile kernel and the dispatcher's
#            choice (--auto); SMALL_MID_ARGS e.g. "--weight 4096x4096"; adopt winners with
#            scripts/measure_small_crossover.py --adopt small-mid.json
#   small-prefetch - the small kernel with each step's block index and activation tile loaded
#            ahead (SmallConfig.prefetch) against the heuristic's configs (each block's) and the shipped
#            choice (--auto): M 1 / 32 / 64 / 128, b 128-16,
#            density 0.5 / 0.1 / 0.03; adopt with measure_small_crossover.py --adopt small-prefetch.json
#   small-prefetch-b16 - b 16's prefetch at M 8 / 16 / 64 (the fourteenth session swept M 1 / 32);
#            adopt with measure_small_crossover.py --adopt small-prefetch-b16.json
#   small-gemv - the FMA kernel (kernels/bsmm_gemv.py) at M 1-8 against the dispatcher's choice,
#            every block size, density 0.5 / 0.1 (SMALL_GEMV_ARGS e.g. "--ms 2")
#   small-gemv-b16 - the FMA kernel at b 16, M 2-4: 4 and 8 warps, 32-256-wide steps
#            (SMALL_GEMV_ARGS="--ms 1 5 8" for the other row counts)
#   small-swap - M 32 and 64: the swapped product orientation (batch rows as the MMA's M,
#            wgmma at M 64) against the default configs and the tuned choice
#   small-skew - the dispatcher's own choice (--auto: chunks on skewed layouts) against whole
#            runs, on Barabasi-Albert and random layouts (SKEW_ARGS overrides the sizes)
#   sdpa-deterministic - SDPA causal forward + backward per backend, with and without
#            torch.use_deterministic_algorithms: time and bitwise reproducibility
#   small-m64 - M 64: wider slices (less activation traffic per weight byte) with chunks
#   small-crossover - small vs large dds kernel per (op, block, density, M 16..512): measured
#            dispatch entries in $OUT/tuned-crossover.json (merge with --merge to ship them)
#   ws     - the Hopper warp-specialized dds (bsmm_ws) against the Triton tile kernel and dense,
#            kernel time, fprop, bprop and updat (WS_ARGS overrides shapes / blocks / variants)
#   ws-balanced - the ws dds with the balanced tile schedule (kernels/ws_schedule.py) against
#            round-robin, bf16 b 128 and 64, fprop and bprop, both shapes; then TF32 b 128
#   ws-b128-more - around the b 128 default: a 5th stage, tile-order groups of 4 and 16
#   ws-small-blocks - the ws dds at b 32 and 16 (deep rings) against the Triton kernels, fprop and bprop
#   ws-group - the column-grouped dds (kernels/bsmm_ws_group.py): the shipped configs, two union
#            entries per ring stage and deeper rings, b 32 / 16 / 64, density 0.5 / 0.25, both shapes
#   ws-sdd - b 64 updat: the grouped ws sdd (kernels/bsmm_ws_sdd_group.py, shipped at M 8192, d 0.5)
#            against the row-run ws sdd (kernels/bsmm_ws_sdd_rows.py), both shapes, density 0.5 / 0.25 / 0.1;
#            then ncu (DRAM, L2 hit rate) of the row-run kernel on 16384x8192²
#   ws-group-e34 - the grouped dds with three / four union entries per stage against the shipped configs,
#            b 32 / 16, density 0.5 / 0.25, both shapes
#   ws-group-b16 - b 16 at density 0.5 / 0.25: the grouped dds with four union entries per stage and
#            ring depths 2-5 against the shipped choice, fprop and bprop, both shapes
#   small-resident - the resident-activation fprop (kernels/bsmm_resident.py and its column-major variant,
#            bsmm_resident_columns.py, the rC variants): its GPU tests (4 shards),
#            then against the small kernel's default and the dispatcher's choice, W 12288², b 16 / 32 / 64,
#            d 0.5 / 0.25 / 0.1, M 1-64 (RESIDENT_VARIANTS overrides the variants), $OUT/small-resident.json;
#            RESIDENT_TESTS=0 / RESIDENT_PROBE=0 leave out either half (two calls fit the 600 s limit)
#   small-panel-next - the deep panel's open questions (thirty-sixth session), b 16, W 12288², with the
#            dispatcher's choice and the heuristic in the same run: the fused split sum against the shipped
#            torch sum, 4 block-rows x 8 entries (longer runs per row) for fprop, and densities 0.2 / 0.15
#            (the 0.25 bucket's low end); adopt with measure_small_crossover.py --adopt ... --per-shape
#   small-panel-wide - deep panels (128 x 128 tiles, 64-deep steps) at 128-512 rows, b 16 / 32, where
#            b 16 ran 3.5-4x slower than dense; adopt with measure_small_crossover.py --adopt ... --per-shape
#   small-panel-wide2 - the next round at 128 / 256 rows: 256-wide panels, 256 rows, deeper pipelines
#   small-panel-split - b 16 / 32 at 16-64 rows: the panel dds (G block-rows sharing each activation tile)
#            with its reduction split over 8-16 programs, against the small kernel's default and the
#            dispatcher's choice; adopt with measure_small_crossover.py --adopt small-panel-split.json
#   ncu-shipped - ncu (speed of light, memory, occupancy, launch) of the shipped kernel for one product:
#            NCU_ARGS for scripts/probes/dispatch_one.py (e.g. "--op updat --block 32 --density 0.25"),
#            NCU_KERNEL a kernel-name regex (default: dds|sdd); SM active cycles against elapsed say
#            whether programs idle (load balance) or run starved (bandwidth / latency); warp states
#            and the schedulers' issue say what a starved warp waits on, the source counters where (SASS lines);
#            NCU_TAG names the report ($OUT/ncu-shipped-<tag>.txt) so that one call can run several
#   small-next40 - the fortieth session's next sweeps (W 12288² unless noted): spread_index on a 4096²
#            weight and at b 8; the deep panel at 32-64 rows with 8 splits; the density-0.25 bucket's
#            bprop crossover between the deep panel and the small kernel with spread_index
#   small-stages - deeper rings where the loads are indirect (TTGIR: 8 stages keep 3 weight buffers in
#            the small kernel's bprop and gather paths, 6 stages 3 in the deep panel): the dispatcher's
#            config at 12 / 16 / 24 stages, b 16 (density 0.25-0.03, M 8-64) and b 32-128 (b 128 at 8
#            stages without prefetch: 3 buffers too; density 0.1 / 0.03, M 1-64)
#   small-tma - b 16 at 8-64 rows through the large kernel's device-descriptor TMA path (one block
#            per step; ncu: the small kernel is bound on the L1/TEX pipe, which TMA copies skip)
#   panel-next42 - the deep panel at 32-64 rows with two warpgroups or 2-3 splits (b 16, density 0.5 / 0.25);
#            then the small kernel with K-major activations (autoKmajor), b 16 / 32, density 0.03-0.25, M 16-64
#   kmajor43 - the small kernel on K-major activations (forty-third session: b 16, density 0.1, M 64 from 42
#            to 22 µs): with the transpose inside the timed call (autoKmajorT / defaultKmajorT), the heuristic
#            config where panels are dispatched (defaultKmajor*), b 16 at density 0.5-0.03, M 8-64; b 32 / 64
#   kmajor43b - the dispatcher's K-major path (bsmm_kmajor) against itself with bsmm.KMAJOR_SMALL off, and
#            the small kernel behind the tiled transposing copy, b 16 at 16-64 rows (48 too), b 32 at 32-64
#   kmajor44 - K-major configs of their own (defaultKmajor* overrides: reduction depth, warps, stages, 32-row
#            tiles, prefetch), b 16 at 16-64 rows; then K-major against row-major on the LSTM's recurrent
#            weight (W_hh [4H, H], hidden 4096; b 32 / 64 / 16, batch 32); then the small suite's
#            tilesparse_kmajor rows (b 16 / 32, 16-64 rows)
#   warps44 - the small kernel at 1 / 2 warps per program (it had only run 4 or 8), row-major (the dispatcher's
#            and the heuristic's config) and K-major, b 16 at 1-64 rows, then b 32-128 row-major
#   kmajor45 - after 2 warps went into the heuristic and K-major took the heuristic's config: the dispatcher
#            (auto) against itself with K-major off (autoRowMajor) and the small kernel behind the tiled copy
#            (defaultKmajorTT) / on K-major inputs (defaultKmajor), b 16 at 16-64 rows, b 32 at 16-64
#   warps45 - the deep panel and the FMA kernel at 1 / 2 / 8 warps (b 16, 2-8 rows); the small kernel at 1 / 2
#            warps where warps44 did not reach (b 32-128 at 8 rows, density 0.05); b 32-128 at 48-64 rows unswapped
#            at 2 / 4 warps and as two 32-row programs per slice (the swapped wgmma tile needs 4 warps)
#   warps46 - the dispatcher's 1-2 warp configs against 4 warps on smaller weights (4096², 8192²: fewer programs
#            per SM than the 12288² they were measured on), b 16-128, M 1 / 8 / 32
#   warps47 - the one-wave warps rule between 132 and 256 programs: W 6144² (192 programs at b >= 32) and
#            W 5120² (160), 2 against 4 warps, b 32-128, M 1 / 8 / 32
#   plans48 - GPU tests of the layers' plans (ops/linear_plans.py), the loop graphs (record_stream on their
#            statics: the eviction test also run with record_stream made a no-op, where it should fail) and the
#            shared side streams (attention's concurrent dQ, the tables' side stream); then
#            scripts/probes/linear_plans_eager.py (eager no-grad forwards with / without plans, against graph replay)
#   plans48b - plans48's tests and race check, then the probe's --profile (where a planned call's host time goes)
#   timeline49 - scripts/probes/small_timeline.py: per-program start / end / SM stamps of a copy of the small
#            kernel's fprop loop, random against balanced layout (b 128 / 32, density 0.1 / 0.25, M 1):
#            $OUT/small-timeline.{json,log}
#   wgmma50 - b 128 / 64 at 1-16 rows on wgmma without the swap (64-wide slices, 4 warps; the fiftieth
#            session's ncu: the shipped kernel's time follows the SM clock), against the dispatcher, and the
#            timeline probe's copy of the loop at 64-wide slices, after their GPU tests: $OUT/small-wgmma.*,
#            small-timeline-wgmma.*, gpu-tests-wgmma50.log
#   hostab49 - scripts/probes/linear_plans_eager.py --host-ab: planned calls with and without the host cuts
#            (7d8f590), alternating round by round in one process: $OUT/host-ab.{json,log}
#   host49 - GPU tests of the layers, plans, launches and switches after the host-time cuts (7d8f590), then
#            scripts/probes/linear_plans_eager.py alternately on this tree and on $HOST49_BASE (a copy of an
#            earlier commit's tilesparse/ and scripts/probes/, e.g. git archive 049ae56 | tar -x -C base49), 2 rounds
#            each: $OUT/host49-{new,base}-{1,2}.log
#   demo48 - scripts/probes/linear_plans_eager.py (after the raw-stream key), then the LSTM demo at density 0.1
#            (W_hh sparse, H 2880; eager with the loop graphs): $OUT/demo-lstm-d0.1.{csv,json,log}
#   graphs47b - the paper's LSTM suite (lstm-paper: H 6144 / 12288 / 18432, density 0.03) and the quick LSTM suite,
#            eager with the loops from CUDA graphs ($OUT/lstm-paper.csv, $OUT/lstm-quick.csv)
#   graphs47 - the eager LSTM with its time loops replayed from CUDA graphs (ops/lstm_graphs.py):
#            b 16, density 0.25, batch 32, H 2048 / 4096 with TILESPARSE_LSTM_GRAPHS off / on, batch 4 on,
#            then the quick LSTM suite (graphs on; $OUT/lstm-quick.csv)
#   plans47 - the eager LSTM at batch 4 (b 16, density 0.25, H 2048 / 4096: the FMA kernel's table rows, now
#            relaunched by DdsPlan) with TILESPARSE_STEP_PLANS off / on; then scripts/probes/lstm_step_profile.py
#            (batch 32, H 2048 / 4096 / 2048: wall against kernel time per timestep, the host's busiest ops)
#   plans46 - GPU tests of the per-sequence step plans (DdsPlan, CellSteps, PreparedLaunch) and what they touch,
#            then the eager LSTM suite (b 16, density 0.25, H 2048 / 4096) with TILESPARSE_STEP_PLANS off / on
#   swap64 - b 64 / 128 at 32-64 rows, density 0.25 / 0.5: 64-wide swapped slices, whole runs and split in 2
#            (small_variants' s64k64st8Sx2 and kin), against the dispatcher's choice
#   next46 - the forty-fifth session's open checks in one call (7 files): warps47, the probe's dense rotation at
#            4096² (its dense_ms against the suite's 12.5-14.2 µs) and the GPU tests of the small dispatch
#   lstm-kmajor - BlockSparseLSTM at b 16 with the cell writing h^T for a K-major recurrent product, against
#            TILESPARSE_KMAJOR=off (row-major products), batch 32, hidden 2048 / 4096, density 0.25 / 0.1,
#            after the LSTM GPU tests ($OUT/gpu-tests-lstm.log)
#   small-4096-suite - the small suite on W 4096² (M 1-64, then 128-512, merged into
#            $OUT/small-4096-m1-512.csv): the base for gen_small_speedups.py's w4096x4096.py
#   small-stages2 - b 32-128 at 4 / 6 / 16 / 24 stages (density 0.03-0.5, M 1-64), b 16 at 4 / 6
#   panel-stages - the deep panels at 8-12 stages (6 keep 3 buffers), b 16, density 0.5 / 0.25, M 8-64
#   small-4096 - W 4096²: the heuristic against the dispatcher's choice (shape-free entries tuned on
#            12288²) and against dense, b 16-128, density 0.5-0.1, M 1-32;
#            then b 16 at 256 / 512 rows through the one-entry panels, and the density-0.25 bucket's
#            forward crossover (small kernel against the deep panel, 8-16 rows)
#   l2-ingest - the SMs' intake with part of the bytes from L2 (scripts/probes/l2_ingest.py: a read of a
#            151 MB buffer plus 0-4x as many bytes from a 1-16 MB L2-resident one, and L2-only reads)
#   feature-major - b 64 / 32 / 16: the streaming kernel's feature-major tiles (a W slice as the
#            MMA's M side, 128-256 activation rows as N) at large M against the default, fprop, bprop
#   sdd-group - updat with several blocks of a block-row per program (kernels/bsmm_sdd_group.py)
#            against the default sdd, b 128-16, both shapes
#   transpose - TF32 updat's activation copies: PyTorch's against kernels/transpose.py, alone and
#            inside TF32 updat (bsmm.TILED_TF32_COPIES off / on)
#   dense-dispatch - block_sparse_linear with TILESPARSE_DENSE_DISPATCH on / off against dense,
#            b 16 / 32 / 64, density 0.05-0.5 (scripts/probes/dense_dispatch_ab.py)
#   block-scatter - the dense path's block copies, Triton against PyTorch indexing
#            (scripts/probes/block_scatter_ab.py), then the dense path at 128-512 rows against the kernels
#   host   - host time per call: profile_host.py, the direct-launch A/B (launch_ab.py) and
#            step_gap.py (the step with and without autograd's threads, backward phases)
#   learn-profile  - where the 2:4 one-pass value-map learn spends its time
#   attn-profile   - per-kernel times of attention forward + backward against FlexAttention
#   attn-bwd-ncu   - ncu of the dK/dV kernel (NCU_ATTN_KERNEL, a kernel-name regex: _bwd_dkdv; _bwd_dq for
#            the dQ kernel, which runs only with NCU_DETERMINISTIC=1 on a pattern the ordered mode
#            refuses: random10, bigbird, fixed; one launch after warm-up) on NCU_PATTERN (local1024), with
#            deterministic=False (TMA-reduction dQ; NCU_DETERMINISTIC=1: the default instead):
#            speed of light, warp states, scheduler, memory and the source's top stall lines;
#            then the per-kernel times (attn-profile) of that pattern; $OUT/ncu-attention-<kernel>-<pattern>.txt (e.g. -bwd-dkdv-local1024)
#   attn-power - sustained power, SM clock and energy per call of attention forward + backward
#            (scripts/probes/attention_power.py; POWER_ARGS e.g. "--patterns random10 --ops fwd fwd_bwd"):
#            under the 700 W cap energy per call, not full-clock latency, sets the suite's ratios;
#            then attention_drift.py (kernel times before / after the suite's timing stages)
#   ddp    - examples/ddp_train.py on 1 and on all GPUs of the machine (same global batch):
#            loss curves and tokens/s in $OUT/ddp1.json, $OUT/ddpN.json (run on nvidia-h200-x2)
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
for step in ${STEPS:-large dtypes graph}; do
  start=$(date +%s)
  case $step in
    large)  timeout "${LARGE_TIMEOUT:-340}" python3 -m tilesparse bench --out "$OUT" > "$OUT/bench-large.log" 2>&1 ;;
    dtypes) timeout "${DTYPES_TIMEOUT:-150}" python3 -m tilesparse bench --dtype fp16 fp32 --shape 8192x4096x4096 \
              --block 128 64 --out "$OUT" --no-plot > "$OUT/bench-dtypes.log" 2>&1 ;;
    graph)  timeout "${GRAPH_TIMEOUT:-150}" python3 -m tilesparse bench --cuda-graph --shape 8192x4096x4096 \
              --no-plot --out "$OUT" > "$OUT/bench-graph.log" 2>&1 ;;
    ceiling) timeout 90 python3 scripts/probes/gemm_ceiling.py > "$OUT/gemm-ceiling.txt" 2>&1 ;;
    small)  timeout "${SMALL_TIMEOUT:-300}" python3 -m tilesparse bench --suite small ${SMALL_ARGS:-} --out "$OUT" \
              > "$OUT/bench-small.log" 2>&1 ;;
    small-a) timeout "${SMALL_TIMEOUT:-290}" python3 -m tilesparse bench --suite small --shape 1x12288x12288 \
              2x12288x12288 4x12288x12288 8x12288x12288 --out "$OUT/small-a" > "$OUT/bench-small-a.log" 2>&1 ;;
    small-a2) timeout "${SMALL_TIMEOUT:-290}" python3 -m tilesparse bench --suite small --shape 16x12288x12288 \
              32x12288x12288 64x12288x12288 --out "$OUT/small-a2" > "$OUT/bench-small-a2.log" 2>&1 ;;
    small-b) timeout "${SMALL_TIMEOUT:-290}" python3 -m tilesparse bench --suite small --shape 128x12288x12288 \
              256x12288x12288 512x12288x12288 --out "$OUT/small-b" --no-plot > "$OUT/bench-small-b.log" 2>&1
            python3 scripts/merge_results.py "$OUT/small-m1-512.csv" "$OUT"/small-a*/*-small.csv \
              "$OUT"/small-b/*-small.csv >> "$OUT/bench-small-b.log" 2>&1 ;;
    lstm)   timeout "${LSTM_TIMEOUT:-300}" python3 -m tilesparse bench --suite lstm ${LSTM_ARGS:-} --out "$OUT" \
              > "$OUT/bench-lstm.log" 2>&1 ;;
    ddp)    gpus=$(nvidia-smi -L | wc -l)
            timeout "${DDP_TIMEOUT:-240}" torchrun --nproc-per-node 1 examples/ddp_train.py --out "$OUT/ddp1.json" \
              ${DDP_ARGS:-} > "$OUT/ddp.log" 2>&1
            timeout "${DDP_TIMEOUT:-240}" torchrun --nproc-per-node "$gpus" examples/ddp_train.py \
              --out "$OUT/ddp$gpus.json" ${DDP_ARGS:-} >> "$OUT/ddp.log" 2>&1 ;;
    attention) timeout "${ATTN_TIMEOUT:-300}" python3 -m tilesparse bench --suite attention ${ATTN_ARGS:-} --out "$OUT" \
              > "$OUT/bench-attention.log" 2>&1 ;;
    attention-long) timeout "${ATTN_TIMEOUT:-300}" python3 -m tilesparse bench --suite attention-long --out "$OUT" \
              > "$OUT/bench-attention-long.log" 2>&1 ;;
    attn-stored-ds) timeout "${ATTN_TIMEOUT:-300}" python3 scripts/probes/attention_stored_ds.py ${STORED_DS_ARGS:-} \
              --out "$OUT/attention-stored-ds.json" > "$OUT/attention-stored-ds.log" 2>&1 ;;
    attn-fwd-persistent) timeout "${ATTN_TIMEOUT:-200}" python3 scripts/probes/attention_fwd_persistent.py \
              ${FWD_PERSISTENT_ARGS:-} --out "$OUT/attention-fwd-persistent.json" > "$OUT/attention-fwd-persistent.log" 2>&1 ;;
    attn-tma-dq) for i in 0 1 2 3 4 5 6 7; do  # 8 shards: one process compiles too slowly for 240 s
              TILESPARSE_SHARD=$i/8 timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
                tests/test_attention_ws_atomic_gpu.py \
                tests/test_attention_ws_gpu.py::test_backward_with_host_descriptors_is_bitwise_the_same \
                > "/tmp/attn-tma-dq-tests-$i.log" 2>&1 &
            done; wait; tail -n 40 /tmp/attn-tma-dq-tests-*.log > "$OUT/attn-tma-dq-tests.log"
            timeout "${ATTN_TIMEOUT:-300}" python3 scripts/probes/attention_tma_dq.py ${TMA_DQ_ARGS:-} \
              --out "$OUT/attention-tma-dq.json" > "$OUT/attention-tma-dq.log" 2>&1 ;;
    attn-tests) for i in 0 1 2 3 4 5 6 7; do
              TILESPARSE_SHARD=$i/8 timeout "${ATTN_TEST_TIMEOUT:-280}" python3 -m pytest -q -m gpu -p no:cacheprovider \
                ${ATTN_TESTS:-tests/test_attention_ring_stores_gpu.py tests/test_attention_ws_gpu.py tests/test_attention.py \
                tests/test_attention_module.py tests/test_attention_ordered_dq_gpu.py} > "/tmp/attn-tests-$i.log" 2>&1 &
            done; wait; tail -n 40 /tmp/attn-tests-*.log > "$OUT/attn-tests.log"
            grep -hE "passed|failed|error" /tmp/attn-tests-*.log | tail -n 8 ;;
    attn-probe) for dim in ${PROBE_DIMS:-128}; do
              TMA_DQ_HOST=${PROBE_HOST:-balanced} TMA_DQ_CONCURRENT=0 TMA_DQ_PASSES=0 TMA_DQ_ROUNDS=${PROBE_ROUNDS:-5} \
                TMA_DQ_VARIANTS=${PROBE_VARIANTS:-none} timeout "${PROBE_TIMEOUT:-150}" python3 scripts/probes/attention_tma_dq.py --head-dim "$dim" \
                --patterns ${PROBE_PATTERNS:-local1024 random10 bigbird fixed} --out "$OUT/attention-probe-d$dim.json" \
                > "$OUT/attention-probe-d$dim.log" 2>&1; tail -n 6 "$OUT/attention-probe-d$dim.log"
            done ;;
    attn-configs) timeout "${ATTN_TIMEOUT:-300}" python3 scripts/probes/attention_configs.py --budget 240 \
              --out "$OUT/attention-configs.json" > "$OUT/attention-configs.log" 2>&1 ;;
    semi24) timeout "${SEMI24_TIMEOUT:-300}" python3 -m tilesparse bench --suite semi24 ${SEMI24_ARGS:-} --out "$OUT" \
              > "$OUT/bench-semi24.log" 2>&1 ;;
    small-variants) timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --blocks 128 32 \
              --densities 0.25 0.03 --ms 1 32 ${VARIANT_ARGS:---variants s32k64st8 s32k64st12 s32k64st16 s16k64st8 \
              s16k64st12 s32k128st8 s32k64st8x2 s32k64st8x3} --out "$OUT/small-variants.json" > "$OUT/small-variants.log" 2>&1 ;;
    small-mid) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 128 64 32 16 \
              --densities 0.5 0.1 0.03 --ms 128 256 512 --auto --variants s32k64st12S s32k32st12S s16k64st8 \
              s32k64st12SI s64k64st8SI s32k64st8Sw8m128I s64k64st6Sw8m128I s64k64st6Sw8m128Ix2 s128k64st4Sw8m128I \
              s128k64st4Sw8m128Ix2 s16k64st8I ${SMALL_MID_ARGS:-} --out "$OUT/small-mid.json" > "$OUT/small-mid.log" 2>&1 ;;
    small-prefetch) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 128 64 32 16 \
              --densities 0.5 0.1 0.03 --ms 1 32 64 128 --auto --variants s32k128st8 s32k64st12 s32k32st12 s32k64st12S s32k32st12S \
              s16k64st8 s64k64st8SI s32k128st8P s32k64st12P s32k32st12P s16k64st8P s16k128st8P s32k64st12SP \
              s32k32st12SP s64k64st8SIP \
              ${SMALL_PREFETCH_ARGS:-} --out "$OUT/small-prefetch.json" > "$OUT/small-prefetch.log" 2>&1 ;;
    small-prefetch-b16) timeout "${SMALL_TIMEOUT:-150}" python3 scripts/probes/small_threshold.py --blocks 16 \
              --densities 0.5 0.25 0.1 0.03 --ms 8 16 64 --auto --variants s16k64st8 s16k64st8P s16k128st8P \
              --out "$OUT/small-prefetch-b16.json" > "$OUT/small-prefetch-b16.log" 2>&1 ;;
    small-gemv) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 16 32 64 128 \
              --densities 0.5 0.1 --ms 1 4 8 --auto --variants v16k128 v16k256 v16k512r v16k128r v16k64r v32k128 \
              v32k256r v32k64r v32k64 v32k128r v32k32r v64k128r ${SMALL_GEMV_ARGS:-} \
              --out "$OUT/small-gemv.json" > "$OUT/small-gemv.log" 2>&1 ;;
    small-gemv-b16) timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --blocks 16 \
              --densities 0.5 0.1 --ms 2 3 4 --auto --variants v16k128 v16k64 v16k32 v16k128w8 v16k256w8 ${SMALL_GEMV_ARGS:-} \
              --out "$OUT/small-gemv-b16.json" > "$OUT/small-gemv-b16.log" 2>&1 ;;
    small-chunks) timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --blocks 128 64 32 16 \
              --densities 0.25 0.1 0.03 --ms 1 32 --variants s32k128st8 s32k128st8c2 s32k128st8c3 s32k128st8L \
              s32k128st8c2L s32k64st12 s32k64st12c2 s32k64st12L s32k64st12c2L s32k32st12 s32k32st12c2 s32k32st12L \
              s16k64st8 s16k64st8c2 s16k64st8L --out "$OUT/small-chunks.json" \
              > "$OUT/small-chunks.log" 2>&1 ;;
    small-chunks-ba) timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --layout barabasi_albert \
              --blocks 128 32 --densities 0.1 0.03 --ms 1 32 --variants s32k128st8 s32k128st8c2 s32k128st8c3 s32k128st8L \
              s32k128st8c2L s32k32st12 s32k32st12c2 s32k32st12L --out "$OUT/small-chunks-ba.json" \
              > "$OUT/small-chunks-ba.log" 2>&1 ;;
    small-swap) timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --auto --blocks 128 64 32 16 \
              --densities 0.25 0.1 --ms 64 32 --variants default s32k128st8S s32k64st12S s32k32st12S s16k64st8S \
              --out "$OUT/small-swap.json" > "$OUT/small-swap.log" 2>&1 ;;
    small-skew) for lay in barabasi_albert random; do
              timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --layout $lay --auto \
                ${SKEW_ARGS:---blocks 128 64 32 --densities 0.25 0.1 0.05 --ms 1 32 64} \
                --variants default --out "$OUT/small-skew-$lay.json" > "$OUT/small-skew-$lay.log" 2>&1
            done ;;
    sdpa-deterministic) timeout 150 python3 scripts/probes/sdpa_deterministic.py --out "$OUT/sdpa-deterministic.json" \
              > "$OUT/sdpa-deterministic.log" 2>&1 ;;
    small-m64) timeout "${SMALL_TIMEOUT:-200}" python3 scripts/probes/small_threshold.py --blocks 128 64 \
              --densities 0.25 0.1 --ms 64 --variants s32k128st8 s32k64st12 s32k128st8c2 s64k64st6 s64k64st6c2 \
              s64k64st6c2L s128k64st4w8 s128k64st4w8c3 --out "$OUT/small-m64.json" > "$OUT/small-m64.log" 2>&1 ;;
    small-crossover) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/measure_small_crossover.py ${CROSS_ARGS:-} \
              --record "$OUT/tuned-crossover.json" > "$OUT/small-crossover.log" 2>&1 ;;
    ws)     timeout "${WS_TIMEOUT:-300}" python3 scripts/probes/ws_sweep.py ${WS_ARGS:---shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 128 64 --ops fprop bprop updat} --out "$OUT/ws-sweep.json" > "$OUT/ws-sweep.log" 2>&1 ;;
    ws-group) timeout "${WS_TIMEOUT:-300}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 32 16 64 --densities 0.5 0.25 --ops fprop bprop --variants cg-g8st4 cg-g4st3 \
              cg-g8st3e2 cg-g8st4e2 cg-g4st4e2 cg-g2st2e2 cg-g8st6 --out "$OUT/ws-group.json" > "$OUT/ws-group.log" 2>&1 ;;
    ws-group-e34) timeout "${WS_TIMEOUT:-300}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 32 16 --densities 0.5 0.25 --ops fprop --variants cg-g8st3e2 cg-g4st4e2 \
              cg-g4st3e4 cg-g8st2e3 cg-g4st4e3 cg-g8st3e4 cg-g8st4e3 --out "$OUT/ws-group-e34.json" \
              > "$OUT/ws-group-e34.log" 2>&1 ;;
    ws-group-b16) timeout "${WS_TIMEOUT:-300}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 16 --densities 0.5 0.25 --ops fprop bprop --variants cg-g8st3e2 cg-g8st3e4 \
              cg-g8st2e4 cg-g8st4e4 cg-g8st5e4 cg-g8st3e4m4 --out "$OUT/ws-group-b16.json" \
              > "$OUT/ws-group-b16.log" 2>&1 ;;
    small-resident) if [ "${RESIDENT_TESTS:-1}" = 1 ]; then for i in 0 1 2 3; do
              TILESPARSE_SHARD=$i/4 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
                tests/test_bsmm_resident.py > "/tmp/resident-tests-$i.log" 2>&1 &
            done; wait; tail -n 30 /tmp/resident-tests-*.log > "$OUT/resident-tests.log"
            grep -hE "passed|failed|error" /tmp/resident-tests-*.log | tail -n 4; fi
            if [ "${RESIDENT_PROBE:-1}" = 1 ]; then timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --weight 12288x12288 \
              --blocks 16 32 64 --densities 0.5 0.25 0.1 --ms 1 16 32 64 --variants default \
              ${RESIDENT_VARIANTS:-rR12x2 rC6x1 rC8x1 rC6x1k4 rC12x2c8 rC4x1c24 rC3x1b32 rC4x2b32 rC2x1b64} --auto \
              --out "$OUT/small-resident.json" > "$OUT/small-resident.log" 2>&1; fi ;;
    small-panel-next) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 16 \
              --densities 0.5 0.25 0.2 0.15 --ms 8 16 32 64 --variants default pG8m16x4e4S pG8m16x4e4SF \
              pG8m32x4e4S pG8m32x4e4SF pG8m64x4e4S pG8m64x4e4SF pG4m32x4e4SF pG4m64x4e4SF pG4m16x4e8S \
              pG4m32x4e8S pG4m64x4e8S --auto --out "$OUT/small-panel-next.json" > "$OUT/small-panel-next.log" 2>&1 ;;
    small-panel-wide) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 16 32 \
              --densities 0.5 0.25 0.1 --ms 128 256 512 --variants default pG8m128x1e4 pG8m128x2e4F pG8m128x4e4F \
              pG8m128w8x2e4F pG8m128x2e2F pG8m128x2e4SF pG8m64x2e4SF pG4m128x2e4F --auto \
              --out "$OUT/small-panel-wide.json" > "$OUT/small-panel-wide.log" 2>&1 ;;
    small-panel-wide2) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 16 32 \
              --densities 0.5 0.25 --ms 128 256 --variants default pG8m128w8x2e4F pG4m128x2e4F pG16m128w8x2e4F \
              pG16m64w8x2e4F pG8m256w8x2e4F pG8m128w8st4x2e4F pG4m128w8x2e4F pG4m128x4e4F pG8m128w8x4e2F --auto \
              --out "$OUT/small-panel-wide2.json" > "$OUT/small-panel-wide2.log" 2>&1 ;;
    small-panel-split) timeout "${SMALL_TIMEOUT:-300}" python3 scripts/probes/small_threshold.py --blocks 16 32 \
              --densities 0.5 0.25 0.1 --ms 16 32 64 --variants default pG8m16w4st4x8 pG8m32w4st4x8 pG8m64w4st4x8 \
              pG8m64w4st4x16 pG8m64w8st4x8 pG4m64w4st4x8 --auto --out "$OUT/small-panel-split.json" \
              > "$OUT/small-panel-split.log" 2>&1 ;;
    ncu-shipped) timeout "${NCU_TIMEOUT:-150}" /usr/local/cuda/bin/ncu --kernel-name "regex:${NCU_KERNEL:-dds|sdd}" \
              --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
              --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters \
              python3 scripts/probes/dispatch_one.py ${NCU_ARGS:-} \
              > "$OUT/ncu-shipped${NCU_TAG:+-$NCU_TAG}.txt" 2>&1 ;;
    small-next40) timeout 150 python3 scripts/probes/small_threshold.py --weight 4096x4096 --blocks 16 8 \
              --densities 0.5 0.1 --ms 8 32 --variants default defaultS --auto --out "$OUT/spread-4096.json" \
              > "$OUT/spread-4096.log" 2>&1
            timeout 200 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 --ms 32 64 \
              --variants pG8m32st6x4e4SF pG8m64st6x4e4SF pG8m32st6x8e4SF pG8m64st6x8e4SF pG4m32st6x8e4SF \
              pG4m64st6x8e4SF --auto --out "$OUT/panel-splits8.json" > "$OUT/panel-splits8.log" 2>&1
            timeout 150 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.2 0.25 0.3 0.35 \
              --ms 8 16 --ops bprop --variants defaultS pG8m16st6x4e4SF --auto --out "$OUT/bucket-025.json" \
              > "$OUT/bucket-025.log" 2>&1 ;;
    small-stages) timeout 280 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.25 0.1 0.03 \
              --ms 8 16 32 64 --variants autoSt12 autoSt16 autoSt24 --auto --out "$OUT/small-stages.json" \
              > "$OUT/small-stages.log" 2>&1
            timeout 280 python3 scripts/probes/small_threshold.py --blocks 128 64 32 --densities 0.1 0.03 \
              --ms 1 8 32 64 --variants autoSt12 autoSt16 autoSt24 --auto --out "$OUT/small-stages-b32-128.json" \
              > "$OUT/small-stages-b32-128.log" 2>&1 ;;
    panel-stages) timeout 240 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 --ms 8 16 32 64 \
              --variants pG8m16st8x4e4SF pG8m16st10x4e4SF pG8m16st12x4e4SF pG8m32st8x4e4SF pG8m32st10x4e4SF \
              pG8m32st12x4e4SF pG8m64st8x4e4SF pG8m64st10x4e4SF pG8m64st12x4e4SF --auto \
              --out "$OUT/panel-stages.json" > "$OUT/panel-stages.log" 2>&1 ;;
    small-tma) timeout 240 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 0.1 0.03 \
              --ms 8 16 32 64 --variants tmaM0w4st8 tmaM0w4st12 tmaM0w1st8 tmaM0w2st12 tmaM64w4st8 tmaM64w4st12 \
              --auto --out "$OUT/small-tma.json" > "$OUT/small-tma.log" 2>&1 ;;
    panel-next42) timeout 240 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 --ms 32 64 \
              --variants pG8m32st6x4e4SF pG8m64st6x4e4SF pG8m32w8st6x4e4SF pG8m64w8st6x4e4SF pG8m32st6x2e4SF \
              pG8m64st6x2e4SF pG8m32st6x3e4SF pG8m64st6x3e4SF --auto --out "$OUT/panel-next42.json" \
              > "$OUT/panel-next42.log" 2>&1
            timeout 200 python3 scripts/probes/small_threshold.py --blocks 16 32 --densities 0.25 0.1 0.03 \
              --ms 16 32 64 --variants autoKmajor --auto --out "$OUT/small-kmajor.json" > "$OUT/small-kmajor.log" 2>&1 ;;
    kmajor43) timeout 280 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 0.1 0.03 \
              --ms 8 16 32 64 --variants autoKmajor autoKmajorT defaultKmajor defaultKmajorT defaultKmajorSt4 \
              defaultKmajorSt12 --auto --out "$OUT/kmajor43-b16.json" > "$OUT/kmajor43-b16.log" 2>&1
            timeout 200 python3 scripts/probes/small_threshold.py --blocks 32 64 128 --densities 0.5 0.25 0.1 \
              --ms 8 32 64 --variants autoKmajor autoKmajorT defaultKmajor defaultKmajorT --auto \
              --out "$OUT/kmajor43-b32-128.json" > "$OUT/kmajor43-b32-128.log" 2>&1 ;;
    kmajor43b) timeout 220 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 0.1 0.03 \
              --ms 16 32 48 64 --variants autoRowMajor autoKmajorTT defaultKmajorTT autoKmajor defaultKmajor --auto \
              --out "$OUT/kmajor43b-b16.json" > "$OUT/kmajor43b-b16.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --blocks 32 --densities 0.5 0.25 0.1 --ms 32 64 \
              --variants autoRowMajor autoKmajorTT defaultKmajorTT autoKmajor --auto \
              --out "$OUT/kmajor43b-b32.json" > "$OUT/kmajor43b-b32.log" 2>&1 ;;
    kmajor44) timeout 220 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.25 0.1 0.03 \
              --ms 16 32 48 64 --variants autoKmajor defaultKmajor defaultKmajorK32 defaultKmajorK128 \
              defaultKmajorW2 defaultKmajorW8 defaultKmajorSt6 defaultKmajorM32 defaultKmajorPf \
              --out "$OUT/kmajor44-b16.json" > "$OUT/kmajor44-b16.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --weight 16384x4096 --blocks 32 64 16 \
              --densities 0.25 0.1 0.03 --ms 32 --variants autoRowMajor autoKmajor defaultKmajor --auto \
              --out "$OUT/kmajor44-lstm4096.json" > "$OUT/kmajor44-lstm4096.log" 2>&1
            timeout 150 python3 -m tilesparse bench --suite small --block 16 32 --shape 16x12288x12288 \
              32x12288x12288 64x12288x12288 --peers tilesparse_kmajor --no-plot --out "$OUT/kmajor-peer" \
              > "$OUT/bench-kmajor-peer.log" 2>&1 ;;
    warps44) timeout 260 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 0.1 0.03 \
              --ms 1 8 16 32 64 --variants autoW1 autoW2 defaultW1 defaultW2 defaultKmajorW1 defaultKmajorW2 \
              defaultKmajorW2St12 --auto --out "$OUT/warps44-b16.json" > "$OUT/warps44-b16.log" 2>&1
            timeout 280 python3 scripts/probes/small_threshold.py --blocks 32 64 128 --densities 0.5 0.25 0.1 0.03 \
              --ms 1 16 32 64 --variants autoW1 autoW2 defaultW2 defaultKmajorW2 --auto \
              --out "$OUT/warps44-b32-128.json" > "$OUT/warps44-b32-128.log" 2>&1 ;;
    kmajor45) timeout 220 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 0.1 0.03 \
              --ms 16 32 48 64 --variants autoRowMajor defaultKmajorTT defaultKmajor --auto \
              --out "$OUT/kmajor45-b16.json" > "$OUT/kmajor45-b16.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --blocks 32 --densities 0.5 0.25 0.1 --ms 16 32 64 \
              --variants autoRowMajor defaultKmajorTT defaultKmajor --auto \
              --out "$OUT/kmajor45-b32.json" > "$OUT/kmajor45-b32.log" 2>&1 ;;
    warps45) timeout 100 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 0.25 0.1 \
              --ms 2 4 8 --variants autoKW1 autoKW2 autoKW8 autoW1 autoW2 --auto \
              --out "$OUT/warps45-b16.json" > "$OUT/warps45-b16.log" 2>&1
            timeout 80 python3 scripts/probes/small_threshold.py --blocks 32 64 128 --densities 0.05 --ms 8 16 32 \
              --variants autoW1 autoW2 --auto --out "$OUT/warps45-d005.json" > "$OUT/warps45-d005.log" 2>&1
            timeout 100 python3 scripts/probes/small_threshold.py --blocks 32 64 128 --densities 0.5 0.25 0.1 --ms 48 64 \
              --variants defaultNoSwapW2 defaultNoSwapW4 defaultM32W2 --auto \
              --out "$OUT/warps45-m64.json" > "$OUT/warps45-m64.log" 2>&1 ;;
    warps46) timeout 170 python3 scripts/probes/small_threshold.py --weight 4096x4096 --blocks 16 32 64 128 \
              --densities 0.5 0.25 0.1 --ms 1 8 32 --variants autoW2 autoW4 --auto \
              --out "$OUT/warps46-4096.json" > "$OUT/warps46-4096.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --weight 8192x8192 --blocks 32 64 128 \
              --densities 0.5 0.1 --ms 1 32 --variants autoW2 autoW4 --auto \
              --out "$OUT/warps46-8192.json" > "$OUT/warps46-8192.log" 2>&1 ;;
    warps47) for w in 6144 5120; do timeout 140 python3 scripts/probes/small_threshold.py --weight ${w}x${w} \
              --blocks 32 64 128 --densities 0.5 0.25 0.1 --ms 1 8 32 --variants autoW2 autoW4 --auto \
              --out "$OUT/warps47-$w.json" > "$OUT/warps47-$w.log" 2>&1; done ;;
    timeline49) timeout 240 python3 scripts/probes/small_timeline.py --blocks 128 32 --densities 0.1 0.25 \
              --configs 32,8,2 --out "$OUT/small-timeline.json" > "$OUT/small-timeline.log" 2>&1
            cut -c1-900 "$OUT/small-timeline.log" ;;
    wgmma50) timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bsmm_kernels_gpu.py -k wgmma_slices \
              > "$OUT/gpu-tests-wgmma50.log" 2>&1; tail -3 "$OUT/gpu-tests-wgmma50.log"
            timeout 200 python3 scripts/probes/small_threshold.py --blocks 128 64 --densities 0.1 0.25 0.03 \
              --ms 1 8 16 --auto --variants s64k128st6w4 s64k128st8w4 s64k64st8w4 \
              --out "$OUT/small-wgmma.json" > "$OUT/small-wgmma.log" 2>&1
            timeout 150 python3 scripts/probes/small_timeline.py --blocks 128 --densities 0.1 \
              --configs 32,8,2 64,6,4 64,8,4 --out "$OUT/small-timeline-wgmma.json" > "$OUT/small-timeline-wgmma.log" 2>&1
            grep -v "^{" "$OUT/small-wgmma.log" | tail -8; grep -v running "$OUT/small-timeline-wgmma.log" | cut -c1-500 ;;
    hostab49) timeout 200 python3 scripts/probes/linear_plans_eager.py --host-ab --rounds 15 \
              --out "$OUT/host-ab.json" > "$OUT/host-ab.log" 2>&1; cat "$OUT/host-ab.log" ;;
    host49) timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_linear_plans.py \
              tests/test_linear_module.py tests/test_linear_transposed.py tests/test_launch.py tests/test_env.py \
              tests/test_dds_plan.py tests/test_lstm_graphs.py > "$OUT/gpu-tests-host49.log" 2>&1
            tail -n 1 "$OUT/gpu-tests-host49.log"
            for round in 1 2; do
              for tree in new base; do
                root=$PWD; [ "$tree" = base ] && root=$PWD/${HOST49_BASE:-base49}
                (cd "$root" && PYTHONPATH=$root timeout 100 python3 scripts/probes/linear_plans_eager.py \
                  --out "$OUT/host49-$tree-$round.json" > "$OUT/host49-$tree-$round.log" 2>&1)
                echo "$tree $round"; cat "$OUT/host49-$tree-$round.log"; rm -f "$OUT/host49-$tree-$round.json"
              done
            done ;;
    demo48) timeout 200 python3 scripts/probes/linear_plans_eager.py --out "$OUT/linear-plans-eager.json" \
              > "$OUT/linear-plans-eager.log" 2>&1; cat "$OUT/linear-plans-eager.log"
            timeout 330 python3 -m tilesparse demo --model lstm --preset gpu --density 0.1 --no-plot --out "$OUT/demo" \
              > "$OUT/demo-lstm-d0.1.log" 2>&1; tail -n 6 "$OUT/demo-lstm-d0.1.log"
            for f in "$OUT"/demo/*; do cp "$f" "$OUT/demo-lstm-d0.1.${f##*.}"; done; rm -rf "$OUT/demo" ;;
    plans48|plans48b) timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_linear_plans.py \
              tests/test_lstm_graphs.py tests/test_dds_plan.py tests/test_linear_module.py \
              "tests/test_attention.py::test_gpu_concurrent_dq_gives_the_same_bits" \
              "tests/test_bsmm_kernels_gpu.py::test_small_kernel_chunks_on_a_side_stream_and_in_a_cuda_graph" \
              > "$OUT/gpu-tests-plans48.log" 2>&1; tail -n 1 "$OUT/gpu-tests-plans48.log"
            timeout 90 python3 -c "import sys, torch, pytest; torch.Tensor.record_stream = lambda self, s: None; \
sys.exit(pytest.main(['-q', '-m', 'gpu', '-p', 'no:cacheprovider', '-k', 'evicted', 'tests/test_lstm_graphs.py']))" \
              > "$OUT/race-without-record-stream.log" 2>&1; tail -n 1 "$OUT/race-without-record-stream.log"
            if [ "$step" = plans48b ]; then
              timeout 100 python3 scripts/probes/linear_plans_eager.py --profile > "$OUT/linear-plans-profile.txt" 2>&1
              head -n 45 "$OUT/linear-plans-profile.txt"
            else
              timeout 200 python3 scripts/probes/linear_plans_eager.py --out "$OUT/linear-plans-eager.json" \
                > "$OUT/linear-plans-eager.log" 2>&1; cat "$OUT/linear-plans-eager.log"
            fi ;;
    graphs47b) timeout 150 python3 -m tilesparse bench --suite lstm --quick --no-plot --out "$OUT/lstm-quick" \
              > "$OUT/bench-lstm-quick.log" 2>&1
            cp "$OUT"/lstm-quick/*-lstm*.csv "$OUT/lstm-quick.csv"; rm -rf "$OUT/lstm-quick"
            timeout 200 python3 -m tilesparse bench --suite lstm-paper --no-plot --out "$OUT/lstm-paper" \
              > "$OUT/bench-lstm-paper.log" 2>&1
            cp "$OUT"/lstm-paper/*-lstm*.csv "$OUT/lstm-paper.csv"; rm -rf "$OUT/lstm-paper" ;;
    graphs47) for graphs in off on; do TILESPARSE_LSTM_GRAPHS=$graphs timeout 120 python3 -m tilesparse bench \
              --suite lstm --block 16 --density 0.25 --shape 1024x8192x2048 1024x16384x4096 --dtype bf16 --no-plot \
              --out "$OUT/lstm-graphs-$graphs" > "$OUT/bench-lstm-graphs-$graphs.log" 2>&1
              cp "$OUT"/lstm-graphs-$graphs/*-lstm*.csv "$OUT/lstm-graphs-$graphs.csv"; rm -rf "$OUT/lstm-graphs-$graphs"; done
            timeout 100 python3 -m tilesparse bench --suite lstm --block 16 --density 0.25 --shape 128x8192x2048 \
              128x16384x4096 --dtype bf16 --no-plot --out "$OUT/lstm-b4" > "$OUT/bench-lstm-b4-graphs-on.log" 2>&1
            rm -rf "$OUT/lstm-b4"
            timeout 200 python3 -m tilesparse bench --suite lstm --quick --no-plot --out "$OUT/lstm-quick" \
              > "$OUT/bench-lstm-quick.log" 2>&1
            cp "$OUT"/lstm-quick/*-lstm*.csv "$OUT/lstm-quick.csv"; rm -rf "$OUT/lstm-quick" ;;
    plans47) for plans in off on; do TILESPARSE_STEP_PLANS=$plans timeout 120 python3 -m tilesparse bench --suite lstm \
              --block 16 --density 0.25 --shape 128x8192x2048 128x16384x4096 --dtype bf16 --no-plot \
              --out "$OUT/lstm-b4-plans-$plans" > "$OUT/bench-lstm-b4-plans-$plans.log" 2>&1
              cp "$OUT"/lstm-b4-plans-$plans/*-lstm*.csv "$OUT/lstm-b4-plans-$plans.csv"; rm -rf "$OUT/lstm-b4-plans-$plans"; done
            timeout 150 python3 scripts/probes/lstm_step_profile.py --hidden 2048 4096 2048 --batch 32 --block 16 \
              --density 0.25 --out "$OUT/lstm-step-profile.json" > "$OUT/lstm-step-profile.log" 2>&1 ;;
    plans46) timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_dds_plan.py tests/test_lstm.py \
              tests/test_lstm_cell.py tests/test_lstm_sequence.py tests/test_launch.py tests/test_pdl.py \
              tests/test_bsmm_small_dispatch.py tests/test_bsmm_kmajor.py > "$OUT/gpu-tests-plans46.log" 2>&1
            tail -n 1 "$OUT/gpu-tests-plans46.log"
            for plans in off on; do TILESPARSE_STEP_PLANS=$plans timeout 130 python3 -m tilesparse bench --suite lstm \
              --block 16 --density 0.25 --shape 1024x8192x2048 1024x16384x4096 --dtype bf16 --no-plot \
              --out "$OUT/lstm-plans-$plans" > "$OUT/bench-lstm-plans-$plans.log" 2>&1
              cp "$OUT"/lstm-plans-$plans/*-lstm*.csv "$OUT/lstm-eager-plans-$plans.csv"; rm -rf "$OUT/lstm-plans-$plans"; done ;;
    swap64) timeout 200 python3 scripts/probes/small_threshold.py --blocks 64 128 --densities 0.25 0.5 \
              --ms 32 64 --variants s64k64st8S s64k64st8Sx2 s64k64st8SIx2 s64k64st12Sx2 s64k128st6Sx2 --auto \
              --out "$OUT/swap64.json" > "$OUT/swap64.log" 2>&1 ;;
    next46) timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bsmm_small_dispatch.py \
              tests/test_bsmm_kmajor.py tests/test_lstm_sequence.py > "$OUT/gpu-tests-next46.log" 2>&1
            tail -n 1 "$OUT/gpu-tests-next46.log"
            timeout 60 python3 scripts/probes/small_threshold.py --weight 4096x4096 --blocks 64 --densities 0.5 \
              --ms 1 32 --variants autoW2 --auto --out "$OUT/dense-rotation-4096.json" > "$OUT/dense-rotation-4096.log" 2>&1
            for w in 6144 5120; do timeout 140 python3 scripts/probes/small_threshold.py --weight ${w}x${w} \
              --blocks 32 64 128 --densities 0.5 0.25 0.1 --ms 1 8 32 --variants autoW2 autoW4 --auto \
              --out "$OUT/warps47-$w.json" > "$OUT/warps47-$w.log" 2>&1; done ;;
    lstm-kmajor) timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_lstm.py tests/test_lstm_cell.py \
              tests/test_lstm_sequence.py > "$OUT/gpu-tests-lstm.log" 2>&1; tail -n 1 "$OUT/gpu-tests-lstm.log"
            for km in on off; do TILESPARSE_KMAJOR=$km timeout 150 python3 -m tilesparse bench --suite lstm \
              --block 16 --density 0.25 0.1 --shape 1024x8192x2048 1024x16384x4096 --dtype bf16 --no-plot \
              --out "$OUT/lstm-kmajor-$km" > "$OUT/bench-lstm-kmajor-$km.log" 2>&1; done ;;
    small-4096-suite) timeout 290 python3 -m tilesparse bench --suite small --shape 1x4096x4096 8x4096x4096 \
              32x4096x4096 64x4096x4096 --out "$OUT/small-4096-a" --no-plot > "$OUT/bench-small-4096-a.log" 2>&1
            timeout 290 python3 -m tilesparse bench --suite small --shape 128x4096x4096 256x4096x4096 \
              512x4096x4096 --out "$OUT/small-4096-b" --no-plot > "$OUT/bench-small-4096-b.log" 2>&1
            python3 scripts/merge_results.py "$OUT/small-4096-m1-512.csv" "$OUT"/small-4096-a/*-small.csv \
              "$OUT"/small-4096-b/*-small.csv >> "$OUT/bench-small-4096-b.log" 2>&1 ;;
    small-stages2) timeout 220 python3 scripts/probes/small_threshold.py --blocks 128 64 32 \
              --densities 0.5 0.25 0.1 0.03 --ms 1 8 32 64 --variants autoSt4 autoSt6 autoSt16 autoSt24 --auto \
              --out "$OUT/small-stages-b32-128.json" > "$OUT/small-stages-b32-128.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.25 0.1 0.03 \
              --ms 8 16 32 64 --variants autoSt4 autoSt6 --auto --out "$OUT/small-stages-b16-shallow.json" \
              > "$OUT/small-stages-b16-shallow.log" 2>&1 ;;
    small-4096) timeout 300 python3 scripts/probes/small_threshold.py --weight 4096x4096 --blocks 16 32 64 128 \
              --densities 0.5 0.25 0.1 --ms 1 8 32 --variants default --auto \
              --out "$OUT/small-4096.json" > "$OUT/small-4096.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.5 --ms 256 512 \
              --variants pG4m128w4st3 pG8m128x1e4 --auto --out "$OUT/panel-e1.json" > "$OUT/panel-e1.log" 2>&1
            timeout 120 python3 scripts/probes/small_threshold.py --blocks 16 --densities 0.2 0.25 0.3 --ms 8 16 \
              --ops fprop --variants default pG8m16st6x4e4SF --auto --out "$OUT/bucket-025-fprop.json" \
              > "$OUT/bucket-025-fprop.log" 2>&1 ;;
    l2-ingest) timeout "${L2_TIMEOUT:-150}" python3 scripts/probes/l2_ingest.py ${L2_ARGS:-} --out "$OUT/l2-ingest.json" \
              > "$OUT/l2-ingest.log" 2>&1 ;;
    ws-sdd) timeout "${WS_TIMEOUT:-300}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 64 --densities 0.5 0.25 0.1 --ops updat --variants wsg-g4k64st3 wsr-g4k32st4 \
              wsr-g4k32st4r wsr-g4k64st2 wsr-g2k64st3o wsr-g2k64st3r --out "$OUT/ws-sdd.json" > "$OUT/ws-sdd.log" 2>&1
            timeout 120 /usr/local/cuda/bin/ncu --kernel-name regex:_sdd_ws_rows --launch-skip 2 --launch-count 1 \
              --section SpeedOfLight --section MemoryWorkloadAnalysis python3 scripts/probes/ws_sdd_group_one.py \
              --shape 16384x8192x8192 --rows > "$OUT/ncu-ws-sdd-rows.txt" 2>&1 ;;
    ws-balanced) timeout "${WS_TIMEOUT:-300}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 128 64 --ops fprop bprop --variants m128k64w8st5 m128k64w8st5bal \
              m128k64w4st4pp m128k64w4st4ppbal --out "$OUT/ws-balanced.json" > "$OUT/ws-balanced.log" 2>&1
            timeout 120 python3 scripts/probes/ws_sweep.py --dtype fp32 --shapes 8192x4096x4096 --blocks 128 \
              --ops fprop --variants tf32-m128k32w8st4 tf32-m128k32w8st4bal --out "$OUT/ws-balanced-tf32.json" \
              > "$OUT/ws-balanced-tf32.log" 2>&1 ;;
    ws-b128-more) timeout "${WS_TIMEOUT:-240}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 128 --ops fprop bprop --variants m128k64w4st4ppbal m128k64w4st5ppbal \
              m128k64w4st4ppbalg4 m128k64w4st4ppbalg16 --out "$OUT/ws-b128-more.json" > "$OUT/ws-b128-more.log" 2>&1 ;;
    ws-small-blocks) timeout "${WS_TIMEOUT:-240}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              --blocks 32 16 --ops fprop bprop --variants b32-m128k32w8st12 b32-m128k32w8st16 b32-m256k32w8st10 \
              b16-m128k16w8st16 b16-m256k16w8st16 --out "$OUT/ws-small-blocks.json" > "$OUT/ws-small-blocks.log" 2>&1 ;;
    feature-major) timeout "${WS_TIMEOUT:-240}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 64 32 16 --densities 0.5 0.25 0.1 --ops fprop bprop --variants m128k64w8st5 \
              fm-b64-m256w8st3 fm-b64-m256w8st4 fm-b64-m128w4st4 fm-b32-m256w4st4 fm-b32-m256w8st3 fm-b32-m128w4st4 \
              fm-b16-m256w4st4 fm-b16-m128w4st4 --out "$OUT/feature-major.json" > "$OUT/feature-major.log" 2>&1 ;;
    sdd-group) timeout "${WS_TIMEOUT:-240}" python3 scripts/probes/ws_sweep.py --shapes 8192x4096x4096 \
              16384x8192x8192 --blocks 128 64 32 16 --densities 0.5 0.25 0.1 --ops updat --variants grp-b128-g2w8 \
              grp-b64-g4w8 grp-b64-g4w8sw grp-b64-g2w4 grp-b32-g8w8sw grp-b32-g4w4sw grp-b16-g16w8sw grp-b16-g8w4sw \
              --out "$OUT/sdd-group.json" > "$OUT/sdd-group.log" 2>&1 ;;
    transpose) timeout 120 python3 scripts/probes/transpose_copy.py --out "$OUT/transpose-copy.json" \
              > "$OUT/transpose-copy.log" 2>&1 ;;
    block-scatter) timeout 120 python3 scripts/probes/block_scatter_ab.py --out "$OUT/block-scatter-ab.json" \
              > "$OUT/block-scatter-ab.log" 2>&1
              timeout 150 python3 scripts/probes/dense_dispatch_ab.py --shape 128x12288x12288 --ms 128 256 512 \
              --blocks 16 32 --densities 0.5 0.25 0.1 --out "$OUT/dense-dispatch-small.json" \
              > "$OUT/dense-dispatch-small.log" 2>&1 ;;
    dense-dispatch) timeout 200 python3 scripts/probes/dense_dispatch_ab.py --out "$OUT/dense-dispatch-ab.json" \
              > "$OUT/dense-dispatch-ab.log" 2>&1 ;;
    host)   { timeout 120 python3 scripts/profile_host.py; timeout 120 python3 scripts/probes/launch_ab.py \
              --out "$OUT/launch-ab.json"; timeout 120 python3 scripts/probes/step_gap.py --out "$OUT/step-gap.json"; } \
              > "$OUT/host.log" 2>&1 ;;
    learn-profile) timeout 120 python3 scripts/probes/value_map_learn_profile.py > "$OUT/learn-profile.txt" 2>&1 ;;
    attn-profile) timeout 150 python3 scripts/probes/attention_profile.py > "$OUT/attention-profile.txt" 2>&1 ;;
    attn-bwd-ncu) timeout "${NCU_TIMEOUT:-200}" /usr/local/cuda/bin/ncu --kernel-name "regex:${NCU_ATTN_KERNEL:-_bwd_dkdv}" \
              --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
              --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
              --section SourceCounters python3 scripts/probes/attention_bwd_one.py --pattern "${NCU_PATTERN:-local1024}" \
              $([ "${NCU_DETERMINISTIC:-0}" = 1 ] || echo --atomic) \
              > "$OUT/ncu-attention$(echo "${NCU_ATTN_KERNEL:-_bwd_dkdv}" | tr -c 'a-zA-Z0-9\n' '-')-${NCU_PATTERN:-local1024}.txt" 2>&1
            timeout 150 python3 scripts/probes/attention_profile.py --layouts "${NCU_PATTERN:-local1024}" \
              > "$OUT/attention-profile-${NCU_PATTERN:-local1024}.txt" 2>&1 ;;
    attn-power) timeout "${POWER_TIMEOUT:-300}" python3 scripts/probes/attention_power.py ${POWER_ARGS:-} \
              --out "$OUT/attention-power.json" > "$OUT/attention-power.log" 2>&1
            timeout 150 python3 scripts/probes/attention_drift.py --out "$OUT/attention-drift.json" \
              > "$OUT/attention-drift.log" 2>&1 ;;
    tune)   timeout "${TUNE_TIMEOUT:-400}" python3 -m tilesparse tune ${TUNE_ARGS:-} --out "$OUT/tuned.json" \
              > "$OUT/tune.log" 2>&1 ;;
    tune-11008) timeout "${TUNE_TIMEOUT:-300}" python3 -m tilesparse tune --per-shape --ops updat --block 128 \
              --shape 8192x11008x4096 8192x4096x11008 --density 0.5 0.25 0.1 0.05 --budget 240 \
              --out "$OUT/tuned-11008.json" > "$OUT/tune-11008.log" 2>&1 ;;
    graph-11008) timeout "${GRAPH_TIMEOUT:-230}" python3 -m tilesparse bench --cuda-graph --shape 8192x11008x4096 \
              8192x4096x11008 --block 128 64 --no-plot --out "$OUT" > "$OUT/bench-graph-11008.log" 2>&1 ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - start )) s"
done
exit 0
