"""How `audit` shows and checks a metrics file (each aggregate the mean of its per-query scores),
and how the stage statistics page reads one (`metrics_as_manifest`: it has no manifest)."""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..base import RANK_JSON, Audit, json_kind, read_manifest, show_manifest, show_snakemake_record

KEYS = {"aggregate", "per_query"}  # what makes a JSON file a metrics file


def is_metrics(data: Any) -> bool:
    return isinstance(data, dict) and KEYS <= set(data)


def audit_metrics(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "metrics (scores contract)"
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.say(f"-- run {data.get('run')}  qrels {data.get('qrels')}")
    for measure, value in data["aggregate"].items():
        scores = list((data["per_query"].get(measure) or {}).values())
        a.say(f"  {measure:12s} {value:.4f}  over {len(scores)} queries")
        if scores:
            a.check(
                f"{measure} aggregate = mean of per-query scores",
                math.isclose(value, float(np.mean(scores)), abs_tol=1e-4),
                f"{value:.4f} vs {np.mean(scores):.4f}",
            )
    for measure in data.get("measures", []):
        a.check(f"measure {measure} present", measure in data["aggregate"])


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
        | {k: data[k] for k in ("queries", "queries_missing_from_run", "run_depth") if k in data},
    }


KINDS = [json_kind("metrics", RANK_JSON + 0, lambda p: is_metrics(p.data), audit_metrics)]
