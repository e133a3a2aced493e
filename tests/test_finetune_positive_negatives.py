"""A negatives file that lists one of a query's positives among its negatives (a user's file, the
official triples, a mined file): loading removes it from the query's list, counts it and names
one, so that a passage never trains as both the positive and a negative of one query. The
queries left without negatives then follow queries_without_negatives like any other."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from retrieval_pretraining import artifacts
from retrieval_pretraining.finetune import data as fdata
from retrieval_pretraining.finetune.settings import FinetuneSettings
from test_finetune import tiny_dataset

KEY = "positives_among_negatives_removed"


def _positives(data: dict[str, Path]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for qid, doc in pl.read_parquet(data["qrels"]).filter(pl.col("relevance") > 0).select(
            "query_id", "doc_id").iter_rows():
        found.setdefault(qid, []).append(doc)
    return {q: sorted(d) for q, d in found.items()}


def _leaky(data: dict[str, Path], path: Path, lists: dict[str, list[str]]) -> list[str]:
    """The BM25 stand-in with some queries' negative lists replaced; their query ids, sorted."""
    bm25 = pl.read_parquet(data["bm25"])
    negatives = [lists.get(q, n) for q, n in zip(bm25["query_id"], bm25["negative_ids"].to_list())]
    bm25.with_columns(pl.Series("negative_ids", negatives, dtype=pl.List(pl.String))
                      ).write_parquet(path)
    return sorted(bm25["query_id"].to_list())


def _load(data, files, **config):
    settings = FinetuneSettings.from_config({"group_size": 4, **config})
    return fdata.load_training_set(data["queries"], data["qrels"], data["corpus"], files,
                                   settings, seed=9)


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_a_positive_listed_as_a_negative_is_removed_counted_and_named(tmp_path, policy):
    """q0 lists its positive first (twice) among its negatives, in both of two unioned files; q1
    lists only its positives, in both: q0 keeps its other negatives, q1 is left with none, so
    padded or dropped (counted) as a query the files name no negative for. Every removed entry is
    counted (q0's in each file, each time listed); the first is named with its file: the least
    query id's, though the first file lists q1's row before q0's."""
    data = tiny_dataset(tmp_path, n_queries=12)
    positives = _positives(data)
    bm25 = pl.read_parquet(data["bm25"])
    q0, q1 = sorted(bm25["query_id"].to_list())[:2]
    own = dict(zip(bm25["query_id"], bm25["negative_ids"].to_list()))
    lists = {q0: [positives[q0][0], positives[q0][0], *own[q0]], q1: list(positives[q1])}
    files = [tmp_path / "first.parquet", tmp_path / "second.parquet"]
    _leaky(data, files[0], lists)
    pl.read_parquet(files[0]).sort("query_id", descending=True).write_parquet(files[0])
    _leaky(data, files[1], {q0: [*own[q0][:2], positives[q0][0]], q1: list(positives[q1])})
    loaded = _load(data, files, queries_without_negatives=policy)
    frame = dict(zip(loaded.query_ids.to_list(), loaded.queries["negatives"].to_list()))
    assert frame[q0] == own[q0]  # the union, each id at its first place, the positive gone
    for qid, negatives in frame.items():
        assert not set(negatives or []) & set(positives[qid])
    assert loaded.counts[KEY] == 3 + 2 * len(positives[q1])
    assert loaded.removed_example == (q0, positives[q0][0], str(files[0]))
    if policy == "pad":
        assert not frame[q1] and loaded.counts["queries_without_negatives_padded"] == 1
    else:
        assert q1 not in frame and loaded.counts["queries_without_negatives_dropped"] == 1
    assert set(loaded.needed_passages().to_list()) >= set(own[q0])


def test_a_clean_file_loads_as_before(tmp_path):
    """No positive among the negatives (every file the workflow writes): nothing removed, the
    count 0, no example."""
    data = tiny_dataset(tmp_path, n_queries=12)
    loaded = _load(data, [data["bm25"]])
    bm25 = pl.read_parquet(data["bm25"]).sort("query_id")
    assert loaded.queries["negatives"].to_list() == bm25["negative_ids"].to_list()
    assert loaded.counts[KEY] == 0 and loaded.removed_example is None


def test_a_low_resource_sample_is_drawn_among_queries_with_a_negative_left(tmp_path):
    """Under drop, the sample pool (stage 1's file) holds the queries with a negative that is not
    a positive: a query whose list is its positives alone is outside it, as a query with no list
    is, so the sample is not cut after it is drawn."""
    data = tiny_dataset(tmp_path, n_queries=12)
    positives = _positives(data)
    leaky = tmp_path / "leaky.parquet"
    q1 = _leaky(data, leaky, {})[1]
    _leaky(data, leaky, {q1: positives[q1]})
    cfg = FinetuneSettings.from_config({"train_queries": 11, "train_sample": 0,
                                        "queries_without_negatives": "drop"})
    frame, counts = fdata.training_queries(data["queries"], data["qrels"], [leaky], cfg, 1,
                                           corpus=data["corpus"], sample_among=[leaky])
    assert q1 not in frame["query_id"].to_list() and len(frame) == 11
    assert counts["queries_outside_sample_pool"] == 1
    assert counts["queries_without_negatives_dropped"] == 0


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_separate_files_remove_the_files_own_positives_with_example_positives_file(tmp_path,
                                                                                     policy):
    """negative_files: separate, example_positives: file: an example's positives are its query's
    and those its file's row lists, so a negative of that file among them is removed; a query
    whose every file-list is its positives has no example of a file, and is padded or dropped
    (counted). Without example_positives: file the file's listed positives are no training
    positives, and stay negatives."""
    data = tiny_dataset(tmp_path, n_queries=12)
    bm25 = pl.read_parquet(data["bm25"]).sort("query_id")
    qids = bm25["query_id"].to_list()
    own = dict(zip(qids, bm25["negative_ids"].to_list()))
    extra = {qids[0]: own[qids[0]][0], qids[1]: own[qids[1]][0]}
    mined = bm25.with_columns(
        pl.Series("positive_ids", [p + ([extra[q]] if q in extra else []) for q, p in zip(
            qids, bm25["positive_ids"].to_list())], dtype=pl.List(pl.String)),
        pl.Series("negative_ids", [[extra[qids[1]]] if q == qids[1] else n
                                   for q, n in zip(qids, own.values())],
                  dtype=pl.List(pl.String)))
    files = [tmp_path / "mined.parquet", tmp_path / "bm25-copy.parquet"]
    mined.write_parquet(files[0])
    bm25.filter(pl.col("query_id") != qids[1]).write_parquet(files[1])
    loaded = _load(data, files, negative_files="separate", example_positives="file",
                   queries_without_negatives=policy)
    examples = dict(zip(loaded.query_ids.to_list(), loaded.queries["negatives"].to_list()))
    assert examples[f"{qids[0]}@0"] == own[qids[0]][1:]
    assert examples[f"{qids[0]}@1"] == own[qids[0]]  # the BM25 copy lists no extra positive
    assert f"{qids[1]}@0" not in examples and f"{qids[1]}@1" not in examples
    assert loaded.counts[KEY] == 2
    assert loaded.removed_example == (qids[0], extra[qids[0]], str(files[0]))
    if policy == "pad":
        assert examples[f"{qids[1]}@pad"] is None and loaded.num_queries == 12
        assert loaded.counts["queries_without_negatives_padded"] == 1
    else:
        assert f"{qids[1]}@pad" not in examples and loaded.num_queries == 11
        assert loaded.counts["queries_without_negatives_dropped"] == 1
    plain = _load(data, files, negative_files="separate", queries_without_negatives=policy)
    kept = dict(zip(plain.query_ids.to_list(), plain.queries["negatives"].to_list()))
    assert kept[f"{qids[0]}@0"] == own[qids[0]] and kept[f"{qids[1]}@0"] == [extra[qids[1]]]
    assert plain.counts[KEY] == 0


def test_a_file_mined_with_positives_removed_first_query_keeps_them(tmp_path):
    """The BoW authors' miner, replicated on request (mining positives_removed: first_query),
    leaves each query's own positives among its negatives, and its manifest says so: training on
    them is what it replicates, so they stay (the audit reports them)."""
    data = tiny_dataset(tmp_path, n_queries=12)
    positives = _positives(data)
    leaky = tmp_path / "hard-negatives.parquet"
    q0 = _leaky(data, leaky, {})[0]
    bm25 = pl.read_parquet(data["bm25"])
    listed = [positives[q0][0], *dict(zip(bm25["query_id"], bm25["negative_ids"]))[q0]]
    _leaky(data, leaky, {q0: listed})
    artifacts.write_json(artifacts.manifest_path(leaky), {
        "stage": "mine_hard_negatives", "params": {"policy": {"positives_removed": "first_query"}}})
    loaded = _load(data, [leaky])
    frame = dict(zip(loaded.query_ids.to_list(), loaded.queries["negatives"].to_list()))
    assert frame[q0] == listed and loaded.counts[KEY] == 0
    artifacts.write_json(artifacts.manifest_path(leaky), {
        "stage": "mine_hard_negatives", "params": {"policy": {"positives_removed": "own"}}})
    assert _load(data, [leaky]).counts[KEY] == 1


def test_a_negatives_file_s_manifest_that_is_no_object_is_one_error_line(tmp_path):
    """Loading reads a negatives file's manifest for its mining policy: one that parses to another
    JSON value than an object is an InputFileError naming it (it was an AttributeError)."""
    from retrieval_pretraining.errors import InputFileError

    data = tiny_dataset(tmp_path, n_queries=12)
    negatives = tmp_path / "hard-negatives.parquet"
    _leaky(data, negatives, {})
    artifacts.manifest_path(negatives).write_text("[]\n")
    with pytest.raises(InputFileError, match="hard-negatives.manifest.json: not a JSON object"):
        _load(data, [negatives])
