"""The retrieval dataset contract (results/datasets/{dataset}/, written by datasets.py).

    corpus.parquet            doc_id string, title string, text string (doc_id unique)
    queries-{split}.parquet   query_id string, text string (the split's judged queries, unique)
    qrels-{split}.parquet     query_id string, doc_id string, relevance int32 (each pair once)
    dataset.json              title mode, query-id rule, splits, corpus quirks

Quirks are counted, never silently fixed (datasets.py's docstring says which and why): the counts
are made here, by the checks the writer runs before publishing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .base import (
    RANK_JSON, RANK_PARQUET, Audit, describe_origin, json_kind, parquet_kind, read_manifest,
    render_table_rows, results_root, show_manifest, show_snakemake_record,
)

CORPUS_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
QUERIES_SCHEMA = pa.schema([("query_id", pa.string()), ("text", pa.string())])
QRELS_SCHEMA = pa.schema(
    [("query_id", pa.string()), ("doc_id", pa.string()), ("relevance", pa.int32())]
)
TITLE_MODES = ("none", "sep", "space")  # dataset.json's `title`: how title and text are joined
FILES = [
    ("datasets/*/dataset.json", "dataset info: title mode, query-id rule, splits, corpus quirks",
     "prepare_dataset"),
]


class DatasetError(ValueError):
    """An input file is malformed (the message names the file, the line and the fix)."""


# ----------------------------------------------------------------------------- the writer's checks
def check_unique(frame: pl.DataFrame, column: str, what: str) -> None:
    dupes = frame.filter(pl.col(column).is_duplicated())
    if dupes.height:
        sample = dupes[column].unique(maintain_order=True).head(5).to_list()
        raise DatasetError(
            f"{what}: {dupes[column].n_unique()} duplicated {column}s (e.g. {sample}); ids must be "
            "unique, fix the input file"
        )


def _blank(column: str) -> pl.Expr:
    return pl.col(column).str.strip_chars() == ""


def check_corpus_batch(batch: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Nulls as empty strings; count the documents, empty texts and titles of one batch."""
    batch = batch.with_columns(pl.col("title").fill_null(""), pl.col("text").fill_null(""))
    return batch, {
        "documents": batch.height,
        "empty_text": batch.filter(_blank("text")).height,
        "empty_title": batch.filter(_blank("title")).height,
        "empty_title_and_text": batch.filter(_blank("text") & _blank("title")).height,
    }


def check_split(
    queries: pl.DataFrame, qrels: pl.DataFrame, doc_ids: pl.DataFrame, what: str
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Keep the judged queries, keep every judgement of a known query; count each quirk.

    queries_without_qrels: queries of the file never judged in this split (for BEIR, whose
    queries.jsonl holds every split, these are mostly the other splits' queries).
    """
    queries = queries.with_columns(pl.col("text").fill_null(""))
    check_unique(queries, "query_id", f"{what} queries")
    repeated = qrels.height - qrels.unique(["query_id", "doc_id"]).height
    if repeated:
        raise DatasetError(
            f"{what} qrels: {repeated} repeated (query, document) pairs; each pair must be judged "
            "once, fix the qrels file"
        )
    known = qrels.join(queries.select("query_id"), on="query_id", how="semi")
    judged = queries.join(known.select("query_id").unique(), on="query_id", how="semi")
    missing_docs = known.join(doc_ids, on="doc_id", how="anti")
    self_ids = judged.join(doc_ids.rename({"doc_id": "query_id"}), on="query_id", how="semi")
    stats = {
        "queries": judged.height,
        "queries_without_qrels": queries.height - judged.height,
        "qrels": known.height,
        "qrels_unknown_query": qrels.height - known.height,
        "qrels_missing_document": missing_docs.height,
        "qrels_missing_document_examples": [list(r) for r in missing_docs.head(5).rows()],
        "positive_qrels": known.filter(pl.col("relevance") > 0).height,
        "relevance_levels": {
            str(level): n for level, n in sorted(known.group_by("relevance").len().iter_rows())
        },
        "query_ids_equal_doc_ids": self_ids.height,
        "empty_queries": judged.filter(_blank("text")).height,
    }
    return judged, known, stats


# ----------------------------------------------------------------------------- audit
def dataset_folder(path: Path) -> Path | None:
    """results/{bm25,finetune/...,runs}/.../{dataset}/... -> results/datasets/{dataset}."""
    root = results_root(path)
    if root is None:
        return None
    for part in path.resolve().relative_to(root.resolve()).parts:
        if (root / "datasets" / part).is_dir():
            return root / "datasets" / part
    return None


def lookup_text(folder: Path | None, pattern: str, key: str, ids: list[str]) -> dict[str, str]:
    """id -> text (documents: 'title: text') for a few ids, from the dataset's Parquet files."""
    if folder is None:
        return {}
    found = {}
    for f in sorted(folder.glob(pattern)):
        t = pq.read_table(f)
        t = t.filter(pc.is_in(t[key], value_set=pa.array(ids, pa.string())))
        texts = t["text"].to_pylist()
        if "title" in t.schema.names:
            texts = [
                f"{title}: {text}" if title else text
                for title, text in zip(t["title"].to_pylist(), texts)
            ]
        found.update(zip(t[key].to_pylist(), texts))
    return found


def render_qrels(a: Audit, t: pa.Table, manifest, n: int) -> None:
    a.say(
        f"-- {len(pc.unique(t['query_id']))} queries, relevance levels "
        f"{sorted(pc.unique(t['relevance']).to_pylist())}"
    )
    render_table_rows(None)(a, t, manifest, n)


def audit_dataset_info(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "dataset info (dataset.json)"
    describe_origin(a, "a dataset.json")
    corpus = a.path.parent / "corpus.parquet"
    a.say(
        f"-- dataset {data.get('name')} ({data.get('format')}): title mode {data.get('title')!r}, "
        f"exclude_query_id {data.get('exclude_query_id')}, splits {data.get('splits')}"
    )
    a.say(f"  corpus quirks: {json.dumps(data.get('corpus'), sort_keys=True)}")
    for split in data.get("splits") or []:
        files = [f"{kind}-{split}.parquet" for kind in ("queries", "qrels")]
        present = [f for f in files if (a.path.parent / f).is_file()]
        a.say(f"  split {split}: {', '.join(present) or 'not prepared (no rule asked for it)'}")
    a.say("-- written with corpus.parquet; its manifest:")
    show_manifest(a, read_manifest(corpus))
    show_snakemake_record(a, a.path)
    modes = f"{', '.join(TITLE_MODES[:-1])} or {TITLE_MODES[-1]}"
    a.check(f"title mode is {modes}", data.get("title") in TITLE_MODES)
    if a.check("corpus.parquet beside it", corpus.is_file(), str(corpus)):
        rows = pq.ParquetFile(corpus).metadata.num_rows
        documents = (data.get("corpus") or {}).get("documents")
        a.check(
            "document count equals corpus.parquet's rows",
            rows == documents,
            f"{documents} vs {rows} rows",
        )


def _has(schema: pa.Schema):
    return lambda columns: set(schema.names) <= columns


KINDS = [
    parquet_kind(
        "corpus", RANK_PARQUET + 5, CORPUS_SCHEMA, _has(CORPUS_SCHEMA), render_table_rows("doc_id")
    ),
    parquet_kind(
        "qrels", RANK_PARQUET + 6, QRELS_SCHEMA, _has(QRELS_SCHEMA), render_qrels
    ),
    parquet_kind(
        "queries", RANK_PARQUET + 7, QUERIES_SCHEMA, _has(QUERIES_SCHEMA),
        render_table_rows("query_id"),
    ),
    json_kind(
        "dataset.json", RANK_JSON + 4,
        lambda p: p.name == "dataset.json" and isinstance(p.data, dict) and "splits" in p.data,
        audit_dataset_info,
    ),
]
