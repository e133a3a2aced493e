"""Shared corpora (`datasets: [{..., corpus: {same_as: S}}]`): a dataset with splits of its own
and S's corpus (DPR's NQ and TriviaQA both read the 21M passages of psgs_w100).

Nothing of the corpus is downloaded or parsed for the sharing entry: its corpus.parquet is a copy
of S's (manifest and all), its BM25 index a copy where its bm25 settings index the same text, and
its entry reads as S's corpus files to everything else, so what it builds is what it built when
it downloaded and parsed the same file itself.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from retrieval_pretraining import artifacts, dataset_aliases, datasets
from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import config_checks
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

OWN, SHARED = "dpr-own", "dpr-shared"  # the same splits: one parses the corpus, one shares it


def _sharing(entry: dict, name: str = SHARED, source: str = DPR) -> dict:
    """`entry` (a full dpr entry) under `name`, its corpus `source`'s, its downloads its own."""
    shared = dict(entry, name=name, corpus={"same_as": source})
    shared["downloads"] = [d for d in entry["downloads"] if d["file"] != "psgs_w100.tsv"]
    return shared


def _add_datasets(project: Path, own: bool = False) -> None:
    """The DPR sample, the entry that shares its corpus and (own) one that parses it again."""
    def edit(config):
        source = _dpr_entry(project)
        config["datasets"] += [source, _sharing(source)] + ([dict(source, name=OWN)] if own else [])
    edit_config(project, edit)


@pytest.fixture(scope="module")
def demo():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def _refusal(config: dict) -> str:
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(config)
    return str(error.value)


def _with_sharing(demo: dict, **changes) -> dict:
    config = copy.deepcopy(demo)
    source = _dpr_entry(ROOT)
    config["datasets"] += [source, dict(_sharing(source), **changes)]
    return config


def test_a_shared_corpus_reads_as_its_sources_corpus_files(demo):
    """The rules read the entry with its source's corpus references (what it named before);
    a chain, or a source that is an alias, is the first entry's corpus."""
    config = _with_sharing(demo)
    config["datasets"] += [{"name": "dpr-alias", "same_as": DPR},
                           _sharing(_dpr_entry(ROOT), "dpr-chain", SHARED),
                           _sharing(_dpr_entry(ROOT), "dpr-of-alias", "dpr-alias")]
    config_checks.validate(config)
    datasets = config["datasets"]
    resolved = {e["name"]: e for e in dataset_aliases.resolve(datasets)}
    for name in (SHARED, "dpr-chain", "dpr-of-alias"):
        assert resolved[name]["corpus"] == {"download": "psgs_w100.tsv"}, name
        assert resolved[name]["splits"] == resolved[DPR]["splits"], name
    sources = dataset_aliases.corpus_sources(datasets)
    assert sources == {SHARED: DPR, "dpr-chain": SHARED, "dpr-of-alias": "dpr-alias"}
    aliases = dataset_aliases.sources(datasets)
    for name in (SHARED, "dpr-chain", "dpr-of-alias", "dpr-alias", DPR):
        assert dataset_aliases.corpus_collection(name, aliases, sources) == DPR, name
    assert dataset_aliases.resolve(demo["datasets"]) == demo["datasets"]  # nothing shared


@pytest.mark.parametrize("changes, words", [
    ({"corpus": {"same_as": "wikipedia"}},  # not a datasets entry
     ["datasets.3.corpus.same_as", "'wikipedia' is not a datasets entry", "known before it"]),
    ({"corpus": {"same_as": SHARED}}, ["datasets.3.corpus.same_as", "this entry itself"]),
    ({"corpus": {"same_as": "scifact"}},  # a BEIR folder, parsed otherwise
     ["datasets.3.corpus.same_as", "format dpr", "format beir", "alias"]),
    ({"titles": None}, ["datasets.3.titles", "belong to the corpus", f"'{DPR}'", "remove"]),
    # The corpus is the source's copy, never sampled: a subset here was dropped without a word.
    ({"subset": {"documents": 10, "seed": 0}},
     ["datasets.3.subset", "copy of", f"'{DPR}'", "remove"]),
    # A misspelt key inside `corpus` failed each shape (a file, another entry's) its own way:
    # five lines of the schema's, none naming every key allowed.
    ({"corpus": {"same_ass": DPR}},
     ["datasets.3.corpus", f"(dataset '{SHARED}')", "unknown key 'same_ass'",
      "known keys: download, member, path, same_as"]),
    ({"corpus": {"same_as": DPR, "membr": "x"}},
     ["datasets.3.corpus", f"(dataset '{SHARED}')", "unknown key 'membr'", "same_as"]),
])
def test_a_bad_shared_corpus_is_refused_in_one_message(demo, changes, words):
    message = _refusal(_with_sharing(demo, **changes))
    assert len(message.splitlines()) == 2, message  # "invalid config:" and one line
    assert all(w in message for w in words), message


def test_a_shared_corpus_of_another_format_is_refused(demo):
    """msmarco's TSV and DPR's CSV-quoted file are parsed differently: not one corpus."""
    config = copy.deepcopy(demo)
    source = _dpr_entry(ROOT)
    msmarco = dict(source, name="marco", format="msmarco", corpus={"same_as": DPR},
                   splits=[{"name": "dev", "queries": {"path": "q.tsv"},
                            "qrels": {"path": "r.tsv"}}])
    config["datasets"] += [source, msmarco]
    message = _refusal(config)
    assert len(message.splitlines()) == 2, message
    assert "datasets.3.corpus.same_as" in message and "format msmarco" in message, message
    assert "how a corpus is parsed" in message, message


def test_a_shared_corpus_of_a_later_entry_is_refused(demo):
    config = copy.deepcopy(demo)
    source = _dpr_entry(ROOT)
    config["datasets"] += [_sharing(source), source]
    message = _refusal(config)
    assert "datasets.2.corpus.same_as" in message and "move this entry after it" in message


def test_a_dry_run_parses_and_indexes_the_corpus_once(tmp_path):
    """The sharing entry downloads its own questions only; its corpus and index are copies."""
    project = copy_project(tmp_path / "project")
    _add_datasets(project)
    plan = planned_rules(project, f"results/bm25/{SHARED}/runs/test.trec",
                         f"results/datasets/{SHARED}/answers-test.parquet",
                         f"results/bm25/{DPR}/index")
    assert plan == {
        "download_dataset_file": 2,  # psgs_w100 under the source, its own questions
        "prepare_dataset": 1,  # the source's corpus
        "share_dataset_corpus": 1,
        "prepare_dataset_split": 1,  # the sharing entry's own split, answers
        "prepare_dataset_answers": 1,
        "build_bm25_index": 1,
        "alias_bm25_index": 1,  # the source's index, copied
        "bm25_search": 1,
    }, plan


def test_a_shared_corpus_with_another_indexed_text_builds_its_own_index(tmp_path):
    project = copy_project(tmp_path / "project")
    _add_datasets(project)
    edit_config(project, lambda c: c["bm25"].setdefault("overrides", []).append(
        {"dataset": SHARED, "title": "none"}))
    plan = planned_rules(project, f"results/bm25/{SHARED}/index")
    assert plan == {"download_dataset_file": 1, "prepare_dataset": 1,
                    "share_dataset_corpus": 1, "build_bm25_index": 1}, plan


def test_a_pre_training_corpus_of_a_shared_corpus_reads_the_sources_download(tmp_path):
    """The chunk job reads the raw passages: the file fetched under the source's name."""
    project = copy_project(tmp_path / "project")
    _add_datasets(project)
    edit_config(project, lambda c: c["corpus"]["corpora"].append(
        {"name": "dpr-texts", "source": "dataset", "dataset": SHARED}))
    jobs = planned_params(project, "results/corpus/dpr-texts/chunks/shard-0000.parquet")
    fetched = sorted(out for rule, out in jobs if rule == "download_dataset_file")
    assert fetched == [f"results/downloads/datasets/{DPR}/psgs_w100.tsv"], fetched
    chunk = next(job for (rule, _), job in jobs.items() if rule == "chunk_articles")
    assert f"--downloads results/downloads/datasets/{DPR}" in chunk["named"]["texts"], chunk


def test_a_shared_corpus_is_the_corpus_its_own_parse_gave(tmp_path):
    """Beside an entry that parses the same file itself (what the sharing one did before): the
    same corpus (byte for byte the source's), dataset.json and BM25 run; nothing fetched."""
    project = copy_project(tmp_path / "project")
    _add_datasets(project, own=True)
    files = ("corpus.parquet", "dataset.json", "queries-test.parquet", "answers-test.parquet")
    targets = [f"results/{folder}/{name}/{file}" for name in (OWN, SHARED)
               for folder, file in [("datasets", f) for f in files]
               + [("bm25", "runs/test.trec")]]
    snakemake(project, *targets)
    results = project / "results"
    shared, own, source = (results / "datasets" / n for n in (SHARED, OWN, DPR))
    for name in ("corpus.parquet", "corpus.manifest.json"):
        assert (shared / name).read_bytes() == (source / name).read_bytes(), name
    assert (shared / "corpus.parquet").read_bytes() == (own / "corpus.parquet").read_bytes()
    info = json.loads((own / "dataset.json").read_text()) | {"name": SHARED}
    assert json.loads((shared / "dataset.json").read_text()) == info
    for file in ("queries-test.parquet", "answers-test.parquet"):
        assert (shared / file).read_bytes() == (own / file).read_bytes(), file
    run = (results / "bm25" / SHARED / "runs" / "test.trec").read_text()
    assert run and run == (results / "bm25" / OWN / "runs" / "test.trec").read_text()
    assert not (results / "downloads" / "datasets" / SHARED / "psgs_w100.tsv").exists()
    assert (results / "logs" / "alias_bm25_index" / f"{SHARED}.log").exists()  # a copy
    copies = [shared / f for f in ("corpus.parquet", "dataset.json")]
    copies.append(results / "bm25" / SHARED / "index")
    audit = subprocess.run([sys.executable, "-m", "retrieval_pretraining.audit", *map(str, copies)],
                           capture_output=True, text=True, cwd=project,
                           env=dict(os.environ, PYTHONPATH=str(ROOT / "workflow")))
    assert audit.returncode == 0, audit.stdout + audit.stderr  # each copy reads as its artifact
    # Each names the rule that wrote it, not the one that wrote the source's.
    assert "quirks; written by rule share_dataset_corpus" in audit.stdout, audit.stdout
    assert f"a copy of {DPR}'s index (alias_bm25_index)" in audit.stdout, audit.stdout
    assert planned_rules(project, *targets) == {}
    # The index is the source's files, hard-linked (one file system here), all but Snakemake's
    # timestamp of the folder, the copy's own: linked, the copy's touch would move the source's
    # time, and all that reads the source's index would rerun.
    index, source_index = (results / "bm25" / n / "index" for n in (SHARED, DPR))
    log = (results / "logs" / "alias_bm25_index" / f"{SHARED}.log").read_text()
    assert "hard-linked" in log, log
    files = sorted(p.name for p in index.iterdir() if p.name != ".snakemake_timestamp")
    assert files and files == sorted(
        p.name for p in source_index.iterdir() if p.name != ".snakemake_timestamp")
    for name in files:
        assert (index / name).stat().st_ino == (source_index / name).stat().st_ino, name
    stamps = [i / ".snakemake_timestamp" for i in (index, source_index)]
    assert stamps[0].stat().st_ino != stamps[1].stat().st_ino
    # The source's index rebuilt: the copy keeps its files until its own rerun relinks them.
    before = {name: (index / name).read_bytes() for name in files}
    snakemake(project, f"results/bm25/{DPR}/index", "--forcerun", "build_bm25_index")
    assert all((index / n).stat().st_ino != (source_index / n).stat().st_ino for n in files)
    assert {name: (index / name).read_bytes() for name in files} == before
    assert planned_rules(project, *targets).get("alias_bm25_index") == 1
    snakemake(project, *targets)
    assert all((index / n).stat().st_ino == (source_index / n).stat().st_ino for n in files
               if (source_index / n).exists())
    assert planned_rules(project, *targets) == {}


def test_a_shared_corpuss_bm25_row_names_the_source_s_index_build(tmp_path):
    """The tables' provenance of its BM25 row: the copy's log, then the source's build (the one
    decision, copied_bm25_indexes, that planned the copy)."""
    project = copy_project(tmp_path / "project")
    _add_datasets(project)
    edit_config(project, lambda c: c["evaluate"]["splits"].append(
        {"dataset": SHARED, "split": "test", "measures": ["Acc@5"]}))
    jobs = planned_params(project, "results/tables.md")
    tables = next(job for (rule, _), job in jobs.items() if rule == "make_tables")
    assert json.loads(eval(tables["named"]["tables"]))["bm25_index_copies"] == {SHARED: DPR}


def test_a_split_missing_from_a_shared_corpus_names_the_corpus_it_read(tmp_path):
    """The missing-documents refusal of the sharing entry's split named the corpus file under
    its own download folder, where it never is (nothing of the corpus is fetched for it): it
    names the copy the split was checked against, and whose corpus that is."""
    project = copy_project(tmp_path / "project")
    records = json.loads((project / "data" / DPR / "biencoder-nq-train.json").read_text())
    records[0]["positive_ctxs"][0]["passage_id"] = "999999"  # no passage of the sample
    train = tmp_path / "train.json"
    train.write_text(json.dumps(records))

    def edit(config):
        source = _dpr_entry(project)
        shared = _sharing(source)
        shared["splits"] = [{"name": "train", "biencoder": {"download": "train.json"}}]
        shared["downloads"] = [{"file": "train.json", "url": train.as_uri()}]
        config["datasets"] += [source, shared]
    edit_config(project, edit)
    result = snakemake(project, f"results/datasets/{SHARED}/queries-train.parquet", check=False)
    assert result.returncode != 0
    log = project / "results" / "logs" / "prepare_dataset_split" / SHARED / "train.log"
    said = " ".join(log.read_text().split())
    assert "'999999'" in said, said
    assert f"downloads/datasets/{SHARED}/psgs_w100" not in said, said
    assert f"results/datasets/{SHARED}/corpus.parquet" in said, said
    assert f"corpus.parquet, copied from '{DPR}' by corpus.same_as (it holds 2;" in said, said
    assert ") (" not in said, said  # one bracket after another read as a stutter


def test_a_copied_corpus_is_named_in_a_refusal_with_one_parenthetical(tmp_path):
    """The missing-documents refusal of a shared corpus's split: the copy and whose it is, then
    the counts in brackets, not two bracketed remarks in a row."""
    out = tmp_path / SHARED
    out.mkdir()
    artifacts.write_manifest(artifacts.manifest_path(out / "corpus.parquet"),
                             stage="datasets.corpus", params={"name": DPR})
    corpus = datasets.checked_corpus({"name": SHARED}, out, None, None)
    stats = {"judged_documents": 2, "judged_documents_missing": 1,
             "judged_documents_missing_examples": ["d9"]}
    message = datasets.missing_documents_message(
        {"name": SHARED}, "test", stats, 0, tmp_path / "qrels.tsv", corpus)
    assert f"missing from the corpus {out / 'corpus.parquet'}, copied from '{DPR}' by " \
        "corpus.same_as (it holds 1; missing e.g. 'd9')" in message, message
    assert ") (" not in message, message


def test_a_model_pre_trained_on_a_shared_corpus_is_in_domain_on_every_dataset_over_it(tmp_path):
    """In-domain is about the passages pre-training read, which two datasets over one corpus
    share: a model pre-trained on the source's corpus is in-domain on the sharing entry's columns
    (and the other way round), as it is on an alias's; its questions play no part in it."""
    project = copy_project(tmp_path / "project")
    config = merged_configs(project / "config.yaml",
                            ROOT / "workflow" / "experiments" / "small.yaml")
    source = _dpr_entry(project)
    config["datasets"] += [source, _sharing(source)]
    config["corpus"]["corpora"] += [{"name": "dpr-texts", "source": "dataset", "dataset": DPR},
                                    {"name": "shared-texts", "source": "dataset",
                                     "dataset": SHARED}]
    models = {m["name"]: m for m in config["pretrain"]["models"]}
    models["mlm"]["corpus"], models["costa"]["corpus"] = "dpr-texts", "shared-texts"
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    jobs = planned_params(project, "results/tables.md")
    tables = next(job for (rule, _), job in jobs.items() if rule == "make_tables")
    planned = {m["name"]: m for m in json.loads(eval(tables["named"]["tables"]))["models"]}
    assert planned["mlm"]["pretrained_on"] == [DPR, SHARED], planned["mlm"]
    assert planned["costa"]["pretrained_on"] == [DPR, SHARED], planned["costa"]
    assert planned["bow"]["pretrained_on"] == ["scifact"], planned["bow"]  # unchanged


@pytest.mark.parametrize("text", ["[1, 2]", '"dataset"', "null"])
def test_a_source_dataset_json_that_is_not_an_object_is_one_error_line(tmp_path, capsys, text):
    """The source's dataset.json valid JSON but no object: one line naming it, exit 1, nothing
    written (`list | dict` was a TypeError's traceback naming no file)."""
    from retrieval_pretraining import shared_corpus

    source, out = tmp_path / "dataset.json", tmp_path / "out" / "dataset.json"
    source.write_text(text)
    with pytest.raises(SystemExit) as stop:
        shared_corpus.main(["--config", json.dumps({"title": "space"}), "--source", str(source),
                            "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {source}: not a JSON object"), err
    assert not out.exists()


def test_a_shared_corpus_takes_its_source_s_titles_file_too():
    """An MS MARCO collection is read with its titles file: an entry sharing it reads both, as its
    source does (a pre-training corpus over the sharing entry, chunked from its resolved entry,
    would otherwise chunk the passages without their titles)."""
    source = {"name": "marco", "format": "msmarco", "corpus": {"download": "collection.tsv"},
              "titles": {"download": "para.title.txt"}, "splits": [], "title": "space",
              "exclude_query_id": False}
    shared = {k: v for k, v in source.items() if k != "titles"} | {
        "name": "marco-2", "corpus": {"same_as": "marco"}}
    assert dataset_aliases.corpus_problems([source, shared]) == []
    resolved = {entry["name"]: entry for entry in dataset_aliases.resolve([source, shared])}
    assert resolved["marco-2"]["corpus"] == source["corpus"]
    assert resolved["marco-2"]["titles"] == source["titles"]
