"""Gradient caching: a gathered contrast set is the global batch on any number of processes.

A row that gathers its contrastive candidates across processes (`gather_negatives`: paper.yaml's
CPDAE, m = 64 = 8 GPUs x 8, and coCondenser) contrasts what the processes hold at once. With
gradient accumulation that would be micro_batch_size x processes, so the same config would
contrast 32 texts on 4 GPUs and 64 on 8. Instead, when such a row accumulates, a step runs in
three parts (Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup", 2021, the method coCondenser's authors used):

1. every micro-batch of the step through the model without gradients, keeping only what the
   objective contrasts (`Pretrainer.contrast_inputs`: a few vectors or word distributions a text);
2. the contrastive loss over all of them joined (gathered across processes as usual), and its
   gradient with respect to each micro-batch's share;
3. every micro-batch again, with gradients, each under the dropout seed of its first pass, its
   contrastive term replaced by <inputs, cached gradient> (`Pretrainer.contrast_term`); the other
   terms (MLM, reconstruction) are the micro-batch's own, accumulated as for every row.

The gradient equals that of one pass over the whole global batch (tests/test_pretrain_contrast_cache.py
checks it against that pass, and one process against two); the cost is the first pass, about a
third of a step's compute (on CPU 1.4-1.5x the time a sample: benchmarks/RESULTS.md). Rows that
do not gather, and gathering rows without accumulation, never cache: their pool is what the
trainer holds anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .settings import gather_block


def caches(settings: dict[str, Any], accumulation: int) -> bool:
    """Whether this model's steps cache the contrastive gradient: it gathers and accumulates."""
    block = gather_block(settings)
    return block is not None and bool(settings[block]["gather_negatives"]) and accumulation > 1


def join(parts: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The contrast inputs of several micro-batches as one: per-text tensors concatenated, per-view
    ones ("views", each [view 0 of its m texts; view 1]) re-stacked [view 0 of all; view 1 of all]."""
    joined = {}
    for key in parts[0]:
        if key == "views":
            halves = [part[key].chunk(2) for part in parts]
            joined[key] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        else:
            joined[key] = torch.cat([part[key] for part in parts])
    return joined


def split(joined: dict[str, torch.Tensor], texts: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """`join` undone: each micro-batch's share of `joined` (micro-batch i has `texts[i]` texts)."""
    parts: list[dict[str, torch.Tensor]] = [{} for _ in texts]
    total = sum(texts)
    for key, value in joined.items():
        start = 0
        for part, n in zip(parts, texts):
            if key == "views":
                part[key] = torch.cat([value[start:start + n], value[total + start:total + start + n]])
            else:
                part[key] = value[start:start + n]
            start += n
    return parts


def out_of_memory_fix(global_batch_size: int, world_size: int) -> str:
    """What an out-of-memory error tells the user where a caching step holds this process's whole
    share of the global batch at once (training.oom_guard's `fix`): its micro-batches' inputs,
    fetched before the first, and part 2. Lowering micro_batch_size, a micro-batch's advice,
    shrinks none of it: gradient accumulation grows to hold the same texts."""
    return (f"a caching step holds {global_batch_size // world_size} texts of this process at "
            f"once, their inputs, then the contrastive loss against the {global_batch_size} "
            "gathered and its gradient (pretrain/contrast_cache.py), whatever micro_batch_size "
            "is: train on more GPUs (each then holds fewer), or lower 'global_batch_size', which "
            "contrasts each text with fewer negatives, so changes what is trained, and restarts "
            "at step 0, the saved state moved aside, not deleted (training.claim_state)")


def cached_contrast(model: Any, batches: Sequence[dict[str, torch.Tensor]],
                    seed: Callable[[int], None],
                    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                    guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                    ) -> list[dict[str, Any]]:
    """Parts 1 and 2 above for one step's micro-batches: per micro-batch, the `cached` argument of
    its forward pass (the loss's value, its gradient with respect to that micro-batch's inputs,
    the statistics). `seed(i)` seeds micro-batch i's dropout as its training pass will;
    `context()` is a micro-batch pass's autocast (and memory guard); `guard()` part 2's memory
    guard, whose advice is not a micro-batch's (out_of_memory_fix)."""
    parts, texts = [], []
    with torch.no_grad():
        for i, batch in enumerate(batches):
            seed(i)
            with context():
                inputs = model.contrast_inputs(batch)
            parts.append(inputs)
            texts.append(len(inputs["text"]) if "text" in inputs else len(inputs["views"]) // 2)
    with guard():
        # fp32 leaves: the losses compute in fp32 anyway (fp32_scores, upcast), and so does the
        # gradient kept for part 3.
        joined = {key: value.float().requires_grad_() if value.is_floating_point() else value
                  for key, value in join(parts).items()}
        stats: dict[str, Any] = {}
        with context(), guard():  # inside `context`'s guard: the error gets this one's advice
            loss = model.contrast_loss(joined, stats)
        leaves = [key for key, value in joined.items() if value.requires_grad]
        grads = dict(zip(leaves, torch.autograd.grad(loss, [joined[key] for key in leaves])))
        value = loss.detach().float()
        return [{"value": value, "stats": stats, "grads": part} for part in split(grads, texts)]
