// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The unix socket of an shm link: how the segment's file descriptor travels (SCM_RIGHTS), the
/// doorbell, and how a dead peer is noticed (the kernel closes a killed process's sockets, so
/// the survivor reads EOF at once).
///
/// Sockets live in Linux's abstract namespace ("\0chorus-shm/<job nonce>/<rank>"): nothing is
/// created in any file system, and the name goes when the socket closes, however the process
/// ends. Whoever connects must send the job's nonce, and the kernel's SO_PEERCRED must show the
/// same user as ours (or root), else the connection is refused and logged.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/core/error.hpp"

namespace chorus::shm::detail {

using Clock = std::chrono::steady_clock;

/// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

[[noreturn]] inline void throw_errno(const ErrorContext& ctx, const std::string& what) {
  throw Error(ErrorCode::system, ctx, what + ": " + std::strerror(errno));
}

inline std::string nonce_hex(const JobNonce& n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (auto b : n) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

/// The abstract address of `rank`'s listening socket in the job with this nonce.
inline sockaddr_un listen_address(const JobNonce& nonce, int rank, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "chorus-shm/" + nonce_hex(nonce) + "/" + std::to_string(rank);
  a.sun_path[0] = '\0';
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

/// Milliseconds left until `deadline`, at least 1 (poll's timeout).
inline int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 1, 1 << 30));
}

/// Waits until fd is readable (or writable); false at the deadline.
inline bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    if (Clock::now() >= deadline) return false;
    pollfd p{fd, events, 0};
    const int k = ::poll(&p, 1, ms_left(deadline));
    if (k > 0) return true;
    if (k < 0 && errno != EINTR) return false;
  }
}

/// Reads exactly n bytes (blocking socket, bounded by the deadline); with `fd_out`, also takes a
/// file descriptor passed along with the first bytes. False on EOF, error or deadline.
inline bool read_exact(int fd, void* buf, std::size_t n, Clock::time_point deadline, int* fd_out = nullptr) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    iovec iov{p, n};
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (fd_out) {
      m.msg_control = ctrl;
      m.msg_controllen = sizeof ctrl;
    }
    const ssize_t k = ::recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return false;
    if (fd_out) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd_out, CMSG_DATA(c), sizeof(int));
      fd_out = nullptr;  // only with the first bytes
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

/// Writes n bytes, and with pass_fd >= 0 passes that descriptor along with them.
inline bool write_all(int fd, const void* buf, std::size_t n, Clock::time_point deadline, int pass_fd = -1) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
    iovec iov{const_cast<char*>(p), n};
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (pass_fd >= 0) {
      std::memset(ctrl, 0, sizeof ctrl);
      m.msg_control = ctrl;
      m.msg_controllen = sizeof ctrl;
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t k = ::sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return false;
    pass_fd = -1;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

inline constexpr std::uint32_t kShmMagic = 0x43485348;  // "CHSH"
inline constexpr std::uint32_t kShmVersion = 1;

/// The first message on a link socket, both ways (the acceptor's reply carries the segment).
struct ShmHello {
  std::uint32_t magic = kShmMagic;
  std::uint32_t version = kShmVersion;
  JobNonce nonce{};
  std::int32_t rank = -1;  ///< the sender's rank
  std::int32_t peer = -1;  ///< the rank it wants
  std::int32_t world = -1;
  std::int32_t status = 0;  ///< reply: 0 accepted
  std::uint64_t pid = 0;
  std::uint64_t probe_addr = 0;  ///< address of kCmaProbe in the sender, to test CMA with
};
static_assert(sizeof(ShmHello) == 56 && std::is_trivially_copyable_v<ShmHello>, "sent as raw bytes, no padding");

/// Whether a hello from the network is from this job (magic, version, nonce) and says it is from
/// rank `from` to rank `to` in a world of `world` ranks.
inline bool hello_matches(const ShmHello& h, const JobNonce& nonce, int from, int to, int world) {
  return h.magic == kShmMagic && h.version == kShmVersion && h.nonce == nonce && h.rank == from && h.peer == to &&
         h.world == world;
}

/// The rank whose connection `rank` may accept now, given that hello: a higher rank of this job
/// that it expects (`expected`) and has not connected yet (`connected`; both of world size), or
/// -1 when the hello belongs to no such rank.
inline int accepted_hello_rank(const ShmHello& h, const JobNonce& nonce, int rank, int world,
                               const std::vector<bool>& expected, const std::vector<bool>& connected) {
  if (h.rank <= rank || h.rank >= world || !hello_matches(h, nonce, h.rank, rank, world)) return -1;
  const auto p = static_cast<std::size_t>(h.rank);
  if (p >= expected.size() || p >= connected.size() || !expected[p] || connected[p]) return -1;
  return h.rank;
}

/// A word every process has at a known address: a peer reads it with process_vm_readv to learn
/// whether cross-memory attach works between the two.
inline constexpr std::uint64_t kCmaProbeValue = 0x63686f7275732d31ull;
inline const volatile std::uint64_t kCmaProbe = kCmaProbeValue;

/// The peer's uid through SO_PEERCRED; true when it is ours or root's. `pid` gets its pid.
inline bool peer_is_trusted(int fd, std::uint64_t& pid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  pid = static_cast<std::uint64_t>(cred.pid);
  return cred.uid == ::geteuid() || cred.uid == 0;
}

inline void set_nonblocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

}  // namespace chorus::shm::detail
