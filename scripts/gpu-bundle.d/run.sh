#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The chorus GPU check, from the folder scripts/gpu-bundle builds (docs/gpu-bundle.md). Needs only
# an x86-64 Linux with a CUDA driver (libcuda), bash, coreutils' timeout and python3 (stdlib).
#
#   run.sh OUTDIR          on the GPU (device 0): the copy bandwidth, a flag ping-pong between two
#                          kernels (two threads, two processes), the collective kernel's *_perf rows
#                          (ranks as threads, k = 2, 4, 8; as processes over cuda_ipc, k = 2: 8 B
#                          over 1000 calls, and 16 B to 1 GiB), all_reduce over shm (the staged
#                          path), the GPU suite with REQUIRE_GPU=1; never longer than
#                          CHORUS_BUNDLE_BUDGET_S (docs/gpu-bundle.md)
#   run.sh --sim OUTDIR    the same steps on the simulated CUDA runtime (no GPU needed; small sizes),
#                          so that the steps and the summary's format are checked anywhere
#
# OUTDIR gets four files: summary.txt (read this), summary.json, run.log (this script's output)
# and steps.tar.gz (every step's log and JSON, also left unpacked in OUTDIR/steps/).
#
# Exit status: 0 PASS, 1 FAIL (a test failed or skipped, a wrong result, a step that crashed or
# timed out), 2 usage, 3 NO GPU (no driver, no device: nothing was run; not a pass).
#
# Every step runs under its own `timeout`, shortened where needed so that the whole run stays
# within CHORUS_BUNDLE_BUDGET_S seconds (default 360: 6 minutes of a borrowed GPU's 15).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$here/bin
sim=0
out=
for a in "$@"; do
  case $a in
    --sim) sim=1 ;;
    -h|--help) sed -n '3,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $a (see --help)" >&2; exit 2 ;;
    *) [[ -z $out ]] || { echo "run.sh: one OUTDIR only" >&2; exit 2; }; out=$a ;;
  esac
done
[[ -n $out ]] || { echo "usage: run.sh [--sim] OUTDIR" >&2; exit 2; }
mkdir -p "$out/steps" || exit 2
out=$(cd "$out" && pwd)
steps=$out/steps
rm -f "$steps"/* "$out"/summary.txt "$out"/summary.json "$out"/steps.tar.gz
exec > >(tee "$out/run.log") 2>&1
tee_pid=$!

budget=${CHORUS_BUNDLE_BUDGET_S:-360}
start=$SECONDS
mode=gpu
((sim)) && mode=sim
printf 'step\trc\tseconds\ttimeout\n' > "$steps/steps.tsv"
echo "chorus GPU check ($mode) on $(hostname), $(date -u '+%Y-%m-%d %H:%M:%S UTC'); budget ${budget}s; results in $out"

# step NAME TIMEOUT CMD...: runs CMD with stdout and stderr in steps/NAME.log, under timeout
# TIMEOUT (cut to what is left of the budget), and records its exit status and time in
# steps/steps.tsv; returns CMD's exit status (124: timed out or no time left).
step() {
  local name=$1 t=$2 left rc t0=$SECONDS
  shift 2
  left=$((budget - (SECONDS - start)))
  ((t > left)) && t=$left
  if ((t < 5)); then
    echo "no time left in the ${budget}s budget" > "$steps/$name.log"
    rc=124
  else
    timeout -k 10 "$t" "$@" > "$steps/$name.log" 2>&1
    rc=$?
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$t" >> "$steps/steps.tsv"
  printf '  %-28s exit %3s  %4ss (timeout %ss)\n' "$name" "$rc" "$((SECONDS - t0))" "$t"
  return "$rc"
}

summarize() {
  local rc
  python3 "$here/summary.py" --mode "$mode" --steps "$steps" --out "$out" "$@"
  rc=$?
  tar -czf "$out/steps.tar.gz" -C "$out" steps 2>/dev/null
  echo "run.sh: $(sed -n 's/^result: //p' "$out/summary.txt" 2>/dev/null | head -n 1) in $((SECONDS - start))s (exit $rc); see $out/summary.txt"
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null  # run.log complete before the exit
  exit "$rc"
}

command -v python3 > /dev/null || { echo "run.sh: python3 is needed for the summary" >&2; exit 1; }

# 1. Versions, and whether there is a GPU at all (a few seconds where there is none).
echo "versions and devices:"
step probe 60 "$bin/copy_bw" --probe
probe_rc=$?
if command -v nvidia-smi > /dev/null; then
  step nvidia-smi 30 bash -c 'nvidia-smi; echo; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv'
else
  echo "nvidia-smi: not installed here" > "$steps/nvidia-smi.log"
fi
uname -a > "$steps/host.log"
if ((!sim)); then
  if ((probe_rc == 77)); then
    summarize --no-gpu
  elif ((probe_rc != 0)); then
    summarize --probe-failed
  fi
fi

# 2. The limit: the device's own copy bandwidth (host memory's under --sim).
echo "copy bandwidth:"
if ((sim)); then
  step copy_bw 60 "$bin/copy_bw" --host --bytes 64M --iters 10 --json "$steps/copy_bw.json"
else
  step copy_bw 60 "$bin/copy_bw" --bytes 256M --iters 20 --json "$steps/copy_bw.json"
fi

# 3. The GPU suite's quick executables (the collective matrix, the longest, comes last).
gpu_test() {
  local exe=$1 t=$2 name
  name=$(basename "$exe")
  if ((sim)); then  # no simulated mode: only check that it loads and lists its cases
    step "suite_$name" 30 "$exe" --list-test-cases
  else
    step "suite_$name" "$t" env REQUIRE_GPU=1 "$exe" --duration=true
  fi
}
echo "GPU suite$( ((sim)) && echo ' (--sim: listed, not run)'):"
for exe in "$bin"/cuda_test_*; do
  [[ $(basename "$exe") == cuda_test_collectives ]] || gpu_test "$exe" 120
done

# 4. The hand-off of a device flag between two spinning kernels: two threads of one process (one
# context, side by side) and two processes (time-sliced without MPS): the time-slice question.
echo "flag ping-pong:"
host_flag=()
((sim)) && host_flag=(--host)
for m in threads processes; do
  step "pingpong_$m" 60 "$bin/pingpong" "${host_flag[@]}" --mode "$m" --iters "$( ((sim)) && echo 2000 || echo 10000)" \
    --json "$steps/pingpong_$m.json"
done

# 5. The collective kernel, ranks as threads on device 0 (k = 2, 4, 8) and as processes (k = 2, over
# cuda_ipc): per row, 8 B (a rank's: all_gather and reduce_scatter's rows count k blocks) over
# 1000 calls on each rank's stream, then a sweep from 16 B by 4 to
# the largest size (256 MiB and 1 GiB among them; --sim: 256 KiB). Then the staged path (shm) for
# comparison. CHORUS_DEBUG=INFO makes each rank say which device path its communicator took.
if ((sim)); then
  device=sim max=256K iters=5 warm=1
else
  device=cuda max=1G iters=20 warm=5
fi
echo "collective kernel (-g 1 --device $device; 8 B: -n 1000; sweep: -b 16 -e $max -f 4):"
for config in threads:2 threads:4 threads:8 processes:2; do
  kind=${config%%:*} k=${config##*:}
  transport=inproc
  [[ $kind == processes ]] && transport=cuda_ipc
  for coll in all_reduce reduce_scatter all_gather broadcast; do
    name=kernel_${kind}${k}_${coll}
    small=8  # bytes a rank sends: all_gather's and reduce_scatter's sizes count every rank's block
    [[ $coll == all_gather || $coll == reduce_scatter ]] && small=$((8 * k))
    step "${name}_8B" 60 env CHORUS_DEBUG=INFO "$bin/chorus_perf" "${coll}_perf" -b "$small" -e "$small" -n 1000 -w 20 -g 1 \
      --device "$device" --nranks "$k" --transport "$transport" -J "$steps/${name}_8B.json"
    step "${name}_sweep" 120 env CHORUS_DEBUG=INFO "$bin/chorus_perf" "${coll}_perf" -b 16 -e "$max" -f 4 -n "$iters" \
      -w "$warm" -g 1 --device "$device" --nranks "$k" --transport "$transport" -J "$steps/${name}_sweep.json"
  done
done
echo "staged path (all_reduce over shm, 2 processes, -b 8 -e $max -f 2):"
step perf_all_reduce_shm 90 env CHORUS_DEBUG=INFO "$bin/chorus_perf" all_reduce_perf -b 8 -e "$max" -f 2 -n "$iters" \
  -w "$warm" -g 1 --device "$device" --nranks 2 --transport shm -J "$steps/perf_all_reduce_shm.json"

# 6. The GPU suite's collective matrix: device buffers over shm, tcp and cuda_ipc, ranks as processes.
for exe in "$bin"/cuda_test_collectives; do
  [[ -x $exe ]] && gpu_test "$exe" 240
done

summarize
