# SPDX-License-Identifier: BSD-3-Clause
"""Point-to-point through torch.distributed on chorus: a token passed around a ring with blocking
send/recv, then every rank exchanging with both neighbours at once through isend/irecv.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/03_torch_p2p/main.py --nprocs 4
    PYTHONPATH=build/release/python /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \\
        --nproc_per_node 4 examples/03_torch_p2p/main.py            # the same under torchrun
"""

import argparse

import torch
import torch.distributed as dist

from chorus_torch.launch import launch


def main(rank, world, args):
    # 1. A token goes once around the ring, each rank adding its rank.
    token = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        dist.send(token, dst=1 % world)
        dist.recv(token, src=world - 1)
        print(f"[{args.backend}] token back at rank 0: {int(token)} (expected {sum(range(world))})", flush=True)
    else:
        dist.recv(token, src=rank - 1)
        token += rank
        dist.send(token, dst=(rank + 1) % world)

    # 2. Both neighbours at once: post everything, then wait.
    left, right = (rank - 1) % world, (rank + 1) % world
    mine = torch.full((args.elements,), float(rank))
    from_left, from_right = torch.empty_like(mine), torch.empty_like(mine)
    works = [dist.isend(mine, dst=left, tag=1), dist.isend(mine, dst=right, tag=2),
             dist.irecv(from_right, src=right, tag=1), dist.irecv(from_left, src=left, tag=2)]
    for w in works:
        w.wait()
    ok = bool((from_left == left).all()) and bool((from_right == right).all())
    print(f"[{args.backend}] rank {rank}: neighbours' {args.elements} floats {'ok' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--nprocs", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--elements", type=int, default=1 << 20)
    a = p.parse_args()
    launch(main, a, nprocs=a.nprocs, backend=a.backend)
