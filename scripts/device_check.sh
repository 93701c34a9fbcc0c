#!/usr/bin/env bash
# One device call: GPU tests (sharded over processes so kernels compile in parallel),
# host-overhead profile, config sweep (tilesparse tune). Everything lands under $OUT (at most 8 files).
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
SHARDS=${SHARDS:-8}
# SHARD_TOTAL / SHARD_FIRST: run shards SHARD_FIRST .. SHARD_FIRST + SHARDS - 1 of SHARD_TOTAL
# (default: all SHARDS of SHARDS), so a suite longer than one call runs over several calls
# (the whole GPU suite, 3075 tests, got ~75 % through 16 shards in 500 s on one H200):
#   SHARDS=16 SHARD_TOTAL=64 SHARD_FIRST=0 ... then SHARD_FIRST=16, 32, 48
SHARD_TOTAL=${SHARD_TOTAL:-$SHARDS}; SHARD_FIRST=${SHARD_FIRST:-0}
for v in SHARDS SHARD_TOTAL SHARD_FIRST; do
  case ${!v} in ''|*[!0-9]*) echo "$v must be a non-negative integer, got '${!v}'" >&2; exit 2 ;; esac
done
if [ "$SHARDS" -lt 1 ] || [ $((SHARD_FIRST + SHARDS)) -gt "$SHARD_TOTAL" ]; then
  echo "need SHARDS >= 1 and SHARD_FIRST + SHARDS ($((SHARD_FIRST + SHARDS))) <= SHARD_TOTAL ($SHARD_TOTAL)" >&2; exit 2
fi
# SHARD_TIMEOUT: seconds per test shard, so a hung kernel still leaves the other shards' logs
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  start=$(date +%s)
  rm -f /tmp/gpu_tests_*.log  # a warm machine keeps an earlier call's logs
  # TESTS is read as shell words, quotes kept: TESTS='tests/x.py -k "panel or spread"' (a plain
  # expansion split "panel or spread" into three arguments and ran nothing, fortieth session)
  eval "set -- ${TESTS:-tests}" || { echo "TESTS does not parse as shell words: $TESTS" >&2; exit 2; }
  for i in $(seq "$SHARD_FIRST" $((SHARD_FIRST + SHARDS - 1))); do
    TILESPARSE_SHARD=$i/$SHARD_TOTAL timeout "${SHARD_TIMEOUT:-3600}" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" > /tmp/gpu_tests_$i.log 2>&1 &
  done
  wait
  cat /tmp/gpu_tests_*.log > "$OUT/gpu_tests.log"
  echo "GPU tests: $(( $(date +%s) - start )) s"
  for i in $(seq "$SHARD_FIRST" $((SHARD_FIRST + SHARDS - 1))); do  # each shard's summary, or its last line
    line=$(grep -iE "passed|failed|error|no tests ran|deselected" /tmp/gpu_tests_$i.log | tail -n 1)
    echo "shard $i/$SHARD_TOTAL: ${line:-$(tail -n 1 /tmp/gpu_tests_$i.log)}"
  done
fi
[ "${PROFILE:-1}" = 1 ] && python3 scripts/profile_host.py > "$OUT/profile.txt" 2>&1 && head -3 "$OUT/profile.txt"
if [ "${BENCH:-0}" = 1 ]; then
  # The suite (eager timing, peers side by side), then kernel-only timing of the main
  # shape by CUDA-graph replay. TILESPARSE_COMMIT names the commit (the copy has no history).
  timeout "${BENCH_TIMEOUT:-330}" python3 -m tilesparse bench --out "$OUT" > /tmp/bench.log 2>&1
  echo "bench rc=$?"; tail -n 25 /tmp/bench.log
  timeout "${GRAPH_TIMEOUT:-150}" python3 -m tilesparse bench --cuda-graph --shape 8192x4096x4096 --no-plot --out "$OUT" > /tmp/bench_graph.log 2>&1
  echo "graph bench rc=$?"; tail -n 25 /tmp/bench_graph.log
fi
# TUNE_ARGS: `tilesparse tune` options, e.g. "--block 128 64 --density 0.5 0.1 --budget 200";
# winners land in $OUT/tuned.json (copy them into tilesparse/kernels/tuned/<gpu>.json to ship them)
[ -n "${TUNE_ARGS:-}" ] && python3 -m tilesparse tune $TUNE_ARGS --out "$OUT/tuned.json" 2>&1 | tee "$OUT/tune.log" | tail -n 40
exit 0
