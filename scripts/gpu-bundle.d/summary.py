#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The summary of a GPU bundle run (run.sh): reads OUTDIR/steps/ (steps.tsv, each step's log, the
*_perf JSON, copy_bw.json) and writes OUTDIR/summary.txt and OUTDIR/summary.json; the exit status
is run.sh's: 0 PASS, 1 FAIL, 3 NO GPU. Python 3 standard library only.

    summary.py --mode gpu|sim --steps OUTDIR/steps --out OUTDIR [--no-gpu | --probe-failed]
"""
import argparse
import datetime
import json
import os
import re
import sys

FORMAT = 2
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
# The collective kernel's rows: ranks as threads of one process, and as processes over cuda_ipc.
CONFIGS = [("threads", 2), ("threads", 4), ("threads", 8), ("processes", 2)]
# The device path each row must take (CHORUS_DEBUG=INFO's "communicator ready" line).
EXPECTED_PATH = {"threads": "kernel", "processes": "kernel", "shm": "staged"}
SIZES = {  # mode -> (largest size of the sweeps, the size whose time is held against the floor)
    "gpu": (1 << 30, 256 << 20),
    "sim": (256 << 10, 256 << 10),
}
# Targets of the kernel rows (the GPU issue): ranks as threads, all_reduce at k = 2.
TARGETS = {"time_8B_us": 20.0, "floor_fraction": 1.67}
EXIT = {"PASS": 0, "FAIL": 1, "NO GPU": 3}


def size_text(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_steps(steps_dir):
    rows = {}
    text = read(os.path.join(steps_dir, "steps.tsv")) or ""
    for line in text.splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) == 4:
            rows[parts[0]] = {"rc": int(parts[1]), "seconds": int(parts[2]), "timeout": int(parts[3])}
    return rows


def status_text(rc):
    if rc == 0:
        return "ok"
    if rc in (124, 137):
        return "timed out"
    if rc == 77:
        return "no GPU (77)"
    if rc > 128:
        return "killed by signal %d" % (rc - 128)
    return "exit %d" % rc


def probe_info(steps_dir):
    info = {}
    text = read(os.path.join(steps_dir, "probe.log")) or ""
    for key in ("cuda_driver_version", "cuda_runtime_version", "devices"):
        m = re.search(r"^%s: (.*)$" % key, text, re.M)
        if m:
            info[key] = m.group(1).strip()
    info["device_lines"] = re.findall(r"^device \d+: .*$", text, re.M)
    smi = read(os.path.join(steps_dir, "nvidia-smi.log")) or ""
    m = re.search(r"^name, driver_version.*\n(.+)$", smi, re.M)
    if m:
        info["nvidia_smi"] = m.group(1).strip()
    return info


def suite_results(steps_dir, steps, mode):
    """One entry per cuda_test_* step: doctest's counts, or (--sim) the cases listed."""
    out = []
    for name in sorted(steps):
        if not name.startswith("suite_"):
            continue
        rc = steps[name]["rc"]
        text = read(os.path.join(steps_dir, name + ".log")) or ""
        r = {"executable": name[len("suite_"):], "rc": rc, "seconds": steps[name]["seconds"]}
        if mode == "sim":
            m = re.search(r"\[doctest\] unskipped test cases passing the current filters: (\d+)", text)
            r["listed"] = int(m.group(1)) if m else None
            r["ok"] = rc == 0 and bool(r["listed"])
        else:
            m = re.search(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped",
                          text)
            if m:
                r.update(cases=int(m.group(1)), passed=int(m.group(2)), failed=int(m.group(3)), skipped=int(m.group(4)))
            r["ok"] = rc == 0 and m is not None and r["cases"] > 0 and r["failed"] == 0 and r["skipped"] == 0 \
                and r["passed"] == r["cases"]
        out.append(r)
    return out


def device_path(log):
    found = set()
    if re.search(r"device buffers: one collective kernel per call", log):
        found.add("kernel")
    if re.search(r"device buffers: staged through", log):
        found.add("staged")
    if not found:
        return "unknown"
    return found.pop() if len(found) == 1 else "mixed"


def perf_run(steps_dir, steps, name, expect_path, sizes):
    """One *_perf step: its status, device path, rows by size and #wrong; problems listed."""
    r = {"step": name, "problems": []}
    st = steps.get(name)
    if st is None:
        r["problems"].append("not run")
        return r, {}
    r.update(rc=st["rc"], seconds=st["seconds"])
    if st["rc"] != 0:
        r["problems"].append(status_text(st["rc"]))
    log = read(os.path.join(steps_dir, name + ".log")) or ""
    r["device_path"] = device_path(log)
    if r["device_path"] != expect_path:
        r["problems"].append("device path %s, not %s" % (r["device_path"], expect_path))
    doc = None
    text = read(os.path.join(steps_dir, name + ".json"))
    if text is None:
        r["problems"].append("no JSON")
    else:
        try:
            doc = json.loads(text)
        except ValueError as e:
            r["problems"].append("unreadable JSON (%s)" % e)
    if doc is None:
        return r, {}
    results = doc.get("results", [])
    by_size = {row["size"]: row for row in results}
    missing = [size_text(x) for x in sizes if x not in by_size]
    if missing:
        r["problems"].append("rows missing: " + ", ".join(missing))
    r["rows"] = len(results)
    wrong = 0
    for row in results:
        for half in ("out_of_place", "in_place"):
            nw = row.get(half, {}).get("nwrong")
            if nw is not None:
                wrong += nw
        if row.get("out_of_place", {}).get("nwrong") is None:
            r["problems"].append("%s out-of-place not checked" % size_text(row["size"]))
    r["wrong"] = wrong
    oob = doc.get("out_of_bounds", {}).get("count")
    if wrong != 0 or oob not in (0, None):
        r["problems"].append("%d wrong elements" % max(wrong, oob or 0))
    return r, by_size


def sweep_sizes(max_bytes):
    out, x = [], 16
    while x <= max_bytes:
        out.append(x)
        x *= 4
    return out


def kernel_row(steps_dir, steps, kind, k, coll, mode, limit):
    """A row of the collective kernel: the 8 B run and the sweep, and the big size against the floor
    k N / C (C: the copy bandwidth, bytes copied per second)."""
    max_bytes, big = SIZES[mode]
    base = "kernel_%s%d_%s" % (kind, k, coll)
    # (all_gather and reduce_scatter count n blocks in a row's size: their 8 B step asks for 8 B a rank)
    r8, by8 = perf_run(steps_dir, steps, base + "_8B", EXPECTED_PATH[kind], [])
    rs, bys = perf_run(steps_dir, steps, base + "_sweep", EXPECTED_PATH[kind], [big])
    if not by8:
        r8["problems"].append("no 8 B row")
    row = {"ranks": kind, "k": k, "collective": coll, "problems": r8["problems"] + rs["problems"],
           "wrong": r8.get("wrong", 0) + rs.get("wrong", 0), "rows": rs.get("rows", 0) + r8.get("rows", 0)}
    row["time_8B_us"] = by8[min(by8)]["out_of_place"]["time"] if by8 else None
    b = bys.get(big)
    row["big_bytes"] = big
    row["time_big_us"] = b["out_of_place"]["time"] if b else None
    row["floor_us"] = k * big / (limit * 1e9) * 1e6 if limit else None
    row["floor_fraction"] = row["time_big_us"] / row["floor_us"] if row["time_big_us"] and row["floor_us"] else None
    row["busbw_big"] = b["out_of_place"]["bus_bw"] if b else None
    row["ok"] = not row["problems"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["gpu", "sim"], required=True)
    ap.add_argument("--steps", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--probe-failed", action="store_true")
    a = ap.parse_args()
    steps = read_steps(a.steps)
    manifest = read(os.path.join(os.path.dirname(os.path.abspath(__file__)), "MANIFEST.txt")) or ""
    m = re.search(r"^commit: (.*)$", manifest, re.M)
    s = {
        "format": FORMAT,
        "mode": a.mode,
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": os.uname().nodename,
        "chorus_commit": m.group(1).strip() if m else "unknown",
        "probe": probe_info(a.steps),
        "steps": steps,
        "problems": [],
    }
    lines = []

    def finish(result):
        s["result"] = result
        head = [
            "chorus GPU check summary (format %d)" % FORMAT,
            "result: %s" % result,
            "mode: %s" % ("gpu: device 0 through the CUDA runtime" if a.mode == "gpu" else
                          "sim: the simulated CUDA runtime, no GPU (checks the steps and this format; no figure "
                          "below is a GPU's)"),
            "when: %s on %s; chorus %s" % (s["when"], s["host"], s["chorus_commit"]),
            "cuda: driver %s, runtime %s; devices: %s" % (
                s["probe"].get("cuda_driver_version", "?"), s["probe"].get("cuda_runtime_version", "?"),
                s["probe"].get("devices", "?")),
        ]
        head += ["  " + d for d in s["probe"]["device_lines"]]
        if "nvidia_smi" in s["probe"]:
            head.append("  nvidia-smi: " + s["probe"]["nvidia_smi"])
        body = lines[:]
        if s["problems"]:
            body.append("problems:")
            body += ["  - " + p for p in s["problems"]]
        body.append("steps (exit status, seconds, timeout): " + "; ".join(
            "%s %d %ds/%ds" % (k, v["rc"], v["seconds"], v["timeout"]) for k, v in steps.items()))
        with open(os.path.join(a.out, "summary.txt"), "w") as f:
            f.write("\n".join(head + body) + "\n")
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(s, f, indent=2)
            f.write("\n")
        sys.stdout.write("\n".join(head + body) + "\n")
        return EXIT[result]

    if a.no_gpu:
        lines.append("NO GPU: %s; nothing was run (run.sh exits 3)" % s["probe"].get("devices", "no device"))
        return finish("NO GPU")
    if a.probe_failed:
        s["problems"].append("the GPU probe failed (%s): see steps/probe.log" %
                             status_text(steps.get("probe", {}).get("rc", -1)))
        return finish("FAIL")

    # The limit: the copy bandwidth.
    cb = None
    text = read(os.path.join(a.steps, "copy_bw.json"))
    if text:
        try:
            cb = json.loads(text)
        except ValueError:
            cb = None
    s["copy_bw"] = cb
    if cb is None:
        s["problems"].append("copy_bw: %s, no figures" % status_text(steps.get("copy_bw", {}).get("rc", -1)))
        limit = None
    else:
        limit = cb["memcpy_gbps"]
        lines.append("copy bandwidth (%s, %s, bytes copied per second): cudaMemcpy device to device %.1f GB/s, "
                     "copy kernel %.1f GB/s; the fractions below are of the cudaMemcpy figure" % (
                         cb["where"], size_text(cb["bytes"]), cb["memcpy_gbps"], cb["kernel_gbps"])
                     if not cb.get("host") else
                     "copy bandwidth (%s, %s): memcpy %.1f GB/s, copy loop %.1f GB/s; the fractions below are of the "
                     "memcpy figure" % (cb["where"], size_text(cb["bytes"]), cb["memcpy_gbps"], cb["kernel_gbps"]))

    # The GPU suite.
    suite = suite_results(a.steps, steps, a.mode)
    s["suite"] = suite
    if a.mode == "sim":
        listed = sum(r.get("listed") or 0 for r in suite)
        lines.append("GPU suite: not run (--sim: the GPU suite has no simulated mode); its %d executables load and "
                     "list %d test cases" % (len(suite), listed))
        for r in suite:
            lines.append("  %-28s %s test cases listed, %s" % (r["executable"], r.get("listed"), status_text(r["rc"])))
            if not r["ok"]:
                s["problems"].append("%s did not list its test cases (%s)" % (r["executable"], status_text(r["rc"])))
    else:
        tot = {k: sum(r.get(k, 0) for r in suite) for k in ("cases", "passed", "failed", "skipped")}
        s["suite_totals"] = tot
        lines.append("GPU suite (REQUIRE_GPU=1): %d executables, %d test cases: %d passed, %d failed, %d skipped" % (
            len(suite), tot["cases"], tot["passed"], tot["failed"], tot["skipped"]))
        for r in suite:
            counts = ("%d passed, %d failed, %d skipped" % (r["passed"], r["failed"], r["skipped"])
                      if "cases" in r else "no doctest summary")
            lines.append("  %-28s %s; %s, %ds" % (r["executable"], counts, status_text(r["rc"]), r["seconds"]))
            if not r["ok"]:
                s["problems"].append("GPU suite: %s: %s, %s" % (r["executable"], counts, status_text(r["rc"])))
        if not suite:
            s["problems"].append("GPU suite: no executable ran")

    # The flag ping-pong.
    s["pingpong"] = {}
    pp_text = []
    for m in ("threads", "processes"):
        st = steps.get("pingpong_" + m)
        doc = None
        text = read(os.path.join(a.steps, "pingpong_%s.json" % m))
        if text:
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
        s["pingpong"][m] = doc
        if st is None or st["rc"] != 0 or doc is None or not doc.get("ok"):
            s["problems"].append("pingpong %s: %s" % (m, status_text(st["rc"]) if st else "not run"))
            pp_text.append("%s -" % m)
        else:
            pp_text.append("%s %.2f us" % (m, doc["us_per_handoff"]))
    lines.append("flag ping-pong between two spinning kernels (%s), per hand-off: %s" % (
        "device 0" if a.mode == "gpu" else "host threads and processes: --sim", "; ".join(pp_text)))

    # The collective kernel's rows.
    max_bytes, big = SIZES[a.mode]
    rows = [kernel_row(a.steps, steps, kind, k, c, a.mode, limit) for kind, k in CONFIGS for c in COLLECTIVES]
    s["kernel"] = rows
    s["kernel_big_bytes"] = big
    lines.append("collective kernel on %s, float sum, out-of-place: 8 B time per call (1000 calls on each rank's "
                 "stream); %s: time, the floor k N / C, time / floor (targets, threads all_reduce k = 2: 8 B <= %g us, "
                 "%s <= %g of the floor)" % ("device 0" if a.mode == "gpu" else "the simulated runtime",
                                             size_text(big), TARGETS["time_8B_us"], size_text(big),
                                             TARGETS["floor_fraction"]))
    lines.append("  %-11s %-15s %9s %12s %11s %8s %9s %5s %7s %s" % (
        "ranks", "collective", "8 B (us)", size_text(big) + " (us)", "floor (us)", "/floor", "busbw", "rows",
        "#wrong", "status"))

    def num(v, f):
        return f % v if v is not None else "-"

    for r in rows:
        lines.append("  %-11s %-15s %9s %12s %11s %8s %9s %5s %7s %s" % (
            "%s %d" % (r["ranks"], r["k"]), r["collective"], num(r["time_8B_us"], "%.1f"), num(r["time_big_us"], "%.1f"),
            num(r["floor_us"], "%.1f"), num(r["floor_fraction"], "%.2f"), num(r["busbw_big"], "%.2f"), r["rows"],
            r["wrong"], "ok" if r["ok"] else "; ".join(r["problems"])))
        if not r["ok"]:
            s["problems"].append("kernel %s %d %s: %s" % (r["ranks"], r["k"], r["collective"], "; ".join(r["problems"])))
    if a.mode == "gpu":
        t = next((r for r in rows if r["ranks"] == "threads" and r["k"] == 2 and r["collective"] == "all_reduce"), None)
        met = t is not None and t["time_8B_us"] is not None and t["floor_fraction"] is not None and \
            t["time_8B_us"] <= TARGETS["time_8B_us"] and t["floor_fraction"] <= TARGETS["floor_fraction"]
        s["targets_met"] = met
        lines.append("targets (threads, all_reduce, k = 2): %s" % ("met" if met else "NOT met"))

    # The staged path, for comparison.
    shm, by = perf_run(a.steps, steps, "perf_all_reduce_shm", EXPECTED_PATH["shm"], [8] + sweep_sizes(max_bytes)[1:])
    s["staged"] = shm
    lines.append("staged path (all_reduce over shm, 2 processes): 8 B %s us, %s busbw %s GB/s, #wrong %s, %s" % (
        num(by[8]["out_of_place"]["time"] if 8 in by else None, "%.1f"), size_text(big),
        num(by[big]["out_of_place"]["bus_bw"] if big in by else None, "%.2f"), shm.get("wrong", "-"),
        "ok" if not shm["problems"] else "; ".join(shm["problems"])))
    if shm["problems"]:
        s["problems"].append("staged all_reduce over shm: " + "; ".join(shm["problems"]))
    return finish("FAIL" if s["problems"] else "PASS")


if __name__ == "__main__":
    sys.exit(main())
