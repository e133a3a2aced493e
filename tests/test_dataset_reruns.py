"""Incremental reruns of the dataset stages, asserted through Snakemake's own dry-run plan.

The corpus is the root of everything after it (BM25 index, corpus encodings, fine-tuning): an edit
of a dataset entry that does not change what the corpus job reads (a new split, a larger
allowance, a pinned checksum) must not rebuild it, nor download its files again.
"""

import json
from pathlib import Path

import pytest

from workflow_harness import copy_project, edit_config, planned_rules, snakemake

BEIR = "scifact-full"
BEIR_TEST = f"results/datasets/{BEIR}/queries-test.parquet"
DPR = "dpr-sample"
DPR_TEST = f"results/datasets/{DPR}/queries-test.parquet"
DPR_FILES = ("psgs_w100.tsv", "nq-test.qa.csv")


def _dpr_entry(project: Path) -> dict:
    """A dpr dataset whose files are downloads (file:// URLs into the project's sample)."""
    folder = project / "data" / "dpr-sample"
    return {
        "name": DPR,
        "format": "dpr",
        "corpus": {"download": "psgs_w100.tsv"},
        "splits": [{"name": "test", "questions": {"download": "nq-test.qa.csv"}}],
        "title": "space",
        "exclude_query_id": False,
        "downloads": [{"file": f, "url": (folder / f).as_uri()} for f in DPR_FILES],
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A project copy whose dataset jobs (downloads, corpus, one split) have run once."""
    project = copy_project(tmp_path_factory.mktemp("dataset-reruns") / "project")
    edit_config(project, lambda c: c["datasets"].append(_dpr_entry(project)))
    snakemake(project, BEIR_TEST, DPR_TEST)
    return project


def _dataset(config: dict, name: str) -> dict:
    return next(entry for entry in config["datasets"] if entry["name"] == name)


def _edited(project: Path, name: str, edit) -> str:
    """Apply `edit` to the datasets entry `name`; the original config text, to restore."""
    return edit_config(project, lambda c: edit(_dataset(c, name)))


def test_a_finished_dataset_has_nothing_to_do(finished):
    assert planned_rules(finished, BEIR_TEST, DPR_TEST) == {}


def test_adding_a_split_runs_only_the_new_split(finished):
    original = _edited(finished, BEIR, lambda e: e["splits"].append({"name": "train"}))
    try:
        assert planned_rules(finished, BEIR_TEST) == {}
        train = f"results/datasets/{BEIR}/queries-train.parquet"
        plan = planned_rules(finished, train)
        assert plan == {"prepare_dataset_split": 1}, plan
    finally:
        (finished / "config.yaml").write_text(original)


def test_raising_the_missing_documents_allowance_reruns_only_the_split(finished):
    """The split checks the allowance (and records it in its manifests); the corpus does not."""
    original = _edited(finished, BEIR, lambda e: e.update(max_missing_judged_documents=3))
    try:
        plan = planned_rules(finished, BEIR_TEST)
        assert plan == {"prepare_dataset_split": 1}, plan
        assert planned_rules(finished, f"results/datasets/{BEIR}/corpus.parquet") == {}
    finally:
        (finished / "config.yaml").write_text(original)


def _pin(entry: dict, key: str, value) -> None:
    for download in entry["downloads"]:
        download[key] = value(download["file"])


def _manifest_stat(project: Path, file: str, key: str):
    path = project / "results" / "downloads" / "datasets" / DPR / f"{file}.manifest.json"
    return json.loads(path.read_text())["stats"][key]


@pytest.mark.parametrize("key", ["sha256", "md5", "size"])
def test_pinning_a_downloads_checksum_downloads_nothing_again(finished, key):
    stat = "bytes" if key == "size" else key
    original = _edited(finished, DPR, lambda e: _pin(
        e, key, lambda f: _manifest_stat(finished, f, stat)))
    try:
        assert planned_rules(finished, DPR_TEST) == {}
    finally:
        (finished / "config.yaml").write_text(original)


@pytest.mark.parametrize("key,wrong", [("sha256", "0" * 64), ("md5", "0" * 32)])
def test_a_pinned_checksum_the_download_does_not_match_is_refused(finished, key, wrong):
    """The existing file is checked against the newly pinned value (its manifest's record; md5,
    what MS MARCO publishes, is recorded even when nothing was verified). Once the file is deleted
    as the error says, the stale manifest no longer refuses (the DAG builds; the file would be
    fetched again where it is needed)."""
    original = _edited(finished, DPR, lambda e: e["downloads"][0].update({key: wrong}))
    download = finished / "results" / "downloads" / "datasets" / DPR / "psgs_w100.tsv"
    aside = download.with_name("aside")  # moved back unchanged: later tests see no edit
    try:
        result = snakemake(finished, "--dry-run", DPR_TEST, check=False)
        assert result.returncode != 0
        out = result.stdout + result.stderr
        assert "psgs_w100.tsv" in out and key in out and wrong in out, out
        download.rename(aside)
        planned_rules(finished, DPR_TEST)  # (fails if the DAG build refuses)
        fetch_again = str(download.relative_to(finished))
        assert planned_rules(finished, fetch_again) == {"download_dataset_file": 1}
    finally:
        (finished / "config.yaml").write_text(original)
        if aside.exists():
            aside.replace(download)


def test_a_pin_the_fetched_triples_file_contradicts_is_refused(tmp_path):
    """The negatives' triples file is a download like the corpus and the splits: a checksum pinned
    after it was fetched (or changed since) is compared with its manifest when the DAG is built,
    as every other dataset file's is, instead of the old file being sampled from unchecked (the
    download job does not rerun for a pin: checks travel as resources)."""
    from retrieval_pretraining import download

    project = copy_project(tmp_path / "project")
    source = tmp_path / "t.tsv"
    source.write_text("1\t2\t3\n")
    fetched = project / "results" / "downloads" / "datasets" / "scifact" / "t.tsv.gz"
    download.main(["fetch", "--url", str(source), "--out", str(fetched)])
    negatives = "results/bm25/scifact/negatives.parquet"

    def triples(md5):
        def edit(config):
            config["bm25"]["negatives"][0].update(source="triples",
                                                  triples={"download": "t.tsv.gz"})
            scifact = next(d for d in config["datasets"] if d["name"] == "scifact")
            scifact["downloads"] = [{"file": "t.tsv.gz", "url": source.as_uri(), "md5": md5}]
        return edit

    edit_config(project, triples(_manifest_md5(fetched)))
    planned_rules(project, negatives)  # the pin the file has: the DAG builds
    wrong = "0" * 32
    edit_config(project, triples(wrong))
    result = snakemake(project, "--dry-run", negatives, check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "t.tsv.gz" in out and wrong in out and "delete the file" in out, out


def _manifest_md5(path: Path) -> str:
    from retrieval_pretraining import download

    return json.loads(download.manifest_for(path).read_text())["stats"]["md5"]
