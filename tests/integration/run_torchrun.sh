#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# C++ chorus programs started by torch 1.13's torchrun with --no_python (docs/torch.md, "C++
# programs under torchrun"). Scenarios:
#
#   one_host_static <all_reduce_perf>   torchrun's default (static) rendezvous: its agent serves a
#       torch TCPStore on MASTER_PORT and sets TORCHELASTIC_USE_AGENT_STORE=True, so every rank
#       joins that store. 4 ranks, -b 8 -e 1M -f 4 -c 1. In a network namespace of its own, where
#       the default port 29500 is free whatever else runs (root needed: skipped without).
#   one_host_c10d <all_reduce_perf>     --rdzv_backend c10d --rdzv_endpoint localhost:0: the agent
#       picks a free MASTER_PORT and rank 0 serves chorus's own store there. No root needed.
#   two_hosts_c10d|two_hosts_static <02_train_fashion_mnist>   two hosts (network, UTS, mount and
#       pid namespaces: own address, host name, /dev/shm, /etc/hosts naming both), one torchrun
#       each (--nnodes 2 --nproc_per_node 2), one epoch of the Fashion-MNIST example; c10d: the
#       rendezvous store on host-a, MASTER_ADDR host-a's name, rank 0 serves chorus's store;
#       static: --master_addr host-a's address, the agent of node 0 serves the store.
#
# Passes when torchrun exits 0 everywhere, the ranks say which store they used (CHORUS_DEBUG=INFO,
# subsystems BOOTSTRAP and TRANSPORT), all_reduce_perf's rows all have #wrong 0 and it prints "Out
# of bounds values : 0 OK", the example reaches --min-test-accuracy (its exit status is 3 below
# it) and its ranks reach the other host's ranks over tcp and their own host's over shm. The result
# lines are printed. Nothing is left: no process, namespace, veth or work folder. Exit 77
# (skipped) without /usr/bin/torchrun and torch, where namespaces are needed without root, and
# for the example without Debian's dataset-fashion-mnist.
#
# Debian's torchrun (torch 1.13 on Python 3.11) fails with "'NoneType' object has no attribute
# 'get'" unless given --redirects and --tee: 1 (stdout) for both, so rank lines come prefixed
# "[default<local rank>]:".
set -uo pipefail

scenario=${1:?usage: run_torchrun.sh one_host_static|one_host_c10d|two_hosts_c10d|two_hosts_static <program>}
program=${2:?the program (all_reduce_perf, or 02_train_fashion_mnist for two_hosts_*)}
limit=${TORCHRUN_WAIT:-120}   # seconds for each torchrun
torchrun=/usr/bin/torchrun

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }

[[ -x $torchrun ]] || skip "no $torchrun (Debian package python3-torch)"
/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip "/usr/bin/python3 cannot import torch.distributed.run"
[[ -x $program ]] || { echo "FAIL: $program is not an executable"; exit 1; }
needs_root() {
  [[ $(id -u) == 0 ]] || skip "needs root for namespaces (run as root, e.g. in a privileged container)"
  command -v unshare >/dev/null || skip "no 'unshare' command (util-linux)"
}

source "$(dirname "${BASH_SOURCE[0]}")/two_hosts.sh"
tag="chtr$$"
two_hosts_names "$tag" 10.78.0   # ns_a, ns_b, veth_a, veth_b, addr_a (10.78.0.1), addr_b
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-torchrun.XXXXXX")
export TMPDIR=$work   # torchrun's log folders (torchelastic_*) go there, and with it
failed=0
pids=()   # each a session leader (setsid): its process group is the whole run

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 -- "-$p" 2>/dev/null; done
  two_hosts_remove
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# What every run gets: torchrun's flags for C++ programs, and the log lines that say which store.
torchrun_flags=(--no_python --redirects 1 --tee 1)
export CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=BOOTSTRAP,TRANSPORT

# Checks all_reduce_perf's output ($1) and prints its result lines.
check_perf() {
  local out=$1 rows
  grep -E '^\[default0\]:#|^\[default0\]: +[0-9]' "$out" | sed 's/^\[default0\]://'
  grep -q '# Out of bounds values : 0 OK' "$out" || fail "no '# Out of bounds values : 0 OK' line"
  # size count type redop root time algbw busbw #wrong time algbw busbw #wrong
  rows=$(grep -cE '^\[default0\]: +[0-9]+ +[0-9]+ +float +sum' "$out")
  ((rows == 9)) || fail "$rows result rows, expected 9 (8 B to 512 KiB, factor 4)"
  if ((rows > 0)); then
    grep -E '^\[default0\]: +[0-9]+ +[0-9]+ +float +sum' "$out" | awk '$10 != 0 || $14 != 0 { bad = 1 } END { exit bad }' ||
      fail "a row with #wrong other than 0"
  fi
  for r in 0 1 2 3; do grep -qE "#  Rank +$r " "$out" || fail "rank $r is not in the device list"; done
}

# The store lines: $1 the output, $2 "agent" (every rank joined the agent's store) or "own" (rank
# 0 served chorus's store), $3 the number of ranks in that output.
check_store() {
  local out=$1 kind=$2 n=$3 joined
  joined=$(grep -c "store: torchrun's agent store (a torch TCPStore) at" "$out")
  if [[ $kind == agent ]]; then
    ((joined == n)) || fail "$joined of $n ranks say they joined torchrun's agent store"
  else
    ((joined == 0)) || fail "$joined ranks joined an agent store under the c10d rendezvous"
  fi
}

run_torchrun() {  # run_torchrun <output file> <torchrun arguments...>, bounded
  local out=$1; shift
  setsid timeout -k 5 "$limit" "$@" >"$out" 2>&1 &
  pids+=($!)
  wait $!
}

case $scenario in
  one_host_static | one_host_c10d)
    perf_args=(-b 8 -e 1M -f 4 -c 1)
    if [[ $scenario == one_host_static ]]; then
      needs_root
      # A network (and pid) namespace of its own: port 29500, torchrun's default, is free there.
      inside=(unshare --net --pid --mount --fork --kill-child --mount-proc bash -c 'ip link set lo up && exec "$@"' sh)
      flags=(--nproc_per_node 4)
      kind=agent
    else
      inside=()
      flags=(--nnodes 1 --nproc_per_node 4 --rdzv_backend c10d --rdzv_endpoint localhost:0)
      kind=own
    fi
    run_torchrun "$work/torchrun.out" "${inside[@]}" "$torchrun" "${torchrun_flags[@]}" "${flags[@]}" \
      "$program" "${perf_args[@]}"
    rc=$?
    echo "torchrun ${torchrun_flags[*]} ${flags[*]} $program ${perf_args[*]}: exit status $rc"
    ((rc == 0)) || fail "torchrun exited with $rc"
    check_perf "$work/torchrun.out"
    check_store "$work/torchrun.out" "$kind" 4
    if [[ $kind == own ]]; then
      grep -q 'TcpStore server listening on' "$work/torchrun.out" || fail "rank 0 did not serve chorus's store"
    fi
    ;;
  two_hosts_c10d | two_hosts_static)
    needs_root
    command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
    [[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
      skip "no Fashion-MNIST under /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist)"
    two_hosts_create
    printf '127.0.0.1 localhost\n%s host-a\n%s host-b\n' "$addr_a" "$addr_b" >"$work/hosts"

    if [[ $scenario == two_hosts_c10d ]]; then
      rdzv=(--rdzv_backend c10d --rdzv_endpoint "$addr_a:29400" --rdzv_id "$tag")
    else
      rdzv=(--master_addr "$addr_a" --master_port 29500)
    fi
    args=(--epochs 1 --no-progress --min-test-accuracy 0.75)
    # start_host <ns> <host name> <node rank>: one torchrun in the host's namespaces.
    start_host() {
      local ns=$1 name=$2 node=$3 extra=()
      [[ $scenario == two_hosts_static ]] && extra=(--node_rank "$node")
      setsid timeout -k 5 "$limit" ip netns exec "$ns" \
        unshare --uts --mount --propagation private --pid --fork --kill-child --mount-proc bash -c '
          hostname "$1" && mount -t tmpfs -o size=256m tmpfs /dev/shm && mount --bind "$2" /etc/hosts || exit 1
          shift 2
          exec "$@"' host "$name" "$work/hosts" \
        "$torchrun" "${torchrun_flags[@]}" --nnodes 2 --nproc_per_node 2 "${rdzv[@]}" "${extra[@]}" \
        "$program" "${args[@]}" >"$work/$name.out" 2>&1 &
      pids+=($!)
    }
    start_host "$ns_a" host-a 0
    start_host "$ns_b" host-b 1
    rc_a=0 rc_b=0
    wait "${pids[0]}" || rc_a=$?
    wait "${pids[1]}" || rc_b=$?
    node_flag=""
    [[ $scenario == two_hosts_static ]] && node_flag=" --node_rank 0|1"
    echo "host-a, host-b: torchrun ${torchrun_flags[*]} --nnodes 2 --nproc_per_node 2 ${rdzv[*]}$node_flag" \
         "$program ${args[*]}"
    echo "exit status: host-a $rc_a, host-b $rc_b"
    ((rc_a == 0)) || fail "host-a's torchrun exited with $rc_a"
    ((rc_b == 0)) || fail "host-b's torchrun exited with $rc_b"
    # Rank 0's lines (on whichever host the rendezvous put it).
    grep -hE '^\[default0\]:(02_train_fashion_mnist|epoch|gradient)' "$work/host-a.out" "$work/host-b.out" |
      sed 's/^\[default0\]://'
    grep -hqE '^\[default0\]:02_train_fashion_mnist: 4 ranks' "$work/host-a.out" "$work/host-b.out" ||
      fail "no '4 ranks' line from rank 0"
    grep -hqE '^\[default0\]:epoch +1/1 .* test 0\.[0-9]+' "$work/host-a.out" "$work/host-b.out" ||
      fail "no epoch line from rank 0"
    if [[ $scenario == two_hosts_static ]]; then kind=agent; else kind=own; fi
    check_store "$work/host-a.out" "$kind" 2
    check_store "$work/host-b.out" "$kind" 2
    # Each rank reaches the other host's ranks over tcp, its own host's over shm.
    for r in 0 1 2 3; do
      line=$(grep -h "rank $r <-> rank" "$work/host-a.out" "$work/host-b.out" | sed 's/.*: rank/rank/' | sort | tr '\n' ';')
      for p in 0 1 2 3; do
        ((p == r)) && continue
        want=tcp
        (((p < 2) == (r < 2))) && want=shm
        [[ $line == *"rank $r <-> rank $p over $want;"* ]] || fail "rank $r does not reach rank $p over $want: $line"
      done
    done
    ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac

# Nothing left: the runs' process groups, then the namespaces and the work folder.
for p in "${pids[@]}"; do
  for _ in $(seq 50); do kill -0 -- "-$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 -- "-$p" 2>/dev/null && fail "processes of run $p left: $(pgrep -g "$p" | tr '\n' ' ')"
done
if ((failed)); then
  for f in "$work"/*.out; do
    echo "--- $(basename "$f"): its error lines, then its last lines"
    grep -E -i -m10 'error|chorus [a-z_]+:' "$f"
    tail -25 "$f"
  done
  exit 1
fi
work_dir=$work
cleanup
trap - EXIT
two_hosts_check_removed
[[ -e $work_dir ]] && fail "work folder $work_dir left"
((failed)) && exit 1
echo "PASS: $scenario"
