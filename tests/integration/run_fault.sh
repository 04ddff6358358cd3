#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Multi-host fault test: two "hosts" (A: ranks 0-1 and the store, B: ranks 2-3), each a network,
# UTS and mount namespace of its own (own address, host name and /dev/shm), joined by a veth pair.
# One communicator over chorus's default transport: shm inside a host, tcp across (checked: each
# rank reports how it reaches every other). After every rank has passed its first barrier, one
# fault is injected:
#
#   link_cut          B's end of the veth is set down while ranks loop 16 MiB all_reduces
#   kill <seed>       SIGKILL of one random rank after a random delay (0.1-1.6 s), while ranks
#                     loop mixed collectives (all_reduce, broadcast, all_gather, reduce_scatter,
#                     all_to_all, barrier); the seed picks both and is printed (rank 0 takes the
#                     store with it)
#   store_host_dies   host A (ranks 0-1 and the store) vanishes: its veth end goes down, then its
#                     ranks are SIGKILLed, so B hears nothing from it (no FIN, no RST)
#
# Passes when every surviving rank fails, within FAULT_WAIT seconds (default 60), with
# peer_failure and a message that names a peer rank (kill: at least one names the killed rank;
# store_host_dies: at least one names rank 0 or 1; link_cut: on each host at least one names a
# rank of the other host), and nothing is left: no rank process, no process in
# the namespaces, no namespace, no veth, no work files. Prints each rank's seconds from the fault
# to its error. Exit 77 (skipped) without root or without ip netns / unshare.
#
# Usage: run_fault.sh <fault_driver> link_cut|kill <seed>|store_host_dies
set -uo pipefail

driver=${1:?usage: run_fault.sh <fault_driver> link_cut|kill <seed>|store_host_dies}
scenario=${2:?scenario}
seed=${3:-1}
wait_limit=${FAULT_WAIT:-60}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }

[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces (run as root, e.g. in a privileged container)"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v unshare >/dev/null || skip "no 'unshare' command (util-linux)"

source "$(dirname "${BASH_SOURCE[0]}")/two_hosts.sh"
source "$(dirname "${BASH_SOURCE[0]}")/error_line.sh"
tag="chf$$"
two_hosts_names "$tag" 10.77.0   # ns_a, ns_b, veth_a, veth_b, addr_a (10.77.0.1), addr_b
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-fault.XXXXXX")
failed=0
pids=()

cleanup() {
  local p
  for p in "${pids[@]}" $(cat "$work"/host_*.pid 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  two_hosts_remove
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

two_hosts_create
unshare --uts --mount --propagation private sh -c 'mount -t tmpfs tmpfs /dev/shm' 2>/dev/null ||
  skip "'unshare --uts --mount' with a private /dev/shm failed"

workload=mixed
[[ $scenario == link_cut ]] && workload=allreduce16m
[[ $scenario == kill || $scenario == link_cut || $scenario == store_host_dies ]] || { echo "unknown scenario $scenario"; exit 2; }

# start_host <ns> <host name> <ranks...>: one process per host, in the host's network namespace,
# with its own UTS (host name) and mount namespace (a private /dev/shm), that starts the host's
# ranks: they share its namespaces, as processes of one machine do.
start_host() {
  local ns=$1 name=$2; shift 2
  ip netns exec "$ns" unshare --uts --mount --propagation private bash -c '
    hostname "$1"; mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 1
    work=$2 driver=$3 workload=$4; shift 4
    for r in "$@"; do
      RANK=$r WORLD_SIZE=4 MASTER_ADDR='"$addr_a"' "$driver" "$work/port" "$workload" 600 \
        >"$work/rank$r.out" 2>"$work/rank$r.err" &
      echo $! >"$work/rank$r.pid"
    done
    wait' host "$name" "$work" "$driver" "$workload" "$@" 2>"$work/host_$name.err" &
  echo $! >"$work/host_$name.pid"
  pids+=($!)
}

start_host "$ns_a" host-a 0 1
start_host "$ns_b" host-b 2 3

now() { date +%s.%N; }
rank_pid() { cat "$work/rank$1.pid" 2>/dev/null; }
alive() { local p; p=$(rank_pid "$1"); [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }

# Every rank past its first barrier (bounded).
deadline=$((SECONDS + 60))
until (( $(cat "$work"/rank*.out 2>/dev/null | grep -c '^CHORUS_READY') == 4 )); do
  if ((SECONDS > deadline)); then
    fail "the ranks did not all start within 60 s"
    for r in 0 1 2 3; do echo "--- rank $r"; cat "$work/rank$r.out" "$work/rank$r.err" 2>/dev/null | tail -5; done
    exit 1
  fi
  sleep 0.1
done
echo "scenario $scenario: 4 ranks ready (host-a: 0 1 and the store at $addr_a, host-b: 2 3)"
# The namespaces look like two hosts to chorus: shm inside each, tcp across.
want=(self,shm,tcp,tcp shm,self,tcp,tcp tcp,tcp,self,shm tcp,tcp,shm,self)
for r in 0 1 2 3; do
  links=$(sed -n 's/^CHORUS_READY .* links=\([a-z,]*\) .*/\1/p' "$work/rank$r.out")
  [[ $links == "${want[r]}" ]] || fail "rank $r reaches the ranks over $links, expected ${want[r]}"
done

survivors=(0 1 2 3)
case $scenario in
  link_cut)
    sleep 1
    t_fault=$(now)
    ip -n "$ns_b" link set "$veth_b" down
    echo "cut: $veth_b (host-b) set down"
    ;;
  kill)
    RANDOM=$seed
    delay_ms=$((100 + RANDOM % 1500))
    victim=$((RANDOM % 4))
    echo "seed $seed: SIGKILL rank $victim after ${delay_ms} ms of mixed collectives"
    sleep "$((delay_ms / 1000)).$(printf %03d $((delay_ms % 1000)))"
    t_fault=$(now)
    kill -9 "$(rank_pid "$victim")"
    survivors=()
    for r in 0 1 2 3; do [[ $r == "$victim" ]] || survivors+=("$r"); done
    ;;
  store_host_dies)
    sleep 1
    t_fault=$(now)
    ip -n "$ns_a" link set "$veth_a" down
    kill -9 "$(rank_pid 0)" "$(rank_pid 1)"
    echo "host-a gone: $veth_a down, ranks 0 and 1 SIGKILLed"
    survivors=(2 3)
    ;;
esac

# Every rank ends (bounded): survivors with their error, the killed ones at once.
deadline=$((SECONDS + wait_limit))
while :; do
  left=()
  for r in 0 1 2 3; do alive "$r" && left+=("$r"); done
  ((${#left[@]} == 0)) && break
  if ((SECONDS > deadline)); then
    fail "rank(s) ${left[*]} still running ${wait_limit} s after the fault"
    break
  fi
  sleep 0.1
done

for r in "${survivors[@]}"; do
  line=$(grep -m1 '^CHORUS_ERROR' "$work/rank$r.out" 2>/dev/null)
  if [[ -z $line ]]; then
    fail "rank $r reported no error: $(tail -2 "$work/rank$r.out" 2>/dev/null) $(tail -3 "$work/rank$r.err" 2>/dev/null)"
    continue
  fi
  error_fields "$line" "$t_fault"
  echo "rank $r: error ${err_after} s after the fault: $err_msg"
  [[ $err_code == peer_failure ]] || fail "rank $r: code $err_code, expected peer_failure"
  named=$err_named
  if [[ -z $named || $named == "$r" ]]; then
    fail "rank $r: the error names no peer rank"
  fi
  echo "$r $named" >>"$work/named"   # who named whom
done
# names <regex of ranks> <regex of named ranks>: some rank of the first names one of the second.
# A rank may name a neighbour that failed before it (and exited), so only one needs to name the
# lost ranks themselves.
names() { grep -Eq "^$1 $2\$" "$work/named" 2>/dev/null; }
case $scenario in
  kill) names '[0-3]' "$victim" || fail "no survivor names the killed rank $victim" ;;
  store_host_dies) names '[23]' '[01]' || fail "no survivor names a rank of the vanished host (0 or 1)" ;;
  link_cut)
    names '[01]' '[23]' || fail "no rank of host-a names a rank of host-b"
    names '[23]' '[01]' || fail "no rank of host-b names a rank of host-a"
    ;;
esac
for r in 0 1 2 3; do
  if grep -q '^CHORUS_WRONG' "$work/rank$r.out" 2>/dev/null; then fail "rank $r: $(grep '^CHORUS_WRONG' "$work/rank$r.out")"; fi
done
if ((failed)); then
  for r in 0 1 2 3; do echo "--- rank $r stderr (last lines)"; tail -5 "$work/rank$r.err" 2>/dev/null; done
  for h in "$work"/host_*.err; do echo "--- $(basename "$h")"; cat "$h"; done
fi

# Nothing left behind: no process in either namespace, then no namespace, veth or work folder.
for h in "$work"/host_*.pid; do
  p=$(cat "$h")
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "host launcher $p still running"
done
for ns in "$ns_a" "$ns_b"; do
  [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] || fail "processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')"
done
for r in 0 1 2 3; do alive "$r" && fail "rank $r process left"; done
work_dir=$work
cleanup
trap - EXIT
two_hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"

if ((failed)); then echo "FAIL: $scenario"; exit 1; fi
echo "PASS: $scenario"
