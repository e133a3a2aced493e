"""Dataset aliases (`datasets: [{name: A, same_as: S}]`): S's data under a second name.

One collection fine-tuned and evaluated under two recipes (bow.yaml's BoW recipe beside
paper.yaml's COSTA recipe on msmarco-passage) without downloading and preparing it twice: the
alias's prepared files are copies of its source's, and what compares dataset names to ask "the
same collection?" (in-domain numbers, zero-shot targets, benchmarks) sees through it.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import dataset_aliases, references
from test_dataset_reruns import DPR, _dpr_entry
from workflow_harness import (
    ROOT,
    copy_project,
    edit_config,
    merged_configs,
    planned_params,
    planned_rules,
    snakemake,
)


@pytest.fixture(scope="module")
def demo():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def _with(config: dict, *entries: dict) -> dict:
    config = copy.deepcopy(config)
    config["datasets"] += list(entries)
    return config


def _refusal(config: dict) -> str:
    with pytest.raises(experiment_config.ConfigError) as error:
        experiment_config.validate(config)
    return str(error.value)


def test_an_alias_is_its_sources_entry_under_its_own_name(demo):
    config = _with(demo, {"name": "scifact-bow", "same_as": "scifact"},
                   {"name": "scifact-again", "same_as": "scifact-bow"})
    experiment_config.validate(config)
    resolved = {e["name"]: e for e in dataset_aliases.resolve(config["datasets"])}
    source = next(e for e in demo["datasets"] if e["name"] == "scifact")
    # An alias of an alias is resolved to the first entry of the chain.
    for alias in ("scifact-bow", "scifact-again"):
        assert resolved[alias] == dict(source, name=alias)
    assert dataset_aliases.sources(config["datasets"]) == {
        "scifact-bow": "scifact", "scifact-again": "scifact"}
    assert resolved["scifact"] == source  # the source itself untouched


def test_the_references_an_alias_takes_are_its_sources_splits(demo):
    """The checks of named splits read an alias (as written in the config) as its source."""
    config = _with(demo, {"name": "scifact-bow", "same_as": "scifact"})
    config["evaluate"]["splits"].append(
        {"dataset": "scifact-bow", "split": "test", "measures": ["nDCG@10"],
         "relevance_level": 1})
    references.check(config)
    config["evaluate"]["splits"][-1]["split"] = "dev"
    with pytest.raises(experiment_config.ConfigError,
                       match="'dev' is not a split of 'scifact-bow'"):
        references.check(config)


@pytest.mark.parametrize("entry, words", [
    ({"name": "x", "same_as": "nowhere"}, ["datasets.2.same_as", "'nowhere'", "listed before"]),
    ({"name": "x", "same_as": "x"}, ["datasets.2.same_as", "this entry itself"]),
    ({"name": "x", "same_as": "scifact", "title": "sep"},
     ["datasets.2", "'title'", "name, same_as"]),
])
def test_a_bad_alias_is_refused_naming_the_key(demo, entry, words):
    message = _refusal(_with(demo, entry))
    assert all(w in message for w in words), message


@pytest.mark.parametrize("entry, index", [
    ({"name": "scifact-full", "same_as": "scifact"}, 1),  # the demo's full-corpus entry's name
    ({"name": "scifact", "same_as": "scifact-full"}, 0),
])
def test_an_alias_under_another_entrys_name_is_refused_in_one_message(demo, entry, index):
    """Aliases resolve by name: with two entries of one name the resolved config held the
    alias's copy of scifact (a 1500-document sample) as 'scifact-full', and the cross-checks
    went on to refuse scifact-full's published number as one for a sample, a mistake the
    config does not make."""
    message = _refusal(_with(demo, entry))
    lines = message.splitlines()[1:]
    assert len(lines) == 1, message
    assert "datasets.2.name" in message and f"'{entry['name']}'" in message, message
    assert f"datasets.{index}" in message and "a name of its own" in message, message


def test_an_alias_of_a_later_entry_is_refused(demo):
    config = copy.deepcopy(demo)
    config["datasets"].insert(0, {"name": "first", "same_as": "scifact"})
    message = _refusal(config)
    assert "datasets.0.same_as" in message and "move this alias after it" in message, message


def _evaluated_alias(demo: dict) -> dict:
    """The demo with scifact-bow, an alias of scifact, scored on its test split."""
    config = _with(demo, {"name": "scifact-bow", "same_as": "scifact"})
    config["evaluate"]["splits"].append(
        {"dataset": "scifact-bow", "split": "test", "measures": ["nDCG@10"],
         "relevance_level": 1})
    return config


def test_a_zero_shot_target_that_is_the_fine_tuned_collection_is_refused(demo):
    """scifact is fine-tuned on: its alias is the same collection, so runs there are in-domain."""
    config = _evaluated_alias(demo)
    config["evaluate"]["zero_shot"] = [{"dataset": "scifact-bow", "trained_on": "scifact"}]
    message = _refusal(config)
    assert "evaluate.zero_shot.0.dataset" in message and "same_as" in message, message


def test_an_aliass_column_takes_its_sources_benchmark(demo):
    config = _evaluated_alias(demo)
    table = config["report"]["tables"][0]
    table["columns"] = [{"dataset": "scifact-bow", "split": "test", "measure": "nDCG@10",
                         "benchmark": "scifact-test"}]
    experiment_config.validate(config)




def _add_aliases(project: Path) -> None:
    def edit(config):
        config["datasets"] += [_dpr_entry(project), {"name": "dpr-alias", "same_as": DPR},
                               {"name": "scifact-bow", "same_as": "scifact"}]
    edit_config(project, edit)


ALIAS_FILES = {
    "dpr-alias": ["corpus.parquet", "dataset.json", "queries-test.parquet",
                  "qrels-test.parquet", "answers-test.parquet"],
    "scifact-bow": ["corpus.parquet", "dataset.json", "queries-test.parquet",
                    "qrels-test.parquet"],
}
SOURCES = {"dpr-alias": DPR, "scifact-bow": "scifact"}


def _targets() -> list[str]:
    return [f"results/datasets/{alias}/{name}"
            for alias, names in ALIAS_FILES.items() for name in names]


def test_an_aliases_dry_run_prepares_each_source_once(tmp_path):
    """Nothing is downloaded or parsed for the alias: the source's jobs, once, and copies."""
    project = copy_project(tmp_path / "project")
    _add_aliases(project)
    sources = [t.replace("dpr-alias", DPR).replace("scifact-bow", "scifact") for t in _targets()]
    plan = planned_rules(project, *_targets(), *sources, "results/bm25/scifact-bow/index")
    assert plan == {
        "download_dataset_file": 2,  # the dpr source's two files, fetched under its name
        "prepare_dataset": 2,  # one corpus per source
        "prepare_dataset_split": 2,
        "prepare_dataset_answers": 1,
        "alias_dataset_file": 9,
        "build_bm25_index": 1,  # the source's; the alias's is its copy
        "alias_bm25_index": 1,
    }, plan


def test_an_alias_with_another_indexed_text_builds_its_own_bm25_index(tmp_path):
    project = copy_project(tmp_path / "project")
    _add_aliases(project)
    edit_config(project, lambda c: c["bm25"].setdefault("overrides", []).append(
        {"dataset": "scifact-bow", "title": "none"}))
    plan = planned_rules(project, "results/bm25/scifact-bow/index")
    assert plan.get("build_bm25_index") == 1 and "alias_bm25_index" not in plan, plan
    assert plan.get("alias_dataset_file") == 1, plan  # its corpus is still a copy


def test_an_aliases_prepared_files_are_copies_of_its_sources(tmp_path):
    project = copy_project(tmp_path / "project")
    _add_aliases(project)
    snakemake(project, *_targets(), "results/bm25/scifact-bow/index")
    for alias, names in ALIAS_FILES.items():
        for name in names:
            copied = project / "results" / "datasets" / alias / name
            source = project / "results" / "datasets" / SOURCES[alias] / name
            assert copied.read_bytes() == source.read_bytes(), copied
            if name != "dataset.json":
                stem = name.split(".")[0]
                assert (copied.with_name(f"{stem}.manifest.json").read_bytes()
                        == source.with_name(f"{stem}.manifest.json").read_bytes())
    assert not (project / "results" / "downloads" / "datasets" / "dpr-alias").exists()
    copies = [project / t for t in _targets()] + [project / "results/bm25/scifact-bow/index"]
    audit = subprocess.run([sys.executable, "-m", "retrieval_pretraining.audit", *map(str, copies)],
                           capture_output=True, text=True, cwd=project,
                           env=dict(os.environ, PYTHONPATH=str(ROOT / "workflow")))
    assert audit.returncode == 0, audit.stdout + audit.stderr  # each copy reads as its artifact
    index = project / "results" / "bm25" / "scifact-bow" / "index"
    source = project / "results" / "bm25" / "scifact" / "index"
    files = sorted(p.relative_to(index) for p in index.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(source) for p in source.rglob("*")
                                     if p.is_file())
    assert all((index / f).read_bytes() == (source / f).read_bytes() for f in files)
    assert planned_rules(project, *_targets(), "results/bm25/scifact-bow/index") == {}


def test_a_model_pre_trained_on_the_source_is_in_domain_on_its_alias(tmp_path):
    """The tables place an in-domain published number by `pretrained_on`: the alias's columns
    are the source's collection (small.yaml pre-trains on a SciFact mixture)."""
    project = copy_project(tmp_path / "project")
    config = merged_configs(project / "config.yaml",
                            ROOT / "workflow" / "experiments" / "small.yaml")
    config["datasets"].append({"name": "scifact-bow", "same_as": "scifact"})
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = planned_params(project, "results/tables.md")
    tables = next(job for (rule, _), job in jobs.items() if rule == "make_tables")
    models = json.loads(eval(tables["named"]["tables"]))["models"]
    mlm = next(m for m in models if m["name"] == "mlm")
    assert mlm["pretrained_on"] == ["scifact", "scifact-bow"], mlm


def test_an_aliases_own_jobs_read_its_sources_downloads(tmp_path):
    """An alias's BM25 negatives from a triples file, and a pre-training corpus of the alias's
    texts, read the files fetched under the source's name: none is fetched a second time."""
    project = copy_project(tmp_path / "project")
    _add_aliases(project)
    triples = tmp_path / "t.tsv"
    triples.write_text("1\t2\t3\n")

    def edit(config):
        scifact = next(d for d in config["datasets"] if d["name"] == "scifact")
        scifact["downloads"] = [{"file": "t.tsv.gz", "url": triples.as_uri()}]
        negatives = dict(config["bm25"]["negatives"][0], dataset="scifact-bow", source="triples",
                         triples={"download": "t.tsv.gz"})
        config["bm25"]["negatives"].append(negatives)
        config["corpus"]["corpora"].append(
            {"name": "dpr-texts", "source": "dataset", "dataset": "dpr-alias"})
    edit_config(project, edit)
    jobs = planned_params(project, "results/bm25/scifact-bow/negatives.parquet",
                          "results/corpus/dpr-texts/chunks/shard-0000.parquet")
    fetched = sorted(out for rule, out in jobs if rule == "download_dataset_file")
    assert fetched == [f"results/downloads/datasets/{DPR}/psgs_w100.tsv",  # the chunks' texts
                       "results/downloads/datasets/scifact/t.tsv.gz"], fetched
    chunk = next(job for (rule, _), job in jobs.items() if rule == "chunk_articles")
    assert f"--downloads results/downloads/datasets/{DPR}" in chunk["named"]["texts"], chunk


@pytest.mark.parametrize("title, expected", [
    (None, ["alias_bm25_index/scifact-bow.log", "build_bm25_index/scifact.log"]),  # a copy
    ("none", ["build_bm25_index/scifact-bow.log"]),  # another indexed text: its own build
])
def test_an_aliass_bm25_row_names_the_jobs_that_made_its_index(tmp_path, title, expected):
    """The provenance of an alias's BM25 row named build_bm25_index/<alias>.log, a log no job
    writes when the index is the source's, copied: it names the copy's log, then the source's
    build, as the rules planned them (make_tables' params)."""
    from retrieval_pretraining.tables.__main__ import check_config
    from retrieval_pretraining.tables.layout import Group, Row
    from retrieval_pretraining.tables.provenance import log_location

    project = copy_project(tmp_path / "project")

    def edit(config):
        config.update(_evaluated_alias(config))
        if title:
            config["bm25"].setdefault("overrides", []).append(
                {"dataset": "scifact-bow", "title": title})
    edit_config(project, edit)
    jobs = planned_params(project, "results/tables.md")
    tables = next(job for (rule, _), job in jobs.items() if rule == "make_tables")
    params = json.loads(eval(tables["named"]["tables"]))
    check_config(params)  # the tables stage accepts the slice the rule hands it
    bm25 = Row("BM25", "bm25", objective="bm25")
    results = project / "results"
    logs = log_location(results, bm25, "scifact-bow", Group("Sparse", [bm25]), "test", params)
    assert logs.split(", ") == [f"`{results / 'logs' / p}`" for p in expected] + [
        f"`{results / 'logs' / p / 'scifact-bow' / 'test.log'}`"
        for p in ("bm25_search", "publish_bm25_run")], logs
    source = log_location(results, bm25, "scifact", Group("Sparse", [bm25]), None, params)
    assert source == f"`{results / 'logs' / 'build_bm25_index' / 'scifact.log'}`", source
