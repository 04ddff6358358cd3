// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// One collective kernel per rank per call: what the host hands the kernel (CollectiveLaunch,
/// trivially copyable, passed by value), the memory every rank shares with its peers (its
/// collective area), and what a failed kernel leaves for the host (KernelReport). The protocol
/// itself (barriers, the data phases, the LL lines) is device/collective_body.hpp; CudaRuntime
/// launches it as one kernel (device/collective.cuh), SimRuntime runs each block of it on a host
/// thread of its own (testing/sim_runtime/collective.hpp).
///
/// A call runs on the caller's stream and its blocks are channels: block b of every rank owns the
/// same slice of the data and has flags of its own, so block b of rank r only ever waits for block
/// b of its peers. Three protocols (KernelProtocol), chosen by the host per call:
/// * ll: small messages. Each rank writes what a peer needs into the peer's area as LL lines
///   (16 bytes: two 64-bit words, each 4 bytes of data beside a 4-byte flag, the call's number),
///   so one store publishes data and flag together and the reader spins on the line itself: no
///   barrier, no fence. The first four lines carry the call's descriptor. all_reduce, all_gather
///   and reduce_scatter, where every rank writes to every rank (which is what makes two buffers
///   of lines enough: see collective_body.hpp).
/// * direct: every rank's buffers are addressable by its peers (ranks as threads of one process:
///   raw device pointers). An entry barrier, at which each block publishes its buffers' addresses
///   and the call's descriptor; a data phase that reads the peers' inputs directly and, for
///   all_reduce, writes each reduced share into every rank's output (a fused reduce-scatter and
///   all-gather: 2N bytes of device memory traffic per rank); an exit barrier.
/// * windowed: peers in other processes whose buffers are not mapped: each rank's area ends in a
///   window (mapped by its peers through CUDA IPC, set up once); the kernel copies its input into
///   the window a chunk at a time, and every chunk takes a barrier, the reads of the peers'
///   windows, and a barrier.
/// Reductions fold the ranks' values in rank order with the functors of reduce/ops.hpp (avg: sum,
/// then avg_divide once), so every rank gets the bits of the host path.
///
/// Failure, never a hang: every spin watches this process's abort word (pinned memory the host
/// sets), the abort word of the peer it waits for (in that peer's area), and the call's deadline
/// (the timeout from the kernel's start). A block that gives up writes its KernelResult (pinned
/// memory): mismatch (and the peer's descriptor, in its KernelReport), timeout or peer_failure,
/// and the peer; then it sets this process's abort word and the one in its own area. That is
/// sticky: a kernel that finds the abort word set gives up at once (aborted), as a CUDA stream's
/// error is sticky, and the peers' kernels that wait for this rank give up too (peer_failure).

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "chorus/config.hpp"
#include "chorus/core/types.hpp"

namespace chorus::device {

/// The most ranks one collective kernel serves (the peers' pointers travel in its arguments).
inline constexpr int kMaxKernelRanks = 8;
/// The most blocks (channels) one collective kernel runs.
inline constexpr unsigned kMaxKernelBlocks = 32;
/// Threads per block of the collective kernel.
inline constexpr unsigned kKernelThreads = 256;
/// The largest message (bytes each rank contributes to one peer) the LL protocol carries.
inline constexpr std::size_t kLLMaxBytes = 8192;
/// LL lines: the descriptor's four, then one per 8 bytes of data.
inline constexpr std::size_t kLLDescLines = 4;
inline constexpr std::size_t kLLLines = kLLDescLines + kLLMaxBytes / 8;
inline constexpr std::size_t kLLLineBytes = 16;

enum class KernelCollective : std::uint32_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce };
enum class KernelProtocol : std::uint32_t { ll, direct, windowed };

/// How a block of a call ended, where it gave up (pinned memory, one entry per block of each
/// call: the host zeroes them before the launch; a block that finishes leaves its entry alone).
enum class KernelStatus : std::uint32_t { ok = 0, aborted = 1, timeout = 2, peer_failure = 3, mismatch = 4 };
struct KernelResult {
  std::uint32_t status;  ///< a KernelStatus; written last
  std::int32_t peer;     ///< the peer it waited for or differs from; -1 for aborted
};
/// The descriptor of the peer a block found different (pinned memory, one entry per block; only
/// the communicator's first failure writes it: every later kernel gives up as aborted).
struct KernelReport {
  std::uint64_t peer_desc[4];  ///< algo::CollectiveDesc's 32 bytes
};
/// Calls whose results the host keeps at once (a ring of entries, kMaxKernelBlocks per call).
inline constexpr std::size_t kKernelResultSlots = 256;

/// A rank's collective area (device memory; its peers map it): at kAbortOffset a word its host
/// sets when it aborts, then one flag line per block, the LL lines, and the window.
namespace area {
inline constexpr std::size_t kAbortOffset = 0;
/// Block b's flag line: [0] the barriers it has passed (the number of the last), [1] and [2] the
/// call's input and output as peers address them (direct), [3..6] the call's descriptor.
inline constexpr std::size_t kFlagsOffset = 256;
inline constexpr std::size_t kFlagLineBytes = 128;
inline constexpr std::size_t kLLOffset = kFlagsOffset + kMaxKernelBlocks * kFlagLineBytes;
/// LL lines from rank `src` in buffer `parity` (the call number's parity).
inline constexpr std::size_t kLLBufferBytes = kLLLines * kLLLineBytes;
inline constexpr std::size_t kLLBytes = 2 * kMaxKernelRanks * kLLBufferBytes;
inline constexpr std::size_t kWindowOffset = (kLLOffset + kLLBytes + 4095) / 4096 * 4096;
/// Bytes of an area whose window holds `window` bytes.
constexpr std::size_t bytes(std::size_t window) noexcept { return kWindowOffset + window; }
}  // namespace area

/// The arguments of one rank's collective kernel, passed by value.
struct CollectiveLaunch {
  KernelCollective kind;
  KernelProtocol protocol;
  DataType dtype;
  ReduceOp op;
  std::int32_t root;    ///< broadcast, reduce
  std::int32_t ranks;   ///< 1 to kMaxKernelRanks
  std::int32_t rank;
  std::uint32_t blocks;  ///< 1 to kMaxKernelBlocks
  std::uint64_t count;   ///< elements, as the collective defines its count (per rank)
  const std::byte* in;   ///< this rank's buffers, as this rank addresses them
  std::byte* out;
  /// The address of `in` and `out` as the peers address them (direct: the same in one process).
  std::uint64_t in_shared;
  std::uint64_t out_shared;
  std::byte* areas[kMaxKernelRanks];  ///< every rank's collective area as this rank addresses it
  std::uint64_t barrier_base;  ///< barriers every rank passed before this call (direct, windowed)
  std::uint32_t ll_flag;       ///< ll: this call's flag value (never 0); its parity picks the buffer
  std::uint32_t pad0;
  std::uint64_t chunk;         ///< windowed: elements per chunk (of each block of the window)
  std::uint64_t desc[4];       ///< the call's descriptor (algo::CollectiveDesc), compared with every peer's
  /// Pinned memory, as kernels address it (Runtime::device_address):
  std::uint32_t* abort;        ///< not 0 once this process gives up (the host or a kernel sets it)
  KernelResult* result;        ///< `blocks` entries, zeroed by the host
  KernelReport* report;        ///< kMaxKernelBlocks entries
  std::uint64_t timeout_ns;    ///< from the kernel's start
};
static_assert(std::is_trivially_copyable_v<CollectiveLaunch>);
static_assert(sizeof(CollectiveLaunch) <= 4096, "a kernel's parameters");

/// Elements per 16-byte pack; ranges are split in whole packs so that each block's part of every
/// buffer keeps the buffer's alignment.
template <class T>
inline constexpr std::size_t kKernelPack = 16 / sizeof(T);

/// Barriers a call passes: direct 2, windowed 2 per chunk (at least one chunk), ll none.
CHORUS_HOST_DEVICE constexpr std::uint64_t kernel_barriers(KernelProtocol p, std::uint64_t count, std::uint64_t chunk) noexcept {
  if (p == KernelProtocol::ll) return 0;
  if (p == KernelProtocol::direct) return 2;
  const std::uint64_t chunks = count == 0 || chunk == 0 ? 1 : (count + chunk - 1) / chunk;
  return 2 * chunks;
}

/// Bytes each rank sends to one peer in an LL call (all_reduce, all_gather: its input;
/// reduce_scatter: one block of it).
constexpr std::size_t ll_payload_bytes(std::uint64_t count, DataType dt) noexcept { return count * size_of(dt); }

/// Device-memory traffic of one rank's kernel (bytes read plus bytes written, the flags and LL
/// lines aside for direct and windowed, which move a few hundred bytes): what the counting
/// runtime (device/counting.hpp) charges for a launch. N = count * element size.
inline std::uint64_t kernel_traffic_bytes(const CollectiveLaunch& a) {
  const std::uint64_t N = a.count * size_of(a.dtype), k = static_cast<std::uint64_t>(a.ranks);
  const bool root = a.rank == a.root;
  switch (a.protocol) {
    case KernelProtocol::ll: {
      // lines of 16 bytes carry 8 of data: written to every peer, read from every peer
      const std::uint64_t line = 2 * (N + kLLDescLines * 8);
      switch (a.kind) {
        case KernelCollective::all_reduce: return (k - 1) * 2 * line + N + N;  // + own input read, output written
        case KernelCollective::all_gather: return (k - 1) * 2 * line + N + k * N;
        case KernelCollective::reduce_scatter: return (k - 1) * 2 * line + N + N;
        default: return 0;
      }
    }
    case KernelProtocol::direct:
      switch (a.kind) {
        case KernelCollective::all_reduce: return 2 * N;                   // its 1/k of k inputs, written to k outputs
        case KernelCollective::reduce: return N + N / k;                   // its 1/k of k inputs, to the root's output
        case KernelCollective::reduce_scatter: return k * N + N;           // block r of k inputs, its output
        case KernelCollective::all_gather: return 2 * k * N;               // k inputs read, its output written
        case KernelCollective::broadcast: return root ? 0 : 2 * N;         // the root's buffer read, its own written
      }
      return 0;
    case KernelProtocol::windowed:
      switch (a.kind) {
        case KernelCollective::all_reduce: return 2 * N + k * N + N;       // input to window, k windows read, output
        case KernelCollective::reduce: return 2 * N + (root ? k * N + N : 0);
        case KernelCollective::reduce_scatter: return 2 * k * N + k * N + N;
        case KernelCollective::all_gather: return 2 * N + 2 * k * N;
        case KernelCollective::broadcast: return root ? 2 * N : 2 * N;
      }
      return 0;
  }
  return 0;
}

}  // namespace chorus::device
