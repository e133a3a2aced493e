"""How `audit` shows and checks encoded corpus shards: the vectors (finite, their norms) and one id
per vector."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from ..base import (
    RANK_NAME, RANK_PARQUET, Audit, Kind, NotAnArtifact, parquet_kind, read_manifest,
    render_table_rows, show_manifest, show_snakemake_record,
)
from . import IDS_SCHEMA


def audit_npy(a: Audit, n: int) -> None:
    a.kind = "embeddings (.npy)"
    try:
        x = np.load(a.path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise NotAnArtifact(f"{a.path}: not a plain .npy array ({error})") from error
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.say(f"-- shape {x.shape}, dtype {x.dtype}")
    sample = np.asarray(x[: min(len(x), 10000)], dtype=np.float32)
    a.check("2-d float matrix", x.ndim == 2 and x.dtype.kind == "f")
    a.check("finite values (first 10,000 rows)", bool(np.isfinite(sample).all()))
    if x.ndim == 2 and len(sample):
        norms = np.linalg.norm(sample, axis=1)
        a.say(f"  row norms min/mean/max {norms.min():.3f}/{norms.mean():.3f}/{norms.max():.3f}")
        for i in range(min(n, len(sample))):
            a.say(f"  [{i}] " + " ".join(f"{v:+.3f}" for v in sample[i, :8]) + " …")
    stem = a.path.name.removesuffix(".npy")
    ids = [a.path.with_name(f"{stem}.ids.parquet"), a.path.parent / "docid"]
    for p in [p for p in ids if p.is_file()][:1]:
        count = (
            len(pq.read_table(p))
            if p.suffix == ".parquet"
            else (
                len(np.load(p, allow_pickle=False))
                if p.suffix == ".npy"
                else len(p.read_text().splitlines())
            )
        )
        a.check(f"one id per row ({p.name})", count == len(x), f"{count} ids, {len(x)} rows")


KINDS = [
    parquet_kind(
        "embedding ids", RANK_PARQUET + 8, IDS_SCHEMA, lambda c: c == set(IDS_SCHEMA.names),
        render_table_rows("doc_id"), shown_as="ids",
    ),
    Kind(".npy", RANK_NAME + 2, "file", lambda p: p.name.endswith(".npy"), audit_npy),
]
