"""Stage wiring of rules/finetune.smk and rules/dense.smk, read from Snakemake's own dry-run plan
(no training runs).

Which encoder each stage starts from and which negatives it trains on are the recipe knobs the
papers and their public scripts disagree on; these tests pin them down in the planned shell commands:
COSTA (continue from the previous stage, mined negatives only), coCondenser / BoW (restart from the
pre-trained encoder), Tevatron (mined + BM25), documents (start from another dataset's model, two
mining rounds, each mined with the previous round's model), and the low-resource wildcards.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from workflow_harness import ROOT, copy_project, local_dump, snakemake

FT = "results/finetune/bert"
BM25 = "results/bm25/{dataset}/negatives.parquet"


def planned_jobs(project: Path, *targets: str) -> list[dict]:
    """Every job of a dry run: {"rule", "wildcards" (dict), "args" (the shell command, split)}."""
    result = snakemake(project, "--dry-run", "--printshellcmds", *targets)
    jobs: list[dict] = []
    for line in (result.stdout + result.stderr).splitlines():
        if match := re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line):
            jobs.append({"rule": match.group(1), "wildcards": {}, "args": []})
        elif jobs and (match := re.match(r"^\s+wildcards: (.*)$", line)):
            jobs[-1]["wildcards"] = dict(pair.split("=", 1) for pair in match.group(1).split(", "))
        elif jobs and line.startswith("Shell command: "):
            jobs[-1]["args"] = shlex.split(line[len("Shell command: "):])
    return jobs


def job(jobs: list[dict], rule: str, **wildcards: str) -> dict:
    found = [j for j in jobs if j["rule"] == rule
             and all(j["wildcards"].get(k) == v for k, v in wildcards.items())]
    assert len(found) == 1, f"{len(found)} planned {rule} jobs with {wildcards}"
    return found[0]


def values(args: list[str], flag: str) -> list[str]:
    """The value(s) after `flag` up to the next option (--negatives takes several)."""
    start = args.index(flag) + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    return args[start:end]


def stage_config(args: list[str]) -> dict:
    return json.loads(values(args, "--config")[0])


def demo_config() -> dict:
    return yaml.safe_load((ROOT / "config.yaml").read_text())


@pytest.fixture(scope="module")
def costa_plan(tmp_path_factory) -> list[dict]:
    """The demo recipe (COSTA's): stage 2 continues from stage 1 on the negatives stage 1 mined."""
    project = copy_project(tmp_path_factory.mktemp("costa") / "project",
                           {"finetune": {"models": ["bert"]}})
    return planned_jobs(project, "results/runs/scifact/bert-stage2/test.trec")


def test_stage2_continues_from_stage1_on_its_mined_negatives(costa_plan):
    stage2 = job(costa_plan, "finetune_stage2", stage="stage2")["args"]
    assert values(stage2, "--init") == [f"{FT}/scifact/stage1/encoder"]
    assert values(stage2, "--negatives") == [f"{FT}/scifact/stage1/hard-negatives.parquet"]
    stage1 = job(costa_plan, "finetune_stage1", stage="stage1")["args"]
    assert values(stage1, "--init") == ["results/pretrain/bert/encoder"]
    assert values(stage1, "--negatives") == [BM25.format(dataset="scifact")]
    mine = job(costa_plan, "mine_hard_negatives", stage="stage1")["args"]
    assert values(mine, "--encoder") == [f"{FT}/scifact/stage1/encoder"]
    assert values(mine, "--index") == ["results/index/bert/scifact/stage1/faiss"]
    # SciFact (BEIR) excludes the query's own id when mining, as its runs do, and when padding.
    assert stage_config(mine)["exclude_self"] is True
    assert stage_config(stage1)["exclude_self"] is stage_config(stage2)["exclude_self"] is True
    assert stage_config(stage2)["epochs"] == demo_config()["finetune"]["epochs_mined"]



@pytest.mark.parametrize("finetune", [{}, {"stage1": "init", "stage1_init": "pretrained",
                                           "stage2_negatives": "union"}])
def test_bm25_negatives_of_another_split_than_the_training_one_are_refused(tmp_path, finetune):
    """The BM25 negatives a stage trains on (stage 1, or stage 2's union) are keyed by query id:
    built for another split (here scifact's test queries), they name no training query, and under
    the demo's queries_without_negatives: pad every group was silently padded with random corpus
    documents: a random-negatives stage published as a BM25-negatives one."""
    negatives = {"dataset": "scifact", "split": "test", "source": "bm25", "depth": 200,
                 "count": 30}
    project = copy_project(tmp_path / "project", {"finetune": {"models": ["bert"], **finetune},
                                                  "bm25": {"negatives": [negatives]}})
    result = snakemake(project, "--dry-run", "results/runs/scifact/bert-stage2/test.trec",
                       check=False)
    assert result.returncode != 0
    assert ("bm25.negatives names split 'test' for scifact, but finetune.datasets trains on "
            "its split 'train'") in " ".join((result.stdout + result.stderr).split())


# Knobs edited in one go: what each job's --config may change under them is asserted below.
EDITS = {"shards": 2, "search_depth": 150, "encode_batch_size": 8, "dtype": "float32",
         "epochs_mined": 3, "stage2_negatives": "union", "lr": 1e-4, "temperature": 0.1,
         "lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 5}
SCHEDULE = {"lr_schedule", "min_lr_ratio", "warmup_steps"}  # the trainer's alone


@pytest.fixture(scope="module")
def edited_plan(tmp_path_factory) -> list[dict]:
    """costa_plan's targets with EDITS applied to the finetune section."""
    project = copy_project(tmp_path_factory.mktemp("edited") / "project",
                           {"finetune": {"models": ["bert"], **EDITS}})
    return planned_jobs(project, "results/runs/scifact/bert-stage2/test.trec")


@pytest.mark.parametrize("rule, wildcards, changed", [
    ("finetune_stage1", {"stage": "stage1"}, {"lr", "temperature", *SCHEDULE}),
    ("finetune_stage2", {"stage": "stage2"}, {"lr", "temperature", "epochs", *SCHEDULE}),  # mined
    # encode_batch_size travels as --runtime: only dtype of the two changes the vectors.
    ("encode_corpus_shard", {"stage": "stage1", "shard": "0000"}, {"dtype"}),
    ("mine_hard_negatives", {"stage": "stage1"}, {"dtype"}),
    ("dense_search", {"stage": "stage2"}, {"dtype", "search_depth"}),
])
def test_a_job_s_slice_changes_only_with_the_knobs_it_reads(costa_plan, edited_plan, rule,
                                                            wildcards, changed):
    """Snakemake reruns a job whose params changed: a knob of encoding, search or the rules
    (shards, a process count; search_depth; encode_batch_size, lowered after an out-of-memory
    error) must leave every fine-tuning job's slice as it was, and a training knob (lr) every
    encoding, mining and search job's (stage 0 and stage-1 init encoders are encoded unchanged).
    A changed encoding slice (dtype) still reruns mining and fine-tuning after it, by its files."""
    before = stage_config(job(costa_plan, rule, **wildcards)["args"])
    after = stage_config(job(edited_plan, rule, **wildcards)["args"])
    differing = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert differing == changed


@pytest.fixture(scope="module")
def variant_plan(tmp_path_factory) -> list[dict]:
    """Restart + union for scifact (with a low-resource sample), and a paper-style document setup:
    `scifact-docs` starts from scifact's stage 2 and mines twice (rounds 2)."""
    config = demo_config()
    docs = copy.deepcopy(config["datasets"][0]) | {"name": "scifact-docs"}
    negatives = config["bm25"]["negatives"][0]
    overrides = {
        "datasets": [*config["datasets"], docs],  # the demo's (its baselines read scifact-full)
        "bm25": {"negatives": [negatives, negatives | {"dataset": "scifact-docs"}]},
        "finetune": {
            "models": ["bert"],
            "stage2_init": "pretrained",
            "stage2_negatives": "union",
            "datasets": [
                {"dataset": "scifact", "split": "train"},
                {"dataset": "scifact-docs", "split": "train",
                 "overrides": {"rounds": 2, "stage1_init": "scifact/stage2",
                               "stage2_init": "previous", "stage2_negatives": "mined"}},
            ],
        },
    }
    project = copy_project(tmp_path_factory.mktemp("variants") / "project", overrides)
    return planned_jobs(project, "results/runs/scifact/bert-n16s1-stage2/test.trec",
                        "results/runs/scifact-docs/bert-stage3/test.trec")


def test_separate_negatives_hand_stage_2_both_files_each_its_own_examples(tmp_path):
    """stage2_negatives separate (the Tevatron / BoW QA scripts' stage 2): stage 2 reads the mined
    and the BM25 files as union does, and its slice alone tells the trainer to keep them apart
    (negative_files); stage 1's slice is what it was."""
    project = copy_project(tmp_path / "project", {"finetune": {
        "models": ["bert"], "stage2_negatives": "separate"}})
    jobs = planned_jobs(project, "results/runs/scifact/bert-stage2/test.trec")
    stage2 = job(jobs, "finetune_stage2", dataset="scifact", stage="stage2")["args"]
    assert values(stage2, "--negatives") == [f"{FT}/scifact/stage1/hard-negatives.parquet",
                                             BM25.format(dataset="scifact")]
    assert stage_config(stage2)["negative_files"] == "separate"
    stage1 = job(jobs, "finetune_stage1", dataset="scifact", stage="stage1")["args"]
    assert "negative_files" not in stage_config(stage1)


def test_restart_and_union_read_the_pretrained_encoder_and_both_negative_sets(variant_plan):
    stage2 = job(variant_plan, "finetune_stage2", dataset="scifact", stage="stage2")["args"]
    assert values(stage2, "--init") == ["results/pretrain/bert/encoder"]
    assert values(stage2, "--negatives") == [f"{FT}/scifact/stage1/hard-negatives.parquet",
                                             BM25.format(dataset="scifact")]


def test_low_resource_stages_sample_queries_and_chain_within_their_sample(variant_plan):
    stage1 = job(variant_plan, "finetune_stage1", dataset="scifact", stage="n16s1-stage1")["args"]
    assert stage_config(stage1) | {"train_queries": 16, "train_sample": 1} == stage_config(stage1)
    mine = job(variant_plan, "mine_hard_negatives", dataset="scifact", stage="n16s1-stage1")["args"]
    assert values(mine, "--encoder") == [f"{FT}/scifact/n16s1-stage1/encoder"]
    assert values(mine, "--index") == ["results/index/bert/scifact/n16s1-stage1/faiss"]
    stage2 = job(variant_plan, "finetune_stage2", dataset="scifact", stage="n16s1-stage2")["args"]
    assert values(stage2, "--init") == ["results/pretrain/bert/encoder"]  # restart
    assert values(stage2, "--negatives") == [f"{FT}/scifact/n16s1-stage1/hard-negatives.parquet",
                                             BM25.format(dataset="scifact")]
    assert stage_config(stage2)["train_queries"] == 16 and stage_config(stage2)["train_sample"] == 1


def test_document_rounds_each_mine_with_the_previous_rounds_model(variant_plan):
    stage1 = job(variant_plan, "finetune_stage1", dataset="scifact-docs", stage="stage1")["args"]
    assert values(stage1, "--init") == [f"{FT}/scifact/stage2/encoder"]  # the "passage" model
    assert values(stage1, "--negatives") == [BM25.format(dataset="scifact-docs")]
    for k in (2, 3):
        previous = f"{FT}/scifact-docs/stage{k - 1}"
        stage = job(variant_plan, "finetune_stage2", dataset="scifact-docs", stage=f"stage{k}")
        assert values(stage["args"], "--init") == [f"{previous}/encoder"]
        assert values(stage["args"], "--negatives") == [f"{previous}/hard-negatives.parquet"]
        mine = job(variant_plan, "mine_hard_negatives", dataset="scifact-docs",
                   stage=f"stage{k - 1}")["args"]
        assert values(mine, "--encoder") == [f"{previous}/encoder"]
        assert values(mine, "--index") == [f"results/index/bert/scifact-docs/stage{k - 1}/faiss"]
    # Two rounds: stage 3 is the last; nothing mines with it.
    assert not [j for j in variant_plan if j["rule"] == "mine_hard_negatives"
                and j["wildcards"].get("stage") == "stage3"]


@pytest.fixture(scope="module")
def paper_order_plan(tmp_path_factory) -> list[dict]:
    """The COSTA paper's document order (stage1: init: no BM25 stage; mine with the passage model,
    train round 1, mine again, train round 2) and a stage-0 run (the pre-trained encoder itself)."""
    config = demo_config()
    docs = copy.deepcopy(config["datasets"][0]) | {"name": "scifact-docs"}
    overrides = {
        "datasets": [*config["datasets"], docs],  # the demo's (its baselines read scifact-full)
        "finetune": {
            "models": ["bert"],
            "datasets": [
                {"dataset": "scifact", "split": "train"},
                {"dataset": "scifact-docs", "split": "train",
                 "overrides": {"rounds": 2, "stage1": "init", "stage1_init": "scifact/stage2"}},
            ],
        },
    }
    project = copy_project(tmp_path_factory.mktemp("paper-order") / "project", overrides)
    return planned_jobs(project, "results/runs/scifact-docs/bert-stage3/test.trec",
                        "results/runs/scifact/bert-stage0/test.trec")


def test_documents_in_the_papers_order_mine_first_with_the_passage_model(paper_order_plan):
    plan = paper_order_plan
    passage = f"{FT}/scifact/stage2/encoder"
    assert not [j for j in plan if j["rule"] == "finetune_stage1"
                and j["wildcards"].get("dataset") == "scifact-docs"]
    for rule in ("encode_corpus_shard", "mine_hard_negatives"):
        first = job(plan, rule, dataset="scifact-docs", stage="stage1")["args"]
        assert values(first, "--encoder") == [passage]
    round1 = job(plan, "finetune_stage2", dataset="scifact-docs", stage="stage2")["args"]
    assert values(round1, "--init") == [passage]
    assert values(round1, "--negatives") == [f"{FT}/scifact-docs/stage1/hard-negatives.parquet"]
    round2 = job(plan, "finetune_stage2", dataset="scifact-docs", stage="stage3")["args"]
    assert values(round2, "--init") == [f"{FT}/scifact-docs/stage2/encoder"]
    assert values(round2, "--negatives") == [f"{FT}/scifact-docs/stage2/hard-negatives.parquet"]


def test_stage0_searches_with_the_pretrained_encoder_untrained(paper_order_plan):
    for rule in ("encode_corpus_shard", "dense_search"):
        args = job(paper_order_plan, rule, dataset="scifact", stage="stage0")["args"]
        assert values(args, "--encoder") == ["results/pretrain/bert/encoder"]
    assert not [j for j in paper_order_plan if j["rule"].startswith("finetune")
                and j["wildcards"].get("stage") == "stage0"]


EXPERIMENTS = ROOT / "workflow" / "experiments"


@pytest.fixture(scope="module")
def paper_plan(tmp_path_factory) -> list[dict]:
    """The paper configuration with COSTA's ablations (the overlay adds models; fine-tuning, mining
    and search are paper.yaml's): every job up to the tables."""
    project = copy_project(tmp_path_factory.mktemp("paper") / "project")
    jobs = planned_jobs(
        project, "--configfile", str(EXPERIMENTS / "paper.yaml"),
        str(EXPERIMENTS / "ablations.yaml"), "--", "results/tables.md",
    )
    assert jobs, "the dry run planned nothing"
    return jobs


def test_the_ablation_overlay_fine_tunes_ablated_models_on_bm25_negatives_only(paper_plan):
    """COSTA's ablations ran with BM25 negatives only: an ablated model must never be mined with,
    fine-tuned again or taken to documents, and a tau/projector variant reuses the span index."""
    jobs = paper_plan
    overlay = yaml.safe_load((EXPERIMENTS / "ablations.yaml").read_text())
    main = {"bert", "mlm", "costa", "cpdae", "bow"}
    ablated = {m["name"] for m in overlay["pretrain"]["models"]} - main
    finetuned = {(j["wildcards"]["model"], j["wildcards"]["dataset"], j["wildcards"]["stage"])
                 for j in jobs if j["rule"].startswith("finetune_stage")}
    for model in ablated:
        assert {(d, s) for m, d, s in finetuned if m == model} == {("msmarco-passage", "stage1")}, model
    assert {(d, s) for m, d, s in finetuned if m == "costa"} >= {
        ("msmarco-passage", "stage2"), ("msmarco-doc", "stage3")
    }
    # One span index per span config, whatever the number of models using it.
    span_configs = {j["wildcards"]["spans"] for j in jobs if j["rule"] == "sample_spans"}
    used = {m["spans"] for m in overlay["pretrain"]["models"] if m.get("spans")}
    assert span_configs == used


@pytest.fixture(scope="module")
def ablations_all_plan(tmp_path_factory) -> list[dict]:
    """`all` for the paper with COSTA's ablations, the dump's parts known (local_dump)."""
    project = copy_project(tmp_path_factory.mktemp("paper-all") / "project")
    return planned_jobs(
        project, "--configfile", str(EXPERIMENTS / "paper.yaml"),
        str(EXPERIMENTS / "ablations.yaml"), str(local_dump(project)), "--", "all",
    )


def test_all_builds_for_the_ablation_overlay_only_what_its_tables_read(ablations_all_plan,
                                                                      paper_plan):
    """`all` adds the per-stage statistics page and the analyses to the tables; what they list
    must be what the tables read, not every model fine-tuned on every dataset: an ablated model
    is not mined with, fine-tuned again or taken to documents for them (GPU-days), and no GPU job
    is planned beyond the tables'."""
    ablated = {m["name"] for m in yaml.safe_load((EXPERIMENTS / "ablations.yaml").read_text())
               ["pretrain"]["models"]} - {"bert", "mlm", "costa", "cpdae", "bow"}
    for planned in ablations_all_plan:
        if planned["wildcards"].get("model") in ablated:
            assert planned["rule"] not in ("mine_hard_negatives", "finetune_stage2"), planned
            assert planned["wildcards"].get("dataset") != "msmarco-doc", planned
    gpu = ("pretrain_model", "finetune_stage1", "finetune_stage2", "mine_hard_negatives",
           "encode_corpus_shard", "build_dense_index", "dense_search")

    def counts(plan):
        return {rule: sum(j["rule"] == rule for j in plan) for rule in gpu}

    assert counts(ablations_all_plan) == counts(paper_plan)


def test_a_low_resource_stage_samples_among_the_queries_with_bm25_negatives(paper_plan):
    """Under paper.yaml's queries_without_negatives: drop, a low-resource stage draws its sample
    among the queries stage 1 can train (--sample-among the BM25 negatives); a full stage has no
    sample to draw."""
    bm25 = BM25.format(dataset="msmarco-passage")
    low = job(paper_plan, "finetune_stage1", model="costa", dataset="msmarco-passage",
              stage="n500s0-stage1")["args"]
    assert low[low.index("--sample-among") + 1] == bm25
    full = job(paper_plan, "finetune_stage1", model="costa", dataset="msmarco-passage",
               stage="stage1")["args"]
    assert "--sample-among" not in full


def test_the_low_resource_figure_writes_its_own_section(ablations_all_plan):
    """low_resource_figure writes the low-resource section alone (tables --low-resource-only),
    not a second copy of the whole tables document under results/analysis/low-resource.md."""
    args = job(ablations_all_plan, "low_resource_figure")["args"]
    assert "--low-resource-only" in args
    assert values(args, "--out") == ["results/analysis/low-resource.md"]



def _span_jobs(plan, rule):
    return {tuple(j["wildcards"][k] for k in ("corpus", "spans", "shard") if k in j["wildcards"])
            for j in plan if j["rule"] == rule}


@pytest.fixture(scope="module")
def overlay_plans(tmp_path_factory) -> dict[str, list[dict]]:
    """Dry-run plans, the dump's parts known (local_dump): paper.yaml's `all` and tables, and
    `all` with the BoW overlay."""
    project = copy_project(tmp_path_factory.mktemp("spans") / "project")
    dump = str(local_dump(project))
    overlays = {"paper-all": (["paper.yaml"], "all"),
                "paper-tables": (["paper.yaml"], "results/tables.md"),
                "bow-all": (["paper.yaml", "bow.yaml"], "all")}
    return {name: planned_jobs(project, "--configfile",
                               *[str(EXPERIMENTS / f) for f in files], dump, "--", target)
            for name, (files, target) in overlays.items()}


def test_all_samples_and_audits_only_the_span_indexes_its_tables_read(overlay_plans):
    """The statistics page and the span audits of `all` list the span indexes of the models the
    report reaches, not every spans entry: bow.yaml reports no COSTA model (no span index at all),
    paper.yaml's tables read costa's index only (its ablation entries: ablations.yaml)."""
    assert _span_jobs(overlay_plans["bow-all"], "sample_spans") == set()
    assert _span_jobs(overlay_plans["bow-all"], "audit_spans") == set()
    sampled = _span_jobs(overlay_plans["paper-all"], "sample_spans")
    assert sampled == _span_jobs(overlay_plans["paper-tables"], "sample_spans")
    assert {spans for _, spans, _ in sampled} == {"costa"}
    # each sampled index is audited (audit_spans reads all its shards)
    audited = _span_jobs(overlay_plans["paper-all"], "audit_spans")
    assert audited == {(corpus, spans) for corpus, spans, _ in sampled}


def _stage_settings():
    """rule -> the function its stage builds its settings with from the rule's --config slice."""
    from retrieval_pretraining import encode, mine
    from retrieval_pretraining.dense_search import SearchSettings
    from retrieval_pretraining.finetune.settings import FinetuneSettings
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    def mining(config):
        return mine.policy(config), RetrievalSettings.from_config(config, added=mine.MINING_KEYS)

    return {"finetune_stage1": FinetuneSettings.from_config,
            "finetune_stage2": FinetuneSettings.from_config,
            "encode_corpus_shard": encode.settings, "mine_hard_negatives": mining,
            "dense_search": SearchSettings.from_config}


@pytest.mark.parametrize("plan", ["costa_plan", "variant_plan", "paper_plan"])
def test_every_planned_slice_is_accepted_and_a_stray_key_is_refused(plan, request):
    """The settings of fine-tuning, encoding, mining and search accept exactly what their rules
    pass (the demo's, a variant's and the paper's slices), and refuse a key beyond it, naming it."""
    from retrieval_pretraining.config import ConfigError

    builders = _stage_settings()
    seen = set()
    for planned in request.getfixturevalue(plan):
        if planned["rule"] in builders:
            config = stage_config(planned["args"])
            builders[planned["rule"]](config)
            if planned["rule"] not in seen:
                with pytest.raises(ConfigError, match=r"unknown config key\(s\) 'p_lenn'; known"):
                    builders[planned["rule"]]({**config, "p_lenn": 64})
            seen.add(planned["rule"])
    assert seen == set(builders), f"{plan} planned no {sorted(set(builders) - seen)} job"
