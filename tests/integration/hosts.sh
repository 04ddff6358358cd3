# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# H namespace "hosts" behind one bridge, for multi-host tests and scripts/hosts-bench (sourced).
# Host i is a network namespace with its loopback up and one veth whose other end is a port of
# the bridge br0, which lives in a network namespace of its own; host i has <prefix>.(i+1)/24.
# Each host also has a UTS namespace (its own host name) and a mount namespace (a private tmpfs on
# /dev/shm), held by one process per host (a `sleep infinity` in all three namespaces), so every
# command started with hosts_exec on host i shares them, as the processes of one machine do:
# chorus's auto transport sees one host per namespace host (shm inside, tcp across).
# The caller defines skip (exit 77) and fail (records a failure; may return), and sets a trap that
# calls hosts_remove before hosts_create (which may stop halfway, with skip or exit 1).
#
#   hosts_names <tag> <a.b.c>   sets the names, unique per tag (ctest -j runs several tests at
#                               once): hosts_tag, hosts_prefix, hosts_brns (the bridge namespace
#                               <tag>br); hosts_create names host i's namespace <tag>h<i>, its veth
#                               <tag>v<i> and the bridge's end <tag>b<i>. The tag: letters, digits
#                               and _, at most 11 characters (device names have at most 15).
#   hosts_create <H>            makes H hosts (1..250). Sets hosts_count and the arrays, index
#                               0..H-1: hosts_ns (namespace), hosts_addr (address),
#                               hosts_dev (veth inside the host), hosts_brdev (its other end, in
#                               $hosts_brns), hosts_name (host name), hosts_holder (pid holding
#                               the host's UTS and mount namespaces). Calls skip where namespaces
#                               cannot be made (not root, no ip, unshare or nsenter).
#   hosts_exec <i> <cmd...>     runs cmd on host i (its network, UTS and mount namespaces; the
#                               working directory stays the caller's) and returns its status;
#                               with `hosts_exec i cmd &`, wait $! gives cmd's status ($! may be
#                               a shell around cmd: killing it may leave cmd running, hosts_remove
#                               ends everything on the hosts).
#   hosts_shape <rate> [<burst>] [<delay>]
#                               tc tbf (rate as tc writes it: 1gbit, 500mbit; burst default 256kb,
#                               latency 100ms) on both ends of every host's veth, so each host's
#                               link carries at most rate in each direction. With a delay (tc time,
#                               e.g. 1ms): netem adds it on both ends as well (each crossing of a
#                               link: host to host is twice the delay); where the kernel has no
#                               netem, fail names it, nothing is shaped and the status is 1.
#   hosts_unshape               removes the shaping.
#   hosts_have_netem            status 0 when netem qdiscs can be made here.
#   hosts_tx_bytes <i>          bytes host i's veth has sent (its statistics: headers and
#   hosts_rx_bytes <i>          acknowledgements included), received.
#   hosts_cut <i>               host i's link down (the veth inside the host).
#   hosts_remove                SIGKILLs every process still in the hosts' and the bridge's
#                               namespaces, waits (at most 10 s) until none is left, deletes the
#                               namespaces (their veths with them). Safe to call twice, and after
#                               a hosts_create that stopped halfway.
#   hosts_check_removed         fail for each namespace, device or holder left.
#   hosts_scratch <name>        for a test script, after hosts_names: makes its work folder $work
#                               (mktemp -d in TMPDIR, else /tmp: chorus-<name>.XXXXXX) and an
#                               empty array pids, and calls hosts_cleanup on EXIT (INT and TERM
#                               exit 1, so it runs then too).
#   hosts_cleanup               SIGKILLs every process in pids, hosts_remove, removes $work. Safe
#                               to call twice.

hosts_names() {
  [[ $1 =~ ^[A-Za-z0-9_]{1,11}$ ]] || { fail "hosts_names: tag '$1' must be 1-11 letters, digits or _"; exit 1; }
  [[ $2 =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { fail "hosts_names: prefix '$2' is not a.b.c"; exit 1; }
  hosts_tag=$1 hosts_prefix=$2 hosts_brns="$1br"
  hosts_count=0
  hosts_ns=() hosts_addr=() hosts_dev=() hosts_brdev=() hosts_name=() hosts_holder=()
  hosts_work=""
}

# hosts__listns: this tag's namespaces that exist now.
hosts__listns() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^${hosts_tag}(br|h[0-9]+)\$"
}

hosts_create() {
  local n=$1 i ns deadline
  [[ -n ${hosts_tag:-} ]] || { fail "hosts_create: call hosts_names first"; exit 1; }
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || { fail "hosts_create: host count '$n' not in 1..250"; exit 1; }
  [[ $(id -u) == 0 ]] || skip "needs root to create network namespaces (run as root, e.g. in a privileged container)"
  local tool
  for tool in ip unshare nsenter; do command -v "$tool" >/dev/null || skip "no '$tool' command"; done
  ip netns add "$hosts_brns" 2>/dev/null || skip "'ip netns add' failed (no CAP_SYS_ADMIN or no network namespaces here)"
  hosts_work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-hosts.XXXXXX") || { fail "mktemp"; exit 1; }
  ip netns exec "$hosts_brns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
  ip -n "$hosts_brns" link set lo up &&
    ip -n "$hosts_brns" link add br0 type bridge &&
    ip -n "$hosts_brns" link set br0 up || { fail "cannot make the bridge in $hosts_brns"; exit 1; }
  for ((i = 0; i < n; ++i)); do
    ns="${hosts_tag}h$i"
    hosts_ns[i]=$ns hosts_addr[i]="$hosts_prefix.$((i + 1))" hosts_dev[i]="${hosts_tag}v$i"
    hosts_brdev[i]="${hosts_tag}b$i" hosts_name[i]="${hosts_tag}-host$i"
    hosts_count=$((i + 1))
    ip netns add "$ns" || { fail "ip netns add $ns"; exit 1; }
    # No IPv6: no router solicitations or MLD reports in the hosts' byte counts.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
    ip -n "$hosts_brns" link add "${hosts_brdev[i]}" type veth peer name "${hosts_dev[i]}" netns "$ns" ||
      skip "cannot create a veth pair"
    ip -n "$hosts_brns" link set "${hosts_brdev[i]}" master br0 up &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" addr add "${hosts_addr[i]}/24" dev "${hosts_dev[i]}" &&
      ip -n "$ns" link set "${hosts_dev[i]}" up || { fail "cannot set up host $i ($ns)"; exit 1; }
    # The holder: it sets the host name and mounts the private /dev/shm, then says so by renaming
    # its ready file. ip netns exec and unshare exec, so $! is the holder's pid.
    ip netns exec "$ns" unshare --uts --mount --propagation private bash -c '
      hostname "$1" && mount -t tmpfs tmpfs /dev/shm && echo $$ >"$2.tmp" && mv "$2.tmp" "$2" && exec sleep infinity' \
      holder "${hosts_name[i]}" "$hosts_work/ready$i" </dev/null >/dev/null 2>"$hosts_work/holder$i.err" &
    hosts_holder[i]=$!
    disown "$!"   # no "Killed" notice from the shell when hosts_remove ends it
  done
  deadline=$((SECONDS + 20))
  for ((i = 0; i < n; ++i)); do
    until [[ -e $hosts_work/ready$i ]]; do
      if ! kill -0 "${hosts_holder[i]}" 2>/dev/null || ((SECONDS > deadline)); then
        skip "host $i: 'unshare --uts --mount' with a private /dev/shm failed: $(cat "$hosts_work/holder$i.err" 2>/dev/null)"
      fi
      sleep 0.02
    done
  done
}

hosts_exec() {
  local i=$1
  shift
  [[ -n ${hosts_holder[i]:-} ]] || { fail "hosts_exec: no host $i"; return 1; }
  nsenter --target "${hosts_holder[i]}" --net --uts --mount --wd="$PWD" -- "$@"
}

hosts_have_netem() {
  local ok=1
  tc -n "$hosts_brns" qdisc add dev br0 root netem delay 1ms 2>/dev/null && ok=0
  tc -n "$hosts_brns" qdisc del dev br0 root 2>/dev/null
  return $ok
}

hosts_shape() {
  local rate=${1:?hosts_shape: rate} burst=${2:-256kb} delay=${3:-} i ns dev
  command -v tc >/dev/null || { fail "hosts_shape: no 'tc' command (iproute2)"; return 1; }
  if [[ -n $delay ]] && ! hosts_have_netem; then
    fail "hosts_shape: a delay of $delay needs netem, and this kernel has none ('tc qdisc add ... netem' fails: no sch_netem)"
    return 1
  fi
  for ((i = 0; i < hosts_count; ++i)); do
    for ns in "${hosts_ns[i]}" "$hosts_brns"; do
      dev=${hosts_dev[i]}
      [[ $ns == "$hosts_brns" ]] && dev=${hosts_brdev[i]}
      tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
      if [[ -n $delay ]]; then
        tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" &&
          tc -n "$ns" qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 100ms
      else
        tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
      fi || { fail "hosts_shape: tc on $dev (namespace $ns) refused rate '$rate' burst '$burst'"; return 1; }
    done
  done
}

hosts_unshape() {
  local i
  for ((i = 0; i < hosts_count; ++i)); do
    tc -n "${hosts_ns[i]}" qdisc del dev "${hosts_dev[i]}" root 2>/dev/null
    tc -n "$hosts_brns" qdisc del dev "${hosts_brdev[i]}" root 2>/dev/null
  done
  return 0
}

hosts__stat() {
  local i=$1 what=$2
  [[ -n ${hosts_ns[i]:-} ]] || { fail "hosts_${what}: no host $i"; return 1; }
  ip netns exec "${hosts_ns[i]}" cat "/sys/class/net/${hosts_dev[i]}/statistics/$what"
}
hosts_tx_bytes() { hosts__stat "$1" tx_bytes; }
hosts_rx_bytes() { hosts__stat "$1" rx_bytes; }

hosts_cut() {
  ip -n "${hosts_ns[$1]:?hosts_cut: no host $1}" link set "${hosts_dev[$1]}" down
}

hosts_remove() {
  local ns p left deadline i
  [[ -n ${hosts_tag:-} ]] || return 0
  deadline=$((SECONDS + 10))
  while :; do
    left=""
    for ns in $(hosts__listns); do
      for p in $(ip netns pids "$ns" 2>/dev/null); do
        kill -9 "$p" 2>/dev/null
        left+=" $p"
      done
    done
    [[ -z $left ]] && break
    ((SECONDS > deadline)) && break
    sleep 0.05
  done
  for ns in $(hosts__listns); do ip netns del "$ns" 2>/dev/null; done
  [[ -n ${hosts_work:-} ]] && rm -rf "$hosts_work"
  return 0
}

hosts_check_removed() {
  local left i
  [[ -n ${hosts_tag:-} ]] || return 0
  left=$(hosts__listns | tr '\n' ' ')
  [[ -z $left ]] || fail "namespace(s) left: $left"
  left=$(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep -E "^${hosts_tag}[vb][0-9]+\$" | tr '\n' ' ')
  [[ -z $left ]] || fail "device(s) left: $left"
  for i in "${!hosts_holder[@]}"; do
    kill -0 "${hosts_holder[i]}" 2>/dev/null && fail "host $i's holder ${hosts_holder[i]} still runs"
  done
  [[ -n ${hosts_work:-} && -e $hosts_work ]] && fail "work folder $hosts_work left"
  return 0
}

hosts_scratch() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/chorus-$1.XXXXXX") || { fail "hosts_scratch: mktemp"; exit 1; }
  pids=()
  trap hosts_cleanup EXIT
  trap 'exit 1' INT TERM
}

hosts_cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  hosts_remove
  if [[ -n ${work:-} ]]; then rm -rf "$work"; fi
}
