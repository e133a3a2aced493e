"""mining.overrides: one fine-tuning dataset mines with a policy of its own (the BoW recipe's MS
MARCO run beside COSTA's), the others exactly as before. Every job's params are its rerun trigger,
so the tests compare the params Snakemake plans with and without an override, and the refusals the
workflow gives when it parses."""

from __future__ import annotations

import ast
import copy
import itertools
import json

import pytest
import yaml
from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import config_checks
from retrieval_pretraining import references
from workflow_harness import ROOT, copy_project, edit_config, planned_params

# A BoW-like override (bow.yaml counts places on a 1000-deep search): ranks 3..200, 128 at random.
BOW = {"depth": 200, "rank_window": [3, None], "num_negatives": 128, "sample": "random"}
TARGETS = ("results/runs/scifact/bert-stage2/test.trec",
           "results/runs/scifact-docs/bert-stage2/test.trec")


def demo_config() -> dict:
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def two_datasets(config: dict) -> dict:
    """The demo fine-tuning scifact and a copy of it, scifact-docs (each mines once)."""
    docs = copy.deepcopy(config["datasets"][0]) | {"name": "scifact-docs"}
    negatives = config["bm25"]["negatives"][0]
    return {
        "datasets": [*config["datasets"], docs],
        "bm25": {"negatives": [negatives, negatives | {"dataset": "scifact-docs"}]},
        "finetune": {"models": ["bert"], "datasets": [{"dataset": "scifact", "split": "train"},
                                                      {"dataset": "scifact-docs",
                                                       "split": "train"}]},
    }


def mining_config(job: dict) -> dict:
    """The --config JSON a planned mine_hard_negatives job passes (params.mining)."""
    return json.loads(ast.literal_eval(job["named"]["mining"]))


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[dict, dict]:
    """(without, with) an override for scifact-docs: the plans of both datasets' stage-2 runs."""
    project = copy_project(tmp_path_factory.mktemp("mining-overrides") / "project",
                           two_datasets(demo_config()))
    before = planned_params(project, *TARGETS)
    override = {"dataset": "scifact-docs", **BOW, "positives_removed": "first_query"}
    edit_config(project, lambda config: config["mining"].update(overrides=[override]))
    return before, planned_params(project, *TARGETS)


def test_an_override_reaches_its_dataset_s_mining_and_nothing_else(plans):
    """The dry run's mine job of scifact-docs passes the override (a key the section lacks,
    positives_removed, included); every other job, scifact's mining among them, plans the same
    params, so nothing of theirs reruns."""
    from retrieval_pretraining import mine

    before, after = plans
    assert before.keys() == after.keys()
    changed = {key for key in before if before[key]["params"] != after[key]["params"]}
    mined = {key for key in before if key[0] == "mine_hard_negatives"}
    docs = {key for key in mined if "/scifact-docs/" in key[1]}
    assert docs and mined - docs, mined
    assert changed == docs, sorted(changed)
    for key in docs:
        # The section's slice with the override's keys replaced or added, and nothing else.
        policy = mining_config(after[key])
        assert mining_config(before[key]) | BOW | {"positives_removed": "first_query"} == policy
        assert policy["num_negatives"] == 128 and policy["rank_window"] == [3, None]
        # What mine.py reads from it, and records as the mined set's manifest's params.policy.
        assert mine.policy(policy) | BOW | {"positives_removed": "first_query"} == mine.policy(
            policy)


def test_a_dataset_without_an_override_passes_the_section_s_policy_as_before(plans):
    """scifact's mining slice: the retrieval knobs, exclude_self, use_gpu and the section's policy
    keys, not `overrides` (whose presence would change every mining job's params)."""
    before, after = plans
    demo = demo_config()["mining"]
    for key in [k for k in after if k[0] == "mine_hard_negatives" and "/scifact/" in k[1]]:
        assert after[key]["named"]["mining"] == before[key]["named"]["mining"]
        policy = mining_config(after[key])
        assert {k: policy[k] for k in ("depth", "sample", "num_negatives", "rank_window")} == {
            k: demo[k] for k in ("depth", "sample", "num_negatives", "rank_window")}
        assert policy["negative_filter"] == "qrels" and "positives_removed" not in policy
        assert not {"overrides", "index", "keep_vectors"} & set(policy)


@pytest.fixture
def demo() -> dict:
    """The config two_datasets' project plans (its sections merged into the demo's)."""
    config = demo_config()
    added = copy.deepcopy(two_datasets(config))
    config["datasets"] = added["datasets"]
    config["bm25"]["negatives"] = added["bm25"]["negatives"]
    config["finetune"] |= added["finetune"]
    return config


def refusal(config: dict) -> str:
    """The parse-time refusal of `config` (config_checks.validate, then references.check)."""
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(config)
        references.check(config)
    return " ".join(str(error.value).split())


@pytest.mark.parametrize("overrides, expected", [
    ([{"dataset": "scifact-doc", "depth": 100}],
     "config key 'mining.overrides.0.dataset': 'scifact-doc' is not a datasets entry"),
    ([{"dataset": "scifact-full", "depth": 100}],
     "config key 'mining.overrides.0.dataset': 'scifact-full' is not fine-tuned on"),
    ([{"dataset": "scifact-docs", "depth": 100}, {"dataset": "scifact-docs", "sample": "top"}],
     "config key 'mining.overrides.1.dataset': 'scifact-docs' has an entry already "
     "(mining.overrides.0)"),
    ([{"dataset": "scifact-docs", "index": {"type": "ivf"}}],
     "config key 'mining.overrides.0': Additional properties are not allowed ('index' was"),
    ([{"dataset": "scifact-docs", "keep_vectors": False}],
     "config key 'mining.overrides.0': Additional properties are not allowed ('keep_vectors'"),
    ([{"dataset": "scifact-docs", "depth": 2, "rank_window": [3, None]}],
     "config key 'mining.overrides.0.rank_window': on 'scifact-docs' (depth from "
     "mining.overrides.0.depth) the window starts at rank 3 but depth is 2"),
    # The section's window [3, null) with a depth of 2 on one dataset: the window is the section's.
    ([{"dataset": "scifact-docs", "depth": 2}],
     "config key 'mining.rank_window': on 'scifact-docs' (depth from mining.overrides.0.depth) "
     "the window starts at rank 3 but depth is 2"),
    ([{"dataset": "scifact-docs", "rank_window": [3, 202]}],
     "config key 'mining.overrides.0.rank_window': on 'scifact-docs' (depth from mining.depth) "
     "the window [3, 202) reaches past depth 200"),
    ([{"dataset": "scifact-docs", "sample": "best"}],
     "config key 'mining.overrides.0.sample': 'best' is not one of"),
], ids=["unknown", "not-fine-tuned", "twice", "index", "keep_vectors", "lo-past-own-depth",
        "lo-past-overridden-depth", "hi-past-depth", "sample"])
def test_an_override_nothing_could_mine_with_is_refused_naming_the_key(demo, overrides, expected):
    bad = copy.deepcopy(demo)
    bad["mining"]["rank_window"] = [3, None]
    bad["mining"]["overrides"] = overrides
    assert expected in refusal(bad)
    good = copy.deepcopy(demo)
    good["mining"]["overrides"] = [{"dataset": "scifact-docs", **BOW}]
    config_checks.validate(good)
    references.check(good)


def test_the_section_s_own_window_past_its_depth_is_refused_when_the_workflow_parses(demo):
    """The same check on a dataset without an override: before, the mining job refused it, after
    a whole corpus encoding and index build."""
    bad = copy.deepcopy(demo)
    bad["mining"]["rank_window"] = [201, None]
    assert ("config key 'mining.rank_window': the window starts at rank 201 but depth is 200"
            in refusal(bad))


def test_the_parse_time_window_check_refuses_what_the_mining_job_refuses():
    """references.window_mistake restates mine.check_window (which imports torch and faiss, too
    slow for a parse): on every window the schema admits, they refuse the same ones."""
    from retrieval_pretraining import mine

    for depth, lo, hi in itertools.product(range(1, 6), range(1, 8), [None, *range(1, 9)]):
        try:
            mine.check_window([lo, hi], depth)
            refused = False
        except mine.ConfigError:
            refused = True
        assert (references.window_mistake([lo, hi], depth) is not None) == refused, (lo, hi, depth)
    assert references.window_mistake(None, 1) is None


def test_answer_positives_without_the_answers_filter_is_refused_when_the_workflow_parses(demo):
    """mine.policy refuses answer_positives where the negative filter is not answers (it finds no
    answer passage to write); the rules resolve `auto` to qrels on a dataset that is not format
    dpr, so the demo's datasets can never have it. Refused at parse time, naming the key, not by
    the mining job after a whole corpus encoding and index build."""
    from retrieval_pretraining import mine

    for where in ("section", "override"):
        bad = copy.deepcopy(demo)
        if where == "section":
            bad["mining"]["answer_positives"] = True
            key = "mining.answer_positives"
        else:
            bad["mining"]["overrides"] = [{"dataset": "scifact-docs", "answer_positives": True}]
            key = "mining.overrides.0.answer_positives"
        message = refusal(bad)
        assert f"config key '{key}'" in message and "negative_filter" in message, message
    with pytest.raises(experiment_config.ConfigError, match="answer_positives"):
        mine.policy({"answer_positives": True, "negative_filter": "qrels"})
    good = copy.deepcopy(demo)
    good["mining"]["answer_positives"] = False
    config_checks.validate(good)
    references.check(good)


def test_min_negatives_above_num_negatives_is_refused_when_the_workflow_parses(demo):
    """A query keeps at most num_negatives (mine.select_negatives), and mine_batch then empties a
    query left with fewer than min_negatives, so a minimum above the cut would leave every query
    none: the mined set would train nothing, said only by its manifest's count."""
    import numpy as np
    import pyarrow as pa

    from retrieval_pretraining import mine

    bad = copy.deepcopy(demo)
    bad["mining"]["overrides"] = [{"dataset": "scifact-docs", "min_negatives": 31}]
    message = refusal(bad)
    assert "config key 'mining.overrides.0.min_negatives': on 'scifact-docs' 31 is above " \
        "num_negatives 30" in message, message
    bad["mining"]["min_negatives"] = 40
    bad["mining"]["overrides"] = [{"dataset": "scifact-docs", "num_negatives": 50}]
    message = refusal(bad)
    assert "config key 'mining.min_negatives': on 'scifact'" in message, message
    assert "scifact-docs" not in message, message
    for least, most in ((30, 30), (None, 30), (300, None)):
        good = copy.deepcopy(demo)
        good["mining"] |= {"min_negatives": least, "num_negatives": most}
        config_checks.validate(good)
        references.check(good)
    # What the refusal spares: the job would mine an empty list for every query.
    docs = [f"d{i}" for i in range(100)]
    knobs = {**mine.policy({"num_negatives": 30, "min_negatives": 31}), "sample": "top"}
    ids = pa.array(docs)
    table = mine.mine_batch([("q", np.arange(100), np.linspace(1, 0, 100, dtype=np.float32))],
                            ids, mine.IdRows(ids, ["x"]).of(["x"]), {"q": ["x"]}, {"x"}, {}, knobs, 0,
                            dict.fromkeys(("positives_removed", "answer_passages_removed",
                                           "own_positives_kept", "queries_below_min_negatives"),
                                          0))
    assert table["negative_ids"].to_pylist() == [[]]
