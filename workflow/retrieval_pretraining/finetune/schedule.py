"""Fine-tuning's learning-rate schedule: a linear warm-up, then a linear or cosine decay that ends
at `min_lr_ratio` x the peak lr (the BoW authors' recipe: cosine, 0.1, 1000 warm-up steps).

Its own module, not training/optim.py: pre-training imports that file, and an edit there would
rerun every pre-training (code inputs, code_deps.py). With the defaults (linear, 0, the warm-up
from warmup_ratio) the factor is training.linear_schedule's, expression for expression, so the
lr of every step is bit-identical to it (tests/test_finetune_schedule.py).
"""

from __future__ import annotations

import math

import torch

from .settings import FinetuneSettings


def warmup_steps(settings: FinetuneSettings, total_steps: int) -> int:
    """`warmup_steps` when set (the BoW authors' 1000, as transformers' Trainer lets a positive
    warmup_steps win over warmup_ratio); otherwise ceil(warmup_ratio x total_steps), as before."""
    if settings.warmup_steps is not None:
        return settings.warmup_steps
    return math.ceil(settings.warmup_ratio * total_steps)


def lr_factor(step: int, *, warmup: int, total: int, shape: str, min_ratio: float) -> float:
    """The peak lr's multiplier for optimiser step `step` (0-based).

    Warm-up: (step + 1) / warmup, training.linear_schedule's (the first step already learns;
    transformers' warm-up, the BoW authors', spends it at lr 0: one step of their 1000 apart).
    Then decay with progress p from 0 (step = warmup) to 1 (step = total): linear 1 - p, cosine
    (1 + cos(pi p)) / 2, mapped onto [min_ratio, 1]: min_ratio + (1 - min_ratio) x decay, as the
    BoW authors' scheduler (caskcsg/ir, bowdpr/src/bowdpr/scheduler.py) and transformers'
    cosine_with_min_lr do. Past `total`, min_ratio.
    """
    if step < warmup:
        return (step + 1) / max(1, warmup)
    if shape == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # linear_schedule's expression, so that min_ratio 0 gives its very floats
        decay = max(0.0, (total - step) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * decay


def build_schedule(optimizer: torch.optim.Optimizer, settings: FinetuneSettings,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR: its state is the step count alone, so a resumed job (training.load_state)
    continues the schedule where it stopped, as with the linear one."""
    warmup = warmup_steps(settings, total_steps)

    def factor(step: int) -> float:
        return lr_factor(step, warmup=warmup, total=total_steps, shape=settings.lr_schedule,
                         min_ratio=settings.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
