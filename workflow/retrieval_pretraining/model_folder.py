"""Loading a Hugging Face model folder: safetensors weights only, never a pickle.

A `pytorch_model.bin` (or `.pt`, `.pth`, `.ckpt`) is a pickle: loading it runs whatever code the
file holds. Every loader in the package goes through `load_model` (or `check_safetensors` before
copying a folder), which refuses a folder whose weights are only pickled, naming the folder and the
fix, whatever torch's or transformers' defaults happen to be. Imports no torch until it loads.

`check_folder_vocabulary` refuses a folder whose tokenizer has ids its word embeddings have no
row for: encode.load_encoder (every encoding, search, mining, fine-tuning init) and the copy of a
base encoder (pretrain/train.export_base) call it, as does pre-training at start. The tokenizer
they check is loaded by tokenizer_files.auto_tokenizer, which checks the folder's tokenizer files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import REBUILD, BadInput, expect_positive_int, read_json_object, reading

PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
CONVERT = (
    "convert it to safetensors where you trust the file (transformers: "
    "from_pretrained(folder).save_pretrained(folder, safe_serialization=True)), then stage the "
    "converted folder through the `checkpoints` stage (source: local)"
)


class ModelFolderError(BadInput, ValueError):
    """A model folder this package will not load (no config, no safetensors, only a pickle)."""


def check_safetensors(folder: str | Path) -> Path:
    """`folder` when it is a model folder with safetensors weights; else ModelFolderError. A
    .safetensors whose header cannot be read (cut short, overwritten) is InputFileError naming
    it: every loader failed on it with the safetensors library's bare SafetensorError."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    expect_config(folder)
    weights = sorted(folder.glob("*.safetensors"))
    if weights:
        from safetensors import safe_open

        for path in weights:  # the header only: its offsets are checked against the file's size
            with reading(path, "a safetensors file"), safe_open(str(path), framework="numpy"):
                pass
        return folder
    pickles = sorted({p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern)})
    if pickles:
        raise ModelFolderError(
            f"model folder {folder} holds its weights only as a pickle ({', '.join(pickles)}), "
            f"which is never loaded (unpickling runs code from the file); {CONVERT}"
        )
    # REBUILD: a source staging reads says its own fix (checkpoints._source_fix: for the Hub,
    # another revision), which errors.fixed_by puts in its place.
    raise ModelFolderError(f"model folder {folder} has no *.safetensors weights; {REBUILD}")


def expect_config(folder: Path) -> None:
    """Refuse a model folder without config.json (ModelFolderError naming it): every loader reads
    it first. The fix is REBUILD, as for no *.safetensors, so that staging can put a source's
    own fix in its place (checkpoints._source_fix through errors.fixed_by): no rule writes the
    user's folder, a package's or the Hub's."""
    if not (folder / "config.json").is_file():
        raise ModelFolderError(f"model folder {folder} has no config.json; {REBUILD}")


def check_vocabulary(tokenizer: Any, rows: int, checkpoint: str | Path,
                     rows_from: str = "config.json vocab_size") -> None:
    """Raise ModelFolderError, before any work, if `tokenizer` has ids the model's word embeddings
    have no row for (`rows`: the table's, config.json's vocab_size): tokens added to the tokenizer
    and not to the table. The first text holding one, or a masked position replaced by one at
    random, would fail the embedding lookup (IndexError on the CPU, a device-side assert on CUDA)
    hours into a run. A table with more rows than the tokenizer has ids (padded to a multiple of
    64 or 128, common) is fine: the rows no id names are never looked up. `rows_from` says where
    `rows` comes from."""
    vocab = tokenizer.get_vocab()  # added tokens included
    top = max(vocab.values())
    if top >= rows:
        beyond = sorted((i, token) for token, i in vocab.items() if i >= rows)
        named = ", ".join(repr(token) for _, token in beyond[:5])
        raise ModelFolderError(
            f"the tokenizer of {checkpoint} has {len(vocab)} tokens (ids up to {top}), but its "
            f"model's word embeddings have {rows} rows ({rows_from}): {len(beyond)} "
            f"token(s) have no embedding ({named}{', ...' if len(beyond) > 5 else ''}); use the "
            "tokenizer the checkpoint was trained with, or resize the embeddings to at least "
            f"{top + 1} rows (transformers: resize_token_embeddings) and save the model")


CONFIG = "a model folder's config.json"
# The word-embedding rows transformers' BertConfig (and bert.DEFAULTS) gives a BERT config.json
# that leaves out vocab_size: the table every BERT loader builds then.
BERT_VOCAB_SIZE = 30522
# The sizes in config.json the loaders build layers of or compare lengths with: absent (a default
# applies) or a positive integer. Null is refused for BERT (a TypeError in bert.py and in
# transformers' BertModel) and for the position limit the stages read as a length; another
# architecture's null is its config class's to read (GPT-Neo's intermediate_size: 4 x hidden_size).
SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "intermediate_size", "max_position_embeddings")


def read_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's config.json; one cut short, not UTF-8, not JSON or not an object is
    InputFileError naming it and the fix (every loader and stage reads it through this), as is a
    size (SIZES) that is no positive integer: a string or list there was a bare TypeError where a
    loader built a layer of it or compared a length with it, naming neither file nor key."""
    path = Path(folder) / "config.json"
    config = read_json_object(path, CONFIG)
    for key in SIZES:
        if key in config:
            null = config.get("model_type") != "bert" and key != "max_position_embeddings"
            expect_positive_int(config[key], key, path, CONFIG, null=null)
    return config


def check_folder_vocabulary(folder: str | Path, tokenizer: Any) -> None:
    """check_vocabulary of `folder`'s tokenizer against the table its config.json declares (the
    rows every loader builds: a weight of another shape fails to load). A BERT config without a
    vocab_size is checked against BertConfig's default (BERT_VOCAB_SIZE), the table its loaders
    build then (skipped, a tokenizer past it loaded and failed at the first text holding such an
    id); another architecture's default is its config class's, not checked here. A folder
    without config.json is refused by expect_config (staging calls this first: it was a bare
    FileNotFoundError saying to run "the stage that writes it", which no stage is for a source)."""
    expect_config(Path(folder))
    config = read_config(folder)
    rows, rows_from = config.get("vocab_size"), "config.json vocab_size"
    if rows is None and config.get("model_type") == "bert":
        rows, rows_from = BERT_VOCAB_SIZE, "BertConfig's default vocab_size: config.json gives none"
    if isinstance(rows, int):
        check_vocabulary(tokenizer, rows, folder, rows_from)


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
