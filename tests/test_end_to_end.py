"""The whole demo DAG, raw Wikipedia dump to `rule all`, on a tiny config (issue 6, "Tests").

One Snakemake run of `all` on a project copy (tests/tiny_experiment.py: a SciFact subset of 400
training queries and 100 test queries with their documents, 4 pre-training steps per model, one
fine-tuning epoch per stage, every analysis at a tiny size); then the results are checked against
what the contracts say they must be (tables and their provenance, the analyses, the Snakemake
report with every figure and caption, `audit` on every artifact), fine-tuning must lift every
encoder above its zero-shot score, a second run must have nothing to do, and a COSTA-only config
change must plan COSTA's jobs and nothing upstream or beside them.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import math
import os
import re
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from retrieval_pretraining import artifacts
from tiny_experiment import DATASET, E2E_FINETUNED, E2E_MODELS, tiny_overrides, write_scifact_subset
from workflow_harness import copy_project, plan_of, planned_rules, snakemake

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TARGET = "all"  # tables, analyses, span audit, per-stage statistics: every rule of the demo
TABLES = "results/tables.md"
SPLIT = "test"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    if reuse := os.environ.get("E2E_PROJECT"):
        # Developing these checks: point at a project copy this fixture already ran (it is edited
        # and restored by the COSTA test, and gains report.zip).
        return Path(reuse)
    project = copy_project(tmp_path_factory.mktemp("e2e") / "project", tiny_overrides())
    write_scifact_subset(project)
    started = time.monotonic()
    # One thread per encoder job, two side by side (as `make demo`): the demo's own local profile.
    snakemake(project, "--workflow-profile", "profiles/local", TARGET)
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


def _stages(config) -> list[str]:
    return [s["suffix"] for s in config["report"]["stages"]]


def _finetuned(config) -> list[dict]:
    """The pre-training entries of the models that are fine-tuned and tabled (finetune.models)."""
    chosen = config["finetune"]["models"]
    return [m for m in config["pretrain"]["models"] if chosen is None or m["name"] in chosen]


def _systems(config) -> list[str]:
    models = [m["name"] for m in _finetuned(config)]
    return ["bm25"] + [f"{m}-{stage}" for stage in _stages(config) for m in models]


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


def test_the_run_has_a_model_for_every_rule(config):
    objectives = {m["objective"] for m in config["pretrain"]["models"]}
    assert objectives == {"none", "costa", "cpdae"}, objectives


def test_finetune_models_chooses_what_is_fine_tuned_and_tabled(project, config):
    """CPDAE is pre-trained (its words are analysed) but not in finetune.models: nothing of it is
    fine-tuned, encoded or tabled."""
    assert [m["name"] for m in _finetuned(config)] == ["bert", "costa"]
    assert (project / "results/pretrain/cpdae/encoder/config.json").is_file()
    for folder in ("results/finetune/cpdae", "results/index/cpdae", f"results/runs/{DATASET}/cpdae-stage0"):
        assert not (project / folder).exists(), folder
    assert "CPDAE" not in (project / TABLES).read_text().split("## Provenance")[0]


def test_the_demo_plans_every_model_through_every_stage(tmp_path):
    """The shipped demo (five models, three stages each) plans the jobs the tiny run ran for three:
    a dry run of `all` on the demo's own config, per model and stage."""
    demo = yaml.safe_load((ROOT / "config.yaml").read_text())
    models = demo["pretrain"]["models"]
    assert {m["objective"] for m in models} == {"none", "mlm", "costa", "cpdae", "bow"}
    stages = len(demo["report"]["stages"])  # zero-shot, stage 1, stage 2
    trained = sum(m["objective"] != "none" for m in models)
    plan = planned_rules(copy_project(tmp_path / "demo"), TARGET)
    assert plan["pretrain_model"] == trained and plan["export_base_encoder"] == len(models) - trained
    for rule in ("finetune_stage1", "finetune_stage2", "mine_hard_negatives"):
        assert plan[rule] == len(models), (rule, plan)
    for rule in ("encode_corpus_shard", "build_dense_index", "dense_search"):
        assert plan[rule] == len(models) * stages * demo["finetune"].get("shards", 1), (rule, plan)
    baseline_runs = {  # evaluate.baselines rows (rules/baselines.smk), one run per column split
        (c["dataset"], name, c["split"])
        for table in demo["report"]["tables"]
        for name in table.get("baseline_rows") or []
        for c in table["columns"]
    }
    assert plan["baseline_search"] == len(baseline_runs), plan
    assert plan["score_run"] == len(models) * stages + 1 + len(baseline_runs), plan  # + BM25


def test_the_published_bm25_run_is_the_search_s_run_with_its_own_manifest(project, config):
    """publish_bm25_run copies the search's run and manifest to results/runs/, where score_run
    and the tables find them: the k1, b and label travel with the run."""
    published = project / f"results/runs/{DATASET}/bm25"
    own = project / f"results/bm25/{DATASET}/runs"
    assert (published / f"{SPLIT}.trec").read_bytes() == (own / f"{SPLIT}.trec").read_bytes()
    manifest = json.loads((published / f"{SPLIT}.manifest.json").read_text())
    assert manifest == json.loads((own / f"{SPLIT}.manifest.json").read_text())
    k1, b = config["bm25"]["k1"], config["bm25"]["b"]
    assert manifest["stage"] == "bm25.search"
    assert manifest["params"]["label"] == f"BM25 (k1={k1}, b={b})"
    assert (manifest["params"]["k1"], manifest["params"]["b"]) == (k1, b)


def test_tables_have_bm25_and_every_model_in_both_stages(project, config):
    tables = (project / TABLES).read_text()
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
        for model in _finetuned(config):
            # One row per model in each fine-tuning group, with nDCG@10 and R@100 in [0, 1].
            rows = values[(stage["label"], display[model["objective"]])]
            assert len(rows) == 1, (stage["label"], model["name"], tables)
            assert len(rows[0]) == 2 and all(0.0 <= v <= 1.0 for v in rows[0]), rows


def _per_query(project: Path, system: str, measure: str = "nDCG@10") -> dict[str, float]:
    path = project / "results/metrics" / DATASET / system / f"{SPLIT}.json"
    return json.loads(path.read_text())["per_query"][measure]


def test_fine_tuning_lifts_every_encoder_above_zero_shot(project, config):
    """Per model, against the same encoder not fine-tuned (stage 0): the final stage's nDCG@10 is
    up by at least 0.05 with a paired t-test p <= 0.05 (scipy, not our tables), and the tables
    mark it so (§); the first stage alone (one epoch on BM25 negatives) is up by at least 0.02."""
    from scipy import stats

    tables = json.loads((project / "results/report/tables.json").read_text())
    marks = {row["system"]: row["cells"][0]["marks"]
             for group in tables["tables"]["main"] for row in group["rows"]}
    final = _stages(config)[-1]
    for model in (m["name"] for m in _finetuned(config)):
        before = _per_query(project, f"{model}-stage0")
        queries = sorted(before)
        scores = {}
        for stage, least in (("stage1", 0.02), (final, 0.05)):
            scores[stage] = [_per_query(project, f"{model}-{stage}")[q] for q in queries]
            lift = sum(scores[stage]) / len(queries) - sum(before.values()) / len(queries)
            assert lift >= least, (model, stage, round(lift, 4))
        p = stats.ttest_rel(scores[final], [before[q] for q in queries]).pvalue
        assert p <= 0.05, (model, final, p)
        assert "§" in marks[f"{model}-{final}"] and "§↓" not in marks[f"{model}-{final}"], marks


def test_the_first_fine_tuning_loss_falls(project, config):
    """Stage 1's loss (metrics.jsonl, one record per step) is lower over its last quarter of steps
    than over its first: the lift above is the training's, not chance. Stage 2 is not asked: it
    starts from stage 1, already fit to these very queries, and sees each once, so its per-step
    loss on queries it has not yet revisited measures forgetting as much as learning (here it
    rises, 0.43 -> 1.26, while its test nDCG@10 lifts: test_fine_tuning_lifts_every_encoder_...).
    From a start not fit to the queries, the loss falls: tests/test_finetune.py's learning test."""
    for model in (m["name"] for m in _finetuned(config)):
        for stage in ("stage1",):
            path = project / "results/finetune" / model / DATASET / stage / "metrics.jsonl"
            losses = [r["loss"] for r in map(json.loads, path.read_text().splitlines())
                      if "loss" in r]
            window = max(1, len(losses) // 4)
            first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
            assert len(losses) >= 4 and last < first, (model, stage, losses)


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
    depth = min(config["finetune"]["search_depth"], len(corpus_ids))
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


def test_without_keep_vectors_an_index_s_shards_go_once_it_is_built(project):
    """mining.keep_vectors: false (tiny_overrides): the encoded shards are temporary; every index
    stands without them, and the second run above plans nothing for their absence."""
    indexes = sorted((project / "results").glob("**/faiss/index"))
    assert len(indexes) >= 4  # stage 1 and 2 of two models, and the baseline's
    assert not list((project / "results").glob("**/shard-*.npy"))
    assert not list((project / "results").glob("**/shard-*.ids.parquet"))


def test_the_models_read_one_data_store_that_a_successful_run_deletes(project, config):
    """Every trainer converts into (or reads from) the shared store folder; the run's success
    deleted it (a cache: the second run above planned nothing for its absence)."""
    trained = [m["name"] for m in config["pretrain"]["models"] if m["objective"] != "none"]
    for model in trained:
        log = (project / f"results/logs/pretrain_model/{model}.log").read_text()
        assert "data store results/state/pretrain-data:" in log, (model, log[-2000:])
    assert not (project / "results/state/pretrain-data").exists()


def _planned_jobs(output: str) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run's output plans, from Snakemake's job listing."""
    jobs, rule = [], None
    for line in output.splitlines():
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
        result = snakemake(project, "--dry-run", TARGET)
        plan = plan_of(result.stdout + result.stderr)
        jobs = _planned_jobs(result.stdout + result.stderr)
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
    # The analyses that read COSTA's outputs rerun; those that do not (CPDAE's words, spans) do not.
    for analysis in ("loss_curves", "tsne_candidates", "token_coverage", "stage_statistics"):
        assert plan.get(analysis) == 1, (analysis, plan)
    assert "cpdae_top_words" not in plan and "audit_spans" not in plan, plan
    for rule, wildcards in jobs:
        if rule.startswith(("pretrain", "finetune", "mine", "encode", "build_dense", "dense")):
            assert re.search(rf"\bmodel={costa[0]}\b", wildcards), (rule, wildcards)
    # COSTA's runs (zero-shot, stage 1, 2) are rescored; BM25's and the other models' are not.
    scored = [w for r, w in jobs if r == "score_run"]
    assert len(scored) == len(_stages(config)), scored
    assert all(f"system={costa[0]}-" in w for w in scored), scored
    assert planned_rules(project, TARGET) == {}


def test_tables_provenance_names_every_field_and_existing_files(project, config):
    text = (project / TABLES).read_text()
    assert "## Provenance" in text, text
    provenance = text.split("## Provenance", 1)[1]
    assert re.search(r"^- config hash \(sha256 of the resolved config\): `[0-9a-f]{16}`$",
                     provenance, re.M), provenance
    assert re.search(r"^- tables built with: `[^`]+` ", provenance, re.M), provenance
    date = dt.datetime.fromisoformat(re.search(r"^- date: (\S+)$", provenance, re.M).group(1))
    written = dt.datetime.fromtimestamp((project / TABLES).stat().st_mtime, dt.timezone.utc)
    assert abs((written - date).total_seconds()) < 600, (date, written)
    assert re.search(r"^- tables built on: .+, \d+ CPUs$", provenance, re.M), provenance

    rows = [r for r in _table_rows(provenance) if r[0] != "system"]
    assert sorted(r[0] for r in rows) == sorted(_systems(config)), rows
    objectives = {m["name"]: m["objective"] for m in config["pretrain"]["models"]}
    for system, split, run, run_sha256, metrics, scored_with, model, logs in rows:
        assert split == f"{DATASET}/{SPLIT}"
        digest = artifacts.sha256_file(project / run.strip("`"))[:16]
        assert run_sha256 == f"`{digest}`", (run_sha256, digest)
        assert re.fullmatch(r"`[^`]+` \(package `[0-9a-f]{12}`\)", scored_with), scored_with
        assert run == f"`results/runs/{DATASET}/{system}/{SPLIT}.trec`", run
        assert metrics == f"`results/metrics/{DATASET}/{system}/{SPLIT}.json`", metrics
        if system == "bm25":
            assert model == f"`results/bm25/{DATASET}/index`", model
            expected_logs = [
                f"build_bm25_index/{DATASET}.log", f"bm25_search/{DATASET}/{SPLIT}.log",
                f"publish_bm25_run/{DATASET}/{SPLIT}.log",
            ]
        else:
            name, stage = system.rsplit("-", 1)
            pretrain = "export_base_encoder" if objectives[name] == "none" else "pretrain_model"
            expected_logs = [f"{pretrain}/{name}.log"]
            if stage == "stage0":  # zero-shot: the pre-trained encoder itself
                assert model == f"`results/pretrain/{name}/encoder`", model
            else:
                assert model == f"`results/finetune/{name}/{DATASET}/{stage}/encoder`", model
                expected_logs.append(f"finetune/{name}/{DATASET}/{stage}.log")
            # Then the jobs that made its run: each corpus shard's encoding, the index, the search.
            expected_logs += [f"encode_corpus_shard/{name}/{DATASET}/{stage}/{shard:04d}.log"
                              for shard in range(config["finetune"].get("shards", 1))]
            expected_logs += [f"build_dense_index/{name}/{DATASET}/{stage}.log",
                              f"dense_search/{DATASET}/{system}/{SPLIT}.log"]
        assert re.findall(r"`([^`]+)`", logs) == [f"results/logs/{p}" for p in expected_logs]
        for cell in (run, metrics, model, logs):
            for path in re.findall(r"`([^`]+)`", cell):
                assert (project / path).exists(), (system, path)


def test_the_analyses_ran_as_rules(project, config, test_queries):
    from PIL import Image

    results = project / "results"
    for figure in ("analysis/loss-curves.png", "analysis/coverage.png",
                   f"analysis/tsne/{DATASET}/{SPLIT}.png", "corpus/wikipedia/spans/costa/lengths.png"):
        with Image.open(results / figure) as image:
            assert image.width >= 300 and image.height >= 200, (figure, image.size)

    trained = [m["name"] for m in config["pretrain"]["models"] if m["objective"] != "none"]
    steps = config["pretrain"]["trainer"]["max_steps"]
    curves = json.loads((results / "analysis/loss-curves.json").read_text())
    assert sorted(curves) == sorted(trained), curves
    for name, terms in curves.items():
        # A fresh MLM head (MiniLM has none) trains alone first: those steps come before the schedule.
        info = json.loads((results / f"pretrain/{name}/encoder/training.json").read_text())
        assert info["fresh_mlm_head"] and info["head_warmup_steps"] >= 1, (name, info)
        expected = steps + info["head_warmup_steps"]
        assert terms["loss"]["steps"] == expected and math.isfinite(terms["loss"]["last"]), name

    coverage = json.loads((results / "analysis/coverage.json").read_text())
    wanted = config["report"]["analysis"]["coverage"]
    assert sorted(coverage["models"]) == sorted(wanted["models"]) and coverage["samples"] > 0
    for name, info in coverage["models"].items():
        assert info["projection"] == "mlm_head", (name, info)  # the saved heads were found
        assert sorted(map(int, info["coverage"])) == sorted(wanted["ks"]), info
        assert all(0.0 <= v <= 1.0 for v in info["coverage"].values()), info

    tsne = json.loads((results / f"analysis/tsne/{DATASET}/{SPLIT}.json").read_text())
    assert tsne["query_id"] in test_queries and tsne["relevant"], tsne
    depth = config["report"]["analysis"]["tsne"]["depth"]
    assert sorted(tsne["models"]) == ["bert", "costa"], tsne
    assert all(m["candidates"] == depth for m in tsne["models"].values()), tsne

    words = (results / "analysis/cpdae-top-words.md").read_text()
    top = config["report"]["analysis"]["cpdae_top_words"]["top"]
    lines = [l for l in words.splitlines() if l.startswith("**Top words:**")]
    assert len(lines) == 1 and len(lines[0].split(" · ")) == top, words  # the decoder was found
    assert "Top words" in (results / "analysis/cpdae-top-words.html").read_text()

    sample = (results / "corpus/wikipedia/spans/costa/sample.md").read_text()
    assert sample.startswith("# Span sample") and "| granularity |" in sample, sample[:500]
    for stem in ("loss-curves", "coverage", "cpdae-top-words", f"tsne/{DATASET}/{SPLIT}"):
        manifest = json.loads((results / f"analysis/{stem}.manifest.json").read_text())
        assert manifest["stage"].startswith("analysis.") and manifest["inputs"], stem

    stats = (results / "report/stage-statistics.html").read_text()
    assert "(no manifest)" not in stats
    for kind in ("results/wikipedia/articles/", "results/corpus/wikipedia/spans/", "results/pretrain/",
                 f"results/bm25/{DATASET}/negatives.parquet", "/stage2/encoder",
                 "hard-negatives.parquet", "/faiss", "results/runs/", "results/metrics/"):
        assert kind in stats, kind


def _artifact_files(project: Path) -> list[str]:
    """Every file under results/ but Snakemake's job records: logs/ and benchmarks/ (text about a
    job, read by no rule, no manifest) and the `.snakemake_timestamp` marker in each folder output.
    Files inside a folder artifact (model, Lucene, FAISS) are audited as part of their folder."""
    skipped = ("results/logs/", "results/benchmarks/")
    return sorted(
        str(p.relative_to(project))
        for p in (project / "results").rglob("*")
        if p.is_file()
        and p.name != ".snakemake_timestamp"
        and not str(p.relative_to(project)).startswith(skipped)
    )


def _audit(project: Path, *paths: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(project / "workflow"))
    return subprocess.run(
        [sys.executable, "-m", "retrieval_pretraining.audit", "--rows", "1", *paths],
        cwd=project, env=env, capture_output=True, text=True,
    )


def test_audit_explains_every_artifact(project):
    paths = _artifact_files(project)
    kinds = {Path(p).suffix or Path(p).name for p in paths}
    assert {".png", ".md", ".html", ".safetensors", ".parquet", ".json", ".trec"} <= kinds, kinds
    result = _audit(project, *paths)
    failed = [l for l in result.stdout.splitlines() if l.lstrip().startswith("FAIL")]
    assert result.returncode == 0 and not result.stderr and not failed, (
        result.returncode, result.stderr[-3000:], failed[:20]
    )
    headers = [l for l in result.stdout.splitlines() if l.startswith("== ")]
    assert len(headers) == len(paths), (len(headers), len(paths))


def test_audit_refuses_what_is_not_an_artifact(project, tmp_path):
    noise = tmp_path / "random.bin"
    noise.write_bytes(os.urandom(4096))
    result = _audit(project, str(noise))
    assert result.returncode == 2, result
    assert f"{noise}: no artifact of this workflow has this kind of name" in result.stderr
    # Random bytes under an artifact's name are refused by what they contain.
    fake = tmp_path / "results/analysis/coverage.png"
    fake.parent.mkdir(parents=True)
    fake.write_bytes(os.urandom(4096))
    result = _audit(project, str(fake))
    assert result.returncode == 2 and "not a PNG image" in result.stderr, result
    # A job log: the message names the rule and the outputs to audit instead.
    result = _audit(project, "results/logs/make_tables.log")
    assert result.returncode == 2, result
    assert "a Snakemake job log of rule make_tables, not an artifact" in result.stderr
    assert "results/report/tables.json" in result.stderr, result.stderr


# Every report item -> its caption (workflow/report/); the figures are every PNG the run wrote.
CAPTIONS = {
    "results/report/tables.html": "tables.rst",
    "results/report/stage-statistics.html": "stage_statistics.rst",
    "results/analysis/cpdae-top-words.html": "cpdae_words.rst",
    "results/analysis/loss-curves.png": "loss_curves.rst",
    "results/analysis/coverage.png": "coverage.rst",
    "results/analysis/tsne/*.png": "tsne.rst",
    "results/analysis/low-resource.png": "low_resource.rst",
    "results/corpus/*/spans/*/lengths.png": "span_lengths.rst",
    "results/pretrain/*/loss.png": "pretrain_loss.rst",
    "results/finetune/*/loss.png": "finetune_loss.rst",
}


def test_the_report_holds_every_figure_with_its_caption(project):
    # Written beside results/, not in it: the report is not an artifact of the workflow.
    snakemake(project, TARGET, "--report", "report.zip")
    archive = zipfile.ZipFile(project / "report.zip")
    page = archive.read("report/report.html").decode()
    items = json.loads(re.search(r"^\s*var results = (\{.*\});\s*$", page, re.M).group(1))
    figures = [str(p.relative_to(project)) for p in (project / "results").rglob("*.png")]
    pages = [k for k in CAPTIONS if k.endswith(".html")]
    finetuned, trained = len(E2E_FINETUNED), len(E2E_MODELS) - 1  # BERT is not pre-trained
    # Analyses (loss curves, coverage, t-SNE), span lengths, each training's loss (2 fine-tuning
    # stages per fine-tuned model, one pre-training per trained model).
    assert len(figures) >= 3 + 1 + 2 * finetuned + trained, figures
    assert set(figures + pages) <= set(items), sorted(set(figures + pages) - set(items))
    for path in sorted(figures + pages):
        entry = items[path]
        caption = next(CAPTIONS[k] for k in CAPTIONS if fnmatch.fnmatchcase(path, k))
        opening = " ".join((project / "workflow/report" / caption).read_text().split()[:3])
        assert opening in entry["caption"], (path, opening, entry["caption"][:300])
        stored = archive.getinfo(f"report/{entry['data_uri']}")
        assert stored.file_size == (project / path).stat().st_size, path
    # The tables' caption is rendered with the config (Jinja in workflow/report/tables.rst).
    assert "Rows are grouped by fine-tuning stage" in items["results/report/tables.html"]["caption"]
