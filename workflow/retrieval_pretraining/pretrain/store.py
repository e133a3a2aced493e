"""The pre-training data store: chunk (+ span) shards, checked and copied into uncompressed Arrow
IPC files that every process memory-maps (DataLoader workers share pages instead of each decoding
Parquet).

One *chunk file* per chunk shard holds what every objective reads (chunk_id, input_ids,
word_starts); one *span file* per span shard holds the span columns alone, checked against its
chunk shard (same chunk ids row by row, the chunk shard's checksum as recorded in the span
manifest, every span inside its chunk). Files are named by the checksums of their shards, so one
folder serves every model: in the workflow `results/state/pretrain-data/`, where the paper's seven
Wikipedia models read one copy of its chunks and each COSTA span ablation adds only its span files
(about a twentieth of a chunk file). The folder is a cache outside Snakemake's outputs: files
appear whole (by rename), a changed shard gets new files, and deleting it costs a conversion.
rules/pretrain.smk deletes it when a workflow run succeeds, unless a process reads it: each
trainer process leaves a marker in `.readers/` for its whole run (`registered_reader`), since
another Snakemake run in the same directory may be training from it. A marker whose process was
killed outright (SIGKILL, a lost node) keeps the store: delete it by hand (`rm -r` the folder)
once no trainer runs.

The processes of a job convert the missing files between them (`prepare_store`'s `share`), then
wait for the rest (`wait_for_store`). Jobs that start together convert each file once: a process
converts a file only after creating its claim `<file>.claim` (O_CREAT | O_EXCL, holding host, pid
and time), and publishes it by hard link, which never replaces a file another process may have
mapped. A waiting process converts a file nobody converts: one with no claim (the folder was
deleted meanwhile) or whose writer has shown no progress (claim and temporary file unchanged) for
`STALE_S` (15 min) of the waiter's own clock; a writer merely that slow loses its work, nothing is
ever replaced.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import artifacts
from ..errors import reading
from .mixture import DataError

log = logging.getLogger(__name__)
CHUNK_COLUMNS = ("chunk_id", "input_ids", "word_starts")
SPAN_COLUMNS = ("span_start", "span_end", "granularity")


@dataclass(frozen=True)
class StoreFile:
    """The store files of one shard: its chunk file and, for COSTA, its span file; and the shards
    they are converted from (what lets `wait_for_store` convert a file nobody writes)."""

    chunks: Path
    spans: Path | None = None
    chunk_source: Path | None = field(default=None, compare=False)
    span_source: Path | None = field(default=None, compare=False)

    def paths(self) -> list[Path]:
        return [self.chunks] + ([self.spans] if self.spans is not None else [])


# ---------------------------------------------------------------- validation ----------------------
def _flat(column: pa.ChunkedArray | pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list<int> column; zero-copy for a plain (not chunked) array."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.offsets.to_numpy(), array.values.to_numpy(zero_copy_only=False)


def check_spans(chunk_ids: pa.ChunkedArray, lengths: np.ndarray, spans: pa.Table,
                chunk_path: Path, span_path: Path) -> None:
    """Raise DataError unless `spans` describes exactly the chunks of `chunk_path` (their ids and
    token counts given), each span inside its chunk."""
    if spans.num_rows != len(chunk_ids) or not spans["chunk_id"].equals(chunk_ids):
        ours = chunk_ids.to_numpy()
        theirs = spans["chunk_id"].to_numpy()
        n = min(len(ours), len(theirs))
        bad = np.flatnonzero(ours[:n] != theirs[:n])
        row = int(bad[0]) if len(bad) else n
        raise DataError(
            f"span index {span_path} does not match chunk shard {chunk_path}: {spans.num_rows} vs "
            f"{len(chunk_ids)} rows, first differing chunk_id at row {row}; rebuild the span index "
            "from these chunks (rule sample_spans)"
        )
    manifest = artifacts.manifest_path(span_path)
    if manifest.exists():
        recorded = [
            entry.get("sha256") for entry in artifacts.read_json_object(
                manifest, "a span index's manifest").get("inputs", {}).values()
            if Path(entry.get("path", "")).name == chunk_path.name and entry.get("sha256")
        ]
        actual = artifacts.sha256_once(chunk_path)
        if recorded and actual not in recorded:
            raise DataError(
                f"span index {span_path} was sampled from a different {chunk_path.name} (manifest "
                f"sha256 {recorded[0][:12]}..., file {actual[:12]}...); rebuild the span index"
            )
    s_off, starts = _flat(spans["span_start"])
    e_off, ends = _flat(spans["span_end"])
    g_off, _ = _flat(spans["granularity"])
    if not (np.array_equal(s_off, e_off) and np.array_equal(s_off, g_off)):
        raise DataError(f"{span_path}: span_start, span_end and granularity lists differ in length")
    owner = np.repeat(np.arange(len(lengths)), np.diff(s_off))
    # Valid spans cover tokens strictly between [CLS] (position 0) and the final [SEP].
    bad = np.flatnonzero((starts < 1) | (ends <= starts) | (ends > lengths[owner] - 1))
    if len(bad):
        i = int(bad[0])
        row = int(owner[i])
        raise DataError(
            f"{span_path} row {row} (chunk_id {chunk_ids[row].as_py()}): span "
            f"[{starts[i]}, {ends[i]}) lies outside the chunk's tokens [1, {lengths[row] - 1}) "
            f"({len(bad)} bad spans in the file); rebuild the span index from these chunks"
        )


# ---------------------------------------------------------------- writing -------------------------
BATCH_ROWS = 16_384  # rows a record batch: ~60 MB of a 512-token chunk file, the conversion's memory


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{socket.gethostname()}-{os.getpid()}-"
                            f"{secrets.token_hex(4)}.tmp")


def _temps(target: Path) -> list[Path]:
    """The temporary files of `target`'s writers (`_temp_name`)."""
    return sorted(target.parent.glob(f".{glob.escape(target.name)}.*.tmp"))


def _publish(tmp: Path, target: Path) -> None:
    """`tmp` as `target`, unless `target` exists. A link never replaces: a process that has mapped
    `target` keeps the file it mapped (os.replace would swap it, and its pages, under it)."""
    try:
        artifacts.sync(tmp)  # the name may only appear on data that is on disk
        os.link(tmp, target)
        artifacts.sync_folder(target.parent)
    except FileExistsError:
        pass  # another process published it first: the same content (named by the shards' sums)
    except FileNotFoundError:
        # Our temporary file was removed: another process took this conversion over, judging us
        # gone (`wait_for_store`); its copy is used.
        log.warning("%s: the conversion was taken over by another process", target)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        # A filesystem without hard links: a rename, unless the file is there (the claim makes
        # two writers rare; the window is this check).
        if not target.exists():
            os.rename(tmp, target)


def _write(batches: Iterator[pa.RecordBatch], schema: pa.Schema, target: Path) -> None:
    """The batches as one IPC file, which appears whole (`_publish`). Each batch stays a part of
    its own when mapped (`_MappedColumns`), so nothing is ever combined in memory."""
    tmp = _temp_name(target)
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        _publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_chunk_file(chunk_path: str | Path, target: str | Path) -> None:
    """The chunk file of one chunk shard, streamed a record batch at a time."""
    chunk_path = Path(chunk_path)
    with reading(chunk_path, "a chunks Parquet file"):
        source = pq.ParquetFile(chunk_path, memory_map=True)
        # The shard's own schema (the chunks contract's), cut to the columns read.
        schema = source.schema_arrow.empty_table().select(list(CHUNK_COLUMNS)).schema
        # One thread: reading ahead on several held ~0.2 GB more of a 512-token shard (for 0.4 s).
        batches = source.iter_batches(BATCH_ROWS, columns=list(CHUNK_COLUMNS), use_threads=False)
        _write(batches, schema, Path(target))


def write_span_file(chunk_path: str | Path, span_path: str | Path, target: str | Path) -> None:
    """The span file of one span shard, after checking it against its chunk shard."""
    chunk_path, span_path = Path(chunk_path), Path(span_path)
    ids, lengths = [], []
    with reading(chunk_path, "a chunks Parquet file"):
        # The check needs the chunks' ids and token counts alone: a batch of tokens at a time.
        source = pq.ParquetFile(chunk_path, memory_map=True)
        for batch in source.iter_batches(BATCH_ROWS, columns=["chunk_id", "input_ids"],
                                         use_threads=False):
            ids.append(batch.column("chunk_id"))
            lengths.append(pc.list_value_length(batch.column("input_ids")).to_numpy())
    with reading(span_path, "a span index Parquet file"):
        spans = pq.read_table(span_path, columns=["chunk_id", *SPAN_COLUMNS], memory_map=True)
    check_spans(pa.chunked_array(ids, pa.int64()),
                np.concatenate(lengths) if lengths else np.zeros(0, np.int32), spans, chunk_path,
                span_path)
    _write(spans.to_batches(BATCH_ROWS), spans.schema, Path(target))


# ---------------------------------------------------------------- the folder ----------------------
def store_paths(chunk_paths: Sequence[str | Path], span_paths: Sequence[str | Path] | None,
                cache_dir: str | Path) -> list[StoreFile]:
    """The files `prepare_store` writes for these shards, named by their checksums (so a changed
    shard gets a new file)."""
    if span_paths is not None and len(span_paths) != len(chunk_paths):
        raise DataError(f"{len(chunk_paths)} chunk shards but {len(span_paths)} span shards")
    out = []
    for i, chunk_path in enumerate(map(Path, chunk_paths)):
        key = artifacts.sha256_once(chunk_path)[:16]
        spans = None
        if span_paths is not None:
            spans = Path(cache_dir) / (f"{chunk_path.stem}-{key}-"
                                       f"{artifacts.sha256_once(span_paths[i])[:16]}.spans.arrow")
        out.append(StoreFile(Path(cache_dir) / f"{chunk_path.stem}-{key}.arrow", spans,
                             chunk_path, Path(span_paths[i]) if span_paths is not None else None))
    return out


# ---------------------------------------------------------------- claims ------------------------
# A process converts a file only after creating its claim, `<file>.claim` (O_EXCL: one process
# wins), and removes the claim after publishing: jobs that start together convert each file once.
STALE_S = 15 * 60  # a claim whose writer shows no progress this long is taken over
Conversion = tuple[Path, Callable[[Path], None] | None]  # a store file, and what writes it


def _claim_path(target: Path) -> Path:
    return target.with_name(target.name + ".claim")


def _conversions(files: Sequence[StoreFile]) -> list[Conversion]:
    """Every store file with what writes it (None where its shards are unknown): the chunk files,
    then the span files."""
    out: list[Conversion] = [(f.chunks, None if f.chunk_source is None else
                              lambda target, f=f: write_chunk_file(f.chunk_source, target))
                             for f in files]
    out += [(f.spans, None if f.span_source is None else
             lambda target, f=f: write_span_file(f.chunk_source, f.span_source, target))
            for f in files if f.spans is not None]
    return out


def _convert(target: Path, write: Callable[[Path], None]) -> bool:
    """Write `target` unless it exists or another process has claimed it; True if this one did."""
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    claim = _claim_path(target)
    text = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(),
                       "token": secrets.token_hex(8)})
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    try:
        if target.exists():  # published, and its claim removed, since the check above
            return False
        write(target)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            if claim.read_text() == text:  # still ours (not taken over by `wait_for_store`)
                claim.unlink()


def _writer_state(target: Path) -> tuple | None:
    """What shows the progress of `target`'s writer: its claim and its temporary files (their
    sizes and times); None when the file is not claimed."""
    try:
        claim = _claim_path(target).stat()
    except FileNotFoundError:
        return None
    temps = []
    for tmp in _temps(target):
        with contextlib.suppress(FileNotFoundError):
            info = tmp.stat()
            temps.append((tmp.name, info.st_size, info.st_mtime_ns))
    return (claim.st_ino, claim.st_mtime_ns), tuple(temps)


def _take_over_if_stalled(target: Path, watched: dict, stale_s: float) -> None:
    """Remove `target`'s claim (and its writer's temporary files) once its writer has shown no
    progress for `stale_s` seconds of this process's clock (no clock of another host compared):
    the writer is taken for gone (killed, node lost), and the next round converts the file. A
    writer merely slow loses its work (`_publish`); a file is never converted wrong, only twice."""
    state = _writer_state(target)
    now = time.monotonic()
    if state is None or watched.get(target, (None,))[0] != state:
        watched[target] = (state, now)
        return
    if now - watched[target][1] < stale_s:
        return
    claim = _claim_path(target)
    with contextlib.suppress(FileNotFoundError):
        log.warning("taking over the conversion of %s: its writer (%s) showed no progress for %s",
                    target, claim.read_text(), _duration(stale_s))
        claim.unlink()
    for tmp in _temps(target):
        tmp.unlink(missing_ok=True)
    watched.pop(target)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"


def wait_for_store(files: Sequence[StoreFile], timeout_s: float = 12 * 3600,
                   poll_s: float = 0.5, stale_s: float = STALE_S) -> None:
    """Wait until every file of the store exists, converting those nobody converts: unclaimed
    (its claim's writer finished without publishing it, or the folder was deleted meanwhile) or
    claimed by a writer that shows no progress for `stale_s`. Files appear whole (`_publish`), so
    a duplicate conversion costs only time. The processes wait here rather than in a collective:
    converting Wikipedia's ~43 GB on a busy shared filesystem can outlast the process group's
    timeout. If a process fails instead, its launcher (torchrun) ends the others."""
    conversions = _conversions(files)
    deadline = time.monotonic() + timeout_s
    watched: dict[Path, tuple] = {}  # file -> (its writer's state, when this process first saw it)
    while True:
        missing = [(target, write) for target, write in conversions if not target.exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            claims = [_claim_path(t).read_text() for t, _ in missing if _claim_path(t).exists()]
            raise DataError(f"the data store was not written within {_duration(timeout_s)} "
                            f"(missing {[str(t) for t, _ in missing[:3]]}; claims {claims[:3]})")
        for target, write in missing:
            if write is None or not _convert(target, write):
                _take_over_if_stalled(target, watched, stale_s)
        time.sleep(poll_s)


def prepare_store(
    chunk_paths: Sequence[str | Path],
    span_paths: Sequence[str | Path] | None,
    cache_dir: str | Path,
    share: tuple[int, int] = (0, 1),
) -> list[StoreFile]:
    """Validate and convert the shards into store files under `cache_dir`, keeping those already
    there and those another process has claimed. `share` = (r, n): this process takes every n-th
    file from the r-th (a job's n processes split the work; each then waits for the others' files
    with `wait_for_store`, which converts what nobody converts)."""
    out = store_paths(chunk_paths, span_paths, cache_dir)
    work = _conversions(out)
    rank, processes = share
    converted = sum(_convert(target, write) for target, write in work[rank::processes])
    log.info("data store %s: %d files, %d converted by this process", cache_dir, len(work),
             converted)
    return out


# ---------------------------------------------------------------- readers and deletion -----------
READERS = ".readers"  # a marker per process that reads the folder: what keeps it from deletion
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _add_marker(readers: Path) -> Path:
    marker = readers / f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    text = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
    for _ in range(3):  # another reader may remove the (empty) folder between the two calls
        readers.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            marker.write_text(text)
            return marker
    raise FileNotFoundError(f"could not create {marker}")


@contextlib.contextmanager
def registered_reader(folder: str | Path) -> Iterator[Path]:
    """While the block runs, `folder`/.readers/<host>-<pid>-<random> says this process reads the
    store, so that `delete_unless_read` (the workflow's onsuccess) keeps it. The trainer's whole
    run is such a block: its DataLoader workers, when not forked, reopen the files by path.

    The marker goes on any exit Python sees (return, exception, Ctrl-C) and on SIGTERM/SIGUSR1
    before the trainer installs its own handlers (training.StopFlag), after which those signals
    end the run by a return. A process killed outright (SIGKILL, a lost node) leaves its marker,
    which keeps the store until someone deletes it by hand (`delete_unless_read` says how)."""
    readers = Path(folder) / READERS
    # The folders the marker brings into being go with it (a run that stops before reading
    # anything leaves no trace); one that is not empty stays (another reader, or the store).
    created = [d for d in (readers, *readers.parents) if not d.exists()]
    marker = _add_marker(readers)

    def remove() -> None:
        marker.unlink(missing_ok=True)
        for folder_ in created:
            with contextlib.suppress(OSError):
                folder_.rmdir()

    def end(signum: int, frame: object) -> None:
        # The signal's default action (the process ends by it, as it would have), marker first.
        remove()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS} if main else {}
    for sig, handler in previous.items():
        if handler == signal.SIG_DFL:
            signal.signal(sig, end)
    try:
        yield marker
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is end:
                signal.signal(sig, handler)
        remove()


def store_readers(folder: str | Path) -> list[str]:
    """The reader markers in `folder` (`registered_reader`), sorted."""
    readers = Path(folder) / READERS
    return sorted(p.name for p in readers.iterdir()) if readers.is_dir() else []


def delete_unless_read(folder: str | Path) -> tuple[bool, str]:
    """Delete the store `folder` unless a process reads it; (deleted, what to log).

    The workflow's onsuccess calls it: another Snakemake run in the same directory (other targets:
    one run per model, a BM25 run, a table run) may still be training from the store when this
    one succeeds, and deleting it would leave that run's processes waiting for files nobody writes
    or failing to reopen them."""
    folder = Path(folder)
    readers = store_readers(folder)
    if readers:
        return False, (
            f"kept the pre-training data store {folder}: {len(readers)} process(es) read it "
            f"({', '.join(readers[:3])}{', ...' if len(readers) > 3 else ''}; "
            f"{folder / READERS}/<host>-<pid>-<random>). A marker whose process was killed "
            f"outright (SIGKILL, a lost node) also keeps it: once no trainer runs, delete it by "
            f"hand: rm -r {folder}")
    if not folder.exists():
        return False, f"no pre-training data store {folder} to delete"
    shutil.rmtree(folder, ignore_errors=True)
    return True, f"deleted the pre-training data store {folder} (a cache: no trainer reads it)"


# ---------------------------------------------------------------- reading -------------------------
class _MappedColumns:
    """List columns of memory-mapped IPC files read as one table, as numpy views; nothing copied.

    Each record batch of each file stays where it is mapped (a part); a global row (file order,
    then row order, as if the files were concatenated) is found through the parts' cumulative row
    counts. Concatenating them instead would copy the whole corpus into every worker's memory.
    """

    def __init__(self, paths: Sequence[Path], names: Sequence[str]):
        readers = [pa.ipc.open_file(pa.memory_map(str(p))) for p in paths]
        batches = [[r.get_batch(i) for i in range(r.num_record_batches)] for r in readers]
        self.file_rows = [sum(b.num_rows for b in file) for file in batches]
        parts = [b for file in batches for b in file if b.num_rows]
        # starts[k] = global row of part k's first row; starts[-1] = number of rows.
        self.starts = np.cumsum([0] + [part.num_rows for part in parts])
        self.chunk_ids = [part.column("chunk_id").to_numpy() for part in parts]
        self.cols = {name: [_flat(part.column(name)) for part in parts] for name in names}

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(part, row within the part) of each global row."""
        part = np.searchsorted(self.starts, rows, side="right") - 1
        return part, rows - self.starts[part]

    def get(self, name: str, row: int) -> np.ndarray:
        part, local = self.locate(np.int64(row))
        offsets, values = self.cols[name][int(part)]
        return values[offsets[local]:offsets[local + 1]]

    @property
    def nbytes(self) -> int:
        return sum(offsets.nbytes + values.nbytes
                   for parts in self.cols.values() for offsets, values in parts)


class ChunkStore:
    """Random access to the rows of a store (chunk files, and span files where every shard has
    one), as numpy views on the mapped files."""

    def __init__(self, files: Sequence[StoreFile]):
        self._chunks = _MappedColumns([f.chunks for f in files], CHUNK_COLUMNS[1:])
        if not int(self._chunks.starts[-1]):
            raise DataError(f"no chunks in {[str(f.chunks) for f in files]}")
        self.file_rows = self._chunks.file_rows
        self.has_spans = bool(files) and all(f.spans is not None for f in files)
        self._spans = None
        self.max_spans = 0
        if self.has_spans:
            self._spans = _MappedColumns([f.spans for f in files], SPAN_COLUMNS)
            if self._spans.file_rows != self.file_rows:
                raise DataError(f"span store files of {self._spans.file_rows} rows for chunk "
                                f"store files of {self.file_rows}")
            # Same on every rank, so span tensors can be all-gathered.
            self.max_spans = max(int(np.diff(offsets).max())
                                 for offsets, _ in self._spans.cols["span_start"])

    def __len__(self) -> int:
        return int(self._chunks.starts[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of the mapped columns (shared by every process that maps them)."""
        return self._chunks.nbytes + (self._spans.nbytes if self._spans is not None else 0)

    def all_chunk_ids(self) -> np.ndarray:
        """The chunk id of every row, in row order."""
        return np.concatenate(self._chunks.chunk_ids)

    def chunk_ids(self, rows: np.ndarray) -> np.ndarray:
        part, local = self._chunks.locate(np.asarray(rows, dtype=np.int64))
        return np.array([self._chunks.chunk_ids[p][r] for p, r in zip(part, local)],
                        dtype=np.int64)

    def get(self, name: str, row: int) -> np.ndarray:
        columns = self._spans if name in SPAN_COLUMNS else self._chunks
        if columns is None:
            raise DataError(f"column {name}: this store has no span files")
        return columns.get(name, row)
