"""Per-dtype tolerances, in one place. Errors are relative Frobenius norms
||out - ref|| / ||ref|| against a float64 reference.

fp32 allows TF32 (the kernels use it unless float32 matmul precision is 'highest');
fp16/bf16 inputs are rounded once, accumulate in fp32, and round the output once.
"""

import torch

REL_TOL = {
    torch.float64: 1e-10,
    torch.float32: 5e-3,  # TF32: 10-bit mantissa inputs
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert torch.isfinite(out).all(), "output has NaN or Inf (unwritten or poisoned elements?)"
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_error(out, ref)
    assert err <= REL_TOL[dtype], f"{what}: relative error {err:.3e} > {REL_TOL[dtype]:.1e} ({dtype})"
