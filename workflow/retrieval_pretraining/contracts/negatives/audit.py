"""How `audit` shows and checks negatives: no positive among a query's negatives (unless mined with
`positives_removed: first_query`, which the manifest records), a positive for every query, no
negative twice, no query with fewer negatives than a mined set's min_negatives but some, one rank
(and score) per negative, ranks as the writers leave them (increasing search ranks from 1; -1
throughout from the unranked `triples` source), every negative a document of the corpus (where
the manifest names the dataset), and a few queries shown with their positive and negatives as
text.
The checks read the rows a batch at a time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..base import RANK_PARQUET, Audit, check_unique, input_path, parquet_kind, short
from ..datasets.audit import dataset_folder, lookup_text
from . import MINED_SCHEMA, SCHEMA

ROWS_PER_BATCH = 1 << 16  # rows checked at a time: the lists of ids, flattened, stay bounded


def _keys(column: pa.Array, codes: np.ndarray, width: int) -> np.ndarray:
    """One integer per id of a list column: its row and its code (< width) together."""
    return pc.list_parent_indices(column).to_numpy() * width + codes


def _codes(*columns: pa.Array) -> tuple[list[np.ndarray], int]:
    """The ids of list columns as integer codes shared by all of them (sorting integers is much
    faster than hashing (row, string) pairs), and how many distinct ids there are."""
    flat = [pc.fill_null(pc.list_flatten(c), "") for c in columns]
    encoded = pa.concat_arrays(flat).dictionary_encode()
    codes = encoded.indices.to_numpy().astype(np.int64)
    cuts = np.cumsum([len(f) for f in flat])[:-1]
    return np.split(codes, cuts), max(len(encoded.dictionary), 1)


def rows_repeating(column: pa.Array) -> np.ndarray:
    """The rows of a list column that hold an id twice."""
    (codes,), width = _codes(column)
    keys = np.sort(_keys(column, codes, width))
    return np.unique(keys[1:][keys[1:] == keys[:-1]] // width)


def rows_sharing(a: pa.Array, b: pa.Array) -> np.ndarray:
    """The rows where list columns `a` and `b` share an id."""
    (codes_a, codes_b), width = _codes(a, b)
    keys_b = _keys(b, codes_b, width)
    return np.unique(keys_b[np.isin(keys_b, _keys(a, codes_a, width))] // width)


def rows_outside(column: pa.Array, ids: pa.Array) -> np.ndarray:
    """The rows of a list column holding an id that `ids` lacks. The batch's distinct ids are
    looked up, not every id, and `ids` (the corpus's) is hashed once per batch."""
    flat = pc.list_flatten(column)
    distinct = pc.unique(flat)
    missing = distinct.filter(pc.invert(pc.is_in(distinct, value_set=ids)))
    if not len(missing):
        return np.zeros(0, np.int64)
    where = pc.is_in(flat, value_set=missing).to_numpy(zero_copy_only=False)
    return np.unique(pc.list_parent_indices(column).to_numpy()[where])


def rows_misranked(ranks: pa.Array, unranked: bool) -> np.ndarray:
    """The rows of a list column of ranks unlike what the writers leave: each sampler keeps its
    negatives in rank order (bm25.sample_negatives, mine.mine_batch through mine.kept_places;
    DPR's positions and a search's ranks count from 1), so a row's ranks rise from 1 at least; the
    `triples` source's file is unranked, so its ranks are all -1
    (msmarco_triples.triples_candidates)."""
    flat = pc.fill_null(pc.list_flatten(ranks), 0).to_numpy()
    parents = pc.list_parent_indices(ranks).to_numpy()
    if unranked:
        bad = flat != -1
    else:
        bad = flat < 1
        bad[1:] |= (flat[1:] <= flat[:-1]) & (parents[1:] == parents[:-1])
    return np.unique(parents[bad])


def _lengths(column: pa.Array) -> np.ndarray:
    return pc.list_value_length(column).fill_null(0).to_numpy()


def corpus_ids(a: Audit, manifest) -> pa.Array | None:
    """The doc ids of the corpus beside the dataset files the manifest names (one column read),
    or None where the manifest names none: negatives are then not checked against it."""
    for name in ("qrels", "queries"):
        entry = ((manifest or {}).get("inputs") or {}).get(name) or {}
        corpus = input_path(entry.get("path", ""), a.path).parent / "corpus.parquet"
        if entry.get("path") and corpus.is_file():
            a.say(f"-- negatives checked against {corpus}")
            return pq.read_table(corpus, columns=["doc_id"])["doc_id"].combine_chunks()
    a.say("-- negatives not checked against a corpus (the manifest names no dataset files)")
    return None


def find_problems(t: pa.Table, corpus: pa.Array | None, unranked: bool = False
                  ) -> dict[str, list[int]]:
    """Row numbers of the rows breaking each rule, read a batch at a time (`unranked`: negatives
    from the triples source, whose ranks are -1)."""
    names = ["leak", "repeat", "no positive", "ranks", "rank order"]
    names += ["scores"] * ("negative_scores" in t.schema.names) + ["corpus"] * (corpus is not None)
    found: dict[str, list[int]] = {name: [] for name in names}
    offset = 0
    for batch in t.to_batches(max_chunksize=ROWS_PER_BATCH):
        negatives = batch.column("negative_ids")
        rows = {
            "leak": rows_sharing(batch.column("positive_ids"), negatives),
            "repeat": rows_repeating(negatives),
            "no positive": np.flatnonzero(_lengths(batch.column("positive_ids")) == 0),
            "ranks": np.flatnonzero(
                _lengths(batch.column("negative_ranks")) != _lengths(negatives)
            ),
            "rank order": rows_misranked(batch.column("negative_ranks"), unranked),
        }
        if "negative_scores" in batch.schema.names:
            scores = _lengths(batch.column("negative_scores"))
            rows["scores"] = np.flatnonzero(scores != _lengths(negatives))
        if corpus is not None:
            rows["corpus"] = rows_outside(negatives, corpus)
        for name, where in rows.items():
            found[name].extend((where + offset).tolist())
        offset += batch.num_rows
    return found


def check_rows(a: Audit, t: pa.Table, name: str, rows: list[int]) -> None:
    """A check over rows, naming how many fail and a few of their queries."""
    if not rows:
        a.check(name, True)
        return
    examples = t["query_id"].take(pa.array(rows[:5], pa.int64())).to_pylist()
    a.check(name, False, f"{len(rows)} queries, e.g. {examples}")


def render_negatives(a: Audit, t: pa.Table, manifest, n: int) -> None:
    check_unique(a, "query_id", t["query_id"])
    corpus = corpus_ids(a, manifest)
    params = (manifest or {}).get("params") or {}
    unranked = params.get("source") == "triples"  # bm25.py's params are its policy
    found = find_problems(t, corpus, unranked)
    policy = params.get("policy") or {}
    if policy.get("positives_removed") == "first_query":
        # Mined with the BoW authors' miner replicated on request (mine.py): leaks are its effect.
        a.say(
            f"-- positives_removed: first_query (the BoW authors' miner): {len(found['leak'])} "
            "queries keep an own positive among their negatives, as that policy does"
        )
    else:
        check_rows(a, t, "no query's own positive among its negatives", found["leak"])
    # Both writers skip queries without a positive and take negatives from one ranked list.
    check_rows(a, t, "every query has a positive", found["no positive"])
    check_rows(a, t, "no negative twice for a query", found["repeat"])
    check_rows(a, t, "one rank per negative", found["ranks"])
    check_rows(a, t, "ranks all -1 (triples: unranked)" if unranked else
               "ranks increasing, each >= 1", found["rank order"])
    if "scores" in found:
        check_rows(a, t, "one score per negative", found["scores"])
    if "corpus" in found:
        check_rows(a, t, "every negative is a document of the corpus", found["corpus"])
    counts = _lengths(t["negative_ids"])
    least = policy.get("min_negatives")
    if least:  # mine.py empties a query left with fewer: none keeps 1 to least - 1
        check_rows(a, t, f"no query with 1 to {least - 1} negatives (min_negatives {least})",
                   np.flatnonzero((counts > 0) & (counts < least)).tolist())
    a.say(
        f"-- {len(t)} queries, negatives per query min/mean/max "
        f"{counts.min(initial=0)}/{counts.mean() if len(counts) else 0:.1f}/{counts.max(initial=0)}"
    )
    folder = dataset_folder(a.path)
    sample = t.slice(0, n).to_pylist()
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


KINDS = [
    # Mined first: BM25 negatives are recognised by fewer columns.
    parquet_kind(
        "negatives", RANK_PARQUET + 3, MINED_SCHEMA,
        lambda c: {"negative_ids", "negative_scores"} <= c, render_negatives,
        shown_as="negatives (mined hard negatives)",
        counted_by=("queries_mined",),  # mine.py: stats.queries counts those without a positive
    ),
    parquet_kind(
        "negatives", RANK_PARQUET + 4, SCHEMA, lambda c: "negative_ids" in c, render_negatives,
        counted_by=("queries",),  # bm25.py: one row per query kept
    ),
]
