"""The balanced-stream small-batch kernel (``kernels/bsmm_small_stream.py``) against float64
references under the Triton interpreter: steps over several blocks (b 16 at 64- and
128-deep steps, b 24 on a 32-wide tile) and within blocks (b 32, b 64 in slices of 32),
runs cut among 1 to 64 programs (rows split across programs, programs with nothing, empty
rows at run boundaries and at the end), both table directions, every layout class; its
tables against a direct reading of the rule; and, on a GPU, bf16 against the reference
and bitwise repeatable."""

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, LAYOUT_KINDS, dense_of, make_layout, random_values
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small_stream as stream
from tilesparse.kernels import tuned
from tilesparse.kernels._alloc import arrival_counters
from tolerances import assert_close


def _under_the_interpreter(test):
    for mark in INTERPRETER_MARKS:
        test = mark(test)
    return test


def _check(layout, m, trans, config, dtype=torch.float32, device="cpu"):
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows, device=device).to(dtype)
    values = random_values(layout, dtype, device)
    bias = torch.randn(rows if trans else cols, device=device).to(dtype)
    meta = layout.meta_on(device)
    out = kernels.dds(a, values, meta, bias, layout.block_rows, layout.block_cols, trans, config=config)
    s = dense_of(values, layout)
    expected = a.double().cpu() @ (s.t() if trans else s) + bias.double().cpu()
    assert_close(out, expected, dtype, f"dds {config}")
    return a, values, bias, meta, out


@pytest.mark.parametrize("programs", [1, 3, 7, 64], ids=lambda p: f"p{p}")
@pytest.mark.parametrize("block_size, sub, block_k", [(16, 16, 64), (16, 16, 128), (24, 16, 64), (32, 32, 32),
                                                     (64, 32, 32)],
                         ids=["b16-k64", "b16-k128", "b24-k64", "b32-k32", "b64-s32-k32"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@_under_the_interpreter
def test_stream_matches_the_reference(kind, trans, block_size, sub, block_k, programs):
    # on the CPU a device counts as one SM: programs_per_sm is the number of runs
    layout = make_layout(kind, 5, 3, block_size)
    config = stream.StreamConfig(sub, block_k, 16, num_warps=4, num_stages=2, programs_per_sm=programs)
    _check(layout, 21, trans, config, torch.float16 if kind == "random" else torch.float32)  # 2 row tiles
    assert not arrival_counters(torch.device("cpu"), 1).any(), "the last of a row's programs resets its counter"


@pytest.mark.parametrize("per_lane", [False, True], ids=["spread", "per_lane"])
@_under_the_interpreter
def test_long_and_empty_rows_cut_in_many_runs(per_lane):
    # block-row 0 holds 9 blocks, 1-2 none, 3 one, 4 six, 5-6 none (empty rows inside runs,
    # at their boundaries and past the last step): runs of 1-3 steps over 1-9 programs
    mask = torch.zeros(7, 9, dtype=torch.bool)
    mask[0, :] = True
    mask[3, 4] = True
    mask[4, 1:7] = True
    layout = BlockLayout(mask, 16)
    for programs in (1, 2, 5, 9, 16):
        for trans in (True, False):
            config = stream.StreamConfig(16, 32, 16, 4, 2, programs_per_sm=programs, spread_index=not per_lane)
            _check(layout, 3, trans, config)


def _reference_tables(lengths, steps_of, programs, per_program):
    """Each row's first step; each program's first row: the row its first step continues,
    else the first whose first step lies in its run or later."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + steps_of(n))
    first = []
    for p in range(programs):
        t0 = p * per_program
        inside = [j for j in range(len(lengths)) if starts[j] < t0 < starts[j + 1]]
        later = [j for j in range(len(lengths)) if starts[j] >= t0]
        first.append(inside[0] if inside else (later[0] if later else len(lengths)))
    return starts, first


@pytest.mark.parametrize("tile, block_k", [(16, 64), (16, 16), (64, 32)], ids=["g4", "one", "k2"])
def test_tables_follow_the_rule(tile, block_k):
    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        n_rows = int(torch.randint(1, 12, (1,), generator=gen))
        lengths = torch.randint(0, 6, (n_rows,), generator=gen) * torch.randint(0, 2, (n_rows,), generator=gen)
        ptr = torch.zeros(n_rows + 1, dtype=torch.int32)
        ptr[1:] = torch.cumsum(lengths, 0)
        programs = int(torch.randint(1, 9, (1,), generator=gen))
        bound = stream.step_bound(int(ptr[-1]), n_rows, tile, block_k)
        per_program = max(1, -(-(bound + 1) // programs))
        steps, first = stream.stream_tables(ptr, tile, block_k, programs, per_program)
        steps_of = (lambda n: -(-n // (block_k // tile))) if block_k > tile else (lambda n: n * (tile // block_k))
        want_steps, want_first = _reference_tables(lengths.tolist(), steps_of, programs, per_program)
        assert steps.tolist() == want_steps and first.tolist() == want_first
        assert want_steps[-1] <= bound < programs * per_program  # every row's first step lies in some run


def test_config_is_checked_and_round_trips_through_the_tuned_table():
    cfg = stream.StreamConfig(16, 64, 16, 4, 8, programs_per_sm=6)
    assert tuned.from_json(tuned.to_json(cfg)) == cfg
    assert tuned.to_json(cfg)["kind"] == "small_stream"
    with pytest.raises(ValueError, match="programs_per_sm"):
        stream.StreamConfig(16, 64, 16, 4, 8, programs_per_sm=0)
    with pytest.raises(ValueError, match="programs_per_sm"):
        stream.StreamConfig(16, 64, 16, 4, 8, programs_per_sm=True)
    with pytest.raises(ValueError, match="power of two"):
        stream.StreamConfig(16, 48, 16, 4, 8)
    with pytest.raises(ValueError, match="num_warps"):
        stream.StreamConfig(16, 64, 16, 3, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 4, 16], ids=lambda p: f"p{p}")
@pytest.mark.parametrize("block_size, sub, block_k", [(16, 16, 64), (16, 16, 128), (32, 32, 32), (128, 32, 128)],
                         ids=["b16-k64", "b16-k128", "b32", "b128"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
def test_gpu_stream_matches_the_reference_and_repeats_bitwise(kind, trans, block_size, sub, block_k, programs):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    layout = make_layout(kind, 2048 // block_size, 1024 // block_size, block_size)
    config = stream.StreamConfig(sub, block_k, 32, num_warps=4, num_stages=4, programs_per_sm=programs)
    a, values, bias, meta, out = _check(layout, 37, trans, config, torch.bfloat16, "cuda")
    again = kernels.dds(a, values, meta, bias, layout.block_rows, layout.block_cols, trans, config=config)
    assert torch.equal(out, again), "the cut rows' partials are summed in program order: bitwise repeatable"
    assert not arrival_counters(out.device, 1).any()
