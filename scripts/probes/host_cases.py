"""The calls whose host time the host probes compare (launch_ab.py on the GPU,
host_python_cost.py on the CPU): one small block-sparse problem (W 1024², b 128,
density 0.25), too small to keep a GPU busy, so a loop of calls measures the host."""

from __future__ import annotations

import torch

import tilesparse as ts
from tilesparse.kernels import bsmm as K
from tilesparse.ops import linear_plans


def host_cases(device, dtype: torch.dtype, m: int = 256) -> dict:
    """name -> zero-argument call: the kernel wrappers (dds both ways, sdd, dds at M 16),
    the public function with and without autograd, the module without autograd at M 16 from its
    plans and dispatched each call, and the training step with and without autograd's worker
    threads."""
    layout = ts.layouts.random(1024, 1024, 128, 0.25, seed=0, device=device)
    w = torch.randn(layout.nnz, 128, 128, device=device, dtype=dtype, requires_grad=True)
    x = torch.randn(m, 1024, device=device, dtype=dtype, requires_grad=True)
    x16 = torch.randn(16, 1024, device=device, dtype=dtype)
    dy = torch.randn(m, 1024, device=device, dtype=dtype)
    meta, r, c = layout.meta, layout.block_rows, layout.block_cols
    xd, wd = x.detach(), w.detach()
    module = ts.nn.BlockSparseLinear(1024, 1024, block_size=128, layout=layout.to("cpu"), device=device, dtype=dtype)

    def module_no_grad():
        with torch.no_grad():
            return module(x16)

    def module_no_grad_unplanned():
        linear_plans.PLANS = False  # checked and dispatched every call
        try:
            return module_no_grad()
        finally:
            linear_plans.PLANS = True

    def step():
        return torch.autograd.grad(ts.block_sparse_linear(x, w, layout), (x, w), dy)

    def step_one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            return step()

    return {
        "kernels.dds (fprop)": lambda: K.dds(xd, wd, meta, None, r, c, True),
        "kernels.dds (bprop)": lambda: K.dds(dy, wd, meta, None, r, c, False),
        "kernels.sdd": lambda: K.sdd(dy.t(), xd, meta, 128, r, c),
        "kernels.dds, M 16": lambda: K.dds(x16, wd, meta, None, r, c, True),
        "block_sparse_linear, no grad": lambda: ts.block_sparse_linear(xd, wd, layout),
        "block_sparse_linear, grad": lambda: ts.block_sparse_linear(x, w, layout),
        "BlockSparseLinear, no grad, M 16 (planned)": module_no_grad,
        "BlockSparseLinear, no grad, M 16 (unplanned)": module_no_grad_unplanned,
        "training step": step,
        "training step, backward on the calling thread": step_one_thread,
    }
