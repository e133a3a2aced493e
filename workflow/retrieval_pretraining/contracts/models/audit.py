"""How `audit` shows and checks model folders (config, weights as safetensors, no pickles, the
tokenizer splitting a sample), the JSON files inside them, and staged tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..base import (
    RANK_FOLDER, RANK_JSON, Audit, Kind, NotAnArtifact, describe_origin, json_kind, read_manifest,
    results_relative, short, show_manifest, show_snakemake_record,
)
from ..tensors.audit import safetensors_tensors
from . import ALL_POOLING_FLAGS, CARD_BLOCK, NORMALIZE_DIR, POOLING_DIR, POOLING_FLAGS, ST_FILES

FILES = [
    ("pretrain/*/encoder/*", "a file of a pre-trained encoder folder",
     "pretrain_model / export_base_encoder"),
    ("finetune/*/encoder/*", "a file of a fine-tuned encoder folder",
     "finetune_stage1 / finetune_stage2"),
    ("checkpoints/*/mlm_head.safetensors",
     "the source checkpoint's trained MLM head (cls.predictions.*), which AutoModel drops",
     "stage_checkpoint"),
    ("checkpoints/*/*", "a file of a staged base checkpoint folder", "stage_checkpoint"),
    ("tokenizers/*/*", "a file of a staged tokenizer folder (what the corpus stages read)",
     "stage_tokenizer"),
]
# Hugging Face folder files (and training.json) shown as they are.
MODEL_FOLDER_JSON = {
    "config.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
    "training.json", "modules.json", "sentence_bert_config.json",
    "config_sentence_transformers.json",
}
# The folders of an encoder where sentence-transformers keeps a module's config.
MODULE_FOLDERS = (POOLING_DIR, NORMALIZE_DIR)
SAMPLE = "Dense retrieval pre-training from Wikipedia."  # what a tokenizer is shown splitting


def is_model_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def check_folder(a: Audit) -> None:
    """A model folder file lies in a model folder; one of a staged tokenizer (results/tokenizers/,
    what the corpus stages read) lies beside tokenizer.json and no weights."""
    folder = a.path.parent
    if (results_relative(a.path) or "").startswith("tokenizers/"):
        a.check(
            "inside a tokenizer folder (tokenizer.json, no weights)",
            (folder / "tokenizer.json").is_file() and not any(folder.glob("*.safetensors")),
        )
    elif folder.name in MODULE_FOLDERS:
        a.check("inside a sentence-transformers module folder of a model folder",
                is_model_folder(folder.parent) and (folder.parent / "modules.json").is_file())
    else:
        a.check("inside a model folder (config.json + safetensors)", is_model_folder(folder))


def is_encoder_folder(folder: Path) -> bool:
    """A pre-trained or fine-tuned encoder (st_export.py makes it a sentence-transformers model)."""
    rel = results_relative(folder) or ""
    return (folder / "modules.json").is_file() or rel.startswith(("pretrain/", "finetune/"))


def sentence_transformers_view(folder: Path, cfg: dict) -> tuple[str, list[str]]:
    """(how sentence-transformers embeds with this folder, what disagrees): the modules, the one
    pooling mode and its width, Normalize exactly when the similarity is cosine, max_seq_length
    within the position embeddings, and the card's `use` block saying the same."""
    from ...st_export import read_card

    problems = []
    listed = json.loads((folder / "modules.json").read_text())
    modules = [m["type"].rsplit(".", 1)[-1] for m in listed]
    if modules[:2] != ["Transformer", "Pooling"] or modules[2:] not in ([], ["Normalize"]):
        problems.append(f"modules {modules} (expected Transformer, Pooling[, Normalize])")
    pooling = json.loads((folder / POOLING_DIR / "config.json").read_text())
    modes = [m for m, flag in POOLING_FLAGS.items() if pooling.get(flag)]
    others = [f for f in ALL_POOLING_FLAGS if pooling.get(f) and f not in POOLING_FLAGS.values()]
    if len(modes) != 1 or others:
        problems.append(f"pooling modes {modes + others} (expected exactly one: cls or mean)")
    if pooling.get("word_embedding_dimension") != cfg.get("hidden_size"):
        problems.append(f"pooling width {pooling.get('word_embedding_dimension')} != hidden size "
                        f"{cfg.get('hidden_size')}")
    similarity = json.loads((folder / "config_sentence_transformers.json").read_text()).get(
        "similarity_fn_name")
    if ("Normalize" in modules) != (similarity == "cosine"):
        problems.append(f"similarity {similarity} with modules {modules}")
    length = json.loads((folder / "sentence_bert_config.json").read_text()).get("max_seq_length")
    if not isinstance(length, int) or length > cfg.get("max_position_embeddings", length):
        problems.append(f"max_seq_length {length} (position embeddings: "
                        f"{cfg.get('max_position_embeddings')})")
    use = (read_card(folder).get(CARD_BLOCK) or {}).get("use") or {}
    stated = {"pooling": modes[0] if len(modes) == 1 else None, "similarity": similarity,
              "p_len": length}
    if any(use.get(k) != v for k, v in stated.items()):
        problems.append(f"the card's use block {use} disagrees with the files ({stated})")
    view = (f"-- sentence-transformers: {' -> '.join(modules)}; pooling {'/'.join(modes)}, "
            f"similarity {similarity}, max_seq_length {length} (queries: q_len {use.get('q_len')})")
    return view, problems


def audit_model(a: Audit, n: int) -> None:
    a.kind = "model folder (Hugging Face)"
    cfg = json.loads((a.path / "config.json").read_text())
    a.say(
        f"-- {cfg.get('model_type')} {cfg.get('architectures')}: "
        f"{cfg.get('num_hidden_layers')} layers, hidden {cfg.get('hidden_size')}, "
        f"vocab {cfg.get('vocab_size')}"
    )
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    weights = sorted(a.path.glob("*.safetensors"))
    for w in weights:
        header, _ = safetensors_tensors(w)
        params = sum(int(np.prod(v["shape"])) for v in header.values())
        dtypes = sorted({v["dtype"] for v in header.values()})
        a.say(f"  {w.name}: {len(header)} tensors, {params:,} parameters, {dtypes}")
        heads = [k for k in header if k.startswith(("cls.", "lm_head", "projector", "decoder"))]
        if heads:
            a.say(f"    heads: {heads[:8]}")
    a.check("weights stored as safetensors", bool(weights))
    pickles = [p.name for p in a.path.iterdir() if p.suffix in (".bin", ".pt", ".pkl", ".pickle")]
    a.check("no pickled files", not pickles, ", ".join(pickles))
    a.check("tokenizer.json present", (a.path / "tokenizer.json").is_file())
    if is_encoder_folder(a.path):
        missing = [f for f in ST_FILES if not (a.path / f).is_file()]
        if a.check("sentence-transformers files present", not missing, ", ".join(missing)):
            view, problems = sentence_transformers_view(a.path, cfg)
            a.say(view)
            a.check("sentence-transformers files agree", not problems, "; ".join(problems))
    training = a.path / "training.json"
    if training.is_file():
        info = json.loads(training.read_text())
        a.say(f"-- training.json keys: {sorted(info)}")
        for key in ("objective", "steps", "tokens_seen", "world_size", "device"):
            if key in info:
                a.say(f"  {key}: {short(json.dumps(info[key]), 200)}")
    if (a.path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(a.path / "tokenizer.json"))
        tok.no_padding()
        tokens = tok.encode(SAMPLE).tokens
        a.say(f"-- tokenizer: {tok.get_vocab_size()} entries; {SAMPLE!r} -> {tokens}")


def audit_model_file(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = f"{a.path.name} (model folder file)"
    describe_origin(a, "a model folder file")
    check_folder(a)
    a.say("  " + short(json.dumps(data, sort_keys=True), 3000))


def audit_tokenizer(a: Audit, n: int) -> None:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(a.path))
    except Exception as error:  # the tokenizers library raises its own exception type
        raise NotAnArtifact(f"{a.path}: not a Hugging Face tokenizer.json ({error})") from error
    a.kind = "tokenizer (Hugging Face tokenizers)"
    describe_origin(a, "a tokenizer.json")
    tok.no_padding()
    tok.no_truncation()
    a.say(f"-- {tok.get_vocab_size()} entries; {SAMPLE!r} -> {tok.encode(SAMPLE).tokens}")
    check_folder(a)
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if tok.token_to_id(t) is None]
    a.check("has BERT's special tokens", not missing, f"missing {missing}" if missing else "")


KINDS = [
    Kind(
        "a model (config.json + safetensors)", RANK_FOLDER + 0, "folder",
        lambda p: "config.json" in p.entries and any(e.endswith(".safetensors") for e in p.entries),
        audit_model,
    ),
    json_kind("a tokenizer.json", RANK_JSON + 5, lambda p: p.name == "tokenizer.json",
              audit_tokenizer),
    json_kind("a model folder file", RANK_JSON + 6, lambda p: p.name in MODEL_FOLDER_JSON,
              audit_model_file),
]
