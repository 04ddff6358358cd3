# SPDX-License-Identifier: BSD-3-Clause
"""The xdist_group marker (harness.shared) is pytest-xdist's; registered here too, so that a run
without pytest-xdist (ctest's label torch, one file per test) knows it."""


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that one pytest-xdist worker runs (--dist loadgroup)")
