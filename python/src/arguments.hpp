// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a torch argument means to chorus: a dtype's element type on the wire, a c10d ReduceOp's
// chorus op, and the checks that reject what chorus cannot take. Every message names the rank
// and the operation: "chorus_torch: rank 1: allreduce: ...".

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "chorus/core/types.hpp"

namespace chorus_torch {

/// The element type on the wire for a torch dtype (bool travels as uint8, 0 or 1).
struct Wire {
  chorus::DataType dt = chorus::DataType::uint8;
  bool is_bool = false;
};

/// "chorus_torch: rank R: OP: ", the start of every message.
std::string prefix(int rank, const std::string& op);

/// Throws std::runtime_error(prefix(rank, op) + msg).
[[noreturn]] void fail(int rank, const std::string& op, const std::string& msg);

/// torch's name of a dtype ("int16", not c10's "Short").
std::string dtype_name(at::ScalarType t);

/// The wire type of a dtype; fails on dtypes chorus does not carry.
Wire wire_of(int rank, const std::string& op, at::ScalarType t);

/// "SUM", "AVG", ...
const char* name_of(c10d::ReduceOp::RedOpType op);

/// chorus's op for torch's ReduceOp on a wire type. bool follows torch's meaning on bool tensors:
/// SUM and MAX are "any" (max of 0/1), PRODUCT and MIN "all" (min), the bitwise ops apply to 0/1.
chorus::ReduceOp op_of(int rank, const std::string& op, const c10d::ReduceOp& r, Wire w);

/// PREMUL_SUM's factor (torch.distributed._make_nccl_premul_sum: a float, or a list holding one
/// one-element tensor) as a 0-dim tensor of `like`'s dtype, as NCCL's ncclRedOpCreatePreMulSum
/// takes the scalar in the data's type; an undefined tensor for every other op. (op_of maps
/// PREMUL_SUM to sum: the inputs are scaled before the sum, launch_premul.)
at::Tensor premul_factor(int rank, const std::string& op, const c10d::ReduceOp& r, const at::Tensor& like);

/// A defined, strided CPU tensor.
void check_tensor(int rank, const std::string& op, const at::Tensor& t);

/// Exactly one tensor, which check_tensor accepts.
void check_single(int rank, const std::string& op, const std::vector<at::Tensor>& ts);

/// `t` passes check_tensor and has the dtype of `ref` (and its number of elements if same_size).
void check_same(int rank, const std::string& op, const at::Tensor& ref, const at::Tensor& t, bool same_size);

/// `root` is a rank of a group of `size`, and `root_tensor` (broadcast's and reduce's option) is 0.
void check_root(int rank, int size, const std::string& op, int64_t root, int64_t root_tensor = 0);

/// "OP (DTYPE, N elements)": what a Work reports itself as.
std::string describe(const std::string& op, const at::Tensor& t);

/// The data of `t`, or null when it has no elements.
inline void* data_of(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.data_ptr(); }

}  // namespace chorus_torch
