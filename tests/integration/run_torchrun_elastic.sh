#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The chorus torch backend under torchrun's elastic restarts (docs/torch.md, "Elastic restarts under
# torchrun"): examples/03_torch_elastic/main.py, 2 ranks on one host, --max_restarts 3, 3 epochs of
# DDP on 6,000 Fashion-MNIST images (synthetic data without Debian's dataset-fashion-mnist); one
# rank SIGKILLs itself at step 5 of epoch 2 on the first attempt. Scenarios:
#
#   c10d     --rdzv_backend c10d --rdzv_endpoint localhost:0 (a free port; the workers' rank 0
#            serves torch's TCPStore on the MASTER_PORT the agent picks anew for each attempt);
#            rank 1 is killed. No root needed.
#   static   torchrun's default rendezvous (its agent serves the store on port 29500, the workers
#            use it under /worker/attempt_<n>/), in a network namespace of its own so that the port
#            is free; rank 0 is killed. Needs root (skipped without).
#
# Passes when torchrun exits 0, the log shows attempt 0, the kill, attempt 1 (and no attempt 2),
# the restarted group resuming from the checkpoint of epoch 1 and training epochs 2 and 3 only, and
# a final line whose loss is below epoch 1's and whose test accuracy is at least 0.65. The result
# lines are printed. Nothing is left: no process, no checkpoint temporary, no work folder (torchrun's
# torchelastic_* log folders go there: TMPDIR). Exit 77 without /usr/bin/torchrun, torch, or the
# chorus_torch module in the given folder.
#
# usage: run_torchrun_elastic.sh c10d|static <folder holding chorus_torch> <examples/03_torch_elastic/main.py>
set -uo pipefail

scenario=${1:?usage: run_torchrun_elastic.sh c10d|static <PYTHONPATH folder> <main.py>}
pythonpath=${2:?the folder holding the chorus_torch package (<build>/python)}
example=${3:?examples/03_torch_elastic/main.py}
limit=${TORCHRUN_WAIT:-150}   # seconds for the whole torchrun
torchrun=/usr/bin/torchrun

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }

[[ -x $torchrun ]] || skip "no $torchrun (Debian package python3-torch)"
PYTHONPATH=$pythonpath /usr/bin/python3 -c 'import torch.distributed.run, chorus_torch' 2>/dev/null ||
  skip "/usr/bin/python3 cannot import torch.distributed.run and chorus_torch from $pythonpath"
[[ -f $example ]] || { echo "FAIL: no $example"; exit 1; }
case $scenario in
  c10d) kill_rank=1 ;;
  static)
    kill_rank=0
    [[ $(id -u) == 0 ]] || skip "needs root for a network namespace (run as root, e.g. in a privileged container)"
    command -v unshare >/dev/null || skip "no 'unshare' command (util-linux)"
    ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-elastic.XXXXXX")
export TMPDIR=$work   # torchrun's log folders (torchelastic_*) go there, and with it
failed=0
pid=""   # the run's session leader (setsid): its process group is the whole run

cleanup() {
  [[ -n $pid ]] && kill -9 -- "-$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

flags=(--redirects 1 --tee 1 --nnodes 1 --nproc_per_node 2 --max_restarts 3 --monitor_interval 1)
inside=()
if [[ $scenario == c10d ]]; then
  flags+=(--rdzv_backend c10d --rdzv_endpoint localhost:0)
else
  # A network (and pid) namespace of its own: port 29500, torchrun's default, is free there.
  inside=(unshare --net --pid --mount --fork --kill-child --mount-proc bash -c 'ip link set lo up && exec "$@"' sh)
fi
args=(--checkpoint-dir "$work/ckpt" --epochs 3 --train-images 6000 --kill-rank "$kill_rank" --kill-epoch 2)

start=$(date +%s%N)
PYTHONPATH=$pythonpath setsid timeout -k 5 "$limit" "${inside[@]}" "$torchrun" "${flags[@]}" "$example" "${args[@]}" \
  >"$work/torchrun.out" 2>&1 &
pid=$!
wait $pid
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
out=$work/torchrun.out

echo "PYTHONPATH=$pythonpath ${inside[*]:+${inside[*]} }$torchrun ${flags[*]} $example ${args[*]}"
echo "exit status $rc after $((elapsed_ms / 1000)).$((elapsed_ms % 1000 / 100)) s"
((rc == 0)) || fail "torchrun exited with $rc"
grep -E '^\[default[0-9]\]:elastic:|chorus peer_failure|Traceback' "$out" | grep -v '^  File' | sed 's/^/  /'

has() { grep -qE "$1" "$out" || fail "no line matching: $1"; }
has "^\[default0\]:elastic: attempt 0 \(TORCHELASTIC_RESTART_COUNT=0\), 2 ranks"
has "^\[default$kill_rank\]:elastic: rank $kill_rank kills itself \(SIGKILL\) at epoch 2 step 5 on attempt 0"
has "^\[default0\]:elastic: attempt 1 \(TORCHELASTIC_RESTART_COUNT=1\), 2 ranks"
has "^\[default0\]:elastic: resumed from .*checkpoint\.pt: epochs 1-1 done .*going on at epoch 2/3"
grep -q 'TORCHELASTIC_RESTART_COUNT=2' "$out" && fail "a second restart (attempt 2)"
# Epoch 1 trained once (attempt 0), epochs 2 and 3 once each (attempt 1, after the resume).
for e in 1 2 3; do
  n=$(grep -cE "^\[default0\]:elastic: epoch $e/3: loss" "$out")
  ((n == 1)) || fail "epoch $e finished $n times, expected once"
done
final=$(grep -E '^\[default0\]:elastic: finished 3 epochs on attempt 1: loss' "$out")
if [[ -z $final ]]; then
  fail "no final line from rank 0 on attempt 1"
else
  # elastic: finished 3 epochs on attempt 1: loss 0.4707 (epoch 1: 1.1094), test accuracy 0.8167
  read -r loss first accuracy <<<"$(sed -E 's/.*: loss ([0-9.]+) \(epoch 1: ([0-9.]+)\), test accuracy ([0-9.]+).*/\1 \2 \3/' <<<"$final")"
  awk -v l="$loss" -v f="$first" 'BEGIN { exit !(l < f) }' || fail "final loss $loss is not below epoch 1's $first"
  awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.65) }' || fail "test accuracy $accuracy below 0.65"
fi
ls "$work/ckpt"/checkpoint.pt.tmp.* >/dev/null 2>&1 && fail "a checkpoint temporary was left: $(ls "$work/ckpt")"

# Nothing left: the run's process group, then the work folder.
for _ in $(seq 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 -- "-$pid" 2>/dev/null && fail "processes of the run left: $(pgrep -g "$pid" | tr '\n' ' ')"
if ((failed)); then
  echo "--- the last lines of torchrun's output"
  grep -v '^  #' "$out" | tail -40
  exit 1
fi
work_dir=$work
cleanup
pid=""
trap - EXIT
[[ -e $work_dir ]] && { echo "FAIL: work folder $work_dir left"; exit 1; }
echo "PASS: torchrun_elastic_$scenario"
