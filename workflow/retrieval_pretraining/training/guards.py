"""Checks that stop a step before it does harm, each with a message naming the fix."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN/inf; the message names the step and the items of the batch."""


class NonFiniteGradientError(NonFiniteLossError):
    """The losses were finite but the gradient norm is NaN/inf (raised before the optimiser
    step)."""


def _ids(item_ids: Any) -> list:
    return item_ids.tolist() if hasattr(item_ids, "tolist") else list(item_ids)


def check_finite_step(read: Any, keys: list[str], *, step: int, item_ids: list[list]) -> None:
    """Raise NonFiniteLossError naming the step and the items of the first micro-batch with a
    NaN/inf value in a step's host_read (`keys`: the values' names), else check its gradient norm
    (check_finite_grad_norm, the whole step's items). After the fact: the caller has kept the
    optimiser from applying such a step (step_if_finite)."""
    for ids, values in zip(item_ids, read.terms):
        for name, value in zip(keys, values):
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"loss term '{name}' is {value} at step {step} for batch items {ids}; lower "
                    "the learning rate, check those inputs, or use precision fp32"
                )
    # The means over processes: a value another process found non-finite stops this one too.
    for name, value in zip(keys, read.means):
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"loss term '{name}' is {value} at step {step} on another process (its log names "
                "the batch items); lower the learning rate, or use precision fp32"
            )
    if read.grad_norm is not None:
        check_finite_grad_norm(read.grad_norm, step=step, item_ids=[i for ids in item_ids for i in ids])


def check_finite_grad_norm(norm: torch.Tensor | float, *, step: int, item_ids: Any) -> None:
    """Raise NonFiniteGradientError naming the step and items if `norm` (clip_grad_norm_'s result)
    is NaN/inf: clipping would scale every gradient by NaN and the step would ruin the weights."""
    value = float(norm)
    if not math.isfinite(value):
        raise NonFiniteGradientError(
            f"gradient norm is {value} at step {step} for batch items {_ids(item_ids)} (the losses "
            "were finite); lower the learning rate, check those inputs, or use precision fp32"
        )


def step_if_finite(optimizer: torch.optim.Optimizer, *values: torch.Tensor,
                   distributed: bool = False) -> None:
    """optimizer.step(), skipped on the device where any of `values` (the step's losses, its
    gradient norm) is NaN/inf, without reading them on the host: the trainers read a step's values
    once, after it (host_read), and raise then (check_finite_step) with the weights untouched.
    build_optimizer's fused AdamW honours `found_inf` as under a GradScaler: no update, and its
    step count stays. `distributed`: every process skips if any one would (one all-reduce of the
    flag on the device): a NaN loss on one process must not leave the others updating."""
    finite = torch.stack([torch.isfinite(value.detach()).all() for value in values]).all()
    found_inf = (~finite).float()
    if distributed:
        torch.distributed.all_reduce(found_inf, op=torch.distributed.ReduceOp.MAX)
    optimizer.found_inf = found_inf
    optimizer.step()


@contextlib.contextmanager
def oom_guard(micro_batch_size: int, hint: str = "micro_batch_size", *,
              fix: str | None = None) -> Iterator[None]:
    """Turn an out-of-memory error into a message naming the config change that fixes it: by
    default lowering `hint`, the key that sets the micro-batch, which gradient accumulation
    compensates (pre-training). `fix` replaces that advice where no one key does so (fine-tuning's
    micro-batch is a contrast set: finetune/train.out_of_memory_fix)."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        fix = fix or (
            f"lower '{hint}' (the global batch stays the same: gradient accumulation grows to "
            "compensate), or shorten max_len; either restarts at step 0, the saved state moved "
            "aside, not deleted (training.claim_state)")
        raise RuntimeError(f"out of memory with {hint}={micro_batch_size}: {fix}") from error


def loading_out_of_memory_fix(what: str, device: torch.device, *, keys: str, rules: str) -> str:
    """What an out-of-memory error loading `what` onto `device` before any micro-batch tells the
    user (oom_guard's `fix`), in both trainers: no key that shrinks a micro-batch helps, as the
    weights, their gradients and AdamW's state take the same memory whatever the micro-batch; what
    helps is the GPU (_gpu_fix). `keys`: the trainer's keys that do not help ("finetune key");
    `rules`: its GPU rules in profiles/default/config.yaml."""
    return (f"loading {what} onto {device}, before any micro-batch: the GPU holds the weights, "
            "their gradients and AdamW's state (twice the weights) whatever the micro-batch, so "
            f"no {keys} lowers this. {_gpu_fix(rules)}")


def data_parallel_out_of_memory_fix(device: torch.device, *, keys: str, rules: str) -> str:
    """What an out-of-memory error wrapping the model in DDP (training.data_parallel, several
    processes) tells the user: DDP allocates gradient buffers about the size of the weights beside
    them on every process, whatever the batch, so no batch key helps, nor more GPUs (each holds the
    whole model); what helps is the GPU (_gpu_fix). `keys`, `rules`: as in
    loading_out_of_memory_fix."""
    return (f"wrapping the model in DDP on {device}, before any micro-batch: the weights (with a "
            "resumed state, AdamW's too: twice the weights) and DDP's gradient buffers (about the "
            "size of the weights) do not fit, and every process holds them whatever the batch, so "
            f"no {keys} lowers this, nor do more GPUs. {_gpu_fix(rules)}")


def _gpu_fix(rules: str) -> str:
    # A rule that asks for its GPUs through `gres` (multi-node pre-training: gpu: 0) names the
    # model there: gpu_model qualifies `gpu`, which the Slurm plugin refuses beside `gres`.
    return ("Check that no other process holds its memory (nvidia-smi), or train on a GPU with "
            "more memory (slurm/config.yaml's GPU partitions; one GPU model: gpu_model on "
            f"{rules} in profiles/default/config.yaml, or, where the rule sets gres instead "
            "(multi-node pre-training, gpu: 0), the model in gres, e.g. gpu:a100:8). A saved state "
            "is kept: the same command resumes it")
