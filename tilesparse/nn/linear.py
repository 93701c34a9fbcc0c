"""BlockSparseLinear: a drop-in nn.Linear whose weight is block-sparse."""

from __future__ import annotations

import torch
from torch import nn

from .. import layouts as layout_generators
from .._counts import check_count
from .._checks import check_loaded_mask
from ..layout import BlockLayout
from ..ops.linear_plans import LinearPlans


class _BlockStoredLinear(nn.Module):
    """What a linear layer whose weight is ``b x b`` blocks on a layout needs, whichever
    order it stores them in (BlockSparseLinear: W's; TransposedBlockSparseLinear: Wᵀ's):
    the layout and its mask buffer (named ``MASK_BUFFER``) made with the Parameters, the
    layout following the mask across devices with its tables built on a move, a
    checkpoint's mask checked on load, and nn.Linear's init by each output's actual fan-in
    (``OUT_AXIS``: the layout's axis of the outputs). Subclasses set ``out_features`` and
    ``block_size`` before :meth:`_make_blocks`."""

    MASK_BUFFER = "layout_mask"
    OUT_AXIS = 0
    LAYOUT_WHAT = "block layout"

    def _make_blocks(self, layout: BlockLayout, bias: bool, device, dtype) -> None:
        """The layout (on ``device``), its mask buffer, ``weight`` [nnz, b, b] and ``bias``, initialised."""
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype (the weights are trained), got {dtype!r}")
        factory = {"device": device, "dtype": dtype}
        layout = layout.to(device if device is not None else "cpu")
        self._layout = layout
        self._plans = LinearPlans()  # forwards without autograd, dispatched once per activation shape
        self.register_buffer(self.MASK_BUFFER, layout.mask.clone())
        b = layout.block_size
        self.weight = nn.Parameter(torch.empty(layout.nnz, b, b, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self.reset_parameters()

    @property
    def layout(self) -> BlockLayout:
        """The layout of the stored blocks, on the module's current device."""
        mask = self._buffers.get(self.MASK_BUFFER)  # (nn.Module's __getattr__ costs ~1 µs a call)
        if mask is None:
            mask = getattr(self, self.MASK_BUFFER)
        if self._layout.mask.device != mask.device:
            self._layout = self._layout.to(mask.device)
        return self._layout

    def _apply(self, fn, recurse=True):
        """After ``.to()`` / ``.cuda()``: follow the mask to its device and build the lookup
        tables there now, outside any compiled region. Built lazily inside a
        ``torch.compile(mode="reduce-overhead")`` graph, they would be CUDA-graph outputs
        that a later replay overwrites."""
        result = super()._apply(fn, recurse)
        self._forget_plans()  # they hold the tensors before the move
        if getattr(self, self.MASK_BUFFER).device.type != "meta":  # a meta-device mask has no values to index
            self.layout.meta  # noqa: B018 (builds and caches the tables on the mask's device)
        return result

    def _forget_plans(self) -> None:
        plans = self.__dict__.get("_plans")
        if plans is not None:
            plans.clear()

    def _forward(self, x: torch.Tensor, transposed_storage: bool) -> torch.Tensor:
        """Y = X W^T + bias: from the layer's plans (``tilesparse.ops.linear_plans``) where they apply."""
        plans = self.__dict__.get("_plans")
        if plans is None:  # a module pickled before plans existed
            plans = self._plans = LinearPlans()
        # the Parameters from their dict (nn.Module's __getattr__ costs ~1 µs each, per eager call), unless
        # something else now answers for them (a parametrization's property, an attribute set in their place)
        params = self._parameters
        cls = type(self)
        if getattr(cls, "weight", None) is not None or getattr(cls, "bias", None) is not None:  # (a property)
            weight, bias = self.weight, self.bias
        else:
            weight = params.get("weight")
            if weight is None:  # (moved by a parametrization, or an attribute in its place)
                weight = self.weight
            bias = params["bias"] if "bias" in params else self.bias
        return plans(x, weight, self.layout, bias, transposed_storage)

    def reset_parameters(self) -> None:
        """nn.Linear's init (uniform, bound 1/sqrt(fan_in)) with each output's actual fan-in
        (its stored blocks times b), so the output variance matches a dense layer of the
        same fan-in."""
        b = self.block_size
        with torch.no_grad():
            blocks = getattr(self, self.MASK_BUFFER).sum(dim=1 - self.OUT_AXIS).clamp(min=1)  # per output block
            bound = (blocks * b).to(self.weight.device, torch.float32).rsqrt()
            outputs = self.layout.coords[:, self.OUT_AXIS].to(self.weight.device)
            noise = torch.rand(self.weight.shape, device=self.weight.device, dtype=torch.float32) * 2 - 1
            self.weight.copy_(noise * bound[outputs][:, None, None])
            if self.bias is not None:
                noise = torch.rand(self.out_features, device=self.bias.device, dtype=torch.float32) * 2 - 1
                self.bias.copy_(noise * bound.repeat_interleave(b).to(self.bias.device))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        check_loaded_mask(state_dict, prefix + self.MASK_BUFFER, getattr(self, self.MASK_BUFFER), self.LAYOUT_WHAT)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class BlockSparseLinear(_BlockStoredLinear):
    """y = x W^T + b, with W [out_features, in_features] stored as blocks.

    Give either ``density`` (a random layout with that fraction of blocks) or an explicit
    ``layout`` of shape (out_features, in_features). ``weight`` is a Parameter
    [nnz, b, b]: block i covers rows ``coords[i, 0] * b ...`` and columns
    ``coords[i, 1] * b ...`` of the dense weight. The layout is saved in the state_dict
    as the buffer ``layout_mask``; its lookup tables are built once per device and cached
    on the layout object.
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
        device=None,
        dtype=None,
    ):
        super().__init__()
        block_size = check_count("block_size", block_size, 1)
        in_features = check_count("in_features", in_features, 1)
        out_features = check_count("out_features", out_features, 1)
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if value % block_size:
                raise ValueError(f"{name}={value} is not divisible by block_size={block_size}")
        if layout is None:
            if density is None:
                raise ValueError("give either density or layout")
            layout = layout_generators.random(out_features, in_features, block_size, density, seed=seed)
        else:
            if density is not None:
                raise ValueError("give density or layout, not both")
            if not isinstance(layout, BlockLayout):
                raise TypeError(f"layout must be a tilesparse.BlockLayout, got {type(layout).__name__}")
            if layout.shape != (out_features, in_features):
                raise ValueError(
                    f"layout has shape {layout.shape} but (out_features, in_features) is "
                    f"{(out_features, in_features)}"
                )
            if layout.block_size != block_size:
                raise ValueError(f"layout has block_size={layout.block_size} but block_size={block_size}")
        self.in_features = in_features
        self.out_features = out_features
        self.block_size = block_size
        self._make_blocks(layout, bias, device, dtype)

    # ----------------------------------------------------------------- layout
    def set_layout(self, layout: BlockLayout, values: torch.Tensor) -> None:
        """Swap in a new layout of the same shape and its blocks ``values`` [nnz, b, b]
        (in ``layout.coords`` order), e.g. after a RigL rewire.

        ``weight`` stays the same Parameter object (optimizers keep referencing it): its
        data is overwritten in place when nnz is unchanged, and replaced (``.data =``)
        otherwise. Its ``.grad`` is dropped (set to None): a gradient in the old storage
        order would be wrong for the new one. ``layout_mask`` is updated in place; the
        new layout's cached tables are kept. Nothing here syncs with the host when nnz
        is unchanged and ``layout`` knows its nnz (see
        :meth:`BlockLayout.from_mask_with_nnz`). Optimizer state is the caller's.
        """
        if not isinstance(layout, BlockLayout):
            raise TypeError(f"layout must be a tilesparse.BlockLayout, got {type(layout).__name__}")
        if layout.shape != (self.out_features, self.in_features) or layout.block_size != self.block_size:
            raise ValueError(
                f"layout has shape {layout.shape} and block_size {layout.block_size}, but this module "
                f"needs {(self.out_features, self.in_features)} and {self.block_size}"
            )
        b = self.block_size
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != (layout.nnz, b, b):
            shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise ValueError(f"values must have shape {(layout.nnz, b, b)}, got {shape}")
        weight = self.weight
        with torch.no_grad():
            values = values.to(weight.device, weight.dtype)
            if values.shape == weight.shape:
                weight.copy_(values)
            else:
                weight.data = values.detach().clone().contiguous()
            self.layout_mask.copy_(layout.mask.to(self.layout_mask.device))
        weight.grad = None
        self._layout = layout.to(self.layout_mask.device)
        self._forget_plans()

    # ----------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Y = X W^T + bias with W block-sparse; X [..., in_features]."""
        return self._forward(x, False)

    # ----------------------------------------------------------------- conversions
    def to_dense(self) -> torch.Tensor:
        """The dense [out_features, in_features] weight (a copy, for inspection)."""
        return self.layout.to_dense(self.weight.detach())

    @classmethod
    def from_dense(
        cls, linear: nn.Linear, *, block_size: int, density: float | None = None, layout: BlockLayout | None = None
    ) -> "BlockSparseLinear":
        """Prune an nn.Linear to its blocks on ``layout``, or, given ``density`` instead, to
        that fraction of blocks with the largest L2 norm."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        if (density is None) == (layout is None):
            raise ValueError("give exactly one of density or layout")
        weight = linear.weight.detach()
        if layout is None:
            layout = layout_generators.from_dense(weight, block_size, density)
        module = cls(
            linear.in_features,
            linear.out_features,
            block_size=block_size,
            layout=layout,
            bias=linear.bias is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            module.weight.copy_(module.layout.gather(weight))
            if linear.bias is not None:
                module.bias.copy_(linear.bias.detach())
        return module

    def extra_repr(self) -> str:
        """Sizes, block size, density and stored block count, for print(module)."""
        layout = self._layout
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"block_size={self.block_size}, density={layout.density:.3f}, nnz_blocks={layout.nnz}, "
            f"bias={self.bias is not None}"
        )
