"""The retrieval dataset contract (results/datasets/{dataset}/, written by datasets.py).

    corpus.parquet            doc_id string, title string, text string (doc_id unique)
    queries-{split}.parquet   query_id string, text string (the split's judged queries, unique)
    qrels-{split}.parquet     query_id string, doc_id string, relevance int32 (each pair once)
    answers-{split}.parquet   query_id string, answers list<string> (open-domain QA datasets,
                              format dpr: what Acc@k and the answers negative filter match)
    dataset.json              title mode, query-id rule, corpus quirks

Quirks are counted, never silently fixed (datasets.py's docstring says which and why): the counts
are made by the checks the writer runs before publishing (checks.py, the one part that needs
polars; the schemas and title modes here are read by torch-side code too, on machines without it).
"""

from __future__ import annotations

import pyarrow as pa

from ...errors import BadInput

CORPUS_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
QUERIES_SCHEMA = pa.schema([("query_id", pa.string()), ("text", pa.string())])
QRELS_SCHEMA = pa.schema(
    [("query_id", pa.string()), ("doc_id", pa.string()), ("relevance", pa.int32())]
)
ANSWERS_SCHEMA = pa.schema([("query_id", pa.string()), ("answers", pa.list_(pa.string()))])
TITLE_MODES = ("none", "sep", "space")  # dataset.json's `title`: how title and text are joined


class DatasetError(BadInput, ValueError):
    """An input file is malformed (the message names the file, the line and the fix)."""


def join_title(title: str | None, text: str | None, mode: str, sep_token: str = "[SEP]") -> str:
    """The document representation: `none` = text, `sep` = `title [SEP] text`, `space` = `title text`.

    An empty title gives the text alone in every mode (no dangling separator).
    """
    if mode not in TITLE_MODES:
        raise ValueError(f"title mode {mode!r} unknown; use one of {', '.join(TITLE_MODES)}")
    title, text = title or "", text or ""
    if mode == "none" or not title:
        return text
    if mode == "sep":
        return f"{title} {sep_token} {text}"
    return f"{title} {text}"
