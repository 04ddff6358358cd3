// SPDX-License-Identifier: BSD-3-Clause
// CHORUS_SOCKET_IFNAME read as NCCL_SOCKET_IFNAME, over a given list of interfaces: prefixes
// ("eth,ib"), "^" to exclude, "=" for exact names; a single name still means that interface where
// longer names share its prefix; IPv4 before IPv6; nothing kept is invalid_argument naming the
// variable and the interfaces there are. And over this host's own interfaces: "lo" and "=lo" give
// loopback.
#include "chorus/transport/tcp/detail/socket.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_ifname {

namespace asio = chorus::detail::asio;
using chorus::tcp::detail::choose_interface;
using chorus::tcp::detail::InterfaceAddress;

namespace {

InterfaceAddress at(std::string name, const char* address) { return {std::move(name), asio::ip::make_address(address)}; }

/// A host with loopback, a container bridge, a VLAN on eth0, eth0 (IPv6 listed first), eth1, an
/// InfiniBand port, and one with IPv6 only: in the order getifaddrs would give them.
const std::vector<InterfaceAddress> kHost = {
    at("lo", "127.0.0.1"),     at("docker0", "172.17.0.1"), at("eth0.100", "10.1.0.1"), at("eth0", "fd00::2"),
    at("eth0", "10.0.0.1"),    at("eth1", "10.0.1.1"),      at("ib0", "10.2.0.1"),      at("ib1", "fd00::9"),
};

std::string pick(const std::string& spec) { return choose_interface(spec, kHost).to_string(); }

std::string refusal(const std::string& spec) {
  try {
    (void)choose_interface(spec, kHost);
  } catch (const chorus::Error& e) {
    CHECK(e.code() == chorus::ErrorCode::invalid_argument);
    return e.what();
  }
  FAIL("'" << spec << "' kept an interface");
  return {};
}

}  // namespace

TEST_CASE("ifname: prefixes, ^ and = over a given interface list") {
  CHECK(pick("eth") == "10.1.0.1");          // the first eth* with IPv4: eth0.100
  CHECK(pick("eth0") == "10.0.0.1");         // the interface of that name before eth0.100, IPv4 first
  CHECK(pick("=eth0") == "10.0.0.1");        // exact
  CHECK(pick("eth1") == "10.0.1.1");
  CHECK(pick("ib") == "10.2.0.1");
  CHECK(pick("ib1") == "fd00::9");           // IPv6 where there is nothing else
  CHECK(pick("ib1,eth1") == "10.0.1.1");     // both named: IPv4 first
  CHECK(pick("wlan,ib") == "10.2.0.1");      // an entry that matches nothing is no error
  CHECK(pick("^docker,lo") == "10.1.0.1");   // all but these, in order
  CHECK(pick("^=eth0.100,docker0,lo") == "10.0.0.1");
  CHECK(pick("^eth,lo,docker") == "10.2.0.1");
  CHECK(pick("lo") == "127.0.0.1");
  CHECK(pick(" eth1 ,") == "10.0.1.1");      // spaces and empty entries are dropped

  for (const std::string spec : {"=eth", "wlan", "^lo,docker,eth,ib", "=eth0.1"}) {
    const std::string what = refusal(spec);
    MESSAGE(what);
    CHECK(what.find("CHORUS_SOCKET_IFNAME='" + spec + "'") != std::string::npos);
    CHECK(what.find("'lo', 'docker0', 'eth0.100', 'eth0', 'eth1', 'ib0', 'ib1'") != std::string::npos);
  }
  CHECK(refusal("^").find("names no interface") != std::string::npos);
  const std::string none = [] {
    try {
      (void)choose_interface("eth", {});
    } catch (const chorus::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  }();
  CHECK(none.find("(interfaces with one here: none)") != std::string::npos);
}

TEST_CASE("ifname: 'lo' and '=lo' are this host's loopback") {
  CHECK(chorus::tcp::detail::interface_address("lo").is_loopback());
  CHECK(chorus::tcp::detail::interface_address("=lo").is_loopback());
  CHECK(chorus::tcp::detail::interface_address("l").is_loopback());
}

}  // namespace unit_test_ifname
