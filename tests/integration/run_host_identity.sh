#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Host identity on namespace hosts (tests/integration/hosts.sh), with all_reduce_perf: which ranks
# count as one host (the topology: local_rank/local_size and the hierarchical algorithms) and which
# pairs share memory (shm). A host is a machine (boot id and host name, transport/peer_info.hpp);
# shm also needs the pair's network namespace to be one (shm::Transport::local_fact).
#
#   mount  2 hosts x 2 ranks, each rank in a mount namespace of its own on its host (unshare
#          --mount, as separate containers of one node sharing its network, or one `ip netns exec`
#          per rank). Passes when the 4 mount namespaces differ, rank 0 lists every rank as local
#          k/2 on its host, each rank's pair inside its host goes over shm and its pairs across
#          hosts over tcp (or rdma), every row has #wrong 0; and a second run with the hierarchical
#          algorithm forced (--algo hierarchical, which needs 2 hosts with 2 ranks) has #wrong 0.
#   net    2 ranks, one on each of 2 hosts given the same host name: one machine (one boot id) and
#          two network namespaces. Passes when they are one host (local 0/2 and 1/2), their pair
#          goes over tcp (or rdma), not shm, every row has #wrong 0; and with transport=shm forced
#          both ranks fail with invalid_argument naming the different network namespaces.
#
# MASTER_PORT: a port the kernel gives to a socket bound to port 0 in host 0's network namespace
# (this test's own), so no fixed port. Every run is bounded (timeout); nothing may be left: no
# rank, no process in the hosts but their holders, then no namespace, device or holder. Exit 77
# (skipped) without root, ip netns, unshare or python3.
#
# Usage: run_host_identity.sh <all_reduce_perf> <mount|net>
set -uo pipefail

perf=${1:?usage: run_host_identity.sh <all_reduce_perf> <mount|net>}
scenario=${2:?scenario: mount or net}
run_limit=${HOST_ID_RUN_LIMIT:-90}  # seconds for one run of the ranks (ctest's TIMEOUT is 300)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
failed=0

[[ $scenario == mount || $scenario == net ]] || { echo "unknown scenario '$scenario'"; exit 2; }
[[ -x $perf ]] || { echo "no program $perf"; exit 2; }
command -v python3 >/dev/null || skip "no python3 (it finds a free port in host 0)"

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_names "hid$$" 10.83.0
hosts_scratch host-id

hosts_create 2
if [[ $scenario == mount ]]; then
  host_of=(0 0 1 1)
else
  host_of=(0 1)
  # One machine, two network namespaces: host 1 takes host 0's name (its own UTS namespace).
  hosts_exec 1 hostname "${hosts_name[0]}" || { fail "cannot rename host 1"; exit 1; }
  hosts_name[1]=${hosts_name[0]}
fi
world=${#host_of[@]}
echo "scenario $scenario: $world ranks on hosts ${host_of[*]} (names ${hosts_name[*]}), store on host 0 at ${hosts_addr[0]}"

# run <name> <perf arguments...>: starts the ranks (RANK, WORLD_SIZE, MASTER_*; the mount
# scenario gives each its own mount namespace), each writing "<mnt> <net>" namespaces to
# <name>.ns<r>, stdout to <name>.out<r>, stderr to <name>.err<r>; waits for all; sets rcs.
run() {
  local name=$1 r port deadline
  shift
  port=$(hosts_exec 0 python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])') ||
    { fail "no free port in host 0"; return 1; }
  local own_mount=()
  [[ $scenario == mount ]] && own_mount=(unshare --mount --propagation private)
  pids=()
  for ((r = 0; r < world; ++r)); do
    hosts_exec "${host_of[r]}" timeout -k 5 "$run_limit" "${own_mount[@]}" bash -c '
      echo "$(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/net)" >"$1"; shift; exec "$@"' \
      ns "$work/$name.ns$r" \
      env -u CHORUS_HOST_ID -u CHORUS_TRANSPORT -u CHORUS_TRANSPORT_DISABLE -u CHORUS_ALGO -u LOCAL_RANK \
      -u LOCAL_WORLD_SIZE RANK=$r WORLD_SIZE=$world MASTER_ADDR="${hosts_addr[0]}" MASTER_PORT="$port" \
      CHORUS_TIMEOUT=30 CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=TRANSPORT "$perf" "$@" \
      >"$work/$name.out$r" 2>"$work/$name.err$r" </dev/null &
    pids[r]=$!
  done
  deadline=$((SECONDS + run_limit + 10))
  rcs=()
  for ((r = 0; r < world; ++r)); do
    while kill -0 "${pids[r]}" 2>/dev/null && ((SECONDS <= deadline)); do sleep 0.05; done
    if kill -0 "${pids[r]}" 2>/dev/null; then rcs[r]=running; fail "$name: rank $r still runs"; else wait "${pids[r]}"; rcs[r]=$?; fi
  done
  echo "$name: port $port, exit statuses ${rcs[*]}"
}

show() {
  local name=$1 r
  for ((r = 0; r < world; ++r)); do
    echo "--- $name rank $r: last lines of stdout and stderr"
    tail -4 "$work/$name.out$r" 2>/dev/null
    tail -4 "$work/$name.err$r" 2>/dev/null
  done
}

# rows_ok <name>: rank 0's result rows all have #wrong 0 (out of place and in place), and there are some.
rows_ok() {
  local out=$work/$1.out0 rows bad
  rows=$(grep -cE '^ +[0-9]+ ' "$out")
  bad=$(awk '/^ +[0-9]+ / && ($9 != 0 || $13 != 0)' "$out")
  ((rows > 0)) || { fail "$1: no result rows"; return; }
  [[ -z $bad ]] || fail "$1: rows with #wrong other than 0: $bad"
  grep -q '^# Out of bounds values : 0 OK' "$out" || fail "$1: no '# Out of bounds values : 0 OK'"
  echo "$1: $rows rows, #wrong 0 on each; $(grep -m1 '^# Avg bus bandwidth' "$out")"
}

# The ranks' placement, the topology rank 0 lists, and each pair's transport.
check_layout() {
  local name=$1 r p line want_kind got ns same_net same_host
  for ((r = 0; r < world; ++r)); do
    ns=$(cat "$work/$name.ns$r" 2>/dev/null)
    echo "rank $r on host ${host_of[r]}: namespaces $ns"
    ns_of[r]=$ns
  done
  for ((r = 0; r < world; ++r)); do
    for ((p = r + 1; p < world; ++p)); do
      if [[ $scenario == mount ]]; then
        [[ ${ns_of[r]%% *} != "${ns_of[p]%% *}" ]] || fail "ranks $r and $p share a mount namespace"
        same_net=0 same_host=0
        [[ ${ns_of[r]#* } == "${ns_of[p]#* }" ]] && same_net=1
        ((host_of[r] == host_of[p])) && same_host=1
        ((same_net == same_host)) ||
          fail "ranks $r and $p: network namespaces ${ns_of[r]#* } and ${ns_of[p]#* } on hosts ${host_of[r]} and ${host_of[p]}"
      else
        [[ ${ns_of[r]#* } != "${ns_of[p]#* }" ]] || fail "ranks $r and $p share a network namespace"
      fi
    done
  done
  grep '^#  Rank' "$work/$name.out0"
  for ((r = 0; r < world; ++r)); do
    # "#  Rank  1 Group  0 Pid  1234 on <host> transport shm+tcp local 1/2"
    line=$(awk -v r="$r" '$2 == "Rank" && $3 == r { print $9, $13 }' "$work/$name.out0")
    local k=0 n=0 q
    for ((q = 0; q < world; ++q)); do
      ((host_of[q] == host_of[r])) || continue
      ((q < r)) && k=$((k + 1))
      n=$((n + 1))
    done
    if [[ $scenario == net ]]; then k=$r n=$world; fi  # one host
    [[ $line == "${hosts_name[host_of[r]]} $k/$n" ]] ||
      fail "$name: rank 0 lists rank $r as '$line', expected '${hosts_name[host_of[r]]} $k/$n' (host name, local rank/size)"
  done
  for ((r = 0; r < world; ++r)); do
    for ((p = 0; p < world; ++p)); do
      ((p == r)) && continue
      got=$(sed -n "s/.* INFO TRANSPORT transport auto: rank $r <-> rank $p over \([a-z_]*\)\$/\1/p" "$work/$name.err$r")
      want_kind='tcp|rdma'
      [[ $scenario == mount && ${host_of[r]} == "${host_of[p]}" ]] && want_kind=shm
      [[ $got =~ ^($want_kind)$ ]] || fail "$name: rank $r <-> rank $p over '$got', expected $want_kind"
    done
    grep -h 'INFO TRANSPORT transport auto: [0-9]' "$work/$name.err$r"
  done
}

ns_of=()
t0=$SECONDS
run auto -b 8 -e 16M -f 8 -n 2 --show-algo
check_layout auto
for ((r = 0; r < world; ++r)); do [[ ${rcs[r]} == 0 ]] || fail "auto: rank $r exited ${rcs[r]}"; done
rows_ok auto
echo "auto: algorithms by size: $(awk '/^ +[0-9]+ / { printf "%s=%s ", $1, $NF }' "$work/auto.out0")"
((failed)) && show auto

if [[ $scenario == mount ]]; then
  run hier -b 8 -e 16M -f 8 -n 2 --algo hierarchical
  for ((r = 0; r < world; ++r)); do [[ ${rcs[r]} == 0 ]] || fail "hier: rank $r exited ${rcs[r]}"; done
  rows_ok hier
  ((failed)) && show hier
else
  # Rank 0 serves the store, so it always reads rank 1's facts and says why; rank 1 may lose the
  # store to rank 0's exit before it has read them (then its error is the store's).
  run shm -b 8 -e 8 -n 1 --transport shm
  for ((r = 0; r < world; ++r)); do
    [[ ${rcs[r]} != 0 && ${rcs[r]} != running ]] || fail "shm forced: rank $r exited ${rcs[r]}, expected a failure"
    line=$(grep -h -m1 '^all_reduce_perf: rank' "$work/shm.err$r" "$work/shm.out$r" 2>/dev/null | head -1)
    echo "shm forced: rank $r: $line"
    ((r == 0)) && [[ $line != *"invalid_argument"*"transport=shm"*"cannot share memory: different network namespaces ("* ]] &&
      fail "shm forced: rank 0 does not say 'cannot share memory: different network namespaces'"
  done
  ((failed)) && show shm
fi

# Nothing left: no rank, no process in a host but its holder.
for r in "${!pids[@]}"; do kill -0 "${pids[r]}" 2>/dev/null && fail "rank $r process left"; done
for ((h = 0; h < hosts_count; ++h)); do
  left=$(ip netns pids "${hosts_ns[h]}" 2>/dev/null | grep -vx "${hosts_holder[h]}" | tr '\n' ' ')
  [[ -z $left ]] || fail "processes left on host $h: $left"
done
work_dir=$work
hosts_cleanup
trap - EXIT
hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"
echo "runs took $((SECONDS - t0)) s"

if ((failed)); then echo "FAIL: host identity, $scenario"; exit 1; fi
echo "PASS: host identity, $scenario"
