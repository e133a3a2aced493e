"""Every encoder folder is also a sentence-transformers model, with a Hugging Face model card.

The exporters (pre-training, the `none` export of a base checkpoint, fine-tuning) call `write`
inside their `artifacts.atomic_dir` block, after the weights, tokenizer and training.json, so a
folder is published whole with these files or not at all (contracts/models says what they are):

* `modules.json`: Transformer -> Pooling (-> Dense) (-> Normalize when the similarity is
  cosine), the order in which `encode.pool` pools, projects and normalises;
* `1_Pooling/config.json`: [CLS] or the mean over real tokens, exactly `encode.pool`;
* `2_Dense/` (a folder fine-tuned through COSTA's projector, `projector.safetensors`): the same
  projector as sentence-transformers' Dense (Tanh or Identity activation, weights
  `model.safetensors` from projector.py's `save_dense`), so sentence-transformers embeds [CLS]
  through it as `encode.load_encoder` does; Normalize follows it as `3_Normalize/`;
* `sentence_bert_config.json`: `max_seq_length` = p_len. sentence-transformers has one length
  for every input; ours cuts queries at q_len and passages at p_len. A query is rarely longer than
  q_len, and cutting passages shorter than they were trained and indexed with would change every
  vector, so p_len it is; the card says to set `max_seq_length = q_len` for queries to match
  our pipeline exactly;
* `config_sentence_transformers.json`: the similarity function and empty query / document
  prompts (our encoders prepend nothing);
* `README.md`: the model card. Its YAML front matter carries the Hub's keys and a block of what
  the workflow knew at export time (`retrieval_pretraining`: base checkpoint, objective,
  pre-training steps and corpus, fine-tuning data, the numbers the training runs measured). A
  fine-tuned encoder inherits its init encoder's block, so the card of stage 2 still names the
  base checkpoint and the pre-training; pre-training from another model's encoder (`init`)
  inherits its base checkpoint and lists its pre-training (`earlier_pretraining`). Retrieval
  scores are measured after export (results/metrics/); nothing is stated that the folder's own
  records do not hold.

A pre-trained encoder has not been fine-tuned for retrieval, so its files state a convention,
never the fine-tuning config (that would make a change of `finetune.pooling` rerun pre-training):
a trained encoder gets [CLS] and the dot product (what COSTA, CPDAE and BoW shape and what their
papers fine-tune), at its position limit; the `none` export of a base checkpoint that is itself
a sentence-transformers model keeps that model's pooling, similarity and length, as staging
recorded them (`pretrained_use`). The card says so, and that the workflow's zero-shot (stage 0) rows encode it
with the `finetune` knobs. Torch-free (projector.py, which needs torch, is imported only to write
a projector's Dense module).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from . import artifacts
from .contracts.models import (ALL_POOLING_FLAGS, CARD_BLOCK, DENSE, NORMALIZE, POOLING_DIR,
                               POOLING_FLAGS, PROJECTOR_FILE, SIMILARITY_FN, dense_config,
                               module_dir, module_entries)
from .errors import InputFileError, expect_list, expect_positive_int, expect_section
from .retrieval_settings import RetrievalSettings

if TYPE_CHECKING:
    from torch import nn

PRETRAINED_USE = (
    "not fine-tuned: [CLS] pooling and the dot product, the representation the pre-training "
    "objectives shape (a base checkpoint exported as it is keeps its own sentence-transformers "
    "pooling); the workflow's zero-shot (stage 0) rows encode it with config `finetune.pooling`, "
    "`finetune.similarity`, `finetune.q_len` and `finetune.p_len` instead"
)
FINETUNED_USE = "the settings this encoder was fine-tuned with"
# Records of a training run that are bookkeeping, not measurements of the encoder.
NOT_MEASURED = ("step", "lr", "grad_norm", "tokens_per_s", "tokens_seen", "memory_mb",
                "encoder_frozen", "epoch", "event", "input_wait_share")


# ---------------------------------------------------------------- sentence-transformers files ---
def modules(similarity: str, projector: bool = False) -> list[dict[str, Any]]:
    return module_entries(similarity, projector)


def pooling_config(pooling: str, dimension: int) -> dict[str, Any]:
    """1_Pooling/config.json: exactly one mode on (encode.pool's cls or mean)."""
    return {"word_embedding_dimension": dimension,
            **{flag: flag == POOLING_FLAGS[pooling] for flag in ALL_POOLING_FLAGS}}


def st_config(similarity: str) -> dict[str, Any]:
    """config_sentence_transformers.json: no prompts, our similarity, the versions writing it."""
    versions = {}
    for label, dist in (("sentence_transformers", "sentence-transformers"),
                        ("transformers", "transformers"), ("pytorch", "torch")):
        try:
            versions[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"__version__": versions, "model_type": "SentenceTransformer",
            "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
            "similarity_fn_name": SIMILARITY_FN[similarity]}


def write(folder: str | Path, retrieval: RetrievalSettings, card: Mapping[str, Any],
          projector: nn.Module | None = None) -> None:
    """Add the sentence-transformers files and the model card to an encoder folder being written
    (call inside the exporter's atomic_dir, after config.json, training.json and, for a model
    fine-tuned through COSTA's projector, projector.safetensors: pass that `projector` too)."""
    folder = Path(folder)
    if (folder / PROJECTOR_FILE).is_file() != (projector is not None):
        raise ValueError(f"{folder}: projector {'given' if projector is not None else 'None'} but "
                         f"{PROJECTOR_FILE} {'absent' if projector is not None else 'present'}; "
                         "the sentence-transformers files must embed as the folder does")
    if projector is not None and retrieval.pooling != "cls":
        raise ValueError("a text projector embeds [CLS]; use pooling 'cls'")
    config = artifacts.read_json_object(folder / "config.json", CONFIG)
    hidden = config_size(config, "hidden_size", folder / "config.json")
    entries = modules(retrieval.similarity, projector is not None)
    for entry in entries[1:]:
        (folder / entry["path"]).mkdir(exist_ok=True)
    artifacts.write_json(folder / "modules.json", entries)
    artifacts.write_json(folder / POOLING_DIR / "config.json", pooling_config(retrieval.pooling, hidden))
    kind = None
    if projector is not None:
        from . import projector as text_projector

        kind = text_projector.kind_of(projector)
        dense = folder / module_dir(entries, DENSE)
        artifacts.write_json(dense / "config.json", dense_config(kind, hidden))
        text_projector.save_dense(dense, projector)
    normalize = module_dir(entries, NORMALIZE)
    if normalize:  # sentence-transformers >= 6 writes it; older ones skip it
        artifacts.write_json(folder / normalize / "config.json", {})
    artifacts.write_json(folder / "sentence_bert_config.json",
                {"max_seq_length": retrieval.p_len, "do_lower_case": False})
    artifacts.write_json(folder / "config_sentence_transformers.json", st_config(retrieval.similarity))
    with artifacts.atomic_path(folder / "README.md") as tmp:
        tmp.write_text(render_card(card, retrieval, kind))


STAGED, CONFIG = "a staged checkpoint's manifest", "a model folder's config.json"


def config_size(config: Mapping[str, Any], key: str, path: Path,
                default: int | None = None) -> int:
    """config.json's `key` (a width, a position limit), read from `path`, as a positive integer
    (`default` where it has none): a config.json without hidden_size was a bare KeyError, and a
    limit that is no number a TypeError or ValueError, neither naming the file."""
    if key not in config and default is None:
        raise InputFileError(f"{path}: has no {key}, which {CONFIG} states; add it, or rebuild "
                             "the folder with the stage that writes it")
    return expect_positive_int(config.get(key, default), key, path, CONFIG, null=False)


def sentence_transformers_use(record: Mapping[str, Any]) -> dict[str, Any]:
    """How a sentence-transformers base embeds, from what staging recorded of its files
    (checkpoints.sentence_transformers_files): pooling (cls, mean, or None for a mode we do not
    encode with), similarity (cosine when it normalises) and max_seq_length."""
    flags = record.get("pooling") or {}
    pooling = next((name for name, flag in POOLING_FLAGS.items() if flags.get(flag)), None)
    return {"pooling": pooling,
            "similarity": "cosine" if NORMALIZE in (record.get("modules") or []) else "dot",
            "max_seq_length": record.get("max_seq_length")}


def recorded_use(checkpoint: Path) -> dict[str, Any] | None:
    """The base's sentence-transformers settings as its staging manifest records them (None: not
    a sentence-transformers model, or a folder staging did not write). A max_seq_length there
    that is no positive integer is InputFileError naming the manifest: its readers' int() of it
    was a bare ValueError or TypeError; so is a module list that is no list."""
    manifest = checkpoint / "manifest.json"
    if not manifest.is_file():
        return None
    staged = artifacts.read_manifest(manifest, STAGED)
    record = expect_section(staged, "stats.sentence_transformers", manifest, STAGED)
    expect_section(staged, "stats.sentence_transformers.pooling", manifest, STAGED)
    if not record:
        return None
    expect_positive_int(record.get("max_seq_length"), "stats.sentence_transformers.max_seq_length",
                        manifest, STAGED)
    expect_list(record.get("modules"), "stats.sentence_transformers.modules", manifest, STAGED)
    return sentence_transformers_use(record)


def pretrained_use(checkpoint: str | Path, objective: str) -> RetrievalSettings:
    """How a not-yet-fine-tuned encoder is stated to be used (module docstring): for the `none`
    export of a sentence-transformers checkpoint, the base's own settings (recorded at staging),
    else [CLS] + dot product at the position limit (at most 512 tokens)."""
    checkpoint = Path(checkpoint)
    config = artifacts.read_json_object(checkpoint / "config.json", CONFIG)
    limit = min(512, config_size(config, "max_position_embeddings", checkpoint / "config.json",
                                 default=512))
    use = recorded_use(checkpoint) if objective == "none" else None
    if use is None:
        return RetrievalSettings(pooling="cls", similarity="dot", p_len=limit)
    if use["pooling"] is None:
        raise ValueError(f"{checkpoint}/manifest.json: its source's sentence-transformers pooling "
                         "is one we do not encode with (only cls or mean)")
    return RetrievalSettings(pooling=use["pooling"], similarity=use["similarity"],
                             p_len=min(int(use["max_seq_length"] or limit), limit))


# ---------------------------------------------------------------- what the card states ----------
def read_card(folder: str | Path) -> dict[str, Any]:
    """The YAML front matter of a folder's README.md ({} when it has none)."""
    path = Path(folder) / "README.md"
    if not path.is_file():
        return {}
    match = re.match(r"---\n(.*?)\n---\n", path.read_text(encoding="utf-8"), re.S)
    front = yaml.safe_load(match.group(1)) if match else None
    return front if isinstance(front, dict) else {}


def base_checkpoint(checkpoint: str | Path) -> dict[str, Any]:
    """The staged base checkpoint as its manifest records it (the `checkpoints` entry)."""
    manifest = Path(checkpoint) / "manifest.json"
    if not manifest.is_file():
        return {"path": str(checkpoint)}
    params = artifacts.read_manifest(manifest, STAGED)["params"]
    keep = ("name", "source", "location", "revision", "num_layers")
    return {k: params[k] for k in keep if params.get(k) is not None}


def measured(record: Mapping[str, Any] | None) -> dict[str, float]:
    """The numbers of a training record that measure the encoder (losses, probes)."""
    return {k: round(float(v), 6) for k, v in (record or {}).items()
            if k not in NOT_MEASURED and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _earlier_pretraining(inherited: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pre-training stages an init encoder's card lists, its own last (`none`: no stage)."""
    stages = list(inherited.get("earlier_pretraining") or [])
    if inherited.get("pretraining"):
        stages.append({"model": inherited.get("model"), "objective": inherited.get("objective"),
                       **inherited["pretraining"]})
    return stages


def pretrained_card(info: Mapping[str, Any], checkpoint: str | Path) -> dict[str, Any]:
    """The card facts of a pre-trained encoder (or of the `none` export) from its training.json.

    Pre-training that starts from another model's encoder (`init`) inherits that encoder's base
    checkpoint and lists its pre-training under `earlier_pretraining`: the init's own manifest
    names only the init model, not the checkpoint both descend from."""
    settings = info.get("settings", {})
    objective = info.get("objective", settings.get("objective"))
    inherited = read_card(checkpoint).get(CARD_BLOCK) or {}
    facts: dict[str, Any] = {
        "encoder": "base checkpoint, not pre-trained" if objective == "none" else "pre-trained",
        "model": settings.get("name"), "objective": objective,
        "base_checkpoint": inherited.get("base_checkpoint") or base_checkpoint(checkpoint) or None,
        "use": PRETRAINED_USE,
    }
    if inherited:
        facts["init"] = str(checkpoint)
        if inherited.get("base_model"):
            facts["base_model"] = inherited["base_model"]
        if earlier := _earlier_pretraining(inherited):
            facts["earlier_pretraining"] = earlier
    if objective != "none":
        trainer = settings.get("trainer", {})
        facts["pretraining"] = {
            "steps": info.get("steps"), "tokens_seen": info.get("tokens_seen"),
            "global_batch_size": trainer.get("global_batch_size"), "lr": trainer.get("lr"),
            "corpora": [c["name"] if c.get("proportion", 1.0) == 1.0
                        else f"{c['name']} ({c['proportion']:g})"
                        for c in settings.get("corpora") or []],
            "chunks": info.get("chunks"), "held_out_chunks": info.get("probe_chunks"),
            "chunk_files": info.get("chunk_files"), "span_files": info.get("span_files"),
            "data_files": sorted(info.get("data", {})),
            "spans": settings.get("spans"), "final": measured(info.get("final_metrics")),
        }
    return facts


def _pretraining_data(pretraining: Mapping[str, Any]) -> str:
    """What the card's pre-training line says the model read: `40 chunks of `wikipedia` (4 of
    them held out for the probes; 2 chunk files; spans `costa` from 2 span files)`."""
    corpora = " + ".join(f"`{name}`" for name in pretraining.get("corpora") or []) or "its corpus"
    held_out = pretraining.get("held_out_chunks")
    files = pretraining.get("chunk_files")
    notes = [f"{held_out} of them held out for the probes"] if held_out else []
    notes += [f"{files} chunk files"] if files is not None else []
    if pretraining.get("spans"):
        span_files = pretraining.get("span_files")
        notes.append(f"spans `{pretraining['spans']}`"
                     + (f" from {span_files} span files" if span_files is not None else ""))
    return (f"{pretraining.get('chunks')} chunks of {corpora}"
            + (f" ({'; '.join(notes)})" if notes else ""))


def finetuned_card(provenance: Mapping[str, Any], init: str | Path,
                   stats: Mapping[str, Any]) -> dict[str, Any]:
    """The card facts of a fine-tuned encoder: its init's facts plus this fine-tuning."""
    init = Path(init)
    inherited = read_card(init)
    facts = dict(inherited.get(CARD_BLOCK) or {"init": str(init)})
    config, inputs = provenance.get("config", {}), provenance.get("inputs", {})
    step: dict[str, Any] = {"init": str(init)}
    queries = Path(inputs.get("queries", ""))
    split = re.fullmatch(r"queries-(.+)\.parquet", queries.name)
    if split:  # results/datasets/{dataset}/queries-{split}.parquet
        step |= {"dataset": queries.parent.name, "split": split.group(1)}
    step |= {
        "queries": inputs.get("queries"),
        "negatives": [v for k, v in sorted(inputs.items()) if k.startswith("negatives")],
        "train_queries": stats.get("train_queries"), "steps": provenance.get("steps"),
        "epochs": config.get("epochs"), "batch_size": config.get("batch_size"),
        "group_size": config.get("group_size"), "temperature": config.get("temperature"),
        "lr": config.get("lr"), "seed": provenance.get("seed"),
        "final": measured(provenance.get("final_metrics")),
    }
    facts |= {"encoder": "fine-tuned", "use": FINETUNED_USE}
    facts["finetuning"] = [*facts.get("finetuning", []), step]
    if inherited.get("base_model"):
        facts.setdefault("base_model", inherited["base_model"])
    return facts


# ---------------------------------------------------------------- the card ----------------------
def front_matter(facts: Mapping[str, Any], retrieval: RetrievalSettings,
                 projector: str | None = None) -> dict[str, Any]:
    front: dict[str, Any] = {
        "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "feature-extraction", "sentence-similarity",
                 "dense-retrieval", "retrieval-pretraining"]
                + ([str(facts["objective"])] if facts.get("objective") else []),
        "language": ["en"],
    }
    base = facts.get("base_checkpoint") or {}
    if base.get("source") == "hub":  # the Hub's base_model must be a Hub id: never a local path
        front["base_model"] = base["location"]
    elif facts.get("base_model"):
        front["base_model"] = facts["base_model"]
    use = {"pooling": retrieval.pooling, "similarity": retrieval.similarity,
           "q_len": retrieval.q_len, "p_len": retrieval.p_len, "title": retrieval.title,
           "chosen_by": facts.get("use", FINETUNED_USE)}
    if projector:  # the kind of COSTA's projector the encoder embeds [CLS] through
        use["projector"] = projector
    front[CARD_BLOCK] = {k: v for k, v in facts.items() if k != "use"} | {"use": use}
    return front


_EXAMPLE_PASSAGE = {"none": '"The passage text."', "space": '"A title" + " " + "The passage text."',
                    "sep": '"A title" + " [SEP] " + "The passage text."'}


def _title_rule(title: str) -> str:
    return {"none": "the text alone (no title)",
            "space": "`title + \" \" + text`",
            "sep": "`title + \" [SEP] \" + text` (the tokenizer's separator token)"}[title]


def _measured_rows(facts: Mapping[str, Any]) -> list[str]:
    rows = []
    for stage in facts.get("earlier_pretraining") or []:
        for key, value in sorted((stage.get("final") or {}).items()):
            rows.append(f"| pre-training `{stage.get('model')}`, last step | {key} | {value:.4f} |")
    pretraining = facts.get("pretraining") or {}
    for key, value in sorted((pretraining.get("final") or {}).items()):
        rows.append(f"| pre-training, last step | {key} | {value:.4f} |")
    for i, step in enumerate(facts.get("finetuning") or [], 1):
        where = f"fine-tuning {i}" + (f" ({step['dataset']})" if step.get("dataset") else "")
        for key, value in sorted((step.get("final") or {}).items()):
            rows.append(f"| {where}, last step | {key} | {value:.4f} |")
    return rows


_PROJECTED = {"nonlinear": "Tanh(Linear)", "linear": "Linear"}


def render_card(facts: Mapping[str, Any], retrieval: RetrievalSettings,
                projector: str | None = None) -> str:
    """The model card; `projector`: the kind of COSTA's projector the encoder embeds through."""
    front = front_matter(facts, retrieval, projector)
    block = front[CARD_BLOCK]
    name = block.get("model") or "encoder"
    pooled = {"cls": "the last layer's [CLS] vector", "mean": "the mean of the last layer over "
              "real (non-padding) tokens"}[retrieval.pooling]
    scored = {"cosine": "cosine similarity (vectors L2-normalised: the `Normalize` module)",
              "dot": "the dot product of unnormalised vectors"}[retrieval.similarity]
    base = block.get("base_checkpoint") or {}
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
        f"# {name}: {block.get('encoder', 'encoder')} dense-retrieval encoder", "",
        "Written by the retrieval-pretraining workflow (pre-training of dense-retrieval "
        "text encoders). The YAML block `retrieval_pretraining` above holds everything the "
        "workflow knew when it wrote this folder; `training.json` and `manifest.json` beside "
        "this card are its full records.", "",
        "## Use", "", "```python", "from sentence_transformers import SentenceTransformer", "",
        'model = SentenceTransformer("path/to/this/folder")  # or its Hub repo id',
        f"model.max_seq_length = {retrieval.q_len}  # queries: cut at q_len, as our pipeline does",
        'queries = model.encode_query(["what is dense retrieval?"])',
        f"model.max_seq_length = {retrieval.p_len}  # passages (the saved default): p_len",
        f"passages = model.encode_document([{_EXAMPLE_PASSAGE[retrieval.title]}])",
        "scores = model.similarity(queries, passages)", "```", "",
        "## How it embeds", "",
        f"- Pooling: {pooled}; similarity: {scored}.",
        *([f"- Projector: the pooled [CLS] goes through COSTA's text projector "
           f"({_PROJECTED[projector]}, fine-tuned with the encoder; `{PROJECTOR_FILE}`), the "
           "`Dense` module here, before "
           + ("normalisation." if retrieval.similarity == "cosine" else "scoring.")]
          if projector else []),
        f"- Chosen by: {block['use']['chosen_by']}.",
        f"- Lengths: queries are truncated at q_len = {retrieval.q_len} tokens"
        + (" by our pipeline" if block.get("finetuning") else " (a convention, as above)")
        + f", passages (title included) at p_len = {retrieval.p_len}. sentence-transformers keeps "
        f"one `max_seq_length`, saved as p_len; set it to {retrieval.q_len} while encoding "
        "queries to get our query vectors exactly (shorter queries are the same either way).",
        f"- Passages with a title: {_title_rule(retrieval.title)}"
        + (" (this encoder's fine-tuning dataset's title mode)." if block.get("finetuning")
           else " for a dataset whose title mode is `space` (a dataset's `title` setting)."),
        "- No query or passage prefix (the `query` and `document` prompts are empty).", "",
        "## Training", "",
    ]
    if base:
        where = f"{base.get('source', '')} `{base.get('location', base.get('path', ''))}`"
        layers = f", first {base['num_layers']} layers" if base.get("num_layers") else ""
        lines.append(f"- Base checkpoint: `{base.get('name', '?')}` ({where.strip()}{layers}).")
    for stage in block.get("earlier_pretraining") or []:
        lines.append(f"- Pre-trained first as `{stage.get('model')}` (objective "
                     f"`{stage.get('objective')}`): {stage.get('steps')} steps, "
                     f"{stage.get('tokens_seen')} tokens, on {_pretraining_data(stage)}.")
    if block.get("objective"):
        then = " (continuing from the above)" if block.get("earlier_pretraining") else ""
        lines.append(f"- Pre-training objective: `{block['objective']}`{then}.")
    pretraining = block.get("pretraining")
    if pretraining:
        lines.append(f"- Pre-training: {pretraining.get('steps')} steps, "
                     f"{pretraining.get('tokens_seen')} tokens, on {_pretraining_data(pretraining)}.")
    elif block.get("objective") == "none":
        lines.append("- No pre-training: the base checkpoint's weights as they are.")
    for step in block.get("finetuning") or []:
        data = (f"`{step['dataset']}` ({step['split']})" if step.get("dataset")
                else f"`{step.get('queries')}`")
        lines.append(f"- Fine-tuned on {data}: {step.get('train_queries')} queries, "
                     f"{step.get('steps')} steps, negatives from "
                     f"{', '.join(f'`{n}`' for n in step.get('negatives') or []) or '?'}.")
    rows = _measured_rows(block)
    lines += ["", "## Measured", ""]
    if rows:
        lines += ["| when | measure | value |", "|---|---|---|", *rows, ""]
    else:
        lines += ["Nothing was measured while this folder was written (no training ran).", ""]
    lines += ["Retrieval scores (nDCG@10, ...) are measured after export, by the workflow's "
              "evaluation (results/metrics/ and results/tables.md of the run), and are not "
              "stated here.", ""]
    return "\n".join(lines)
