"""tilesparse under torch.distributed: 2 CPU processes, gloo backend (they run in CI).

One spawn runs every scenario (process start-up dominates the cost), each rank saving
its results; the test process compares them with a single-process run on the same
global batch:

* DDP of a block-sparse MLP: the parameters after 3 SGD steps equal the single-process
  run on the concatenated batches;
* FSDP2 (`fully_shard`) of the same model: the same, through the sharded parameters;
* DDP and FSDP2 of a BlockSparseLSTM language model and of a block-sparse
  self-attention model: the same after 2 steps; of a 2:4 (SemiSparseLinear) MLP whose
  masks are recomputed during training: the same after 3 steps;
* RigL under DDP: every rank captures a different batch, yet the rewired layouts are
  identical on both ranks (the grow scores are combined across ranks); under FSDP2 it
  refuses, by name, to rewire sharded weights.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import tilesparse

WORLD = 2
BATCH = 8  # per rank
pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        tilesparse.BlockSparseLinear(32, 64, block_size=16, density=0.5, seed=1),
        nn.GELU(),
        tilesparse.BlockSparseLinear(64, 32, block_size=8, density=0.5, seed=2),
    ).double()


class _LstmLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = tilesparse.BlockSparseLSTM(8, 16, block_size=8, density=0.5, batch_first=True, seed=3)
        self.head = nn.Linear(16, 8)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


def _lstm_lm() -> nn.Module:
    torch.manual_seed(0)
    return _LstmLM().double()


class _AttentionLM(nn.Module):
    def __init__(self):
        super().__init__()
        from tilesparse.attention import layouts as attention_layouts

        self.attn = tilesparse.BlockSparseSelfAttention(32, 2, attention_layouts.local(32, 16, window=16, causal=True))
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        return self.head(x + self.attn(x))


def _semi_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(tilesparse.SemiSparseLinear(32, 64, mask_every=2), nn.GELU(),
                         tilesparse.SemiSparseLinear(64, 32, mask_every=2))  # fp32: 2:4 masks take no fp64


def _attention_lm() -> nn.Module:
    torch.manual_seed(0)
    return _AttentionLM().double()


def _batch(rank: int, kind: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    shape = {"mlp": (BATCH, 32), "lstm": (BATCH, 5, 8), "attention": (BATCH, 32, 32)}[kind]
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _loss(model, x):
    return model(x).square().mean()


def _train(model, batches, steps):
    """SGD on ``batches`` (cast to the model's dtype); SemiSparseLinear layers count each
    step, recomputing their 2:4 masks every 2 steps from the weights every rank holds
    identically, so the masks agree across ranks."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = batches.to(next(model.parameters()).dtype)
    semi_layers = [m for m in model.modules() if isinstance(m, tilesparse.SemiSparseLinear)]
    for _ in range(steps):
        opt.zero_grad()
        _loss(model, batches).backward()
        opt.step()
        for layer in semi_layers:
            layer.step()
    return model


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# name -> (model factory, batch kind, SGD steps, the submodules FSDP2 shards on their own).
# The LSTM and attention are one group each: their forward reads child weights directly.
SCENARIOS = {
    "mlp": (_mlp, "mlp", 3, lambda m: [x for x in m if isinstance(x, tilesparse.BlockSparseLinear)]),
    "lstm": (_lstm_lm, "lstm", 2, lambda m: [m.lstm]),
    "attention": (_attention_lm, "attention", 2, lambda m: [m.attn]),
    "semi": (_semi_mlp, "mlp", 3, lambda m: [x for x in m if isinstance(x, tilesparse.SemiSparseLinear)]),
}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    # file rendezvous: no port to pick (and race for) on a busy machine
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        results = {}
        for name, (make, kind, steps, shard_groups) in SCENARIOS.items():
            # (through the DDP wrapper's forward: that is what arms its gradient all-reduce)
            model = make()
            _train(DDP(model), _batch(rank, kind), steps)
            results[f"ddp_{name}"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            sharded = make()
            for group in shard_groups(sharded):
                fully_shard(group)
            fully_shard(sharded)
            _train(sharded, _batch(rank, kind), steps)
            results[f"fsdp2_{name}"] = {k: _full(v).detach().clone() for k, v in sharded.state_dict().items()}
            if name == "mlp":
                try:
                    tilesparse.sparsity.RigL(sharded, None, every=2, total_steps=10)
                    results["rigl_on_fsdp2"] = "accepted"
                except TypeError as exc:
                    results["rigl_on_fsdp2"] = str(exc)

        model = _mlp()
        wrapped = DDP(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        rigl = tilesparse.sparsity.RigL(model, opt, every=2, drop_fraction=0.5, total_steps=10)
        gen = torch.Generator().manual_seed(7 + rank)  # each rank its own data
        for _ in range(2):
            opt.zero_grad()
            wrapped(torch.randn(BATCH, 32, generator=gen, dtype=torch.float64)).square().mean().backward()
            opt.step()
            rigl.step()
        results["rigl_masks"] = [m.layout_mask.clone() for m in rigl.modules.values()]
        results["rigl_changed"] = rigl.history[-1]["changed"]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(str(out / "rendezvous"), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_matches_one_process_on_the_global_batch(ranks, wrapper, name):
    make, kind, steps, _ = SCENARIOS[name]
    both = torch.cat([_batch(r, kind) for r in range(WORLD)])  # the global batch
    want = {k: v.detach() for k, v in _train(make(), both, steps).state_dict().items()}
    # fp64 models agree to rounding; the fp32 one (2:4) within the all-reduce mean's rounding
    rtol, atol = (1e-10, 1e-12) if next(iter(want.values())).dtype == torch.float64 else (1e-5, 1e-6)
    for r, res in enumerate(ranks):
        got = res[f"{wrapper}_{name}"]
        assert got.keys() == want.keys(), f"{wrapper} {name} rank {r}"
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=rtol, atol=atol, msg=f"{wrapper} {name} rank {r}: {k}")


def test_rigl_rewires_identically_on_every_rank(ranks):
    assert sum(ranks[0]["rigl_changed"].values()) > 0, "the rewire should have moved blocks"
    for a, b in zip(ranks[0]["rigl_masks"], ranks[1]["rigl_masks"]):
        assert torch.equal(a, b)


def test_rigl_refuses_fsdp2_sharded_weights_clearly(ranks):
    # Rewiring a sharded DTensor weight would be silently wrong: refused by name.
    for res in ranks:
        assert "FSDP2-sharded (DTensor)" in res["rigl_on_fsdp2"]


def test_ddp_example_gives_the_one_process_loss_curve(tmp_path):
    # examples/ddp_train.py under torchrun (CPU, gloo): 2 processes on the same global
    # batch follow the 1-process loss curve step for step.
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"
    curves = {}
    for procs in (1, 2):
        out = tmp_path / f"ddp{procs}.json"
        # --standalone: torchrun picks its own free port (a port chosen here could be taken
        # by the time it binds: that raced once in a full-suite run)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", str(script), "--device", "cpu", "--steps", "4",
               "--global-batch", "8", "--context", "32", "--d-model", "64", "--layers", "2", "--block", "16",
               "--out", str(out)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        # the children's tracebacks come first in torchrun's stderr; keep them
        errors = [line for line in result.stderr.splitlines() if "rank" in line or "Error" in line]
        assert result.returncode == 0, "\n".join(errors[:40]) + "\n...\n" + result.stderr[-1500:]
        curves[procs] = json.loads(out.read_text())["losses"]
    torch.testing.assert_close(torch.tensor(curves[2]), torch.tensor(curves[1]), rtol=1e-5, atol=1e-5)
    assert curves[1][-1] < curves[1][0]
