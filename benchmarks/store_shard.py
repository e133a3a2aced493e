"""Pre-training's data store at paper scale, one shard: what converting its chunk and span files costs.

    .venv/bin/python benchmarks/store_shard.py [--chunks 190000] [--tokens 512] [--work /tmp/store-bench]

A synthetic shard the size of one of paper.yaml's 64 Wikipedia shards (~190k chunks of 512 tokens,
~380 word starts each; COSTA's 20 spans a chunk), written as the chunk stage writes Parquet; then
`pretrain/store.py`'s two conversions of it (what a trainer's process does per file), each in a
subprocess: wall time, peak RSS (psutil, sampled every
20 ms) and the store file's size. Random token ids: the store copies bytes, so their
values do not matter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def write_shard(folder: Path, chunks: int, tokens: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    words = int(tokens * 0.74)  # word starts per chunk (~1.35 tokens a word in Wikipedia)
    spans = 20
    ids = rng.integers(1000, 30000, size=chunks * tokens, dtype=np.int32)

    def lists(values, width):
        return pa.ListArray.from_arrays(np.arange(0, chunks * width + 1, width, dtype=np.int32),
                                        values)

    chunk_ids = np.arange(chunks, dtype=np.int64)
    table = pa.table({"chunk_id": chunk_ids, "input_ids": lists(ids, tokens),
                      "word_starts": lists(np.tile(np.arange(1, 1 + words, dtype=np.int32), chunks),
                                           words)})
    starts = np.tile(np.arange(1, 1 + 2 * spans, 2, dtype=np.int32), chunks)
    span_table = pa.table({
        "chunk_id": chunk_ids, "span_start": lists(starts, spans), "span_end": lists(starts + 1, spans),
        "granularity": lists(np.tile(np.repeat(np.arange(4, dtype=np.int8), spans // 4), chunks),
                             spans)})
    folder.mkdir(parents=True, exist_ok=True)
    chunk_path, span_path = folder / "shard-0000.parquet", folder / "spans-0000.parquet"
    pq.write_table(table, chunk_path, row_group_size=10_000)
    pq.write_table(span_table, span_path, row_group_size=10_000)
    return chunk_path, span_path


def measure(args: list[str]) -> dict:
    env = os.environ | {"PYTHONPATH": str(ROOT / "workflow")}
    started = time.perf_counter()
    code = ("import sys; from retrieval_pretraining.pretrain import store; "
            "(store.write_chunk_file if len(sys.argv) == 3 else store.write_span_file)(*sys.argv[1:])")
    child = psutil.Popen([sys.executable, "-c", code, *args], env=env)
    peak = 0
    while child.poll() is None:
        try:
            peak = max(peak, child.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    if child.returncode:
        raise SystemExit(f"{args} failed with {child.returncode}")
    return {"wall_s": round(time.perf_counter() - started, 2), "peak_rss_mb": round(peak / 2**20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=190_000)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--work", type=Path, default=Path("/tmp/store-bench"))
    args = parser.parse_args()
    chunk_path, span_path = write_shard(args.work, args.chunks, args.tokens)
    results = {"chunks": args.chunks, "tokens": args.tokens,
               "chunk_parquet_mb": round(chunk_path.stat().st_size / 2**20)}
    for name, extra in (("chunk_file", []), ("span_file", [str(span_path)])):
        out = args.work / f"{name}.arrow"
        out.unlink(missing_ok=True)
        results[name] = measure([str(chunk_path), *extra, str(out)]) | {
            "size_mb": round(out.stat().st_size / 2**20)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
