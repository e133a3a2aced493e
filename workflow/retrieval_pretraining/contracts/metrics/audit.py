"""How `audit` shows and checks a metrics file (each aggregate the mean of its per-query scores,
the total for ir_measures' counts, one per-query score per query counted, each score in [0, 1]
unless the measure is a count, the run scored still the one whose sha256 it records; shown: the
queries the run and the qrels do not share, with example ids), and how the stage statistics page
reads one (`metrics_as_manifest`: it has no manifest)."""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ... import artifacts
from ...answer_accuracy import acc_cutoffs
from ..base import (
    RANK_JSON, Audit, input_path, json_kind, read_manifest, show_manifest, show_snakemake_record,
)

KEYS = {"aggregate", "per_query"}  # what makes a JSON file a metrics file


def is_metrics(data: Any) -> bool:
    return isinstance(data, dict) and KEYS <= set(data)


def audit_metrics(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "metrics (scores contract)"
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.say(f"-- run {data.get('run')}  qrels {data.get('qrels')}")
    show_coverage(a, data)
    for measure, value in data["aggregate"].items():
        scores = list((data["per_query"].get(measure) or {}).values())
        a.say(f"  {measure:12s} {value:.4f}  over {len(scores)} queries")
        if scores:
            # evaluate.py aggregates as ir_measures does: counts are totals, the rest means.
            how, expected = ("mean", float(np.mean(scores))) if bounded(measure) else (
                "total", float(np.sum(scores)))
            a.check(
                f"{measure} aggregate = {how} of per-query scores",
                math.isclose(value, expected, abs_tol=1e-4),
                f"{value:.4f} vs {expected:.4f}",
            )
    for measure in data.get("measures", []):
        a.check(f"measure {measure} present", measure in data["aggregate"])
    check_per_query(a, data)
    check_run_checksum(a, data)


# The coverage counts evaluate.py records, and what each means for the scores.
COVERAGE = (
    ("queries_missing_from_run", "qrels queries the run does not answer (each scores 0)"),
    ("run_queries_without_qrels", "run queries without qrels (not scored, as trec_eval)"),
    ("questions_missing_from_run", "questions the run does not answer (each scores 0)"),
    ("run_queries_without_answers", "run queries that are no question (not scored)"),
)


def show_coverage(a: Audit, data: dict) -> None:
    """The queries the run and the judgements do not share, as the file counts them with a few of
    their ids: a score lowered by unanswered queries, or a run of another split, shows here."""
    for key, what in COVERAGE:
        if key not in data:
            continue  # Acc@k only, qrels only, or a file scored before the count was kept
        examples = data.get(f"{key}_examples")
        named = f", e.g. {examples}" if data[key] and examples else ""
        a.say(f"  {what}: {data[key]}{named}")


def bounded(measure: str) -> bool:
    """Every measure the workflow scores is a fraction in [0, 1] (nDCG, R, P, RR, AP, Acc@k, ...)
    except ir_measures' counts (NumQ, NumRet, NumRel, NumRelRet)."""
    return not measure.startswith("Num")


def check_per_query(a: Audit, data: dict) -> None:
    """evaluate.py scores every qrels query (0 for one the run misses) and every question for
    Acc@k: a per-query list of another length makes the aggregate a mean over other queries,
    and the tables' paired tests would pair the wrong ones."""
    for measure, values in data["per_query"].items():
        counted = data.get("questions") if acc_cutoffs([measure]) else data.get("queries")
        if counted is not None:
            a.check(f"{measure}: one per-query score per query ({counted})",
                    len(values) == counted, f"{len(values)} scores")
        if bounded(measure):
            outside = [q for q, v in values.items() if not 0 <= v <= 1]
            a.check(f"{measure}: every per-query score in [0, 1]", not outside,
                    f"{len(outside)} outside, e.g. "
                    f"{[(q, values[q]) for q in outside[:3]]}" if outside else "")


def check_run_checksum(a: Audit, data: dict) -> None:
    """The run the scores came from is still the one scored: a run rewritten after scoring (a
    search rerun whose scoring did not) leaves the tables citing numbers of another run."""
    if "run_sha256" not in data or not data.get("run"):
        return
    run = input_path(data["run"], a.path)
    if not run.is_file():
        a.say(f"  (run {run} not here: its sha256 not compared)")
        return
    actual = artifacts.sha256_file(run)
    a.check("the run still has the recorded sha256 (run_sha256)", actual == data["run_sha256"],
            f"{run}: {actual} vs {data['run_sha256']}")


def metrics_as_manifest(path: Path) -> dict[str, Any] | None:
    """A metrics file's statistics as a manifest would give them (for the stage statistics page):
    the scores and counts; None for any other file."""
    if not (path.is_file() and path.suffix == ".json"):
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not is_metrics(data):
        return None
    created = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc)
    return {
        "stage": "score_run",
        "created": created.isoformat(timespec="seconds"),
        "stats": data["aggregate"]
        | {k: data[k] for k in ("queries", "queries_missing_from_run", "run_queries_without_qrels",
                                "run_depth") if k in data},
    }


KINDS = [json_kind("metrics", RANK_JSON + 0, lambda p: is_metrics(p.data), audit_metrics)]
