"""COSTA's text projector on [CLS], and its one file in a model folder (`projector.safetensors`).

COSTA pre-trains a text projector (Tanh(Linear), or Linear in an ablation) on the [CLS] state; the
pre-training job keeps it in `heads.safetensors` beside the encoder (keys `projector.*`). A model
fine-tuned with `finetune.projector` embeds [CLS] through it, so its exported encoder folder holds
`projector.safetensors` (tensors `weight`, `bias`; metadata `kind`): a folder with that file embeds
through the projector wherever it is loaded (`encode.load_encoder`, which every encoding, search,
mining and fine-tuning job uses); a folder without it embeds the raw pooled vector, as before.
Every reader and writer of that file goes through `load` / `save` here (the exporters included).
The folder's sentence-transformers files carry the same projector as a Dense module
(st_export.py), whose weights `save_dense` writes, so sentence-transformers embeds through it too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .contracts.models import DENSE_KEYS, DENSE_WEIGHTS, PROJECTOR_FILE
from .errors import BadInput

FILE = PROJECTOR_FILE
KINDS = ("nonlinear", "linear")


class ProjectorError(BadInput, ValueError):
    """A projector that cannot be read (a heads file without one, a damaged projector file)."""


def build(kind: str, dim: int) -> nn.Module:
    """Tanh(Linear) (`nonlinear`, the paper's), `linear`, or the identity (`none`, an ablation)."""
    if kind == "nonlinear":
        return nn.Sequential(nn.Linear(dim, dim), nn.Tanh())
    if kind == "linear":
        return nn.Linear(dim, dim)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"projector kind {kind!r} is unknown; use nonlinear, linear or none")


def _linear(module: nn.Module) -> nn.Linear:
    return module[0] if isinstance(module, nn.Sequential) else module


def kind_of(module: nn.Module) -> str:
    return "nonlinear" if isinstance(module, nn.Sequential) else "linear"


def from_heads(heads: Path) -> nn.Module:
    """The projector a COSTA pre-training left in its heads file (`projector.0.*`: Tanh(Linear),
    `projector.*`: Linear); ProjectorError when the file holds none (another objective, or COSTA
    pre-trained with `projector: none`)."""
    with safe_open(str(heads), framework="pt") as handle:
        keys = set(handle.keys())
        for prefix, kind in (("projector.0.", "nonlinear"), ("projector.", "linear")):
            if {prefix + "weight", prefix + "bias"} <= keys:
                weight, bias = handle.get_tensor(prefix + "weight"), handle.get_tensor(prefix + "bias")
                break
        else:
            raise ProjectorError(
                f"{heads} holds no text projector (keys {sorted(keys)[:6]}...); "
                "a model's finetune.projector (pretrain.models[].finetune) needs it pre-trained "
                "with objective costa and costa.projector nonlinear or linear")
    module = build(kind, weight.shape[1])
    _linear(module).load_state_dict({"weight": weight, "bias": bias})
    return module


def save(folder: Path, module: nn.Module) -> None:
    """Write `module` (a projector from `build`) as the folder's projector.safetensors."""
    linear = _linear(module)
    tensors = {"weight": linear.weight.detach().cpu().contiguous(),
               "bias": linear.bias.detach().cpu().contiguous()}
    save_file(tensors, str(Path(folder) / FILE), metadata={"kind": kind_of(module)})


def save_dense(module_dir: Path, module: nn.Module) -> None:
    """Write `module`'s Linear as the weights of a sentence-transformers Dense module folder
    (`model.safetensors`, keys `linear.weight` / `linear.bias`, float32: what Dense.load reads)."""
    linear = _linear(module)
    weight_key, bias_key = DENSE_KEYS
    tensors = {weight_key: linear.weight.detach().cpu().float().contiguous(),
               bias_key: linear.bias.detach().cpu().float().contiguous()}
    save_file(tensors, str(Path(module_dir) / DENSE_WEIGHTS), metadata={"kind": kind_of(module)})


def load(folder: Path) -> nn.Module | None:
    """The projector of a model folder, or None when it has no projector.safetensors."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            kind = (handle.metadata() or {}).get("kind")
            weight, bias = handle.get_tensor("weight"), handle.get_tensor("bias")
    except Exception as error:  # a truncated or foreign file: name it, never a traceback
        raise ProjectorError(f"{path} is not a readable projector ({error}); rebuild the "
                             "fine-tuning stage that wrote the folder") from error
    if kind not in KINDS:
        raise ProjectorError(f"{path} has projector kind {kind!r}; expected one of {KINDS}")
    module = build(kind, weight.shape[1])
    _linear(module).load_state_dict({"weight": weight.to(torch.float32),
                                     "bias": bias.to(torch.float32)})
    return module
