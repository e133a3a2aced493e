"""Fine-tuning's learning-rate schedule from its settings: the warm-up length (warmup_steps or
ceil(warmup_ratio x steps)) and the shape and floor the settings name, on the factor both
trainers share (training.lr_factor: a linear warm-up, then a linear or cosine decay that ends at
`min_lr_ratio` x the peak lr; the BoW authors' recipe: cosine, 0.1, 1000 warm-up steps). With the
defaults (linear, 0, the warm-up from warmup_ratio) the lr of every step is bit-identical to the
schedule fine-tuning ran before the other shapes existed (tests/test_finetune_schedule.py).
"""

from __future__ import annotations

import math

import torch

from .. import training
from .settings import FinetuneSettings


def warmup_steps(settings: FinetuneSettings, total_steps: int) -> int:
    """`warmup_steps` when set (the BoW authors' 1000, as transformers' Trainer lets a positive
    warmup_steps win over warmup_ratio); otherwise ceil(warmup_ratio x total_steps), as before."""
    if settings.warmup_steps is not None:
        return settings.warmup_steps
    return math.ceil(settings.warmup_ratio * total_steps)


def build_schedule(optimizer: torch.optim.Optimizer, settings: FinetuneSettings,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """training.lr_scheduler with the settings' knobs: a LambdaLR, whose state is the step count
    alone, so a resumed job (training.load_state) continues the schedule where it stopped."""
    return training.lr_scheduler(optimizer, warmup_steps=warmup_steps(settings, total_steps),
                                 total_steps=total_steps, shape=settings.lr_schedule,
                                 min_ratio=settings.min_lr_ratio)
