"""Data-parallel training of the demo's block-sparse GPT with torch.distributed: the
same global batch on 1 or N processes, so the loss curves can be compared step for
step, and the throughput gives the scaling efficiency.

    torchrun --nproc-per-node 2 examples/ddp_train.py --out ddp2.json        # 2 GPUs (NCCL)
    torchrun --nproc-per-node 1 examples/ddp_train.py --out ddp1.json        # 1 GPU, same global batch
    torchrun --nproc-per-node 2 examples/ddp_train.py --device cpu --steps 5 --d-model 64 --layers 2 \
        --context 64 --global-batch 8 --block 16   # CPU, gloo: a smoke run (seconds)

Every rank draws the whole global batch from the same seeded generator and keeps its
own slice, so N processes see exactly the batches one process sees. Rank 0 writes
{world_size, steps, losses, tokens_per_s, ...} as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from tilesparse.demo import corpus
from tilesparse.demo.model import ByteGPT, sparse_hidden


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--density", type=float, default=0.25)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    cuda = args.device == "cuda"
    if "RANK" not in os.environ:
        raise SystemExit("run this under torchrun (see the module docstring): it sets RANK / WORLD_SIZE")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs CUDA (NCCL); on a CPU machine pass --device cpu (gloo)")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by the {world} processes")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    hidden = sparse_hidden(4 * args.d_model, args.density, args.block)
    model = ByteGPT(d_model=args.d_model, n_layers=args.layers, n_heads=8, context=args.context,
                    mlp_hidden=hidden, block_size=args.block, density=args.density, seed=0).to(device)
    model = DDP(model, device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    text = corpus.load(None, None if cuda else 2_000_000)
    gen = torch.Generator().manual_seed(1)
    per_rank = args.global_batch // world
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    losses, start = [], None
    for step in range(args.steps):
        x, y = corpus.batch(text.train, args.global_batch, args.context, gen, device)
        x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
        if step == 1:  # after the first step (compilation, autotuning) the clock starts
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        with autocast:
            loss = F.cross_entropy(model(x).float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    tokens = (args.steps - 1) * args.global_batch * args.context
    if rank == 0:
        result = {"world_size": world, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                  "steps": args.steps, "global_batch": args.global_batch, "context": args.context,
                  "d_model": args.d_model, "layers": args.layers, "mlp_hidden": hidden, "density": args.density,
                  "block": args.block, "losses": losses, "seconds_after_step_1": elapsed,
                  "tokens_per_s": tokens / elapsed if elapsed == elapsed and elapsed > 0 else None}
        print(json.dumps({k: v for k, v in result.items() if k != "losses"}))
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    # every rank reaches here before any tears down: a gloo peer that closes its
    # connections while another still uses them can abort it (SIGABRT seen once in CI)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
