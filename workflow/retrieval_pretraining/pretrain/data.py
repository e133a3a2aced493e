"""From the data store (store.py: chunk and span shards, checked and memory-mapped) to masked,
dynamically padded micro-batches.

* The data order is a permutation drawn from (seed, epoch); step s takes the s-th global batch
  of that order and splits it into micro-batches in a fixed way, micro-batch j going to rank
  j % world_size. The set of micro-batches is therefore the same for any number of processes.
* Masking draws from a generator seeded by (seed, epoch, chunk_id, view, corpus), a key of fixed
  width (`MicroBatches._rng`): no dependence on worker order, on the number of workers or on
  resumption.
* A mixture of corpora (`corpora` with proportions): every global batch holds a fixed quota of
  each corpus (the proportions times the batch, largest remainders rounded up, at least one each),
  the k-th step taking the k-th slice of each corpus's own (seed, epoch, corpus) order; the batch
  is then shuffled from (seed, step) so every micro-batch mixes. Quotas are the same every step,
  so where each corpus stands at step s is a function of s: resuming stays exact. Chunk ids of two
  corpora may coincide, so masks and held-out hashes of corpus c > 0 also key on c.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .. import artifacts
from ..errors import InputFileError, expect_positive_int, expect_section
from ..wordpiece import position_limit, tokens_by_id, vocab_sha256
from . import views as cuts
from .masking import Vocab, bag_of_ids, mask_tokens, with_positions  # noqa: F401 (also data.Vocab etc.)
from .mixture import DataError, quotas
from .store import ChunkStore, StoreFile

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- validation ------------------
CHUNK_MANIFEST = "a chunk shard's manifest"


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
        recorded = expect_section(artifacts.read_manifest(manifest, CHUNK_MANIFEST),
                                  "stats.tokenizer", manifest, CHUNK_MANIFEST)
        _check_commit(path, recorded, checkpoint)
        theirs = recorded.get("vocab_sha256")
        if theirs is not None and not isinstance(theirs, str):  # its [:12] below: a TypeError
            raise InputFileError(
                f"{manifest}: stats.tokenizer.vocab_sha256 is {json.dumps(theirs)}, not a "
                f"vocabulary fingerprint (a hex string, read as {CHUNK_MANIFEST}); rebuild it "
                "with the stage that writes it, or fix the path")
        if theirs not in (None, ours):
            raise DataError(
                f"{path} was tokenised with {recorded.get('name')} (vocabulary "
                f"{theirs[:12]}...), but the model {checkpoint} has vocabulary "
                f"{ours[:12]}...: set corpus.checkpoint and pretrain.checkpoint to checkpoints "
                "with the same tokenizer"
            )


def check_positions(chunk_paths: Sequence[str | Path], checkpoint: Path) -> None:
    """Raise DataError if the chunks may be longer than the model can encode.

    The chunk manifests record `max_len`; a model with fewer positions would fail at the first
    forward (a device-side assert on CUDA) after the data store is built, not here.
    """
    limit = position_limit(checkpoint)
    for path in map(Path, chunk_paths):
        manifest = artifacts.manifest_path(path)
        if limit is None or not manifest.exists():
            continue
        max_len = expect_positive_int(
            artifacts.read_manifest(manifest, CHUNK_MANIFEST)["params"].get("max_len"),
            "params.max_len", manifest, CHUNK_MANIFEST)
        if max_len is not None and max_len > limit:
            raise DataError(
                f"{path} holds chunks of up to {max_len} tokens, but the model {checkpoint} has "
                f"max_position_embeddings {limit}: re-chunk the corpus with corpus.max_len <= "
                f"{limit}, or pre-train a checkpoint with more positions"
            )


def _check_commit(path: Path, recorded: dict[str, Any], checkpoint: Path) -> None:
    """Raise DataError if the chunks' tokenizer was staged from another Hub commit of the same
    repository than the checkpoint: an unpinned entry (`revision: null`) resolves `main` once in
    stage_tokenizer and again in stage_checkpoint, which may fall on either side of an upload."""
    manifest = Path(checkpoint) / "manifest.json"
    if not manifest.is_file():
        return
    staged = artifacts.read_manifest(manifest, "a staged checkpoint's manifest")
    location = staged["params"].get("location")
    commit = staged["stats"].get("resolved_revision")
    theirs = recorded.get("revision")
    if recorded.get("source") == location and None not in (commit, theirs) and commit != theirs:
        raise DataError(
            f"{path} was tokenised with {location} at commit {theirs}, but the checkpoint "
            f"{checkpoint} was staged from commit {commit}: pin the checkpoint entry's `revision` "
            "to one commit and rerun stage_tokenizer and stage_checkpoint"
        )


def objective_inputs(settings: dict[str, Any]) -> dict[str, Any]:
    """The `MicroBatches` keywords a model's resolved settings decide: what its batches hold
    (masking, views, spans, bags, originals, segments, decoder inputs). The trainer and
    benchmarks/input_pipeline.py build their datasets from it."""
    objective = settings["objective"]
    return {
        "mask_rate": settings["mlm"]["mask_rate"], "whole_word": settings["mlm"]["whole_word"],
        "views": 2 if objective in ("cpdae", "cpdae_r") else 1,
        "need_spans": objective == "costa",
        "need_bags": objective in ("cpdae", "cpdae_r", "bow"),
        "need_original": (objective == "costa" and settings["costa"]["span_pass"] == "unmasked"
                          or objective in ("retromae", "ar_decoder")),
        "segment_pairs": objective == "cocondenser",
        "span_tokens": settings.get("cocondenser", {}).get("span_tokens"),
        "decoder_mask_rate": settings["retromae"]["decoder_mask_rate"]
        if objective == "retromae" else None,
        "copy_mask_rate": settings["ae_decoder"]["mask_rate"] if objective == "ae_decoder" else None,
    }


# ---------------------------------------------------------------- order ----------------------
def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


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
        self, store_files: Sequence[StoreFile], *, vocab: Vocab, seed: int, global_batch_size: int,
        micro_batch_size: int, rank: int, world_size: int, mask_rate: float, whole_word: bool,
        views: int = 1, need_spans: bool = False, need_bags: bool = False,
        need_original: bool = False, holdout: int = 0,
        corpus_files: Sequence[int] | None = None, proportions: Sequence[float] | None = None,
        segment_pairs: bool = False, span_tokens: int | None = None,
        decoder_mask_rate: float | None = None, copy_mask_rate: float | None = None,
    ):
        """`store_files` (one per shard) of one corpus, or of several in turn: `corpus_files` says
        how many shards each has, `proportions` its share of every global batch (a mixture)."""
        self.store_files = list(store_files)
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
        self.copy_mask_rate = copy_mask_rate  # AE decoder: a second masked copy (its own draw)
        n = len(self.store)
        if holdout >= n:
            raise DataError(f"trainer.probe_chunks {holdout} leaves none of the {n} chunks to "
                            "train on; lower it")
        files = list(corpus_files) if corpus_files else [len(self.store_files)]
        if sum(files) != len(self.store_files) or (proportions is not None
                                                  and len(proportions) != len(files)):
            raise DataError(f"{len(self.store_files)} files for corpora of {files} files and "
                            f"proportions {proportions}")
        rows = np.cumsum([0] + self.store.file_rows)
        # bounds[c]..bounds[c + 1]: corpus c's store rows.
        self.bounds = rows[np.cumsum([0] + files)]
        self.mixed = len(files) > 1
        self.holdout_rows = held_out_rows(self.store.all_chunk_ids(), holdout, seed,
                                          self.corpus_of(np.arange(n)) if self.mixed else None)
        self._order: dict[int, tuple[int, np.ndarray]] = {}  # corpus -> (epoch, its order)
        self.steps_per_epoch = (n - len(self.holdout_rows)) // global_batch_size
        if self.steps_per_epoch == 0:
            raise DataError(
                f"{n - len(self.holdout_rows)} chunks cannot fill one global batch of "
                f"{global_batch_size}; lower trainer.global_batch_size (or probe_chunks) or add data"
            )
        self.quotas = quotas(proportions or [1.0] * len(files), global_batch_size)
        # Steps per pass over each corpus (one corpus: the epoch itself).
        self.corpus_steps = [self.steps_per_epoch] if not self.mixed else [
            int(self._train_rows(c).size // q) for c, q in enumerate(self.quotas)]
        if min(self.corpus_steps) == 0:
            c = int(np.argmin(self.corpus_steps))
            raise DataError(f"corpus {c} has {self._train_rows(c).size} chunks to train on, fewer "
                            f"than its {self.quotas[c]} per global batch; lower its proportion")
        if need_spans and not self.store.has_spans:
            raise DataError("this objective needs span shards (model entry 'spans'), none given")
        self.total_steps = 0  # set by the trainer

    @property
    def store(self) -> ChunkStore:
        # Opened lazily so that each DataLoader worker maps the files itself.
        if self._store is None:
            self._store = ChunkStore(self.store_files)
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        """What a DataLoader worker receives where it is not forked (spawn; forkserver, Python
        3.14's default on Linux): the store's paths, not its pages (pickling the mapped columns
        would copy the corpus, ~50 GB at Wikipedia's size, into every worker)."""
        return self.__dict__ | {"_store": None, "_order": {}}

    def __len__(self) -> int:
        return self.total_steps * self.accumulation

    def mean_bag_size(self, sample: int = 1000) -> float:
        """Mean number of distinct (non-special) ids per chunk over the first `sample` chunks."""
        rows = range(min(sample, len(self.store)))
        return float(np.mean([len(bag_of_ids(self.store.get("input_ids", r), self.vocab)) for r in rows]))

    def corpus_of(self, rows: np.ndarray) -> np.ndarray:
        """The corpus (index into the mixture) of each store row."""
        return np.searchsorted(self.bounds, rows, side="right") - 1

    def _train_rows(self, corpus: int) -> np.ndarray:
        rows = np.arange(self.bounds[corpus], self.bounds[corpus + 1])
        return rows[~np.isin(rows, self.holdout_rows)]

    def global_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(store rows, the epoch each row's corpus is in) of the global batch of `step`."""
        rows, epochs = [], []
        for c, quota in enumerate(self.quotas):
            epoch, within = divmod(step, self.corpus_steps[c])
            rows.append(self.training_order(epoch, c)[within * quota:(within + 1) * quota])
            epochs.append(np.full(quota, epoch))
        if not self.mixed:
            return rows[0], epochs[0]
        shuffle = np.random.default_rng([self.seed, step, 0x313C]).permutation(self.global_batch_size)
        return np.concatenate(rows)[shuffle], np.concatenate(epochs)[shuffle]

    def _micro(self, batch: np.ndarray, micro: int) -> np.ndarray:
        j = micro * self.world_size + self.rank
        return batch[j * self.micro_batch_size:(j + 1) * self.micro_batch_size]

    def rows_for(self, step: int, micro: int) -> np.ndarray:
        """Store rows of micro-batch `micro` (0..accumulation-1) of this rank at optimiser `step`."""
        return self._micro(self.global_batch(step)[0], micro)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        step, micro = divmod(k, self.accumulation)
        rows, epochs = (self._micro(part, micro) for part in self.global_batch(step))
        batch = self.collate(rows, epoch=epochs)
        return batch | {"step": torch.tensor(step)}

    def training_order(self, epoch: int, corpus: int = 0) -> np.ndarray:
        """Every store row of `corpus` but the held-out ones, in epoch `epoch`'s order (kept for
        the epoch: drawing a permutation of ~12M rows per micro-batch would cost more than the
        batch). One corpus: its order is drawn from (seed, epoch) alone, as it always was."""
        if corpus not in self._order or self._order[corpus][0] != epoch:
            low, high = int(self.bounds[corpus]), int(self.bounds[corpus + 1])
            if self.mixed:
                order = low + np.random.default_rng([self.seed, epoch, 0x5EED, corpus]).permutation(
                    high - low)
            else:
                order = epoch_order(len(self.store), self.seed, epoch)
            if len(self.holdout_rows):
                order = order[~np.isin(order, self.holdout_rows)]
            self._order[corpus] = (epoch, order)
        return self._order[corpus][1]

    def probe_batches(self) -> list[dict[str, torch.Tensor]]:
        """The held-out chunks as batches of near-equal size (at most micro_batch_size), masked as
        in epoch 0 (the same every time). Near-equal, not a remainder batch: span retrieval and
        view agreement choose among their batch's texts, and 2 candidates (32 chunks in 10s) make
        an easier task than 10."""
        rows = self.holdout_rows
        if not len(rows):
            return []
        parts = -(-len(rows) // self.micro_batch_size)
        return [self.collate(part, epoch=0) for part in np.array_split(rows, parts)]

    def collate(self, rows: np.ndarray, epoch: int | np.ndarray) -> dict[str, torch.Tensor]:
        """One padded batch of the given store rows, masked from (seed, epoch, chunk_id, view,
        corpus) (`_rng`); `epoch` for all rows or per row."""
        store = self.store
        originals = [store.get("input_ids", r) for r in rows]
        words = [store.get("word_starts", r) for r in rows]
        chunk_ids = store.chunk_ids(rows)
        epochs = np.broadcast_to(np.asarray(epoch, dtype=np.int64), (len(rows),))
        corpora = self.corpus_of(np.asarray(rows, dtype=np.int64)) if self.mixed \
            else np.zeros(len(rows), dtype=np.int64)
        keys = list(zip(epochs, chunk_ids, corpora))  # what every random draw of a row is keyed by
        texts = [list(zip(originals, words))] * self.views
        if self.segment_pairs:  # view v = segment v of every chunk
            pairs = [cuts.segment_pair(ids, ws, self._rng(key, cuts.SEGMENTS), self.span_tokens)
                     for ids, ws, key in zip(originals, words, keys)]
            texts = [[pair[v] for pair in pairs] for v in range(2)]
        masked, labels = [], []
        for view, view_texts in enumerate(texts):  # stacked: [view 0 of all items, view 1 of all, ...]
            for (ids, ws), key in zip(view_texts, keys):
                rng = self._rng(key, view)
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
            batch |= self._decoder_inputs(originals, words, keys)
        if self.copy_mask_rate is not None:
            copies = [mask_tokens(ids, ws, self._rng(key, cuts.COPY), self.vocab, self.copy_mask_rate,
                                  self.whole_word) for ids, ws, key in zip(originals, words, keys)]
            batch["decoder_input_ids"] = _pad([c[0] for c in copies], self.vocab.pad_id)
            batch["decoder_labels"] = _pad([c[1] for c in copies], -100)
        return with_positions(batch)

    def _rng(self, key: tuple, stream: int) -> np.random.Generator:
        """A row's generator for one stream (a view's masking, coCondenser's segments, the
        decoder's mask), from (seed, epoch, chunk_id, stream, corpus of the mixture).

        The key has a fixed width of 32-bit words: NumPy splits an int >= 2**32 into several words
        and pads a key shorter than 4 with zeros, so a variable-length key made (corpus 1, chunk p,
        view 1) and (corpus 0, chunk (1 << 32) | p, view 1) draw the same mask."""
        epoch, chunk_id, corpus = (int(k) for k in key)
        return np.random.default_rng([self.seed, epoch, chunk_id & 0xFFFFFFFF, chunk_id >> 32,
                                      stream, corpus])

    def _decoder_inputs(self, originals, words, keys) -> dict[str, torch.Tensor]:
        """Enhanced decoding's targets (every inner token of the unmasked chunk) and each row's
        visible positions [B, L, L] (padding rows see [CLS] only, so no softmax is empty)."""
        width = max(len(ids) for ids in originals)
        visible = np.zeros((len(originals), width, width), dtype=bool)
        visible[:, :, 0] = True
        targets = []
        for b, (ids, ws, key) in enumerate(zip(originals, words, keys)):
            n = len(ids)
            visible[b, :n, :n] = cuts.decoder_visibility(
                n, ws, self._rng(key, cuts.DECODER), self.decoder_mask_rate, self.whole_word)
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


def held_out_rows(chunk_ids: np.ndarray, count: int, seed: int,
                  corpora: np.ndarray | None = None) -> np.ndarray:
    """The store rows of `count` chunks set aside for the probes: those with the smallest hash of
    (seed, chunk_id) (and of the corpus c for a mixture's rows of c > 0), so the choice depends on
    neither shard order nor process count. Sorted."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    salt = _splitmix(np.array([seed ^ 0x9B0BE], dtype=np.uint64))
    keys = _splitmix(salt ^ chunk_ids.astype(np.uint64))
    if corpora is not None:
        other = corpora > 0
        keys[other] = _splitmix(keys[other] ^ corpora[other].astype(np.uint64))
    return np.sort(np.argsort(keys, kind="stable")[:count]).astype(np.int64)


def data_checksums(paths: Sequence[str | Path]) -> dict[str, dict[str, str]]:
    """sha256 of each shard and of its manifest, recorded in training.json."""
    out = {}
    for path in map(Path, paths):
        entry = {"sha256": artifacts.sha256_once(path)}
        manifest = artifacts.manifest_path(path)
        if manifest.exists():
            entry["manifest_sha256"] = artifacts.sha256_file(manifest)
        out[str(path)] = entry
    return out
