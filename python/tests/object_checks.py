# SPDX-License-Identifier: BSD-3-Clause
"""What the ranks of test_objects.py run: object collectives and batch_isend_irecv on the chorus
default group, each result compared with what it must be (every rank can make every rank's
objects and tensors).

run_all() returns {"failures": {category: [message, ...]}, "checks": {category: n}}."""

import traceback

import torch
import torch.distributed as dist

# Pickled sizes from about 30 B to 200 KiB: which rank gets which depends on the rank and the call,
# so every call mixes sizes (torch pads to the largest and trims back).
BLOB_BYTES = [0, 7, 1500, 200_000, 33]
P2P_SHAPES = [(torch.float32, 7), (torch.int64, 13), (torch.float16, 1031), (torch.bool, 3), (torch.bfloat16, 1),
              (torch.uint8, 65537), (torch.float64, 0)]


def make_obj(rank, salt):
    """A picklable object unique to (rank, salt), its pickled size set by BLOB_BYTES."""
    n = BLOB_BYTES[(rank * 3 + salt) % len(BLOB_BYTES)]
    blob = (bytes(range(251)) * (n // 251 + 1))[rank % 251:rank % 251 + n]
    return {"rank": rank, "salt": salt, "text": "rank %d salt %d" % (rank, salt) * (salt + 1), "blob": blob,
            "nested": [None, (rank, -salt, 1.5 * rank), {"set": {rank, salt}}],
            "tensor": torch.arange(rank + salt + 1, dtype=torch.float64) * 0.25}


def same(a, b):
    """Equality that understands tensors inside containers."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) == type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def brief(obj):
    r = repr(obj)
    return r if len(r) <= 200 else r[:200] + "... (%d characters)" % len(r)


def make_tensor(src, dst, k, dtype, n):
    """The k-th tensor src sends to dst: values unique to (src, dst, k), exact in every dtype."""
    g = torch.Generator().manual_seed(src * 10007 + dst * 101 + k)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    hi = 100 if dtype in (torch.uint8, torch.float16, torch.bfloat16) else 1000
    return torch.randint(0, hi, (n,), generator=g).to(dtype)


class Checks:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.failures, self.checks = {}, {}

    def expect(self, category, ok, message):
        self.checks[category] = self.checks.get(category, 0) + 1
        if not ok:
            self.failures.setdefault(category, []).append("rank %d: %s" % (self.rank, message))

    def guarded(self, category, fn):
        try:
            fn()
        except Exception:
            self.failures.setdefault(category, []).append("rank %d raised:\n%s" % (self.rank, traceback.format_exc()))

    # --- object collectives -------------------------------------------------------------------

    def all_gather_object(self, salt=0, group=None, members=None):
        members = list(range(self.world)) if members is None else members
        out = [None] * len(members)
        dist.all_gather_object(out, make_obj(self.rank, salt), group=group)
        for i, r in enumerate(members):
            self.expect("all_gather_object" if group is None else "subgroup_objects",
                        same(out[i], make_obj(r, salt)), "all_gather_object salt %d: entry %d (rank %d) differs: %s"
                        % (salt, i, r, brief(out[i])))

    def broadcast_object_list(self, src, salt=0, group=None):
        count = 3
        objs = [make_obj(src, salt + k) for k in range(count)]
        got = list(objs) if self.rank == src else [None] * count
        dist.broadcast_object_list(got, src=src, group=group)
        self.expect("broadcast_object_list" if group is None else "subgroup_objects",
                    same(got, objs), "broadcast_object_list from %d salt %d: got %s" % (src, salt, brief(got)))

    def scatter_object_list(self, src, salt=0):
        inputs = [make_obj(src, salt + 10 * dst) for dst in range(self.world)] if self.rank == src else None
        out = [None]
        dist.scatter_object_list(out, inputs, src=src)
        self.expect("scatter_object_list", same(out[0], make_obj(src, salt + 10 * self.rank)),
                    "scatter_object_list from %d salt %d: got %s" % (src, salt, brief(out[0])))

    def gather_object(self, dst, salt=0):
        out = [None] * self.world if self.rank == dst else None
        dist.gather_object(make_obj(self.rank, salt), out, dst=dst)
        if self.rank == dst:
            for r in range(self.world):
                self.expect("gather_object", same(out[r], make_obj(r, salt)),
                            "gather_object to %d salt %d: entry %d differs: %s" % (dst, salt, r, brief(out[r])))
        else:
            self.expect("gather_object", out is None, "gather_object changed a non-destination's list")

    # --- batch_isend_irecv --------------------------------------------------------------------

    def batch_ring(self):
        """Each rank sends every P2P_SHAPES tensor to the next rank and receives the previous one's,
        sends and receives interleaved in one batch."""
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        ops, bufs = [], []
        for k, (dtype, n) in enumerate(P2P_SHAPES):
            ops.append(dist.P2POp(dist.isend, make_tensor(self.rank, nxt, k, dtype, n), nxt))
            bufs.append(torch.full((n,), 1, dtype=dtype) if dtype == torch.bool else torch.full((n,), 77, dtype=dtype))
            ops.append(dist.P2POp(dist.irecv, bufs[-1], prv))
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for k, (dtype, n) in enumerate(P2P_SHAPES):
            self.expect("batch_isend_irecv_ring", torch.equal(bufs[k], make_tensor(prv, self.rank, k, dtype, n)),
                        "ring: tensor %d (%s, %d elements) from %d differs" % (k, dtype, n, prv))

    def batch_all_pairs(self):
        """Every rank sends every P2P_SHAPES tensor to every other rank, each on its own tag (k + 1);
        the receives are posted in the reverse tag order, so they match by (source, tag)."""
        ops, bufs = [], {}
        for p in range(self.world):
            if p == self.rank:
                continue
            sends = [dist.P2POp(dist.isend, make_tensor(self.rank, p, k, dtype, n), p, tag=k + 1)
                     for k, (dtype, n) in enumerate(P2P_SHAPES)]
            recvs = []
            for k, (dtype, n) in reversed(list(enumerate(P2P_SHAPES))):
                bufs[p, k] = torch.zeros(n, dtype=dtype)
                recvs.append(dist.P2POp(dist.irecv, bufs[p, k], p, tag=k + 1))
            # The lower rank of each pair posts its receives first, the higher one its sends.
            ops += recvs + sends if self.rank < p else sends + recvs
        works = dist.batch_isend_irecv(ops)
        self.expect("batch_isend_irecv_all_pairs", len(works) == len(ops),
                    "batch_isend_irecv returned %d works for %d ops" % (len(works), len(ops)))
        for w in works:
            w.wait()
        for (p, k), buf in sorted(bufs.items()):
            dtype, n = P2P_SHAPES[k]
            self.expect("batch_isend_irecv_all_pairs", torch.equal(buf, make_tensor(p, self.rank, k, dtype, n)),
                        "all pairs: tensor %d (%s, %d elements, tag %d) from %d differs" % (k, dtype, n, k + 1, p))


def run_all(rank, world):
    c = Checks(rank, world)
    for salt in range(3):
        c.guarded("all_gather_object", lambda: c.all_gather_object(salt))
    for src in range(world):
        c.guarded("broadcast_object_list", lambda: c.broadcast_object_list(src, salt=src))
        c.guarded("scatter_object_list", lambda: c.scatter_object_list(src, salt=src))
        c.guarded("gather_object", lambda: c.gather_object(src, salt=src))
    # A sub-group: the first and the last rank (every rank calls new_group; only members use it).
    members = [0, world - 1]
    sub = dist.new_group(members)
    if rank in members:
        c.guarded("subgroup_objects", lambda: c.all_gather_object(salt=5, group=sub, members=members))
        c.guarded("subgroup_objects", lambda: c.broadcast_object_list(world - 1, salt=6, group=sub))
    for _ in range(2):  # twice: the second batch follows traffic already matched
        c.guarded("batch_isend_irecv_ring", c.batch_ring)
        c.guarded("batch_isend_irecv_all_pairs", c.batch_all_pairs)
    dist.barrier()
    return {"failures": c.failures, "checks": c.checks}
