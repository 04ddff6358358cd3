// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// This host's interfaces and their IP addresses, and the one CHORUS_SOCKET_IFNAME picks
/// (detail/ifname.hpp): the address tcp links listen on (tcp/detail/socket.hpp) and the one rank 0
/// publishes for its store where a launcher's key-value service carries it
/// (bootstrap/launcher_kvs.hpp).

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/ifname.hpp"

namespace chorus::detail {

/// One IP address of one interface.
struct InterfaceAddress {
  std::string name;
  asio::ip::address address;
};

/// Every IP address of every interface of this host, in the kernel's order (getifaddrs).
inline std::vector<InterfaceAddress> interface_addresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw system_error({}, "getifaddrs");
  std::vector<InterfaceAddress> out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (a->ifa_addr->sa_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      out.push_back({a->ifa_name, asio::ip::address_v4(ntohl(in->sin_addr.s_addr))});
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &in6->sin6_addr, b.size());
      out.push_back({a->ifa_name, asio::ip::address_v6(b, in6->sin6_scope_id)});
    }
  }
  ::freeifaddrs(list);
  return out;
}

/// The address to listen on for CHORUS_SOCKET_IFNAME=`spec` (chorus/detail/ifname.hpp) among
/// `list`: of the addresses of the interfaces it keeps, one of an interface the list names exactly
/// first (so "eth0" is eth0 where eth0.100 exists), then IPv4 before IPv6, then the kernel's
/// order. invalid_argument naming the variable and the interfaces there are when it keeps none.
inline asio::ip::address choose_interface(const std::string& spec, const std::vector<InterfaceAddress>& list) {
  const auto filter = InterfaceFilter::parse(spec);
  const InterfaceAddress* best = nullptr;
  auto rank = [&](const InterfaceAddress& a) { return std::tuple(!filter.named(a.name), !a.address.is_v4()); };
  for (const auto& a : list)
    if (filter.matches(a.name) && (best == nullptr || rank(a) < rank(*best))) best = &a;
  if (best != nullptr) return best->address;
  std::string there;
  for (const auto& a : list)
    if (there.find("'" + a.name + "'") == std::string::npos) there += (there.empty() ? "'" : ", '") + a.name + "'";
  throw Error(ErrorCode::invalid_argument, "CHORUS_SOCKET_IFNAME='" + spec +
                                               "': no interface with an IP address matches (interfaces with one here: " +
                                               (there.empty() ? std::string("none") : there) + ")");
}

/// The address of this host that CHORUS_SOCKET_IFNAME=`spec` picks (choose_interface).
inline asio::ip::address interface_address(const std::string& spec) {
  return choose_interface(spec, interface_addresses());
}

/// The address a rank publishes for others to reach it where nothing names one, among `list`:
/// CHORUS_SOCKET_IFNAME's (`spec`) when set (choose_interface), else as NCCL picks without
/// NCCL_SOCKET_IFNAME: an address of an interface other than loopback and docker's (IPv4 first,
/// link-local IPv6 never, then the kernel's order), else loopback.
inline asio::ip::address choose_publishable(const std::string& spec, const std::vector<InterfaceAddress>& list) {
  if (!spec.empty()) return choose_interface(spec, list);
  const auto filter = InterfaceFilter::parse("^docker,lo");
  for (const bool v4 : {true, false})
    for (const auto& a : list)
      if (filter.matches(a.name) && a.address.is_v4() == v4 && !a.address.is_loopback() &&
          !(a.address.is_v6() && a.address.to_v6().is_link_local()))
        return a.address;
  return asio::ip::address_v4::loopback();
}

/// choose_publishable among this host's interfaces.
inline asio::ip::address publishable_address(const std::string& spec) {
  return choose_publishable(spec, interface_addresses());
}

}  // namespace chorus::detail
