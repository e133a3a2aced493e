"""bm25.overrides: a dataset's own k1, b or title (paper.yaml's msmarco-passage indexes the text
only, as Anserini's passage baseline does). The rules apply an entry to the dataset of its name
alone, so a misspelt name left that dataset's BM25 on the section's settings without a word, and
a name listed twice applied both entries; the workflow now refuses both when it parses."""

from __future__ import annotations

import copy

import pytest
import yaml
from retrieval_pretraining import config_checks
from retrieval_pretraining import references
from test_mining_overrides import refusal
from workflow_harness import ROOT, merged_configs

EXPERIMENTS = ROOT / "workflow" / "experiments"


@pytest.fixture
def demo() -> dict:
    """The demo config with an alias of scifact (an alias's override decides its index)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["datasets"].append({"name": "scifact-bow", "same_as": "scifact"})
    return config


@pytest.mark.parametrize("overrides, expected", [
    ([{"dataset": "scifcat", "title": "none"}],
     "config key 'bm25.overrides.0.dataset': 'scifcat' is not a datasets entry, so these "
     "settings would apply to no BM25 run; known: scifact, scifact-full, scifact-bow"),
    ([{"dataset": "scifact", "k1": 0.82}, {"dataset": "scifact", "b": 0.68}],
     "config key 'bm25.overrides.1.dataset': 'scifact' has an entry already "
     "(bm25.overrides.0); give it one, with every key"),
    ([{"dataset": "scifact-bow", "title": "none"}, {"dataset": "scifact-bow", "k1": 0.82}],
     "config key 'bm25.overrides.1.dataset': 'scifact-bow' has an entry already "
     "(bm25.overrides.0)"),
], ids=["unknown", "twice", "alias-twice"])
def test_an_override_no_bm25_run_reads_as_written_is_refused_naming_the_key(
        demo, overrides, expected):
    bad = copy.deepcopy(demo)
    bad["bm25"]["overrides"] = overrides
    assert expected in refusal(bad)


def test_an_override_of_each_dataset_and_alias_once_is_valid(demo):
    demo["bm25"]["overrides"] = [{"dataset": "scifact", "k1": 0.82, "b": 0.68},
                                 {"dataset": "scifact-bow", "title": "none"},
                                 {"dataset": "scifact-full", "title": "space"}]
    config_checks.validate(demo)
    references.check(demo)


@pytest.mark.parametrize("files", [
    (), ("small.yaml",), ("paper.yaml",), ("paper.yaml", "bow.yaml"),
    ("paper.yaml", "ablations.yaml"),
], ids=lambda files: "+".join(("config.yaml", *files)))
def test_the_shipped_configs_pass_the_parse_time_checks(files):
    """Each config a documented command line builds (config.yaml, then each --configfile)."""
    config = merged_configs(ROOT / "config.yaml", *(EXPERIMENTS / name for name in files))
    config_checks.validate(config)
    references.check(config)
    if "paper.yaml" in files:  # the override the BM25 row's text depends on is still there
        assert {"dataset": "msmarco-passage", "title": "none"} in config["bm25"]["overrides"]
