"""Significance as IR reports it: paired tests, corrected for multiple testing within each mark's
family (one baseline, one column), and the baseline encoders' rows (evaluate.baselines)."""

import itertools
import json
import math

import numpy as np
import pytest

from retrieval_pretraining.tables.make import make_tables
from retrieval_pretraining.tables.significance import (
    bonferroni,
    holm,
    paired_t_test,
    permutation_test,
)

from test_tables import QIDS, params, write_metrics

# R's multtest (mt.rawp2adjp) on ten p-values, as statsmodels' own tests record it
# (statsmodels/stats/tests/test_multi.py, res_multtest1: columns rawp, Bonferroni, Holm).
R_RAW = [5.23656777208e-05, 2.8140506198e-04, 1.49877310796e-02, 2.02732688798e-02,
         0.177096952723, 0.642193923795, 0.680845947633, 0.71626938238, 0.838541367553,
         0.967833824309]  # fmt: skip
R_BONFERRONI = [5.23656777208e-04, 2.8140506198e-03, 0.149877310796, 0.202732688798] + [1.0] * 6
R_HOLM = [5.23656777208e-04, 2.53264555782e-03, 0.1199018486368, 0.1419128821586] + [1.0] * 6


def test_holm_on_a_hand_computed_case():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, 0.5]) == pytest.approx([0.4, 0.5])  # capped at 1 only above it
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])


def test_holm_and_bonferroni_match_r_multtest_in_any_order():
    order = np.random.default_rng(3).permutation(len(R_RAW))
    raw = [R_RAW[i] for i in order]
    np.testing.assert_allclose(holm(raw), [R_HOLM[i] for i in order], rtol=1e-12)
    np.testing.assert_allclose(bonferroni(raw), [R_BONFERRONI[i] for i in order], rtol=1e-12)
    # statsmodels' reject at alpha 0.1: the two smallest only (Holm), as adjusted p <= alpha
    assert [p <= 0.1 for p in holm(R_RAW)] == [True, True] + [False] * 8


def test_an_untestable_comparison_stays_outside_the_family():
    adjusted = holm([0.01, math.nan, 0.02])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02)
    assert adjusted[2] == pytest.approx(0.02)  # m = 2, not 3


def test_permutation_test_approaches_the_exact_randomisation_p_value():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, 10), rng.uniform(0, 1, 10)
    d = a - b
    signs = np.array(list(itertools.product([-1, 1], repeat=d.size)))
    exact = np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12)  # all 1,024 assignments
    mean, p = permutation_test(a, b, permutations=50000)
    assert mean == pytest.approx(d.mean())
    assert p == pytest.approx(exact, abs=0.01)
    assert permutation_test(a, b, 2000) == permutation_test(a, b, 2000)  # seeded
    assert math.isnan(permutation_test(a, a)[1])


def test_the_observed_assignment_counts_once_so_p_is_never_below_one_over_n_plus_one():
    """20 positive differences of distinct sizes: only the all-plus and all-minus sign patterns
    (2 of 2^20) reach |mean d|, so 99 random ones find none: p = (0 + 1) / (99 + 1), exactly."""
    a, b = np.arange(1.0, 21.0), np.zeros(20)
    assert permutation_test(a, b, 99) == (10.5, 0.01)


def test_sign_patterns_that_tie_with_the_observed_mean_count_as_extreme():
    """Two queries, both differences 0.25: the patterns ++ and -- reach |mean d| = 0.25 (ties),
    +- and -+ reach 0: the exact p is 2/4 = 0.5. Not counting ties would give ~1/20001."""
    mean, p = permutation_test(np.array([0.5, 0.5]), np.array([0.25, 0.25]), 20000)
    assert mean == 0.25
    assert p == pytest.approx(0.5, abs=0.02)  # 0.5 +- 5.7 standard errors of 20,000 draws


def test_a_tie_that_differs_from_the_observed_mean_only_by_rounding_still_counts():
    """Differences 0.1, 0.5, 0.5, -1.0: flipping the 0.1 alone, or the 0.5, 0.5, -1.0 together
    (their sum is exactly 0), or all of them or none, gives |mean| = 0.025, and every other pattern
    at least 0.225: the exact p is 1. But 0.1 + 0.5 + 0.5 - 1.0 rounds differently in another order
    (d.mean() gives 0.025000000000000022, the matrix product of a pattern a few ulps less, even for
    the observed pattern itself), so an exact >= drops these ties: p ~0.77."""
    a, b = np.array([0.1, 0.5, 0.5, 0.0]), np.array([0.0, 0.0, 0.0, 1.0])
    mean, p = permutation_test(a, b, 999)
    assert mean == pytest.approx(0.025)
    assert p == 1.0
    # A mean difference of exactly 0 (observed 0, the tolerance no help or harm): every pattern ties.
    assert permutation_test(np.array([0.5, 0.0]), np.array([0.0, 0.5]), 999) == (0.0, 1.0)


def test_permutation_and_t_test_agree_on_a_large_sample():
    rng = np.random.default_rng(2)
    a = rng.uniform(0, 1, 300)
    b = a - 0.02 + rng.normal(0, 0.15, 300)
    assert permutation_test(a, b)[1] == pytest.approx(paired_t_test(a, b)[1], abs=0.01)


def _family_of_three(tmp_path):
    """Three models each better than BM25 with t = 2.2, 2.3, 2.4 over 40 queries (raw p 0.034,
    0.027, 0.021: each significant alone, none after Holm over the three)."""
    rng = np.random.default_rng(5)
    results = tmp_path / "results"
    base = rng.uniform(0.2, 0.6, len(QIDS))
    write_metrics(results, "scifact", "bm25", "test", {"nDCG@10": base})
    for name, t in (("bert", 2.2), ("costa", 2.3), ("bow", 2.4)):
        noise = rng.normal(0, 1, len(QIDS))
        noise = (noise - noise.mean()) / noise.std(ddof=1) * 0.08  # sd of the differences 0.08
        shift = t * 0.08 / math.sqrt(len(QIDS))
        scores = {"nDCG@10": base + shift + noise}
        write_metrics(results, "scifact", f"{name}-stage1", "test", scores)
    return results


def _build(tmp_path, results, significance, **table):
    column = {"dataset": "scifact", "split": "test", "measure": "nDCG@10", "label": "nDCG@10"}
    p = params(
        stages=[{"suffix": "stage1", "label": "stage 1"}],
        significance={"alpha": 0.05, "baselines": [{"system": "bm25", "mark": "†"}]}
        | significance,
        tables=[{"name": "t", "columns": [column], "rows": None} | table],
    )
    p["baselines"] = {
        "minilm": {"label": "MiniLM (zero-shot)", "encoder": "results/checkpoints/minilm",
                   "published": [{"dataset": "scifact", "split": "test", "measure": "nDCG@10",
                                  "value": 0.5, "source": "MTEB"}]},
    }  # fmt: skip
    out = tmp_path / f"tables-{len(list(tmp_path.glob('tables-*')))}.md"
    summary = make_tables(p, results, out, tmp_path / "tables.json")
    cells = {r["system"]: r["cells"][0] for g in summary["tables"]["t"] for r in g["rows"]}
    return cells, out.read_text()


def test_holm_corrects_over_every_row_a_mark_tests_in_a_column(tmp_path):
    results = _family_of_three(tmp_path)
    raw, text = _build(tmp_path, results, {"correction": "none"})
    corrected, holm_text = _build(tmp_path, results, {"correction": "holm"})
    systems = ["bert-stage1", "costa-stage1", "bow-stage1"]
    pvalues = [raw[s]["tests"]["bm25"]["p"] for s in systems]
    assert all(0.02 < p < 0.035 for p in pvalues) and all(raw[s]["marks"] == "†" for s in systems)
    for system, adjusted in zip(systems, holm(pvalues)):
        test = corrected[system]["tests"]["bm25"]
        assert test["p_adjusted"] == pytest.approx(adjusted) and test["family"] == 3
        assert corrected[system]["marks"] == ("†" if adjusted <= 0.05 else "")
    assert not any(corrected[s]["marks"] for s in systems)  # 3 x 0.021 > 0.05: the correction bit
    assert "not corrected for multiple testing" in text
    assert "Holm-Bonferroni-adjusted p ≤ 0.05" in holm_text and "† 3 tests" in holm_text
    assert "one mark in one column" in holm_text


def test_the_permutation_test_is_selectable_and_named(tmp_path):
    results = _family_of_three(tmp_path)
    cells, text = _build(tmp_path, results, {"test": "permutation", "permutations": 2000,
                                             "correction": "holm"})
    test = cells["costa-stage1"]["tests"]["bm25"]
    assert test["mean_difference"] == pytest.approx(2.3 * 0.08 / math.sqrt(len(QIDS)))
    assert 0.01 < test["p"] < 0.05
    assert "randomisation test" in text and "2,000 random sign flips" in text


def test_a_baseline_encoder_row_shows_its_published_number_and_is_tested_too(tmp_path):
    results = _family_of_three(tmp_path)
    v = np.full(len(QIDS), 0.55)
    write_metrics(results, "scifact", "minilm", "test", {"nDCG@10": v})
    cells, text = _build(tmp_path, results, {"correction": "holm"}, rows=[],
                         baseline_rows=["minilm"])
    assert set(cells) == {"bm25", "minilm"}  # rows: [] = no model rows
    assert cells["minilm"]["published"] == 0.5 and "| MiniLM (zero-shot) | " in text
    assert "(0.500, Δ +0.050)" in text and "sources: MTEB" in text
    assert cells["minilm"]["tests"]["bm25"]["family"] == 1
    summary = json.loads((tmp_path / "tables.json").read_text())
    assert summary["tables"]["t"][-1]["group"].startswith("Baseline encoders")


def test_a_delta_that_rounds_to_nothing_is_shown_without_a_sign():
    from retrieval_pretraining.tables.render import signed

    assert signed(0.6450817 - 0.6451, 3) == "±0.000"  # the demo's all-MiniLM-L6-v2 row
    assert signed(0.012, 3) == "+0.012" and signed(-0.0051, 3) == "-0.005"
