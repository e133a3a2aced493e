"""The marks in a table: significance against named baselines, and the best value in bold.

Each mark is a paired test over the per-query scores of the metrics JSON files (scores contract):
a two-tailed paired t-test (computed here from its formula, so that tests can check it against
scipy) or a paired randomisation test (the signs of the per-query differences flipped at random),
chosen by `report.significance.test`. A mark tests many rows against one baseline, so its p-values
are corrected for multiple testing (`correction`: Holm-Bonferroni, Bonferroni or none) within its
family: one baseline mark in one column of one table, i.e. every row tested against that baseline
in that column, across the table's row groups.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np
from scipy import stats

from .layout import Group, Row, shown
from .metrics import MetricsCache, paired_scores

log = logging.getLogger(__name__)

WORSE = "↓"  # follows a baseline's mark when the row is significantly WORSE than that baseline
TESTS = {
    "t-test": "two-tailed paired t-test",
    "permutation": "two-tailed paired randomisation test",
}
CORRECTIONS = {"holm": "Holm-Bonferroni", "bonferroni": "Bonferroni", "none": "none"}
PERMUTATION_SEED = 0  # every build of the same scores gives the same p-values


def settings(params: dict[str, Any]) -> dict[str, Any]:
    """report.significance with its defaults: t-test, 10,000 permutations, no correction."""
    sig = params["report"]["significance"]
    return {"test": "t-test", "permutations": 10000, "correction": "none"} | sig


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


def permutation_test(
    a: np.ndarray, b: np.ndarray, permutations: int = 10000, seed: int = PERMUTATION_SEED
) -> tuple[float, float]:
    """Two-tailed paired randomisation test of a vs b: (mean difference, p).

    Under the null each query's two scores are exchangeable, so the sign of its difference is a
    coin flip; p = (1 + #{|mean of randomly signed d| >= |mean d|}) / (1 + permutations) (the
    observed assignment counts as one, so p is never 0). Identical scores give (0.0, nan).
    """
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.size == 0 or not d.any():
        return 0.0, math.nan
    observed = abs(d.mean())
    rng = np.random.default_rng(seed)
    extreme, chunk = 0, max(1, min(permutations, 2_000_000 // d.size))
    for start in range(0, permutations, chunk):
        signs = rng.integers(0, 2, size=(min(chunk, permutations - start), d.size)) * 2 - 1
        means = np.abs(signs @ d) / d.size
        extreme += int((means >= observed * (1 - 1e-12)).sum())  # ties count as extreme
    return float(d.mean()), (extreme + 1) / (permutations + 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given: sorted ascending, the i-th of m
    (from 1) is min(1, max over j <= i of (m - j + 1) p_(j)); a hypothesis is rejected when its
    adjusted p is <= alpha (the step-down procedure). NaN (no test) stays NaN, outside the family.
    """
    order = [i for i in np.argsort(pvalues, kind="stable") if not math.isnan(pvalues[i])]
    m, adjusted, running = len(order), [math.nan] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def bonferroni(pvalues: Sequence[float]) -> list[float]:
    m = sum(not math.isnan(p) for p in pvalues)
    return [p if math.isnan(p) else min(1.0, m * p) for p in pvalues]


def adjust(pvalues: Sequence[float], correction: str) -> list[float]:
    if correction == "holm":
        return holm(pvalues)
    if correction == "bonferroni":
        return bonferroni(pvalues)
    return list(pvalues)


def baselines_for(spec: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
    if spec.get("baselines") is not None:
        return spec["baselines"]
    return params["report"]["significance"]["baselines"]


def baseline_system(baseline: dict[str, Any], row: Row, suffix: str | None) -> str | None:
    """The system `row` (in the group of stage `suffix`) is compared with, or None for no test:
    a fixed system (bm25, or a baseline encoder by name), a model at the same stage (BERT), or the
    row's own model at another stage (its zero-shot start, stage0: what fine-tuning added). A
    baseline encoder's row is tested against fixed systems only."""
    if "system" in baseline:
        return baseline["system"]
    if row.model is None:
        return None
    if "model" in baseline:
        return f"{baseline['model']}-{suffix}"
    if suffix == baseline["stage"]:
        return None
    return f"{row.model}-{baseline['stage']}"


def table_systems(groups: list[Group]) -> set[str]:
    """The systems the table has a row of: the only ones a mark may compare with, since a
    reader checks a mark against the baseline's number beside it (a table without a BM25 or a
    BERT row has no † or ‡)."""
    return {row.system for group in groups for row in group.rows
            if row.system is not None and not row.reference}


def tested_baselines(
    spec: dict[str, Any], groups: list[Group], params: dict[str, Any]
) -> list[dict[str, Any]]:
    """The table's baselines some row was tested against (their row shown, with scores): the
    ones its legend names."""
    return [
        b for b in baselines_for(spec, params)
        if any(baseline_system(b, row, group.suffix) in cell.tests
               for group in groups for row in group.rows for cell in row.cells)
    ]


def _test(ours, base, measure: str, label: str, sig: dict[str, Any]) -> tuple[float, float, int]:
    a, b, unmatched = paired_scores(ours, base, measure)
    if unmatched:
        log.warning(
            "%s: %d queries scored for only one system; testing the %d common ones",
            label, unmatched, a.size,
        )  # fmt: skip
    if sig["test"] == "permutation":
        statistic, p = permutation_test(a, b, sig["permutations"])
    else:
        statistic, p = paired_t_test(a, b)
    return statistic, p, int(a.size)


def mark_significance(
    groups: list[Group], spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache
) -> None:
    """Test every row of the table against each baseline that is a row of it too, correct each
    family (one baseline, one column), and mark the cells whose adjusted p is <= alpha."""
    sig = settings(params)
    key = "t" if sig["test"] == "t-test" else "mean_difference"
    in_table = table_systems(groups)
    for baseline in baselines_for(spec, params):
        for j, c in enumerate(spec["columns"]):
            family = []
            for group in groups:
                for row in group.rows:
                    base_system = baseline_system(baseline, row, group.suffix)
                    if row.reference or base_system in (None, row.system):
                        continue
                    if base_system not in in_table:
                        continue
                    ours = cache.get(c["dataset"], row.system, c["split"])
                    base = cache.get(c["dataset"], base_system, c["split"])
                    if ours is None or base is None:
                        continue
                    label = f"{row.system} vs {base_system} on {c['dataset']}/{c['split']}"
                    result = _test(ours, base, c["measure"], f"{label} {c['measure']}", sig)
                    family.append((row.cells[j], base_system, *result))
            adjusted = adjust([p for *_, p, _ in family], sig["correction"])
            size = sum(not math.isnan(p) for p in adjusted)
            for (cell, base_system, statistic, p, n), p_adjusted in zip(family, adjusted):
                cell.tests[base_system] = {key: statistic, "p": p, "p_adjusted": p_adjusted,
                                           "n": n, "family": size}
                if not math.isnan(p_adjusted) and p_adjusted <= sig["alpha"]:
                    cell.marks += baseline["mark"] + ("" if statistic > 0 else WORSE)


def family_sizes(spec: dict[str, Any], groups: list[Group], params: dict[str, Any]) -> dict:
    """{mark: the largest number of tests its family held in a column} (for the legend)."""
    sizes: dict[str, int] = {}
    for baseline in baselines_for(spec, params):
        for group in groups:
            for row in group.rows:
                base_system = baseline_system(baseline, row, group.suffix)
                for cell in row.cells:
                    test = cell.tests.get(base_system or "")
                    if test and not row.reference:
                        mark = baseline["mark"]
                        sizes[mark] = max(sizes.get(mark, 0), test["family"])
    return sizes


def mark_best(group: Group, decimals: int = 3) -> None:
    """Bold the best value of each column within a group as the table shows it (higher is better
    for every measure used): cells that show the same best number are all bold."""
    if len(group.rows) < 2 or any(r.reference for r in group.rows):
        return
    for j in range(len(group.rows[0].cells)):
        values = [shown(r.cells[j].value, decimals) for r in group.rows
                  if r.cells[j].value is not None]
        if not values:
            continue
        best = max(values)
        for r in group.rows:
            if r.cells[j].value is not None and shown(r.cells[j].value, decimals) == best:
                r.cells[j].bold = True
