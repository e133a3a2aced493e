"""The encoder being pre-trained plus the objective's heads (all heads are dropped at export).

`Pretrainer.forward(batch, progress)` returns a dict of loss terms with the total under "loss".
A contrastive objective's term is split into what it contrasts (`contrast_inputs`) and the loss
over it (`contrast_loss`), so that a gathering row can cache that term's gradient over the
micro-batches of a step (contrast_cache.py; `forward(..., cached=...)`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from .. import projector as text_projector
from .. import bert
from ..bert import PredictionHeadTransform
from ..model_folder import load_model
from . import baselines
from . import objectives as obj

log = logging.getLogger(__name__)

HEAD_PREFIXES = ("cls.predictions.", "mlm_head.")  # where a checkpoint may keep its MLM head


class MLMHead(nn.Module):
    """BERT's MLM head (dense + GELU + LayerNorm, then the word embeddings transposed + a bias)."""

    def __init__(self, config: Any, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # A plain list so the tied embedding is not registered twice as a parameter of this module.
        self._tied = [word_embeddings]
        nn.init.normal_(self.transform.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.transform.dense.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden), self._tied[0].weight, self.bias)


def load_mlm_head(head: MLMHead, checkpoint: Path) -> bool:
    """Copy a trained MLM head from the checkpoint's safetensors files if it has one."""
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for prefix in HEAD_PREFIXES:
                keys = [k for k in handle.keys() if k.startswith(prefix)]
                if not any("transform.dense.weight" in k for k in keys):
                    continue
                state = {}
                for key in keys:
                    # Legacy gamma/beta: folders staged before staging renamed them.
                    short = key[len(prefix):].removeprefix("predictions.")
                    short = bert.legacy_layernorm_name(short)
                    short = "bias" if short == "decoder.bias" else short
                    if short.startswith("transform.") or short == "bias":
                        state[short] = handle.get_tensor(key)
                head.load_state_dict(state, strict=True)
                return True
    return False


def load_heads(model: nn.Module, path: Path) -> set[str]:
    """Copy the tensors of a heads.safetensors (what train.py saves beside an encoder) that this
    model has, with the same shape (the MLM head always; a projector or decoder when the objective
    has one); return their names. The others are left as initialised."""
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("encoder.")}
    loaded = {}
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            if key in own and tuple(handle.get_slice(key).get_shape()) == tuple(own[key].shape):
                loaded[key] = handle.get_tensor(key)
    model.load_state_dict(loaded, strict=False)
    return set(loaded)


def cpdae_decoder(dim: int, vocab_size: int, eps: float) -> nn.Module:
    """CPDAE's MLP decoder: two FFN blocks (Linear, GELU, LayerNorm), then |V| logits."""
    return nn.Sequential(
        nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim, eps=eps),
        nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim, eps=eps),
        nn.Linear(dim, vocab_size),
    )


class Pretrainer(nn.Module):
    def __init__(self, checkpoint: Path, settings: dict[str, Any], attn_implementation: str = "sdpa",
                 bag_prior: float | None = None, init_heads: Path | None = None):
        super().__init__()
        self.objective = settings["objective"]
        self.settings = settings
        self.encoder = load_model(checkpoint, attn_implementation=attn_implementation)
        self.unpad = bool(settings.get("trainer", {}).get("unpad")) \
            and isinstance(self.encoder, bert.BertModel)
        if getattr(self.encoder, "pooler", None) is not None:
            # Unused by every objective (and by fine-tuning); frozen so DDP sees no unused grads,
            # exported unchanged.
            self.encoder.pooler.requires_grad_(False)
        config = self.encoder.config
        self.vocab_size = config.vocab_size
        self.mlm_head = MLMHead(config, self.encoder.get_input_embeddings())
        self.fresh_head = not load_mlm_head(self.mlm_head, checkpoint)
        if self.fresh_head:
            log.warning(
                "checkpoint %s has no MLM head: using a freshly initialised head tied to the word "
                "embeddings (its early MLM loss measures the head learning, not the encoder)", checkpoint,
            )
        dim = config.hidden_size
        if self.objective == "costa":
            self.projector = text_projector.build(settings["costa"]["projector"], dim)
        if self.objective in ("cpdae", "cpdae_r"):
            self.decoder = cpdae_decoder(dim, self.vocab_size, config.layer_norm_eps)
            if bag_prior:
                # Start the sigmoid outputs at the data's word-set density instead of 0.5: otherwise
                # the first thousands of steps only learn "most words are absent" via the bias.
                nn.init.constant_(self.decoder[-1].bias, math.log(bag_prior / (1 - bag_prior)))
        baselines.add_heads(self, config, checkpoint)  # Condenser's head, the enhanced decoder
        if init_heads is not None:  # continued pre-training: the heads the init model trained
            loaded = load_heads(self, init_heads)
            self.fresh_head = self.fresh_head and not any(k.startswith("mlm_head.") for k in loaded)
            log.info("heads from %s: %s", init_heads, ", ".join(sorted(loaded)) or "none apply")
        # from_pretrained returns the encoder in eval mode (dropout off); a new Pretrainer starts in
        # training mode like any new module. Call .eval() for deterministic passes.
        self.train()

    def unpadded(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The encoder's keyword for skipping the padding rows (trainer.unpad, bert.BertModel
        only; transformers' models have no such path): its real tokens' flat indices."""
        return {"token_positions": batch["token_positions"]} \
            if self.unpad and "token_positions" in batch else {}

    def hidden(self, batch: dict[str, torch.Tensor], ids: str = "input_ids") -> torch.Tensor:
        """The last layer's states of the batch's token ids `ids` (its masked input, or with
        "original_ids" the unmasked text: the same attention mask and real tokens)."""
        return self.encoder(input_ids=batch[ids], attention_mask=batch["attention_mask"],
                            **self.unpadded(batch)).last_hidden_state

    def mlm(self, hidden: torch.Tensor, labels: torch.Tensor,
            positions: torch.Tensor | None = None) -> torch.Tensor:
        """The MLM head's cross-entropy at the predicted positions (labels != -100).

        `positions`: their flat indices from the data (masking.with_positions): the head
        runs on those rows only (cheap vocab matmul), selected without waiting for the device.
        None: every position goes through the head and the others are ignored by the loss, for
        targets made on the device whose positions are nearly all predicted (the AR decoder's)."""
        hidden, labels = hidden.flatten(0, 1), labels.flatten()
        if positions is not None:
            hidden, labels = hidden.index_select(0, positions), labels.index_select(0, positions)
        return obj.mlm_loss(self.mlm_head(hidden), labels)

    def bow_logits(self, cls: torch.Tensor) -> torch.Tensor:
        """[CLS] projected to the vocabulary as the BoW objective does it."""
        if self.settings["bow"]["form"] == "paper":
            return cls @ self.encoder.get_input_embeddings().weight.T  # h_CLS . E^T
        return self.mlm_head(cls)  # the authors' code: the whole MLM head on [CLS]

    def project_text(self, cls: torch.Tensor) -> torch.Tensor:
        """COSTA's text vector: the projector on [CLS] in fp32, also inside a bf16 autocast region.
        Its output is what fp32_scores compares with the spans; computed in bf16 it would already
        have lost the precision those scores keep (BERT-size logits moved by up to ~0.45).
        Outside autocast (fp32 on CPU) this is the plain projector, bit for bit."""
        with torch.autocast(device_type=cls.device.type, enabled=False):
            return self.projector(obj.upcast(cls))

    # ---- the contrast set: its inputs from a micro-batch, and its loss over one or many ----------
    # Split so that the trainer can cache the contrastive term's gradient (contrast_cache.py): the
    # inputs of every micro-batch of a step first, without gradients, then the loss over all of
    # them, then each micro-batch again with that loss's gradient in place of its own term.
    def contrast_inputs(self, batch: dict[str, torch.Tensor],
                        hidden: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """What the objective contrasts, from the micro-batch `batch` (whose last-layer states
        `hidden` the caller may have): per text ("text", "spans", "span_mask": COSTA) or per view
        ("views": [2m, ...] stacked [view 0 of the m texts; view 1], CPDAE's word logits, CPDAE_R's
        and coCondenser's [CLS]). Computed in the order forward computes it, so a pass with the
        same seed draws the same dropout."""
        if self.objective in baselines.OBJECTIVES:
            return baselines.contrast_inputs(self, batch, hidden)
        if hidden is None:
            hidden = self.hidden(batch)
        cls = hidden[:, 0]
        if self.objective == "costa":
            source = hidden
            if self.settings["costa"]["span_pass"] == "unmasked":
                source = self.hidden(batch, "original_ids")
            return {"text": self.project_text(cls),
                    "spans": obj.span_means(source, batch["span_start"], batch["span_end"]),
                    "span_mask": batch["span_mask"]}
        return {"views": self.decoder(cls) if self.objective == "cpdae" else cls}

    def contrast_loss(self, inputs: dict[str, torch.Tensor], stats: dict[str, Any]) -> torch.Tensor:
        """The objective's contrastive loss over `inputs` (one micro-batch's or several joined),
        with the candidates of every process when the objective gathers."""
        if self.objective in baselines.OBJECTIVES:
            return baselines.contrast_loss(self, inputs, stats)
        if self.objective == "costa":
            opts = self.settings["costa"]
            return obj.costa_loss(inputs["text"], inputs["spans"], inputs["span_mask"],
                                  temperature=opts["temperature"], gather=opts["gather_negatives"],
                                  stats=stats)
        opts = self.settings["cpdae"]
        if self.objective == "cpdae":
            temperature = opts["temperature"] if opts["temperature"] is not None else 1.0
            return obj.cpdae_contrastive(inputs["views"], temperature, opts["gather_negatives"], stats)
        temperature = opts["temperature"] if opts["temperature"] is not None else 0.1
        return obj.dense_contrastive(inputs["views"], temperature, opts["gather_negatives"], stats)

    def contrast_term(self, inputs: dict[str, torch.Tensor], weight: float,
                      losses: dict[str, torch.Tensor], stats: dict[str, Any],
                      cached: dict[str, Any] | None) -> torch.Tensor:
        """The contrastive loss of this micro-batch's `inputs`, or with `cached` (the step's loss
        over every micro-batch, its gradient with respect to this micro-batch's inputs and its
        statistics: contrast_cache.py) that loss's value, without gradient, while
        losses["contrast_surrogate"] = weight x <inputs, gradient> carries its gradient into the
        encoder: the trainer adds it to the backward pass, outside the accumulation's division."""
        if cached is None:
            return self.contrast_loss(inputs, stats)
        stats.update(cached["stats"])
        losses["contrast_surrogate"] = weight * sum(
            (inputs[key].float() * grad).sum() for key, grad in cached["grads"].items())
        return cached["value"]

    def forward(self, batch: dict[str, torch.Tensor], progress: float | torch.Tensor = 0.0,
                cached: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
        """`progress`: the share of training done (step / steps), for schedules inside the loss
        (BoW's weight). The trainer passes it as a float64 tensor: torch.compile would guard on a
        Python float's value and recompile, or fail, at every step. `cached`: the contrastive
        term's cached gradient for this micro-batch (contrast_term)."""
        if self.objective in baselines.OBJECTIVES:
            losses, stats = baselines.forward(self, batch, cached)
            return losses | _on_device(stats, losses["loss"])
        hidden = self.hidden(batch)
        losses = {"loss_mlm": self.mlm(hidden, batch["labels"], batch.get("label_positions"))}
        stats: dict[str, float | torch.Tensor] = {}
        cls = hidden[:, 0]
        if self.objective == "costa":
            opts = self.settings["costa"]
            losses["loss_gwc"] = self.contrast_term(self.contrast_inputs(batch, hidden),
                                                    opts["lambda"], losses, stats, cached)
            losses["loss"] = losses["loss_mlm"] + opts["lambda"] * losses["loss_gwc"]
        elif self.objective in ("cpdae", "cpdae_r"):
            opts = self.settings["cpdae"]
            inputs = self.contrast_inputs(batch, hidden)
            logits = inputs["views"] if self.objective == "cpdae" else self.decoder(cls)  # [2m, V]
            bag = obj.multi_hot(batch["bag_ids"], batch["bag_mask"], self.vocab_size)
            losses["loss_rec"] = obj.reconstruction_loss(logits, bag.repeat(2, 1), opts["reconstruction"])
            losses["loss_cl"] = self.contrast_term(inputs, opts["lambda"], losses, stats, cached)
            losses["loss"] = losses["loss_rec"] + losses["loss_mlm"] + opts["lambda"] * losses["loss_cl"]
        elif self.objective == "bow":
            opts = self.settings["bow"]
            losses["loss_bow"] = obj.bow_loss(self.bow_logits(cls), batch["bag_ids"],
                                              batch["bag_mask"], opts["reduction"])
            weight = opts["weight"]
            if opts["weight_schedule"] == "cosine":
                weight = obj.cosine_weight(progress, opts["weight"], opts["weight_end"])
            # fp32 (a bf16 [CLS] under autocast must not set the weight's precision)
            weight = weight.float() if torch.is_tensor(weight) else cls.new_full((), weight,
                                                                                 dtype=torch.float32)
            losses["bow_weight"] = weight
            losses["loss"] = losses["loss_mlm"] + weight * losses["loss_bow"]
        else:
            losses["loss"] = losses["loss_mlm"]
        # Logged beside the losses (averaged over micro-batches and processes like them): the
        # candidates each contrastive anchor is scored against, as fine-tuning logs its negatives.
        return losses | _on_device(stats, losses["loss"])


def _on_device(stats: dict[str, float | torch.Tensor], like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics as tensors on the losses' device, so that the trainer reads every value of a step
    in one copy. A number known on the host is written there by a fill kernel, which unlike a copy
    from host memory never waits for the device."""
    return {key: value if torch.is_tensor(value) else like.new_full((), value, dtype=torch.float32)
            for key, value in stats.items()}
