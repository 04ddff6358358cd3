# SPDX-License-Identifier: BSD-3-Clause
"""DistributedDataParallel on the chorus backend: after every step the parameters are identical on
every rank and equal, within float tolerance, to the same training run through gloo (a gloo group
over the same ranks, same model, same data, in the same processes). Also the classic synchronous
SGD loop (average_gradients with dist.all_reduce) and the store-based init paths."""

import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ddp_twins
import harness

STEPS = 6


def ddp_vs_gloo(rank, world):
    torch.manual_seed(rank)  # different on each rank: DDP's broadcast from rank 0 must make them equal
    model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    return ddp_twins.train_twins(rank, world, model, dist.new_group(backend="gloo"), STEPS)[0]


def average_gradients_loop(rank, world):
    """The tutorial loop: all_reduce every gradient (SUM), divide by the world size."""
    torch.manual_seed(0)
    model = nn.Linear(10, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(4):
        x, y = torch.randn(8, 10, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
        opt.step()
    # the same steps on one process over every rank's data: the mean of the per-rank gradients
    torch.manual_seed(0)
    ref = nn.Linear(10, 3)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.5)
    gens = [torch.Generator().manual_seed(7 + r) for r in range(world)]
    for _ in range(4):
        batches = [(torch.randn(8, 10, generator=gg), torch.randn(8, 3, generator=gg)) for gg in gens]
        ropt.zero_grad()
        sum(F.mse_loss(ref(x), y) for x, y in batches).div(world).backward()
        ropt.step()
    return float((ddp_twins.flat(model) - ddp_twins.flat(ref)).abs().max())


def test_ddp_matches_gloo(tmp_path):
    res = harness.run(tmp_path, 2, "test_ddp:ddp_vs_gloo")
    for r, steps in res.items():
        assert len(steps) == STEPS
        for i, s in enumerate(steps):
            assert s["identical"], "rank %d step %d: parameters differ between ranks" % (r, i)
            assert s["max_diff_vs_gloo"] < 1e-5, "rank %d step %d: %.3g from the gloo run" % (r, i, s["max_diff_vs_gloo"])


def test_average_gradients(tmp_path):
    res = harness.run(tmp_path, 3, "test_ddp:average_gradients_loop")
    for r, diff in res.items():
        assert diff < 1e-5, "rank %d: %.3g from the single-process reference" % (r, diff)


def through_tcp_store(rank, world):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    sub = dist.new_group([world - 1])
    u = torch.tensor([5.0])
    if rank == world - 1:
        dist.all_reduce(u, group=sub)  # a group of one
    return float(t), float(u)


def test_tcp_store(tmp_path):
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    res = harness.run(tmp_path, 2, "test_ddp:through_tcp_store", tcp_port=server.port)
    assert res == {0: (3.0, 5.0), 1: (3.0, 5.0)}, res
