"""How `audit` shows and checks model folders (config, weights as safetensors, finite and the
files whose sha256 the manifest records, no pickles, the tokenizer splitting a sample), the JSON
files inside them, and staged tokenizers (a tokenizer.json, and a tokenizer folder against what
its manifest records)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from ... import artifacts
from ...errors import (
    REBUILD, BadInput, InputFileError, expect_list, expect_object, expect_section, one_line,
    read_json, read_json_object, reading,
)
from ...model_folder import read_config
from ..base import (
    RANK_FOLDER, RANK_JSON, Audit, Kind, NotAnArtifact, describe_origin, folder_stage, input_path,
    json_kind, read_manifest, results_relative, short, show_manifest, show_snakemake_record,
)
from ..tensors.audit import safetensors_tensors, tensors_not_finite
from . import (ALL_POOLING_FLAGS, CARD_BLOCK, DENSE, DENSE_ACTIVATION, DENSE_KEYS, DENSE_WEIGHTS,
               MODULE_FOLDERS, POOLING_DIR, POOLING_FLAGS, PROJECTOR_FILE, ST_FILES, dense_config,
               module_dir, module_entries)

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
SAMPLE = "Dense retrieval pre-training from Wikipedia."  # what a tokenizer is shown splitting
# What the folder's JSON files are read as (the errors name them so).
MODULES = "a sentence-transformers module list"
TRAINING = "an encoder's training.json"
CARD = "a model card's front matter"
T = TypeVar("T")


def readable(a: Audit, name: str, read: Callable[[], T]) -> T | None:
    """read() of the folder's file `name`, or None after a failed check `<name> readable` naming
    the file, the member and what is wrong: a file cut short, another JSON value than the one
    read, or a member of another type was "could not be audited" (exit 3), naming neither."""
    try:
        value = read()
    except (BadInput, OSError) as error:
        a.check(f"{name} readable", False, one_line(error))
        return None
    return value


def read_modules(path: Path) -> list[dict[str, Any]]:
    """modules.json: a list of objects, each with a string `path` and `type` (what module_dir
    and the comparison with module_entries read)."""
    listed = expect_list(read_json(path, MODULES), "the file", path, MODULES)
    for number, entry in enumerate(listed):
        where = f"{path}, entry {number}"
        expect_object(entry, where, "a modules.json entry")
        for key in ("path", "type"):
            if not isinstance(entry.get(key), str):
                raise InputFileError(
                    f"{where}: {key} is {json.dumps(entry.get(key))}, not a string (read as "
                    f"{MODULES}); {REBUILD}")
    return listed


def read_training(path: Path) -> dict[str, Any]:
    """training.json, with its `data` (trained-on file -> {sha256}) an object of objects."""
    info = read_json_object(path, TRAINING)
    for name, entry in expect_section(info, "data", path, TRAINING).items():
        if entry is not None:
            expect_object(entry, path, f"its entry data[{name!r}]")
    return info


def card_use(folder: Path) -> dict[str, Any]:
    """The `use` block of the model card's front matter ({} where there is none)."""
    from ...st_export import read_card

    path = folder / "README.md"
    with reading(path, CARD):
        card = read_card(folder)
    return expect_section(card, f"{CARD_BLOCK}.use", path, CARD)


# The files transformers reads a model's weights from, as bert.weight_files names them (not
# imported: bert.py imports torch, and the contract modules stay light).
MODEL_WEIGHTS = "model.safetensors"
MODEL_WEIGHTS_INDEX = "model.safetensors.index.json"
WEIGHTS_INDEX = "a sharded model's weight index"


def missing_model_weights(folder: Path) -> str:
    """What is missing of the folder's own weights ("" when nothing is): model.safetensors, or
    model.safetensors.index.json and every shard its weight_map names. Another safetensors file
    (a staged checkpoint's mlm_head.safetensors, an encoder's projector.safetensors) holds no
    encoder weights, and stage_checkpoint's manifest records no sha256 that would catch
    model.safetensors gone."""
    if (folder / MODEL_WEIGHTS).is_file():
        return ""
    index = folder / MODEL_WEIGHTS_INDEX
    if not index.is_file():
        others = sorted(p.name for p in folder.glob("*.safetensors"))
        return (f"no {MODEL_WEIGHTS} nor {MODEL_WEIGHTS_INDEX}"
                + (f" (only {', '.join(others)}, not the model's weights)" if others else ""))
    try:
        weight_map = expect_section(read_json_object(index, WEIGHTS_INDEX), "weight_map", index,
                                    WEIGHTS_INDEX)
    except BadInput as error:
        return one_line(error)
    if not weight_map or not all(isinstance(name, str) for name in weight_map.values()):
        return f"{index}: weight_map is empty or names a shard that is no file name; {REBUILD}"
    shards = set(weight_map.values())
    missing = sorted(name for name in shards if not (folder / name).is_file())
    return (f"{MODEL_WEIGHTS_INDEX} names {len(shards)} shards, missing: {', '.join(missing)}"
            if missing else "")


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
                is_module_folder(folder))
    else:
        a.check("inside a model folder (config.json + safetensors)", is_model_folder(folder))


def is_module_folder(folder: Path) -> bool:
    """A sentence-transformers module folder (1_Pooling, 2_Dense, ...) named in its model
    folder's modules.json (a Dense one holds config.json + safetensors, yet is no model)."""
    listing = folder.parent / "modules.json"
    if folder.name not in MODULE_FOLDERS or not listing.is_file():
        return False
    try:
        listed = json.loads(listing.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return (is_model_folder(folder.parent) and isinstance(listed, list)
            and any(isinstance(m, dict) and m.get("path") == folder.name for m in listed))


def dense_view(folder: Path, listed: list, hidden) -> tuple[str | None, list[str]]:
    """(the projector kind, what disagrees): a folder with projector.safetensors has a Dense
    module whose config is exactly `dense_config` of that kind and width and whose weights
    (`model.safetensors`: linear.weight, linear.bias) equal the projector's."""
    dense = module_dir(listed, DENSE)
    if not (folder / PROJECTOR_FILE).is_file():
        return None, [f"a Dense module ({dense}) but no {PROJECTOR_FILE}"] if dense else []
    try:
        _, metadata = safetensors_tensors(folder / PROJECTOR_FILE)
    except NotAnArtifact as error:  # cut short or overwritten: a problem named, as below
        return None, [one_line(error)]
    kind = metadata.get("kind")
    if kind not in DENSE_ACTIVATION:
        return kind, [f"{PROJECTOR_FILE} has kind {kind!r} (expected {sorted(DENSE_ACTIVATION)})"]
    if dense is None:
        return kind, [f"{PROJECTOR_FILE} ({kind}) but no Dense module: sentence-transformers "
                      "would embed the raw [CLS], not through the projector"]
    problems = []
    path, expected = folder / dense / "config.json", dense_config(kind, hidden)
    try:
        config = read_json(path, "a Dense module's config") if path.is_file() else None
    except BadInput as error:  # cut short, not JSON: named, as a config of other keys is
        problems.append(one_line(error))
    else:
        if config != expected:
            problems.append(f"{dense}/config.json {config} (expected {expected})")
    weights = folder / dense / DENSE_WEIGHTS
    if not weights.is_file():
        return kind, problems + [f"{dense}/{DENSE_WEIGHTS} missing"]
    from safetensors import safe_open

    try:
        with safe_open(str(folder / PROJECTOR_FILE), framework="numpy") as handle:
            ours = [handle.get_tensor(k).astype(np.float32) for k in ("weight", "bias")]
        with safe_open(str(weights), framework="numpy") as handle:
            keys = sorted(handle.keys())
            theirs = [handle.get_tensor(k) for k in DENSE_KEYS] if keys == sorted(DENSE_KEYS) else []
    except Exception as error:  # SafetensorError, or a dtype numpy cannot hold
        return kind, problems + [f"{dense}/{DENSE_WEIGHTS} unreadable beside {PROJECTOR_FILE} "
                                 f"({error})"]
    if not theirs:
        problems.append(f"{dense}/{DENSE_WEIGHTS} keys {keys} (expected {sorted(DENSE_KEYS)})")
    elif not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(ours, theirs)):
        problems.append(f"{dense}/{DENSE_WEIGHTS} differs from {PROJECTOR_FILE}")
    return kind, problems


def is_encoder_folder(folder: Path) -> bool:
    """A pre-trained or fine-tuned encoder (st_export.py makes it a sentence-transformers model)."""
    rel = results_relative(folder) or ""
    return (folder / "modules.json").is_file() or rel.startswith(("pretrain/", "finetune/"))


def sentence_transformers_view(a: Audit, folder: Path, cfg: dict
                               ) -> tuple[str, list[str]] | None:
    """(how sentence-transformers embeds with this folder, what disagrees): modules.json exactly
    Transformer, Pooling, Dense when the folder holds projector.safetensors (dense_view), and
    Normalize when the similarity is cosine, numbered in that order; the one pooling mode and its
    width, max_seq_length within the position embeddings, and the card's `use` block saying the
    same. None when one of the files is unreadable (its check `<file> readable` failed)."""
    listed = readable(a, "modules.json", lambda: read_modules(folder / "modules.json"))
    settings, pooling, bert_config = (
        readable(a, name, lambda name=name: read_json_object(folder / name, what))
        for name, what in (("config_sentence_transformers.json", "a sentence-transformers config"),
                           (f"{POOLING_DIR}/config.json", "a Pooling module's config"),
                           ("sentence_bert_config.json", "a sentence-transformers config")))
    use = readable(a, "README.md", lambda: card_use(folder))
    if any(value is None for value in (listed, settings, pooling, bert_config, use)):
        return None
    problems = []
    modules = [m["type"].rsplit(".", 1)[-1] for m in listed]
    similarity = settings.get("similarity_fn_name")
    projected = (folder / PROJECTOR_FILE).is_file()
    expected = module_entries(similarity, projected)
    if listed != expected:
        problems.append(
            f"modules {[(m.get('path'), t) for m, t in zip(listed, modules)]} (expected "
            f"{[(m['path'], m['type'].rsplit('.', 1)[-1]) for m in expected]} for similarity "
            f"{similarity}, {'with' if projected else 'without'} {PROJECTOR_FILE})")
    kind, dense_problems = dense_view(folder, listed, cfg.get("hidden_size"))
    problems += dense_problems
    modes = [m for m, flag in POOLING_FLAGS.items() if pooling.get(flag)]
    others = [f for f in ALL_POOLING_FLAGS if pooling.get(f) and f not in POOLING_FLAGS.values()]
    if len(modes) != 1 or others:
        problems.append(f"pooling modes {modes + others} (expected exactly one: cls or mean)")
    if pooling.get("word_embedding_dimension") != cfg.get("hidden_size"):
        problems.append(f"pooling width {pooling.get('word_embedding_dimension')} != hidden size "
                        f"{cfg.get('hidden_size')}")
    if kind and modes != ["cls"]:
        problems.append(f"a projector ({kind}) with pooling {modes}: it embeds [CLS]")
    length = bert_config.get("max_seq_length")
    if (isinstance(length, bool) or not isinstance(length, int)
            or length > cfg.get("max_position_embeddings", length)):
        problems.append(f"max_seq_length {length} (position embeddings: "
                        f"{cfg.get('max_position_embeddings')})")
    stated = {"pooling": modes[0] if len(modes) == 1 else None, "similarity": similarity,
              "p_len": length, "projector": kind}
    if any(use.get(k) != v for k, v in stated.items()):
        problems.append(f"the card's use block {use} disagrees with the files ({stated})")
    view = (f"-- sentence-transformers: {' -> '.join(modules)}; pooling {'/'.join(modes)}, "
            f"{f'projector {kind}, ' if kind else ''}similarity {similarity}, max_seq_length "
            f"{length} (queries: q_len {use.get('q_len')})")
    return view, problems


def weights_mismatches(folder: Path) -> list[str] | None:
    """How the folder's weight files differ from the sha256 its manifest.json records for them
    (stats.weights, artifacts.weights_checksums): a file swapped or rewritten after the export
    would otherwise pass for the trained one. None when the manifest records no checksums (a
    staged checkpoint, or a folder exported before they were recorded)."""
    recorded = ((read_manifest(folder) or {}).get("stats") or {}).get("weights")
    if not isinstance(recorded, dict):
        return None
    present = {name for name in artifacts.WEIGHT_FILES if (folder / name).is_file()}
    problems = [f"{name}: not recorded in manifest.json"
                for name in sorted(present - set(recorded))]
    for name, digest in sorted(recorded.items()):
        if not (folder / name).is_file():
            problems.append(f"{name}: recorded in manifest.json, missing from the folder")
            continue
        actual = artifacts.sha256_file(folder / name)
        if actual != digest:
            problems.append(f"{name}: sha256 {actual}, manifest.json records {digest}")
    return problems


DATA_SHOWN = 3  # changed or missing trained-on files named by the check and the summary


def check_training_data(a: Audit, data) -> None:
    """The files training.json says the encoder trained on (`data`: path -> sha256; the chunk
    and span shards) still hold what it trained on: a shard swapped after training passes its
    own audit against its manifest untouched, and the encoder's checks covered its checkpoint's
    manifest alone. Each file is hashed (no manifest records a shard's own sha256, and one
    recorded at write time says nothing of the file now), once per audit run (sha256_once: the
    encoders of one corpus share its shards). A file not found now is said, not failed: inputs
    deleted after use are no damage to the encoder."""
    if not isinstance(data, dict) or not data:
        return
    changed, missing = [], []
    for recorded, entry in sorted(data.items()):
        path = input_path(recorded, a.path)
        if not path.is_file():
            missing.append(str(path))
        elif artifacts.sha256_once(path) != (entry or {}).get("sha256"):
            changed.append(str(path))
    a.say(f"-- trained on {len(data)} files (training.json data): {len(data) - len(missing)} "
          f"hashed now, {len(changed)} changed since training, {len(missing)} not found now")
    for path in missing[:DATA_SHOWN]:
        a.say(f"  not found now: {path}")
    a.check("the files it trained on unchanged since training (sha256 in training.json data)",
            not changed, f"{len(changed)} changed since training, e.g. {changed[:DATA_SHOWN]}; "
            "rerun pretrain_model on them, or restore the files" if changed else "")


def audit_model(a: Audit, n: int) -> None:
    a.kind = "model folder (Hugging Face)"
    cfg = readable(a, "config.json", lambda: read_config(a.path))
    a.say(
        f"-- {cfg.get('model_type')} {cfg.get('architectures')}: "
        f"{cfg.get('num_hidden_layers')} layers, hidden {cfg.get('hidden_size')}, "
        f"vocab {cfg.get('vocab_size')}" if cfg is not None else
        "-- config.json unreadable (see its check)"
    )
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    weights = sorted(a.path.glob("*.safetensors"))
    readable_weights = []
    for w in weights:
        try:  # a file cut short or overwritten: its check, not "not an artifact" for the folder
            header, _ = safetensors_tensors(w)
        except NotAnArtifact as error:
            a.check(f"{w.name} readable", False, one_line(error))
            continue
        readable_weights.append(w)
        params = sum(int(np.prod(v["shape"])) for v in header.values())
        dtypes = sorted({v["dtype"] for v in header.values()})
        a.say(f"  {w.name}: {len(header)} tensors, {params:,} parameters, {dtypes}")
        heads = [k for k in header if k.startswith(("cls.", "lm_head", "projector", "decoder"))]
        if heads:
            a.say(f"    heads: {heads[:8]}")
    # The model's own weights: any other safetensors file passed for them (a staged checkpoint
    # that lost model.safetensors but kept mlm_head.safetensors).
    absent = missing_model_weights(a.path)
    a.check("weights stored as safetensors", not absent, absent)
    # A run that diverged exports such weights, and they load without complaint.
    bad = [f"{w.name}: {name}" for w in readable_weights for name in tensors_not_finite(w)]
    detail = f"{len(bad)} tensors, e.g. {bad[:3]}" if bad else ""
    a.check("every weight finite (no nan, inf)", not bad, detail)
    mismatches = weights_mismatches(a.path)
    if mismatches is not None:
        a.check("weights match the sha256 manifest.json records", not mismatches,
                "; ".join(mismatches))
    pickles = [p.name for p in a.path.iterdir() if p.suffix in (".bin", ".pt", ".pkl", ".pickle")]
    a.check("no pickled files", not pickles, ", ".join(pickles))
    a.check("tokenizer.json present", (a.path / "tokenizer.json").is_file())
    if is_encoder_folder(a.path):
        missing = [f for f in ST_FILES if not (a.path / f).is_file()]
        if a.check("sentence-transformers files present", not missing, ", ".join(missing)):
            found = sentence_transformers_view(a, a.path, cfg) if cfg is not None else None
            if found is not None:
                view, problems = found
                a.say(view)
                a.check("sentence-transformers files agree", not problems, "; ".join(problems))
    training = a.path / "training.json"
    info = readable(a, "training.json", lambda: read_training(training)) if training.is_file() \
        else None
    if info is not None:
        a.say(f"-- training.json keys: {sorted(info)}")
        for key in ("objective", "steps", "tokens_seen", "world_size", "device"):
            if key in info:
                a.say(f"  {key}: {short(json.dumps(info[key]), 200)}")
        check_training_data(a, info.get("data"))
    tokenizer = a.path / "tokenizer.json"
    if tokenizer.is_file():
        from tokenizers import Tokenizer

        try:
            with reading(tokenizer, "a tokenizer.json"):
                tok = Tokenizer.from_file(str(tokenizer))
        except BadInput as error:
            a.check("tokenizer.json loads", False, one_line(error))
            return
        a.check("tokenizer.json loads", True)
        tok.no_padding()
        tokens = tok.encode(SAMPLE).tokens
        a.say(f"-- tokenizer: {tok.get_vocab_size()} entries; {SAMPLE!r} -> {tokens}")


def audit_module_folder(a: Audit, n: int) -> None:
    """A sentence-transformers module folder of an encoder (1_Pooling, 2_Dense, ...): its files,
    and for a Dense module, that it agrees with the encoder's projector.safetensors."""
    a.kind = "sentence-transformers module folder (of an encoder)"
    describe_origin(a, "a model folder file")
    a.check("named in its model folder's modules.json", is_module_folder(a.path))
    for item in sorted(a.path.iterdir()):
        shown = (item.read_text(errors="replace")[:300] if item.suffix == ".json"
                 else f"{item.stat().st_size:,} bytes")
        a.say(f"  {item.name}: {shown}")
    listed = readable(a, "modules.json", lambda: read_modules(a.path.parent / "modules.json"))
    if listed is not None and module_dir(listed, DENSE) == a.path.name:
        cfg = readable(a, "config.json", lambda: read_config(a.path.parent))
        if cfg is None:
            return
        kind, problems = dense_view(a.path.parent, listed, cfg.get("hidden_size"))
        a.check(f"the Dense module is the encoder's {PROJECTOR_FILE} ({kind})", not problems,
                "; ".join(problems))


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


# What stage_tokenizer records (checkpoints.stage_tokenizer) and what the corpus stages read from
# the folder besides tokenizer.json (wordpiece.position_limit, tokenizer_info).
TOKENIZER_STAGE = "stage_tokenizer"
SPECIAL_TOKENS = ("cls", "sep", "pad", "unk", "mask")


def is_tokenizer_folder(p) -> bool:
    """A staged tokenizer (results/tokenizers/<name>/, what the corpus stages read): tokenizer.json,
    or stage_tokenizer's manifest.json (one that lost tokenizer.json, audited, fails "tokenizer.json
    loads" instead of being refused as no artifact), and no model (neither config.json nor
    weights: a model folder missing its weights is refused as a model, not audited as a
    tokenizer)."""
    return (("tokenizer.json" in p.entries or folder_stage(p.path) == TOKENIZER_STAGE)
            and "config.json" not in p.entries
            and not any(e.endswith(".safetensors") for e in p.entries))


def check_tokenizer_against_manifest(a: Audit, tok, manifest: dict | None) -> None:
    """What stage_tokenizer recorded (stats: vocab_size, tokenizer_class, max_position_embeddings)
    against the tokenizer the folder holds now: a tokenizer.json replaced after staging would
    chunk the corpus with another vocabulary than the one the manifest names."""
    stats = (manifest or {}).get("stats") or {}
    if "vocab_size" in stats:
        # transformers' `vocab_size` (what was recorded) leaves out added tokens.
        size = tok.get_vocab_size(with_added_tokens=False)
        a.check("vocabulary size is the manifest's", size == stats["vocab_size"],
                f"{size} vs {stats['vocab_size']}")
    else:
        a.say("  vocab_size: not recorded in the manifest (not compared)")
    a.say(f"  tokenizer_class: {stats.get('tokenizer_class', 'not recorded')}"
          + (f"   Hub revision {stats['resolved_revision']}" if "resolved_revision" in stats
             else ""))
    limit = stats.get("max_position_embeddings")
    a.say(f"  max_position_embeddings: {limit}" if limit is not None else
          "  max_position_embeddings: not recorded (the corpus stages cannot check max_len "
          "against it; restage the tokenizer)")


def audit_tokenizer_folder(a: Audit, n: int) -> None:
    """A staged tokenizer folder: its manifest (stage_tokenizer's), its files, the tokenizer
    loading and as the manifest records it, and readable the way the corpus stages read it
    (WordPiece, the special tokens tokenizer_config.json names)."""
    from tokenizers import Tokenizer

    from ...config import ConfigError
    from ...wordpiece import tokenizer_info

    a.kind = "tokenizer folder (staged tokenizer)"
    manifest = read_manifest(a.path)
    show_manifest(a, manifest)
    show_snakemake_record(a, a.path)
    a.say("-- files")
    for item in sorted(a.path.iterdir()):
        a.say(f"  {item.name}: {item.stat().st_size:,} bytes")
    stage = (manifest or {}).get("stage")
    a.check(f"manifest.json written by {TOKENIZER_STAGE}", stage == TOKENIZER_STAGE,
            "" if stage == TOKENIZER_STAGE else "no manifest.json" if manifest is None
            else f"stage {stage}")
    try:
        tok = Tokenizer.from_file(str(a.path / "tokenizer.json"))
    except Exception as error:  # the tokenizers library raises its own exception type
        a.check("tokenizer.json loads", False, f"{error}; rerun {TOKENIZER_STAGE}")
        return
    a.check("tokenizer.json loads", True)
    tok.no_padding()
    tok.no_truncation()
    a.say(f"-- {tok.get_vocab_size()} entries; {SAMPLE!r} -> {tok.encode(SAMPLE).tokens}")
    check_tokenizer_against_manifest(a, tok, manifest)
    try:
        info = tokenizer_info(a.path)
    except (ConfigError, ValueError, KeyError) as error:
        a.check("readable by the corpus stages (WordPiece, [CLS]/[SEP])", False, str(error))
        return
    a.check("readable by the corpus stages (WordPiece, [CLS]/[SEP])", True)
    missing = [name for name in SPECIAL_TOKENS if info["special_ids"].get(name) is None]
    a.check("has the special tokens tokenizer_config.json names (cls, sep, pad, unk, mask)",
            not missing, f"missing {missing}" if missing else "")
    a.say(f"-- special ids {info['special_ids']}; vocab_sha256 {info['vocab_sha256']} (what the "
          "chunk manifests record as stats.tokenizer.vocab_sha256)")


# The stages that write a model folder's own manifest.json (checkpoints.stage_checkpoint,
# pretrain/train.py, finetune/train.py).
MODEL_STAGES = ("stage_checkpoint", "pretrain", "finetune")


def is_model(p) -> bool:
    """A model folder: config.json and safetensors, or the manifest.json a model's writer puts
    in it (one that lost either, audited, fails "config.json readable" or "weights stored as
    safetensors" instead of being refused as no artifact); never a module folder of one."""
    files = "config.json" in p.entries and any(e.endswith(".safetensors") for e in p.entries)
    return (files or folder_stage(p.path) in MODEL_STAGES) and not is_module_folder(p.path)


KINDS = [
    Kind("a model (config.json + safetensors, or its writer's manifest.json)", RANK_FOLDER + 0,
         "folder", is_model, audit_model),
    Kind("a sentence-transformers module folder (1_Pooling, 2_Dense, ... of an encoder)",
         RANK_FOLDER + 3, "folder", lambda p: is_module_folder(p.path), audit_module_folder),
    Kind("a tokenizer folder (tokenizer.json, no weights)", RANK_FOLDER + 4, "folder",
         is_tokenizer_folder, audit_tokenizer_folder),
    json_kind("a tokenizer.json", RANK_JSON + 5, lambda p: p.name == "tokenizer.json",
              audit_tokenizer),
    json_kind("a model folder file", RANK_JSON + 6, lambda p: p.name in MODEL_FOLDER_JSON,
              audit_model_file),
]
