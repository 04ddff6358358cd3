// ProcessGroupChorus: see process_group.hpp.
//
// How a collective runs. Each call makes a Work holding a `launch` closure and appends it to the
// group's queue; nothing is sent yet. Works leave the queue in call order, each "issued" once to
// the chorus communicator, under issue_mu_ (so chorus sees them in call order, which is what
// makes every rank agree):
//   - by the dispatcher thread, which issues whatever is queued as chorus *_async calls: they run
//     on the communicator's worker, in order, and complete the Work (and its future) from there;
//   - or by a thread that calls Work::wait() on a Work still queued: it issues the Works queued
//     before it (async) and then runs its own as a blocking chorus call on its own thread, which
//     chorus runs inline when nothing is in flight. A blocking dist.all_reduce thus costs no
//     thread hop.
// send and recv are posted to chorus at once (not queued), as gloo does, so that a blocking
// collective never holds back a receive another rank waits for.

#include "process_group.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include "chorus/all_to_all_v.hpp"
#include "chorus/chorus.hpp"
#include "store_adapter.hpp"

namespace chorus_torch {

namespace {

using Comm = chorus::Communicator<chorus::DefaultTransport>;

/// The element type on the wire for a torch dtype (bool travels as uint8, 0 or 1).
struct Wire {
  chorus::DataType dt = chorus::DataType::uint8;
  bool is_bool = false;
};

std::string prefix(int rank, const std::string& op) { return "chorus_torch: rank " + std::to_string(rank) + ": " + op + ": "; }

[[noreturn]] void fail(int rank, const std::string& op, const std::string& msg) {
  throw std::runtime_error(prefix(rank, op) + msg);
}

/// torch's name of a dtype ("int16", not c10's "Short").
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    case at::kShort: return "int16";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kComplexHalf: return "complex32";
    default: return c10::toString(t);
  }
}

Wire wire_of(int rank, const std::string& op, at::ScalarType t) {
  switch (t) {
    case at::kFloat: return {chorus::DataType::float32, false};
    case at::kDouble: return {chorus::DataType::float64, false};
    case at::kHalf: return {chorus::DataType::float16, false};
    case at::kBFloat16: return {chorus::DataType::bfloat16, false};
    case at::kChar: return {chorus::DataType::int8, false};
    case at::kByte: return {chorus::DataType::uint8, false};
    case at::kInt: return {chorus::DataType::int32, false};
    case at::kLong: return {chorus::DataType::int64, false};
    case at::kBool: return {chorus::DataType::uint8, true};
    default: break;
  }
  fail(rank, op,
       "dtype " + dtype_name(t) +
           " is not supported (float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool are)");
}

const char* name_of(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNKNOWN";
  }
}

/// torch's ReduceOp for a wire type. bool follows torch's meaning on bool tensors: SUM and MAX
/// are "any" (max of 0/1), PRODUCT and MIN "all" (min), and the bitwise ops apply to 0/1.
chorus::ReduceOp op_of(int rank, const std::string& op, const c10d::ReduceOp& r, Wire w) {
  using R = c10d::ReduceOp;
  if (w.is_bool) {
    switch (r.op_) {
      case R::SUM: case R::MAX: case R::BOR: return chorus::ReduceOp::max;
      case R::PRODUCT: case R::MIN: case R::BAND: return chorus::ReduceOp::min;
      case R::BXOR: return chorus::ReduceOp::bxor;
      default: fail(rank, op, std::string("ReduceOp ") + name_of(r.op_) + " does not apply to bool tensors");
    }
  }
  chorus::ReduceOp out = chorus::ReduceOp::sum;
  switch (r.op_) {
    case R::SUM: out = chorus::ReduceOp::sum; break;
    case R::AVG: out = chorus::ReduceOp::avg; break;
    case R::PRODUCT: out = chorus::ReduceOp::prod; break;
    case R::MIN: out = chorus::ReduceOp::min; break;
    case R::MAX: out = chorus::ReduceOp::max; break;
    case R::BAND: out = chorus::ReduceOp::band; break;
    case R::BOR: out = chorus::ReduceOp::bor; break;
    case R::BXOR: out = chorus::ReduceOp::bxor; break;
    default: fail(rank, op, std::string("ReduceOp ") + name_of(r.op_) + " is not supported by chorus");
  }
  if (!chorus::is_valid_op(w.dt, out))
    fail(rank, op, std::string("ReduceOp ") + name_of(r.op_) + " does not apply to " +
                       std::string(chorus::to_string(w.dt)) + " tensors (bitwise ops take integer and bool tensors)");
  return out;
}

void check_tensor(int rank, const std::string& op, const at::Tensor& t) {
  if (!t.defined()) fail(rank, op, "undefined tensor");
  if (!t.device().is_cpu())
    fail(rank, op, "tensor on " + t.device().str() + ": the chorus backend handles CPU tensors only");
  if (t.layout() != at::kStrided) fail(rank, op, "sparse tensors are not supported");
}

void check_single(int rank, const std::string& op, const std::vector<at::Tensor>& ts) {
  if (ts.size() != 1)
    fail(rank, op, "expects exactly one tensor per call (got " + std::to_string(ts.size()) + ")");
  check_tensor(rank, op, ts[0]);
}

void check_same(int rank, const std::string& op, const at::Tensor& ref, const at::Tensor& t, bool same_size) {
  check_tensor(rank, op, t);
  if (t.scalar_type() != ref.scalar_type())
    fail(rank, op, "tensors of different dtypes: " + dtype_name(ref.scalar_type()) + " and " +
                       dtype_name(t.scalar_type()));
  if (same_size && t.numel() != ref.numel())
    fail(rank, op, "tensors of different sizes: " + std::to_string(ref.numel()) + " and " +
                       std::to_string(t.numel()) + " elements");
}

std::string describe(const std::string& op, const at::Tensor& t) {
  std::ostringstream os;
  os << op << " (" << dtype_name(t.scalar_type()) << ", " << t.numel() << " elements)";
  return os.str();
}

void* data_of(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.data_ptr(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Work
// ---------------------------------------------------------------------------------------------

class ChorusWork final : public c10d::Work {
 public:
  /// launch(work, blocking): hands the operation to chorus. blocking: run it to the end on this
  /// thread and call complete(); else start it asynchronously and attach() its requests.
  using Launch = std::function<void(ChorusWork&, bool blocking)>;

  ChorusWork(ProcessGroupChorus::Impl* pg, int rank, c10d::OpType type, std::string what,
             std::vector<at::Tensor> outputs, int source = -1)
      : Work(rank, type),
        pg_(pg),
        what_(std::move(what)),
        outputs_(std::move(outputs)),
        source_(source),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  bool wait(std::chrono::milliseconds timeout) override;
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  /// Keeps tensors alive (and unchanged) until the operation is done.
  void keep(at::Tensor t) { keep_.push_back(std::move(t)); }
  /// Runs on success, before completion, in the reverse order of the calls: copies from staging
  /// buffers into the caller's tensors.
  void then(std::function<void()> f) { post_.push_back(std::move(f)); }

  /// Completes the work when every request has: the first failure is its error.
  void attach(std::vector<chorus::Request> reqs) {
    {
      std::lock_guard lk(req_mu_);
      reqs_ = reqs;
    }
    pending_.store(static_cast<int>(reqs.size()) + 1);
    c10::intrusive_ptr<ChorusWork> self = c10::intrusive_ptr<ChorusWork>::reclaim_copy(this);
    for (auto& r : reqs) {
      if (!r.state()) {
        arrive(nullptr);
        continue;
      }
      chorus::detail::RequestState* st = r.state().get();
      st->then([self, st] {
        std::string what;
        chorus::ErrorCode code{};
        self->arrive(st->failed(&code, &what) ? self->error(what) : nullptr);
      });
    }
    arrive(nullptr);
  }
  /// The operation ran to the end (blocking launch).
  void complete() { finish_once(nullptr); }
  /// The operation failed.
  void fail_with(const std::exception& e) { finish_once(error(e.what())); }

  std::exception_ptr error(const std::string& what) const {
    return std::make_exception_ptr(std::runtime_error(prefix(rank_, what_) + what));
  }

  Launch launch;
  /// Handed to chorus (or failed) already; set under the group's queue mutex, read without it by
  /// wait() (once true it stays true, and the group is not touched again).
  std::atomic<bool> issued{false};

 private:
  void arrive(std::exception_ptr e) {
    if (e) {
      std::lock_guard lk(req_mu_);
      if (!first_error_) first_error_ = e;
    }
    if (pending_.fetch_sub(1) != 1) return;
    std::exception_ptr err;
    {
      std::lock_guard lk(req_mu_);
      err = first_error_;
    }
    finish_once(err);
  }

  void finish_once(std::exception_ptr e) {
    {
      std::lock_guard lk(req_mu_);
      if (finished_) return;
      finished_ = true;
    }
    if (!e) {
      try {
        // Innermost first: what launch() added (unpacking from the wire buffers) runs before
        // what the call added (copies into the caller's tensors).
        for (auto it = post_.rbegin(); it != post_.rend(); ++it) (*it)();
      } catch (const std::exception& ex) {
        e = error(ex.what());
      }
    }
    post_.clear();
    keep_.clear();
    finish(e);
    if (e)
      future_->setError(e);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

  ProcessGroupChorus::Impl* pg_;  ///< valid while issued is false (the group issues or fails all before it goes)
  std::string what_;
  std::vector<at::Tensor> outputs_;
  int source_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> post_;
  std::mutex req_mu_;
  std::vector<chorus::Request> reqs_;
  std::atomic<int> pending_{0};
  std::exception_ptr first_error_;
  bool finished_ = false;
};

// ---------------------------------------------------------------------------------------------
// The group
// ---------------------------------------------------------------------------------------------

struct ProcessGroupChorus::Impl {
  int rank;
  int size;
  std::unique_ptr<Comm> comm;

  std::mutex issue_mu;  ///< held while handing works to chorus: call order
  std::mutex p2p_mu;    ///< serialises posting sends and receives
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<c10::intrusive_ptr<ChorusWork>> queue;
  bool stopping = false;
  std::thread dispatcher;

  Impl(const c10::intrusive_ptr<c10d::Store>& store, int r, int n, std::chrono::milliseconds timeout)
      : rank(r), size(n) {
    chorus::Options o = chorus::Options::from_env();
    o.rank = r;
    o.world_size = n;
    o.store = std::make_shared<C10dStore>(store);
    if (timeout.count() > 0) o.timeout = timeout;
    try {
      comm = std::make_unique<Comm>(Comm::create(std::move(o)));
    } catch (const std::exception& e) {
      fail(r, "init (rendezvous through the c10d store)", e.what());
    }
    dispatcher = std::thread([this] { dispatch_loop(); });
  }

  ~Impl() {
    {
      std::lock_guard lk(queue_mu);
      stopping = true;
    }
    queue_cv.notify_all();
    dispatcher.join();
    // Whatever is still queued never ran: fail it (the communicator goes with this object).
    std::deque<c10::intrusive_ptr<ChorusWork>> left;
    {
      std::lock_guard lk(queue_mu);
      for (auto& w : queue) w->issued = true;
      left.swap(queue);
    }
    for (auto& w : left) w->fail_with(std::runtime_error("the process group was destroyed before it ran"));
  }

  c10::intrusive_ptr<ChorusWork> make(c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
                                      int source = -1) {
    return c10::make_intrusive<ChorusWork>(this, rank, type, std::move(what), std::move(outputs), source);
  }

  c10::intrusive_ptr<c10d::Work> enqueue(c10::intrusive_ptr<ChorusWork> w) {
    {
      std::lock_guard lk(queue_mu);
      queue.push_back(w);
    }
    queue_cv.notify_one();
    return w;
  }

  static void issue(ChorusWork& w, bool blocking) {
    try {
      w.launch(w, blocking);
    } catch (const std::exception& e) {
      w.fail_with(e);
    }
    w.launch = nullptr;  // drop the tensors it captured
  }

  /// Issues queued works in call order: all of them (target null), or up to `target`, which then
  /// runs blocking on this thread. Returns at once if `target` was issued by someone else.
  void drain(ChorusWork* target) {
    std::lock_guard il(issue_mu);
    for (;;) {
      c10::intrusive_ptr<ChorusWork> w;
      {
        std::lock_guard lk(queue_mu);
        if (queue.empty() || (target && target->issued)) return;
        w = queue.front();
        queue.pop_front();
        w->issued = true;
      }
      const bool mine = w.get() == target;
      issue(*w, mine);
      if (mine) return;
    }
  }

  void dispatch_loop() {
    for (;;) {
      {
        std::unique_lock lk(queue_mu);
        queue_cv.wait(lk, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
      }
      drain(nullptr);
    }
  }

  /// A point-to-point work, posted now.
  c10::intrusive_ptr<c10d::Work> post_p2p(c10::intrusive_ptr<ChorusWork> w, const std::function<chorus::Request()>& post) {
    {
      std::lock_guard lk(queue_mu);
      w->issued = true;
    }
    try {
      chorus::Request r;
      {
        std::lock_guard lk(p2p_mu);
        r = post();
      }
      w->attach({r});
    } catch (const std::exception& e) {
      w->fail_with(e);
    }
    return w;
  }
};

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  if (!issued.load()) pg_->drain(this);
  std::vector<chorus::Request> reqs;
  {
    std::lock_guard lk(req_mu_);
    reqs = reqs_;
  }
  // Drive the requests on this thread (sends and receives make progress here) and surface a
  // timeout at once; completion itself arrives through attach()'s callbacks.
  for (auto& r : reqs) {
    if (!r.state()) continue;
    try {
      r.wait();
    } catch (const std::exception& e) {
      finish_once(error(e.what()));
    }
  }
  return Work::wait(timeout);
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

namespace {

/// A contiguous tensor with the data of `t`; when `t` is not contiguous, a copy that is written
/// back into `t` (if `write_back`) when the work succeeds.
at::Tensor staged(ChorusWork& w, const at::Tensor& t, bool write_back) {
  if (t.is_contiguous()) return t;
  at::Tensor c = t.contiguous();
  if (write_back) w.then([t, c]() mutable { t.copy_(c); });
  return c;
}

}  // namespace

ProcessGroupChorus::ProcessGroupChorus(const Ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>(store, rank, size, timeout)) {}

ProcessGroupChorus::~ProcessGroupChorus() = default;

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  const std::string op = "broadcast";
  check_single(rank_, op, tensors);
  if (opts.rootRank < 0 || opts.rootRank >= size_ || opts.rootTensor != 0)
    fail(rank_, op, "root " + std::to_string(opts.rootRank) + " is not a rank of this group (size " + std::to_string(size_) + ")");
  const at::Tensor t = tensors[0];
  const Wire wire = wire_of(rank_, op, t.scalar_type());
  auto w = impl_->make(c10d::OpType::BROADCAST, describe(op, t), tensors);
  const at::Tensor buf = staged(*w, t, true);
  w->keep(buf);
  const int root = static_cast<int>(opts.rootRank);
  Comm* c = impl_->comm.get();
  w->launch = [c, buf, wire, root](ChorusWork& self, bool blocking) {
    if (blocking) {
      c->broadcast(data_of(buf), static_cast<std::size_t>(buf.numel()), wire.dt, root);
      self.complete();
    } else {
      self.attach({c->broadcast_async(data_of(buf), static_cast<std::size_t>(buf.numel()), wire.dt, root)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const std::string op = "allreduce";
  check_single(rank_, op, tensors);
  const at::Tensor t = tensors[0];
  const Wire wire = wire_of(rank_, op, t.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  auto w = impl_->make(c10d::OpType::ALLREDUCE, describe(op, t) + " " + name_of(opts.reduceOp.op_), tensors);
  const at::Tensor buf = staged(*w, t, true);
  w->keep(buf);
  Comm* c = impl_->comm.get();
  w->launch = [c, buf, wire, rop](ChorusWork& self, bool blocking) {
    void* p = data_of(buf);
    const auto n = static_cast<std::size_t>(buf.numel());
    if (blocking) {
      c->all_reduce(p, p, n, wire.dt, rop);
      self.complete();
    } else {
      self.attach({c->all_reduce_async(p, p, n, wire.dt, rop)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const std::string op = "reduce";
  check_single(rank_, op, tensors);
  if (opts.rootRank < 0 || opts.rootRank >= size_ || opts.rootTensor != 0)
    fail(rank_, op, "root " + std::to_string(opts.rootRank) + " is not a rank of this group (size " + std::to_string(size_) + ")");
  const at::Tensor t = tensors[0];
  const Wire wire = wire_of(rank_, op, t.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  const int root = static_cast<int>(opts.rootRank);
  auto w = impl_->make(c10d::OpType::REDUCE, describe(op, t) + " " + name_of(opts.reduceOp.op_), tensors);
  const at::Tensor in = staged(*w, t, rank_ == root);
  // The result lands on the root, in place; the other ranks' tensors stay as they are.
  const at::Tensor out = rank_ == root ? in : at::empty_like(in);
  w->keep(in);
  w->keep(out);
  Comm* c = impl_->comm.get();
  w->launch = [c, in, out, wire, rop, root](ChorusWork& self, bool blocking) {
    const auto n = static_cast<std::size_t>(in.numel());
    if (blocking) {
      c->reduce(data_of(in), data_of(out), n, wire.dt, rop, root);
      self.complete();
    } else {
      self.attach({c->reduce_async(data_of(in), data_of(out), n, wire.dt, rop, root)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  const std::string op = "_allgather_base";
  check_tensor(rank_, op, input);
  check_same(rank_, op, input, output, false);
  if (output.numel() != input.numel() * size_)
    fail(rank_, op, "output has " + std::to_string(output.numel()) + " elements, not size x input = " +
                        std::to_string(input.numel() * size_));
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::_ALLGATHER_BASE, describe(op, input), {output});
  const at::Tensor in = staged(*w, input, false);
  const at::Tensor out = staged(*w, output, true);
  w->keep(in);
  w->keep(out);
  Comm* c = impl_->comm.get();
  w->launch = [c, in, out, wire](ChorusWork& self, bool blocking) {
    const auto n = static_cast<std::size_t>(in.numel());
    if (blocking) {
      c->all_gather(data_of(in), data_of(out), n, wire.dt);
      self.complete();
    } else {
      self.attach({c->all_gather_async(data_of(in), data_of(out), n, wire.dt)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions&) {
  const std::string op = "allgather";
  check_single(rank_, op, inputs);
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
    fail(rank_, op, "expects one list of " + std::to_string(size_) + " output tensors");
  const at::Tensor input = inputs[0];
  for (const auto& o : outputs[0]) check_same(rank_, op, input, o, true);
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::ALLGATHER, describe(op, input), outputs[0]);
  const at::Tensor in = input.contiguous();
  const at::Tensor flat = at::empty({input.numel() * size_}, input.options());
  w->keep(in);
  w->keep(flat);
  w->then([flat, outs = outputs[0], n = input.numel()]() mutable {
    for (std::size_t r = 0; r < outs.size(); ++r)
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  });
  Comm* c = impl_->comm.get();
  w->launch = [c, in, flat, wire](ChorusWork& self, bool blocking) {
    const auto n = static_cast<std::size_t>(in.numel());
    if (blocking) {
      c->all_gather(data_of(in), data_of(flat), n, wire.dt);
      self.complete();
    } else {
      self.attach({c->all_gather_async(data_of(in), data_of(flat), n, wire.dt)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  const std::string op = "gather";
  check_single(rank_, op, inputs);
  if (opts.rootRank < 0 || opts.rootRank >= size_)
    fail(rank_, op, "root " + std::to_string(opts.rootRank) + " is not a rank of this group (size " + std::to_string(size_) + ")");
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor input = inputs[0];
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      fail(rank_, op, "the root expects one list of " + std::to_string(size_) + " output tensors");
    outs = outputs[0];
    for (const auto& o : outs) check_same(rank_, op, input, o, true);
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(rank_, op, "only the root takes output tensors");
  }
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::GATHER, describe(op, input), outs);
  const at::Tensor in = input.contiguous();
  const at::Tensor flat = rank_ == root ? at::empty({input.numel() * size_}, input.options()) : at::Tensor();
  w->keep(in);
  if (rank_ == root) {
    w->keep(flat);
    w->then([flat, outs, n = input.numel()]() mutable {
      for (std::size_t r = 0; r < outs.size(); ++r)
        outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    });
  }
  Comm* c = impl_->comm.get();
  w->launch = [c, in, flat, wire, root](ChorusWork& self, bool blocking) {
    const auto n = static_cast<std::size_t>(in.numel());
    void* out = flat.defined() ? data_of(flat) : nullptr;
    if (blocking) {
      c->gather(data_of(in), out, n, wire.dt, root);
      self.complete();
    } else {
      self.attach({c->gather_async(data_of(in), out, n, wire.dt, root)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  const std::string op = "scatter";
  check_single(rank_, op, outputs);
  if (opts.rootRank < 0 || opts.rootRank >= size_)
    fail(rank_, op, "root " + std::to_string(opts.rootRank) + " is not a rank of this group (size " + std::to_string(size_) + ")");
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor output = outputs[0];
  at::Tensor flat;
  if (rank_ == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
      fail(rank_, op, "the root expects one list of " + std::to_string(size_) + " input tensors");
    for (const auto& i : inputs[0]) check_same(rank_, op, output, i, true);
    std::vector<at::Tensor> parts;
    for (const auto& i : inputs[0]) parts.push_back(i.reshape({-1}));
    flat = at::cat(parts);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(rank_, op, "only the root takes input tensors");
  }
  const Wire wire = wire_of(rank_, op, output.scalar_type());
  auto w = impl_->make(c10d::OpType::SCATTER, describe(op, output), outputs);
  const at::Tensor out = staged(*w, output, true);
  w->keep(out);
  if (flat.defined()) w->keep(flat);
  Comm* c = impl_->comm.get();
  w->launch = [c, flat, out, wire, root](ChorusWork& self, bool blocking) {
    const auto n = static_cast<std::size_t>(out.numel());
    const void* in = flat.defined() ? data_of(flat) : nullptr;
    if (blocking) {
      c->scatter(in, data_of(out), n, wire.dt, root);
      self.complete();
    } else {
      self.attach({c->scatter_async(in, data_of(out), n, wire.dt, root)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  const std::string op = "_reduce_scatter_base";
  check_tensor(rank_, op, output);
  check_same(rank_, op, output, input, false);
  if (input.numel() != output.numel() * size_)
    fail(rank_, op, "input has " + std::to_string(input.numel()) + " elements, not size x output = " +
                        std::to_string(output.numel() * size_));
  const Wire wire = wire_of(rank_, op, output.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  auto w = impl_->make(c10d::OpType::_REDUCE_SCATTER_BASE, describe(op, output) + " " + name_of(opts.reduceOp.op_),
                       {output});
  const at::Tensor in = input.contiguous();
  const at::Tensor out = staged(*w, output, true);
  w->keep(in);
  w->keep(out);
  Comm* c = impl_->comm.get();
  w->launch = [c, in, out, wire, rop](ChorusWork& self, bool blocking) {
    const auto n = static_cast<std::size_t>(out.numel());
    if (blocking) {
      c->reduce_scatter(data_of(in), data_of(out), n, wire.dt, rop);
      self.complete();
    } else {
      self.attach({c->reduce_scatter_async(data_of(in), data_of(out), n, wire.dt, rop)});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter";
  check_single(rank_, op, outputs);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
    fail(rank_, op, "expects one list of " + std::to_string(size_) + " input tensors");
  const at::Tensor output = outputs[0];
  for (const auto& i : inputs[0]) check_same(rank_, op, output, i, true);
  std::vector<at::Tensor> parts;
  for (const auto& i : inputs[0]) parts.push_back(i.reshape({-1}));
  at::Tensor flat = at::cat(parts);
  at::Tensor out = output;
  return _reduce_scatter_base(out, flat, opts);
}

namespace {

/// all_to_all with per-rank counts: chorus::all_to_all_v (point to point, blocking on the thread
/// that issues it) after a barrier. The barrier is a blocking collective, so it runs after every
/// collective issued before (it queues behind them on the communicator's worker): their results
/// are in the input before it is sent, and nothing still writes the output.
/// `in_counts[p]` elements go to rank p, `out_counts[p]` come from it, at the running offsets.
void launch_all_to_all_v(Comm* c, ChorusWork& self, const at::Tensor& in, const at::Tensor& out,
                         const std::vector<int64_t>& in_counts, const std::vector<int64_t>& out_counts, Wire wire) {
  const std::vector<std::size_t> send(in_counts.begin(), in_counts.end());
  const std::vector<std::size_t> recv(out_counts.begin(), out_counts.end());
  c->barrier();
  chorus::all_to_all_v(*c, data_of(in), std::span<const std::size_t>(send), data_of(out),
                       std::span<const std::size_t>(recv), wire.dt);
  self.complete();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions&) {
  const std::string op = "alltoall_base";
  check_tensor(rank_, op, input);
  check_same(rank_, op, input, output, false);
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::ALLTOALL_BASE, describe(op, input), {output});
  const at::Tensor in = input.contiguous();
  const at::Tensor out = staged(*w, output, true);
  w->keep(in);
  w->keep(out);
  Comm* c = impl_->comm.get();
  if (output_splits.empty() && input_splits.empty()) {
    if (in.numel() % size_ != 0 || out.numel() != in.numel())
      fail(rank_, op, "equal splits need input and output of the same size, a multiple of the group size (" +
                          std::to_string(in.numel()) + " and " + std::to_string(out.numel()) + " elements)");
    w->launch = [c, in, out, wire, n = size_](ChorusWork& self, bool blocking) {
      const auto count = static_cast<std::size_t>(in.numel() / n);
      if (blocking) {
        c->all_to_all(data_of(in), data_of(out), count, wire.dt);
        self.complete();
      } else {
        self.attach({c->all_to_all_async(data_of(in), data_of(out), count, wire.dt)});
      }
    };
    return impl_->enqueue(w);
  }
  // Split sizes count rows (the first dimension); either list may be empty (equal rows).
  auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* which) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row = rows == 0 ? 0 : t.numel() / rows;
    std::vector<int64_t> out(static_cast<std::size_t>(size_));
    if (splits.empty()) {
      if (rows % size_ != 0)
        fail(rank_, op, std::string(which) + " has " + std::to_string(rows) + " rows, not a multiple of the group size");
      for (auto& x : out) x = rows / size_ * row;
      return out;
    }
    if (static_cast<int>(splits.size()) != size_)
      fail(rank_, op, std::string(which) + " split sizes: " + std::to_string(splits.size()) + " entries for a group of " +
                          std::to_string(size_));
    int64_t sum = 0;
    for (int p = 0; p < size_; ++p) {
      if (splits[p] < 0) fail(rank_, op, std::string(which) + " split sizes must not be negative");
      sum += splits[p];
      out[p] = splits[p] * row;
    }
    if (sum != rows)
      fail(rank_, op, std::string(which) + " split sizes add up to " + std::to_string(sum) + ", but the tensor has " +
                          std::to_string(rows) + " rows");
    return out;
  };
  std::vector<int64_t> in_counts = counts(input_splits, in, "input");
  std::vector<int64_t> out_counts = counts(output_splits, out, "output");
  w->launch = [c, in, out, in_counts, out_counts, wire](ChorusWork& self, bool) {
    launch_all_to_all_v(c, self, in, out, in_counts, out_counts, wire);
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  const std::string op = "alltoall";
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_)
    fail(rank_, op, "expects " + std::to_string(size_) + " input and output tensors");
  for (const auto& t : inputs) check_same(rank_, op, inputs[0], t, false);
  for (const auto& t : outputs) check_same(rank_, op, inputs[0], t, false);
  const Wire wire = wire_of(rank_, op, inputs[0].scalar_type());
  std::vector<int64_t> in_counts, out_counts;
  std::vector<at::Tensor> parts;
  int64_t out_total = 0;
  for (int p = 0; p < size_; ++p) {
    in_counts.push_back(inputs[p].numel());
    out_counts.push_back(outputs[p].numel());
    out_total += outputs[p].numel();
    parts.push_back(inputs[p].reshape({-1}));
  }
  auto w = impl_->make(c10d::OpType::ALLTOALL, describe(op, inputs[0]), outputs);
  const at::Tensor in = at::cat(parts);
  const at::Tensor out = at::empty({out_total}, inputs[0].options());
  w->keep(in);
  w->keep(out);
  w->then([out, outs = outputs]() mutable {
    int64_t off = 0;
    for (auto& o : outs) {
      o.copy_(out.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  });
  Comm* c = impl_->comm.get();
  w->launch = [c, in, out, in_counts, out_counts, wire](ChorusWork& self, bool) {
    launch_all_to_all_v(c, self, in, out, in_counts, out_counts, wire);
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions&) {
  auto w = impl_->make(c10d::OpType::BARRIER, "barrier", {});
  Comm* c = impl_->comm.get();
  w->launch = [c](ChorusWork& self, bool blocking) {
    if (blocking) {
      c->barrier();
      self.complete();
    } else {
      self.attach({c->barrier_async()});
    }
  };
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const std::string op = "send to " + std::to_string(dst) + " tag " + std::to_string(tag);
  check_single(rank_, op, tensors);
  wire_of(rank_, op, tensors[0].scalar_type());
  const at::Tensor t = tensors[0].contiguous();
  auto w = impl_->make(c10d::OpType::SEND, describe(op, t), tensors);
  w->keep(t);
  Comm* c = impl_->comm.get();
  return impl_->post_p2p(w, [c, t, dst, tag] {
    return c->isend_bytes(chorus::ConstBytes{static_cast<const std::byte*>(data_of(t)), t.nbytes()}, dst, tag);
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

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>&, int tag) {
  fail(rank_, "recv from any source, tag " + std::to_string(tag),
       "not supported by the chorus backend (chorus matches receives by source): pass src");
}

}  // namespace chorus_torch
