"""block_grad_norms: Frobenius norms of the b x b blocks of dW = dY^T X, never storing dW.

Checked against a float64 brute force (the dense dW, reshaped) for the chunked PyTorch
reference, the Triton kernel under the interpreter (fp32 and fp16 only: the
interpreter's bf16 dot is wrong), and the kernel on CUDA (gpu-marked).

Shape grid (why): odd M (masked M tail), M = 1 and M = 0; b = 16 and 32 (power-of-two
blocks: several blocks share one 64-wide tile, G = 4 / 2) with block grids that are not
multiples of G (masked grid edge); b = 12 and 20 (non-power-of-two: one padded tile per
block, masked in-block tail); b = 64 (G = 1, no padding).
"""

import pytest
import torch

from tilesparse.kernels import block_norms as bn
from tilesparse.sparsity import block_grad_norms
from tolerances import assert_close

# (M, N, K, b)
SHAPES = [
    (37, 64, 96, 16),   # odd M; 4 x 6 grid, G = 4: second column tile half empty
    (5, 48, 80, 16),    # 3 x 5 grid: both edges masked
    (33, 96, 64, 32),   # b = 32, G = 2, 3 x 2 grid
    (1, 32, 160, 32),   # M = 1
    (17, 24, 36, 12),   # non-power-of-two b (tile 16)
    (70, 40, 60, 20),   # non-power-of-two b (tile 32), M spans several tiles
    (9, 128, 64, 64),   # b = 64, G = 1
]


def brute(dy: torch.Tensor, x: torch.Tensor, b: int) -> torch.Tensor:
    dw = dy.double().reshape(-1, dy.shape[-1]).t() @ x.double().reshape(-1, x.shape[-1])
    r, c = dw.shape[0] // b, dw.shape[1] // b
    return dw.reshape(r, b, c, b).pow(2).sum(dim=(1, 3)).sqrt()


def inputs(m, n, k, dtype, device="cpu", strided=False):
    if strided:  # column-major views: stride along features != 1
        return (torch.randn(n, m, device=device).to(dtype).t(), torch.randn(k, m, device=device).to(dtype).t())
    return torch.randn(m, n, device=device).to(dtype), torch.randn(m, k, device=device).to(dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_vs_brute(shape, dtype):
    m, n, k, b = shape
    dy, x = inputs(m, n, k, dtype)
    out = bn.block_grad_norms_reference(dy, x, b)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_close(out, brute(dy, x, b), dtype, "reference")


def test_reference_chunks(monkeypatch):
    # A chunk smaller than one block-row: every block-row is its own chunk.
    monkeypatch.setattr(bn, "_CHUNK_ELEMENTS", 100)
    dy, x = inputs(13, 80, 48, torch.float64)
    assert_close(bn.block_grad_norms_reference(dy, x, 16), brute(dy, x, 16), torch.float64, "chunked")


def test_empty_m_and_dispatch_shapes():
    dy, x = inputs(0, 32, 48, torch.float32)
    assert torch.equal(block_grad_norms(dy, x, 16), torch.zeros(2, 3))
    # Leading dims are flattened: [2, 7, N] and [2, 7, K] -> M = 14.
    dy, x = torch.randn(2, 7, 32, dtype=torch.float64), torch.randn(2, 7, 48, dtype=torch.float64)
    assert_close(block_grad_norms(dy, x, 16), brute(dy, x, 16), torch.float64, "3-d")


def test_errors():
    dy, x = torch.randn(4, 32), torch.randn(4, 48)
    with pytest.raises(ValueError, match="divisible"):
        block_grad_norms(dy, x, 20)
    with pytest.raises(ValueError, match="leading dims"):
        block_grad_norms(dy, x[:3], 16)
    with pytest.raises(TypeError):
        block_grad_norms(dy, x.double(), 16)
    with pytest.raises(ValueError, match="block_size"):
        block_grad_norms(dy, x, 0)


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_interpreter(shape, dtype):
    m, n, k, b = shape
    dy, x = inputs(m, n, k, dtype, strided=(m % 2 == 1))
    out = bn.block_grad_norms_triton(dy, x, b)
    assert out.dtype == torch.float32
    assert_close(out, brute(dy, x, b), dtype, "triton (interpreter)")


@pytest.mark.interpreter
def test_kernel_interpreter_m_zero():
    dy, x = inputs(0, 32, 32, torch.float32)
    assert torch.equal(bn.block_grad_norms_triton(dy, x, 16), torch.zeros(2, 2))


# ----------------------------------------------------------------------------- GPU

GPU_SHAPES = [
    (1, 256, 512, 16),
    (1000, 512, 768, 16),
    (4097, 1024, 512, 32),
    (333, 768, 768, 64),
    (2048, 1024, 2048, 128),
    (129, 96, 120, 24),  # non-power-of-two b
    (65, 512, 768, 256),  # b > 128: the dispatcher takes the chunked reference on CUDA
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_gpu(shape, dtype):
    m, n, k, b = shape
    dy, x = inputs(m, n, k, dtype, device="cuda")
    out = block_grad_norms(dy, x, b)  # dispatches to Triton on CUDA
    assert out.device.type == "cuda" and out.dtype == torch.float32
    assert_close(out, brute(dy.cpu(), x.cpu(), b), dtype, "triton (cuda)")
    # Strided (column-major) operands take the same path.
    out_t = block_grad_norms(dy.t().contiguous().t(), x.t().contiguous().t(), b)
    assert_close(out_t, brute(dy.cpu(), x.cpu(), b), dtype, "triton (cuda, strided)")


@pytest.mark.gpu
def test_kernel_gpu_deterministic():
    dy, x = inputs(3000, 512, 512, torch.float16, device="cuda")
    assert torch.equal(block_grad_norms(dy, x, 32), block_grad_norms(dy, x, 32))
