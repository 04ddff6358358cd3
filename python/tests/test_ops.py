# SPDX-License-Identifier: BSD-3-Clause
"""Every c10d operation on the chorus backend at world sizes 2, 3 and 4, against a Python
reference and against gloo (op_checks.py). One group of processes per world size runs all the
checks; each category is reported as its own test."""

import pytest

import harness
import op_checks

WORLDS = [2, 3, 4]
CATEGORIES = ["all_reduce_" + op for op in op_checks.OPS] + [
    "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
    "all_to_all_single", "all_to_all", "send_recv", "barrier", "subgroups", "async", "errors",
]
# Categories whose every call gloo also runs (on this torch): at least one comparison each.
GLOO_COMPARED = ["all_reduce_SUM", "all_reduce_MIN", "broadcast", "reduce", "all_gather", "gather", "scatter",
                 "all_to_all_single"]

_runs = {}


def results(world, tmp_path_factory):
    if world not in _runs:
        try:
            _runs[world] = harness.run(tmp_path_factory.mktemp("ops%d" % world), world, "op_checks:run_all")
        except AssertionError as e:
            _runs[world] = e
    if isinstance(_runs[world], AssertionError):
        raise _runs[world]
    return _runs[world]


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("world", WORLDS)
def test_category(world, category, tmp_path_factory):
    res = results(world, tmp_path_factory)
    failures = [m for r in sorted(res) for m in res[r]["failures"].get(category, [])]
    assert not failures, "\n".join(failures)
    checks = sum(res[r]["checks"].get(category, 0) for r in res)
    assert checks > 0, "no checks ran for %s" % category
    if category in GLOO_COMPARED:
        assert sum(res[r]["gloo"].get(category, 0) for r in res) > 0, "never compared with gloo"
