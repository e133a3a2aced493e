"""BM25 batch search: our `retrieval_pretraining.bm25 search` vs Anserini's own SearchCollection.

Same Lucene index (SciFact, title + " " + text), same queries (SciFact claims, `--splits`), same
depth (1000), same threads, same k1/b, query id excluded in both. Each side is timed as a whole
command (process start, JVM start, reading queries, searching, writing the run), alternating the
order, `--repeats` times; the median is reported, with the in-process search time of ours too.
The two runs are compared hit by hit (ids and scores) so the timing compares equal work.

    .venv/bin/python benchmarks/bm25_vs_searchcollection.py [--threads 2] [--repeats 3] [--splits test]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

import polars as pl  # noqa: E402

from retrieval_pretraining import artifacts, bm25, datasets  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from shipped_data import SCIFACT_DATASET  # noqa: E402

SCIFACT = SCIFACT_DATASET


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def read_run(path: Path) -> dict[str, list[tuple[str, str]]]:
    runs: dict[str, list[tuple[str, str]]] = {}
    for line in path.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        runs.setdefault(qid, []).append((doc, score))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--splits", nargs="+", default=["test"], help="SciFact query splits (train test)"
    )
    args = parser.parse_args()
    settings = {
        "k1": 0.9,
        "b": 0.4,
        "title": "space",
        "threads": args.threads,
        "index_threads": args.threads,
        "depth": args.depth,
    }
    env = dict(os.environ, PYTHONPATH=str(ROOT / "workflow"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        datasets.prepare(SCIFACT, tmp / "data")
        queries = pl.concat(
            [pl.read_parquet(tmp / "data" / f"queries-{s}.parquet") for s in args.splits]
        )
        queries.write_parquet(tmp / "queries.parquet")
        with open(tmp / "topics.tsv", "w") as handle:
            for qid, text in queries.iter_rows():
                handle.write(f"{qid}\t{text}\n")
        bm25.build_index(tmp / "data" / "corpus.parquet", tmp / "index", settings)

        ours = [
            sys.executable,
            "-m",
            "retrieval_pretraining.bm25",
            "search",
            "--index",
            str(tmp / "index"),
            "--queries",
            str(tmp / "queries.parquet"),
            "--exclude-query-id",
            "--out",
            str(tmp / "ours.trec"),
            "--config",
            json.dumps(settings),
        ]
        anserini = bm25.java_command(
            "io.anserini.search.SearchCollection",
            "-index",
            str(tmp / "index"),
            "-topics",
            str(tmp / "topics.tsv"),
            "-topicReader",
            "TsvString",
            "-output",
            str(tmp / "anserini.trec"),
            "-bm25",
            "-bm25.k1",
            "0.9",
            "-bm25.b",
            "0.4",
            "-hits",
            str(args.depth),
            "-threads",
            str(args.threads),
            "-removeQuery",
        )
        times: dict[str, list[float]] = {"ours": [], "anserini": []}
        inner: list[float] = []
        for repeat in range(args.repeats):
            order = [("ours", ours), ("anserini", anserini)]
            for name, command in order if repeat % 2 == 0 else order[::-1]:
                times[name].append(timed(command, env))
                print(f"{name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
                if name == "ours":
                    inner.append(
                        artifacts.read_json(tmp / "ours.manifest.json")["stats"]["search_seconds"]
                    )

        ours_run, theirs = read_run(tmp / "ours.trec"), read_run(tmp / "anserini.trec")
        # SearchCollection's -removeQuery drops the query's own id after ranking (then 999 hits);
        # we search one deeper instead. Compare the common prefix of every ranking.
        same = sum(
            ours_run.get(q, [])[: len(hits)] == hits
            or ours_run.get(q, [])[: len(hits) - 1] == hits[:-1]
            for q, hits in theirs.items()
        )
    result = {
        "queries": queries.height,
        "depth": args.depth,
        "threads": args.threads,
        "ours_s": round(statistics.median(times["ours"]), 2),
        "ours_in_process_search_s": round(statistics.median(inner), 2),
        "searchcollection_s": round(statistics.median(times["anserini"]), 2),
        "all_ours_s": [round(t, 2) for t in times["ours"]],
        "all_searchcollection_s": [round(t, 2) for t in times["anserini"]],
        "identical_rankings": f"{same}/{len(theirs)}",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    }
    result["ratio"] = round(result["ours_s"] / result["searchcollection_s"], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
