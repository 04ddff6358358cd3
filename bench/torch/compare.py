# SPDX-License-Identifier: BSD-3-Clause
"""chorus against gloo through torch.distributed, side by side: the same PyTorch code, only the
backend name differs.

  1. all_reduce (float32, SUM, in place, blocking dist.all_reduce) from 8 B to 64 MiB at 2 and 4
     ranks: time per call (median of --reps repetitions of a timed loop) and bus bandwidth
     (nccl-tests' definition: bytes x 2 (P-1)/P / time).
  2. DDP on Fashion-MNIST (examples/03_torch_ddp_fashion_mnist) at 2 ranks: images/s per epoch
     and the test accuracy after the last epoch.

Backends alternate (chorus, gloo, chorus, ...) so that a change in the machine's load hits both.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch/compare.py \\
        --json bench-torch.json                       # everything
    ... --skip-ddp --ranks 2 --max-bytes 1M           # a quick look

The table goes to stdout (markdown); --json writes every figure.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import chorus_torch  # noqa: F401  (registers the backend)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def sizes(lo, hi):
    n = lo
    while n <= hi:
        yield n
        n *= 2 if n < 1024 else 4


def iterations(t, target_s):
    """Calls per timed loop: about target_s seconds' worth (5 to 2000), measured on a few calls
    and agreed on by every rank (the slowest one's estimate)."""
    t0 = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(t)
    est = torch.tensor([(time.perf_counter() - t0) / 5], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    return int(min(2000, max(5, target_s / max(float(est), 1e-7))))


def all_reduce_rank(rank, world, init, backend, args, out):
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    torch.set_num_threads(1)
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        t = torch.ones(max(1, nbytes // 4))
        n = iterations(t, args.loop_seconds)
        for _ in range(max(5, n // 10)):  # warm-up
            dist.all_reduce(t)
        times = []
        for _ in range(args.reps):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(t)
            times.append((time.perf_counter() - t0) / n)
        # the slowest rank's median is the group's time
        med = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        s = float(med)
        rows.append({"bytes": t.numel() * 4, "us": s * 1e6,
                     "busbw_GBps": t.numel() * 4 * 2 * (world - 1) / world / s / 1e9})
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def run_all_reduce(world, backend, args):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "store")
        procs = [ctx.Process(target=all_reduce_rank, args=(r, world, init, backend, args, out)) for r in range(world)]
        for p in procs:
            p.start()
        rows = out.get(timeout=3600)
        for p in procs:
            p.join()
    return rows


def run_ddp(backend, args):
    """The example itself, in a process of its own (it spawns its 2 ranks), reporting through --json."""
    example = os.path.join(ROOT, "examples", "03_torch_ddp_fashion_mnist", "main.py")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ddp.json")
        subprocess.run([sys.executable, example, "--backend", backend, "--nprocs", "2", "--epochs", str(args.ddp_epochs),
                        "--batch", str(args.ddp_batch), "--json", path], check=True)
        with open(path) as f:
            return json.load(f)


def fmt_bytes(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return "%d %s" % (n // k, unit)
    return "%d B" % n


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--min-bytes", type=parse_bytes, default=8)
    p.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    p.add_argument("--reps", type=int, default=3, help="timed loops per size (the median is kept)")
    p.add_argument("--loop-seconds", type=float, default=0.3, help="length of one timed loop")
    p.add_argument("--rounds", type=int, default=1, help="alternations chorus/gloo (the best round is kept)")
    p.add_argument("--skip-ddp", action="store_true")
    p.add_argument("--ddp-epochs", type=int, default=3)
    p.add_argument("--ddp-batch", type=int, default=64, help="per rank")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args()

    backends = ["chorus", "gloo"]
    results = {"date": datetime.datetime.utcnow().isoformat() + "Z", "torch": torch.__version__,
               "cpus": os.cpu_count(), "all_reduce": {}, "ddp": {}}
    for world in args.ranks:
        best = {}
        for _ in range(args.rounds):
            for b in backends:
                rows = run_all_reduce(world, b, args)
                if b not in best:
                    best[b] = rows
                else:
                    best[b] = [min(x, y, key=lambda r: r["us"]) for x, y in zip(best[b], rows)]
        results["all_reduce"][world] = best
        print("\n### all_reduce float32 SUM through torch.distributed, %d ranks\n" % world)
        print("| size | chorus us | gloo us | chorus / gloo time | chorus busbw GB/s | gloo busbw GB/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for c, g in zip(best["chorus"], best["gloo"]):
            print("| %s | %.1f | %.1f | %.2f | %.3f | %.3f |" % (
                fmt_bytes(c["bytes"]), c["us"], g["us"], c["us"] / g["us"], c["busbw_GBps"], g["busbw_GBps"]))
        sys.stdout.flush()
    if not args.skip_ddp:
        for b in backends:
            results["ddp"][b] = run_ddp(b, args)
        print("\n### DDP on Fashion-MNIST, 2 ranks, batch %d per rank, %d epochs\n" % (args.ddp_batch, args.ddp_epochs))
        print("| backend | images/s per epoch | test accuracy after the last epoch |")
        print("|---|---|---:|")
        for b in backends:
            e = results["ddp"][b]["epochs"]
            print("| %s | %s | %.4f |" % (b, ", ".join("%.0f" % x["images_per_s"] for x in e), e[-1]["test_accuracy"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
