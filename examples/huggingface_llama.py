"""A Llama-style transformers model with block-sparse MLPs, trained a few steps on the
demo corpus (bytes of the Python standard library), then saved and reloaded.

    python examples/huggingface_llama.py            # CPU is fine: a tiny model, ~20 s

Random init from a config: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tilesparse
from tilesparse.demo import corpus
from tilesparse.integrations.huggingface import load_sparse_pretrained, mlp_filter


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def train(model, text: torch.Tensor, steps: int, batch: int = 8, context: int = 64) -> list[float]:
    """AdamW on random windows of ``text`` (uint8 bytes as token ids)."""
    data = text.long()
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
        ids = torch.stack([data[s:s + context] for s in starts.tolist()])
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(steps: int = 30) -> dict:
    model = tiny_llama()
    report = tilesparse.sparsify(model, block_size=16, density=0.25, filter_fn=mlp_filter)
    print(report)
    text = corpus.load(None, 1_000_000).train
    losses = train(model, text, steps)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {steps} steps")
    model.eval()
    prompt = torch.tensor([list(b"def ")])
    generated = model.generate(prompt, max_new_tokens=16, do_sample=False)
    print("greedy continuation:", bytes(generated[0].tolist()))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = load_sparse_pretrained(LlamaForCausalLM, folder, block_size=16, density=0.25)
    reloaded.eval()
    with torch.no_grad():
        same = torch.equal(model(prompt).logits, reloaded(prompt).logits)
    print("reloaded model gives identical logits:", same)
    return {"report": report, "losses": losses, "generated": generated, "reloaded_identical": same}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30, help="training steps, at least 1 (default 30)")
    steps = p.parse_args().steps
    if steps < 1:
        p.error(f"--steps must be at least 1 (the loss before and after is reported), got {steps}")
    main(steps)
