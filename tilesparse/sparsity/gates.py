"""Per-block gates: a scalar per stored block that multiplies it (the original's ``gate``).

The gate is applied to the values before the product, ``W_i * g_i``, so the kernels are
untouched: the gated product is ``block_sparse_linear(x, weight * g[:, None, None], ...)``
and autograd gives ``dL/dg_i = <dL/dW_i', W_i>`` and ``dL/dW_i = g_i dL/dW_i'`` (W' the
gated weight). A block whose gate is exactly 0 contributes exactly nothing, and gets no
weight gradient, but its gate still gets a gradient and may reopen.

Learned sparsity uses :class:`HardConcreteGate` (Louizos, Welling & Kingma 2018,
"Learning Sparse Neural Networks through L0 Regularization"): a stochastic gate in
[0, 1] that is exactly 0 or 1 with positive probability, whose expected number of open
gates (:meth:`HardConcreteGate.l0_penalty`) is differentiable. After training,
:meth:`GatedBlockSparseLinear.to_block_sparse` drops the closed blocks from the layout.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import nn

from .._counts import check_count
from ..layout import BlockLayout
from ..nn import BlockSparseLinear
from ..ops.bsmm import block_sparse_linear

__all__ = ["gated_block_sparse_linear", "GatedBlockSparseLinear", "HardConcreteGate", "l0_penalty"]


def gated_block_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    gates: torch.Tensor,
    layout: BlockLayout,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Y = X (W * g)^T + bias, block i of ``weight`` [nnz, b, b] scaled by ``gates[i]``."""
    if not isinstance(gates, torch.Tensor) or gates.shape != (weight.shape[0],):
        shape = tuple(gates.shape) if isinstance(gates, torch.Tensor) else type(gates).__name__
        raise ValueError(f"gates must have shape ({weight.shape[0]},) (one per stored block), got {shape}")
    # The gate takes the weight's dtype: a float32 gate on a bfloat16 weight would promote
    # the product to float32 and then fail the dtype check against x.
    return block_sparse_linear(x, weight * gates.to(weight.dtype)[:, None, None], layout, bias)


# --------------------------------------------------------------------------- hard concrete


class HardConcreteGate(nn.Module):
    """``n`` hard-concrete gates (Louizos et al. 2018, the L0 relaxation).

    Training (``forward`` in train mode, or :meth:`sample`)::

        u ~ U(0, 1);  s = sigmoid((log u - log(1 - u) + log_alpha) / beta)
        z = clamp(s * (zeta - gamma) + gamma, 0, 1)

    Evaluation (:meth:`deterministic`, the paper's test-time estimator)::

        z = clamp(sigmoid(log_alpha) * (zeta - gamma) + gamma, 0, 1)

    :meth:`l0_penalty` is the expected number of nonzero gates,
    ``sum_i sigmoid(log_alpha_i - beta * log(-gamma / zeta))``.

    Args:
        n: number of gates (the layer's stored blocks).
        droprate_init: initial probability-like drop rate; ``log_alpha`` starts at
            ``log(1 - d) - log(d)`` (the paper's parametrisation). The default 0.1 starts
            with every test-time gate at 0.98, close to the ungated layer.
        beta: temperature (2/3 in the paper).
        limits: the stretch interval (gamma, zeta) = (-0.1, 1.1).
    """

    def __init__(
        self,
        n: int,
        *,
        droprate_init: float = 0.1,
        beta: float = 2 / 3,
        limits: tuple[float, float] = (-0.1, 1.1),
        eps: float = 1e-6,
        device=None,
        dtype=None,
    ):
        super().__init__()
        n = check_count("n (the number of gates)", n)
        if not 0.0 < droprate_init < 1.0:
            raise ValueError(f"droprate_init must be in (0, 1), got {droprate_init!r}")
        if beta <= 0:
            raise ValueError(f"beta must be positive, got {beta!r}")
        gamma, zeta = limits
        if not (gamma < 0.0 and zeta > 1.0):
            raise ValueError(f"limits must be (gamma < 0, zeta > 1), got {limits!r}")
        self.n = n
        self.beta = float(beta)
        self.gamma, self.zeta = float(gamma), float(zeta)
        self.eps = float(eps)
        self.droprate_init = float(droprate_init)
        self.log_alpha = nn.Parameter(torch.empty(n, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """log-alpha from droprate_init: each gate starts open with probability about 1 - droprate_init."""
        d = self.droprate_init
        with torch.no_grad():
            self.log_alpha.fill_(math.log(1 - d) - math.log(d))

    def _stretch(self, s: torch.Tensor) -> torch.Tensor:
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """One stochastic draw of the gates [n] (reparametrised: differentiable in log_alpha)."""
        u = torch.rand(self.log_alpha.shape, generator=generator, device=self.log_alpha.device)
        u = u.to(self.log_alpha.dtype) * (1 - 2 * self.eps) + self.eps  # keep log(u), log(1-u) finite
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + self.log_alpha) / self.beta)
        return self._stretch(s)

    def deterministic(self) -> torch.Tensor:
        """The test-time gates [n]: clamp(sigmoid(log_alpha) * (zeta - gamma) + gamma, 0, 1)."""
        return self._stretch(torch.sigmoid(self.log_alpha))

    def forward(self) -> torch.Tensor:
        """Gate values [n]: sampled (stretched, clipped) in training, the deterministic test-time gates in eval."""
        return self.sample() if self.training else self.deterministic()

    def prob_open(self) -> torch.Tensor:
        """P(gate_i != 0) for every gate [n]."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log(-self.gamma / self.zeta))

    def l0_penalty(self) -> torch.Tensor:
        """Expected number of open gates (differentiable in log_alpha)."""
        return self.prob_open().sum()

    def extra_repr(self) -> str:
        """Number of gates and the hard-concrete hyperparameters, for print(module)."""
        return f"n={self.n}, beta={self.beta:.4g}, limits=({self.gamma:g}, {self.zeta:g})"


def l0_penalty(model: nn.Module) -> torch.Tensor:
    """Sum of :meth:`HardConcreteGate.l0_penalty` over every gate in ``model``."""
    gates = [m for m in model.modules() if isinstance(m, HardConcreteGate)]
    if not gates:
        raise ValueError(f"{type(model).__name__} holds no HardConcreteGate")
    return torch.stack([g.l0_penalty().float() for g in gates]).sum()


# --------------------------------------------------------------------------- gated module


class GatedBlockSparseLinear(BlockSparseLinear):
    """A :class:`BlockSparseLinear` whose stored blocks are each scaled by a gate.

    ``gate=None`` (default): ``gates`` is an ``nn.Parameter`` [nnz] initialised to 1
    (the layer starts equal to the ungated one). ``gate="hard_concrete"``: a
    :class:`HardConcreteGate` over the blocks, as the submodule ``gate`` (``gates`` is
    None then). Any other ``nn.Module`` whose ``forward()`` returns [nnz] gates works too.

    Other arguments are :class:`BlockSparseLinear`'s. ``weight`` stays the ungated
    values; :meth:`gated_weight` is what the product uses.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        block_size: int,
        density: float | None = None,
        layout: BlockLayout | None = None,
        bias: bool = True,
        seed: int = 0,
        gate: Union[None, str, nn.Module] = None,
        device=None,
        dtype=None,
    ):
        super().__init__(
            in_features,
            out_features,
            block_size=block_size,
            density=density,
            layout=layout,
            bias=bias,
            seed=seed,
            device=device,
            dtype=dtype,
        )
        nnz = self.weight.shape[0]
        if gate is None:
            self.gates = nn.Parameter(torch.ones(nnz, device=device, dtype=dtype))
            self.gate = None
        else:
            if gate == "hard_concrete":
                gate = HardConcreteGate(nnz, device=device)
            elif not isinstance(gate, nn.Module):
                raise TypeError(f"gate must be None, 'hard_concrete' or an nn.Module, got {gate!r}")
            self.register_parameter("gates", None)
            self.gate = gate

    def reset_parameters(self) -> None:
        """Re-draw the weights (as BlockSparseLinear) and open the per-block gate parameters (if any)."""
        super().reset_parameters()
        gates = getattr(self, "gates", None)  # absent while BlockSparseLinear.__init__ runs
        if gates is not None:
            with torch.no_grad():
                gates.fill_(1.0)

    # ----------------------------------------------------------------- gates
    def gate_values(self) -> torch.Tensor:
        """The gates used by the next forward [nnz] (a fresh sample for a stochastic gate
        in training mode)."""
        return self.gates if self.gate is None else self.gate()

    def deterministic_gates(self) -> torch.Tensor:
        """The gates without sampling: the parameter, or the gate's test-time value."""
        if self.gate is None:
            return self.gates
        deterministic = getattr(self.gate, "deterministic", None)
        return deterministic() if deterministic is not None else self.gate()

    def gated_weight(self) -> torch.Tensor:
        """weight * gates, [nnz, b, b] (differentiable in both)."""
        return self.weight * self.gate_values().to(self.weight.dtype)[:, None, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Y = X (gates * W)^T + bias: each stored block scaled by its gate."""
        return gated_block_sparse_linear(x, self.weight, self.gate_values(), self.layout, self.bias)

    # ----------------------------------------------------------------- conversions
    def to_dense(self) -> torch.Tensor:
        """The dense weight the layer computes with (deterministic gates folded in)."""
        gates = self.deterministic_gates().detach().to(self.weight.dtype)
        return self.layout.to_dense(self.weight.detach() * gates[:, None, None])

    @classmethod
    def from_block_sparse(
        cls, module: BlockSparseLinear, *, gate: Union[None, str, nn.Module] = None
    ) -> "GatedBlockSparseLinear":
        """A gated copy of ``module`` (same layout, weight, bias, device and dtype)."""
        if not isinstance(module, BlockSparseLinear):
            raise TypeError(f"module must be a BlockSparseLinear, got {type(module).__name__}")
        weight = module.weight.detach()
        gated = cls(
            module.in_features,
            module.out_features,
            block_size=module.block_size,
            layout=module.layout,
            bias=module.bias is not None,
            gate=gate,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            gated.weight.copy_(weight)
            if module.bias is not None:
                gated.bias.copy_(module.bias.detach())
        gated.train(module.training)
        return gated

    def to_block_sparse(self, threshold: float = 0.0) -> BlockSparseLinear:
        """A plain BlockSparseLinear with the (deterministic) gates folded into the weight
        and the blocks whose ``|gate| <= threshold`` removed from the layout. With the
        default threshold 0 its output equals this layer's in eval mode."""
        gates = self.deterministic_gates().detach()
        keep = gates.abs() > threshold
        folded = self.weight.detach() * gates.to(self.weight.dtype)[:, None, None]
        mask = torch.zeros_like(self.layout_mask)
        coords = self.layout.coords.to(mask.device)[keep.to(mask.device)]
        mask[coords[:, 0], coords[:, 1]] = True
        # Storage order is row-major over blocks, so the kept blocks keep their order.
        module = BlockSparseLinear(
            self.in_features,
            self.out_features,
            block_size=self.block_size,
            layout=BlockLayout(mask, self.block_size),
            bias=self.bias is not None,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        with torch.no_grad():
            module.weight.copy_(folded[keep.to(folded.device)])
            if self.bias is not None:
                module.bias.copy_(self.bias.detach())
        module.weight.requires_grad_(self.weight.requires_grad)
        module.train(self.training)
        return module

    def extra_repr(self) -> str:
        """Adds the gate kind to BlockSparseLinear's description."""
        kind = "parameter" if self.gate is None else type(self.gate).__name__
        return f"{super().extra_repr()}, gates={kind}"
