# SPDX-License-Identifier: BSD-3-Clause
"""Nothing hangs at exit (issue 34): a program as a user writes it, ranks meeting through
init_method="tcp://..." (rank 0's process serves torch's TCPStore), a few steps of collectives
(list all_to_all with uneven sizes among them) whose tensors are dropped as each step returns,
then destroy_process_group() on every rank, run 25 times at 3 ranks and 25 times at 4. Every
rank must exit with code 0 within RUN_TIMEOUT seconds.

The hang this guards against: a group's threads (the dispatcher, the communicator's worker) may
drop the last reference to a tensor whose Python object the program has already let go; torch
then frees that object under the GIL. destroy_process_group() destroys the group from Python with
the GIL held and waited for those threads: a deadlock. Before ~ProcessGroupChorus released the
GIL for that wait, 21 of 50 runs of this program hung (this test stops after MAX_HANGS, about
70 s); after, 0 of 100.

Cheap: the ranks are forked from a forkserver that imported torch and chorus_torch once, so a run
costs no interpreter start, and two runs go at once.
"""

import datetime
import os
import shutil
import socket
import subprocess
import time

import pytest

import harness

RUNS = {3: 25, 4: 25}
RUN_TIMEOUT = 30.0  # seconds for one run (rendezvous to exit); a clean run takes about a second
PARALLEL = 2        # runs at once
MAX_HANGS = 3       # stop early once this many runs hung (each costs RUN_TIMEOUT)


# ---- what each rank runs ---------------------------------------------------------------------------

def _step(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.full((16,), float(rank))
    dist.all_reduce(t)
    assert t[0].item() == sum(range(world))
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=world - 1)
    assert b[0].item() == world - 1
    g = [torch.empty(3) for _ in range(world)]
    dist.all_gather(g, torch.full((3,), float(rank)))
    assert [x[0].item() for x in g] == list(range(world))
    dist.barrier()
    pending = dist.all_reduce(torch.ones(8), async_op=True)  # its tensor is only the Work's
    # list all_to_all, uneven: rank r sends r + p + 1 elements to rank p
    ins = [torch.full((rank + p + 1,), float(rank)) for p in range(world)]
    outs = [torch.empty(p + rank + 1) for p in range(world)]
    dist.all_to_all(outs, ins)
    assert [o[0].item() for o in outs] == list(range(world))
    pending.wait()


def _rank_main(rank, world, port):
    import torch.distributed as dist

    import chorus_torch  # noqa: F401  (registers the backend)

    dist.init_process_group("chorus", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=RUN_TIMEOUT))
    for _ in range(3):
        _step(rank, world)
    _last(rank, world)
    dist.destroy_process_group()


def _last(rank, world):
    import torch
    import torch.distributed as dist

    works = [dist.all_reduce(torch.ones(8), async_op=True) for _ in range(4)]  # tensors only the Works'
    for w in works:
        w.wait()


# ---- the driver ------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stacks(pid):
    """Every thread's stack of a hung rank (gdb), for the failure message."""
    if not shutil.which("gdb"):
        return "(no gdb for stacks)"
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                           capture_output=True, text=True, timeout=60)
        keep = ("Thread ", "chorus", "TensorImpl", "PyEval", "join", "wait")
        return "\n".join(l[:200] for l in r.stdout.splitlines()
                         if l.startswith("Thread ") or (l.startswith("#") and any(k in l for k in keep)))[:6000]
    except (OSError, subprocess.TimeoutExpired) as e:
        return "(gdb failed: %s)" % e


class _Run:
    def __init__(self, ctx, world):
        self.world = world
        self.port = _free_port()
        self.procs = [ctx.Process(target=_rank_main, args=(r, world, self.port), daemon=True) for r in range(world)]
        for p in self.procs:
            p.start()
        self.deadline = time.monotonic() + RUN_TIMEOUT

    def poll(self):
        """None while running; else (hung, failure text or None)."""
        if all(p.exitcode is not None for p in self.procs):
            codes = [p.exitcode for p in self.procs]
            if any(codes):
                return False, "world %d: exit codes %s" % (self.world, codes)
            return False, None
        if time.monotonic() < self.deadline:
            return None
        alive = [r for r, p in enumerate(self.procs) if p.exitcode is None]
        text = "world %d: rank(s) %s still running after %.0f s (exit codes %s)" % (
            self.world, alive, RUN_TIMEOUT, [p.exitcode for p in self.procs])
        text += "\nstacks of rank %d:\n%s" % (alive[0], _stacks(self.procs[alive[0]].pid))
        self.kill()
        return True, text

    def kill(self):
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
        for p in self.procs:
            p.join()


def run_many(runs, parallel=PARALLEL, max_hangs=MAX_HANGS):
    """Runs the program runs[world] times at each world size, `parallel` runs at once. Returns
    (runs done, hangs, failure texts)."""
    ctx = harness.forkserver(__name__)
    todo = [w for w, n in sorted(runs.items()) for _ in range(n)]
    active, done, hangs, failures = [], 0, 0, []
    try:
        while todo or active:
            while todo and len(active) < parallel and hangs < max_hangs:
                active.append(_Run(ctx, todo.pop(0)))
            if not active:
                break
            time.sleep(0.05)
            for run in list(active):
                res = run.poll()
                if res is None:
                    continue
                active.remove(run)
                done += 1
                hung, text = res
                hangs += hung
                if text:
                    failures.append(text)
    finally:
        for run in active:
            run.kill()
    return done, hangs, failures


def test_no_hang_at_exit():
    t0 = time.monotonic()
    total = sum(RUNS.values())
    done, hangs, failures = run_many(RUNS)
    elapsed = time.monotonic() - t0
    assert not failures and done == total, "%d of %d runs done in %.0f s, %d hung (stopped after %d hangs):\n%s" % (
        done, total, elapsed, hangs, MAX_HANGS, "\n\n".join(failures[:3]))


if __name__ == "__main__":  # counts without stopping early: python3 test_exit.py [runs per world size]
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    t0 = time.monotonic()
    done, hangs, failures = run_many({3: n, 4: n}, max_hangs=2 * n)
    print("runs %d, hangs %d, other failures %d, %.0f s" % (done, hangs, len(failures) - hangs, time.monotonic() - t0))
    for f in failures:
        print(f.splitlines()[0])
