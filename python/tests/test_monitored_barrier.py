# SPDX-License-Identifier: BSD-3-Clause
"""monitored_barrier with the chorus backend.

torch 1.13's Python (distributed_c10d.monitored_barrier) raises RuntimeError("monitored_barrier is
only implemented for GLOO backend.") for any group whose backend is not gloo, before the backend
is reached; so on a chorus group it must raise that at once (not hang) and leave the group usable.
Where torch does allow it, a gloo group made with new_group(backend="gloo") next to the chorus
default group, a rank that does not arrive is named in rank 0's error within the timeout."""

import datetime
import time

import torch
import torch.distributed as dist

import harness

TIMEOUT_S = 2


def refused_on_chorus(rank, world):
    """Every rank calls monitored_barrier on the chorus default group and on a chorus sub-group;
    returns (message, seconds) of each refusal, then proves the group still works."""
    out = []
    sub = dist.new_group(list(range(world)))
    for group in (None, sub):
        t0 = time.monotonic()
        try:
            dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=TIMEOUT_S))
            out.append(("returned", time.monotonic() - t0))
        except RuntimeError as e:
            out.append((str(e), time.monotonic() - t0))
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return out, float(t)


def test_refused_on_chorus(tmp_path):
    res = harness.run(tmp_path, 2, "test_monitored_barrier:refused_on_chorus", timeout=120)
    for r, (calls, total) in res.items():
        for message, seconds in calls:
            assert "only implemented for GLOO backend" in message, "rank %d: %s" % (r, message)
            assert seconds < 1.0, "rank %d: the refusal took %.2f s" % (r, seconds)
        assert total == 3.0, "rank %d: all_reduce after the refusal gave %s" % (r, total)


def absent_rank_named(rank, world):
    """On a gloo group: rank world-1 stays away from monitored_barrier (then every rank but rank
    0 stays away, with wait_all_ranks=True); rank 0's error must name the absent ranks. Each round
    uses a fresh gloo group (a failed monitored barrier leaves messages behind) and ends with a
    barrier on the chorus default group, so no rank runs ahead."""
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    out = {}
    for case, absent, wait_all in (("one", {world - 1}, False), ("all", set(range(1, world)), True)):
        gloo = dist.new_group(backend="gloo", timeout=timeout)
        dist.monitored_barrier(group=gloo, timeout=timeout)  # everyone there: it passes
        message, t0 = "returned", time.monotonic()
        if rank not in absent:
            try:
                dist.monitored_barrier(group=gloo, timeout=timeout, wait_all_ranks=wait_all)
            except RuntimeError as e:
                message = str(e)
        out[case] = (message, time.monotonic() - t0)
        dist.barrier()  # chorus: the absent ranks wait here for the others' verdicts
    return out


def test_absent_rank_named_on_gloo_group(tmp_path):
    world = 3
    res = harness.run(tmp_path, world, "test_monitored_barrier:absent_rank_named", timeout=120)
    one, seconds = res[0]["one"]
    assert "Rank %d failed to pass monitoredBarrier" % (world - 1) in one, one
    assert seconds < TIMEOUT_S + 5, "rank 0 raised after %.1f s" % seconds
    every, seconds = res[0]["all"]
    assert "Ranks 1, 2 failed to pass monitoredBarrier" in every, every
    assert seconds < TIMEOUT_S + 5, "rank 0 raised after %.1f s" % seconds
    # The rank that did arrive is not blamed in the first case; it fails too (rank 0 never answers).
    assert "Rank 1 failed" not in one, one
    assert res[1]["one"][0] != "returned", "rank 1 passed a barrier that rank %d never reached" % (world - 1)
