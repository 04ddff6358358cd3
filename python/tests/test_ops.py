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
    "all_gather_uneven", "reduce_scatter_uneven", "premul_sum", "all_to_all_single", "all_to_all", "send_recv",
    "barrier", "subgroups", "async", "errors",
]
# Categories whose every call gloo also runs (on this torch): at least one comparison each.
GLOO_COMPARED = ["all_reduce_SUM", "all_reduce_MIN", "broadcast", "reduce", "all_gather", "gather", "scatter",
                 "all_to_all_single"]

_runs = {}


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("world", [harness.shared("ops-%d" % w, w) for w in WORLDS])
def test_category(world, category, tmp_path_factory):
    res = harness.run_once(_runs, world, tmp_path_factory, world, "op_checks:run_all")
    harness.check_category(res, category)
    if category in GLOO_COMPARED:
        assert sum(res[r]["gloo"].get(category, 0) for r in res) > 0, "never compared with gloo"
