"""Reading a retrieval dataset's source files, as the config entry names them.

BEIR folders (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) and MS MARCO files (TSV collections
of passages or documents, queries TSV, TREC qrels; plain, .gz or a member of a tar archive, from a
path or a download). Ids are read as strings. A malformed line raises DatasetError naming the file,
the line and the fix. Corpora (MS MARCO documents: 22 GB) are streamed in batches of lines.
What the rows must then be is the datasets contract (contracts/datasets/).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import polars as pl

from .config import resolve_path
from .contracts.datasets import DatasetError
from .contracts.runs import trec_fields
from .errors import json_value_kind

DOWNLOAD_DIR = "results/downloads/datasets"
# A corpus batch ends at this many documents or characters (MS MARCO documents average ~7k).
CORPUS_BATCH_ROWS = 100_000
CORPUS_BATCH_CHARS = 128 << 20


@contextmanager
def open_text(path: Path, member: str | None = None) -> Iterator[io.TextIOBase]:
    """A text stream over `path` (plain or .gz), or over `member` inside a tar archive."""
    if member is not None:
        with tarfile.open(path, "r:*") as archive:
            try:
                handle = archive.extractfile(member)
            except KeyError:
                names = ", ".join(archive.getnames()[:20])
                raise DatasetError(
                    f"{path}: no member {member!r} in the archive (it holds: {names}); "
                    "fix `member` in the dataset config"
                ) from None
            if handle is None:
                raise DatasetError(f"{path}: member {member!r} is not a regular file")
            raw = gzip.GzipFile(fileobj=handle) if member.endswith(".gz") else handle
            yield io.TextIOWrapper(raw, encoding="utf-8-sig", newline="\n")
        return
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8-sig", newline="\n") as handle:
            yield handle
    else:
        with open(path, encoding="utf-8-sig", newline="\n") as handle:
            yield handle


def _where(path: Path, member: str | None) -> str:
    return f"{path}!{member}" if member else str(path)


def json_lines(handle: Iterable[str], where: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line of a JSON-lines stream; a line that is
    not JSON fails, naming `where` and the line."""
    for number, line in enumerate(handle, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{where}, line {number}: not valid JSON ({error})") from None


def json_objects(handle: Iterable[str], where: str, fields: tuple[str, ...],
                 optional: tuple[str, ...] = (), required: bool = False
                 ) -> Iterator[tuple[int, dict]]:
    """json_lines whose every value must be an object (one with `fields`, the message says): a
    JSON string would pass `field in record` as a substring test, and fail later unnamed. With
    `required`, an object without one of `fields` is refused too, naming the line and field (the
    `optional` ones named as such)."""
    needs = ", ".join(fields) + (f" ({', '.join(optional)} optional)" if optional else "")
    for number, record in json_lines(handle, where):
        if not isinstance(record, dict):
            raise DatasetError(f"{where}, line {number}: not a JSON object but "
                               f"{json_value_kind(record)}; each line is one object with "
                               f"{', '.join(fields)}")
        missing = [field for field in fields if field not in record] if required else []
        if missing:
            raise DatasetError(f"{where}, line {number}: missing field {missing[0]!r}; each "
                               f"line needs {needs}")
        yield number, record


def record_text(record: dict, field: str, where: str, number: int) -> str | None:
    """`field` of a BEIR record as written: a string, or None (null, read as an empty text). A
    number or a list is refused, naming the line: it failed later with a TypeError naming no
    file, or was cast to a string as if it were text."""
    value = record.get(field)
    if value is None or isinstance(value, str):
        return value
    raise DatasetError(f"{where}, line {number}: {field!r} is not a JSON string but "
                       f"{json_value_kind(value)}; a title or text is a JSON string (or null)")


def record_id(value: Any, where: str, number: int) -> str:
    """A BEIR `_id` as the string the qrels name it by: a JSON string as written, an integer as its
    decimal digits (so a corpus id 5 matches a qrels id "5"). Anything else (null, a boolean, a
    fraction, an array, an object) is refused, naming the line: str() made "None", "True" or
    "['a']" an id no qrels line could name."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    shown = json.dumps(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise DatasetError(f"{where}, line {number}: '_id' is not a JSON string but "
                       f"{json_value_kind(value)} ({shown}); an id is a JSON string (or an "
                       "integer)")


def _no_records(path: Path) -> DatasetError:
    return DatasetError(f"{path}: no records (the file is empty); it holds one JSON object per "
                        "line: download the dataset again, or fix `path`")


def read_jsonl(
    path: Path, fields: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, list]:
    """Columns `fields` (+ `optional`, default "") of a JSON-lines file; ids are read as strings
    (record_id)."""
    columns: dict[str, list] = {f: [] for f in fields + optional}
    with open_text(path) as handle:
        for number, record in json_objects(handle, str(path), fields, optional, required=True):
            for field in fields:
                columns[field].append(record_id(record[field], str(path), number)
                                      if field == "_id"
                                      else record_text(record, field, str(path), number))
            for field in optional:
                columns[field].append(record_text(record, field, str(path), number) or "")
    if not columns[fields[0]]:  # polars then failed on a join of a null-typed column
        raise _no_records(path)
    return columns


def read_jsonl_corpus_batches(
    path: Path, require_id: bool = True, rows: int | None = None, chars: int | None = None
) -> Iterator[pl.DataFrame]:
    """A JSON-lines corpus (BEIR's corpus.jsonl: `_id`, `text`, optional `title`) as (doc_id,
    title, text) frames of at most `rows` documents or `chars` characters, read line by line.
    Without `require_id` a record may lack `_id` (its doc_id is then its 0-based position)."""
    rows = rows or CORPUS_BATCH_ROWS
    chars = chars or CORPUS_BATCH_CHARS
    fields = ("_id", "text") if require_id else ("text",)
    columns: dict[str, list[str]] = {"doc_id": [], "title": [], "text": []}
    size = position = 0
    with open_text(path) as handle:
        for number, record in json_objects(handle, str(path), fields, ("title",), required=True):
            columns["doc_id"].append(record_id(record["_id"], str(path), number)
                                     if "_id" in record else str(position))
            columns["title"].append(record_text(record, "title", str(path), number) or "")
            columns["text"].append(record_text(record, "text", str(path), number))
            position += 1
            size += len(columns["text"][-1] or "") + len(columns["title"][-1])
            if len(columns["doc_id"]) >= rows or size >= chars:
                yield pl.DataFrame(columns, schema=dict.fromkeys(columns, pl.String))
                columns = {k: [] for k in columns}
                size = 0
    if columns["doc_id"]:
        yield pl.DataFrame(columns, schema=dict.fromkeys(columns, pl.String))
    elif not position:  # an empty corpus: its splits failed later on every judged document
        raise _no_records(path)


def read_tsv_records(
    path: Path, member: str | None, widths: tuple[int, ...]
) -> Iterator[list[str]]:
    """Tab-separated records of one of the allowed field counts (a bad line fails, naming it)."""
    with open_text(path, member) as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) not in widths:
                raise DatasetError(
                    f"{_where(path, member)}, line {number}: {len(fields)} tab-separated fields, "
                    f"expected {' or '.join(map(str, widths))}"
                )
            yield fields


def read_qrels_file(path: Path, member: str | None = None) -> pl.DataFrame:
    """Qrels in TREC format (`qid iter docid rel`, spaces or tabs) or BEIR's 3-column TSV with
    header.

    The layout is decided once, on the first line: tab-separated if it holds a tab (BEIR; MS MARCO's
    TREC qrels.train.tsv), else split on whitespace (NIST's TREC files); 3 fields (BEIR) or 4
    (TREC). A later line of another width is refused, naming it: read per line, a BEIR id holding
    a space made 4 fields and was taken for TREC, its ids shifted."""
    qids, dids, rels = [], [], []
    sep: str | None = None
    width = 0
    with open_text(path, member) as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if not width:
                sep = "\t" if "\t" in line else None
            # Whitespace as trec_eval splits on: str.split() also split an id at U+00A0 or U+3000.
            fields = line.split(sep) if sep else trec_fields(line)
            if number == 1 and fields[0] == "query-id":
                continue  # BEIR header
            width = width or len(fields)
            if len(fields) != width or width not in (3, 4):
                raise DatasetError(
                    f"{_where(path, member)}, line {number}: {len(fields)} fields, the file's "
                    f"lines have {width if width in (3, 4) else '3 or 4'}; qrels lines are "
                    "`query_id iteration doc_id relevance` (TREC) or `query-id corpus-id score` "
                    "(BEIR, tab-separated)"
                )
            qid, did, rel = (fields[0], fields[2], fields[3]) if width == 4 else fields
            try:
                rels.append(int(rel))
            except ValueError:
                raise DatasetError(
                    f"{_where(path, member)}, line {number}: relevance {rel!r} is not an integer"
                ) from None
            qids.append(qid)
            dids.append(did)
    return pl.DataFrame(
        {"query_id": qids, "doc_id": dids, "relevance": rels},
        schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32},
    )


def read_queries_tsv(path: Path, member: str | None = None) -> pl.DataFrame:
    rows = list(read_tsv_records(path, member, (2,)))
    return pl.DataFrame(rows, schema={"query_id": pl.String, "text": pl.String}, orient="row")


def read_corpus_tsv_batches(
    path: Path, member: str | None = None, rows: int | None = None, chars: int | None = None
) -> Iterator[pl.DataFrame]:
    """MS MARCO passage (`pid text`) or document (`docid url title body`) collections, plain, .gz
    or a tar member, as (doc_id, title, text) frames of at most `rows` documents or `chars`
    characters (CORPUS_BATCH_ROWS / CORPUS_BATCH_CHARS by default)."""
    rows = rows or CORPUS_BATCH_ROWS
    chars = chars or CORPUS_BATCH_CHARS
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    size = 0

    def flush() -> pl.DataFrame:
        frame = pl.DataFrame(
            {"doc_id": ids, "title": titles, "text": texts},
            schema={"doc_id": pl.String, "title": pl.String, "text": pl.String},
        )
        for column in (ids, titles, texts):
            column.clear()
        return frame

    for fields in read_tsv_records(path, member, (2, 4)):
        ids.append(fields[0])
        titles.append("" if len(fields) == 2 else fields[2])
        texts.append(fields[-1])
        size += len(fields[-1]) + len(titles[-1])
        if len(ids) >= rows or size >= chars:
            yield flush()
            size = 0
    if ids:
        yield flush()


# --- a dataset's files: the corpus, then each split ---------------------------------------


def resolve_ref(
    ref: dict[str, Any], entry: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> tuple[Path, str | None]:
    """A file reference of the config: `{path: ...}` or `{download: <file>, member: <in archive>}`.

    Downloads lie in `downloads` (default: results/downloads/datasets/<dataset>/ of the project).
    """
    if "path" in ref:
        return resolve_path(ref["path"], data_root), ref.get("member")
    folder = Path(downloads) if downloads else Path(DOWNLOAD_DIR) / entry["name"]
    return resolve_path(folder / ref["download"], data_root), ref.get("member")


def _split_entry(entry: dict[str, Any], split: str) -> dict[str, Any]:
    for candidate in entry["splits"]:
        if candidate["name"] == split:
            return candidate
    names = ", ".join(s["name"] for s in entry["splits"])
    raise DatasetError(
        f"dataset {entry['name']!r} has no split {split!r} (splits: {names}); fix `splits`"
    )


def corpus_source(
    entry: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> str:
    """The corpus file as a message names it (BEIR corpus.jsonl; MS MARCO path or path!member)."""
    if entry["format"] == "beir":
        return str(resolve_path(entry["path"], data_root) / "corpus.jsonl")
    return _where(*resolve_ref(entry["corpus"], entry, data_root, downloads))


def corpus_batches(
    entry: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> tuple[Iterator[pl.DataFrame], dict[str, Path]]:
    """The corpus as (doc_id, title, text) batches in file order, and the files it is read from.

    Both are streamed: BEIR's corpus.jsonl line by line, MS MARCO collections in batches of lines.
    """
    if entry["format"] == "beir":
        path = resolve_path(entry["path"], data_root) / "corpus.jsonl"
        return read_jsonl_corpus_batches(path), {"corpus": path}
    path, member = resolve_ref(entry["corpus"], entry, data_root, downloads)
    inputs = {"corpus": path}
    if entry["format"] == "dpr":  # DPR's psgs_w100.tsv: CSV-quoted, with a header
        from .dpr_files import read_passages_batches

        return read_passages_batches(path, member), inputs
    if not entry.get("titles"):
        return read_corpus_tsv_batches(path, member), inputs
    # RocketQA's para.title.txt (`pid <tab> title`): the passage titles the COSTA authors used.
    tpath, tmember = resolve_ref(entry["titles"], entry, data_root, downloads)
    inputs["titles"] = tpath
    return _with_titles(read_corpus_tsv_batches(path, member), tpath, tmember), inputs


def load_split(
    entry: dict[str, Any], split: str, data_root: str | None, downloads: Path | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Path]]:
    """(queries, qrels, input files) of one split, as read (not yet checked)."""
    if entry["format"] == "beir":
        _split_entry(entry, split)
        folder = resolve_path(entry["path"], data_root)
        qrels_path = folder / "qrels" / f"{split}.tsv"
        if not qrels_path.is_file():
            raise DatasetError(
                f"{qrels_path} does not exist; BEIR folders hold qrels/<split>.tsv, fix `splits`"
            )
        cols = read_jsonl(folder / "queries.jsonl", ("_id", "text"))
        queries = pl.DataFrame({"query_id": cols["_id"], "text": cols["text"]})
        return (
            queries,
            read_qrels_file(qrels_path),
            {"queries": folder / "queries.jsonl", "qrels": qrels_path},
        )
    spec = _split_entry(entry, split)
    if "queries" not in spec or "qrels" not in spec:
        raise DatasetError(
            f"dataset {entry['name']!r} split {split!r}: msmarco splits need `queries` and `qrels`"
        )
    qpath, qmember = resolve_ref(spec["queries"], entry, data_root, downloads)
    rpath, rmember = resolve_ref(spec["qrels"], entry, data_root, downloads)
    return (
        read_queries_tsv(qpath, qmember),
        read_qrels_file(rpath, rmember),
        {"queries": qpath, "qrels": rpath},
    )


def _with_titles(batches: Iterator[pl.DataFrame], path: Path, member: str | None
                 ) -> Iterator[pl.DataFrame]:
    """The collection's batches with the titles of a `pid <tab> title` file, merged as both are
    read: a title file of 8.8M lines is never held whole. A title is kept as written, RocketQA's
    "-" (no title) too: the COSTA authors' Tevatron scripts fed "-" [SEP] body (ARCHITECTURE.md).
    Both files list integer ids in ascending order (MS MARCO's collection and RocketQA's
    para.title.txt do); a passage the title file skips keeps its own title, a title of a passage
    the collection lacks is ignored, and ids out of that order are refused, naming the line."""
    where = _where(path, member)
    records = enumerate(read_tsv_records(path, member, (1, 2)), 1)
    pending: tuple[int, int, str] | None = None  # (line, pid, title) read but not yet matched
    last_title = last_doc = -1

    def next_title() -> tuple[int, int, str] | None:
        nonlocal last_title
        for number, fields in records:
            pid = _integer_id(fields[0], f"{where}, record {number}")
            if pid <= last_title:
                raise DatasetError(f"{where}, record {number}: id {pid} after {last_title}; the "
                                   "titles must list ascending ids, in the collection's order")
            last_title = pid
            return number, pid, fields[1] if len(fields) == 2 else ""
        return None

    pending = next_title()
    for batch in batches:
        merged = []
        for doc_id, title in zip(batch["doc_id"].to_list(), batch["title"].to_list()):
            pid = _integer_id(doc_id, "the collection")
            if pid <= last_doc:
                raise DatasetError(f"the collection lists id {pid} after {last_doc}; titles are "
                                   "merged by ascending ids (MS MARCO's order)")
            last_doc = pid
            while pending is not None and pending[1] < pid:
                pending = next_title()  # a title of a passage the collection does not have
            if pending is not None and pending[1] == pid:
                title, pending = pending[2], next_title()
            merged.append(title)
        yield batch.with_columns(pl.Series("title", merged, dtype=pl.String))


def _integer_id(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DatasetError(f"{where}: id {value!r} is not an integer; a `titles` file is merged "
                           "by MS MARCO's integer passage ids") from None
