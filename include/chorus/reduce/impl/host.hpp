// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of reduce() and finalize_avg() on a DataType (reduce/host.hpp; CHORUS_DECL,
/// config.hpp): included by that header in a header-only program, and by chorus/impl/bodies.hpp
/// alone with CHORUS_SEPARATE_COMPILATION.

#include <string>

#include "chorus/reduce/host.hpp"

namespace chorus {

CHORUS_DECL void reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count) {
  if (is_bitwise(op) && size_of(dt) != 0 && !is_valid_op(dt, op))
    throw Error(ErrorCode::invalid_argument, "reduce: " + std::string(to_string(op)) + " does not apply to " +
                                                 std::string(to_string(dt)) + " (bitwise ops take integer types)");
  dispatch(dt, [&]<class T>(std::type_identity<T>) {
    detail::dispatch_op(op, [&]<class Op>(Op) {
      reduce_to<Op>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count);
    });
  });
}

CHORUS_DECL void finalize_avg(DataType dt, void* data, std::size_t count, int world_size) {
  dispatch(dt,
           [&]<class T>(std::type_identity<T>) { finalize_avg(static_cast<T*>(data), count, world_size); });
}

}  // namespace chorus
