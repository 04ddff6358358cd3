// SPDX-License-Identifier: BSD-3-Clause
// The one instantiation of each communicator the tests use (see communicators.hpp).
#include "support/communicators.hpp"

template class chorus::Communicator<chorus::inproc::Transport>;
template class chorus::Communicator<chorus::tcp::Transport>;
template class chorus::Communicator<chorus::shm::Transport>;
template class chorus::Communicator<chorus::hybrid::Transport>;
