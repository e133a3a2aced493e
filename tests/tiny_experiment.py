"""A tiny experiment for the end-to-end test: a BEIR SciFact subset plus config overrides.

The whole demo DAG (dump -> articles -> chunks -> spans -> 5 pre-trained encoders -> BM25 ->
2 fine-tuning stages each -> runs -> metrics -> tables, analyses, span audit, per-stage statistics)
runs in a few minutes on 2 cores because the retrieval side shrinks to a few hundred documents and
pre-training to a handful of steps.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import yaml

DATASET = "scifact-tiny"
SUBSET_DIR = Path("data/beir") / DATASET  # relative to the project copy
SOURCE_DIR = Path(__file__).resolve().parents[1] / "data" / "beir" / "scifact"
DEMO_MODELS = yaml.safe_load((SOURCE_DIR.parents[2] / "config.yaml").read_text())["pretrain"]["models"]
# Pre-trained: one model per rule that needs its own objective (CPDAE: the decoder-words analysis);
# fine-tuned, encoded, searched and tabled: two (the fine-tuning rules do not depend on the objective).
E2E_MODELS = ("bert", "costa", "cpdae")
E2E_FINETUNED = ("bert", "costa")


def _rank(key: str, seed: int = 0) -> str:
    # A stable pseudo-random order: independent of file order, Python's hash seed and time.
    return hashlib.sha1(f"{seed}:{key}".encode()).hexdigest()


def _read_qrels(path: Path) -> dict[str, list[tuple[str, str]]]:
    qrels: dict[str, list[tuple[str, str]]] = {}
    with path.open(newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        next(reader)  # header
        for query_id, doc_id, score in reader:
            qrels.setdefault(query_id, []).append((doc_id, score))
    return qrels


def write_scifact_subset(
    project: Path, train: int | None = 400, test: int = 100, others: int = 300,
    source: Path = SOURCE_DIR,
) -> dict[str, list[str]]:
    """Write a BEIR-format SciFact subset into `project`/data/beir/scifact-tiny/.

    `train` and `test` queries (those with qrels, chosen by a seeded hash of their ids; None: all),
    every one of their positive documents, and `others` further documents (same order). Returns the
    chosen query ids per split and the corpus ids. By default 400 of the 809 training queries, so
    that one short fine-tuning epoch measurably lifts its encoder (all 809 lift nDCG@10 by 0.13 at
    twice the cost), and 100 test queries, so that the lift is measurable (a paired t-test over 30
    queries would rarely see it).
    """
    out = project / SUBSET_DIR
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    chosen: dict[str, list[str]] = {}
    positives: set[str] = set()
    for split, count in (("train", train), ("test", test)):
        qrels = _read_qrels(source / "qrels" / f"{split}.tsv")
        ids = sorted(qrels, key=lambda q: _rank(q))[:count]  # [:None]: all
        chosen[split] = ids
        with (out / "qrels" / f"{split}.tsv").open("w", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
            writer.writerow(["query-id", "corpus-id", "score"])
            for query_id in sorted(ids, key=int):
                for doc_id, score in qrels[query_id]:
                    writer.writerow([query_id, doc_id, score])
                    positives.add(doc_id)

    lines = (source / "corpus.jsonl").read_text().splitlines()
    doc_ids = [json.loads(line)["_id"] for line in lines]
    missing = positives - set(doc_ids)
    assert not missing, f"qrels name documents missing from {source}/corpus.jsonl: {sorted(missing)[:5]}"
    extra = sorted((d for d in doc_ids if d not in positives), key=_rank)[:others]
    keep = positives | set(extra)
    corpus = [(d, line) for d, line in zip(doc_ids, lines) if d in keep]
    (out / "corpus.jsonl").write_text("".join(line + "\n" for _, line in corpus))
    chosen["corpus"] = [d for d, _ in corpus]

    wanted = set(chosen["train"]) | set(chosen["test"])
    queries = [
        line
        for line in (source / "queries.jsonl").read_text().splitlines()
        if json.loads(line)["_id"] in wanted
    ]
    assert len(queries) == len(wanted), "a chosen query is missing from queries.jsonl"
    (out / "queries.jsonl").write_text("".join(line + "\n" for line in queries))
    return chosen


def tiny_overrides() -> dict:
    """Config overrides (merged into the demo config.yaml by workflow_harness.copy_project).

    Lists replace the demo's whole; every reference to the demo's `scifact` entry is redirected to
    the subset so that no job reads the full dataset. Three of the demo's five models are
    pre-trained: BERT (no pre-training: the base encoder's export), COSTA (the span index) and
    CPDAE (the decoder words), so that every rule runs; two of them (BERT, COSTA) are fine-tuned
    and evaluated (`finetune.models`): CPDAE's would be ten more jobs of the same rules. MLM and
    BoW would add jobs of the same rules with other objective settings (their trainers:
    tests/test_pretrain_*.py; the demo's plan of all five:
    test_end_to_end.py::test_the_demo_plans_every_model_through_every_stage).
    """
    split = lambda s: {"dataset": DATASET, "split": s}  # noqa: E731
    return {
        "corpus": {"shards": 1},
        "pretrain": {
            "models": [m for m in DEMO_MODELS if m["name"] in E2E_MODELS],
            "trainer": {
                "global_batch_size": 4,
                "micro_batch_size": 4,
                "max_steps": 4,
                "checkpoint_every": None,
                "num_workers": 0,
            }
        },
        "datasets": [
            {
                "name": DATASET,
                "format": "beir",
                "path": str(SUBSET_DIR),
                "splits": [{"name": "train"}, {"name": "test"}],
                "title": "space",
                "exclude_query_id": True,
            }
        ],
        "bm25": {"negatives": [split("train") | {"source": "bm25", "depth": 50, "count": 8}]},
        "finetune": {
            "models": list(E2E_FINETUNED),
            "datasets": [split("train")],
            "q_len": 16,
            "p_len": 32,
            "group_size": 2,
            "batch_size": 8,
            "train_queries": None,
            "epochs": 1,
            "epochs_mined": 1,
            "encode_batch_size": 128,
            "shards": 1,
        },
        # keep_vectors: the paper-scale disk saver, so that the end-to-end run checks it (shards
        # deleted once indexed, and a second run has nothing to do).
        "mining": {"depth": 50, "num_negatives": 8, "keep_vectors": False},
        # No baselines: the demo's is published on scifact-full, a dataset this experiment lacks.
        "evaluate": {
            "baselines": [],
            "splits": [split("test") | {"measures": ["nDCG@10", "R@100"], "relevance_level": 1}],
        },
        "report": {
            "tables": [
                {
                    "name": "main",
                    "title": "SciFact subset test (end-to-end test)",
                    "columns": [
                        split("test") | {"measure": "nDCG@10", "label": "nDCG@10"},
                        split("test") | {"measure": "R@100", "label": "R@100"},
                    ],
                    "rows": None,
                }
            ],
            # Every analysis rule runs, at a size that adds well under a minute of CPU: t-SNE of
            # 20 candidates, coverage of 8 chunks, the decoder words of one text.
            "analysis": {
                "loss_curves": True,
                "tsne": {
                    "dataset": DATASET,
                    "split": "test",
                    "query": None,
                    "models": ["bert", "costa"],
                    "stage": "stage2",
                    "depth": 20,
                },
                "coverage": {
                    "models": ["costa", "cpdae"],
                    "ks": [1, 5, 10],
                    "samples": 8,
                },
                "cpdae_top_words": {
                    "model": "cpdae",
                    "texts": ["Anarchism is a political philosophy skeptical of authority."],
                    "top": 10,
                },
            },
        },
    }
