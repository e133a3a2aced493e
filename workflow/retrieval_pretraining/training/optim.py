"""One optimiser step: batch arithmetic, AdamW, the learning-rate schedule, precision, seeding."""

from __future__ import annotations

import contextlib
import math
import random

import numpy as np
import torch


def accumulation_steps(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Micro-batches each process accumulates so that one optimiser step sees `global_batch_size`.

    global = micro * world * accumulation must hold exactly; otherwise the fix is named.
    """
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size "
            f"{micro_batch_size} x world size {world_size}; choose a global batch divisible by "
            f"{per_step} or change micro_batch_size"
        )
    return global_batch_size // per_step


def build_optimizer(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW with no weight decay on biases and LayerNorm weights (1-d tensors), fused.

    The fused kernel (CUDA, and CPU since torch 2.4) updates every tensor in one pass; the
    default per-tensor loop is ~10x slower on CPU (117 vs 10 ms a step for a 14M-parameter
    encoder), which is most of a tiny CPU fine-tuning step. Same update to fp32 rounding
    (tests/test_pretrain_training.py compares it with the per-tensor loop).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)


# The decay after the warm-up: linear (COSTA, Tevatron; the default) or cosine (the BoW authors).
LR_SCHEDULES = ("linear", "cosine")


def lr_factor(step: int, *, warmup: int, total: int, shape: str = "linear",
              min_ratio: float = 0.0, hold: int = 0) -> float:
    """The peak lr's multiplier for optimiser step `step` (0-based); pre-training and fine-tuning
    both read it.

    The first `hold` steps (pre-training's head warm-up) run at the peak; the schedule proper
    covers the steps after them, `warmup` steps of it a linear warm-up: (step + 1) / warmup (the
    first step already learns; transformers' warm-up, the BoW authors', spends it at lr 0: one
    step of their 1000 or 4000 apart). Then decay with progress p from 0 (step = warmup) to 1
    (step = total): linear 1 - p, cosine (1 + cos(pi p)) / 2, mapped onto [min_ratio, 1]:
    min_ratio + (1 - min_ratio) x decay, as the BoW authors' scheduler (caskcsg/ir,
    bowdpr/src/bowdpr/scheduler.py) and transformers' cosine_with_min_lr do. Past `total`,
    min_ratio. With the defaults (linear, 0) every step's factor is the float the linear schedule
    computed before the other shapes existed (tests/test_lr_schedule.py).
    """
    if step < hold:
        return 1.0
    step, total = step - hold, total - hold
    if step < warmup:
        return (step + 1) / max(1, warmup)
    if shape == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # the linear schedule's own expression, so that min_ratio 0 gives its very floats
        decay = max(0.0, (total - step) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * decay


def lr_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, hold_steps: int = 0,
    shape: str = "linear", min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """`lr_factor` as a LambdaLR: its state is the step count alone, so a resumed job
    (training.load_state) continues the schedule where it stopped."""
    if shape not in LR_SCHEDULES:
        raise ValueError(f"lr schedule {shape!r}: expected one of {', '.join(LR_SCHEDULES)}")

    def factor(step: int) -> float:
        return lr_factor(step, warmup=warmup_steps, total=total_steps, shape=shape,
                         min_ratio=min_ratio, hold=hold_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast(device: torch.device, precision: str = "auto") -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA ("auto" or "bf16"), plain fp32 otherwise (CPU bf16: slow and noisy)."""
    if device.type == "cuda" and precision in ("auto", "bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses run in fp32 (under bf16 autocast too); float64 inputs (tests) stay float64."""
    return x if x.dtype == torch.float64 else x.float()


def fp32_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T in fp32 (float64 inputs stay float64), also inside a bf16 autocast region: dot
    products of unnormalised vectors reach the hundreds, where bf16 (8 bits of mantissa) tells
    apart only values 1-2 apart, coarser than a positive's margin over its hard negatives."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        return upcast(a) @ upcast(b).T


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_torch(seed: int, *key: int) -> None:
    """Seed torch's generators (CPU, every GPU) from (seed, *key), e.g. (seed, step, micro-batch).

    Called before each micro-batch, it makes dropout a function of which micro-batch is computed,
    not of how many were computed before in this process: a resumed run and a run with another
    number of processes draw the same dropout masks (on the same kind of device).
    """
    words = np.random.SeedSequence([seed, *key]).generate_state(2, np.uint32)
    torch.manual_seed(((int(words[0]) << 32) | int(words[1])) & (2**63 - 1))
