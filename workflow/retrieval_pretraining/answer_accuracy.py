"""Top-k answer accuracy (`Acc@k`), DPR's retrieval score for open-domain QA.

A question scores 1 when any of its first k retrieved passages (in run order: score descending)
has an answer, else 0; questions missing from the run score 0; the mean is over every question of
the answers file. Whether a passage has an answer is answers.py's rule (DPR's has_answer), matched
by the same corpus pass as the answers negative filter's (answers.matching_pairs).

Kept apart from answers.py because the two rerun different stages: answers.py is a code input of
dataset preparation, BM25 negatives and mining, and so of every fine-tuning after them; this file
is run only by scoring (score_run), the tables and the audit, so an edit to Acc@k reruns those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .answers import matching_pairs

ACC_RE = re.compile(r"^Acc@([1-9][0-9]*)$")


def acc_cutoffs(measures: Iterable[str]) -> dict[str, int]:
    """{"Acc@20": 20, ...} for the answer-recall measures among `measures`."""
    return {m: int(match.group(1)) for m in measures if (match := ACC_RE.match(m))}


def top_k_accuracy(ranked: dict[str, list[str]], answers: dict[str, list[str]], corpus: Path,
                   cutoffs: dict[str, int], mode: str = "string") -> dict[str, dict[str, float]]:
    """{measure: {query_id: 0.0 | 1.0}} over every question of `answers` (module docstring);
    `ranked` holds each query's doc ids in rank order."""
    depth = max(cutoffs.values())
    top = {q: docs[:depth] for q, docs in ranked.items() if q in answers}
    hits = matching_pairs({q: set(d) for q, d in top.items()}, answers, corpus, mode)
    first_hit = {q: next((i for i, d in enumerate(docs) if d in hits[q]), depth)
                 for q, docs in top.items()}
    return {name: {q: float(first_hit.get(q, depth) < k) for q in sorted(answers)}
            for name, k in cutoffs.items()}
