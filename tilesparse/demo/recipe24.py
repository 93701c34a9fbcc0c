"""The 2:4 training recipe of the demo's ``gpt24`` model (Hu et al. 2024): masked decay on
the gradients of the pruned weights every step, transposable masks recomputed every few
steps (``SemiSparseLinear.step``), and dense fine-tuning over the last steps."""

from __future__ import annotations

from torch import nn

from ..semi24 import SemiSparseLinear


class Semi24Recipe:
    """Hooks for :func:`tilesparse.demo.train.train`. ``decay``: the masked-decay factor
    added to the pruned weights' gradients (``apply_masked_decay_``); the last
    ``dense_fraction`` of ``steps`` train dense (``densify``). ``flip_rates`` records
    (step, mean flip rate) at every mask update."""

    def __init__(self, steps: int, *, decay: float = 2e-4, dense_fraction: float = 0.15):
        if not 0.0 <= dense_fraction < 1.0:
            raise ValueError(f"dense_fraction must be in [0, 1), got {dense_fraction}")
        self.decay = decay
        self.switch = max(1, round(steps * (1.0 - dense_fraction)))  # the first dense step follows this one
        self.flip_rates: list[tuple[int, float]] = []

    @staticmethod
    def layers(model: nn.Module) -> list[SemiSparseLinear]:
        return [m for m in model.modules() if isinstance(m, SemiSparseLinear)]

    def after_backward(self, model: nn.Module, step: int) -> None:
        """Masked decay while sparse (the training loop calls it after clipping, before the optimizer step)."""
        if step <= self.switch and self.decay:
            for layer in self.layers(model):
                if layer.weight.grad is not None:
                    layer.apply_masked_decay_(self.decay)

    def after_step(self, model: nn.Module, step: int) -> None:
        """Count the step (masks recomputed every ``mask_every``); densify at the switch."""
        layers = self.layers(model)
        if step < self.switch:
            if any([layer.step() for layer in layers]):
                self.flip_rates.append((step, sum(layer.flip_rate for layer in layers) / len(layers)))
        elif step == self.switch:
            for layer in layers:
                layer.densify()
