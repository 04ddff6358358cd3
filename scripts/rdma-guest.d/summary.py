#!/usr/bin/env python3
"""Reads the log of a Soft-RoCE guest run (scripts/rdma-guest with scripts/rdma-guest.d/chorus.sh)
and prints chorus's sendrecv_perf over rdma beside perftest on the same device in the same boot:
bandwidth at 1 MiB and 16 MiB against ib_write_bw, and 8-byte latency against ib_write_lat and
ib_send_lat, as ratios (absolute figures under TCG emulation mean little). Bandwidths come from
the times (nccl-tests' GB/s columns have two decimals, too few at tens of MB/s).

Usage: summary.py GUEST_LOG. Prints the table; exits 1 when a figure is missing. It asserts no
speed: the ratios are for the reader (and the closing note)."""

import re
import sys


def sections(lines):
    """{name: [lines]} between 'CHORUS-SECTION <name>' markers."""
    out, name = {}, None
    for line in lines:
        m = re.match(r"\s*CHORUS-SECTION (.+?)\s*$", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def numeric_rows(lines, first):
    """Rows whose first field is the integer `first`, split into fields."""
    rows = []
    for line in lines:
        f = line.split()
        if f and f[0] == str(first):
            rows.append(f)
    return rows


def perf_time_us(lines, size):
    """nccl-tests table: out-of-place time (us) of the row for `size` bytes."""
    rows = numeric_rows(lines, size)
    return float(rows[0][5]) if rows else None


def write_bw_mbs(lines, size):
    """ib_write_bw --report_gbits: the average bandwidth (Gb/s) of the row for `size`, in MB/s."""
    rows = numeric_rows(lines, size)
    return float(rows[-1][3]) * 1e3 / 8 if rows else None


def lat_us(lines, size):
    """ib_*_lat: (t_typical, t_avg) in us of the row for `size`."""
    rows = numeric_rows(lines, size)
    if not rows:
        return None
    f = rows[-1]
    return float(f[4]), float(f[5])


def main():
    with open(sys.argv[1], errors="replace") as fh:
        sec = sections(fh.read().splitlines())
    missing = []

    def need(value, what):
        if value is None:
            missing.append(what)
        return value

    sr = sec.get("sendrecv_perf rdma 2", [])
    print("rdma-guest summary (same boot; sendrecv_perf over rdma vs perftest on rxe0):")
    for size, label in ((1 << 20, "1 MiB"), (16 << 20, "16 MiB")):
        t = need(perf_time_us(sr, size), f"sendrecv_perf {label}")
        ib = need(write_bw_mbs(sec.get(f"ib_write_bw {size}", []), size), f"ib_write_bw {label}")
        if t is not None and ib is not None:
            ours = size / t  # bytes per us = MB/s
            print(f"  {label:>6}: sendrecv_perf {ours:9.1f} MB/s, ib_write_bw {ib:9.1f} MB/s, ratio {ours / ib:6.1%}")
    t8 = need(perf_time_us(sr, 8), "sendrecv_perf 8 B")
    for tool in ("ib_write_lat", "ib_send_lat"):
        lat = need(lat_us(sec.get(f"{tool} 8", []), 8), f"{tool} 8 B")
        if t8 is not None and lat is not None:
            typ, avg = lat
            print(f"  8 B: sendrecv_perf {t8:8.2f} us, {tool} typical {typ:8.2f} us (ratio {t8 / typ:5.2f}x),"
                  f" average {avg:8.2f} us (ratio {t8 / avg:5.2f}x)")
    if missing:
        print("rdma-guest summary: missing from the log: " + ", ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
