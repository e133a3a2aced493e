"""From chunk (+ span) shards to masked, dynamically padded micro-batches.

* `prepare_store` checks every span shard against its chunk shard (same chunk ids row by row, the
  chunk shard's checksum as recorded in the span manifest, every span inside its chunk) and copies
  the needed columns into uncompressed Arrow IPC files under the run's state folder; `ChunkStore`
  memory-maps them, so DataLoader workers share pages instead of each decoding Parquet.
* The data order is a permutation drawn from (seed, epoch); step s takes the s-th global batch
  of that order and splits it into micro-batches in a fixed way, micro-batch j going to rank
  j % world_size. The set of micro-batches is therefore the same for any number of processes.
* Masking draws from a generator seeded by (seed, epoch, chunk_id, view): no dependence on worker
  order, on the number of workers or on resumption.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from .. import artifacts
from ..errors import BadInput, reading
from ..wordpiece import tokens_by_id, vocab_sha256
from . import views as cuts

log = logging.getLogger(__name__)

CHUNK_COLUMNS = ("chunk_id", "input_ids", "word_starts")
SPAN_COLUMNS = ("span_start", "span_end", "granularity")


class DataError(BadInput, ValueError):
    """The chunk or span shards break their contract; the message names the file, row and fix."""


# ---------------------------------------------------------------- validation + store ------------
def _flat(column: pa.ChunkedArray | pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list<int> column; zero-copy for a plain (not chunked) array."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.offsets.to_numpy(), array.values.to_numpy(zero_copy_only=False)


def check_spans(chunks: pa.Table, spans: pa.Table, chunk_path: Path, span_path: Path) -> None:
    """Raise DataError unless `spans` describes exactly the chunks of `chunks`, each span inside it."""
    if spans.num_rows != chunks.num_rows or not spans["chunk_id"].equals(chunks["chunk_id"]):
        ours = chunks["chunk_id"].to_numpy()
        theirs = spans["chunk_id"].to_numpy()
        n = min(len(ours), len(theirs))
        bad = np.flatnonzero(ours[:n] != theirs[:n])
        row = int(bad[0]) if len(bad) else n
        raise DataError(
            f"span index {span_path} does not match chunk shard {chunk_path}: {spans.num_rows} vs "
            f"{chunks.num_rows} rows, first differing chunk_id at row {row}; rebuild the span index "
            "from these chunks (rule sample_spans)"
        )
    manifest = artifacts.manifest_path(span_path)
    if manifest.exists():
        recorded = [
            entry.get("sha256") for entry in artifacts.read_json(manifest).get("inputs", {}).values()
            if Path(entry.get("path", "")).name == chunk_path.name and entry.get("sha256")
        ]
        actual = artifacts.sha256_file(chunk_path)
        if recorded and actual not in recorded:
            raise DataError(
                f"span index {span_path} was sampled from a different {chunk_path.name} (manifest "
                f"sha256 {recorded[0][:12]}..., file {actual[:12]}...); rebuild the span index"
            )
    lengths = pc.list_value_length(chunks["input_ids"]).to_numpy()
    s_off, starts = _flat(spans["span_start"])
    e_off, ends = _flat(spans["span_end"])
    g_off, _ = _flat(spans["granularity"])
    if not (np.array_equal(s_off, e_off) and np.array_equal(s_off, g_off)):
        raise DataError(f"{span_path}: span_start, span_end and granularity lists differ in length")
    owner = np.repeat(np.arange(len(lengths)), np.diff(s_off))
    # Valid spans cover tokens strictly between [CLS] (position 0) and the final [SEP].
    bad = np.flatnonzero((starts < 1) | (ends <= starts) | (ends > lengths[owner] - 1))
    if len(bad):
        i = int(bad[0])
        row = int(owner[i])
        raise DataError(
            f"{span_path} row {row} (chunk_id {chunks['chunk_id'][row].as_py()}): span "
            f"[{starts[i]}, {ends[i]}) lies outside the chunk's tokens [1, {lengths[row] - 1}) "
            f"({len(bad)} bad spans in the file); rebuild the span index from these chunks"
        )


def check_tokenizer(chunk_paths: Sequence[str | Path], tokenizer: Any, checkpoint: Path) -> None:
    """Raise DataError if the chunks were tokenised with another vocabulary than the model's.

    The chunk manifests record the fingerprint of the corpus tokenizer (`corpus.checkpoint`); the
    model is `pretrain.checkpoint`. Different vocabularies would train on meaningless ids.
    """
    ours = vocab_sha256(tokens_by_id(tokenizer.get_vocab()))
    for path in map(Path, chunk_paths):
        manifest = artifacts.manifest_path(path)
        if not manifest.exists():
            continue
        recorded = artifacts.read_json(manifest).get("stats", {}).get("tokenizer", {})
        if recorded.get("vocab_sha256") not in (None, ours):
            raise DataError(
                f"{path} was tokenised with {recorded.get('name')} (vocabulary "
                f"{recorded['vocab_sha256'][:12]}...), but the model {checkpoint} has vocabulary "
                f"{ours[:12]}...: set corpus.checkpoint and pretrain.checkpoint to checkpoints "
                "with the same tokenizer"
            )


def prepare_store(
    chunk_paths: Sequence[str | Path],
    span_paths: Sequence[str | Path] | None,
    cache_dir: str | Path,
) -> list[Path]:
    """Validate and copy the shards into memory-mappable Arrow IPC files (cached by checksum)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    if span_paths is not None and len(span_paths) != len(chunk_paths):
        raise DataError(f"{len(chunk_paths)} chunk shards but {len(span_paths)} span shards")
    out = []
    for i, chunk_path in enumerate(map(Path, chunk_paths)):
        span_path = Path(span_paths[i]) if span_paths is not None else None
        key = artifacts.sha256_file(chunk_path)[:16]
        if span_path is not None:
            key += "-" + artifacts.sha256_file(span_path)[:16]
        target = cache_dir / f"{chunk_path.stem}-{key}.arrow"
        out.append(target)
        if target.exists():
            continue
        with reading(chunk_path, "a chunks Parquet file"):
            chunks = pq.read_table(chunk_path, columns=list(CHUNK_COLUMNS), memory_map=True)
        if span_path is not None:
            with reading(span_path, "a span index Parquet file"):
                spans = pq.read_table(span_path, columns=["chunk_id", *SPAN_COLUMNS],
                                      memory_map=True)
            check_spans(chunks, spans, chunk_path, span_path)
            for name in SPAN_COLUMNS:
                chunks = chunks.append_column(name, spans[name])
        table = chunks.combine_chunks()
        with artifacts.atomic_path(target) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
    return out


class ChunkStore:
    """Random access to rows of the memory-mapped IPC files, as numpy views; nothing is copied.

    Each record batch of each file stays where it is mapped (a part); a global row (file order,
    then row order, as if the files were concatenated) is found through the parts' cumulative row
    counts. Concatenating them instead would copy the whole corpus into every worker's memory.
    """

    def __init__(self, paths: Sequence[Path]):
        readers = [pa.ipc.open_file(pa.memory_map(str(p))) for p in paths]
        parts = [r.get_batch(i) for r in readers for i in range(r.num_record_batches)]
        parts = [part for part in parts if part.num_rows]
        if not parts:
            raise DataError(f"no chunks in {list(map(str, paths))}")
        self.has_spans = all("span_start" in r.schema.names for r in readers)
        names = CHUNK_COLUMNS[1:] + (SPAN_COLUMNS if self.has_spans else ())
        # starts[k] = global row of part k's first row; starts[-1] = number of rows.
        self._starts = np.cumsum([0] + [part.num_rows for part in parts])
        self._chunk_ids = [part.column("chunk_id").to_numpy() for part in parts]
        self._cols = {name: [_flat(part.column(name)) for part in parts] for name in names}
        self.max_spans = max(
            int(np.diff(offsets).max()) for offsets, _ in self._cols["span_start"]
        ) if self.has_spans else 0

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(part, row within the part) of each global row."""
        part = np.searchsorted(self._starts, rows, side="right") - 1
        return part, rows - self._starts[part]

    def all_chunk_ids(self) -> np.ndarray:
        """The chunk id of every row, in row order."""
        return np.concatenate(self._chunk_ids)

    def chunk_ids(self, rows: np.ndarray) -> np.ndarray:
        part, local = self._locate(np.asarray(rows, dtype=np.int64))
        return np.array([self._chunk_ids[p][r] for p, r in zip(part, local)], dtype=np.int64)

    def get(self, name: str, row: int) -> np.ndarray:
        part, local = self._locate(np.int64(row))
        offsets, values = self._cols[name][int(part)]
        return values[offsets[local]:offsets[local + 1]]


# ---------------------------------------------------------------- order + masking ---------------
def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


@dataclasses.dataclass(frozen=True)
class Vocab:
    """What masking and bag-of-words targets need to know about the tokenizer."""

    size: int
    mask_id: int
    pad_id: int
    excluded: np.ndarray  # ids never used as bag targets or random replacements ([CLS], [unused12], ...)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "Vocab":
        vocab = tokenizer.get_vocab()
        excluded = set(tokenizer.all_special_ids)
        # The BoW authors' filter: special ids and BERT's [unusedN] placeholders.
        excluded |= {i for tok, i in vocab.items() if tok.startswith("[unused")}
        return cls(size=len(vocab), mask_id=tokenizer.mask_token_id, pad_id=tokenizer.pad_token_id,
                   excluded=np.array(sorted(excluded), dtype=np.int64))

    @functools.cached_property
    def replacements(self) -> np.ndarray:
        """The ids a masked position may be replaced by at random: every id but the excluded ones."""
        return np.setdiff1d(np.arange(self.size, dtype=np.int64), self.excluded)


def mask_tokens(
    ids: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator, vocab: Vocab,
    rate: float, whole_word: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of one chunk: select ~rate of its inner tokens; 80% [MASK], 10% a random id
    (never an excluded one: `Vocab.replacements`), 10% kept.

    Returns (masked ids, labels with -100 where nothing is predicted). With `whole_word`, whole
    words (from `word_starts`; a word ends where the next begins or at the final [SEP]) are
    selected in random order while they fit in the budget of round(rate * tokens) tokens.
    """
    ids = ids.astype(np.int64)
    n_inner = len(ids) - 2
    labels = np.full(len(ids), -100, dtype=np.int64)
    if n_inner <= 0:
        return ids.copy(), labels
    budget = max(1, int(round(rate * n_inner)))
    if whole_word and len(word_starts):
        ends = np.append(word_starts[1:], len(ids) - 1)
        chosen: list[int] = []
        for w in rng.permutation(len(word_starts)):
            width = int(ends[w] - word_starts[w])
            if len(chosen) + width > budget:
                continue
            chosen.extend(range(int(word_starts[w]), int(ends[w])))
            if len(chosen) >= budget:
                break
        positions = np.array(sorted(chosen), dtype=np.int64)
    else:
        positions = np.sort(rng.choice(np.arange(1, n_inner + 1), size=budget, replace=False))
    masked = ids.copy()
    labels[positions] = ids[positions]
    action = rng.random(len(positions))
    masked[positions[action < 0.8]] = vocab.mask_id
    random_pos = positions[(action >= 0.8) & (action < 0.9)]
    # A random [CLS]/[SEP]/[PAD]/[unusedN] would be a corruption BERT never sees at fine-tuning.
    masked[random_pos] = vocab.replacements[rng.integers(0, len(vocab.replacements), size=len(random_pos))]
    return masked, labels


def bag_of_ids(ids: np.ndarray, vocab: Vocab) -> np.ndarray:
    """The set of token ids a text contains, minus special and [unused] ids (BoW / CPDAE targets)."""
    unique = np.unique(ids.astype(np.int64))
    return unique[~np.isin(unique, vocab.excluded)]


def _pad(rows: list[np.ndarray], value: int, width: int | None = None) -> torch.Tensor:
    width = width if width is not None else max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), value, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return torch.from_numpy(out)


# ---------------------------------------------------------------- micro-batches ------------------
class MicroBatches(torch.utils.data.Dataset):
    """Item k = this rank's k-th micro-batch (step k // accumulation), collated and padded.

    Index range [start_step * accumulation, total_steps * accumulation): resuming at a step is
    just starting the index there.
    """

    def __init__(
        self, store_paths: Sequence[Path], *, vocab: Vocab, seed: int, global_batch_size: int,
        micro_batch_size: int, rank: int, world_size: int, mask_rate: float, whole_word: bool,
        views: int = 1, need_spans: bool = False, need_bags: bool = False,
        need_original: bool = False, holdout: int = 0, segment_pairs: bool = False,
        span_tokens: int | None = None, decoder_mask_rate: float | None = None,
    ):
        self.store_paths = list(store_paths)
        self._store: ChunkStore | None = None
        self.vocab, self.seed = vocab, seed
        self.global_batch_size, self.micro_batch_size = global_batch_size, micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.accumulation = global_batch_size // (micro_batch_size * world_size)
        self.mask_rate, self.whole_word, self.views = mask_rate, whole_word, views
        self.need_spans, self.need_bags, self.need_original = need_spans, need_bags, need_original
        # coCondenser: each chunk becomes two segments (the two views); enhanced decoding: each
        # decoder row's visible positions (views.py).
        self.segment_pairs, self.span_tokens = segment_pairs, span_tokens
        self.decoder_mask_rate = decoder_mask_rate
        n = len(self.store)
        if holdout >= n:
            raise DataError(f"trainer.probe_chunks {holdout} leaves none of the {n} chunks to "
                            "train on; lower it")
        self.holdout_rows = held_out_rows(self.store.all_chunk_ids(), holdout, seed)
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its training order)
        self.steps_per_epoch = (n - len(self.holdout_rows)) // global_batch_size
        if self.steps_per_epoch == 0:
            raise DataError(
                f"{n - len(self.holdout_rows)} chunks cannot fill one global batch of "
                f"{global_batch_size}; lower trainer.global_batch_size (or probe_chunks) or add data"
            )
        if need_spans and not self.store.has_spans:
            raise DataError("this objective needs span shards (model entry 'spans'), none given")
        self.total_steps = 0  # set by the trainer

    @property
    def store(self) -> ChunkStore:
        # Opened lazily so that each DataLoader worker maps the files itself.
        if self._store is None:
            self._store = ChunkStore(self.store_paths)
        return self._store

    def __len__(self) -> int:
        return self.total_steps * self.accumulation

    def mean_bag_size(self, sample: int = 1000) -> float:
        """Mean number of distinct (non-special) ids per chunk over the first `sample` chunks."""
        rows = range(min(sample, len(self.store)))
        return float(np.mean([len(bag_of_ids(self.store.get("input_ids", r), self.vocab)) for r in rows]))

    def rows_for(self, step: int, micro: int) -> np.ndarray:
        """Store rows of micro-batch `micro` (0..accumulation-1) of this rank at optimiser `step`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self.training_order(epoch)
        batch = order[within * self.global_batch_size:(within + 1) * self.global_batch_size]
        j = micro * self.world_size + self.rank
        return batch[j * self.micro_batch_size:(j + 1) * self.micro_batch_size]

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        step, micro = divmod(k, self.accumulation)
        batch = self.collate(self.rows_for(step, micro), epoch=step // self.steps_per_epoch)
        return batch | {"step": torch.tensor(step)}

    def training_order(self, epoch: int) -> np.ndarray:
        """Every store row but the held-out ones, in epoch `epoch`'s order (kept for the epoch:
        drawing a permutation of ~12M rows per micro-batch would cost more than the batch)."""
        if self._order is None or self._order[0] != epoch:
            order = epoch_order(len(self.store), self.seed, epoch)
            if len(self.holdout_rows):
                order = order[~np.isin(order, self.holdout_rows)]
            self._order = (epoch, order)
        return self._order[1]

    def probe_batches(self) -> list[dict[str, torch.Tensor]]:
        """The held-out chunks as micro-batches, masked as in epoch 0 (the same every time)."""
        rows = self.holdout_rows
        size = self.micro_batch_size
        return [self.collate(rows[i:i + size], epoch=0) for i in range(0, len(rows), size)]

    def collate(self, rows: np.ndarray, epoch: int) -> dict[str, torch.Tensor]:
        """One padded batch of the given store rows, masked from (seed, epoch, chunk_id, view)."""
        store = self.store
        originals = [store.get("input_ids", r) for r in rows]
        words = [store.get("word_starts", r) for r in rows]
        chunk_ids = store.chunk_ids(rows)
        texts = [list(zip(originals, words))] * self.views
        if self.segment_pairs:  # view v = segment v of every chunk
            pairs = [cuts.segment_pair(ids, ws, self._rng(epoch, cid, cuts.SEGMENTS), self.span_tokens)
                     for ids, ws, cid in zip(originals, words, chunk_ids)]
            texts = [[pair[v] for pair in pairs] for v in range(2)]
        masked, labels = [], []
        for view, view_texts in enumerate(texts):  # stacked: [view 0 of all items, view 1 of all, ...]
            for (ids, ws), cid in zip(view_texts, chunk_ids):
                rng = self._rng(epoch, cid, view)
                m, l = mask_tokens(ids, ws, rng, self.vocab, self.mask_rate, self.whole_word)
                masked.append(m)
                labels.append(l)
        input_ids = _pad(masked, self.vocab.pad_id)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (_pad([np.ones(len(m)) for m in masked], 0)).bool().long(),
            "labels": _pad(labels, -100),
            "chunk_ids": torch.from_numpy(chunk_ids.astype(np.int64)),
            "n_tokens": torch.tensor(sum(len(m) for m in masked)),
        }
        if self.need_original:
            batch["original_ids"] = _pad(originals, self.vocab.pad_id)
        if self.need_spans:
            width = store.max_spans  # same on every rank, so span tensors can be all-gathered
            starts = [store.get("span_start", r) for r in rows]
            batch["span_start"] = _pad(starts, 1, width)
            batch["span_end"] = _pad([store.get("span_end", r) for r in rows], 2, width)
            batch["span_mask"] = _pad([np.ones(len(s)) for s in starts], 0, width).bool()
        if self.need_bags:
            bags = [bag_of_ids(ids, self.vocab) for ids in originals]
            batch["bag_ids"] = _pad(bags, 0)
            batch["bag_mask"] = _pad([np.ones(len(b)) for b in bags], 0).bool()
        if self.decoder_mask_rate is not None:
            batch |= self._decoder_inputs(originals, words, chunk_ids, epoch)
        return batch

    def _rng(self, epoch: int, chunk_id: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch, int(chunk_id), stream])

    def _decoder_inputs(self, originals, words, chunk_ids, epoch: int) -> dict[str, torch.Tensor]:
        """Enhanced decoding's targets (every inner token of the unmasked chunk) and each row's
        visible positions [B, L, L] (padding rows see [CLS] only, so no softmax is empty)."""
        width = max(len(ids) for ids in originals)
        visible = np.zeros((len(originals), width, width), dtype=bool)
        visible[:, :, 0] = True
        targets = []
        for b, (ids, ws, cid) in enumerate(zip(originals, words, chunk_ids)):
            n = len(ids)
            visible[b, :n, :n] = cuts.decoder_visibility(
                n, ws, self._rng(epoch, cid, cuts.DECODER), self.decoder_mask_rate, self.whole_word)
            target = ids.astype(np.int64)
            target[[0, n - 1]] = -100  # [CLS] and [SEP] are not reconstructed
            targets.append(target)
        return {"decoder_visible": torch.from_numpy(visible), "decoder_labels": _pad(targets, -100)}


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection on uint64 that scrambles every bit, on whole arrays."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def held_out_rows(chunk_ids: np.ndarray, count: int, seed: int) -> np.ndarray:
    """The store rows of `count` chunks set aside for the probes: those with the smallest hash of
    (seed, chunk_id), so the choice depends on neither shard order nor process count. Sorted."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    salt = _splitmix(np.array([seed ^ 0x9B0BE], dtype=np.uint64))
    keys = _splitmix(salt ^ chunk_ids.astype(np.uint64))
    return np.sort(np.argsort(keys, kind="stable")[:count]).astype(np.int64)


def data_checksums(paths: Sequence[str | Path]) -> dict[str, dict[str, str]]:
    """sha256 of each shard and of its manifest, recorded in training.json."""
    out = {}
    for path in map(Path, paths):
        entry = {"sha256": artifacts.sha256_file(path)}
        manifest = artifacts.manifest_path(path)
        if manifest.exists():
            entry["manifest_sha256"] = artifacts.sha256_file(manifest)
        out[str(path)] = entry
    return out
