// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of the functions declared CHORUS_DECL (config.hpp): each header includes its own in
/// a header-only program; with CHORUS_SEPARATE_COMPILATION they are compiled once, here, through
/// chorus::compiled (cmake/compiled/communicators.cpp) or the program's chorus/src.hpp.

#include "chorus/bootstrap/impl/local_launch.hpp"
#include "chorus/bootstrap/impl/rendezvous.hpp"
#include "chorus/bootstrap/impl/tcp_store.hpp"
#include "chorus/detail/impl/log.hpp"
#include "chorus/reduce/impl/host.hpp"
