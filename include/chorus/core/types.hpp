// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Element vocabulary: DataType, ReduceOp, and the traits that map between C++ element types and
/// DataType values (the float types narrower than float are in core/float.hpp).
///
/// ```cpp
/// static_assert(chorus::data_type_of<float> == chorus::DataType::float32);
/// auto dt = chorus::parse_data_type("half");            // DataType::float16
/// std::size_t bytes = count * chorus::size_of(*dt);
/// chorus::dispatch(*dt, [&]<class T>(std::type_identity<T>) { fill<T>(buf, count); });
/// ```

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "chorus/config.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/float.hpp"

namespace chorus {

// ---------------------------------------------------------------------------------------------
// DataType
// ---------------------------------------------------------------------------------------------

/// The element types every collective accepts (the same set as NCCL's). The fp8 types come last,
/// so that the values of the others (which travel in call descriptors) stay what they were.
// clang-format off
enum class DataType {
  int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64, float8_e4m3, float8_e5m2
};
// clang-format on

inline constexpr std::array<DataType, 12> kAllDataTypes = {
    DataType::int8,    DataType::uint8,   DataType::int32,       DataType::uint32,
    DataType::int64,   DataType::uint64,  DataType::float16,     DataType::bfloat16,
    DataType::float32, DataType::float64, DataType::float8_e4m3, DataType::float8_e5m2,
};

/// Bytes per element; 0 for a value outside the enumeration.
constexpr std::size_t size_of(DataType t) noexcept {
  switch (t) {
    case DataType::int8: case DataType::uint8: case DataType::float8_e4m3: case DataType::float8_e5m2: return 1;
    case DataType::float16: case DataType::bfloat16: return 2;
    case DataType::int32: case DataType::uint32: case DataType::float32: return 4;
    case DataType::int64: case DataType::uint64: case DataType::float64: return 8;
  }
  return 0;
}

/// The canonical name ("int8", ..., "float16", "bfloat16", "float32", "float64", "float8_e4m3",
/// "float8_e5m2"); "unknown" for a value outside the enumeration.
constexpr std::string_view to_string(DataType t) noexcept {
  switch (t) {
    case DataType::int8: return "int8";
    case DataType::uint8: return "uint8";
    case DataType::int32: return "int32";
    case DataType::uint32: return "uint32";
    case DataType::int64: return "int64";
    case DataType::uint64: return "uint64";
    case DataType::float16: return "float16";
    case DataType::bfloat16: return "bfloat16";
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
    case DataType::float8_e4m3: return "float8_e4m3";
    case DataType::float8_e5m2: return "float8_e5m2";
  }
  return "unknown";
}

/// Parses a canonical name, or one of the nccl-tests spellings: "char" (int8), "int" (int32),
/// "uint" (uint32), "half" (float16), "bf16" (bfloat16), "float" (float32), "double" (float64),
/// "f8e4m3" and "f8e5m2"; or torch's "float8_e4m3fn". Case-sensitive; nullopt for anything else.
constexpr std::optional<DataType> parse_data_type(std::string_view s) noexcept {
  for (DataType t : kAllDataTypes) {
    if (s == to_string(t)) return t;
  }
  if (s == "char") return DataType::int8;
  if (s == "int") return DataType::int32;
  if (s == "uint") return DataType::uint32;
  if (s == "half") return DataType::float16;
  if (s == "bf16") return DataType::bfloat16;
  if (s == "float") return DataType::float32;
  if (s == "double") return DataType::float64;
  if (s == "f8e4m3" || s == "float8_e4m3fn") return DataType::float8_e4m3;
  if (s == "f8e5m2") return DataType::float8_e5m2;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// ReduceOp
// ---------------------------------------------------------------------------------------------

/// Reduction operators. avg is sum followed by division by the number of ranks. band, bor and
/// bxor (bitwise and, or, exclusive or) apply to the integer types only (is_valid_op).
/// premul_sum (NCCL's ncclRedOpCreatePreMulSum): each rank's input multiplied by the call's scalar
/// (Call::scalar: one element of the call's dtype, which each rank gives for itself), rounded once,
/// then summed; floating-point types only. It needs its scalar, so it is in neither list below,
/// and only the calls that take a chorus::Call carry it (Communicator::start, persistent).
enum class ReduceOp { sum, prod, min, max, avg, band, bor, bxor, premul_sum };

/// The arithmetic operators, valid for every DataType.
inline constexpr std::array<ReduceOp, 5> kAllReduceOps = {
    ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg,
};

/// The bitwise operators, valid for the integer DataTypes only.
inline constexpr std::array<ReduceOp, 3> kBitwiseReduceOps = {ReduceOp::band, ReduceOp::bor, ReduceOp::bxor};

constexpr bool is_bitwise(ReduceOp op) noexcept {
  return op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor;
}

/// "sum", "prod", "min", "max", "avg"; "unknown" for a value outside the enumeration.
constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
    case ReduceOp::band: return "band";
    case ReduceOp::bor: return "bor";
    case ReduceOp::bxor: return "bxor";
    case ReduceOp::premul_sum: return "premul_sum";
  }
  return "unknown";
}

/// Parses the names to_string gives (case-sensitive); nullopt for anything else.
constexpr std::optional<ReduceOp> parse_reduce_op(std::string_view s) noexcept {
  for (ReduceOp op : kAllReduceOps) {
    if (s == to_string(op)) return op;
  }
  for (ReduceOp op : kBitwiseReduceOps) {
    if (s == to_string(op)) return op;
  }
  if (s == to_string(ReduceOp::premul_sum)) return ReduceOp::premul_sum;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Traits: C++ element type <-> DataType
// ---------------------------------------------------------------------------------------------

namespace detail {
template <class T>
inline constexpr bool kIsElement =
    std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t> ||
    std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float> ||
    std::is_same_v<T, double> || std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;
}  // namespace detail

/// True for exactly the twelve element types (unqualified): std::int8_t, std::uint8_t, std::int32_t,
/// std::uint32_t, std::int64_t, std::uint64_t, float16, bfloat16, float, double, float8_e4m3,
/// float8_e5m2. Note that `char`
/// and (where int64_t is `long`) `long long` are distinct types and not elements.
template <class T>
concept Element = detail::kIsElement<T>;

namespace detail {
template <Element T>
consteval DataType data_type_of_impl() {
  if constexpr (std::is_same_v<T, std::int8_t>) return DataType::int8;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DataType::uint8;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DataType::int32;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return DataType::uint32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DataType::int64;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return DataType::uint64;
  else if constexpr (std::is_same_v<T, float16>) return DataType::float16;
  else if constexpr (std::is_same_v<T, bfloat16>) return DataType::bfloat16;
  else if constexpr (std::is_same_v<T, float>) return DataType::float32;
  else if constexpr (std::is_same_v<T, double>) return DataType::float64;
  else if constexpr (std::is_same_v<T, float8_e4m3>) return DataType::float8_e4m3;
  else return DataType::float8_e5m2;
}

template <DataType D> struct ElementOf;
template <> struct ElementOf<DataType::int8> { using type = std::int8_t; };
template <> struct ElementOf<DataType::uint8> { using type = std::uint8_t; };
template <> struct ElementOf<DataType::int32> { using type = std::int32_t; };
template <> struct ElementOf<DataType::uint32> { using type = std::uint32_t; };
template <> struct ElementOf<DataType::int64> { using type = std::int64_t; };
template <> struct ElementOf<DataType::uint64> { using type = std::uint64_t; };
template <> struct ElementOf<DataType::float16> { using type = float16; };
template <> struct ElementOf<DataType::bfloat16> { using type = bfloat16; };
template <> struct ElementOf<DataType::float32> { using type = float; };
template <> struct ElementOf<DataType::float64> { using type = double; };
template <> struct ElementOf<DataType::float8_e4m3> { using type = float8_e4m3; };
template <> struct ElementOf<DataType::float8_e5m2> { using type = float8_e5m2; };
}  // namespace detail

/// The DataType of an element type: `data_type_of<float> == DataType::float32`.
template <Element T>
inline constexpr DataType data_type_of = detail::data_type_of_impl<T>();

/// The element type of a DataType: `element_t<DataType::bfloat16>` is `bfloat16`.
template <DataType D>
using element_t = typename detail::ElementOf<D>::type;

/// Runtime-to-compile-time dispatch: calls `f(std::type_identity<T>{})` with T = element_t<t> and
/// returns its result (every instantiation must return the same type). Throws
/// Error(invalid_argument) for a value outside the enumeration.
///
/// ```cpp
/// std::size_t n = chorus::dispatch(dt, []<class T>(std::type_identity<T>) { return sizeof(T); });
/// ```
template <class F>
constexpr decltype(auto) dispatch(DataType t, F&& f) {
  switch (t) {
    case DataType::int8: return static_cast<F&&>(f)(std::type_identity<std::int8_t>{});
    case DataType::uint8: return static_cast<F&&>(f)(std::type_identity<std::uint8_t>{});
    case DataType::int32: return static_cast<F&&>(f)(std::type_identity<std::int32_t>{});
    case DataType::uint32: return static_cast<F&&>(f)(std::type_identity<std::uint32_t>{});
    case DataType::int64: return static_cast<F&&>(f)(std::type_identity<std::int64_t>{});
    case DataType::uint64: return static_cast<F&&>(f)(std::type_identity<std::uint64_t>{});
    case DataType::float16: return static_cast<F&&>(f)(std::type_identity<float16>{});
    case DataType::bfloat16: return static_cast<F&&>(f)(std::type_identity<bfloat16>{});
    case DataType::float32: return static_cast<F&&>(f)(std::type_identity<float>{});
    case DataType::float64: return static_cast<F&&>(f)(std::type_identity<double>{});
    case DataType::float8_e4m3: return static_cast<F&&>(f)(std::type_identity<float8_e4m3>{});
    case DataType::float8_e5m2: return static_cast<F&&>(f)(std::type_identity<float8_e5m2>{});
  }
  throw Error(ErrorCode::invalid_argument,
              "DataType value " + std::to_string(static_cast<int>(t)) + " is not a valid DataType");
}

/// Whether `dt` is one of the floating-point types (float16, bfloat16, float32, float64 and the
/// two fp8 types).
constexpr bool is_floating(DataType dt) noexcept {
  switch (dt) {
    case DataType::float16: case DataType::bfloat16: case DataType::float32: case DataType::float64:
    case DataType::float8_e4m3: case DataType::float8_e5m2: return true;
    default: return false;
  }
}

/// Whether `op` applies to elements of type `dt`: the arithmetic operators to every type, the
/// bitwise ones to the integer types (int8 ... uint64) only, premul_sum to the floating-point
/// types (is_floating) only.
constexpr bool is_valid_op(DataType dt, ReduceOp op) noexcept {
  if (op == ReduceOp::premul_sum) return is_floating(dt);
  if (!is_bitwise(op)) return to_string(op) != "unknown";
  switch (dt) {
    case DataType::int8: case DataType::uint8: case DataType::int32: case DataType::uint32:
    case DataType::int64: case DataType::uint64: return true;
    default: return false;
  }
}

}  // namespace chorus
