"""The pre-training losses as pure tensor functions (tested against plain-loop references).

Reductions (our choices where the papers are silent): every contrastive loss is a mean over its
anchors; the MLM loss is the mean over the micro-batch's predicted tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..training import all_gather_with_grad


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses run in fp32 (under bf16 autocast too); float64 inputs (tests) stay float64."""
    return x if x.dtype == torch.float64 else x.float()


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the predicted positions (logits already restricted to them)."""
    return F.cross_entropy(_upcast(logits), labels)


# ---------------------------------------------------------------- COSTA --------------------------
def span_means(hidden: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Mean of hidden[b, start:end] for every span, vectorised with a prefix sum and gather.

    hidden [B, L, D]; start, end [B, S] (end exclusive, end > start) -> [B, S, D].
    """
    # Accumulate in at least fp32 (bf16 prefix sums over 512 tokens lose the short spans).
    acc = hidden if hidden.dtype == torch.float64 else hidden.float()
    zero = acc.new_zeros(acc.shape[0], 1, acc.shape[2])
    prefix = torch.cat([zero, acc.cumsum(dim=1)], dim=1)  # prefix[:, k] = sum of tokens [0, k)
    index = lambda pos: pos.unsqueeze(-1).expand(-1, -1, hidden.shape[2])  # noqa: E731
    sums = prefix.gather(1, index(end)) - prefix.gather(1, index(start))
    return (sums / (end - start).clamp(min=1).unsqueeze(-1).to(acc.dtype)).to(hidden.dtype)


def costa_loss(
    text: torch.Tensor, spans: torch.Tensor, span_mask: torch.Tensor, *, temperature: float,
    gather: bool = False,
) -> torch.Tensor:
    """Group-wise contrastive loss (COSTA Eq. 8), averaged over the texts that have spans.

    text [n, D] (projected [CLS]), spans [n, S, D], span_mask [n, S]. For text i, each of its spans
    is a positive; the softmax runs over every text and every (real) span of the batch except z_i
    itself. With `gather`, the candidates are all ranks' texts and spans (gradients flow back).
    """
    n, s, d = spans.shape
    offset = 0
    all_text, all_spans, all_mask = text, spans, span_mask
    if gather and torch.distributed.is_available() and torch.distributed.is_initialized():
        all_text = all_gather_with_grad(text)
        all_spans = all_gather_with_grad(spans)
        all_mask = all_gather_with_grad(span_mask.float()).bool()
        offset = torch.distributed.get_rank() * n
    total = all_text.shape[0]
    candidates = _upcast(torch.cat([all_text, all_spans.reshape(-1, d)], dim=0))
    logits = _upcast(text) @ candidates.T / temperature  # [n, total + total * S]
    invalid = torch.cat([
        torch.zeros(n, total, dtype=torch.bool, device=text.device),
        (~all_mask).reshape(1, -1).expand(n, -1),
    ], dim=1)
    invalid[torch.arange(n), offset + torch.arange(n)] = True  # j != i: not z_i itself
    log_prob = logits.masked_fill(invalid, float("-inf")).log_softmax(dim=1)
    # Column of span p of local text i: total + (offset + i) * S + p.
    own = total + (offset + torch.arange(n, device=text.device)).unsqueeze(1) * s + torch.arange(
        s, device=text.device)
    positive = log_prob.gather(1, own).masked_fill(~span_mask, 0.0)
    counts = span_mask.sum(dim=1)
    has = counts > 0
    per_text = -positive.sum(dim=1)[has] / counts[has]
    return per_text.mean() if has.any() else text.sum() * 0.0


# ---------------------------------------------------------------- CPDAE --------------------------
def multi_hot(bag_ids: torch.Tensor, bag_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, K] padded id sets -> [B, V] 0/1 targets.

    Only the real entries are written: scattering the padding too would write 0s to the pad id's
    column, erasing that id when it is also a real member (scatter order is unspecified).
    """
    target = torch.zeros(bag_ids.shape[0], vocab_size, device=bag_ids.device)
    rows = torch.arange(bag_ids.shape[0], device=bag_ids.device).unsqueeze(1).expand_as(bag_ids)
    return target.index_put_((rows[bag_mask], bag_ids[bag_mask]), target.new_ones(()))


def reconstruction_loss(logits: torch.Tensor, target: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Sigmoid multi-label BCE of the input's word set; `sum` over the vocabulary (the set's
    log-likelihood) or `mean` over it, then the mean over texts/views."""
    logits = _upcast(logits)
    bce = F.binary_cross_entropy_with_logits(logits, target.to(logits.dtype), reduction="none").sum(dim=1)
    if reduction == "mean":
        bce = bce / logits.shape[1]
    return bce.mean()


def _plogp(p: torch.Tensor) -> torch.Tensor:
    """sum p log p over the last axis. The word distributions here come from sigmoids, so no entry
    is exactly 0; the clamp only guards log(0) (and is much faster than torch.xlogy)."""
    return (p * p.clamp_min(1e-30).log()).sum(dim=-1)


def pairwise_js(q: torch.Tensor, block: int = 16, checkpoint_above: int = 2**25) -> torch.Tensor:
    """Jensen-Shannon divergence (natural log) between every pair of rows of q [N, V] (rows sum to 1).

    JS(P, Q) = (sum P log P + sum Q log Q) / 2 - sum M log M with M = (P + Q) / 2. Only the last
    term is pairwise ([N, N, V] values); above `checkpoint_above` of them it is computed in row
    blocks that are recomputed in backward, to bound memory (a batch of 64 texts = 128 views x
    128 x 30,522 would otherwise keep ~2 GB per intermediate).
    """
    self_terms = _plogp(q)

    def mix_block(rows: torch.Tensor) -> torch.Tensor:
        return _plogp((rows.unsqueeze(1) + q.unsqueeze(0)) / 2)

    if q.shape[0] ** 2 * q.shape[1] <= checkpoint_above or not torch.is_grad_enabled():
        mix = mix_block(q)
    else:
        mix = torch.cat([
            torch.utils.checkpoint.checkpoint(mix_block, q[i:i + block], use_reentrant=False)
            for i in range(0, q.shape[0], block)
        ], dim=0)
    return (self_terms.unsqueeze(1) + self_terms.unsqueeze(0)) / 2 - mix


def views_info_nce(similarity: torch.Tensor, temperature: float) -> torch.Tensor:
    """InfoNCE over 2m views stacked [view 0 of m texts; view 1 of m texts]: the positive of view a
    is the other view of the same text; the candidates are all 2m - 1 other views."""
    two_m = similarity.shape[0]
    m = two_m // 2
    logits = _upcast(similarity / temperature)
    logits = logits.masked_fill(torch.eye(two_m, dtype=torch.bool, device=logits.device), float("-inf"))
    positive = (torch.arange(two_m, device=logits.device) + m) % two_m
    return F.cross_entropy(logits, positive)


def cpdae_contrastive(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """CPDAE: sigmoid outputs normalised into word distributions, similarity = -JS divergence."""
    p = torch.sigmoid(_upcast(logits))
    q = p / p.sum(dim=1, keepdim=True)
    return views_info_nce(-pairwise_js(q), temperature)


def dense_contrastive(cls: torch.Tensor, temperature: float) -> torch.Tensor:
    """CPDAE_R: the same InfoNCE on the dense [CLS] vectors (cosine similarity)."""
    z = F.normalize(_upcast(cls), dim=-1)
    return views_info_nce(z @ z.T, temperature)


# ---------------------------------------------------------------- Bag-of-Word --------------------
def bow_loss(logits: torch.Tensor, bag_ids: torch.Tensor, bag_mask: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy against the uniform distribution over each text's unique input ids
    (= mean over the bag of -log p(id)), averaged over texts."""
    log_prob = _upcast(logits).log_softmax(dim=-1).gather(1, bag_ids)
    counts = bag_mask.sum(dim=1).clamp(min=1)
    return (-(log_prob * bag_mask).sum(dim=1) / counts).mean()


def cosine_weight(progress: float, start: float, end: float) -> float:
    """Weight decaying from `start` (progress 0) to `end` (progress 1) on a half cosine."""
    progress = min(max(progress, 0.0), 1.0)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
