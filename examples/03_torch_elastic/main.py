# SPDX-License-Identifier: BSD-3-Clause
"""Training that survives a killed worker under torchrun's elastic restarts, on the chorus backend.

The pattern of torchrun's elastic examples: every worker loads the last checkpoint when there is
one and goes on from the epoch after it; rank 0 saves a checkpoint at the end of every epoch
(written to a temporary file, then os.replace, so a worker killed meanwhile never leaves half a
file). When a worker dies, torchrun (--max_restarts N) stops the others and starts the whole group
again (TORCHELASTIC_RESTART_COUNT goes up by one); the new group meets again through
init_process_group("chorus") and resumes from the checkpoint.

The model is an MLP 784-256-128-10 trained with DDP and SGD on Debian's Fashion-MNIST
(dataset-fashion-mnist), or, without it, on synthetic data from a fixed seed (--data synthetic).
--kill-rank R --kill-epoch E [--kill-step S] makes rank R SIGKILL itself at step S of epoch E
(epochs count from 1), on the first attempt only (TORCHELASTIC_RESTART_COUNT 0), so that the
restarted group goes on and the job finishes:

    PYTHONPATH=build/release/python /usr/bin/torchrun --redirects 1 --tee 1 --nnodes 1 \\
        --nproc_per_node 2 --max_restarts 3 --rdzv_backend c10d --rdzv_endpoint localhost:0 \\
        examples/03_torch_elastic/main.py --checkpoint-dir /tmp/ckpt --epochs 3 \\
        --kill-rank 1 --kill-epoch 2

Run under torchrun only (it needs RANK, WORLD_SIZE and the rendezvous torchrun sets up). Rank 0
prints the attempt, where it starts (fresh, or the epoch it resumed after), one line per epoch and
a final line. The checkpoint folder must be shared by the ranks (one host, or a shared file system).
"""

import argparse
import datetime
import importlib.util
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import chorus_torch  # noqa: F401  (registers the backend "chorus")

DATA = "/usr/share/datasets/fashion-mnist"
CHECKPOINT = "checkpoint.pt"


def fashion_mnist_reader():
    """read_idx of examples/03_torch_ddp_fashion_mnist (the same IDX reader, not a copy of it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "03_torch_ddp_fashion_mnist", "main.py")
    spec = importlib.util.spec_from_file_location("ddp_fashion_mnist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_idx


def synthetic(n, seed):
    """n noisy points around 10 class centres in 784 dimensions (the centres from seed 0)."""
    centres = torch.randn(10, 784, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    return 0.15 * centres[y] + torch.randn(n, 784, generator=g), y


def load_data(kind):
    if kind == "auto":
        kind = "fashion-mnist" if os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")) else "synthetic"
    if kind == "fashion-mnist":
        read_idx = fashion_mnist_reader()
        train = (read_idx("train-images-idx3-ubyte.gz"), read_idx("train-labels-idx1-ubyte.gz"))
        test = (read_idx("t10k-images-idx3-ubyte.gz"), read_idx("t10k-labels-idx1-ubyte.gz"))
    else:
        train, test = synthetic(60000, 1), synthetic(10000, 2)
    return kind, train, test


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def save_checkpoint(path, state):
    """Atomically: a worker killed while rank 0 writes leaves the previous checkpoint whole."""
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(args):
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group(args.backend, init_method="env://", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    if rank == 0:
        print(f"elastic: attempt {attempt} (TORCHELASTIC_RESTART_COUNT={attempt}), {world} ranks, "
              f"backend {args.backend}, group formed at {now()}", flush=True)

    kind, (train_x, train_y), (test_x, test_y) = load_data(args.data)
    if args.train_images:
        train_x, train_y = train_x[:args.train_images], train_y[:args.train_images]
    train = TensorDataset(train_x, train_y)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    path = os.path.join(args.checkpoint_dir, CHECKPOINT)
    history = []  # per finished epoch: (mean training loss, test accuracy)
    if os.path.exists(path):
        # Every rank reads the same file, so the model and the optimizer's momentum are the same on
        # every rank (DDP broadcasts rank 0's parameters at construction as well).
        state = torch.load(path, map_location="cpu")
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        history = state["history"]
        if rank == 0:
            print(f"elastic: resumed from {path}: epochs 1-{len(history)} done "
                  f"(last loss {history[-1][0]:.4f}, test accuracy {history[-1][1]:.4f}), "
                  f"going on at epoch {len(history) + 1}/{args.epochs}", flush=True)
    elif rank == 0:
        print(f"elastic: no checkpoint in {args.checkpoint_dir}: starting at epoch 1/{args.epochs} "
              f"({kind}, {len(train)} training images)", flush=True)
    model = DDP(net)

    for epoch in range(len(history) + 1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        loss_sum, steps = 0.0, 0
        for step, (x, y) in enumerate(loader):
            if attempt == 0 and rank == args.kill_rank and epoch == args.kill_epoch and step == args.kill_step:
                print(f"elastic: rank {rank} kills itself (SIGKILL) at epoch {epoch} step {step} "
                      f"on attempt {attempt}, at {now()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss_sum += float(loss)
            steps += 1
        mean = torch.tensor([loss_sum / max(steps, 1)])
        dist.all_reduce(mean)
        model.eval()
        with torch.no_grad():
            accuracy = float((net(test_x).argmax(1) == test_y).float().mean())
        history.append((float(mean) / world, accuracy))
        if rank == 0:
            save_checkpoint(path, {"model": net.state_dict(), "optimizer": opt.state_dict(), "history": history})
            print(f"elastic: epoch {epoch}/{args.epochs}: loss {history[-1][0]:.4f}, test accuracy {accuracy:.4f}, "
                  f"{time.perf_counter() - t0:.1f} s; checkpoint saved", flush=True)
        # Nobody starts the next epoch before the checkpoint of this one is on disk: a worker that
        # dies in the next epoch is resumed from this one.
        dist.barrier()

    if rank == 0:
        print(f"elastic: finished {args.epochs} epochs on attempt {attempt}: loss {history[-1][0]:.4f} "
              f"(epoch 1: {history[0][0]:.4f}), test accuracy {history[-1][1]:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["chorus", "gloo"], default="chorus")
    p.add_argument("--checkpoint-dir", required=True, help="where rank 0 saves and every rank loads the checkpoint")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", choices=["auto", "fashion-mnist", "synthetic"], default="auto",
                   help="auto: Fashion-MNIST where Debian's dataset-fashion-mnist is installed, else synthetic")
    p.add_argument("--train-images", type=int, default=0, help="train on the first N images only (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--timeout", type=float, default=60, help="the process group's timeout, seconds")
    p.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself (first attempt only)")
    p.add_argument("--kill-epoch", type=int, default=0, help="... in this epoch (from 1)")
    p.add_argument("--kill-step", type=int, default=5, help="... at this step of the epoch (from 0)")
    a = p.parse_args()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("03_torch_elastic: run it under torchrun (RANK and WORLD_SIZE are not set)")
    os.makedirs(a.checkpoint_dir, exist_ok=True)
    main(a)
