"""How `audit` shows and checks a chunks shard: the text decoded with the tokenizer the manifests
name, ids and lengths against the contract, every chunk through the writer's own check
(validate_chunks, with that tokenizer's tables), a batch at a time, and the shard against its
manifest (chunks, pages, tokens, every page in this shard by the recorded sharding).
`manifest_tokenizer` and `decode` also serve the spans' audit (spans are shown inside their
chunk).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import BadInput, one_line
from ..base import RANK_PARQUET, Audit, input_path, parquet_kind, results_root, short
from ..columns import flat
from . import CHUNK_INDEX_BITS, MIN_LENGTH, SCHEMA, validate_chunks


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
            p = input_path(entry.get("path", ""), root)
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


ROWS_PER_BATCH = 1 << 16  # chunks checked at a time: the flattened ids stay bounded


def word_starts_in_text(batch: pa.RecordBatch) -> np.ndarray:
    """The rows of a batch whose word_starts are not increasing positions inside the text tokens
    (what can be checked without the tokenizer)."""
    lengths = pc.list_value_length(batch.column("input_ids")).fill_null(0).to_numpy()
    pos, off = flat(batch.column("word_starts"))
    row = np.repeat(np.arange(len(lengths)), np.diff(off))
    bad = (pos < 1) | (pos > lengths[row] - 2)
    bad[1:] |= (row[1:] == row[:-1]) & (np.diff(pos) <= 0)
    return np.unique(row[bad])


def writer_check(tokenizer_file: Path | None, max_len: int | None):
    """chunk.py's own check of a batch (validate_chunks: [CLS] text [SEP], no special token
    inside the text, word_starts exactly the word-starting tokens) as `check(batch, where)`, with
    the tokenizer's tables; None (and why) where the tokenizer cannot give them."""
    from ...wordpiece import tokenizer_info

    if tokenizer_file is None:
        return None, "no tokenizer found"
    try:
        info = tokenizer_info(tokenizer_file.parent)
    except BadInput as error:  # not WordPiece (ConfigError), a file it cannot read
        return None, one_line(error)
    prefix = info["continuation_prefix"]
    continues_word = np.array([t.startswith(prefix) for t in info["tokens"]], dtype=bool)
    special = (info["special_ids"]["cls"], info["special_ids"]["sep"])
    limit = max_len or np.iinfo(np.int32).max

    def check(batch: pa.RecordBatch, where: str) -> None:
        ids = pc.list_flatten(batch.column("input_ids"))
        low, high = pc.min_max(ids).values()
        if len(ids) and (low.as_py() < 0 or high.as_py() >= len(continues_word)):
            raise ValueError(f"{where}: a token id outside the vocabulary of "
                             f"{len(continues_word)}")
        validate_chunks(batch, limit, continues_word, special, where)

    return check, ""


SHARDING = re.compile(r"page_id % (\d+)")  # stats.sharding as chunk.py records it


def check_shard(a: Audit, t: pa.Table, lengths: np.ndarray, manifest) -> None:
    """The shard is the one its manifest describes (stats.shard: its number, chunks, pages and
    tokens; stats.sharding: which pages a shard holds): another shard of the corpus copied over
    it passes every row-level check, yet pre-training would read some pages twice and others
    never. The row count is parquet_kind's."""
    stats = (manifest or {}).get("stats") or {}
    shard = stats.get("shard")
    if not isinstance(shard, dict):
        return
    page_id = t["page_id"].to_numpy()
    for key, found in (("pages", len(np.unique(page_id))), ("tokens", int(lengths.sum()))):
        if key in shard:
            a.check(f"{key} equal the manifest's (stats.shard.{key})", found == shard[key],
                    f"{found} vs {shard[key]}")
    rule = SHARDING.fullmatch(str(stats.get("sharding", "")))
    if rule is None or "shard" not in shard:
        a.say(f"-- pages not checked against the sharding: the manifest records "
              f"{stats.get('sharding')!r}, shard {shard.get('shard')!r}")
        return
    shards, number = int(rule.group(1)), shard["shard"]
    elsewhere = np.flatnonzero(page_id % shards != number)
    a.check(
        f"every page_id % {shards} == {number} (the manifest's sharding and shard number)",
        not len(elsewhere),
        f"{len(elsewhere)} chunks of other shards' pages, first page_id "
        f"{page_id[elsewhere[0]]}" if len(elsewhere) else "",
    )


def render_chunks(a: Audit, t: pa.Table, manifest, n: int) -> None:
    tokenizer, source = manifest_tokenizer(results_root(a.path), manifest)
    a.say(f"-- tokenizer: {source or 'not found (ids shown raw)'}")
    ids = t["chunk_id"].to_numpy()
    back = np.flatnonzero(np.diff(ids) <= 0) + 1  # rows not above the row before them
    a.check("chunk_id sorted and unique", not len(back),
            f"{len(back)} rows, first row {back[0]}: chunk_id {ids[back[0]]} after "
            f"{ids[back[0] - 1]}" if len(back) else "")
    index = t["chunk_index"].to_numpy().astype(np.int64)
    expected = (t["page_id"].to_numpy() << CHUNK_INDEX_BITS) + index
    wrong = np.flatnonzero(ids != expected)
    a.check("chunk_id == (page_id << 16) + chunk_index", not len(wrong),
            f"{len(wrong)} rows, first row {wrong[0]}: chunk_id {ids[wrong[0]]}, page_id "
            f"{t['page_id'][int(wrong[0])].as_py()}, chunk_index {index[wrong[0]]}"
            if len(wrong) else "")
    lengths = pc.list_value_length(t["input_ids"]).to_numpy()
    # Checked without the tokenizer too: `[CLS][SEP]` (no text) is otherwise caught only by
    # chunk.py's check, which needs it.
    shortest = int(lengths.min()) if len(lengths) else MIN_LENGTH  # not min(initial=): it caps
    a.check(
        f"every chunk >= {MIN_LENGTH} tokens ([CLS], a text token, [SEP])",
        shortest >= MIN_LENGTH,
        f"shortest {shortest}" if len(lengths) else "",
    )
    check_shard(a, t, lengths, manifest)
    max_len = ((manifest or {}).get("params") or {}).get("max_len")
    if max_len:
        a.check(
            f"every chunk <= max_len {max_len}",
            int(lengths.max(initial=0)) <= max_len,
            f"longest {lengths.max(initial=0)}",
        )
    check, why = writer_check(source, max_len)
    bad, offset, error = [], 0, None
    for batch in t.to_batches(max_chunksize=ROWS_PER_BATCH):
        bad += (word_starts_in_text(batch) + offset).tolist()
        if check is not None and error is None:
            try:
                check(batch, a.path.name)
            except ValueError as found:
                error = str(found).removesuffix("; this is a bug in chunk.py")
        offset += batch.num_rows
    a.check(
        "word_starts sorted, inside the text tokens",
        not bad,
        f"first bad row {bad[:1]}" if bad else "",
    )
    if check is None:
        a.say(f"-- chunk.py's check of every chunk not run: {why}")
    else:
        a.check(
            "every chunk as chunk.py checks it ([CLS] text [SEP], no special token inside the "
            "text, word_starts exactly the word-starting tokens)",
            error is None,
            error or "",
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
        render_chunks, counted_by=("shard", "chunks"), manifest_objects=("stats.shard",),
        manifest_counts=("params.max_len",),
    ),
]
