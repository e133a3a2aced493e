"""BERT's encoder in plain torch: what `transformers.BertModel` computes, read from and written to
the same files (config.json + model.safetensors, the same tensor names).

Why: importing transformers' modelling code costs ~1.4 CPU-seconds a process (v5 imports
torch._dynamo, torch.distributed.tensor and scipy.optimize on the way), and every model job of the
workflow is its own process (the demo runs ~40 of them). The model itself is ~150 lines;
tests/test_bert.py holds it equal to transformers' BertModel (outputs, every layer's states,
gradients, the saved files loaded back by AutoModel). A checkpoint this module cannot reproduce
exactly (another architecture, relative positions, a decoder) is loaded by transformers'
AutoModel instead (`model_folder.load_model`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .errors import reading
from .model_folder import BERT_VOCAB_SIZE, ModelFolderError, read_config

ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PREFIX = "bert."  # BertForMaskedLM / BertForPreTraining keep the encoder under it
# The devices on which unpadded layers (`token_positions`) attend over the real tokens alone, as
# variable-length sequences: on CUDA in bf16/fp16, flash attention's varlen kernel, dropout
# included (the padded path's mask rules flash out). On CPU attention stays padded:
# `varlen_attention`'s CPU stand-in exists for the tests.
VARLEN_DEVICES = ("cuda",)
# How attention is computed: "sdpa" in torch's own choice (a padding mask rules flash out: on
# sm90/sm100 cards with a recent cuDNN torch's CUDA dispatch tries cuDNN's kernel first,
# check_prefer_cudnn_attention, elsewhere the memory-efficient kernel runs); "sdpa_cudnn" with
# cuDNN's kernel first on any card, which takes the mask (where it cannot run the inputs, torch's
# order follows: on CPU the same kernels as "sdpa"); "eager" the softmax written out, as
# transformers' eager path.
IMPLEMENTATIONS = ("sdpa", "sdpa_cudnn", "eager")
CUDNN_FIRST = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
               SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
FLASH_DTYPES = (torch.float16, torch.bfloat16)  # flash attention computes in these alone
# BertModel's defaults (transformers' BertConfig) for keys a config.json may leave out: the sizes
# too (BertConfig fills them: a config.json without intermediate_size was an AttributeError naming
# neither file nor key here, while transformers built 3072); weights of other sizes are refused.
DEFAULTS = {
    "vocab_size": BERT_VOCAB_SIZE, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute",
    "is_decoder": False, "add_cross_attention": False,
}  # fmt: skip


class Config:
    """config.json as attributes (what the package reads: hidden_size, vocab_size, ...); the
    file's other keys are kept and written back unchanged."""

    def __init__(self, raw: dict[str, Any]):
        self.raw = dict(raw)
        self.__dict__.update(DEFAULTS | self.raw)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Config:
        return cls(read_config(folder))


def unsupported(config: Config) -> str | None:
    """Why this module cannot stand in for transformers on `config` (None: it can)."""
    model_type = getattr(config, "model_type", None)
    checks = [
        (model_type == "bert", f"model_type {model_type!r}"),
        (config.position_embedding_type == "absolute",
         f"position_embedding_type {config.position_embedding_type!r}"),
        (config.hidden_act in ACTIVATIONS, f"hidden_act {config.hidden_act!r}"),
        (not config.is_decoder and not config.add_cross_attention, "a decoder"),
    ]  # fmt: skip
    return next((reason for ok, reason in checks if not ok), None)


@dataclass
class Output:
    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class Embeddings(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x + self.position_embeddings(positions)))


@dataclass(frozen=True)
class Layout:
    """Where the real (non-padding) tokens of a [batch, length] batch are: their flat indices, in
    order. Every layer but attention works token by token, so it can skip the padding rows."""

    batch: int
    length: int
    positions: torch.Tensor  # [tokens], indices into batch x length
    # [batch + 1] int32: where each row's tokens start among the real tokens (None: attend padded)
    offsets: torch.Tensor | None = None

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, length, ...] -> [tokens, ...]"""
        return x.flatten(0, 1).index_select(0, self.positions)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[tokens, width] -> [batch, length, width], zeros at the padding."""
        full = x.new_zeros(self.batch * self.length, x.shape[-1])
        return full.index_copy(0, self.positions, x).view(self.batch, self.length, -1)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                     longest: int, dropout_p: float) -> torch.Tensor:
    """Attention of each row's tokens over its own: q, k, v [tokens, heads, head dim] of rows
    stacked as `offsets` [rows + 1] (int32) says, `longest` a bound on a row's length (given, not
    measured: no host wait). On CUDA, flash attention's variable-length kernel, called as the op
    autograd differentiates: scaled_dot_product_attention reaches it only through a jagged nested
    tensor, whose Python dispatch around it made a bert-base step 4.4x slower on an H200
    (benchmarks/RESULTS.md, "The first GPU run"). Elsewhere (tests), the same attention through
    one block-diagonal mask."""
    if q.device.type == "cuda":
        return torch.ops.aten._flash_attention_forward(
            q, k, v, offsets, offsets, longest, longest, dropout_p, False, False)[0]
    lengths = offsets.diff().long()
    row = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), lengths)
    same_row = row[:, None] == row[None, :]
    out = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)),
                                         attn_mask=same_row, dropout_p=dropout_p)
    return out.transpose(0, 1)


class SelfAttention(nn.Module):
    def __init__(self, config: Config, implementation: str):
        super().__init__()
        self.heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.implementation = implementation

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                layout: Layout | None = None) -> torch.Tensor:
        """`mask`: [batch, 1, 1, keys], True where a key may be attended to (None: every key).
        `x`: [batch, length, width], or with `layout` the real tokens only, [tokens, width]: the
        projections run on those rows, the attention on the padded layout, or with the layout's
        offsets on the real tokens alone (variable-length sequences; the mask is then implied).
        Flash attention computes in bf16/fp16 only: an fp32 run on CUDA attends padded."""
        p = self.dropout.p if self.training else 0.0
        # The three projections as one matrix product (the weights stay three modules, named as
        # in the files): an eager bert-base training step then dispatches 2,512 operations, not
        # 2,908, 388 of them casts, not 532 (benchmarks/RESULTS.md, "Why eager MLM ..."). The
        # slices are views whose last dimension is contiguous, as attention's kernels require.
        modules = (self.query, self.key, self.value)
        projected = F.linear(x, torch.cat([m.weight for m in modules]),
                             torch.cat([m.bias for m in modules])).chunk(3, dim=-1)
        if (layout is not None and layout.offsets is not None
                and (x.device.type != "cuda" or projected[0].dtype in FLASH_DTYPES)):
            tokens, width = x.shape
            q, k, v = (t.view(tokens, self.heads, -1) for t in projected)
            return varlen_attention(q, k, v, layout.offsets, layout.length, p).reshape(tokens, width)
        batch, length, width = (layout.batch, layout.length, x.shape[-1]) if layout else x.shape
        q, k, v = ((t if layout is None else layout.pad(t))
                   .view(batch, length, self.heads, -1).transpose(1, 2) for t in projected)
        if self.implementation != "eager":  # the kernel order: BertModel.forward
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:  # "eager": the softmax written out, as transformers' eager path computes it
            scores = (q @ k.transpose(2, 3)) * q.shape[-1] ** -0.5
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            out = F.dropout(scores.softmax(-1), p=p, training=self.training) @ v
        out = out.transpose(1, 2).reshape(batch, length, width)
        return out if layout is None else layout.unpad(out)


class Residual(nn.Module):
    """dense, dropout, then LayerNorm of (that + the block's input): both of BertLayer's outputs."""

    def __init__(self, d_in: int, config: Config):
        super().__init__()
        self.dense = nn.Linear(d_in, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, config: Config, implementation: str):
        super().__init__()
        self.self = SelfAttention(config, implementation)
        self.output = Residual(config.hidden_size, config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                layout: Layout | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask, layout), x)


class Intermediate(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class Layer(nn.Module):
    def __init__(self, config: Config, implementation: str):
        super().__init__()
        self.attention = Attention(config, implementation)
        self.intermediate = Intermediate(config)
        self.output = Residual(config.intermediate_size, config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                layout: Layout | None = None) -> torch.Tensor:
        x = self.attention(x, mask, layout)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, config: Config, implementation: str):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config, implementation)
                                   for _ in range(config.num_hidden_layers))


class Pooler(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class PredictionHeadTransform(nn.Module):
    """BERT's MLM-head transform (dense, activation, LayerNorm), under transformers' names."""

    def __init__(self, config: Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertModel(nn.Module):
    """transformers' BertModel for an encoder: forward(input_ids, attention_mask, token_type_ids,
    output_hidden_states) -> Output; get_input_embeddings(); save_pretrained(folder)."""

    def __init__(self, config: Config, add_pooling_layer: bool = True,
                 attn_implementation: str = "sdpa"):
        super().__init__()
        if attn_implementation not in IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation {attn_implementation!r}: use one of "
                             f"{', '.join(IMPLEMENTATIONS)}")
        self.config = config
        self.attn_implementation = attn_implementation
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config, attn_implementation)
        self.pooler = Pooler(config) if add_pooling_layer else None

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                token_positions: torch.Tensor | None = None) -> Output:
        """`token_positions`: the flat indices of the tokens attention_mask keeps (found on the
        host, masking.with_positions): the layers then compute those rows only, not the padding
        (attention too on VARLEN_DEVICES unless "eager", else padded). The states are the same
        at those tokens, zero at the padding; dropout draws differ from the padded computation."""
        x = self.embeddings(input_ids, token_type_ids)
        # Always the mask when one is given: no host synchronisation to test it for all-ones, and
        # one kernel for a batch with padding and one without (near-ties ranked the same).
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        layout = None if token_positions is None else self._layout(input_ids, attention_mask,
                                                                    token_positions)
        if layout is not None:
            x = layout.unpad(x)
        states = [x]
        # The forward picks each attention's kernel, and its backward follows that choice.
        cudnn_first = self.attn_implementation == "sdpa_cudnn"
        with sdpa_kernel(CUDNN_FIRST, set_priority=True) if cudnn_first else contextlib.nullcontext():
            for layer in self.encoder.layer:
                x = layer(x, mask, layout)
                states.append(x)
        if layout is not None:
            x = layout.pad(x)
            states = [layout.pad(state) for state in states] if output_hidden_states else states
        pooled = self.pooler(x) if self.pooler is not None else None
        return Output(x, pooled, tuple(states) if output_hidden_states else None)

    def _layout(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                token_positions: torch.Tensor) -> Layout:
        batch, length = input_ids.shape
        if self.attn_implementation == "eager" or input_ids.device.type not in VARLEN_DEVICES:
            return Layout(batch, length, token_positions)
        lengths = (input_ids.new_full((batch,), length) if attention_mask is None
                   else attention_mask.sum(1))
        return Layout(batch, length, token_positions,
                      F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)))

    def save_pretrained(self, folder: str | Path, state_dict: dict[str, torch.Tensor] | None = None,
                        safe_serialization: bool = True) -> None:
        """config.json + model.safetensors as transformers writes them for a BertModel."""
        if not safe_serialization:
            raise ValueError("only safetensors are written")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_dict() if state_dict is None else state_dict
        save_file({k: v.detach().contiguous() for k, v in state.items()}, folder / WEIGHTS,
                  metadata={"format": "pt"})
        dtype = str(next(self.parameters()).dtype).removeprefix("torch.")
        config = self.config.raw | {"architectures": ["BertModel"], "dtype": dtype,
                                    "num_hidden_layers": len(self.encoder.layer)}
        config.pop("torch_dtype", None)  # the older spelling of "dtype"
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def weight_files(folder: Path) -> list[Path]:
    """The files transformers reads a model's weights from: model.safetensors or its shards."""
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / WEIGHTS_INDEX).is_file():
        with reading(folder / WEIGHTS_INDEX, "a sharded model's weight index"):
            shards = json.loads((folder / WEIGHTS_INDEX).read_text(encoding="utf-8"))
            shards = list(shards["weight_map"].values())
        return [folder / name for name in sorted(set(shards))]
    return []


def legacy_layernorm_name(key: str) -> str:
    """A tensor name with the old TensorFlow-era LayerNorm names (`gamma`, `beta`) made current."""
    if ".LayerNorm." in key or key.startswith("LayerNorm."):
        key = key.replace(".gamma", ".weight").replace(".beta", ".bias")
    return key


def _own_name(key: str) -> str:
    """A checkpoint's tensor name as BertModel names it (prefix dropped, old LayerNorm names)."""
    return legacy_layernorm_name(key.removeprefix(PREFIX))


def load(folder: str | Path, add_pooling_layer: bool = True,
         attn_implementation: str = "sdpa") -> BertModel:
    """A BertModel from a folder's config.json and safetensors weights, in eval mode (as
    transformers' from_pretrained returns it), its parameters float32 whatever the files store
    (see `model_folder.load_model`). Loading leaves torch's random generator as it found
    it, as transformers' does: a seeded run initialises its heads the same either way. (Not built
    on the meta device: its initialisers import torch._dynamo, ~1 s.) A missing pooler is
    initialised as transformers initialises one (normal, std initializer_range; zero bias) from its
    own generator; any other missing tensor is an error."""
    folder = Path(folder)
    config = Config.from_folder(folder)
    if config.hidden_size % config.num_attention_heads:  # transformers: a ValueError at build
        raise ModelFolderError(
            f"{folder / 'config.json'}: hidden_size {config.hidden_size} is not a multiple of "
            f"num_attention_heads {config.num_attention_heads} (BertConfig's default 12 where "
            "it leaves it out); state the checkpoint's num_attention_heads")
    with torch.random.fork_rng(devices=[]):  # the initial values are overwritten below
        model = BertModel(config, add_pooling_layer, attn_implementation)
    wanted = model.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(folder):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if (name := _own_name(key)) in wanted:
                    tensors[name] = handle.get_tensor(key)
    missing = sorted(set(wanted) - set(tensors))
    if add_pooling_layer and set(missing) == {"pooler.dense.weight", "pooler.dense.bias"}:
        generator = torch.Generator().manual_seed(0)
        shape = wanted["pooler.dense.weight"].shape
        tensors["pooler.dense.weight"] = torch.empty(shape).normal_(
            0.0, config.initializer_range, generator=generator)
        tensors["pooler.dense.bias"] = torch.zeros(shape[0])
        missing = []
    wrong = [f"{name} is {list(tensors[name].shape)}, not {list(wanted[name].shape)}"
             for name in wanted if name in tensors and tensors[name].shape != wanted[name].shape]
    if wrong:  # load_state_dict: a RuntimeError naming neither the folder nor config.json
        raise ModelFolderError(
            f"model folder {folder}: its weights do not have the sizes {folder / 'config.json'} "
            f"states or leaves to BertConfig's defaults ({'; '.join(wrong[:3])}"
            f"{' ...' if len(wrong) > 3 else ''}); fix its sizes (hidden_size, "
            "intermediate_size, num_attention_heads, ...) or rebuild it with the stage that "
            "writes it")
    if missing:
        raise ModelFolderError(f"model folder {folder}: its weights lack {', '.join(missing[:5])}"
                               f"{' ...' if len(missing) > 5 else ''}; rebuild it with the stage "
                               "that writes it")
    model.load_state_dict(tensors, strict=True)  # copied into the float32 parameters
    return model.eval()
