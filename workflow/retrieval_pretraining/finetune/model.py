"""The bi-encoder being fine-tuned (one shared encoder for queries and passages) and its loss."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import projector as text_projector
from .. import training
from ..encode import (attach_projector, check_title_separator, encode_batch, load_encoder,
                      projector_of)
from ..retrieval_settings import RetrievalSettings
from .settings import FinetuneSettings


class BiEncoder(torch.nn.Module):
    """Queries and passages through the same encoder, pooled as retrieval pools them (encode.py), so
    training and retrieval can never disagree on pooling or normalisation."""

    def __init__(self, encoder: torch.nn.Module, pooling: str, similarity: str):
        super().__init__()
        self.encoder = encoder
        self.pooling, self.similarity = pooling, similarity

    def forward(self, queries: dict[str, torch.Tensor], passages: dict[str, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return (encode_batch(self.encoder, queries, self.pooling, self.similarity),
                encode_batch(self.encoder, passages, self.pooling, self.similarity))


def load_bi_encoder(folder: Path, retrieval: RetrievalSettings, device: torch.device, *,
                    projector: bool = False, heads: Path | None = None):
    """(BiEncoder, tokenizer) from a Hugging Face encoder folder (local files, no remote code).

    With `projector`, [CLS] is embedded through COSTA's text projector: the folder's own (a stage
    fine-tuned with it) or else the one pre-training left in `heads`. Without it, a folder that
    embeds through a projector is refused: the stage would silently change what a vector is. So
    is a tokenizer that would split title mode sep's [SEP] (encode.check_title_separator), here,
    before the job writes its passages, not at its first micro-batch."""
    encoder, tokenizer = load_encoder(folder, device)  # refuses ids past the embeddings
    check_title_separator(tokenizer, retrieval.title)
    if projector and projector_of(encoder) is None:
        if heads is None:
            raise text_projector.ProjectorError(
                f"the model's finetune.projector (pretrain.models[].finetune) is on, but {folder} "
                f"has no {text_projector.FILE} and no pre-training heads file was given (--heads)")
        attach_projector(encoder, text_projector.from_heads(Path(heads)).to(device))
    if not projector and projector_of(encoder) is not None:
        raise text_projector.ProjectorError(
            f"{folder} embeds through a text projector ({text_projector.FILE}), but "
            "the model's finetune.projector is off (pretrain.models[].finetune); set it to true")
    return BiEncoder(encoder, retrieval.pooling, retrieval.similarity), tokenizer


def contrastive_loss(q: torch.Tensor, p: torch.Tensor, group_size: int, temperature: float = 1.0,
                     query_offset: int = 0) -> torch.Tensor:
    """Mean cross-entropy of queries `q` (b x d) over passages `p` (m x d).

    Query i's positive is passage (query_offset + i) * group_size: passages are laid out group by
    group, positive first. query_offset is this process's first query within a gathered contrast
    set.
    """
    scores = training.fp32_scores(q, p) / temperature  # not bf16: scores in the hundreds
    targets = (torch.arange(len(q), device=q.device) + query_offset) * group_size
    return F.cross_entropy(scores, targets)


def contrast_set_loss(q: torch.Tensor, p: torch.Tensor, *, group_size: int, temperature: float,
                      gather: bool, rank: int) -> torch.Tensor:
    """The loss of this process's queries over their contrast set: this micro-batch's passages, or
    with `gather` every rank's share of the set (all-gathered with gradients; this rank's queries
    are the rank-th share). Without a process group, gathering changes nothing."""
    offset = 0
    if gather:
        p = training.all_gather_with_grad(p.contiguous())
        offset = rank * len(q)
    return contrastive_loss(q, p, group_size, temperature, offset)


def micro_batch_loss(model: torch.nn.Module, queries: dict[str, torch.Tensor],
                     passages: dict[str, torch.Tensor], settings: FinetuneSettings,
                     device: torch.device, rank: int = 0) -> torch.Tensor:
    """One micro-batch's loss as the training loop computes it: queries and passages through
    `model` (the BiEncoder, or DDP around it) under the settings' precision (bf16 autocast on
    CUDA), then this process's contrast-set loss. Here, apart from the loop's data (which needs
    polars), so that the GPU checks run what the loop runs on a machine without it."""
    with training.autocast(device, settings.precision):
        q, p = model(queries, passages)
        return contrast_set_loss(q, p, group_size=settings.group_size,
                                 temperature=settings.temperature, gather=settings.gather,
                                 rank=rank)


def rows(inputs: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Tokenised `inputs` cut into consecutive pieces of `size` rows (the last may be shorter)."""
    total = len(next(iter(inputs.values())))
    return [{k: v[start:start + size] for k, v in inputs.items()}
            for start in range(0, total, size)]


def cached_contrast_set(model: torch.nn.Module, encoder: torch.nn.Module,
                        queries: dict[str, torch.Tensor], passages: dict[str, torch.Tensor],
                        settings: FinetuneSettings, device: torch.device, rank: int, *,
                        chunk: int, seed: Callable[[int], None], scale: float,
                        sync: Callable[[bool], contextlib.AbstractContextManager]
                        ) -> torch.Tensor:
    """One micro-batch's loss and gradient, as micro_batch_loss then (loss x scale).backward(),
    `chunk` queries (and their groups) a forward pass: gradient caching (Gao et al., "Scaling Deep
    Contrastive Learning Batch Size under Memory Limited Setup", 2021), the method
    pretrain/contrast_cache.py applies to pre-training's gathered contrast sets.

    1. every chunk through `encoder` (the BiEncoder) without gradients, `seed(j)` before chunk j,
       keeping only its query and passage vectors;
    2. the contrast-set loss over all of them (gathered across processes as micro_batch_loss
       gathers) and its gradient with respect to each vector;
    3. every chunk again through `model` (DDP around the encoder, or it), with gradients, under
       the same seed, so the same dropout: <vectors, cached gradient> backpropagated, inside
       `sync(last)` (DDP's no_sync but for the micro-batch's last chunk when the step syncs).

    Memory: one chunk's activations, not the micro-batch's; cost: one more forward pass. Returns
    the loss's value (detached), the value micro_batch_loss would return."""
    q_chunks, p_chunks = rows(queries, chunk), rows(passages, chunk * settings.group_size)
    q_parts, p_parts = [], []
    with torch.no_grad():
        for j, (q_in, p_in) in enumerate(zip(q_chunks, p_chunks)):
            seed(j)
            with training.autocast(device, settings.precision):
                q, p = encoder(q_in, p_in)
            q_parts.append(q)
            p_parts.append(p)
    # fp32 leaves (float64 in tests): the loss scores in fp32 anyway (fp32_scores), and so does the
    # cached gradient.
    q = training.upcast(torch.cat(q_parts)).requires_grad_()
    p = training.upcast(torch.cat(p_parts)).requires_grad_()
    with training.autocast(device, settings.precision):
        loss = contrast_set_loss(q, p, group_size=settings.group_size,
                                 temperature=settings.temperature, gather=settings.gather,
                                 rank=rank)
    q_grads, p_grads = torch.autograd.grad(loss * scale, [q, p])
    q_grads, p_grads = q_grads.split([len(x) for x in q_parts]), p_grads.split(
        [len(x) for x in p_parts])
    last = len(q_chunks) - 1
    for j, (q_in, p_in) in enumerate(zip(q_chunks, p_chunks)):
        seed(j)
        with sync(j == last):
            with training.autocast(device, settings.precision):
                q, p = model(q_in, p_in)
            surrogate = ((training.upcast(q) * q_grads[j]).sum()
                         + (training.upcast(p) * p_grads[j]).sum())
            surrogate.backward()
    return loss.detach()
