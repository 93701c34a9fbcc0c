"""``sparsify``: replace a model's ``nn.Linear`` modules by :class:`BlockSparseLinear`, in place.

The conversion runs in two passes: a plan (which modules can be converted, and why the
others cannot) and then the replacement. Modules that cannot be converted correctly are
skipped and named in the returned :class:`SparsifyReport`, never converted into
something that computes a different function; ``strict=True`` turns any skip into an
error raised before the model is touched.
"""

from __future__ import annotations

import functools
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Callable, Union

import torch
from torch import nn

from .. import layouts as layout_generators
from .._checks import SUPPORTED_DTYPES
from .._counts import check_count
from ..layout import BlockLayout
from ..layouts._common import check_density
from ..nn import BlockSparseLinear

__all__ = ["sparsify", "SparsifyReport", "ConvertedModule", "convertible_linears", "LAYOUTS"]

LayoutFn = Callable[[int, int, int], BlockLayout]
LAYOUTS = ("magnitude", "random", "balanced")

# Parents that read their nn.Linear children's ``.weight`` directly instead of calling
# them: a block-sparse child would break them (torch 2.13: TransformerEncoderLayer's
# eval/no_grad fast path passes linear1.weight to _transformer_encoder_layer_fwd, which
# raises "2d weights expected"; TransformerEncoder checks the same weights).
# nn.MultiheadAttention's out_proj is caught by the exact-type rule below.
_WEIGHT_READING_PARENTS: dict[type, str] = {
    nn.TransformerEncoderLayer: "its parent nn.TransformerEncoderLayer reads linear1/linear2.weight "
    "directly (inference fast path)",
    nn.MultiheadAttention: "its parent nn.MultiheadAttention reads out_proj.weight directly",
}


@dataclass(frozen=True)
class ConvertedModule:
    """One converted module: its name(s), shape and layout size."""

    name: str
    in_features: int
    out_features: int
    nnz_blocks: int
    total_blocks: int
    aliases: tuple[str, ...] = ()  # other names of the same module object (shared modules)

    @property
    def density(self) -> float:
        """Fraction of the converted weight's blocks that are stored."""
        return self.nnz_blocks / self.total_blocks if self.total_blocks else 0.0


@dataclass
class SparsifyReport:
    """What :func:`sparsify` did.

    converted: name -> :class:`ConvertedModule`, in module order.
    skipped:   name -> reason, for modules that were selected but not converted.
    excluded:  names of nn.Linear modules that ``filter_fn`` rejected.
    """

    block_size: int
    density: float
    layout: str
    converted: dict[str, ConvertedModule] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)

    @property
    def weights_before(self) -> int:
        """Dense weight elements of the converted modules (biases not counted)."""
        return sum(c.in_features * c.out_features for c in self.converted.values())

    @property
    def weights_after(self) -> int:
        """Stored weight elements of the converted modules."""
        return sum(c.nnz_blocks * self.block_size**2 for c in self.converted.values())

    def __str__(self) -> str:
        before, after = self.weights_before, self.weights_after
        share = f" ({after / before:.1%})" if before else ""
        lines = [
            f"sparsify: layout={self.layout}, block_size={self.block_size}, density={self.density:g}",
            f"converted {len(self.converted)} module(s); weights {before:,} -> {after:,}{share}",
        ]
        width = max((len(n) for n in [*self.converted, *self.skipped, *self.excluded]), default=0)
        for c in self.converted.values():
            alias = f"  (also {', '.join(c.aliases)})" if c.aliases else ""
            lines.append(
                f"  {c.name:<{width}}  {c.out_features}x{c.in_features}  "
                f"blocks {c.nnz_blocks}/{c.total_blocks} ({c.density:.3f}){alias}"
            )
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} module(s), left unchanged:")
            lines += [f"  {name:<{width}}  {reason}" for name, reason in self.skipped.items()]
        if self.excluded:
            lines.append(f"excluded by filter_fn: {len(self.excluded)} module(s): {', '.join(self.excluded)}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- planning


@dataclass
class _Site:
    """Every place a module object is reachable from: (parent, attribute) and names."""

    module: nn.Module
    names: list[str] = field(default_factory=list)
    slots: list[tuple[nn.Module, str]] = field(default_factory=list)


def _linear_sites(model: nn.Module) -> dict[int, _Site]:
    """Each nn.Linear (or subclass) of ``model`` by object id, with all its names and slots
    (a module registered twice is replaced at both places)."""
    sites: dict[int, _Site] = {}
    if isinstance(model, nn.Linear):
        sites[id(model)] = _Site(model, [""], [])
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent._modules.items():
            if isinstance(child, nn.Linear):
                site = sites.setdefault(id(child), _Site(child))
                name = f"{parent_name}.{attr}" if parent_name else attr
                if name not in site.names:
                    site.names.append(name)
                if not any(p is parent and a == attr for p, a in site.slots):
                    site.slots.append((parent, attr))
    return sites


def _parameter_names(model: nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _skip_reason(site: _Site, block_size: int, param_names: dict[int, list[str]],
                 divisor_name: str = "block_size") -> str | None:
    """Why this module cannot be converted faithfully (None: it can)."""
    module = site.module
    for parent, _ in site.slots:
        for parent_type, reason in _WEIGHT_READING_PARENTS.items():
            if isinstance(parent, parent_type):
                return reason
    if type(module) is not nn.Linear:
        return (
            f"{type(module).__name__} is a subclass of nn.Linear; only exact nn.Linear is converted "
            "(a subclass may change forward, or its parent may read .weight directly)"
        )
    if not site.slots:
        return "the root module cannot be replaced in place; use BlockSparseLinear.from_dense"
    for dim_name in ("out_features", "in_features"):
        value = getattr(module, dim_name)
        if value % block_size:
            return f"{dim_name}={value} is not divisible by {divisor_name}={block_size}"
    hooks = [
        kind
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        if getattr(module, kind, None)
    ]
    if hooks:
        return f"has {', '.join(h.strip('_') for h in hooks)} (e.g. old-style weight_norm) that would be lost"
    weight = module.weight
    if weight.dtype not in SUPPORTED_DTYPES:
        return f"weight dtype {weight.dtype} is not supported (float16, bfloat16, float32, float64)"
    if weight.device.type == "meta":
        return "weight is on the meta device (no values to prune); materialise the model first"
    own = set(site.names)
    for pname in ("weight", "bias"):
        p = getattr(module, pname)
        if p is None:
            continue
        others = [n for n in param_names.get(id(p), []) if n.rpartition(".")[0] not in own]
        if others:
            return f"{pname} is shared with {', '.join(others)} (tied parameters)"
    return None


def _select(model, block_size, filter_fn, skipped: dict, excluded: list,
            divisor_name: str = "block_size") -> list[_Site]:
    """The convertible nn.Linear sites of ``model``; fills ``skipped`` and ``excluded``."""
    param_names = _parameter_names(model)
    sites = []
    for site in _linear_sites(model).values():
        name = site.names[0]
        if filter_fn is not None and not filter_fn(name, site.module):
            excluded.append(name)
            continue
        reason = _skip_reason(site, block_size, param_names, divisor_name)
        if reason is not None:
            skipped[name] = reason
            continue
        sites.append(site)
    return sites


def convertible_linears(
    model: nn.Module, *, block_size: int, filter_fn: Callable[[str, nn.Module], bool] | None = None
) -> dict[str, nn.Linear]:
    """name -> module of the nn.Linear modules that :func:`sparsify` with these arguments
    would convert (nothing is modified)."""
    sites = _select(model, block_size, filter_fn, {}, [])
    return {site.names[0]: site.module for site in sites}


def _layout_fn(layout: Union[str, LayoutFn], density: float, seed: int):
    """A function (name, linear, block_size) -> BlockLayout, or None for magnitude pruning."""
    if callable(layout):
        return lambda name, linear, b: layout(linear.out_features, linear.in_features, b)
    if layout == "magnitude":
        return None
    if layout in ("random", "balanced"):
        generator = getattr(layout_generators, layout)
        # One seed per module name: a module's layout does not depend on which other
        # modules are converted, and layers of equal shape do not share a layout.
        return lambda name, linear, b: generator(
            linear.out_features, linear.in_features, b, density, seed=_module_seed(seed, name)
        )
    raise ValueError(
        f"layout must be one of {LAYOUTS} or a callable (out_features, in_features, block_size) -> "
        f"BlockLayout, got {layout!r}"
    )


def _module_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode())


def _check_layout(layout, name: str, linear: nn.Linear, block_size: int) -> BlockLayout:
    if not isinstance(layout, BlockLayout):
        raise TypeError(f"layout for {name!r} must be a tilesparse.BlockLayout, got {type(layout).__name__}")
    expected = (linear.out_features, linear.in_features)
    if layout.shape != expected or layout.block_size != block_size:
        raise ValueError(
            f"layout for {name!r} has shape {layout.shape} and block_size={layout.block_size}; "
            f"expected {expected} and block_size={block_size}"
        )
    return layout


# --------------------------------------------------------------------------- conversion


def _convert(linear: nn.Linear, layout: BlockLayout | None, block_size: int,
             density: float) -> tuple[BlockSparseLinear, int, int]:
    """A BlockSparseLinear holding ``linear``'s weight on ``layout`` (magnitude-pruned
    when None), on the same device and dtype; with its stored and total block counts."""
    if layout is None:
        module = BlockSparseLinear.from_dense(linear, block_size=block_size, density=density)
    else:
        module = BlockSparseLinear.from_dense(linear, block_size=block_size, layout=layout)
    return module, module.layout.nnz, module.layout.mask.numel()


def _convert_24(linear: nn.Linear, options: dict) -> tuple[nn.Module, int, int]:
    """A SemiSparseLinear holding ``linear``'s weight and bias, its 2:4 mask from their
    magnitudes; with its kept and total 4x4 tiles' worth of weights (8 of 16 kept)."""
    from ..semi24 import SemiSparseLinear

    tiles = linear.in_features * linear.out_features // 16
    return SemiSparseLinear.from_dense(linear, **options), tiles // 2, tiles


def _replace(report: SparsifyReport, strict: bool, planned: list) -> None:
    """Convert the planned sites: ``planned`` is [(site, build)], ``build(linear) ->
    (module, stored blocks, total blocks)``. With ``strict``, refuse (before touching the
    model) if anything was skipped. Each new module keeps its Linear's requires_grad and
    train/eval mode, replaces it under every name, and is recorded in ``report``."""
    if strict and report.skipped:
        details = "; ".join(f"{n}: {r}" for n, r in report.skipped.items())
        raise ValueError(f"sparsify(strict=True): {len(report.skipped)} module(s) cannot be converted: {details}")
    for site, build in planned:
        linear = site.module
        new, stored, total = build(linear)
        new.weight.requires_grad_(linear.weight.requires_grad)
        if linear.bias is not None:
            new.bias.requires_grad_(linear.bias.requires_grad)
        new.train(linear.training)
        for parent, attr in site.slots:
            setattr(parent, attr, new)
        report.converted[site.names[0]] = ConvertedModule(
            name=site.names[0], in_features=new.in_features, out_features=new.out_features,
            nnz_blocks=stored, total_blocks=total, aliases=tuple(site.names[1:]),
        )


def sparsify(
    model: nn.Module,
    *,
    block_size: int | None = None,
    density: float | None = None,
    layout: Union[str, LayoutFn] = "magnitude",
    filter_fn: Callable[[str, nn.Module], bool] | None = None,
    seed: int = 0,
    strict: bool = False,
    pattern: str = "block",
    semi24_options: dict | None = None,
) -> SparsifyReport:
    """Replace the ``nn.Linear`` modules of ``model`` by :class:`BlockSparseLinear` (or, with
    ``pattern="2:4"``, by :class:`~tilesparse.semi24.SemiSparseLinear`), in place.

    Args:
        model: the model; modified in place (build optimizers afterwards).
        block_size: side b of the square blocks (block pattern only).
        density: fraction of blocks kept in every converted weight (block pattern only).
        layout: how each layout is chosen:
            ``"magnitude"``: the blocks of the dense weight with the largest L2 norm
            (:meth:`BlockSparseLinear.from_dense`);
            ``"random"`` / ``"balanced"``: :func:`tilesparse.layouts.random` /
            :func:`~tilesparse.layouts.balanced`, seeded per module from ``seed`` and the
            module's name; the kept blocks of the dense weight are copied;
            a callable ``(out_features, in_features, block_size) -> BlockLayout``.
        filter_fn: ``(name, module) -> bool``; only modules it accepts are converted
            (default: every nn.Linear). Rejected ones are listed in ``report.excluded``.
        seed: base seed of the random layouts.
        strict: raise ``ValueError`` (before touching the model) if any selected module
            would be skipped.
        pattern: ``"block"`` (default) or ``"2:4"``: semi-structured 2:4 weights trained
            with a dense master copy (STE), masks from the weights' magnitudes
            (transposable by default); ``block_size``, ``density`` and ``layout`` do not
            apply, and both feature counts must be multiples of 4.
        semi24_options: keyword arguments for each SemiSparseLinear (``mask_every``,
            ``srste_decay``, ``method``, ``mode`` ...), with ``pattern="2:4"``.

    Only modules of exact type ``nn.Linear`` are converted. Skipped, with the reason in
    ``report.skipped``: subclasses (e.g. nn.MultiheadAttention's out_proj), children of
    parents that read ``.weight`` directly (nn.TransformerEncoderLayer), features not
    divisible by ``block_size``, modules with hooks, tied weights, unsupported dtypes,
    meta tensors and the root module itself. A module registered under several names is
    converted once and replaced everywhere.

    Each converted module is, on the same device and dtype, exactly the masked dense
    module: its output equals ``x @ (W * mask)^T + b``.
    """
    if pattern == "2:4":
        report, planned = _plan_24(model, block_size, density, layout, filter_fn, semi24_options)
    elif pattern == "block":
        report, planned = _plan_blocks(model, block_size, density, layout, filter_fn, seed, semi24_options)
    else:
        raise ValueError(f"pattern must be 'block' or '2:4', got {pattern!r}")
    _replace(report, strict, planned)
    if report.skipped:
        warnings.warn(
            f"sparsify left {len(report.skipped)} module(s) dense: {', '.join(report.skipped)} "
            "(reasons in the returned report's .skipped)",
            stacklevel=2,
        )
    return report


def _plan_blocks(model, block_size, density, layout, filter_fn, seed, semi24_options):
    """(report, [(site, build)]) for sparsify(pattern="block"): each site's layout chosen
    (and checked) before the model is touched."""
    if semi24_options is not None:
        raise ValueError("semi24_options applies to pattern='2:4' only")
    if density is None or block_size is None:
        raise ValueError("sparsify(pattern='block') needs block_size and density")
    check_density(density)
    block_size = check_count("block_size", block_size, 1)
    make_layout = _layout_fn(layout, density, seed)
    layout_name = layout if isinstance(layout, str) else getattr(layout, "__name__", type(layout).__name__)
    report = SparsifyReport(block_size=block_size, density=float(density), layout=layout_name)

    sites = _select(model, block_size, filter_fn, report.skipped, report.excluded)
    planned = []
    for site in sites:
        name = site.names[0]
        chosen = None
        if make_layout is not None:
            chosen = _check_layout(make_layout(name, site.module, block_size), name, site.module, block_size)
        planned.append((site, functools.partial(_convert, layout=chosen, block_size=block_size, density=density)))
    return report, planned


def _plan_24(model, block_size, density, layout, filter_fn, options):
    """(report, [(site, build)]) for sparsify(pattern="2:4"): every selected nn.Linear
    whose sides are multiples of 4 and whose dtype 2:4 takes."""
    if block_size is not None or density is not None or layout != "magnitude":
        raise ValueError("pattern='2:4' takes no block_size, density or layout (2 of every 4 weights are kept)")
    options = dict(options or {})
    report = SparsifyReport(block_size=4, density=0.5, layout="2:4")
    planned = []
    for site in _select(model, 4, filter_fn, report.skipped, report.excluded, "the 2:4 group size"):
        if site.module.weight.dtype == torch.float64:  # the 2:4 masks and cuSPARSELt take 16/32-bit floats
            report.skipped[site.names[0]] = ("weight dtype torch.float64 is not supported by 2:4 "
                                             "(float16, bfloat16, float32)")
            continue
        planned.append((site, functools.partial(_convert_24, options=options)))
    return report, planned
