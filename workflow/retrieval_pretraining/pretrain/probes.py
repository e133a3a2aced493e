"""What each objective is for, measured on held-out chunks: evidence that pre-training learns.

Every probe is a score in [0, 1] computed without gradients on a fixed batch of chunks the trainer
never trains on (`trainer.probe_chunks`, drawn from (seed, chunk_id)), with the objective's own
heads, so a run can be compared with its step 0:

  probe_mlm_accuracy      every objective: share of masked tokens the MLM head predicts exactly.
  loss_mlm_heldout        every objective: the masked-LM cross-entropy on those chunks (the BoW
                          paper's held-out MLM loss; plotted with the losses, not in [0, 1]).
  probe_span_retrieval    COSTA: share of spans whose own text is the best-scoring of the batch's
                          texts (span -> text retrieval among the batch's candidates).
  probe_bag_precision     CPDAE: share of the decoder's top-|T| words that are in the text's word
                          set T (T = the reconstruction target).
  probe_view_agreement    CPDAE / CPDAE_R: share of view-0 texts whose nearest view-1 text (by
                          the contrastive similarity) is their own other view.
  probe_coverage          BoW: input-token coverage |top-|T| ∩ T| / |T| of [CLS] projected to the
                          vocabulary by the BoW head (the BoW paper's Algorithm 1 at k = |T|).
  probe_head_mlm_accuracy, probe_view_agreement (coCondenser), probe_decoder_accuracy: the
                          baselines' probes (baselines.probe).

Over several batches (`probe_batches`) each figure is pooled over all its items: the masked
tokens (MLM accuracy and loss, the heads' and decoders'), the spans (span retrieval), the texts
(word precision, coverage, view agreement). The retrieval-like probes choose among the texts of
their own batch: the held-out chunks are split into batches of near-equal size (data.probe_batches,
at most micro_batch_size), so every item has about as many candidates as any other.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import baselines
from . import objectives as obj


# (mean over n items, n): what lets batches pool as sum(mean * n) / sum(n), an exact mean over
# all their items, where a mean of per-batch means would weigh a batch's tokens or spans by the
# batch, not by their number.
Pooled = tuple[float, int]


def _share(hits: torch.Tensor) -> float:
    return float(hits.float().mean()) if hits.numel() else float("nan")


def _pooled_share(hits: torch.Tensor) -> Pooled:
    return _share(hits), hits.numel()


def _texts_with_bags(bag_mask: torch.Tensor) -> int:
    """How many texts top_set_precision averages over (those whose word set is not empty)."""
    return int(bag_mask.any(dim=1).sum())


def top_set_precision(logits: torch.Tensor, bag_ids: torch.Tensor,
                      bag_mask: torch.Tensor) -> float:
    """Mean over texts of |top-|T| of logits ∩ T| / |T| (T = the real entries of bag_ids)."""
    vocab = logits.shape[1]
    scores = []
    for row, ids, mask in zip(logits, bag_ids, bag_mask):
        bag = ids[mask]
        if len(bag) == 0:
            continue
        top = row.topk(min(len(bag), vocab)).indices
        scores.append(torch.isin(top, bag).float().mean())
    return float(torch.stack(scores).mean()) if scores else float("nan")


def nearest_is_partner(similarity: torch.Tensor) -> float:
    """similarity [m, m] of view-0 texts (rows) against view-1 texts (columns): the share of rows
    whose best column is their own text."""
    own = torch.arange(len(similarity), device=similarity.device)
    return _share(similarity.argmax(dim=1) == own)


def probe(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """The probes of `model`'s objective on one collated batch (the trainer's own layout)."""
    return {key: value for key, (value, _) in pooled_probe(model, batch).items()}


@torch.no_grad()
def pooled_probe(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, Pooled]:
    """`probe`'s figures, each with the number of items (tokens, spans, texts) it averages over."""
    was_training = model.training
    model.eval()
    try:
        hidden = model.hidden(batch)
        selected = batch["labels"] != -100
        mlm_logits = model.mlm_head(hidden[selected]).float()
        masked = int(selected.sum())
        out = {
            "probe_mlm_accuracy": _pooled_share(
                mlm_logits.argmax(dim=-1) == batch["labels"][selected]),
            # The BoW paper's Tables 1-2 report it: the masked-LM loss on held-out text.
            "loss_mlm_heldout": (float(F.cross_entropy(mlm_logits, batch["labels"][selected])),
                                 masked),
        }
        cls = hidden[:, 0]
        objective = model.objective
        if objective == "costa":
            source = hidden
            if model.settings["costa"]["span_pass"] == "unmasked":
                source = model.hidden(batch, "original_ids")
            spans = obj.span_means(source, batch["span_start"], batch["span_end"])
            text = model.project_text(cls)  # in fp32, as training scores it
            scores = obj.fp32_scores(spans[batch["span_mask"]], text)  # [real spans, texts]
            owner = torch.arange(len(text), device=text.device).unsqueeze(1)
            owner = owner.expand_as(batch["span_mask"])
            out["probe_span_retrieval"] = _pooled_share(
                scores.argmax(dim=1) == owner[batch["span_mask"]])
        elif objective in ("cpdae", "cpdae_r"):
            m = len(cls) // 2  # views stacked [view 0 of m texts; view 1 of m texts]
            logits = model.decoder(cls)
            out["probe_bag_precision"] = (
                top_set_precision(logits[:m], batch["bag_ids"], batch["bag_mask"]),
                _texts_with_bags(batch["bag_mask"]))
            if objective == "cpdae":
                p = torch.sigmoid(logits.float())
                q = p / p.sum(dim=1, keepdim=True)
                similarity = -obj.pairwise_js(q[:m], q[m:])
            else:
                z = F.normalize(cls.float(), dim=-1)
                similarity = obj.fp32_scores(z[:m], z[m:])
            out["probe_view_agreement"] = nearest_is_partner(similarity), m
        elif objective == "bow":
            logits = model.bow_logits(cls)
            out["probe_coverage"] = (
                top_set_precision(logits, batch["bag_ids"], batch["bag_mask"]),
                _texts_with_bags(batch["bag_mask"]))
        elif objective in baselines.OBJECTIVES:
            out |= baselines.probe(model, batch, hidden)
        return out
    finally:
        model.train(was_training)


def probe_batches(model: Any, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The probes over several batches, each pooled over all its items (tokens, spans, texts) of
    every batch; NaN where no batch had any."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for batch in batches:
        for key, (value, n) in pooled_probe(model, batch).items():
            counts[key] = counts.get(key, 0) + n
            if n:  # an empty batch's NaN would poison the sum
                totals[key] = totals.get(key, 0.0) + value * n
    return {key: totals[key] / n if n else float("nan") for key, n in counts.items()}
