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
from ..columns import flat
from . import GRANULARITIES, SCHEMA

FILES = [
    ("corpus/*/spans/*/lengths.png", "span lengths against the scaled Beta density", "audit_spans"),
    ("corpus/*/spans/*/sample.md", "sample spans shown inside their chunks", "audit_spans"),
]


def granularity_name(code: int):
    return GRANULARITIES[code] if 0 <= code < len(GRANULARITIES) else code


def span_checks(t: pa.Table, lengths: np.ndarray) -> tuple[list[int], dict]:
    """(the rows whose spans are not inside their chunk's text tokens, whose lists differ in
    length or whose granularity is not 0..3; {granularity name: span lengths}), the lengths in
    row order and the names in order of first appearance. Row i's lists are paired up to the
    shortest, as zip pairs them. Whole columns at once: a paper-scale shard holds ~190k rows of
    20 spans, a minute of per-span Python."""
    (s, s_off), (e, e_off), (g, g_off) = (
        flat(t[name]) for name in ("span_start", "span_end", "granularity"))
    ls, le, lg = np.diff(s_off), np.diff(e_off), np.diff(g_off)
    paired = np.minimum(np.minimum(ls, le), lg)
    row = np.repeat(np.arange(len(paired)), paired)
    within = np.arange(len(row)) - np.repeat(np.cumsum(paired) - paired, paired)
    s, e, g = (v[off[:-1][row] + within].astype(np.int64)
               for v, off in ((s, s_off), (e, e_off), (g, g_off)))
    inside = (1 <= s) & (s < e) & (e <= lengths.astype(np.int64)[row] - 1)
    known = (0 <= g) & (g < len(GRANULARITIES))
    bad = (ls != le) | (ls != lg) | (np.bincount(row[~(inside & known)], minlength=len(ls)) > 0)
    codes, first = np.unique(g, return_index=True)
    counts = {granularity_name(int(k)): e[g == k] - s[g == k] for k in codes[np.argsort(first)]}
    return np.flatnonzero(bad).tolist(), counts


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
    bad, counts = span_checks(t, lengths)
    a.check(
        "spans inside the text tokens (never [CLS]/[SEP]), lists aligned, granularity 0..3",
        not bad,
        f"{len(bad)} bad rows, first {bad[:3]}" if bad else "",
    )
    a.say("-- span lengths per granularity (count, mean, min-max)")
    for name, ls in counts.items():
        a.say(f"  {name}: {len(ls)}, {np.mean(ls):.1f}, {ls.min()}-{ls.max()}")
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
