# SPDX-License-Identifier: BSD-3-Clause
"""How the chorus backend's calls reach chorus, measured through torch.distributed at 2 ranks:

  latency  blocking dist.all_reduce of 8 B (2 float32): time per call, the median of --loops
           timed loops of --iters calls (rank 0's figure; the ranks run in lockstep);
  overlap  20 dist.all_reduce(async_op=True) of --overlap-bytes each, then wait() on all: time
           per batch of 20, the median of --loops timed loops of --batches batches.

Each repetition starts a fresh pair of rank processes per setting; the settings alternate (the
first setting first in even repetitions, the second in odd ones) and each figure is the median
over --repeat repetitions. A setting is an environment for the ranks, NAME=VALUE[,NAME=VALUE...]
(empty: the environment as it is), so two builds or two modes can be compared:

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch/issue_path.py --repeat 5
    ... --setting "" --setting CHORUS_SOMETHING=1
"""

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time


def _rank(rank, world, store_path, env, args, out):
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    import chorus_torch  # noqa: F401

    dist.init_process_group("chorus", init_method="file://" + store_path, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(2)
    for _ in range(200):
        dist.all_reduce(t)
    lat = []
    for _ in range(args.loops):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        lat.append((time.perf_counter() - t0) / args.iters)
    bufs = [torch.ones(args.overlap_bytes // 4) for _ in range(20)]
    ovl = []
    for _ in range(args.loops):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.batches):
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
            for w in works:
                w.wait()
        ovl.append((time.perf_counter() - t0) / args.batches)
    dist.destroy_process_group()
    out.put((rank, statistics.median(lat), statistics.median(ovl)))


def measure(env, args):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        procs = [ctx.Process(target=_rank, args=(r, 2, store, env, args, out)) for r in range(2)]
        for p in procs:
            p.start()
        res = {}
        for _ in procs:
            rank, lat, ovl = out.get(timeout=300)
            res[rank] = (lat, ovl)
        for p in procs:
            p.join()
    return res[0]


def parse_env(s):
    return dict(kv.split("=", 1) for kv in s.split(",") if kv)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", action="append", default=None, help="NAME=VALUE[,...] for the ranks (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loops", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--overlap-bytes", type=int, default=64 << 10)
    ap.add_argument("--json", help="write every repetition's figures here")
    args = ap.parse_args()
    settings = args.setting or [""]
    runs = {s: [] for s in settings}
    for rep in range(args.repeat):
        order = settings if rep % 2 == 0 else list(reversed(settings))
        for s in order:
            lat, ovl = measure(parse_env(s), args)
            runs[s].append((lat, ovl))
            print("rep %d %-28s latency %.1f us  overlap %.1f us per 20" % (rep, s or "(as is)", lat * 1e6, ovl * 1e6),
                  flush=True)
    print("\n| setting | all_reduce 8 B, blocking | 20 async all_reduce of %d B, then wait |" % args.overlap_bytes)
    print("|---|---:|---:|")
    for s in settings:
        lat = statistics.median(r[0] for r in runs[s]) * 1e6
        ovl = statistics.median(r[1] for r in runs[s]) * 1e6
        print("| %s | %.1f us | %.1f us |" % (s or "(as is)", lat, ovl))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
