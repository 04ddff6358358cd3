# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# A Slurm cluster of namespace hosts (tests/integration/hosts.sh), for the srun tests (sourced).
# Debian's Slurm 22.05 and MUNGE, no systemd, no cgroups:
#   * munged, with a key generated for this cluster, its socket, key, log and seed in the
#     cluster's work folder (slurm.conf names the socket: AuthInfo=socket=...);
#   * slurmctld on host 0 and one slurmd per host (slurmd -N <node>), from a slurm.conf written
#     here: one partition, ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no accounting,
#     per-node spool, pid and log files (%n); SLURM_CONF points every client at it.
# Every daemon runs inside a namespace host (hosts_exec), so hosts_remove ends them all, and
# with them every task they started. Ports: slurmctld and slurmd listen inside the hosts'
# network namespaces, which this cluster alone uses, so the ports are free by construction.
# Node names: each host's name (<tag>-host<i>), NodeAddr its address; every host's mount
# namespace gets a private /etc/hosts (a bind mount over a copy of the real one with the nodes'
# lines added), so the names resolve on every host and the real /etc/hosts is never written.
# The caller defines skip (exit 77) and fail, sets a trap that calls slurm_cluster_stop, and
# runs clients (srun, sinfo) on a host: slurm_exec 0 srun ...
#
#   slurm_cluster_start <tag> <a.b.c> <H>
#                           H hosts (hosts_names <tag> <a.b.c>, hosts_create H), the daemons,
#                           then waits (at most SLURM_START_LIMIT seconds, default 60) until
#                           `sinfo` shows all H nodes idle. Skips (exit 77) without root, the
#                           commands (slurmctld, slurmd, srun, sinfo, munged: Debian's slurmctld,
#                           slurmd, slurm-client, munge) or namespaces. Sets slurm_dir (work
#                           folder), slurm_nodes (the node names) and exports SLURM_CONF.
#   slurm_exec <i> <cmd...> runs cmd on host i (hosts_exec) with SLURM_CONF set.
#   slurm_logs              the last lines of every daemon's log (for a failure report).
#   slurm_cluster_stop      ends every process on the hosts, removes the hosts and the work
#                           folder. Safe to call twice, and after a start that stopped halfway.

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"

slurm_dir=""
slurm_nodes=()
slurm_daemons=()  # pid:name of munged, slurmctld and the slurmds

slurm_exec() {
  local i=$1
  shift
  hosts_exec "$i" env SLURM_CONF="$slurm_dir/slurm.conf" "$@"
}

slurm_logs() {
  local f
  for f in "$slurm_dir"/log/*.log; do
    [[ -e $f ]] || continue
    echo "--- $(basename "$f"): last lines"
    tail -8 "$f"
  done
}

# slurm__wait_idle <n> <seconds>: polls sinfo until n nodes are idle; fails at once when a
# daemon has exited.
slurm__wait_idle() {
  local n=$1 limit=$2 deadline idle states p
  deadline=$((SECONDS + limit))
  while :; do
    for p in "${slurm_daemons[@]}"; do
      if ! kill -0 "${p%%:*}" 2>/dev/null; then
        fail "${p#*:} exited while the cluster started"
        return 1
      fi
    done
    states=$(slurm_exec 0 sinfo -h -N -o '%N %t' 2>&1)
    idle=$(grep -c ' idle$' <<<"$states")
    ((idle == n)) && return 0
    if ((SECONDS > deadline)); then
      fail "the Slurm nodes are not all idle ${limit} s after the daemons started; sinfo says: $(tr '\n' ';' <<<"$states")"
      return 1
    fi
    sleep 0.2
  done
}

slurm_cluster_start() {
  local tag=$1 prefix=$2 n=$3 i tool limit=${SLURM_START_LIMIT:-60}
  for tool in slurmctld slurmd srun sinfo munged; do
    command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null ||
      skip "no '$tool' command (Debian packages slurmctld, slurmd, slurm-client, munge: scripts/install-deps)"
  done
  PATH=$PATH:/usr/sbin
  [[ $(id -u) == 0 ]] || skip "needs root for namespace hosts and the Slurm daemons (run as root, e.g. in a privileged container)"
  hosts_names "$tag" "$prefix"
  hosts_create "$n"
  slurm_dir=$(mktemp -d "${TMPDIR:-/tmp}/chorus-slurm.XXXXXX") || { fail "mktemp"; exit 1; }
  chmod 755 "$slurm_dir"
  mkdir -p "$slurm_dir"/{munge,log,state,spool} || { fail "mkdir in $slurm_dir"; exit 1; }
  chmod 700 "$slurm_dir/munge"
  # shellcheck disable=SC2034  # read by the callers
  slurm_nodes=("${hosts_name[@]}")

  # Names: a private /etc/hosts on every host.
  cp /etc/hosts "$slurm_dir/hosts" || { fail "cannot copy /etc/hosts"; exit 1; }
  for ((i = 0; i < n; ++i)); do echo "${hosts_addr[i]} ${hosts_name[i]}" >>"$slurm_dir/hosts"; done
  for ((i = 0; i < n; ++i)); do
    hosts_exec "$i" mount --bind "$slurm_dir/hosts" /etc/hosts || { fail "host $i: cannot bind-mount /etc/hosts"; exit 1; }
    # slurmd 22.05 loads a cgroup plugin whatever the other plugins are, and fails where
    # /sys/fs/cgroup holds no cgroup file system (as in a network namespace's fresh /sys): give
    # each host a cgroup v1 layout of its own (a tmpfs and the freezer hierarchy), unused by the
    # plugins this cluster runs (proctrack/linuxproc, task/none).
    hosts_exec "$i" sh -c 'mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer &&
      mount -t cgroup -o freezer cgroup /sys/fs/cgroup/freezer' || { fail "host $i: cannot mount a cgroup v1 layout"; exit 1; }
  done

  # MUNGE, on host 0 (its socket is a file: every host reaches it).
  head -c 1024 /dev/urandom >"$slurm_dir/munge/munge.key" && chmod 400 "$slurm_dir/munge/munge.key" ||
    { fail "cannot write a munge key"; exit 1; }
  hosts_exec 0 munged --foreground --force --socket="$slurm_dir/munge/munge.socket" \
    --key-file="$slurm_dir/munge/munge.key" --pid-file="$slurm_dir/munge/munged.pid" \
    --log-file="$slurm_dir/log/munged.log" --seed-file="$slurm_dir/munge/munged.seed" \
    </dev/null >"$slurm_dir/log/munged.out.log" 2>&1 &
  slurm_daemons+=("$!:munged")
  disown $!
  local deadline=$((SECONDS + 20))
  until [[ -S $slurm_dir/munge/munge.socket ]]; do
    ((SECONDS > deadline)) && { fail "munged made no socket within 20 s: $(tail -3 "$slurm_dir"/log/munged*.log)"; exit 1; }
    sleep 0.05
  done

  {
    echo "# written by tests/integration/slurm_cluster.sh"
    echo "ClusterName=chorus$tag"
    echo "SlurmctldHost=${hosts_name[0]}(${hosts_addr[0]})"
    echo "SlurmctldPort=6817"
    echo "SlurmdPort=6818"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$slurm_dir/munge/munge.socket"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$slurm_dir/state"
    echo "SlurmdSpoolDir=$slurm_dir/spool/%n"
    echo "SlurmctldPidFile=$slurm_dir/slurmctld.pid"
    echo "SlurmdPidFile=$slurm_dir/slurmd.%n.pid"
    echo "SlurmctldLogFile=$slurm_dir/log/slurmctld.log"
    echo "SlurmdLogFile=$slurm_dir/log/slurmd.%n.log"
    echo "PlugStackConfig=$slurm_dir/plugstack.conf"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SwitchType=switch/none"
    echo "MpiDefault=none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    # The hosts share this machine's CPUs: every node claims 4, whatever the machine has.
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    echo "KillWait=2"
    echo "InactiveLimit=0"
    echo "MinJobAge=60"
    for ((i = 0; i < n; ++i)); do
      echo "NodeName=${hosts_name[i]} NodeAddr=${hosts_addr[i]} NodeHostname=${hosts_name[i]} CPUs=4 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=chorus Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$slurm_dir/slurm.conf"
  : >"$slurm_dir/plugstack.conf"
  echo "CgroupPlugin=cgroup/v1" >"$slurm_dir/cgroup.conf"
  export SLURM_CONF=$slurm_dir/slurm.conf

  hosts_exec 0 slurmctld -D -i -f "$slurm_dir/slurm.conf" </dev/null >"$slurm_dir/log/slurmctld.out.log" 2>&1 &
  slurm_daemons+=("$!:slurmctld")
  disown $!
  for ((i = 0; i < n; ++i)); do
    mkdir -p "$slurm_dir/spool/${hosts_name[i]}"
    hosts_exec "$i" slurmd -D -N "${hosts_name[i]}" -f "$slurm_dir/slurm.conf" \
      </dev/null >"$slurm_dir/log/slurmd.${hosts_name[i]}.out.log" 2>&1 &
    slurm_daemons+=("$!:slurmd on host $i")
    disown $!
  done
  if ! slurm__wait_idle "$n" "$limit"; then
    slurm_logs
    exit 1
  fi
}

slurm_cluster_stop() {
  hosts_remove
  [[ -n $slurm_dir ]] && rm -rf "$slurm_dir"
  return 0
}
