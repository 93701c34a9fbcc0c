import time, torch, tilesparse as ts
from tilesparse.ops import bsmm as O
dev, dt = torch.device("cuda"), torch.bfloat16
def host_us(fn, n=300):
    for _ in range(20): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    h = (time.perf_counter() - t0) / n * 1e6; torch.cuda.synchronize(); return h
layout = ts.layouts.random(1024, 1024, 128, 0.25, device=dev)
w = torch.randn(layout.nnz, 128, 128, device=dev, dtype=dt, requires_grad=True)
x = torch.randn(256, 1024, device=dev, dtype=dt, requires_grad=True)
dy = torch.randn(256, 1024, device=dev, dtype=dt)
class Nop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a): return a * 1
    @staticmethod
    def backward(ctx, g): return g
cases = {
 "nop Function step": lambda: torch.autograd.grad(Nop.apply(x), (x,), dy),
 "step dX only": lambda: torch.autograd.grad(ts.block_sparse_linear(x, w.detach(), layout), (x,), dy),
 "step dW only": lambda: torch.autograd.grad(ts.block_sparse_linear(x.detach(), w, layout), (w,), dy),
 "step both": lambda: torch.autograd.grad(ts.block_sparse_linear(x, w, layout), (x, w), dy),
 "fwd only (grad mode)": lambda: ts.block_sparse_linear(x, w, layout),
}
for k, f in list(cases.items())[:2]: print(f"{k:24s} {host_us(f):8.1f} us")
import cProfile, pstats, threading
pr = cProfile.Profile(); torch.autograd.set_multithreading_enabled(False)
print("multithreading off: step both", host_us(cases["step both"]))
pr.enable()
for _ in range(100): cases["step both"]()
pr.disable(); torch.cuda.synchronize()
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(45)
pr2 = cProfile.Profile(); pr2.enable()
for _ in range(100): cases["step dX only"]()
pr2.disable(); torch.cuda.synchronize()
pstats.Stats(pr2).sort_stats("tottime").print_stats(12)
