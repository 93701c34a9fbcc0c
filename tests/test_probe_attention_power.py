"""The power probe's arithmetic (scripts/probes/attention_power.py) on made-up nvidia-smi
output: parsing (N/A and partial lines skipped, hex throttle bits), medians, the power-cap
share and energy per call, against values worked out by hand."""

import pytest

from script_modules import ROOT, load_script


@pytest.fixture(scope="module")
def probe():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "scripts" / "probes"))  # its imports of the folder's modules
        return load_script("scripts/probes/attention_power.py")


def _reading(mhz, watts, capped):
    return {"sm_mhz": mhz, "watts": watts, "power_capped": capped}


def test_parse_skips_what_is_not_a_sample(probe):
    # the suite's query order (tilesparse.bench.env.CLOCK_QUERY): SM clock, power, throttle bits
    text = "1770, 690.5, 0x0000000000000004\n1980, N/A, 0x0\n1980, 120.0, 0x0000000000000000\n1770, 68"
    assert probe.parse_samples(text) == [_reading(1770.0, 690.5, True), _reading(1980.0, 120.0, False)]
    # a last line cut off inside its hex field would read as other bits: dropped, as any unended line
    assert probe.parse_samples("1770, 690.5, 0x0000000000000004\n1770, 688.0, 0x00000000000000") == [
        _reading(1770.0, 690.5, True)]


def test_summary_of_made_up_samples(probe):
    samples = [_reading(1800.0, 600.0, True), _reading(1700.0, 700.0, True), _reading(1900.0, 650.0, False),
               _reading(1750.0, 640.0, False)]
    got = probe.summarize(samples, elapsed_s=2.0, calls=1000)
    assert got["ms_per_call"] == pytest.approx(2.0)
    assert got["watts"] == pytest.approx(645.0)  # median of 600, 640, 650, 700
    assert got["sm_mhz"] == pytest.approx(1775.0)
    assert got["power_capped_share"] == pytest.approx(0.5)  # the SW power cap in two of four
    assert got["mj_per_call"] == pytest.approx(645.0 * 2.0)
    assert got["samples"] == 4


def test_summary_refuses_no_samples(probe):
    with pytest.raises(ValueError, match="samples"):
        probe.summarize([], elapsed_s=1.0, calls=10)


def test_pattern_methods_builds_the_suites_calls(capsys):
    # attention_inputs.pattern_methods (the probes' shared setup): each method's (forward,
    # forward + backward) on a suite pattern, built as the suite builds it; FlexAttention
    # is GPU-only, so on the CPU it is skipped with its reason printed
    import torch

    from tilesparse.attention import block_sparse_attention
    from tilesparse.bench.attention import build_layout, suite_patterns

    inputs = load_script("scripts/probes/attention_inputs.py")
    *_, specs = suite_patterns()
    q, k, v, g = (torch.randn(1, 2, 64, 16, dtype=torch.float32) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    got = dict(inputs.pattern_methods(specs["random10"], ["tilesparse", "flex"], q, k, v, g, 16))
    assert list(got) == ["tilesparse"]
    assert "flex random10: FlexAttention is timed on the GPU only" in capsys.readouterr().out
    layout = build_layout(specs["random10"], 64, 16, 2)
    forward, forward_backward = got["tilesparse"]
    assert torch.equal(forward(), block_sparse_attention(q, k, v, layout).detach())
    grads = forward_backward()
    assert len(grads) == 3 and all(gr.shape == t.shape for gr, t in zip(grads, (q, k, v)))
