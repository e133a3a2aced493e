"""Chunking throughput (text tokens/s) against the raw batch throughput of the same fast tokenizer.

    .venv/bin/python benchmarks/chunk_throughput.py \
        --checkpoint results/checkpoints/minilm-l2 [--copies 3]

Text: the SciFact corpus (real prose, title + abstract as two paragraphs), `--copies` times with
distinct page ids. The raw limit is the tokenizer alone on exactly the paragraphs chunk.py
tokenises, with the tokenizer's own (Rayon) threads and its fastest batch call
(`encode_batch_fast`, ids without offsets, as chunk.py uses). Chunking is the whole stage
(`chunk_corpus`: read, tokenise, cut, validate, spill, sort, write) with worker processes, spawn
start-up included. `--copies 24` (41.7M tokens) amortises the ~0.5 s start-up as a paper-scale run
does; `--copies 8` (13.9M) still shows it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

RAW = """
import sys, time, pyarrow.parquet as pq
sys.path.insert(0, {workflow!r})
from retrieval_pretraining import chunker, wordpiece
tok = wordpiece.load_tokenizer({checkpoint!r})
texts = pq.read_table({articles!r})["text"].to_pylist()
paragraphs = [p for t in texts for p in chunker.PARAGRAPH_SPLIT.split(t) if p.strip()]
best = 0.0
for _ in range(2):
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(paragraphs), 4096):
        batch = paragraphs[i:i + 4096]
        n += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
    best = max(best, n / (time.perf_counter() - t0))
print(n, best)
"""


def raw_throughput(checkpoint: Path, articles: Path, threads: int) -> tuple[int, float]:
    env = dict(
        os.environ,
        RAYON_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="true" if threads > 1 else "false",
    )
    code = RAW.format(
        workflow=str(ROOT / "workflow"), checkpoint=str(checkpoint), articles=str(articles)
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    tokens, rate = out.stdout.split()
    return int(tokens), float(rate)


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from retrieval_pretraining import chunk, chunker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-len", type=int, nargs="+", default=[512, 128])
    args = parser.parse_args()
    docs = [json.loads(line) for line in (ROOT / "data/beir/scifact/corpus.jsonl").open()]
    with tempfile.TemporaryDirectory() as tmp:
        articles = Path(tmp) / "articles.parquet"
        rows = [
            (c * 10**8 + int(d["_id"]), d["title"] + "\n\n" + d["text"])
            for c in range(args.copies)
            for d in docs
        ]
        pq.write_table(
            pa.table(
                {
                    "page_id": pa.array([r[0] for r in rows], pa.int64()),
                    "text": pa.array([r[1] for r in rows], pa.large_string()),
                }
            ),
            articles,
        )
        results = {"articles": len(rows)}
        for threads in (1, args.processes):
            tokens, rate = raw_throughput(args.checkpoint, articles, threads)
            results[f"raw_{threads}_threads_tokens_per_s"] = round(rate)
        results["text_tokens"] = tokens
        for max_len in args.max_len:
            cfg = chunker.ChunkConfig.from_dict(
                {"checkpoint": "x", "max_len": max_len, "min_tail_len": 16, "shards": 4}
            )
            outs = [Path(tmp) / f"m{max_len}" / f"shard-{i:04d}.parquet" for i in range(4)]
            t0 = time.perf_counter()
            stats = chunk.chunk_corpus(
                [articles], args.checkpoint, outs, cfg, processes=args.processes
            )
            seconds = time.perf_counter() - t0
            rate = stats["text_tokens"] / seconds
            results[f"max_len_{max_len}"] = {
                "seconds": round(seconds, 2),
                "chunks": stats["chunks"],
                "text_tokens_per_s": round(rate),
                "ratio_to_raw": round(
                    rate / results[f"raw_{args.processes}_threads_tokens_per_s"], 3
                ),
                "tokens_dropped": stats["text_tokens"] - tokens,
            }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
