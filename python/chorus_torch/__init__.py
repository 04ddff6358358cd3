# SPDX-License-Identifier: BSD-3-Clause
"""chorus as a torch.distributed backend.

    import chorus_torch                      # registers the backend "chorus"
    dist.init_process_group("chorus", init_method=..., rank=..., world_size=...)

The default process group gets a chorus communicator, which meets its peers through the c10d
store torch hands the backend, so ``env://``, ``tcp://``, ``file://`` and torchrun all work. A
``new_group`` of chorus when the default group is chorus's is a subset of its communicator
(``Communicator::subset``): it shares the default group's links, so it opens no connection; its
members learn each other's ranks in the default group through the group's store. Shared links
carry the default group's timeout: a ``new_group(timeout=...)`` shorter than it gets a rendezvous
and links of its own, and a longer one (``new_group``'s default, 30 minutes, against a shorter
``init_process_group`` timeout) is bounded by the default group's. Shared links are aborted
together: a failure in one group sharing them (a timeout, a mismatch, a dead peer) fails the
others too. ``CHORUS_TORCH_NEW_GROUP=own`` gives every new group links of its own (a failure then
stays in its group). CPU tensors of dtype float32, float64, float16, bfloat16, int8,
uint8, int32, int64 and bool.
"""

import os

import torch.distributed as dist

from . import _C
from ._version import __version__  # written by the build from include/chorus/version.hpp

BACKEND = "chorus"


def _default_chorus_group():
    """The default process group when it is chorus's (None while it is being made, or another's)."""
    if not dist.is_initialized():
        return None
    pg = dist.distributed_c10d._get_default_group()
    return pg if dist.get_backend(pg) == BACKEND else None


def _new_group_links():
    """CHORUS_TORCH_NEW_GROUP: "shared" (the default: a new_group shares the default group's links)
    or "own" (a rendezvous and links of its own, so that a failure in it leaves the other groups be)."""
    v = os.environ.get("CHORUS_TORCH_NEW_GROUP", "shared")
    if v not in ("shared", "own"):
        raise ValueError("CHORUS_TORCH_NEW_GROUP=%r: not 'shared' or 'own'" % v)
    return v


def _create(store, rank, size, timeout):
    parent = _default_chorus_group()
    # Shared links carry the default group's timeout: a group asking for a shorter one gets its own.
    if parent is None or _new_group_links() == "own" or timeout < _C.timeout_of(parent):
        return _C.create(store, rank, size, timeout)
    # new_group: its members (only they get here) tell each other their ranks in the default group
    # through the group's own (prefixed) store, then make the subset in group order.
    store.set("chorus/default_rank/%d" % rank, str(parent.rank()))
    ranks = [int(store.get("chorus/default_rank/%d" % r)) for r in range(size)]
    return _C.create_subset(parent, ranks, rank, size)


if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    dist.Backend.register_backend(BACKEND, _create)

__all__ = ["BACKEND", "__version__"]
