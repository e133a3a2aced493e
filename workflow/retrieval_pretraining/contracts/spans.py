"""The span index contract (results/corpus/spans/{spans}/shard-*.parquet, written by spans.py).

Row i describes row i of the chunks shard of the same name (chunk_id equal, checked); span_start and
span_end (end exclusive) index the chunk's input_ids and never cover [CLS]/[SEP]; granularity is the
code of GRANULARITIES. The span audit beside the shards (lengths.png, sample.md) is span_audit.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .base import RANK_PARQUET, Audit, flat, parquet_kind, read_manifest, results_root, short
from .chunks import decode, manifest_tokenizer, word_extents

GRANULARITIES = ("word", "phrase", "sentence", "paragraph")  # granularity code -> name
SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("span_start", pa.list_(pa.int32()), nullable=False),
        pa.field("span_end", pa.list_(pa.int32()), nullable=False),
        pa.field("granularity", pa.list_(pa.int8()), nullable=False),
    ]
)
FILES = [
    ("corpus/spans/*/lengths.png", "span lengths against the scaled Beta density", "audit_spans"),
    ("corpus/spans/*/sample.md", "sample spans shown inside their chunks", "audit_spans"),
]


def validate_spans(spans: pa.RecordBatch, chunks: pa.RecordBatch, cfg, words, where: str) -> None:
    """Check every span of a batch against the sampling rules of `cfg` (a spans.SpanConfig; `words`
    its spans.WordTable); raise naming the first bad span."""
    chunk_ids = chunks.column("chunk_id").to_numpy()
    if not np.array_equal(spans.column("chunk_id").to_numpy(), chunk_ids):
        raise ValueError(f"{where}: the chunk_id column differs from the chunks shard's")
    ids, ids_off = flat(chunks.column("input_ids"))
    word_pos, word_off = flat(chunks.column("word_starts"))
    start, off = flat(spans.column("span_start"))
    end, _ = flat(spans.column("span_end"))
    gran, _ = flat(spans.column("granularity"))
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
            w_start, w_len, _ = word_extents(ids_off, word_pos, word_off)
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


def granularity_name(code: int):
    return GRANULARITIES[code] if 0 <= code < len(GRANULARITIES) else code


def render_spans(a: Audit, t: pa.Table, manifest, n: int) -> None:
    chunks_path = a.path.parents[2] / "chunks" / a.path.name
    for entry in ((manifest or {}).get("inputs") or {}).values():
        if Path(entry.get("path", "")).name == a.path.name and "chunks" in entry.get("path", ""):
            chunks_path = Path(entry["path"])
    if not a.check("matching chunks shard exists", chunks_path.is_file(), str(chunks_path)):
        return
    chunks = pq.read_table(chunks_path, columns=["chunk_id", "input_ids"])
    a.check(
        "row i describes chunk i (chunk_id equal row by row)",
        len(chunks) == len(t) and chunks["chunk_id"].equals(t["chunk_id"]),
    )
    lengths = pc.list_value_length(chunks["input_ids"]).to_numpy()
    bad, counts = [], {}
    for i, (s, e, g) in enumerate(
        zip(t["span_start"].to_pylist(), t["span_end"].to_pylist(), t["granularity"].to_pylist())
    ):
        ok = len(s) == len(e) == len(g) and all(1 <= x < y <= lengths[i] - 1 for x, y in zip(s, e))
        ok = ok and all(0 <= k < len(GRANULARITIES) for k in g)
        if not ok:
            bad.append(i)
        for k, x, y in zip(g, s, e):
            counts.setdefault(granularity_name(k), []).append(y - x)
    a.check(
        "spans inside the text tokens (never [CLS]/[SEP]), lists aligned, granularity 0..3",
        not bad,
        f"{len(bad)} bad rows, first {bad[:3]}" if bad else "",
    )
    a.say("-- span lengths per granularity (count, mean, min-max)")
    for name, ls in counts.items():
        a.say(f"  {name}: {len(ls)}, {np.mean(ls):.1f}, {min(ls)}-{max(ls)}")
    chunk_manifest = read_manifest(chunks_path)
    tokenizer, _ = manifest_tokenizer(results_root(a.path), manifest, chunk_manifest)
    a.say("-- spans shown inside their chunk (⟦span⟧; at most two per granularity)")
    for i in range(min(n, len(t))):
        ids = chunks["input_ids"][i].as_py()
        a.say(f"  chunk {t['chunk_id'][i].as_py()}:")
        shown: dict[int, int] = {}
        for s, e, g in zip(
            t["span_start"][i].as_py(), t["span_end"][i].as_py(), t["granularity"][i].as_py()
        ):
            shown[g] = shown.get(g, 0) + 1
            if shown[g] > 2:  # two per granularity keep the page readable
                continue
            left = decode(tokenizer, ids[max(1, s - 6) : s])
            right = decode(tokenizer, ids[e : e + 6])
            span = short(decode(tokenizer, ids[s:e]), 160)
            a.say(f"    {str(granularity_name(g)):9s} [{s},{e}) …{left} ⟦{span}⟧ {right}…")


KINDS = [
    parquet_kind(
        "spans", RANK_PARQUET + 2, SCHEMA,
        lambda c: {"span_start", "span_end", "granularity"} <= c, render_spans,
    ),
]
