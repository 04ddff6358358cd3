// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The one header that includes Boost.Asio: the parts chorus uses, not the <boost/asio.hpp>
/// umbrella, which costs every translation unit some 700 more headers to parse. <utility> must
/// come first: Boost 1.74's awaitable.hpp uses std::exchange without including it (breaks g++ 12
/// in C++20 mode).

#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/socket_base.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace chorus::detail {
namespace asio = boost::asio;
using asio_tcp = boost::asio::ip::tcp;
}  // namespace chorus::detail
