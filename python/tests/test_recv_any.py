# SPDX-License-Identifier: BSD-3-Clause
"""dist.recv(t) and dist.irecv(t) without src (recv_anysource): every other rank sends to rank 0
at once, and each receive returns (recv) or names (work._source_rank()) a distinct sender whose
tensor it holds; over several rounds, into a non-contiguous tensor, and in a subgroup (recv then
returns the sender's global rank)."""

import pytest
import torch
import torch.distributed as dist

import harness

ROUNDS = 3


def value(src, rnd):
    return float(src * 10 + rnd)


# ---- what the ranks run ---------------------------------------------------------------------------

def any_source(rank, world):
    out = {}
    last = world - 1
    sub = dist.new_group([0, last])  # every rank creates it; only 0 and the last are in it
    if rank == 0:
        got = []
        for rnd in range(ROUNDS):
            for _ in range(world - 1):
                if rnd == ROUNDS - 1:  # a non-contiguous tensor: staged, written back on success
                    base = torch.zeros(5, 2)
                    t = base[:, 1]
                else:
                    t = torch.zeros(5)
                src = dist.recv(t, tag=rnd)
                got.append((rnd, src, t.tolist()))
        out["recv"] = got
        works = [(dist.irecv(t, tag=100), t) for t in (torch.zeros(3, dtype=torch.int64) for _ in range(world - 1))]
        dist.barrier()  # the senders send only now: the receives were posted first
        res = []
        for w, t in works:
            w.wait()
            res.append((w._source_rank(), t.tolist()))
        out["irecv"] = res
        t = torch.zeros(2)
        out["sub"] = (dist.recv(t, group=sub, tag=7), t.tolist())
    else:
        for rnd in range(ROUNDS):
            dist.send(torch.full((5,), value(rank, rnd)), dst=0, tag=rnd)
        dist.barrier()
        dist.send(torch.tensor([rank, rank * rank, 7]), dst=0, tag=100)
        if rank == last:
            dist.send(torch.tensor([1.5, float(rank)]), dst=0, group=sub, tag=7)
    dist.barrier()
    return out


# ---- the tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", [3, 4])
def test_recv_without_src_returns_each_sender(world, tmp_path):
    out = harness.run(tmp_path, world, "test_recv_any:any_source")[0]
    senders = set(range(1, world))
    for rnd in range(ROUNDS):
        this_round = [(src, t) for r, src, t in out["recv"] if r == rnd]
        assert sorted(src for src, _ in this_round) == sorted(senders), (rnd, this_round)
        for src, t in this_round:
            assert t == [value(src, rnd)] * 5, (rnd, src, t)
    assert sorted(src for src, _ in out["irecv"]) == sorted(senders), out["irecv"]
    for src, t in out["irecv"]:
        assert t == [src, src * src, 7], (src, t)
    assert out["sub"] == (world - 1, [1.5, float(world - 1)]), out["sub"]
