#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# chorus ranks started by an MPI launcher on 2 namespace hosts x 2 ranks (integration/hosts.sh),
# with no MASTER_ADDR and no MASTER_PORT anywhere: rank 0 serves the store on an ephemeral port and
# hands its address to the others through the launcher's key-value service (PMIx under Open MPI's
# mpirun, PMI-1 under MPICH's mpiexec; include/chorus/bootstrap/launcher_kvs.hpp).
#
#   run_mpi_hosts.sh <all_reduce_perf> openmpi|mpich [<rounds_driver>]
#
# The launcher runs on host 0 and reaches host 1 through its remote-shell agent (Open MPI's
# plm_rsh_agent, Hydra's -launcher ssh -launcher-exec): a small script in place of ssh that runs
# the command on the named host's namespaces (nsenter). Each host gets a private /etc/hosts (a bind
# mount over a copy with both hosts' lines added) so the names resolve on both; the real one is
# never written. all_reduce_perf runs 8 B to 8 MiB (-f 8, one warm-up and one timed call per size:
# the test checks, it does not time). Passes when the launcher exits 0 within 120 s, every row has
# #wrong 0, ranks 0-1 report host 0 and 2-3 host 1 with local rank r mod 2 of 2 (the
# communicator's and the launcher's), no task has a MASTER_* variable (each checks its environment
# before it execs the program), rank 0's INFO log says the store's address was handed out by the
# launcher's pmix or pmi1, and nothing is left on the hosts. With <rounds_driver>
# (integration/rounds_driver.cpp), a second job runs it: three communicators one after the other
# in each process (the later ones meet on the store the first exchange found) and a split; every
# rank prints OK for every round. Exit 77 (skipped) without root, namespaces or the launcher.
set -uo pipefail

perf=${1:?usage: run_mpi_hosts.sh <all_reduce_perf> openmpi|mpich}
kind=${2:?usage: run_mpi_hosts.sh <all_reduce_perf> openmpi|mpich}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
failed=0

rounds=${3:-}
[[ -x $perf ]] || { echo "no program $perf"; exit 2; }
perf=$(realpath "$perf")
if [[ -n $rounds ]]; then
  [[ -x $rounds ]] || { echo "no program $rounds"; exit 2; }
  rounds=$(realpath "$rounds")
fi
case $kind in
  openmpi) launcher=mpirun.openmpi service=pmix ;;
  mpich) launcher=mpiexec.mpich service=pmi1 ;;
  *) echo "unknown launcher kind '$kind' (openmpi or mpich)"; exit 2 ;;
esac
command -v "$launcher" >/dev/null 2>&1 || skip "$launcher is not installed (apt-get install openmpi-bin / mpich)"
((EUID == 0)) || skip "namespace hosts need root"

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
hosts_names "m${kind:0:1}$$" 10.83.0
hosts_scratch mpi-hosts
hosts_create 2
cp /etc/hosts "$work/hosts" || { fail "cannot copy /etc/hosts"; exit 1; }
for i in 0 1; do echo "${hosts_addr[i]} ${hosts_name[i]}" >>"$work/hosts"; done
for i in 0 1; do
  hosts_exec "$i" mount --bind "$work/hosts" /etc/hosts || { fail "host $i: cannot bind-mount /etc/hosts"; exit 1; }
  echo "${hosts_name[i]} ${hosts_holder[i]}" >>"$work/map"
done

# The remote-shell agent: [options] host command..., as ssh is called; the command is a shell
# line (Open MPI and Hydra quote for a remote shell).
cat >"$work/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1
shift
pid=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$work/map")
[ -n "\$pid" ] || { echo "agent: no namespace host named '\$host'" >&2; exit 255; }
exec nsenter --target "\$pid" --net --uts --mount -- sh -c "\$*"
EOF
chmod +x "$work/agent"

# Each task refuses to run with a MASTER_* variable, then execs the program.
cat >"$work/task" <<'EOF'
#!/bin/sh
if env | grep '^MASTER_'; then echo "MASTER_CHECK: a task has MASTER_* set" >&2; exit 3; fi
exec "$@"
EOF
chmod +x "$work/task"

hostlist="${hosts_name[0]}:2,${hosts_name[1]}:2"
case $kind in
  openmpi)
    set -- "$launcher" --allow-run-as-root --host "$hostlist" --mca plm_rsh_agent "$work/agent" \
      -x CHORUS_DEBUG=INFO -x CHORUS_DEBUG_SUBSYS=BOOTSTRAP
    ;;
  mpich)
    set -- "$launcher" -hosts "$hostlist" -launcher ssh -launcher-exec "$work/agent" \
      -genv CHORUS_DEBUG INFO -genv CHORUS_DEBUG_SUBSYS BOOTSTRAP
    ;;
esac
# The launcher on host 0, bounded, without MASTER_* nor other launchers' variables; output in $1.
launch() {
  local out=$1 rc t0=$SECONDS
  shift
  echo "on ${hosts_name[0]}: ${launch_args[*]} $*"
  hosts_exec 0 env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
    -u CHORUS_AGENT_STORE CHORUS_TIMEOUT=60 timeout -k 5 120 "${launch_args[@]}" "$@" >"$out" 2>&1
  rc=$?
  echo "$launcher exited with status $rc after $((SECONDS - t0)) s"
  ((rc == 0)) || fail "$launcher exited with status $rc"
}
launch_args=("$@")
launch "$work/out" "$work/task" "$perf" -b 8 -e 8M -f 8 -w 1 -n 1

out=$work/out
grep -E '^#  Rank|^ +[0-9]+ +[0-9]+ +float|Out of bounds|store: ' "$out"
grep -q '# Out of bounds values : 0 OK' "$out" || fail "no '# Out of bounds values : 0 OK' line"
rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +float +sum' "$out")
((rows == 7)) || fail "$rows result rows, expected 7 (8 B to 8 MiB, factor 8)"
grep -E '^ +[0-9]+ +[0-9]+ +float +sum' "$out" | awk '$9 != "0" || $13 != "0" { bad = 1 } END { exit bad }' ||
  fail "a row with #wrong other than 0"
for r in 0 1 2 3; do
  h=$((r / 2)) l=$((r % 2))
  grep -qE "^#  Rank +$r .* on +${hosts_name[h]} .* local $l/2 $kind local $l/2\$" "$out" ||
    fail "rank $r: not on ${hosts_name[h]} with local rank $l of 2 (communicator and launcher)"
done
grep -qE "rank 0\] INFO BOOTSTRAP store: tcp://${hosts_addr[0]//./\\.}:[0-9]+, its address handed out by the launcher's $service\$" "$out" ||
  fail "rank 0 did not log its store at ${hosts_addr[0]}, handed out by the launcher's $service"
if grep -q 'MASTER_' "$out"; then fail "a task had MASTER_* set: $(grep 'MASTER_' "$out" | head -3)"; fi
if ((failed)); then
  echo "--- the launcher's output"
  cat "$out"
fi

if [[ -n $rounds ]]; then
  echo "=== three communicators one after the other"
  launch "$work/rounds" "$work/task" "$rounds" 3
  grep -E '^ROUND' "$work/rounds" | sort
  ok=$(grep -cE '^ROUND [0-2] rank [0-3]/4 OK$' "$work/rounds")
  ((ok == 12)) || fail "$ok OK lines from rounds_driver, expected 12 (3 rounds x 4 ranks)"
  if grep -qE 'WRONG|ROUNDS_ERROR|MASTER_' "$work/rounds"; then
    fail "rounds_driver: $(grep -E 'WRONG|ROUNDS_ERROR|MASTER_' "$work/rounds" | head -3)"
    cat "$work/rounds"
  fi
fi

hosts_remove
hosts_check_removed
if ((failed)); then echo "FAIL: $launcher across hosts"; exit 1; fi
echo "PASS: $launcher across 2 namespace hosts x 2 ranks, no MASTER_*, the store's address through $service"
