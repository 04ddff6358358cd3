# SPDX-License-Identifier: BSD-3-Clause
"""chorus as a torch.distributed backend.

    import chorus_torch                      # registers the backend "chorus"
    dist.init_process_group("chorus", init_method=..., rank=..., world_size=...)

Every process group (the default one and each ``new_group``) gets its own chorus communicator,
which meets its peers through the c10d store torch hands the backend, so ``env://``, ``tcp://``,
``file://`` and torchrun all work. CPU tensors of dtype float32, float64, float16, bfloat16, int8,
uint8, int32, int64 and bool.
"""

import torch.distributed as dist

from . import _C
from ._version import __version__  # written by the build from include/chorus/version.hpp

BACKEND = "chorus"


def _create(store, rank, size, timeout):
    return _C.create(store, rank, size, timeout)


if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    dist.Backend.register_backend(BACKEND, _create)

__all__ = ["BACKEND", "__version__"]
