"""The WordPiece tokenizer the corpus stages read, and its fingerprint.

Loaded from a staged tokenizer (or checkpoint) folder without the truncation and padding a saved
tokenizer may carry; "[SEP]" written in an article stays text. The vocabulary in id order (added
tokens included) is what word boundaries are read from, and its sha256 (recorded in the chunk
manifests) is what the span stage and pre-training compare their tokenizer against.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from . import artifacts
from .config import ConfigError
from .errors import expect_positive_int, expect_token, reading

def load_tokenizer(checkpoint_dir: str | os.PathLike):
    """The checkpoint's fast tokenizer, without the truncation/padding a saved one may carry."""
    from tokenizers import Tokenizer

    path = Path(checkpoint_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} missing: stage the tokenizer first (rule stage_tokenizer)"
        )
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.encode_special_tokens = True  # "[SEP]" written in an article is text, not a separator
    return tokenizer


# What a checkpoint or tokenizer folder's manifest.json is, as errors name it.
MANIFEST = "a staged model folder's manifest"

# BertModel's default (transformers' BertConfig, bert.DEFAULTS) when config.json leaves it out.
DEFAULT_POSITIONS = 512


def position_limit(folder: str | os.PathLike) -> int | None:
    """How many tokens the folder's model can encode (`max_position_embeddings`): from its
    config.json (a checkpoint), else from its manifest (a staged tokenizer records its source's);
    None when neither says (a tokenizer staged before it was recorded). One that is no positive
    integer is InputFileError naming the file (errors.expect_positive_int); in config.json a
    null too, as model_folder.read_config refuses it (which every loader reads the folder
    through: a null read here as 512 passed chunking, then failed at the first load), while one
    left out is BertModel's default there as here."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        # artifacts, not model_folder.read_config: that would add model_folder.py and bert.py to
        # the code of every chunk and span job
        what = "a model folder's config.json"
        config = artifacts.read_json_object(folder / "config.json", what)
        if "max_position_embeddings" not in config:
            return DEFAULT_POSITIONS
        return expect_positive_int(config["max_position_embeddings"], "max_position_embeddings",
                                   folder / "config.json", what, null=False)
    if (folder / "manifest.json").is_file():
        manifest = artifacts.read_manifest(folder / "manifest.json", MANIFEST)
        return expect_positive_int(manifest["stats"].get("max_position_embeddings"),
                                   "stats.max_position_embeddings", folder / "manifest.json",
                                   MANIFEST)
    return None


def check_max_len(max_len: int, folder: str | os.PathLike, what: str) -> None:
    """Refuse chunks longer than the model can encode: they would pass every corpus stage, then
    fail at pre-training's first forward (a device-side assert on CUDA), hours later."""
    limit = position_limit(folder)
    if limit is not None and max_len > limit:
        raise ConfigError(
            f"{what} is {max_len} tokens, but the checkpoint {folder} has max_position_embeddings "
            f"{limit}: it cannot encode chunks that long; set corpus.max_len <= {limit} (or use a "
            "checkpoint with more positions)"
        )


def tokens_by_id(vocab: dict[str, int]) -> list[str]:
    """The vocabulary (token -> id, added tokens included) as a list indexed by id."""
    tokens = [""] * (max(vocab.values()) + 1)
    for token, idx in vocab.items():
        tokens[idx] = token
    return tokens


def vocab_sha256(tokens: list[str]) -> str:
    """The vocabulary's fingerprint, recorded in the chunk manifests and checked by pre-training."""
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()


def tokenizer_info(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """Special token ids, the vocabulary in id order, its hash, and a name for manifests."""
    checkpoint_dir = Path(checkpoint_dir)
    with reading(checkpoint_dir / "tokenizer.json", "a tokenizer.json"):
        model = json.loads((checkpoint_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]
        kind, prefix = model["type"], model.get("continuing_subword_prefix")
    if kind != "WordPiece":
        raise ConfigError(
            f"{checkpoint_dir}/tokenizer.json is a {kind} tokenizer; chunking "
            "needs a "
            "WordPiece (BERT) tokenizer to find word boundaries"
        )
    config_path = checkpoint_dir / "tokenizer_config.json"
    tok_config = (artifacts.read_json_object(config_path, "a tokenizer_config.json")
                  if config_path.is_file() else {})
    tokenizer = load_tokenizer(checkpoint_dir)
    tokens = tokens_by_id(tokenizer.get_vocab(with_added_tokens=True))
    source, staged = {}, {}
    if (checkpoint_dir / "manifest.json").is_file():
        manifest = artifacts.read_manifest(checkpoint_dir / "manifest.json", MANIFEST)
        source, staged = manifest.get("params", {}), manifest.get("stats", {})
    special = {  # a token stored as an AddedToken object is read as transformers reads it
        name: tokenizer.token_to_id(expect_token(tok_config.get(f"{name}_token"), f"{name}_token",
                                                 config_path, "a tokenizer_config.json")
                                    or default)
        for name, default in (
            ("cls", "[CLS]"),
            ("sep", "[SEP]"),
            ("pad", "[PAD]"),
            ("unk", "[UNK]"),
            ("mask", "[MASK]"),
        )
    }
    if special["cls"] is None or special["sep"] is None:
        raise ConfigError(f"{checkpoint_dir}: the tokenizer has no [CLS]/[SEP] token")
    return {
        "name": f"{checkpoint_dir.name} ({tok_config.get('tokenizer_class', 'WordPiece')})",
        "source": source.get("location"),
        # The Hub commit it was staged from (None: not from the Hub), compared by the pre-training
        # stage with its checkpoint's: both are staged separately from `main` when unpinned.
        "revision": staged.get("resolved_revision"),
        "vocab_size": len(tokens),
        "vocab_sha256": vocab_sha256(tokens),
        "continuation_prefix": prefix or "##",
        "special_ids": special,
        "tokens": tokens,
    }
