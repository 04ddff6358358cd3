# SPDX-License-Identifier: BSD-3-Clause
"""chorus against gloo through torch.distributed, side by side: the same PyTorch code, only the
backend name differs, and both backends run the same way.

  1. all_reduce (float32, SUM, in place, blocking dist.all_reduce) at 2 and 4 ranks: time per
     call (the slowest rank's median over --loops timed loops of about --loop-seconds each) and
     bus bandwidth (nccl-tests' definition: bytes x 2 (P-1)/P / time).
  2. DDP on Fashion-MNIST (examples/03_torch_ddp_fashion_mnist, its main() unchanged) at 2 ranks:
     training images/s of the group, --ddp-epochs epochs per repetition (their mean), and the
     test accuracy after the last epoch.

Fairness. Every measurement is a fresh group of rank processes started by a launcher process of
its own; with --rt the launcher runs under `chrt -r 1` (SCHED_RR, priority 1) and every rank
inherits it, for both backends; without it, neither runs real-time. Each rank reports its
scheduling policy and the run stops if one differs from what was asked. The whole set is
repeated --repeat times (default 5) and each figure is the median over the repetitions; within
a repetition the backends alternate, chorus first in even repetitions and gloo first in odd ones,
so that a drift in the machine's load hits both alike.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch/compare.py --acceptance --rt \\
        --json bench-torch.json       # the acceptance points, both columns, about 7 minutes
    ... --ranks 2 --sizes 8 1M --skip-ddp --repeat 1          # a quick look
    ... --sizes 8 64M                                          # a sweep, 8 B to 64 MiB

--acceptance measures exactly: all_reduce 8 B and 16 MiB at 2 and 4 ranks, and DDP images/s at
2 ranks (one epoch per repetition), and prints them as one markdown table with both columns
and how many times chorus is ahead (gloo's time / chorus's time, chorus's rate / gloo's rate:
above 1 means chorus is better). The other tables and --json (every repetition's figures) come
in every mode.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE_DIR = os.path.join(ROOT, "examples", "03_torch_ddp_fashion_mnist")
BACKENDS = ["chorus", "gloo"]
POLICY_NAMES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def sweep(lo, hi):
    n = lo
    while n <= hi:
        yield n
        n *= 2 if n < 1024 else 4


def fmt_bytes(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return "%d %s" % (n // k, unit)
    return "%d B" % n


# --- what the ranks run (inside the launcher process, see worker()) ------------------------------

def report_policy(out_dir, rank):
    with open(os.path.join(out_dir, "policy-%d" % rank), "w") as f:
        f.write(str(os.sched_getscheduler(0)))


def iterations(t, target_s):
    """Calls per timed loop: about target_s seconds' worth (5 to 2000), measured on a few calls
    and agreed on by every rank (the slowest one's estimate)."""
    import torch
    import torch.distributed as dist
    t0 = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(t)
    est = torch.tensor([(time.perf_counter() - t0) / 5], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    return int(min(2000, max(5, target_s / max(float(est), 1e-7))))


def all_reduce_rank(rank, world, args):
    import torch
    import torch.distributed as dist
    report_policy(args.out_dir, rank)
    torch.set_num_threads(1)
    rows = []
    for nbytes in args.sizes:
        t = torch.ones(max(1, nbytes // 4))
        n = iterations(t, args.loop_seconds)
        for _ in range(max(5, n // 10)):  # warm-up
            dist.all_reduce(t)
        times = []
        for _ in range(args.loops):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(t)
            times.append((time.perf_counter() - t0) / n)
        # the slowest rank's median is the group's time
        med = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        s = float(med)
        rows.append({"bytes": t.numel() * 4, "us": s * 1e6, "calls_per_loop": n,
                     "busbw_GBps": t.numel() * 4 * 2 * (world - 1) / world / s / 1e9})
    if rank == 0:
        with open(os.path.join(args.out_dir, "result.json"), "w") as f:
            json.dump(rows, f)


def ddp_rank(rank, world, args):
    sys.path.insert(0, EXAMPLE_DIR)
    import main as example  # examples/03_torch_ddp_fashion_mnist/main.py
    report_policy(args.out_dir, rank)
    example.main(rank, world, args)


def worker(args):
    """The launcher: starts args.world ranks of args.backend (chorus_torch.launch: mp.spawn, a
    FileStore in a temporary folder) running all_reduce_rank or ddp_rank."""
    from chorus_torch.launch import launch
    if args.worker == "all_reduce":
        launch(all_reduce_rank, args, nprocs=args.world, backend=args.backend)
    else:
        args.json = os.path.join(args.out_dir, "result.json")  # the example writes rank 0's epochs here
        args.lr, args.threads = 0.05, 1
        launch(ddp_rank, args, nprocs=args.world, backend=args.backend)


# --- the driver ----------------------------------------------------------------------------------

def measure(kind, backend, world, args):
    """One launcher process (under chrt -r 1 with --rt) for one backend; returns rank 0's result
    after checking every rank's scheduling policy."""
    want = os.SCHED_RR if args.rt else os.SCHED_OTHER
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--backend", backend, "--world", str(world),
               "--out-dir", d, "--sizes", *[str(s) for s in args.sizes], "--loops", str(args.loops),
               "--loop-seconds", str(args.loop_seconds), "--epochs", str(args.ddp_epochs),
               "--batch", str(args.ddp_batch)]
        if args.rt:
            cmd = ["chrt", "-r", "1"] + cmd
        subprocess.run(cmd, check=True, timeout=args.run_timeout)
        for r in range(world):
            with open(os.path.join(d, "policy-%d" % r)) as f:
                got = int(f.read())
            if got != want:
                sys.exit("compare.py: %s rank %d of %d ran under %s, not %s" % (
                    backend, r, world, POLICY_NAMES.get(got, got), POLICY_NAMES[want]))
        with open(os.path.join(d, "result.json")) as f:
            return json.load(f)


def order(rep):
    return BACKENDS if rep % 2 == 0 else BACKENDS[::-1]


def median_rows(reps):
    """Per size, the median over the repetitions of the time (and the bandwidth from it)."""
    rows = []
    for i, row in enumerate(reps[0]):
        us = statistics.median(r[i]["us"] for r in reps)
        rows.append({"bytes": row["bytes"], "us": us, "busbw_GBps": row["busbw_GBps"] * row["us"] / us,
                     "us_each": [r[i]["us"] for r in reps]})
    return rows


def ddp_summary(reps):
    per_rep = [statistics.mean(e["images_per_s"] for e in r["epochs"]) for r in reps]
    return {"images_per_s": statistics.median(per_rep), "images_per_s_each": per_rep,
            "test_accuracy_each": [r["epochs"][-1]["test_accuracy"] for r in reps]}


def print_acceptance(results, args):
    print("\n### Acceptance points: median of %d repetitions, backends alternating, %s\n" % (
        args.repeat, "both under chrt -r 1" if args.rt else "neither under chrt"))
    print("| point | chorus | gloo | chorus ahead by (x) |")
    print("|---|---:|---:|---:|")
    ar = results["all_reduce"]
    for world in args.ranks:
        for i, nbytes in enumerate(args.sizes):
            c, g = ar[world]["chorus"][i], ar[world]["gloo"][i]
            if nbytes <= 1024:
                print("| all_reduce %s, %d ranks, time per call | %.1f us | %.1f us | %.2f |" % (
                    fmt_bytes(nbytes), world, c["us"], g["us"], g["us"] / c["us"]))
            else:
                print("| all_reduce %s, %d ranks, busbw | %.3f GB/s (%.0f us) | %.3f GB/s (%.0f us) | %.2f |" % (
                    fmt_bytes(nbytes), world, c["busbw_GBps"], c["us"], g["busbw_GBps"], g["us"], g["us"] / c["us"]))
    if results["ddp"]:
        c, g = results["ddp"]["chorus"], results["ddp"]["gloo"]
        print("| DDP Fashion-MNIST, 2 ranks, images/s (%d epoch per repetition) | %.0f | %.0f | %.2f |" % (
            args.ddp_epochs, c["images_per_s"], g["images_per_s"], c["images_per_s"] / g["images_per_s"]))


def driver(args):
    import torch
    if args.rt and subprocess.run(["chrt", "-r", "1", "true"]).returncode != 0:
        sys.exit("compare.py: --rt needs `chrt -r 1` to work (root or CAP_SYS_NICE)")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    results = {"date": datetime.datetime.utcnow().isoformat() + "Z", "commit": commit, "torch": torch.__version__,
               "cpus": os.cpu_count(), "rt": args.rt, "repeat": args.repeat, "sizes": args.sizes,
               "loadavg_start": os.getloadavg(), "all_reduce": {}, "ddp": {}}
    print("compare.py at %s, %s, repeat %d, %s; load average %.2f %.2f %.2f" % (
        commit, results["date"], args.repeat, "--rt (both backends under chrt -r 1)" if args.rt else "no chrt",
        *os.getloadavg()), flush=True)
    t_start = time.monotonic()
    raw = {"all_reduce": {w: {b: [] for b in BACKENDS} for w in args.ranks}, "ddp": {b: [] for b in BACKENDS}}
    for rep in range(args.repeat):
        for world in args.ranks:
            for b in order(rep):
                raw["all_reduce"][world][b].append(measure("all_reduce", b, world, args))
        if not args.skip_ddp:
            for b in order(rep):
                raw["ddp"][b].append(measure("ddp", b, 2, args))
        print("repetition %d of %d done after %.0f s" % (rep + 1, args.repeat, time.monotonic() - t_start),
              file=sys.stderr, flush=True)

    for world in args.ranks:
        best = {b: median_rows(raw["all_reduce"][world][b]) for b in BACKENDS}
        results["all_reduce"][world] = best
        print("\n### all_reduce float32 SUM through torch.distributed, %d ranks (median of %d)\n" % (
            world, args.repeat))
        print("| size | chorus us | gloo us | gloo / chorus time | chorus busbw GB/s | gloo busbw GB/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for c, g in zip(best["chorus"], best["gloo"]):
            print("| %s | %.1f | %.1f | %.2f | %.3f | %.3f |" % (
                fmt_bytes(c["bytes"]), c["us"], g["us"], g["us"] / c["us"], c["busbw_GBps"], g["busbw_GBps"]))
    if not args.skip_ddp:
        results["ddp"] = {b: ddp_summary(raw["ddp"][b]) for b in BACKENDS}
        print("\n### DDP on Fashion-MNIST, 2 ranks, batch %d per rank, %d epoch(s) per repetition\n" % (
            args.ddp_batch, args.ddp_epochs))
        print("| backend | images/s (median) | each repetition | test accuracy, each repetition |")
        print("|---|---:|---|---|")
        for b in BACKENDS:
            s = results["ddp"][b]
            print("| %s | %.0f | %s | %s |" % (b, s["images_per_s"],
                                               ", ".join("%.0f" % x for x in s["images_per_s_each"]),
                                               ", ".join("%.4f" % x for x in s["test_accuracy_each"])))
    if args.acceptance:
        print_acceptance(results, args)
    results["loadavg_end"] = os.getloadavg()
    results["seconds"] = time.monotonic() - t_start
    results["raw"] = raw
    print("\n(%.0f s; load average at the end %.2f %.2f %.2f)" % (results["seconds"], *results["loadavg_end"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--acceptance", action="store_true",
                   help="exactly the acceptance points (8 B and 16 MiB at 2 and 4 ranks, DDP 1 epoch) and their table")
    p.add_argument("--rt", action="store_true", help="every rank of both backends under chrt -r 1 (default: neither)")
    p.add_argument("--repeat", type=int, default=5, help="repetitions (each figure is their median)")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes", type=parse_bytes, nargs="+", help="all_reduce sizes in bytes (K, M suffixes); "
                   "two give a sweep from the first to the second (default 8 64M)")
    p.add_argument("--loops", type=int, default=3, help="timed loops per size in one run (their median)")
    p.add_argument("--loop-seconds", type=float, default=0.3, help="length of one timed loop")
    p.add_argument("--skip-ddp", action="store_true")
    p.add_argument("--ddp-epochs", type=int, default=1, help="epochs per repetition")
    p.add_argument("--ddp-batch", type=int, default=64, help="per rank")
    p.add_argument("--run-timeout", type=int, default=600, help="seconds one launcher may take")
    p.add_argument("--json", help="write every figure here")
    # the launcher's own arguments (measure() passes them)
    p.add_argument("--worker", choices=["all_reduce", "ddp"], help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.acceptance:
        args.sizes, args.ranks, args.ddp_epochs = [8, 16 << 20], [2, 4], 1
    elif not args.sizes:
        args.sizes = list(sweep(8, 64 << 20))
    elif len(args.sizes) == 2 and args.sizes[0] < args.sizes[1]:
        args.sizes = list(sweep(*args.sizes))
    driver(args)


if __name__ == "__main__":
    main()
