# SPDX-License-Identifier: BSD-3-Clause
"""Failures surface as exceptions naming the rank and the operation, and nothing hangs:
a timeout (the timeout given to new_group / init_process_group bounds the wait), ranks calling
different collectives (mismatch), and a rank killed in the middle of an all_reduce. The groups of
the first test ask for timeouts (3 s, 30 s) shorter than the world's (60 s), so they get links of
their own, and the world goes on after their failures."""

import datetime
import os
import signal
import time

import torch
import torch.distributed as dist

import harness


# ---- what the ranks run ---------------------------------------------------------------------------

def timeout_and_mismatch(rank, world):
    out = {}
    # A group of its own with a 3 s bound: rank 0 calls all_reduce, rank 1 never does.
    sub = dist.new_group(timeout=datetime.timedelta(seconds=3))
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=sub)
            out["timeout"] = None
        except RuntimeError as e:
            out["timeout"] = (str(e), time.monotonic() - t0)
    dist.barrier()  # the world group is unaffected
    # Another group: rank 0 calls all_reduce, rank 1 broadcast. Both learn it.
    mis = dist.new_group(timeout=datetime.timedelta(seconds=30))
    t0 = time.monotonic()
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(4), group=mis)
        else:
            dist.broadcast(torch.ones(4), src=0, group=mis)
        out["mismatch"] = None
    except RuntimeError as e:
        out["mismatch"] = (str(e), time.monotonic() - t0)
    t = torch.ones(3)
    dist.all_reduce(t)
    out["world_after"] = t.tolist()
    return out


def killed(rank, world):
    t = torch.ones(1 << 22)  # 16 MiB: several slices, the kill lands mid-operation
    dist.all_reduce(t)
    if rank == world - 1:
        dist.all_reduce(t, async_op=True)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(20):
            dist.all_reduce(t)
        return None
    except RuntimeError as e:
        return (str(e), time.monotonic() - t0)


# ---- the tests ------------------------------------------------------------------------------------

def test_timeout_and_mismatch(tmp_path):
    res = harness.run(tmp_path, 2, "test_errors:timeout_and_mismatch")
    assert res[0]["timeout"] is not None, "rank 0's lone all_reduce returned"
    msg, elapsed = res[0]["timeout"]
    assert "chorus_torch: rank 0: allreduce" in msg and "timeout" in msg, msg
    assert 2.5 <= elapsed < 20, "timed out after %.1f s, not about 3 s" % elapsed
    for r in (0, 1):
        assert res[r]["mismatch"] is not None, "rank %d did not see the mismatch" % r
        msg, elapsed = res[r]["mismatch"]
        assert ("chorus_torch: rank %d:" % r) in msg and "mismatch" in msg, msg
        assert elapsed < 20, "mismatch took %.1f s" % elapsed
        assert res[r]["world_after"] == [2.0, 2.0, 2.0]


def test_killed_rank(tmp_path):
    world = 3
    res = harness.run(tmp_path, world, "test_errors:killed", may_die=(world - 1,), pg_timeout=120)
    for r in range(world - 1):
        assert res[r] is not None, "rank %d finished 20 all_reduces with a dead peer" % r
        msg, elapsed = res[r]
        assert ("chorus_torch: rank %d: allreduce" % r) in msg, msg
        assert "peer_failure" in msg or "timeout" not in msg, msg
        assert elapsed < 60, "rank %d took %.1f s to notice (timeout is 120 s)" % (r, elapsed)
