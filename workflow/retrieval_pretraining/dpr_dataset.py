"""A `format: dpr` dataset's splits in the datasets contract (DPR's files: dpr_files.py).

A split names ONE source: `questions` (a qa.csv / JSON-lines file: question + answers) or
`biencoder` (a DPR training JSON: question + answers + positive passages). It becomes
- queries-{split}.parquet: every question (query_id = its 0-based position in the file), judged or
  not: open-domain QA scores a question by its answers, not by judgements;
- answers-{split}.parquet: its answer strings, as the file lists them. An answer with no token
  under DPR's normalisation (answers.py) is found in every passage by DPR's rule, and so by
  Acc@k: it is kept and counted (answers_without_tokens, questions_with_answers_without_tokens);
  a question with no answer at all keeps an empty list (questions_without_answers: Acc@k 0);
- qrels-{split}.parquet: relevance 1 for each positive passage a biencoder file names (repeats
  counted and kept once); empty for a `questions` split (score it with Acc@k, not qrels measures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from .answers import tokens
from .contracts.datasets import DatasetError
from .dataset_files import _split_entry, resolve_ref
from .dpr_files import read_biencoder, read_questions

SOURCES = ("questions", "biencoder")


def split_source(entry: dict[str, Any], split: str) -> str:
    """Which of SOURCES the split entry names (exactly one)."""
    spec = _split_entry(entry, split)
    named = [key for key in SOURCES if key in spec]
    if len(named) != 1:
        raise DatasetError(
            f"dataset {entry['name']!r} split {split!r}: a dpr split names exactly one of "
            f"`questions` (qa.csv) or `biencoder` (training JSON); it names {named or 'neither'}")
    return named[0]


def load_split(entry: dict[str, Any], split: str, data_root: str | None,
               downloads: Path | None = None
               ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, dict[str, Path], dict[str, int]]:
    """(queries, qrels, answers, input files, counts) of one split, streamed from its source."""
    source = split_source(entry, split)
    path, member = resolve_ref(_split_entry(entry, split)[source], entry, data_root, downloads)
    if source == "questions":
        records = ((qid, q, a, []) for qid, q, a in read_questions(path, member))
    else:
        records = read_biencoder(path, member)
    ids, texts, answer_lists, judged_q, judged_d = [], [], [], [], []
    counts = dict.fromkeys(("answers_without_tokens", "questions_with_answers_without_tokens",
                            "questions_without_answers", "repeated_positives",
                            "questions_without_positives"), 0)
    for qid, question, answers, positives in records:
        tokenless = sum(not tokens(a) for a in answers)
        counts["answers_without_tokens"] += tokenless
        counts["questions_with_answers_without_tokens"] += tokenless > 0
        counts["questions_without_answers"] += not answers
        unique = list(dict.fromkeys(positives))
        counts["repeated_positives"] += len(positives) - len(unique)
        counts["questions_without_positives"] += source == "biencoder" and not unique
        ids.append(qid)
        texts.append(question)
        answer_lists.append(list(answers))
        judged_q += [qid] * len(unique)
        judged_d += unique
    queries = pl.DataFrame({"query_id": ids, "text": texts},
                           schema={"query_id": pl.String, "text": pl.String})
    qrels = pl.DataFrame({"query_id": judged_q, "doc_id": judged_d, "relevance": [1] * len(judged_q)},
                         schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32})
    answers = pl.DataFrame({"query_id": ids, "answers": answer_lists},
                           schema={"query_id": pl.String, "answers": pl.List(pl.String)})
    return queries, qrels, answers, {source: path}, counts
