// SPDX-License-Identifier: BSD-3-Clause
// ProcessGroupChorus's send and recv: posted to chorus at once, not queued (group.hpp says why).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "comm.hpp"
#include "group.hpp"
#include "process_group.hpp"
#include "work.hpp"

namespace chorus_torch {

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const std::string op = "send to " + std::to_string(dst) + " tag " + std::to_string(tag);
  check_single(rank_, op, tensors);
  wire_of(rank_, op, tensors[0].scalar_type());
  const at::Tensor t = tensors[0].contiguous();
  auto w = impl_->make(c10d::OpType::SEND, describe(op, t), tensors);
  w->keep(t);
  Comm* c = impl_->comm.get();
  return impl_->post_p2p(w, [c, t, dst, tag] {
    return c->isend_bytes(chorus::ConstBytes{static_cast<const std::byte*>(data_of(t)), t.nbytes()}, dst,
                          tag);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const std::string op = "recv from " + std::to_string(src) + " tag " + std::to_string(tag);
  check_single(rank_, op, tensors);
  wire_of(rank_, op, tensors[0].scalar_type());
  auto w = impl_->make(c10d::OpType::RECV, describe(op, tensors[0]), tensors, src);
  const at::Tensor t = staged(*w, tensors[0], true);
  w->keep(t);
  Comm* c = impl_->comm.get();
  return impl_->post_p2p(w, [c, t, src, tag] {
    return c->irecv_bytes(chorus::MutableBytes{static_cast<std::byte*>(data_of(t)), t.nbytes()}, src, tag);
  });
}

// dist.recv(t) and dist.irecv(t) without src: chorus's receive from any source
// (Communicator::irecv_any_bytes); the Work's sourceRank() names the sender once it is complete.
c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const std::string op = "recv from any source tag " + std::to_string(tag);
  check_single(rank_, op, tensors);
  wire_of(rank_, op, tensors[0].scalar_type());
  auto w = impl_->make(c10d::OpType::RECVANYSOURCE, describe(op, tensors[0]), tensors);
  const at::Tensor t = staged(*w, tensors[0], true);
  w->keep(t);
  auto posted = std::make_shared<chorus::Request>();
  // Runs on success before the Work completes (and is dropped with its other steps then).
  w->then([work = w.get(), posted] { work->set_source(posted->source()); });
  Comm* c = impl_->comm.get();
  return impl_->post_p2p(w, [c, t, tag, posted] {
    *posted = c->irecv_any_bytes(chorus::MutableBytes{static_cast<std::byte*>(data_of(t)), t.nbytes()}, tag);
    return *posted;
  });
}

}  // namespace chorus_torch
