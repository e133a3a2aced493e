"""The heads of the baseline objectives, dropped after pre-training: Condenser's head and the
enhanced-decoding (RetroMAE) decoder (the AE / AR decoders in mae_decoders.py use `Layer` too,
the AR one as a GPT-2 block: `pre_norm`).

Both are BERT layers (post-LayerNorm attention + feed-forward, GELU), written out here on
`scaled_dot_product_attention` rather than taken from `transformers` (whose layer classes change
signature between releases), with the query stream and the key/value stream as separate inputs.
Both are initialised as BERT initialises new layers (normal(0, initializer_range) weights, zero
biases, unit LayerNorms): Condenser's and RetroMAE's code apply the backbone's `_init_weights`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    """One BERT layer whose queries come from `query` and keys/values from `context`
    (self-attention when they are the same tensor). `visible`: bool, True where a query may
    attend to a key, broadcastable to [B, heads, Lq, Lk]. With `pre_norm` it is a GPT-2 block
    instead (self-attention only): each sublayer normalises its input and adds its output to it
    un-normalised (`attention_norm`, `output_norm` are GPT-2's ln_1, ln_2)."""

    def __init__(self, config: Any, pre_norm: bool = False):
        super().__init__()
        self.pre_norm = pre_norm
        dim, self.heads = config.hidden_size, config.num_attention_heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.attention_out = nn.Linear(dim, dim)
        self.attention_norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(dim, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, dim)
        self.output_norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob
        init_bert(self, config.initializer_range)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        return x.view(b, length, self.heads, dim // self.heads).transpose(1, 2)

    def _attend(self, query: torch.Tensor, context: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        attended = F.scaled_dot_product_attention(
            self._split(self.query(query)), self._split(self.key(context)),
            self._split(self.value(context)), attn_mask=visible,
            dropout_p=self.attention_dropout if self.training else 0.0,
        ).transpose(1, 2).flatten(2)
        return self.dropout(self.attention_out(attended))

    def _feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.output(F.gelu(self.intermediate(hidden))))

    def forward(self, query: torch.Tensor, context: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            normed = self.attention_norm(query)
            hidden = query + self._attend(normed, normed, visible)
            return hidden + self._feed_forward(self.output_norm(hidden))
        hidden = self.attention_norm(query + self._attend(query, context, visible))
        return self.output_norm(hidden + self._feed_forward(hidden))


def init_bert(module: nn.Module, std: float) -> None:
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.normal_(sub.weight, std=std)
            nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


class CondenserHead(nn.Module):
    """Condenser: `layers` Transformer layers over [last-layer [CLS]; early-layer token states 1..L],
    attending to the real tokens; their outputs are read by the shared MLM head."""

    def __init__(self, config: Any, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(Layer(config) for _ in range(layers))

    def forward(self, last: torch.Tensor, early: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.cat([last[:, :1], early[:, 1:]], dim=1)
        visible = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            hidden = layer(hidden, hidden, visible)
        return hidden


class EnhancedDecoder(nn.Module):
    """RetroMAE's enhanced decoding: one layer whose query stream is the sentence embedding plus
    each position's embedding, and whose key/value stream is [sentence embedding; the embedded
    tokens 1..L] of the unmasked input; row i sees only the positions `visible[:, i]` allows."""

    def __init__(self, config: Any):
        super().__init__()
        self.layer = Layer(config)

    def forward(self, cls: torch.Tensor, embedded: torch.Tensor, positions: torch.Tensor,
                visible: torch.Tensor) -> torch.Tensor:
        """cls [B, D]; embedded [B, L, D] (the embedding layer's output); positions [L, D];
        visible [B, L, L] -> [B, L, D]."""
        query = positions.unsqueeze(0) + cls.unsqueeze(1)
        context = torch.cat([cls.unsqueeze(1), embedded[:, 1:]], dim=1)
        return self.layer(query, context, visible.unsqueeze(1))
