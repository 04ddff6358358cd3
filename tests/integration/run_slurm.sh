#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# chorus programs under srun, on a real Slurm cluster (Debian's Slurm 22.05) of 2 namespace hosts
# (tests/integration/slurm_cluster.sh), with no MASTER_ADDR and no MASTER_PORT anywhere: rank 0's
# host is the first of SLURM_STEP_NODELIST, the store's port is derived from SLURM_JOB_ID and
# SLURM_STEP_ID. The cluster starts once per run of this script; scenarios run in turn on it:
#
#   all_reduce   srun -N 2 --ntasks-per-node 2 all_reduce_perf -b 8 -e 64M -f 2 -w 1 -n 1 (one
#                warm-up and one timed call per size: the test checks, it does not time): every
#                row has #wrong 0, and no task has a MASTER_* variable (each task checks its
#                environment before it execs the program); ranks 0-1 on host 0, 2-3 on host 1.
#   uneven       srun -n 3 -N 2 all_reduce_perf -b 8 -e 1M -f 8 (6 sizes, to 256 KiB): ranks 0
#                and 1 on host 0, rank 2 on host 1; all_reduce_perf's device list gives each
#                rank's local rank and size, the communicator's and the launcher's
#                (SLURM_STEP_TASKS_PER_NODE=2,1 at SLURM_NODEID): 0/2, 1/2 and 0/1 both.
#   port_taken   an allocation (salloc --no-shell), a program listening on the port its first step
#                will derive (15000 + (16 x job + step) mod 15000, computed here from the formula
#                docs/environment.md gives) on rank 0's host, then srun --jobid: rank 0 fails at
#                once with an error naming the port and MASTER_PORT, rank 1 within its
#                CHORUS_TIMEOUT (10 s) with one naming the port; the step ends within 60 s. Then
#                a second step with MASTER_PORT set to another port passes.
#   sbatch       sbatch of examples/slurm/train.sbatch (2 nodes x 2 tasks) with the training
#                example CHORUS_SLURM_TRAIN names (examples/02_train_fashion_mnist), one epoch and
#                --min-test-accuracy 0.80, polled until it leaves the queue: the job completes with
#                exit code 0, and its output has the epoch's line with a test accuracy of at least
#                0.80 (submitted with no MASTER_* in its environment).
#                Skipped (77) without Debian's dataset-fashion-mnist.
#   failure      the same example (CHORUS_SLURM_TRAIN), 2 epochs on 2 x 2 tasks, rank 3 SIGKILLing
#                itself before step 20 of epoch 1 (its --kill-rank: a task killed at a known place):
#                  elastic  --elastic under srun's defaults (a task's death does not end the step):
#                           rank 0 reports rank 3 lost and the shrink to 3 ranks, and the 3
#                           survivors finish epoch 2;
#                  plain    no --elastic: each survivor ends with chorus's peer_failure error (one
#                           of them naming rank 3), and the step ends within 60 s of the kill;
#                  killed   srun --kill-on-bad-exit=1: Slurm ends the step's other tasks at once.
#
# Nothing may be left: every daemon and task ends with the hosts (hosts_remove), and no namespace
# or work folder remains. Every wait is bounded (srun under `timeout`). Exit 77 (skipped) without
# root or Debian's slurmctld, slurmd, slurm-client and munge packages.
#
# Usage: run_slurm.sh <all_reduce_perf> <scenario>...
set -uo pipefail

perf=${1:?usage: run_slurm.sh <all_reduce_perf> <scenario>...}
shift
(($# > 0)) || set -- all_reduce uneven port_taken
step_limit=${SLURM_STEP_LIMIT:-150}  # seconds for one srun

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
failed=0

[[ -x $perf ]] || { echo "no program $perf"; exit 2; }
perf=$(realpath "$perf")
for s in "$@"; do
  [[ $s == all_reduce || $s == uneven || $s == port_taken || $s == sbatch || $s == failure ]] || { echo "unknown scenario '$s'"; exit 2; }
  if [[ $s == sbatch || $s == failure ]]; then
    [[ -x ${CHORUS_SLURM_TRAIN:-} ]] || { echo "$s: CHORUS_SLURM_TRAIN must name the training example"; exit 2; }
    [[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
      skip "$s: no Fashion-MNIST under /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist)"
  fi
done

source "$(dirname "${BASH_SOURCE[0]}")/slurm_cluster.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-slurm-it.XXXXXX")
cleanup() {
  slurm_cluster_stop
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

t0=$SECONDS
slurm_cluster_start "sl$$" 10.81.0 2
echo "cluster up in $((SECONDS - t0)) s (munged, slurmctld, 2 slurmd); sinfo:"
slurm_exec 0 sinfo

# Each task refuses to run with a MASTER_* variable, then execs the program.
no_master='if env | grep "^MASTER_"; then echo "MASTER_CHECK: task $SLURM_PROCID has MASTER_* set" >&2; exit 3; fi; exec "$@"'

# srun on host 0 (the submit host), bounded, without MASTER_*; output in $work/$1.out.
run_srun() {
  local name=$1 rc
  shift
  slurm_exec 0 env -u MASTER_ADDR -u MASTER_PORT CHORUS_TIMEOUT="${CHORUS_TIMEOUT:-60}" \
    timeout -k 5 "$step_limit" srun "$@" >"$work/$name.out" 2>&1
  rc=$?
  echo "srun $*: exit status $rc ($((SECONDS - t_step)) s)"
  return $rc
}

# The result rows of all_reduce_perf's output $1: size count type redop root time algbw busbw
# #wrong (out of place) time algbw busbw #wrong (in place). $2: the rows expected.
check_rows() {
  local out=$1 want=$2 rows
  grep -E '^#  Rank|^ +[0-9]+ +[0-9]+ +float|Out of bounds|Avg bus' "$out"
  grep -q '# Out of bounds values : 0 OK' "$out" || fail "no '# Out of bounds values : 0 OK' line"
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +float +sum' "$out")
  ((rows == want)) || fail "$rows result rows, expected $want"
  if ((rows > 0)); then
    grep -E '^ +[0-9]+ +[0-9]+ +float +sum' "$out" | awk '$9 != "0" || $13 != "0" { bad = 1 } END { exit bad }' ||
      fail "a row with #wrong other than 0"
  fi
  if grep -q 'MASTER_' "$out"; then fail "a task had MASTER_* set: $(grep 'MASTER_' "$out" | head -3)"; fi
}

for scenario in "$@"; do
  echo "=== $scenario"
  t_step=$SECONDS
  case $scenario in
    all_reduce)
      run_srun all_reduce -N 2 --ntasks-per-node 2 bash -c "$no_master" task "$perf" -b 8 -e 64M -f 2 -w 1 -n 1 ||
        fail "srun exited non-zero"
      check_rows "$work/all_reduce.out" 24   # 8 B to 64 MiB, factor 2
      for r in 0 1 2 3; do
        h=$((r / 2)) l=$((r % 2))
        grep -qE "^#  Rank +$r .* on +${slurm_nodes[h]} .* local $l/2 slurm local $l/2\$" "$work/all_reduce.out" ||
          fail "rank $r: not on ${slurm_nodes[h]} with local rank $l of 2 (communicator and launcher)"
      done
      ;;
    uneven)
      run_srun uneven -n 3 -N 2 bash -c "$no_master" task "$perf" -b 8 -e 1M -f 8 -w 1 -n 5 || fail "srun exited non-zero"
      check_rows "$work/uneven.out" 6   # 8 B to 256 KiB, factor 8
      expect=("0 0 2" "1 0 2" "2 1 1")   # rank, host, local size
      for e in "${expect[@]}"; do
        read -r r h size <<<"$e"
        l=$((r - 2 * h))
        grep -qE "^#  Rank +$r .* on +${slurm_nodes[h]} .* local $l/$size slurm local $l/$size\$" "$work/uneven.out" ||
          fail "rank $r: not on ${slurm_nodes[h]} with local rank $l of $size (communicator and launcher)"
      done
      ;;
    port_taken)
      slurm_exec 0 timeout 30 salloc -N 2 --no-shell >"$work/salloc.out" 2>&1 || fail "salloc: $(cat "$work/salloc.out")"
      job=$(sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p' "$work/salloc.out")
      [[ $job =~ ^[0-9]+$ ]] || { fail "no job id from salloc: $(cat "$work/salloc.out")"; continue; }
      port=$((15000 + (16 * job + 0) % 15000))
      echo "job $job: its step 0 derives port $port; a program listens there on ${slurm_nodes[0]}"
      hosts_exec 0 python3 -c '
import socket, sys, os, time
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
open(sys.argv[2] + ".tmp", "w").close(); os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(600)' "$port" "$work/listening" </dev/null >"$work/listener.out" 2>&1 &
      deadline=$((SECONDS + 20))
      until [[ -e $work/listening ]]; do
        ((SECONDS > deadline)) && { fail "the listener did not start: $(cat "$work/listener.out")"; break; }
        sleep 0.05
      done
      CHORUS_TIMEOUT=10 run_srun port_taken --jobid "$job" -N 2 --ntasks-per-node 1 bash -c "$no_master" task \
        "$perf" -b 8 -e 8 && fail "srun passed with the port taken"
      took=$((SECONDS - t_step))
      grep -E 'chorus' "$work/port_taken.out" | head -6
      ((took <= 60)) || fail "the step took $took s with the port taken (limit 60)"
      grep -qE "rank 0: .*cannot serve the store on ${slurm_nodes[0]}:$port, the port derived from SLURM_JOB_ID=$job and SLURM_STEP_ID=0.*another program holds it.*set MASTER_PORT" \
        "$work/port_taken.out" || fail "rank 0 did not say that port $port is taken and that MASTER_PORT overrides it"
      grep -qE "rank 1: .*no store at ${slurm_nodes[0]}:$port, the port derived from SLURM_JOB_ID=$job.*MASTER_PORT" \
        "$work/port_taken.out" || fail "rank 1 did not name port $port and MASTER_PORT"
      # The way out the error gives: MASTER_PORT, in the same allocation (step 1).
      t_step=$SECONDS
      slurm_exec 0 env MASTER_PORT=$((port + 1)) CHORUS_TIMEOUT=60 timeout -k 5 "$step_limit" \
        srun --jobid "$job" -N 2 --ntasks-per-node 1 "$perf" -b 8 -e 1K -f 4 -w 1 -n 2 >"$work/override.out" 2>&1 ||
        fail "srun with MASTER_PORT=$((port + 1)) failed: $(tail -5 "$work/override.out")"
      echo "srun --jobid $job with MASTER_PORT=$((port + 1)): $((SECONDS - t_step)) s"
      grep -q '# Out of bounds values : 0 OK' "$work/override.out" || fail "with MASTER_PORT: no '# Out of bounds values : 0 OK' line"
      slurm_exec 0 scancel "$job"
      ;;
    sbatch)
      # The batch script runs on host 0; its srun starts the 4 ranks. MASTER_* would fail the check
      # below: the environment sbatch hands on is the submitter's, which has none. Polled here
      # rather than with sbatch --wait, whose checks back off to tens of seconds.
      slurm_exec 0 env -u MASTER_ADDR -u MASTER_PORT CHORUS_TIMEOUT=60 \
        sbatch --parsable -N 2 --ntasks-per-node 2 -o "$work/sbatch.out" \
        "$(dirname "${BASH_SOURCE[0]}")/../../examples/slurm/train.sbatch" "$CHORUS_SLURM_TRAIN" --min-test-accuracy 0.80 \
        >"$work/submit.out" 2>&1 || fail "sbatch exited non-zero: $(cat "$work/submit.out")"
      job=$(tr -d '[:space:]' <"$work/submit.out")
      [[ $job =~ ^[0-9]+$ ]] || { fail "no job id from sbatch: $(cat "$work/submit.out")"; continue; }
      deadline=$((SECONDS + step_limit))
      while [[ -n $(slurm_exec 0 squeue -h -j "$job" 2>/dev/null) ]]; do
        ((SECONDS > deadline)) && { fail "batch job $job still in the queue after $step_limit s"; slurm_exec 0 scancel "$job"; break; }
        sleep 0.2
      done
      state=$(slurm_exec 0 scontrol show job "$job" | grep -oE 'JobState=[A-Z]+|ExitCode=[0-9]+:[0-9]+' | tr '\n' ' ')
      echo "batch job $job: $state after $((SECONDS - t_step)) s"
      [[ $state == *"JobState=COMPLETED"*"ExitCode=0:0"* ]] || fail "batch job $job did not complete with exit code 0: $state"
      grep -E '^job |^02_train_fashion_mnist: |^epoch ' "$work/sbatch.out"
      acc=$(sed -n 's/^epoch  *1\/1 .* test \([0-9.]*\) .*/\1/p' "$work/sbatch.out")
      [[ -n $acc ]] || fail "no line for epoch 1/1 with a test accuracy"
      [[ -n $acc ]] && ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }' && fail "test accuracy $acc below 0.80"
      grep -q '4 ranks' "$work/sbatch.out" || fail "the run did not have 4 ranks"
      ;;
    failure)
      kill_args=(--epochs 2 --kill-rank 3 --kill-epoch 1 --kill-step 20 --no-progress)
      # elastic: srun ends non-zero (task 3 was killed); the survivors' lines decide.
      run_srun failure_elastic -N 2 --ntasks-per-node 2 bash -c "$no_master" task "$CHORUS_SLURM_TRAIN" --elastic \
        "${kill_args[@]}"
      grep -E '^epoch|kills itself|lost' "$work/failure_elastic.out"
      grep -qE '^epoch 1: rank 3 lost \(peer_failure\): shrunk to 3 ranks in [0-9.]+ s' "$work/failure_elastic.out" ||
        fail "elastic: rank 0 did not report rank 3 lost and the shrink to 3 ranks"
      grep -qE '^epoch  2/2  3 ranks ' "$work/failure_elastic.out" || fail "elastic: the 3 survivors did not finish epoch 2"
      # plain: every survivor fails with peer_failure, promptly.
      t_step=$SECONDS
      run_srun failure_plain -N 2 --ntasks-per-node 2 bash -c "$no_master" task "$CHORUS_SLURM_TRAIN" "${kill_args[@]}" &&
        fail "plain: srun exited 0 with a rank killed"
      grep -E 'kills itself|peer_failure' "$work/failure_plain.out" | head -4
      # Each survivor names the peer whose link broke first: rank 3, or a survivor that already left.
      n=$(grep -oE '^chorus peer_failure: rank [012]: peer [0-3]' "$work/failure_plain.out" | sort -u | wc -l)
      ((n == 3)) || fail "plain: $n of the 3 survivors ended with chorus's peer_failure error"
      grep -qE '^chorus peer_failure: rank [012]: peer 3' "$work/failure_plain.out" || fail "plain: no survivor named rank 3"
      ((SECONDS - t_step <= 60)) || fail "plain: the step took $((SECONDS - t_step)) s after a rank died"
      # killed: Slurm ends the others.
      t_step=$SECONDS
      run_srun failure_killed --kill-on-bad-exit=1 -N 2 --ntasks-per-node 2 bash -c "$no_master" task \
        "$CHORUS_SLURM_TRAIN" "${kill_args[@]}" && fail "killed: srun exited 0 with a rank killed"
      grep -E 'kills itself|srun: error|Terminating|Killed' "$work/failure_killed.out" | head -4
      ((SECONDS - t_step <= 60)) || fail "killed: the step took $((SECONDS - t_step)) s after a rank died"
      ;;
  esac
  if ((failed)); then
    echo "--- output of the last step"
    tail -30 "$work"/*.out
    slurm_logs
    break
  fi
done

work_dir=$work
cluster_dir=$slurm_dir
cleanup
trap - EXIT
hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"
[[ -e $cluster_dir ]] && fail "cluster folder $cluster_dir left"
echo "ran $((SECONDS - t0)) s in all"
if ((failed)); then echo "FAIL: $*"; exit 1; fi
echo "PASS: $*"
