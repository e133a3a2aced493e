"""The whole demo DAG, raw Wikipedia dump to results/tables.md, on a tiny config (issue 6, "Tests").

One Snakemake run on a project copy (tests/tiny_experiment.py: a 374-document SciFact subset,
4 pre-training steps per model, 1 short fine-tuning epoch); then the results are checked against
what the contracts say they must be, a second run must have nothing to do, and a COSTA-only config
change must plan COSTA's jobs and nothing upstream or beside them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tiny_experiment import DATASET, tiny_overrides, write_scifact_subset
from workflow_harness import copy_project, planned_rules, snakemake

pytestmark = pytest.mark.slow

TARGET = "results/tables.md"
SPLIT = "test"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    if reuse := os.environ.get("E2E_PROJECT"):
        # Developing these checks: point at a project copy this fixture already ran (it is edited
        # and restored by the COSTA test, and gains results/report.html).
        return Path(reuse)
    project = copy_project(tmp_path_factory.mktemp("e2e") / "project", tiny_overrides())
    write_scifact_subset(project)
    started = time.monotonic()
    snakemake(project, TARGET)
    # Printed with -s; the brief asks for the wall time (noisy on a shared machine).
    print(f"\nend-to-end run: {time.monotonic() - started:.0f} s")
    return project


@pytest.fixture(scope="module")
def config(project) -> dict:
    return yaml.safe_load((project / "config.yaml").read_text())


@pytest.fixture(scope="module")
def test_queries(project) -> set[str]:
    # Read from the BEIR files we wrote, not from the workflow's own Parquet (independent source).
    qrels = (project / "data/beir" / DATASET / "qrels" / f"{SPLIT}.tsv").read_text().splitlines()[1:]
    return {line.split("\t")[0] for line in qrels}


@pytest.fixture(scope="module")
def corpus_ids(project) -> set[str]:
    lines = (project / "data/beir" / DATASET / "corpus.jsonl").read_text().splitlines()
    return {json.loads(line)["_id"] for line in lines}


def _systems(config) -> list[str]:
    models = [m["name"] for m in config["pretrain"]["models"]]
    return ["bm25"] + [f"{m}-{stage}" for stage in ("stage1", "stage2") for m in models]


def _table_rows(markdown: str) -> list[list[str]]:
    """Cells of every Markdown table row that is not a header rule."""
    rows = []
    for line in markdown.splitlines():
        line = line.strip()
        if line.startswith("|") and not re.fullmatch(r"\|[\s:|-]+\|", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _number(cell: str) -> float | None:
    # A value may carry significance marks (†, ‡, ↓) or a delta; its first number is the value.
    match = re.match(r"^\*{0,2}(-?\d+(?:\.\d+)?)", cell)
    return float(match.group(1)) if match else None


def test_all_five_models_are_configured(config):
    objectives = {m["objective"] for m in config["pretrain"]["models"]}
    assert {"none", "mlm", "costa", "cpdae", "bow"} <= objectives, objectives


def test_tables_have_bm25_and_every_model_in_both_stages(project, config):
    tables = (project / TARGET).read_text()
    main = tables.split("## Provenance")[0]  # the provenance table lists systems too
    group, values = None, defaultdict(list)
    for row in _table_rows(main):
        if re.fullmatch(r"\*[^*].*\*", row[0]):  # an italic group heading row
            group = row[0].strip("*")
            continue
        numbers = [_number(cell) for cell in row[1:]]
        if numbers and None not in numbers:
            values[(group, row[0])].append(numbers)
    assert any(label.startswith("BM25") for _, label in values), tables

    display = {"none": "BERT", "mlm": "MLM", "costa": "COSTA", "cpdae": "CPDAE", "bow": "BoW"}
    for stage in config["report"]["stages"]:
        for model in config["pretrain"]["models"]:
            # One row per model in each fine-tuning group, with nDCG@10 and R@100 in [0, 1].
            rows = values[(stage["label"], display[model["objective"]])]
            assert len(rows) == 1, (stage["label"], model["name"], tables)
            assert len(rows[0]) == 2 and all(0.0 <= v <= 1.0 for v in rows[0]), rows


def test_every_metrics_file_scores_every_test_query(project, config, test_queries):
    for system in _systems(config):
        path = project / "results/metrics" / DATASET / system / f"{SPLIT}.json"
        metrics = json.loads(path.read_text())
        assert set(metrics["measures"]) == {"nDCG@10", "R@100"}, path
        for measure in ("nDCG@10", "R@100"):
            per_query = metrics["per_query"][measure]
            assert set(per_query) == test_queries, (path, measure)
            mean = sum(per_query.values()) / len(per_query)
            assert math.isclose(metrics["aggregate"][measure], mean, abs_tol=1e-6), (path, measure)


def test_dense_runs_are_valid_trec_runs(project, config, test_queries, corpus_ids):
    depth = min(1000, len(corpus_ids))
    for system in _systems(config)[1:]:
        path = project / "results/runs" / DATASET / system / f"{SPLIT}.trec"
        hits: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            fields = line.split()
            assert len(fields) == 6 and fields[1] == "Q0", f"{path}:{number}: {line!r}"
            query_id, _, doc_id, rank, score, _tag = fields
            hits[query_id].append((int(rank), float(score), doc_id))
        assert set(hits) == test_queries, path
        for query_id, ranked in hits.items():
            ranks = [r for r, _, _ in ranked]
            scores = [s for _, s, _ in ranked]
            docs = [d for _, _, d in ranked]
            assert ranks == list(range(1, len(ranks) + 1)), (path, query_id)
            assert scores == sorted(scores, reverse=True), (path, query_id)
            assert len(set(docs)) == len(docs) and set(docs) <= corpus_ids, (path, query_id)
            # Every document is ranked, less the query's own id (BEIR's exclude_query_id).
            assert depth - 1 <= len(docs) <= depth, (path, query_id, len(docs))
            assert query_id not in docs, (path, query_id)


def test_the_dataset_stage_read_the_whole_subset(project):
    corpus = pq.read_table(project / "results/datasets" / DATASET / "corpus.parquet")
    assert corpus.num_rows == len(
        (project / "data/beir" / DATASET / "corpus.jsonl").read_text().splitlines()
    )


def test_a_second_run_has_nothing_to_do(project):
    assert planned_rules(project, TARGET) == {}


def _planned_jobs(project: Path, target: str) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run plans, from Snakemake's job listing."""
    result = snakemake(project, "--dry-run", target)
    jobs, rule = [], None
    for line in (result.stdout + result.stderr).splitlines():
        if match := re.match(r"^(?:local)?rule (\w+):$", line.strip()):
            if rule:
                jobs.append((rule, ""))
            rule = match.group(1)
        elif rule and line.strip().startswith("wildcards:"):
            jobs.append((rule, line.strip().removeprefix("wildcards:").strip()))
            rule = None
        elif rule and not line.strip():
            jobs.append((rule, ""))
            rule = None
    return jobs


def test_changing_costa_temperature_reruns_costa_only(project, config):
    path = project / "config.yaml"
    original = path.read_text()
    edited = yaml.safe_load(original)
    edited["pretrain"]["costa"]["temperature"] = config["pretrain"]["costa"]["temperature"] * 2
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    try:
        plan = planned_rules(project, TARGET)
        jobs = _planned_jobs(project, TARGET)
    finally:
        path.write_text(original)

    assert len(jobs) == sum(plan.values()), (jobs, plan)  # the job listing was parsed whole
    costa = [m["name"] for m in config["pretrain"]["models"] if m["objective"] == "costa"]
    assert len(costa) == 1
    for upstream in ("sample_spans", "chunk_articles", "extract_articles", "bm25_negatives",
                     "build_bm25_index", "export_base_encoder"):
        assert upstream not in plan, (upstream, plan)
    assert plan.get("pretrain_model") == 1, plan
    assert plan.get("finetune_stage1") == 1 and plan.get("finetune_stage2") == 1, plan
    assert plan.get("make_tables") == 1, plan
    for rule, wildcards in jobs:
        if rule.startswith(("pretrain", "finetune", "mine", "encode", "build_dense", "dense")):
            assert re.search(rf"\bmodel={costa[0]}\b", wildcards), (rule, wildcards)
    # The two COSTA runs (stage 1, 2) are rescored; BM25's and the other models' are not.
    scored = [w for r, w in jobs if r == "score_run"]
    assert len(scored) == 2 and all(f"system={costa[0]}-" in w for w in scored), scored
    assert planned_rules(project, TARGET) == {}


def test_the_report_contains_the_tables(project):
    snakemake(project, TARGET, "--report", "results/report.html")
    report = (project / "results/report.html").read_text(errors="replace")
    # The tables are a report item: their file name and their rendered caption (workflow/report/tables.rst).
    assert "tables.html" in report
    assert "Rows are grouped by fine-tuning stage" in report
