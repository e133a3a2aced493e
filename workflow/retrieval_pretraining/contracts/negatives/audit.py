"""How `audit` shows and checks negatives: no positive among a query's negatives (unless mined with
`positives_removed: first_query`, which the manifest records), one rank (and score) per negative,
and a few queries shown with their positive and negatives as text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..base import RANK_PARQUET, Audit, parquet_kind, short
from ..datasets.audit import dataset_folder, lookup_text
from . import MINED_SCHEMA, SCHEMA


def render_negatives(a: Audit, t: pa.Table, manifest, n: int) -> None:
    rows = t.to_pylist()
    a.check("query_id unique", len({r["query_id"] for r in rows}) == len(rows))
    leaks = [r["query_id"] for r in rows if set(r["positive_ids"]) & set(r["negative_ids"])]
    policy = ((manifest or {}).get("params") or {}).get("policy") or {}
    if policy.get("positives_removed") == "first_query":
        # Mined with the BoW authors' miner replicated on request (mine.py): leaks are its effect.
        a.say(
            f"-- positives_removed: first_query (the BoW authors' miner): {len(leaks)} queries "
            "keep an own positive among their negatives, as that policy does"
        )
    else:
        a.check(
            "no query's own positive among its negatives",
            not leaks,
            f"{len(leaks)} queries, e.g. {leaks[:5]}" if leaks else "",
        )
    a.check(
        "one rank per negative",
        all(len(r["negative_ranks"]) == len(r["negative_ids"]) for r in rows),
    )
    if "negative_scores" in t.schema.names:
        a.check(
            "one score per negative",
            all(len(r["negative_scores"]) == len(r["negative_ids"]) for r in rows),
        )
    counts = [len(r["negative_ids"]) for r in rows]
    a.say(
        f"-- {len(rows)} queries, negatives per query min/mean/max "
        f"{min(counts, default=0)}/{np.mean(counts) if counts else 0:.1f}/{max(counts, default=0)}"
    )
    folder = dataset_folder(a.path)
    sample = rows[:n]
    queries = lookup_text(folder, "queries-*.parquet", "query_id", [r["query_id"] for r in sample])
    doc_ids = [d for r in sample for d in r["positive_ids"][:1] + r["negative_ids"][:3]]
    titles = lookup_text(folder, "corpus.parquet", "doc_id", doc_ids)
    a.say(f"-- rows (texts from {folder or 'no dataset folder found'})")
    for r in sample:
        a.say(f"  query {r['query_id']}: {short(queries.get(r['query_id'], '?'), 160)}")
        for d in r["positive_ids"][:1]:
            a.say(f"    + {d}: {short(titles.get(d, '?'), 140)}")
        for d, rank in list(zip(r["negative_ids"], r["negative_ranks"]))[:3]:
            a.say(f"    - {d} (rank {rank}): {short(titles.get(d, '?'), 130)}")


KINDS = [
    # Mined first: BM25 negatives are recognised by fewer columns.
    parquet_kind(
        "negatives", RANK_PARQUET + 3, MINED_SCHEMA,
        lambda c: {"negative_ids", "negative_scores"} <= c, render_negatives,
        shown_as="negatives (mined hard negatives)",
    ),
    parquet_kind(
        "negatives", RANK_PARQUET + 4, SCHEMA, lambda c: "negative_ids" in c, render_negatives
    ),
]
