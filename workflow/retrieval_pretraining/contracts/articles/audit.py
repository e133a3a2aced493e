"""How `audit` shows and checks an articles part: page ids unique, no empty text, a few pages."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..base import RANK_PARQUET, Audit, check_unique, parquet_kind, short
from . import SCHEMA


def render_articles(a: Audit, t: pa.Table, manifest, n: int) -> None:
    check_unique(a, "page_id", t["page_id"])
    empty = int(pc.sum(pc.equal(pc.utf8_length(t["text"]), 0)).as_py() or 0)
    a.check("no empty text", empty == 0, f"{empty} empty")
    a.say("-- rows")
    for row in t.slice(0, n).to_pylist():
        paragraphs = row["text"].count("\n\n") + 1
        size = f"{len(row['text'])} chars, {paragraphs} paragraphs"
        a.say(f"  [{row['page_id']}] {row['title']} ({size})")
        a.say(f"      {short(row['text'], 240)}")


KINDS = [
    parquet_kind(
        "articles", RANK_PARQUET + 0, SCHEMA, lambda c: set(SCHEMA.names) <= c, render_articles,
        counted_by=("articles",),  # extract.py: the pages kept, one row each
    ),
]
