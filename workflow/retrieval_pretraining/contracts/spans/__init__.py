"""The span index contract (results/corpus/{corpus}/spans/{spans}/shard-*.parquet, by spans.py).

Row i describes row i of the chunks shard of the same name (chunk_id equal, checked); span_start and
span_end (end exclusive) index the chunk's input_ids and never cover [CLS]/[SEP]; granularity is the
code of GRANULARITIES. The span audit beside the shards (lengths.png, sample.md) is span_audit.py's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..chunks import word_extents
from ..columns import flat

GRANULARITIES = ("word", "phrase", "sentence", "paragraph")  # granularity code -> name
SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("span_start", pa.list_(pa.int32()), nullable=False),
        pa.field("span_end", pa.list_(pa.int32()), nullable=False),
        pa.field("granularity", pa.list_(pa.int8()), nullable=False),
    ]
)


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
