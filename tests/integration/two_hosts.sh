# SPDX-License-Identifier: BSD-3-Clause
# Two "hosts" for the multi-host integration tests (sourced by run_fault.sh and run_torchrun.sh):
# network namespaces A and B joined by a veth pair, A at $addr_a and B at $addr_b (a /24), each
# with its loopback up. The caller defines skip (exit 77) and fail, and ends its own processes
# before two_hosts_remove.
#
#   two_hosts_names <tag> <first three bytes>   sets ns_a ns_b veth_a veth_b addr_a addr_b: names
#                                               unique per test process (ctest -j runs several)
#   two_hosts_create                            makes them; skip where this machine cannot
#   two_hosts_remove                            SIGKILLs what still runs in them, removes them
#   two_hosts_check_removed                     fail when a namespace or the veth pair is left

two_hosts_names() {
  ns_a="$1a" ns_b="$1b" veth_a="$1va" veth_b="$1vb" addr_a="$2.1" addr_b="$2.2"
}

two_hosts_create() {
  local ns
  ip netns add "$ns_a" 2>/dev/null || skip "'ip netns add' failed (no CAP_SYS_ADMIN or no network namespaces here)"
  ip netns add "$ns_b" || { fail "ip netns add $ns_b"; exit 1; }
  ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" || skip "cannot create a veth pair"
  ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
  ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_a" link set "$veth_a" up
  ip -n "$ns_b" link set "$veth_b" up
}

two_hosts_remove() {
  local p
  for p in $(ip netns pids "$ns_a" 2>/dev/null) $(ip netns pids "$ns_b" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  ip link del "$veth_a" 2>/dev/null
}

two_hosts_check_removed() {
  local left
  left=$(ip netns list | grep -E "^($ns_a|$ns_b)( |$)")
  [[ -z $left ]] || fail "namespace left: $left"
  ip link show "$veth_a" >/dev/null 2>&1 && fail "veth $veth_a left"
}
