"""How `audit` shows and checks a retrieval dataset's files (corpus, queries, qrels, dataset.json).
`dataset_folder` and `lookup_text` also serve the audits of negatives and runs, which show their
queries and documents as text.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...answers import tokens
from ...errors import json_value_kind
from ..base import (
    RANK_JSON, RANK_PARQUET, Audit, describe_origin, json_kind, parquet_kind, read_manifest,
    render_table_rows, results_root, show_manifest, show_snakemake_record,
)
from . import ANSWERS_SCHEMA, CORPUS_SCHEMA, QRELS_SCHEMA, QUERIES_SCHEMA, TITLE_MODES
from .checks import untrec_ids, why_untrec

FILES = [
    ("datasets/*/dataset.json", "dataset info: title mode, query-id rule, corpus quirks",
     "prepare_dataset"),
]


def dataset_folder(path: Path) -> Path | None:
    """results/{bm25,finetune/...,runs}/.../{dataset}/... -> results/datasets/{dataset}."""
    root = results_root(path)
    if root is None:
        return None
    for part in path.resolve().relative_to(root.resolve()).parts:
        if (root / "datasets" / part).is_dir():
            return root / "datasets" / part
    return None


LOOKUP_ROWS = 4096  # rows of a row group holding a wanted id decoded at a time


def rows_with(path: Path, key: str, ids: list[str], columns: list[str]) -> pa.Table:
    """The rows whose `key` is one of `ids`, with `columns`: the key column read a row group at a
    time, the others only from row groups holding a wanted id, a few thousand rows at a time. A
    whole corpus.parquet read to show a few documents took 750 MB at 1M passages (~15 GB at
    Wikipedia's 21M)."""
    pf = pq.ParquetFile(path)
    wanted = pa.array(ids, pa.string())
    found = [pf.schema_arrow.empty_table().select(columns)]
    for group in range(pf.metadata.num_row_groups):
        keys = pf.read_row_group(group, columns=[key])[key]
        if not pc.any(pc.is_in(keys, value_set=wanted)).as_py():
            continue
        for batch in pf.iter_batches(LOOKUP_ROWS, row_groups=[group], columns=columns):
            hit = pc.is_in(batch.column(key), value_set=wanted)
            if pc.any(hit).as_py():
                found.append(pa.Table.from_batches([batch.filter(hit)]))
    return pa.concat_tables(found)


def lookup_text(folder: Path | None, pattern: str, key: str, ids: list[str]) -> dict[str, str]:
    """id -> text (documents: 'title: text') for a few ids, from the dataset's Parquet files."""
    if folder is None:
        return {}
    found = {}
    for f in sorted(folder.glob(pattern)):
        names = pq.ParquetFile(f).schema_arrow.names
        t = rows_with(f, key, ids, [c for c in (key, "title", "text") if c in names])
        texts = t["text"].to_pylist()
        if "title" in t.schema.names:
            texts = [
                f"{title}: {text}" if title else text
                for title, text in zip(t["title"].to_pylist(), texts)
            ]
        found.update(zip(t[key].to_pylist(), texts))
    return found


def check_trec_ids(a: Audit, t: pa.Table, column: str) -> None:
    """Each id of `column` is one field of a TREC run or qrels line (checks.untrec_ids), as
    datasets.py checks at preparation: a dataset prepared before it refused the others may hold
    one, and every run naming it fails evaluation, after the corpus was encoded and searched."""
    ids = pl.from_arrow(t[column])
    bad = untrec_ids(ids)
    count = int(bad.sum())
    detail = ""
    if count:
        row = int(bad.arg_true()[0])
        detail = (f"{count} rows, e.g. row {row}: {ids[row]!r} {why_untrec(ids[row])}; prepare the "
                  "dataset again (datasets now refuses such an id, naming its input record)")
    a.check(f"every {column} one TREC field (not empty, no space, tab, \\n, \\v, \\f or \\r)",
            not count, detail)


def render_corpus(a: Audit, t: pa.Table, manifest, n: int) -> None:
    check_trec_ids(a, t, "doc_id")
    render_table_rows("doc_id")(a, t, manifest, n)


def render_qrels(a: Audit, t: pa.Table, manifest, n: int) -> None:
    a.say(
        f"-- {len(pc.unique(t['query_id']))} queries, relevance levels "
        f"{sorted(pc.unique(t['relevance']).to_pylist())}"
    )
    check_trec_ids(a, t, "query_id")
    check_trec_ids(a, t, "doc_id")
    # The writer refuses a pair judged twice (checks.check_split): evaluation would count it twice.
    pairs = t.group_by(["query_id", "doc_id"]).aggregate([]).num_rows
    a.check(
        "each (query_id, doc_id) pair judged once",
        pairs == len(t),
        f"{len(t) - pairs} repeated rows" if pairs != len(t) else "",
    )
    check_qrels_against_split(a, t, manifest)
    render_table_rows(None)(a, t, manifest, n)


def recorded_stats(manifest) -> dict:
    """The manifest's stats ({} for none, or one that is not readable: show_manifest fails it)."""
    return (manifest.get("stats") or {}) if isinstance(manifest, dict) else {}


def check_qrels_against_split(a: Audit, t: pa.Table, manifest) -> None:
    """What the writer (datasets.prepare_split, contracts/datasets/checks.py) guarantees across
    files: every judged query is one of the split's queries (it drops the others), its counts
    are the file's, and judged_documents_missing (which it refuses past the entry's allowance)
    is the number of distinct judged documents corpus.parquet lacks. Relevance is any int32
    (Touché grades -2, TREC Web 0-4): its levels must be the ones the manifest counted."""
    stats = recorded_stats(manifest)
    if "qrels" in stats:
        a.check("rows equal the manifest's qrels count", stats["qrels"] == len(t),
                f"{len(t)} rows vs {stats['qrels']}")
    if "relevance_levels" in stats:
        counts = t.group_by("relevance").aggregate([("relevance", "count")]).to_pylist()
        levels = {str(r["relevance"]): r["relevance_count"] for r in counts}
        a.check("relevance levels and their counts are the manifest's",
                levels == stats["relevance_levels"], f"{levels} vs {stats['relevance_levels']}")
    split = a.path.name.removeprefix("qrels-").removesuffix(".parquet")
    queries = a.path.with_name(f"queries-{split}.parquet")
    if a.path.name.startswith("qrels-") and queries.is_file():
        known = pq.read_table(queries, columns=["query_id"]).column("query_id").combine_chunks()
        judged = pc.unique(t["query_id"])
        unknown = judged.filter(pc.invert(pc.is_in(judged, value_set=known)))
        a.check(f"every judged query is in {queries.name}", not len(unknown),
                f"{len(unknown)} unknown, e.g. {unknown.to_pylist()[:3]}" if len(unknown) else "")
    corpus = a.path.with_name("corpus.parquet")
    if "judged_documents_missing" in stats and corpus.is_file():
        documents = pq.read_table(corpus, columns=["doc_id"]).column("doc_id").combine_chunks()
        judged = pc.unique(t["doc_id"])
        missing = judged.filter(pc.invert(pc.is_in(judged, value_set=documents)))
        recorded = stats["judged_documents_missing"]
        a.check(f"judged documents missing from corpus.parquet: {recorded}, as the manifest "
                "counts", len(missing) == recorded,
                f"found {len(missing)}, e.g. {missing.to_pylist()[:3]}" if len(missing) != recorded
                else "")


def render_queries(a: Audit, t: pa.Table, manifest, n: int) -> None:
    stats = recorded_stats(manifest)
    if "queries" in stats:
        a.check("rows equal the manifest's queries count", stats["queries"] == len(t),
                f"{len(t)} rows vs {stats['queries']}")
    check_trec_ids(a, t, "query_id")
    render_table_rows("query_id")(a, t, manifest, n)


def render_answers(a: Audit, t: pa.Table, manifest, n: int) -> None:
    """Answers as the writer leaves them (dpr_dataset.load_split): every answer the source lists,
    those with no token (found in every passage by DPR's rule) counted, and the questions with
    none counted (kept with an empty list: Acc@k scores them 0)."""
    answers = t["answers"]
    flat = pc.list_flatten(answers)
    nulls = flat.null_count
    a.check("no answer null", not nulls, f"{nulls} null answers" if nulls else "")
    stats = (manifest or {}).get("stats") or {}
    tokenless = sum(not tokens(x) for x in flat.drop_null().to_pylist())
    recorded = stats.get("answers_without_tokens", 0)
    a.check(f"answers without a token: {recorded}, as the manifest counts", tokenless == recorded,
            f"found {tokenless}" if tokenless != recorded else "")
    empty = pc.sum(pc.equal(pc.list_value_length(answers).fill_null(0), 0)).as_py() or 0
    counted = stats.get("questions_without_answers", 0)
    a.check(
        f"questions without an answer: {counted}, as the manifest counts",
        empty == counted,
        f"found {empty}" if empty != counted else "",
    )
    render_table_rows("query_id")(a, t, manifest, n)


def info_writer(path: Path, data: dict) -> str | None:
    """The rule that wrote a dataset.json that prepare_dataset did not, from what the folder
    holds: one naming another dataset is an alias's (its source's, copied, or written with the
    alias's own title: alias_dataset_file / alias_dataset_info); one under its own name beside a
    corpus prepared for another dataset (the corpus manifest's `name`) is a shared corpus's
    (share_dataset_corpus). None: prepare_dataset's, or nothing to tell."""
    own = path.parent.name
    if isinstance(data.get("name"), str) and data["name"] != own:
        return "alias_dataset_file / alias_dataset_info"
    corpus = read_manifest(path.parent / "corpus.parquet") or {}
    owner = (corpus.get("params") or {}).get("name")
    if isinstance(owner, str) and owner != own:
        return "share_dataset_corpus"
    return None


def audit_dataset_info(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "dataset info (dataset.json)"
    describe_origin(a, "a dataset.json", rule=info_writer(a.path, data))
    corpus = a.path.parent / "corpus.parquet"
    a.say(
        f"-- dataset {data.get('name')} ({data.get('format')}): title mode {data.get('title')!r}, "
        f"exclude_query_id {data.get('exclude_query_id')}"
    )
    a.say(f"  corpus quirks: {json.dumps(data.get('corpus'), sort_keys=True)}")
    # The splits prepared so far (each is its own job, after the corpus): their files beside it.
    splits = sorted(p.name.removeprefix("queries-").removesuffix(".parquet")
                    for p in a.path.parent.glob("queries-*.parquet"))
    for split in splits:
        files = [f"{kind}-{split}.parquet" for kind in ("queries", "qrels", "answers")]
        present = [f for f in files if (a.path.parent / f).is_file()]
        a.say(f"  split {split}: {', '.join(present)}")
    a.say("-- written with corpus.parquet; its manifest:")
    show_manifest(a, read_manifest(corpus))
    show_snakemake_record(a, a.path)
    modes = f"{', '.join(TITLE_MODES[:-1])} or {TITLE_MODES[-1]}"
    a.check(f"title mode is {modes}", data.get("title") in TITLE_MODES)
    if a.check("corpus.parquet beside it", corpus.is_file(), str(corpus)):
        rows = pq.ParquetFile(corpus).metadata.num_rows
        quirks = data.get("corpus") or {}  # a string here was .get: exit 3
        documents = quirks.get("documents") if isinstance(quirks, dict) else None
        a.check(
            "document count equals corpus.parquet's rows",
            rows == documents,
            f"{documents} vs {rows} rows" if isinstance(quirks, dict) else
            f"its corpus is not a JSON object but {json_value_kind(quirks)}; rerun prepare_dataset",
        )


def _has(schema: pa.Schema):
    return lambda columns: set(schema.names) <= columns


KINDS = [
    # The counts datasets.py records (queries and qrels: their renderers check theirs), and the
    # ids each file publishes as TREC fields.
    parquet_kind(
        "corpus", RANK_PARQUET + 5, CORPUS_SCHEMA, _has(CORPUS_SCHEMA), render_corpus,
        columns=["doc_id"], counted_by=("documents",),
    ),
    parquet_kind(
        "qrels", RANK_PARQUET + 6, QRELS_SCHEMA, _has(QRELS_SCHEMA), render_qrels
    ),
    parquet_kind(
        "queries", RANK_PARQUET + 7, QUERIES_SCHEMA, _has(QUERIES_SCHEMA), render_queries,
        columns=["query_id"],
    ),
    parquet_kind(
        "answers", RANK_PARQUET + 9, ANSWERS_SCHEMA, _has(ANSWERS_SCHEMA), render_answers,
        counted_by=("questions",),
    ),
    json_kind(
        "dataset.json", RANK_JSON + 4,
        lambda p: (p.name == "dataset.json" and isinstance(p.data, dict)
                   and "exclude_query_id" in p.data),
        audit_dataset_info,
    ),
]
