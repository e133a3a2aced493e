"""Zero-shot vs fine-tuned SciFact test nDCG@10 of one encoder under one fine-tuning setting.

How the demo's fine-tuning knobs were chosen (issue 18; figures in benchmarks/RESULTS.md). Reads a
finished demo's canonical SciFact and BM25 negatives, fine-tunes `--encoder` on the train split
with the workflow's own `finetune.train`, and scores both encoders through the workflow's encode,
FAISS and search functions; appends one JSON line to `--out`.

    make demo   # results/datasets/scifact and results/bm25/scifact/negatives.parquet
    .venv/bin/python benchmarks/finetune_settings.py --results results \
        --encoder results/pretrain/bert/encoder --tag cos-t05 \
        --spec '{"pooling": "mean", "similarity": "cosine", "temperature": 0.05, "q_len": 32,
                 "p_len": 64, "group_size": 2, "batch_size": 32, "lr": 2e-4, "epochs": 1}'
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
from retrieval_pretraining import dense_search, encode, evaluate, faiss_index  # noqa: E402
from retrieval_pretraining.finetune.settings import FinetuneSettings  # noqa: E402
from retrieval_pretraining.finetune.train import train  # noqa: E402

# What the demo's rules pass besides the knobs under test (config.yaml finetune, datasets.scifact).
FIXED = {"title": "space", "exclude_self": True, "encode_batch_size": 64, "dtype": "float16",
         "search_depth": 1000, "use_gpu": "auto", "train_queries": None,
         "queries_without_negatives": "pad", "log_every_steps": 1}


def score(encoder: Path, data: Path, knobs: dict, work: Path) -> float:
    npy, ids = work / "shard.npy", work / "shard.ids.parquet"
    encode.encode_corpus_shard(data / "corpus.parquet", encoder, 0, 1, npy, ids, knobs)
    faiss_index.index_shards([npy], [ids], work / "faiss", {"type": "flat"})
    run = work / "test.trec"
    dense_search.dense_run(work / "faiss", encoder, data / "queries-test.parquet", run, "x", knobs)
    measures = {"measures": ["nDCG@10"], "relevance_level": 1}
    return evaluate.evaluate(run, data / "qrels-test.parquet", None, measures)["aggregate"]["nDCG@10"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--encoder", type=Path, required=True)
    parser.add_argument("--spec", type=json.loads, required=True, help="fine-tuning knobs (JSON)")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--out", type=Path, default=Path("finetune_settings.jsonl"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = args.results / "datasets" / "scifact"
    knobs = FIXED | args.spec
    record = {"tag": args.tag, "encoder": str(args.encoder), "spec": args.spec}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        record["zero_shot"] = score(args.encoder, data, knobs, work / "zero")
        record["zero_shot_s"] = round(time.perf_counter() - started, 1)
        started = time.perf_counter()
        # use_gpu is the encoder's knob (the rules pass it to encoding only).
        settings = FinetuneSettings.from_config({k: v for k, v in knobs.items() if k != "use_gpu"})
        train(settings, init=args.encoder, queries=data / "queries-train.parquet",
              qrels=data / "qrels-train.parquet", corpus=data / "corpus.parquet",
              negatives=[args.results / "bm25/scifact/negatives.parquet"], seed=42,
              out=work / "encoder", state_dir=work / "state", metrics_path=work / "metrics.jsonl")
        record["finetune_s"] = round(time.perf_counter() - started, 1)
        records = map(json.loads, (work / "metrics.jsonl").read_text().splitlines())
        losses = [r["loss"] for r in records if "loss" in r]
        record["loss_first_last"] = [losses[0], losses[-1]]
        record["finetuned"] = score(work / "encoder", data, knobs, work / "tuned")
    print(json.dumps(record))
    with args.out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
