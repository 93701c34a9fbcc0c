"""The attention backward with dQ added by TMA reductions (``deterministic=False``: the
warp-specialized dK/dV kernel with ``atomic_dq``, 5 products per block pair, no dQ
kernel) against the deterministic default (dK/dV then dQ: 7 products) and the Triton
kernel's atomic mode, on the attention suite's patterns (B 4, H 16, S 8192, D 128 or
``--head-dim``, blocks of 128, bf16), one process. The atomic gradients are compared with
the deterministic ones (max |difference| over max |gradient|; not bitwise: the adds land
in any order).

Why: the backward's 7 products at ~440-480 TF/s keep local 1024's forward + backward at
~1.1x Flex (2.73 ms); issue 6 asks 1.3x and 2.5 ms. The seventeenth session's atomic dQ
from registers (``red.v4``) lost (4.56 ms); triton 3.6's Gluon builder has the TMA
reduction (``kernels/_tma_reduce.py``), which the Triton kernel's 2.75 ms used.

    python scripts/probes/attention_tma_dq.py --out attention-tma-dq.json [--flex]
    TMA_DQ_VARIANTS=ws_tma_shared_stats,ws_tma_shared_fa3 python scripts/probes/attention_tma_dq.py ...
    TMA_DQ_ROUNDS=7 ... (interleaved timing rounds; default 5)
    TMA_DQ_HOST=delta,no_delta TMA_DQ_CONCURRENT=0 ... (a subset of the deterministic rows)
"""

from __future__ import annotations

import dataclasses
import os

import torch
from attention_power import sustained  # this folder's

from tilesparse.bench.attention import probe_flex_times, probe_inputs, probe_main, probe_times
from tilesparse.bench.timing import bench_ms, interleaved_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels import attention_ws, attention_ws_dkdv
from tilesparse.kernels.attention_ws import DkdvWsConfig

# the shipped modes (D 128: shared dS; D 64: stats in smem) and the candidates against them; the
# twenty-second session's losers (overlapped, plain) are in ...-attention-tma-dq-9424a3b.json
_SHARED = dict(consumers=2, stats_in_smem=True, atomic_dq=True, shared_ds=True)
_FA3 = dict(fa3_order=True, mma_regs=240, load_regs=24)


def _ordered(**options) -> DkdvWsConfig:
    """The shipped D 128 mode (shared dS in FlashAttention-3's order, host descriptors) with
    its shares added in a fixed order by the dQ writer (ordered_dq), plus ``options``."""
    return DkdvWsConfig(64, 2, **_SHARED, **_FA3, host_descs=True, ordered_dq=True, **options)


VARIANTS = {"ws_tma_shared_stats": DkdvWsConfig(64, 2, **_SHARED),
            "ws_tma_stats": DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True),
            "ws_tma_shared_240": DkdvWsConfig(64, 2, **_SHARED, mma_regs=240, load_regs=24),
            "ws_tma_shared_staged": DkdvWsConfig(64, 2, **_SHARED, staged_stores=True),
            "ws_tma_shared_fa3": DkdvWsConfig(64, 2, **_SHARED, **_FA3),
            "ws_tma_shared_fa3_staged": DkdvWsConfig(64, 2, **_SHARED, **_FA3, staged_stores=True),
            "ws_tma_shared_host": DkdvWsConfig(64, 2, **_SHARED, host_descs=True),
            "ws_tma_shared_persistent": DkdvWsConfig(64, 2, **_SHARED, persistent=True),
            "ws_tma_shared_fa3_staged_persistent": DkdvWsConfig(64, 2, **_SHARED, **_FA3, staged_stores=True,
                                                                persistent=True),
            "ws_tma_shared_fa3_staged_host": DkdvWsConfig(64, 2, **_SHARED, **_FA3, staged_stores=True,
                                                          host_descs=True),
            "ws_tma_stats_staged": DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True,
                                                staged_stores=True),
            # the shipped D 128 mode launched in the balanced order (attention_launch_order; with
            # atomic_dq the long columns in grid order since e57f52a, longest first before)
            "ws_tma_shared_fa3_staged_host_balanced": DkdvWsConfig(64, 2, **_SHARED, **_FA3, staged_stores=True,
                                                                   host_descs=True, balanced=True),
            # D 64's plain mode (its default) with host descriptors, and staged too
            "ws_tma_stats_host": DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True,
                                              host_descs=True),
            "ws_tma_stats_staged_host": DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True,
                                                     staged_stores=True, host_descs=True),
            "ws_tma_stats_staged_host_balanced": DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True,
                                                              staged_stores=True, host_descs=True, balanced=True),
            # the shipped D 128 mode with its shares added in a fixed order by a dQ writer warp (ordered_dq:
            # deterministic, 5 products; no staged stores; layouts whose order would wait: an error row)
            "ws_tma_shared_fa3_host_ordered": _ordered(),
            # the same with the twenty-fifth session's dQ writer (counters read after each hand-over;
            # attention_ws_dkdv.ORDERED_DQ_WRITER 1), against the look-ahead writer above
            "ws_tma_shared_fa3_host_ordered_writer1": _ordered()}
VARIANTS["ws_tma_shared_fa3_staged_host_ordered"] = _ordered(staged_stores=True)
# each query tile's first share stored, not added: dQ's fp32 buffer not zeroed first (where every
# query block has a share; the probe's layouts all do)
VARIANTS["ws_tma_shared_fa3_host_ordered_first_store"] = _ordered(first_share_stored=True)
# both options together (the default candidate once each alone was timed)
VARIANTS["ws_tma_shared_fa3_staged_host_ordered_first_store"] = _ordered(staged_stores=True, first_share_stored=True)
# the shipped deterministic=False mode with a program per SM taking items in turn (head major)
# instead of the balanced grid
VARIANTS["ws_tma_shared_fa3_staged_host_persistent"] = DkdvWsConfig(64, 2, **_SHARED, **_FA3, staged_stores=True,
                                                                    host_descs=True, persistent=True)
# dK and dV stored through the drained Q / dO ring instead of the dQ staging tiles: the shipped
# deterministic=False mode and the ordered default
VARIANTS["ws_tma_shared_fa3_ring_host_balanced"] = DkdvWsConfig(64, 2, **_SHARED, **_FA3, ring_stores=True,
                                                                host_descs=True, balanced=True)
VARIANTS["ws_tma_shared_fa3_host_ordered_first_ring"] = _ordered(first_share_stored=True, ring_stores=True)
# the shipped ordered mode with each row's last share not counted (no completion wait on it)
VARIANTS["ws_tma_shared_fa3_host_ordered_first_ring_uncounted"] = _ordered(first_share_stored=True, ring_stores=True,
                                                                         last_share_uncounted=True)
_WRITERS = {"ws_tma_shared_fa3_host_ordered_writer1": 1}  # variant -> attention_ws_dkdv.ORDERED_DQ_WRITER


if os.environ.get("TMA_DQ_VARIANTS"):  # a comma-separated subset, to save device time ("none": no variant rows)
    _wanted = [] if os.environ["TMA_DQ_VARIANTS"] == "none" else os.environ["TMA_DQ_VARIANTS"].split(",")
    _unknown = sorted(set(_wanted) - set(VARIANTS))
    if _unknown:
        raise SystemExit(f"TMA_DQ_VARIANTS: unknown {_unknown}; known: {sorted(VARIANTS)}")
    VARIANTS = {name: VARIANTS[name] for name in _wanted}


# TMA_DQ_HOST: a comma-separated subset of the deterministic default's variants below (dkdv, both,
# persistent, persistent_lpt, balanced, grid_order, delta, no_delta, ring, dq_staged, dq_plain); all where unset
HOST_VARIANTS = os.environ["TMA_DQ_HOST"].split(",") if os.environ.get("TMA_DQ_HOST") else None
# TMA_DQ_CONCURRENT=0 skips the CONCURRENT_DQ row
CONCURRENT = os.environ.get("TMA_DQ_CONCURRENT", "1") != "0"

# TMA_DQ_PASSES=0 skips the rows timing the memory passes around the 5-product kernel
PASSES = os.environ.get("TMA_DQ_PASSES", "1") != "0"

# TMA_DQ_ROUNDS: each pattern's backward variants are timed in this many interleaved rounds
# (bench.timing.interleaved_ms; medians), so that the shared GPU's drifts (5-10 % between
# one variant's timing and the next in the twenty-fourth session) fall on all of them
ROUNDS = int(os.environ.get("TMA_DQ_ROUNDS", "5"))
# TMA_DQ_ENERGY=<seconds>: after the timings, each timed entry whose name contains
# TMA_DQ_ENERGY_MATCH (default "bwd_") is also called back to back for that long with nvidia-smi
# sampling (attention_power.sustained): its energy per call (mJ), SM clock and ms per call under
# the board's power cap, which is what the suite's rows run at (twenty-ninth session)
ENERGY_S = float(os.environ.get("TMA_DQ_ENERGY", "0"))
ENERGY_MATCH = os.environ.get("TMA_DQ_ENERGY_MATCH", "bwd_")
# TMA_DQ_DTYPE=float16: the inputs in fp16 instead of bf16
DTYPE = getattr(torch, os.environ.get("TMA_DQ_DTYPE", "bfloat16"))


def _relative_error(got, want) -> float:
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
               for a, b in zip(got, want))


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout, causal, inputs, meta, scale, row = probe_inputs(spec, B, H, S, D, block, tensors=4)
    q, k, v, dout = (t.to(DTYPE) for t in inputs)
    row["dtype"] = str(DTYPE)
    fwd = lambda: K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale)  # noqa: E731
    out, lse = fwd()
    row["fwd_default_ms"] = bench_ms(fwd, cuda=True)

    def bwd(configs=None, deterministic=True):
        return K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block, causal, scale,
                                    configs=configs, deterministic=deterministic)

    want = bwd()
    timed = {"bwd_default": bwd}
    # the forward with each tile's O through the consumers' Q rows (FwdWsConfig.staged_stores), against
    # its shipped config, in the same rounds (bitwise the same O and lse)
    fwd_cfg = attention_ws._WS_DEFAULTS.get(("fwd", block, D))
    if fwd_cfg is not None and fwd_cfg.persistent:
        staged = dataclasses.replace(fwd_cfg, staged_stores=True)
        fwd_with = {name: (lambda c=c: K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal,
                                                           scale, config=c))
                    for name, c in (("fwd_shipped", fwd_cfg), ("fwd_staged", staged))}
        row["fwd_staged_same"] = all(map(torch.equal, fwd_with["fwd_staged"](), fwd_with["fwd_shipped"]()))
        timed.update(fwd_with)
    # the deterministic default with host-built descriptors for its dK/dV kernel, then for
    # its dQ kernel too, then with the persistent dK/dV kernel, then both kernels launched in
    # the balanced order, then both in grid order (bitwise the same gradients; the twenty-third
    # session shipped host descriptors, and the balanced order at D 128)
    defaults = [attention_ws.default_config(kind, q, k, v, dout, block, layout.layout_heads) for kind in ("dkdv", "dq")]
    if None not in defaults:
        for name, host in (("dkdv", (dataclasses.replace(defaults[0], host_descs=True), defaults[1])),
                           ("both", tuple(dataclasses.replace(c, host_descs=True) for c in defaults)),
                           ("persistent", (dataclasses.replace(defaults[0], persistent=True, balanced=False,
                                                               ring_stores=False), defaults[1])),
                           # ... each program taking its share of the balanced schedule (thirtieth session)
                           ("persistent_lpt", (dataclasses.replace(defaults[0], persistent=True, balanced=True,
                                                                   ring_stores=False), defaults[1])),
                           ("balanced", tuple(dataclasses.replace(c, balanced=True) for c in defaults)),
                           ("grid_order", tuple(dataclasses.replace(c, balanced=False) for c in defaults)),
                           # delta computed by the dQ kernel, which runs first (no delta kernel; not the same
                           # bits: delta's sum is another order)
                           ("delta", (defaults[0], dataclasses.replace(defaults[1], delta=True))),
                           ("no_delta", (defaults[0], dataclasses.replace(defaults[1], delta=False))),
                           # dK and dV stored through the drained Q / dO ring (the same bits)
                           ("ring", (dataclasses.replace(defaults[0], ring_stores=True), defaults[1])),
                           # dQ stored through the consumers' rows of the Q tile, or not (the same bits; staged
                           # is the D 128 default since the twenty-ninth session, plain is D 64's)
                           ("dq_staged", (defaults[0], dataclasses.replace(defaults[1], staged_stores=True))),
                           ("dq_plain", (defaults[0], dataclasses.replace(defaults[1], staged_stores=False)))):
            if HOST_VARIANTS is not None and name not in HOST_VARIANTS:
                continue
            got = bwd(host)
            if "delta" in name:
                row[f"bwd_default_host_{name}_rel_err"] = _relative_error(got, want)
                row[f"bwd_default_host_{name}_deterministic"] = all(map(torch.equal, bwd(host), got))
            else:
                row[f"bwd_default_host_{name}_same"] = all(map(torch.equal, got, want))
            timed[f"bwd_default_host_{name}"] = lambda host=host: bwd(host)
    # the deterministic default with its dQ kernel on a side stream beside dK/dV (CONCURRENT_DQ)
    def concurrent():
        K.CONCURRENT_DQ = True
        try:
            return bwd()
        finally:
            K.CONCURRENT_DQ = False

    if CONCURRENT:
        row["bwd_default_concurrent_same"] = all(map(torch.equal, concurrent(), want))
        timed["bwd_default_concurrent"] = concurrent
    triton = tuple(K.attention_config(kind, block, D, q.dtype) for kind in ("dkdv", "dq"))
    timed["bwd_triton_atomic"] = lambda: bwd(triton, False)
    for name, cfg in VARIANTS.items():  # (the Triton dQ config is not run with atomics)
        def variant(cfg=cfg, writer=_WRITERS.get(name, attention_ws_dkdv.ORDERED_DQ_WRITER)):
            shipped, attention_ws_dkdv.ORDERED_DQ_WRITER = attention_ws_dkdv.ORDERED_DQ_WRITER, writer
            try:
                return bwd((cfg, triton[1]), False)
            finally:
                attention_ws_dkdv.ORDERED_DQ_WRITER = shipped

        try:
            got = variant()
        except Exception as exc:  # noqa: BLE001 (a probe: record and go on)
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        row[f"{name}_rel_err"] = _relative_error(got, want)
        if cfg.ordered_dq:  # deterministic: the same bits again, and (where the default is ordered) its bits
            row[f"{name}_repeat_same"] = all(map(torch.equal, variant(), got))
            row[f"{name}_same"] = all(map(torch.equal, got, want))
        timed[f"bwd_{name}"] = variant
    # the passes over memory around the 5-product kernel (its dQ buffer's zero fill, the delta
    # kernel, the fp32 -> bf16 conversion), each alone: what first_share_stored and a converting
    # last share could save (TMA_DQ_PASSES=0 skips them)
    if PASSES:
        acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        delta = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        B_, H_, S_, D_ = q.shape
        timed["pass_zero_fill"] = lambda: torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        timed["pass_convert"] = lambda: acc.to(q.dtype)
        timed["pass_delta"] = lambda: K.launch(K._bwd_preprocess_kernel, (K.cdiv(S_, 64), B_ * H_),
                                               out, dout, delta, S_, H_, *out.stride()[:3], *dout.stride()[:3],
                                               D=D_, D_TILE=max(16, K.next_power_of_2(D_)), BLOCK_M=64)
    for name, ms in interleaved_ms(timed, cuda=True, rounds=ROUNDS).items():
        row[f"{name}_ms"] = ms
    row["rounds"] = ROUNDS
    if ENERGY_S > 0:
        for name, fn in timed.items():
            if ENERGY_MATCH in name:
                got = sustained(fn, ENERGY_S)  # (after 1 s idle: each from a board cooled off a little)
                row[f"{name}_mj"], row[f"{name}_mhz"] = got["mj_per_call"], got["sm_mhz"]
                row[f"{name}_sustained_ms"] = got["ms_per_call"]
    if flex:
        probe_flex_times(row, q, k, v, layout, causal, spec["name"], dout)
    return row


def describe(name: str, row: dict) -> str:
    errs = "  ".join(f"{key}: {value:.2e}" if isinstance(value, float) else f"{key}: {value}"
                     for key, value in row.items() if key.endswith(("_rel_err", "_error", "_same", "_deterministic")))
    return f"{name:10} d {row['density']:.3f}  {probe_times(row)}  {errs}"


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "also time FlexAttention (compiles: minutes)")
