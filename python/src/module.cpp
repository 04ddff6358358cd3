// SPDX-License-Identifier: BSD-3-Clause
// The Python module chorus_torch._C: creates ProcessGroupChorus objects for torch.distributed.
// chorus_torch/__init__.py registers `create` as the creator of the backend "chorus".
#include <chrono>
#include <stdexcept>
#include <vector>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "process_group.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "chorus backend for torch.distributed (import chorus_torch to register it)";
  // torch.distributed's pybind classes (Store, ProcessGroup) must be registered before ours use
  // them: the store argument converts to c10d::Store, the result to ProcessGroup.
  py::module::import("torch.distributed");
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)
          -> c10::intrusive_ptr<c10d::ProcessGroup> {
        return c10::make_intrusive<chorus_torch::ProcessGroupChorus>(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "A chorus process group over a communicator that meets its peers through `store`.");
  auto chorus_group = [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
    auto* p = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
    if (p == nullptr) throw std::invalid_argument("chorus_torch: the parent group is not a chorus group");
    return p;
  };
  m.def(
      "timeout_of",
      [chorus_group](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) { return chorus_group(pg)->timeout(); },
      py::arg("group"), "The timeout of a chorus group's communicator (what a subset of it keeps).");
  m.def(
      "create_subset",
      [chorus_group](const c10::intrusive_ptr<c10d::ProcessGroup>& parent, const std::vector<int>& ranks, int rank,
                     int size) -> c10::intrusive_ptr<c10d::ProcessGroup> {
        return c10::make_intrusive<chorus_torch::ProcessGroupChorus>(*chorus_group(parent), ranks, rank, size);
      },
      py::arg("parent"), py::arg("ranks"), py::arg("rank"), py::arg("size"), py::call_guard<py::gil_scoped_release>(),
      "A chorus process group of `ranks` (the parent's ranks, in group order) over the parent's links and with "
      "its timeout: chorus::Communicator::subset, no new connection.");
}
