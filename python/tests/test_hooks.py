# SPDX-License-Identifier: BSD-3-Clause
"""DDP communication hooks on the chorus backend, against gloo with the same hook: torch 1.13's
built-in CPU hooks default_hooks.allreduce_hook, fp16_compress_hook, bf16_compress_hook and
powerSGD_hook.powerSGD_hook (PowerSGDState: random_seed 0, matrix_approximation_rank 1,
start_powerSGD_iter 2, so steps 3 to 6 are compressed). For each hook a small model is trained
STEPS steps by DDP on the chorus default group and, in the same processes from the same initial
weights and data, by DDP on a gloo group with the same hook: after every step the parameters must
be identical on every rank and within a bound of the gloo run.

What torch 1.13 (CPU build) allows, and so what runs here:
- bf16_compress_hook: DDP.register_comm_hook refuses it by its name on every backend ("BF16 all
  reduce communication hook required CUDA 11+ and NCCL 2.10+."; checked for chorus and gloo), and
  gloo cannot all_reduce bfloat16 ("Invalid scalar type"). Its body runs on chorus under another
  name (bf16_hook); the gloo side runs bf16_reference_hook, which sums in float32 and rounds once.
- batched_powerSGD_hook fails on every backend at its first compressed step (an assertion in
  _orthogonalize, which 1.13 hands a 2-D matrix): not run.
- The quantization hooks are CUDA-only: not run.

The bound. Each hook casts the bucket (fp16/bf16 divide by the world size first), all-reduces it
with SUM and reads it back; the rest of the step is the same code on the same numbers. At 2 ranks
a SUM is one addition, correctly rounded in the dtype by both backends, so the runs must be
bitwise equal: the bound is 0. At 3 ranks the backends may add in another order, or round each
partial sum (fp16/bf16), so a reduced gradient may differ by about an ulp of its dtype, and the
difference accumulates through the steps (momentum). Measured at 3 ranks, largest over 6 steps
and every parameter (the weights move by 0.048): allreduce 0, fp16 1.9e-5, bf16 (against the
float32-sum reference) 1.7e-4; gloo against gloo with the sum taken in reverse rank order
(emulating another order): float32 and PowerSGD 1.5e-8, fp16 1.25e-5. MAX_DIFF_3 is about ten
times those (1e-5 for float32 sums, as test_ddp.py)."""

import faulthandler

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_twins
import harness

STEPS = 6
HOOKS = ["allreduce", "fp16_compress", "bf16_compress", "powerSGD"]
# Largest parameter difference from the gloo run allowed at 3 ranks (see the module's comment).
MAX_DIFF_3 = {"allreduce": 1e-5, "fp16_compress": 2e-4, "bf16_compress": 2e-3, "powerSGD": 1e-5}


def bf16_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """default_hooks.bf16_compress_hook itself, under another name: DDP.register_comm_hook
    refuses the hook by its name unless torch was built with CUDA 11+ and NCCL 2.10+ (see
    bf16_refused), though its body (cast, all_reduce, cast back) runs on any backend."""
    return default_hooks.bf16_compress_hook(state, bucket)


def bf16_reference_hook(group, bucket) -> torch.futures.Future[torch.Tensor]:
    """bf16_compress_hook for gloo, which cannot all_reduce bfloat16 in torch 1.13 ("Invalid
    scalar type"): the same cast and division, the sum taken in float32 and rounded to bfloat16
    once. At 2 ranks that is the correctly rounded bfloat16 sum, as a bfloat16 all_reduce gives
    (the float32 sum of two bfloat16 values is exact, or the smaller is below half an ulp)."""
    compressed = bucket.buffer().to(torch.bfloat16).div_(group.size())
    fut = dist.all_reduce(compressed.float(), group=group, async_op=True).get_future()

    def decompress(fut):
        buffer = bucket.buffer()
        buffer.copy_(fut.value()[0].to(torch.bfloat16))
        return buffer

    return fut.then(decompress)


def hook_and_state(name, group):
    """The hook and its state for a DDP over `group`; a fresh state per model."""
    if name in ("powerSGD", "batched_powerSGD"):
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                            min_compression_rate=2, random_seed=0)
        return getattr(powerSGD_hook, name + "_hook"), state
    if name == "bf16_compress":
        return (bf16_hook if group is None else bf16_reference_hook), group
    return getattr(default_hooks, name + "_hook"), group


def bf16_refused(gloo):
    """What DDP says to bf16_compress_hook on this CPU-only torch, on chorus and on gloo."""
    out = {}
    for name, group in (("chorus", None), ("gloo", gloo)):
        m = DDP(nn.Linear(4, 4), process_group=group)
        try:
            m.register_comm_hook(group, default_hooks.bf16_compress_hook)
            out[name] = "registered"
        except TypeError as e:
            out[name] = str(e)
    return out


def hooks_vs_gloo(rank, world, names, guard_s=None):
    """Trains with each hook in `names`; with guard_s, a rank still running after guard_s seconds
    dumps its stacks and exits (faulthandler), so a deadlock costs seconds, not the harness's
    timeout."""
    if guard_s:
        faulthandler.dump_traceback_later(guard_s, exit=True)
    gloo = dist.new_group(backend="gloo")
    out = {"bf16_refused": bf16_refused(gloo)}
    for name in names:
        def register(ddp, group, name=name):
            hook, state = hook_and_state(name, group)
            ddp.register_comm_hook(state, hook)

        torch.manual_seed(rank)  # different on each rank: DDP's broadcast from rank 0 makes them equal
        # Weights 32x20, 16x32, 4x16: each compresses at rank 1 (PowerSGD), the biases are all-reduced.
        model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
        steps, moved = ddp_twins.train_twins(rank, world, model, gloo, STEPS, register)
        out[name] = {"steps": steps, "moved": moved}
    faulthandler.cancel_dump_traceback_later()
    return out


_runs = {}


def results(world, hook, tmp_path_factory):
    """One group of processes per world size for the hooks but PowerSGD, one for PowerSGD (the
    group's timeout 10 s; the guard stops a deadlocked rank after 10 s)."""
    if hook == "powerSGD":
        return harness.run_once(_runs, _group(world, hook), tmp_path_factory, world, "test_hooks:hooks_vs_gloo",
                                ("powerSGD",), 10, timeout=60, pg_timeout=10)
    return harness.run_once(_runs, _group(world, hook), tmp_path_factory, world, "test_hooks:hooks_vs_gloo",
                            tuple(h for h in HOOKS if h != "powerSGD"))


def _group(world, hook):
    """Which group of processes results() runs a hook in: its run_once key, and its tests' xdist
    group (harness.shared)."""
    return "hooks-%d%s" % (world, "-powerSGD" if hook == "powerSGD" else "")


@pytest.mark.xdist_group(_group(2, "allreduce"))
def test_bf16_hook_refused_by_name(tmp_path_factory):
    """torch 1.13 without CUDA refuses bf16_compress_hook by name for every backend; chorus gets
    the same answer as gloo (test_hook_matches_gloo runs the hook's body through bf16_hook)."""
    for r, out in results(2, "allreduce", tmp_path_factory).items():
        out = out["bf16_refused"]
        if torch.version.cuda is None and torch.version.hip is None:
            refusal = "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+."
            assert out["chorus"] == out["gloo"] == refusal, out
        else:
            assert out["chorus"] == out["gloo"], out


@pytest.mark.parametrize("world,hook", [harness.shared(_group(w, h), w, h, id="%d-%s" % (w, h))
                                        for w in [2, 3] for h in HOOKS])
def test_hook_matches_gloo(world, hook, tmp_path_factory):
    res = results(world, hook, tmp_path_factory)
    bound = 0.0 if world == 2 else MAX_DIFF_3[hook]
    for r in sorted(res):
        steps = res[r][hook]["steps"]
        assert len(steps) == STEPS
        # Training moved the weights by far more than the bound: agreement is not trivial.
        assert res[r][hook]["moved"] > 10 * max(bound, 1e-3), res[r][hook]
        for i, s in enumerate(steps):
            assert s["identical"], "rank %d step %d: parameters differ between ranks" % (r, i)
            assert s["max_diff_vs_gloo"] <= bound, "%s, %d ranks, rank %d step %d: %.3g from gloo (bound %.3g)" % (
                hook, world, r, i, s["max_diff_vs_gloo"], bound)
