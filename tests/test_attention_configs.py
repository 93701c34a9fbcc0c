"""Launch configs of the fused attention kernels (tilesparse.kernels.attention_configs):
every config fits its block, the H200-measured ones apply where they were measured,
tensor-descriptor (TMA) loads are refused where a descriptor cannot address the tensors,
and the forward's split-off last block computes what the plain walk does."""

import dataclasses
import functools

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS
from tilesparse.attention import layouts
from tilesparse.kernels import attention as kernels


def test_tma_is_refused_where_a_descriptor_cannot_address_the_tensors():
    cfg = kernels.AttentionConfig(16, 16, tma=True)
    t = torch.randn(1, 2, 64, 32)
    assert kernels._tma_ok(cfg, 32, 32, t, t)
    assert not kernels._tma_ok(kernels.AttentionConfig(16, 16), 32, 32, t, t)  # not asked for
    assert not kernels._tma_ok(cfg, 48, 64, t, t)  # D is not the whole box
    odd = torch.randn(1, 2, 64, 33)[..., :32]  # row pitch 33 * 4 bytes: not 16-byte aligned
    assert not kernels._tma_ok(cfg, 32, 32, t, odd)
    shifted = torch.randn(2 * 64 * 32 + 1)[1:].view(1, 2, 64, 32)  # base 4 bytes past alignment
    assert not kernels._tma_ok(cfg, 32, 32, shifted, t)
    assert not kernels._tma_ok(cfg, 32, 32, t, torch.randn(1, 1, 64, 32).expand(1, 2, 64, 32))  # stride 0


def test_config_must_divide_block_size():
    with pytest.raises(ValueError, match="block_m"):
        kernels.AttentionConfig(64, 16).check(32)
    with pytest.raises(ValueError, match="block_n"):
        kernels.AttentionConfig(16, 24).check(32)
    with pytest.raises(ValueError, match="maxnreg"):
        kernels.AttentionConfig(16, 16, maxnreg=300).check(32)
    assert kernels.AttentionConfig(16, 16, 8, 3).launch_options() == {"num_warps": 8, "num_stages": 3}
    assert kernels.AttentionConfig(16, 16, maxnreg=128).launch_options()["maxnreg"] == 128


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_every_config_fits_its_block(dtype):
    """attention_config gives launchable tiles (powers of two >= 16 dividing b) for every
    pass, block size and head dim, and the H200-measured ones where they apply."""
    from tilesparse.kernels.attention_configs import _MEASURED, attention_config

    for kind in ("fwd", "dkdv", "dq"):
        for block in (16, 32, 64, 128):
            for head_dim in (32, 64, 96, 128):
                cfg = attention_config(kind, block, head_dim, dtype)
                cfg.check(block)
                measured = dtype != torch.float32 and head_dim > 64 and block >= 128
                assert (cfg == _MEASURED[kind]) == measured, (kind, block, head_dim, cfg)
                assert not cfg.two_pass, "the two-pass dK/dV walk is opt-in"
    with pytest.raises(ValueError, match="kind"):
        attention_config("dx", 64, 64, dtype)


def _interp(test):
    return functools.reduce(lambda t, mark: mark(t), INTERPRETER_MARKS, test)


@_interp
@pytest.mark.parametrize("case", ["causal_oddS", "local_subtiles", "random_padded"])
def test_split_last_gives_the_plain_walk_bitwise(case):
    """Rows are sorted, so only a row's last block can need the element mask (the causal
    diagonal, the S tail): walking the others without the mask's branch must not change
    a bit. With key padding the launcher keeps the plain walk."""
    S, b = {"causal_oddS": (75, 16), "local_subtiles": (100, 32), "random_padded": (70, 16)}[case]
    layout = {"causal_oddS": lambda: layouts.causal(S, b),
              "local_subtiles": lambda: layouts.local(S, b, 48),
              "random_padded": lambda: layouts.random(S, b, 0.5, 3, num_heads=2)}[case]()
    causal = case == "causal_oddS"
    q, k, v = (torch.randn(2, 2, S, 32).to(torch.float16) for _ in range(3))
    kpm = None
    if case == "random_padded":
        kpm = torch.zeros(2, S, dtype=torch.bool)
        kpm[1, -9:] = True
    meta = layout.meta_on(q.device, causal)
    plain = kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, b, causal, 0.2,
                                      config=kernels.AttentionConfig(16, 16))
    split = kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, b, causal, 0.2,
                                      config=kernels.AttentionConfig(16, 16, split_last=True))
    assert torch.equal(plain[0], split[0]) and torch.equal(plain[1], split[1])


def test_configs_of_the_wrong_kernel_are_refused_by_name():
    # a warp-specialized config where another kernel's goes: a clear error, not an
    # AttributeError; off Hopper a ws config is refused as such (CPU tensors here)
    from tilesparse.kernels import attention_ws

    S, b, D = 64, 32, 16
    layout = layouts.local(S, b, window=32)
    q = k = v = torch.randn(1, 1, S, D)
    meta = layout.meta_on("cpu")
    with pytest.raises(ValueError, match="not a forward config"):
        kernels.attention_forward(q, k, v, meta, None, 1, b, False, 0.25, config=attention_ws.DkdvWsConfig())
    with pytest.raises(ValueError, match="sm90"):
        kernels.attention_forward(q, k, v, meta, None, 1, b, False, 0.25, config=attention_ws.FwdWsConfig(64, 32))
    out, lse = torch.zeros(1, 1, S, D), torch.zeros(1, 1, S)
    dq_cfg = kernels.attention_config("dq", b, D, q.dtype)
    with pytest.raises(ValueError, match=r"configs\[0\].*not a dK/dV config"):
        kernels.attention_backward(out, q, k, v, out, lse, meta, None, 1, b, False, 0.25,
                                   configs=(attention_ws.FwdWsConfig(), dq_cfg))
    with pytest.raises(ValueError, match=r"configs\[1\].*sm90"):
        kernels.attention_backward(out, q, k, v, out, lse, meta, None, 1, b, False, 0.25,
                                   configs=(kernels.attention_config("dkdv", b, D, q.dtype), attention_ws.DqWsConfig()))


def test_ws_defaults_apply_only_where_measured_and_supported(monkeypatch):
    # the table of measured warp-specialized defaults is consulted when no config is
    # given; an entry the inputs cannot take (here: CPU tensors, not sm90) is skipped
    from tilesparse.kernels import attention_ws

    q = torch.randn(1, 2, 256, 32)
    assert attention_ws.default_config("fwd", q, q, q, q, 128) is None  # no entry (D 32)
    monkeypatch.setitem(attention_ws._WS_DEFAULTS, ("fwd", 128, 32), attention_ws.FwdWsConfig())
    assert attention_ws.default_config("fwd", q, q, q, q, 128) is None  # not on an sm90 GPU
    monkeypatch.setattr(attention_ws, "ws_supported", lambda *args: None)
    assert attention_ws.default_config("fwd", q, q, q, q, 128) == attention_ws.FwdWsConfig()
    assert attention_ws.default_config("dq", q, q, q, q, 128) is None  # no entry for dQ
    # D 64: every kernel measured faster on every layout (the balanced forward, the
    # backward with overlap); an entry limited to shared layouts skips per-head ones
    q64 = torch.randn(1, 2, 256, 64)
    for kind in ("fwd", "dq", "dkdv"):
        for heads in (1, 2):
            assert attention_ws.default_config(kind, q64, q64, q64, q64, 128, layout_heads=heads) is not None
    monkeypatch.setattr(attention_ws, "_SHARED_LAYOUTS_ONLY", {("dq", 128, 64)})
    assert attention_ws.default_config("dq", q64, q64, q64, q64, 128, layout_heads=1) is not None
    assert attention_ws.default_config("dq", q64, q64, q64, q64, 128, layout_heads=2) is None
    q128 = torch.randn(1, 2, 256, 128)
    assert attention_ws.default_config("fwd", q128, q128, q128, q128, 128, layout_heads=2) is not None


def test_persistent_forward_config_checks_and_counts_its_second_q_buffer():
    from tilesparse.kernels.attention_ws import FwdWsConfig

    one, persistent = FwdWsConfig(128, 128, 2), FwdWsConfig(128, 128, 2, persistent=True)
    assert persistent.shared_bytes(128, 128) - one.shared_bytes(128, 128) == 128 * 128 * 2
    with pytest.raises(ValueError, match="persistent must be a bool"):
        FwdWsConfig(128, 128, 2, persistent=1)
    with pytest.raises(ValueError, match="overlap needs persistent"):
        FwdWsConfig(128, 128, 2, overlap=True)
    with pytest.raises(ValueError, match="balanced must be a bool"):
        FwdWsConfig(128, 128, 2, persistent=True, balanced=1)
    assert FwdWsConfig(128, 128, 2, persistent=True, overlap=True).overlap
    with pytest.raises(ValueError, match="consumers must be 1 or 2"):
        FwdWsConfig(128, 128, 2, persistent=True, consumers=3)
    with pytest.raises(ValueError, match="consumers=2 needs persistent"):
        FwdWsConfig(128, 128, 2, consumers=2)
    with pytest.raises(ValueError, match="consumers=2 needs block_m=128"):
        FwdWsConfig(64, 64, 2, persistent=True, consumers=2)
    from tilesparse.kernels.attention_ws import DkdvWsConfig, DqWsConfig

    with pytest.raises(ValueError, match="consumers must be 1 or 2"):
        DkdvWsConfig(consumers=True)
    with pytest.raises(ValueError, match="consumers=2 needs block_m=128"):
        DqWsConfig(64, 64, 2, consumers=2)
    assert DqWsConfig(128, 128, 2, consumers=2).consumers == 2 and DkdvWsConfig(consumers=2).consumers == 2
    with pytest.raises(ValueError, match="load_regs must be <= 40"):
        DkdvWsConfig(load_regs=64, consumers=2)
    for cls in (DkdvWsConfig, DqWsConfig):
        with pytest.raises(ValueError, match="overlap must be a bool"):
            cls(overlap=1)
        assert cls(overlap=True).overlap


def test_two_consumer_dkdv_is_refused_at_blocks_of_64(monkeypatch):
    # two consumers split the key block into halves of one warpgroup (64 keys) each
    from tilesparse.kernels import attention_ws

    monkeypatch.setattr(attention_ws, "hopper_reason", lambda t: None)
    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    why = attention_ws.ws_supported(q, q, q, q, 64, attention_ws.DkdvWsConfig(consumers=2))
    assert why is not None and "blocks of 128 with two consumers" in why
    assert attention_ws.ws_supported(q, q, q, q, 64, attention_ws.DkdvWsConfig()) is None


def test_measured_backward_overlap_defaults():
    # dQ runs P under its dP wgmma at D 128 and 64; dK/dV only at D 64 (at D 128 the
    # overlapped consumer spills and measured 28 % slower)
    from tilesparse.kernels import attention_ws

    defaults = attention_ws._WS_DEFAULTS
    assert defaults[("dq", 128, 128)].overlap and defaults[("dq", 128, 64)].overlap
    assert defaults[("dkdv", 128, 64)].overlap and not defaults[("dkdv", 128, 128)].overlap
    assert all(defaults[("fwd", 128, d)].balanced for d in (64, 128))
    # at D 128 dK/dV reads lse and delta from its ring stages (no spills; 7 % faster)
    assert defaults[("dkdv", 128, 128)].stats_in_smem and not defaults[("dkdv", 128, 64)].stats_in_smem


@pytest.mark.parametrize("D", [64, 128])
def test_measured_store_defaults(D):
    # the persistent forward stores O through its Q buffers and the deterministic dK/dV kernel
    # stores dK / dV through its drained ring at both head dims (each measured 3-8 % faster, the
    # same bits); deterministic=False keeps D 64's staged stores (the ring not timed there), and
    # the dQ kernel stores through its Q tile at both head dims (1.5-3 % less energy per call on
    # random 10 % and BigBird at the power cap)
    from tilesparse.kernels import attention_ws

    defaults = attention_ws._WS_DEFAULTS
    assert defaults[("fwd", 128, D)].staged_stores and defaults[("fwd", 128, D)].persistent
    assert defaults[("dkdv", 128, D)].ring_stores and defaults[("dq", 128, D)].staged_stores
    atomic = dataclasses.replace(defaults[("dkdv", 128, D)], atomic_dq=True,
                                 **attention_ws._ATOMIC_DQ_DEFAULTS[("dkdv", 128, D)])
    assert atomic.ring_stores == (D == 128) and atomic.staged_stores == (D == 64)


def test_dkdv_stats_in_smem_config():
    from tilesparse.kernels import attention_ws

    plain, stats = attention_ws.DkdvWsConfig(64, 2), attention_ws.DkdvWsConfig(64, 2, stats_in_smem=True)
    # two fp32 rows (lse, delta) of block_m per stage
    assert stats.shared_bytes(128, 128) - plain.shared_bytes(128, 128) == 2 * 2 * 64 * 4
    with pytest.raises(ValueError, match="stats_in_smem must be a bool"):
        attention_ws.DkdvWsConfig(64, 2, stats_in_smem=1)


def test_atomic_dq_dkdv_config_checks(monkeypatch):
    # the warp-specialized dK/dV kernel's atomic-dQ mode (TMA reductions): a bool, block_m 64,
    # refused with deterministic=True (and its absence with False); its staging tiles counted
    from tilesparse.kernels import attention_ws

    with pytest.raises(ValueError, match="atomic_dq must be a bool"):
        attention_ws.DkdvWsConfig(atomic_dq=1)
    with pytest.raises(ValueError, match="atomic_dq needs block_m=64"):
        attention_ws.DkdvWsConfig(32, atomic_dq=True)
    plain, atomic = attention_ws.DkdvWsConfig(consumers=2), attention_ws.DkdvWsConfig(consumers=2, atomic_dq=True)
    # two staging tiles per consumer, and the scratch that transposes dS
    assert atomic.shared_bytes(128, 128) - plain.shared_bytes(128, 128) == 2 * 2 * 64 * 64 * 4 + 128 * 64 * 2
    assert atomic.shared_bytes(128, 128) <= 227 * 1024
    deeper = attention_ws.DkdvWsConfig(consumers=2, stages=3, stats_in_smem=True, atomic_dq=True)
    assert deeper.shared_bytes(128, 128) > 227 * 1024  # (ptxas: 247 KB)
    # shared_ds: half of D per consumer's staging tiles, two dSᵀ tiles; sm_90 compiled 230,848 B
    shared = attention_ws.DkdvWsConfig(consumers=2, stats_in_smem=True, atomic_dq=True, shared_ds=True)
    assert 230848 <= shared.shared_bytes(128, 128) <= 232448
    for bad in (dict(shared_ds=True), dict(shared_ds=True, atomic_dq=True), dict(shared_ds=1, atomic_dq=True,
                                                                                consumers=2)):
        with pytest.raises(ValueError, match="shared_ds"):
            attention_ws.DkdvWsConfig(**bad)
    monkeypatch.setattr(attention_ws, "hopper_reason", lambda t: None)
    q = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
    assert attention_ws.ws_supported(q, q, q, q, 128, atomic) is None
    for deterministic, cfg, match in ((True, atomic, "needs deterministic=False"),
                                      (False, plain, "needs atomic_dq=True")):
        with pytest.raises(ValueError, match=match):
            kernels._check_config(cfg, attention_ws.DkdvWsConfig, "configs[0]", "dK/dV", q, q, q, q, 128,
                                  deterministic)
    assert kernels._check_config(atomic, attention_ws.DkdvWsConfig, "configs[0]", "dK/dV", q, q, q, q, 128, False)
    # one consumer of 8 warps at blocks of 128 would repeat dQ's product in both warpgroups
    why = attention_ws.ws_supported(q, q, q, q, 128, attention_ws.DkdvWsConfig(atomic_dq=True))
    assert why is not None and "a warpgroup per consumer" in why
    assert attention_ws.ws_supported(q, q, q, q, 64, attention_ws.DkdvWsConfig(atomic_dq=True)) is None
    with pytest.raises(ValueError, match="has no atomic-dQ mode"):
        kernels._check_config(attention_ws.DqWsConfig(), attention_ws.DqWsConfig, "configs[1]", "dQ", q, q, q, q, 128,
                              False)


def test_fa3_order_register_split_and_staged_store_checks():
    # FlashAttention-3's order is a mode of the shared-dS tile (not with the other overlap);
    # the consumers' registers: multiples of 8, and two consumers plus the producer within
    # three warpgroups of 168
    from tilesparse.kernels.attention_ws_base import DkdvWsConfig

    shared = dict(consumers=2, stats_in_smem=True, atomic_dq=True, shared_ds=True)
    cfg = DkdvWsConfig(**shared, fa3_order=True, mma_regs=240, load_regs=24)
    assert cfg.fa3_order and cfg.shared_bytes(128, 128) == DkdvWsConfig(**shared).shared_bytes(128, 128)
    for bad in (dict(fa3_order=True), dict(consumers=2, atomic_dq=True, fa3_order=True),
                dict(shared, fa3_order=True, overlap=True)):
        with pytest.raises(ValueError, match="fa3_order needs shared_ds=True and overlap=False"):
            DkdvWsConfig(**bad)
    with pytest.raises(ValueError, match="fa3_order must be a bool"):
        DkdvWsConfig(**shared, fa3_order=1)
    for regs in (236, 16, 264, True, 240.0):
        with pytest.raises(ValueError, match="mma_regs must be a multiple of 8 in 24..256"):
            DkdvWsConfig(mma_regs=regs)
    with pytest.raises(ValueError, match="2 \\* mma_regs \\+ load_regs must be <= 504"):
        DkdvWsConfig(consumers=2, mma_regs=240, load_regs=40)
    with pytest.raises(ValueError, match="mma_regs applies to two consumers"):
        DkdvWsConfig(mma_regs=240)  # one consumer is the default partition: nothing to set
    # staged_stores reuses the atomic-dQ staging tiles: no shared memory of its own
    staged = DkdvWsConfig(**shared, staged_stores=True)
    assert staged.shared_bytes(128, 128) == DkdvWsConfig(**shared).shared_bytes(128, 128)
    with pytest.raises(ValueError, match="staged_stores needs atomic_dq=True"):
        DkdvWsConfig(consumers=2, staged_stores=True)
    with pytest.raises(ValueError, match="staged_stores must be a bool"):
        DkdvWsConfig(**shared, staged_stores="yes")
    with pytest.raises(ValueError, match="host_descs must be a bool"):
        DkdvWsConfig(host_descs=1)
    with pytest.raises(ValueError, match="persistent must be a bool"):
        DkdvWsConfig(persistent=1)
    from tilesparse.kernels.attention_ws_base import DqWsConfig

    assert DqWsConfig(128, 128, 2, host_descs=True).host_descs
    with pytest.raises(ValueError, match="host_descs must be a bool"):
        DqWsConfig(128, 128, 2, host_descs="on")


def test_launch_dkdv_ws_wants_dq_acc_exactly_with_atomic_dq():
    from tilesparse.kernels import attention_ws_dkdv
    from tilesparse.kernels.attention_ws_base import DkdvWsConfig

    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    args = (q, q, q, q, None, None, None, None, None, None, None, 2, 1, 128, False, False, 1.0)
    with pytest.raises(ValueError, match="dq_acc must be given exactly when atomic_dq is set"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(atomic_dq=True))
    with pytest.raises(ValueError, match="dq_acc must be given exactly when atomic_dq is set"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(), dq_acc=torch.zeros(1, 2, 256, 128))
    with pytest.raises(ValueError, match="not both"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(atomic_dq=True), ds=q, dq_acc=torch.zeros(1, 2, 256, 128))
    with pytest.raises(ValueError, match="contiguous float32 tensor of q's shape"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(atomic_dq=True), dq_acc=torch.zeros(1, 2, 256, 128,
                                                                                                dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="stamps: a contiguous int64 tensor of 8 per program"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(), stamps=torch.zeros(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="stamps: a contiguous int64 tensor of 8 per program"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(), stamps=torch.zeros(3, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="ring_stores needs block_m >= block_size / consumers"):
        attention_ws_dkdv.launch_dkdv_ws(*args, DkdvWsConfig(consumers=1, ring_stores=True))


def test_ring_stores_config_checks():
    from tilesparse.kernels.attention_ws_base import DkdvWsConfig

    with pytest.raises(ValueError, match="ring_stores: not with staged_stores"):
        DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, staged_stores=True, ring_stores=True)
    with pytest.raises(ValueError, match="ring_stores: not with staged_stores"):
        DkdvWsConfig(64, 2, consumers=2, persistent=True, ring_stores=True)
    with pytest.raises(ValueError, match="and stages >= consumers"):
        DkdvWsConfig(64, 1, consumers=2, ring_stores=True)
    with pytest.raises(ValueError, match="ring_stores must be a bool"):
        DkdvWsConfig(ring_stores=1)
    assert DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=True, ring_stores=True).ring_stores
    from tilesparse.kernels.attention_ws_base import DqWsConfig

    assert DqWsConfig(128, 128, 2, consumers=2, staged_stores=True).staged_stores
    with pytest.raises(ValueError, match="staged_stores must be a bool"):
        DqWsConfig(128, 128, 2, staged_stores=1)
    from tilesparse.kernels.attention_ws_base import FwdWsConfig

    assert FwdWsConfig(128, 128, 2, persistent=True, staged_stores=True).staged_stores
    with pytest.raises(ValueError, match="staged_stores needs persistent=True"):
        FwdWsConfig(128, 128, 2, staged_stores=True)
    from tilesparse.kernels.attention_ws_persistent import launch_fwd_ws_persistent

    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="staged_stores stores O through Q's buffers: out must be torch.bfloat16"):
        launch_fwd_ws_persistent(q, q, q, torch.zeros(1, 2, 256, 128), None, None, None, None, 2, 1, 128, False, False,
                                 1.0, FwdWsConfig(128, 128, 2, persistent=True, staged_stores=True))


def test_stamp_tables_are_checked():
    from tilesparse.kernels._stamps import check_stamps

    check_stamps(torch.zeros(6, 8, dtype=torch.int64), (2, 3), False, torch.device("cpu"))
    with pytest.raises(ValueError, match="on cuda"):
        check_stamps(torch.zeros(6, 8, dtype=torch.int64), (2, 3), False, torch.device("cuda"))
    with pytest.raises(ValueError, match="persistent=True"):
        check_stamps(torch.zeros(6, 8, dtype=torch.int64), (2, 3), True, torch.device("cpu"))
    with pytest.raises(ValueError, match="6 programs"):
        check_stamps(torch.zeros(5, 8, dtype=torch.int64), (2, 3), False, torch.device("cpu"))


def test_atomic_dq_defaults_only_where_listed(monkeypatch):
    # deterministic=False: the dK/dV default adds dQ by TMA reductions only for listed keys
    # in the mode listed; never a warp-specialized dQ config then (no dQ kernel)
    from tilesparse.kernels import attention_ws

    monkeypatch.setattr(attention_ws, "hopper_reason", lambda t: None)
    monkeypatch.setattr(attention_ws, "_ATOMIC_DQ_DEFAULTS", {})
    q = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
    assert attention_ws.default_config("dkdv", q, q, q, q, 128, deterministic=False) is None
    assert attention_ws.default_config("dq", q, q, q, q, 128, deterministic=False) is None
    assert attention_ws.default_config("fwd", q, q, q, q, 128, deterministic=False) is not None
    assert not attention_ws.default_config("dkdv", q, q, q, q, 128).atomic_dq
    monkeypatch.setattr(attention_ws, "_ATOMIC_DQ_DEFAULTS", {("dkdv", 128, 128): {}})
    cfg = attention_ws.default_config("dkdv", q, q, q, q, 128, deterministic=False)
    assert cfg is not None and cfg.atomic_dq and cfg.consumers == 2 and not cfg.shared_ds
    monkeypatch.setattr(attention_ws, "_ATOMIC_DQ_DEFAULTS", {("dkdv", 128, 128): {"shared_ds": True}})
    cfg = attention_ws.default_config("dkdv", q, q, q, q, 128, deterministic=False)
    assert cfg.atomic_dq and cfg.shared_ds and cfg.stats_in_smem
    q64 = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)  # D 64 not listed: the Triton kernel's atomics
    assert attention_ws.default_config("dkdv", q64, q64, q64, q64, 128, deterministic=False) is None


def test_shipped_atomic_dq_defaults(monkeypatch):
    # the measured modes: at D 128 shared dS in FlashAttention-3's order, dK / dV through the
    # Q / dO ring and host descriptors; at D 64 the plain mode, stats in shared memory, staged
    # stores; both launched balanced
    from tilesparse.kernels import attention_ws

    monkeypatch.setattr(attention_ws, "hopper_reason", lambda t: None)
    q = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
    cfg = attention_ws.default_config("dkdv", q, q, q, q, 128, deterministic=False)
    assert cfg.atomic_dq and cfg.shared_ds and cfg.stats_in_smem and cfg.consumers == 2
    assert cfg.fa3_order and cfg.ring_stores and cfg.host_descs and (cfg.mma_regs, cfg.load_regs) == (240, 24)
    assert not cfg.persistent and cfg.balanced
    # deterministic: both backward kernels with host-built descriptors, launched balanced, at D 128 and 64
    for kind in ("dkdv", "dq"):
        cfg = attention_ws.default_config(kind, q, q, q, q, 128)
        assert cfg.host_descs and cfg.balanced
    q64 = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    cfg = attention_ws.default_config("dkdv", q64, q64, q64, q64, 128, deterministic=False)
    assert cfg.atomic_dq and not cfg.shared_ds and cfg.stats_in_smem and not cfg.overlap and cfg.consumers == 2
    assert cfg.staged_stores and cfg.host_descs and cfg.balanced and not cfg.fa3_order
    for kind in ("dkdv", "dq"):
        cfg = attention_ws.default_config(kind, q64, q64, q64, q64, 128)
        assert cfg.host_descs and cfg.balanced
    assert not attention_ws.default_config("dkdv", q64, q64, q64, q64, 128).atomic_dq  # deterministic: unchanged
    assert attention_ws.default_config("dq", q, q, q, q, 128, deterministic=False) is None


def test_plan_signature_tells_apart_what_the_kernel_choice_reads():
    # the launchers remember their kernel choice per operand signature: dtype, shape, strides
    # and 16-byte alignment of each operand each give another signature
    from tilesparse.kernels.attention import _operand_signature

    q = torch.randn(1, 2, 64, 32)
    buf = torch.randn(1 * 2 * 64 * 32 + 1)
    shifted = buf[1:].view(1, 2, 64, 32)  # base + 4 bytes
    base = _operand_signature(q, q)
    assert base == _operand_signature(torch.randn(1, 2, 64, 32), q)  # other values, same signature
    for other in (q.half(), q[:, :, :32], q.transpose(1, 2).contiguous().transpose(1, 2), shifted):
        assert _operand_signature(other, q) != base


def test_remembered_plan_chooses_once_per_key_and_stays_bounded(monkeypatch):
    monkeypatch.setattr(kernels, "_PLANS", {})
    monkeypatch.setattr(kernels, "_MAX_PLANS", 2)
    chosen = []
    choose = lambda key: lambda: chosen.append(key) or f"plan {key}"  # noqa: E731
    assert kernels._remembered_plan("a", choose("a")) == "plan a"
    assert kernels._remembered_plan("a", choose("a")) == "plan a"
    assert chosen == ["a"]
    kernels._remembered_plan("b", choose("b"))
    kernels._remembered_plan("c", choose("c"))  # full: forgets the others
    assert chosen == ["a", "b", "c"] and len(kernels._PLANS) == 1


def test_a_config_that_cannot_run_raises_every_time_and_is_not_remembered(monkeypatch):
    # errors from checking a chosen config propagate (nothing remembered), also when the
    # launcher would remember plans (CUDA operands; here forced on the CPU)
    from tilesparse.kernels import attention_ws

    monkeypatch.setattr(kernels, "_PLANS", {})
    monkeypatch.setattr(kernels, "_plans_apply", lambda q: True)
    monkeypatch.setitem(attention_ws._WS_DEFAULTS, ("fwd", 16, 32), attention_ws.FwdWsConfig())
    monkeypatch.setattr(attention_ws, "default_config", lambda *args, **kwargs: attention_ws.FwdWsConfig())
    layout = layouts.causal(32, 16)
    q = torch.randn(1, 2, 32, 32)
    for _ in range(2):
        with pytest.raises(ValueError, match="warp-specialized forward kernel"):
            kernels.attention_forward(q, q, q, layout.meta_on("cpu", True), None, 1, 16, True, 0.1)
    assert not kernels._PLANS


@pytest.mark.parametrize("delta,out_aligned", [(True, True), (False, True), (True, False)],
                         ids=["delta", "no-delta", "delta-but-o-unaligned"])
def test_dq_config_with_delta_runs_first_and_replaces_the_delta_kernel(monkeypatch, delta, out_aligned):
    # DqWsConfig.delta: the dQ kernel computes delta from O, so it launches first (given O)
    # and the dK/dV kernel reads what it wrote; the delta kernel is not launched. Without
    # it, or where O's rows are not 16-byte aligned (no TMA descriptor): the delta kernel,
    # dK/dV, then dQ reading delta. (Launchers stubbed: CPU tensors.)
    from tilesparse.kernels import attention_ws

    monkeypatch.setattr(attention_ws, "hopper_reason", lambda t: None)
    calls = []
    monkeypatch.setattr(attention_ws, "launch_dq_ws", lambda *a, out=None, **kw: calls.append(("dq", out, a[5])))
    monkeypatch.setattr(attention_ws, "launch_dkdv_ws", lambda *a, **kw: calls.append(("dkdv", None, a[5])))
    monkeypatch.setattr(kernels, "launch", lambda fn, *a, **kw: calls.append((fn.__name__, None, None)))
    layout = layouts.local(512, 128, 256)
    q, k, v, out, grad = (torch.randn(1, 2, 512, 128, dtype=torch.bfloat16) for _ in range(5))
    if not out_aligned:
        out = torch.randn(1, 2, 512, 129, dtype=torch.bfloat16)[..., :128]
    lse = torch.zeros(1, 2, 512)
    configs = (attention_ws.DkdvWsConfig(64, 2, consumers=2),
               attention_ws.DqWsConfig(128, 128, 2, consumers=2, delta=delta))
    kernels.attention_backward(grad, q, k, v, out, lse, layout.meta_on(q.device), None, 1, 128, False, 0.1,
                               configs=configs)
    names = [name for name, _, _ in calls]
    if delta and out_aligned:
        assert names == ["dq", "dkdv"]
        assert calls[0][1] is out and calls[0][2] is calls[1][2]  # O given; dK/dV reads the delta it wrote
    else:
        assert names == ["_bwd_preprocess_kernel", "dkdv", "dq"] and calls[2][1] is None
