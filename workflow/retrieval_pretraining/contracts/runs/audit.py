"""How `audit` checks a TREC run (six fields a line; per query ranks 1..k, scores non-increasing,
no document twice, scores finite; every query one of its split's, every document one of the
corpus's) and shows its first query with its top documents as text."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from ..base import (
    RANK_NAME, Audit, Kind, NotAnArtifact, read_manifest, short, show_manifest,
    show_snakemake_record,
)
from ..datasets.audit import dataset_folder, lookup_text
from . import trec_fields, utf8_lines


ID_ROWS = 1 << 20  # ids of a dataset file read at a time


def ids_absent(path: Path, column: str, ids: Iterable[str]) -> set[str]:
    """Those of `ids` that `path`'s `column` lacks: that column alone, read a batch at a time
    (Wikipedia's 21M passage ids are never held at once), each batch struck from the set of `ids`.
    A hash join: nothing is sorted and `ids` are hashed once (arrow's is_in hashed them again for
    every batch), and the reading stops once every id is found."""
    absent = set(ids)
    for batch in pq.ParquetFile(path).iter_batches(ID_ROWS, columns=[column]):
        absent.difference_update(batch.column(0).cast(pa.string()).to_pylist())
        if not absent:
            break
    return absent


def check_ids_known(a: Audit, folder: Path | None, per_query: dict[str, list]) -> None:
    """Every writer (bm25.py search, dense_search.py) searches queries-{split}.parquet in an index
    of the dataset's corpus.parquet: a query or document id from elsewhere means a run of another
    split or dataset, which evaluation would score against the wrong qrels. The message names the
    first unknown queries in file order and the first unknown documents in sorted order."""
    docs = (d for hits in per_query.values() for _, _, d in hits)
    for name, column, ids in ((f"queries-{a.path.stem}.parquet", "query_id", per_query),
                              ("corpus.parquet", "doc_id", docs)):
        path = folder / name if folder is not None else None
        if path is None or not path.is_file():
            a.say(f"-- {column}s not checked: no {name} in the dataset folder ({folder})")
            continue
        absent = ids_absent(path, column, ids)
        # Only the unknown ids are ordered for the message: sorting all 5M of a 7M-line run
        # took longer than the check.
        named = [q for q in per_query if q in absent] if column == "query_id" else sorted(absent)
        a.check(f"every {column} is in {name}", not absent,
                f"{len(absent)} unknown, e.g. {named[:3]}" if absent else "")


def _rank_out_of_order(hits: list) -> int | None:
    return next((i for i, (rank, _, _) in enumerate(hits) if rank != i + 1), None)


def _score_above_previous(hits: list) -> int | None:
    # `not >=`, so that a nan score breaks the order too
    return next((i for i in range(1, len(hits)) if not hits[i - 1][1] >= hits[i][1]), None)


def _document_again(hits: list) -> int | None:
    seen: set[str] = set()
    for i, (_, _, doc) in enumerate(hits):
        if doc in seen:
            return i
        seen.add(doc)
    return None


def _where(path: Path, bad: list[tuple[str, int]]) -> str:
    """Which line breaks a check: the first failing query's (in file order) first bad hit, found
    by reading the file again (a failing audit only; hits are not stored with their lines)."""
    qid, index = bad[0]
    seen = 0
    for number, line in utf8_lines(path, NotAnArtifact):
        fields = trec_fields(line)
        if fields and fields[0] == qid:
            if seen == index:
                return (f"{len(bad)} queries, first query {qid} at line {number}: "
                        f"{line.rstrip()!r}")
            seen += 1
    return f"{len(bad)} queries, first query {qid}"


def audit_run(a: Audit, n: int) -> None:
    a.kind = "TREC run"
    per_query: dict[str, list[tuple[int, float, str]]] = {}
    not_finite: list[int] = []  # line numbers: float() reads 'nan' and 'inf' as scores
    for number, line in utf8_lines(a.path, NotAnArtifact):
        line = line.rstrip("\r\n")
        parts = trec_fields(line)
        if len(parts) != 6:
            raise NotAnArtifact(
                f"{a.path}:{number}: expected 6 fields 'qid Q0 docid rank score tag', "
                f"got {len(parts)}: {line!r}"
            )
        try:
            per_query.setdefault(parts[0], []).append((int(parts[3]), float(parts[4]), parts[2]))
        except ValueError as error:
            raise NotAnArtifact(f"{a.path}:{number}: rank/score not numeric: {line!r}") from error
        if not math.isfinite(per_query[parts[0]][-1][1]):
            not_finite.append(number)
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    depths = [len(v) for v in per_query.values()]
    depth = f"{min(depths, default=0)}/{max(depths, default=0)}"
    a.say(f"-- {len(per_query)} queries, depth min/max {depth}")
    a.check(
        "scores finite (no nan, inf)",
        not not_finite,
        f"{len(not_finite)} lines, first {not_finite[:3]}" if not_finite else "",
    )
    for name, first_bad in (("ranks 1..k in order per query", _rank_out_of_order),
                            ("scores non-increasing by rank", _score_above_previous),
                            ("no document twice for a query", _document_again)):
        bad = [(qid, i) for qid, hits in per_query.items() if (i := first_bad(hits)) is not None]
        a.check(name, not bad, _where(a.path, bad) if bad else "")
    folder = dataset_folder(a.path)
    check_ids_known(a, folder, per_query)
    first = list(per_query.items())[:1]
    for qid, hits in first:
        queries = lookup_text(folder, "queries-*.parquet", "query_id", [qid])
        docs = lookup_text(folder, "corpus.parquet", "doc_id", [d for *_, d in hits[:n]])
        a.say(f"-- query {qid}: {short(queries.get(qid, '?'), 160)}")
        for rank, score, d in hits[:n]:
            a.say(f"   {rank:4d} {score:10.4f} {d}  {short(docs.get(d, ''), 100)}")


KINDS = [
    Kind(".trec", RANK_NAME + 0, "file", lambda p: p.name.endswith(".trec"), audit_run),
]
