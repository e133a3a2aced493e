"""How `audit` shows and checks a chunks shard: the text decoded with the tokenizer the manifests
name, ids and lengths against the contract. `manifest_tokenizer` and `decode` also serve the spans'
audit (spans are shown inside their chunk).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..base import RANK_PARQUET, Audit, input_path, parquet_kind, results_root, short
from . import CHUNK_INDEX_BITS, SCHEMA


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
