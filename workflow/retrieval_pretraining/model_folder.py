"""Loading a Hugging Face model folder: safetensors weights only, never a pickle.

A `pytorch_model.bin` (or `.pt`, `.pth`, `.ckpt`) is a pickle: loading it runs whatever code the
file holds. Every loader in the package goes through `load_model` (or `check_safetensors` before
copying a folder), which refuses a folder whose weights are only pickled, naming the folder and the
fix, whatever torch's or transformers' defaults happen to be. Imports no torch until it loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import BadInput

PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
CONVERT = (
    "convert it to safetensors where you trust the file (transformers: "
    "from_pretrained(folder).save_pretrained(folder, safe_serialization=True)), then stage the "
    "converted folder through the `checkpoints` stage (source: local)"
)


class ModelFolderError(BadInput, ValueError):
    """A model folder this package will not load (no config, no safetensors, only a pickle)."""


def check_safetensors(folder: str | Path) -> Path:
    """`folder` when it is a model folder with safetensors weights; else ModelFolderError."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ModelFolderError(f"model folder {folder} has no config.json; build its rule first")
    if any(folder.glob("*.safetensors")):
        return folder
    pickles = sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)})
    if pickles:
        raise ModelFolderError(
            f"model folder {folder} holds its weights only as a pickle ({', '.join(pickles)}), "
            f"which is never loaded (unpickling runs code from the file); {CONVERT}"
        )
    raise ModelFolderError(
        f"model folder {folder} has no *.safetensors weights; rebuild it with the stage that "
        "writes it (from the Hub: a revision that has safetensors)"
    )


def load_model(folder: str | Path, *, native: bool = True, **kwargs: Any):
    """The encoder of a local folder's safetensors (no download, no remote code, no pickle): a
    BERT checkpoint as `bert.BertModel` (transformers' computation without its ~1.4 CPU-s import),
    any other architecture, or `native=False`, through transformers' AutoModel. kwargs:
    add_pooling_layer, attn_implementation.

    Parameters come out float32 whatever the folder stores (transformers 5 would load a config's
    float16 / bfloat16): training keeps fp32 master weights (at lr 5e-6 most AdamW updates to an
    fp16 weight round away; bf16 autocast assumes fp32 parameters), CPU encoding computes in fp32,
    and mixed precision is autocast's job. Staging (checkpoints.py) therefore writes float32."""
    folder = check_safetensors(folder)
    if native:
        from . import bert

        if bert.unsupported(bert.Config.from_folder(folder)) is None and bert.weight_files(folder):
            return bert.load(folder, **kwargs)
    import torch
    from transformers import AutoModel

    if kwargs.get("attn_implementation") == "sdpa_cudnn":  # bert.py's kernel order: ours alone
        kwargs["attn_implementation"] = "sdpa"
    return AutoModel.from_pretrained(
        folder, local_files_only=True, trust_remote_code=False, use_safetensors=True,
        dtype=torch.float32, **kwargs
    )
