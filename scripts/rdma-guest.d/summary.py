#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Reads the log of a Soft-RoCE guest run (scripts/rdma-guest with scripts/rdma-guest.d/chorus.sh)
and prints chorus over rdma beside perftest on the same device in the same boot: sendrecv_perf's
bandwidth at 1 MiB and 16 MiB against ib_write_bw (one way, and both ways at once with -b, per
direction), tcp_pingpong's one-way stream against ib_write_bw, and 8-byte latency against ib_write_lat and
ib_send_lat (tcp_pingpong's ping-pong, the same pattern, and sendrecv_perf's blocking exchange), as
ratios (absolute figures under TCG emulation mean little), and the device's own floor for those
patterns (verbs_floor: raw verbs, busy polling, no library). Bandwidths come from
the times (nccl-tests' GB/s columns have two decimals, too few at tens of MB/s). sendrecv_perf runs
twice a round: as it is (every large message's buffer registered for that message) and with -R 1
(the buffers registered once, as perftest registers its own).

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


def pingpong_us(lines, size):
    """tcp_pingpong's latency table: the median (us) of the row for `size` ("8 B")."""
    for line in lines:
        f = line.split()
        if len(f) >= 4 and " ".join(f[:2]) == size:
            return float(f[2])
    return None


def stream_mbs(lines, size):
    """tcp_pingpong's bandwidth table: the median (GB/s) of the row for `size` ("1 MiB"), in MB/s."""
    for line in lines:
        f = line.split()
        if len(f) >= 5 and " ".join(f[:2]) == size:
            return float(f[3]) * 1e3
    return None


def lat_us(lines, size):
    """ib_*_lat: (t_typical, t_avg) in us of the row for `size`."""
    rows = numeric_rows(lines, size)
    if not rows:
        return None
    f = rows[-1]
    return float(f[4]), float(f[5])


def floor_us(lines, pattern):
    """verbs_floor: the median (us) of its runs of `pattern` ("send-exchange", ...)."""
    vals = [float(m.group(1)) for line in lines
            for m in [re.match(rf"\s*verbs_floor {pattern} 8 B: ([0-9.]+) us", line)] if m]
    return median(vals)


def median(values):
    v = sorted(x for x in values if x is not None)
    return v[len(v) // 2] if v else None


def main():
    with open(sys.argv[1], errors="replace") as fh:
        sec = sections(fh.read().splitlines())
    rounds = sorted({int(m.group(1)) for k in sec for m in [re.search(r" round (\d+)$", k)] if m})
    missing = []

    def per_round(name, read, *args):
        """The figure `read` gives for section "<name> round <r>" of every round, and their median."""
        vals = [read(sec.get(f"{name} round {r}", []), *args) for r in rounds]
        if not vals or any(v is None for v in vals):
            missing.append(name)
        return vals, median(vals)

    def fmt(vals, f="{:.1f}"):
        return "/".join("-" if v is None else f.format(v) for v in vals)

    print(f"rdma-guest summary (same boot, {len(rounds)} rounds, medians; chorus over rdma vs perftest on rxe0):")
    ib_meds = {}
    for size, label in ((1 << 20, "1 MiB"), (16 << 20, "16 MiB")):
        ib, ib_med = per_round(f"ib_write_bw {size}", write_bw_mbs, size)
        ib_meds[size] = ib_med
        # ib_write_bw -b reports both directions summed: half is one direction's, what
        # sendrecv_perf's algbw counts while both ranks send.
        bi, _ = per_round(f"ib_write_bw bidir {size}", write_bw_mbs, size)
        bi = [b / 2 if b else None for b in bi]
        bi_med = median(bi)
        for name, how in (("sendrecv_perf rdma 2", "sendrecv_perf"),
                          ("sendrecv_perf rdma 2 registered", "sendrecv_perf -R 1")):
            t_vals, _ = per_round(name, perf_time_us, size)
            ours = [size / t if t else None for t in t_vals]  # bytes per us = MB/s
            o_med = median(ours)
            if o_med and ib_med:
                print(f"  {label:>6} bandwidth: {how:<18} {o_med:6.1f} MB/s ({fmt(ours)}), ib_write_bw"
                      f" {ib_med:6.1f} MB/s ({fmt(ib)}): {o_med / ib_med:6.1%}")
            if o_med and bi_med:
                print(f"  {label:>6} both ways at once, per direction: {how} {o_med:6.1f} MB/s, ib_write_bw -b"
                      f" {bi_med:6.1f} MB/s ({fmt(bi)}): {o_med / bi_med:6.1%}")
    one, one_med = per_round("pingpong rdma", stream_mbs, "1 MiB")
    ib1 = ib_meds[1 << 20]
    if one_med and ib1:
        print(f"   1 MiB one way: tcp_pingpong stream {one_med:6.1f} MB/s ({fmt(one)}), ib_write_bw {ib1:6.1f} MB/s:"
              f" {one_med / ib1:6.1%}")
    pp, pp_med = per_round("pingpong rdma", pingpong_us, "8 B")
    ex, ex_med = per_round("sendrecv_perf rdma 2 blocking 8", perf_time_us, 8)
    lat = {}  # tool: (median t_typical, median t_avg)
    for tool in ("ib_write_lat", "ib_send_lat"):
        lats, _ = per_round(f"{tool} 8", lat_us, 8)
        typ, avg = lat[tool] = (median([l[0] if l else None for l in lats]), median([l[1] if l else None for l in lats]))
        if typ and pp_med:
            print(f"  8 B ping-pong, half round trip (medians): tcp_pingpong {pp_med:6.2f} us ({fmt(pp, '{:.2f}')}),"
                  f" {tool} typical {typ:6.2f} us: {pp_med / typ:4.2f}x")
        if avg and ex_med:
            print(f"  8 B sendrecv_perf -z 2, one exchange both ways at once (means): {ex_med:6.2f} us"
                  f" ({fmt(ex, '{:.2f}')}), {tool} average {avg:6.2f} us: {ex_med / avg:4.2f}x")
    # The device's floor: raw verbs with busy polling, the same patterns, the same boot.
    wp, wp_med = per_round("verbs_floor", floor_us, "write-pingpong")
    se, se_med = per_round("verbs_floor", floor_us, "send-exchange")
    we, we_med = per_round("verbs_floor", floor_us, "write-exchange")
    typ, avg = lat["ib_write_lat"]
    if wp_med and typ:
        print(f"  8 B raw verbs ping-pong (verbs_floor, ib_write_lat's pattern): {wp_med:6.2f} us ({fmt(wp, '{:.2f}')}),"
              f" ib_write_lat typical {typ:6.2f} us: {wp_med / typ:4.2f}x")
    for name, vals, med in (("send", se, se_med), ("write", we, we_med)):
        if med and avg:
            print(f"  8 B raw verbs exchange by {name} (verbs_floor, sendrecv_perf -z 2's pattern): {med:6.2f} us"
                  f" ({fmt(vals, '{:.2f}')}), ib_write_lat average {avg:6.2f} us: {med / avg:4.2f}x")
    if ex_med and se_med:
        print(f"  8 B sendrecv_perf -z 2 against the raw verbs exchange by send: {ex_med:6.2f} / {se_med:6.2f} us:"
              f" {ex_med / se_med:4.2f}x")
    if missing or not rounds:
        print("rdma-guest summary: missing from the log: " + (", ".join(sorted(set(missing))) or "every round"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
