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
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.stats import beta as beta_law
from tqdm import tqdm

from . import artifacts
from .chunk import load_tokenizer, tokenizer_info
from .config import ConfigError, stage_parser

log = logging.getLogger(__name__)

GRANULARITIES = ("word", "phrase", "sentence", "paragraph")
SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("span_start", pa.list_(pa.int32()), nullable=False),
        pa.field("span_end", pa.list_(pa.int32()), nullable=False),
        pa.field("granularity", pa.list_(pa.int8()), nullable=False),
    ]
)


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


def stop_words() -> set[str]:
    STOP_WORDS = _spacy_stop_words()

    words = set(STOP_WORDS)
    for (
        word
    ) in STOP_WORDS:  # "n't" -> "n", "t": what BERT's punctuation split leaves of contractions
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


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (values, offsets starting at 0)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    off = arr.offsets.to_numpy().astype(np.int64)
    return arr.flatten().to_numpy(), off - off[0]


def _words(ids_off, word_pos, word_off):
    """Absolute start, length in pieces and owning row of every word of a batch of chunks."""
    counts = np.diff(word_off)
    row = np.repeat(np.arange(len(counts)), counts)
    start = word_pos.astype(np.int64) + ids_off[:-1][row]
    end = np.empty_like(start)
    end[:-1] = start[1:]
    last = word_off[1:][counts > 0] - 1
    end[last] = ids_off[1:][counts > 0] - 1  # the last word ends at [SEP]
    return start, end - start, row


def sample_batch(
    batch: pa.RecordBatch | pa.Table, cfg: SpanConfig, words: WordTable, stats: dict
) -> pa.RecordBatch:
    """Sample the spans of a batch of chunks (NumPy over the whole batch)."""
    chunk_ids = batch.column("chunk_id").to_numpy()
    ids, ids_off = _flat(batch.column("input_ids"))
    word_pos, word_off = _flat(batch.column("word_starts"))
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
            w_start, w_len, w_row = _words(ids_off, word_pos, word_off)
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
                room = n >= lmin
                top = cdf[np.clip(n - lmin, 0, len(cdf) - 1)]  # P(length <= n)
                redrawn = lmin + np.searchsorted(cdf, ul * top[:, None], side="right")
                ln = np.where(fits, drawn, redrawn)
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


def validate_spans(
    spans: pa.RecordBatch, chunks: pa.RecordBatch, cfg: SpanConfig, words: WordTable, where: str
) -> None:
    """Check every span of a batch against the rules above; raise naming the first bad span."""
    chunk_ids = chunks.column("chunk_id").to_numpy()
    if not np.array_equal(spans.column("chunk_id").to_numpy(), chunk_ids):
        raise ValueError(f"{where}: the chunk_id column differs from the chunks shard's")
    ids, ids_off = _flat(chunks.column("input_ids"))
    word_pos, word_off = _flat(chunks.column("word_starts"))
    start, off = _flat(spans.column("span_start"))
    end, _ = _flat(spans.column("span_end"))
    gran, _ = _flat(spans.column("granularity"))
    row = np.repeat(np.arange(len(chunk_ids)), np.diff(off))
    start, end, n = start.astype(np.int64), end.astype(np.int64), (np.diff(ids_off) - 2)[row]
    length = end - start

    def fail(bad: np.ndarray, what: str) -> None:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{where}: chunk {chunk_ids[row[i]]} span {i - off[row[i]]} "
                f"({GRANULARITIES[gran[i]]}, [{start[i]}, {end[i]})) {what}; "
                "this is a bug in spans.py"
            )

    fail((start < 1) | (end > n + 1) | (length < 1), "is not inside the text tokens")
    for g, name in enumerate(GRANULARITIES):
        sel = gran == g
        if not cfg.enabled(name):
            fail(sel, "belongs to a disabled granularity")
            continue
        fail(
            sel
            & (np.bincount(row[sel], minlength=len(chunk_ids))[row] > cfg.spans_per_granularity),
            "exceeds spans_per_granularity",
        )
        if name == "word":
            w_start, w_len, _ = _words(ids_off, word_pos, word_off)
            bad = np.zeros_like(sel)
            if sel.any():  # look up the word each word span starts at (word starts are sorted)
                abs_start = start[sel] + ids_off[:-1][row[sel]]
                idx = np.clip(np.searchsorted(w_start, abs_start), 0, len(w_start) - 1)
                bad[sel] = (w_start[idx] != abs_start) | (w_len[idx] != length[sel])
                fail(bad, "is not one whole word")
                bad[sel] = ~words.eligible(ids, w_start[idx], w_len[idx])
                fail(bad, "is a stop word or punctuation")
        else:
            lmin, lmax = cfg.bounds(name)
            clipped = (cfg.short_chunk == "clip") & (length == n) & (n < lmax)
            fail(
                sel & ~(((length >= lmin) & (length <= lmax)) | clipped),
                f"has a length outside [{lmin}, {lmax}]",
            )


# --- the stage ------------------------------------------------------------------------------------


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
        expected = artifacts.read_json(chunk_manifest)["stats"]["tokenizer"]["vocab_sha256"]
        if expected != words.vocab_sha256:
            raise ValueError(
                f"{chunks_path} was tokenised with another vocabulary than {checkpoint_dir}; "
                "re-run chunk_articles with this checkpoint"
            )
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
        g, _ = _flat(spans.column("granularity"))
        ln = _flat(spans.column("span_end"))[0] - _flat(spans.column("span_start"))[0]
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


# --- audit artifacts ------------------------------------------------------------------------------


def audit(
    chunk_paths: Sequence[str | os.PathLike],
    span_paths: Sequence[str | os.PathLike],
    checkpoint_dir: str | os.PathLike,
    cfg: SpanConfig,
    plot: str | os.PathLike,
    sample: str | os.PathLike,
    max_chunks: int = 200_000,
    sample_chunks: int = 3,
) -> None:
    """lengths.png: span lengths against the scaled Beta density; sample.md: spans as text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = {g: [] for g in GRANULARITIES}
    seen = 0
    for path in span_paths:  # the first max_chunks chunks, shard by shard: deterministic
        table = pq.read_table(path, columns=["span_start", "span_end", "granularity"]).slice(
            0, max_chunks - seen
        )
        seen += table.num_rows
        g, _ = _flat(table["granularity"])
        ln = _flat(table["span_end"])[0] - _flat(table["span_start"])[0]
        for i, name in enumerate(GRANULARITIES):
            lengths[name].append(ln[g == i])
    enabled = [g for g in GRANULARITIES if cfg.enabled(g)]
    fig, axes = plt.subplots(1, len(enabled), figsize=(4 * len(enabled), 3.2), squeeze=False)
    for ax, name in zip(axes[0], enabled):
        ln = np.concatenate(lengths[name]) if lengths[name] else np.zeros(0)
        if name == "word":
            ax.hist(
                ln, bins=np.arange(0.5, max(ln.max(initial=1), 1) + 1.5), density=True, color="C0"
            )
            ax.set_title(f"word: pieces per word span (n={len(ln)})")
        else:
            lmin, lmax = cfg.bounds(name)
            ax.hist(
                ln,
                bins=np.arange(min(lmin, ln.min(initial=lmin)) - 0.5, lmax + 1.5),
                density=True,
                color="C0",
                label="sampled",
            )
            x = np.linspace(lmin, lmax, 400)
            ax.plot(
                x,
                beta_law.pdf((x - lmin) / max(lmax - lmin, 1), cfg.beta_alpha, cfg.beta_beta)
                / max(lmax - lmin, 1),
                color="C3",
                label=f"Beta({cfg.beta_alpha:g},{cfg.beta_beta:g}) scaled",
            )
            ax.set_title(f"{name} [{lmin}, {lmax}] (n={len(ln)})")
            ax.legend(fontsize=7)
        ax.set_xlabel("span length (tokens)")
    fig.suptitle(f"span lengths, spans={cfg.name}, short_chunk={cfg.short_chunk}", fontsize=9)
    fig.tight_layout()
    with artifacts.atomic_path(plot) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)

    tokenizer = load_tokenizer(checkpoint_dir)
    chunks = pq.read_table(chunk_paths[0]).slice(0, sample_chunks).to_pylist()
    spans = pq.read_table(span_paths[0]).slice(0, sample_chunks).to_pylist()
    lines = [
        f"# Span sample: spans={cfg.name}",
        "",
        f"The first {len(chunks)} chunks of {chunk_paths[0]}, decoded, with their spans "
        "(positions index input_ids; [CLS] is position 0).",
        "",
    ]
    for chunk, row in zip(chunks, spans):
        ids = chunk["input_ids"]
        lines += [
            f"## chunk {chunk['chunk_id']} (page {chunk['page_id']}, chunk {chunk['chunk_index']}, "
            f"{len(ids)} tokens)",
            "",
            "> " + tokenizer.decode(ids, skip_special_tokens=False),
            "",
            "| granularity | [start, end) | length | text |",
            "|---|---|---|---|",
        ]
        for s, e, g in zip(row["span_start"], row["span_end"], row["granularity"]):
            text = tokenizer.decode(ids[s:e]).replace("|", "\\|")
            lines.append(f"| {GRANULARITIES[g]} | [{s}, {e}) | {e - s} | {text} |")
        lines.append("")
    with artifacts.atomic_path(sample) as tmp:
        tmp.write_text("\n".join(lines))
    params = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    inputs = {f"spans:{Path(p).name}": p for p in span_paths}
    counts = {g: int(sum(len(x) for x in lengths[g])) for g in enabled}
    for artifact in (plot, sample):
        artifacts.write_manifest(
            artifacts.manifest_path(artifact),
            stage="audit_spans",
            params=params,
            inputs=inputs,
            stats={"chunks_read": seen, "spans_plotted": counts},
        )


def main() -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("command", choices=["sample", "audit"])
    parser.add_argument("--chunks", type=Path, nargs="+", required=True, help="chunks shard(s)")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="tokenizer folder (rule stage_tokenizer) or a checkpoint folder",
    )
    parser.add_argument("--out", type=Path, help="sample: the span index shard to write")
    parser.add_argument("--spans", type=Path, nargs="+", help="audit: the span index shards")
    parser.add_argument("--plot", type=Path, help="audit: lengths.png to write")
    parser.add_argument("--sample", type=Path, help="audit: sample.md to write")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = SpanConfig.from_dict(args.config)
    if args.command == "sample":
        if len(args.chunks) != 1 or args.out is None:
            parser.error("sample takes one --chunks shard and --out")
        sample_shard(args.chunks[0], args.checkpoint, args.out, cfg)
    else:
        if not (args.spans and args.plot and args.sample):
            parser.error("audit needs --spans, --plot and --sample")
        audit(args.chunks, args.spans, args.checkpoint, cfg, args.plot, args.sample)


if __name__ == "__main__":
    main()
