"""Peak memory of BM25 negatives (bm25.mine_negatives, source bm25, filter qrels) by query count,
and a hash of the Parquet file and the manifest's stats, so that two versions can be compared.

    PYTHONPATH=workflow .venv/bin/python benchmarks/negatives_memory.py [--queries 20000] \
        [--workflow DIR]   # DIR: another checkout's workflow/ (the code measured)

The Lucene search is replaced by a stand-in that yields `--depth` hits a query (fresh id strings,
as batch_search's are), so the figure is mine_negatives' own memory, not the JVM's; 1 to 3 of a
query's positives are among its hits. Peak anonymous memory (RssAnon) that the call added,
sampled every 2 ms, in a fresh process per run.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import memory_probe

MEASURE = """
import hashlib, types
import polars as pl
import pyarrow as pa
from retrieval_pretraining import artifacts, bm25, datasets
folder, queries, depth = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
qids = [f"q{i}" for i in range(queries)]
pl.DataFrame({"query_id": qids, "text": ["x"] * queries}).write_parquet(folder / "q.parquet")
pos = [(q, f"d{(i * 7 + k * 1_000_003) % 9_000_000}") for i, q in enumerate(qids)
       for k in range(1 + i % 3)]
artifacts.write_parquet(folder / "qrels.parquet", pa.table(
    {"query_id": [q for q, _ in pos], "doc_id": [d for _, d in pos], "relevance": [1] * len(pos)}),
    datasets.QRELS_SCHEMA)

def fake_search(search, frame, depth, threads, exclude_query_id, batch_size=10000):
    for i, qid in enumerate(frame["query_id"].to_list()):
        hits = [(f"d{(i * 7 + j * 1_000_003) % 9_000_000}", 1.0 / (j + 1)) for j in range(depth)]
        yield qid, hits

bm25.searcher = lambda index, k1, b: None
bm25.batch_search = fake_search
config = {"negatives": {"source": "bm25", "depth": depth, "count": 30, "seed": 3}}
out = folder / "negatives.parquet"
peak_kb, stats = peak_anon_kb(lambda: bm25.mine_negatives(
    folder / "q.parquet", folder / "qrels.parquet", out, config, index=folder))
print(json.dumps({"peak_kb": peak_kb, "stats": stats, "parquet_sha256":
                  hashlib.sha256(out.read_bytes()).hexdigest()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--workflow", type=Path, default=ROOT / "workflow")
    args = parser.parse_args()
    memory_probe.WORKFLOW = args.workflow.resolve()
    with tempfile.TemporaryDirectory() as folder:
        try:
            result = memory_probe.run(MEASURE, folder, args.queries, args.depth,
                                      env=memory_probe.HELD_ONLY)
        except subprocess.CalledProcessError as error:
            sys.exit(error.stderr)
    stats = json.dumps(result["stats"], sort_keys=True).encode()
    print(json.dumps({"queries": args.queries, "depth": args.depth,
                      "peak_anon_mb": round(result["peak_kb"] / 1024, 1),
                      "parquet_sha256": result["parquet_sha256"][:16],
                      "stats_sha256": hashlib.sha256(stats).hexdigest()[:16],
                      "stats": result["stats"]}))


if __name__ == "__main__":
    main()
