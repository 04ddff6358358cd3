# SPDX-License-Identifier: BSD-3-Clause
"""What the ranks of test_ops.py run: every c10d operation on the chorus backend, against a
reference computed here in Python from every rank's inputs (each rank can make any rank's inputs),
and against the gloo backend (a gloo group over the same ranks) wherever gloo supports the call.

run_all() returns {"failures": {category: [message, ...]}, "checks": {category: n},
"gloo": {category: n compared with gloo}}; one category per operation (and per op for
all_reduce), so that the parent reports each as its own test.
"""

import threading
import traceback

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
SIZES = [0, 1, 7, 13, 1031]
BIG_SIZES = [65537, (1 << 20) + 3]  # several pipeline slices (float32 and int64 only)
OPS = {
    "SUM": ReduceOp.SUM, "AVG": ReduceOp.AVG, "PRODUCT": ReduceOp.PRODUCT, "MIN": ReduceOp.MIN,
    "MAX": ReduceOp.MAX, "BAND": ReduceOp.BAND, "BOR": ReduceOp.BOR, "BXOR": ReduceOp.BXOR,
}
BITWISE = {"BAND", "BOR", "BXOR"}
AVG_RTOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-12}


def seed_of(*parts):
    s = 17
    for p in parts:
        s = (s * 1000003 + int(p)) % (1 << 31)
    return s


def make(rank, dtype, n, seed, kind="sum"):
    """Rank `rank`'s input: small integers, so that sums and products are exact in every dtype."""
    g = torch.Generator().manual_seed(seed_of(seed, rank, DTYPES.index(dtype), n))
    if dtype is torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    signed = dtype is not torch.uint8
    if kind == "prod":
        vals = torch.tensor([-2, -1, 1, 2] if signed else [1, 2, 3, 1])
        return vals[torch.randint(0, 4, (n,), generator=g)].to(dtype)
    if kind == "bits" and dtype not in FLOATS:
        info = torch.iinfo(dtype)
        lo, hi = max(info.min, -(1 << 31)), min(info.max, (1 << 31) - 1)
        return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)
    return (torch.randint(-8, 9, (n,), generator=g) if signed else torch.randint(0, 17, (n,), generator=g)).to(dtype)


def kind_of(op):
    return "prod" if op == "PRODUCT" else "bits" if op in BITWISE else "sum"


def reference(inputs, op, dtype, world):
    """op over the ranks' inputs, computed wide (float64 / int64) and cast back."""
    if dtype is torch.bool:
        x = torch.stack(inputs)
        if op in ("SUM", "MAX", "BOR"):
            return x.any(0) if x.shape[1] else x[0]
        if op in ("PRODUCT", "MIN", "BAND"):
            return x.all(0) if x.shape[1] else x[0]
        r = inputs[0]
        for v in inputs[1:]:
            r = torch.logical_xor(r, v)
        return r
    wide = torch.float64 if dtype in FLOATS else torch.int64
    x = torch.stack([i.to(wide) for i in inputs])
    if op == "SUM":
        r = x.sum(0)
    elif op == "PRODUCT":
        r = x.prod(0)
    elif op == "MIN":
        r = x.min(0).values if x.shape[1] else x[0]
    elif op == "MAX":
        r = x.max(0).values if x.shape[1] else x[0]
    elif op == "AVG":
        r = x.sum(0) / world if dtype in FLOATS else torch.div(x.sum(0), world, rounding_mode="trunc")
    else:
        f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        r = x[0]
        for v in x[1:]:
            r = f(r, v)
    return r.to(dtype)


def same(got, want, dtype, op=None):
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if op == "AVG" and dtype in FLOATS:
        return torch.allclose(got.double(), want.double(), rtol=AVG_RTOL[dtype], atol=0)
    return torch.equal(got, want)


class Checks:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.failures, self.checks, self.gloo = {}, {}, {}
        self.gloo_group = dist.new_group(backend="gloo")

    def expect(self, category, ok, what):
        self.checks[category] = self.checks.get(category, 0) + 1
        if not ok and len(self.failures.setdefault(category, [])) < 20:
            self.failures[category].append("rank %d: %s" % (self.rank, what))
        self.failures.setdefault(category, [])

    def section(self, category, fn):
        try:
            fn()
        except Exception:
            self.failures.setdefault(category, []).append("rank %d: %s" % (self.rank, traceback.format_exc()))

    def with_gloo(self, n, category, fn, compare):
        """Runs fn on the gloo group; compare(result) when gloo supports the call. Not for n == 0:
        torch 1.13's gloo dies of SIGFPE on an empty all_gather."""
        if n == 0:
            return
        try:
            result = fn(self.gloo_group)
        except RuntimeError:
            return  # gloo does not support this dtype or op
        self.gloo[category] = self.gloo.get(category, 0) + 1
        compare(result)

    def expect_error(self, category, fn, words):
        try:
            fn()
        except RuntimeError as e:
            msg = str(e)
            ok = ("rank %d" % self.rank) in msg and all(w in msg for w in words)
            self.expect(category, ok, "error message %r lacks rank %d or %s" % (msg, self.rank, words))
            return
        self.expect(category, False, "no error raised (expected one mentioning %s)" % (words,))

    # ---- all_reduce -------------------------------------------------------------------------------
    def all_reduce(self, name):
        op = OPS[name]
        cat = "all_reduce_" + name
        for dtype in DTYPES:
            sizes = SIZES + (BIG_SIZES if name == "SUM" and dtype in (torch.float32, torch.int64) else [])
            for n in sizes:
                seed = seed_of(1, list(OPS).index(name), n)
                inputs = [make(r, dtype, n, seed, kind_of(name)) for r in range(self.world)]
                valid = not (name in BITWISE and dtype in FLOATS) and not (name == "AVG" and dtype is torch.bool)
                if not valid:
                    t = inputs[self.rank].clone()
                    self.expect_error(cat, lambda: dist.all_reduce(t, op=op), ["allreduce"])
                    continue
                t = inputs[self.rank].clone()
                dist.all_reduce(t, op=op)
                want = reference(inputs, name, dtype, self.world)
                self.expect(cat, same(t, want, dtype, name), "%s %s n=%d: got %s want %s" % (name, dtype, n, t[:8], want[:8]))
                if n <= 1031:
                    def on_gloo(g, src=inputs[self.rank]):
                        x = src.clone()
                        dist.all_reduce(x, op=op, group=g)
                        return x
                    self.with_gloo(n, cat, on_gloo, lambda x, t=t, dtype=dtype, n=n: self.expect(
                        cat, same(t, x, dtype, name), "%s %s n=%d differs from gloo" % (name, dtype, n)))
        # non-contiguous in place (every other element of a matrix column)
        if name == "SUM":
            base = torch.zeros(13, 2)
            base[:, 0] = make(self.rank, torch.float32, 13, 99)
            col = base[:, 0]
            dist.all_reduce(col)
            want = reference([make(r, torch.float32, 13, 99) for r in range(self.world)], "SUM", torch.float32, self.world)
            self.expect(cat, torch.equal(base[:, 0], want) and torch.equal(base[:, 1], torch.zeros(13)),
                        "non-contiguous all_reduce")

    # ---- rooted and gathering collectives ---------------------------------------------------------
    def broadcast(self):
        cat = "broadcast"
        root = self.world - 1
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(2, n)
                t = make(self.rank, dtype, n, seed)
                dist.broadcast(t, src=root)
                self.expect(cat, torch.equal(t, make(root, dtype, n, seed)), "%s n=%d" % (dtype, n))
                def on_gloo(g, dtype=dtype, n=n, seed=seed):
                    x = make(self.rank, dtype, n, seed)
                    dist.broadcast(x, src=root, group=g)
                    return x
                self.with_gloo(n, cat, on_gloo, lambda x, t=t: self.expect(cat, torch.equal(t, x), "differs from gloo"))
        base = torch.zeros(7, 3, dtype=torch.int64)
        col = base[:, 1]
        col.copy_(make(self.rank, torch.int64, 7, 5))
        dist.broadcast(col, src=0)
        self.expect(cat, torch.equal(base[:, 1], make(0, torch.int64, 7, 5)) and int(base[:, 0].abs().sum()) == 0,
                    "non-contiguous broadcast")

    def reduce(self):
        cat = "reduce"
        root = 1 % self.world
        for dtype in DTYPES:
            for name in ("SUM", "MAX"):
                for n in SIZES:
                    seed = seed_of(3, n, name == "SUM")
                    inputs = [make(r, dtype, n, seed) for r in range(self.world)]
                    t = inputs[self.rank].clone()
                    dist.reduce(t, dst=root, op=OPS[name])
                    if self.rank == root:
                        want = reference(inputs, name, dtype, self.world)
                        self.expect(cat, torch.equal(t, want), "%s %s n=%d" % (name, dtype, n))
                        def on_gloo(g, src=inputs[self.rank], name=name):
                            x = src.clone()
                            dist.reduce(x, dst=root, op=OPS[name], group=g)
                            return x
                        self.with_gloo(n, cat, on_gloo, lambda x, t=t: self.expect(cat, torch.equal(t, x), "differs from gloo"))
                    else:
                        self.expect(cat, torch.equal(t, inputs[self.rank]), "non-root tensor changed")
                        self.with_gloo(n, cat, lambda g, src=inputs[self.rank], name=name: dist.reduce(
                            src.clone(), dst=root, op=OPS[name], group=g), lambda x: None)

    def all_gather(self):
        cat = "all_gather"
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(4, n)
                outs = [torch.full((n,), 1, dtype=dtype) for _ in range(self.world)]
                dist.all_gather(outs, make(self.rank, dtype, n, seed))
                ok = all(torch.equal(outs[r], make(r, dtype, n, seed)) for r in range(self.world))
                self.expect(cat, ok, "%s n=%d" % (dtype, n))
                def on_gloo(g, dtype=dtype, n=n, seed=seed):
                    o = [torch.empty(n, dtype=dtype) for _ in range(self.world)]
                    dist.all_gather(o, make(self.rank, dtype, n, seed), group=g)
                    return o
                self.with_gloo(n, cat, on_gloo, lambda o, outs=outs: self.expect(
                    cat, all(torch.equal(a, b) for a, b in zip(outs, o)), "differs from gloo"))

    def all_gather_into_tensor(self):
        cat = "all_gather_into_tensor"
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(5, n)
                out = torch.empty(self.world * n, dtype=dtype)
                dist.all_gather_into_tensor(out, make(self.rank, dtype, n, seed))
                want = torch.cat([make(r, dtype, n, seed) for r in range(self.world)])
                self.expect(cat, torch.equal(out, want), "%s n=%d" % (dtype, n))
                def on_gloo(g, dtype=dtype, n=n, seed=seed):
                    o = torch.empty(self.world * n, dtype=dtype)
                    dist.all_gather_into_tensor(o, make(self.rank, dtype, n, seed), group=g)
                    return o
                self.with_gloo(n, cat, on_gloo, lambda o, out=out: self.expect(cat, torch.equal(out, o), "differs from gloo"))

    def gather(self):
        cat = "gather"
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(6, n)
                outs = [torch.empty(n, dtype=dtype) for _ in range(self.world)] if self.rank == 0 else None
                dist.gather(make(self.rank, dtype, n, seed), gather_list=outs, dst=0)
                if self.rank == 0:
                    ok = all(torch.equal(outs[r], make(r, dtype, n, seed)) for r in range(self.world))
                    self.expect(cat, ok, "%s n=%d" % (dtype, n))
                else:
                    self.expect(cat, True, "")
                def on_gloo(g, dtype=dtype, n=n, seed=seed):
                    o = [torch.empty(n, dtype=dtype) for _ in range(self.world)] if self.rank == 0 else None
                    dist.gather(make(self.rank, dtype, n, seed), gather_list=o, dst=0, group=g)
                    return o
                self.with_gloo(n, cat, on_gloo, lambda o, outs=outs: self.expect(
                    cat, o is None or all(torch.equal(a, b) for a, b in zip(outs, o)), "differs from gloo"))

    def scatter(self):
        cat = "scatter"
        root = self.world - 1
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(7, n)
                ins = [make(p, dtype, n, seed) for p in range(self.world)] if self.rank == root else None
                out = torch.empty(n, dtype=dtype)
                dist.scatter(out, scatter_list=ins, src=root)
                self.expect(cat, torch.equal(out, make(self.rank, dtype, n, seed)), "%s n=%d" % (dtype, n))
                def on_gloo(g, ins=ins, dtype=dtype, n=n):
                    o = torch.empty(n, dtype=dtype)
                    dist.scatter(o, scatter_list=ins, src=root, group=g)
                    return o
                self.with_gloo(n, cat, on_gloo, lambda o, out=out: self.expect(cat, torch.equal(out, o), "differs from gloo"))

    def reduce_scatter(self):
        cat = "reduce_scatter"
        for dtype in DTYPES:
            for name in ("SUM", "MIN", "BXOR"):
                if name in BITWISE and dtype in FLOATS:
                    continue
                for n in SIZES:
                    seed = seed_of(8, n, list(OPS).index(name))
                    # rank r's block j: make(r, ..., seed + j)
                    ins = [make(self.rank, dtype, n, seed + j, kind_of(name)) for j in range(self.world)]
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter(out, ins, op=OPS[name])
                    want = reference([make(r, dtype, n, seed + self.rank, kind_of(name)) for r in range(self.world)],
                                     name, dtype, self.world)
                    self.expect(cat, torch.equal(out, want), "list %s %s n=%d" % (name, dtype, n))
                    flat = torch.cat(ins)
                    out2 = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter_tensor(out2, flat, op=OPS[name])
                    self.expect(cat, torch.equal(out2, want), "tensor %s %s n=%d" % (name, dtype, n))
                    def on_gloo(g, ins=ins, name=name, dtype=dtype, n=n):
                        o = torch.empty(n, dtype=dtype)
                        dist.reduce_scatter(o, ins, op=OPS[name], group=g)
                        return o
                    self.with_gloo(n, cat, on_gloo, lambda o, out=out: self.expect(cat, torch.equal(out, o), "differs from gloo"))

    # ---- uneven all_gather and reduce_scatter (chorus's all_gather_v, reduce_scatter_v) -------------
    def uneven_sizes(self, n):
        """Elements of rank p's block: different per rank, 0 among them where n allows."""
        return [(n + 3 * p) % (n + 5) for p in range(self.world)]

    def all_gather_uneven(self):
        """all_gather into output tensors of different sizes: rank p's holds what rank p gives
        (1-D, and rows of 3 as a batch of variable length)."""
        cat = "all_gather_uneven"
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(11, n)
                sizes = self.uneven_sizes(n)
                outs = [torch.full((sizes[p],), 1, dtype=dtype) for p in range(self.world)]
                dist.all_gather(outs, make(self.rank, dtype, sizes[self.rank], seed))
                ok = all(torch.equal(outs[p], make(p, dtype, sizes[p], seed)) for p in range(self.world))
                self.expect(cat, ok, "%s sizes=%s" % (dtype, sizes))
                rows = [torch.empty((sizes[p], 3), dtype=dtype) for p in range(self.world)]
                dist.all_gather(rows, make(self.rank, dtype, 3 * sizes[self.rank], seed + 1).view(-1, 3))
                ok = all(torch.equal(rows[p], make(p, dtype, 3 * sizes[p], seed + 1).view(-1, 3)) for p in range(self.world))
                self.expect(cat, ok, "rows of 3 %s sizes=%s" % (dtype, sizes))
        # This rank's output tensor must match its input: an error on every rank, before anything moves.
        bad = [torch.empty(p + 2) for p in range(self.world)]
        self.expect_error(cat, lambda: dist.all_gather(bad, torch.zeros(1)), ["allgather", "output tensor of this rank"])

    def reduce_scatter_uneven(self):
        """reduce_scatter from input tensors of different sizes: the one for rank p holds rank p's block."""
        cat = "reduce_scatter_uneven"
        for dtype in DTYPES:
            for name in ("SUM", "MIN", "BXOR"):
                if name in BITWISE and dtype in FLOATS:
                    continue
                for n in SIZES:
                    seed = seed_of(12, n, list(OPS).index(name))
                    sizes = self.uneven_sizes(n)
                    ins = [make(self.rank, dtype, sizes[j], seed + j, kind_of(name)) for j in range(self.world)]
                    out = torch.empty(sizes[self.rank], dtype=dtype)
                    dist.reduce_scatter(out, ins, op=OPS[name])
                    want = reference([make(r, dtype, sizes[self.rank], seed + self.rank, kind_of(name))
                                      for r in range(self.world)], name, dtype, self.world)
                    self.expect(cat, torch.equal(out, want), "%s %s sizes=%s" % (name, dtype, sizes))

    # ---- PREMUL_SUM ----------------------------------------------------------------------------------
    def premul_sum(self):
        """PREMUL_SUM (torch.distributed._make_nccl_premul_sum): every rank's input times the factor
        (taken in the tensor's dtype, as NCCL takes it), then summed; the factor as a float and as a
        one-element tensor; all_reduce, reduce (the other ranks' tensors unchanged), reduce_scatter
        (list, tensor, uneven) and all_reduce_coalesced."""
        cat = "premul_sum"
        w, me = self.world, self.rank
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32):
            for n in SIZES:
                for factor in (2.0, 0.5, [torch.tensor(3.0)]):
                    f = factor[0].item() if isinstance(factor, list) else factor
                    op = dist._make_nccl_premul_sum(factor)
                    scale = lambda x: x * torch.scalar_tensor(f, dtype=dtype)
                    seed = seed_of(13, n, DTYPES.index(dtype))
                    what = "%s n=%d factor %s" % (dtype, n, factor)
                    want = reference([scale(make(r, dtype, n, seed)) for r in range(w)], "SUM", dtype, w)
                    t = make(me, dtype, n, seed)
                    dist.all_reduce(t, op=op)
                    self.expect(cat, torch.equal(t, want), "all_reduce " + what)
                    t = make(me, dtype, n, seed)
                    dist.reduce(t, dst=w - 1, op=op)
                    self.expect(cat, torch.equal(t, want if me == w - 1 else make(me, dtype, n, seed)), "reduce " + what)
                    a, b = make(me, dtype, n, seed), make(me, dtype, n, seed + 1)
                    dist.all_reduce_coalesced([a, b], op=op)
                    want_b = reference([scale(make(r, dtype, n, seed + 1)) for r in range(w)], "SUM", dtype, w)
                    self.expect(cat, torch.equal(a, want) and torch.equal(b, want_b), "all_reduce_coalesced " + what)
                    ins = [make(me, dtype, n, seed + 2 + j) for j in range(w)]
                    want_rs = reference([scale(make(r, dtype, n, seed + 2 + me)) for r in range(w)], "SUM", dtype, w)
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter(out, ins, op=op)
                    self.expect(cat, torch.equal(out, want_rs), "reduce_scatter " + what)
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter_tensor(out, torch.cat(ins), op=op)
                    self.expect(cat, torch.equal(out, want_rs), "reduce_scatter_tensor " + what)
                    sizes = self.uneven_sizes(n)
                    ins = [make(me, dtype, sizes[j], seed + 3 + j) for j in range(w)]
                    want_u = reference([scale(make(r, dtype, sizes[me], seed + 3 + me)) for r in range(w)], "SUM", dtype, w)
                    out = torch.empty(sizes[me], dtype=dtype)
                    dist.reduce_scatter(out, ins, op=op)
                    self.expect(cat, torch.equal(out, want_u), "uneven reduce_scatter " + what)
        self.expect_error(cat, lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist._make_nccl_premul_sum(2.0)),
                          ["allreduce", "PREMUL_SUM", "bool"])

    # ---- all_to_all -------------------------------------------------------------------------------
    @staticmethod
    def split(src, dst, n):
        """Rows rank src sends to rank dst: 0, primes, and n."""
        return [0, 1, 7, 13, 2, n][(src + 2 * dst + n) % 6]

    def all_to_all_single(self):
        cat = "all_to_all_single"
        w = self.world
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(9, n)
                # equal splits
                inp = make(self.rank, dtype, w * n, seed)
                out = torch.empty(w * n, dtype=dtype)
                dist.all_to_all_single(out, inp)
                want = torch.cat([make(p, dtype, w * n, seed)[self.rank * n:(self.rank + 1) * n] for p in range(w)])
                self.expect(cat, torch.equal(out, want), "equal %s n=%d" % (dtype, n))
                def on_gloo(g, inp=inp, dtype=dtype, n=n):
                    o = torch.empty(w * n, dtype=dtype)
                    dist.all_to_all_single(o, inp, group=g)
                    return o
                self.with_gloo(n, cat, on_gloo, lambda o, out=out: self.expect(cat, torch.equal(out, o), "differs from gloo"))
                # split sizes (rows of 3 elements)
                ins = [self.split(self.rank, p, n) for p in range(w)]
                outs = [self.split(p, self.rank, n) for p in range(w)]
                def rows_of(src):
                    total = sum(self.split(src, p, n) for p in range(w))
                    return make(src, dtype, 3 * total, seed + 1).view(total, 3)
                inp = rows_of(self.rank)
                out = torch.empty(sum(outs), 3, dtype=dtype)
                dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins)
                parts = []
                for p in range(w):
                    start = sum(self.split(p, q, n) for q in range(self.rank))
                    parts.append(rows_of(p)[start:start + self.split(p, self.rank, n)])
                self.expect(cat, torch.equal(out, torch.cat(parts)), "splits %s n=%d" % (dtype, n))
                def on_gloo(g, inp=inp, ins=ins, outs=outs, dtype=dtype):
                    o = torch.empty(sum(outs), 3, dtype=dtype)
                    dist.all_to_all_single(o, inp, output_split_sizes=outs, input_split_sizes=ins, group=g)
                    return o
                self.with_gloo(n, cat, on_gloo, lambda o, out=out: self.expect(cat, torch.equal(out, o), "differs from gloo"))

    def all_to_all(self):
        cat = "all_to_all"
        w = self.world
        for dtype in DTYPES:
            for n in SIZES:
                seed = seed_of(10, n)
                send = [make(self.rank, dtype, self.split(self.rank, p, n), seed + p) for p in range(w)]
                recv = [torch.empty(self.split(p, self.rank, n), dtype=dtype) for p in range(w)]
                dist.all_to_all(recv, send)
                ok = all(torch.equal(recv[p], make(p, dtype, self.split(p, self.rank, n), seed + self.rank)) for p in range(w))
                self.expect(cat, ok, "uneven %s n=%d" % (dtype, n))
                send = [make(self.rank, dtype, n, seed + 50 + p) for p in range(w)]
                recv = [torch.empty(n, dtype=dtype) for p in range(w)]
                dist.all_to_all(recv, send)
                ok = all(torch.equal(recv[p], make(p, dtype, n, seed + 50 + self.rank)) for p in range(w))
                self.expect(cat, ok, "equal %s n=%d" % (dtype, n))

    # ---- point to point ---------------------------------------------------------------------------
    def send_recv(self):
        cat = "send_recv"
        w, r = self.world, self.rank
        nxt, prv = (r + 1) % w, (r - 1) % w
        for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
            for n in SIZES + [1 << 20]:
                seed = seed_of(11, n)
                # blocking, in an order that cannot deadlock: even ranks send first
                got = torch.empty(n, dtype=dtype)
                mine = make(r, dtype, n, seed)
                if r % 2 == 0:
                    dist.send(mine, dst=nxt, tag=3)
                    dist.recv(got, src=prv, tag=3)
                else:
                    dist.recv(got, src=prv, tag=3)
                    dist.send(mine, dst=nxt, tag=3)
                self.expect(cat, torch.equal(got, make(prv, dtype, n, seed)), "blocking ring %s n=%d" % (dtype, n))
                # isend/irecv both ways at once, two tags, received in the other order
                a, b = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
                works = [dist.isend(make(r, dtype, n, seed + 1), dst=nxt, tag=5),
                         dist.isend(make(r, dtype, n, seed + 2), dst=nxt, tag=7),
                         dist.irecv(b, src=prv, tag=7), dist.irecv(a, src=prv, tag=5)]
                for wk in reversed(works):
                    wk.wait()
                self.expect(cat, torch.equal(a, make(prv, dtype, n, seed + 1)) and torch.equal(b, make(prv, dtype, n, seed + 2)),
                            "isend/irecv %s n=%d" % (dtype, n))
        # recv without src (any source) returns the sender: the left neighbour, the only one sending on tag 9
        got = torch.empty(3)
        wk = dist.isend(make(r, torch.float32, 3, 99), dst=nxt, tag=9)
        src = dist.recv(got, tag=9)
        wk.wait()
        self.expect(cat, src == prv and torch.equal(got, make(prv, torch.float32, 3, 99)),
                    "recv without src returned rank %s (expected %d)" % (src, prv))

    def barrier(self):
        cat = "barrier"
        for _ in range(5):
            dist.barrier()
        self.expect(cat, True, "")
        # torch 1.13 routes monitored_barrier to gloo only; it says so.
        try:
            dist.monitored_barrier()
            self.expect(cat, False, "monitored_barrier did not raise")
        except RuntimeError as e:
            self.expect(cat, "GLOO" in str(e), "monitored_barrier: %s" % e)

    # ---- groups, async, errors --------------------------------------------------------------------
    def subgroups(self):
        cat = "subgroups"
        w, r = self.world, self.rank
        pair = dist.new_group([0, w - 1])
        evens = dist.new_group([p for p in range(w) if p % 2 == 0])
        odds = dist.new_group([p for p in range(w) if p % 2 == 1])
        if r in (0, w - 1):
            t = torch.tensor([float(r + 1)] * 5)
            dist.all_reduce(t, group=pair)
            self.expect(cat, torch.equal(t, torch.tensor([float(w + 1)] * 5)), "pair all_reduce %s" % t)
        mine = evens if r % 2 == 0 else odds
        members = [p for p in range(w) if p % 2 == r % 2]
        t = torch.tensor([r], dtype=torch.int64)
        dist.all_reduce(t, group=mine)
        self.expect(cat, int(t) == sum(members), "parity all_reduce %d" % int(t))
        b = torch.tensor([r * 10], dtype=torch.int64)
        dist.broadcast(b, src=members[-1], group=mine)  # src is a global rank
        self.expect(cat, int(b) == members[-1] * 10, "parity broadcast %d" % int(b))
        outs = [torch.empty(1, dtype=torch.int64) for _ in members]
        dist.all_gather(outs, torch.tensor([r]), group=mine)
        self.expect(cat, [int(o) for o in outs] == members, "parity all_gather %s" % outs)
        # a sub-group and the world in flight at once
        x = torch.ones(1031)
        y = torch.ones(1031)
        wx = dist.all_reduce(x, async_op=True)
        wy = dist.all_reduce(y, group=mine, async_op=True)
        wy.wait()
        wx.wait()
        self.expect(cat, bool((x == w).all()) and bool((y == len(members)).all()), "world and sub-group at once")

    def async_work(self):
        cat = "async"
        ts = [torch.full((13,), float(self.rank + i)) for i in range(6)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for wk in reversed(works):
            self.expect(cat, wk.wait(), "wait returned False")
        s = sum(range(self.world))
        self.expect(cat, all(bool((t == s + self.world * i).all()) for i, t in enumerate(ts)), "results")
        # a future completes with nobody calling wait(): a callback sets an event
        t = torch.ones(7)
        fut = dist.all_reduce(t, async_op=True).get_future()
        done = threading.Event()
        fut.then(lambda f: done.set())
        self.expect(cat, done.wait(60), "future did not complete without wait()")
        self.expect(cat, bool((t == self.world).all()) and bool((fut.value()[0] == self.world).all()), "future value")
        # is_completed turns true by itself too
        t = torch.ones(3)
        wk = dist.broadcast(t, src=0, async_op=True)
        ev = threading.Event()
        wk.get_future().then(lambda f: ev.set())
        self.expect(cat, ev.wait(60) and wk.is_completed(), "is_completed")

    def call_errors(self):
        cat = "errors"
        self.expect_error(cat, lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), ["allreduce", "int16"])
        self.expect_error(cat, lambda: dist.all_reduce(torch.ones(3), op=ReduceOp.BAND), ["allreduce", "BAND", "float32"])
        self.expect_error(cat, lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=ReduceOp.AVG), ["AVG", "bool"])
        self.expect_error(cat, lambda: dist.broadcast(torch.ones(3), src=self.world + 3), ["broadcast"])
        # the group is still usable after refused calls (nothing was sent)
        t = torch.ones(2)
        dist.all_reduce(t)
        self.expect(cat, bool((t == self.world).all()), "usable after errors")


def run_all(rank, world):
    c = Checks(rank, world)
    for name in OPS:
        c.section("all_reduce_" + name, lambda name=name: c.all_reduce(name))
    for fn in ("broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
               "all_gather_uneven", "reduce_scatter_uneven", "premul_sum", "all_to_all_single", "all_to_all", "send_recv", "barrier", "subgroups", "async_work", "call_errors"):
        c.section(fn if fn != "async_work" else "async", getattr(c, fn))
    dist.barrier()
    return {"failures": c.failures, "checks": c.checks, "gloo": c.gloo}
