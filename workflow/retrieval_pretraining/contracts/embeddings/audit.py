"""How `audit` shows and checks encoded corpus shards: the vectors (every row finite, their
norms) and one id per vector."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from ..base import (
    RANK_NAME, RANK_PARQUET, Audit, Kind, NotAnArtifact, parquet_kind, read_manifest,
    render_table_rows, show_manifest, show_snakemake_record,
)
from . import IDS_SCHEMA


ROWS_PER_READ = 1 << 16  # rows checked at a time: memory stays bounded whatever the shard's size


def rows_not_finite(x: np.ndarray) -> tuple[int, int | None]:
    """(how many rows of the 2-d `x` hold a nan or inf, the first such row), read a slice at a
    time from the memory map: one bad vector anywhere spoils every search that reaches it."""
    count, first = 0, None
    for start in range(0, len(x), ROWS_PER_READ):
        bad = np.flatnonzero(~np.isfinite(x[start : start + ROWS_PER_READ]).all(axis=1))
        if len(bad) and first is None:
            first = start + int(bad[0])
        count += len(bad)
    return count, first


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
    matrix = a.check("2-d float matrix", x.ndim == 2 and x.dtype.kind == "f")
    if matrix:
        bad, first = rows_not_finite(x)
        a.check("finite values (every row)", not bad, f"{bad} rows, first {first}" if bad else "")
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
