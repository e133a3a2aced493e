"""How `audit` shows and checks encoded corpus shards: the vectors (every row finite, their
norms, sha256, shape and dtype as the manifest records) and one id per vector, the ids being the
corpus's doc ids over the shard's row range in order (vector i is corpus row lo + i)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ... import artifacts
from ..base import (
    RANK_NAME, RANK_PARQUET, UNREADABLE, Audit, Kind, NotAnArtifact, input_path, parquet_kind,
    read_manifest, render_table_rows, show_manifest, show_snakemake_record,
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


def corpus_ids(corpus: Path, lo: int, hi: int) -> list[str]:
    """corpus.parquet's doc_id rows lo..hi, read a batch at a time (the text column, most of the
    file, is never read)."""
    out: list[str] = []
    start = 0
    for batch in pq.ParquetFile(corpus).iter_batches(batch_size=ROWS_PER_READ, columns=["doc_id"]):
        end = start + batch.num_rows
        if end > lo:
            out += batch.column(0).slice(max(lo - start, 0), hi - max(lo, start)).to_pylist()
        if end >= hi:
            break
        start = end
    return out


def first_difference(found: list[str], expected: list[str]) -> str:
    """Where two id lists first differ, as a check's detail ('' when they are equal)."""
    if found == expected:
        return ""
    i = next((i for i, (f, e) in enumerate(zip(found, expected)) if f != e),
             min(len(found), len(expected)))
    here = found[i] if i < len(found) else None
    there = expected[i] if i < len(expected) else None
    return (f"{len(found)} ids vs {len(expected)} corpus rows; first difference at row {i}: "
            f"{here!r} vs {there!r}")


def check_against_manifest(a: Audit, x: np.ndarray, manifest: dict | None) -> None:
    """The array is what encode.py recorded (its sha256, rows, dim, dtype), and its ids are the
    corpus's doc ids over the recorded row range, in order: the index maps vector i to ids[i], so
    ids shifted or reordered would return the wrong documents for every hit, and a shard stale
    beside a newer manifest would mix two encodings."""
    if not manifest or UNREADABLE in manifest:
        return
    stats = manifest.get("stats") or {}
    if "sha256" in stats:  # another shard's array of the same shape passes every other check
        same = artifacts.sha256_file(a.path) == stats["sha256"]
        a.check("sha256 equals the manifest's", same, "" if same else
                f"not the array encoded; rerun the job that encoded {a.path.name}")
    else:
        a.say("  sha256 not recorded (encoded before encode.py recorded it): not compared")
    if {"rows", "dim", "dtype"} <= set(stats):
        recorded = ((stats["rows"], stats["dim"]), str(stats["dtype"]))
        a.check("shape and dtype are the manifest's (rows, dim, dtype)",
                (x.shape, str(x.dtype)) == recorded,
                f"{x.shape} {x.dtype} vs {recorded[0]} {recorded[1]}")
    ids = a.path.with_name(a.path.name.removesuffix(".npy") + ".ids.parquet")
    recorded_corpus = ((manifest.get("inputs") or {}).get("corpus") or {}).get("path", "")
    corpus = input_path(recorded_corpus, a.path)
    if "row_range" not in stats or not ids.is_file() or not corpus.is_file():
        return
    row_range = stats["row_range"]  # unpacked and sliced: a string or a short list was exit 3
    ok = (isinstance(row_range, list) and len(row_range) == 2
          and all(isinstance(r, int) and not isinstance(r, bool) for r in row_range)
          and 0 <= row_range[0] <= row_range[1])
    if not a.check("the manifest's stats.row_range is [first, end] corpus rows", ok, "" if ok
                   else f"{json.dumps(row_range)}; rerun the job that encoded {a.path.name}"):
        return
    lo, hi = row_range
    found = pq.read_table(ids, columns=["doc_id"]).column("doc_id").to_pylist()
    detail = first_difference(found, corpus_ids(corpus, lo, hi))
    a.check(f"ids are {corpus.name}'s doc_id rows {lo}..{hi}, in order", not detail, detail)


def audit_npy(a: Audit, n: int) -> None:
    a.kind = "embeddings (.npy)"
    try:
        x = np.load(a.path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise NotAnArtifact(f"{a.path}: not a plain .npy array ({error})") from error
    manifest = read_manifest(a.path)
    show_manifest(a, manifest)
    show_snakemake_record(a, a.path)
    a.say(f"-- shape {x.shape}, dtype {x.dtype}")
    check_against_manifest(a, x, manifest)
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
