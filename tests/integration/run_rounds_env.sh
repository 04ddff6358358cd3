#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Communicators one after the other through env://, as test suites and notebooks make them:
# 4 ranks of rounds_driver on this host, each process making ROUNDS (default 5) communicators in
# turn with MASTER_ADDR=127.0.0.1 and MASTER_PORT (a port the kernel gave to a socket bound to port
# 0, so no fixed port). A fast rank's next rendezvous reaches rank 0's store before rank 0 has let
# its last communicator go: the process keeps that store (detail::url_store), so every round
# meets. (Made afresh, it failed in round 2 with "store server gone?".)
#
# Passes when every rank prints "ROUND r ... OK" for every round and exits 0, each within 60 s.
# Usage: run_rounds_env.sh <rounds_driver> [rounds]
set -euo pipefail

driver=$1
rounds=${2:-5}
world=4
command -v python3 >/dev/null || { echo "SKIP: no python3 (it finds a free port)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-rounds-env.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for ((r = 0; r < world; ++r)); do
  env -u LOCAL_RANK -u LOCAL_WORLD_SIZE MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    RANK=$r WORLD_SIZE=$world timeout --kill-after=5 60 "$driver" "$rounds" >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < world; ++r)); do
  rc=0
  wait "${pids[$r]}" || rc=$?
  ok=$(grep -c "^ROUND .* rank $r/$world OK\$" "$work/rank$r.log" || true)
  if ((rc != 0 || ok != rounds)); then
    echo "FAIL: rank $r exited $rc with $ok of $rounds rounds OK; its output:"
    sed 's/^/  /' "$work/rank$r.log"
    status=1
  fi
done
pids=()
((status == 0)) && echo "PASS: $world ranks x $rounds communicators one after the other over env:// (port $port)"
exit $status
