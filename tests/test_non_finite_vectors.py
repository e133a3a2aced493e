"""Non-finite vectors are refused before they are written or searched, and a search's shortfall
is blamed on nprobe / efSearch only where the index is approximate.

A NaN document vector is never retrieved, a NaN query retrieves nothing, and float16 storage
turns a component above 65504 into inf: the runs written from them silently lost documents or
queries, and the tables were scored from those runs."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from safetensors.torch import load_file, save_file

from pretrain_fixtures import tiny_checkpoint
from retrieval_pretraining import dense_search, encode, faiss_index, mine
from retrieval_pretraining.encode import NonFiniteVectors

KNOBS = {"pooling": "cls", "similarity": "dot", "q_len": 16, "p_len": 16,
         "encode_batch_size": 8}
DOCS = ["d0", "d1", "d2", "d3"]


def nan_encoder(folder: Path) -> Path:
    """A tiny BERT whose last LayerNorm is NaN: every output vector NaN, as after a fine-tuning
    whose loss went NaN and whose weights were saved."""
    tiny_checkpoint(folder)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in sorted(weights) if k.endswith("output.LayerNorm.bias"))
    weights[name] = weights[name] * float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def corpus(path: Path) -> Path:
    pl.DataFrame({"doc_id": DOCS, "title": [""] * 4,
                  "text": ["one fish", "two fish", "red fish", "blue fish"]}).write_parquet(path)
    return path


def queries(path: Path) -> Path:
    pl.DataFrame({"query_id": ["q0", "q1"], "text": ["a fish", "two"]}).write_parquet(path)
    return path


def flat_index(folder: Path, rows: int = 4, dim: int = 32) -> Path:
    vectors = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    faiss_index.save(folder, faiss_index.build(vectors), [f"d{i}" for i in range(rows)])
    return folder


def test_a_shard_of_nan_vectors_is_refused_naming_the_shard_rows_ids_and_cause(tmp_path):
    out = tmp_path / "shard-0000.npy"
    with pytest.raises(NonFiniteVectors) as error:
        encode.encode_corpus_shard(corpus(tmp_path / "corpus.parquet"),
                                   nan_encoder(tmp_path / "encoder"), 0, 1, out,
                                   tmp_path / "shard-0000.ids.parquet",
                                   KNOBS | {"dtype": "float16"})
    message = str(error.value)
    assert message.startswith(f"{out} (shard 0 of 1, corpus rows 0..3): 4 of 4 doc vectors are "
                              "not finite (e.g. doc ids d0, d1, d2, ...)")
    assert "from the encoder" in message and "fine-tuning diverged" in message
    assert "float16" not in message  # the cast is not what made them NaN
    assert not out.exists() and not (tmp_path / "shard-0000.ids.parquet").exists()


def _encode_stubbed(tmp_path, monkeypatch, vectors: np.ndarray, dtype: str) -> Path:
    monkeypatch.setattr(encode, "load_encoder", lambda folder: (None, None))
    monkeypatch.setattr(encode, "embed", lambda model, tok, texts, **_: vectors)
    out = tmp_path / "shard.npy"
    encode.encode_corpus_shard(corpus(tmp_path / "corpus.parquet"), tmp_path / "encoder", 0, 1,
                               out, tmp_path / "ids.parquet", KNOBS | {"dtype": dtype})
    return out


def test_a_vector_that_overflows_float16_is_refused_with_the_dtype_fix(tmp_path, monkeypatch):
    """Finite in float32 (an unnormalised dot-product vector), inf once stored as float16."""
    vectors = np.ones((4, 8), np.float32)
    vectors[2, 5] = 70000.0
    with pytest.raises(NonFiniteVectors) as error:
        _encode_stubbed(tmp_path, monkeypatch, vectors, "float16")
    message = str(error.value)
    assert "1 of 4 doc vectors are not finite (e.g. doc ids d2)" in message
    assert "1 overflow float16" in message and "set finetune.dtype: float32" in message
    assert "from the encoder" not in message
    assert not (tmp_path / "shard.npy").exists()
    # The fix the message gives: the same vectors stored in float32 are written as they are.
    stored = np.load(_encode_stubbed(tmp_path, monkeypatch, vectors, "float32"))
    assert np.array_equal(stored, vectors)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_finite_vectors_are_written_byte_for_byte_as_before(dtype, tmp_path):
    """The .npy is what the encoder's vectors, cast, always saved as (np.save of astype)."""
    encoder = tiny_checkpoint(tmp_path / "encoder")
    out = tmp_path / "shard.npy"
    encode.encode_corpus_shard(corpus(tmp_path / "corpus.parquet"), encoder, 0, 1, out,
                               tmp_path / "ids.parquet", KNOBS | {"dtype": dtype})
    model, tokenizer = encode.load_encoder(encoder)
    vectors = encode.embed(model, tokenizer, ["one fish", "two fish", "red fish", "blue fish"],
                           titles=[""] * 4, max_len=16, pooling="cls", similarity="dot")
    expected = io.BytesIO()
    np.save(expected, vectors.astype(dtype), allow_pickle=False)
    assert out.read_bytes() == expected.getvalue()


def test_a_dense_run_refuses_nan_queries_before_searching(tmp_path):
    """A NaN query got no hit, and a warning to raise nprobe: the wrong fix, and a run that
    silently lost the query."""
    out = tmp_path / "run.trec"
    query_file = queries(tmp_path / "queries.parquet")
    config = KNOBS | {"title": "space", "search_depth": 2, "exclude_self": False,
                      "use_gpu": "never"}
    with pytest.raises(NonFiniteVectors) as error:
        dense_search.dense_run(flat_index(tmp_path / "index"), nan_encoder(tmp_path / "encoder"),
                               query_file, out, "x", config)
    message = str(error.value)
    assert message.startswith(f"{query_file}: 2 of 2 query vectors are not finite (e.g. query "
                              "ids q0, q1)")
    assert "fine-tuning diverged" in message
    assert not out.exists()


def test_mining_refuses_nan_queries_before_searching(tmp_path):
    pl.DataFrame({"query_id": ["q0", "q1"], "doc_id": ["d0", "d1"], "relevance": [1, 1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    out = tmp_path / "hard-negatives.parquet"
    config = {**KNOBS, "title": "space", "depth": 2, "num_negatives": 1, "use_gpu": "never"}
    with pytest.raises(NonFiniteVectors, match="2 of 2 query vectors are not finite"):
        mine.mine_to_file(flat_index(tmp_path / "index"), nan_encoder(tmp_path / "encoder"),
                          queries(tmp_path / "queries.parquet"), tmp_path / "qrels.parquet",
                          out, config, seed=0)
    assert not out.exists()


def _dense_run(tmp_path, monkeypatch, index, depth: int) -> dict:
    rows = index.ntotal
    rng = np.random.default_rng(1)
    monkeypatch.setattr(faiss_index, "load", lambda folder: (
        index, pa.array([f"d{i}" for i in range(rows)])))
    monkeypatch.setattr(dense_search, "encode_queries", lambda encoder, queries, knobs: (
        [f"q{i}" for i in range(5)], rng.standard_normal((5, index.d)).astype(np.float32)))
    config = KNOBS | {"title": "space", "search_depth": depth, "exclude_self": True,
                      "use_gpu": "never"}
    return dense_search.dense_run(tmp_path / "index", tmp_path / "encoder",
                                  tmp_path / "q.parquet", tmp_path / "run.trec", "x", config)


def test_a_flat_index_smaller_than_the_depth_says_so_not_raise_nprobe(tmp_path, monkeypatch,
                                                                      caplog):
    index = faiss_index.build(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    with caplog.at_level(logging.INFO, logger=dense_search.__name__):
        stats = _dense_run(tmp_path, monkeypatch, index, depth=10)
    assert stats["candidates_per_query_min"] == 4
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "nprobe" not in caplog.text
    assert ("5 of 5 queries got fewer than the 10 candidates asked (min 4): the index holds only "
            "4 documents") in caplog.text


@pytest.mark.parametrize("knobs", [{"type": "ivf", "nlist": 100, "nprobe": 1},
                                   {"type": "hnsw", "hnsw_m": 4, "ef_search": 1}])
def test_an_approximate_index_that_finds_too_few_warns_to_raise_its_setting(knobs, tmp_path,
                                                                            monkeypatch, caplog):
    vectors = np.random.default_rng(0).standard_normal((4000, 8)).astype(np.float32)
    index = faiss_index.build(vectors, knobs)
    with caplog.at_level(logging.WARNING, logger=dense_search.__name__):
        stats = _dense_run(tmp_path, monkeypatch, index, depth=200)
    assert stats["candidates_per_query_min"] < 200
    assert "raise nprobe or ef_search in mining.index" in caplog.text


def test_mining_over_a_flat_index_smaller_than_the_depth_does_not_warn(tmp_path, monkeypatch,
                                                                       caplog):
    index = faiss_index.build(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    docs = pa.array(DOCS)
    monkeypatch.setattr(mine.faiss_index, "load", lambda folder: (index, docs))
    monkeypatch.setattr(mine, "encode_queries", lambda encoder, q, config: (
        ["q0", "q1"], np.ones((2, 8), np.float32)))
    pl.DataFrame({"query_id": ["q0", "q1"], "doc_id": ["d0", "d1"], "relevance": [1, 1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    config = {**KNOBS, "title": "space", "depth": 10, "num_negatives": 2, "use_gpu": "never"}
    with caplog.at_level(logging.WARNING):
        stats = mine.mine_to_file(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                                  tmp_path / "qrels.parquet", tmp_path / "neg.parquet", config,
                                  seed=0)
    assert stats["candidates_per_query_min"] == 4
    assert "nprobe" not in caplog.text


@pytest.mark.parametrize("knobs", [{"type": "ivf", "nlist": 100, "nprobe": 64},
                                   {"type": "hnsw", "hnsw_m": 32, "ef_search": 256}])
def test_an_approximate_index_smaller_than_the_depth_says_so_not_raise_nprobe(knobs, tmp_path,
                                                                             monkeypatch, caplog):
    """An approximate index that searched the whole of a corpus smaller than the depth was told
    to raise nprobe or ef_search: no setting finds more than the corpus holds."""
    vectors = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
    index = faiss_index.build(vectors, knobs)
    with caplog.at_level(logging.INFO, logger=dense_search.__name__):
        stats = _dense_run(tmp_path, monkeypatch, index, depth=200)
    assert stats["candidates_per_query_min"] == 100
    searched = [r for r in caplog.records if r.name == dense_search.__name__]
    assert not [r for r in searched if r.levelno >= logging.WARNING]
    assert not [r for r in searched if "nprobe" in r.getMessage()]
    assert ("5 of 5 queries got fewer than the 200 candidates asked (min 100): the index holds "
            "only 100 documents") in caplog.text


def test_an_ivf_index_smaller_than_the_depth_that_misses_some_still_warns(tmp_path, monkeypatch,
                                                                          caplog):
    """A corpus smaller than the depth does not hide an index that found less than all of it."""
    vectors = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    index = faiss_index.build(vectors, {"type": "ivf", "nlist": 10, "nprobe": 1})
    with caplog.at_level(logging.WARNING, logger=dense_search.__name__):
        stats = _dense_run(tmp_path, monkeypatch, index, depth=1000)
    assert stats["candidates_per_query_min"] < 399
    assert "raise nprobe or ef_search in mining.index" in caplog.text


@pytest.mark.parametrize("stage", ["dense_run", "mine"])
def test_a_search_of_the_whole_corpus_but_the_query_s_own_id_does_not_warn(stage, tmp_path,
                                                                           monkeypatch, caplog):
    """Under exclude_self, a query named like a document of a corpus smaller than the depth gets
    every document but that one: a complete search, even from an approximate index. Both stages
    must tell depth_reached that its own id was dropped; else the query's 99 of 100 read as an
    index that missed one and the log told the user to raise nprobe, which finds nothing more."""
    vectors = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
    index = faiss_index.build(vectors, {"type": "ivf", "nlist": 100, "nprobe": 64})
    docs = pa.array([f"d{i}" for i in range(100)])
    qids = ["d3", "q1"]
    encoded = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    for module in (dense_search, mine):
        monkeypatch.setattr(module, "encode_queries", lambda encoder, q, knobs: (qids, encoded))
    monkeypatch.setattr(faiss_index, "load", lambda folder: (index, docs))
    with caplog.at_level(logging.INFO, logger=dense_search.__name__):
        if stage == "dense_run":
            stats = dense_search.dense_run(
                tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                tmp_path / "run.trec", "x", KNOBS | {"title": "space", "search_depth": 200,
                                                     "exclude_self": True, "use_gpu": "never"})
        else:
            pl.DataFrame({"query_id": qids, "doc_id": ["d0", "d1"], "relevance": [1, 1]},
                         schema={"query_id": pl.String, "doc_id": pl.String,
                                 "relevance": pl.Int32}).write_parquet(tmp_path / "qrels.parquet")
            stats = mine.mine_to_file(
                tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                tmp_path / "qrels.parquet", tmp_path / "neg.parquet",
                {**KNOBS, "title": "space", "depth": 200, "num_negatives": 2,
                 "exclude_self": True, "use_gpu": "never"}, seed=0)
    assert stats["candidates_per_query_min"] == 99
    searched = [r for r in caplog.records if r.name == dense_search.__name__]
    assert not [r for r in searched if r.levelno >= logging.WARNING], caplog.text
    assert "the index holds only 100 documents" in caplog.text
