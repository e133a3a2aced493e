"""Evaluate an encoder folder on an MTEB retrieval task whose data is already on disk (no download).

    python -m retrieval_pretraining.mteb_eval --encoder results/pretrain/costa/encoder \
        --task SciFact --data data/beir/scifact [--split test] [--out scores.json] \
        [--ignore-identical-ids] \
        [--config '{"pooling": "mean", "similarity": "cosine", "q_len": 256, "p_len": 256}']

MTEB (the `mteb` package, pinned in requirements.txt) runs its own retrieval evaluation: its task
(metadata, k values, which queries count, how identical ids are treated), its search over the
whole corpus and its scores. Only the data and the encoder are ours:

- the data: MTEB's loader fetches a task's files from the Hugging Face Hub, so the task's
  `dataset` is filled here from a local BEIR folder (corpus.jsonl, queries.jsonl,
  qrels/<split>.tsv; the BEIR layout MTEB's own Hub copies have) and marked loaded; the Hub,
  `datasets` and transformers are set offline by `evaluate` before mteb is imported, so nothing
  is ever fetched, also where the caller imported them first (`go_offline`);
- the encoder: any Hugging Face folder (safetensors) embedded by `encode.embed` with the
  retrieval knobs of `--config` (retrieval_settings.RetrievalSettings: pooling, similarity,
  q_len, p_len, title mode, query / passage prefixes), exactly as the workflow's encode and
  dense-search stages embed it, so MTEB's number and the workflow's are the same model's. The
  knobs `--config` leaves out come from the folder's model card where it states them (this
  workflow's encoders: `retrieval_pretraining.use`; not its title mode, which is its fine-tuning
  dataset's, e.g. MS MARCO's `sep`: a BEIR document is title + " " + text, as MTEB joins it and
  the workflow's BEIR entries do, unless `--config` gives `title`), else from a staged
  checkpoint's manifest (results/checkpoints/<name>/: a sentence-transformers source's pooling,
  similarity and max_seq_length as q_len and p_len), else the folder's own sentence-transformers
  files (a model never staged, e.g. a package's or a Hub snapshot: the same three), else
  RetrievalSettings' defaults: a mean-pooled cosine encoder is not scored as a [CLS]
  dot-product one by omission. The result records where they came from (`settings_from`).
  `--ignore-identical-ids` should match the dataset's `exclude_query_id` (the workflow drops a
  hit whose id is the query's only where it is set).

The scores (every measure MTEB computes, its main score first) are printed and written as JSON.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .config import ConfigError, stage_parser
from .contracts.models import PROJECTOR_FILE
from .dataset_files import json_objects, open_text, record_id, record_text
from .errors import InputFileError, command, reading
from .model_folder import read_config
from .retrieval_settings import PREFIX_KEYS, RetrievalSettings

log = logging.getLogger(__name__)

# Nothing may be fetched: the Hub, `datasets` and transformers are offline before mteb loads.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def go_offline() -> None:
    """Set OFFLINE, and its flags in the Hub's and `datasets`' modules already imported.

    Both read the variables once, when imported (huggingface_hub.constants.HF_HUB_OFFLINE, which
    transformers' is_offline_mode returns too; datasets.config.HF_HUB_OFFLINE): a library caller
    that imported them before `evaluate` would otherwise stay online whatever the environment."""
    os.environ.update(OFFLINE)
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True
    data = sys.modules.get("datasets.config")
    if data is not None:
        data.HF_HUB_OFFLINE = data.HF_DATASETS_OFFLINE = True


def settings(config: dict[str, Any]) -> RetrievalSettings:
    return RetrievalSettings.from_config(config, added=PREFIX_KEYS, stage="mteb_eval")


def read_beir(folder: Path, split: str) -> tuple[list[dict], list[dict], dict[str, dict[str, int]]]:
    """(corpus rows {id, title, text}, query rows {id, text}, qrels {query: {doc: grade}}) of a
    BEIR folder; only the queries the split judges (as MTEB keeps them)."""
    qrels_file = folder / "qrels" / f"{split}.tsv"
    for path in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_file):
        if not path.is_file():
            raise InputFileError(f"{path} does not exist; --data must be a BEIR folder "
                                 "(corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
    qrels: dict[str, dict[str, int]] = {}
    with reading(qrels_file, "a BEIR qrels TSV"):
        # Lines end at \n alone, as the workflow's readers end them: splitlines() also broke a line
        # at U+2028, U+0085 or \x1c-\x1e, which an id may hold.
        with open(qrels_file, encoding="utf-8", newline="\n") as handle:
            lines = [line.rstrip("\r\n") for line in handle]
        for line in lines[1:] if lines and lines[0].startswith("query-id") else lines:
            if line.strip():
                query, doc, grade = line.split("\t")[:3]
                qrels.setdefault(query, {})[doc] = int(float(grade))
    with reading(folder / "queries.jsonl", "a BEIR queries JSONL"):
        queries = [{"id": i, "text": text}
                   for i, _, text in _jsonl(folder / "queries.jsonl") if i in qrels]
    with reading(folder / "corpus.jsonl", "a BEIR corpus JSONL"):
        corpus = [{"id": i, "title": title, "text": text}
                  for i, title, text in _jsonl(folder / "corpus.jsonl")]
    return corpus, queries, qrels


def _jsonl(path: Path) -> Iterator[tuple[str, str, str]]:
    """(id, title, text) of each line of a BEIR JSONL file, read as the workflow's readers read it
    (dataset_files): an integer `_id` as its digits; null, a boolean, a fraction, an array or an
    object refused naming the line, where str() made "None" or "['a']" an id no qrels line names;
    a title or text that is not a string (or null, read as empty) refused naming the line, where
    a number reached MTEB as a number and a list as a list; a record without `_id` or `text`
    refused naming the line and field, as the workflow's readers refuse it (a missing text was
    read as "", a query MTEB scored as empty)."""
    where = str(path)
    with open_text(path) as handle:
        for number, record in json_objects(handle, where, ("_id", "text"), ("title",),
                                           required=True):
            yield (record_id(record["_id"], where, number),
                   record_text(record, "title", where, number) or "",
                   record_text(record, "text", where, number) or "")


def local_task(name: str, folder: Path, split: str):
    """The MTEB task `name`, its `dataset` filled from the BEIR folder (never from the Hub)."""
    import mteb
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval

    try:
        task = mteb.get_task(name)
    except KeyError as error:
        raise ConfigError(f"--task {name!r}: MTEB has no such task ({error})") from None
    if not isinstance(task, AbsTaskRetrieval):
        raise ConfigError(f"--task {name!r} is a {task.metadata.type} task; give a retrieval task")
    corpus, queries, qrels = read_beir(folder, split)
    task.dataset = {"default": {split: {
        "corpus": Dataset.from_list(corpus), "queries": Dataset.from_list(queries),
        "relevant_docs": qrels, "top_ranked": None,
    }}}  # fmt: skip
    task.data_loaded = True
    return task


def folder_encoder(folder: Path, knobs: RetrievalSettings):
    """An MTEB encoder (mteb.models.AbsEncoder) that embeds with encode.embed and our knobs."""
    import torch
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.types import PromptType

    from . import encode

    class FolderEncoder(AbsEncoder):
        def __init__(self) -> None:
            self.model, self.tokenizer = encode.load_encoder(folder)

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None,
                   **kwargs) -> np.ndarray:
            batches = list(inputs)
            texts = [t for b in batches for t in b["text"]]
            query = prompt_type == PromptType.query
            titles = None
            if not query and all("body" in b for b in batches):  # a document: ours joins title
                texts = [t for b in batches for t in b["body"]]
                titles = [t for b in batches
                          for t in (b["title"] if "title" in b else [""] * len(b["body"]))]
            return encode.embed(
                self.model, self.tokenizer, texts, titles=titles, title=knobs.title,
                max_len=knobs.q_len if query else knobs.p_len, pooling=knobs.pooling,
                similarity=knobs.similarity, batch_size=knobs.encode_batch_size,
                prefix=knobs.query_prefix if query else knobs.passage_prefix,
                desc="encode queries" if query else "encode corpus")

        def similarity(self, embeddings1, embeddings2):
            # cosine: the vectors are L2-normalised already, so both are a dot product
            a, b = (torch.as_tensor(np.asarray(e, dtype=np.float32)) for e in (embeddings1,
                                                                              embeddings2))
            return a @ b.T

    return FolderEncoder()


# What the card's `use` block states of the encoder itself. Not its `title`: that is the title
# mode of the dataset it was fine-tuned on (MS MARCO's `sep`), and the workflow encodes a zero-shot
# BEIR target with the target's own mode (`space`, as MTEB joins title and text), so taking it
# from the card scored SciFact's abstracts as "title [SEP] text", another number than both.
CARD_KEYS = ("pooling", "similarity", "q_len", "p_len")


def stated_use(encoder: Path) -> tuple[dict[str, Any], str]:
    """The knobs the folder states and where: its card's `use` block (this workflow's encoders),
    else what staging recorded of a sentence-transformers source (a staged checkpoint,
    results/checkpoints/<name>/, keeps no card: its manifest's stats.sentence_transformers), else
    the folder's own sentence-transformers files (one never staged: a package's model, a Hub
    snapshot), read as staging reads them."""
    from .checkpoints import sentence_transformers_files
    from .st_export import CARD_BLOCK, read_card, recorded_use, sentence_transformers_use

    use = (read_card(encoder).get(CARD_BLOCK) or {}).get("use") or {}
    if use:
        return use, "card"
    recorded, origin = recorded_use(encoder), "checkpoint manifest"
    if recorded is None:
        files = sentence_transformers_files(encoder)
        if files is None:
            return {}, ""
        if (any(str(m).endswith(".Dense") for m in files["modules"])
                and not (encoder / PROJECTOR_FILE).is_file()):
            raise ConfigError(f"{encoder}: its sentence-transformers pipeline projects the pooled "
                              "vector through a Dense module, which encode.embed does not apply, "
                              "so MTEB would score another model; stage it through `checkpoints` "
                              "(which refuses it with the reason) or use a model without one")
        recorded, origin = sentence_transformers_use(files), "sentence-transformers files"
    stated = {"pooling": recorded["pooling"], "similarity": recorded["similarity"]}
    if recorded["max_seq_length"]:
        # The model's own length for queries and passages alike, within its position limit.
        # Both positive integers: recorded_use and sentence_transformers_files check the length,
        # read_config the limit.
        limit = min(512, read_config(encoder).get("max_position_embeddings", 512))
        stated["q_len"] = stated["p_len"] = min(recorded["max_seq_length"], limit)
    return stated, origin


def with_card_settings(encoder: Path, config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`config` completed by the knobs the encoder states (`stated_use`), and where the knobs came
    from: "--config", "card", "checkpoint manifest", "sentence-transformers files", one of the
    last three after "--config and ", or "defaults"."""
    stated, origin = stated_use(encoder)
    added = {k: stated[k] for k in CARD_KEYS if k in stated and k not in config}
    if "pooling" in added and added["pooling"] is None:
        raise ConfigError(
            f"{encoder} ({origin}): its sentence-transformers source pools in a way "
            "encode.embed cannot (max or weighted mean; only cls or mean), so MTEB would score "
            "another model; "
            "give --config '{\"pooling\": ...}' to score it with another pooling anyway"
        )
    given = any(k in config for k in CARD_KEYS)
    source = " and ".join(name for name, used in (("--config", given), (origin, bool(added)))
                          if used) or "defaults"
    return {**added, **config}, source


def evaluate(encoder: Path, task_name: str, data: Path, split: str, config: dict[str, Any],
             ignore_identical_ids: bool | None = None) -> dict[str, Any]:
    """MTEB's scores of the encoder on the task's split read from `data` (offline: go_offline)."""
    go_offline()
    if not (Path(encoder) / "config.json").is_file():
        raise InputFileError(f"{encoder} is not a model folder (no config.json); give an encoder "
                             "folder, e.g. results/pretrain/<model>/encoder")
    config, settings_from = with_card_settings(Path(encoder), config)
    knobs = settings(config)
    log.info("retrieval knobs from %s: %s", settings_from, knobs.record())
    task = local_task(task_name, Path(data), split)
    if ignore_identical_ids is not None:
        task.ignore_identical_ids = ignore_identical_ids
    scores = task.evaluate(folder_encoder(Path(encoder), knobs), split,
                           encode_kwargs={"batch_size": knobs.encode_batch_size})["default"]
    return {"task": task_name, "split": split, "data": str(data), "encoder": str(encoder),
            "settings": knobs.record(), "settings_from": settings_from,
            "ignore_identical_ids": task.ignore_identical_ids,
            "main_score": scores["main_score"], "scores": scores}


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--encoder", type=Path, required=True, help="Hugging Face encoder folder")
    parser.add_argument("--task", required=True, help="an MTEB retrieval task, e.g. SciFact")
    parser.add_argument("--data", type=Path, required=True, help="the task's BEIR folder on disk")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, default=None, help="write the scores as JSON here")
    identical = parser.add_mutually_exclusive_group()
    identical.add_argument("--ignore-identical-ids", dest="identical", action="store_true",
                           default=None, help="drop a hit whose id is the query's (BEIR's rule)")
    identical.add_argument("--keep-identical-ids", dest="identical", action="store_false",
                           help="keep them (default: the MTEB task's own setting)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    result = evaluate(args.encoder, args.task, args.data, args.split, args.config, args.identical)
    if args.out is not None:
        from . import artifacts

        artifacts.write_json(args.out, result)
    scores = result["scores"]
    print(f"{args.task} {args.split}: main score {result['main_score']:.4f}, nDCG@10 "
          f"{scores.get('ndcg_at_10', float('nan')):.4f}, R@100 "
          f"{scores.get('recall_at_100', float('nan')):.4f}")


if __name__ == "__main__":
    main()
