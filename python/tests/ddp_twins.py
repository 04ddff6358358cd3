# SPDX-License-Identifier: BSD-3-Clause
"""DDP on chorus beside DDP on gloo, in the same ranks (test_ddp.py, test_hooks.py): a model and
its copy trained on the same data, one through the chorus default group, the other through a
gloo group over the same ranks."""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_twins(rank, world, model, gloo, steps, register=None):
    """Trains `model` (20 inputs, 4 classes) by DDP on chorus and a deep copy of it by DDP on
    `gloo`, `steps` SGD steps with momentum on batches of 16 drawn from a per-rank seed, small
    buckets (several all_reduces per backward, overlapping it). register(ddp, group), when given,
    is called for each (group None: chorus). Returns (per step {"identical": every rank holds the
    same chorus parameters, "max_diff_vs_gloo": ...}, the largest change of a chorus parameter)."""
    twin = copy.deepcopy(model)
    a = DDP(model, bucket_cap_mb=0.001)
    b = DDP(twin, process_group=gloo, bucket_cap_mb=0.001)
    if register:
        register(a, None)
        register(b, gloo)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    start = flat(a.module).clone()
    out = []
    for _ in range(steps):
        x = torch.randn(16, 20, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        for m, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
        pa, pb = flat(a.module), flat(b.module)
        every = [torch.empty_like(pa) for _ in range(world)]
        dist.all_gather(every, pa, group=gloo)
        out.append({"identical": all(torch.equal(every[0], q) for q in every),
                    "max_diff_vs_gloo": float((pa - pb).abs().max())})
    return out, float((flat(a.module) - start).abs().max())
