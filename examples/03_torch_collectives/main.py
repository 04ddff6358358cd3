# SPDX-License-Identifier: BSD-3-Clause
"""The collectives of torch.distributed on chorus, each checked against what it must give.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/03_torch_collectives/main.py --nprocs 4
    PYTHONPATH=build/release/python /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \\
        --nproc_per_node 4 examples/03_torch_collectives/main.py --backend gloo
"""

import argparse

import torch
import torch.distributed as dist

from chorus_torch.launch import launch


def main(rank, world, args):
    results = {}

    t = torch.tensor([float(rank + 1)] * 4)
    dist.all_reduce(t)  # SUM
    results["all_reduce"] = bool((t == world * (world + 1) / 2).all())

    t = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    results["all_reduce MAX"] = int(t) == world - 1

    t = torch.arange(3) if rank == 0 else torch.zeros(3, dtype=torch.int64)
    dist.broadcast(t, src=0)
    results["broadcast"] = t.tolist() == [0, 1, 2]

    t = torch.ones(5)
    dist.reduce(t, dst=world - 1)
    results["reduce"] = rank != world - 1 or bool((t == world).all())

    outs = [torch.empty(2) for _ in range(world)]
    dist.all_gather(outs, torch.tensor([rank, -rank], dtype=torch.float32))
    results["all_gather"] = [o.tolist() for o in outs] == [[r, -r] for r in range(world)]

    out = torch.empty(1)
    dist.scatter(out, [torch.tensor([10.0 * r]) for r in range(world)] if rank == 0 else None, src=0)
    results["scatter"] = float(out) == 10.0 * rank

    out = torch.empty(3)
    dist.reduce_scatter(out, [torch.full((3,), float(rank + r)) for r in range(world)])
    results["reduce_scatter"] = bool((out == sum(p + rank for p in range(world))).all())

    # all_to_all_single with uneven splits: rank r sends r + 1 rows to each peer
    inp = torch.full((world * (rank + 1), 2), float(rank))
    out = torch.empty(sum(p + 1 for p in range(world)), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[p + 1 for p in range(world)],
                           input_split_sizes=[rank + 1] * world)
    want = torch.cat([torch.full((p + 1, 2), float(p)) for p in range(world)])
    results["all_to_all_single (splits)"] = torch.equal(out, want)

    # an async all_reduce whose future is used, then a barrier
    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    results["async + future"] = bool((fut.wait()[0] == world).all())
    dist.barrier()

    bad = [k for k, ok in results.items() if not ok]
    print(f"[{args.backend}] rank {rank}: {len(results) - len(bad)}/{len(results)} collectives right"
          + (f"; WRONG: {bad}" if bad else ""), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--nprocs", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    a = p.parse_args()
    launch(main, a, nprocs=a.nprocs, backend=a.backend)
