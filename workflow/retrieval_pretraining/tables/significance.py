"""The marks in a table: significance against named baselines, and the best value in bold.

Significance is a two-tailed paired t-test over the per-query scores of the metrics JSON files
(scores contract), computed here from its formula so that tests can check it against scipy.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from scipy import stats

from .layout import Group, Row
from .metrics import MetricsCache, paired_scores

log = logging.getLogger(__name__)

WORSE = "↓"  # follows a baseline's mark when the row is significantly WORSE than that baseline


def paired_t_test(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-tailed paired t-test of a vs b: t = mean(d) / (sd(d) / sqrt(n)), df = n - 1.

    Zero variance: identical scores give (nan, nan) (no evidence either way); a constant non-zero
    difference gives (+-inf, 0.0).
    """
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = d.size
    if n < 2:
        return math.nan, math.nan
    mean, sd = d.mean(), d.std(ddof=1)
    if sd == 0:
        return (math.nan, math.nan) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return float(t), float(2 * stats.t.sf(abs(t), df=n - 1))


def baselines_for(spec: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
    if spec.get("baselines") is not None:
        return spec["baselines"]
    return params["report"]["significance"]["baselines"]


def baseline_system(baseline: dict[str, Any], row: Row, suffix: str | None) -> str | None:
    """The system `row` (in the group of stage `suffix`) is compared with, or None for no test:
    a fixed system (bm25), a model at the same stage (BERT), or the row's own model at another
    stage (its zero-shot start, stage0: what fine-tuning added)."""
    if "system" in baseline:
        return baseline["system"]
    if "model" in baseline:
        return f"{baseline['model']}-{suffix}"
    if suffix == baseline["stage"] or row.model is None:
        return None
    return f"{row.model}-{baseline['stage']}"


def mark_significance(
    group: Group, spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache
) -> None:
    alpha = params["report"]["significance"]["alpha"]
    for baseline in baselines_for(spec, params):
        for row in group.rows:
            base_system = baseline_system(baseline, row, group.suffix)
            if base_system is None or row.system == base_system:
                continue
            for c, cell in zip(spec["columns"], row.cells):
                ours = cache.get(c["dataset"], row.system, c["split"])
                base = cache.get(c["dataset"], base_system, c["split"])
                if ours is None or base is None:
                    continue
                a, b, unmatched = paired_scores(ours, base, c["measure"])
                if unmatched:
                    log.warning(
                        "%s vs %s on %s/%s %s: %d queries scored for only one system; "
                        "testing the %d common ones",
                        row.system,
                        base_system,
                        c["dataset"],
                        c["split"],
                        c["measure"],
                        unmatched,
                        a.size,
                    )
                t, p = paired_t_test(a, b)
                cell.tests[base_system] = {"t": t, "p": p, "n": int(a.size)}
                if not math.isnan(p) and p <= alpha:
                    cell.marks += baseline["mark"] + ("" if t > 0 else WORSE)


def mark_best(group: Group) -> None:
    """Bold the best value of each column within a group (higher is better for every measure
    used)."""
    if len(group.rows) < 2 or any(r.reference for r in group.rows):
        return
    for j in range(len(group.rows[0].cells)):
        values = [r.cells[j].value for r in group.rows if r.cells[j].value is not None]
        if not values:
            continue
        best = max(values)
        for r in group.rows:
            if r.cells[j].value is not None and r.cells[j].value == best:
                r.cells[j].bold = True
