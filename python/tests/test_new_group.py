# SPDX-License-Identifier: BSD-3-Clause
"""new_group on a chorus default group is a subset of its communicator (Communicator::subset): it
shares the default group's links, so making it opens no socket (counted in /proc/self/fd before
and after, on every rank), and its collectives give the right results: two halves, the odd ranks,
the whole world again; all_reduce, broadcast from a group's last rank, all_gather in group order,
barrier; the default group goes on. For comparison, a group made through a rendezvous of its own
(the creator told there is no chorus default group) does open sockets, so the count can tell.
Shared links are aborted together: a sub-group's call that times out fails the world's next call
on every rank, promptly, with an error naming the rank (a group with a timeout of its own, or
CHORUS_TORCH_NEW_GROUP=own, keeps groups apart: test_errors.py, test_timeouts.py)."""

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import harness


def sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("socket:"):
                n += 1
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return n


def run_new_group(rank, world):
    import chorus_torch

    out = {}
    half, other = list(range(world // 2)), list(range(world // 2, world))
    odd = [r for r in range(world) if r % 2 == 1]
    dist.barrier()
    before = sockets()
    g_half, g_other, g_odd, g_all = dist.new_group(half), dist.new_group(other), dist.new_group(odd), dist.new_group()
    dist.barrier()
    out["sockets"] = (before, sockets())

    members = half if rank in half else other
    mine = g_half if rank in half else g_other
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=mine)
    out["sum"] = (t.tolist(), [float(sum(r + 1 for r in members))] * 5)
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=members[-1], group=mine)
    out["broadcast"] = (b.tolist(), [float(members[-1])] * 3)
    parts = [torch.empty(2, dtype=torch.int64) for _ in members]
    dist.all_gather(parts, torch.full((2,), rank, dtype=torch.int64), group=mine)
    out["all_gather"] = ([p.tolist() for p in parts], [[r, r] for r in members])
    dist.barrier(group=mine)
    if rank in odd:
        x = torch.full((4,), float(rank))
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g_odd)
        out["odd"] = (x.tolist(), [float(odd[-1])] * 4)
    y = torch.full((2,), float(rank))
    dist.all_reduce(y, group=g_all)
    out["all"] = (y.tolist(), [float(sum(range(world)))] * 2)
    z = torch.ones(3)
    dist.all_reduce(z)
    out["default"] = (z.tolist(), [float(world)] * 3)

    # For comparison: a group through a rendezvous of its own opens sockets (its standby store).
    dist.barrier()
    before = sockets()
    saved = chorus_torch._default_chorus_group
    chorus_torch._default_chorus_group = lambda: None
    try:
        own = dist.new_group(half)
    finally:
        chorus_torch._default_chorus_group = saved
    dist.barrier()
    out["own_sockets"] = (before, sockets()) if rank in half else None
    if rank in half:
        w = torch.ones(2)
        dist.all_reduce(w, group=own)
        out["own"] = (w.tolist(), [float(len(half))] * 2)
    dist.barrier()
    return out


def run_shared_failure(rank, world):
    """A new_group sharing the world's links (the world's timeout): rank 0's call on it, bounded by
    Work.wait(2 s), times out (rank 1 never calls), and the world's next call fails on both ranks,
    promptly and saying why, rather than hanging."""
    sub = dist.new_group()
    out = {}
    t0 = time.monotonic()
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(4), group=sub, async_op=True).wait(timeout=datetime.timedelta(seconds=2))
            out["sub"] = None
        except RuntimeError as e:
            out["sub"] = str(e)
    try:
        dist.barrier()
        t = torch.ones(2)
        dist.all_reduce(t)
        out["world"] = None
    except RuntimeError as e:
        out["world"] = str(e)
    out["elapsed"] = time.monotonic() - t0
    return out


def test_shared_links_fail_together(tmp_path):
    res = harness.run(tmp_path, 2, "test_new_group:run_shared_failure", pg_timeout=60)
    assert res[0]["sub"] is not None and "did not complete within 2000 ms" in res[0]["sub"], res[0]["sub"]
    for r in range(2):
        msg = res[r]["world"]
        assert msg is not None, "rank %d: the world group went on over links its sub-group aborted" % r
        assert ("chorus_torch: rank %d" % r) in msg, msg
        assert res[r]["elapsed"] < 30, "rank %d: %.1f s, not promptly after the 2 s bound" % (r, res[r]["elapsed"])


@pytest.mark.parametrize("world", [4])
def test_new_group(tmp_path, world):
    res = harness.run(tmp_path, world, "test_new_group:run_new_group")
    for r in range(world):
        o = res[r]
        before, after = o["sockets"]
        assert after == before, "rank %d: %d sockets before four new_group calls, %d after" % (r, before, after)
        for key in ("sum", "broadcast", "all_gather", "odd", "all", "default", "own"):
            if o.get(key) is not None:
                got, want = o[key]
                assert got == want, "rank %d: %s gave %s, not %s" % (r, key, got, want)
        if o["own_sockets"] is not None:
            before, after = o["own_sockets"]
            assert after > before, "rank %d: a group with a rendezvous of its own opened no socket (%d, %d)" % (
                r, before, after)
