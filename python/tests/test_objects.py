# SPDX-License-Identifier: BSD-3-Clause
"""torch.distributed's object collectives and batch_isend_irecv on the chorus backend, at world
sizes 2 and 3. One group of processes per world size runs every check (object_checks.py); each
category is reported as its own test.

Object collectives pickle each object into a uint8 tensor and move its size (int64) and its bytes
with chorus's all_gather, broadcast, scatter and gather; the objects here differ in pickled size
from rank to rank (about 30 B to 200 KiB), so the padding and trimming torch does around them is
exercised, and each result is compared with the objects every rank made. batch_isend_irecv posts
a list of isend/irecv and waits for them all: a ring exchange and an exchange between every pair of
ranks, several tensors per peer, mixed dtypes, odd element counts."""

import pytest

import harness

WORLDS = [2, 3]
CATEGORIES = [
    "all_gather_object", "broadcast_object_list", "scatter_object_list", "gather_object", "subgroup_objects",
    "batch_isend_irecv_ring", "batch_isend_irecv_all_pairs",
]

_runs = {}


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("world", [harness.shared("objects-%d" % w, w) for w in WORLDS])
def test_category(world, category, tmp_path_factory):
    harness.check_category(harness.run_once(_runs, world, tmp_path_factory, world, "object_checks:run_all"), category)
