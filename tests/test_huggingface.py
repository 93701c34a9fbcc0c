"""The Hugging Face example (examples/huggingface_llama.py) runs: a Llama-style model
built from its config, sparsify on its MLPs, training steps on the demo corpus with the
loss falling, greedy generation, and a save_pretrained / load_sparse_pretrained round
trip that reproduces the logits exactly."""

import pytest
import torch

from script_modules import load_script

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def _example():
    return load_script("examples/huggingface_llama.py")


def test_llama_with_sparse_mlps_trains_generates_and_round_trips():
    result = _example().main(steps=20)
    report = result["report"]
    assert len(report.converted) == 6  # gate, up, down in each of 2 layers; attention untouched
    assert all(".mlp." in name for name in report.converted)
    losses = result["losses"]
    assert losses[-1] < 0.8 * losses[0]
    assert result["generated"].shape == (1, 4 + 16)
    assert result["reloaded_identical"]


def test_loading_into_a_differently_sparsified_model_is_refused(tmp_path):
    from transformers import LlamaForCausalLM

    import tilesparse
    from tilesparse.integrations.huggingface import load_sparse_pretrained, mlp_filter

    example = _example()
    model = example.tiny_llama()
    tilesparse.sparsify(model, block_size=16, density=0.25, filter_fn=mlp_filter)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="layout_mask"):  # blocks of 32 cannot hold a b = 16 layout
        load_sparse_pretrained(LlamaForCausalLM, tmp_path, block_size=32, density=0.25)
    torch.testing.assert_close(
        load_sparse_pretrained(LlamaForCausalLM, tmp_path, block_size=16, density=0.25).lm_head.weight,
        model.lm_head.weight,
    )
