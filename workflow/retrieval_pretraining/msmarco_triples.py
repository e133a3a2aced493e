"""MS MARCO's official `qidpidtriples` as a negatives source (bm25.py's `source: triples`): the
file streamed, `count` negatives sampled per query by bottom-k keys, memory O(queries x count)
whatever the file's length or order (400M lines at MS MARCO scale; benchmarks/RESULTS.md, issue 17).
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
from tqdm import tqdm

from .answers import answer_exclusions
from .config import ConfigError
from .errors import FILE_ERRORS, InputFileError, one_line, reading

TRIPLES_BLOCK_BYTES = 16 << 20  # qidpidtriples text per read (a block is ~800k lines)
TRIPLES_MERGE_ROWS = 1 << 20  # candidate rows held before they are merged into the kept sample
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def _mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64s (wrapping arithmetic): a bijection that spreads bits."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _fnv1a64(strings: pl.Series) -> np.ndarray:
    """FNV-1a 64 of each string's UTF-8 bytes, vectorised over the column (one pass per byte
    position): fixed arithmetic, so the sample never depends on a library's hash version."""
    arr = strings.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_string())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if len(arr) else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.full(len(arr), _FNV_OFFSET, dtype=np.uint64)
    for j in range(int(lengths.max()) if len(arr) else 0):
        rows = np.flatnonzero(lengths > j)
        hashes[rows] = (hashes[rows] ^ data[starts[rows] + j].astype(np.uint64)) * _FNV_PRIME
    return hashes


def triples_blocks(path: Path) -> Iterator[pa.RecordBatch]:
    """The file's (query_id, pos, neg) string columns, a block at a time. A malformed line is
    named by its number (pyarrow's parse error quotes its text only: one of 400M lines); a .gz
    cut short or damaged is named as a download to fetch again."""
    import pyarrow.csv as pacsv

    try:
        yield from pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(
                column_names=["query_id", "pos", "neg"], block_size=TRIPLES_BLOCK_BYTES
            ),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.string() for c in ("query_id", "pos", "neg")}
            ),
        )
    except pa.ArrowInvalid as error:
        raise malformed_line(path, error) or error
    except OSError as error:  # pyarrow's "Truncated compressed stream", a bad gzip header
        if isinstance(error, FILE_ERRORS) or Path(path).suffix != ".gz":
            raise
        raise damaged_gzip(path, error) from error


def damaged_gzip(path: Path, error: Exception) -> InputFileError:
    """A compressed stream cut short or corrupt: a download, so the fix is to fetch it again (the
    generic hint, "rebuild it with the stage that writes it", names no stage that can)."""
    return InputFileError(f"{path}: the compressed file is cut short or damaged "
                          f"({type(error).__name__}: {one_line(error)}); download the file again")


def malformed_line(path: Path, error: Exception) -> InputFileError | None:
    """The error naming the first line that is not three tab-separated UTF-8 fields, found by
    reading the file again (only after a parse error); None if every line is well formed."""
    for number, raw in enumerate(_raw_lines(path), 1):
        line = raw.rstrip(b"\r\n")
        if not line:  # pyarrow skips empty lines
            continue
        try:
            line.decode("utf-8")
            fields = line.count(b"\t") + 1
            wrong = f"{fields} fields, expected 3" if fields != 3 else None
        except UnicodeDecodeError:
            wrong = "not UTF-8"
        if wrong:
            return InputFileError(
                f"{path}, line {number}: {wrong} ({one_line(error)}); qidpidtriples lines are "
                "qid <tab> positive pid <tab> negative pid: download the file again")
    return None


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The file's lines (a .gz decompressed); a .gz cut short or corrupt is damaged_gzip (pyarrow
    may first meet its cut as a partial line)."""
    opener = gzip.open if Path(path).suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            yield from handle
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise damaged_gzip(path, error) from error


def query_salts(seed: int, query_ids: Iterable[str]) -> pl.DataFrame:
    """(query_id, salt): 64 bits of sha256(seed, query id), as derive_rng draws its seed."""
    ids = sorted(set(query_ids))
    salts = [
        int.from_bytes(hashlib.sha256(f"{seed}\x1f{q}".encode()).digest()[:8], "little")
        for q in ids
    ]
    return pl.DataFrame({"query_id": ids, "salt": salts},
                        schema={"query_id": pl.String, "salt": pl.UInt64})


def _pairs(pairs: dict[str, set[str]]) -> pl.DataFrame:
    return pl.DataFrame(
        {"query_id": [q for q, docs in pairs.items() for _ in docs],
         "neg": [d for docs in pairs.values() for d in docs]},
        schema={"query_id": pl.String, "neg": pl.String},
    )


def _keep_smallest(frame: pl.DataFrame, count: int) -> pl.DataFrame:
    """Per query, the `count` distinct negatives of smallest key (ties by id), each with the line
    where it first appeared."""
    return (
        frame.group_by("query_id", "neg")
        .agg(pl.col("key").first(), pl.col("pos").min())
        .sort("query_id", "key", "neg")
        .filter(pl.int_range(pl.len()).over("query_id") < count)
    )


def triples_candidates(
    path: Path,
    member: str | None,
    positives: dict[str, set[str]],
    count: int,
    seed: int,
    excluded: dict[str, set[str]] | None = None,
) -> tuple[dict[str, list[tuple[str, int]]], int]:
    """`count` negatives per query of `positives` from MS MARCO `qidpidtriples` (qid, positive pid,
    negative pid), streamed: ({qid: [(negative pid, -1), ...]}, candidate positives removed).

    Each distinct (query, negative) listed gets the key mix64(salt(seed, qid) ^ mix64(fnv1a(pid)));
    the query's negatives are the `count` of smallest key among its listed negatives that are
    neither its positives nor in `excluded` (bottom-k sampling: the keys are exchangeable, so
    every `count`-subset is equally likely, the law of a uniform sample without replacement).
    Only the current smallest keys are held, O(queries x count) whatever the file's length or
    order; the sample depends on (seed, qid, pid) alone, never on line order or repeats. The file
    is unranked, so ranks are -1; the kept negatives are listed in order of first appearance.
    """
    if member is not None:
        raise ConfigError(
            "read qidpidtriples from the .tsv.gz download itself, not from an archive member"
        )
    salts = query_salts(seed, positives)
    drop = _pairs({q: set(positives[q]) | (excluded or {}).get(q, set()) for q in positives})
    own = _pairs(positives)
    kept = pl.DataFrame(schema={"query_id": pl.String, "neg": pl.String, "key": pl.UInt64,
                                "pos": pl.Int64})
    limits = pl.DataFrame(schema={"query_id": pl.String, "limit": pl.UInt64})
    pending: list[pl.DataFrame] = []
    pending_rows = lines = matched = 0
    listed_positives: set[tuple[str, str]] = set()

    def merge() -> None:
        nonlocal kept, limits, pending, pending_rows
        kept = _keep_smallest(pl.concat([kept, *pending]), count)
        limits = (kept.group_by("query_id").agg(pl.col("key").max().alias("limit"), pl.len())
                  .filter(pl.col("len") == count).drop("len"))
        pending, pending_rows = [], 0

    with reading(path, "an MS MARCO qidpidtriples file (qid, positive pid, negative pid)"):
        for batch in tqdm(triples_blocks(path), desc="qidpidtriples", unit="block", mininterval=10):
            frame = (
                pl.from_arrow(pa.Table.from_batches([batch]))
                .select("query_id", "neg",
                        pos=pl.int_range(lines, lines + batch.num_rows, dtype=pl.Int64))
                .join(salts, on="query_id", how="inner")
            )
            lines += batch.num_rows
            matched += frame.height
            listed_positives.update(frame.join(own, on=["query_id", "neg"], how="semi")
                                    .select("query_id", "neg").iter_rows())
            frame = frame.join(drop, on=["query_id", "neg"], how="anti")
            frame = (
                frame.with_columns(key=pl.Series(
                    _mix64(frame["salt"].to_numpy() ^ _mix64(_fnv1a64(frame["neg"]))),
                    dtype=pl.UInt64))
                .join(limits, on="query_id", how="left")
                .filter(pl.col("limit").is_null() | (pl.col("key") <= pl.col("limit")))
                .select("query_id", "neg", "key", "pos")
            )
            pending.append(frame)
            pending_rows += frame.height
            if pending_rows >= max(TRIPLES_MERGE_ROWS, kept.height):
                merge()
    if not lines:
        raise InputFileError(f"{path}: no triples read; the file is empty")
    if not matched:
        # Otherwise every query would get no negatives and fine-tuning's padding would quietly
        # turn the BM25-negatives stage into a random-negatives one.
        raise InputFileError(
            f"{path}: none of its {lines} lines names a query of this split (first column); "
            "it must be MS MARCO's qidpidtriples (query id, positive pid, negative pid), not "
            "triples.train.small (the texts), and of the split whose qrels are given"
        )
    merge()
    grouped = kept.sort("pos").group_by("query_id", maintain_order=True).agg("neg")
    return {q: [(n, -1) for n in negs] for q, negs in grouped.iter_rows()}, len(listed_positives)


TRIPLES_SAMPLING = (
    "uniform without replacement by bottom-k keys: the count distinct listed negatives of smallest "
    "mix64(sha256(seed, query_id)[:8] ^ mix64(fnv1a64(pid))); streamed; kept in order of first "
    "appearance"
)


def triples_sample(
    path: Path,
    positives: dict[str, set[str]],
    count: int,
    seed: int,
    negative_filter: str,
    answers: Path | None,
    corpus: Path | None,
    answer_match: str = "string",
) -> tuple[dict[str, list[tuple[str, int]]], dict[str, set[str]], int]:
    """triples_candidates with `negative_filter` applied before the sample, not after: (sample,
    answer passages met, candidate positives removed).

    With `answers`, a sampled negative that holds an answer is excluded and the file is read
    again, until a pass samples none: then each query's sample is the bottom-`count` of its
    listed negatives minus its positives and every answer passage (any answer passage with a
    smaller key was met, and excluded, in an earlier pass). With `qrels` it is one pass.
    """
    excluded: dict[str, set[str]] = {}
    while True:
        table, listed_positives = triples_candidates(path, None, positives, count, seed, excluded)
        found = answer_exclusions({q: [d for d, _ in c] for q, c in table.items()},
                                  negative_filter, answers, corpus, answer_match)
        found = {q: docs for q, docs in found.items() if docs}
        if not found:
            return table, excluded, listed_positives
        for q, docs in found.items():
            excluded.setdefault(q, set()).update(docs)
