"""Baseline encoders as table rows (evaluate.baselines, rules/baselines.smk): a published
checkpoint, or one of our pre-trained encoders as it is, through the same encoding, index, search
and scoring.

Asserted on Snakemake's own plan (a dry run with the shell commands), so nothing heavy runs. The
number itself: the demo's baseline job gets exactly the retrieval settings with which
tests/test_dense_anchor.py reproduces all-MiniLM-L6-v2's published SciFact nDCG@10 (0.6451)
through the same stage functions; the workflow run itself is recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from retrieval_pretraining import dense_search, encode
from retrieval_pretraining.retrieval_settings import RetrievalSettings, with_runtime

from anchors.make_scifact_minilm_vectors import KNOBS as ANCHOR_KNOBS
from workflow_harness import ROOT, copy_project, snakemake

DEMO = yaml.safe_load((ROOT / "config.yaml").read_text())
METRICS = "results/metrics/scifact-full/all-minilm-l6-v2/test.json"


def _commands(output: str, module: str) -> list[list[str]]:
    """The planned shell commands that run `python -m retrieval_pretraining.<module>`, directly
    or through claim_run (the GPU stages), split."""
    lines = (line.strip().removeprefix("Shell command: ") for line in output.splitlines())
    claimed = r"claim_run --gpus \d+ --module retrieval_pretraining\."
    return [
        shlex.split(line)
        for line in lines
        if re.match(rf"python -m retrieval_pretraining\.({claimed})?{module} ", line)
    ]


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("baselines") / "project")
    result = snakemake(project, "--dry-run", "--printshellcmds", METRICS)
    return result.stdout + result.stderr


def test_the_demo_baseline_runs_the_stages_our_models_run_on_the_full_corpus(plan):
    jobs = {rule: len(re.findall(rf"^rule {rule}:", plan, re.M)) for rule in (
        "stage_checkpoint", "encode_baseline_shard", "build_baseline_index", "baseline_search",
        "score_run", "finetune_stage1", "pretrain_model", "encode_corpus_shard")}  # fmt: skip
    assert jobs == {"stage_checkpoint": 1, "encode_baseline_shard": 1, "build_baseline_index": 1,
                    "baseline_search": 1, "score_run": 1, "finetune_stage1": 0,
                    "pretrain_model": 0, "encode_corpus_shard": 0}, jobs  # fmt: skip
    [stage] = _commands(plan, "checkpoints")
    assert json.loads(_option(stage, "--config"))["num_layers"] is None  # all 6 layers
    [enc] = _commands(plan, "encode")
    assert _option(enc, "--encoder") == "results/checkpoints/all-minilm-l6-v2"
    assert _option(enc, "--corpus") == "results/datasets/scifact-full/corpus.parquet"
    assert _option(enc, "--out-npy").startswith("results/baselines/all-minilm-l6-v2/scifact-full/")
    [search] = _commands(plan, "dense_search")
    assert _option(search, "--tag") == "all-minilm-l6-v2"
    assert _option(search, "--out") == "results/runs/scifact-full/all-minilm-l6-v2/test.trec"
    # scifact-full is the whole corpus: no subset, so the published number applies.
    full = next(d for d in DEMO["datasets"] if d["name"] == "scifact-full")
    assert "subset" not in full and full["path"] == "data/beir/scifact"


def test_the_tables_get_the_shard_count_that_names_the_baseline_s_encoding_logs(tmp_path):
    """The provenance names one encode_baseline_shard log per shard (tables/provenance.py), as
    many on each dataset of its columns as its encoding there has."""
    project = copy_project(tmp_path / "project", {"finetune": {"shards": 3}})
    result = snakemake(project, "--dry-run", "--printshellcmds", "--forceall", "results/tables.md")
    [tables] = _commands(result.stdout + result.stderr, "tables")
    baseline = json.loads(_option(tables, "--config"))["baselines"]["all-minilm-l6-v2"]
    assert baseline["shards"] == {"scifact-full": 3}, baseline


def _slice(command):
    """What the stage reads: its --config with its --runtime merged in, as its CLI merges them."""
    return with_runtime(json.loads(_option(command, "--config")),
                        json.loads(_option(command, "--runtime")))


def test_the_jobs_get_the_anchor_tests_settings_so_they_compute_its_number(plan):
    """Each stage accepts the slice its rule hands it, and the retrieval settings in it are the
    ones test_dense_anchor.py reproduces 0.6451 with (search depth aside: nDCG@10 reads 10): the
    search's all of them, the corpus encoding's the passage side (it is handed no q_len)."""
    [enc] = _commands(plan, "encode")
    [search] = _commands(plan, "dense_search")
    encode_knobs = encode.settings(_slice(enc))
    search_knobs = dense_search.SearchSettings.from_config(_slice(search))
    anchor = RetrievalSettings.from_config(ANCHOR_KNOBS, added=("search_depth", "use_gpu"))
    assert search_knobs.retrieval == anchor
    assert encode_knobs.corpus_record() == anchor.corpus_record()
    assert "q_len" not in _slice(enc)
    assert search_knobs.exclude_self and search_knobs.search_depth >= 10


def test_one_of_our_encoders_as_a_baseline_with_its_own_knobs(tmp_path):
    """`pretrain:<model>`: the pre-trained encoder itself, with the entry's pooling, lengths and
    prefixes (stage0 rows use the fine-tuning knobs instead, and only on fine-tuning datasets)."""
    entry = {"name": "costa-e5style", "checkpoint": "pretrain:costa", "pooling": "cls",
             "similarity": "dot", "q_len": 64, "p_len": 200, "query_prefix": "query: ",
             "passage_prefix": "passage: "}  # fmt: skip
    table = DEMO["report"]["tables"][-1] | {"baseline_rows": ["costa-e5style"]}
    overrides = {
        "evaluate": {"baselines": [entry]},
        "report": {"tables": [DEMO["report"]["tables"][0], table]},
    }
    project = copy_project(tmp_path / "project", overrides)
    metrics = "results/metrics/scifact-full/costa-e5style/test.json"
    result = snakemake(project, "--dry-run", "--printshellcmds", metrics)
    output = result.stdout + result.stderr
    [enc] = _commands(output, "encode")
    [search] = _commands(output, "dense_search")
    assert _option(enc, "--encoder") == "results/pretrain/costa/encoder"
    knobs = json.loads(_option(enc, "--config"))
    assert knobs["passage_prefix"] == "passage: "
    assert (knobs["pooling"], knobs["p_len"], knobs["title"]) == ("cls", 200, "space")
    assert not {"q_len", "query_prefix"} & knobs.keys()  # the queries' own: the search's alone
    queries = json.loads(_option(search, "--config"))
    assert (queries["query_prefix"], queries["q_len"]) == ("query: ", 64)
    assert "rule pretrain_model:" in output and "rule finetune_stage1:" not in output


def test_a_baseline_searches_a_dataset_as_our_fine_tuned_encoders_there_do(tmp_path):
    """finetune.datasets[].overrides set a dataset's search depth, stored dtype, shards and
    encoding batch for our encoders' runs on it; a baseline on the same dataset took finetune's
    shared values, so one table's rows differed in depth and precision. Both now read the
    dataset's: the baseline's encoding and search slices agree with our stage-2 encoder's there
    (outside the baseline's own pooling, similarity, lengths and prefixes)."""
    overrides = {"search_depth": 150, "dtype": "float32", "shards": 2, "encode_batch_size": 16}
    finetune = {"datasets": [dict(DEMO["finetune"]["datasets"][0], overrides=overrides)]}
    project = copy_project(tmp_path / "project", {"finetune": finetune})
    result = snakemake(project, "--dry-run", "--printshellcmds",
                       "results/metrics/scifact/all-minilm-l6-v2/test.json",
                       "results/metrics/scifact/costa-stage2/test.json")
    output = result.stdout + result.stderr
    encodes = _commands(output, "encode")
    searches = {_option(c, "--tag"): c for c in _commands(output, "dense_search")}
    ours = [c for c in encodes if "/costa/scifact/stage2/" in _option(c, "--out-npy")]
    staged = "results/checkpoints/all-minilm-l6-v2"
    theirs = [c for c in encodes if _option(c, "--encoder") == staged]
    assert len(ours) == len(theirs) == 2, (len(ours), len(theirs))
    shared = ("dtype", "encode_batch_size", "title")
    assert {k: _slice(theirs[0])[k] for k in shared} == {k: _slice(ours[0])[k] for k in shared}
    searched = ("dtype", "search_depth", "exclude_self", "encode_batch_size")
    baseline, model = _slice(searches["all-minilm-l6-v2"]), _slice(searches["costa-stage2"])
    assert {k: baseline[k] for k in searched} == {k: model[k] for k in searched}
    assert (baseline["search_depth"], baseline["dtype"]) == (150, "float32"), baseline
