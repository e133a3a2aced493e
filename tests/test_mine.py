"""Hard-negative mining policies, and positive removal PER QUERY (the BoW authors' miner removed the
first query's positives from every query, so gold passages leaked in as negatives: replicated only
on request, `positives_removed: first_query`)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retrieval_pretraining import mine

POLICY = {"depth": 200, "rank_window": None, "sample": "random", "num_negatives": None}


def _stub_search(monkeypatch, index, docs, qids, vectors):
    """mine.mine_to_file searches `index` (its rows' doc ids `docs`) on the CPU with `vectors` as
    the queries `qids`: no index folder and no encoder needed."""
    monkeypatch.setattr(mine.faiss_index, "load", lambda folder: (index, docs))
    monkeypatch.setattr(mine.faiss_index, "to_search_device", lambda index, use_gpu, k: index)
    monkeypatch.setattr(mine, "encode_queries", lambda encoder, queries, config: (qids, vectors))


def ranked(ids):
    return ids, np.linspace(10, 1, len(ids)).astype(np.float32), np.arange(1, len(ids) + 1)


def test_each_query_loses_its_own_positives_and_only_those():
    docs = ["a", "b", "c", "d", "e", "f"]
    positives = {"q1": {"a"}, "q2": {"b", "e"}}
    out = {q: mine.select_negatives(q, *ranked(docs), positives[q], POLICY, seed=0)[0]
           for q in ("q1", "q2")}
    # The buggy miner would apply q1's positives to q2: q2 would keep "b" and "e" and lose "a".
    assert out["q1"] == ["b", "c", "d", "e", "f"]
    assert out["q2"] == ["a", "c", "d", "f"]


def test_a_judged_non_relevant_document_is_no_positive_and_stays_a_negative(tmp_path):
    """Positives are the qrels rows with relevance > 0: a grade-0 row records a document judged
    NOT relevant, a legitimate (even ideal) hard negative, which mining must not remove."""
    pq.write_table(pa.table({"query_id": ["q1", "q1", "q2"], "doc_id": ["d1", "d2", "d3"],
                             "relevance": pa.array([1, 0, 0], pa.int32())}),
                   qrels := tmp_path / "qrels.parquet")
    positives = mine.positives_by_query(qrels)
    assert positives == {"q1": ["d1"]}  # q2 has only a grade-0 row: no positive, not mined
    negs, _, _ = mine.select_negatives("q1", *ranked(["d2", "d3"]), set(positives["q1"]),
                                       POLICY, 0)
    assert negs == ["d2", "d3"]


@pytest.mark.parametrize("exclude,expected", [
    (True, (["b", "d"], [2, 4])),        # BEIR: the query's own id is not a negative
    (False, (["b", "c", "d"], [2, 3, 4])),  # MS MARCO: passage "c" is unrelated to query "c"
])
def test_a_document_with_the_query_id_follows_the_dataset_rule(exclude, expected):
    knobs = {**POLICY, "exclude_query_id": exclude}
    negs, ranks, _ = mine.select_negatives("c", *ranked(["a", "b", "c", "d"]), {"a"}, knobs, 0)
    assert (negs, ranks) == expected  # ranks are those given, not renumbered


@pytest.mark.parametrize("exclude_self", [True, False])
def test_mining_honours_the_datasets_query_id_rule(tmp_path, monkeypatch, exclude_self):
    """The whole `mine` path on a hand-made flat index: the document numbered like the query is the
    best hit; it is dropped (ranks counted without it) only when the dataset excludes query ids."""
    import faiss
    import polars as pl

    docs = ["7", "d1", "d2", "d3", "d4"]
    vectors = np.array([[4, 0], [3, 0], [2, 0], [1, 0], [0.5, 0]], dtype=np.float32)
    index = faiss.IndexFlatIP(2)
    index.add(vectors)
    monkeypatch.setattr(mine.faiss_index, "load", lambda folder: (index, pa.array(docs)))
    asked = []  # the neighbours the GPU check is told the search fetches
    monkeypatch.setattr(mine.faiss_index, "to_search_device",
                        lambda index, use_gpu, k: asked.append(k) or index)
    monkeypatch.setattr(mine, "encode_queries",
                        lambda encoder, queries, config: (["7"], np.array([[1, 0]], np.float32)))
    pl.DataFrame({"query_id": ["7"], "doc_id": ["d2"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    config = {**POLICY, "depth": 4, "exclude_self": exclude_self, "use_gpu": "never"}
    out = tmp_path / "hard-negatives.parquet"
    mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                      tmp_path / "qrels.parquet", out, config, seed=0)
    row = pl.read_parquet(out).row(0, named=True)
    manifest = json.loads(out.with_name("hard-negatives.manifest.json").read_text())
    assert manifest["params"]["policy"]["exclude_query_id"] is exclude_self
    assert asked == [4 + exclude_self]
    if exclude_self:
        assert row["negative_ids"] == ["d1", "d3", "d4"] and row["negative_ranks"] == [1, 3, 4]
    else:
        assert row["negative_ids"] == ["7", "d1", "d3"] and row["negative_ranks"] == [1, 2, 4]


def test_mined_negatives_record_their_encoder_s_weights_from_its_manifest(tmp_path, monkeypatch):
    """The encoder a folder: its weights' sha256 copied from its manifest (stats.weights) into
    the negatives' manifest, which named it by path alone (audit compares the two)."""
    import faiss
    import polars as pl

    from retrieval_pretraining import artifacts

    encoder = tmp_path / "encoder"
    encoder.mkdir()
    weights = {"model.safetensors": "cd" * 32}
    artifacts.write_manifest(encoder / "manifest.json", stage="finetune", params={},
                             stats={"weights": weights})
    index = faiss.IndexFlatIP(2)
    index.add(np.array([[2, 0], [1, 0]], dtype=np.float32))
    _stub_search(monkeypatch, index, pa.array(["a", "b"]), ["q1"], np.array([[1, 0]], np.float32))
    pl.DataFrame({"query_id": ["q1"], "doc_id": ["a"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    out = tmp_path / "hard-negatives.parquet"
    mine.mine_to_file(tmp_path / "index", encoder, tmp_path / "q.parquet",
                      tmp_path / "qrels.parquet", out, {**POLICY, "depth": 2, "use_gpu": "never"},
                      seed=0)
    manifest = json.loads(out.with_name("hard-negatives.manifest.json").read_text())
    assert manifest["inputs"]["encoder"] == {"path": str(encoder), "weights": weights}


def five_ranked_docs(monkeypatch):
    """A stand-in index of documents a..e that every query (q1, q2, q3) ranks a > b > ... > e."""
    import faiss

    index = faiss.IndexFlatIP(2)
    index.add(np.array([[5, 0], [4, 0], [3, 0], [2, 0], [1, 0]], dtype=np.float32))
    docs = pa.array(["a", "b", "c", "d", "e"])
    _stub_search(monkeypatch, index, docs, ["q1", "q2", "q3"], np.array([[1, 0]] * 3, np.float32))


@pytest.mark.parametrize("removed", ["own", "first_query"])
def test_the_bow_authors_miner_is_replicated_only_on_request(tmp_path, monkeypatch, capsys,
                                                             removed):
    """positives_removed: first_query removes the FIRST mined query's positives from every query
    (the BoW authors' miner): later queries keep their own gold passages as negatives, counted in
    the manifest, and `audit` reports them as that policy's effect. The default removes each
    query's own, and `audit` fails a file where one leaked."""
    import polars as pl

    from retrieval_pretraining import audit

    five_ranked_docs(monkeypatch)
    pl.DataFrame({"query_id": ["q1", "q2", "q2", "q3"], "doc_id": ["a", "b", "c", "a"],
                  "relevance": [1, 1, 2, 1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    config = {**POLICY, "depth": 5, "use_gpu": "never", "positives_removed": removed}
    out = tmp_path / "hard-negatives.parquet"
    stats = mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                              tmp_path / "qrels.parquet", out, config, seed=0)
    negatives = dict(pl.read_parquet(out).select("query_id", "negative_ids").iter_rows())
    manifest = json.loads(out.with_name("hard-negatives.manifest.json").read_text())
    assert manifest["params"]["policy"]["positives_removed"] == removed
    status = audit.main([str(out)])
    report = capsys.readouterr().out
    assert status == 0, report
    if removed == "own":
        assert negatives == {"q1": ["b", "c", "d", "e"], "q2": ["a", "d", "e"],
                             "q3": ["b", "c", "d", "e"]}
        assert stats["own_positives_kept"] == 0
        # A file whose own positive leaked fails the audit under the default policy.
        table = pl.read_parquet(out).with_columns(
            pl.when(pl.col("query_id") == "q2").then(pl.lit(["b", "d"]))
            .otherwise(pl.col("negative_ids")).alias("negative_ids"),
            pl.when(pl.col("query_id") == "q2").then(pl.lit([2, 4], dtype=pl.List(pl.Int32)))
            .otherwise(pl.col("negative_ranks")).alias("negative_ranks"),
            pl.when(pl.col("query_id") == "q2").then(pl.lit([4.0, 2.0], dtype=pl.List(pl.Float32)))
            .otherwise(pl.col("negative_scores")).alias("negative_scores"))
        # Written with the writer's schema (polars writes large_list): only the content is
        # corrupt, so the audit reaches its own checks.
        pq.write_table(table.to_arrow().cast(pq.read_schema(out)), out)
        assert audit.main([str(out)]) != 0
        assert "FAIL  no query's own positive among its negatives" in capsys.readouterr().out
    else:  # q1's positive "a" removed from every query; q2 keeps its own "b" and "c"
        assert negatives == {"q1": ["b", "c", "d", "e"], "q2": ["b", "c", "d", "e"],
                             "q3": ["b", "c", "d", "e"]}
        assert stats["own_positives_kept"] == 2
        assert "positives_removed: first_query (the BoW authors' miner): 1 queries" in report
    with pytest.raises(ValueError, match="positives_removed"):
        mine.policy({"positives_removed": "first"})


def test_min_negatives_empties_short_queries_end_to_end_and_audit_checks_it(
        tmp_path, monkeypatch, capsys):
    """min_negatives through mine_to_file: q2 (3 negatives left of 5) gets none, counted; the
    others keep theirs. `audit` checks the manifest's min_negatives against the rows: a row
    holding some negatives, but fewer than it, fails (the writer never leaves one)."""
    import polars as pl

    from retrieval_pretraining import audit

    five_ranked_docs(monkeypatch)
    pl.DataFrame({"query_id": ["q1", "q2", "q2", "q3"], "doc_id": ["a", "b", "c", "a"],
                  "relevance": [1, 1, 1, 1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    config = {**POLICY, "depth": 5, "use_gpu": "never", "min_negatives": 4}
    out = tmp_path / "hard-negatives.parquet"
    stats = mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                              tmp_path / "qrels.parquet", out, config, seed=0)
    negatives = dict(pl.read_parquet(out).select("query_id", "negative_ids").iter_rows())
    assert negatives == {"q1": ["b", "c", "d", "e"], "q2": [], "q3": ["b", "c", "d", "e"]}
    assert stats["queries_below_min_negatives"] == 1 and stats["queries_with_no_negative"] == 1
    assert audit.main([str(out)]) == 0, capsys.readouterr().out
    assert "min_negatives 4" in capsys.readouterr().out
    table = pl.read_parquet(out).with_columns(
        pl.when(pl.col("query_id") == "q1").then(pl.col("negative_ids").list.head(2))
        .otherwise(pl.col("negative_ids")).alias("negative_ids"),
        pl.when(pl.col("query_id") == "q1").then(pl.col("negative_ranks").list.head(2))
        .otherwise(pl.col("negative_ranks")).alias("negative_ranks"),
        pl.when(pl.col("query_id") == "q1").then(pl.col("negative_scores").list.head(2))
        .otherwise(pl.col("negative_scores")).alias("negative_scores"))
    pq.write_table(table.to_arrow().cast(pq.read_schema(out)), out)
    assert audit.main([str(out)]) != 0
    assert "FAIL  no query with 1 to 3 negatives (min_negatives 4)" in capsys.readouterr().out


def test_rank_window_keeps_ranks_lo_to_hi_exclusive():
    docs = [f"d{i}" for i in range(1, 11)]
    knobs = {**POLICY, "rank_window": [3, 7]}
    negs, ranks, _ = mine.select_negatives("q", *ranked(docs), {"d4"}, knobs, 0)
    assert ranks == [3, 5, 6] and negs == ["d3", "d5", "d6"]
    open_ended = mine.select_negatives("q", *ranked(docs), set(),
                                       {**POLICY, "rank_window": [9, None]}, 0)
    assert open_ended[1] == [9, 10]


def test_a_window_counting_candidates_slices_the_list_left_after_removal():
    """rank_window_counts candidates: bowdpr's build_train_hn drops the positives, then slices
    negatives[2:200]: [3, null) skips the two best NON-positives wherever the positive ranks. By
    search ranks (the default) a positive at rank 1 uses up one of the two skipped places, so
    rank 3 stays; both agree where the positive ranks below the window's start."""
    docs = [f"d{i}" for i in range(1, 11)]
    knobs = {**POLICY, "rank_window": [3, None], "rank_window_counts": "candidates"}
    negs, ranks, _ = mine.select_negatives("q", *ranked(docs), {"d1"}, knobs, 0)
    assert negs == ["d4", "d5", "d6", "d7", "d8", "d9", "d10"] and ranks == [4, 5, 6, 7, 8, 9, 10]
    by_rank = mine.select_negatives("q", *ranked(docs), {"d1"}, {**knobs, "rank_window_counts":
                                                                 "ranks"}, 0)
    assert by_rank[0] == ["d3", *negs]
    low = mine.select_negatives("q", *ranked(docs), {"d6"}, knobs, 0)[0]
    assert low == ["d3", "d4", "d5", "d7", "d8", "d9", "d10"]
    # A closed window counts places too: [2, 4) is the 2nd and 3rd non-positive.
    closed = mine.select_negatives("q", *ranked(docs), {"d2", "d3"},
                                   {**knobs, "rank_window": [2, 4]}, 0)
    assert closed[:2] == (["d4", "d5"], [4, 5])
    assert mine.policy({"rank_window_counts": "candidates"})["rank_window_counts"] == "candidates"
    assert mine.policy({})["rank_window_counts"] == "ranks"
    with pytest.raises(ValueError, match="rank_window_counts"):
        mine.policy({"rank_window_counts": "places"})


def test_a_window_on_candidates_equals_bowdpr_s_slice_on_random_lists():
    """Against a restatement of build_train_hn's load_ranking: remove the positives, slice
    [lo - 1 : hi - 1] (hi null: to the end), then `top` keeps the head and `random` n of them."""
    rng = np.random.default_rng(8)
    for case in range(300):
        depth = int(rng.integers(1, 60))
        docs = [f"d{i}" for i in rng.permutation(100)[:depth]]
        positives = {str(d) for d in rng.choice([*docs, "x"], size=int(rng.integers(0, 6)))}
        lo = int(rng.integers(1, 6))
        hi = [None, lo + int(rng.integers(1, 40))][int(rng.integers(2))]
        knobs = {**POLICY, "rank_window": [lo, hi], "rank_window_counts": "candidates",
                 "num_negatives": [None, 5][int(rng.integers(2))], "sample": "top"}
        expected = [d for d in docs if d not in positives][lo - 1:None if hi is None else hi - 1]
        negs = mine.select_negatives(f"q{case}", *ranked(docs), positives, knobs, 0)[0]
        n = knobs["num_negatives"]
        assert negs == (expected if n is None else expected[:n]), (case, knobs)


def test_answer_passages_become_positives_and_short_lists_go_only_on_request():
    """answer_positives: the BoW authors' QA miner (annotate.py --build_hn) lists the query's
    positives, then every candidate holding an answer, in rank order, as positives; by default
    such a candidate is no negative and no positive. Negatives are the same either way."""
    docs = ["a1", "g", "n1", "a2", "n2", "n3", "a3"]
    positives = {"q": ["g", "z"]}
    knobs = {**mine.policy({"negative_filter": "answers"}), "num_negatives": None}

    def rows(docs=docs, **policy):
        ids = pa.array(docs)  # the index's rows, ranked in this order
        answered = {"q": np.array([d in {"a1", "a2", "a3", "g"} for d in docs])}
        table = mine.mine_batch([("q", np.arange(len(docs)), ranked(docs)[1])], ids,
                                mine.IdRows(ids, ["g", "z"]).of(["g", "z"]), positives,
                                {"g", "z"}, answered,
                                {**knobs, **policy}, 0, dict.fromkeys(
                                    ("positives_removed", "answer_passages_removed",
                                     "own_positives_kept", "queries_below_min_negatives"), 0))
        return table["positive_ids"].to_pylist()[0], table["negative_ids"].to_pylist()[0]

    assert rows() == (["g", "z"], ["n1", "n2", "n3"])
    assert rows(answer_positives=True) == (["g", "z", "a1", "a2", "a3"], ["n1", "n2", "n3"])
    # In rank order, not id order: the list reversed lists them reversed.
    assert rows(docs[::-1], answer_positives=True)[0] == ["g", "z", "a3", "a2", "a1"]
    # annotate.py's min_neg_size: a question left with fewer negatives is no mined example.
    assert rows(min_negatives=3) == (["g", "z"], ["n1", "n2", "n3"])
    assert rows(min_negatives=4, answer_positives=True) == (["g", "z", "a1", "a2", "a3"], [])
    assert mine.policy({})["min_negatives"] is None
    with pytest.raises(ValueError, match="min_negatives"):
        mine.policy({"min_negatives": 0})
    assert mine.policy({})["answer_positives"] is False
    with pytest.raises(mine.ConfigError, match="answer_positives.*negative_filter answers"):
        mine.policy({"answer_positives": True, "negative_filter": "qrels"})


def test_random_sampling_is_seeded_per_query_and_keeps_rank_order():
    docs = [f"d{i}" for i in range(200)]
    knobs = {**POLICY, "num_negatives": 30}
    negs, ranks, scores = mine.select_negatives("q7", *ranked(docs), {"d0"}, knobs, seed=1)
    assert len(negs) == len(set(negs)) == 30 and "d0" not in negs
    assert ranks == sorted(ranks) and scores == sorted(scores, reverse=True)
    assert negs == mine.select_negatives("q7", *ranked(docs), {"d0"}, knobs, seed=1)[0]
    assert negs != mine.select_negatives("q7", *ranked(docs), {"d0"}, knobs, seed=2)[0]
    assert negs != mine.select_negatives("q8", *ranked(docs), {"d0"}, knobs, seed=1)[0]
    # Drawn from the whole candidate list, not just its head: ranks spread beyond the top 60.
    assert max(ranks) > 60


def _naive_selection(qid, docs, ranks, positives, window, exclude_own):
    """The (doc, rank) pairs a policy may keep, restated: ranks in [lo, hi), the query's positives
    and (exclude_own) its own id out, in rank order."""
    lo, hi = window or (1, None)
    return [(d, int(r)) for d, r in zip(docs, ranks)
            if lo <= r and (hi is None or r < hi) and d not in positives
            and not (exclude_own and d == qid)]


def test_the_selection_equals_a_naive_restatement_on_random_policies():
    """Random lists, positives (some not retrieved), own ids, windows, counts and samplers: `top`
    keeps the head of the naive candidate list, `random` a subset of it in rank order, n of them
    (every one when there are at most n), each with its own rank and score."""
    rng = np.random.default_rng(5)
    for case in range(400):
        qid, depth = f"q{case}", int(rng.integers(1, 60))
        docs = [f"d{i}" for i in rng.permutation(100)[:depth]]
        if rng.random() < 0.3:
            docs[int(rng.integers(depth))] = qid
        positives = {str(d) for d in rng.choice([*docs, "x1", "x2"], size=int(rng.integers(0, 5)))}
        lo = int(rng.integers(1, 6))
        window = None if rng.random() < 0.3 else [lo, [None, lo + int(rng.integers(1, 40))][
            int(rng.integers(2))]]
        n = [None, 1, 5, 30][int(rng.integers(4))]
        knobs = {**POLICY, "rank_window": window, "num_negatives": n,
                 "sample": ["random", "top"][int(rng.integers(2))],
                 "exclude_query_id": bool(rng.integers(2))}
        _, scores, ranks = ranked(docs)
        negs, neg_ranks, neg_scores = mine.select_negatives(qid, docs, scores, ranks, positives,
                                                            knobs, seed=3)
        expected = _naive_selection(qid, docs, ranks, positives, window,
                                    knobs["exclude_query_id"])
        kept = list(zip(negs, neg_ranks))
        assert neg_scores == [float(scores[docs.index(d)]) for d in negs]
        if n is None or len(expected) <= n:
            assert kept == expected, (case, knobs)
        elif knobs["sample"] == "top":
            assert kept == expected[:n], (case, knobs)
        else:
            assert len(kept) == n and kept == [c for c in expected if c in kept], (case, knobs)


def test_random_sampling_draws_every_candidate_of_the_window_equally_often():
    """COSTA's 30 at random from the top 200 less the positives: over many queries each remaining
    candidate is kept about 30/198 of the time, whatever its rank (a draw from the head only, or
    one that counted the positives among the 30, fails this)."""
    docs = [f"d{i}" for i in range(200)]
    _, scores, ranks = ranked(docs)
    knobs = {**POLICY, "num_negatives": 30}
    counts = dict.fromkeys(docs, 0)
    for q in range(3000):
        negs, _, _ = mine.select_negatives(f"q{q}", docs, scores, ranks, {"d0", "d57"}, knobs, 11)
        assert len(negs) == 30
        for d in negs:
            counts[d] += 1
    assert counts["d0"] == counts["d57"] == 0
    # Expected 3000 * 30 / 198 = 454.5 each, sd ~19.6: all within 6 sd.
    assert all(336 < c < 573 for d, c in counts.items() if d not in ("d0", "d57")), counts


def test_top_policy_takes_the_best_n_and_short_lists_keep_everything():
    docs = [f"d{i}" for i in range(1, 11)]
    top = mine.select_negatives("q", *ranked(docs), {"d1"}, {**POLICY, "sample": "top",
                                                             "num_negatives": 3}, 0)
    assert top[0] == ["d2", "d3", "d4"]
    few = mine.select_negatives("q", *ranked(docs[:3]), set(), {**POLICY, "num_negatives": 30}, 0)
    assert few[0] == docs[:3]


def test_bad_policies_fail_with_the_fix():
    with pytest.raises(ValueError, match="random.*top"):
        mine.policy({"sample": "shuffle"})
    with pytest.raises(ValueError, match="rank_window"):
        mine.policy({"rank_window": [5, 3]})


@pytest.mark.parametrize("window,depth,says", [
    ([150, None], 100, "starts at rank 150 but mining.depth is 100"),
    ([101, 200], 100, "starts at rank 101"),
    ([3, 500], 200, "raise depth to 499 or lower hi to 201"),
])
def test_a_rank_window_beyond_the_depth_is_refused_naming_both_keys(window, depth, says):
    """A window that starts past the depth mines no negative for any query; one that ends past
    it is cut to depth + 1. Both fail before anything is encoded, naming both keys."""
    with pytest.raises(mine.ConfigError, match="rank_window") as error:
        mine.policy({**POLICY, "depth": depth, "rank_window": window})
    assert says in str(error.value) and "mining.depth" in str(error.value)


@pytest.mark.parametrize("window,depth", [([3, None], 200), ([1, 201], 200), ([200, None], 200),
                                          ([3, None], 3)])
def test_windows_within_the_depth_pass(window, depth):
    assert mine.policy({**POLICY, "depth": depth, "rank_window": window})["rank_window"] == window


def test_seeds_depend_on_seed_and_keys_only():
    a = mine.rng_for(3, "mine", "q1").integers(1 << 30, size=4)
    assert (a == mine.rng_for(3, "mine", "q1").integers(1 << 30, size=4)).all()
    assert not (a == mine.rng_for(3, "mine", "q2").integers(1 << 30, size=4)).all()


def test_seeded_draws_are_those_mined_files_were_made_with():
    """rng_for moved to seeding.py: its draws (negatives sampled, groups, epoch orders) must stay
    the ones every existing mined file and fine-tuning run was made with (values of the old
    mine.py)."""
    from retrieval_pretraining.seeding import rng_for

    assert rng_for(3, "mine", "q1").integers(1 << 30, size=4).tolist() == [
        180834457, 20505769, 22261559, 551067523]
    assert rng_for(7, "group", 2, "q9").permutation(6).tolist() == [4, 1, 5, 3, 0, 2]


def _mine_random(tmp_path, monkeypatch, index_config, depth, queries=30, rows=4000):
    """Mine `queries` random queries against `rows` random vectors under `index_config`."""
    import polars as pl

    from retrieval_pretraining import faiss_index

    tmp_path.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((rows, 16)).astype(np.float32)
    index = faiss_index.build(vectors, index_config)
    docs = pa.array([f"d{i}" for i in range(rows)])
    qids = [f"q{i}" for i in range(queries)]
    _stub_search(monkeypatch, index, docs, qids,
                 rng.standard_normal((queries, 16)).astype(np.float32))
    pl.DataFrame({"query_id": qids, "doc_id": ["d0"] * queries, "relevance": [1] * queries},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    config = {**POLICY, "depth": depth, "num_negatives": 30, "use_gpu": "never"}
    out = tmp_path / "hard-negatives.parquet"
    stats = mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                              tmp_path / "qrels.parquet", out, config, seed=0)
    manifest = json.loads(out.with_name("hard-negatives.manifest.json").read_text())
    return stats, manifest, pl.read_parquet(out)


def test_mining_records_the_depth_an_approximate_index_reached_and_warns(tmp_path, monkeypatch,
                                                                         caplog):
    """IVF with nprobe 1 of 100 cells sees ~1% of 4,000 vectors: far fewer than 200 per query.
    The manifest must say so (not only `depth: 200`), and the log must name the setting."""
    stats, manifest, table = _mine_random(tmp_path, monkeypatch,
                                          {"type": "ivf", "nlist": 100, "nprobe": 1}, depth=200)
    deepest = max(max(r) for r in table["negative_ranks"].to_list())
    assert stats["candidates_per_query_min"] < 200
    assert stats["candidates_per_query_min"] <= deepest <= 200  # the ranks mined agree with it
    assert manifest["stats"]["candidates_per_query_mean"] < 200
    assert "fewer than the 200 candidates asked" in caplog.text
    assert "'nprobe': 1" in caplog.text


def test_an_exact_index_reaches_the_depth_without_a_warning(tmp_path, monkeypatch, caplog):
    stats, _, _ = _mine_random(tmp_path, monkeypatch, {"type": "flat"}, depth=200)
    assert stats["candidates_per_query_min"] == 200
    assert stats["candidates_per_query_mean"] == 200.0
    assert "candidates asked" not in caplog.text


def _mining_peak(tmp_path, monkeypatch, queries: int) -> int:
    """Peak Python (and numpy) allocation while mining `queries` random queries against a flat
    index of 1,000 vectors, depth 200, 30 at random."""
    import tracemalloc

    tracemalloc.start()
    try:
        _mine_random(tmp_path, monkeypatch, {"type": "flat"}, depth=200, queries=queries, rows=1000)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_mining_memory_does_not_grow_with_the_queries_at_10x(tmp_path, monkeypatch):
    """MS MARCO mines 503k training queries: holding ~19 KB of candidate ids, scores and negatives
    for every query before writing is ~9.5 GB. Mined a batch of queries at a time and written as it
    goes, 10x the queries (10x the batches) add only the run's per-query state (ids, positives,
    counts: a few hundred bytes a query), not their candidates: FAISS's rows and scores alone are
    2.4 KB a query at depth 200 (and a batch's are now small enough that the per-query state is
    not lost beside them: the bound is on the growth a query, not a ratio of peaks)."""
    monkeypatch.setattr(mine, "QUERY_BATCH", 256, raising=False)
    _mining_peak(tmp_path / "warm", monkeypatch, 8)  # first-call imports and caches not counted
    one = _mining_peak(tmp_path / "1x", monkeypatch, 256)
    ten = _mining_peak(tmp_path / "10x", monkeypatch, 2560)
    grown = (ten - one) / (2560 - 256)
    assert grown < 1000, (f"peak {one / 1e6:.1f} MB at 1x, {ten / 1e6:.1f} MB at 10x: "
                          f"{grown:.0f} B a query more")


def test_the_mined_file_does_not_depend_on_the_query_batch(tmp_path, monkeypatch):
    _, whole, table = _mine_random(tmp_path / "whole", monkeypatch, {"type": "flat"}, depth=50)
    monkeypatch.setattr(mine, "QUERY_BATCH", 7)
    _, batched, in_batches = _mine_random(tmp_path / "batched", monkeypatch, {"type": "flat"},
                                          depth=50)
    assert in_batches.equals(table) and len(table) == 30
    assert batched["stats"] == whole["stats"]


def test_mining_writes_the_same_bytes_at_any_thread_count_searching_more_at_once(tmp_path,
                                                                                 monkeypatch):
    """faiss_index.search runs a FAISS call a thread, so a search of one batch (2 calls at the
    shipped 8,192 and 4,096) used 2 of a job's threads: at 4 threads a search takes 2 batches (4
    calls), and the negatives file is byte for byte the one-thread file, a row group a batch. Here
    1,024 queries a call (dim 128: FAISS's BLAS path, whose rounding depends on a call's queries and
    threads) and batches of 2,048; the last search is short, its call below the BLAS path."""
    import faiss
    import polars as pl

    from retrieval_pretraining import faiss_index

    rng = np.random.default_rng(7)
    index = faiss_index.build(rng.standard_normal((5000, 128)).astype(np.float32))
    docs = pa.array([f"d{i}" for i in range(5000)])
    qids = [f"q{i}" for i in range(5000)]
    _stub_search(monkeypatch, index, docs, qids,
                 rng.standard_normal((5000, 128)).astype(np.float32))
    pl.DataFrame({"query_id": qids, "doc_id": ["d0"] * 5000, "relevance": [1] * 5000},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    monkeypatch.setattr(faiss_index, "SEARCH_BATCH", 1024)
    monkeypatch.setattr(mine, "QUERY_BATCH", 2048)
    searched = []
    search = faiss_index.search
    monkeypatch.setattr(faiss_index, "search", lambda index, queries, depth, batch_size: (
        searched.append((len(queries), batch_size)) or search(index, queries, depth, batch_size)))
    config = {**POLICY, "depth": 50, "num_negatives": None, "use_gpu": "never"}  # all scores
    files = {}
    before = faiss.omp_get_max_threads()
    try:
        for threads in (1, 4):
            faiss.omp_set_num_threads(threads)
            searched.clear()
            out = tmp_path / f"negatives-{threads}.parquet"
            mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                              tmp_path / "qrels.parquet", out, config, seed=0)
            files[threads] = out.read_bytes()
            assert searched == ([(2048, 1024)] * 2 + [(904, 1024)] if threads == 1 else
                                [(4096, 1024), (904, 1024)]), (threads, searched)
            written = pq.ParquetFile(out).metadata
            assert [written.row_group(g).num_rows for g in range(written.num_row_groups)] == [
                2048, 2048, 904]
    finally:
        faiss.omp_set_num_threads(before)
    assert files[4] == files[1]


def test_the_index_ids_are_scanned_once_a_job_not_once_a_batch(tmp_path, monkeypatch):
    """Finding the index rows of the ids mining removes by id reads every id of the index (8.8M
    at MS MARCO, ~0.3 s a pass): once for the job, not once for each batch (62 at MS MARCO). The
    file stays the one mined in a single batch (the test above)."""
    scanned = []
    index_in = mine.pc.index_in

    def counted(values, *args, **kwargs):
        scanned.append(len(values))
        return index_in(values, *args, **kwargs)

    monkeypatch.setattr(mine.pc, "index_in", counted)
    monkeypatch.setattr(mine, "QUERY_BATCH", 7)
    _, _, table = _mine_random(tmp_path, monkeypatch, {"type": "flat"}, depth=50, rows=500)
    assert len(table) == 30 and scanned == [500], scanned


def test_a_batch_holds_index_rows_not_doc_ids_until_the_cut(tmp_path, monkeypatch):
    """bow.yaml's MS MARCO policy searches 1,000 deep and keeps 128: a batch that made a Python
    string of every candidate's doc id (~85 B a candidate with its list's pointer, beside FAISS's
    12 B of score and row) held ~0.74 GB a batch of 8,192. Its candidates stay FAISS rows until
    the cut; ids are made for the negatives kept alone. Python's (and numpy's) peak allocation per
    candidate searched: FAISS's arrays and little more (~16 B), not ~85."""
    import tracemalloc

    import polars as pl

    from retrieval_pretraining import faiss_index

    queries, rows, depth = 1024, 1100, 1000
    rng = np.random.default_rng(0)
    index = faiss_index.build(rng.standard_normal((rows, 16)).astype(np.float32))
    docs = pa.array([f"doc-{i}" for i in range(rows)], pa.large_string())
    qids = [f"q{i}" for i in range(queries)]
    vectors = rng.standard_normal((queries, 16)).astype(np.float32)
    _stub_search(monkeypatch, index, docs, qids, vectors)
    pl.DataFrame({"query_id": qids, "doc_id": [f"doc-{i}" for i in range(queries)],
                  "relevance": [1] * queries}).write_parquet(tmp_path / "qrels.parquet")
    config = {"depth": depth, "rank_window": [3, 201], "rank_window_counts": "candidates",
              "num_negatives": 128, "sample": "random", "exclude_self": False, "use_gpu": "never"}

    def run():
        return mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                                 tmp_path / "qrels.parquet", tmp_path / "negatives.parquet",
                                 config, seed=0)

    run()  # first-call imports and caches not counted
    tracemalloc.start()
    try:
        stats = run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats["candidates_per_query_min"] == depth
    assert stats["negatives_per_query_mean"] == 128
    per_candidate = peak / (queries * depth)
    assert per_candidate < 40, f"{per_candidate:.1f} B a candidate searched ({peak / 1e6:.0f} MB)"


def _naive_mined(qids, vectors, index, docs, qrels, texts, answers, knobs, seed):
    """What `mine` writes, restated from its policy on doc id strings, one query at a time: the
    search's ranking (FAISS's order, the query's own id dropped where excluded, cut to depth),
    then the removals (own or first query's positives, answer passages), the window on ranks or
    on places left, num_negatives (top, or drawn with the (seed, query id) generator and kept in
    rank order), min_negatives; answer passages not its own listed as positives on request.
    Returns (rows, the manifest's removal counts)."""
    from retrieval_pretraining import answers as answer_match
    from retrieval_pretraining import faiss_index

    positives = {}
    for q, d, relevance in qrels:
        if relevance > 0:
            positives.setdefault(q, set()).add(d)
    positives = {q: sorted(ds) for q, ds in positives.items()}
    mined = [(i, q) for i, q in enumerate(qids) if q in positives]
    first = set(positives[mined[0][1]])
    scores, rows = faiss_index.search(index, vectors, knobs["depth"] + 1)
    lo, hi = knobs["rank_window"] or (1, None)
    counts = dict.fromkeys(("positives_removed", "answer_passages_removed",
                            "own_positives_kept", "queries_below_min_negatives"), 0)
    table = []
    for i, q in mined:
        hits = [(docs[r], float(s)) for r, s in zip(rows[i], scores[i])
                if r >= 0 and not (knobs["exclude_query_id"] and docs[r] == q)][:knobs["depth"]]
        own = set(positives[q])
        removed = own if knobs["positives_removed"] == "own" else first
        holding = {d for d, _ in hits if knobs["negative_filter"] == "answers"
                   and answer_match.has_answer(texts[d], answers[q], knobs["answer_match"])}
        left = [(d, rank, s) for rank, (d, s) in enumerate(hits, start=1)
                if d not in removed and d not in holding]
        if knobs["rank_window_counts"] == "candidates":
            pool = left[lo - 1:None if hi is None else hi - 1]
        else:
            pool = [c for c in left if lo <= c[1] and (hi is None or c[1] < hi)]
        n = knobs["num_negatives"]
        if n is not None and len(pool) > n:
            if knobs["sample"] == "top":
                pool = pool[:n]
            else:
                drawn = mine.rng_for(seed, "mine", q).choice(len(pool), size=n, replace=False)
                pool = [pool[j] for j in sorted(drawn)]
        if knobs["min_negatives"] is not None and len(pool) < knobs["min_negatives"]:
            pool = []
            counts["queries_below_min_negatives"] += 1
        counts["positives_removed"] += sum(d in removed for d, _ in hits)
        counts["answer_passages_removed"] += len(holding - removed)
        counts["own_positives_kept"] += sum(d in own for d, _, _ in pool)
        listed = positives[q] + [d for d, _ in hits if d in holding and d not in own
                                 and knobs["answer_positives"]]
        table.append({"query_id": q, "positive_ids": listed,
                      "negative_ids": [d for d, _, _ in pool],
                      "negative_ranks": [r for _, r, _ in pool],
                      "negative_scores": [s for _, _, s in pool]})
    if knobs["min_negatives"] is None:
        del counts["queries_below_min_negatives"]
    return table, counts


def test_the_mined_file_equals_a_naive_restatement_on_random_policies(tmp_path, monkeypatch):
    """Every policy knob at once, through `mine_to_file` in batches of 7 queries: depth, window
    (on ranks or on places left), top or random, num_negatives, min_negatives, the qrels or
    answers filter (string or regex), answer_positives, own or first_query positives, the
    dataset's query-id rule (a quarter of the queries share an id with a document), positives
    the index lacks or ranks low and graded 0: the file's rows and the manifest's removal counts
    equal `_naive_mined`'s."""
    import polars as pl

    from retrieval_pretraining import faiss_index

    rng = np.random.default_rng(17)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    n_docs, dim = 300, 8
    docs = [f"d{i}" for i in range(n_docs)]
    qids = list(dict.fromkeys(docs[int(rng.integers(n_docs))] if i % 4 == 0 else f"q{i}"
                              for i in range(40)))
    vectors = rng.standard_normal((len(qids), dim)).astype(np.float32)
    doc_vectors = rng.standard_normal((n_docs, dim)).astype(np.float32)
    index = faiss_index.build(doc_vectors)
    near = np.argsort(-(vectors @ doc_vectors.T), axis=1)
    qrels = [(q, docs[d], int(rng.integers(0, 3))) for k, q in enumerate(qids[:-3])
             for d in rng.choice(near[k, :40], size=int(rng.integers(1, 4)), replace=False)]
    qrels.append((qids[0], "not-in-the-index", 1))
    texts = {d: " ".join(rng.choice(words, 3)) for d in docs}
    answers = {q: [str(rng.choice(words))] for q in qids}
    pl.DataFrame(qrels, orient="row", schema={"query_id": pl.String, "doc_id": pl.String,
                                              "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    pl.DataFrame({"doc_id": docs, "title": ["t"] * n_docs, "text": [texts[d] for d in docs]}
                 ).write_parquet(tmp_path / "corpus.parquet")
    pl.DataFrame({"query_id": qids, "answers": [answers[q] for q in qids]}
                 ).write_parquet(tmp_path / "answers.parquet")
    _stub_search(monkeypatch, index, pa.array(docs, pa.large_string()), qids, vectors)
    monkeypatch.setattr(mine, "QUERY_BATCH", 7)
    for case in range(60):
        depth = int(rng.choice([10, 30, 80]))
        lo = int(rng.integers(1, 5))
        n = [None, 3, 10, 40][int(rng.integers(4))]
        answer_filter = case % 2 == 1
        config = {"depth": depth, "num_negatives": n, "exclude_self": bool(rng.integers(2)),
                  "rank_window": [None, [lo, None], [lo, lo + int(rng.integers(1, depth - lo + 2))]
                                  ][int(rng.integers(3))],
                  "rank_window_counts": ["ranks", "candidates"][int(rng.integers(2))],
                  "sample": ["random", "top"][int(rng.integers(2))],
                  "min_negatives": [None, 2, 6][int(rng.integers(3))] if (n or 40) >= 6 else None,
                  "negative_filter": ["qrels", "answers"][answer_filter],
                  "answer_match": ["string", "regex"][int(rng.integers(2))],
                  "positives_removed": ["own", "first_query"][int(rng.integers(2))],
                  "answer_positives": answer_filter and bool(rng.integers(2)), "use_gpu": "never"}
        out = tmp_path / f"negatives-{case}.parquet"
        stats = mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                                  tmp_path / "qrels.parquet", out, config, seed=case,
                                  answers=tmp_path / "answers.parquet",
                                  corpus=tmp_path / "corpus.parquet")
        expected, counts = _naive_mined(qids, vectors, index, docs, qrels, texts, answers,
                                        mine.policy(config), case)
        written = pq.read_table(out).to_pylist()
        for row in written:  # float32 as written; the restatement's come from FAISS's float32
            row["negative_scores"] = [float(np.float32(s)) for s in row["negative_scores"]]
        assert written == expected, (case, config)
        assert {k: stats[k] for k in counts} == counts, (case, config)


def test_a_gpu_encoder_is_released_before_the_index_goes_to_the_gpu(tmp_path, monkeypatch):
    """faiss-gpu allocates on its own: memory torch's allocator holds for the query encoder is
    lost to the index. On a GPU, mining encodes the queries, drops the encoder and empties torch's
    cache, then moves the index. Stand-ins for the CUDA path, which the CPU suite never takes: an
    encoder whose parameters say CUDA, and torch.cuda.empty_cache recording whether the encoder
    was still alive when it ran (emptied before the encoder is dropped, it frees nothing)."""
    import weakref
    from types import SimpleNamespace

    import faiss
    import polars as pl

    from retrieval_pretraining import dense_search

    class CudaEncoder:
        def parameters(self):
            return iter([SimpleNamespace(is_cuda=True)])

    encoders, events = [], []

    def load_encoder(folder):
        encoder = CudaEncoder()
        encoders.append(weakref.ref(encoder))
        return encoder, None

    def to_search_device(index, use_gpu, k):
        events.append("index to the GPU")
        return index

    index = faiss.IndexFlatIP(2)
    index.add(np.array([[2, 0], [1, 0]], dtype=np.float32))
    monkeypatch.setattr(dense_search, "load_encoder", load_encoder)
    monkeypatch.setattr(dense_search, "embed",
                        lambda model, tokenizer, texts, **_: np.ones((len(texts), 2), np.float32))
    monkeypatch.setattr(dense_search.torch.cuda, "empty_cache", lambda: events.append(
        f"cache emptied, encoder {'alive' if encoders[0]() else 'released'}"))
    monkeypatch.setattr(mine.faiss_index, "load", lambda folder: (index, pa.array(["a", "b"])))
    monkeypatch.setattr(mine.faiss_index, "to_search_device", to_search_device)
    pl.DataFrame({"query_id": ["q1"], "text": ["a query"]}).write_parquet(tmp_path / "q.parquet")
    pl.DataFrame({"query_id": ["q1"], "doc_id": ["a"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    mine.mine(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
              tmp_path / "qrels.parquet", tmp_path / "hard-negatives.parquet",
              {**POLICY, "depth": 2, "pooling": "cls", "similarity": "dot", "q_len": 8,
               "p_len": 8}, seed=0)
    assert events == ["cache emptied, encoder released", "index to the GPU"]


def test_every_row_of_a_positive_the_index_repeats_is_removed(tmp_path, monkeypatch):
    """An index folder made by hand (faiss_index.load does not refuse repeats) may hold one doc id
    in several rows: IdRows gives every row of a positive's id, and each is removed; a miner that
    looked up one row would keep the other copy of the gold passage as a negative."""
    import faiss
    import polars as pl

    docs = ["a", "b", "a", "c"]
    index = faiss.IndexFlatIP(2)
    index.add(np.array([[4, 0], [3, 0], [2, 0], [1, 0]], dtype=np.float32))
    _stub_search(monkeypatch, index, pa.array(docs), ["q1"], np.array([[1, 0]], np.float32))
    pl.DataFrame({"query_id": ["q1"], "doc_id": ["a"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    out = tmp_path / "hard-negatives.parquet"
    stats = mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                              tmp_path / "qrels.parquet", out,
                              {**POLICY, "depth": 4, "use_gpu": "never"}, seed=0)
    row = pl.read_parquet(out).row(0, named=True)
    assert (row["negative_ids"], row["negative_ranks"]) == (["b", "c"], [2, 4])
    assert stats["positives_removed"] == 2
