"""The Bag-of-Word paper's decoder baselines (its Tables 1, 2, 5): a shallow Transformer decoder
conditioned on the encoder's last-layer [CLS] reconstructs the input, beside the encoder's own MLM
(tested against per-example loops in tests/test_pretrain_mae_decoders.py).

  ae_decoder   auto-encoding: `ae_decoder.layers` BERT layers (bidirectional over the real
               tokens) read [CLS; the embedded tokens 1..L of a second masked copy of the chunk]
               (`ae_decoder.mask_rate`, BERT's 80/10/10, whole words with `mlm.whole_word`) and
               predict the copy's masked tokens through the shared MLM head.
  ar_decoder   auto-regressive: `ar_decoder.layers` GPT-2 blocks (pre-LayerNorm, causal, a final
               LayerNorm) read [CLS; the embedded tokens 1..L of the unmasked chunk]; position t
               predicts token t + 1 (the first inner token from [CLS] alone, [SEP] last), through
               the shared MLM head.

Loss = encoder MLM + `weight` x the decoder's mean cross-entropy. Facts from the authors' public
code (bowdpr `pretrain/mae_decoder/`, model and collator): both decoders 1 layer by default, the
MLM head and embedding layer shared with the encoder, [CLS] put in place of the decoder input's
first embedding, both coefficients 1.0, the AE copy masked at 0.15 by default, AR labels = the
input ids with padding ignored, shifted by one. The decoders are dropped at export.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .heads import Layer

OBJECTIVES = ("ae_decoder", "ar_decoder")


class AutoEncodingDecoder(nn.Module):
    """BERT layers over [CLS; embedded tokens 1..L], attending to every real token."""

    def __init__(self, config: Any, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(Layer(config) for _ in range(layers))

    def forward(self, cls: torch.Tensor, embedded: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.cat([cls.unsqueeze(1), embedded[:, 1:]], dim=1)
        visible = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            hidden = layer(hidden, hidden, visible)
        return hidden


class AutoRegressiveDecoder(nn.Module):
    """GPT-2 blocks over [CLS; embedded tokens 1..L]: dropout on the input, causal attention over
    the real tokens, a final LayerNorm. GPT-2's initialisation: the output projection of each
    sublayer drawn with std initializer_range / sqrt(2 x layers)."""

    def __init__(self, config: Any, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(Layer(config, pre_norm=True) for _ in range(layers))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        std = config.initializer_range / math.sqrt(2 * layers)
        for layer in self.layers:
            nn.init.normal_(layer.attention_out.weight, std=std)
            nn.init.normal_(layer.output.weight, std=std)

    def forward(self, cls: torch.Tensor, embedded: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(torch.cat([cls.unsqueeze(1), embedded[:, 1:]], dim=1))
        length = hidden.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=hidden.device).tril()
        # Padding rows attend to [CLS] (always real), so no softmax is empty.
        visible = causal[None, None] & attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            hidden = layer(hidden, hidden, visible)
        return self.norm(hidden)


def add_heads(model: Any, config: Any) -> None:
    if model.objective == "ae_decoder":
        model.ae_decoder = AutoEncodingDecoder(config, model.settings["ae_decoder"]["layers"])
    elif model.objective == "ar_decoder":
        model.ar_decoder = AutoRegressiveDecoder(config, model.settings["ar_decoder"]["layers"])


def next_token_labels(ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Position t's target: token t + 1 of the chunk ([SEP] included); -100 at the last real
    position and on padding."""
    labels = ids.masked_fill(attention_mask == 0, -100)
    return torch.cat([labels[:, 1:], labels.new_full((len(ids), 1), -100)], dim=1)


def decoded(model: Any, cls: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the decoder's outputs [B, L, D] from `cls`, their target ids with -100 where none)."""
    embeddings = model.encoder.embeddings
    if model.objective == "ae_decoder":
        out = model.ae_decoder(cls, embeddings(input_ids=batch["decoder_input_ids"]), batch["attention_mask"])
        return out, batch["decoder_labels"]
    ids = batch["original_ids"]
    out = model.ar_decoder(cls, embeddings(input_ids=ids), batch["attention_mask"])
    return out, next_token_labels(ids, batch["attention_mask"])


def forward(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Loss terms (total under "loss"): encoder MLM + weight x decoder cross-entropy."""
    hidden = model.hidden(batch)
    losses = {"loss_mlm": model.mlm(hidden, batch["labels"], batch.get("label_positions"))}
    states, labels = decoded(model, hidden[:, 0], batch)
    # The AE decoder's targets come with the batch (their positions too); the AR decoder's next
    # tokens are made here on the device and are nearly every position: the head takes them all.
    positions = batch.get("decoder_label_positions") if model.objective == "ae_decoder" else None
    losses["loss_dec"] = model.mlm(states, labels, positions)
    losses["loss"] = losses["loss_mlm"] + model.settings[model.objective]["weight"] * losses["loss_dec"]
    return losses
