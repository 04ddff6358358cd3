// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Runs a planned call (algo/plan.hpp) down its plumbing: the one choice among the three families
/// a host-path call can take once the plan has decided, with the one stall callback they share.
///
///   direct                 the IPC windows (algo/intranode/ipc.hpp): cuda_ipc peers, device buffers
///   one_shot               the shm mailboxes (algo/intranode/one_shot.hpp): small all_reduce
///   every other algorithm  a Channel over the links, through algo::run (algo/run.hpp)
///
/// The collective kernel (Plan::kernel) is not among them: the communicator hands such a call to
/// impl/kernel_call.hpp before it is queued.

#include <chrono>
#include <memory>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/intranode/ipc.hpp"
#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/algo/intranode/window.hpp"
#include "chorus/algo/plan.hpp"
#include "chorus/algo/run.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/exec/device.hpp"
#include "chorus/topology/hosts.hpp"

namespace chorus::algo {

/// What a call's plumbing reaches besides its arguments: the communicator's group and what
/// outlives a call. `windows` and `device` are read by a direct call only (its plan made the
/// windows; its buffers are in device memory, on the device executor).
template <Transport T>
struct Plumbing {
  Group<T>& group;
  const topology::Hosts& hosts;
  std::shared_ptr<ChannelMemory>& channel_memory;  ///< reused by each call's Channel
  cuda_ipc::Windows* windows = nullptr;
  exec::DeviceExecutor* device = nullptr;
  std::chrono::milliseconds timeout{};  ///< bounds each wait of the call
};

/// Runs `desc` with `args` (its executor is `*args.exec`) as `plan` says. `on_stall(desc)` runs
/// whenever a wait of the call stalls, whichever family waits (the stall cross-check).
template <Transport T, class OnStall>
void execute(const Plan& plan, const CollectiveDesc& desc, const Args& args, const Plumbing<T>& p,
             const OnStall& on_stall) {
  if (plan.direct) {
    if constexpr (LinkWithIpc<LinkOf<T>> && LinkWithMailboxes<LinkOf<T>>) {  // (else direct is false: has_ipc)
      IpcCollective ipc(p.group, desc, args, *p.windows, *p.device, p.timeout, on_stall);
      ipc.run(plan.choice.algorithm);
    }
  } else if (plan.choice.algorithm == Algorithm::one_shot) {
    one_shot_all_reduce(p.group, desc, args, p.timeout, on_stall);
  } else {
    Channel<T> ch(p.group, desc, p.channel_memory, *args.exec, on_stall);
    run(ch, desc, args, plan.choice, p.group.size(), p.hosts);
    ch.finish();
  }
}

}  // namespace chorus::algo
