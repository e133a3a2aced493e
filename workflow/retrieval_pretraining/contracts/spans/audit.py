"""How `audit` shows and checks a span index shard: each span against its chunk (inside the text
tokens, lists aligned), lengths per granularity, and a few spans shown inside their chunk's text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..base import (
    RANK_PARQUET, Audit, input_path, parquet_kind, read_manifest, results_root, short,
)
from ..chunks.audit import decode, manifest_tokenizer
from . import GRANULARITIES, SCHEMA

FILES = [
    ("corpus/*/spans/*/lengths.png", "span lengths against the scaled Beta density", "audit_spans"),
    ("corpus/*/spans/*/sample.md", "sample spans shown inside their chunks", "audit_spans"),
]


def granularity_name(code: int):
    return GRANULARITIES[code] if 0 <= code < len(GRANULARITIES) else code


def render_spans(a: Audit, t: pa.Table, manifest, n: int) -> None:
    chunks_path = a.path.parents[2] / "chunks" / a.path.name
    for entry in ((manifest or {}).get("inputs") or {}).values():
        if Path(entry.get("path", "")).name == a.path.name and "chunks" in entry.get("path", ""):
            chunks_path = input_path(entry["path"], a.path)
    if not a.check("matching chunks shard exists", chunks_path.is_file(), str(chunks_path)):
        return
    chunks = pq.read_table(chunks_path, columns=["chunk_id", "input_ids"])
    aligned = a.check(
        "row i describes chunk i (chunk_id equal row by row)",
        len(chunks) == len(t) and chunks["chunk_id"].equals(t["chunk_id"]),
        f"{len(t)} rows, the chunks shard {len(chunks)}" if len(chunks) != len(t) else "",
    )
    if not aligned:  # the spans of row i cannot be read against chunk i
        return
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
        counted_by=("chunks",),
    ),
]
