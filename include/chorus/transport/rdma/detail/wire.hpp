// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// What the two ends of an rdma link agree on (link.hpp has the protocol): the sizes of
/// Policy, the header of every slot message, the credit block each side writes into the other's
/// memory, the work-request ids that tell a completion's link and kind, and what a receive can
/// meet (an eager payload, or the announcement of a large message).

#include <cstdint>
#include <cstddef>
#include <memory>
#include <variant>

#include "chorus/core/request.hpp"
#include "chorus/transport/matching.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::rdma {


struct Policy {
  /// Receive slots per link (the credits a sender starts with) and their size.
  static constexpr std::uint32_t kSlots = 64;
  static constexpr std::size_t kSlotBytes = 8192;
  /// Credits are returned once this many slots were reposted (a quarter of them: a sender out of
  /// credits has kSlots unreturned, so its peer always owes enough to answer).
  static constexpr std::uint32_t kCreditBatch = kSlots / 4;
  /// Work requests per send queue (eager sends, control messages, write chunks, credit writes).
  static constexpr std::uint32_t kSendDepth = 256;
  /// The size of one RDMA write of a large message.
  static constexpr std::size_t kChunkBytes = std::size_t(1) << 20;
  static constexpr std::uint64_t kMaxMessageBytes = std::uint64_t(1) << 40;
  /// Large messages per link and direction that hold a registration at once: a program with
  /// thousands of large sends or receives outstanding registers this many, the others wait their
  /// turn, instead of running the device (or the locked-memory limit) out of registrations.
  static constexpr std::uint32_t kMaxRegistered = 32;
};

namespace detail {

using chorus::detail::Completions;
using chorus::detail::RequestState;
using ReqPtr = std::shared_ptr<RequestState>;

enum class MsgType : std::uint32_t { eager = 0x45414752, rts = 0x52545320, cts = 0x43545320 };
inline constexpr std::uint32_t kReject = 1;  ///< cts flag: the sizes differ

/// The header of every slot message (eager payload follows it).
struct Header {
  std::uint32_t type = 0;
  std::uint32_t flags = 0;
  std::uint64_t tag = 0;
  std::uint64_t size = 0;  ///< eager, rts: the message's; cts: the receive's
  std::uint32_t id = 0;    ///< rts, cts: the message id (the immediate of its last write)
  std::uint32_t rkey = 0;  ///< cts: the receive buffer's
  std::uint64_t addr = 0;  ///< cts: the receive buffer's
};
static_assert(sizeof(Header) == 40);

/// Written into by the peer (RDMA write): credits it returned and its abort. Each value comes with
/// its complement; a pair that does not match is a write in progress, read again later.
struct CreditBlock {
  std::uint64_t returned = 0;
  std::uint64_t returned_check = ~std::uint64_t(0);
  std::uint64_t aborted = 0;
  std::uint64_t aborted_check = ~std::uint64_t(0);
};

/// wr_id: kind in the top byte, the link's peer in the next two, the rest (slot, message id).
enum class WrKind : std::uint8_t { recv_slot = 1, send_slot, inline_msg, write, write_last, credit, abort };
inline std::uint64_t make_wr(WrKind k, int peer, std::uint64_t low) {
  return (std::uint64_t(k) << 56) | (std::uint64_t(std::uint16_t(peer)) << 40) | (low & ((std::uint64_t(1) << 40) - 1));
}
inline WrKind wr_kind(std::uint64_t w) { return static_cast<WrKind>(w >> 56); }
inline int wr_peer(std::uint64_t w) { return static_cast<int>((w >> 40) & 0xffff); }
inline std::uint64_t wr_low(std::uint64_t w) { return w & ((std::uint64_t(1) << 40) - 1); }

using chorus::detail::EagerArrival;
using chorus::detail::RecvOp;
struct RtsArrival {
  std::uint64_t size;
  std::uint32_t id;
};
using Arrival = std::variant<EagerArrival, RtsArrival>;

}  // namespace detail
}  // namespace chorus::rdma
