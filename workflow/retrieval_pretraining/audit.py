"""Print a readable summary of any artifact the workflow writes: `python -m retrieval_pretraining.audit PATH`.

For every artifact: what it is, its manifest (stage, parameters, inputs and whether they still have
the recorded checksums), which Snakemake rule produced it (from .snakemake/metadata when present),
its schema and size, a few rows rendered as text (token ids decoded with the checkpoint tokenizer
named by the manifests, spans shown inside their chunk, negatives shown with their query), and the
contract checks it passed. Exit status: 0 all checks passed, 1 a check failed, 2 not an artifact.

Each artifact kind has one small renderer; `detect` picks it from the path and its contents.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import bz2
import json
import math
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


def read_manifest(path: Path) -> dict[str, Any] | None:
    candidate = artifacts.manifest_path(path)
    if candidate.is_file() and candidate.resolve() != path.resolve():
        return json.loads(candidate.read_text())
    return None


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


def show_snakemake_record(a: Audit, path: Path) -> None:
    """Which rule, inputs and command produced it, from Snakemake's per-output metadata record."""
    for workdir in path.resolve().parents:
        meta = workdir / ".snakemake" / "metadata"
        if meta.is_dir():
            rel = str(path.resolve().relative_to(workdir))
            record = meta / base64.urlsafe_b64encode(rel.encode()).decode()
            a.say("-- produced by")
            if not record.is_file():
                a.say(f"  no Snakemake record for {rel} (built outside Snakemake, or long path)")
                return
            info = json.loads(record.read_text())
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
            return


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
    elif a.path.name == "training.json" or a.path.name == "config.json":
        a.kind = a.path.name
        a.say(short(json.dumps(data, sort_keys=True, indent=1), 3000))
    else:
        raise NotAnArtifact(
            f"{a.path}: JSON, but neither metrics, a manifest, training.json nor a "
            "dumpstatus file"
        )


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


def safetensors_header(path: Path) -> dict[str, Any]:
    """Tensor names, dtypes and shapes from the safetensors header (no weights loaded)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        return json.loads(handle.read(size))


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
        header = {k: v for k, v in safetensors_header(w).items() if k != "__metadata__"}
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
    head = a.path.read_bytes()[:3]
    if head != b"BZh":
        raise NotAnArtifact(f"{a.path}: not bzip2 (starts with {head!r})")
    with bz2.open(a.path, "rt", encoding="utf-8", errors="replace") as handle:
        text = handle.read(2_000_000)
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


def detect(path: Path) -> Callable[[Audit, int], None]:
    if not path.exists():
        raise NotAnArtifact(f"{path} does not exist")
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
    for suffix, auditor in (
        (".parquet", audit_parquet),
        (".trec", audit_run),
        (".jsonl", audit_jsonl),
        (".json", audit_json),
        (".npy", audit_npy),
        (".faiss", audit_faiss),
        (".bz2", audit_dump),
    ):
        if name.endswith(suffix):
            return auditor
    if name == "index" and (path.parent / "docid").exists():
        return audit_faiss
    raise NotAnArtifact(
        f"{path}: no artifact of this workflow has this kind of name (Parquet, .trec, "
        ".json, .jsonl, .npy, .faiss, .bz2, or a model / index folder)"
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


def stage_statistics(paths: list[Path]) -> str:
    """Markdown: one row per artifact, grouped by the stage its manifest names, with its statistics."""
    rows = []
    for path in paths:
        manifest = (
            read_manifest(path)
            if not (path.is_file() and path.name.endswith("manifest.json"))
            else json.loads(path.read_text())
        )
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
        from .tables import markdown_to_html

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
