"""The run contract (results/runs/{dataset}/{system}/{split}.trec: bm25.py, dense_search.py).

TREC format, UTF-8 text, one hit per line: `query_id Q0 doc_id rank score tag`; per query, ranks
1..k in order, scores non-increasing, no document twice. evaluate.py parses runs strictly and fails
on anything else (its `_hits`); every reader of runs reads their lines through `utf8_lines`.
"""

from __future__ import annotations

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
