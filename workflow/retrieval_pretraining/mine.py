"""Hard-negative mining: search the training queries with a fine-tuned encoder, keep non-positives.

Recipes differ on every knob (the COSTA authors' scripts, Tevatron, coCondenser, the BoW authors'
code), so each is a named option recorded in the manifest:
  depth            how deep to search (COSTA: 200; Tevatron: 100)
  rank_window      [lo, hi) on 1-based places: search ranks, or non-positives' places under
                   rank_window_counts: candidates (the BoW authors skip the best two: [3, 201))
  rank_window_counts  what the window counts: ranks (default) = the search's ranks, positives
                   included | candidates = places in the list left once positives (and answer
                   passages, and the query's own id) are removed: the BoW authors' build_train_hn,
                   which slices its candidates [2:200] after dropping positives, so [3, 201)
                   skips the best two NON-positives wherever the positive ranks
  sample           random (COSTA: 30 at random from the top 200) | top (the best n)
  num_negatives    n per query; null keeps every candidate (Tevatron)
  min_negatives    a query left with fewer negatives gets none (its row lists no negative, so
                   fine-tuning trains no example on this file for it, or pads it under
                   stage2_negatives: mined with queries_without_negatives: pad); null = keep
                   any. The BoW authors' QA miner drops such questions (annotate.py: 4)
  negative_filter  qrels: only the query's qrels positives are removed | answers (NQ, TriviaQA:
                   DPR's and Tevatron's policy): also every candidate whose text contains one of
                   the query's answers (answers.py's DPR match, or regex where the dataset's
                   evaluate splits say answer_match: regex), counted as answer_passages_removed
  positives_removed  own (default): each query's OWN positives are removed | first_query: the BoW
                   authors' miner, replicated on request: the first mined query's positives are
                   removed from every query, so a query's own gold passages can stay among its
                   negatives (counted as own_positives_kept; the negatives contract allows it
                   only under this policy, and `audit` says so). Never a default: it is a bug,
                   offered so that its effect on their numbers can be measured.
  answer_positives  false (default): a candidate holding an answer is no negative, and no
                   positive either | true: it is also written among the row's positive_ids, after
                   the qrels positives, in rank order: the BoW authors' QA miner (annotate.py
                   --build_hn), whose mined file trains on them as positives (finetune's
                   example_positives: file reads them)
A document whose id equals the query id is removed only where the dataset says so
(`exclude_query_id`, passed in as `exclude_self` like the dense runs: BEIR reuses ids; MS MARCO
numbers queries and passages independently, so passage 123 is a real passage for query 123), the
rule BM25 negatives follow too;
ranks are then counted without it, as in the runs. Sampling is seeded from (seed, query id) only, so
the mined set does not depend on batch, shard or thread counts.

Output: Parquet `query_id, positive_ids, negative_ids, negative_ranks, negative_scores` (the BM25
negatives schema plus scores; negatives in rank order) + manifest with the policy and seed, and
the candidates each query's search reached (`candidates_per_query_min` / `_mean`): an IVF or HNSW
index can return fewer than `depth`, which is then logged as a warning naming its settings.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import artifacts, faiss_index
from .answers import MATCH_MODES, NEGATIVE_FILTERS, answer_exclusions
from .config import ConfigError, stage_parser
from .contracts.negatives import MINED_SCHEMA as SCHEMA
from .dense_search import depth_reached, encode_queries, fetch_depth
from .encode import record_encoder_weights, recorded_weights
from .errors import command, reading
from .retrieval_settings import (SEARCH_KEYS, RetrievalSettings, add_runtime_option, check_bool,
                                 check_choice, check_int, refuse_unknown, slice_keys, with_runtime)
from .seeding import rng_for

log = logging.getLogger(__name__)

POLICY_DEFAULTS: dict[str, Any] = {
    "depth": 200,
    "rank_window": None,   # [lo, hi) 1-based ranks; hi null = up to depth
    "sample": "random",    # random | top
    "num_negatives": 30,   # null = keep all candidates
    "min_negatives": None,  # fewer kept: none (the BoW authors' QA miner: 4); null = any
    "negative_filter": "qrels",  # qrels | answers (the rule resolves mining's `auto` per dataset)
    # How answers match text under the answers filter: the dataset's evaluate splits' mode (the
    # rule passes it), so that what Acc@k counts as an answer passage is never a negative.
    "answer_match": "string",
    "positives_removed": "own",  # own | first_query (the BoW authors' miner's bug, on request)
    "rank_window_counts": "ranks",  # ranks | candidates (RANK_WINDOW_COUNTS)
    "answer_positives": False,  # answer-bearing candidates also written as positives
}
POSITIVES_REMOVED = ("own", "first_query")
# What rank_window's [lo, hi) counts: search ranks (positives among them), or places among the
# candidates left after removal (the BoW authors' build_train_hn: negatives[2:200]).
RANK_WINDOW_COUNTS = ("ranks", "candidates")
# The dataset's query-id rule arrives as `exclude_self` (finetune_knobs), as it does for dense runs.
EXCLUDE_QUERY_ID_DEFAULT = True
# The slice the mine_hard_negatives rule passes (mining_argument): a fine-tuning slice plus these.
MINING_KEYS = (*POLICY_DEFAULTS, *SEARCH_KEYS)


def policy(config: dict[str, Any]) -> dict[str, Any]:
    """The mining policy of the slice mine_hard_negatives passes (unknown keys refused)."""
    refuse_unknown(config, slice_keys(*MINING_KEYS), "mine")
    knobs = {key: config.get(key, value) for key, value in POLICY_DEFAULTS.items()}
    knobs["exclude_query_id"] = bool(config.get("exclude_self", EXCLUDE_QUERY_ID_DEFAULT))
    check_choice("mining.negative_filter", knobs["negative_filter"], NEGATIVE_FILTERS)
    check_choice("mining.positives_removed", knobs["positives_removed"], POSITIVES_REMOVED)
    check_choice("mining.rank_window_counts", knobs["rank_window_counts"], RANK_WINDOW_COUNTS)
    check_choice("answer_match", knobs["answer_match"], MATCH_MODES)
    check_bool("mining.answer_positives", knobs["answer_positives"])
    if knobs["answer_positives"] and knobs["negative_filter"] != "answers":
        raise ConfigError("mining.answer_positives writes the candidates holding an answer as "
                          f"positives, but negative_filter is {knobs['negative_filter']!r}, which "
                          "finds none; use negative_filter answers (auto: a format dpr dataset)")
    if knobs["sample"] not in ("random", "top"):
        raise ConfigError(f"mining.sample '{knobs['sample']}' is unknown; use 'random' or 'top'")
    check_int("mining.depth", knobs["depth"], 1)
    check_int("mining.num_negatives", knobs["num_negatives"], 1, nullable=True)
    check_int("mining.min_negatives", knobs["min_negatives"], 1, nullable=True)
    check_choice("mining.index.use_gpu", config.get("use_gpu", "auto"), ("auto", "never"))
    check_window(knobs["rank_window"], knobs["depth"])
    return knobs


def check_window(window: list | None, depth: int) -> None:
    """[lo, hi) must be a window on ranks 1..depth: the search returns no rank beyond `depth`, so a
    window past it would mine no negative (found only after a whole encode, index and search), and
    a hi past it would be cut to depth + 1 without a word."""
    if window is None:
        return
    if (len(window) != 2 or window[0] < 1
            or (window[1] is not None and window[1] <= window[0])):
        raise ConfigError(f"mining.rank_window {window} must be [lo, hi) with 1 <= lo < hi "
                          "(hi may be null)")
    lo, hi = window
    if lo > depth:
        raise ConfigError(f"mining.rank_window starts at rank {lo} but mining.depth is {depth}: "
                          "no query would get a negative; raise depth or lower the window's lo")
    if hi is not None and hi - 1 > depth:
        raise ConfigError(f"mining.rank_window [{lo}, {hi}) reaches past mining.depth {depth} "
                          f"(ranks beyond it are never searched); raise depth to {hi - 1} or "
                          f"lower hi to {depth + 1} (or null: up to depth)")


def select_negatives(query_id: str, doc_ids: list[str], scores: np.ndarray, ranks: np.ndarray,
                     positives: set[str], knobs: dict[str, Any], seed: int
                     ) -> tuple[list[str], list[int], list[float]]:
    """Apply the policy to ONE query's ranked list (ranks 1-based, counted before this removal).

    The policy stated for one query, for the tests: `mine` does not call it, but applies the
    same `kept_places` to a batch of queries in `mine_batch`, where the search already dropped
    the query's own id under `exclude_query_id`. Here a document whose id equals the query id is
    dropped only with `exclude_query_id`. The window is on `ranks`, or with rank_window_counts
    `candidates` on 1-based places in the list left after those removals (the returned ranks
    stay the search's).
    """
    own_id = query_id if knobs.get("exclude_query_id", EXCLUDE_QUERY_ID_DEFAULT) else None
    removed = np.array([d in positives or d == own_id for d in doc_ids], dtype=bool)
    places = kept_places(query_id, removed, ranks, knobs, seed)
    return ([doc_ids[i] for i in places], [int(ranks[i]) for i in places],
            [float(scores[i]) for i in places])


def kept_places(query_id: str, removed: np.ndarray, ranks: np.ndarray, knobs: dict[str, Any],
                seed: int) -> np.ndarray:
    """The places (0-based, in rank order) of one query's ranked list that the policy keeps as
    negatives, `removed` marking those that may not be (positives, answer passages, its own id):
    the window on `ranks` or on the places left, then num_negatives at random or the best."""
    lo, hi = (knobs["rank_window"] or [1, None])
    kept = np.flatnonzero(~removed)
    if knobs.get("rank_window_counts", "ranks") == "candidates":
        candidates = kept[lo - 1:None if hi is None else hi - 1]
    else:
        at = ranks[kept]
        candidates = kept[(at >= lo) & (at < (np.inf if hi is None else hi))]
    n = knobs["num_negatives"]
    if n is not None and len(candidates) > n:
        if knobs["sample"] == "top":
            candidates = candidates[:n]
        else:
            picked = rng_for(seed, "mine", query_id).choice(len(candidates), size=n, replace=False)
            candidates = candidates[np.sort(picked)]  # keep rank order
    return candidates


def positives_by_query(qrels: Path) -> dict[str, list[str]]:
    """Relevant (relevance > 0) doc ids per query, sorted for a stable order."""
    with reading(qrels, "a qrels Parquet file"):
        frame = (pl.scan_parquet(qrels).filter(pl.col("relevance") > 0)
                 .group_by("query_id").agg(pl.col("doc_id").unique().sort()).collect())
    return dict(zip(frame["query_id"].to_list(), frame["doc_id"].to_list()))


# Queries mined at a time, their rows written (a row group) before the next. A batch holds its
# candidates as FAISS's rows and scores (12 B a candidate: ~20 MB at depth 200, ~98 MB at bow.yaml's
# 1000) and makes doc ids of the negatives kept alone: it adds ~0.13 / ~0.26 GB, search included;
# as Python strings, every candidate's id made it ~0.25 / ~0.74 GB (benchmarks/RESULTS.md,
# "Mining's memory by depth"). A multiple of faiss_index.SEARCH_BATCH: see `batches_a_search`.
QUERY_BATCH = 8192


def batches_a_search(index, batch: int) -> int:
    """How many batches of `batch` queries one search takes: enough for each of the FAISS calls
    `faiss_index.search` runs side by side (on the CPU, one a thread: `calls_at_once`) to have
    one, where one batch of 8,192 is 2 calls (2 of a job's 8 threads). Its calls still start at
    multiples of SEARCH_BATCH from the first query while `batch` is a multiple of it, so the
    search writes the same bytes at any thread count; its candidates are held for all its batches
    (12 B a candidate: ~98 MB a batch at depth 1000), and as many calls' k-selections at once."""
    calls = -(-batch // faiss_index.SEARCH_BATCH)
    return -(-faiss_index.calls_at_once(index) // calls)


def mine(index_dir: Path, encoder: Path | tuple, queries: Path, qrels: Path, out: Path,
         config: dict[str, Any], seed: int, answers: Path | None = None,
         corpus: Path | None = None) -> dict[str, Any]:
    """Mine the queries with a positive, writing `out` a batch of queries at a time; the policy,
    seed and stats."""
    knobs = policy(config)
    retrieval = RetrievalSettings.from_config(config, added=MINING_KEYS, stage="mine")
    positives = positives_by_query(qrels)
    query_ids, vectors = encode_queries(encoder, queries, retrieval)
    # Only queries with a positive can be trained on; the others are counted, not mined.
    keep = [i for i, q in enumerate(query_ids) if q in positives]
    index, doc_ids = faiss_index.load(index_dir)
    limits = faiss_index.search_limits(index)  # as loaded: a GPU copy reports neither
    index = faiss_index.to_search_device(index, config.get("use_gpu", "auto"),
                                         fetch_depth(knobs["depth"], knobs["exclude_query_id"]))
    first = set(positives[query_ids[keep[0]]]) if keep else set()
    # The answers filter reads the whole corpus once per call: one batch (NQ and TriviaQA have
    # ~60k training queries, not MS MARCO's 503k).
    batch = QUERY_BATCH if knobs["negative_filter"] == "qrels" else max(len(keep), 1)
    searched = batch * batches_a_search(index, batch)
    tally = {"positives_removed": 0, "answer_passages_removed": 0, "own_positives_kept": 0}
    if knobs["min_negatives"] is not None:
        tally["queries_below_min_negatives"] = 0
    candidates: list[int] = []
    negatives: list[int] = []

    def removed_by_id(ids: list[str]) -> list[str]:
        """The ids queries `ids` remove by id: their positives (and the first query's), and their
        own query ids where the dataset excludes them."""
        return [*first, *(d for q in ids for d in positives[q]),
                *(ids if knobs["exclude_query_id"] else ())]

    # Their index rows, found in one pass over the index's ids for the whole job and looked up
    # per batch (a pass a batch before: 62 over MS MARCO's 8.8M ids).
    id_rows = IdRows(doc_ids, removed_by_id([query_ids[i] for i in keep]))
    with artifacts.atomic_path(out) as tmp, \
            pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer:
        for start in range(0, len(keep), searched):
            part = keep[start:start + searched]
            part_ids = [query_ids[i] for i in part]
            found = id_rows.of(removed_by_id(part_ids))
            # With the dataset's exclude_query_id, the query's own id is dropped by the search
            # and ranks are counted without it (as in the runs); without it (MS MARCO) a
            # same-numbered passage stays.
            ranked = ranked_rows(index, part_ids, vectors[part], knobs["depth"],
                                 knobs["exclude_query_id"], found)
            answered = answer_places(ranked, doc_ids, knobs, answers, corpus)
            for at in range(0, len(ranked), batch):  # each batch its row group, as searched alone
                table = mine_batch(ranked[at:at + batch], doc_ids, found, positives, first,
                                   answered, knobs, seed, tally)
                writer.write_table(table)
                negatives.extend(pc.list_value_length(table["negative_ids"]).to_pylist())
                del table
            candidates.extend(len(rows) for _, rows, _ in ranked)
            del ranked, answered  # before the next search: one search's batches held at a time
    stats = {"queries": len(query_ids), "queries_mined": len(keep),
             "queries_without_positives": len(query_ids) - len(keep), **tally,
             "negatives_per_query_mean": float(np.mean(negatives)) if negatives else 0.0,
             "queries_with_no_negative": int(sum(c == 0 for c in negatives)),
             **depth_reached(candidates, knobs["depth"], limits, knobs["exclude_query_id"])}
    return {**knobs, "seed": seed, "stats": stats}


class IdRows:
    """The index rows of each of `names`, found in one pass over the index's ids (`doc_ids`) and
    kept compact (each name's place, and all their rows in one array), for `of` to answer for any
    of them without another pass."""

    def __init__(self, doc_ids: pa.Array, names: list[str]) -> None:
        self.place = {name: place for place, name in enumerate(dict.fromkeys(names))}
        wanted = pa.array(list(self.place), doc_ids.type)
        codes = pc.fill_null(pc.index_in(doc_ids, value_set=wanted), -1).to_numpy()
        rows = np.flatnonzero(codes >= 0)
        order = np.argsort(codes[rows], kind="stable")  # each name's rows stay ascending
        self.rows = rows[order].astype(np.int64)
        self.starts = np.searchsorted(codes[rows][order], np.arange(len(self.place) + 1))

    def of(self, names: list[str]) -> dict[str, np.ndarray]:
        """The rows whose doc id is each of `names` (an id the index lacks, or one not given at
        construction, is left out; more than one row where the index repeats an id)."""
        found = {}
        for name in dict.fromkeys(names):
            place = self.place.get(name)
            if place is not None and self.starts[place + 1] > self.starts[place]:
                found[name] = self.rows[self.starts[place]:self.starts[place + 1]]
        return found


NO_ROWS = np.empty(0, dtype=np.int64)


def ranked_rows(index, query_ids: list[str], query_vectors: np.ndarray, depth: int,
                exclude_self: bool, found: dict[str, np.ndarray]
                ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """`dense_search.rank` on the index's rows, no doc id made: per query (query id, rows best
    first, their scores; ranks are places + 1), with `exclude_self` the rows of its own id
    (`found`: IdRows.of) dropped, then cut to `depth`. Views of FAISS's arrays where nothing is
    dropped."""
    scores, rows = faiss_index.search(index, query_vectors, fetch_depth(depth, exclude_self),
                                      batch_size=faiss_index.SEARCH_BATCH)
    ranked = []
    for qid, qscores, qrows in zip(query_ids, scores, rows):
        drop = qrows < 0
        if exclude_self and qid in found:
            drop |= np.isin(qrows, found[qid])
        if drop.any():
            qrows, qscores = qrows[~drop], qscores[~drop]
        ranked.append((qid, qrows[:depth], qscores[:depth]))
    return ranked


def answer_places(ranked: list[tuple], doc_ids: pa.Array, knobs: dict[str, Any],
                  answers: Path | None, corpus: Path | None) -> dict[str, np.ndarray]:
    """Per query, which of its candidates hold one of its answers (a mask in rank order) under
    `negative_filter: answers`; none under qrels. The one place every candidate's doc id is made:
    matching reads their texts."""
    if knobs["negative_filter"] == "qrels":
        return {}
    ids = {qid: doc_ids.take(rows).to_pylist() for qid, rows, _ in ranked}
    hits = answer_exclusions(ids, knobs["negative_filter"], answers, corpus,
                             knobs["answer_match"])
    return {qid: np.array([d in hits.get(qid, ()) for d in docs], dtype=bool)
            for qid, docs in ids.items()}


def mine_batch(ranked: list[tuple], doc_ids: pa.Array, found: dict[str, np.ndarray],
               positives: dict[str, list[str]], first: set[str], answered: dict[str, np.ndarray],
               knobs: dict[str, Any], seed: int, tally: dict[str, int]) -> pa.Table:
    """The rows of a batch of ranked queries (`ranked_rows`: index rows and scores); the removals
    counted into `tally`. `found`: the rows of the positives' ids (`IdRows.of`); `first`: the first
    mined query's positives (positives_removed: first_query); `answered`: `answer_places`. Doc
    ids are made for the negatives kept alone (and, with answer_positives, for the candidates
    holding an answer, which follow the qrels positives in positive_ids, in rank order)."""
    def rows(ids) -> np.ndarray:
        return np.concatenate([NO_ROWS, *(found.get(d, NO_ROWS) for d in ids)])

    first_rows = rows(sorted(first))
    listed: list[list[str]] = []
    kept_rows, kept_ranks, kept_scores = [NO_ROWS], [], []
    for qid, qrows, qscores in ranked:
        own = rows(positives[qid])
        in_pos = np.isin(qrows, own if knobs["positives_removed"] == "own" else first_rows)
        holds = answered.get(qid, np.zeros(len(qrows), dtype=bool))
        tally["positives_removed"] += int(in_pos.sum())
        tally["answer_passages_removed"] += int((holds & ~in_pos).sum())
        places = kept_places(qid, in_pos | holds, np.arange(1, len(qrows) + 1), knobs, seed)
        least = knobs.get("min_negatives")
        if least is not None and len(places) < least:
            tally["queries_below_min_negatives"] += 1
            places = places[:0]
        tally["own_positives_kept"] += int(np.isin(qrows[places], own).sum())
        extra = []
        if knobs.get("answer_positives"):
            extra = doc_ids.take(qrows[holds & ~np.isin(qrows, own)]).to_pylist()
        listed.append(positives[qid] + extra)
        kept_rows.append(qrows[places])
        kept_ranks.append((places + 1).astype(np.int32))
        kept_scores.append(qscores[places])
    offsets = pa.array(np.cumsum([0, *map(len, kept_ranks)]), pa.int32())
    columns = [pa.array([qid for qid, _, _ in ranked], pa.string()),
               pa.array(listed, pa.list_(pa.string())),
               pa.ListArray.from_arrays(offsets, doc_ids.take(np.concatenate(kept_rows))
                                        .cast(pa.string())),
               pa.ListArray.from_arrays(offsets, np.concatenate([np.empty(0, np.int32),
                                                                 *kept_ranks])),
               pa.ListArray.from_arrays(offsets, np.concatenate([np.empty(0, np.float32),
                                                                 *kept_scores]))]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def mine_to_file(index_dir: Path, encoder: Path, queries: Path, qrels: Path, out: Path,
                 config: dict[str, Any], seed: int, answers: Path | None = None,
                 corpus: Path | None = None) -> dict[str, Any]:
    weights = recorded_weights(encoder)
    info = mine(index_dir, encoder, queries, qrels, out, config, seed, answers, corpus)
    stats = info.pop("stats")
    manifest = artifacts.write_manifest(
        artifacts.manifest_path(out), stage="mine_hard_negatives",
        params={"policy": info, "retrieval": config},
        inputs={"queries": queries, "qrels": qrels, "index": index_dir / "index",
                "encoder": encoder} | ({"answers": answers} if answers else {}), stats=stats)
    record_encoder_weights(artifacts.manifest_path(out), manifest, weights)
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True, help="folder with `index` + `docid`")
    parser.add_argument("--encoder", type=Path, required=True, help="the model that mines")
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--qrels", type=Path, required=True)
    parser.add_argument("--answers", type=Path, help="answers-{split}.parquet (negative_filter answers)")
    parser.add_argument("--corpus", type=Path, help="corpus.parquet (negative_filter answers)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = add_runtime_option(parser).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stats = mine_to_file(args.index, args.encoder, args.queries, args.qrels, args.out,
                         with_runtime(args.config, args.runtime), args.seed, args.answers,
                         args.corpus)
    log.info("mined %s -> %s", stats, args.out)


if __name__ == "__main__":
    main()
