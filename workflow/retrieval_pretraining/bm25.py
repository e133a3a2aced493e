"""BM25 with Pyserini/Anserini: Lucene index, batch search to TREC runs, BM25 negatives.

    python -m retrieval_pretraining.bm25 index --corpus corpus.parquet --out index/ --config JSON
    python -m retrieval_pretraining.bm25 search --index index/ --queries queries-test.parquet \
        --out runs/test.trec --config JSON [--exclude-query-id]
    python -m retrieval_pretraining.bm25 negatives --index index/ --queries queries-train.parquet \
        --qrels qrels-train.parquet --out negatives.parquet --config JSON [--exclude-query-id]
        (source triples: --triples F for --index; source dpr: --biencoder F [--biencoder-member M])

Index: Anserini's IndexCollection over a JsonCollection (`{"id", "contents"}`), with positions,
document vectors and raw documents stored (so the index serves `LuceneIndexReader` and RM3 too).
`contents` is `datasets.join_title(title, text, bm25.title)`; Anserini's BEIR regressions use
title + " " + text, the setting that reproduces their SciFact nDCG@10 of 0.6789.

Search: Anserini's `SimpleSearcher.batch_search` (the Java object behind pyserini's
`LuceneSearcher.batch_search`: Lucene searches in `threads` Java threads), k1/b from config.
`--exclude-query-id` drops a hit whose doc id equals the query id (Anserini's `-removeQuery`,
used for BEIR, where some datasets reuse ids); we search one hit deeper so the run still has
`depth` hits per query.

Negatives: per query, the top-`depth` hits minus ALL of that query's own positives
(relevance >= 1 in the split's qrels), then `count` sampled uniformly without replacement by a
generator seeded from (seed, query id), so the sample is independent of thread count, batch order
or which other queries exist. A query's hits are sampled as the search yields them, then dropped
(memory O(queries x count), not O(queries x depth); `negative_filter: answers` holds them for its
one pass over the corpus). Alternative source `triples`: the negatives listed for the query in
MS MARCO's official `qidpidtriples` file (what the COSTA authors used), same removal, the file
streamed (memory O(queries x count), not O(lines): 400M lines at MS MARCO scale): the `count`
listed negatives of smallest hash key of (seed, query id, pid), a uniform sample without
replacement like the bm25 source's, independent of the file's order (`triples_candidates`).
Alternative source `dpr` (NQ, TriviaQA): the negatives DPR's biencoder-*.json lists for the
question (`dpr_lists`, default `hard_negative_ctxs`: DPR's BM25 negatives, what the Bag-of-Word
authors' and Tevatron's NQ/TQA recipes train on), read from the file the split was built from
(streamed by dpr_files; ids are the file's passage ids and list positions, as the split's), their
rank the 1-based position in the lists, then the bm25 source's removal and sampling.
`negative_filter: answers` (NQ, TriviaQA) also removes every candidate containing an answer (answers.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from . import artifacts, datasets
from .answers import answer_exclusions
from .dpr_files import NEGATIVE_LISTS, read_biencoder_negatives
from .msmarco_triples import TRIPLES_SAMPLING, triples_sample
from .config import ConfigError, closed, refuse_unknown, section_schema, stage_parser
from .contracts.negatives import SCHEMA as NEGATIVES_SCHEMA
from .contracts.datasets.checks import check_unique
from .errors import command, reading

log = logging.getLogger(__name__)

DEFAULTS = {
    "k1": 0.9,
    "b": 0.4,
    "title": "space",
    "threads": 2,
    "index_threads": 2,
    "depth": 1000,
    "batch_size": 10000,
}
NEGATIVE_DEFAULTS = {"source": "bm25", "depth": 200, "count": 30, "seed": 42,
                     "negative_filter": "qrels", "answer_match": "string",
                     "dpr_lists": ["hard_negative_ctxs"]}
SOURCES = ("bm25", "triples", "dpr")
# Speed and memory: the rules pass them with --runtime, outside their params (no rerun trigger);
# rules/retrieval.smk imports this list (its one home).
RUNTIME_KEYS = ("threads", "index_threads", "batch_size", "java_heap")
RUN_TAG = "bm25"
# Hits one batch_search call may return. Anserini's ScoredDoc holds each hit's Lucene document,
# stored raw JSON included, so a call's heap grows with hits x document length, not with queries:
# 10,000 queries x 1,000 hits of MS MARCO documents (~7 KB) is ~70 GB. Past the heap the JVM's
# search threads die and batch_search waits forever (a job hung to its time limit, no error).
HITS_PER_CALL = 100_000
COLLECTION_BATCH_ROWS = 10_000  # corpus rows per read while writing the JsonCollection
NEGATIVE_ROWS_BATCH = 10_000  # negatives rows built as Python lists before they become Arrow


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """The slice the BM25 rules pass (the section without `overrides`; `negatives`: one entry's
    policy and the seed), with defaults; an unknown key is refused."""
    section = section_schema("bm25")["properties"]
    policy = (set(section["negatives"]["items"]["properties"]) - {"dataset", "triples"}
              | {"seed", "negative_filter", "answer_match"})
    keys = set(section) - {"overrides", "negatives"}
    refuse_unknown(config, closed(keys, negatives=closed(policy)), "bm25")
    return DEFAULTS | {k: v for k, v in config.items() if v is not None}


def derive_rng(seed: int, item: str) -> np.random.Generator:
    """A generator that depends only on (seed, item): never on time, order or worker."""
    digest = hashlib.sha256(f"{seed}\x1f{item}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def anserini_jar() -> Path:
    """The Anserini fat jar bundled inside the installed Pyserini."""
    import importlib.resources

    jars = sorted(
        Path(str(importlib.resources.files("pyserini.resources.jars"))).glob(
            "anserini-*-fatjar.jar"
        )
    )
    if not jars:
        raise FileNotFoundError(
            "no anserini-*-fatjar.jar in pyserini/resources/jars; reinstall pyserini"
        )
    return jars[-1]


def java_command(main_class: str, *args: str, heap: str | None = None) -> list[str]:
    """`java -cp <anserini jar> <class> args` with the Java >= 21 chosen by pyserini_setup."""
    from . import pyserini_setup

    java = pyserini_setup.java_home() / "bin" / "java"
    heap_args = [f"-Xmx{heap}"] if heap else []
    return [str(java), *heap_args, "-cp", str(anserini_jar()), main_class, *args]


# --- index ------------------------------------------------------------------------------------


def write_json_collection(corpus: Path, folder: Path, title: str, files: int) -> dict[str, int]:
    """Anserini JsonCollection input: `files` JSON-lines files (one per indexing thread), each a
    contiguous slice of the corpus, written from a batched scan (the corpus is never in memory)."""
    folder.mkdir(parents=True, exist_ok=True)
    with reading(corpus, "a corpus Parquet file"):
        source = pq.ParquetFile(corpus)
        # Anserini adds a repeated id as another document: runs would list it twice for a query,
        # and negatives hold it twice. datasets.py refuses repeats; a corpus made by hand is not.
        check_unique(pl.read_parquet(corpus, columns=["doc_id"]), "doc_id", f"{corpus}")
    total = source.metadata.num_rows
    bounds = np.linspace(0, total, files + 1).astype(int)
    written = empty = part = 0
    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(open(folder / f"docs-{i:03d}.jsonl", "w", encoding="utf-8"))
            for i in range(files)
        ]
        for batch in source.iter_batches(
            batch_size=COLLECTION_BATCH_ROWS, columns=["doc_id", "title", "text"]
        ):
            frame = pl.from_arrow(batch).select("doc_id", datasets.joined_text_expr(title))
            empty += frame.filter(pl.col("text").str.strip_chars(JAVA_TRIM) == "").height
            for doc_id, text in frame.iter_rows():
                while written >= bounds[part + 1]:
                    part += 1
                handles[part].write(
                    json.dumps({"id": doc_id, "contents": text}, ensure_ascii=False) + "\n"
                )
                written += 1
    return {"documents": total, "empty_documents": empty}


# What Anserini's `contents.trim().isEmpty()` strips: Java's String.trim removes the code points
# up to U+0020 (controls included) and nothing else, so a document of only a no-break space is
# indexed and one of only \x01 is skipped; Unicode whitespace would count both the other way and
# fail the check below after hours of indexing.
JAVA_TRIM = "".join(map(chr, range(0x21)))


def build_index(corpus: Path, out: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Index `corpus` (canonical corpus.parquet) into the Lucene folder `out`, atomically."""
    cfg = _settings(config)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A killed build's collection and index (tens of GB) are removed first.
    with artifacts.temp_dir(out) as tmp:
        counts = write_json_collection(
            corpus, tmp / "collection", cfg["title"], cfg["index_threads"]
        )
        command = java_command(
            "io.anserini.index.IndexCollection", "-collection", "JsonCollection",
            "-generator", "DefaultLuceneDocumentGenerator", "-input", str(tmp / "collection"),
            "-index", str(tmp / "index"), "-threads", str(cfg["index_threads"]),
            "-storePositions", "-storeDocvectors", "-storeRaw", heap=cfg.get("java_heap"),
        )
        log.info("indexing %d documents: %s", counts["documents"], " ".join(command))
        start = time.perf_counter()
        subprocess.run(command, check=True)
        seconds = time.perf_counter() - start
        indexed = index_size(tmp / "index")
        # Anserini skips documents whose contents are empty; anything else missing is a failure.
        if indexed != counts["documents"] - counts["empty_documents"]:
            raise RuntimeError(
                f"Lucene index holds {indexed} documents, expected {counts['documents']} minus "
                f"{counts['empty_documents']} empty ones; see the IndexCollection log above"
            )
        stats = counts | {"indexed": indexed, "index_seconds": round(seconds, 1)}
        # The manifest goes in before the rename: a disk that fills while it is written must not
        # leave a complete-looking index under the final name.
        artifacts.write_manifest(
            tmp / "index" / "manifest.json",
            stage="bm25.index",
            params={k: cfg[k] for k in ("title", "index_threads")}
            | {"collection": "JsonCollection", "stored": ["positions", "docvectors", "raw"]},
            inputs={"corpus": corpus},
            stats=stats,
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp / "index", out)
    return stats


def _autoclass(name: str):
    """A Java class of the Anserini jar. pyserini.pyclass only starts the JVM on the jar: it avoids
    `pyserini.search.lucene`, whose import pulls in torch, transformers and faiss (~10 s of CPU)."""
    from . import pyserini_setup  # noqa: F401  (Java fixes before pyserini starts the JVM)
    from pyserini.pyclass import autoclass

    return autoclass(name)


def index_size(index: Path) -> int:
    """Documents in a Lucene index (read with Lucene itself)."""
    directory = _autoclass("org.apache.lucene.store.FSDirectory").open(
        _autoclass("java.nio.file.Paths").get(str(index))
    )
    reader = _autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
    try:
        return int(reader.numDocs())
    finally:
        reader.close()


# --- search -----------------------------------------------------------------------------------


def searcher(index: Path, k1: float, b: float):
    """Anserini's SimpleSearcher (what pyserini's LuceneSearcher wraps) with BM25(k1, b).

    A query is one clause per distinct analysed term; Lucene refuses more than 1,024 clauses by
    default (a process-wide limit), and batch_search then fails the whole job with no query named
    ("queryCount = n is not equal to completedTaskCount = n - 1"). A passage or an argument as the
    query (ArguAna-like data) can hold more terms, so the limit is lifted: no shorter query's
    score changes."""
    _autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(2**31 - 1)
    search = _autoclass("io.anserini.search.SimpleSearcher")(str(index))
    search.set_bm25(float(k1), float(b))
    return search


def batch_search(
    search,
    queries: pl.DataFrame,
    depth: int,
    threads: int,
    exclude_query_id: bool,
    batch_size: int = 10000,
) -> Iterable[tuple[str, list[tuple[str, float]]]]:
    """Yield (query id, [(doc id, score), ...]) in the order of `queries`, `depth` hits each.

    A call searches at most `batch_size` queries and HITS_PER_CALL hits (never fewer queries than
    `threads`): each query is searched alone, so the split changes no result, only the heap."""
    k = depth + 1 if exclude_query_id else depth
    step = max(1, min(batch_size, max(threads, HITS_PER_CALL // k)))
    ids, texts = queries["query_id"].to_list(), queries["text"].to_list()
    with tqdm(total=len(ids), desc="bm25 search", unit="q", mininterval=5) as bar:
        for start in range(0, len(ids), step):
            qids, qtexts = ids[start : start + step], texts[start : start + step]
            results = _batch(search, qtexts, qids, k, threads)
            for qid in qids:
                hits = results.get(qid, [])
                if exclude_query_id:
                    hits = [h for h in hits if h[0] != qid]
                yield qid, hits[:depth]
            bar.update(len(qids))


def _batch(
    search, texts: list[str], qids: list[str], k: int, threads: int
) -> dict[str, list[tuple[str, float]]]:
    """SimpleSearcher.batch_search (Lucene searches in `threads` Java threads), as Python lists."""
    jlist = _autoclass("java.util.ArrayList")
    jtexts, jqids = jlist(), jlist()
    for text, qid in zip(texts, qids):
        jtexts.add(text)
        jqids.add(qid)
    results = search.batch_search(jtexts, jqids, int(k), int(threads))
    return {
        entry.getKey(): [(hit.docid, hit.score) for hit in entry.getValue()]
        for entry in results.entrySet().toArray()
    }


def write_run(
    path: Path, ranked: Iterable[tuple[str, list[tuple[str, float]]]], tag: str = RUN_TAG
) -> dict[str, int]:
    """TREC run lines `qid Q0 docid rank score tag` (scores as Anserini prints them, %.6f)."""
    queries = lines = empty = 0
    with artifacts.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for qid, hits in ranked:
            queries += 1
            empty += not hits
            for rank, (docid, score) in enumerate(hits, 1):
                handle.write(f"{qid} Q0 {docid} {rank} {score:.6f} {tag}\n")
            lines += len(hits)
    return {"queries": queries, "lines": lines, "queries_without_hits": empty}


def run_label(k1: float, b: float) -> str:
    """The label a run's manifest records: the k1/b THIS run used (per-dataset overrides
    included). A table's row label adds what the index holds (tables/build.py bm25_parts)."""
    return f"BM25 (k1={k1:g}, b={b:g})"


def search_run(
    index: Path, queries_path: Path, out: Path, config: dict[str, Any], exclude_query_id: bool
) -> dict[str, Any]:
    """Write a TREC run and its manifest (params: k1, b, label, depth, title, exclude_query_id)."""
    cfg = _settings(config)
    with reading(queries_path, "a queries Parquet file"):
        queries = pl.read_parquet(queries_path)
    search = searcher(index, cfg["k1"], cfg["b"])
    start = time.perf_counter()
    ranked = batch_search(
        search, queries, cfg["depth"], cfg["threads"], exclude_query_id, cfg["batch_size"]
    )
    stats = write_run(out, ranked)
    stats["search_seconds"] = round(time.perf_counter() - start, 2)
    artifacts.write_manifest(
        artifacts.manifest_path(out),
        stage="bm25.search",
        params={k: cfg[k] for k in ("k1", "b", "depth", "threads", "title")}
        | {"exclude_query_id": exclude_query_id, "label": run_label(cfg["k1"], cfg["b"])},
        inputs={"queries": queries_path, "index_manifest": Path(index) / "manifest.json"},
        stats=stats,
    )
    log.info("wrote %s: %s", out, stats)
    return stats


# --- negatives --------------------------------------------------------------------------------


def sample_negatives(
    query_id: str,
    candidates: list[tuple[str, int]],
    positives: set[str],
    count: int,
    seed: int,
) -> tuple[list[str], list[int]]:
    """`count` of the candidates (doc id, rank) that are not positives, uniform, from (seed, qid).

    The kept negatives are returned in rank order (sampling picks which, not how they are shown).
    """
    pool = [(doc, rank) for doc, rank in candidates if doc not in positives]
    if len(pool) > count:
        picked = np.sort(derive_rng(seed, query_id).choice(len(pool), size=count, replace=False))
        pool = [pool[i] for i in picked]
    return [d for d, _ in pool], [r for _, r in pool]


def dpr_candidates(biencoder: Path, member: str | None, lists: list[str],
                   queries: pl.DataFrame) -> dict[str, list[tuple[str, int]]]:
    """Each query's (passage id, rank) in DPR's `lists`, rank = 1-based position in the lists
    joined (a passage listed twice kept at its first), read from the biencoder file in one pass;
    only the queries' lists are held. Each question must be the query of the same id: ids are
    list positions, so a file other than the split's would pair questions with others' lists."""
    if not lists or any(name not in NEGATIVE_LISTS for name in lists):
        raise ConfigError(f"negatives dpr_lists {lists!r}: choose among "
                          f"{', '.join(NEGATIVE_LISTS)}")
    texts = dict(zip(queries["query_id"].to_list(), queries["text"].to_list()))
    table: dict[str, list[tuple[str, int]]] = {}
    for qid, question, ids in read_biencoder_negatives(biencoder, member, lists):
        if qid not in texts:
            continue
        # read_biencoder refused a non-string question when the split was built: a null one here
        # is another file's, compared as "" (refused below unless the split's query is empty);
        # read_biencoder_negatives refuses any other non-string, naming the file and question.
        question = question or ""
        if question != texts[qid]:
            raise ConfigError(
                f"{biencoder}: question {qid} is {question[:60]!r}, but the split's query {qid} "
                f"is {texts[qid][:60]!r}; pass the biencoder file the split was built from")
        first: dict[str, int] = {}
        for rank, doc in enumerate(ids, 1):
            first.setdefault(doc, rank)
        table[qid] = list(first.items())
    missing = texts.keys() - table.keys()
    if missing:
        raise ConfigError(f"{biencoder}: {len(missing)} of the split's queries (e.g. "
                          f"{sorted(missing)[0]}) are not in it; pass the file the split was "
                          "built from")
    return table


def _negative_rows(
    candidates: Iterable[tuple[str, list[tuple[str, int]]]],
    positives: dict[str, set[str]],
    answered: dict[str, set[str]],
    count: int,
    seed: int,
) -> tuple[pa.Table, dict[str, int]]:
    """Each query's row (query_id, positive_ids, negative_ids, negative_ranks), in the order of
    `candidates`, and the counts the manifest reports, taking one query's list at a time: a list
    is dropped once sampled, and rows become Arrow every NEGATIVE_ROWS_BATCH queries. Memory is
    O(queries x count), not O(queries x depth): MS MARCO's 367k document queries x 200 BM25 hits
    held as Python tuples were ~10 GB."""
    batches, rows = [], {name: [] for name in NEGATIVES_SCHEMA.names}
    counts = dict.fromkeys(("short", "positives_removed", "sampled", "longest", "negatives"), 0)
    for qid, cands in candidates:
        pos = positives[qid]
        counts["positives_removed"] += sum(d in pos for d, _ in cands)
        removed = pos | answered.get(qid, set())
        negs, ranks = sample_negatives(qid, cands, removed, count, seed)
        counts["short"] += len(negs) < count
        counts["sampled"] += sum(d not in removed for d, _ in cands) > count
        counts["longest"] = max(counts["longest"], len(cands))
        counts["negatives"] += len(negs)
        rows["query_id"].append(qid)
        rows["positive_ids"].append(sorted(pos))
        rows["negative_ids"].append(negs)
        rows["negative_ranks"].append(ranks)
        if len(rows["query_id"]) == NEGATIVE_ROWS_BATCH:
            batches.append(pa.table(rows, schema=NEGATIVES_SCHEMA))
            rows = {name: [] for name in NEGATIVES_SCHEMA.names}
    batches.append(pa.table(rows, schema=NEGATIVES_SCHEMA))
    # One chunk a column, as a table built at once: chunk ends would move where the writer cuts
    # dictionary and data pages (the same rows, other bytes than before batching).
    return pa.concat_tables(batches).combine_chunks(), counts


def mine_negatives(
    queries_path: Path,
    qrels_path: Path,
    out: Path,
    config: dict[str, Any],
    index: Path | None = None,
    triples: Path | None = None,
    exclude_query_id: bool = False,
    answers: Path | None = None, corpus: Path | None = None,
    biencoder: Path | None = None, biencoder_member: str | None = None,
) -> dict[str, Any]:
    """Write the negatives Parquet (query_id, positive_ids, negative_ids, negative_ranks) + manifest."""
    cfg = _settings(config)
    neg = NEGATIVE_DEFAULTS | {
        k: v for k, v in config.get("negatives", {}).items() if v is not None
    }
    with reading(queries_path, "a queries Parquet file"):
        queries = pl.read_parquet(queries_path)
    with reading(qrels_path, "a qrels Parquet file"):
        positives = datasets.read_qrels(qrels_path, min_relevance=1)
    without_positive = queries.filter(~pl.col("query_id").is_in(list(positives))).height
    queries = queries.filter(pl.col("query_id").is_in(list(positives)))
    if neg["source"] == "bm25":
        if index is None:
            raise ConfigError("negatives source 'bm25' needs --index")
        search = searcher(index, cfg["k1"], cfg["b"])
        ranked = batch_search(
            search, queries, neg["depth"], cfg["threads"], exclude_query_id, cfg["batch_size"]
        )
        candidates = ((q, [(d, r) for r, (d, _) in enumerate(hits, 1)]) for q, hits in ranked)
    elif neg["source"] == "triples":
        if triples is None:
            raise ConfigError("negatives source 'triples' needs --triples (MS MARCO qidpidtriples)")
        wanted = {q: positives[q] for q in queries["query_id"].to_list()}
        table, answered, listed_positives = triples_sample(
            Path(triples), wanted, neg["count"], neg["seed"], neg["negative_filter"], answers,
            corpus, neg["answer_match"])
        candidates = ((q, table.get(q, [])) for q in queries["query_id"].to_list())
    elif neg["source"] == "dpr":
        if biencoder is None:
            raise ConfigError("negatives source 'dpr' needs --biencoder: the DPR training JSON the "
                              "split was built from (a format dpr dataset's `biencoder` split)")
        table = dpr_candidates(Path(biencoder), biencoder_member, neg["dpr_lists"], queries)
        candidates = ((q, table[q]) for q in queries["query_id"].to_list())
    else:
        raise ConfigError(f"negatives source {neg['source']!r} unknown; use {', '.join(SOURCES)}")
    if neg["negative_filter"] == "answers" and neg["source"] != "triples":
        # One corpus scan matches every query's candidates, so they are held for it; a scan per
        # batch of queries would re-read a 21M-passage corpus once a batch. (Triples filters
        # answers while it streams.)
        candidates = list(candidates)
        answered = answer_exclusions({q: [d for d, _ in c] for q, c in candidates},
                                     neg["negative_filter"], answers, corpus, neg["answer_match"])
    elif neg["source"] != "triples":  # qrels: nothing to match; an unknown filter is refused
        answered = answer_exclusions({}, neg["negative_filter"], answers, corpus,
                                     neg["answer_match"])
    table, counts = _negative_rows(candidates, positives, answered, neg["count"], neg["seed"])
    positives_removed = counts["positives_removed"]
    if neg["source"] == "triples":  # removed while streaming: the sample holds none
        positives_removed = listed_positives
    artifacts.write_parquet(out, table, NEGATIVES_SCHEMA)
    stats = {
        "queries": table.num_rows,
        "queries_without_positive_skipped": without_positive,
        "queries_with_fewer_negatives": counts["short"],
        "candidate_positives_removed": positives_removed,
        "answer_passages_removed": sum(len(v - positives[q]) for q, v in answered.items()),
        "negatives": counts["negatives"],
        # Whether `count` cut any list (0 sampled: every candidate kept). Triples streams a sample
        # of `count` and never holds a whole list, so neither is known there.
        "queries_sampled": None if neg["source"] == "triples" else counts["sampled"],
        "longest_candidate_list": None if neg["source"] == "triples" else counts["longest"],
    }
    policy = {
        "source": neg["source"],
        "depth": neg["depth"] if neg["source"] == "bm25" else None,
        "count": neg["count"],
        "seed": neg["seed"],
        "removed": "every positive (relevance >= 1) of the query itself",
        "sampling": TRIPLES_SAMPLING if neg["source"] == "triples" else
        "uniform without replacement, numpy default_rng(sha256(seed, query_id)); kept in rank order",
        "exclude_query_id": exclude_query_id,
        "negative_filter": neg["negative_filter"],
    }
    if neg["negative_filter"] == "answers":
        policy["answer_match"] = neg["answer_match"]
    if neg["source"] == "bm25":
        policy |= {"k1": cfg["k1"], "b": cfg["b"], "title": cfg["title"]}
    if neg["source"] == "dpr":
        policy["dpr_lists"] = list(neg["dpr_lists"])
    inputs = {"queries": queries_path, "qrels": qrels_path}
    if index is not None and neg["source"] == "bm25":
        inputs["index_manifest"] = Path(index) / "manifest.json"
    if neg["source"] == "dpr":
        inputs["biencoder"] = biencoder
    artifacts.write_manifest(
        artifacts.manifest_path(out),
        stage="bm25.negatives",
        params=policy,
        inputs=inputs,
        stats=stats,
    )
    log.info("wrote %s: %s", out, stats)
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("BM25 with Pyserini: index, search, negatives.")
    parser.add_argument("command", choices=["index", "search", "negatives"])
    parser.add_argument("--corpus", type=Path, help="corpus.parquet (index; negative_filter answers)")
    parser.add_argument("--index", type=Path, help="Lucene index folder (search, negatives)")
    parser.add_argument("--queries", type=Path, help="queries-{split}.parquet")
    parser.add_argument("--qrels", type=Path, help="qrels-{split}.parquet (negatives)")
    parser.add_argument("--triples", type=Path, help="MS MARCO qidpidtriples .tsv.gz (source=triples)")
    parser.add_argument("--answers", type=Path, help="answers-{split}.parquet (negative_filter answers)")
    parser.add_argument("--biencoder", type=Path,
                        help="DPR biencoder-*.json[.gz] the split was built from (source=dpr)")
    parser.add_argument("--biencoder-member", help="its member in a tar archive, if it is one")
    parser.add_argument("--exclude-query-id", action="store_true",
                        help="drop a hit whose doc id equals the query id (Anserini's -removeQuery)")
    parser.add_argument("--runtime", type=json.loads, default={},
                        help=f"speed and memory settings ({', '.join(RUNTIME_KEYS)}) as JSON, "
                             "merged into --config (the rules keep them out of their params)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    refuse_unknown(args.runtime, RUNTIME_KEYS, "bm25 --runtime")
    args.config = args.config | args.runtime
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    needed = {
        "index": ["corpus"],
        "search": ["index", "queries"],
        "negatives": ["queries", "qrels"],
    }
    missing = [f"--{n}" for n in needed[args.command] if getattr(args, n) is None]
    if missing:
        parser.error(f"{args.command} needs {' '.join(missing)}")
    if args.command == "index":
        build_index(args.corpus, args.out, args.config)
    elif args.command == "search":
        search_run(args.index, args.queries, args.out, args.config, args.exclude_query_id)
    else:
        mine_negatives(
            args.queries,
            args.qrels,
            args.out,
            args.config,
            index=args.index,
            triples=args.triples,
            exclude_query_id=args.exclude_query_id,
            answers=args.answers, corpus=args.corpus,
            biencoder=args.biencoder, biencoder_member=args.biencoder_member,
        )


if __name__ == "__main__":
    main()
