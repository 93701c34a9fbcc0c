"""Triton kernels for fused block-sparse attention (FlashAttention-2 style); their
launchers are in :mod:`tilesparse.kernels.attention`.

Shapes: q, o, dq [B, H, S, D]; k, v, dk, dv [B, Hkv, S, D] (H % Hkv == 0: query head h
reads kv head h // (H / Hkv)); lse, delta [B, H, S] float32; key_padding_mask [B, S]
(True = padding). The layout is a packed int32 ``meta`` (see
:mod:`tilesparse.attention.layout`) for L layout heads (L = 1: shared by all heads) of
nb = ceil(S / b) blocks of b tokens.

* ``_fwd_kernel``: program (query tile, batch*head) walks the CSR row of its query block:
  O = softmax(Q K^T * scale) V with the online softmax (running max and sum, exp2), and
  saves lse = log(sum exp(s)) per row (natural log; -inf for a row with no kept key,
  whose output is 0).
* ``_bwd_preprocess_kernel``: delta = rowsum(dO * O) in fp32.
* ``_bwd_dkdv_kernel``: program (key tile, batch*kv head) walks, for each query head of its
  group, the CSC column of its key block: dV = sum P^T dO, dK = scale * sum dS^T Q with
  P = exp(s - lse), dS = P * (dO V^T - delta). Each dK/dV element is written once.
  ``AttentionConfig.two_pass`` (opt-in): the column walked twice, dV then dK, with one
  fp32 accumulator live at a time (5 matmuls per block pair instead of 4).
* ``_bwd_dq_kernel``: program (query tile, batch*head) walks the CSR row again:
  dQ = scale * sum dS K.

By default no atomics anywhere, and every reduction runs in a fixed order: gradients
are bitwise deterministic. ``deterministic=False`` opts into the one exception: dQ
accumulated by fp32 atomics inside ``_bwd_dkdv_kernel`` (FlashAttention-2's way), which
drops the dQ kernel's recomputation of QKᵀ and dO Vᵀ. Kept pairs: block in the
layout, key < S, not padding, and key <= query when causal (diagonal blocks are masked
inside; blocks above the diagonal are not in the causal tables at all). A D that is
not a power of two (96) runs on the next power-of-two tile with masked loads. Row
offsets are int64 (B*H*S*D can pass 2**31).

"""

import triton
import triton.language as tl


@triton.jit
def _tile_mask(offs_m, offs_n, kpm_ptr, bz, S, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] bool: the (query, key) pairs kept (key < S, query < S, key not
    padding, key <= query when causal)."""
    n_ok = offs_n < S
    if HAS_KPM:
        pad = tl.load(kpm_ptr + bz * S + offs_n, mask=n_ok, other=1)
        n_ok = n_ok & (pad == 0)
    keep = (offs_m < S)[:, None] & n_ok[None, :]
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return keep


@triton.jit
def _needs_mask(kblk, qblk, S, BS: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr):
    """Whether block (qblk, kblk) needs the element mask: always with key padding, else
    only the last key block when S is not a multiple of b and, if causal, the diagonal
    block. Elsewhere every pair is kept, and the mask's compares and selects are skipped
    (rows past S in such a block read q = dO = 0 and are never stored)."""
    if HAS_KPM:
        need = kblk == kblk
    else:
        need = (kblk + 1) * BS > S
        if CAUSAL:
            need = need | (kblk == qblk)
    return need


@triton.jit
def _query_tile(bh, H, GROUP, L_HEADS, BS: tl.constexpr, BLOCK_M: tl.constexpr):
    """The query tile of program (program_id(0), bh) in the forward and dQ kernels: its
    query block, batch (int64), head, kv head, layout head (L_HEADS is 1 when the
    layout is shared, else H) and its BLOCK_M row offsets (int64)."""
    M_SPLIT: tl.constexpr = BS // BLOCK_M
    pid = tl.program_id(0)
    qblk = pid // M_SPLIT
    bz = (bh // H).to(tl.int64)
    h = bh % H
    offs_m = (qblk * BS + (pid % M_SPLIT) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    return qblk, bz, h, h // GROUP, h % L_HEADS, offs_m


@triton.jit
def _kv_sources(k_ptr, v_ptr, bz, hkv, B, HKV, S, skb, skh, sks, svb, svh, svs, D: tl.constexpr,
                D_TILE: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """Where the row walk reads K and V: tensor descriptors over [B, HKV, S, D] with
    [1, 1, BLOCK_N, D] boxes (TMA: zero-filled past S, no address math or masks in the
    loop), or the base pointers of batch ``bz`` (int64), kv head ``hkv``."""
    if TMA:
        k_src = tl.make_tensor_descriptor(k_ptr, [B, HKV, S, D], [skb, skh, sks, 1], [1, 1, BLOCK_N, D_TILE])
        v_src = tl.make_tensor_descriptor(v_ptr, [B, HKV, S, D], [svb, svh, svs, 1], [1, 1, BLOCK_N, D_TILE])
    else:
        k_src = k_ptr + bz * skb + hkv.to(tl.int64) * skh
        v_src = v_ptr + bz * svb + hkv.to(tl.int64) * svh
    return k_src, v_src


@triton.jit
def _kv_step(t, row_cols_ptr, k_src, v_src, bz, hkv, sks, svs, offs_d, d_ok, S, BS: tl.constexpr,
             BLOCK_N: tl.constexpr, N_STEPS: tl.constexpr, D_TILE: tl.constexpr, TMA: tl.constexpr):
    """Step t of a query block's row walk (forward and dQ): the key block (int64), its
    BLOCK_N key offsets, and those K and V rows (zeros past S and past D)."""
    kblk = tl.load(row_cols_ptr + t // N_STEPS).to(tl.int64)
    start = kblk * BS + (t % N_STEPS) * BLOCK_N
    offs_n = start + tl.arange(0, BLOCK_N)
    if TMA:
        where = [bz.to(tl.int32), hkv.to(tl.int32), start.to(tl.int32), 0]
        k = k_src.load(where).reshape(BLOCK_N, D_TILE)
        v = v_src.load(where).reshape(BLOCK_N, D_TILE)
    else:
        kv_mask = (offs_n < S)[:, None] & d_ok[None, :]
        k = tl.load(k_src + offs_n[:, None] * sks + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_src + offs_n[:, None] * svs + offs_d[None, :], mask=kv_mask, other=0.0)
    return kblk, offs_n, k, v


@triton.jit
def _fwd_step(q, k, v, m_i, l_i, acc, kblk, qblk, offs_m, offs_n, kpm_ptr, bz, S, qk_scale, BS: tl.constexpr,
              HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One online-softmax step of the forward over a key tile: (m_i, l_i, acc) updated.
    MASK: apply the element mask where :func:`_needs_mask` says so (False: the caller
    knows the tile needs none)."""
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
    if MASK:
        if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
            s = tl.where(_tile_mask(offs_m, offs_n, kpm_ptr, bz, S, HAS_KPM, CAUSAL), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with nothing kept so far has m_new = -inf: subtract 0 instead, so that
    # exp2(-inf - -inf) never makes a NaN (p and alpha come out 0; l and acc stay 0).
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kpm_ptr,
    row_ptr_ptr, row_cols_ptr,
    B, S, H, GROUP, NB, L_HEADS, qk_scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
    BS: tl.constexpr, D: tl.constexpr, D_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr,
    SPLIT_LAST: tl.constexpr = False,
):
    """O[tile] = softmax(Q[tile] K^T * scale) V over the tile's block row; qk_scale is
    scale * log2(e) (the softmax runs in base 2). SPLIT_LAST (no key padding): a row's
    blocks are sorted, so only its last can need the element mask (the causal diagonal,
    the S tail); walk the others in a loop without the mask's branch, then the last."""
    tl.static_assert(not (SPLIT_LAST and HAS_KPM), "SPLIT_LAST assumes no key padding")
    N_STEPS: tl.constexpr = BS // BLOCK_N
    bh = tl.program_id(1)
    qblk, bz, h, hkv, lh, offs_m = _query_tile(bh, H, GROUP, L_HEADS, BS, BLOCK_M)
    offs_d = tl.arange(0, D_TILE)
    d_ok = offs_d < D
    q_base = q_ptr + bz * sqb + h.to(tl.int64) * sqh
    k_src, v_src = _kv_sources(k_ptr, v_ptr, bz, hkv, B, H // GROUP, S, skb, skh, sks, svb, svh, svs,
                               D, D_TILE, BLOCK_N, TMA)
    q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :], mask=(offs_m < S)[:, None] & d_ok[None, :],
                other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D_TILE), dtype=tl.float32)

    start = tl.load(row_ptr_ptr + lh * NB + qblk)
    end = tl.load(row_ptr_ptr + lh * NB + qblk + 1)
    masked_from = start
    if SPLIT_LAST:
        masked_from = tl.maximum(end - 1, start)
        for t in range(start * N_STEPS, masked_from * N_STEPS):
            kblk, offs_n, k, v = _kv_step(t, row_cols_ptr, k_src, v_src, bz, hkv, sks, svs, offs_d, d_ok, S,
                                          BS, BLOCK_N, N_STEPS, D_TILE, TMA)
            m_i, l_i, acc = _fwd_step(q, k, v, m_i, l_i, acc, kblk, qblk, offs_m, offs_n, kpm_ptr, bz, S, qk_scale,
                                      BS, HAS_KPM, CAUSAL, False, INPUT_PRECISION)
    for t in range(masked_from * N_STEPS, end * N_STEPS):
        kblk, offs_n, k, v = _kv_step(t, row_cols_ptr, k_src, v_src, bz, hkv, sks, svs, offs_d, d_ok, S,
                                      BS, BLOCK_N, N_STEPS, D_TILE, TMA)
        m_i, l_i, acc = _fwd_step(q, k, v, m_i, l_i, acc, kblk, qblk, offs_m, offs_n, kpm_ptr, bz, S, qk_scale,
                                  BS, HAS_KPM, CAUSAL, True, INPUT_PRECISION)

    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) / 1.4426950408889634)
    row_ok = offs_m < S
    tl.store(o_ptr + bz * sob + h.to(tl.int64) * soh + offs_m[:, None] * sos + offs_d[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + bh.to(tl.int64) * S + offs_m, lse, mask=row_ok)


@triton.jit
def _bwd_preprocess_kernel(
    o_ptr, do_ptr, delta_ptr, S, H,
    sob, soh, sos, sdb, sdh, sds,
    D: tl.constexpr, D_TILE: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta[b, h, rows] = sum_d dO * O, in fp32."""
    bh = tl.program_id(1)
    bz = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_TILE)
    mask = (offs_m < S)[:, None] & (offs_d < D)[None, :]
    o = tl.load(o_ptr + bz * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(do_ptr + bz * sdb + h * sdh + offs_m[:, None] * sds + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + bh.to(tl.int64) * S + offs_m, delta, mask=offs_m < S)


@triton.jit
def _bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, kpm_ptr,
    col_ptr_ptr, col_rows_ptr, dq_acc_ptr, ds_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, NNZ, BHK_OFFSET, DS_ROW_OFFSET, qk_scale, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    BS: tl.constexpr, D: tl.constexpr, D_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr,
    ATOMIC_DQ: tl.constexpr = False, TMA_REDUCE: tl.constexpr = False, TWO_PASS: tl.constexpr = False,
    STORE_DS: tl.constexpr = False,
):
    """dK, dV of one key tile of one kv head: a fixed-order sum over the group's query
    heads and, for each, the query blocks of the key block's CSC column. dk/dv are
    contiguous [B, HKV, S, D]. With ATOMIC_DQ, also dQ += scale * dS K into the fp32
    [B, H, S, D] ``dq_acc`` by atomic adds (no dQ kernel; not bitwise reproducible).

    TWO_PASS: walk the column twice, so that one fp32 [BLOCK_N, D] accumulator is live
    at a time instead of two: first dV (S, P, dV += P^T dO; 2 matmuls per block pair),
    stored, then dK (S, P, dP, dS, dK += dS^T Q; 3 matmuls, and ATOMIC_DQ's dQ share).
    5 matmuls per pair instead of 4, for half the accumulator registers. Both passes walk
    the pairs in the single pass's order: the same sums in the same order (deterministic;
    under the interpreter bitwise equal to the single pass).

    STORE_DS: each block pair's dS (in q's dtype, the value dK's product uses) is also
    stored into ``ds`` [rows, NNZ, BS keys, BS queries] at the pair's CSC slot (transposed,
    as computed here), row (batch, which of the heads sharing layout head lh) minus
    DS_ROW_OFFSET, for the dQ kernel that reads it instead of recomputing S, P and dP
    (:mod:`tilesparse.kernels.attention_stored_ds`). BHK_OFFSET: program (.., i) works on
    batch * kv head BHK_OFFSET + i (a launch per chunk of kv heads)."""
    tl.static_assert(not TMA_REDUCE or (TMA and ATOMIC_DQ), "TMA_REDUCE needs TMA loads and ATOMIC_DQ")
    tl.static_assert(not (STORE_DS and ATOMIC_DQ), "STORE_DS and ATOMIC_DQ are two ways to make dQ")
    N_SPLIT: tl.constexpr = BS // BLOCK_N
    M_STEPS: tl.constexpr = BS // BLOCK_M
    pid = tl.program_id(0)
    bhk = tl.program_id(1) + BHK_OFFSET  # the launch may cover a chunk of the kv heads
    kblk = pid // N_SPLIT
    bz = (bhk // HKV).to(tl.int64)
    hkv = bhk % HKV

    offs_n = (kblk * BS + (pid % N_SPLIT) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_d = tl.arange(0, D_TILE)
    d_ok = offs_d < D
    kv_mask = (offs_n < S)[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + bz * skb + hkv.to(tl.int64) * skh + offs_n[:, None] * sks + offs_d[None, :], mask=kv_mask,
                other=0.0)
    if not TWO_PASS:  # (two passes: V is loaded for the dK pass, the first needs none)
        v = tl.load(v_ptr + bz * svb + hkv.to(tl.int64) * svh + offs_n[:, None] * svs + offs_d[None, :],
                    mask=kv_mask, other=0.0)
    n_keep = offs_n < S
    if HAS_KPM:
        pad = tl.load(kpm_ptr + bz * S + offs_n, mask=n_keep, other=1)
        n_keep = n_keep & (pad == 0)
    dk = tl.zeros((BLOCK_N, D_TILE), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, D_TILE), dtype=tl.float32)
    if TMA:  # Q and dO tiles through descriptors over [B, H, S, D] (zero-filled past S)
        q_desc = tl.make_tensor_descriptor(q_ptr, [B, H, S, D], [sqb, sqh, sqs, 1], [1, 1, BLOCK_M, D_TILE])
        do_desc = tl.make_tensor_descriptor(do_ptr, [B, H, S, D], [sdb, sdh, sds, 1], [1, 1, BLOCK_M, D_TILE])
        if TMA_REDUCE:  # dQ shares added by TMA reductions (one bulk async add per tile; rows past S clipped)
            head_stride = S.to(tl.int64) * D
            dq_desc = tl.make_tensor_descriptor(dq_acc_ptr, [B, H, S, D], [H * head_stride, head_stride, D, 1],
                                                [1, 1, BLOCK_M, D_TILE])

    # one pass (dK and dV together), or two: pass 0 dV only, pass 1 dK only (p is a
    # constexpr: each pass is its own loop, carrying only its own accumulator)
    LAST_PASS: tl.constexpr = 1 if TWO_PASS else 0
    for p in tl.static_range(LAST_PASS + 1):
        if TWO_PASS and p == 1:
            v = tl.load(v_ptr + bz * svb + hkv.to(tl.int64) * svh + offs_n[:, None] * svs + offs_d[None, :],
                        mask=kv_mask, other=0.0)
        for g in range(0, GROUP):
            h = hkv * GROUP + g
            lh = h % L_HEADS  # L_HEADS is 1 (shared) or H
            bh = bz * H + h
            q_base = q_ptr + bz * sqb + h.to(tl.int64) * sqh
            do_base = do_ptr + bz * sdb + h.to(tl.int64) * sdh
            start = tl.load(col_ptr_ptr + lh * NB + kblk)
            end = tl.load(col_ptr_ptr + lh * NB + kblk + 1)
            for i in range(start * M_STEPS, end * M_STEPS):
                if ATOMIC_DQ:  # each key tile starts its column walk elsewhere: global query blocks, which
                    # every column shares, are not all hit by every program at once (same-address atomics serialize)
                    t = start * M_STEPS + (i - start * M_STEPS + pid * M_STEPS) % ((end - start) * M_STEPS)
                else:
                    t = i
                qblk = tl.load(col_rows_ptr + t // M_STEPS).to(tl.int64)
                row = qblk * BS + (t % M_STEPS) * BLOCK_M
                offs_m = row + tl.arange(0, BLOCK_M)
                m_ok = offs_m < S
                if TMA:
                    where = [bz.to(tl.int32), h.to(tl.int32), row.to(tl.int32), 0]
                    q = q_desc.load(where).reshape(BLOCK_M, D_TILE)
                    do = do_desc.load(where).reshape(BLOCK_M, D_TILE)
                else:
                    q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :],
                                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
                    do = tl.load(do_base + offs_m[:, None] * sds + offs_d[None, :],
                                 mask=m_ok[:, None] & d_ok[None, :], other=0.0)
                lse = tl.load(lse_ptr + bh * S + offs_m, mask=m_ok, other=0.0)
                lse = tl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634  # empty rows: p = 0 anyway
                if p == LAST_PASS:
                    delta = tl.load(delta_ptr + bh * S + offs_m, mask=m_ok, other=0.0)
                # transposed scores sT[n, m] = k[n] . q[m]
                sT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * qk_scale
                pT = tl.exp2(sT - lse[None, :])
                if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
                    keepT = n_keep[:, None] & m_ok[None, :]
                    if CAUSAL:
                        keepT = keepT & (offs_n[:, None] <= offs_m[None, :])
                    pT = tl.where(keepT, pT, 0.0)
                if p == 0:
                    dv += tl.dot(pT.to(do.dtype), do, input_precision=INPUT_PRECISION)
                if p == LAST_PASS:
                    dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
                    dsT = pT * (dpT - delta[None, :])
                    dk += tl.dot(dsT.to(q.dtype), q, input_precision=INPUT_PRECISION)
                    if STORE_DS:  # ds[row, slot, n, m] = dsT[n, m]; row: (batch, which of the heads sharing layout lh)
                        HPL = H // L_HEADS
                        ds_tile = ds_ptr + ((bz * HPL + h // L_HEADS - DS_ROW_OFFSET) * NNZ + t // M_STEPS) * (BS * BS)
                        n_in = (pid % N_SPLIT) * BLOCK_N + tl.arange(0, BLOCK_N)
                        m_in = (t % M_STEPS) * BLOCK_M + tl.arange(0, BLOCK_M)
                        tl.store(ds_tile + n_in[:, None] * BS + m_in[None, :], dsT.to(ds_ptr.dtype.element_ty))
                    if ATOMIC_DQ:
                        dq_part = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=INPUT_PRECISION) * scale
                        if TMA_REDUCE:
                            dq_desc.atomic_add(where, dq_part.reshape(1, 1, BLOCK_M, D_TILE))
                        else:
                            tl.atomic_add(dq_acc_ptr + bh * S * D + offs_m[:, None] * D + offs_d[None, :], dq_part,
                                          mask=m_ok[:, None] & d_ok[None, :], sem="relaxed")
        if TWO_PASS and p == 0:  # dV out before the dK pass: its accumulator dies here
            dv_off = bhk.to(tl.int64) * S * D + offs_n[:, None] * D + offs_d[None, :]
            tl.store(dv_ptr + dv_off, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)

    out_off = bhk.to(tl.int64) * S * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(dk_ptr + out_off, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    if not TWO_PASS:
        tl.store(dv_ptr + out_off, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, kpm_ptr,
    row_ptr_ptr, row_cols_ptr,
    B, S, H, GROUP, NB, L_HEADS, qk_scale, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    BS: tl.constexpr, D: tl.constexpr, D_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """dQ of one query tile: scale * sum over the block row of dS K. dq is contiguous
    [B, H, S, D]."""
    N_STEPS: tl.constexpr = BS // BLOCK_N
    bh = tl.program_id(1)
    qblk, bz, h, hkv, lh, offs_m = _query_tile(bh, H, GROUP, L_HEADS, BS, BLOCK_M)
    offs_d = tl.arange(0, D_TILE)
    d_ok = offs_d < D
    m_ok = offs_m < S
    q_mask = m_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + bz * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=q_mask,
                other=0.0)
    do = tl.load(do_ptr + bz * sdb + h.to(tl.int64) * sdh + offs_m[:, None] * sds + offs_d[None, :], mask=q_mask,
                 other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634
    delta = tl.load(delta_ptr + bh.to(tl.int64) * S + offs_m, mask=m_ok, other=0.0)
    k_src, v_src = _kv_sources(k_ptr, v_ptr, bz, hkv, B, H // GROUP, S, skb, skh, sks, svb, svh, svs,
                               D, D_TILE, BLOCK_N, TMA)
    dq = tl.zeros((BLOCK_M, D_TILE), dtype=tl.float32)

    start = tl.load(row_ptr_ptr + lh * NB + qblk)
    end = tl.load(row_ptr_ptr + lh * NB + qblk + 1)
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk, offs_n, k, v = _kv_step(t, row_cols_ptr, k_src, v_src, bz, hkv, sks, svs, offs_d, d_ok, S,
                                      BS, BLOCK_N, N_STEPS, D_TILE, TMA)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        p = tl.exp2(s - lse[:, None])
        if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
            p = tl.where(_tile_mask(offs_m, offs_n, kpm_ptr, bz, S, HAS_KPM, CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=INPUT_PRECISION)

    tl.store(dq_ptr + bh.to(tl.int64) * S * D + offs_m[:, None] * D + offs_d[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)
