"""Span sampling throughput (chunks/s on one core) and span index size per million chunks.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/span_sampling.py \
        --checkpoint results/checkpoints/minilm-l2

Chunks: SciFact chunked at 512 tokens (real token ids and word structure), tiled with fresh chunk
ids up to `--chunks` rows. Measured: `sample_batch` alone, sampling + the stage's every-row
validation, and the whole stage (`sample_shard`: read, sample, validate, write Parquet + manifest).
Rates are given per wall-clock second and per CPU second of the (single-threaded) process: on a
shared machine the second is the one-core figure.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))


def main() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from retrieval_pretraining import chunk, chunker, spans
    from retrieval_pretraining.contracts.spans import validate_spans

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8192)
    args = parser.parse_args()
    entry = yaml.safe_load((ROOT / "config.yaml").read_text())["spans"][0]
    cfg = spans.SpanConfig.from_dict({**entry, "seed": 42})
    docs = [json.loads(line) for line in (ROOT / "data/beir/scifact/corpus.jsonl").open()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pq.write_table(
            pa.table(
                {
                    "page_id": pa.array([int(d["_id"]) for d in docs], pa.int64()),
                    "text": pa.array([d["title"] + "\n\n" + d["text"] for d in docs]),
                }
            ),
            tmp / "articles.parquet",
        )
        ccfg = chunker.ChunkConfig.from_dict(
            {"checkpoint": "x", "max_len": args.max_len, "min_tail_len": 16, "shards": 1}
        )
        chunk.chunk_corpus(
            [tmp / "articles.parquet"], args.checkpoint, [tmp / "base.parquet"], ccfg
        )
        base = pq.read_table(tmp / "base.parquet", columns=["chunk_id", "input_ids", "word_starts"])
        copies = -(-args.chunks // base.num_rows)
        table = (
            pa.concat_tables(
                [
                    base.set_column(
                        0, "chunk_id", pa.array(base["chunk_id"].to_numpy() + (c << 40))
                    )
                    for c in range(copies)
                ]
            )
            .slice(0, args.chunks)
            .combine_chunks()
        )
        pq.write_table(table, tmp / "shard.parquet")
        mean_len = float(np.mean(np.diff(table["input_ids"].combine_chunks().offsets.to_numpy())))
        words = spans.WordTable(args.checkpoint)
        batches = table.to_batches(max_chunksize=args.batch_size)
        timings = {}
        for label, validate in (("sample_only", False), ("sample_and_validate", True)):
            best, best_cpu = float("inf"), float("inf")
            for _ in range(3):
                t0, c0 = time.perf_counter(), time.process_time()
                for batch in batches:
                    out = spans.sample_batch(batch, cfg, words, {})
                    if validate:
                        validate_spans(out, batch, cfg, words, "bench")
                best = min(best, time.perf_counter() - t0)
                best_cpu = min(best_cpu, time.process_time() - c0)
            timings[f"{label}_chunks_per_s"] = round(table.num_rows / best)
            timings[f"{label}_chunks_per_cpu_s"] = round(table.num_rows / best_cpu)
        t0, c0 = time.perf_counter(), time.process_time()
        spans.sample_shard(
            tmp / "shard.parquet",
            args.checkpoint,
            tmp / "spans.parquet",
            cfg,
            batch_size=args.batch_size,
        )
        timings["whole_stage_chunks_per_s"] = round(table.num_rows / (time.perf_counter() - t0))
        timings["whole_stage_chunks_per_cpu_s"] = round(table.num_rows / (time.process_time() - c0))
        size = (tmp / "spans.parquet").stat().st_size
    print(
        json.dumps(
            {
                "chunks": table.num_rows,
                "mean_chunk_len": round(mean_len, 1),
                "spans_per_granularity": cfg.spans_per_granularity,
                **timings,
                "index_bytes_per_million_chunks": round(size / table.num_rows * 1e6),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
