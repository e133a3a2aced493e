"""The run contract (results/runs/{dataset}/{system}/{split}.trec: bm25.py, dense_search.py).

TREC format, UTF-8 text, one hit per line: `query_id Q0 doc_id rank score tag`; per query, ranks
1..k in order, scores non-increasing, no document twice. evaluate.py parses runs strictly and fails
on anything else (its `_hits`); every reader of runs (and of TREC qrels) reads their lines through
`utf8_lines` and splits them with `trec_fields`, as trec_eval does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator


def utf8_lines(
    path: str | Path, error: type[Exception], what: str = "a TREC run"
) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of `path`; a byte that is not UTF-8 raises `error` with
    the file, the line, the column and the fix (instead of a bare UnicodeDecodeError)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise error(
                    f"{path}, line {number}: byte 0x{raw[bad.start]:02x} at column {bad.start + 1} "
                    f"is not valid UTF-8 ({what} is UTF-8 text); re-save the file as UTF-8, or "
                    "rerun the step that wrote it"
                ) from None


# What trec_eval splits a run or qrels line's fields on: C's isspace in the C locale. str.split()
# also splits on \x1c-\x1f and on Unicode spaces (U+00A0, U+2003, U+3000, ...), which trec_eval
# keeps inside a field: to it a doc id holding a no-break space is one id.
TREC_WHITESPACE = " \t\n\v\f\r"
_FIELD = re.compile(f"[^{re.escape(TREC_WHITESPACE)}]+")
_INFO_SEPARATORS = re.compile("[\x1c-\x1f]")


def trec_fields(line: str) -> list[str]:
    """The fields of a TREC run or qrels line as trec_eval reads them: runs of characters other
    than TREC_WHITESPACE."""
    if line.isascii() and not _INFO_SEPARATORS.search(line):
        # The same fields, about twice as fast on runs of millions of lines: within ASCII,
        # str.split's whitespace beyond TREC_WHITESPACE is \x1c-\x1f alone.
        return line.split()
    return _FIELD.findall(line)
