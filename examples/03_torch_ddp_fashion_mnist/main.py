# SPDX-License-Identifier: BSD-3-Clause
"""DistributedDataParallel on Fashion-MNIST (Debian's dataset-fashion-mnist), with
DistributedSampler: an MLP 784-256-128-10 (the one in the dataset's README, 0.883 test accuracy)
trained with SGD; per epoch rank 0 prints the training images/s of the whole group and the test
accuracy.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/03_torch_ddp_fashion_mnist/main.py \\
        --nprocs 2 --epochs 3
    PYTHONPATH=build/release/python /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \\
        --nproc_per_node 2 examples/03_torch_ddp_fashion_mnist/main.py --backend gloo

--json PATH writes rank 0's per-epoch figures (bench/torch/compare.py uses it).
"""

import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from chorus_torch.launch import launch

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(name):
    """An IDX file (gzip): uint8 images (n, 784) scaled to [0, 1], or labels (n,)."""
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if dims == 1:
        return torch.from_numpy(data.astype(np.int64))
    return torch.from_numpy(data.reshape(shape[0], -1).astype(np.float32) / 255.0)


def main(rank, world, args):
    torch.set_num_threads(args.threads)
    train = TensorDataset(read_idx("train-images-idx3-ubyte.gz"), read_idx("train-labels-idx1-ubyte.gz"))
    test_x, test_y = read_idx("t10k-images-idx3-ubyte.gz"), read_idx("t10k-labels-idx1-ubyte.gz")
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epochs = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        dist.barrier()
        t0 = time.perf_counter()
        seen = 0
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            seen += len(y)
        elapsed = time.perf_counter() - t0
        total = torch.tensor([float(seen), elapsed])
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        images_per_s = float(total[0]) / (float(total[1]) / world)  # all images / mean epoch time
        model.eval()
        with torch.no_grad():
            accuracy = float((model.module(test_x).argmax(1) == test_y).float().mean())
        epochs.append({"epoch": epoch + 1, "images_per_s": images_per_s, "test_accuracy": accuracy})
        if rank == 0:
            print(f"[{args.backend}] epoch {epoch + 1}: {images_per_s:8.0f} images/s over {world} ranks, "
                  f"test accuracy {accuracy:.4f}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "world": world, "batch": args.batch, "epochs": epochs}, f)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--nprocs", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--json", help="write rank 0's per-epoch figures here")
    a = p.parse_args()
    launch(main, a, nprocs=a.nprocs, backend=a.backend)
