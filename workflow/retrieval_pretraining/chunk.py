"""Stage 3: tokenise the articles and cut them into word-aligned chunks of at most max_len tokens.

Rules (each one is a documented decision; see ARCHITECTURE.md):
- Words are WordPiece words: a token starting with the tokenizer's continuation prefix ("##")
  continues the word before it, anything else starts a word (punctuation marks are words of their
  own, as in BERT's whole-word masking). A chunk never starts or ends inside a word.
- Chunks are cut greedily: each chunk holds at most max_len - 2 text tokens ([CLS] and [SEP] added).
  The cut goes at the last paragraph start inside the final `boundary_slack * (max_len - 2)` tokens
  of the window, else at the last sentence start there (a word after ".", "!" or "?"), else at the
  last word start.
- A word longer than the whole window (only possible with a tiny max_len: BERT turns words of more
  than 100 characters into one [UNK]) cannot be placed without splitting it: it is dropped and
  counted.
- The short tail (last chunk of an article with fewer than min_tail_len text tokens), by
  `short_tail`: `rebalance` (default) moves whole words from the end of the previous chunk into the
  tail until it has min_tail_len tokens (so no text is lost and no chunk exceeds max_len); an
  article shorter than min_tail_len stays one short chunk. `drop` drops the tail (and so articles
  shorter than min_tail_len). `keep` keeps it as it is.
- chunk_id = (page_id << 16) + chunk_index; a chunk's shard is page_id % shards, so the chunk set,
  its ids and each chunk's shard depend on neither the process count nor the batch size; rows are
  sorted by chunk_id.
- Literal "[SEP]"/"[CLS]" text in an article is tokenised as text, never as the special token.
- Every row is validated in the stage (in the worker that built it): [CLS] text [SEP] within
  max_len, no special token inside the text, word_starts exactly the text's word-starting tokens,
  chunk_id formed from page_id and chunk_index; after sorting, no chunk_id twice.

Input: article Parquet parts (page_id, text). Output: one Parquet file per shard + a manifest beside
each.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import tempfile
import time
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import artifacts, parallel
from .config import ConfigError, stage_parser

log = logging.getLogger(__name__)

CHUNK_INDEX_BITS = 16  # chunk_id = (page_id << 16) + chunk_index
SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("page_id", pa.int64(), nullable=False),
        pa.field("chunk_index", pa.int32(), nullable=False),
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("word_starts", pa.list_(pa.int32()), nullable=False),
    ]
)
SENTENCE_FINAL = (".", "!", "?")
PARAGRAPH_SPLIT = re.compile(r"\n[ \t\r\f\v]*\n")


@dataclass(frozen=True)
class ChunkConfig:
    """The `corpus` config section: the keys that change the chunks (`processes` only the speed)."""

    checkpoint: str
    max_len: int = 512
    min_tail_len: int = 16
    short_tail: str = "rebalance"
    boundary_slack: float = 0.1
    shards: int = 1

    @classmethod
    def from_dict(cls, section: dict[str, Any]) -> "ChunkConfig":
        known = {k: v for k, v in section.items() if k in cls.__dataclass_fields__}
        cfg = cls(**known)
        if cfg.short_tail not in ("rebalance", "drop", "keep"):
            raise ConfigError(f"corpus.short_tail={cfg.short_tail!r}; use rebalance, drop or keep")
        if not 0 <= cfg.min_tail_len <= cfg.max_len - 2:
            raise ConfigError(
                f"corpus.min_tail_len={cfg.min_tail_len} must lie in "
                f"[0, max_len - 2 = {cfg.max_len - 2}]"
            )
        if not 0 <= cfg.boundary_slack < 1:
            raise ConfigError(f"corpus.boundary_slack={cfg.boundary_slack} must lie in [0, 1)")
        return cfg

    @property
    def budget(self) -> int:
        return self.max_len - 2


# --- the tokenizer --------------------------------------------------------------------------------


def load_tokenizer(checkpoint_dir: str | os.PathLike):
    """The checkpoint's fast tokenizer, without the truncation/padding a saved one may carry."""
    from tokenizers import Tokenizer

    path = Path(checkpoint_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} missing: stage the tokenizer first (rule stage_tokenizer)"
        )
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.encode_special_tokens = True  # "[SEP]" written in an article is text, not a separator
    return tokenizer


def tokens_by_id(vocab: dict[str, int]) -> list[str]:
    """The vocabulary (token -> id, added tokens included) as a list indexed by id."""
    tokens = [""] * (max(vocab.values()) + 1)
    for token, idx in vocab.items():
        tokens[idx] = token
    return tokens


def vocab_sha256(tokens: list[str]) -> str:
    """The vocabulary's fingerprint, recorded in the chunk manifests and checked by pre-training."""
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()


def tokenizer_info(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """Special token ids, the vocabulary in id order, its hash, and a name for manifests."""
    checkpoint_dir = Path(checkpoint_dir)
    spec = json.loads((checkpoint_dir / "tokenizer.json").read_text())
    if spec["model"]["type"] != "WordPiece":
        raise ConfigError(
            f"{checkpoint_dir}/tokenizer.json is a {spec['model']['type']} tokenizer; chunking "
            "needs a "
            "WordPiece (BERT) tokenizer to find word boundaries"
        )
    config_path = checkpoint_dir / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    tokenizer = load_tokenizer(checkpoint_dir)
    tokens = tokens_by_id(tokenizer.get_vocab(with_added_tokens=True))
    source = {}
    if (checkpoint_dir / "manifest.json").is_file():
        source = artifacts.read_json(checkpoint_dir / "manifest.json").get("params", {})
    special = {
        name: tokenizer.token_to_id(tok_config.get(f"{name}_token") or default)
        for name, default in (
            ("cls", "[CLS]"),
            ("sep", "[SEP]"),
            ("pad", "[PAD]"),
            ("unk", "[UNK]"),
            ("mask", "[MASK]"),
        )
    }
    if special["cls"] is None or special["sep"] is None:
        raise ConfigError(f"{checkpoint_dir}: the tokenizer has no [CLS]/[SEP] token")
    return {
        "name": f"{checkpoint_dir.name} ({tok_config.get('tokenizer_class', 'WordPiece')})",
        "source": source.get("location"),
        "vocab_size": len(tokens),
        "vocab_sha256": vocab_sha256(tokens),
        "continuation_prefix": spec["model"].get("continuing_subword_prefix") or "##",
        "special_ids": special,
        "tokens": tokens,
    }


class _Chunker:
    """Per-process state: the tokenizer and the id lookup tables."""

    def __init__(self, checkpoint_dir: str, cfg: ChunkConfig):
        info = tokenizer_info(checkpoint_dir)
        self.cfg = cfg
        self.tokenizer = load_tokenizer(checkpoint_dir)
        self.cls_id = info["special_ids"]["cls"]
        self.sep_id = info["special_ids"]["sep"]
        prefix = info["continuation_prefix"]
        self.continues_word = np.array([t.startswith(prefix) for t in info["tokens"]], dtype=bool)
        self.sentence_final = np.array([t in SENTENCE_FINAL for t in info["tokens"]], dtype=bool)

    def chunk_batch(
        self, page_ids: np.ndarray, texts: Sequence[str | None]
    ) -> tuple[pa.RecordBatch, Counter]:
        """Tokenise a batch of articles and cut them into chunks (arrays over the whole batch)."""
        cfg, stats = self.cfg, Counter()
        paragraphs, para_article = [], []
        for a, text in enumerate(texts):
            pieces = [p for p in PARAGRAPH_SPLIT.split(text or "") if p.strip()]
            paragraphs.extend(pieces)
            para_article.extend([a] * len(pieces))
        # encode_batch_fast: no character offsets (chunking needs ids only), ~25% faster.
        id_lists = [
            e.ids for e in self.tokenizer.encode_batch_fast(paragraphs, add_special_tokens=False)
        ]
        para_len = np.fromiter((len(x) for x in id_lists), np.int64, len(id_lists))
        flat = np.fromiter(itertools.chain.from_iterable(id_lists), np.int32, int(para_len.sum()))
        para_start = np.concatenate([[0], np.cumsum(para_len)])
        # Token ranges of the articles in `flat` (an article without text gets an empty range).
        article_tokens = np.bincount(
            np.asarray(para_article, np.int64), para_len, minlength=len(texts)
        )
        article_start = np.concatenate([[0], np.cumsum(article_tokens)]).astype(np.int64)

        is_word = ~self.continues_word[flat]
        is_para = np.zeros(len(flat) + 1, bool)
        is_para[para_start] = True
        is_sent = np.zeros(len(flat), bool)
        is_sent[1:] = self.sentence_final[flat[:-1]] & is_word[1:]
        words, sents, paras = (
            np.flatnonzero(is_word),
            np.flatnonzero(is_sent),
            np.flatnonzero(is_para),
        )

        starts, ends, owners, indices = [], [], [], []
        for a in range(len(texts)):
            lo, hi = int(article_start[a]), int(article_start[a + 1])
            if hi == lo:
                stats["articles_empty"] += 1
                continue
            spans = plan_chunks(lo, hi, words, sents, paras, cfg, stats)
            starts.extend(s for s, _ in spans)
            ends.extend(e for _, e in spans)
            owners.extend([a] * len(spans))
            indices.extend(range(len(spans)))
        stats["articles"] += len(texts)
        return self._build(page_ids, flat, is_word, starts, ends, owners, indices), stats

    def _build(self, page_ids, flat, is_word, starts, ends, owners, indices) -> pa.RecordBatch:
        cs, ce = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        lengths = ce - cs
        content_off = np.concatenate([[0], np.cumsum(lengths)])
        out_off = np.concatenate([[0], np.cumsum(lengths + 2)])
        step = np.arange(content_off[-1]) - np.repeat(content_off[:-1], lengths)
        src = step + np.repeat(cs, lengths)
        dest = step + np.repeat(out_off[:-1] + 1, lengths)
        out = np.empty(out_off[-1], np.int32)
        out[dest] = flat[src]
        out[out_off[:-1]] = self.cls_id
        out[out_off[1:] - 1] = self.sep_id
        word_mask = is_word[src]
        word_pos = (step + 1)[word_mask].astype(np.int32)
        word_off = np.concatenate([[0], np.cumsum(word_mask)])[content_off]
        page = np.asarray(page_ids, np.int64)[np.asarray(owners, np.int64)]
        index = np.asarray(indices, np.int64)
        if len(index) and index.max() >= 1 << CHUNK_INDEX_BITS:
            raise ValueError(
                f"page {page[index.argmax()]} has more than 65536 chunks; raise max_len"
            )
        return pa.RecordBatch.from_arrays(
            [
                pa.array((page << CHUNK_INDEX_BITS) + index, pa.int64()),
                pa.array(page, pa.int64()),
                pa.array(index, pa.int32()),
                pa.ListArray.from_arrays(pa.array(out_off, pa.int32()), pa.array(out, pa.int32())),
                pa.ListArray.from_arrays(
                    pa.array(word_off, pa.int32()), pa.array(word_pos, pa.int32())
                ),
            ],
            schema=SCHEMA,
        )


def _last_in(positions: np.ndarray, lo: int, hi: int) -> int:
    """The largest value v of sorted `positions` with lo < v <= hi, or -1."""
    i = int(np.searchsorted(positions, hi, side="right")) - 1
    return int(positions[i]) if i >= 0 and positions[i] > lo else -1


def _best_cut(s: int, hi: int, words, sents, paras, slack: int) -> tuple[int, str]:
    """Where to end a chunk starting at s that may end at hi at the latest (and why)."""
    near = max(s, hi - slack - 1)
    for kind, positions in (("paragraph", paras), ("sentence", sents)):
        cut = _last_in(positions, near, hi)
        if cut > 0:
            return cut, kind
    return _last_in(words, s, hi), "word"


def plan_chunks(
    lo: int, hi: int, words, sents, paras, cfg: ChunkConfig, stats: Counter
) -> list[tuple[int, int]]:
    """Cut the tokens [lo, hi) of one article into chunks [(start, end), ...] (batch positions).

    `words`, `sents`, `paras` are the sorted positions where words, sentences and paragraphs start.
    """
    budget, slack = cfg.budget, int(cfg.boundary_slack * cfg.budget)
    chunks: list[tuple[int, int]] = []
    s = lo
    while hi - s > budget:
        cut, kind = _best_cut(s, s + budget, words, sents, paras, slack)
        if cut < 0:  # one word longer than the whole window: drop it rather than split it
            i = int(np.searchsorted(words, s, side="right"))
            nxt = min(int(words[i]), hi) if i < len(words) else hi
            stats["overlong_words_dropped"] += 1
            stats["overlong_tokens_dropped"] += nxt - s
            s = nxt
            continue
        stats[f"cuts_at_{kind}"] += 1
        chunks.append((s, cut))
        s = cut
    if s >= hi:
        return chunks
    if hi - s >= cfg.min_tail_len or cfg.short_tail == "keep":
        chunks.append((s, hi))
    elif cfg.short_tail == "drop":
        stats["short_tails_dropped"] += 1
        stats["short_tail_tokens_dropped"] += hi - s
    elif chunks and chunks[-1][1] == s:  # rebalance with the previous chunk
        prev = chunks[-1][0]
        cut, _ = _best_cut(
            max(prev, hi - budget - 1), hi - cfg.min_tail_len, words, sents, paras, slack
        )
        if cut > prev:
            chunks[-1] = (prev, cut)
            chunks.append((cut, hi))
            stats["short_tails_rebalanced"] += 1
        else:
            chunks.append((s, hi))
            stats["short_tails_kept"] += 1
    else:
        chunks.append((s, hi))
        stats["short_articles_kept"] += 1
    return chunks


# --- validation -----------------------------------------------------------------------------------


def _fail(mask: np.ndarray, chunk_id: np.ndarray, what: str, where: str) -> None:
    """Raise naming the first row of `mask` (rows that break the contract), if any."""
    if mask.any():
        row = int(np.flatnonzero(mask)[0])
        raise ValueError(
            f"{where}: chunk {chunk_id[row]} (row {row}) {what}; this is a bug in chunk.py"
        )


def validate_chunks(
    batch: pa.RecordBatch,
    max_len: int,
    continues_word: np.ndarray,
    special: tuple[int, int],
    where: str,
) -> None:
    """Check every row of a batch against the chunks contract (vectorised).

    [CLS] text [SEP] with 1 <= len(text) <= max_len - 2, no special token inside the text, the
    text starting with a word, chunk_id = (page_id << 16) + chunk_index, and word_starts exactly
    the positions of the text's word-starting tokens (every token that is not a continuation
    piece). The order of rows across batches is checked by `_check_order`.
    """
    if batch.num_rows == 0:
        return
    cls_id, sep_id = special
    chunk_id = batch.column("chunk_id").to_numpy()

    def fail(mask: np.ndarray, what: str) -> None:
        _fail(mask, chunk_id, what, where)

    page_id = batch.column("page_id").to_numpy()
    chunk_index = batch.column("chunk_index").to_numpy().astype(np.int64)
    fail(
        chunk_id != (page_id << CHUNK_INDEX_BITS) + chunk_index,
        "has chunk_id != (page_id << 16) + chunk_index",
    )
    ids, ws = batch.column("input_ids"), batch.column("word_starts")
    off = ids.offsets.to_numpy().astype(np.int64)
    off -= off[0]
    flat = ids.flatten().to_numpy()
    lengths = np.diff(off)
    fail((lengths < 3) | (lengths > max_len), f"has a length outside [3, max_len={max_len}]")
    fail(flat[off[:-1]] != cls_id, "does not start with [CLS]")
    fail(flat[off[1:] - 1] != sep_id, "does not end with [SEP]")
    special_at = np.flatnonzero((flat == cls_id) | (flat == sep_id))
    specials = np.bincount(np.searchsorted(off, special_at, "right") - 1, minlength=len(lengths))
    fail(specials != 2, "holds [CLS]/[SEP] inside its text")

    woff = ws.offsets.to_numpy().astype(np.int64)
    woff -= woff[0]
    counts = np.diff(woff)
    fail(counts == 0, "has no word start")
    wpos = ws.flatten().to_numpy().astype(np.int64)
    fail(wpos[woff[:-1]] != 1, "does not start with a word right after [CLS]")
    # Every text token that is not a continuation piece starts a word, and nothing else does.
    is_start = ~continues_word[flat]
    is_start[off[:-1]] = is_start[off[1:] - 1] = False
    what = "has word_starts that are not exactly its word-starting tokens"
    fail(np.add.reduceat(is_start, off[:-1], dtype=np.int64) != counts, what)
    wrong = np.flatnonzero(wpos + np.repeat(off[:-1], counts) != np.flatnonzero(is_start))
    bad_rows = np.zeros(len(counts), bool)
    bad_rows[np.searchsorted(woff, wrong, "right") - 1] = True
    fail(bad_rows, what)


def _check_order(chunk_id: np.ndarray, where: str) -> None:
    """Rows of a shard, after sorting: chunk ids strictly increasing (no chunk twice)."""
    repeated = np.flatnonzero(np.diff(chunk_id) <= 0)
    if len(repeated):
        page = int(chunk_id[repeated[0]]) >> CHUNK_INDEX_BITS
        raise ValueError(
            f"{where}: duplicate page_id {page}: it occurs more than once in the articles "
            "(the same page in two article parts?)"
        )


# --- the corpus driver ----------------------------------------------------------------------------
# Phase 1: the main process reads batches of articles and hands them out as Arrow batches (cheap to
# send); a worker tokenises, cuts and validates a batch and appends each shard's rows to its own
# spill stream. Only statistics travel back, so the main process stays nearly idle and leaves the
# cores to the tokenizer. Phase 2 (per shard, in the same workers) gathers that shard's streams,
# sorts them by chunk_id, checks that no chunk_id occurs twice and writes the Parquet file.

_WORKER: _Chunker | None = None
_SPILL: _SpillStreams | None = None


class _SpillStreams:
    """This process's spill: one Arrow IPC stream per shard, `<spill_dir>/<pid>-<shard>.arrows`.

    The streams are unbuffered and never closed: a stream without its end marker reads up to the
    end of the file, and every write has returned before the task's statistics reach the main
    process, so phase 2 (which starts after the last result) sees every row.
    """

    def __init__(self, spill_dir: str):
        self.spill_dir = Path(spill_dir)
        self.streams: dict[int, pa.ipc.RecordBatchStreamWriter] = {}

    def write(self, shard: int, batch: pa.RecordBatch) -> None:
        if shard not in self.streams:
            sink = pa.OSFile(str(self.spill_dir / f"{os.getpid()}-{shard:04d}.arrows"), "wb")
            self.streams[shard] = pa.ipc.new_stream(sink, SCHEMA)
        self.streams[shard].write_batch(batch)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()


def _init_worker(checkpoint_dir: str, cfg: ChunkConfig, spill_dir: str) -> None:
    global _WORKER, _SPILL
    _WORKER = _Chunker(checkpoint_dir, cfg)
    _SPILL = _SpillStreams(spill_dir)


def _work(articles: pa.RecordBatch) -> Counter:
    """Phase 1 for one batch of articles: chunk, validate and spill it; return statistics."""
    page_ids = articles.column("page_id").to_numpy(zero_copy_only=False).astype(np.int64)
    batch, stats = _WORKER.chunk_batch(page_ids, articles.column("text").to_pylist())
    # Every row is checked here, in the workers, while the batch is small and in cache.
    validate_chunks(
        batch,
        _WORKER.cfg.max_len,
        _WORKER.continues_word,
        (_WORKER.cls_id, _WORKER.sep_id),
        f"chunks of page_id {page_ids.min()}..{page_ids.max()}" if len(page_ids) else "",
    )
    shard = batch.column("page_id").to_numpy() % _WORKER.cfg.shards
    for i in np.unique(shard):
        _SPILL.write(int(i), batch.filter(pa.array(shard == i)))
    return stats


def _article_batches(paths: Sequence[Path], batch_size: int) -> Iterator[pa.RecordBatch]:
    for path in paths:
        handle = pq.ParquetFile(path)
        missing = {"page_id", "text"} - set(handle.schema_arrow.names)
        if missing:
            raise ValueError(
                f"{path}: articles lack column(s) {sorted(missing)}; re-run extract_articles"
            )
        for batch in handle.iter_batches(batch_size=batch_size, columns=["page_id", "text"]):
            bounds = pc.min_max(batch.column("page_id"))
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is not None and (low < 0 or high >= 1 << (63 - CHUNK_INDEX_BITS)):
                raise ValueError(f"{path}: page_id outside [0, 2**47) cannot form a chunk_id")
            yield batch


def _binned(histogram: np.ndarray, bins: int = 32) -> dict[str, Any]:
    """A length histogram for a manifest: counts of lengths [i * width, (i + 1) * width)."""
    width = max(1, (len(histogram) - 1) // bins)  # max_len 512 -> width 16, 33 bins
    counts = np.add.reduceat(histogram, np.arange(0, len(histogram), width))
    return {"bin_width": width, "counts": counts.tolist(), "max_len_chunks": int(histogram[-1])}


def _read_spill(spill_dir: Path, shard: int) -> pa.Table:
    """All rows spilled for one shard, by every process, in no particular order."""
    parts = []
    for path in sorted(spill_dir.glob(f"*-{shard:04d}.arrows")):
        with pa.memory_map(str(path)) as source:
            parts.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


def _finish_shard(i: int, spill_dir: Path, out: Path, cfg: ChunkConfig) -> dict[str, Any]:
    """Phase 2 for one shard: sort its spilled rows by chunk_id, check the order, write them."""
    table = _read_spill(spill_dir, i)
    table = table.take(pc.sort_indices(table["chunk_id"]))
    _check_order(table["chunk_id"].to_numpy(), str(out))
    lengths = pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False)
    artifacts.write_parquet(out, table, SCHEMA)
    log.info("shard %d: %d chunks -> %s", i, table.num_rows, out)
    return {
        "shard": i,
        "chunks": table.num_rows,
        "tokens": int(lengths.sum()),
        "pages": len(pc.unique(table["page_id"])),
        "length_histogram": np.bincount(lengths, minlength=cfg.max_len + 1).tolist(),
    }


def chunk_corpus(
    article_paths: Sequence[str | os.PathLike],
    checkpoint_dir: str | os.PathLike,
    out_paths: Sequence[str | os.PathLike],
    cfg: ChunkConfig,
    processes: int = 1,
    batch_size: int = 1024,
) -> dict[str, Any]:
    """Chunk all articles into `out_paths` (shard i -> out_paths[i]); return corpus statistics."""
    out_paths = [Path(p) for p in out_paths]
    if len(out_paths) != cfg.shards:
        raise ConfigError(f"{len(out_paths)} output paths given for corpus.shards={cfg.shards}")
    article_paths = sorted(Path(p) for p in article_paths)
    info = tokenizer_info(checkpoint_dir)
    total_articles = sum(pq.ParquetFile(p).metadata.num_rows for p in article_paths)
    stats: Counter = Counter()
    out_paths[0].parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_paths[0].parent, prefix=".chunk-spill.") as spill_dir:
        spill_dir = Path(spill_dir)
        started = time.perf_counter()
        worker_args = (str(checkpoint_dir), cfg, str(spill_dir))
        if processes > 1:
            # spawn: no tokenizer state is inherited; each worker loads its own, single-threaded.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        else:
            _init_worker(*worker_args)
        try:
            with parallel.process_pool(processes, "spawn", _init_worker, worker_args) as pool:
                # Phase 1: chunk batches (in parallel); each process spills its own rows per shard.
                tasks = ((batch,) for batch in _article_batches(article_paths, batch_size))
                results = parallel.bounded_map(_work, tasks, pool, in_flight=2 * processes)
                try:
                    with tqdm(total=total_articles, unit="article", mininterval=10) as progress:
                        for batch_stats in results:
                            stats.update(batch_stats)
                            progress.update(batch_stats["articles"])
                finally:
                    if pool is None:
                        _SPILL.close()
                log.info("phase 1 (tokenise and cut) took %.1f s", time.perf_counter() - started)
                # Phase 2: per shard (in parallel), sort by chunk_id, check for duplicates, write.
                jobs = [(i, spill_dir, out, cfg) for i, out in enumerate(out_paths)]
                shard_stats = list(
                    parallel.bounded_map(_finish_shard, jobs, pool, in_flight=len(jobs))
                )
        except BrokenProcessPool as error:
            raise RuntimeError(
                "a chunking worker process died or failed to start (a worker's error, if it had "
                "one, is printed above; else killed for lack of memory?); nothing was written. "
                "Lower --processes (corpus.processes) or --batch-size and rerun"
            ) from error
        histogram = np.sum([s["length_histogram"] for s in shard_stats], axis=0, dtype=np.int64)
    corpus = dict(stats)
    corpus["chunks"] = int(histogram.sum())
    corpus["tokens"] = int((histogram * np.arange(len(histogram))).sum())
    corpus["text_tokens"] = corpus["tokens"] - 2 * corpus["chunks"]
    corpus["length_histogram"] = _binned(histogram)
    for shard in shard_stats:
        shard["length_histogram"] = _binned(np.asarray(shard["length_histogram"]))
    tokenizer = {k: v for k, v in info.items() if k != "tokens"}
    inputs = {f"articles:{p.name}": p for p in article_paths}
    inputs["tokenizer"] = Path(checkpoint_dir) / "tokenizer.json"
    for out, shard in zip(out_paths, shard_stats):
        artifacts.write_manifest(
            artifacts.manifest_path(out),
            stage="chunk_articles",
            params=asdict(cfg),
            inputs=inputs,
            stats={
                "shard": shard,
                "corpus": corpus,
                "tokenizer": tokenizer,
                "sharding": f"page_id % {cfg.shards}",
                "chunk_id": "(page_id << 16) + chunk_index",
            },
        )
    log.info(
        "chunked %d articles into %d chunks, %d tokens in %.1f s",
        corpus.get("articles", 0),
        corpus["chunks"],
        corpus["tokens"],
        time.perf_counter() - started,
    )
    return corpus


def main() -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--articles", type=Path, nargs="+", required=True, help="article Parquet parts"
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="tokenizer folder (rule stage_tokenizer) or a checkpoint folder",
    )
    parser.add_argument(
        "--out", type=Path, nargs="+", required=True, help="one path per shard, in order"
    )
    parser.add_argument("--processes", type=int, default=1, help="tokenizer processes (speed only)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1024,
        help="articles per task (speed only; small tasks cost the main process ~3 ms each)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    chunk_corpus(
        args.articles,
        args.checkpoint,
        args.out,
        ChunkConfig.from_dict(args.config),
        args.processes,
        args.batch_size,
    )


if __name__ == "__main__":
    main()
