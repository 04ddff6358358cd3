# SPDX-License-Identifier: BSD-3-Clause
"""The coalesced operations: all_reduce_coalesced and all_gather_coalesced give what one call per
tensor gives (on chorus, exactly) and what gloo's coalesced calls give, for several dtypes, reduce
ops, shapes (empty, non-contiguous) and world sizes; async forms complete through their futures;
bad lists raise naming the rank and the operation. torch 1.13's _coalescing_manager (which
batch_isend_irecv uses) opens a chorus group (chorus/group.hpp) and runs it at its end: sends and
receives written in opposite orders on two ranks complete, two all_reduces inside it are fused, and
a PREMUL_SUM inside it (which waits for steps of its own) fails its Work saying so."""

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import harness

# Integer-valued data: float sums are exact, so chorus and gloo, one call or many, agree bitwise.
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]
SHAPES = [(5,), (0,), (3, 4), (1,), (17,)]


def inputs(rank, dtype, salt):
    ts = []
    for i, shape in enumerate(SHAPES):
        n = 1
        for d in shape:
            n *= d
        base = torch.arange(n, dtype=torch.int64) % 7 + rank * 3 + i + salt
        ts.append(base.to(dtype).reshape(shape))
    # A non-contiguous tensor (a transposed view) among them.
    ts.append((torch.arange(12, dtype=torch.int64) % 5 + rank + salt).to(dtype).reshape(3, 4).t())
    return ts


def run_coalesced(rank, world):
    warnings.simplefilter("ignore")  # torch warns that the coalesced calls will be deprecated
    gloo = dist.new_group(backend="gloo")
    out = {"mismatches": [], "checked": 0}

    def same(name, a, b):
        out["checked"] += 1
        if not (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)):
            out["mismatches"].append("%s: %s != %s" % (name, a.tolist(), b.tolist()))

    for dtype in DTYPES:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            name = "all_reduce_coalesced %s %s" % (dtype, op)
            mine = inputs(rank, dtype, 1)
            dist.all_reduce_coalesced(mine, op=op)
            for i, t in enumerate(inputs(rank, dtype, 1)):  # one call per tensor, on chorus
                dist.all_reduce(t, op=op)
                same(name + " vs all_reduce[%d]" % i, mine[i], t)
            theirs = inputs(rank, dtype, 1)
            dist.all_reduce_coalesced(theirs, op=op, group=gloo)
            for i, t in enumerate(theirs):
                same(name + " vs gloo[%d]" % i, mine[i], t)
        name = "all_gather_coalesced %s" % dtype
        ins = inputs(rank, dtype, 2)
        outs = [[torch.empty_like(t) for t in ins] for _ in range(world)]
        dist.all_gather_coalesced(outs, ins)
        for i, t in enumerate(ins):
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            for r in range(world):
                same(name + " vs all_gather[%d] from %d" % (i, r), outs[r][i], parts[r])
        gl = [[torch.empty_like(t) for t in ins] for _ in range(world)]
        dist.all_gather_coalesced(gl, ins, group=gloo)
        for r in range(world):
            for i in range(len(ins)):
                same(name + " vs gloo[%d] from %d" % (i, r), outs[r][i], gl[r][i])

    # Async: the futures complete with the results; the tensors hold them.
    ts = [torch.full((3,), float(rank + 1)), torch.full((2, 2), float(rank))]
    fut = dist.all_reduce_coalesced(ts, async_op=True)
    fut.wait()
    same("async all_reduce_coalesced[0]", ts[0], torch.full((3,), float(sum(range(1, world + 1)))))
    same("async all_reduce_coalesced[1]", ts[1], torch.full((2, 2), float(sum(range(world)))))
    ins = [torch.full((2,), rank, dtype=torch.int64), torch.full((1,), 10 * rank, dtype=torch.int64)]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins, async_op=True).wait()
    for r in range(world):
        same("async all_gather_coalesced from %d" % r, torch.cat(outs[r]),
             torch.tensor([r, r, 10 * r], dtype=torch.int64))

    # Bad lists, through the process group itself (torch's Python checks some of these first).
    pg = c10d._get_default_group()
    errors = {}
    for key, call in [
        ("mixed dtypes", lambda: pg.allreduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.int64)])),
        ("empty list", lambda: pg.allreduce_coalesced([])),
        ("output lists", lambda: pg.allgather_coalesced([[torch.ones(2)]], [torch.ones(2)])),
    ]:
        try:
            call().wait()
            errors[key] = None
        except RuntimeError as e:
            errors[key] = str(e)
    out["errors"] = errors

    # _coalescing_manager: collectives and point to point inside it, as batch_isend_irecv uses it.
    reqs = []
    a = torch.full((4,), float(rank))
    recv = torch.empty(3)
    with c10d._coalescing_manager(None, reqs):
        reqs.append(dist.all_reduce(a, async_op=True))
        reqs.append(dist.isend(torch.full((3,), float(rank)), (rank + 1) % world))
        reqs.append(dist.irecv(recv, (rank - 1) % world))
    for r in reqs:
        r.wait()
    same("coalescing manager all_reduce", a, torch.full((4,), float(sum(range(world)))))
    same("coalescing manager recv", recv, torch.full((3,), float((rank - 1) % world)))
    got = torch.empty(2)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), (rank + 1) % world),
           dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    same("batch_isend_irecv", got, torch.full((2,), float((rank - 1) % world)))

    # batch_isend_irecv is one chorus group: written in opposite orders on even and odd ranks
    # (receive first on odd ones), 1 MiB each way, several rounds.
    n = 262144
    for rnd in range(3):
        big_out = torch.arange(n, dtype=torch.float32) + 10 * rank + rnd
        big_in = torch.empty(n)
        send_op = dist.P2POp(dist.isend, big_out, (rank + 1) % world)
        recv_op = dist.P2POp(dist.irecv, big_in, (rank - 1) % world)
        for r in dist.batch_isend_irecv([send_op, recv_op] if rank % 2 == 0 else [recv_op, send_op]):
            r.wait()
        same("batch_isend_irecv opposite orders round %d" % rnd, big_in,
             torch.arange(n, dtype=torch.float32) + 10 * ((rank - 1) % world) + rnd)

    # Inside the manager: two all_reduces (fused into one call by the group) and a PREMUL_SUM,
    # which waits for steps of its own and so fails its Work naming why; the others still run.
    reqs = []
    x, y, z = torch.full((5,), float(rank)), torch.full((3,), float(rank + 1)), torch.ones(2)
    with c10d._coalescing_manager(None, reqs):
        reqs.append(dist.all_reduce(x, async_op=True))
        reqs.append(dist.all_reduce(y, async_op=True))
        premul = dist.all_reduce(z, op=dist._make_nccl_premul_sum(2.0), async_op=True)
    for r in reqs:
        r.wait()
    same("coalescing manager fused all_reduce x", x, torch.full((5,), float(sum(range(world)))))
    same("coalescing manager fused all_reduce y", y, torch.full((3,), float(sum(range(1, world + 1)))))
    try:
        premul.wait()
        errors["premul in coalescing"] = None
    except RuntimeError as e:
        errors["premul in coalescing"] = str(e)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced(tmp_path, world):
    res = harness.run(tmp_path, world, "test_coalesced:run_coalesced")
    for r in range(world):
        assert res[r]["mismatches"] == [], "rank %d:\n%s" % (r, "\n".join(res[r]["mismatches"][:10]))
        assert res[r]["checked"] >= 300  # every comparison ran (300 at world 2)
        errors = res[r]["errors"]
        for key, msg in errors.items():
            assert msg is not None, "rank %d: %s did not raise" % (r, key)
        assert ("chorus_torch: rank %d: allreduce_coalesced" % r) in errors["mixed dtypes"], errors["mixed dtypes"]
        assert "at least one tensor" in errors["empty list"], errors["empty list"]
        assert "output lists" in errors["output lists"], errors["output lists"]
        assert "PREMUL_SUM cannot run inside torch's _coalescing_manager" in (errors["premul in coalescing"] or ""), \
            errors["premul in coalescing"]
