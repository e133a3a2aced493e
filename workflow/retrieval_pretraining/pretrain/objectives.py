"""The pre-training losses as pure tensor functions (tested against plain-loop references).

Reductions (our choices where the papers are silent): every contrastive loss is a mean over its
anchors; the MLM loss is the mean over the micro-batch's predicted tokens (0 if it has none).

Similarity logits are computed in fp32 even under bf16 autocast (`fp32_scores`): a bf16 dot
product keeps ~3 significant digits, which at tau = 0.1 moves a logit by several tenths.
Contrastive candidates may be gathered from every process (`gather`): the candidates are then the
global batch's, and the gradient of another process's loss flows back through the gather.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..training import all_gather_with_grad, fp32_scores, upcast


def _gathering(gather: bool) -> bool:
    return (gather and torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions whose label is not -100 (the ignored index); 0, with
    a zero gradient, where there is none.

    None happens: whole-word masking skips a word wider than the budget, so a micro-batch of
    short chunks can predict nothing (ARCHITECTURE.md), and cross-entropy's own mean is then
    0 / 0, a NaN that stops the run as a non-finite step. The count is a device tensor (of the
    rows given, when the caller selected the predicted ones): nothing waits for the device."""
    total = F.cross_entropy(upcast(logits), labels, ignore_index=-100, reduction="sum")
    return total / (labels != -100).sum().clamp(min=1)


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
    gather: bool = False, stats: dict[str, float | torch.Tensor] | None = None,
) -> torch.Tensor:
    """Group-wise contrastive loss (COSTA Eq. 8), averaged over the texts that have spans.

    text [n, D] (projected [CLS]), spans [n, S, D], span_mask [n, S]. For text i, each of its spans
    is a positive; the softmax runs over every text and every (real) span of the batch except z_i
    itself. With `gather`, the candidates are all ranks' texts and spans (gradients flow back).
    `stats`, when given, receives `contrast_pool`: the candidates of each text's softmax.
    """
    n, s, d = spans.shape
    offset = 0
    all_text, all_spans, all_mask = text, spans, span_mask
    if _gathering(gather):
        all_text = all_gather_with_grad(text)
        all_spans = all_gather_with_grad(spans)
        all_mask = all_gather_with_grad(span_mask.float()).bool()
        offset = torch.distributed.get_rank() * n
    total = all_text.shape[0]
    if stats is not None:  # a tensor: reading its value here would wait for the GPU
        stats["contrast_pool"] = (all_mask.sum() + (total - 1)).float()
    candidates = torch.cat([all_text, all_spans.reshape(-1, d)], dim=0)
    logits = fp32_scores(text, candidates) / temperature  # [n, total + total * S]
    rows = torch.arange(n, device=text.device)
    # j != i: not z_i itself. A comparison, not `invalid[rows, offset + rows] = True`: assigning a
    # Python value copies it from pageable host memory, which makes the host wait for a GPU.
    itself = torch.arange(total, device=text.device) == (offset + rows).unsqueeze(1)
    invalid = torch.cat([itself, (~all_mask).reshape(1, -1).expand(n, -1)], dim=1)
    log_prob = logits.masked_fill(invalid, float("-inf")).log_softmax(dim=1)
    # Column of span p of local text i: total + (offset + i) * S + p.
    own = total + (offset + rows).unsqueeze(1) * s + torch.arange(s, device=text.device)
    positive = log_prob.gather(1, own).masked_fill(~span_mask, 0.0)
    counts = span_mask.sum(dim=1)
    # The mean over the texts that have spans, as weights rather than boolean indexing and
    # `.any()` (each waits for the GPU; torch.compile breaks its graph there): 0 if none has any.
    has = (counts > 0).to(positive.dtype)
    per_text = -positive.sum(dim=1) / counts.clamp(min=1)
    return (per_text * has).sum() / has.sum().clamp(min=1)


# ---------------------------------------------------------------- CPDAE --------------------------
def multi_hot(bag_ids: torch.Tensor, bag_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, K] padded id sets -> [B, V] 0/1 targets.

    Each entry writes its mask (1 real, 0 padding) by maximum: a padding entry cannot erase its id
    when that id is also a real member, whatever the scatter order, and nothing is selected by a
    boolean mask (whose count the host would wait for on a GPU).
    """
    target = torch.zeros(bag_ids.shape[0], vocab_size, device=bag_ids.device)
    return target.scatter_reduce_(1, bag_ids, bag_mask.to(target.dtype), reduce="amax")


def reconstruction_loss(logits: torch.Tensor, target: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Sigmoid multi-label BCE of the input's word set; `sum` over the vocabulary (the set's
    log-likelihood) or `mean` over it, then the mean over texts/views."""
    logits = upcast(logits)
    bce = F.binary_cross_entropy_with_logits(logits, target.to(logits.dtype), reduction="none").sum(dim=1)
    if reduction == "mean":
        bce = bce / logits.shape[1]
    return bce.mean()


TINY = 1e-30  # log's floor: a sigmoid in fp32 reaches 0 below a logit of ~-104
BLOCK_ELEMENTS = 2**23  # of [rows, B, V] made at once in pairwise_js: 32 MB in fp32


def _plogp(p: torch.Tensor) -> torch.Tensor:
    """sum p log p over the last axis. The word distributions here come from sigmoids, so no entry
    is exactly 0 in practice; the clamp only guards log(0) (and is much faster than torch.xlogy)."""
    return (p * p.clamp_min(TINY).log()).sum(dim=-1)


def _log_mix_ratio(rows: torch.Tensor, others: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    """log(M / R) = log(1/2 + P / 2R), M = (R + P) / 2, for every row R of `rows` [r, V] and every
    row P of `others` [n, V] -> [r, n, V], in one kernel and an in-place log."""
    return torch.addcdiv(half, others.unsqueeze(0), 2 * rows.clamp_min(TINY).unsqueeze(1)).log_()


class _JensenShannon(torch.autograd.Function):
    """JS(q_a, k_b) for every pair -> [A, B], as one autograd node whose [A, B, V] values are made
    in row blocks and never kept (backward makes what it needs again).

    Its gradient is d JS / d q_av = sum_b g_ab log(q_av / M_abv) / 2 (the +1 of d(p log p)
    cancels between the terms), contracted over b by a matrix product, and the same over a for k.
    Written through autograd (add, /2, clamp, log, *, sum, each saving or re-making [r, B, V]
    values) the same function read and wrote ~35 arrays of that size, and its backward formed that
    gradient as a difference of two sums ~B x 5 apart, in fp32. Here it is ~17 arrays, and the
    log-ratios it sums are small (benchmarks/RESULTS.md, "CPDAE's JS term"). Computed in fp32
    (float64 stays float64) under autocast too."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor | None, rows: int) -> torch.Tensor:
        # k None: q against itself (one input: torch.compile traces no Function given one tensor
        # twice; the two roles' gradients are summed here)
        ctx.itself, ctx.rows = k is None, rows
        k = q if k is None else k
        with torch.autocast(device_type=q.device.type, enabled=False):
            mix_terms = q.new_empty(q.shape[0], k.shape[0])  # sum_v M log M
            for i in range(0, q.shape[0], rows):
                mix = torch.add(q[i:i + rows].unsqueeze(1), k.unsqueeze(0)).mul_(0.5)
                # A sum, not a batch of dot products (bmm): JS ~0.01-0.5 is a difference of sums
                # near -10 over 30k words, of which a sum keeps ~1e-6, bmm's running total ~1e-4.
                mix_terms[i:i + rows] = mix.clamp_min(TINY).log_().mul_(mix).sum(dim=-1)
            out = (_plogp(q).unsqueeze(1) + _plogp(k).unsqueeze(0)) / 2 - mix_terms
        ctx.save_for_backward(q, *(() if ctx.itself else (k,)))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        saved = ctx.saved_tensors  # (q, k), or (q,) when q against itself
        q, k = saved[0], saved[-1]
        with torch.autocast(device_type=q.device.type, enabled=False):
            grad = grad.to(q.dtype)
            half = q.new_full((1, 1, 1), 0.5)  # a fill, not a copy from the host
            grad_q, grad_k = torch.empty_like(q), torch.zeros_like(k)
            for i in range(0, q.shape[0], ctx.rows):
                g, q_rows = grad[i:i + ctx.rows], q[i:i + ctx.rows]  # [r, B], [r, V]
                # sum_b g_ab log(q_a / M_ab) = -sum_b g_ab log(M_ab / q_a)
                grad_q[i:i + ctx.rows] = -torch.bmm(
                    g.unsqueeze(1), _log_mix_ratio(q_rows, k, half)).squeeze(1)
                # this block's share of sum_a g_ab log(k_b / M_ab), through [B, r, V]
                grad_k -= torch.bmm(g.T.unsqueeze(1), _log_mix_ratio(k, q_rows, half)).squeeze(1)
        grad_q, grad_k = grad_q / 2, grad_k / 2
        return (grad_q + grad_k, None, None) if ctx.itself else (grad_q, grad_k, None)


def pairwise_js(q: torch.Tensor, k: torch.Tensor | None = None,
                rows: int | None = None) -> torch.Tensor:
    """Jensen-Shannon divergence (natural log) between every row of q [A, V] and every row of
    k [B, V] (default k = q; rows sum to 1) -> [A, B].

    JS(P, Q) = (sum P log P + sum Q log Q) / 2 - sum M log M with M = (P + Q) / 2. The last term
    is pairwise ([A, B, V] values: a batch of 64 texts = 128 views x 128 x 30,522 would be ~2 GB);
    it is made `rows` rows of q at a time (default: BLOCK_ELEMENTS values a block), in forward and
    again in backward, so memory stays bounded by one block whatever the batch.
    """
    k = None if k is q else k  # one set against itself: the Function takes it once
    pool = q if k is None else k
    rows = rows or max(1, BLOCK_ELEMENTS // max(1, pool.shape[0] * q.shape[1]))
    return _JensenShannon.apply(q, k, rows)


def gather_views(x: torch.Tensor, gather: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool, rows): the views of every process stacked [view 0 of all texts; view 1 of all texts],
    and the rows of this process's 2m views (stacked the same way locally) in the pool.

    Without gathering the pool is `x` itself. Every process must hold the same number of texts.
    """
    rows = torch.arange(x.shape[0], device=x.device)
    if not _gathering(gather):
        return x, rows
    m = x.shape[0] // 2
    first, second = all_gather_with_grad(x[:m]), all_gather_with_grad(x[m:])
    start = torch.distributed.get_rank() * m
    local = torch.arange(start, start + m, device=x.device)
    return torch.cat([first, second]), torch.cat([local, local + first.shape[0]])


def views_info_nce(similarity: torch.Tensor, temperature: float,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """InfoNCE of anchor views against a pool of 2M views stacked [view 0 of M texts; view 1 of M
    texts]: similarity [A, 2M], anchor a being pool row rows[a] (default: the anchors are the pool).
    The positive of pool row c is row (c + M) mod 2M, the other view of the same text; the
    candidates are all 2M - 1 other views. Mean over the anchors."""
    two_m = similarity.shape[1]
    rows = torch.arange(similarity.shape[0], device=similarity.device) if rows is None else rows
    logits = upcast(similarity) / temperature
    # A comparison, not an assignment of True (a copy from host memory: a wait for a GPU).
    self_mask = torch.arange(two_m, device=logits.device) == rows.unsqueeze(1)
    logits = logits.masked_fill(self_mask, float("-inf"))
    return F.cross_entropy(logits, (rows + two_m // 2) % two_m)


def cpdae_contrastive(logits: torch.Tensor, temperature: float, gather: bool = False,
                      stats: dict[str, float] | None = None) -> torch.Tensor:
    """CPDAE Eq. 5: sigmoid outputs normalised into word distributions, similarity = -JS divergence,
    InfoNCE over the 2m views of the batch (of every process with `gather`). `stats` receives
    `contrast_pool`, the candidates of each view (2m - 1)."""
    p = torch.sigmoid(upcast(logits))
    q = p / p.sum(dim=1, keepdim=True)
    pool, rows = gather_views(q, gather)
    if stats is not None:
        stats["contrast_pool"] = float(pool.shape[0] - 1)
    return views_info_nce(-pairwise_js(q, pool), temperature, rows)


def dense_contrastive(cls: torch.Tensor, temperature: float, gather: bool = False,
                      stats: dict[str, float] | None = None) -> torch.Tensor:
    """CPDAE_R: the same InfoNCE on the dense [CLS] vectors (cosine similarity, fp32)."""
    z = F.normalize(upcast(cls), dim=-1)
    pool, rows = gather_views(z, gather)
    if stats is not None:
        stats["contrast_pool"] = float(pool.shape[0] - 1)
    return views_info_nce(fp32_scores(z, pool), temperature, rows)


# ---------------------------------------------------------------- Bag-of-Word --------------------
def bow_loss(logits: torch.Tensor, bag_ids: torch.Tensor, bag_mask: torch.Tensor,
             reduction: str = "mean") -> torch.Tensor:
    """-log softmax(logits)[id] over each text's unique input ids, averaged over texts: `mean` over
    the bag (softmax cross-entropy against the uniform distribution over the bag: the authors'
    code) or `sum` over it (the paper's sum over the input's tokens, read literally)."""
    log_prob = upcast(logits).log_softmax(dim=-1).gather(1, bag_ids)
    per_text = -(log_prob * bag_mask).sum(dim=1)
    if reduction == "mean":
        per_text = per_text / bag_mask.sum(dim=1).clamp(min=1)
    elif reduction != "sum":
        raise ValueError(f"bow reduction {reduction!r} is unknown; use 'mean' or 'sum'")
    return per_text.mean()


def cosine_weight(progress: float | torch.Tensor, start: float, end: float) -> float | torch.Tensor:
    """Weight decaying from `start` (progress 0) to `end` (progress 1) on a half cosine; a tensor
    `progress` gives a tensor (same arithmetic, in its dtype)."""
    if torch.is_tensor(progress):
        return end + (start - end) * 0.5 * (1.0 + torch.cos(math.pi * progress.clamp(0.0, 1.0)))
    progress = min(max(progress, 0.0), 1.0)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
