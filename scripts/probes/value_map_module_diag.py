import torch, os
from tilesparse.semi24 import SemiSparseLinear
for packer in ("map", "cslt"):
    for search in ("1", "0"):
        os.environ["TILESPARSE_SEMI24_PACKER"] = packer
        os.environ["TILESPARSE_CSLT_SEARCH"] = search
        from tilesparse.semi24 import cusparselt
        cusparselt._ALG_IDS.clear()
        torch.manual_seed(0)
        m = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="sparse")
        x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        m(x)
        with torch.no_grad():
            m.weight.mul_(1.5)
        y = m(x)
        y.sum().backward()
        wm = (m.weight.detach() * m.mask).double()
        want = x.detach().double() @ wm.t() + m.bias.detach().double()
        want_dx = torch.ones(64, 512, dtype=torch.float64, device="cuda") @ wm
        print(packer, "search", search, "maps", bool(m._maps), "y err", ((y.double() - want).norm() / want.norm()).item(),
              "dx err", ((x.grad.double() - want_dx).norm() / want_dx.norm()).item(), "algs", dict(cusparselt._ALG_IDS))
