"""What cutting long texts before tokenising buys (`encode.tokenize`, CUT_CHARS_PER_TOKEN).

    .venv/bin/python benchmarks/long_documents.py [--max-len 512] [--batch 64] [--repeats 3]

Documents are SciFact abstracts joined to ~2k, ~7k (MS MARCO documents' average) and ~30k
characters (its long tail); each row tokenises one batch of them at --max-len, as corpus encoding
and document fine-tuning do, whole (the cut disabled) and cut, on one thread: documents per
CPU second of the process, best of --repeats. The ids are checked equal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "workflow"), str(ROOT / "tests")]

from retrieval_pretraining import encode  # noqa: E402


def documents(chars: int, count: int) -> list[str]:
    with open(ROOT / "data/beir/scifact/corpus.jsonl") as handle:
        abstracts = [json.loads(line)["text"] for line in handle]
    docs, i = [], 0
    while len(docs) < count:
        parts = []
        while sum(map(len, parts)) < chars:
            parts.append(abstracts[i % len(abstracts)])
            i += 1
        docs.append(" ".join(parts))
    return docs


def rate(tokenizer, texts: list[str], max_len: int, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        out = encode.tokenize(tokenizer, texts, max_len)
        best = min(best, time.process_time() - start)
    return len(texts) / best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from pretrain_fixtures import tokenizer as load_tokenizer

    tokenizer = load_tokenizer()  # the offline MiniLM's (bert-base-uncased's) WordPiece
    cut_at = encode.CUT_CHARS_PER_TOKEN
    print(f"max_len={args.max_len} batch={args.batch} (documents per CPU second, one thread)")
    print("| document length | whole | cut | gain |")
    print("|---|---:|---:|---:|")
    for chars in (2_000, 7_000, 30_000):
        texts = documents(chars, args.batch)
        encode.CUT_CHARS_PER_TOKEN = 10**9
        whole, a = rate(tokenizer, texts, args.max_len, args.repeats)
        encode.CUT_CHARS_PER_TOKEN = cut_at
        cut, b = rate(tokenizer, texts, args.max_len, args.repeats)
        assert all(torch.equal(a[k], b[k]) for k in a), "the cut changed the ids"
        print(f"| ~{chars:,} characters | {whole:,.0f} | {cut:,.0f} | {cut / whole:.1f}x |")


if __name__ == "__main__":
    main()
