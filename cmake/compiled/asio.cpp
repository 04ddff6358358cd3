// SPDX-License-Identifier: BSD-3-Clause
// chorus::compiled (CMakeLists.txt): Boost.Asio's out-of-line code (BOOST_ASIO_SEPARATE_COMPILATION).
#include <boost/asio/impl/src.hpp>
