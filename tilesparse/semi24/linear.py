"""SemiSparseLinear: a drop-in nn.Linear trained with a 2:4 semi-structured mask.

The layer keeps dense master weights W (a Parameter) and a bool mask M (a buffer,
recomputed from |W| every ``mask_every`` calls of :meth:`SemiSparseLinear.step`):

* fprop  Y  = X (W ⊙ M)^T + b
* bprop  dX = dY (W ⊙ M)            (needs (W ⊙ M)^T 2:4 for a sparse product: the
  transposable mask, ``transposable=True``, makes it so)
* updat  dW = dY^T X, dense: the straight-through estimator (STE), plus the SR-STE term
  ``srste_decay * (1 - M) ⊙ W`` when ``srste_decay > 0`` (Zhou et al. 2021, "Learning
  N:M fine-grained structured sparse neural networks from scratch", Eq. 4).

Hu et al. 2024 ("Accelerating Transformer Pre-training with 2:4 Sparsity", ICML; their
code: huyz2023/2by4-pretrain, sparse/decay.py) apply the same masked term to the
*gradient* once per optimizer step, ``grad += decay * (1 - M) ⊙ W`` (so that Adam
normalizes it), rather than to the weights: :meth:`SemiSparseLinear.apply_masked_decay_`,
called between ``backward()`` and ``optimizer.step()``. SR-STE through ``srste_decay``
adds the term in every backward (so k accumulated micro-batches add it k times);
``apply_masked_decay_`` adds it once.

On a CUDA GPU with sparse tensor cores (sm80+) and cuSPARSELt in the PyTorch build, fp16
and bf16 products run on ``torch._cslt_sparse_mm`` with the masked weight compressed by
``torch._cslt_compress`` once per weight/mask change (eager mode; under torch.compile
the op compresses per call); :mod:`tilesparse.semi24.dispatch` picks sparse or dense per
problem by timing both once (``mode="auto"``). Anything else runs the dense masked
product, with a one-time warning saying why. The CPU runs the dense masked reference.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch import nn
from torch.nn import functional as F

from .._counts import check_count
from . import dispatch as _dispatch
from .cusparselt import cslt_algorithm, cslt_product, sparse_unavailable_reason
from .functional import _is_tile24, _masked, _warn_once, semi24_linear
from .packing import compress_pair
from .value_map import learned_in_one_pass, maps_for, use_value_maps

__all__ = ["SemiSparseLinear", "cslt_algorithm", "semi24_linear", "sparse_unavailable_reason"]

# Learning a value map costs about one compression per orientation once a map of that
# shape has been decoded row-major (the first: ~3 compressions and ~11 ms per 16384x4096
# orientation on the H200, once per process), and is then done at a mask's first pack;
# masks that live fewer steps than this keep plain compression.
_MAP_MIN_STEPS = 4

# --------------------------------------------------------------------------- module


class SemiSparseLinear(nn.Module):
    """y = x (W ⊙ M)^T + b, a drop-in nn.Linear with a 2:4 mask M along in_features.

    Args:
        in_features, out_features, bias, device, dtype: as nn.Linear. in_features must be
            a multiple of 4 (and out_features too when ``transposable``).
        transposable: M is 2:4 along rows and columns of every 4x4 tile, so bprop's
            (W ⊙ M)^T is 2:4 as well (default True: what training needs).
        method: ``"optimal"`` or ``"greedy"`` transposable masks (see
            :func:`tilesparse.semi24.transposable_mask`); ignored when not transposable.
        mask_every: :meth:`step` recomputes M from |W| every this many calls.
        srste_decay: SR-STE's λ: adds ``λ (1 - M) ⊙ W`` to W's gradient in every backward.
        mode: ``"auto"`` (time cuSPARSELt against dense once per shape on the GPU),
            ``"sparse"`` or ``"dense"``.

    Buffers (in the state_dict): ``mask`` (bool [out, in]) and ``num_steps`` (int64).
    :attr:`flip_rate` is the fraction of mask entries that changed at the last update.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        transposable: bool = True,
        method: str = "optimal",
        mask_every: int = 100,
        srste_decay: float = 0.0,
        mode: str = "auto",
    ):
        super().__init__()
        in_features = check_count("in_features", in_features, 1)
        out_features = check_count("out_features", out_features, 1)
        if in_features % 4:
            raise ValueError(f"in_features={in_features} must be a multiple of 4 (2:4 groups along it)")
        if transposable and out_features % 4:
            raise ValueError(f"out_features={out_features} must be a multiple of 4 for transposable=True")
        if method not in ("optimal", "greedy"):
            raise ValueError(f"method must be 'optimal' or 'greedy', got {method!r}")
        mask_every = check_count("mask_every", mask_every, 1)
        if isinstance(srste_decay, bool) or not isinstance(srste_decay, numbers.Real) or not srste_decay >= 0:
            raise ValueError(f"srste_decay must be a real number >= 0, got {srste_decay!r}")
        _dispatch.check_mode(mode)
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.transposable = transposable
        self.method = method
        self.mask_every = mask_every
        self.srste_decay = float(srste_decay)
        self.mode = mode
        self.densified = False
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.register_buffer("mask", torch.ones(out_features, in_features, dtype=torch.bool, device=device))
        self.register_buffer("num_steps", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("_flip_rate", torch.zeros((), dtype=torch.float32, device=device), persistent=False)
        self._steps = 0
        self._forget_packs()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's init, then a fresh mask from it (flip rate reset to 0)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)
        self.update_mask()
        self._flip_rate.zero_()

    # ----------------------------------------------------------------- mask
    def compute_mask(self) -> torch.Tensor:
        """The 2:4 mask of the current |W| (not stored)."""
        from . import prune_24_rows, transposable_mask

        w = self.weight.detach()
        if hasattr(w, "full_tensor"):  # FSDP2 shards W between steps; the mask is whole on every rank
            w = w.full_tensor()
        if w.device.type == "meta":
            return self.mask.clone()
        if self.transposable:
            return transposable_mask(w, self.method)
        return prune_24_rows(w)[1]

    @torch.no_grad()
    def update_mask(self) -> None:
        """Recompute M from |W| (no-op once densified) and record the flip rate."""
        if self.densified:
            return
        new = self.compute_mask()
        if self.mask.device.type != "meta":
            self._flip_rate.copy_((new != self.mask).float().mean())
        self.mask.copy_(new)
        self._forget_packs()

    def step(self) -> bool:
        """Count a training step; recompute the mask every ``mask_every`` steps (never once densified).
        Returns whether the mask was recomputed."""
        self.num_steps += 1  # the buffer (checkpointed) and a host mirror: no device sync per step
        self._steps += 1
        if self._steps % self.mask_every == 0 and not self.densified:
            self.update_mask()
            return True
        return False

    @property
    def flip_rate(self) -> float:
        """Fraction of mask entries that changed at the last :meth:`update_mask`
        (Hu et al. 2024's flip rate; 0 once densified)."""
        return float(self._flip_rate)

    def masked_weight(self) -> torch.Tensor:
        """W ⊙ M (a new tensor, attached to the graph)."""
        return _masked(self.weight, self.mask)

    @torch.no_grad()
    def apply_masked_decay_(self, decay: float) -> None:
        """Hu et al. 2024's masked decay on gradients: ``W.grad += decay * (1 - M) ⊙ W``.
        Call once per optimizer step, after backward() and before optimizer.step()."""
        if self.weight.grad is None:
            raise RuntimeError("apply_masked_decay_ needs weight.grad: call it after backward()")
        if hasattr(self.weight, "full_tensor"):
            raise TypeError("apply_masked_decay_ does not take FSDP2-sharded weights (the mask is whole, the "
                            "gradient a shard); use srste_decay=..., which applies the same term inside backward")
        self.weight.grad.add_(torch.where(self.mask, torch.zeros_like(self.weight), self.weight), alpha=decay)

    # ----------------------------------------------------------------- cuSPARSELt cache
    def _forget_packs(self) -> None:
        """Drop the compressed copies and everything learned about the mask (its 2:4
        check, the value maps): after a mask update, densify, a load or a move."""
        self.refresh()
        self._tile24_key, self._tile24_mask, self._tile24 = None, None, False
        self._maps, self._packs_under_mask = None, 0  # semi24.value_map, learned per mask

    def refresh(self) -> None:
        """Forget the packed copies of W and the held W⊙M. Needed only after W was written
        without bumping its version counter (through ``.data``, say) between inference
        calls; training packs on every forward anyway."""
        self._packed_key, self._packed = None, (None, None)
        self._masked_key, self._masked_weight = None, None  # W⊙M for products that run dense

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        self._forget_packs()  # new tensors: a freed block's pointer and version may repeat
        return result

    def _compressed(self):
        """(compressed W⊙M, compressed (W⊙M)^T or None); (None, None) off the sparse GPU
        path. In training they are packed on every forward: the optimizer changes W each
        step anyway, and FSDP2 writes each step's all-gathered W into the same storage
        with its version counter preserved, so a (version, pointer) key would keep stale
        packs. Otherwise (inference, frozen weights) they are kept until the weight or the
        mask changes by version; writes through ``.data`` need :meth:`refresh`."""
        w = self.weight
        if w.device.type != "cuda" or self.mode == "dense" or self.densified or torch.compiler.is_compiling():
            return None, None
        n, k = w.shape
        dtype = self._compute_dtype()
        if sparse_unavailable_reason(w.device, dtype, n, k) is not None:
            return None, None
        key = (w._version, self.mask._version, w.data_ptr(), self.mask.data_ptr(), dtype)
        if self._recompresses_every_step():
            key = None  # training: pack on every forward (see the docstring)
        if key is None or key != self._packed_key:
            mask_key = (self.mask._version, self.mask.data_ptr(), dtype)
            if mask_key != self._tile24_key or self.mask is not self._tile24_mask:  # once per mask
                self._tile24 = self.transposable and bool(_is_tile24(self.mask))
                self._tile24_key, self._tile24_mask = mask_key, self.mask
                self._maps, self._packs_under_mask = None, 0
            with torch.inference_mode(False), torch.no_grad():  # a cache built in inference mode must serve training
                w = w.detach() if w.dtype == dtype else w.detach().to(dtype)  # autocast: the op's cast
                want_t = self.transposable and sparse_unavailable_reason(w.device, dtype, k, n) is None
                self._packs_under_mask += 1
                # learn at the second pack under a mask (the weight changed under it), or, in
                # training, at the first when learning costs about one compression (the shape
                # is known row-major); frozen weights packed once keep their compression
                cheap = key is None and learned_in_one_pass(n, k, dtype, w.device) and (
                    not want_t or learned_in_one_pass(k, n, dtype, w.device))
                if (self._maps is None and self.mask_every >= _MAP_MIN_STEPS and use_value_maps()
                        and (self._packs_under_mask == 2 or (cheap and self._packs_under_mask == 1))):
                    # from now on repack by a gather
                    self._maps = maps_for(self.mask, dtype, want_t) or False
                    if not self._maps:
                        warnings.warn(f"tilesparse.SemiSparseLinear: cuSPARSELt's placement of a {n}x{k} "
                                      f"weight's values could not be learned and verified; it is compressed "
                                      f"again after every update (slower)", stacklevel=3)
                packed, packed_t = self._pack(w, self._maps, want_t)
            self._packed, self._packed_key = (packed, packed_t), key
        return self._packed

    def _dense_masked(self, mode: str, x: torch.Tensor):
        """W⊙M in the compute dtype for a product that will run dense on the GPU (mode
        "dense", or "auto" with fprop decided dense for this batch), so that fprop and
        bprop do not mask W again each (a pass over W that cost ~10 % of a
        8192x4096x4096 fprop on the H200); the weight itself once densified. In training
        it is built per forward; otherwise kept until W or M changes (by version, see
        :meth:`refresh`). None where the product may run sparse (no copy held then)."""
        w = self.weight
        if w.device.type != "cuda" or torch.compiler.is_compiling():
            return None
        dtype = self._compute_dtype()
        if self.densified:
            return w if w.dtype == dtype else None
        runs_dense = mode == "dense"
        if mode == "auto":
            n, k = w.shape
            key = _dispatch.Semi24Dispatcher.key("fprop", max(1, x.numel() // k), n, k, dtype,
                                                 _dispatch.gpu_name(w.device))
            runs_dense = _dispatch.default_dispatcher().lookup(key) == "dense"
        if not runs_dense:
            self._masked_key, self._masked_weight = None, None  # hold no weight-sized copy for nothing
            return None
        if self._recompresses_every_step():  # training: this forward's W, shared by its fprop and bprop only
            with torch.no_grad():
                self._masked_key, self._masked_weight = None, None
                return _masked(w.detach().to(dtype), self.mask)
        key = (w._version, self.mask._version, w.data_ptr(), self.mask.data_ptr(), dtype)
        if key != self._masked_key:
            with torch.inference_mode(False), torch.no_grad():
                self._masked_weight = _masked(w.detach().to(dtype), self.mask)
            self._masked_key = key
        return self._masked_weight

    def _plain_inference(self, x: torch.Tensor, masked: torch.Tensor) -> bool:
        """No gradient to compute, and x already in W⊙M's dtype and device: a plain
        F.linear on the held W⊙M is the whole product."""
        needs_grad = torch.is_grad_enabled() and (
            x.requires_grad or self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad))
        return not needs_grad and x.dtype == masked.dtype and x.device == masked.device

    def _pack(self, w: torch.Tensor, maps, want_t: bool):
        """(compressed W⊙M, compressed (W⊙M)ᵀ or None) of ``w`` (in the compute dtype):
        by the value maps' gather where they exist, else by compression."""
        if not maps:
            return compress_pair(_masked(w, self.mask), transposable=self._tile24, want_t=want_t)
        forward, backward = maps
        if not want_t:
            return forward.pack(w), None
        if backward is not None:
            return forward.pack(w), backward.pack(w)
        return forward.pack(w), torch._cslt_compress(_masked(w, self.mask).t().contiguous())

    def _compute_dtype(self) -> torch.dtype:
        """The dtype the products run in: CUDA autocast's for a float weight (fp32 master
        weights under AMP: the packs are of the cast weight), else the weight's."""
        w = self.weight
        if (w.device.type == "cuda" and torch.is_autocast_enabled("cuda")
                and w.dtype in (torch.float32, torch.float16, torch.bfloat16)):
            return torch.get_autocast_dtype("cuda")
        return w.dtype

    # ----------------------------------------------------------------- training dispatch
    def _recompresses_every_step(self) -> bool:
        """Training on a GPU: the optimizer changes W every step, so every step pays the
        compression of W (and Wᵀ) before its sparse products."""
        w = self.weight
        return (self.training and w.requires_grad and torch.is_grad_enabled() and w.device.type == "cuda"
                and not torch.compiler.is_compiling())

    def _training_choice(self, x: torch.Tensor) -> str:
        """"sparse" or "dense" for a training step of this layer, timed once per problem
        (dispatcher op ``train_step_map``, or ``train_step_compress`` when value maps are
        off): repack W⊙M and (W⊙M)ᵀ as training does plus the sparse fprop and bprop,
        against the dense fprop and bprop. With compression alone (~1.4 ms per 16384x4096
        weight, twice) an FFN block lost on the H200 (ffn_train_step 0.94-0.97x), and auto
        mode trains dense then and says so once; inference and frozen weights keep the
        per-product choice."""
        w = self.weight
        n, k = w.shape
        dtype = self._compute_dtype()
        if sparse_unavailable_reason(w.device, dtype, n, k) is not None:
            return "dense"
        m = max(1, x.numel() // max(1, self.in_features))
        want_t = self.transposable and sparse_unavailable_reason(w.device, dtype, k, n) is None
        inputs = {}

        def data():
            if not inputs:
                a = torch.randn(m, k, device=w.device, dtype=dtype)
                inputs.update(a=a, g=torch.randn(m, n, device=w.device, dtype=dtype),
                              wm=_masked(w.detach().to(dtype), self.mask))
            return inputs["a"], inputs["g"], inputs["wm"]

        def sparse():
            a, g, wm = data()
            if "maps" not in inputs:  # what training would repack with (learned once, not timed)
                inputs["maps"] = maps_for(self.mask, dtype, want_t) if use_value_maps() else None
            packed, packed_t = self._pack(wm, inputs["maps"], want_t)
            cslt_product(packed, a, None)
            if packed_t is not None:
                cslt_product(packed_t, g, None)
            else:
                g @ wm

        def dense():
            a, g, wm = data()
            F.linear(a, wm)
            g @ wm

        op = "train_step_map" if use_value_maps() else "train_step_compress"  # timed with that packing
        choice = _dispatch.default_dispatcher().choose(op, m, n, k, dtype, w.device, sparse, dense)
        if choice == "dense":
            _warn_once(f"mode='auto': training a {n}x{k} 2:4 weight dense, because compressing it every step "
                       f"costs more than its sparse products save (timed once; mode='sparse' forces sparse)")
            return "dense"
        return "sparse"

    # ----------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Y = X (W ⊙ M)^T + b; X [..., in_features]."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x.shape[-1] must be in_features={self.in_features}, got shape {tuple(x.shape)}")
        mode = "dense" if self.densified else self.mode
        if mode == "auto" and self._recompresses_every_step():
            mode = self._training_choice(x)
        masked = self._dense_masked(mode, x)
        if masked is not None and self._plain_inference(x, masked):
            return F.linear(x, masked, self.bias)  # runs dense without autograd: no custom op in between
        packed, packed_t = self._compressed() if mode != "dense" else (None, None)
        decay = 0.0 if self.densified else self.srste_decay
        return semi24_linear(x, self.weight, self.mask, self.bias, srste_decay=decay, mode=mode,
                             packed=packed, packed_t=packed_t, masked=masked)

    # ----------------------------------------------------------------- conversions
    @torch.no_grad()
    def densify(self, as_linear: bool = False):
        """Turn the layer dense for fine-tuning (Hu et al. 2024's dense fine-tuning):
        the mask becomes all ones and stops updating. With ``as_linear=True`` return an
        nn.Linear holding the current dense W (not W ⊙ M) and b instead."""
        if as_linear:
            linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                               device=self.weight.device, dtype=self.weight.dtype)
            linear.weight.copy_(self.weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias)
            return linear
        self.mask.fill_(True)
        self.densified = True
        self._flip_rate.zero_()  # no mask updates from now on
        self._forget_packs()
        return self

    @classmethod
    def from_dense(cls, linear: nn.Linear, **kwargs) -> "SemiSparseLinear":
        """A SemiSparseLinear with ``linear``'s weight and bias and a mask computed from
        them; keyword arguments as the constructor (transposable, method, ...)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                     device=weight.device, dtype=weight.dtype, **kwargs)
        with torch.no_grad():
            module.weight.copy_(weight)
            if linear.bias is not None:
                module.bias.copy_(linear.bias.detach())
            module.update_mask()
            module._flip_rate.zero_()
        return module

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        mask = state_dict.get(prefix + "mask")
        densified = self._check_loaded_mask(mask, prefix + "mask") if mask is not None else None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if densified is not None:
            self.densified = densified  # a densified layer's checkpoint holds the all-ones mask, and nothing else
        self._forget_packs()  # the weight or mask may have changed in place
        if self.num_steps.device.type != "meta":
            self._steps = int(self.num_steps)

    def _check_loaded_mask(self, mask, key: str) -> bool | None:
        """A checkpoint's mask must be a bool 2:4 mask (transposable when the layer is) or all ones (a densified
        layer's): anything else would reach cuSPARSELt's compression, which assumes 2:4 input. Returns whether
        it is all ones; None where that cannot be told (a wrong shape, left to load_state_dict's own message;
        a meta tensor)."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"{key} must be a bool tensor, got "
                            f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__}")
        if tuple(mask.shape) != (self.out_features, self.in_features) or mask.device.type == "meta":
            return None
        if bool(mask.all()):
            return True
        from . import is_24
        if not is_24(mask, self.transposable):
            raise ValueError(f"{key} is not a {'transposable ' if self.transposable else ''}2:4 mask (at most 2 "
                             f"kept of every 4 along rows{' and columns of each 4x4 tile' if self.transposable else ''}"
                             f") nor all ones (a densified layer's)")
        return False

    def extra_repr(self) -> str:
        """Sizes, mask settings and recipe options, for print(module)."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"transposable={self.transposable}, method={self.method!r}, mask_every={self.mask_every}, "
            f"srste_decay={self.srste_decay}, mode={self.mode!r}, densified={self.densified}"
        )
