"""Reading DPR's published files (Natural Questions, TriviaQA: the DPR-Wiki setting), streamed.

- `psgs_w100.tsv[.gz]`: the 21,015,324 100-word Wikipedia passages. Tab-separated with a header
  `id text title`, CSV-quoted (a text holding `"` is wrapped in quotes with `""` inside), as DPR
  itself reads it (csv.reader, tab delimiter). Read line by line into (doc_id, title, text) batches.
- `{nq,trivia}-{train,dev,test}.qa.csv[.gz]`: `question <tab> answers`, answers a Python list
  literal (`['Tim Nazareth']`), CSV-quoted when it holds `"`. Parsed with ast.literal_eval (no code
  is run) and checked to be a list of strings. No header, no ids: a question's id is its 0-based
  record position (a CSV record may span lines), as Pyserini numbers its `dpr-nq-test` /
  `dpr-trivia-test` topics.
- The same questions as JSON lines: `{"question": ..., "answers" | "answer": [...]}` with an
  optional `id` (else the line number; a null `id` is none, as DPR's JsonlQASrc reads it):
  EfficientQA's NQ-open files.
- `biencoder-{nq,trivia}-{train,dev}.json[.gz]`: ONE top-level JSON list of objects
  `{question, answers, positive_ctxs, negative_ctxs, hard_negative_ctxs}` whose contexts carry
  `passage_id` (`psg_id` in some copies), `title`, `text`. Multi-GB: read by `iter_json_list`, an
  incremental reader for exactly this layout (a list of objects) that holds one object at a time
  (ijson is not installed here). A question's id is its 0-based position in the list.
  `read_biencoder` reads the positives (the split's qrels); `read_biencoder_negatives` reads DPR's
  own negatives, the lists named (`hard_negative_ctxs`: DPR's BM25 negatives; `negative_ctxs`:
  random passages), for bm25.py's negatives `source: dpr` (ARCHITECTURE.md, "NQ / TQA stage-1
  negatives").

Every malformed record raises DatasetError naming the file, the line (or byte offset) and the fix.
"""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path
from typing import IO, Any, Iterator

import polars as pl

from .contracts.datasets import DatasetError
from .dataset_files import CORPUS_BATCH_CHARS, CORPUS_BATCH_ROWS, json_objects, open_text

PASSAGES_HEADER = ["id", "text", "title"]
JSON_READ_CHARS = 1 << 20    # characters read per step by iter_json_list
MAX_JSON_RECORD = 256 << 20  # one list element larger than this is refused (memory bound)
csv.field_size_limit(1 << 30)


def _where(path: Path, member: str | None) -> str:
    return f"{path}!{member}" if member else str(path)


def _tsv_rows(handle: IO[str]) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a tab-separated, CSV-quoted text stream, read with csv's default
    (non-strict) dialect as DPR and Pyserini read these files: a field that opens with a quoted
    phrase and goes on ('"The Last Supper" is by whom?') is read as they read it, not refused."""
    reader = csv.reader(handle, delimiter="\t", quotechar='"', strict=False)
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as error:
        raise DatasetError(f"line {reader.line_num}: {error}") from None


def read_passages_batches(path: Path, member: str | None = None, rows: int | None = None,
                          chars: int | None = None) -> Iterator[pl.DataFrame]:
    """psgs_w100.tsv as (doc_id, title, text) frames of at most `rows` passages or `chars`
    characters (dataset_files' CORPUS_BATCH_ROWS / _CHARS by default)."""
    rows, chars = rows or CORPUS_BATCH_ROWS, chars or CORPUS_BATCH_CHARS
    where = _where(path, member)
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    size = 0

    def flush() -> pl.DataFrame:
        frame = pl.DataFrame({"doc_id": ids, "title": titles, "text": texts},
                             schema={"doc_id": pl.String, "title": pl.String, "text": pl.String})
        for column in (ids, titles, texts):
            column.clear()
        return frame

    with open_text(path, member) as handle:
        try:
            for number, fields in _tsv_rows(handle):
                if number == 1 and fields == PASSAGES_HEADER:
                    continue
                if len(fields) != 3:
                    raise DatasetError(
                        f"{where}, line {number}: {len(fields)} fields; psgs_w100 lines are "
                        "`id <tab> text <tab> title` (is this DPR's passages file?)")
                ids.append(fields[0])
                texts.append(fields[1])
                titles.append(fields[2])
                size += len(fields[1]) + len(fields[2])
                if len(ids) >= rows or size >= chars:
                    yield flush()
                    size = 0
        except DatasetError as error:
            if str(error).startswith("line "):
                raise DatasetError(f"{where}, {error}") from None
            raise
    if ids:
        yield flush()


def parse_answer_list(value: Any, where: str) -> list[str]:
    """A list of answer strings from a Python list literal (qa.csv) or a JSON list."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise DatasetError(f"{where}: answers {value[:80]!r} are not a Python list literal "
                               "such as ['Paris']; fix the file") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise DatasetError(f"{where}: answers must be a list of strings, got {str(value)[:80]}")
    return list(value)


def read_questions(path: Path, member: str | None = None) -> Iterator[tuple[str, str, list[str]]]:
    """(query_id, question, answers) of a qa.csv file (or its JSON-lines form, by name)."""
    where = _where(path, member)
    name = (member or path.name).removesuffix(".gz")
    with open_text(path, member) as handle:
        if name.endswith((".jsonl", ".json")):
            yield from _questions_jsonl(handle, where)
            return
        try:
            # Ids are record positions, as Pyserini numbers its dpr-*-test topics (enumerate over
            # the csv records): a line number would shift after a quoted field spanning lines.
            records = 0
            for number, fields in _tsv_rows(handle):
                if not fields:
                    continue
                if len(fields) != 2:
                    raise DatasetError(f"{where}, line {number}: {len(fields)} fields; DPR qa.csv "
                                       "lines are `question <tab> ['answer', ...]`")
                yield str(records), fields[0], parse_answer_list(fields[1], f"{where}, line {number}")
                records += 1
        except DatasetError as error:
            if str(error).startswith("line "):
                raise DatasetError(f"{where}, {error}") from None
            raise


def _question(record: dict[str, Any], where: str) -> str:
    """The record's question, which must be a string (another value would stop the split later,
    in polars, without naming the file)."""
    question = record["question"]
    if not isinstance(question, str):
        raise DatasetError(f"{where}: the question must be a string, got {str(question)[:80]}")
    return question


def _questions_jsonl(handle: IO[str], where: str) -> Iterator[tuple[str, str, list[str]]]:
    for number, record in json_objects(handle, where, ("question", "answers")):
        answers = record.get("answers", record.get("answer"))
        if "question" not in record or answers is None:
            raise DatasetError(f"{where}, line {number}: a question line needs `question` and "
                               "`answers` (or `answer`)")
        # A null id is no id (DPR's JsonlQASrc reads both as None), not the query id "None".
        qid = str(number - 1 if record.get("id") is None else record["id"])
        at = f"{where}, line {number}"
        yield qid, _question(record, at), parse_answer_list(answers, at)


def iter_json_list(handle: IO[str], where: str, step: int = JSON_READ_CHARS,
                   limit: int = MAX_JSON_RECORD) -> Iterator[Any]:
    """The elements of a top-level JSON list, one at a time, reading `step` characters at a time
    (never the whole stream): memory holds one element plus one step."""
    decoder = json.JSONDecoder()
    buffer, offset, eof = "", 0, False  # offset: characters of the stream before buffer[0]

    def fill() -> bool:
        nonlocal buffer, eof
        if eof:
            return False
        chunk = handle.read(step)
        eof = not chunk
        buffer += chunk
        return bool(chunk)

    def skip_space(pos: int) -> int:
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n":
                pos += 1
            if pos < len(buffer) or not fill():
                return pos

    pos = skip_space(0)
    if pos >= len(buffer) or buffer[pos] != "[":
        raise DatasetError(f"{where}: expected a JSON list (`[`) at character {offset + pos}; DPR's "
                           "training files are one list of question objects")
    pos, first = pos + 1, True
    while True:
        pos = skip_space(pos)
        if pos >= len(buffer):
            raise DatasetError(f"{where}: the list ends without `]` at character {offset + pos} "
                               "(the file is cut short: download it again)")
        if buffer[pos] == "]":
            return
        if not first:
            if buffer[pos] != ",":
                raise DatasetError(f"{where}: expected `,` or `]` at character {offset + pos}")
            pos = skip_space(pos + 1)
        while True:
            try:
                value, end = decoder.raw_decode(buffer, pos)
                # A value that ends with the buffer may be a number cut by the read ('33' of
                # '333'): decode it again with more of the stream.
                if end < len(buffer) or not fill():
                    break
            except json.JSONDecodeError as error:
                if len(buffer) - pos > limit:
                    raise DatasetError(f"{where}: no complete JSON value within {limit} characters "
                                       f"from character {offset + pos} ({error.msg})") from None
                if not fill():
                    raise DatasetError(f"{where}: malformed or cut-short JSON at character "
                                       f"{offset + error.pos} ({error.msg})") from None
        yield value
        first = False
        buffer, offset, pos = buffer[end:], offset + end, 0


NEGATIVE_LISTS = ("hard_negative_ctxs", "negative_ctxs")


def _context_id(context: Any, where: str, kind: str = "positive") -> str:
    if not isinstance(context, dict):
        raise DatasetError(f"{where}: a context must be an object with passage_id, title, text")
    for key in ("passage_id", "psg_id", "id"):
        if context.get(key) not in (None, ""):
            return str(context[key])
    raise DatasetError(f"{where}: a {kind} context has no passage_id; it cannot be judged "
                       "against psgs_w100 (use DPR's files that carry passage ids)")


def _records(path: Path, member: str | None) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(query_id, record, where) of a biencoder file: ids are list positions, so every reader of
    the same file numbers its questions alike (the split's queries and its DPR negatives)."""
    where = _where(path, member)
    with open_text(path, member) as handle:
        for index, record in enumerate(iter_json_list(handle, where)):
            at = f"{where}, question {index}"
            if not isinstance(record, dict) or "question" not in record or "answers" not in record:
                raise DatasetError(f"{at}: a training record needs `question`, `answers` and "
                                   "`positive_ctxs`")
            yield str(index), record, at


def read_biencoder(path: Path, member: str | None = None
                   ) -> Iterator[tuple[str, str, list[str], list[str]]]:
    """(query_id, question, answers, positive passage ids) of a biencoder-*.json file, streamed."""
    for qid, record, at in _records(path, member):
        positives = [_context_id(c, at) for c in record.get("positive_ctxs") or []]
        yield qid, _question(record, at), parse_answer_list(record["answers"], at), positives


def read_biencoder_negatives(path: Path, member: str | None = None,
                             lists: tuple[str, ...] | list[str] = ("hard_negative_ctxs",)
                             ) -> Iterator[tuple[str, str, list[str]]]:
    """(query_id, question, negative passage ids) of a biencoder-*.json file, streamed: the
    contexts of `lists` (NEGATIVE_LISTS), list after list, each in the file's order. A list that
    is absent or null is empty (DPR's own reader treats it so). A question is a string or null
    (the caller compares it with the split's); another value is refused, naming the record."""
    unknown = [name for name in lists if name not in NEGATIVE_LISTS]
    if unknown or not lists:
        raise DatasetError(f"DPR negative lists {list(lists)}: choose among "
                           f"{', '.join(NEGATIVE_LISTS)}")
    for qid, record, at in _records(path, member):
        ids = []
        for name in lists:
            contexts = record.get(name) or []
            if not isinstance(contexts, list):
                raise DatasetError(f"{at}: `{name}` must be a list of contexts")
            ids += [_context_id(c, f"{at}, {name}", "negative") for c in contexts]
        yield qid, None if record["question"] is None else _question(record, at), ids
