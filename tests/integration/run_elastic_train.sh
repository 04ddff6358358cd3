#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Elastic training on two namespace hosts (issue 37, point 3): examples/02_train_fashion_mnist
# --elastic, 4 ranks (host-a: ranks 0-1, host-b: ranks 2-3; each host a network, UTS and mount
# namespace with its own address, host name and /dev/shm, joined by a veth pair), EPOCHS epochs
# (default 5), seed 0, run twice:
#
#   undisturbed   the four ranks train to the end;
#   disturbed     rank 3 SIGKILLs itself before step 100 of epoch 2 (--kill-rank 3 --kill-epoch 2
#                 --kill-step 100: the same place in every run, so the run's result is too), the
#                 survivors shrink to 3 ranks and go on; once rank 0 printed epoch 2's line, a
#                 replacement (--join --join-file) starts on host-b, in its namespaces, and the
#                 job admits it at the end of epoch 3 or 4 ("1 rank joined: 4 ranks").
#
# Passes when every rank still there (0, 1, 2 and the replacement; all four when undisturbed)
# exits 0, rank 0 printed every epoch's line, the shrink and the join, the disturbed run's final
# test accuracy is within 1 point of the undisturbed run's, no rank printed a mismatch or an
# error other than the lost rank's peer_failure, and nothing is left: no process in the
# namespaces, no /dev/shm file in either host, no namespace, veth or work folder. Prints images/s
# before the fault (epoch 1, 4 ranks), with 3 ranks (epoch 3) and after the join (the last
# epoch), the shrink's time, and both accuracies. Exit 77 (skipped) without root, ip netns,
# unshare, nsenter or Debian's dataset-fashion-mnist.
#
# Usage: run_elastic_train.sh <02_train_fashion_mnist>
set -uo pipefail

program=${1:?usage: run_elastic_train.sh <02_train_fashion_mnist>}
epochs=${EPOCHS:-5}
limit=${ELASTIC_WAIT:-150}   # seconds for each run, start to last exit

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }

[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces (run as root, e.g. in a privileged container)"
for c in ip unshare nsenter; do command -v "$c" >/dev/null || skip "no '$c' command"; done
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
  skip "no Fashion-MNIST under /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist)"
[[ -x $program ]] || { echo "FAIL: $program is not an executable"; exit 1; }
program=$(readlink -f "$program")   # the replacement starts in another mount namespace

source "$(dirname "${BASH_SOURCE[0]}")/two_hosts.sh"
tag="chel$$"
two_hosts_names "$tag" 10.86.0   # ns_a, ns_b, veth_a, veth_b, addr_a (10.86.0.1), addr_b
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-elastic.XXXXXX")
failed=0
pids=()   # host launchers and the replacement

cleanup() {
  local p
  for p in "${pids[@]}" $(cat "$work"/*/*.pid 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  two_hosts_remove
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

two_hosts_create
unshare --uts --mount --propagation private sh -c 'mount -t tmpfs tmpfs /dev/shm' 2>/dev/null ||
  skip "'unshare --uts --mount' with a private /dev/shm failed"

args="--epochs $epochs --seed 0 --no-progress --elastic"   # the same for every rank and the replacement
export CHORUS_TIMEOUT=60   # every wait of a rank (and the replacement's admission) is bounded by it

# start_host <run folder> <ns> <host name> <master port> <arguments> <ranks...>: one process per host, in the
# host's network namespace with its own UTS (host name) and mount namespace (a private /dev/shm),
# that starts the host's ranks (they share its namespaces, as processes of one machine do),
# writes each one's exit status to rank<r>.rc, and stays (so that a replacement can enter its
# namespaces) until the run's folder has a file "release"; then it lists what is left in its
# /dev/shm. The master port is fixed: the network namespaces are this test's own.
start_host() {
  local dir=$1 ns=$2 name=$3 port=$4 rank_args=$5; shift 5
  ip netns exec "$ns" unshare --uts --mount --propagation private bash -c '
    hostname "$1"; mount -t tmpfs -o size=256m tmpfs /dev/shm || exit 1
    name=$1 dir=$2 program=$3 addr=$4 port=$5 args=$6; shift 6
    rank_pids=()
    for r in "$@"; do
      RANK=$r WORLD_SIZE=4 MASTER_ADDR=$addr MASTER_PORT=$port "$program" $args --join-file "$dir/join" \
        >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
      rank_pids+=($!)
      echo $! >"$dir/rank$r.pid"
    done
    i=0
    for r in "$@"; do wait "${rank_pids[i]}"; echo $? >"$dir/rank$r.rc"; i=$((i + 1)); done
    for _ in $(seq 3000); do [[ -e $dir/release ]] && break; sleep 0.1; done
    ls -A /dev/shm >"$dir/shm_$name"' host "$name" "$dir" "$program" "$addr_a" "$port" "$rank_args" "$@" \
    2>"$dir/host_$name.err" &
  echo $! >"$dir/host_$name.pid"
  pids+=($!)
}

# start_run <name> <master port> [more arguments]: the 4 ranks of a run, output in $work/<name>.
start_run() {
  mkdir -p "$work/$1"
  start_host "$work/$1" "$ns_a" host-a "$2" "$args ${3:-}" 0 1
  start_host "$work/$1" "$ns_b" host-b "$2" "$args ${3:-}" 2 3
}

# wait_line <file> <regex> <seconds>: until the file has a matching line (bounded).
wait_line() {
  local deadline=$((SECONDS + $3))
  until grep -qE "$2" "$1" 2>/dev/null; do
    ((SECONDS > deadline)) && return 1
    sleep 0.1
  done
}

# finished <run folder> <ranks...>: until every rank's exit status is written (bounded).
finished() {
  local dir=$1 deadline=$((SECONDS + limit)) r; shift
  for r in "$@"; do
    until [[ -s $dir/rank$r.rc ]]; do
      if ((SECONDS > deadline)); then fail "$(basename "$dir"): rank $r still running $limit s after the start"; return 1; fi
      sleep 0.1
    done
  done
}

# release <run folder>: the host launchers list their /dev/shm and end (bounded); nothing may be
# left there.
release() {
  local h p
  touch "$1/release"
  for h in "$1"/host_*.pid; do
    p=$(cat "$h")
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && fail "host launcher $p of $(basename "$1") still running"
  done
  for h in host-a host-b; do
    if [[ ! -e $1/shm_$h ]]; then fail "$(basename "$1"): $h did not list its /dev/shm"
    elif [[ -s $1/shm_$h ]]; then fail "$(basename "$1"): left in $h's /dev/shm: $(tr '\n' ' ' <"$1/shm_$h")"; fi
  done
}

# field <run folder> <epoch> <name>: a field of rank 0's line for that epoch ("test" gives the
# accuracy after the word, "img/s" the number before it, "ranks" the number before it).
field() {
  grep -E "^epoch +$2/$epochs " "$1/rank0.out" | head -1 |
    awk -v f="$3" '{ for (i = 1; i <= NF; ++i) { if (f == "test" && $i == f) print $(i + 1); if (f != "test" && $(i + 1) == f) print $i } }' | head -1
}

# check_run <run folder> <ranks that must exit 0...>: exit statuses, rank 0's epoch lines, and no
# mismatch or wrong result anywhere.
check_run() {
  local dir=$1 name r e f; name=$(basename "$1"); shift
  for r in "$@"; do
    [[ $(cat "$dir/rank$r.rc" 2>/dev/null) == 0 ]] || fail "$name: rank $r exited with $(cat "$dir/rank$r.rc" 2>/dev/null)"
  done
  for ((e = 1; e <= epochs; ++e)); do
    [[ -n $(field "$dir" "$e" test) ]] || fail "$name: rank 0 printed no line for epoch $e"
  done
  for f in "$dir"/*.out "$dir"/*.err; do
    if grep -qE 'mismatch|WRONG' "$f"; then fail "$name/$(basename "$f"): $(grep -m1 -E 'mismatch|WRONG' "$f")"; fi
  done
}

show() {  # show <run folder>: the last lines of every output
  local f
  for f in "$1"/*.out "$1"/*.err; do
    [[ -s $f ]] && { echo "--- $(basename "$1")/$(basename "$f")"; tail -8 "$f"; }
  done
}

echo "$program $args --join-file <run>/join: 4 ranks (host-a: 0 1 at $addr_a, host-b: 2 3 at $addr_b)"

# 1. Undisturbed.
t0=$SECONDS
start_run undisturbed 29500
finished "$work/undisturbed" 0 1 2 3
check_run "$work/undisturbed" 0 1 2 3
release "$work/undisturbed"
echo "undisturbed: $((SECONDS - t0)) s"
grep -E '^(02_train|epoch|gradient)' "$work/undisturbed/rank0.out" | sed 's/^/  /'

# 2. Disturbed: rank 3 SIGKILLed in epoch 2, a replacement started in epoch 3.
t0=$SECONDS
dir=$work/disturbed
kill_args="--kill-rank 3 --kill-epoch 2 --kill-step 100"
start_run disturbed 29501 "$kill_args"
echo "disturbed: the ranks with $kill_args"
if ! wait_line "$dir/rank3.out" "kills itself" 60; then
  fail "disturbed: rank 3 did not kill itself within 60 s"
else
  echo "disturbed: rank 3 SIGKILLed itself $((SECONDS - t0)) s after the start: $(grep -m1 'kills itself' "$dir/rank3.out")"
  if ! wait_line "$dir/rank0.out" "^epoch +2/$epochs " 60; then
    fail "disturbed: no epoch 2 line within 60 s of the kill"
  else
    # The replacement, in host-b's namespaces (its network, host name and /dev/shm).
    nsenter --target "$(cat "$dir/host_host-b.pid")" --net --uts --mount \
      "$program" $args --join --join-file "$dir/join" >"$dir/joiner.out" 2>"$dir/joiner.err" &
    joiner=$!
    pids+=($joiner)
    echo "disturbed: replacement started on host-b $((SECONDS - t0)) s after the start (join address $(cat "$dir/join"))"
  fi
fi
finished "$dir" 0 1 2 3
if [[ -n ${joiner:-} ]]; then
  deadline=$((SECONDS + limit))
  while kill -0 "$joiner" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  kill -0 "$joiner" 2>/dev/null && fail "disturbed: the replacement still runs $limit s later"
  wait "$joiner"
  rc=$?
  ((rc == 0)) || fail "disturbed: the replacement exited with $rc"
fi
check_run "$dir" 0 1 2
[[ $(cat "$dir/rank3.rc" 2>/dev/null) == 137 ]] || fail "disturbed: rank 3 exited with $(cat "$dir/rank3.rc" 2>/dev/null), expected 137 (SIGKILL)"
release "$dir"
echo "disturbed: $((SECONDS - t0)) s"
grep -E '^(02_train|epoch|gradient)' "$dir/rank0.out" | sed 's/^/  /'
sed 's/^/  replacement: /' "$dir/joiner.out" 2>/dev/null
grep -qE '^epoch 2: rank 3 lost \(peer_failure\): shrunk to 3 ranks in [0-9.]+ s, going on' "$dir/rank0.out" ||
  fail "disturbed: no 'epoch 2: rank 3 lost (peer_failure): shrunk to 3 ranks' line"
grep -qE '^epoch [34]: 1 rank joined: 4 ranks' "$dir/rank0.out" || fail "disturbed: no 'epoch 3|4: 1 rank joined: 4 ranks' line"
[[ $(field "$dir" 3 ranks) == 3 ]] || fail "disturbed: epoch 3 ran on $(field "$dir" 3 ranks) ranks, expected 3"
[[ $(field "$dir" "$epochs" ranks) == 4 ]] || fail "disturbed: epoch $epochs ran on $(field "$dir" "$epochs" ranks) ranks, expected 4"
# Only the survivors' peer_failure: no other error code in any rank's error output.
for f in "$dir"/rank*.err "$dir"/joiner.err; do
  other=$(grep -oE 'chorus [a-z_]+:' "$f" | grep -v 'chorus peer_failure:' | head -1)
  [[ -z $other ]] || fail "disturbed/$(basename "$f"): $other $(grep -m1 "$other" "$f")"
done

# The figures.
acc_u=$(field "$work/undisturbed" "$epochs" test) acc_d=$(field "$dir" "$epochs" test)
echo "test accuracy after epoch $epochs: undisturbed $acc_u, disturbed $acc_d"
if [[ -n $acc_u && -n $acc_d ]]; then
  awk -v a="$acc_u" -v b="$acc_d" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
    fail "the accuracies differ by more than 1 point"
fi
echo "images/s, disturbed run: before the fault $(field "$dir" 1 img/s) (epoch 1, 4 ranks);" \
     "3 ranks $(field "$dir" 3 img/s) (epoch 3); after the join $(field "$dir" "$epochs" img/s) (epoch $epochs, 4 ranks);" \
     "undisturbed: $(field "$work/undisturbed" 1 img/s) (epoch 1), $(field "$work/undisturbed" "$epochs" img/s) (epoch $epochs)"
grep -hE '^epoch [0-9]+: (rank|[0-9]+ rank)' "$dir/rank0.out"

# Nothing left: no process in either namespace, then no namespace, veth or work folder.
for ns in "$ns_a" "$ns_b"; do
  [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] || fail "processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')"
done
if ((failed)); then show "$work/undisturbed"; show "$dir"; fi
work_dir=$work
cleanup
trap - EXIT
two_hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"
((failed)) && { echo "FAIL: elastic training"; exit 1; }
echo "PASS: elastic training"
