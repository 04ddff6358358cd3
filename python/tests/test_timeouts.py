# SPDX-License-Identifier: BSD-3-Clause
"""Per-call timeouts: Work.wait(timeout) and the `timeout` of a call's options bound that call,
well before the group's timeout (60 s here). One rank calls on a group where the other never
does: the call raises after about 2 s naming the rank, the operation and the bound, and that
group's communicator is aborted (its later calls fail at once) while the world group goes on: the
groups have links of their own (CHORUS_TORCH_NEW_GROUP=own: with the world's timeout they would
share its links by default, and the world would fail with them, test_new_group.py).
A bound that is long enough changes nothing."""

import datetime
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import harness

TWO_S = datetime.timedelta(seconds=2)
GROUP_TIMEOUT = datetime.timedelta(seconds=60)


def timed(fn):
    t0 = time.monotonic()
    try:
        fn()
        return (None, time.monotonic() - t0)
    except RuntimeError as e:
        return (str(e), time.monotonic() - t0)


def run_timeouts(rank, world):
    out = {}
    # Long enough: results as without a bound, on every rank.
    t = torch.full((5,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    out["long_enough"] = (w.wait(timeout=datetime.timedelta(seconds=30)), t.tolist())
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=30)
    t = torch.full((3,), float(rank))
    c10d._get_default_group().allreduce([t], opts).wait()
    out["long_enough_opts"] = t.tolist()

    # A group per case; rank 1 never calls on them.
    wait_group = dist.new_group(timeout=GROUP_TIMEOUT)
    opts_group = dist.new_group(timeout=GROUP_TIMEOUT)
    barrier_group = dist.new_group(timeout=GROUP_TIMEOUT)
    recv_group = dist.new_group(timeout=GROUP_TIMEOUT)
    if rank == 0:
        w = dist.all_reduce(torch.ones(4), group=wait_group, async_op=True)
        out["wait"] = timed(lambda: w.wait(timeout=TWO_S))
        out["wait_after"] = timed(lambda: dist.all_reduce(torch.ones(4), group=wait_group))
        opts = dist.AllreduceOptions()
        opts.timeout = TWO_S
        out["opts"] = timed(lambda: opts_group.allreduce([torch.ones(4)], opts).wait())
        bopts = dist.BarrierOptions()
        bopts.timeout = TWO_S
        out["barrier_opts"] = timed(lambda: barrier_group.barrier(bopts).wait())
        w = dist.irecv(torch.empty(2), src=1, group=recv_group)
        out["recv"] = timed(lambda: w.wait(timeout=TWO_S))
    dist.barrier()  # the world group is unaffected
    t = torch.ones(2)
    dist.all_reduce(t)
    out["world_after"] = t.tolist()
    return out


def test_timeouts(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORUS_TORCH_NEW_GROUP", "own")  # groups apart from the world (see the top)
    res = harness.run(tmp_path, 2, "test_timeouts:run_timeouts", pg_timeout=60)
    for r in range(2):
        ok, values = res[r]["long_enough"]
        assert ok is True and values == [3.0] * 5, res[r]["long_enough"]
        assert res[r]["long_enough_opts"] == [1.0] * 3
        assert res[r]["world_after"] == [2.0, 2.0]
    out = res[0]
    for key, op, bound in [("wait", "allreduce", "Work.wait()"), ("opts", "allreduce", "options"),
                           ("barrier_opts", "barrier", "options"), ("recv", "recv from 1", "Work.wait()")]:
        msg, elapsed = out[key]
        assert msg is not None, "%s: the call returned" % key
        assert ("chorus_torch: rank 0: " + op) in msg, msg
        assert "did not complete within 2000 ms" in msg and bound in msg, msg
        # Well under the group's 60 s: about 2 s, with room for a loaded machine.
        assert 1.9 <= elapsed < 15, "%s: raised after %.1f s, not about 2 s" % (key, elapsed)
    msg, elapsed = out["wait_after"]
    assert msg is not None and "abort" in msg, msg
    assert elapsed < 5, "a call on the aborted group took %.1f s" % elapsed
