#pragma once
/// The one header that includes Boost.Asio. <utility> must come first: Boost 1.74's
/// awaitable.hpp uses std::exchange without including it (breaks g++ 12 in C++20 mode).

#include <utility>

#include <boost/asio.hpp>

namespace chorus::detail {
namespace asio = boost::asio;
using asio_tcp = boost::asio::ip::tcp;
}  // namespace chorus::detail
