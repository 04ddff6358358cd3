// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The ranges the typed calls take (Communicator's send/recv, its collectives and their
/// persistent forms): contiguous, sized, of trivially copyable elements.

#include <ranges>
#include <type_traits>

#include "chorus/core/types.hpp"

namespace chorus {

/// A contiguous range of trivially copyable elements: std::vector, std::array, std::span, ...
template <class R>
concept ByteRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                    std::is_trivially_copyable_v<std::ranges::range_value_t<R>>;

template <class R>
concept WritableByteRange = ByteRange<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// A contiguous range of one of the element types (int8 ... float64, float16, bfloat16, the fp8 types).
template <class R>
concept ElementRange = ByteRange<R> && Element<std::remove_cv_t<std::ranges::range_value_t<R>>>;

template <class R>
concept WritableElementRange = ElementRange<R> && WritableByteRange<R>;

}  // namespace chorus
