#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Runs a chorus program as ranks of a real mpirun job on this host, with no MASTER_ADDR nor
# MASTER_PORT: the ranks must meet through the job's file store (docs/environment.md).
#
#   run_under_mpi.sh openmpi|mpich NRANKS MIN_OK PROGRAM [ARGS...]
#
# Passes when the launcher exits 0, the output has at least MIN_OK lines ending in "OK" and none
# with "WRONG", and no chorus-*.store file is left in the job's TMPDIR (a fresh directory).
# Exits 77 (ctest: skipped) when the launcher is not installed.
set -u
kind=$1 nranks=$2 min_ok=$3
shift 3
case $kind in
  openmpi) launcher=mpirun.openmpi; set -- --allow-run-as-root --oversubscribe -np "$nranks" "$@" ;;
  mpich) launcher=mpiexec.mpich; set -- -n "$nranks" "$@" ;;
  *) echo "unknown launcher kind '$kind'"; exit 2 ;;
esac
if ! command -v "$launcher" >/dev/null 2>&1; then
  echo "SKIP: $launcher is not installed (apt-get install openmpi-bin / mpich)"
  exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
out=$(env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
          -u CHORUS_AGENT_STORE TMPDIR="$tmp" timeout 120 "$launcher" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
echo "--- $launcher exited with status $rc"
[ "$rc" -eq 0 ] || exit 1
if printf '%s\n' "$out" | grep -q WRONG; then echo "FAIL: a rank reported WRONG"; exit 1; fi
ok=$(printf '%s\n' "$out" | grep -c ' OK$')
if [ "$ok" -lt "$min_ok" ]; then echo "FAIL: $ok lines end in OK, expected at least $min_ok"; exit 1; fi
left=$(find "$tmp" -name 'chorus-*.store')
if [ -n "$left" ]; then echo "FAIL: the job's file store was left behind: $left"; exit 1; fi
echo "PASS: $nranks ranks under $launcher met without MASTER_ADDR"
