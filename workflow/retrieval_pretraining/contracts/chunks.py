"""The chunks contract (results/corpus/chunks/shard-*.parquet, written by chunk.py).

One row per chunk, sorted by chunk_id = (page_id << 16) + chunk_index; input_ids is [CLS] text
[SEP] (no padding, at most max_len tokens, no special token inside the text); word_starts are the
positions of exactly the text's word-starting tokens (every token that is not a continuation piece),
the first right after [CLS]. A chunk's shard is page_id % shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .base import RANK_PARQUET, Audit, parquet_kind, results_root, short

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


# ----------------------------------------------------------------------------- the writer's checks
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
    piece). The order of rows across batches is checked by `check_order`.
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


def check_order(chunk_id: np.ndarray, where: str) -> None:
    """Rows of a shard, after sorting: chunk ids strictly increasing (no chunk twice)."""
    repeated = np.flatnonzero(np.diff(chunk_id) <= 0)
    if len(repeated):
        page = int(chunk_id[repeated[0]]) >> CHUNK_INDEX_BITS
        raise ValueError(
            f"{where}: duplicate page_id {page}: it occurs more than once in the articles "
            "(the same page in two article parts?)"
        )


def word_extents(ids_off: np.ndarray, word_pos: np.ndarray, word_off: np.ndarray):
    """Absolute start, length in pieces and owning row of every word of a batch of chunks, read
    from word_starts (`ids_off`, `word_off`: offsets of input_ids and word_starts from 0)."""
    counts = np.diff(word_off)
    row = np.repeat(np.arange(len(counts)), counts)
    start = word_pos.astype(np.int64) + ids_off[:-1][row]
    end = np.empty_like(start)
    end[:-1] = start[1:]
    last = word_off[1:][counts > 0] - 1
    end[last] = ids_off[1:][counts > 0] - 1  # the last word ends at [SEP]
    return start, end - start, row


# ----------------------------------------------------------------------------- audit
def manifest_tokenizer(root: Path | None, *manifests: dict[str, Any] | None):
    """(tokenizer, its file) named by the manifests (params.checkpoint or an input path), else any
    staged checkpoint's; (None, None) when there is none (ids are then shown raw)."""
    from tokenizers import Tokenizer

    candidates = []
    for manifest in manifests:
        if not manifest:
            continue
        params = manifest.get("params") or {}
        name = params.get("checkpoint") or params.get("tokenizer")
        if name and root is not None:
            candidates.append(root / "checkpoints" / str(name) / "tokenizer.json")
        for entry in (manifest.get("inputs") or {}).values():
            p = Path(entry.get("path", ""))
            candidates += [p / "tokenizer.json", p.parent / "tokenizer.json"]
    if root is not None:
        candidates += sorted((root / "checkpoints").glob("*/tokenizer.json"))
    for c in candidates:
        if c.is_file():
            return Tokenizer.from_file(str(c)), c
    return None, None


def decode(tokenizer, ids) -> str:
    if tokenizer is None:
        return " ".join(map(str, ids))
    return tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)


def render_chunks(a: Audit, t: pa.Table, manifest, n: int) -> None:
    tokenizer, source = manifest_tokenizer(results_root(a.path), manifest)
    a.say(f"-- tokenizer: {source or 'not found (ids shown raw)'}")
    ids = t["chunk_id"].to_numpy()
    a.check("chunk_id sorted and unique", bool(np.all(np.diff(ids) > 0)))
    index = t["chunk_index"].to_numpy().astype(np.int64)
    expected = (t["page_id"].to_numpy() << CHUNK_INDEX_BITS) + index
    a.check("chunk_id == (page_id << 16) + chunk_index", bool(np.array_equal(ids, expected)))
    lengths = pc.list_value_length(t["input_ids"]).to_numpy()
    max_len = ((manifest or {}).get("params") or {}).get("max_len")
    if max_len:
        a.check(
            f"every chunk <= max_len {max_len}",
            int(lengths.max(initial=0)) <= max_len,
            f"longest {lengths.max(initial=0)}",
        )
    if tokenizer is not None:
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        rows = t["input_ids"].to_pylist()
        first = np.array([r[0] if r else -1 for r in rows])
        ends = np.array([r[-1] if r else -1 for r in rows])
        a.check(
            "every chunk starts with [CLS] and ends with [SEP]",
            bool(np.all(first == cls) and np.all(ends == sep)),
        )
    bad = [
        i
        for i, (ws, ln) in enumerate(zip(t["word_starts"].to_pylist(), lengths))
        if ws != sorted(set(ws)) or (ws and (ws[0] < 1 or ws[-1] > ln - 2))
    ]
    a.check(
        "word_starts sorted, inside the text tokens",
        not bad,
        f"first bad row {bad[:1]}" if bad else "",
    )
    if len(t):
        a.say(
            f"-- {len(t)} chunks, {int(lengths.sum())} tokens, length min/mean/max "
            f"{lengths.min()}/{lengths.mean():.1f}/{lengths.max()}"
        )
    a.say("-- rows")
    for row in t.slice(0, n).to_pylist():
        a.say(
            f"  chunk {row['chunk_id']} (page {row['page_id']} #{row['chunk_index']}, "
            f"{len(row['input_ids'])} tokens, {len(row['word_starts'])} words)"
        )
        a.say(f"      {short(decode(tokenizer, row['input_ids']), 300)}")


KINDS = [
    parquet_kind(
        "chunks", RANK_PARQUET + 1, SCHEMA, lambda c: {"input_ids", "word_starts"} <= c,
        render_chunks,
    ),
]
