# SPDX-License-Identifier: BSD-3-Clause
"""torch.profiler shows every chorus operation under its own name, "chorus:<op>", as it shows
gloo's ("gloo:all_reduce", ...): the same program, profiled on a chorus and on a gloo group."""

import warnings

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import harness

# What each call of every_op() must show on chorus (gloo's names where gloo has the operation).
EXPECTED = [
    "chorus:all_reduce", "chorus:broadcast", "chorus:reduce", "chorus:all_gather", "chorus:_all_gather_base",
    "chorus:gather", "chorus:scatter", "chorus:reduce_scatter", "chorus:_reduce_scatter_base",
    "chorus:all_to_all", "chorus:barrier", "chorus:send", "chorus:recv", "chorus:all_reduce_coalesced",
    "chorus:all_gather_coalesced",
]


def every_op(rank, world, group, backend):
    t = torch.ones(4)
    dist.all_reduce(t, group=group)
    dist.broadcast(t, src=0, group=group)
    dist.reduce(t, dst=0, group=group)
    dist.all_gather([torch.empty(4) for _ in range(world)], t, group=group)
    dist.gather(t, [torch.empty(4) for _ in range(world)] if rank == 0 else None, dst=0, group=group)
    dist.scatter(t, [torch.ones(4) for _ in range(world)] if rank == 0 else None, src=0, group=group)
    dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world), group=group)
    dist.barrier(group=group)
    if rank == 0:
        dist.send(t, 1, group=group)
    elif rank == 1:
        dist.recv(t, 0, group=group)
    if backend == "chorus":  # gloo has none of these on this torch
        dist.all_gather_into_tensor(torch.empty(4 * world), t, group=group)
        dist.reduce_scatter(torch.empty(4), [torch.ones(4) for _ in range(world)], group=group)
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * world), group=group)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)], group=group)
            dist.all_gather_coalesced([[torch.empty(2)] for _ in range(world)], [torch.ones(2)], group=group)


def profiled_names(rank, world):
    gloo = dist.new_group(backend="gloo")
    names = {}
    for backend, group in (("chorus", None), ("gloo", gloo)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            every_op(rank, world, group, backend)
        names[backend] = sorted({e.name for e in prof.events() if ":" in e.name and
                                 e.name.split(":")[0] in ("chorus", "gloo")})
    return names


def test_profiler_names(tmp_path):
    res = harness.run(tmp_path, 2, "test_profiler:profiled_names")
    for r in range(2):
        chorus, gloo = res[r]["chorus"], res[r]["gloo"]
        # The check itself works: gloo's names show up in the same profile.
        assert "gloo:all_reduce" in gloo and "gloo:barrier" in gloo, gloo
        expected = [n for n in EXPECTED if not (r == 1 and n == "chorus:send") and not (r == 0 and n == "chorus:recv")]
        missing = [n for n in expected if n not in chorus]
        assert not missing, "rank %d: not in the profile: %s (it has %s)" % (r, missing, chorus)
        # Where gloo has the operation, the names match but for the prefix.
        for g in gloo:
            assert "chorus:" + g.split(":", 1)[1] in chorus, "rank %d: gloo shows %s, chorus does not" % (r, g)
