"""Dataset aliases (`datasets: [{name: A, same_as: S}]`): S's data under a second name.

One collection fine-tuned and evaluated under two recipes (bow.yaml's BoW recipe beside
paper.yaml's COSTA recipe on msmarco-passage) without downloading and preparing it twice: the
alias's prepared files are copies of its source's, and what compares dataset names to ask "the
same collection?" (in-domain numbers, zero-shot targets, benchmarks) sees through it.
"""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import config_checks
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
        config_checks.validate(config)
    return str(error.value)


def test_an_alias_is_its_sources_entry_under_its_own_name(demo):
    config = _with(demo, {"name": "scifact-bow", "same_as": "scifact"},
                   {"name": "scifact-again", "same_as": "scifact-bow"})
    config_checks.validate(config)
    resolved = {e["name"]: e for e in dataset_aliases.resolve(config["datasets"])}
    source = next(e for e in demo["datasets"] if e["name"] == "scifact")
    # An alias of an alias is resolved to the first entry of the chain.
    for alias in ("scifact-bow", "scifact-again"):
        assert resolved[alias] == dict(source, name=alias)
    assert dataset_aliases.sources(config["datasets"]) == {
        "scifact-bow": "scifact", "scifact-again": "scifact"}
    assert resolved["scifact"] == source  # the source itself untouched


def test_an_alias_may_set_its_own_title_mode_and_nothing_else(demo):
    """bow.yaml's msmarco-passage-bow joins title + " " + text (the BoW authors' collators)
    where its source joins title [SEP] text: the alias's `title` replaces its source's, an alias
    of it inherits it, and the files it copies say where it differs (own_settings)."""
    config = _with(demo, {"name": "scifact-sep", "same_as": "scifact", "title": "sep"},
                   {"name": "scifact-sep-again", "same_as": "scifact-sep"},
                   {"name": "scifact-space", "same_as": "scifact", "title": "space"})
    config_checks.validate(config)
    resolved = {e["name"]: e for e in dataset_aliases.resolve(config["datasets"])}
    source = resolved["scifact"]
    assert source["title"] == "space"
    assert resolved["scifact-sep"] == dict(source, name="scifact-sep", title="sep")
    assert resolved["scifact-sep-again"] == dict(source, name="scifact-sep-again", title="sep")
    assert resolved["scifact-space"] == dict(source, name="scifact-space")
    # Its files are still scifact's (the chain's first entry); its title is its own where it
    # differs from scifact's (scifact-space's does not: a plain copy).
    assert dataset_aliases.sources(config["datasets"])["scifact-sep-again"] == "scifact"
    assert dataset_aliases.own_settings(config["datasets"]) == {
        "scifact-sep": {"title": "sep"}, "scifact-sep-again": {"title": "sep"}}


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
    # Only the title mode is the alias's own: the query-id rule, the format and the files are
    # the collection's under any name.
    ({"name": "x", "same_as": "scifact", "exclude_query_id": False},
     ["datasets.2", "'exclude_query_id'", "name, same_as, title"]),
    ({"name": "x", "same_as": "scifact", "format": "beir"},
     ["datasets.2", "'format'", "name, same_as, title"]),
    ({"name": "x", "same_as": "scifact", "title": "[SEP]"}, ["datasets.2.title", "'[SEP]'"]),
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
    config_checks.validate(config)




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


def _retitled(project: Path, title: str | None) -> None:
    """The demo (bert alone) with scifact-bow, an alias of scifact (title: `title` where given),
    fine-tuned with its own BM25 negatives and scored on its test split."""
    def edit(config):
        config["finetune"]["models"] = ["bert"]
        config["datasets"].append({"name": "scifact-bow", "same_as": "scifact"}
                                  | ({"title": title} if title else {}))
        config["finetune"]["datasets"].append({"dataset": "scifact-bow", "split": "train"})
        config["bm25"]["negatives"].append(
            dict(config["bm25"]["negatives"][0], dataset="scifact-bow"))
        config["evaluate"]["splits"].append(
            {"dataset": "scifact-bow", "split": "test", "measures": ["nDCG@10"],
             "relevance_level": 1})
    edit_config(project, edit)


# The jobs that join a passage's title and text with the dataset's title mode.
ENCODING_RULES = ("finetune_stage1", "finetune_stage2", "mine_hard_negatives",
                  "encode_corpus_shard", "dense_search")
TITLE = re.compile(r'"title": ?"(\w+)"')


def test_an_aliass_own_title_reaches_its_encoders_and_leaves_bm25_as_it_was(tmp_path):
    """scifact-bow with title sep beside scifact's space: its fine-tuning, mining, encoding and
    search jobs join title [SEP] text, every BM25 job (index copy, search, negatives) and every
    other job is planned as for the alias without it, and its dataset.json is written with its
    title where the alias without one copies scifact's."""
    plans = {}
    for title in (None, "sep"):
        project = copy_project(tmp_path / str(title))
        _retitled(project, title)
        plans[title] = planned_params(project, "results/runs/scifact-bow/bert-stage2/test.trec",
                                      "results/runs/scifact-bow/bm25/test.trec",
                                      "results/datasets/scifact-bow/dataset.json")
    before, after = plans[None], plans["sep"]
    info = "results/datasets/scifact-bow/dataset.json"
    assert ("alias_dataset_file", info) in before and ("alias_dataset_info", info) in after
    assert set(before) - {("alias_dataset_file", info)} == set(after) - {
        ("alias_dataset_info", info)}
    assert json.loads(eval(after["alias_dataset_info", info]["named"]["info"])) == {
        "title": "sep"}
    encoders, bm25 = set(), set()
    for key, job in after.items():
        rule, outputs = key
        if key not in before:
            continue
        if rule in ENCODING_RULES and "/scifact-bow/" in outputs:
            encoders.add(rule)
            titles = {t for v in job["named"].values() for t in TITLE.findall(v)}
            assert titles == {"sep"}, (key, titles)
            assert {t for v in before[key]["named"].values() for t in TITLE.findall(v)} == {
                "space"}, key
            swapped = [p.replace('"title":"sep"', '"title":"space"') for p in job["params"]]
            assert swapped == before[key]["params"], key  # the title mode, nothing else
        else:
            assert (job["params"], job["input"]) == (before[key]["params"],
                                                     before[key]["input"]), key
            bm25 |= {rule} if "bm25" in rule and "/scifact-bow/" in outputs else set()
    assert encoders == set(ENCODING_RULES), encoders
    assert bm25 == {"alias_bm25_index", "bm25_search", "bm25_negatives", "publish_bm25_run"}, bm25


def test_an_aliass_dataset_json_records_its_own_title_beside_its_copied_corpus(tmp_path):
    """The corpus stores title and text apart (each encoder joins them), so the alias's corpus
    stays a byte copy under another title mode; dataset.json, which records the mode, is its
    source's with the alias's title, and reads as a dataset.json to the audit."""
    project = copy_project(tmp_path / "project")
    _retitled(project, "sep")
    folder = project / "results" / "datasets"
    targets = [f"results/datasets/scifact-bow/{n}" for n in ("corpus.parquet", "dataset.json")]
    snakemake(project, *targets)
    corpus = (folder / "scifact-bow" / "corpus.parquet").read_bytes()
    assert corpus == (folder / "scifact" / "corpus.parquet").read_bytes()
    source = json.loads((folder / "scifact" / "dataset.json").read_text())
    assert source["title"] == "space"
    assert json.loads((folder / "scifact-bow" / "dataset.json").read_text()) == dict(
        source, title="sep")
    audit = subprocess.run([sys.executable, "-m", "retrieval_pretraining.audit",
                            *(str(project / t) for t in targets)],
                           capture_output=True, text=True, cwd=project,
                           env=dict(os.environ, PYTHONPATH=str(ROOT / "workflow")))
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "title mode 'sep'" in audit.stdout, audit.stdout
