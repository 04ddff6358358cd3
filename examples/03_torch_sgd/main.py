# SPDX-License-Identifier: BSD-3-Clause
"""Synchronous SGD the way the PyTorch distributed tutorial writes it: each rank trains on its own
part of the data, and after every backward pass average_gradients() all-reduces each gradient
(SUM) and divides by the world size, so every rank takes the same step. The data is a noisy
linear map; the mean loss printed by rank 0 falls as training goes on.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/03_torch_sgd/main.py --nprocs 2
    PYTHONPATH=build/release/python /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \\
        --nproc_per_node 2 examples/03_torch_sgd/main.py --backend gloo
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from chorus_torch.launch import launch


def average_gradients(model):
    world = float(dist.get_world_size())
    for p in model.parameters():
        dist.all_reduce(p.grad.data, op=dist.ReduceOp.SUM)
        p.grad.data /= world


def main(rank, world, args):
    torch.manual_seed(0)  # the same initial model everywhere
    true_w = torch.randn(32, 4)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 + rank)  # this rank's part of the data
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=g)
        y = x @ true_w + 0.1 * torch.randn(args.batch, 4, generator=g)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        average_gradients(model)
        opt.step()
        if step % (args.steps // 5) == 0 or step == args.steps - 1:
            t = loss.detach().clone()
            dist.all_reduce(t)
            if rank == 0:
                print(f"[{args.backend}] step {step:4d}: mean loss over {world} ranks {float(t) / world:.4f}", flush=True)
    # every rank took the same steps: the parameters are identical
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"[{args.backend}] parameters identical on every rank: {torch.equal(lo, hi)}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--nprocs", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    launch(main, a, nprocs=a.nprocs, backend=a.backend)
