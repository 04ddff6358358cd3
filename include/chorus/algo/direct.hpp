// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Direct and pairwise algorithms: gather and scatter straight between the root and every rank
/// (P-1 messages at the root, all in flight at once: over links with their own connection per
/// pair this is bandwidth-optimal at the root, and its latency term is one message, not log P),
/// all-to-all by pairwise exchange (P-1 steps, step k: send to r+k, receive from r-k), and the
/// dissemination barrier.

#include <cstdint>
#include <vector>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/topology/tree.hpp"

namespace chorus::algo {

/// Gather: every rank's in (count elements) lands in block r of the root's out (P blocks).
template <class Ch>
void direct_gather(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t block = a.bytes(a.count);
  if (r != a.root) return ch.send(a.root, cbytes(a.in, block));
  auto& recvs = ch.ops(0);
  for (int p = 0; p < n; ++p)
    if (p != r) recvs.push_back(ch.irecv(p, mbytes(a.out + block * p, block)));
  a.x().copy(a.out + block * r, a.in, block);
  ch.wait_all(recvs);
}

/// Scatter: block p of the root's in (P blocks of count) goes to rank p's out.
template <class Ch>
void direct_scatter(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t block = a.bytes(a.count);
  if (r != a.root) return ch.recv(a.root, mbytes(a.out, block));
  auto& sends = ch.ops(0);
  for (int p = 0; p < n; ++p)
    if (p != r) sends.push_back(ch.isend(p, cbytes(a.in + block * p, block)));
  a.x().copy(a.out, a.in + block * r, block);
  ch.wait_all(sends);
}

/// All-to-all: block p of in goes to rank p, arriving as block r of its out. In place (in and
/// out overlapping) the input is first copied to the work area, since a received block would
/// overwrite one not yet sent.
template <class Ch>
void pairwise_all_to_all(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t block = a.bytes(a.count);
  const std::size_t total = block * static_cast<std::size_t>(n);
  const std::byte* in = a.in;
  const auto lo_in = reinterpret_cast<std::uintptr_t>(in), lo_out = reinterpret_cast<std::uintptr_t>(a.out);
  if (total != 0 && lo_in < lo_out + total && lo_out < lo_in + total) {
    std::byte* copy = a.x().work(total);
    a.x().copy(copy, in, total);
    in = copy;
  }
  a.x().copy(a.out + block * r, in + block * r, block);
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    ch.sendrecv(to, cbytes(in + block * to, block), from, mbytes(a.out + block * from, block));
  }
}

/// Barrier: in round k signal r + 2^k and wait for r - 2^k (empty messages).
template <class Ch>
void dissemination_barrier(Ch& ch) {
  const int n = ch.size(), r = ch.rank();
  for (int k = 0; k < topology::dissemination_rounds(n); ++k)
    ch.sendrecv(topology::dissemination_send_peer(r, k, n), ConstBytes{},
                topology::dissemination_recv_peer(r, k, n), MutableBytes{});
}

}  // namespace chorus::algo
