"""The per-query metrics the tables read: one JSON file per (dataset, system, split).

Written by `evaluate.py` (rule score_run) under the scores contract: `aggregate` (measure -> mean),
`per_query` (measure -> query id -> score), `run`, `qrels`, `measures`, `relevance_level`. A
missing or malformed file (an aggregate that is not a finite number included) fails with the
command that builds it, unless partial tables were asked for (`MetricsCache`'s allow_missing: a
missing file's cell then shows –). A column names its measure as its
split's `measures` list does (`R@1000`); a split scored at relevance level 2 stores it as
`R(rel=2)@1000`, found here through `evaluate.stored_name`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BadInput
from ..evaluate import EvaluationError, stored_name


class MetricsError(BadInput, ValueError):
    """A metrics file is missing, malformed, or lacks the measure a table asks for."""


def metrics_path(results: Path, dataset: str, system: str, split: str) -> Path:
    return results / "metrics" / dataset / system / f"{split}.json"


@dataclass
class Metrics:
    path: Path
    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]
    run: str | None
    relevance_level: int = 1
    run_sha256: str | None = None  # None in metrics written before evaluate recorded them
    code_version: dict[str, str] | None = None

    def key(self, measure: str) -> str:
        """The name this file stores `measure` under (module docstring)."""
        if measure in self.aggregate:
            return measure
        try:
            return stored_name(measure, self.relevance_level)
        except EvaluationError:  # not a measure name at all: reported as missing by the caller
            return measure

    def threshold(self, measure: str) -> int | None:
        """The lowest grade `measure` counted as relevant where that is not 1 (a binary measure
        of a split scored at relevance_level 2: R@1000 stored as R(rel=2)@1000); None for level
        1 and for measures without a threshold (nDCG's graded gains, Acc@k's answers): those
        keep at the split's level the name they have at level 1 (NDCG@10 is nDCG@10 at both)."""
        if self.relevance_level == 1 or self.key(measure) == measure_name(measure):
            return None
        return self.relevance_level


def measure_name(measure: str) -> str:
    """ir_measures' own name of `measure`, as evaluate stores it at relevance level 1 and as the
    published numbers are keyed (paper_numbers.py): a column may write one that ir_measures
    reads as another (NDCG@10, Recall@100, the papers' MRR@10 are nDCG@10, R@100, RR@10)."""
    try:
        return stored_name(measure)
    except EvaluationError:  # not a measure: no published number has it either
        return measure


def _is_finite_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def load_metrics(path: Path) -> Metrics:
    if not path.is_file():
        raise MetricsError(
            f"metrics file {path} does not exist; build it with "
            f"`snakemake {path}` (rule score_run)"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise MetricsError(f"{path}: not JSON ({error}); delete it and rerun score_run") from error
    if not isinstance(data, dict):
        raise MetricsError(f"{path}: not a JSON object (scores contract: aggregate, per_query, "
                           "run, qrels, measures); delete it and rerun score_run")
    for key in ("aggregate", "per_query"):
        if not isinstance(data.get(key), dict):
            raise MetricsError(
                f"{path}: key '{key}' missing or not an object (scores contract: "
                "aggregate, per_query, run, qrels, measures)"
            )
    for measure, value in data["aggregate"].items():
        # A NaN would print as "nan" and, compared first, keep the column's best value unbolded.
        if not _is_finite_number(value):
            raise MetricsError(
                f"{path}: aggregate {measure!r} is {value!r}, not a finite number; the scoring "
                "went wrong: delete the file and rerun score_run"
            )
    return Metrics(path, data["aggregate"], data["per_query"], data.get("run"),
                   int(data.get("relevance_level", 1)), data.get("run_sha256"),
                   data.get("code_version"))


class MetricsCache:
    def __init__(self, results: Path, allow_missing: bool = False):
        self.results, self.allow_missing, self._cache = results, allow_missing, {}
        self.missing: list[Path] = []

    def get(self, dataset: str, system: str, split: str) -> Metrics | None:
        path = metrics_path(self.results, dataset, system, split)
        if path not in self._cache:
            try:
                self._cache[path] = load_metrics(path)
            except MetricsError:
                if not (self.allow_missing and not path.exists()):
                    raise
                self.missing.append(path)
                self._cache[path] = None
        return self._cache[path]


def measure_value(m: Metrics, measure: str) -> float:
    key = m.key(measure)
    if key not in m.aggregate:
        raise MetricsError(
            f"{m.path}: no aggregate value for {measure!r} (it has "
            f"{', '.join(sorted(m.aggregate))}); add it to the evaluate config"
        )
    return float(m.aggregate[key])


def paired_scores(a: Metrics, b: Metrics, measure: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-query scores of both systems on the queries both were scored on (and how many differ)."""
    for m in (a, b):
        if m.key(measure) not in m.per_query:
            raise MetricsError(
                f"{m.path}: no per-query scores for {measure!r}; the significance "
                "test needs them (scores contract: per_query)"
            )
    qa, qb = a.per_query[a.key(measure)], b.per_query[b.key(measure)]
    common = sorted(set(qa) & set(qb))
    unmatched = len(set(qa) ^ set(qb))
    return (
        np.array([qa[q] for q in common], dtype=np.float64),
        np.array([qb[q] for q in common], dtype=np.float64),
        unmatched,
    )
