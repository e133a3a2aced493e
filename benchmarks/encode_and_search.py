"""Encoding throughput (passages/s) and exact search throughput vs the device's GEMM limit.

Exact inner-product search is one GEMM (queries x corpus^T) plus a top-k selection, so its ceiling
is the device's matrix-multiply rate. We time (1) our encoder (`encode.embed`, bf16 on CUDA as
the stage runs it) on real SciFact abstracts, (2) FAISS IndexFlatIP.search (on the GPU when
faiss-gpu is installed; the lent GPU machine cannot hold its wheel: see RESULTS.md), (3) exact
search in torch on the device (blocked GEMM + top-k), (4) the same-shape GEMM alone (fp32 on
either device; on CUDA bf16 too) and a large square GEMM (the device's limit), and report each
search's achieved fraction of the same-shape GEMM.

    .venv/bin/python benchmarks/encode_and_search.py [--threads 2] [--docs 1024] [--corpus 200000]
    python3 benchmarks/encode_and_search.py --device cuda --archs bert-base --p-lens 128 512 \
        --docs 32768 --corpus 1000000 --dim 768 --queries 8192 --batch 512   # (gpu_checks.sh)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from pretrain_step_time import make_checkpoint  # noqa: E402  (benchmarks/, beside this file)
from retrieval_pretraining import encode  # noqa: E402


def best_of(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":  # the kernels are queued; wait for them before reading the clock
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def abstracts(docs: int) -> tuple[list[str], list[str]]:
    """`docs` SciFact abstracts with their titles, the 5,183 repeated as often as needed."""
    rows = [json.loads(line) for line in (ROOT / "data/beir/scifact/corpus.jsonl").open()]
    rows = [rows[i % len(rows)] for i in range(docs)]
    return [r["text"] for r in rows], [r["title"] for r in rows]


def encoding(archs: list[str], p_lens: list[int], docs: int, batch: int, repeats: int,
             device: torch.device) -> list[dict]:
    texts, titles = abstracts(docs)
    rows = []
    for arch in archs:
        with tempfile.TemporaryDirectory() as tmp:
            model, tokenizer = encode.load_encoder(make_checkpoint(arch, Path(tmp) / "ckpt"), device)
        for p_len in p_lens:
            # As the stage runs (on a GPU: tokenised ahead on encode.gpu_tokenizer_threads() threads);
            # on a GPU also tokenised in turn with the model, once: what tokenising ahead buys.
            for threads, times in [(None, repeats)] + ([(0, 1)] if device.type == "cuda" else []):
                embed = lambda: encode.embed(  # noqa: E731
                    model, tokenizer, texts, titles=titles, max_len=p_len, pooling="cls",
                    similarity="dot", batch_size=batch, tokenizer_threads=threads)
                if threads is None:
                    embed()  # warm-up: CUDA kernels chosen and the allocator filled, not timed
                seconds = best_of(embed, times, device)
                tokenising = "in turn" if threads == 0 else (
                    f"{encode.gpu_tokenizer_threads()} threads ahead" if device.type == "cuda" else "in turn")
                rows.append({"arch": arch, "p_len": p_len, "passages": docs, "batch": batch,
                             "tokenising": tokenising, "passages_per_s": round(docs / seconds, 1)})
                print(rows[-1], flush=True)
    return rows


BLOCK = 1024  # queries per GEMM: one block's scores are held (4 GB at 1M documents, fp32)


def torch_search(queries: torch.Tensor, docs: torch.Tensor, depth: int | None) -> None:
    """Exact top-`depth` by inner product, a block of queries at a time; None: the GEMM alone."""
    for start in range(0, len(queries), BLOCK):
        scores = queries[start:start + BLOCK] @ docs.T
        if depth is not None:
            torch.topk(scores, depth, dim=1)


def faiss_search(docs: np.ndarray, qs: np.ndarray, depth: int, repeats: int,
                 device: torch.device) -> float | str:
    """Seconds for IndexFlatIP.search, or why it was not timed."""
    try:
        from retrieval_pretraining import faiss_index
    except ImportError as error:
        return f"not timed: {error}"
    index = faiss_index.build(docs)
    if device.type == "cuda":
        index = faiss_index.to_search_device(index)
        if not type(index).__name__.startswith("Gpu"):
            return "not timed: faiss has no GPU support here (faiss-cpu)"
    return best_of(lambda: faiss_index.search(index, qs, depth), repeats, device)


def search(corpus: int, queries: int, dim: int, depth: int, repeats: int,
           device: torch.device) -> dict:
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((corpus, dim), dtype=np.float32)
    qs = rng.standard_normal((queries, dim), dtype=np.float32)
    flops = 2.0 * corpus * queries * dim
    result = {"device": device.type, "corpus": corpus, "queries": queries, "dim": dim,
              "depth": depth}
    t_faiss = faiss_search(docs, qs, depth, repeats, device)
    if isinstance(t_faiss, str):
        result["faiss"] = t_faiss
    else:
        result["faiss_queries_per_s"] = round(queries / t_faiss, 1)
        result["faiss_gflops"] = round(flops / t_faiss / 1e9, 1)
    tq, td = torch.from_numpy(qs).to(device), torch.from_numpy(docs).to(device)
    t_torch = best_of(lambda: torch_search(tq, td, depth), repeats, device)
    result["torch_search_queries_per_s"] = round(queries / t_torch, 1)
    result["torch_search_gflops"] = round(flops / t_torch / 1e9, 1)
    t_gemm = best_of(lambda: torch_search(tq, td, None), repeats, device)
    result["same_shape_gemm_gflops"] = round(flops / t_gemm / 1e9, 1)
    if device.type == "cuda":
        bq, bd = tq.bfloat16(), td.bfloat16()
        t_bf16 = best_of(lambda: torch_search(bq, bd, None), repeats, device)
        result["same_shape_gemm_bf16_gflops"] = round(flops / t_bf16 / 1e9, 1)
        del bq, bd
    n = 8192 if device.type == "cuda" else 2048
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t_square = best_of(lambda: a @ b, repeats, device)
    result["square_gemm_gflops"] = round(2.0 * n**3 / t_square / 1e9, 1)
    for name in ("faiss", "torch_search"):
        if f"{name}_gflops" in result:
            result[f"{name}_fraction_of_same_shape_gemm"] = round(
                result[f"{name}_gflops"] / result["same_shape_gemm_gflops"], 3)
    print(result, flush=True)
    return result


def arguments() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--archs", nargs="+", default=["minilm-l2", "minilm-l6"],
                        choices=["minilm-l2", "minilm-l6", "bert-base"])
    parser.add_argument("--p-lens", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--corpus", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--depths", nargs="+", type=int, default=[200, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def main() -> None:
    args = arguments().parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    try:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        pass
    report = {"device": args.device, "threads": args.threads,
              "encoding": encoding(args.archs, args.p_lens, args.docs, args.batch, args.repeats,
                                   device),
              "flat_search": [search(args.corpus, args.queries, args.dim, depth, args.repeats,
                                     device) for depth in args.depths]}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
