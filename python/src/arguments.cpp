// SPDX-License-Identifier: BSD-3-Clause
// Argument translation and checks: see arguments.hpp.

#include "arguments.hpp"

#include <sstream>
#include <stdexcept>

namespace chorus_torch {

std::string prefix(int rank, const std::string& op) {
  return "chorus_torch: rank " + std::to_string(rank) + ": " + op + ": ";
}

void fail(int rank, const std::string& op, const std::string& msg) {
  throw std::runtime_error(prefix(rank, op) + msg);
}

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
    case R::PREMUL_SUM: out = chorus::ReduceOp::sum; break;  // the inputs scaled first: premul_factor
    default: fail(rank, op, std::string("ReduceOp ") + name_of(r.op_) + " is not supported by chorus");
  }
  if (!chorus::is_valid_op(w.dt, out))
    fail(rank, op,
         std::string("ReduceOp ") + name_of(r.op_) + " does not apply to " +
             std::string(chorus::to_string(w.dt)) + " tensors (bitwise ops take integer and bool tensors)");
  return out;
}

at::Tensor premul_factor(int rank, const std::string& op, const c10d::ReduceOp& r, const at::Tensor& like) {
  if (r.op_ != c10d::ReduceOp::PREMUL_SUM) return {};
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(r.supplement_.get());
  if (s == nullptr)
    fail(rank, op, "PREMUL_SUM without its factor (make the op with torch.distributed._make_nccl_premul_sum)");
  if (s->tensor_factors.empty()) return at::scalar_tensor(s->double_factor, like.options());
  const at::Tensor& f = s->tensor_factors[0];
  if (s->tensor_factors.size() != 1 || !f.defined() || f.numel() != 1 || !f.device().is_cpu())
    fail(rank, op, "PREMUL_SUM's factor must be one CPU tensor of one element");
  return f.reshape({}).to(like.scalar_type());
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

void check_root(int rank, int size, const std::string& op, int64_t root, int64_t root_tensor) {
  if (root < 0 || root >= size || root_tensor != 0)
    fail(rank, op,
         "root " + std::to_string(root) + " is not a rank of this group (size " + std::to_string(size) + ")");
}

std::string describe(const std::string& op, const at::Tensor& t) {
  std::ostringstream os;
  os << op << " (" << dtype_name(t.scalar_type()) << ", " << t.numel() << " elements)";
  return os.str();
}

}  // namespace chorus_torch
