"""Training and evaluation of one demo model, with a progress bar and a learning curve."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .corpus import Corpus, batch


@dataclass
class Curve:
    steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    val_bpc: list[float] = field(default_factory=list)


@torch.no_grad()
def evaluate(model, corpus: Corpus, cfg: dict, device, autocast) -> float:
    """Validation bits per byte on fixed windows (the same for every model and call)."""
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    total = 0.0
    for _ in range(cfg["eval_batches"]):
        x, y = batch(corpus.val, cfg["batch_size"], cfg["context"], gen, device)
        with autocast():
            logits = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1)).item()
    model.train()
    return total / cfg["eval_batches"] / math.log(2)


def train(model, corpus: Corpus, cfg: dict, device, autocast, progress, label: str, seed: int,
          recipe=None) -> Curve:
    """AdamW with linear warm-up and cosine decay; the same data order for every model
    (seeded), so the comparison is step for step. ``recipe`` (optional) has
    ``after_backward(model, step)`` (after clipping) and ``after_step(model, step)``
    hooks, e.g. :class:`tilesparse.demo.recipe24.Semi24Recipe`."""
    steps = cfg["steps"]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    )
    gen = torch.Generator().manual_seed(seed)
    curve = Curve()
    task = progress.add_task(label, total=steps)
    train_time = 0.0
    curve.steps.append(0), curve.wall_s.append(0.0), curve.val_bpc.append(evaluate(model, corpus, cfg, device, autocast))
    for step in range(1, steps + 1):
        x, y = batch(corpus.train, cfg["batch_size"], cfg["context"], gen, device)
        t0 = time.perf_counter()
        with autocast():
            loss = F.cross_entropy(model(x).float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        # backward on this thread, for dense and sparse alike: autograd's CUDA worker thread
        # cost ~330 us of host time per block-sparse layer on an H200 (docs/performance.md)
        with torch.autograd.set_multithreading_enabled(False):
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if recipe is not None:
            recipe.after_backward(model, step)
        opt.step()
        sched.step()
        if recipe is not None:
            recipe.after_step(model, step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_time += time.perf_counter() - t0
        progress.update(task, advance=1, description=f"{label} loss {loss.item() / math.log(2):.3f} bpc")
        if step % cfg["eval_every"] == 0 or step == steps:
            curve.steps.append(step)
            curve.wall_s.append(train_time)
            curve.val_bpc.append(evaluate(model, corpus, cfg, device, autocast))
    return curve
