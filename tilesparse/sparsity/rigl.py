"""RigL for block-sparse layers: drop the weakest blocks, regrow where the gradient is
largest, at constant nnz (Evci et al. 2020, "Rigging the Lottery"; the dynamic-sparsity
TODO of Gray et al. 2017).

Every ``every`` steps, for each :class:`~tilesparse.nn.BlockSparseLinear`:

1. drop the ``n = round(f_t * nnz)`` stored blocks of smallest L2 norm (ties: lower
   storage slot first);
2. grow ``n`` blocks among those inactive *before* the rewire, where the Frobenius norm
   of the dense gradient's block (``block_grad_norms(dY, X)``, never a dense dW) is
   largest (ties: lower row-major block index first; a NaN norm, from an overflowed step, ranks
   below every real one). ``n`` is capped by the number of
   inactive blocks, so a dropped block is never regrown in the same rewire and every
   grown block is new;
3. new blocks start at zero, and so does their optimizer state (every per-block state tensor:
   the weight's shape, Adam's ``exp_avg``/``exp_avg_sq``/``max_exp_avg_sq``, SGD's
   ``momentum_buffer``, ..., or another ``[nnz, ...]`` of its rank, Adafactor's factored
   ``row_var``/``col_var``); kept blocks keep their weights and state, moved to the new
   storage order. The optimizer's state tensors are updated in place.

``f_t`` follows ``schedule``: ``'cosine'`` (RigL's: f/2 (1 + cos(pi t / total_steps))),
``'linear'`` or ``'constant'``; no rewire happens at or after ``total_steps`` (RigL
stops at 75 % of training: pass ``total_steps=int(0.75 * steps)``).

The dense-gradient norms need each layer's dY and X. They are captured by hooks that
exist only during the step before which a rewire is due (forward hook: X, and a tensor
hook on the output: dY), so other steps pay nothing. A layer called several times in a
step (micro-batches, weight sharing) contributes all its calls: the captured rows are
concatenated, so the norms are those of the summed gradient.

The rewire runs on the weights' device with no host sync: ``n`` and nnz are Python
ints, selection is by stable argsort, and the new tables come from
:meth:`BlockLayout.from_mask_with_nnz`.

Usage::

    rigl = RigL(model, optimizer, every=100, drop_fraction=0.3, total_steps=int(0.75 * steps))
    for x, y in data:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        rigl.step()          # after optimizer.step(): rewires when due
        optimizer.zero_grad()
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Union

import torch
import torch.distributed as dist
from torch import nn

from .._counts import check_count
from ..kernels.block_norms import block_grad_norms
from ..layout import BlockLayout
from ..nn import BlockSparseLinear
from .gates import GatedBlockSparseLinear
from .group_lasso import block_norms

__all__ = ["RigL", "rewire"]

_SCHEDULES = ("cosine", "linear", "constant")


def rewire(
    module: BlockSparseLinear,
    grad_norms: torch.Tensor,
    n: int,
    optimizer: torch.optim.Optimizer | None = None,
) -> int:
    """Drop ``n`` weakest blocks of ``module`` and grow ``n`` new ones where ``grad_norms``
    [block_rows, block_cols] is largest among inactive blocks (see the module docstring).
    Returns the number of blocks grown (= dropped): ``min(n, inactive blocks)``."""
    if not isinstance(module, BlockSparseLinear):
        raise TypeError(f"module must be a tilesparse.nn.BlockSparseLinear, got {type(module).__name__}")
    if isinstance(module, GatedBlockSparseLinear):  # as RigL: its gates would stay in the old block order
        raise TypeError("rewire does not take GatedBlockSparseLinear layers (their gates are per stored block)")
    n = check_count("n", n)
    mask = module.layout_mask
    weight = module.weight
    nnz = weight.shape[0]
    rows, cols = mask.shape
    total = rows * cols
    if not isinstance(grad_norms, torch.Tensor) or not grad_norms.is_floating_point():
        raise TypeError("grad_norms must be a floating-point tensor of block gradient norms, got "
                        + (f"dtype {grad_norms.dtype}" if isinstance(grad_norms, torch.Tensor) else type(grad_norms).__name__))
    n = max(0, min(int(n), nnz, total - nnz))
    if n == 0:
        return 0
    if tuple(grad_norms.shape) != (rows, cols):
        raise ValueError(f"grad_norms must have shape {(rows, cols)}, got {tuple(grad_norms.shape)}")
    device = weight.device
    with torch.no_grad():
        coords = module.layout.coords.to(device)
        old_flat = coords[:, 0] * cols + coords[:, 1]
        # Drop: smallest block norms; the stable sort breaks ties by storage slot.
        magnitude = block_norms(weight.detach())
        drop_slots = torch.argsort(magnitude, stable=True)[:n]
        # Grow: largest gradient norms among the blocks inactive now; active ones rank last, below
        # inactive ones whose norm is NaN (an overflowed step's: below every real norm, which is >= 0)
        score = torch.nan_to_num(grad_norms.detach().to(device).flatten(), nan=-1.0)
        score = torch.where(mask.flatten().to(device), torch.full_like(score, -math.inf), score)
        grow_flat = torch.argsort(score, descending=True, stable=True)[:n]

        # index_fill_ with a Python scalar, not `t[idx] = False`: the latter copies the
        # scalar to the GPU first, a host sync (seen on the H200 under sync debug mode).
        new_mask = mask.flatten().to(device).clone()
        new_mask.index_fill_(0, old_flat[drop_slots], False)
        new_mask.index_fill_(0, grow_flat, True)
        layout = BlockLayout.from_mask_with_nnz(new_mask.view(rows, cols), module.block_size, nnz)

        # Old storage slot of every new block, -1 for grown ones.
        slot_of = torch.full((total,), -1, dtype=torch.long, device=device)
        slot_of.index_copy_(0, old_flat, torch.arange(nnz, device=device))
        new_coords = layout.coords
        source = slot_of[new_coords[:, 0] * cols + new_coords[:, 1]]
        kept = (source >= 0).view(-1, 1, 1)
        source = source.clamp(min=0)

        def remap(t: torch.Tensor) -> torch.Tensor:
            return torch.where(kept, t[source], torch.zeros((), dtype=t.dtype, device=t.device))

        if optimizer is not None:
            # every per-block state tensor: the weight's shape (SGD's momentum, Adam's moments) or another
            # [nnz, ...] of its rank (Adafactor's factored [nnz, b, 1] / [nnz, 1, b] variances)
            state = optimizer.state.get(weight, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() == weight.dim() and value.shape[0] == nnz:
                    value.copy_(remap(value))
        module.set_layout(layout, remap(weight.detach()))
    return n


def _distributed() -> bool:
    """Whether a multi-process torch.distributed group is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class RigL:
    """RigL controller for every :class:`BlockSparseLinear` of a model.

    Args:
        model_or_modules: a module (all BlockSparseLinear inside it) or an iterable of
            BlockSparseLinear modules. Gated layers are refused (their gates would need
            rewiring too).
        optimizer: whose per-parameter state is remapped on a rewire (or None).
        every: rewire every ``every`` calls of :meth:`step`.
        drop_fraction: f, the fraction of each layer's blocks replaced at step 0.
        schedule: ``'cosine'``, ``'linear'`` or ``'constant'`` decay of f over total_steps.
        total_steps: the step at which the fraction reaches 0; no rewire at or after it.

    Attributes:
        step_count: calls of :meth:`step` so far.
        history: one dict per rewire: ``step``, ``fraction``, ``changed`` (blocks grown
            = dropped, per layer name), ``flip_rate`` (changed / nnz, per layer name).
    """

    def __init__(
        self,
        model_or_modules: Union[nn.Module, Iterable[BlockSparseLinear]],
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int,
        drop_fraction: float = 0.3,
        schedule: str = "cosine",
        total_steps: int,
    ):
        if isinstance(model_or_modules, BlockSparseLinear):
            modules = {"": model_or_modules}
        elif isinstance(model_or_modules, nn.Module):
            modules = {n: m for n, m in model_or_modules.named_modules() if isinstance(m, BlockSparseLinear)}
        else:
            modules = {}
            for i, m in enumerate(model_or_modules):
                if not isinstance(m, BlockSparseLinear):
                    raise TypeError(f"modules must be BlockSparseLinear, got {type(m).__name__}")
                modules[str(i)] = m
        if not modules:
            raise ValueError("no BlockSparseLinear to rewire")
        for name, m in modules.items():
            if isinstance(m, GatedBlockSparseLinear):
                raise TypeError(f"{name or type(m).__name__}: RigL does not rewire gated layers")
            if type(m.weight).__name__ == "DTensor" or type(m.weight.data).__name__ == "DTensor":
                raise TypeError(f"{name or type(m).__name__}: RigL does not rewire FSDP2-sharded (DTensor) weights "
                                "yet; use DistributedDataParallel, whose ranks RigL keeps in agreement")
        every = check_count("every", every, 1)
        if not 0.0 <= float(drop_fraction) <= 1.0:
            raise ValueError(f"drop_fraction must be in [0, 1], got {drop_fraction!r}")
        if schedule not in _SCHEDULES:
            raise ValueError(f"schedule must be one of {_SCHEDULES}, got {schedule!r}")
        total_steps = check_count("total_steps", total_steps, 1)
        for m in modules.values():
            m.layout.coords  # built (with nonzero's one sync) now, not on the first rewire
        self.modules: dict[str, BlockSparseLinear] = modules
        self.optimizer = optimizer
        self.every = every
        self.drop_fraction = float(drop_fraction)
        self.schedule = schedule
        self.total_steps = total_steps
        self.step_count = 0
        self.history: list[dict] = []
        self._handles: list = []
        self._captured: dict[str, list[list]] = {name: [] for name in modules}
        self._sync_hooks()

    # ----------------------------------------------------------------- schedule
    def fraction(self, step: int) -> float:
        """Drop fraction f_t at ``step``."""
        t = min(max(step, 0), self.total_steps) / self.total_steps
        if self.schedule == "cosine":
            return self.drop_fraction * 0.5 * (1.0 + math.cos(math.pi * t))
        if self.schedule == "linear":
            return self.drop_fraction * (1.0 - t)
        return self.drop_fraction

    def is_rewire_step(self, step: int) -> bool:
        """Whether the ``step``-th call of :meth:`step` (1-based) rewires."""
        return step >= 1 and step % self.every == 0 and step < self.total_steps

    # ----------------------------------------------------------------- hooks
    def _make_hook(self, name: str):
        captured = self._captured[name]

        def hook(module, args, kwargs, output):
            if not torch.is_grad_enabled() or not isinstance(output, torch.Tensor) or not output.requires_grad:
                return
            x = args[0] if args else kwargs.get("x")
            entry = [x.detach().reshape(-1, x.shape[-1]), None]
            captured.append(entry)

            def grad_hook(grad):
                entry[1] = grad.detach().reshape(-1, grad.shape[-1])

            output.register_hook(grad_hook)

        return hook

    def _sync_hooks(self) -> None:
        """Hooks on exactly while the next :meth:`step` call is a rewire."""
        armed = self.is_rewire_step(self.step_count + 1)
        if armed and not self._handles:
            self._handles = [
                m.register_forward_hook(self._make_hook(name), with_kwargs=True) for name, m in self.modules.items()
            ]
        elif not armed and self._handles:
            self.remove_hooks()

    def remove_hooks(self) -> None:
        """Remove the capture hooks and forget captured activations."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for entries in self._captured.values():
            entries.clear()

    def _captured_norms(self, name: str, module: BlockSparseLinear) -> torch.Tensor | None:
        pairs = [(x, dy) for x, dy in self._captured[name] if dy is not None]
        if not pairs:
            return None
        dtype = pairs[0][0].dtype
        for x, dy in pairs:
            dtype = torch.promote_types(dtype, torch.promote_types(x.dtype, dy.dtype))
        x = torch.cat([x.to(dtype) for x, _ in pairs]) if len(pairs) > 1 else pairs[0][0].to(dtype)
        dy = torch.cat([dy.to(dtype) for _, dy in pairs]) if len(pairs) > 1 else pairs[0][1].to(dtype)
        return block_grad_norms(dy, x, module.block_size)

    # ----------------------------------------------------------------- step
    def step(self, grad_norms: Mapping[str, torch.Tensor] | None = None) -> bool:
        """Count one training step; rewire if due. Call after ``optimizer.step()``.

        ``grad_norms`` (optional) maps layer names (keys of :attr:`modules`) to
        [block_rows, block_cols] grow scores that replace the captured ones for those
        layers. Returns whether a rewire happened.
        """
        self.step_count += 1
        step = self.step_count
        if not self.is_rewire_step(step):
            self._sync_hooks()
            return False
        grad_norms = dict(grad_norms or {})
        unknown = set(grad_norms) - set(self.modules)
        if unknown:
            raise KeyError(f"grad_norms for unknown layers {sorted(unknown)}; layers are {sorted(self.modules)}")
        fraction = self.fraction(step)
        changed, flip_rate = {}, {}
        scores = {}
        for name, module in self.modules.items():
            score = grad_norms.get(name)
            if score is None:
                score = self._captured_norms(name, module)
            scores[name] = score
        if _distributed():
            scores = self._agree_across_ranks(scores)
        if all(s is None for s in scores.values()):
            self.remove_hooks()
            self._sync_hooks()
            raise RuntimeError(
                "RigL rewire due but no layer's gradient was captured: call rigl.step() once per "
                "training step, after loss.backward() and optimizer.step()"
            )
        for name, module in self.modules.items():
            if scores[name] is None:  # layer unused this step: left as it is
                changed[name] = 0
            else:
                nnz = module.weight.shape[0]
                changed[name] = rewire(module, scores[name], round(fraction * nnz), self.optimizer)
            nnz = module.weight.shape[0]
            flip_rate[name] = changed[name] / nnz if nnz else 0.0
        self.history.append({"step": step, "fraction": fraction, "changed": changed, "flip_rate": flip_rate})
        self.remove_hooks()
        self._sync_hooks()
        return True

    def _agree_across_ranks(self, scores: dict) -> dict:
        """Under torch.distributed every rank captured its own batch: combine the grow
        scores (root of the summed squared block norms over ranks) so that every rank
        makes the same choice and the layouts stay identical. The weights being
        rewired are already identical (DDP), so the drops agree too."""
        combined = {}
        for name, module in self.modules.items():
            score = scores[name]
            device = module.weight.device
            shape = (module.layout.block_rows, module.layout.block_cols)
            squares = torch.zeros(shape, dtype=torch.float32, device=device) if score is None else \
                score.detach().to(device=device, dtype=torch.float32).square()
            present = torch.tensor([0.0 if score is None else 1.0], device=device)
            dist.all_reduce(squares)
            dist.all_reduce(present)
            combined[name] = squares.sqrt() if present.item() > 0 else None  # rare: a rewire step
        return combined

    @property
    def last_stats(self) -> dict | None:
        """The latest entry of :attr:`history` (None before the first rewire)."""
        return self.history[-1] if self.history else None

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """step_count and history: what a resumed run needs to rewire on the same steps."""
        return {"step_count": self.step_count, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """Restore step_count and history (re-arming the capture hooks if a rewire is next)."""
        self.step_count = int(state["step_count"])
        self.history = list(state.get("history", []))
        self.remove_hooks()
        self._sync_hooks()

    def __repr__(self) -> str:
        return (
            f"RigL(layers={len(self.modules)}, every={self.every}, drop_fraction={self.drop_fraction}, "
            f"schedule={self.schedule!r}, total_steps={self.total_steps}, step_count={self.step_count})"
        )
