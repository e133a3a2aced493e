"""The chunks contract (results/corpus/{corpus}/chunks/shard-*.parquet, written by chunk.py).

One row per chunk, sorted by chunk_id = (page_id << 16) + chunk_index; input_ids is [CLS] text
[SEP] (no padding, at most max_len tokens, no special token inside the text); word_starts are the
positions of exactly the text's word-starting tokens (every token that is not a continuation piece),
the first right after [CLS]. A chunk's shard is page_id % shards.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

CHUNK_INDEX_BITS = 16  # chunk_id = (page_id << 16) + chunk_index
# [CLS], one text token, [SEP]: chunker.plan_chunks cuts only after a chunk's start and keeps no
# empty tail, so every chunk holds a text token whatever short_tail says.
MIN_LENGTH = 3
SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("page_id", pa.int64(), nullable=False),
        pa.field("chunk_index", pa.int32(), nullable=False),
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("word_starts", pa.list_(pa.int32()), nullable=False),
    ]
)


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
    fail((lengths < MIN_LENGTH) | (lengths > max_len),
         f"has a length outside [{MIN_LENGTH}, max_len={max_len}]")
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
