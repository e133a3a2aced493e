"""Stage 4: the COSTA span index: T spans per granularity per chunk, stored as (start, end) only.

Rules (each one is a documented decision; see ARCHITECTURE.md):
- Positions index the chunk's input_ids; a span [start, end) lies inside the text tokens 1 .. n (n =
  len - 2), never on [CLS]/[SEP]. Spans are sampled on the unmasked chunk; masking happens later, in
  the trainer.
- word: one whole word (all its WordPiece pieces), drawn uniformly among the chunk's eligible words.
  A word is not eligible when it is punctuation (no letter or digit), a special token, or a stop
  word: spaCy's English list, plus the pieces its contractions break into under BERT's punctuation
  split ("n't" -> "n", "t"; "'ve" -> "ve"). No eligible word in the chunk: no word span (counted).
- phrase/sentence/paragraph: length = round(p * (lmax - lmin) + lmin), p ~ Beta(alpha, beta),
  rounding half up, so lmin and lmax are both reachable, each with half a bin of probability. The
  length is drawn exactly from that discrete law by inverse CDF. Start ~ Uniform{1 .. n - length +
  1}.
- Spans are drawn independently (with replacement): the T spans of a granularity may repeat.
- A drawn length longer than the chunk's text (n), by `short_chunk`: `clip` shortens it to n (the
  span is the whole text); `skip` drops that span; `resample` redraws it from the length law
  conditioned on fitting (exact inverse CDF, the same as rejection sampling), and skips it when even
  lmin does not fit. Each case is counted per granularity in the manifest.
- Randomness: a counter-based generator (SplitMix64) keyed by (seed, chunk_id): the u-th uniform of
  a chunk depends on nothing else, so the index is byte-identical for any shard or process count,
  and a whole batch of chunks is sampled with NumPy array operations.

Every batch is checked against these rules by the span index contract's validator
(contracts/spans/) before the shard is written. lengths.png and sample.md are span_audit.py's (rule
audit_spans), which this module does not import: editing the audit reruns no span sampling.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.stats import beta as beta_law
from tqdm import tqdm

from . import artifacts
from .config import ConfigError, refuse_unknown, section_schema, stage_parser
from .contracts.chunks import word_extents
from .contracts.columns import flat
from .contracts.spans import GRANULARITIES, SCHEMA, validate_spans
from .errors import InputFileError, command, expect_section, reading
from .wordpiece import load_tokenizer, tokenizer_info

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpanConfig:
    """One entry of the `spans` config list, plus the global seed."""

    name: str
    seed: int
    spans_per_granularity: int = 5
    beta_alpha: float = 4.0
    beta_beta: float = 2.0
    short_chunk: str = "clip"
    granularities: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> "SpanConfig":
        if "seed" not in entry:
            raise ConfigError(
                f"spans entry {entry.get('name')!r}: add the global `seed` to its slice"
            )
        schema = section_schema("spans")["items"]
        schema["properties"]["seed"] = {}  # the global seed, added by the rule
        refuse_unknown(entry, schema, "spans")
        cfg = cls(**{k: v for k, v in entry.items() if k in cls.__dataclass_fields__})
        if cfg.short_chunk not in ("clip", "skip", "resample"):
            raise ConfigError(
                f"spans[{cfg.name}].short_chunk={cfg.short_chunk!r}; use clip, skip or resample"
            )
        for g in GRANULARITIES[1:]:
            spec = cfg.granularities.get(g, {"enabled": False})
            if spec.get("enabled") and not 1 <= spec["min_len"] <= spec["max_len"]:
                raise ConfigError(
                    f"spans[{cfg.name}].granularities.{g}: need 1 <= min_len <= max_len, got {spec}"
                )
        return cfg

    def enabled(self, g: str) -> bool:
        return bool(self.granularities.get(g, {}).get("enabled"))

    def bounds(self, g: str) -> tuple[int, int]:
        spec = self.granularities[g]
        return int(spec["min_len"]), int(spec["max_len"])


def length_cdf(lmin: int, lmax: int, alpha: float, beta: float) -> np.ndarray:
    """P(length <= k), k = lmin..lmax, for length = floor(p * (lmax - lmin) + lmin + 0.5)."""
    if lmax == lmin:
        return np.ones(1)
    k = np.arange(lmin, lmax + 1)
    cdf = beta_law.cdf(np.minimum((k + 0.5 - lmin) / (lmax - lmin), 1.0), alpha, beta)
    cdf[-1] = 1.0
    return cdf


# --- counter-based randomness ---------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection on uint64 with good avalanche), on whole arrays."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def chunk_keys(seed: int, chunk_ids: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(_mix(np.full(len(chunk_ids), seed, np.uint64)) ^ chunk_ids.astype(np.uint64))


def uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1), one per (chunk key, counter) pair: shape (len(keys), len(counters))."""
    with np.errstate(over="ignore"):
        x = _mix(keys[:, None] + (counters[None, :].astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# --- word eligibility -----------------------------------------------------------------------------


def _spacy_stop_words() -> set[str]:
    """spaCy's English STOP_WORDS, read from its file: importing spaCy itself takes seconds."""
    import importlib.util

    spec = importlib.util.find_spec("spacy")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("spaCy is not installed; install requirements.txt")
    path = Path(list(spec.submodule_search_locations)[0]) / "lang" / "en" / "stop_words.py"
    module_spec = importlib.util.spec_from_file_location("_spacy_en_stop_words", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return set(module.STOP_WORDS)


# The stems BERT's split leaves of negated auxiliaries ("don't" -> don ' t): fragments of stop
# words (do, is, ...) that are no word of their own. "won" (won't) and "haven" (haven't) are not
# here: both are common words in their own right.
NEGATED_STEMS = frozenset({
    "don", "doesn", "didn", "isn", "wasn", "aren", "weren", "couldn", "wouldn", "shouldn",
    "hasn", "hadn", "mustn", "needn", "mightn", "shan",
})


def stop_words() -> set[str]:
    """spaCy's English stop words, what BERT's punctuation split leaves of its contractions ("n't"
    -> "n", "t"), and the stems of negated auxiliaries (NEGATED_STEMS)."""
    STOP_WORDS = _spacy_stop_words()

    words = set(STOP_WORDS) | NEGATED_STEMS
    for word in STOP_WORDS:
        for piece in word.replace("’", "'").replace("‘", "'").split("'"):
            if piece:
                words.add(piece)
    return words


class WordTable:
    """Token-id lookups that decide, for whole arrays of words, which ones a word span may be."""

    def __init__(self, checkpoint_dir: str | os.PathLike):
        info = tokenizer_info(checkpoint_dir)
        tokens, prefix = info["tokens"], info["continuation_prefix"]
        special = {i for i in info["special_ids"].values() if i is not None}
        tokenizer = load_tokenizer(checkpoint_dir)
        special |= {
            tokenizer.token_to_id(t.content) for t in tokenizer.get_added_tokens_decoder().values()
        }
        stops = stop_words()
        self.vocab_sha256 = info["vocab_sha256"]
        self.bad_first = np.array(
            [
                i in special or t.startswith(prefix) or not any(c.isalnum() for c in t)
                for i, t in enumerate(tokens)
            ],
            dtype=bool,
        )
        self.stop_single = np.array([t.lower() in stops for t in tokens], dtype=bool)
        # Stop words that are one word of several pieces ("hereupon" -> here ##up ##on).
        patterns = set()
        for word in stops:
            for variant in (word, word.capitalize(), word.upper()):
                ids = tokenizer.encode(variant, add_special_tokens=False).ids
                if len(ids) > 1 and all(tokens[i].startswith(prefix) for i in ids[1:]):
                    patterns.add(tuple(ids))
        self.patterns = sorted(patterns)
        self.pattern_first = np.zeros(len(tokens), bool)
        self.pattern_first[[p[0] for p in self.patterns]] = True

    def eligible(self, ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Per word (absolute start in `ids`, length in pieces): may it be a word span?"""
        first = ids[starts]
        ok = ~self.bad_first[first] & ~((lengths == 1) & self.stop_single[first])
        multi = np.flatnonzero(lengths > 1)
        multi = multi[self.pattern_first[first[multi]]]  # the few words that may be a pattern
        for pattern in self.patterns:
            cand = multi[(lengths[multi] == len(pattern)) & (first[multi] == pattern[0])]
            for j, piece in enumerate(pattern[1:], 1):
                cand = cand[ids[starts[cand] + j] == piece]
            ok[cand] = False
        return ok


# --- sampling -------------------------------------------------------------------------------------


def sample_batch(
    batch: pa.RecordBatch | pa.Table, cfg: SpanConfig, words: WordTable, stats: dict
) -> pa.RecordBatch:
    """Sample the spans of a batch of chunks (NumPy over the whole batch)."""
    chunk_ids = batch.column("chunk_id").to_numpy()
    ids, ids_off = flat(batch.column("input_ids"))
    word_pos, word_off = flat(batch.column("word_starts"))
    n_chunks, T = len(chunk_ids), cfg.spans_per_granularity
    n = np.diff(ids_off) - 2
    u = uniforms(chunk_keys(cfg.seed, chunk_ids), np.arange(len(GRANULARITIES) * T * 2))
    u = u.reshape(n_chunks, len(GRANULARITIES), T, 2)
    start = np.zeros((n_chunks, len(GRANULARITIES), T), np.int64)
    length = np.zeros_like(start)
    valid = np.zeros(start.shape, bool)
    for g, name in enumerate(GRANULARITIES):
        if not cfg.enabled(name):
            continue
        s = stats.setdefault(name, {"spans": 0, "clipped": 0, "skipped": 0, "resampled": 0})
        if name == "word":
            w_start, w_len, w_row = word_extents(ids_off, word_pos, word_off)
            elig = np.flatnonzero(words.eligible(ids, w_start, w_len))
            count = np.bincount(w_row[elig], minlength=n_chunks)
            has = count > 0
            if len(elig):
                first = np.cumsum(count) - count
                pick = first[:, None] + (u[:, g, :, 0] * count[:, None]).astype(np.int64)
                pick = elig[np.minimum(pick, len(elig) - 1)]  # rows without a word: dropped below
                start[:, g] = w_start[pick] - ids_off[:-1][:, None]
                length[:, g] = w_len[pick]
            valid[:, g] = has[:, None]
            s["skipped"] += int((~has).sum()) * T
            s["chunks_without_eligible_word"] = s.get("chunks_without_eligible_word", 0) + int(
                (~has).sum()
            )
        else:
            lmin, lmax = cfg.bounds(name)
            cdf = length_cdf(lmin, lmax, cfg.beta_alpha, cfg.beta_beta)
            ul = u[:, g, :, 0]
            drawn = lmin + np.searchsorted(cdf, ul, side="right")
            fits = drawn <= n[:, None]
            if cfg.short_chunk == "clip":
                ln, ok = np.minimum(drawn, n[:, None]), np.ones_like(fits)
                s["clipped"] += int((~fits).sum())
            elif cfg.short_chunk == "skip":
                ln, ok = drawn, fits
                s["skipped"] += int((~fits).sum())
            else:
                # Exactly the law conditioned on fitting, by inverse CDF: u * P(length <= n) is
                # uniform on [0, P(length <= n)). (Redrawing from the uniform that failed, which
                # lies above P(length <= n), piled the lengths up next to n.) A chunk that holds
                # lmax gets its unconditioned draw, unchanged.
                room = n >= lmin
                top = cdf[np.clip(n - lmin, 0, len(cdf) - 1)]  # P(length <= n)
                ln = lmin + np.searchsorted(cdf, ul * top[:, None], side="right")
                ok = fits | room[:, None]
                s["resampled"] += int((~fits & room[:, None]).sum())
                s["skipped"] += int((~ok).sum())
            valid[:, g] = ok
            length[:, g] = ln
            start[:, g] = 1 + (u[:, g, :, 1] * np.maximum(n[:, None] - ln + 1, 1)).astype(np.int64)
        s["spans"] += int(valid[:, g].sum())
    gran = np.broadcast_to(np.arange(len(GRANULARITIES), dtype=np.int8)[None, :, None], start.shape)
    keep = valid.reshape(n_chunks, -1)
    off = np.concatenate([[0], np.cumsum(keep.sum(1))]).astype(np.int32)
    s0 = start.reshape(n_chunks, -1)[keep].astype(np.int32)
    e0 = (start + length).reshape(n_chunks, -1)[keep].astype(np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(chunk_ids, pa.int64()),
            pa.ListArray.from_arrays(pa.array(off), pa.array(s0)),
            pa.ListArray.from_arrays(pa.array(off), pa.array(e0)),
            pa.ListArray.from_arrays(pa.array(off), pa.array(gran.reshape(n_chunks, -1)[keep])),
        ],
        schema=SCHEMA,
    )


# --- the stage ------------------------------------------------------------------------------------


CHUNK_MANIFEST = "a chunk shard's manifest"


def _chunk_corpus(chunks_path: Path) -> dict[str, Any] | None:
    """The corpus name and source the chunk shard's manifest records (None without one)."""
    manifest = artifacts.manifest_path(chunks_path)
    if not manifest.is_file():
        return None
    params = artifacts.read_manifest(manifest, CHUNK_MANIFEST)["params"]
    corpus = {k: v for k, v in params.items() if k in ("name", "source", "dataset", "path")}
    return corpus or None


def sample_shard(
    chunks_path: str | os.PathLike,
    checkpoint_dir: str | os.PathLike,
    out: str | os.PathLike,
    cfg: SpanConfig,
    batch_size: int = 8192,
) -> dict[str, Any]:
    """Sample and validate the span index of one chunks shard; write it and its manifest."""
    words = WordTable(checkpoint_dir)
    chunk_manifest = artifacts.manifest_path(chunks_path)
    if chunk_manifest.is_file():
        recorded = artifacts.read_manifest(chunk_manifest, CHUNK_MANIFEST)
        tokenizer = expect_section(recorded, "stats.tokenizer", chunk_manifest, CHUNK_MANIFEST)
        expected = tokenizer.get("vocab_sha256")
        if expected is None:
            raise InputFileError(
                f"{chunk_manifest}: records no stats.tokenizer.vocab_sha256, as {CHUNK_MANIFEST} "
                "does; re-run chunk_articles to rebuild the shard and its manifest")
        if expected != words.vocab_sha256:
            raise InputFileError(
                f"{chunks_path} was tokenised with another vocabulary than {checkpoint_dir}; "
                "re-run chunk_articles with this checkpoint"
            )
    with reading(chunks_path, "a chunks Parquet file"):
        handle = pq.ParquetFile(chunks_path)
    stats: dict[str, Any] = {}
    batches, lengths = [], {g: [] for g in GRANULARITIES}
    columns = ["chunk_id", "input_ids", "word_starts"]
    for chunks in tqdm(
        handle.iter_batches(batch_size=batch_size, columns=columns),
        total=-(-handle.metadata.num_rows // batch_size),
        unit="batch",
        mininterval=10,
    ):
        spans = sample_batch(chunks, cfg, words, stats)
        validate_spans(spans, chunks, cfg, words, str(out))
        batches.append(spans)
        g, _ = flat(spans.column("granularity"))
        ln = flat(spans.column("span_end"))[0] - flat(spans.column("span_start"))[0]
        for i, name in enumerate(GRANULARITIES):
            lengths[name].append(ln[g == i])
    table = pa.Table.from_batches(batches, schema=SCHEMA)
    artifacts.write_parquet(out, table, SCHEMA)
    for name, parts in lengths.items():
        if name in stats:
            ln = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            stats[name].update(
                mean_length=float(ln.mean()) if len(ln) else None,
                min_length=int(ln.min()) if len(ln) else None,
                max_length=int(ln.max()) if len(ln) else None,
                length_histogram={
                    int(k): int(v) for k, v in zip(*np.unique(ln, return_counts=True))
                },
            )
    stats = {
        "chunks": table.num_rows,
        "granularities": stats,
        "tokenizer_vocab_sha256": words.vocab_sha256,
        # Which corpus these chunks are (name and source), as their manifest records it.
        "corpus": _chunk_corpus(chunks_path),
    }
    params = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    artifacts.write_manifest(
        artifacts.manifest_path(out),
        stage="sample_spans",
        params=params,
        inputs={"chunks": chunks_path},
        stats=stats,
    )
    log.info(
        "%s: %d chunks, %s",
        out,
        table.num_rows,
        {g: v["spans"] for g, v in stats["granularities"].items()},
    )
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("command", choices=["sample"])
    parser.add_argument("--chunks", type=Path, nargs="+", required=True, help="chunks shard")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="tokenizer folder (rule stage_tokenizer) or a checkpoint folder",
    )
    parser.add_argument("--out", type=Path, help="the span index shard to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = SpanConfig.from_dict(args.config)
    if len(args.chunks) != 1 or args.out is None:
        parser.error("sample takes one --chunks shard and --out")
    sample_shard(args.chunks[0], args.checkpoint, args.out, cfg)


if __name__ == "__main__":
    main()
