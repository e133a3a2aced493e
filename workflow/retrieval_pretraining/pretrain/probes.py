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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import baselines
from . import objectives as obj


def _share(hits: torch.Tensor) -> float:
    return float(hits.float().mean()) if hits.numel() else float("nan")


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


@torch.no_grad()
def probe(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """The probes of `model`'s objective on one collated batch (the trainer's own layout)."""
    was_training = model.training
    model.eval()
    try:
        hidden = model.hidden(batch)
        selected = batch["labels"] != -100
        mlm_logits = model.mlm_head(hidden[selected]).float()
        out = {
            "probe_mlm_accuracy": _share(mlm_logits.argmax(dim=-1) == batch["labels"][selected]),
            # The BoW paper's Tables 1-2 report it: the masked-LM loss on held-out text.
            "loss_mlm_heldout": float(F.cross_entropy(mlm_logits, batch["labels"][selected])),
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
            out["probe_span_retrieval"] = _share(
                scores.argmax(dim=1) == owner[batch["span_mask"]])
        elif objective in ("cpdae", "cpdae_r"):
            m = len(cls) // 2  # views stacked [view 0 of m texts; view 1 of m texts]
            logits = model.decoder(cls)
            out["probe_bag_precision"] = top_set_precision(
                logits[:m], batch["bag_ids"], batch["bag_mask"])
            if objective == "cpdae":
                p = torch.sigmoid(logits.float())
                q = p / p.sum(dim=1, keepdim=True)
                similarity = -obj.pairwise_js(q[:m], q[m:])
            else:
                z = F.normalize(cls.float(), dim=-1)
                similarity = obj.fp32_scores(z[:m], z[m:])
            out["probe_view_agreement"] = nearest_is_partner(similarity)
        elif objective == "bow":
            logits = model.bow_logits(cls)
            out["probe_coverage"] = top_set_precision(logits, batch["bag_ids"], batch["bag_mask"])
        elif objective in baselines.OBJECTIVES:
            out |= baselines.probe(model, batch, hidden)
        return out
    finally:
        model.train(was_training)


def probe_batches(model: Any, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The probes averaged over several batches, each weighted by its number of chunks."""
    totals: dict[str, float] = {}
    weight = 0
    for batch in batches:
        n = len(batch["chunk_ids"]) if "chunk_ids" in batch else len(batch["input_ids"])
        for key, value in probe(model, batch).items():
            totals[key] = totals.get(key, 0.0) + value * n
        weight += n
    return {key: value / weight for key, value in totals.items()}
