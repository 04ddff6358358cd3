#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Shrink after faults across namespace hosts: 3 hosts x 2 ranks (tests/integration/hosts.sh;
# host h holds ranks 2h and 2h+1; host 0 also the job's store, served by rank 0). For each seed
# given, six ranks of shrink_driver loop mixed collectives (checked), one fault is injected after a
# seeded delay, and the survivors must shrink (Communicator::shrink) and finish ROUNDS rounds of
# checked collectives on the shrunk communicator. The seed picks the fault kind (seed mod 5) and
# its victims:
#
#   kill_rank       SIGKILL of rank (seed/5) mod 6 (rank 0, the store's, for seeds 0 and 30)
#   kill_host       host (seed/5) mod 3 vanishes: its link goes down, then its ranks are SIGKILLed
#                   (no FIN, no RST reach the others); host 0 takes the job's store with it
#   cut_link        host (seed/5) mod 3's link goes down; its ranks live on, cut off: they must
#                   fail (no quorum), the others go on
#   two_ranks       SIGKILL of two random ranks at once
#   during_shrink   SIGKILL of a random rank, then of another as soon as a survivor enters shrink
#
# Per seed it passes when every survivor prints SHRINK_DONE with the expected members, every
# rank cut off ends with an error, no result is wrong, and nothing is left: no rank process, no
# process in a host but its holder, no file in a host's /dev/shm. It prints each survivor's time
# from the fault to its first correct round on the final communicator, and, at the end, those
# times per kind (median and worst); a time above RECOVER_LIMIT (default 30 s: far above what a
# shrink takes, so only a hang or a fallback to the timeout fails) fails the seed. After all
# seeds the hosts are removed and checked gone. Exit 77 (skipped) without root, ip netns or
# unshare.
#
# A vanished host or a cut link is noticed when TCP gives up on the silent connections
# (docs/environment.md): the ranks run with CHORUS_SOCKET_USER_TIMEOUT=3 and
# CHORUS_SOCKET_KEEPALIVE_IDLE=1 unless set, rather than the defaults 10 and 5, so that each of
# the 12 seeds of those kinds waits about 3 s instead of 10 s. Acknowledgements come from the
# kernel, not from the ranks, so a busy machine does not make a live connection look dead.
#
# Usage: run_shrink.sh <shrink_driver> <seed> [<seed> ...]
set -uo pipefail

driver=${1:?usage: run_shrink.sh <shrink_driver> <seed>...}
shift
seeds=("$@")
((${#seeds[@]} > 0)) || { echo "no seed given"; exit 2; }
rounds=${ROUNDS:-10}
recover_limit=${RECOVER_LIMIT:-30}
export CHORUS_SOCKET_USER_TIMEOUT=${CHORUS_SOCKET_USER_TIMEOUT:-3}
export CHORUS_SOCKET_KEEPALIVE_IDLE=${CHORUS_SOCKET_KEEPALIVE_IDLE:-1}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; seed_failed=1; }
failed=0
seed_failed=0

[[ -x $driver ]] || { echo "no driver $driver"; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_names "shk$$" 10.83.0
hosts_scratch shrink

hosts_create 3
world=6
host_of=(0 0 1 1 2 2)
kinds=(kill_rank kill_host cut_link two_ranks during_shrink)
now() { date +%s.%N; }
# scan <r>: reads rank r's output once, in this shell (on a loaded machine a grep, sed or awk per
# check costs tens of milliseconds, seconds per seed): ready_pid (the pid of its SHRINK_READY
# line), done_line (the first SHRINK_DONE line), ok_line (the last SHRINK_FIRST_OK line),
# error_line (the first SHRINK_ERROR line), bad_line (the first SHRINK_ERROR or SHRINK_WRONG
# line), last_line; every SHRINK_WRONG line is added to wrong_lines, every SHRINK_READY line
# counted in ready_lines.
scan() {
  local line
  ready_pid="" done_line="" ok_line="" error_line="" bad_line="" last_line=""
  [[ -r $run/rank$1.out ]] || return 0
  while IFS= read -r line || [[ -n $line ]]; do
    last_line=$line
    case $line in
      SHRINK_READY*)
        ready_lines=$((ready_lines + 1))
        [[ $line =~ ^SHRINK_READY\ .*\ pid=([0-9]*) ]] && ready_pid=${BASH_REMATCH[1]}
        ;;
      SHRINK_DONE*) [[ -n $done_line ]] || done_line=$line ;;
      SHRINK_FIRST_OK*) ok_line=$line ;;
      SHRINK_ERROR*)
        [[ -n $error_line ]] || error_line=$line
        [[ -n $bad_line ]] || bad_line=$line
        ;;
      SHRINK_WRONG*)
        [[ -n $bad_line ]] || bad_line=$line
        wrong_lines+=("$line")
        ;;
    esac
  done <"$run/rank$1.out"
}
rank_pids=()   # per rank, from its SHRINK_READY line
# shrinking: whether a rank has printed SHRINK_SHRINKING. during_shrink polls it between its two
# kills, which must both land before the survivors finish: without a process per poll the second
# follows the first survivor's SHRINK_SHRINKING sooner on a loaded machine.
shrinking() {
  local r line
  for ((r = 0; r < world; ++r)); do
    [[ -r $run/rank$r.out ]] || continue
    while IFS= read -r line || [[ -n $line ]]; do
      [[ $line == SHRINK_SHRINKING* ]] && return 0
    done <"$run/rank$r.out"
  done
  return 1
}
alive() { [[ -n ${rank_pids[$1]:-} ]] && kill -0 "${rank_pids[$1]}" 2>/dev/null; }
show_ranks() {
  local r
  for ((r = 0; r < world; ++r)); do
    echo "--- rank $r (host ${host_of[r]}): last lines of stdout and stderr"
    tail -5 "$run/rank$r.out" 2>/dev/null
    grep -v '^\[chorus' "$run/rank$r.err" 2>/dev/null | tail -4
  done
}
# The launcher shells (hosts_exec ... &) end with their rank.
wait_ranks() {
  local deadline=$((SECONDS + $1)) r left
  while :; do
    left=""
    for ((r = 0; r < world; ++r)); do kill -0 "${pids[r]}" 2>/dev/null && left+=" $r"; done
    [[ -z $left ]] && return 0
    ((SECONDS > deadline)) && { echo "$left"; return 1; }
    sleep 0.05
  done
}

declare -A times_by_kind=()

for seed in "${seeds[@]}"; do
  seed_failed=0
  run="$work/seed$seed"
  mkdir -p "$run"
  kind=${kinds[seed % 5]}
  k=$((seed / 5))
  RANDOM=$seed
  victims=()
  cut_host=-1
  case $kind in
    kill_rank) victims=($((k % 6))) ;;
    kill_host) cut_host=$((k % 3)); victims=($((2 * cut_host)) $((2 * cut_host + 1))) ;;
    cut_link) cut_host=$((k % 3)) ;;
    two_ranks | during_shrink)
      a=$((RANDOM % 6))
      b=$(((a + 1 + RANDOM % 5) % 6))
      victims=("$a" "$b")
      ;;
  esac
  delay_ms=$((200 + RANDOM % 800))

  pids=()
  for ((r = 0; r < world; ++r)); do
    hosts_exec "${host_of[r]}" env RANK=$r WORLD_SIZE=$world MASTER_ADDR="${hosts_addr[0]}" \
      "$driver" "$run/port" "$rounds" 60 >"$run/rank$r.out" 2>"$run/rank$r.err" </dev/null &
    pids[r]=$!
  done
  deadline=$((SECONDS + 60))
  rank_pids=()
  while :; do
    ready_lines=0
    for ((r = 0; r < world; ++r)); do scan "$r"; rank_pids[r]=$ready_pid; done
    ((ready_lines == world)) && break
    if ((SECONDS > deadline)); then
      fail "seed $seed: the ranks did not all start within 60 s"
      show_ranks
      break
    fi
    sleep 0.05
  done
  ((seed_failed)) && { wait_ranks 1 >/dev/null || for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; continue; }

  sleep "$((delay_ms / 1000)).$(printf %03d $((delay_ms % 1000)))"
  t_fault=$(now)
  case $kind in
    kill_rank | two_ranks)
      for v in "${victims[@]}"; do kill -9 "${rank_pids[v]}"; done
      what="SIGKILL of rank(s) ${victims[*]}"
      ;;
    kill_host)
      hosts_cut "$cut_host"
      for v in "${victims[@]}"; do kill -9 "${rank_pids[v]}"; done
      what="host $cut_host vanished (link down, ranks ${victims[*]} SIGKILLed)"
      ;;
    cut_link)
      hosts_cut "$cut_host"
      what="host $cut_host's link cut (ranks $((2 * cut_host)) and $((2 * cut_host + 1)) cut off)"
      ;;
    during_shrink)
      kill -9 "${rank_pids[victims[0]]}"
      deadline=$((SECONDS + 30))
      until shrinking; do
        ((SECONDS > deadline)) && break
        sleep 0.005
      done
      kill -9 "${rank_pids[victims[1]]}"
      what="SIGKILL of rank ${victims[0]}, then of rank ${victims[1]} as the survivors entered shrink"
      ;;
  esac
  echo "seed $seed: $kind: $what after ${delay_ms} ms of collectives"

  if left=$(wait_ranks 90); then :; else
    fail "seed $seed: rank(s)$left still running 90 s after the fault"
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for ((r = 0; r < world; ++r)); do [[ -n ${rank_pids[r]:-} ]] && kill -9 "${rank_pids[r]}" 2>/dev/null; done
  fi

  # Who must go on: every rank not killed and not cut off.
  expect=()
  for ((r = 0; r < world; ++r)); do
    [[ " ${victims[*]} " == *" $r "* ]] && continue
    ((cut_host >= 0 && host_of[r] == cut_host)) && continue
    expect+=("$r")
  done
  printf -v members '%s,' "${expect[@]}"
  members=${members%,}
  # Each survivor's output once (scan), then the seconds from the fault to its first correct
  # round for all of them in one awk: "<seconds> <1 when within RECOVER_LIMIT>" per line.
  finished=() t_oks=()
  for r in "${expect[@]}"; do
    scan "$r"
    if [[ -z $done_line ]]; then
      fail "seed $seed: rank $r did not finish: $bad_line"
      continue
    fi
    [[ $done_line == *" size=${#expect[@]} members=$members "* ]] ||
      fail "seed $seed: rank $r ended with '$done_line', expected members $members"
    t_ok=""
    [[ $ok_line =~ .*\ wall=([0-9.]*) ]] && t_ok=${BASH_REMATCH[1]}
    finished+=("$r")
    t_oks+=("$t_ok")
  done
  seed_times=()
  if ((${#finished[@]} > 0)); then
    mapfile -t results < <(awk -v b="$t_fault" -v l="$recover_limit" \
      'BEGIN { for (i = 1; i < ARGC; ++i) { d = sprintf("%.2f", ARGV[i] - b); print d, (d + 0 <= l + 0) } exit }' "${t_oks[@]}")
    for i in "${!finished[@]}"; do
      read -r after within <<<"${results[i]:-? 0}"
      seed_times+=("$after")
      ((within)) ||
        fail "seed $seed: rank ${finished[i]}'s first correct round came ${after} s after the fault (limit ${recover_limit} s)"
    done
  fi
  if ((cut_host >= 0)) && [[ $kind == cut_link ]]; then
    for r in $((2 * cut_host)) $((2 * cut_host + 1)); do
      scan "$r"
      if [[ -z $error_line ]]; then
        fail "seed $seed: rank $r, cut off, did not end with an error: $last_line"
      else
        line="seed $seed: rank $r (cut off): ${error_line#SHRINK_ERROR }"
        echo "${line:0:300}"
      fi
      [[ -n $done_line ]] && fail "seed $seed: rank $r, cut off, went on"
    done
  fi
  # Wrong results, on any rank (the victims' and the cut-off ranks' outputs too).
  wrong_lines=()
  for ((r = 0; r < world; ++r)); do scan "$r"; done
  ((${#wrong_lines[@]} == 0)) || printf '%s\n' "${wrong_lines[@]:0:5}"
  ((${#wrong_lines[@]} == 0)) || fail "seed $seed: wrong results (above)"
  sorted=$(printf '%s\n' "${seed_times[@]}" | sort -n | tr '\n' ' ')
  echo "seed $seed: $kind: survivors ${members}: fault to first correct round (s): $sorted"
  times_by_kind[$kind]+="$sorted"
  ((seed_failed)) && show_ranks

  # Nothing left on the hosts; the link back up for the next seed.
  for ((r = 0; r < world; ++r)); do alive "$r" && fail "seed $seed: rank $r process left"; done
  for ((h = 0; h < 3; ++h)); do
    ip -n "${hosts_ns[h]}" link set "${hosts_dev[h]}" up
    mapfile -t ns_pids < <(ip netns pids "${hosts_ns[h]}" 2>/dev/null)
    left=""
    for p in "${ns_pids[@]}"; do [[ $p == "${hosts_holder[h]}" ]] || left+="$p "; done
    [[ -z $left ]] || fail "seed $seed: processes left on host $h: $left"
    mapfile -t shm < <(hosts_exec "$h" find /dev/shm -mindepth 1 2>&1)
    ((${#shm[@]} == 0)) || fail "seed $seed: left in host $h's /dev/shm: ${shm[*]}"
  done
  ((seed_failed)) && echo "seed $seed: FAIL" || echo "seed $seed: PASS"
done

echo "fault to the survivors' first correct round on the shrunk communicator, seconds (seeds ${seeds[*]}):"
for kind in "${kinds[@]}"; do
  [[ -n ${times_by_kind[$kind]:-} ]] || continue
  read -r -a ts <<<"${times_by_kind[$kind]}"
  stats=$(printf '%s\n' "${ts[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "median %.2f, worst %.2f, %d ranks", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR], NR }')
  echo "  $kind: $stats"
done
work_dir=$work
hosts_cleanup
trap - EXIT
hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"
if ((failed)); then echo "FAIL: seeds ${seeds[*]}"; exit 1; fi
echo "PASS: seeds ${seeds[*]}"
