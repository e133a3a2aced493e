"""Print a readable summary of any artifact the workflow writes: `python -m retrieval_pretraining.audit PATH`.

For every artifact: what it is, its manifest (stage, parameters, inputs and whether they still have
the recorded checksums), which Snakemake rule produced it (from .snakemake/metadata when present),
its schema and size, a few rows rendered as text (token ids decoded with the checkpoint tokenizer
named by the manifests, spans shown inside their chunk, negatives shown with their query), and the
contract checks it passed. Exit status: 0 all checks passed, 1 a check failed, 2 not an artifact.

Each artifact kind has one small renderer; `detect` picks it from the path and its contents. A file
inside a folder artifact (a model, Lucene or FAISS folder) is audited as part of that folder. Not
artifacts (exit 2, saying what they are instead): Snakemake's job logs (results/logs/), benchmarks
(results/benchmarks/) and `.snakemake_timestamp` markers, and any file this workflow does not write.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import bz2
import fnmatch
import html as _html
import json
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import artifacts


class NotAnArtifact(ValueError):
    """The path is not something this workflow writes (or is damaged beyond recognition)."""


@dataclass
class Audit:
    path: Path
    kind: str = "unknown"
    lines: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        self.lines.append(text)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        return bool(ok)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def render(self) -> str:
        out = [f"== {self.path}  [{self.kind}]", *self.lines, "", "-- checks"]
        out += [
            f"  {'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else "")
            for name, ok, detail in self.checks
        ] or ["  (none)"]
        return "\n".join(out)


# ----------------------------------------------------------------------------- shared helpers
def results_root(path: Path) -> Path | None:
    """The `results/` folder an artifact lives in (its siblings are found relative to it)."""
    for parent in [path, *path.resolve().parents]:
        if parent.name == "results":
            return parent
    return None


def results_relative(path: Path) -> str | None:
    """The path below its `results/` folder ('pretrain/costa/loss.png'), or None outside one."""
    root = results_root(path)
    if root is None:
        return None
    return path.resolve().relative_to(root.resolve()).as_posix()


def download_manifest_path(path: Path) -> Path:
    """download.py's manifest keeps the whole name: `x.xml.bz2` -> `x.xml.bz2.manifest.json`."""
    return path.with_name(path.name + ".manifest.json")


def read_manifest(path: Path) -> dict[str, Any] | None:
    for candidate in (artifacts.manifest_path(path), download_manifest_path(path)):
        if candidate.is_file() and candidate.resolve() != path.resolve():
            return json.loads(candidate.read_text())
    return None


# What each file below results/ is and which rule writes it (ARCHITECTURE.md's stage table), for the
# kinds whose contents do not say so. First match wins (fnmatch: `*` also matches `/`).
KNOWN_FILES: list[tuple[str, str, str]] = [
    ("corpus/spans/*/lengths.png", "span lengths against the scaled Beta density", "audit_spans"),
    ("corpus/spans/*/sample.md", "sample spans shown inside their chunks", "audit_spans"),
    ("pretrain/*/encoder/*", "a file of a pre-trained encoder folder",
     "pretrain_model / export_base_encoder"),
    ("pretrain/*/loss.png", "pre-training loss curve (from metrics.jsonl beside it)",
     "pretrain_model / export_base_encoder"),
    ("pretrain/*/heads.safetensors",
     "pre-training heads left out of the exported encoder (MLM head, COSTA projector, "
     "CPDAE decoder)",
     "pretrain_model"),
    ("finetune/*/encoder/*", "a file of a fine-tuned encoder folder",
     "finetune_stage1 / finetune_stage2"),
    ("finetune/*/loss.png", "fine-tuning loss curve (from metrics.jsonl beside it)",
     "finetune_stage1 / finetune_stage2"),
    ("checkpoints/*/mlm_head.safetensors",
     "the source checkpoint's trained MLM head (cls.predictions.*), which AutoModel drops",
     "stage_checkpoint"),
    ("checkpoints/*/*", "a file of a staged base checkpoint folder", "stage_checkpoint"),
    ("tokenizers/*/*", "a file of a staged tokenizer folder (what the corpus stages read)",
     "stage_tokenizer"),
    ("bm25/*/index/*", "a file of a BM25 (Lucene) index folder", "build_bm25_index"),
    ("index/*/faiss/*", "a file of a dense (FAISS) index folder", "build_dense_index"),
    ("datasets/*/dataset.json", "dataset info: title mode, query-id rule, splits, corpus quirks",
     "prepare_dataset"),
    ("downloads/*", "a downloaded source file, verified against its manifest",
     "download_dataset_file"),
    ("wikipedia/dump/*", "a Wikipedia dump file, verified against its manifest",
     "download_dump_part / download_dump_index"),
    ("tables.md", "the results tables with significance marks and provenance", "make_tables"),
    ("report/tables.html", "the results tables as HTML (Snakemake report)", "make_tables"),
    ("report/tables.json", "the results tables as JSON (values, marks, tests)", "make_tables"),
    ("report/stage-statistics.html", "per-stage statistics from the artifacts' manifests",
     "stage_statistics"),
    ("analysis/low-resource.*", "low-resource fine-tuning figure and its numbers",
     "low_resource_figure"),
    ("analysis/loss-curves.*", "every pre-training run's loss terms on shared axes",
     "loss_curves"),
    ("analysis/tsne/*", "t-SNE of one query's top candidates per fine-tuned model",
     "tsne_candidates"),
    ("analysis/coverage.*", "input-token coverage of [CLS] projected to the vocabulary",
     "token_coverage"),
    ("analysis/cpdae-top-words.*", "the CPDAE decoder's top words for sample texts",
     "cpdae_top_words"),
    ("state/*",
     "resume state of a training job (outside the declared outputs; deleted when the job ends)",
     "pretrain_model / finetune_stage1 / finetune_stage2"),
    ("report.html", "the Snakemake report", "`snakemake --report`"),
]


def known_file(path: Path) -> tuple[str, str] | None:
    """(what it is, which rule writes it) for a path below results/ that KNOWN_FILES names."""
    rel = results_relative(path)
    if rel is None:
        return None
    for pattern, what, rule in KNOWN_FILES:
        if fnmatch.fnmatchcase(rel, pattern):
            return what, rule
    return None


def describe_origin(a: Audit, label: str, required: bool = True) -> None:
    """Say what the file is and which rule writes it; refuse a file this workflow does not write
    (unless not `required`: its contents already identify it)."""
    known = known_file(a.path)
    if known is not None:
        who = known[1] if known[1].startswith("`") else f"rule {known[1]}"
        a.say(f"-- {known[0]}; written by {who}")
    elif required and snakemake_record(a.path) is None and read_manifest(a.path) is None:
        raise NotAnArtifact(
            f"{a.path}: {label}, but not one this workflow writes (not a known file below "
            "results/, no Snakemake record, no manifest)"
        )


def show_manifest(a: Audit, manifest: dict[str, Any] | None) -> None:
    a.say("-- manifest")
    if manifest is None:
        a.say("  (no manifest beside it)")
        return
    a.say(f"  stage: {manifest.get('stage')}   created: {manifest.get('created')}")
    a.say(f"  params: {short(json.dumps(manifest.get('params', {}), sort_keys=True), 400)}")
    if manifest.get("stats"):
        a.say(f"  stats: {short(json.dumps(manifest['stats'], sort_keys=True), 400)}")
    for name, entry in (manifest.get("inputs") or {}).items():
        status = ""
        source = Path(entry.get("path", ""))
        if "sha256" in entry and source.is_file():
            same = artifacts.sha256_file(source) == entry["sha256"]
            status = "unchanged" if same else "CHANGED since"
            a.check(f"input '{name}' still has the recorded checksum", same, str(source))
        elif "sha256" in entry:
            status = "not found now"
        a.say(f"  input {name}: {source} {status}")
    versions = manifest.get("versions") or {}
    if versions:
        a.say("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))


def snakemake_metadata(path: Path) -> tuple[Path, Path] | None:
    """(working directory, its .snakemake/metadata folder) of the project `path` lies in."""
    for workdir in path.resolve().parents:
        meta = workdir / ".snakemake" / "metadata"
        if meta.is_dir():
            return workdir, meta
    return None


def snakemake_record(path: Path) -> tuple[str, dict[str, Any]] | None:
    """(output, record) of the Snakemake job that wrote `path`, or the folder output holding it."""
    found = snakemake_metadata(path)
    if found is None:
        return None
    workdir, meta = found
    target = path.resolve()
    while target != workdir:
        rel = str(target.relative_to(workdir))
        record = meta / base64.urlsafe_b64encode(rel.encode()).decode()
        if record.is_file():
            return rel, json.loads(record.read_text())
        target = target.parent
    return None


def show_snakemake_record(a: Audit, path: Path) -> None:
    """Which rule, inputs and command produced it, from Snakemake's per-output metadata record."""
    found = snakemake_metadata(path)
    if found is None:
        return
    rel = str(path.resolve().relative_to(found[0]))
    a.say("-- produced by")
    record = snakemake_record(path)
    if record is None:
        a.say(f"  no Snakemake record for {rel} (built outside Snakemake, or long path)")
        return
    output, info = record
    if output != rel:
        a.say(f"  (part of the folder output {output})")
    end = info.get("endtime")
    when = (
        _dt.datetime.fromtimestamp(end, _dt.timezone.utc).isoformat(timespec="seconds")
        if isinstance(end, (int, float))
        else end
    )
    a.say(f"  rule {info.get('rule')}  (finished {when})")
    for item in info.get("input") or []:
        a.say(f"  input {item}")
    if info.get("log"):
        a.say(f"  log {', '.join(info['log'])}")
    if info.get("shellcmd"):
        a.say(f"  command: {short(' '.join(info['shellcmd'].split()), 300)}")


def short(text: str, limit: int = 160) -> str:
    text = text.replace("\n", " ⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def schema_summary(a: Audit, table_or_file: pq.ParquetFile) -> None:
    meta = table_or_file.metadata
    a.say(f"-- schema ({meta.num_rows} rows, {meta.num_row_groups} row groups)")
    for f in table_or_file.schema_arrow:
        a.say(f"  {f.name}: {f.type}")


def check_schema(a: Audit, schema: pa.Schema, expected: dict[str, pa.DataType]) -> None:
    for name, dtype in expected.items():
        got = schema.field(name).type if name in schema.names else None
        a.check(f"column {name} is {dtype}", got == dtype, f"found {got}" if got != dtype else "")


def load_tokenizer(root: Path | None, *manifests: dict[str, Any] | None):
    """The checkpoint tokenizer named by the manifests (params.checkpoint or an input path)."""
    from tokenizers import Tokenizer

    candidates = []
    for manifest in manifests:
        if not manifest:
            continue
        params = manifest.get("params") or {}
        name = params.get("checkpoint") or params.get("tokenizer")
        if name and root is not None:
            candidates.append(root / "checkpoints" / str(name) / "tokenizer.json")
        for entry in (manifest.get("inputs") or {}).values():
            p = Path(entry.get("path", ""))
            candidates += [p / "tokenizer.json", p.parent / "tokenizer.json"]
    if root is not None:
        candidates += sorted((root / "checkpoints").glob("*/tokenizer.json"))
    for c in candidates:
        if c.is_file():
            return Tokenizer.from_file(str(c)), c
    return None, None


def decode(tokenizer, ids) -> str:
    if tokenizer is None:
        return " ".join(map(str, ids))
    return tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)


# ----------------------------------------------------------------------------- Parquet kinds
CONTRACTS: dict[str, dict[str, pa.DataType]] = {
    "articles": {
        "page_id": pa.int64(),
        "title": pa.string(),
        "text": pa.large_string(),
        "revision_id": pa.int64(),
    },
    "chunks": {
        "chunk_id": pa.int64(),
        "page_id": pa.int64(),
        "chunk_index": pa.int32(),
        "input_ids": pa.list_(pa.int32()),
        "word_starts": pa.list_(pa.int32()),
    },
    "spans": {
        "chunk_id": pa.int64(),
        "span_start": pa.list_(pa.int32()),
        "span_end": pa.list_(pa.int32()),
        "granularity": pa.list_(pa.int8()),
    },
    "negatives": {
        "query_id": pa.string(),
        "positive_ids": pa.list_(pa.string()),
        "negative_ids": pa.list_(pa.string()),
        "negative_ranks": pa.list_(pa.int32()),
    },
    "corpus": {"doc_id": pa.string(), "title": pa.string(), "text": pa.string()},
    "queries": {"query_id": pa.string(), "text": pa.string()},
    "qrels": {"query_id": pa.string(), "doc_id": pa.string(), "relevance": pa.int32()},
    "ids": {"doc_id": pa.string()},  # the doc ids of an encoded corpus shard (row i = vector i)
}
GRANULARITY = {0: "word", 1: "phrase", 2: "sentence", 3: "paragraph"}


def parquet_kind(names: set[str]) -> str:
    if {"span_start", "span_end", "granularity"} <= names:
        return "spans"
    if {"input_ids", "word_starts"} <= names:
        return "chunks"
    if "negative_ids" in names:
        return "negatives"
    for kind in ("articles", "corpus", "qrels", "queries"):
        if set(CONTRACTS[kind]) <= names:
            return kind
    if names == {"doc_id"}:
        return "ids"
    raise NotAnArtifact(
        f"Parquet columns {sorted(names)} match no artifact contract of this workflow "
        "(articles, chunks, spans, negatives, corpus, queries, qrels, embedding ids)"
    )


def audit_parquet(a: Audit, n: int) -> None:
    try:
        pf = pq.ParquetFile(a.path)
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise NotAnArtifact(f"{a.path} is not a readable Parquet file: {error}") from error
    a.kind = parquet_kind(set(pf.schema_arrow.names))
    if a.kind == "negatives" and "negative_scores" in pf.schema_arrow.names:
        a.kind = "negatives (mined hard negatives)"
    manifest = read_manifest(a.path)
    show_manifest(a, manifest)
    show_snakemake_record(a, a.path)
    schema_summary(a, pf)
    check_schema(a, pf.schema_arrow, CONTRACTS[a.kind.split(" ")[0]])
    if "negative_scores" in pf.schema_arrow.names:  # hard negatives: the BM25 contract + scores
        check_schema(a, pf.schema_arrow, {"negative_scores": pa.list_(pa.float32())})
    table = pf.read()
    if manifest and "rows" in (manifest.get("stats") or {}):
        a.check(
            "row count equals the manifest's",
            manifest["stats"]["rows"] == table.num_rows,
            f"{table.num_rows} vs {manifest['stats']['rows']}",
        )
    PARQUET_RENDERERS[a.kind.split(" ")[0]](a, table, manifest, n)


def render_articles(a: Audit, t: pa.Table, manifest, n: int) -> None:
    ids = t["page_id"].to_numpy()
    a.check("page_id unique", len(np.unique(ids)) == len(ids))
    empty = int(pc.sum(pc.equal(pc.utf8_length(t["text"]), 0)).as_py() or 0)
    a.check("no empty text", empty == 0, f"{empty} empty")
    a.say("-- rows")
    for row in t.slice(0, n).to_pylist():
        paragraphs = row["text"].count("\n\n") + 1
        a.say(
            f"  [{row['page_id']}] {row['title']} ({len(row['text'])} chars, {paragraphs} paragraphs)"
        )
        a.say(f"      {short(row['text'], 240)}")


def render_chunks(a: Audit, t: pa.Table, manifest, n: int) -> None:
    tokenizer, source = load_tokenizer(results_root(a.path), manifest)
    a.say(f"-- tokenizer: {source or 'not found (ids shown raw)'}")
    ids = t["chunk_id"].to_numpy()
    a.check("chunk_id sorted and unique", bool(np.all(np.diff(ids) > 0)))
    expected = (t["page_id"].to_numpy() << 16) + t["chunk_index"].to_numpy().astype(np.int64)
    a.check("chunk_id == (page_id << 16) + chunk_index", bool(np.array_equal(ids, expected)))
    lengths = pc.list_value_length(t["input_ids"]).to_numpy()
    max_len = ((manifest or {}).get("params") or {}).get("max_len")
    if max_len:
        a.check(
            f"every chunk <= max_len {max_len}",
            int(lengths.max(initial=0)) <= max_len,
            f"longest {lengths.max(initial=0)}",
        )
    if tokenizer is not None:
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        rows = t["input_ids"].to_pylist()
        first = np.array([r[0] if r else -1 for r in rows])
        ends = np.array([r[-1] if r else -1 for r in rows])
        a.check(
            "every chunk starts with [CLS] and ends with [SEP]",
            bool(np.all(first == cls) and np.all(ends == sep)),
        )
    bad = [
        i
        for i, (ws, ln) in enumerate(zip(t["word_starts"].to_pylist(), lengths))
        if ws != sorted(set(ws)) or (ws and (ws[0] < 1 or ws[-1] > ln - 2))
    ]
    a.check(
        "word_starts sorted, inside the text tokens",
        not bad,
        f"first bad row {bad[:1]}" if bad else "",
    )
    if len(t):
        a.say(
            f"-- {len(t)} chunks, {int(lengths.sum())} tokens, length min/mean/max "
            f"{lengths.min()}/{lengths.mean():.1f}/{lengths.max()}"
        )
    a.say("-- rows")
    for row in t.slice(0, n).to_pylist():
        a.say(
            f"  chunk {row['chunk_id']} (page {row['page_id']} #{row['chunk_index']}, "
            f"{len(row['input_ids'])} tokens, {len(row['word_starts'])} words)"
        )
        a.say(f"      {short(decode(tokenizer, row['input_ids']), 300)}")


def render_spans(a: Audit, t: pa.Table, manifest, n: int) -> None:
    chunks_path = a.path.parents[2] / "chunks" / a.path.name
    for entry in ((manifest or {}).get("inputs") or {}).values():
        if Path(entry.get("path", "")).name == a.path.name and "chunks" in entry.get("path", ""):
            chunks_path = Path(entry["path"])
    if not a.check("matching chunks shard exists", chunks_path.is_file(), str(chunks_path)):
        return
    chunks = pq.read_table(chunks_path, columns=["chunk_id", "input_ids"])
    a.check(
        "row i describes chunk i (chunk_id equal row by row)",
        len(chunks) == len(t) and chunks["chunk_id"].equals(t["chunk_id"]),
    )
    lengths = pc.list_value_length(chunks["input_ids"]).to_numpy()
    bad, counts = [], {}
    for i, (s, e, g) in enumerate(
        zip(t["span_start"].to_pylist(), t["span_end"].to_pylist(), t["granularity"].to_pylist())
    ):
        ok = len(s) == len(e) == len(g) and all(1 <= x < y <= lengths[i] - 1 for x, y in zip(s, e))
        ok = ok and all(k in GRANULARITY for k in g)
        if not ok:
            bad.append(i)
        for k, x, y in zip(g, s, e):
            counts.setdefault(GRANULARITY.get(k, k), []).append(y - x)
    a.check(
        "spans inside the text tokens (never [CLS]/[SEP]), lists aligned, granularity 0..3",
        not bad,
        f"{len(bad)} bad rows, first {bad[:3]}" if bad else "",
    )
    a.say("-- span lengths per granularity (count, mean, min-max)")
    for name, ls in counts.items():
        a.say(f"  {name}: {len(ls)}, {np.mean(ls):.1f}, {min(ls)}-{max(ls)}")
    chunk_manifest = read_manifest(chunks_path)
    tokenizer, _ = load_tokenizer(results_root(a.path), manifest, chunk_manifest)
    a.say("-- spans shown inside their chunk (⟦span⟧; at most two per granularity)")
    for i in range(min(n, len(t))):
        ids = chunks["input_ids"][i].as_py()
        a.say(f"  chunk {t['chunk_id'][i].as_py()}:")
        shown: dict[int, int] = {}
        for s, e, g in zip(
            t["span_start"][i].as_py(), t["span_end"][i].as_py(), t["granularity"][i].as_py()
        ):
            shown[g] = shown.get(g, 0) + 1
            if shown[g] > 2:  # two per granularity keep the page readable
                continue
            left = decode(tokenizer, ids[max(1, s - 6) : s])
            right = decode(tokenizer, ids[e : e + 6])
            a.say(
                f"    {GRANULARITY.get(g, g):9s} [{s},{e}) …{left} ⟦{short(decode(tokenizer, ids[s:e]), 160)}⟧ {right}…"
            )


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


def render_negatives(a: Audit, t: pa.Table, manifest, n: int) -> None:
    rows = t.to_pylist()
    a.check("query_id unique", len({r["query_id"] for r in rows}) == len(rows))
    leaks = [r["query_id"] for r in rows if set(r["positive_ids"]) & set(r["negative_ids"])]
    a.check(
        "no query's own positive among its negatives",
        not leaks,
        f"{len(leaks)} queries, e.g. {leaks[:5]}" if leaks else "",
    )
    a.check(
        "one rank per negative",
        all(len(r["negative_ranks"]) == len(r["negative_ids"]) for r in rows),
    )
    if "negative_scores" in t.schema.names:
        a.check(
            "one score per negative",
            all(len(r["negative_scores"]) == len(r["negative_ids"]) for r in rows),
        )
    counts = [len(r["negative_ids"]) for r in rows]
    a.say(
        f"-- {len(rows)} queries, negatives per query min/mean/max "
        f"{min(counts, default=0)}/{np.mean(counts) if counts else 0:.1f}/{max(counts, default=0)}"
    )
    folder = dataset_folder(a.path)
    sample = rows[:n]
    queries = lookup_text(folder, "queries-*.parquet", "query_id", [r["query_id"] for r in sample])
    doc_ids = [d for r in sample for d in r["positive_ids"][:1] + r["negative_ids"][:3]]
    titles = lookup_text(folder, "corpus.parquet", "doc_id", doc_ids)
    a.say(f"-- rows (texts from {folder or 'no dataset folder found'})")
    for r in sample:
        a.say(f"  query {r['query_id']}: {short(queries.get(r['query_id'], '?'), 160)}")
        for d in r["positive_ids"][:1]:
            a.say(f"    + {d}: {short(titles.get(d, '?'), 140)}")
        for d, rank in list(zip(r["negative_ids"], r["negative_ranks"]))[:3]:
            a.say(f"    - {d} (rank {rank}): {short(titles.get(d, '?'), 130)}")


def render_table_rows(key: str | None):
    def render(a: Audit, t: pa.Table, manifest, n: int) -> None:
        if key is not None:
            a.check(f"{key} unique", len(pc.unique(t[key])) == len(t))
        if a.kind == "qrels":
            a.say(
                f"-- {len(pc.unique(t['query_id']))} queries, relevance levels "
                f"{sorted(pc.unique(t['relevance']).to_pylist())}"
            )
        a.say("-- rows")
        for row in t.slice(0, n).to_pylist():
            a.say("  " + " | ".join(f"{k}={short(str(v), 120)}" for k, v in row.items()))

    return render


PARQUET_RENDERERS: dict[str, Callable] = {
    "articles": render_articles,
    "chunks": render_chunks,
    "spans": render_spans,
    "negatives": render_negatives,
    "corpus": render_table_rows("doc_id"),
    "queries": render_table_rows("query_id"),
    "qrels": render_table_rows(None),
    "ids": render_table_rows("doc_id"),
}


# ----------------------------------------------------------------------------- other kinds
def audit_run(a: Audit, n: int) -> None:
    a.kind = "TREC run"
    per_query: dict[str, list[tuple[int, float, str]]] = {}
    for number, line in enumerate(a.path.read_text().splitlines(), 1):
        parts = line.split()
        if len(parts) != 6:
            raise NotAnArtifact(
                f"{a.path}:{number}: expected 6 fields 'qid Q0 docid rank score tag', "
                f"got {len(parts)}: {line!r}"
            )
        try:
            per_query.setdefault(parts[0], []).append((int(parts[3]), float(parts[4]), parts[2]))
        except ValueError as error:
            raise NotAnArtifact(f"{a.path}:{number}: rank/score not numeric: {line!r}") from error
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    depths = [len(v) for v in per_query.values()]
    a.say(
        f"-- {len(per_query)} queries, depth min/max {min(depths, default=0)}/{max(depths, default=0)}"
    )
    a.check(
        "ranks 1..k in order per query",
        all([r for r, _, _ in v] == list(range(1, len(v) + 1)) for v in per_query.values()),
    )
    a.check(
        "scores non-increasing by rank",
        all(all(x[1] >= y[1] for x, y in zip(v, v[1:])) for v in per_query.values()),
    )
    a.check(
        "no document twice for a query",
        all(len({d for *_, d in v}) == len(v) for v in per_query.values()),
    )
    folder = dataset_folder(a.path)
    first = list(per_query.items())[:1]
    for qid, hits in first:
        queries = lookup_text(folder, "queries-*.parquet", "query_id", [qid])
        docs = lookup_text(folder, "corpus.parquet", "doc_id", [d for *_, d in hits[:n]])
        a.say(f"-- query {qid}: {short(queries.get(qid, '?'), 160)}")
        for rank, score, d in hits[:n]:
            a.say(f"   {rank:4d} {score:10.4f} {d}  {short(docs.get(d, ''), 100)}")


def audit_json(a: Audit, n: int) -> None:
    try:
        data = json.loads(a.path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise NotAnArtifact(f"{a.path}: not JSON ({error})") from error
    if isinstance(data, dict) and {"aggregate", "per_query"} <= set(data):
        a.kind = "metrics (scores contract)"
        show_manifest(a, read_manifest(a.path))
        show_snakemake_record(a, a.path)
        a.say(f"-- run {data.get('run')}  qrels {data.get('qrels')}")
        for measure, value in data["aggregate"].items():
            scores = list((data["per_query"].get(measure) or {}).values())
            a.say(f"  {measure:12s} {value:.4f}  over {len(scores)} queries")
            if scores:
                a.check(
                    f"{measure} aggregate = mean of per-query scores",
                    math.isclose(value, float(np.mean(scores)), abs_tol=1e-4),
                    f"{value:.4f} vs {np.mean(scores):.4f}",
                )
        for measure in data.get("measures", []):
            a.check(f"measure {measure} present", measure in data["aggregate"])
    elif isinstance(data, dict) and {"stage", "params", "versions"} <= set(data):
        a.kind = "manifest"
        show_manifest(a, data)
    elif isinstance(data, dict) and "jobs" in data:
        a.kind = "Wikipedia dumpstatus.json"
        for job, info in list(data["jobs"].items())[: n * 4]:
            a.say(f"  {job}: {info.get('status')} ({len(info.get('files') or {})} files)")
    elif isinstance(data, dict) and {"tables", "missing"} <= set(data):
        render_tables_json(a, data, n)
    elif a.path.name == "dataset.json" and isinstance(data, dict) and "splits" in data:
        render_dataset_info(a, data, n)
    elif a.path.name == "tokenizer.json":
        audit_tokenizer(a, n)
    elif a.path.name in MODEL_FOLDER_JSON:
        a.kind = f"{a.path.name} (model folder file)"
        describe_origin(a, "a model folder file")
        check_folder(a)
        a.say("  " + short(json.dumps(data, sort_keys=True), 3000))
    elif (results_relative(a.path) or "").startswith("analysis/"):
        render_analysis_json(a, data, n)
    elif (results_relative(a.path) or "").startswith("state/"):
        a.kind = "resume state record (JSON)"
        describe_origin(a, "a resume state record")
        a.say(short(json.dumps(data, sort_keys=True), 1000))
    else:
        raise NotAnArtifact(
            f"{a.path}: JSON, but none this workflow writes (metrics, a manifest, dataset.json, "
            "tables.json, an analysis's numbers, a model folder file or a dumpstatus file)"
        )


# Hugging Face folder files (and training.json) shown as they are.
MODEL_FOLDER_JSON = {
    "config.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
    "training.json",
}


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
    else:
        a.check("inside a model folder (config.json + safetensors)", is_model_folder(folder))


def render_dataset_info(a: Audit, data: dict[str, Any], n: int) -> None:
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
    a.check("title mode is none, sep or space", data.get("title") in ("none", "sep", "space"))
    if a.check("corpus.parquet beside it", corpus.is_file(), str(corpus)):
        rows = pq.ParquetFile(corpus).metadata.num_rows
        documents = (data.get("corpus") or {}).get("documents")
        a.check(
            "document count equals corpus.parquet's rows",
            rows == documents,
            f"{documents} vs {rows} rows",
        )


def render_tables_json(a: Audit, data: dict[str, Any], n: int) -> None:
    a.kind = "results tables (JSON)"
    describe_origin(a, "a tables JSON")
    show_snakemake_record(a, a.path)
    empty = []
    for name, groups in data["tables"].items():
        rows = [r for g in groups for r in g["rows"]]
        a.say(f"-- table {name}: {len(groups)} groups, {len(rows)} rows")
        for g in groups:
            a.say(f"  {g['group']}")
            for r in g["rows"][: n * 3]:
                values = ", ".join(
                    f"{c['column']} "
                    + ("–" if c["value"] is None else f"{c['value']:.4f}{c.get('marks') or ''}")
                    for c in r["cells"]
                )
                a.say(f"    {r['label']} [{r['system'] or 'reference'}]: {values}")
        empty += [
            f"{name}: {r['label']}"
            for r in rows
            if r["system"] is not None and any(c["value"] is None for c in r["cells"])
        ]
    if data.get("low_resource"):
        a.say(f"-- low-resource: {short(json.dumps(data['low_resource'], sort_keys=True), 300)}")
    a.check(
        "no metrics file missing",
        not data["missing"],
        ", ".join(data["missing"][:5]) if data["missing"] else "",
    )
    a.check("every system row has a value in every column", not empty, ", ".join(empty[:5]))


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def render_analysis_json(a: Audit, data: Any, n: int) -> None:
    a.kind = "analysis numbers (JSON)"
    describe_origin(a, "an analysis JSON")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.say("-- " + short(json.dumps(data, sort_keys=True), 1500))
    figure = a.path.with_suffix(".png")
    a.check("the figure these numbers describe exists", figure.is_file(), str(figure))
    a.check("not empty", bool(data))
    numbers = _numbers(data)
    a.check("every number finite", all(math.isfinite(v) for v in numbers))


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
    sample = "Dense retrieval pre-training from Wikipedia."
    a.say(f"-- {tok.get_vocab_size()} entries; {sample!r} -> {tok.encode(sample).tokens}")
    check_folder(a)
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if tok.token_to_id(t) is None]
    a.check("has BERT's special tokens", not missing, f"missing {missing}" if missing else "")


def audit_jsonl(a: Audit, n: int) -> None:
    a.kind = "training metrics (JSON lines)"
    records = []
    for number, line in enumerate(a.path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise NotAnArtifact(f"{a.path}:{number}: not a JSON line ({error})") from error
    steps = [r["step"] for r in records if "step" in r]
    a.say(f"-- {len(records)} records, keys {sorted({k for r in records for k in r})}")
    a.check("steps increase", all(x < y for x, y in zip(steps, steps[1:])))
    numeric = [v for r in records for v in r.values() if isinstance(v, float)]
    a.check("every logged number finite", all(math.isfinite(v) for v in numeric))
    for r in records[:n] + (records[-1:] if len(records) > n else []):
        a.say("  " + short(json.dumps(r, sort_keys=True), 240))


def safetensors_tensors(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """({name: {shape, dtype}}, metadata) read with safetensors' safe_open (no weights loaded)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            tensors = {}
            for key in handle.keys():
                view = handle.get_slice(key)
                tensors[key] = {"shape": list(view.get_shape()), "dtype": view.get_dtype()}
            return tensors, handle.metadata() or {}
    except Exception as error:  # SafetensorError (a plain Exception subclass) for a bad header
        raise NotAnArtifact(f"{path}: not a safetensors file ({error})") from error


def audit_safetensors(a: Audit, n: int) -> None:
    tensors, metadata = safetensors_tensors(a.path)
    rel = results_relative(a.path) or ""
    config_path = a.path.parent / "config.json"
    if a.path.name == "heads.safetensors":
        a.kind = "pre-training heads (safetensors)"
        config_path = a.path.parent / "encoder" / "config.json"
    elif a.path.name == "mlm_head.safetensors":
        a.kind = "checkpoint MLM head (safetensors)"
    elif rel.startswith("state/"):
        a.kind = "resume state tensors (safetensors)"
    else:
        a.kind = "model weights (safetensors)"
    describe_origin(a, "a safetensors file")
    if a.kind.startswith("model weights"):
        a.say(f"  (one file of the model folder {a.path.parent}: audit the folder for the rest)")
    params = sum(int(np.prod(t["shape"])) for t in tensors.values())
    dtypes = sorted({t["dtype"] for t in tensors.values()})
    a.say(f"-- {len(tensors)} tensors, {params:,} parameters, dtypes {dtypes}")
    if metadata:
        a.say(f"  metadata: {short(json.dumps(metadata, sort_keys=True), 300)}")
    groups: dict[str, int] = {}
    for name in tensors:
        groups[name.split(".")[0]] = groups.get(name.split(".")[0], 0) + 1
    a.say("  groups: " + ", ".join(f"{g} ({k} tensors)" for g, k in sorted(groups.items())))
    for name, t in list(tensors.items())[: n * 6]:
        a.say(f"  {name}: {t['shape']} {t['dtype']}")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.check("holds at least one tensor", bool(tensors))
    if a.kind.startswith(("pre-training heads", "checkpoint MLM head")) and config_path.is_file():
        cfg = json.loads(config_path.read_text())
        sizes = {cfg.get("hidden_size"), cfg.get("vocab_size")}
        odd = [k for k, t in tensors.items() if not set(t["shape"]) <= sizes]
        a.check(
            f"every dimension is the encoder's hidden or vocabulary size ({config_path})",
            not odd,
            f"e.g. {odd[:3]}" if odd else "",
        )
    if a.path.name == "heads.safetensors" and "objective" in metadata:
        training = a.path.parent / "encoder" / "training.json"
        if training.is_file():
            objective = json.loads(training.read_text()).get("objective")
            a.check(
                "objective equals the encoder's training.json",
                objective == metadata["objective"],
                f"{metadata['objective']} vs {objective}",
            )


def audit_model(a: Audit, n: int) -> None:
    a.kind = "model folder (Hugging Face)"
    cfg = json.loads((a.path / "config.json").read_text())
    a.say(
        f"-- {cfg.get('model_type')} {cfg.get('architectures')}: {cfg.get('num_hidden_layers')} layers, "
        f"hidden {cfg.get('hidden_size')}, vocab {cfg.get('vocab_size')}"
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
        sample = "Dense retrieval pre-training from Wikipedia."
        a.say(
            f"-- tokenizer: {tok.get_vocab_size()} entries; {sample!r} -> {tok.encode(sample).tokens}"
        )


def audit_npy(a: Audit, n: int) -> None:
    a.kind = "embeddings (.npy)"
    try:
        x = np.load(a.path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise NotAnArtifact(f"{a.path}: not a plain .npy array ({error})") from error
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.say(f"-- shape {x.shape}, dtype {x.dtype}")
    sample = np.asarray(x[: min(len(x), 10000)], dtype=np.float32)
    a.check("2-d float matrix", x.ndim == 2 and x.dtype.kind == "f")
    a.check("finite values (first 10,000 rows)", bool(np.isfinite(sample).all()))
    if x.ndim == 2 and len(sample):
        norms = np.linalg.norm(sample, axis=1)
        a.say(f"  row norms min/mean/max {norms.min():.3f}/{norms.mean():.3f}/{norms.max():.3f}")
        for i in range(min(n, len(sample))):
            a.say(f"  [{i}] " + " ".join(f"{v:+.3f}" for v in sample[i, :8]) + " …")
    stem = a.path.name.removesuffix(".npy")
    ids = [a.path.with_name(f"{stem}.ids.parquet"), a.path.parent / "docid"]
    for p in [p for p in ids if p.is_file()][:1]:
        count = (
            len(pq.read_table(p))
            if p.suffix == ".parquet"
            else (
                len(np.load(p, allow_pickle=False))
                if p.suffix == ".npy"
                else len(p.read_text().splitlines())
            )
        )
        a.check(f"one id per row ({p.name})", count == len(x), f"{count} ids, {len(x)} rows")


def audit_faiss(a: Audit, n: int) -> None:
    import faiss

    a.kind = "FAISS index"
    try:
        index = faiss.read_index(str(a.path))
    except RuntimeError as error:
        raise NotAnArtifact(
            f"{a.path}: not a FAISS index ({str(error).splitlines()[-1]})"
        ) from error
    metric = {faiss.METRIC_INNER_PRODUCT: "inner product", faiss.METRIC_L2: "L2"}.get(
        index.metric_type
    )
    a.say(
        f"-- {type(index).__name__}: {index.ntotal} vectors, dim {index.d}, metric {metric}, "
        f"trained {index.is_trained}"
    )
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    docid = a.path.parent / "docid"
    if docid.is_file():
        count = len(docid.read_text().splitlines())
        a.check(
            "one docid line per vector (Pyserini FaissSearcher layout)",
            count == index.ntotal,
            f"{count} vs {index.ntotal}",
        )


def audit_faiss_folder(a: Audit, n: int) -> None:
    inner = Audit(a.path / "index")
    audit_faiss(inner, n)
    a.kind, a.lines, a.checks = (
        "FAISS folder (Pyserini layout: index + docid)",
        inner.lines,
        inner.checks,
    )
    a.say("-- first docids: " + ", ".join((a.path / "docid").read_text().splitlines()[:n]))


def audit_lucene(a: Audit, n: int) -> None:
    a.kind = "Lucene index folder"
    files = [p for p in a.path.iterdir() if p.is_file()]
    a.say(
        f"-- {len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.1f} MB; "
        f"segments: {sorted(p.name for p in files if p.name.startswith('segments'))}"
    )
    a.check("has a segments file", any(p.name.startswith("segments_") for p in files))
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)


def audit_dump(a: Audit, n: int) -> None:
    with open(a.path, "rb") as handle:
        head = handle.read(3)
    if head != b"BZh":
        raise NotAnArtifact(f"{a.path}: not bzip2 (starts with {head!r})")
    with bz2.open(a.path, "rt", encoding="utf-8", errors="replace") as handle:
        text = handle.read(2_000_000)
    if check_download(a) is None:
        show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    if "index" in a.path.name:
        a.kind = "multistream index (offset:pageid:title)"
        lines = text.splitlines()[: n * 3]
        a.check(
            "lines are offset:pageid:title",
            all(len(l.split(":", 2)) == 3 and l.split(":")[0].isdigit() for l in lines),
        )
        for l in lines:
            a.say(f"  {l}")
        return
    a.kind = "Wikipedia XML dump part"
    a.check("MediaWiki export XML", "<mediawiki" in text[:2000] or "<page>" in text)
    titles = [t.split("</title>")[0] for t in text.split("<title>")[1:]]
    a.say(f"-- first 2 MB: {text.count('<page>')} pages; titles {titles[:n * 3]}")


# A recorded download is re-hashed up to this size; a larger one (a 20 GB dump part) only has its
# size compared, and the audit says so.
HASH_LIMIT_BYTES = 1 << 30


def check_download(a: Audit) -> dict[str, Any] | None:
    """Show download.py's manifest (`NAME.manifest.json`) and compare the file with it."""
    path = download_manifest_path(a.path)
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    show_manifest(a, manifest)
    stats = manifest.get("stats") or {}
    size = a.path.stat().st_size
    verified = stats.get("verified") or {}
    if verified:
        a.say(f"  verified when fetched: {verified.get('check')} {verified.get('expected')}")
    if "bytes" in stats:
        a.check("size equals the recorded download's", size == stats["bytes"],
                f"{size} vs {stats['bytes']} bytes")
    if "sha256" in stats and size <= HASH_LIMIT_BYTES:
        a.check("sha256 equals the recorded download's",
                artifacts.sha256_file(a.path) == stats["sha256"])
    elif "sha256" in stats:
        a.say(f"  sha256 not recomputed ({size / 1e9:.1f} GB): `sha256sum` it against "
              f"{stats['sha256']}")
    return manifest


def _sniff(path: Path) -> str:
    """A downloaded file's format, from its first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    for magic, kind in ((b"\x1f\x8b", "gzip"), (b"PK\x03\x04", "zip"), (b"BZh", "bzip2")):
        if head.startswith(magic):
            return kind
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not just a character cut at the 4 KiB boundary
            return "binary"
    return "text" if b"\x00" not in head else "binary"


def audit_download(a: Audit, n: int) -> None:
    if a.path.name.endswith(".part"):
        raise NotAnArtifact(
            f"{a.path}: a partial download (the next fetch of "
            f"{a.path.name.removesuffix('.part')} resumes it), not an artifact"
        )
    a.kind = "downloaded file"
    describe_origin(a, "a downloaded file")
    kind = _sniff(a.path)
    a.say(f"-- {a.path.stat().st_size:,} bytes, {kind}")
    if kind == "text":
        with open(a.path, encoding="utf-8", errors="replace") as handle:
            for _, line in zip(range(n), handle):
                a.say(f"  {short(line.rstrip(), 200)}")
    elif kind == "zip":
        import zipfile

        with zipfile.ZipFile(a.path) as archive:
            names = archive.namelist()
        a.say(f"  {len(names)} members: {names[: n * 3]}")
    manifest = check_download(a)
    a.check("download manifest beside it (NAME.manifest.json)", manifest is not None)
    show_snakemake_record(a, a.path)


def audit_png(a: Audit, n: int) -> None:
    with open(a.path, "rb") as handle:
        head = handle.read(24)
    if not head.startswith(b"\x89PNG\r\n\x1a\n") or head[12:16] != b"IHDR":
        raise NotAnArtifact(f"{a.path}: not a PNG image (starts with {head[:8]!r})")
    width, height = struct.unpack(">II", head[16:24])
    a.kind = "figure (PNG)"
    describe_origin(a, "a PNG image")
    a.say(f"-- {width} x {height} pixels, {a.path.stat().st_size:,} bytes")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    from PIL import Image

    try:
        with Image.open(a.path) as image:
            image.verify()  # chunk checksums: a truncated or damaged file fails here
        intact = True, ""
    except Exception as error:  # PIL raises several types for a damaged image
        intact = False, str(error)
    a.check("PNG intact (chunk checksums verify)", *intact)
    a.check("image has pixels", width > 0 and height > 0, f"{width} x {height}")
    source = {
        "loss.png": a.path.with_name("metrics.jsonl"),
        "lengths.png": a.path.parent,
    }.get(a.path.name, a.path.with_suffix(".json"))
    if source.exists() or (results_relative(a.path) or "").startswith("analysis/"):
        a.check(f"the numbers behind it exist ({source.name})", source.exists(), str(source))


def _page_text(a: Audit, label: str) -> str:
    try:
        return a.path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise NotAnArtifact(f"{a.path}: not a UTF-8 {label} ({error})") from error


def audit_html(a: Audit, n: int) -> None:
    text = _page_text(a, "HTML page")
    if "<html" not in text[:4000].lower():
        raise NotAnArtifact(f"{a.path}: no <html> element: not an HTML page")
    a.kind = "report page (HTML)"
    describe_origin(a, "an HTML page")
    title = re.search(r"<title>(.*?)</title>", text, re.S | re.I)
    rows = len(re.findall(r"<tr[ >]", text, re.I))
    a.say(
        f"-- title {_html.unescape(title.group(1).strip()) if title else None!r}, "
        f"{a.path.stat().st_size:,} bytes, {len(re.findall(r'<table', text, re.I))} tables, "
        f"{rows} table rows"
    )
    source = {"tables.html": a.path.parent.parent / "tables.md"}.get(
        a.path.name, a.path.with_suffix(".md")
    )
    if source.is_file():
        a.say(f"  the same as Markdown: {source}")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    body = re.sub(r"(?s)<(script|style|head)\b.*?</\1>", " ", text)
    words = _html.unescape(" ".join(re.sub(r"<[^>]+>", " ", body).split()))
    a.say(f"  text: {short(words, 400)}")
    a.check("complete HTML document (ends with </html>)", text.rstrip().lower().endswith("</html>"))
    a.check("has visible text", bool(words))


# What the provenance block of results/tables.md (tables.provenance) must name, and its line.
PROVENANCE_FIELDS = {
    "config hash": "- config hash",
    "code version": "- code version",
    "date": "- date",
    "hardware": "- tables built on",
}


def audit_markdown(a: Audit, n: int) -> None:
    text = _page_text(a, "Markdown page")
    a.kind = "Markdown page"
    describe_origin(a, "a Markdown page")
    lines = text.splitlines()
    headings = [l.lstrip("#").strip() for l in lines if l.startswith("#")]
    rows = [l for l in lines if l.startswith("|") and not re.fullmatch(r"\|[\s:|-]+\|", l)]
    a.say(f"-- {len(lines)} lines, {a.path.stat().st_size:,} bytes, {len(rows)} table rows")
    a.say(f"  headings: {short(' / '.join(headings), 300)}")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    for line in [l for l in lines if l.strip()][: n * 3]:
        a.say(f"  {short(line, 200)}")
    a.check("not empty", bool(text.strip()))
    if a.path.name == "tables.md":
        provenance = text.split("## Provenance", 1)[1] if "## Provenance" in text else ""
        a.check("has a Provenance section", bool(provenance))
        for label, line in PROVENANCE_FIELDS.items():
            a.check(f"provenance names the {label}", line in provenance)


def audit_folder_member(a: Audit, n: int) -> None:
    """A file inside a Lucene or FAISS folder: what it is, then the folder's own audit."""
    folder = a.path.parent
    inner = Audit(folder)
    (audit_lucene if any(folder.glob("segments_*")) else audit_faiss_folder)(inner, n)
    a.kind = f"file of a {inner.kind}"
    describe_origin(a, "a file of an index folder", required=False)
    a.say(f"-- {a.path.name}: {a.path.stat().st_size:,} bytes; the folder {folder}:")
    a.lines += inner.lines
    a.checks += inner.checks


def not_a_job_record(path: Path, section: str) -> NotAnArtifact:
    """Logs and benchmarks describe a Snakemake job; name the job's outputs to audit instead."""
    what = "log" if section == "logs" else "benchmark"
    rule, outputs = None, []
    found = snakemake_metadata(path)
    if found is not None and section == "logs":
        rel = str(path.resolve().relative_to(found[0]))
        for record in found[1].iterdir():
            try:
                info = json.loads(record.read_text())
                output = base64.urlsafe_b64decode(record.name).decode()
            except (OSError, ValueError):
                continue  # a sub-folder (long paths) or a record being written
            if rel in (info.get("log") or []):
                rule = info.get("rule")
                outputs.append(output)
    if rule is None:
        parts = (results_relative(path) or "").split("/")
        rule = parts[1] if len(parts) > 2 else None
    job = f" of rule {rule}" if rule else ""
    advice = f"; audit its outputs: {', '.join(sorted(outputs))}" if outputs else ""
    return NotAnArtifact(
        f"{path}: a Snakemake job {what}{job}, not an artifact (no manifest, no rule reads it)"
        f"{advice}"
    )


def detect(path: Path) -> Callable[[Audit, int], None]:
    if not path.exists():
        raise NotAnArtifact(f"{path} does not exist")
    if path.name == ".snakemake_timestamp":
        raise NotAnArtifact(
            f"{path}: Snakemake's timestamp marker of the folder output {path.parent}, not an "
            "artifact; audit the folder"
        )
    section = (results_relative(path) or "").split("/")[0]
    if section in ("logs", "benchmarks") and path.is_file():
        raise not_a_job_record(path, section)
    if path.is_dir():
        names = {p.name for p in path.iterdir()}
        if "config.json" in names and any(p.endswith(".safetensors") for p in names):
            return audit_model
        if any(p.startswith("segments_") for p in names):
            return audit_lucene
        if {"index", "docid"} <= names:
            return audit_faiss_folder
        raise NotAnArtifact(
            f"{path} is a folder but not a model (config.json + safetensors), a "
            "Lucene index (segments_*) nor a FAISS folder (index + docid)"
        )
    name = path.name
    if (section == "downloads" and not name.endswith(".manifest.json")) or (
        download_manifest_path(path).is_file() and not name.endswith(".bz2")
    ):
        return audit_download
    for suffix, auditor in (
        (".parquet", audit_parquet),
        (".trec", audit_run),
        (".jsonl", audit_jsonl),
        (".json", audit_json),
        (".npy", audit_npy),
        (".faiss", audit_faiss),
        (".bz2", audit_dump),
        (".safetensors", audit_safetensors),
        (".png", audit_png),
        (".html", audit_html),
        (".md", audit_markdown),
    ):
        if name.endswith(suffix):
            return auditor
    if name == "index" and (path.parent / "docid").exists():
        return audit_faiss
    if any(path.parent.glob("segments_*")) or (
        name == "docid" and (path.parent / "index").is_file()
    ):
        return audit_folder_member
    raise NotAnArtifact(
        f"{path}: no artifact of this workflow has this kind of name (Parquet, .trec, .json, "
        ".jsonl, .npy, .faiss, .bz2, .safetensors, .png, .html, .md, a download, a file of an "
        "index folder, or a model / index folder)"
    )


def audit(path: str | Path, rows: int = 3) -> Audit:
    path = Path(path)
    result = Audit(path)
    detect(path)(result, rows)
    return result


def _scalars(stats: dict[str, Any], prefix: str = "") -> list[str]:
    """Flatten a manifest's stats to 'key=value' for scalars (histograms and lists are skipped)."""
    out = []
    for key, value in stats.items():
        if isinstance(value, dict):
            out += _scalars(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float, str, bool)) and len(str(value)) < 60:
            out.append(
                f"{prefix}{key}={value:.4g}"
                if isinstance(value, float)
                else f"{prefix}{key}={value}"
            )
    return out


def metrics_as_manifest(path: Path) -> dict[str, Any] | None:
    """A metrics JSON carries its own statistics (no manifest beside it): the scores and counts."""
    if not (path.is_file() and path.suffix == ".json"):
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not (isinstance(data, dict) and {"aggregate", "per_query"} <= set(data)):
        return None
    created = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc)
    return {
        "stage": "score_run",
        "created": created.isoformat(timespec="seconds"),
        "stats": data["aggregate"]
        | {k: data[k] for k in ("queries", "queries_missing_from_run") if k in data},
    }


def stage_statistics(paths: list[Path]) -> str:
    """Markdown: one row per artifact, grouped by the stage its manifest names, with its statistics."""
    rows = []
    for path in paths:
        manifest = (
            read_manifest(path)
            if not (path.is_file() and path.name.endswith("manifest.json"))
            else json.loads(path.read_text())
        ) or metrics_as_manifest(path)
        if manifest is None:
            rows.append(("(no manifest)", str(path), "–", "–"))
            continue
        stats = _scalars(manifest.get("stats") or {})
        rows.append(
            (
                manifest.get("stage", "?"),
                str(path),
                manifest.get("created", "?"),
                ", ".join(stats[:12]) + (" …" if len(stats) > 12 else ""),
            )
        )
    lines = [
        "# Per-stage statistics (from the artifacts' manifests)",
        "",
        "| stage | artifact | created | statistics |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {stage} | `{path}` | {created} | {stats} |"
        for stage, path, created, stats in sorted(rows)
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="artifacts to audit")
    parser.add_argument("--rows", type=int, default=3, help="rows to render as text")
    parser.add_argument(
        "--stage-stats",
        type=Path,
        default=None,
        help="instead of auditing, write the manifests' statistics of PATHS as HTML here",
    )
    args = parser.parse_args(argv)
    if args.stage_stats is not None:
        from .markdown_html import markdown_to_html

        with artifacts.atomic_path(args.stage_stats) as tmp:
            tmp.write_text(markdown_to_html(stage_statistics(args.paths), "Per-stage statistics"))
        return 0
    status = 0
    for path in args.paths:
        try:
            result = audit(path, args.rows)
        except NotAnArtifact as error:
            print(f"audit: {error}", file=sys.stderr)
            status = max(status, 2)
            continue
        print(result.render())
        if not result.passed:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
