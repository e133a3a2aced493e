"""Mining's memory and time as the number of training queries grows (MS MARCO mines 503k).

Each count runs in a fresh process: a flat index over --docs random unit 384-d vectors, that many
random queries (the encoder replaced: mining's cost after encoding does not depend on it), each
with one positive, mined with the shipped policy (depth 200, 30 at random) or with --policy bow
bow.yaml's MS MARCO override (places [3, 201) of the candidates, 128 at random), at --depth.
Prints one JSON line per count: wall seconds of `mine_to_file`, the peak RSS it added (VmHWM
after - RSS before, the peak reset once the inputs are built: the index and query vectors
excluded), the process's peak from there (VmHWM), the negatives file's sha256 (its first 16
digits), the OpenMP threads (OMP_NUM_THREADS) and the queries a search at them (`searched`:
`mine.batches_a_search`, one FAISS call a thread). Two knobs tell where the peak comes from:
--search-batch, faiss_index.search's queries a FAISS call (faiss_index.SEARCH_BATCH, shipped:
4,096; FAISS's k-selection holds 2 x depth candidates, 12 B each, for every query of a call, and
mining sizes its searches by it), and --release, which returns the allocators' free memory to
the system before each search (glibc's malloc_trim and Arrow's pool): what it takes off the peak
was held by them, not by mining.

    PYTHONPATH=workflow .venv/bin/python benchmarks/mine_queries.py --queries 10000 40000
    PYTHONPATH=workflow .venv/bin/python benchmarks/mine_queries.py --queries 8192 --docs 1000000 \
        --policy bow --depth 1000
    PYTHONPATH=workflow .venv/bin/python benchmarks/mine_queries.py --queries 8192 32768 \
        --policy bow --depth 1000 --release  # or --search-batch 512
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from memory_probe import status_kb  # noqa: E402

DIM = 384


# bow.yaml's msmarco-passage-bow mining override, less its depth (--depth).
BOW = {"rank_window": [3, 201], "rank_window_counts": "candidates", "num_negatives": 128,
       "sample": "random"}


def policy(name: str, depth: int) -> dict:
    if name == "shipped":
        return {"depth": depth, "sample": "random", "num_negatives": 30}
    # A search of 200 or less takes the window to its end ([3, null)): bow.yaml before a3961ed.
    return BOW | {"depth": depth, "rank_window": BOW["rank_window"] if depth > 200 else [3, None]}


def released(search, release: bool):
    """faiss_index.search with `release` the allocators' free memory returned to the system
    before it runs."""
    import pyarrow as pa

    libc = ctypes.CDLL("libc.so.6")

    def wrapped(index, queries, depth, **kwargs):
        if release:
            libc.malloc_trim(0)
            pa.default_memory_pool().release_unused()
        return search(index, queries, depth, **kwargs)
    return wrapped


def one(queries: int, docs: int, depth: int, name: str, chunk: int | None = None,
        release: bool = False) -> dict:
    import faiss
    import numpy as np
    import polars as pl
    import pyarrow as pa

    from retrieval_pretraining import faiss_index, mine

    rng = np.random.default_rng(0)

    def unit(n: int) -> np.ndarray:
        v = rng.standard_normal((n, DIM), dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    index = faiss_index.build(unit(docs))
    ids = pa.array([f"d{i}" for i in range(docs)], pa.large_string())
    qids = [f"q{i}" for i in range(queries)]
    vectors = unit(queries)
    mine.faiss_index.load = lambda folder: (index, ids)
    mine.encode_queries = lambda encoder, path, knobs: (qids, vectors)
    mine.faiss_index.search = released(faiss_index.search, release)
    if chunk:  # mine passes it to each search, and sizes its searches by it
        faiss_index.SEARCH_BATCH = chunk
    work = Path(tempfile.mkdtemp())
    pl.DataFrame({"query_id": qids, "doc_id": [f"d{i % docs}" for i in range(queries)],
                  "relevance": [1] * queries}).write_parquet(work / "qrels.parquet")
    config = policy(name, depth) | {"use_gpu": "never"}
    # The peak so far is building the inputs' (a temporary copy of the random vectors): reset it,
    # or a large --docs hides mining's peak under it (Linux: clear_refs 5 resets VmHWM).
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kb("VmRSS")
    start = time.perf_counter()
    try:
        mine.mine_to_file(work / "index", work / "encoder", work / "q.parquet",
                          work / "qrels.parquet", work / "negatives.parquet", config, seed=0)
        wall = time.perf_counter() - start
        digest = hashlib.sha256((work / "negatives.parquet").read_bytes()).hexdigest()
    finally:
        shutil.rmtree(work)
    return {"queries": queries, "docs": docs, "depth": depth, "policy": name,
            "batch": mine.QUERY_BATCH, "threads": faiss.omp_get_max_threads(),
            "searched": mine.QUERY_BATCH * mine.batches_a_search(index, mine.QUERY_BATCH),
            "wall_s": round(wall, 1),
            "peak_added_mb": round((status_kb("VmHWM") - before) / 1024),
            "peak_mb": round(status_kb("VmHWM") / 1024), "search_batch": chunk or "shipped",
            "release": release, "sha256": digest[:16]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, nargs="+", default=[10_000, 40_000])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--depth", type=int, default=200, help="mining.depth")
    parser.add_argument("--policy", choices=["shipped", "bow"], default="shipped",
                        help="shipped: 30 at random; bow: bow.yaml's MS MARCO override")
    parser.add_argument("--search-batch", type=int, help="queries a FAISS call (shipped: 4096)")
    parser.add_argument("--release", action="store_true",
                        help="malloc_trim and Arrow's release_unused before each search")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.queries[0], args.docs, args.depth, args.policy,
                             args.search_batch, args.release)))
        return
    knobs = ([f"--search-batch={args.search_batch}"] if args.search_batch else []) + (
        ["--release"] if args.release else [])
    for n in args.queries:  # a fresh process each, so one count's peak is not another's
        subprocess.run([sys.executable, __file__, "--one", "--queries", str(n),
                        "--docs", str(args.docs), "--depth", str(args.depth),
                        "--policy", args.policy, *knobs], check=True)


if __name__ == "__main__":
    main()
