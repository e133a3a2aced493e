"""Padding (queries_without_negatives: pad) fills the group of a query without negatives with
random corpus documents: never one of its positives, and under the dataset's exclude_query_id
(`exclude_self`, a query is the document of its id: BEIR's ArguAna, Quora) never its own
document, which mining never keeps either (mine.py, bm25.py); and never the same document twice."""

from __future__ import annotations

import polars as pl
import pytest
from retrieval_pretraining.finetune import data as fdata
from retrieval_pretraining.finetune.settings import FinetuneSettings


class IdStore:
    """A passage store whose texts are the doc ids (what a group drew, without texts)."""

    def lookup(self, ids):
        return list(ids), list(ids)


def _dataset(tmp_path, n=6, prefix=""):
    """Queries q0..q(n-1) (each id after `prefix`) with positive d<i>, the first half of them the
    document of its own id too; the negatives files name q0 alone (the rest are padded)."""
    queries = [f"{prefix}q{i}" for i in range(n)]
    docs = [*queries[:n // 2], *(f"d{i}" for i in range(n))]
    pl.DataFrame({"doc_id": docs, "title": [""] * len(docs), "text": docs}).write_parquet(
        tmp_path / "corpus.parquet")
    pl.DataFrame({"query_id": queries, "text": queries}).write_parquet(tmp_path / "queries.parquet")
    pl.DataFrame({"query_id": queries, "doc_id": [f"d{i}" for i in range(n)],
                  "relevance": [1] * n}).write_parquet(tmp_path / "qrels.parquet")
    files = []
    for name in ("bm25", "mined"):
        files.append(tmp_path / f"{name}.parquet")
        pl.DataFrame({"query_id": [queries[0]], "negative_ids": [["d1", "d2"]],
                      "positive_ids": [["d0"]]},
                     schema={"query_id": pl.String, "negative_ids": pl.List(pl.String),
                             "positive_ids": pl.List(pl.String)}).write_parquet(files[-1])
    return (tmp_path / "queries.parquet", tmp_path / "qrels.parquet", tmp_path / "corpus.parquet",
            files)


def _groups(tmp_path, exclude_self, negative_files, epochs=40, group_size=6, prefix=""):
    queries, qrels, corpus, files = _dataset(tmp_path, prefix=prefix)
    settings = FinetuneSettings.from_config({"group_size": group_size, "exclude_self": exclude_self,
                                             "negative_files": negative_files})
    loaded = fdata.load_training_set(queries, qrels, corpus,
                                     files if negative_files == "separate" else files[:1],
                                     settings, seed=3).with_passages(IdStore())
    ids = loaded.query_ids.to_list()
    out = []
    for epoch in range(epochs):
        _, _, drawn = loaded.micro_batch(ids, group_size, seed=3, epoch=epoch)
        out += [(qid, drawn[i * group_size:(i + 1) * group_size]) for i, qid in enumerate(ids)]
    return loaded, out


@pytest.mark.parametrize("negative_files", ["union", "separate"])
def test_padding_never_draws_the_querys_own_document_under_exclude_self(tmp_path, negative_files):
    """Five of six queries are padded from a corpus of 9 documents, two of them their own: over
    40 epochs none draws its own id (or a positive) as a negative; a separate example
    (`query@pad`) is its query's. Without exclude_self an id is only a document's (MS MARCO's
    query and passage numbers are unrelated): the draws are as they were, own ids among them;
    a query whose id names no document draws the same either way."""
    loaded, groups = _groups(tmp_path, True, negative_files)
    assert loaded.counts["queries_without_negatives_padded"] == 5
    for example, group in groups:
        query = example.rsplit("@", 1)[0] if negative_files == "separate" else example
        assert group[0] == f"d{query[1:]}" and len(group) == 6
        assert query not in group[1:] and group[0] not in group[1:], (example, group)
    _, kept = _groups(tmp_path, False, negative_files)
    own = sum(e.split("@")[0] in g[1:] for e, g in kept)
    assert own > 0  # the other rule keeps the draws, which do hit the documents named like queries
    for (example, group), (_, old) in zip(groups, kept):
        if example.split("@")[0] in ("q3", "q4", "q5"):
            assert group == old, example


def test_a_query_id_holding_an_at_sign_never_pads_with_its_own_document(tmp_path):
    """A separate example's id is `query_id@file`, its query all before the LAST @: a query id
    with an @ of its own (a user's dataset: `t@q1`) still keeps its own document out of its
    padded groups under exclude_self (read up to the first @ instead, it was `t`, no document)."""
    loaded, groups = _groups(tmp_path, True, "separate", prefix="t@")
    assert loaded.counts["queries_without_negatives_padded"] == 5
    for example, group in groups:
        query = "t@" + example.split("@")[1]  # t@q<i>@<file>: the query t@q<i>
        assert group[0] == f"d{query[3:]}" and query not in group[1:], (example, group)


def test_padding_says_why_when_the_corpus_holds_only_the_querys_positives_and_own_id():
    with pytest.raises(ValueError, match="q1 has no negatives.*own id"):
        fdata.sample_group("q1", ["p1"], [], ["p1", "q1"], 3, seed=7, epoch=0, own_id="q1")
    assert fdata.sample_group("q1", ["p1"], [], ["p1", "q1"], 3, seed=7, epoch=0)[1:] == [
        "q1", "q1"]  # the id is a document's only under exclude_self


@pytest.mark.parametrize("pool_size", [20, 5183])
def test_a_padded_group_never_repeats_a_document(pool_size):
    """Padding draws 4 x group_size pool documents with replacement: each is kept once, so a
    padded group's negatives are distinct whenever the pool (less the positives) holds enough,
    as `draw` keeps a long enough list's (it repeated one in 69% of groups of 8 from 20 documents,
    0.35% from SciFact's 5,183)."""
    pool = [f"d{i}" for i in range(pool_size)]
    for epoch in range(2000):
        group = fdata.sample_group("q1", ["d3"], [], pool, 8, seed=7, epoch=epoch)
        assert len(set(group)) == 8 and group[0] == "d3", (epoch, group)
    tiny = fdata.sample_group("q1", ["d0"], [], ["d0", "d1", "d2"], 8, seed=7, epoch=0)
    assert set(tiny[1:]) == {"d1", "d2"}  # fewer than 7 to pad with: drawn with replacement
