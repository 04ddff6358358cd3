#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The CI check of a GPU bundle (scripts/run-tests' bundle stage), on a machine without a GPU:
#   1. the bundle, copied to another folder, resolves every library of every binary from itself,
#      glibc or libcuda (ldd; libcuda may be "not found" where no driver is installed; any other
#      library not found, or found outside the bundle, fails);
#   2. run.sh ends within 10 s with exit status 3 and a summary that says NO GPU;
#   3. run.sh --sim passes (exit 0) and writes the summary in its full format (read back here).
# Where this machine does have a GPU, step 2 is skipped (run.sh would run the real check).
#
# Usage: scripts/gpu-bundle.d/check.sh BUNDLE_DIR
set -euo pipefail
src=$(realpath "${1:?usage: check.sh BUNDLE_DIR}")
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-bundle-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -a "$src" "$work/bundle"
b=$work/bundle
fail=0

echo "== gpu-bundle check: libraries (bundle copied to $b) =="
glibc='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libanl\.so)'
n=0
for f in "$b"/bin/*; do
  [[ -x $f && ! $f == *.so* ]] || continue
  n=$((n + 1))
  while read -r line; do
    name=$(awk '{print $1}' <<< "$line")
    path=$(awk '$2 == "=>" {print $3}' <<< "$line")
    [[ -n $name && $name != statically ]] || continue
    if [[ $name =~ ^libcuda\.so ]]; then
      continue  # the driver's: found or not found, never bundled
    elif [[ $path == not ]]; then
      echo "  $(basename "$f"): $name not found" >&2; fail=1
    elif [[ $name =~ $glibc ]]; then
      continue
    elif [[ -z $path && $name == /* && $name =~ /ld-linux ]]; then
      continue
    elif [[ $(realpath "$path") != "$b"/bin/* ]]; then
      echo "  $(basename "$f"): $name from $path, outside the bundle" >&2; fail=1
    fi
  done < <(ldd "$f")
done
echo "  $n binaries checked"
((n >= 7)) || { echo "  expected the GPU suite (4 or more), chorus_perf, copy_bw and pingpong" >&2; fail=1; }

if [[ -e /dev/nvidiactl ]] || command -v nvidia-smi > /dev/null; then
  echo "== gpu-bundle check: run.sh (no GPU): skipped, this machine has an NVIDIA driver =="
else
  echo "== gpu-bundle check: run.sh (no GPU) =="
  t0=$(date +%s.%N)
  rc=0
  timeout 30 "$b/run.sh" "$work/out-nogpu" > "$work/nogpu.log" 2>&1 || rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  sed 's/^/  /' "$work/nogpu.log"
  echo "  exit $rc in ${secs}s"
  if ((rc != 3)) || ! grep -q '^result: NO GPU$' "$work/out-nogpu/summary.txt" ||
     awk -v s="$secs" 'BEGIN { exit !(s >= 10) }'; then
    echo "  expected exit 3 and 'result: NO GPU' within 10 s" >&2; fail=1
  fi
fi

echo "== gpu-bundle check: run.sh --sim =="
rc=0
timeout 600 "$b/run.sh" --sim "$work/out-sim" > "$work/sim.log" 2>&1 || rc=$?
sed 's/^/  /' "$work/sim.log"
echo "  exit $rc"
s=$work/out-sim/summary.txt
if ((rc != 0)); then
  echo "  run.sh --sim failed" >&2; fail=1
fi
for want in '^result: PASS$' '^mode: sim' '^copy bandwidth' '^GPU suite: not run' '^flag ping-pong' \
            '^collective kernel on' '^  threads 2 +all_reduce ' '^  threads 8 +broadcast ' '^  processes 2 +all_gather ' \
            '^staged path'; do
  grep -Eq "$want" "$s" 2>/dev/null || { echo "  summary.txt lacks /$want/" >&2; fail=1; }
done
for f in summary.json run.log steps.tar.gz; do
  [[ -s $work/out-sim/$f ]] || { echo "  run.sh --sim wrote no $f" >&2; fail=1; }
done
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "PASS" and len(d["kernel"]) == 16, "not a PASS of 16 kernel rows"
for r in d["kernel"]:
    assert r["ok"] and r["wrong"] == 0 and r["time_8B_us"] is not None and r["floor_fraction"] is not None, r
assert all(d["pingpong"][m]["ok"] for m in ("threads", "processes")), d["pingpong"]
' "$work/out-sim/summary.json" || { echo "  summary.json unreadable, or not a PASS with every kernel row and the ping-pong" >&2; fail=1; }

if ((fail)); then
  echo "gpu-bundle check: FAIL"
  exit 1
fi
echo "gpu-bundle check: ok"
