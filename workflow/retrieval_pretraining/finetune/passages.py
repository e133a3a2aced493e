"""The passages fine-tuning reads: one memory-mapped Arrow file per job, shared by its processes.

Held as a dict of Python strings, the (title, text) of every passage training can use costs each
process ~4 GB at MS MARCO scale (8.8M passages, 503k queries x 30 negatives), once per GPU. Here
the main process streams those rows out of the corpus Parquet (a semi-join on the streaming
engine, corpus order) into an uncompressed Arrow IPC file in the job's state folder, and every
process memory-maps it: the text is page cache, shared by the processes of a node and evictable,
and a process holds only a 64-bit hash of each doc id and its sort order (16 bytes a passage).
A lookup is a binary search on the hashes; the doc id stored beside the text is compared, so a
hash collision is resolved, never mistaken for a match.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from ..errors import InputFileError, reading

COLUMNS = ["doc_id", "title", "text"]


def doc_id_hashes(doc_ids: pl.Series) -> np.ndarray:
    """64-bit hashes of doc ids (polars' hash: the same within one polars version, which is all a
    job needs: the file's hashes are computed by the process that reads them)."""
    return doc_ids.cast(pl.String).hash().to_numpy()


def write_passages(corpus: Path, doc_ids: Iterable[str] | pl.Series, path: Path) -> int:
    """Write the corpus rows named in `doc_ids` to `path` (Arrow IPC, uncompressed, corpus order;
    published by rename) and return how many there are. Every id must be in the corpus: a missing
    one means the negatives were built for another corpus."""
    ids = (doc_ids if isinstance(doc_ids, pl.Series) else pl.Series(list(doc_ids), dtype=pl.String)
           ).cast(pl.String).alias("doc_id").unique()
    path.parent.mkdir(parents=True, exist_ok=True)
    # A write killed part-way (OOM killer, time limit) leaves its temp file: ~20 GB at MS MARCO
    # documents. Only this job's main process writes into its state folder, so any one is stale.
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with reading(corpus, "a corpus Parquet file"):
            (pl.scan_parquet(corpus).select(COLUMNS)
             .filter(pl.col("doc_id").is_in(ids.implode()))  # streams; a semi-join held the corpus
             .with_columns(pl.col("title").fill_null(""), pl.col("text").fill_null(""))
             .sink_ipc(partial, compression=None, compat_level=pl.CompatLevel.oldest()))
        written = pl.scan_ipc(partial).select("doc_id").collect()["doc_id"]
        if len(written) != len(ids):
            absent = sorted(set(ids.to_list()) - set(written.to_list()))
            raise InputFileError(f"{len(absent)} negative doc ids are not in {corpus} (e.g. "
                                 f"{absent[:3]}); the negatives were built for another corpus")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)  # nothing left after a failure (a full disk, say)
    return len(ids)


class PassageStore:
    """Read-only (title, text) by doc id from a file `write_passages` wrote, memory-mapped.

    The file holds record batches (chunks: 18 at 1.5M passages); values are read chunk by chunk,
    never with a take on the whole column: pyarrow's ChunkedArray.take concatenates its chunks
    first, copying every text in the file per call (0.6 s a micro-batch at 1.5M passages)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        table = ipc.open_file(pa.memory_map(str(self.path))).read_all()
        self._columns = {name: table.column(name).chunks for name in COLUMNS}
        lengths = [len(chunk) for chunk in self._columns["doc_id"]]
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hashes = doc_id_hashes(pl.from_arrow(table.column("doc_id")))
        self._order = np.argsort(hashes, kind="stable")
        self._sorted = hashes[self._order]

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _values(self, column: str, rows: np.ndarray) -> list:
        """`column` at file rows `rows`, in their order."""
        chunks = self._columns[column]
        which = np.searchsorted(self._starts, rows, side="right") - 1
        return [chunks[c][int(r - self._starts[c])].as_py() for c, r in zip(which, rows)]

    def rows(self, doc_ids: Sequence[str]) -> np.ndarray:
        """Row numbers of `doc_ids` in the file (KeyError naming the first unknown id)."""
        hashes = doc_id_hashes(pl.Series(doc_ids, dtype=pl.String))
        lo = np.searchsorted(self._sorted, hashes, side="left")
        hi = np.searchsorted(self._sorted, hashes, side="right")
        rows = np.empty(len(doc_ids), dtype=np.int64)
        for i, doc_id in enumerate(doc_ids):
            candidates = self._order[lo[i]:hi[i]]  # more than one only on a hash collision
            matches = [r for r, stored in zip(candidates, self._values("doc_id", candidates))
                       if stored == doc_id]
            if not matches:
                raise KeyError(f"passage {doc_id!r} is not in {self.path}")
            rows[i] = matches[0]
        return rows

    def lookup(self, doc_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """(titles, texts) of `doc_ids`, in their order."""
        rows = self.rows(doc_ids)
        return self._values("title", rows), self._values("text", rows)
