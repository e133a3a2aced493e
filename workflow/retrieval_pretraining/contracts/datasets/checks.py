"""The checks datasets.py runs on a dataset's tables before publishing them: ids unique and each
one a TREC line can hold as one field, each (query, document) pair judged once, and every quirk
counted (what dataset.json reports). `audit` checks the published ids with `untrec_ids` too."""

from __future__ import annotations

from typing import Any

import polars as pl

from ..runs import TREC_WHITESPACE
from . import DatasetError


def check_unique(frame: pl.DataFrame, column: str, what: str) -> None:
    dupes = frame.filter(pl.col(column).is_duplicated())
    if dupes.height:
        sample = dupes[column].unique(maintain_order=True).head(5).to_list()
        raise DatasetError(
            f"{what}: {dupes[column].n_unique()} duplicated {column}s (e.g. {sample}); ids must be "
            "unique, fix the input file"
        )


# An id holding one of these characters is two fields of a TREC run or qrels line (trec_eval
# splits on C's isspace); as a regex class, written out as escapes.
_TREC_BREAK = "[" + "".join(f"\\x{ord(c):02x}" for c in TREC_WHITESPACE) + "]"


def untrec_ids(ids: pl.Series) -> pl.Series:
    """Which ids no TREC run or qrels line can hold as one field: an empty one, or one holding
    TREC_WHITESPACE (space, tab, \\n, \\v, \\f, \\r). Unicode spaces (U+00A0, U+3000) stay
    inside a field for trec_eval and for our readers, and are legal."""
    return ids.str.contains(_TREC_BREAK) | (ids == "")


def why_untrec(value: str) -> str:
    """What makes `value` (one of untrec_ids) no TREC field: its first such character."""
    found = [c for c in value if c in TREC_WHITESPACE][:1]
    return f"holds {found[0]!r}" if found else "is empty"


def check_trec_ids(ids: pl.Series, where: str, kind: str, listed: pl.Series | None = None,
                   before: int = 0) -> None:
    """Refuse an id no TREC run or qrels line can hold as one field (untrec_ids): evaluation
    would refuse every run ranking it, after the corpus had been encoded and searched.
    `listed`: the ids in the order `where` lists them (default `ids`), after `before` other
    records; the record named is the id's first. One vectorised pass: 25-40 ms per million ids,
    ~2% of reading them from a TSV."""
    bad = untrec_ids(ids)
    if not bad.any():
        return
    value = ids.filter(bad)[0]
    record = before + (ids if listed is None else listed).index_of(value) + 1
    raise DatasetError(
        f"{where}, record {record}: {kind} id {value!r} {why_untrec(value)}, which a TREC run line "
        "cannot hold as one field (its fields are split on whitespace: evaluation would refuse "
        "the run after the corpus was encoded and searched); rename the id in that file and "
        "wherever the dataset's other files name it (e.g. whitespace as '_'), then prepare the "
        "dataset again"
    )


def _blank(column: str) -> pl.Expr:
    return pl.col(column).str.strip_chars() == ""


def check_corpus_batch(batch: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Nulls as empty strings; count the documents, empty texts and titles of one batch."""
    batch = batch.with_columns(pl.col("title").fill_null(""), pl.col("text").fill_null(""))
    return batch, {
        "documents": batch.height,
        "empty_text": batch.filter(_blank("text")).height,
        "empty_title": batch.filter(_blank("title")).height,
        "empty_title_and_text": batch.filter(_blank("text") & _blank("title")).height,
    }


def check_split(
    queries: pl.DataFrame, qrels: pl.DataFrame, doc_ids: pl.DataFrame, what: str
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Keep the judged queries, keep every judgement of a known query; count each quirk.

    queries_without_qrels: queries of the file never judged in this split (for BEIR, whose
    queries.jsonl holds every split, these are mostly the other splits' queries).
    judged_documents_missing: distinct documents the kept judgements name that the corpus lacks
    (qrels_missing_document counts the judgements); the writer refuses more than its entry allows.
    judged_queries_unknown: distinct queries the qrels judge that the queries lack (their
    judgements are dropped; qrels_unknown_query counts them); likewise refused beyond the allowance.
    """
    queries = queries.with_columns(pl.col("text").fill_null(""))
    check_unique(queries, "query_id", f"{what} queries")
    repeated = qrels.height - qrels.unique(["query_id", "doc_id"]).height
    if repeated:
        raise DatasetError(
            f"{what} qrels: {repeated} repeated (query, document) pairs; each pair must be judged "
            "once, fix the qrels file"
        )
    known = qrels.join(queries.select("query_id"), on="query_id", how="semi")
    judged = queries.join(known.select("query_id").unique(), on="query_id", how="semi")
    missing_docs = known.join(doc_ids, on="doc_id", how="anti")
    self_ids = judged.join(doc_ids.rename({"doc_id": "query_id"}), on="query_id", how="semi")
    missing_ids = missing_docs["doc_id"].unique(maintain_order=True)
    unknown_ids = qrels.join(queries.select("query_id"), on="query_id", how="anti")[
        "query_id"].unique(maintain_order=True)
    stats = {
        "queries": judged.height,
        "queries_without_qrels": queries.height - judged.height,
        "qrels": known.height,
        "judged_documents": known["doc_id"].n_unique(),
        "judged_documents_missing": missing_ids.len(),
        "judged_documents_missing_examples": missing_ids.head(5).to_list(),
        "qrels_unknown_query": qrels.height - known.height,
        "judged_queries_unknown": unknown_ids.len(),
        "judged_queries_unknown_examples": unknown_ids.head(5).to_list(),
        "qrels_missing_document": missing_docs.height,
        "qrels_missing_document_examples": [list(r) for r in missing_docs.head(5).rows()],
        "positive_qrels": known.filter(pl.col("relevance") > 0).height,
        "relevance_levels": {
            str(level): n for level, n in sorted(known.group_by("relevance").len().iter_rows())
        },
        "query_ids_equal_doc_ids": self_ids.height,
        "empty_queries": judged.filter(_blank("text")).height,
    }
    return judged, known, stats
