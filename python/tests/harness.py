# SPDX-License-Identifier: BSD-3-Clause
"""Ranks as processes for the chorus_torch tests.

    results = harness.run(tmp_path, world=2, target="op_checks:run_all")

starts `world` processes, each joins a process group through a FileStore under tmp_path (no
ports; or a TCPStore the caller hosts on a port the kernel chose), calls
target(rank, world, *args) and sends back its return value or its traceback. run() returns
{rank: value}; it raises AssertionError naming each rank that failed, died or did not finish
within `timeout` seconds (the ones still running are killed, so nothing outlives a test).

The ranks are forked from a forkserver (one per pytest worker, started at its first run) that
imported torch and chorus_torch once, as test_exit.py's are: a rank then costs no interpreter start
and no import of torch (about 1.4 CPU-s each). The suite (116 tests, two workers) took 76 s of
wall and 133 CPU-s of the machine against 137 s and 254 with multiprocessing's spawn context (a
fresh interpreter per rank): medians of 3, alternating, one machine. A forked rank gets the
caller's os.environ of the moment (the server's is that of the first run), and ends with
os._exit, as any forked multiprocessing child does: exit with a live group is test_exit.py's
subject.
"""

import datetime
import importlib
import multiprocessing
import os
import queue as queue_mod
import time
import traceback


def _child(rank, world, store_path, backend, pg_timeout, target, args, out, env):
    try:
        os.environ.clear()  # the caller's environment now (monkeypatch.setenv), not the server's
        os.environ.update(env)
        import torch.distributed as dist

        import chorus_torch  # noqa: F401  (registers the backend)

        timeout = datetime.timedelta(seconds=pg_timeout)
        if isinstance(store_path, int):  # the port of a TCPStore the parent hosts
            store = dist.TCPStore("127.0.0.1", store_path, world, False, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group(
                backend, init_method="file://" + store_path, rank=rank, world_size=world, timeout=timeout)
        module, fn = target.split(":")
        value = getattr(importlib.import_module(module), fn)(rank, world, *args)
        out.put((rank, "ok", value))
    except BaseException:  # report everything, KeyboardInterrupt included
        out.put((rank, "error", traceback.format_exc()))


def forkserver(*modules):
    """multiprocessing's forkserver context, its server preloading torch, torch.distributed,
    chorus_torch and `modules` (the caller's own, whose functions its children run). The server is
    one per process, started by its first child, and preloads the list given before that start; a
    module not in it is imported by the child that needs it."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "chorus_torch", *modules])
    return ctx


def run(tmp_path, world, target, *args, backend="chorus", timeout=240, pg_timeout=60, may_die=(), tcp_port=None):
    """Runs target on `world` ranks; returns {rank: value}. Ranks in `may_die` may end without a
    result (a test that kills them); the others must return. With tcp_port, the ranks meet through
    the TCPStore the caller hosts on that port instead of a FileStore."""
    ctx = forkserver()
    out = ctx.Queue()
    store_path = tcp_port if tcp_port is not None else os.path.join(str(tmp_path), "store-%d" % time.monotonic_ns())
    procs = [
        ctx.Process(
            target=_child,
            args=(r, world, store_path, backend, pg_timeout, target, args, out, dict(os.environ)),
            daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = time.monotonic() + timeout
    expected = set(range(world)) - set(may_die)
    try:
        while not expected <= set(results) | set(errors):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, value = out.get(timeout=min(left, 0.5))
            except queue_mod.Empty:
                # A rank that died without a word (a crash) is reported at once.
                dead = [r for r in expected - set(results) - set(errors) if procs[r].exitcode is not None]
                for r in dead:
                    try:  # its message may still be in the pipe
                        rank, status, value = out.get(timeout=1.0)
                    except queue_mod.Empty:
                        errors[r] = "exited with code %s without a result" % procs[r].exitcode
                        continue
                    (results if status == "ok" else errors)[rank] = value
                continue
            (results if status == "ok" else errors)[rank] = value
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    missing = expected - set(results) - set(errors)
    if errors or missing:
        lines = ["rank %d failed:\n%s" % (r, errors[r]) for r in sorted(errors)]
        lines += ["rank %d did not finish within %d s" % (r, timeout) for r in sorted(missing)]
        raise AssertionError("\n".join(lines))
    return results


def shared(group, *values, id=None):
    """pytest.param(*values) for a test of a run_once group: the tests marked with one group go to
    one pytest-xdist worker under --dist loadgroup (scripts/run-tests), which runs the group of
    processes once. Each worker has its own cache, so a group whose tests two workers shared ran
    twice (the 4-rank op checks: about 32 s each time)."""
    import pytest

    return pytest.param(*values, marks=pytest.mark.xdist_group(group), id=id)


def run_once(cache, key, tmp_path_factory, world, target, *args, **kwargs):
    """run() once per key for a module whose tests share one group of processes: the first test
    that asks runs it, the others get its results, or its failure again. `cache` is the module's
    dict."""
    if key not in cache:
        try:
            cache[key] = run(tmp_path_factory.mktemp("run"), world, target, *args, **kwargs)
        except AssertionError as e:
            cache[key] = e
    if isinstance(cache[key], AssertionError):
        raise cache[key]
    return cache[key]


def check_category(results, category):
    """For checks that return {"failures": {category: [message]}, "checks": {category: n}} from
    every rank: no failure in `category`, and at least one check ran."""
    failures = [m for r in sorted(results) for m in results[r]["failures"].get(category, [])]
    assert not failures, "\n".join(failures)
    assert sum(results[r]["checks"].get(category, 0) for r in results) > 0, "no checks ran for %s" % category
