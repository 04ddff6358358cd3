#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Namespace-host test: H "hosts" (network, UTS and mount namespaces behind one bridge, made by
# tests/integration/hosts.sh), ranks of hosts_driver placed on them by a layout: 3,2,1 is ranks
# 0-2 on host 0 (which also holds the store), 3-4 on host 1, 5 on host 2. chorus's default
# transport sees shm inside a host and tcp across (each rank checks that, and local_rank() /
# local_size() where the communicator has them, against the layout).
#
#   check     (default) every rank runs every collective, dtype, op, count, root, in place and
#             out of place (hosts_driver.cpp), with the model's algorithms and, unless <algo> is
#             auto, with <algo> forced (HOSTS_ALGO) for the collectives that have it (HOSTS_FORCED,
#             default all_reduce,reduce_scatter,all_gather,broadcast,reduce), compared bit for
#             bit with the reference and with each other. Passes when every rank exits 0.
#   link_cut  the ranks loop 16 MiB float32 all_reduces (<algo> forced); once each has completed
#             one, host 1's link goes down (hosts_cut 1). Passes when every rank fails with
#             peer_failure naming a peer within CUT_LIMIT seconds (default 15) of the cut, and
#             ranks on both sides of the cut name a rank across it. Prints each rank's seconds.
#
# Either way nothing may be left: no rank process, no process in the hosts' namespaces but their
# holders, no file in a host's /dev/shm, then (after hosts_remove) no namespace, device, holder
# or work folder. Every wait is bounded. Exit 77 (skipped) without root, ip netns or unshare.
#
# Usage: run_hosts.sh <hosts_driver> <layout, e.g. 2,2,2> <algo: auto|ring|hierarchical|..> [check|link_cut]
set -uo pipefail

driver=${1:?usage: run_hosts.sh <hosts_driver> <layout> <algo> [check|link_cut]}
layout=${2:?layout, e.g. 3,2,1}
algo=${3:?algorithm: auto, ring, hierarchical, ...}
scenario=${4:-check}
run_limit=${HOSTS_RUN_LIMIT:-240}  # seconds for a check run (ctest's TIMEOUT is 300)
cut_limit=${CUT_LIMIT:-15}         # seconds from the cut to each rank's error

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
failed=0

[[ $scenario == check || $scenario == link_cut ]] || { echo "unknown scenario '$scenario'"; exit 2; }
[[ $layout =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "layout '$layout' is not like 3,2,1"; exit 2; }
[[ -x $driver ]] || { echo "no driver $driver"; exit 2; }
IFS=, read -r -a per_host <<<"$layout"
nhosts=${#per_host[@]}
host_of=()
for ((h = 0; h < nhosts; ++h)); do
  for ((k = 0; k < per_host[h]; ++k)); do host_of+=("$h"); done
done
world=${#host_of[@]}
[[ $scenario != link_cut ]] || ((nhosts >= 2)) || { echo "link_cut needs at least 2 hosts"; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
source "$(dirname "${BASH_SOURCE[0]}")/error_line.sh"
hosts_names "hh$$" 10.79.0
hosts_scratch hosts-it

t0=$(date +%s.%N)
hosts_create "$nhosts"
echo "scenario $scenario, layout $layout ($world ranks on $nhosts hosts), algo $algo; store on host 0 at ${hosts_addr[0]}"

mode=(check)
[[ $scenario == link_cut ]] && mode=(loop 600)
# CHORUS_ALGO is not used: hosts_driver forces HOSTS_ALGO on the collectives that have it only.
# A check run's communicators time out well within run_limit; the link-cut run keeps the
# default, so that only the loss of the link can end it early.
timeout_env=()
[[ $scenario == check ]] && timeout_env=(CHORUS_TIMEOUT=60)
for ((r = 0; r < world; ++r)); do
  hosts_exec "${host_of[r]}" env -u CHORUS_ALGO RANK=$r WORLD_SIZE=$world MASTER_ADDR="${hosts_addr[0]}" \
    HOSTS_ALGO="$algo" "${timeout_env[@]}" "$driver" "$work/port" "$layout" "${mode[@]}" \
    >"$work/rank$r.out" 2>"$work/rank$r.err" </dev/null &
  pids[r]=$!
done

now() { date +%s.%N; }
count_lines() { cat "$work"/rank*.out 2>/dev/null | grep -c "^$1 "; }
running() {
  local r left=()
  for ((r = 0; r < world; ++r)); do kill -0 "${pids[r]}" 2>/dev/null && left+=("$r"); done
  echo "${left[*]}"
}
show_ranks() {
  local r
  for ((r = 0; r < world; ++r)); do
    echo "--- rank $r (host ${host_of[r]}): last lines of stdout and stderr"
    grep -v '^HOSTS_WRONG' "$work/rank$r.out" 2>/dev/null | tail -4
    tail -4 "$work/rank$r.err" 2>/dev/null
  done
}

if [[ $scenario == link_cut ]]; then
  # Every rank past its first 16 MiB all_reduce (bounded), then the cut.
  deadline=$((SECONDS + 90))
  until (($(count_lines HOSTS_FIRST) == world)); do
    if ((SECONDS > deadline)) || [[ $(running) != "$(seq -s' ' 0 $((world - 1)))" ]]; then
      fail "not every rank completed its first all_reduce (within 90 s, or a rank ended first)"
      show_ranks
      exit 1
    fi
    sleep 0.05
  done
  t_fault=$(now)
  hosts_cut 1
  echo "cut: host 1's link (${hosts_dev[1]}) down after every rank's first all_reduce"
  wait_limit=$((cut_limit + 45))
else
  wait_limit=$run_limit
fi

# Every rank ends (bounded).
deadline=$((SECONDS + wait_limit))
while [[ -n $(running) ]]; do
  if ((SECONDS > deadline)); then
    fail "rank(s) $(running) still running ${wait_limit} s later"
    break
  fi
  sleep 0.05
done
t_end=$(now)
rcs=()
for ((r = 0; r < world; ++r)); do
  if kill -0 "${pids[r]}" 2>/dev/null; then rcs[r]=running; else wait "${pids[r]}"; rcs[r]=$?; fi
done

for ((r = 0; r < world; ++r)); do
  ready=$(grep -m1 '^HOSTS_READY' "$work/rank$r.out" 2>/dev/null)
  [[ -n $ready ]] || { fail "rank $r never got ready (exit ${rcs[r]})"; continue; }
  echo "rank $r host ${host_of[r]}: $(sed 's/^HOSTS_READY rank=[0-9]* //; s/ wall=.*//' <<<"$ready")"
  grep -m1 '^HOSTS_NOTE' "$work/rank$r.out"
done
grep -h '^HOSTS_WRONG' "$work"/rank*.out 2>/dev/null | head -40
nwrong=$(cat "$work"/rank*.out 2>/dev/null | grep -c '^HOSTS_WRONG')
((nwrong == 0)) || fail "$nwrong wrong result(s) (the first 40 above)"

if [[ $scenario == check ]]; then
  for ((r = 0; r < world; ++r)); do
    done_line=$(grep -m1 '^HOSTS_DONE' "$work/rank$r.out" 2>/dev/null)
    err_line=$(grep -m1 '^HOSTS_ERROR' "$work/rank$r.out" 2>/dev/null)
    [[ -n $err_line ]] && echo "$err_line"
    [[ ${rcs[r]} == 0 && -n $done_line ]] || fail "rank $r exited ${rcs[r]}"
    [[ -n $done_line ]] && echo "$done_line"
  done
else
  for ((r = 0; r < world; ++r)); do
    line=$(grep -m1 '^HOSTS_ERROR' "$work/rank$r.out" 2>/dev/null)
    if [[ -z $line ]]; then
      fail "rank $r (exit ${rcs[r]}) reported no error: $(tail -2 "$work/rank$r.out" 2>/dev/null)"
      continue
    fi
    error_fields "$line" "$t_fault"
    echo "rank $r (host ${host_of[r]}): error ${err_after} s after the cut: $err_code: $err_msg"
    [[ $err_code == peer_failure ]] || fail "rank $r: code $err_code, expected peer_failure"
    awk -v a="$err_after" -v l="$cut_limit" 'BEGIN { exit !(a <= l) }' ||
      fail "rank $r: error ${err_after} s after the cut (limit ${cut_limit} s)"
    named=$err_named
    if [[ -z $named || $named == "$r" || $named -ge $world ]]; then
      fail "rank $r: the error names no peer rank"
    else
      echo "$r $named" >>"$work/named"
    fi
  done
  # Across the cut: a rank of host 1 names a rank elsewhere, and a rank elsewhere names one of
  # host 1 (others may name a neighbour of their own host that failed before them).
  across_in=0 across_out=0
  while read -r a b; do
    if [[ ${host_of[a]} == 1 && ${host_of[b]} != 1 ]]; then across_in=1; fi
    if [[ ${host_of[a]} != 1 && ${host_of[b]} == 1 ]]; then across_out=1; fi
  done <"$work/named" 2>/dev/null
  ((across_in)) || fail "no rank of host 1 names a rank of another host"
  ((across_out)) || fail "no rank of another host names a rank of host 1"
fi
((failed)) && show_ranks

# Nothing left: no rank, no process in a host but its holder, no file in a host's /dev/shm.
for ((r = 0; r < world; ++r)); do kill -0 "${pids[r]}" 2>/dev/null && fail "rank $r process left"; done
for ((h = 0; h < nhosts; ++h)); do
  left=$(ip netns pids "${hosts_ns[h]}" 2>/dev/null | grep -vx "${hosts_holder[h]}" | tr '\n' ' ')
  [[ -z $left ]] || fail "processes left on host $h: $left"
  shm=$(hosts_exec "$h" find /dev/shm -mindepth 1 2>&1 | tr '\n' ' ')
  [[ -z $shm ]] || fail "left in host $h's /dev/shm: $shm"
done
work_dir=$work
hosts_cleanup
trap - EXIT
hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"
echo "ranks ran $(awk -v a="$t_end" -v b="$t0" 'BEGIN { printf "%.1f", a - b }') s from the hosts' creation"

if ((failed)); then echo "FAIL: $scenario $layout $algo"; exit 1; fi
echo "PASS: $scenario $layout $algo"
