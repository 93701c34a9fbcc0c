"""Launchers of the fused block-sparse attention kernels: the Triton ones
(:mod:`tilesparse.kernels.attention_kernels`, whose docstring gives the shapes, tables
and math) and, on Hopper where measured faster or asked for by config, the
warp-specialized ones (:mod:`tilesparse.kernels.attention_ws`).

The launchers take raw tensors and tables and check nothing beyond what they need; the
registered ops in :mod:`tilesparse.ops.attention` check user input.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .._env import switch
from ..attention.layout import attention_table_views
from ._alloc import new_output
from ._device import side_stream
from . import attention_stored_ds, attention_ws, attention_ws_dq
from .attention_configs import AttentionConfig, _tma_ok, attention_config
from .attention_ordered_dq import every_row_has_shares
from .attention_kernels import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess_kernel, _fwd_kernel
from .bsmm_tma import ensure_allocator
from ._launch import launch
from ._tiles import MAX_GRID_Y, cdiv, next_power_of_2  # batch * heads go on the grid's y axis

__all__ = ["attention_forward", "attention_backward", "attention_config", "AttentionConfig", "MAX_GRID_Y",
           "_fwd_kernel", "_bwd_preprocess_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_tma_ok"]

LOG2E = 1.4426950408889634


def _input_precision(dtype: torch.dtype) -> str:
    """fp32 operands use TF32 unless float32 matmul precision is 'highest' (as dense)."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee"


def _rows(t: torch.Tensor) -> torch.Tensor:
    """The kernels address the head dimension with stride 1."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _kpm_bytes(key_padding_mask, ref: torch.Tensor) -> torch.Tensor:
    """key_padding_mask as contiguous uint8 [B, S] (a zero-copy view of a contiguous
    bool tensor); a dummy pointer when absent."""
    if key_padding_mask is None:
        return ref
    return key_padding_mask.contiguous().view(torch.uint8)




# The deterministic backward's warp-specialized dQ kernel reads nothing the dK/dV kernel writes:
# with CONCURRENT_DQ it runs on a side stream beside it (joined before the backward returns),
# so the GPU starts dQ's programs as dK/dV's last ones leave SMs free. Off until measured.
CONCURRENT_DQ = switch("TILESPARSE_ATTENTION_CONCURRENT_DQ", False)


# The default kernels and configs chosen for an operand signature, remembered (CUDA only):
# choosing them (the Hopper checks of every operand, the measured defaults) was a third of
# the backward launcher's host time (twenty-fourth session). Keyed on all they read: each
# operand's dtype, shape, strides and 16-byte alignment, the device, the layout's heads,
# the block size and the mode. Not the module tables behind the choice (attention_ws's
# _WS_DEFAULTS, _ATOMIC_DQ_DEFAULTS, _SHARED_LAYOUTS_ONLY): whoever edits them at run time
# on CUDA clears _PLANS.
_PLANS: dict = {}
_MAX_PLANS = 1024


def _plans_apply(q: torch.Tensor) -> bool:
    """Plans are remembered for CUDA operands (the CPU runs the interpreter in tests, which
    patch the checks the plans would skip)."""
    return q.is_cuda


def _operand_signature(*tensors: torch.Tensor) -> tuple:
    return tuple((t.dtype, t.shape, t.stride(), t.data_ptr() % 16 == 0) for t in tensors)


def _remembered_plan(key, choose, remember: bool = True):
    """``choose()`` for ``key``, remembered where ``remember`` (the launchers: no config given
    and :func:`_plans_apply`; the first element of ``key`` is the device)."""
    if not remember:
        return choose()
    plan = _PLANS.get(key)
    if plan is None:
        plan = choose()
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _common(q, k, meta, layout_heads, block_size):
    B, H, S, D = q.shape
    if B * H > MAX_GRID_Y:
        raise ValueError(f"batch * heads = {B * H} exceeds {MAX_GRID_Y} (the kernels' grid axis 1); split the batch")
    nb = cdiv(S, block_size)
    return B, H, S, D, k.shape[1], nb, max(16, next_power_of_2(D))


# --------------------------------------------------------------------------- launchers


def attention_forward(q, k, v, meta, key_padding_mask, layout_heads: int, block_size: int, causal: bool,
                      scale: float, config: AttentionConfig | None = None):
    """(out [B, H, S, D] in q's dtype, lse [B, H, S] float32): the fused forward over the
    layout's CSR rows (``meta`` built with the same ``causal``; an
    ``attention_ws.FwdWsConfig`` runs the Hopper warp-specialized forward)."""
    q, k, v = _rows(q), _rows(k), _rows(v)
    B, H, S, D, Hkv, nb, d_tile = _common(q, k, meta, layout_heads, block_size)
    out = new_output(B, H, S, D, dtype=q.dtype, device=q.device)
    lse = new_output(B, H, S, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse

    def choose():
        cfg = config or attention_ws.default_config("fwd", q, k, v, out, block_size, layout_heads) or \
            attention_config("fwd", block_size, D, q.dtype)
        ws = _check_config(cfg, attention_ws.FwdWsConfig, "config", "forward", q, k, v, out, block_size)
        return cfg, ws, not ws and _tma_ok(cfg, D, d_tile, k, v)

    cfg, ws, tma = _remembered_plan((q.device, "fwd", _operand_signature(q, k, v, out), block_size, layout_heads),
                                    choose, remember=config is None and _plans_apply(q))
    row_ptr, _, row_cols, _ = attention_table_views(meta, layout_heads, nb)
    kpm = _kpm_bytes(key_padding_mask, row_ptr)
    if ws:
        attention_ws.launch_fwd_ws(q, k, v, out, lse, kpm, row_ptr, row_cols, nb, layout_heads, block_size, causal,
                                   key_padding_mask is not None, scale, cfg, meta)
        return out, lse
    if tma:
        ensure_allocator()
    launch(_fwd_kernel, (nb * (block_size // cfg.block_m), B * H),
        q, k, v, out, lse, kpm, row_ptr, row_cols,
        B, S, H, H // Hkv, nb, layout_heads, scale * LOG2E,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        BS=block_size, D=D, D_TILE=d_tile, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, HAS_KPM=key_padding_mask is not None, INPUT_PRECISION=_input_precision(q.dtype),
        TMA=tma, SPLIT_LAST=cfg.split_last and key_padding_mask is None, **cfg.launch_options(),
    )
    return out, lse


def _check_config(cfg, ws_kind, where: str, what: str, q, k, v, third, block_size: int,
                  deterministic: bool = True) -> bool:
    """Whether ``cfg`` picks the Hopper warp-specialized kernel of ``ws_kind`` (raising
    ValueError, named after ``where``, if these inputs cannot take it, or if its atomic-dQ
    mode disagrees with ``deterministic``: only the dK/dV kernel has one,
    ``DkdvWsConfig.atomic_dq``); else checks it as an AttentionConfig. ``third`` is
    grad_out for the backward, the output for the forward."""
    if not isinstance(cfg, ws_kind):
        if not isinstance(cfg, AttentionConfig):
            raise ValueError(f"{where}={cfg}: not a {what} config (an AttentionConfig or {ws_kind.__name__})")
        cfg.check(block_size)
        return False
    atomic = getattr(cfg, "atomic_dq", None)  # None: the kernel has no atomic-dQ mode (dQ, forward)
    if atomic and cfg.ordered_dq:  # its adds in a fixed order: deterministic
        atomic = not deterministic
    why = attention_ws.ws_supported(q, k, v, third, block_size, cfg)
    if why is None and atomic is None and not deterministic:
        why = "has no atomic-dQ mode (deterministic=False)"
    elif why is None and atomic is not None and atomic == deterministic:
        why = ("adds dQ by reductions (atomic_dq=True): it needs deterministic=False" if atomic else
               "needs atomic_dq=True (its atomic-dQ mode) with deterministic=False")
    if why is not None:
        raise ValueError(f"{where}={cfg}: the warp-specialized {what} kernel {why}")
    return True


def _dkdv(q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows, dq_acc, ds, chunk, nb, layout_heads,
          scale, cfg_kv, ws: bool, tma_kv: bool, has_kpm: bool, strides, common, meta=None) -> None:
    """One launch of a dK/dV kernel (the warp-specialized one where ``ws``): over every
    (batch, kv head), or over ``chunk``'s with its workspace rows (stored dS)."""
    B, H, S, _ = q.shape
    Hkv = k.shape[1]
    first, end, row_first = (0, B * Hkv, 0) if chunk is None else (chunk.kv_first, chunk.kv_end, chunk.row_first)
    block_size, causal = common["BS"], common["CAUSAL"]
    if ws:
        attention_ws.launch_dkdv_ws(q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows, nb, layout_heads,
                                    block_size, causal, has_kpm, scale, cfg_kv, ds=ds, kv_heads=(first, end),
                                    ds_row_offset=row_first, dq_acc=dq_acc, meta=meta)
        return
    launch(_bwd_dkdv_kernel, (nb * (block_size // cfg_kv.block_n), end - first),
        q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows, delta if dq_acc is None else dq_acc,
        delta if ds is None else ds,
        B, S, H, Hkv, H // Hkv, nb, layout_heads, col_rows.numel(), first, row_first, scale * LOG2E, scale, *strides,
        BLOCK_M=cfg_kv.block_m, BLOCK_N=cfg_kv.block_n, TMA=tma_kv, ATOMIC_DQ=dq_acc is not None,
        TWO_PASS=cfg_kv.two_pass,
        # the bulk TMA reduction of dQ on the GPU (the interpreter has none: pointer atomics there)
        TMA_REDUCE=dq_acc is not None and tma_kv and q.device.type == "cuda", STORE_DS=ds is not None,
        **cfg_kv.launch_options(), **common,
    )


def attention_backward(grad_out, q, k, v, out, lse, meta, key_padding_mask, layout_heads: int, block_size: int,
                       causal: bool, scale: float, configs: tuple[AttentionConfig, AttentionConfig] | None = None,
                       deterministic: bool = True):
    """(dq, dk, dv) in the inputs' dtypes: delta = rowsum(dO * O), then the dK/dV kernel
    over the CSC columns and the dQ kernel over the CSR rows (``configs`` = (dkdv, dq); a
    ``attention_ws.DkdvWsConfig`` first / ``DqWsConfig`` second runs the Hopper
    warp-specialized dK/dV / dQ kernel). A ``DqWsConfig`` with ``delta`` runs first and
    computes delta itself, for the dK/dV kernel after it (no delta kernel).
    ``deterministic=False``: the dK/dV kernel (Triton's, or the warp-specialized one with
    ``atomic_dq=True``) also adds each block pair's dQ share into an fp32 buffer by
    atomics or TMA reductions (5 matmuls per pair instead of 7, no dQ kernel; dQ's bits
    then depend on the order the adds land in; a ``DkdvWsConfig`` with ``ordered_dq`` adds them
    in a fixed order instead: deterministic either way; without ``configs`` the deterministic
    backward runs that mode where ``attention_ws.ordered_default`` says this layout takes it
    cheaply, D 128 on Hopper). A dK/dV config with ``two_pass`` walks
    each key tile's column twice (dV, then dK; one fp32 accumulator live at a time).
    With ``attention_stored_ds`` on (and no configs given), the dK/dV kernel stores each
    pair's dS and dQ is one product per pair over the rows (deterministic, 5 matmuls)."""
    q, k, v, out, grad_out = (_rows(t) for t in (q, k, v, out, grad_out))
    B, H, S, D, Hkv, nb, d_tile = _common(q, k, meta, layout_heads, block_size)
    dk = new_output(B, Hkv, S, D, dtype=k.dtype, device=k.device)
    dv = new_output(B, Hkv, S, D, dtype=v.dtype, device=v.device)
    if dk.numel() == 0:
        return new_output(B, H, S, D, dtype=q.dtype, device=q.device), dk, dv
    delta = new_output(B, H, S, dtype=torch.float32, device=q.device)
    row_ptr, col_ptr, row_cols, col_rows = attention_table_views(meta, layout_heads, nb)
    # dQ from dS stored by the dK/dV kernel (attention_stored_ds; either dK/dV kernel stores it),
    # in chunks of heads where the workspace would pass its budget
    stored = None
    if deterministic and configs is None:
        stored = attention_stored_ds.plan(B, H, Hkv, layout_heads, col_rows.numel(), block_size, q.dtype,
                                          q.numel() * q.element_size(), q.device)
    stored_ds = stored is not None

    def choose(configs=configs):
        defaults = configs is None
        if defaults:  # a measured warp-specialized default on Hopper (with deterministic=False, the dK/dV
            # one adding dQ by TMA reductions where measured faster), else Triton's; with stored dS, dQ runs the
            # Triton dq-from-dS kernel at the dQ config's tiles
            configs = tuple((not (stored_ds and kind == "dq")
                             and attention_ws.default_config(kind, q, k, v, grad_out, block_size, layout_heads,
                                                             deterministic))
                            or attention_config(kind, block_size, D, q.dtype) for kind in ("dkdv", "dq"))
        cfg_kv, cfg_q = configs
        ws = _check_config(cfg_kv, attention_ws.DkdvWsConfig, "configs[0]", "dK/dV", q, k, v, grad_out, block_size,
                           deterministic)
        ws_q = _check_config(cfg_q, attention_ws.DqWsConfig, "configs[1]", "dQ", q, k, v, grad_out, block_size,
                             deterministic)
        # deterministic, on operands the ordered mode takes: its config, used where the layout does
        ordered = (attention_ws.ordered_candidate(q, k, v, grad_out, block_size, layout_heads)
                   if defaults and deterministic and ws and not stored_ds else None)
        return (cfg_kv, cfg_q, ws, ws_q, not ws and _tma_ok(cfg_kv, D, d_tile, q, grad_out),
                not ws_q and _tma_ok(cfg_q, D, d_tile, k, v), ordered)

    cfg_kv, cfg_q, ws, ws_q, tma_kv, tma_q, ordered = _remembered_plan(
        (q.device, "bwd", _operand_signature(q, k, v, grad_out), block_size, layout_heads, deterministic, stored_ds),
        choose, remember=configs is None and _plans_apply(q))
    if ordered is not None and attention_ws.ordered_layout_ok(meta, layout_heads, nb):
        # this layout's dQ shares ordered cheaply: one dK/dV kernel adds them in a fixed order
        # (5 products per block pair, no dQ kernel); decided per layout, not in the plan
        cfg_kv = ordered
    kpm = _kpm_bytes(key_padding_mask, row_ptr)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3])
    common = dict(BS=block_size, D=D, D_TILE=d_tile, CAUSAL=causal, HAS_KPM=key_padding_mask is not None,
                  INPUT_PRECISION=_input_precision(q.dtype))
    if tma_kv or tma_q:
        ensure_allocator()
    # dQ added by reductions (deterministic=False, or in order: DkdvWsConfig.ordered_dq) into fp32
    adds = not deterministic or (ws and cfg_kv.atomic_dq)
    dq_acc = None
    if adds and ws and cfg_kv.first_share_stored and every_row_has_shares(meta, layout_heads, nb):
        dq_acc = new_output(B, H, S, D, dtype=torch.float32, device=q.device)  # every row's first share stored
    elif adds:
        dq_acc = torch.zeros(B, H, S, D, dtype=torch.float32, device=q.device)
    ds = slots = None
    chunks = [None]  # one launch over every head
    if stored_ds:  # every tile of every pair of a chunk is written by the dK/dV kernel
        chunks, rows = stored
        ds = new_output(rows, col_rows.numel(), block_size, block_size, dtype=q.dtype, device=q.device)
        slots = attention_stored_ds.row_entry_slots(meta, layout_heads, nb)  # (first call: built before the launches)
    dq = None if dq_acc is not None else new_output(B, H, S, D, dtype=q.dtype, device=q.device)
    side = None
    dq_ws = ws_q and dq_acc is None and not stored_ds  # the warp-specialized dQ kernel runs
    if dq_ws and CONCURRENT_DQ and q.is_cuda and (
            not torch.cuda.is_current_stream_capturing() or side_stream(q.device, "attention-dq", create=False) is not None):
        # dQ beside dK/dV, after delta (the side stream is made outside a CUDA graph capture)
        main, side = torch.cuda.current_stream(q.device), side_stream(q.device, "attention-dq")
    delta_in_dq = dq_ws and cfg_q.delta and side is None and attention_ws_dq.out_reason(out, q) is None
    if dq_ws and cfg_q.delta and not delta_in_dq:  # beside dK/dV (or O unreadable by TMA), dQ reads delta
        cfg_q = dataclasses.replace(cfg_q, delta=False)
    if delta_in_dq:  # the dQ kernel computes delta and writes it; dK/dV reads it after
        attention_ws.launch_dq_ws(q, k, v, grad_out, lse, delta, dq, kpm, row_ptr, row_cols, nb, layout_heads,
                                  block_size, causal, key_padding_mask is not None, scale, cfg_q, meta, out=out)
    else:
        launch(_bwd_preprocess_kernel, (cdiv(S, 64), B * H),
            out, grad_out, delta, S, H, *out.stride()[:3], *grad_out.stride()[:3],
            D=D, D_TILE=d_tile, BLOCK_M=64,
        )
        if side is not None:
            side.wait_stream(main)
    for chunk in chunks:
        _dkdv(q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows, dq_acc, ds, chunk, nb, layout_heads,
              scale, cfg_kv, ws, tma_kv, key_padding_mask is not None, strides, common, meta)
        if chunk is not None:
            launch(attention_stored_ds._bwd_dq_from_ds_kernel,
                (nb * (block_size // cfg_q.block_m), chunk.q_end - chunk.q_first),
                ds, k, dq, row_ptr, row_cols, slots,
                S, H, H // Hkv, nb, layout_heads, col_rows.numel(), chunk.q_first, chunk.row_first, scale,
                *k.stride()[:3],
                BS=block_size, D=D, D_TILE=d_tile, BLOCK_M=cfg_q.block_m, BLOCK_N=cfg_q.block_n,
                INPUT_PRECISION=common["INPUT_PRECISION"], **cfg_q.launch_options(),
            )
    if dq_acc is not None:
        return dq_acc.to(q.dtype), dk, dv
    if stored_ds or delta_in_dq:
        return dq, dk, dv
    if ws_q:
        try:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                attention_ws.launch_dq_ws(q, k, v, grad_out, lse, delta, dq, kpm, row_ptr, row_cols, nb,
                                          layout_heads, block_size, causal, key_padding_mask is not None, scale, cfg_q,
                                          meta)
        finally:
            if side is not None:  # joined also when the launch raises (an open capture needs it)
                main.wait_stream(side)
        return dq, dk, dv
    launch(_bwd_dq_kernel, (nb * (block_size // cfg_q.block_m), B * H),
        q, k, v, grad_out, lse, delta, dq, kpm, row_ptr, row_cols,
        B, S, H, H // Hkv, nb, layout_heads, scale * LOG2E, scale, *strides,
        BLOCK_M=cfg_q.block_m, BLOCK_N=cfg_q.block_n, TMA=tma_q, **cfg_q.launch_options(), **common,
    )
    return dq, dk, dv
