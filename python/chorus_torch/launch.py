# SPDX-License-Identifier: BSD-3-Clause
"""Starting ranks for the examples and the benchmark, the two usual ways.

    from chorus_torch.launch import launch
    launch(main, args, nprocs=2, backend="chorus")   # main(rank, world, args)

Under torchrun (RANK and WORLD_SIZE in the environment) the process is one rank: it joins the
group through env:// and calls main. Otherwise it starts `nprocs` ranks with
torch.multiprocessing.spawn, which meet through a FileStore in a temporary folder (no port).
"""

import datetime
import os
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

from . import BACKEND  # noqa: F401  (importing the package registers the backend)


def _rank_main(rank, world, init_method, backend, timeout_s, main, args):
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        main(rank, world, args)
    finally:
        dist.destroy_process_group()


def launch(main, args, nprocs=2, backend="chorus", timeout_s=300):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", backend, timeout_s, main, args)
        return
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "store")
        mp.spawn(_rank_main, args=(nprocs, init, backend, timeout_s, main, args), nprocs=nprocs)
