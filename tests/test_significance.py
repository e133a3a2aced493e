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


def test_the_significance_defaults_are_the_documented_ones():
    """report.schema.yaml: a t-test, 10,000 sign flips for the permutation test, no correction."""
    from retrieval_pretraining.tables.significance import settings

    got = settings({"report": {"significance": {"alpha": 0.05, "baselines": []}}})
    assert got == {"test": "t-test", "permutations": 10000, "correction": "none", "alpha": 0.05,
                   "baselines": []}


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
    assert bonferroni([0.01, math.nan, 0.02]) == pytest.approx([0.02, math.nan, 0.04],
                                                               nan_ok=True)  # m = 2 there too


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


def test_a_row_significantly_worse_by_either_test_is_marked_worse(tmp_path):
    """The permutation test's statistic is the signed mean difference (ours - baseline), as the
    t-test's t is signed: a row below BM25 on every query gets † followed by ↓ from both."""
    rng = np.random.default_rng(5)
    base = rng.uniform(0.2, 0.6, len(QIDS))
    results = tmp_path / "results"
    write_metrics(results, "scifact", "bm25", "test",
                  {"nDCG@10": base + 0.1 + rng.normal(0, 0.02, len(QIDS))})
    write_metrics(results, "scifact", "costa-stage1", "test", {"nDCG@10": base})
    for test, key in (("t-test", "t"), ("permutation", "mean_difference")):
        cells, _ = _build(tmp_path, results, {"test": test, "permutations": 999},
                          rows=[{"model": "costa"}])
        assert cells["costa-stage1"]["tests"]["bm25"][key] < 0, test
        assert cells["costa-stage1"]["marks"] == "†↓", test
    mean, p = permutation_test(base, base + 0.1, 999)
    assert mean == pytest.approx(-0.1) and p == 1 / 1000


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


def test_a_row_that_cannot_be_tested_leaves_its_columns_family_and_the_legend_says_the_largest(
        tmp_path):
    """bow scores exactly what BM25 does on R@100 (no evidence either way: p is NaN), so that
    column's Holm family holds the two other rows, not three: its tests are corrected, and the cell
    records, for m = 2; the legend names the largest family of the mark (nDCG@10's 3)."""
    results = _family_of_three(tmp_path)
    for system in ("bm25", "bert-stage1", "costa-stage1", "bow-stage1"):
        path = results / "metrics" / "scifact" / system / "test.json"
        data = json.loads(path.read_text())
        scores = dict(data["per_query"]["nDCG@10"])
        if system == "bow-stage1":
            bm25 = json.loads((results / "metrics/scifact/bm25/test.json").read_text())
            scores = dict(bm25["per_query"]["nDCG@10"])
        data["per_query"]["R@100"] = scores
        data["aggregate"]["R@100"] = float(np.mean(list(scores.values())))
        path.write_text(json.dumps(data))
    columns = [{"dataset": "scifact", "split": "test", "measure": m} for m in ("nDCG@10", "R@100")]
    _, text = _build(tmp_path, results, {"correction": "holm"}, columns=columns)
    summary = json.loads((tmp_path / "tables.json").read_text())
    rows = {r["system"]: r["cells"] for g in summary["tables"]["t"] for r in g["rows"]}
    assert rows["bow-stage1"][1]["tests"]["bm25"]["p"] is None  # NaN: null in tables.json
    tested = ["bert-stage1", "costa-stage1"]
    recall = [rows[system][1]["tests"]["bm25"] for system in tested]
    for test, adjusted in zip(recall, holm([t["p"] for t in recall])):
        assert test["family"] == 2 and test["p_adjusted"] == pytest.approx(adjusted)
    assert all(rows[system][0]["tests"]["bm25"]["family"] == 3 for system in tested)
    assert "† 3 tests" in text


def test_a_p_value_equal_to_alpha_is_significant_as_the_legend_says(tmp_path):
    """p ≤ alpha, not p < alpha: 40 positive differences of distinct sizes, 999 random sign
    patterns of which none reaches |mean d|, give a randomisation p of exactly 1 / 1000."""
    results = tmp_path / "results"
    base = np.linspace(0.2, 0.4, len(QIDS))
    write_metrics(results, "scifact", "bm25", "test", {"nDCG@10": base})
    write_metrics(results, "scifact", "costa-stage1", "test",
                  {"nDCG@10": base + np.linspace(0.01, 0.05, len(QIDS))})
    cells, text = _build(tmp_path, results, {"alpha": 0.001, "test": "permutation",
                                             "permutations": 999}, rows=[{"model": "costa"}])
    assert cells["costa-stage1"]["tests"]["bm25"]["p"] == 0.001
    assert cells["costa-stage1"]["marks"] == "†" and "p ≤ 0.001" in text


def test_a_baseline_s_published_number_sits_only_beside_its_own_split(tmp_path):
    """MiniLM's published SciFact *test* nDCG@10 (0.5) belongs beside that column alone, not
    beside our dev split's nDCG@10 with a delta against it."""
    results = _family_of_three(tmp_path)
    rng = np.random.default_rng(8)
    for system in ("bm25", "minilm"):
        write_metrics(results, "scifact", system, "dev", {"nDCG@10": rng.uniform(0, 1, len(QIDS))})
    write_metrics(results, "scifact", "minilm", "test", {"nDCG@10": np.full(len(QIDS), 0.55)})
    columns = [{"dataset": "scifact", "split": split, "measure": "nDCG@10"}
               for split in ("test", "dev")]
    _build(tmp_path, results, {"correction": "holm"}, rows=[], baseline_rows=["minilm"],
           columns=columns)
    summary = json.loads((tmp_path / "tables.json").read_text())
    minilm = next(r for g in summary["tables"]["t"] for r in g["rows"] if r["system"] == "minilm")
    assert [cell["published"] for cell in minilm["cells"]] == [0.5, None]


def test_queries_scored_for_one_system_only_are_left_out_of_the_paired_test(tmp_path, caplog):
    """Metrics scored against different qrels (a stale file): ours lacks q0-q2, BM25's lacks
    q3-q5; the pairs are the 34 queries both have, each with its own two scores, and a warning
    says how many were dropped."""
    from scipy import stats

    rng = np.random.default_rng(9)
    results = tmp_path / "results"
    base, ours = rng.uniform(0.2, 0.6, len(QIDS)), rng.uniform(0.3, 0.7, len(QIDS))
    write_metrics(results, "scifact", "bm25", "test", {"nDCG@10": base})
    write_metrics(results, "scifact", "costa-stage1", "test", {"nDCG@10": ours})
    for system, dropped in (("costa-stage1", QIDS[:3]), ("bm25", QIDS[3:6])):
        path = results / "metrics" / "scifact" / system / "test.json"
        data = json.loads(path.read_text())
        data["per_query"]["nDCG@10"] = {q: v for q, v in data["per_query"]["nDCG@10"].items()
                                        if q not in dropped}
        path.write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="retrieval_pretraining.tables.significance"):
        cells, _ = _build(tmp_path, results, {}, rows=[{"model": "costa"}])
    test = cells["costa-stage1"]["tests"]["bm25"]
    ref = stats.ttest_rel(ours[6:], base[6:])
    assert test["n"] == 34 and test["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert any("6 queries scored for only one system; testing the 34 common ones" in r.getMessage()
               for r in caplog.records)


def test_a_marks_family_spans_the_table_s_row_groups(tmp_path):
    """One family per mark and column across the stage groups (ARCHITECTURE, README's demo: 12
    rows tested against BERT): with stage 1 and stage 2, BM25's family in the column holds all six
    model rows, BERT's the four non-BERT ones, and each p is Holm-adjusted over that family, not
    over its own group's rows alone."""
    rng = np.random.default_rng(11)
    results = tmp_path / "results"
    base = rng.uniform(0.2, 0.6, len(QIDS))
    write_metrics(results, "scifact", "bm25", "test", {"nDCG@10": base})
    for stage, lift in (("stage1", 0.02), ("stage2", 0.04)):
        for name, extra in (("bert", 0.0), ("costa", 0.01), ("bow", -0.01)):
            scores = base + lift + extra + rng.normal(0, 0.06, len(QIDS))
            write_metrics(results, "scifact", f"{name}-{stage}", "test", {"nDCG@10": scores})
    column = {"dataset": "scifact", "split": "test", "measure": "nDCG@10"}
    p = params(
        stages=[{"suffix": "stage1", "label": "stage 1"}, {"suffix": "stage2", "label": "stage 2"}],
        significance={"alpha": 0.05, "correction": "holm",
                      "baselines": [{"system": "bm25", "mark": "†"},
                                    {"model": "bert", "mark": "‡"}]},
        tables=[{"name": "t", "columns": [column], "rows": None}],
    )
    summary = make_tables(p, results, tmp_path / "tables.md", tmp_path / "tables.json")
    cells = {r["system"]: r["cells"][0] for g in summary["tables"]["t"] for r in g["rows"]}
    for baseline, size in (("bm25", 6), ("bert", 4)):
        tested = sorted(s for s, c in cells.items() if any(b.startswith(baseline)
                                                            for b in c["tests"]))
        tests = [next(t for b, t in cells[s]["tests"].items() if b.startswith(baseline))
                 for s in tested]
        assert len(tested) == size and {t["family"] for t in tests} == {size}
        for test, adjusted in zip(tests, holm([t["p"] for t in tests])):
            assert test["p_adjusted"] == pytest.approx(adjusted, rel=1e-12)
