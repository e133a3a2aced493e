"""The objectives the Bag-of-Word paper compares with, on the same trainer: their loss terms, the
forward pass that combines them, and their probes (tested against plain-loop statements in
tests/test_pretrain_baselines.py).

  condenser    Condenser (Gao & Callan, EMNLP 2021): a 2-layer head over [last-layer [CLS];
               early-layer token states] predicts the masked tokens through the shared MLM head;
               loss = head MLM + the backbone's own MLM (their `--late_mlm`).
  cocondenser  coCondenser (Gao & Callan, ACL 2022): Condenser on the two segments of every chunk
               (views.segment_pair) plus lambda x the span-pair contrastive loss on the
               backbone's last-layer [CLS]: raw dot products over the temperature (the paper: none,
               i.e. 1), the other segment of the same chunk the positive, every other segment of
               the batch (of every process with gather_negatives) a negative; mean over segments.
  retromae     Enhanced decoding (RetroMAE, Xiao et al., EMNLP 2022): the encoder's MLM on its
               masked input (30% in their recipe) plus a one-layer decoder that reconstructs every
               inner token of the unmasked chunk from [CLS] with position-specific attention
               (heads.EnhancedDecoder, views.decoder_visibility); loss = MLM + mean token CE.
  ae_decoder,  the BoW paper's auto-encoding and auto-regressive decoders (mae_decoders.py):
  ar_decoder   forward and heads there, probes here.

Every head is dropped at export: the encoder is the backbone (train.export_encoder).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BadInput
from . import mae_decoders
from . import objectives as obj
from .heads import CondenserHead, EnhancedDecoder

OBJECTIVES = ("condenser", "cocondenser", "retromae", *mae_decoders.OBJECTIVES)


class HeadError(BadInput, ValueError):
    """A head setting the checkpoint cannot satisfy."""


def early_layer(setting: int | None, layers: int) -> int:
    """The backbone layer feeding Condenser's head: `setting`, or half the depth (0 = embeddings)."""
    layer = layers // 2 if setting is None else setting
    if not 0 <= layer < layers:
        raise HeadError(f"condenser.early_layer {layer}: the checkpoint has {layers} layers; "
                        f"choose 0 (the embeddings) to {layers - 1}, or null (half the depth)")
    return layer


def position_table_problem(encoder: Any) -> str | None:
    """Why `decoded` cannot read the positions of tokens 0..L-1 as rows 0..L-1 of `encoder`'s
    position table (None: it can, as in BERT)."""
    table = getattr(getattr(encoder, "embeddings", None), "position_embeddings", None)
    kind = getattr(encoder.config, "position_embedding_type", "absolute")
    if not isinstance(table, torch.nn.Embedding):
        return f"its encoder ({type(encoder).__name__}) has no absolute position embedding table"
    if kind != "absolute":
        return f"its position_embedding_type is {kind!r}: the table is not what its encoder adds"
    if table.padding_idx is not None:
        return (f"its position ids start at padding_idx + 1 = {table.padding_idx + 1} "
                f"(RoBERTa-style; row {table.padding_idx} is the padding row), so rows 0..L-1 are "
                "not the positions its encoder adds")
    return None


def add_heads(model: Any, config: Any, checkpoint: Any = None) -> None:
    """Give `model` (a Pretrainer) its objective's head; HeadError if `checkpoint` (what its
    encoder was loaded from, for the message) cannot have it."""
    if model.objective in ("condenser", "cocondenser"):
        opts = model.settings["condenser"]
        model.early_layer = early_layer(opts["early_layer"], config.num_hidden_layers)
        model.condenser = CondenserHead(config, opts["head_layers"])
    elif model.objective == "retromae":
        problem = position_table_problem(model.encoder)
        if problem is not None:
            raise HeadError(
                f"checkpoint {checkpoint}: objective retromae (enhanced decoding) adds row i of "
                f"the encoder's position table to the decoder's query for token i, but {problem}; "
                "pre-train a BERT-style checkpoint (absolute positions from 0) with it, or this "
                "checkpoint with another objective")
        model.enhanced_decoder = EnhancedDecoder(config)
    else:
        mae_decoders.add_heads(model, config)


def span_pair_contrastive(cls: torch.Tensor, temperature: float, gather: bool = False,
                          stats: dict[str, float] | None = None) -> torch.Tensor:
    """coCondenser's loss: cls [2m, D] stacked [segment 0 of m chunks; segment 1 of them];
    InfoNCE of each segment against every other segment of the pool (dot products / temperature),
    its partner the positive; mean over this process's segments."""
    pool, rows = obj.gather_views(cls, gather)
    if stats is not None:
        stats["contrast_pool"] = float(pool.shape[0] - 1)
    return obj.views_info_nce(obj.fp32_scores(cls, pool), temperature, rows)


def condenser_states(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(last-layer states, head outputs) of Condenser's forward pass."""
    states = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           output_hidden_states=True, **model.unpadded(batch)).hidden_states
    hidden = states[-1]
    return hidden, model.condenser(hidden, states[model.early_layer], batch["attention_mask"])


def decoded(model: Any, cls: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The enhanced decoder's outputs [B, L, D] from [CLS] and the unmasked chunk."""
    embeddings = model.encoder.embeddings
    ids = batch["original_ids"]
    positions = embeddings.position_embeddings.weight[:ids.shape[1]]
    return model.enhanced_decoder(cls, embeddings(input_ids=ids), positions, batch["decoder_visible"])


def contrast_inputs(model: Any, batch: dict[str, torch.Tensor],
                    hidden: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """coCondenser's contrast set from one micro-batch: the backbone's last-layer [CLS] of both
    segments of every chunk ("views", [2m, D]; Pretrainer.contrast_inputs)."""
    if model.objective != "cocondenser":
        raise ValueError(f"objective {model.objective!r} contrasts nothing")
    if hidden is None:
        hidden, _ = condenser_states(model, batch)
    return {"views": hidden[:, 0]}


def contrast_loss(model: Any, inputs: dict[str, torch.Tensor], stats: dict[str, Any]) -> torch.Tensor:
    opts = model.settings["cocondenser"]
    return span_pair_contrastive(inputs["views"], opts["temperature"], opts["gather_negatives"], stats)


def forward(model: Any, batch: dict[str, torch.Tensor], cached: dict[str, Any] | None = None
            ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(loss terms with the total under "loss", logged statistics) of a baseline objective;
    `cached`: coCondenser's cached contrastive gradient (Pretrainer.contrast_term)."""
    stats: dict[str, float] = {}
    if model.objective in mae_decoders.OBJECTIVES:
        return mae_decoders.forward(model, batch), stats
    if model.objective == "retromae":
        hidden = model.hidden(batch)
        losses = {"loss_mlm": model.mlm(hidden, batch["labels"], batch.get("label_positions"))}
        losses["loss_dec"] = model.mlm(decoded(model, hidden[:, 0], batch), batch["decoder_labels"],
                                       batch.get("decoder_label_positions"))
        losses["loss"] = losses["loss_mlm"] + losses["loss_dec"]
        return losses, stats
    hidden, head = condenser_states(model, batch)
    positions = batch.get("label_positions")
    losses = {"loss_mlm": model.mlm(hidden, batch["labels"], positions),
              "loss_head_mlm": model.mlm(head, batch["labels"], positions)}
    losses["loss"] = losses["loss_mlm"] + losses["loss_head_mlm"]
    if model.objective == "cocondenser":
        opts = model.settings["cocondenser"]
        losses["loss_co"] = model.contrast_term(contrast_inputs(model, batch, hidden),
                                                opts["lambda"], losses, stats, cached)
        losses["loss"] = losses["loss"] + opts["lambda"] * losses["loss_co"]
    return losses, stats


def _scores(model: Any, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of the MLM head's predictions at the labelled positions."""
    selected = labels != -100
    logits = model.mlm_head(hidden[selected]).float()
    if not len(logits):
        return float("nan"), float("nan")
    hits = logits.argmax(dim=-1) == labels[selected]
    return float(hits.float().mean()), float(torch.nn.functional.cross_entropy(logits, labels[selected]))


def _other(cls: torch.Tensor) -> torch.Tensor:
    """Every text's [CLS] replaced by the next text's (the last by the first's)."""
    return cls.roll(1, dims=0)


def probe(model: Any, batch: dict[str, torch.Tensor], hidden: torch.Tensor
          ) -> dict[str, tuple[float, int]]:
    """What each baseline's head is for, on held-out chunks (the caller has set eval mode), each
    with the number of items it averages over (the labelled tokens; coCondenser's agreement: the
    first segments), so that probes.probe_batches pools them over batches:

      probe_head_mlm_accuracy   Condenser / coCondenser: share of masked tokens the head predicts
      loss_head_mlm_heldout     (it sees the early layer's tokens and only the last layer's
                                [CLS]), and its cross-entropy.
      probe_decoder_accuracy    enhanced decoding: share of the chunk's tokens the decoder
      loss_dec_heldout          reconstructs from [CLS] and the positions each row may see, and
                                its cross-entropy; AE / AR decoders: share of the copy's masked
                                tokens (of the next tokens) they predict, and the cross-entropy.
      probe_cls_reliance        all: the head's (decoder's) held-out cross-entropy when each
                                text's [CLS] is swapped for another text's, minus with its own
                                (nats): how much of what the head predicts [CLS] carries, the
                                bottleneck these objectives train. 0 for a head that ignores it.
      probe_view_agreement      coCondenser: share of first segments whose best-scoring second
                                segment (dot product of [CLS]) is the other half of their chunk.
    """
    out: dict[str, float] = {}
    cls = hidden[:, 0]
    if model.objective in ("condenser", "cocondenser"):
        states = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               output_hidden_states=True, **model.unpadded(batch)).hidden_states
        early = states[model.early_layer]
        labels = batch["labels"]
        accuracy, loss = _scores(model, model.condenser(hidden, early, batch["attention_mask"]), labels)
        swapped = torch.cat([_other(cls).unsqueeze(1), hidden[:, 1:]], dim=1)
        _, loss_swapped = _scores(model, model.condenser(swapped, early, batch["attention_mask"]), labels)
        out |= {"probe_head_mlm_accuracy": accuracy, "loss_head_mlm_heldout": loss}
        if model.objective == "cocondenser":
            m = len(hidden) // 2
            scores = obj.fp32_scores(cls[:m], cls[m:])
            agreement = float(
                (scores.argmax(dim=1) == torch.arange(m, device=cls.device)).float().mean())
    elif model.objective == "retromae":
        labels = batch["decoder_labels"]
        accuracy, loss = _scores(model, decoded(model, cls, batch), labels)
        _, loss_swapped = _scores(model, decoded(model, _other(cls), batch), labels)
        out |= {"probe_decoder_accuracy": accuracy, "loss_dec_heldout": loss}
    elif model.objective in mae_decoders.OBJECTIVES:
        states, labels = mae_decoders.decoded(model, cls, batch)
        accuracy, loss = _scores(model, states, labels)
        _, loss_swapped = _scores(model, mae_decoders.decoded(model, _other(cls), batch)[0], labels)
        out |= {"probe_decoder_accuracy": accuracy, "loss_dec_heldout": loss}
    else:
        return {}
    out["probe_cls_reliance"] = loss_swapped - loss
    tokens = int((labels != -100).sum())
    pooled = {key: (value, tokens) for key, value in out.items()}
    if model.objective == "cocondenser":
        pooled["probe_view_agreement"] = agreement, m
    return pooled
