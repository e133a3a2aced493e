"""Retrieval datasets in one canonical Parquet form, from BEIR folders or MS MARCO files.

Every later stage (BM25, fine-tuning, mining, retrieval, scoring) reads only the files of the
datasets contract (contracts/datasets/): results/datasets/{dataset}/corpus.parquet,
queries-{split}.parquet, qrels-{split}.parquet and dataset.json; its checks run here before anything
is published. The source files are read by dataset_files.py.

Title and text stay separate in corpus.parquet; the contract's `join_title` (and `joined_text_expr`
here, for polars) builds the text a model or BM25 consumes, so the representation is a config
choice, not baked in.

Quirks are counted (corpus: dataset.json; split: the queries/qrels manifests), never silently fixed:
- query ids equal to document ids (BEIR reuses ids; Anserini's `-removeQuery` excludes the query's
  own id from its ranking: `exclude_query_id` records whether downstream search must do the same),
- qrels naming documents missing from the corpus (kept: they count as unretrievable relevants, as
  the official evaluation does), up to the entry's `max_missing_judged_documents` (default 0: a
  corpus of another dataset or version would otherwise score 0 everywhere without a word; BEIR
  ArguAna lacks a few of its judged documents), qrels naming queries the queries file lacks
  (dropped, counted) up to `max_unknown_judged_queries` (default 0: DL20 topics paired with DL19
  qrels would publish an empty split); a split with no judged query is refused (except a dpr
  `questions` split, scored by answers),
- empty document texts / titles and empty queries (kept, counted).
An id no TREC run line can hold as one field (empty, or holding C's whitespace) is refused, not
counted: every run naming it would fail evaluation, after encoding and search (check_trec_ids).
A split's queries are those that appear in its qrels (BEIR's convention; MS MARCO's 808k train
queries include ~300k without any judgement, useless for training and evaluation), except for DPR's
open-domain QA files (`format: dpr`, dpr_dataset.py), whose questions are scored by their answers:
all are kept, and `answers` writes answers-{split}.parquet.

MS MARCO collections (22 GB of documents) are streamed: read in batches of lines, written batch by
batch into corpus.parquet (one row group per batch), counted on the way; unique ids are checked on
the doc_id column read back, so memory holds one batch and the ids, never the corpus (passage
titles are merged as both files stream: dataset_files._with_titles).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pyarrow.parquet as pq

from . import artifacts
from . import dpr_dataset
from .config import refuse_unknown, section_schema, stage_parser
from .contracts.datasets import (
    ANSWERS_SCHEMA, CORPUS_SCHEMA, QRELS_SCHEMA, QUERIES_SCHEMA, TITLE_MODES, DatasetError,
)
from .contracts.datasets.checks import (
    check_corpus_batch, check_split, check_trec_ids, check_unique,
)
from .dataset_files import corpus_batches, corpus_source, load_split
from .errors import command, reading

log = logging.getLogger(__name__)


# --- the text a model consumes --------------------------------------------------------------


def joined_text_expr(mode: str, sep_token: str = "[SEP]") -> pl.Expr:
    """`join_title` as a polars expression over the corpus columns `title` and `text`."""
    if mode not in TITLE_MODES:
        raise ValueError(f"title mode {mode!r} unknown; use one of {', '.join(TITLE_MODES)}")
    text = pl.col("text").fill_null("")
    title = pl.col("title").fill_null("")
    if mode == "none":
        return text.alias("text")
    glue = f" {sep_token} " if mode == "sep" else " "
    return pl.when(title == "").then(text).otherwise(title + glue + text).alias("text")


def dataset_dir(root: str | os.PathLike, dataset: str) -> Path:
    return Path(root) / dataset


def read_info(folder: str | os.PathLike) -> dict[str, Any]:
    """dataset.json of a prepared dataset: title mode, exclude_query_id, corpus quirks."""
    return artifacts.read_json_object(Path(folder) / "dataset.json",
                                      "a prepared dataset's dataset.json")


def read_qrels(path: str | os.PathLike, min_relevance: int = 1) -> dict[str, set[str]]:
    """{query_id: {doc_id, ...}} of the judgements with relevance >= min_relevance."""
    with reading(path, "a qrels Parquet file"):
        frame = pl.read_parquet(path).filter(pl.col("relevance") >= min_relevance)
    grouped = frame.group_by("query_id").agg(pl.col("doc_id"))
    return {q: set(docs) for q, docs in grouped.iter_rows()}


# --- writing the canonical dataset ----------------------------------------------------------


def write_corpus(batches: Iterator[pl.DataFrame], path: Path, name: str) -> dict[str, int]:
    """Stream `batches` into corpus.parquet (atomically, one row group per batch); the counts.

    Ids must be unique over the whole corpus: checked on the doc_id column read back before the
    file is renamed into place.
    """
    stats = dict.fromkeys(("documents", "empty_text", "empty_title", "empty_title_and_text"), 0)
    with artifacts.atomic_path(path) as tmp:
        with pq.ParquetWriter(tmp, CORPUS_SCHEMA, compression="zstd") as writer:
            for batch in batches:
                batch, counts = check_corpus_batch(batch)
                stats = {k: stats[k] + counts[k] for k in stats}
                table = batch.select(CORPUS_SCHEMA.names).to_arrow().cast(CORPUS_SCHEMA)
                writer.write_table(table)
        check_unique(pl.read_parquet(tmp, columns=["doc_id"]), "doc_id", f"{name} corpus")
    return stats


def _params(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("name", "format", "title", "exclude_query_id")}


def _small_inputs(inputs: dict[str, Path]) -> dict[str, Path]:
    # Checksumming multi-GB downloads again is slow; their MD5 was verified by the download rule.
    return {k: v for k, v in inputs.items() if Path(v).stat().st_size < (1 << 30)}


def corpus_subset(
    entry: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> tuple[list[str], dict[str, Any], dict[str, Path]]:
    """(doc ids to keep, what the sample is, the qrels files read) for `subset: {documents, seed}`:
    every document a split's qrels judge, then the others in the order of a hash of (seed, doc_id)
    until `documents` are kept. Deterministic, independent of file order."""
    spec = entry["subset"]
    if entry["format"] != "beir":
        raise DatasetError(f"dataset {entry['name']!r}: `subset` is for beir datasets only; "
                           "remove it (MS MARCO collections are streamed, not sampled)")
    judged: set[str] = set()
    files = {}
    for split in entry["splits"]:
        _, qrels, inputs = load_split(entry, split["name"], data_root, downloads)
        judged |= set(qrels["doc_id"].to_list())
        files[f"qrels_{split['name']}"] = inputs["qrels"]
    batches = corpus_batches(entry, data_root, downloads)[0]
    corpus_ids = set(pl.concat([b.select("doc_id") for b in batches])["doc_id"].to_list())
    others = sorted(corpus_ids - judged,
                    key=lambda d: hashlib.sha256(f"{spec['seed']}:{d}".encode()).hexdigest())
    present = judged & corpus_ids
    keep = sorted(present) + others[: max(0, spec["documents"] - len(present))]
    return keep, {"documents": spec["documents"], "seed": spec["seed"], "judged": len(present),
                  "full_corpus": len(corpus_ids)}, files


def _trec_doc_ids(batches: Iterator[pl.DataFrame], where: str) -> Iterator[pl.DataFrame]:
    """The batches, each doc_id checked as a TREC field (check_trec_ids) as it streams past, so
    an id no run line can hold stops the corpus here, not evaluation after encoding and search."""
    before = 0
    for batch in batches:
        check_trec_ids(batch["doc_id"], where, "doc", before=before)
        before += batch.height
        yield batch


def prepare_corpus(
    entry: dict[str, Any],
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """Write corpus.parquet (+ manifest) and dataset.json (title mode, query-id rule, corpus quirks)."""
    batches, inputs = corpus_batches(entry, data_root, downloads)
    batches = _trec_doc_ids(batches, corpus_source(entry, data_root, downloads))
    subset = None
    if entry.get("subset"):
        keep, subset, qrels_files = corpus_subset(entry, data_root, downloads)
        batches = (batch.filter(pl.col("doc_id").is_in(keep)) for batch in batches)
        inputs |= qrels_files
    path = Path(out_dir) / "corpus.parquet"
    stats = write_corpus(batches, path, entry["name"])
    artifacts.write_manifest(
        artifacts.manifest_path(path),
        stage="datasets.corpus",
        params=_params(entry),
        inputs=_small_inputs(inputs),
        stats=stats,
    )
    # No split list: the corpus job is given none (a new split must not rebuild the corpus).
    info = _params(entry) | {"corpus": stats}
    if subset is not None:
        info["subset"] = subset
    artifacts.write_json(Path(out_dir) / "dataset.json", info)
    log.info(
        "%s: %d documents, %d with empty text, %d with empty title",
        entry["name"],
        stats["documents"],
        stats["empty_text"],
        stats["empty_title"],
    )
    return info


def prepare_split(
    entry: dict[str, Any],
    split: str,
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """Write queries-{split}.parquet and qrels-{split}.parquet; quirk counts go to their manifests."""
    out_dir = Path(out_dir)
    if entry["format"] == "dpr":
        queries, qrels, _, inputs, counts = dpr_dataset.load_split(entry, split, data_root, downloads)
    else:
        (queries, qrels, inputs), counts = load_split(entry, split, data_root, downloads), {}
    doc_ids = pl.read_parquet(out_dir / "corpus.parquet", columns=["doc_id"])
    every, all_qrels, (queries, qrels, stats) = queries, qrels, check_split(
        queries, qrels, doc_ids, f"{entry['name']} ({split})")
    first = next(iter(inputs.values()))  # dpr: one file holds questions and positives
    published = every if entry["format"] == "dpr" else queries
    # Only what is published: a query no qrels judge never heads a run line.
    check_trec_ids(published["query_id"], str(inputs.get("queries", first)), "query",
                   every["query_id"])
    check_trec_ids(qrels["doc_id"], str(inputs.get("qrels", first)), "doc", all_qrels["doc_id"])
    unknown_allowed = entry.get("max_unknown_judged_queries", 0)
    check_judged_queries(entry, split, stats, unknown_allowed, inputs, every)
    qrels_input = inputs.get("qrels") or next(iter(inputs.values()))
    if entry["format"] == "dpr":  # questions are scored by their answers: keep every one
        queries = every.with_columns(pl.col("text").fill_null(""))
        stats |= counts | {"queries": queries.height,
                           "queries_without_qrels": queries.height - stats["queries"]}
    allowed = entry.get("max_missing_judged_documents", 0)
    if stats["judged_documents_missing"] > allowed:
        corpus = checked_corpus(entry, out_dir, data_root, downloads)
        raise DatasetError(
            missing_documents_message(entry, split, stats, allowed, qrels_input, corpus)
        )
    inputs = _small_inputs(inputs) | {"corpus": out_dir / "corpus.parquet"}
    for kind, frame, schema in (
        ("queries", queries, QUERIES_SCHEMA),
        ("qrels", qrels, QRELS_SCHEMA),
    ):
        path = out_dir / f"{kind}-{split}.parquet"
        artifacts.write_parquet(path, frame.to_arrow(), schema)
        artifacts.write_manifest(
            artifacts.manifest_path(path),
            stage="datasets.split",
            params=_params(entry) | {"split": split, "max_missing_judged_documents": allowed,
                                     "max_unknown_judged_queries": unknown_allowed},
            inputs=inputs,
            stats=stats,
        )
    log.info(
        "%s/%s: %d queries, %d qrels (%d name the %d judged documents missing from the corpus, "
        "%d name unknown queries), %d query ids equal to document ids, %d empty queries",
        entry["name"],
        split,
        stats["queries"],
        stats["qrels"],
        stats["qrels_missing_document"],
        stats["judged_documents_missing"],
        stats["qrels_unknown_query"],
        stats["query_ids_equal_doc_ids"],
        stats["empty_queries"],
    )
    return stats


def prepare_answers(
    entry: dict[str, Any],
    split: str,
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """Write answers-{split}.parquet (format dpr): each question's answer strings."""
    if entry["format"] != "dpr":
        raise DatasetError(f"dataset {entry['name']!r} is {entry['format']}: only format dpr "
                           "datasets have answer lists (score it with qrels measures)")
    _, _, answers, inputs, counts = dpr_dataset.load_split(entry, split, data_root, downloads)
    path = Path(out_dir) / f"answers-{split}.parquet"
    artifacts.write_parquet(path, answers.to_arrow(), ANSWERS_SCHEMA)
    stats = counts | {"questions": answers.height,
                      "answers": int(answers["answers"].list.len().sum() or 0)}
    artifacts.write_manifest(artifacts.manifest_path(path), stage="datasets.answers",
                             params=_params(entry) | {"split": split},
                             inputs=_small_inputs(inputs), stats=stats)
    log.info("%s/%s answers: %s", entry["name"], split, stats)
    return stats


def checked_corpus(entry: dict[str, Any], out_dir: Path, data_root: str | None,
                   downloads: Path | None) -> str:
    """The corpus a split was checked against, as a message names it: the file the entry names,
    or, where its corpus.parquet was prepared for another dataset (its manifest says whose: a
    shared corpus, `corpus.same_as`, is a copy), the copy and whose it is. A copy's file is under
    its source's downloads, not `downloads` (the entry's own), where a message would send a user
    looking for a file that was never fetched. Said without brackets: the refusal that names it
    adds its own."""
    path = out_dir / "corpus.parquet"
    manifest = artifacts.manifest_path(path)
    params = (artifacts.read_manifest(manifest, "a corpus.parquet's manifest")["params"]
              if manifest.is_file() else {})
    owner = params.get("name")
    if owner is None or owner == entry["name"]:
        return corpus_source(entry, data_root, downloads)
    return f"{path}, copied from {owner!r} by corpus.same_as"


def missing_documents_message(
    entry: dict[str, Any], split: str, stats: dict[str, Any], allowed: int, qrels: Path, corpus: str
) -> str:
    """Why a split is refused: its qrels judge more documents the corpus lacks than allowed."""
    missing, judged = stats["judged_documents_missing"], stats["judged_documents"]
    examples = ", ".join(repr(d) for d in stats["judged_documents_missing_examples"])
    if missing == judged:
        what = "it holds none of them: the two files belong to different datasets"
    else:
        what = f"it holds {judged - missing}"
    return (
        f"dataset {entry['name']!r} split {split!r}: {missing} of the {judged} documents judged "
        f"in {qrels} are missing from the corpus {corpus} ({what}; missing e.g. {examples}), "
        "and every score would count them as misses. Point the entry at the corpus these qrels "
        "belong to; if the dataset itself lacks them (BEIR ArguAna lacks a few), allow them with "
        f"`max_missing_judged_documents: {missing}` in its datasets entry (now {allowed})"
    )


def check_judged_queries(entry: dict[str, Any], split: str, stats: dict[str, Any], allowed: int,
                         inputs: dict[str, Path], queries: pl.DataFrame) -> None:
    """Refuse a split that judges no query of its queries, or more unknown queries than allowed.
    A dpr `questions` split has no qrels by design: its questions are scored by their answers."""
    empty = stats["queries"] == 0 and "questions" not in inputs
    if empty or stats["judged_queries_unknown"] > allowed:
        first = next(iter(inputs.values()))  # dpr: one file holds questions and positives
        raise DatasetError(unknown_queries_message(
            entry, split, stats, allowed, inputs.get("queries", first), inputs.get("qrels", first),
            queries["query_id"].head(3).to_list()))


def unknown_queries_message(
    entry: dict[str, Any], split: str, stats: dict[str, Any], allowed: int, queries: Path,
    qrels: Path, query_examples: list[str],
) -> str:
    """Why a split is refused: it judges no query of its queries file, or more unknown queries
    than allowed (a wrong pairing such as DL20 topics with DL19 qrels would publish 0 queries, and
    the failure would show only at scoring, blaming retrieval)."""
    unknown, kept = stats["judged_queries_unknown"], stats["queries"]
    where = f"dataset {entry['name']!r} split {split!r}"
    listed = ", ".join(repr(q) for q in query_examples) or "none"
    if unknown == 0:  # kept == 0: nothing judged at all
        return (f"{where}: 0 queries; {qrels} judges no query of {queries} (which lists e.g. "
                f"{listed}). Point the split at the qrels its queries belong to")
    examples = ", ".join(repr(q) for q in stats["judged_queries_unknown_examples"])
    if kept == 0:
        what, effect = "none of them: the two files belong to different query sets", "empty"
    else:
        what, effect = f"it holds the other {kept}", "without their judgements"
    message = (f"{where}: {unknown} queries judged in {qrels} are not in {queries} ({what}; "
               f"unknown e.g. {examples}; the queries file lists e.g. {listed}), and the split "
               f"would be published {effect}. Point the split at the queries file its qrels "
               "belong to")
    if kept:
        message += ("; if the dataset itself lacks them, allow them with "
                    f"`max_unknown_judged_queries: {unknown}` in its datasets entry "
                    f"(now {allowed})")
    return message


def prepare(
    entry: dict[str, Any],
    out_dir: Path,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """The whole dataset (corpus, then every split) in one call: for tests and notebooks."""
    info = prepare_corpus(entry, out_dir, data_root, downloads)
    info["split_stats"] = {
        s["name"]: prepare_split(entry, s["name"], out_dir, data_root, downloads)
        for s in entry["splits"]
    }
    if entry["format"] == "dpr":
        for s in entry["splits"]:
            prepare_answers(entry, s["name"], out_dir, data_root, downloads)
    return info


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("Write a retrieval dataset in canonical Parquet form.")
    parser.add_argument("command", choices=["corpus", "split", "answers"])
    parser.add_argument("--split", help="split name (commands `split`, `answers`)")
    parser.add_argument("--out", required=True, type=Path, help="results/datasets/{dataset}/")
    parser.add_argument(
        "--data-root", default=None, help="extra folder config paths may point into"
    )
    parser.add_argument(
        "--downloads",
        type=Path,
        default=None,
        help="folder of this dataset's downloads (default results/downloads/datasets/<name>)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    refuse_unknown(args.config, section_schema("datasets")["items"], "datasets")
    if args.command == "corpus":
        prepare_corpus(args.config, args.out, args.data_root, args.downloads)
    elif args.split is None:
        parser.error(f"`{args.command}` needs --split NAME")
    elif args.command == "answers":
        prepare_answers(args.config, args.split, args.out, args.data_root, args.downloads)
    else:
        prepare_split(args.config, args.split, args.out, args.data_root, args.downloads)


if __name__ == "__main__":
    main()
