"""BEIR zero-shot evaluation from config (issue 6): a dataset nobody fine-tunes on is encoded and
searched with the encoders fine-tuned on another one, and its table asks for nothing else.

Asserted on Snakemake's own plan (a dry run with the shell commands), so nothing heavy runs.
"""

from __future__ import annotations

import re

import pytest

from workflow_harness import copy_project, snakemake

TARGET = "scifact-zs"


def _overrides() -> dict:
    test = {"dataset": TARGET, "split": "test"}
    demo_dataset = {
        "name": "scifact", "format": "beir", "path": "data/beir/scifact",
        "splits": [{"name": "train"}, {"name": "test"}], "title": "space",
        "exclude_query_id": True,
    }
    return {
        # The target is a second BEIR folder entry (the shipped SciFact again, test split only).
        "datasets": [demo_dataset, demo_dataset | {"name": TARGET, "splits": [{"name": "test"}]}],
        "evaluate": {
            "baselines": [],  # the demo's is published on scifact-full, not configured here
            "splits": [
                {"dataset": "scifact", "split": "test", "measures": ["nDCG@10"]},
                test | {"measures": ["nDCG@10", "R@100"]},
            ],
            "zero_shot": [{"dataset": TARGET, "trained_on": "scifact"}],
        },
        "report": {
            "tables": [
                {
                    "name": "zero-shot",
                    "title": "zero-shot",
                    "columns": [test | {"measure": "nDCG@10", "label": "nDCG@10"}],
                    "rows": [{"model": "costa"}],
                    "groups": [{"suffix": "stage2", "label": "hard negatives"}],
                    "baselines": [{"system": "bm25", "mark": "†", "label": "BM25"}],
                }
            ],
            "analysis": {"loss_curves": False, "tsne": None, "coverage": None,
                         "cpdae_top_words": None},
        },
    }


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("zero-shot") / "project", _overrides())
    result = snakemake(project, "--dry-run", "--printshellcmds", "results/tables.md")
    return project, result.stdout + result.stderr


def test_the_target_is_encoded_and_searched_with_the_source_encoder(plan):
    _, output = plan
    source_encoder = "results/finetune/costa/scifact/stage2/encoder"
    encode = [l for l in output.splitlines() if "retrieval_pretraining.encode " in l and TARGET in l]
    assert encode, "no encoding job for the zero-shot target"
    assert all(f"--encoder {source_encoder}" in l for l in encode), encode
    assert all(f"--corpus results/datasets/{TARGET}/corpus.parquet" in l for l in encode)
    search = [l for l in output.splitlines() if "retrieval_pretraining.dense_search " in l]
    assert len(search) == 1 and f"--encoder {source_encoder}" in search[0], search
    assert f"results/runs/{TARGET}/costa-stage2/test.trec" in search[0]


def test_nothing_is_fine_tuned_or_mined_on_the_target(plan):
    _, output = plan
    outputs = re.findall(r"output: (.*)", output)
    assert any(f"results/index/costa/{TARGET}/stage2" in o for o in outputs), "plan not parsed"
    for rule_output in outputs:
        assert f"finetune/costa/{TARGET}" not in rule_output
        assert f"bm25/{TARGET}/negatives" not in rule_output
    # Only the table's system (costa, stage 2) and BM25 are run on the target.
    runs = set(re.findall(rf"results/runs/{TARGET}/([^/\s]+)/test\.trec", output))
    assert runs == {"costa-stage2", "bm25"}, runs


def test_a_zero_shot_source_that_is_not_fine_tuned_fails_at_parse_time(plan, tmp_path):
    overrides = _overrides()
    overrides["evaluate"]["zero_shot"] = [{"dataset": TARGET, "trained_on": "nfcorpus"}]
    project = copy_project(tmp_path / "project", overrides)
    result = snakemake(project, "--dry-run", "results/tables.md", check=False)
    assert result.returncode != 0
    assert "evaluate.zero_shot.0.trained_on" in result.stdout + result.stderr
