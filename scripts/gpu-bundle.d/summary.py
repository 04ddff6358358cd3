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

FORMAT = 1
COLLECTIVES = ["all_reduce", "broadcast", "reduce_scatter", "all_gather"]
PATHS = ["shm", "cuda_ipc"]
# The device path each transport must take with device buffers (CHORUS_DEBUG=INFO's
# "communicator ready" line): shm stages through pinned host memory, cuda_ipc reads directly.
EXPECTED_PATH = {"shm": "staged", "cuda_ipc": "direct"}
SIZES = {  # mode -> (largest size of the sweep, the two sizes whose busbw is reported)
    "gpu": (256 << 20, [64 << 20, 256 << 20]),
    "sim": (256 << 10, [64 << 10, 256 << 10]),
}
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
    if re.search(r"device buffers: direct reads", log):
        found.add("direct")
    if re.search(r"device buffers: staged through", log):
        found.add("staged")
    if not found:
        return "unknown"
    return found.pop() if len(found) == 1 else "mixed"


def perf_result(steps_dir, steps, coll, path, mode):
    name = "perf_%s_%s" % (coll, path)
    max_bytes, big = SIZES[mode]
    r = {"collective": coll, "path": path, "problems": []}
    st = steps.get(name)
    if st is None:
        r["problems"].append("not run")
        r["ok"] = False
        return r
    r.update(rc=st["rc"], seconds=st["seconds"])
    if st["rc"] != 0:
        r["problems"].append(status_text(st["rc"]))
    log = read(os.path.join(steps_dir, name + ".log")) or ""
    r["device_path"] = device_path(log)
    if r["device_path"] != EXPECTED_PATH[path]:
        r["problems"].append("device path %s, not %s" % (r["device_path"], EXPECTED_PATH[path]))
    doc = None
    text = read(os.path.join(steps_dir, name + ".json"))
    if text is None:
        r["problems"].append("no JSON")
    else:
        try:
            doc = json.loads(text)
        except ValueError as e:
            r["problems"].append("unreadable JSON (%s)" % e)
    if doc is not None:
        transport = doc.get("config", {}).get("transport")
        r["transport"] = transport
        if transport != path:
            r["problems"].append("transport %s, not %s" % (transport, path))
        results = doc.get("results", [])
        by_size = {row["size"]: row for row in results}
        want = []
        s = 8
        while s <= max_bytes:
            want.append(s)
            s *= 2
        missing = [size_text(s) for s in want if s not in by_size]
        if missing:
            r["problems"].append("rows missing: " + ", ".join(missing))
        r["rows"] = len(results)
        wrong = 0
        unchecked = 0
        for row in results:
            for half in ("out_of_place", "in_place"):
                nw = row.get(half, {}).get("nwrong")
                if nw is None:
                    unchecked += 1
                else:
                    wrong += nw
            if row.get("out_of_place", {}).get("nwrong") is None:
                r["problems"].append("%s out-of-place not checked" % size_text(row["size"]))
        r["wrong"] = wrong
        r["unchecked_halves"] = unchecked
        oob = doc.get("out_of_bounds", {}).get("count")
        if wrong != 0 or oob not in (0, None):
            r["problems"].append("%d wrong elements" % max(wrong, oob or 0))
        r["time_8B_us"] = by_size[8]["out_of_place"]["time"] if 8 in by_size else None
        r["busbw"] = {}
        for b in big:
            row = by_size.get(b)
            r["busbw"][str(b)] = row["out_of_place"]["bus_bw"] if row else None
    r["ok"] = not r["problems"]
    return r


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

    # The *_perf runs.
    _, big = SIZES[a.mode]
    perf = [perf_result(a.steps, steps, c, p, a.mode) for c in COLLECTIVES for p in PATHS]
    s["perf"] = perf
    s["perf_sizes"] = big
    lines.append("perf: 2 ranks on %s, float sum, out-of-place; busbw in GB/s (fraction of the copy bandwidth); "
                 "8 B time in us" % ("device 0" if a.mode == "gpu" else "the simulated runtime"))
    lines.append("  %-15s %-9s %9s %21s %21s %5s %7s %-7s %s" % (
        "collective", "path", "8 B (us)", "busbw " + size_text(big[0]), "busbw " + size_text(big[1]), "rows",
        "#wrong", "device", "status"))

    def bw(r, b):
        v = r.get("busbw", {}).get(str(b))
        if v is None:
            return "-"
        frac = " (%.3f)" % (v / limit) if limit else ""
        return "%.2f%s" % (v, frac)

    for r in perf:
        t8 = r.get("time_8B_us")
        lines.append("  %-15s %-9s %9s %21s %21s %5s %7s %-7s %s" % (
            r["collective"], r["path"], "%.1f" % t8 if t8 is not None else "-", bw(r, big[0]), bw(r, big[1]),
            r.get("rows", "-"), r.get("wrong", "-"), r.get("device_path", "-"),
            "ok" if r["ok"] else "; ".join(r["problems"])))
        if not r["ok"]:
            s["problems"].append("perf %s over %s: %s" % (r["collective"], r["path"], "; ".join(r["problems"])))
        if limit:
            r["busbw_fraction"] = {k: (v / limit if v is not None else None) for k, v in r.get("busbw", {}).items()}
    return finish("FAIL" if s["problems"] else "PASS")


if __name__ == "__main__":
    sys.exit(main())
