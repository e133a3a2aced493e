"""Canonical datasets: BEIR and MS MARCO layouts, quirk counts, title joining, schema of the output."""

import copy
import gzip
import io
import json
import re
import tarfile
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml

from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import config_checks
from retrieval_pretraining import audit, dataset_files, datasets
from retrieval_pretraining.contracts import datasets as contract
from retrieval_pretraining.contracts.datasets import DatasetError

from shipped_data import ROOT, SCIFACT_DATASET

SCIFACT = SCIFACT_DATASET


def test_join_title_modes():
    assert contract.join_title("Cats", "They purr.", "none") == "They purr."
    assert contract.join_title("Cats", "They purr.", "space") == "Cats They purr."
    assert contract.join_title("Cats", "They purr.", "sep") == "Cats [SEP] They purr."
    assert contract.join_title("", "They purr.", "sep") == "They purr."  # no dangling separator
    assert contract.join_title(None, None, "space") == ""
    with pytest.raises(ValueError, match="none, sep, space"):
        contract.join_title("a", "b", "colon")


@pytest.mark.parametrize("mode", contract.TITLE_MODES)
def test_polars_join_agrees_with_join_title(mode):
    frame = pl.DataFrame({"title": ["Cats", "", None], "text": ["They purr.", "Untitled.", "x"]})
    joined = frame.select(datasets.joined_text_expr(mode))["text"].to_list()
    assert joined == [contract.join_title(t, x, mode) for t, x in frame.iter_rows()]


def test_scifact_matches_beir_published_sizes(tmp_path):
    info = datasets.prepare(SCIFACT, tmp_path)
    # BEIR's table: SciFact 5,183 documents; 809 train and 300 test queries (919 / 339 judgements).
    assert info["corpus"]["documents"] == 5183
    assert {s: v["queries"] for s, v in info["split_stats"].items()} == {"train": 809, "test": 300}
    assert {s: v["qrels"] for s, v in info["split_stats"].items()} == {"train": 919, "test": 339}
    assert pq.read_schema(tmp_path / "corpus.parquet").names == ["doc_id", "title", "text"]
    assert str(pq.read_schema(tmp_path / "qrels-test.parquet").field("relevance").type) == "int32"
    manifest = json.loads((tmp_path / "qrels-test.manifest.json").read_text())
    assert manifest["stats"]["qrels_missing_document"] == 0
    assert json.loads((tmp_path / "dataset.json").read_text())["exclude_query_id"] is True


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def quirky_beir(tmp_path):
    folder = tmp_path / "quirky"
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(
        folder / "corpus.jsonl",
        [
            {"_id": "d1", "title": "One", "text": "first document"},
            {"_id": "d2", "title": "", "text": "no title here"},
            {"_id": "d3", "title": "Three", "text": "  "},  # empty text
            {"_id": "q2", "title": "", "text": ""},  # same id as a query, empty both
            {"_id": 5, "title": "Five", "text": "an integer id"},  # ids are read as strings
        ],
    )
    write_jsonl(
        folder / "queries.jsonl",
        [
            {"_id": "q1", "text": "first"},
            {"_id": "q2", "text": "second"},
            {"_id": "q3", "text": ""},
            {"_id": "q4", "text": "never judged"},
        ],
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        "q1\td1\t1\nq1\tgone\t1\n"  # a document missing from the corpus
        "q2\td2\t2\nq2\t5\t0\n"
        "q3\td3\t1\n"
        "q9\td1\t1\n"  # a query missing from queries.jsonl
    )
    return folder


def quirky_entry(folder):
    # The one judged document absent from the corpus ("gone") and query absent from queries.jsonl
    # ("q9") are allowed.
    return dict(SCIFACT, name="quirky", path=str(folder), splits=[{"name": "test"}],
                max_missing_judged_documents=1, max_unknown_judged_queries=1)


def test_outputs_follow_the_datasets_contract(quirky_beir, tmp_path):
    """The writer's output is its contract's, quirks and all: the contract's schemas, and every
    audit check passes (dataset.json included)."""
    entry = quirky_entry(quirky_beir)
    out = tmp_path / "results" / "datasets" / "quirky"
    datasets.prepare(entry, out, data_root=str(tmp_path))
    for name, schema, kind in (
        ("corpus.parquet", contract.CORPUS_SCHEMA, "corpus"),
        ("queries-test.parquet", contract.QUERIES_SCHEMA, "queries"),
        ("qrels-test.parquet", contract.QRELS_SCHEMA, "qrels"),
    ):
        assert pq.read_schema(out / name) == schema, name
        result = audit.audit(out / name)
        assert result.kind == kind and result.passed, result.render()
    result = audit.audit(out / "dataset.json")
    assert result.kind == "dataset info (dataset.json)" and result.passed, result.render()


def test_beir_quirks_are_counted_not_dropped(quirky_beir, tmp_path):
    entry = quirky_entry(quirky_beir)
    out = tmp_path / "out"
    info = datasets.prepare(entry, out, data_root=str(tmp_path))
    assert info["corpus"] == {
        "documents": 5,
        "empty_text": 2,
        "empty_title": 2,
        "empty_title_and_text": 1,
    }
    stats = info["split_stats"]["test"]
    assert stats["queries"] == 3 and stats["queries_without_qrels"] == 1
    assert stats["qrels"] == 5 and stats["qrels_unknown_query"] == 1
    assert stats["qrels_missing_document"] == 1
    assert stats["qrels_missing_document_examples"] == [["q1", "gone", 1]]
    assert stats["query_ids_equal_doc_ids"] == 1
    assert stats["empty_queries"] == 1
    assert stats["relevance_levels"] == {"0": 1, "1": 3, "2": 1}
    # The judgement naming a missing document is kept (it is an unretrievable relevant).
    qrels = pl.read_parquet(out / "qrels-test.parquet")
    assert ("q1", "gone", 1) in qrels.rows()
    assert sorted(pl.read_parquet(out / "queries-test.parquet")["query_id"]) == ["q1", "q2", "q3"]
    assert "5" in pl.read_parquet(out / "corpus.parquet")["doc_id"].to_list()


def test_beir_errors_name_the_file_and_line(quirky_beir, tmp_path):
    entry = quirky_entry(quirky_beir)
    with open(quirky_beir / "corpus.jsonl", "a") as handle:
        handle.write('{"_id": "d1", "text": "duplicate id"}\n')
    with pytest.raises(DatasetError, match="duplicated doc_ids.*d1"):
        datasets.prepare(entry, tmp_path / "out", data_root=str(tmp_path))
    with open(quirky_beir / "corpus.jsonl", "a") as handle:
        handle.write("{not json\n")
    with pytest.raises(DatasetError, match=r"corpus.jsonl, line 7: not valid JSON"):
        datasets.prepare(entry, tmp_path / "out", data_root=str(tmp_path))
    with pytest.raises(DatasetError, match="no split 'dev'"):
        datasets.prepare_split(entry, "dev", tmp_path / "out", data_root=str(tmp_path))


def test_repeated_judgements_are_refused(quirky_beir, tmp_path):
    with open(quirky_beir / "qrels" / "test.tsv", "a") as handle:
        handle.write("q1\td1\t0\n")
    entry = quirky_entry(quirky_beir)
    with pytest.raises(DatasetError, match="1 repeated"):
        datasets.prepare(entry, tmp_path / "out", data_root=str(tmp_path))


def _add(archive, name, text):
    data = text.encode()
    member = tarfile.TarInfo(name)
    member.size = len(data)
    archive.addfile(member, io.BytesIO(data))


def test_msmarco_layout_from_archives_gzip_and_titles(tmp_path):
    downloads = tmp_path / "downloads"
    downloads.mkdir(parents=True)
    with tarfile.open(downloads / "collectionandqueries.tar.gz", "w:gz") as archive:
        _add(archive, "collection.tsv", "0\tpassage zero\n1\tpassage one\n2\tpassage two\n")
        _add(archive, "qrels.dev.small.tsv", "10\t0\t1\t1\n11\t0\t7\t1\n")
        _add(archive, "queries.dev.small.tsv", "10\twhat is one\n11\twhat is seven\n12\tunjudged\n")
    with tarfile.open(downloads / "marco.tar.gz", "w:gz") as archive:
        _add(archive, "marco/para.title.txt", "0\tZero\n1\t-\n")
    with gzip.open(downloads / "dl19-queries.tsv.gz", "wt") as handle:
        handle.write("10\twhat is one\n")
    (downloads / "dl19-qrels.txt").write_text("10 Q0 1 3\n10 Q0 0 1\n")
    ref = lambda file, member=None: {
        "download": file,
        **({"member": member} if member else {}),
    }  # noqa: E731
    entry = {
        "name": "mini-marco",
        "format": "msmarco",
        "title": "sep",
        "exclude_query_id": False,
        "max_missing_judged_documents": 1,  # passage 7
        "corpus": ref("collectionandqueries.tar.gz", "collection.tsv"),
        "titles": ref("marco.tar.gz", "marco/para.title.txt"),
        "splits": [
            {
                "name": "dev",
                "queries": ref("collectionandqueries.tar.gz", "queries.dev.small.tsv"),
                "qrels": ref("collectionandqueries.tar.gz", "qrels.dev.small.tsv"),
            },
            {"name": "dl19", "queries": ref("dl19-queries.tsv.gz"), "qrels": ref("dl19-qrels.txt")},
        ],
    }
    info = datasets.prepare(entry, tmp_path / "out", data_root=str(tmp_path), downloads=downloads)
    corpus = pl.read_parquet(tmp_path / "out" / "corpus.parquet")
    assert corpus.rows() == [
        ("0", "Zero", "passage zero"),
        ("1", "-", "passage one"),  # RocketQA's "no title", fed as written (as the COSTA authors)
        ("2", "", "passage two"),
    ]
    assert info["split_stats"]["dev"]["queries"] == 2
    assert info["split_stats"]["dev"]["qrels_missing_document"] == 1  # passage 7
    assert info["split_stats"]["dl19"]["relevance_levels"] == {"1": 1, "3": 1}
    with pytest.raises(DatasetError, match="no member 'nope.tsv'"):
        datasets.prepare_corpus(
            dict(entry, corpus=ref("collectionandqueries.tar.gz", "nope.tsv")),
            tmp_path / "out2",
            data_root=str(tmp_path),
            downloads=downloads,
        )


@pytest.mark.parametrize("compressed", [True, False])
def test_msmarco_document_layout_is_streamed_in_batches(tmp_path, monkeypatch, compressed):
    """`docid url title body` (msmarco-docs.tsv[.gz]) with gzipped TREC doc qrels, written batch by
    batch: the rows, their order and the quirk counts must not depend on where batches end."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    lines = "".join(
        f"D{i}\thttp://example.org/{i}\t{'' if i % 3 == 0 else f'Title {i}'}\t"
        f"{'' if i == 4 else f'body of document {i}'}\n"
        for i in range(1, 8)
    )
    name = "msmarco-docs.tsv.gz" if compressed else "msmarco-docs.tsv"
    if compressed:
        with gzip.open(downloads / name, "wt") as handle:
            handle.write(lines)
    else:
        (downloads / name).write_text(lines)
    with gzip.open(downloads / "msmarco-docdev-queries.tsv.gz", "wt") as handle:
        handle.write("174249\tdoes xpress bet charge to deposit money\n320792\tunjudged\n")
    with gzip.open(downloads / "msmarco-docdev-qrels.tsv.gz", "wt") as handle:
        handle.write("174249 0 D3 1\n174249 0 D99 1\n")
    entry = {
        "name": "mini-marco-doc",
        "format": "msmarco",
        "title": "sep",
        "exclude_query_id": False,
        "max_missing_judged_documents": 1,  # D99
        "corpus": {"download": name},
        "titles": None,
        "splits": [
            {
                "name": "dev",
                "queries": {"download": "msmarco-docdev-queries.tsv.gz"},
                "qrels": {"download": "msmarco-docdev-qrels.tsv.gz"},
            }
        ],
    }
    monkeypatch.setattr(dataset_files, "CORPUS_BATCH_ROWS", 3)  # 7 documents: batches of 3, 3, 1
    out = tmp_path / "out"
    info = datasets.prepare(entry, out, data_root=str(tmp_path), downloads=downloads)
    corpus = pl.read_parquet(out / "corpus.parquet")
    assert corpus["doc_id"].to_list() == [f"D{i}" for i in range(1, 8)]
    assert corpus.row(0) == ("D1", "Title 1", "body of document 1")  # the url is not kept
    assert corpus.row(2) == ("D3", "", "body of document 3")
    assert pq.ParquetFile(out / "corpus.parquet").num_row_groups == 3
    assert info["corpus"] == {
        "documents": 7,
        "empty_text": 1,
        "empty_title": 2,
        "empty_title_and_text": 0,
    }
    dev = info["split_stats"]["dev"]
    assert dev["queries"] == 1 and dev["qrels"] == 2 and dev["qrels_missing_document"] == 1
    assert pl.read_parquet(out / "qrels-dev.parquet").rows() == [
        ("174249", "D3", 1),
        ("174249", "D99", 1),
    ]
    # A repeated id in a later batch is found too (ids are checked over the whole file).
    with gzip.open(downloads / "dupe.tsv.gz", "wt") as handle:
        handle.write(lines + "D2\thttp://example.org/again\tAgain\tsecond copy\n")
    with pytest.raises(DatasetError, match="duplicated doc_ids.*D2"):
        datasets.prepare_corpus(
            dict(entry, corpus={"download": "dupe.tsv.gz"}),
            tmp_path / "dupe",
            data_root=str(tmp_path),
            downloads=downloads,
        )
    assert not (tmp_path / "dupe" / "corpus.parquet").exists()


def test_config_sections_validate_and_reject_unknown_title_modes():
    demo = yaml.safe_load((ROOT / "config.yaml").read_text())
    config_checks.validate(demo)
    bad = copy.deepcopy(demo)
    bad["datasets"][0]["title"] = "colon"
    with pytest.raises(experiment_config.ConfigError, match="datasets.0.title"):
        config_checks.validate(bad)
    bad = copy.deepcopy(demo)
    bad["bm25"]["negatives"][0]["source"] = "random"
    with pytest.raises(experiment_config.ConfigError, match="bm25.negatives.0.source"):
        config_checks.validate(bad)


def test_a_subset_keeps_every_judged_document_and_a_hashed_sample_of_the_rest(tmp_path):
    """`subset: {documents, seed}`: all documents either split judges, then others by a hash of
    (seed, doc_id), whatever the corpus file's order."""
    entry = dict(SCIFACT, subset={"documents": 1500, "seed": 3})
    info = datasets.prepare(entry, tmp_path / "a")
    corpus = pl.read_parquet(tmp_path / "a" / "corpus.parquet")
    judged = set()
    for split in ("train", "test"):
        lines = (Path(SCIFACT["path"]) / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
        judged |= {line.split("\t")[1] for line in lines}
    assert len(corpus) == 1500 and judged <= set(corpus["doc_id"])
    assert info["subset"] == {"documents": 1500, "seed": 3, "judged": len(judged),
                              "full_corpus": 5183}
    assert json.loads((tmp_path / "a" / "dataset.json").read_text())["subset"]["judged"] == 667
    # The same sample from a shuffled copy of the corpus file; another seed, another sample.
    shuffled = tmp_path / "shuffled"
    (shuffled / "qrels").mkdir(parents=True)
    for name in ("queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        (shuffled / name).write_text((Path(SCIFACT["path"]) / name).read_text())
    lines = (Path(SCIFACT["path"]) / "corpus.jsonl").read_text().splitlines()
    (shuffled / "corpus.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    datasets.prepare_corpus(dict(entry, path=str(shuffled)), tmp_path / "b", data_root=tmp_path)
    again = pl.read_parquet(tmp_path / "b" / "corpus.parquet")
    assert set(again["doc_id"]) == set(corpus["doc_id"])
    datasets.prepare_corpus(dict(entry, subset={"documents": 1500, "seed": 4}), tmp_path / "c")
    other = set(pl.read_parquet(tmp_path / "c" / "corpus.parquet")["doc_id"])
    assert judged <= other and other != set(corpus["doc_id"])
    # Every split's queries and qrels stay whole: their documents are all in the sample.
    stats = info["split_stats"]["test"]
    assert stats["queries"] == 300 and stats["qrels_missing_document"] == 0


def test_a_subset_of_a_streamed_collection_is_refused(tmp_path):
    entry = {"name": "m", "format": "msmarco", "corpus": {"path": "x"}, "splits": [{"name": "dev"}],
             "title": "none", "exclude_query_id": False, "subset": {"documents": 10, "seed": 0}}
    with pytest.raises(DatasetError, match="subset` is for beir datasets only"):
        datasets.corpus_subset(entry, None)


# --- a corpus that does not hold the documents the qrels judge ---------------------------------
def tiny_beir(folder, corpus_ids, judged):
    """A BEIR folder: `corpus_ids` as documents, two queries judging `judged` in qrels/test.tsv."""
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", [{"_id": d, "text": f"about {d}"} for d in corpus_ids])
    write_jsonl(folder / "queries.jsonl", [{"_id": q, "text": f"query {q}"} for q in ("q1", "q2")])
    lines = "".join(f"q{1 + i % 2}\t{d}\t1\n" for i, d in enumerate(judged))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
    return dict(SCIFACT, name="tiny", path=str(folder), splits=[{"name": "test"}])


def test_a_subset_keeps_its_size_when_a_judged_document_is_missing(tmp_path):
    """A judged document the corpus lacks (BEIR ArguAna's) takes no place in the sample: it still
    holds `documents` documents, and `judged` counts the ones it holds."""
    corpus_ids = [f"d{i}" for i in range(1, 9)]
    entry = dict(tiny_beir(tmp_path / "tiny", corpus_ids, ["d1", "gone"]),
                 subset={"documents": 4, "seed": 0})
    info = datasets.prepare_corpus(entry, tmp_path / "out", data_root=str(tmp_path))
    kept = pl.read_parquet(tmp_path / "out" / "corpus.parquet")["doc_id"].to_list()
    assert len(kept) == 4 and "d1" in kept
    assert info["subset"] == {"documents": 4, "seed": 0, "judged": 1, "full_corpus": 8}


def test_a_corpus_of_another_dataset_stops_the_split_naming_both_files(tmp_path, capsys):
    """Every judged document absent: one error line naming the corpus and the qrels file, the
    count and examples, exit 1, and no split file (it used to pass, every score then 0)."""
    folder = tmp_path / "tiny"
    entry = tiny_beir(folder, ["d1", "d2", "d3"], ["x1", "x2", "x3", "x4"])
    out = tmp_path / "out"
    args = ["--config", json.dumps(entry), "--out", str(out), "--data-root", str(tmp_path)]
    datasets.main(["corpus", *args])
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        datasets.main(["split", "--split", "test", *args])
    assert stopped.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert str(folder / "corpus.jsonl") in errors[0]
    assert str(folder / "qrels" / "test.tsv") in errors[0]
    assert "4 of the 4 documents judged" in errors[0] and "none of them" in errors[0]
    assert "'x1', 'x2', 'x3', 'x4'" in errors[0] and "max_missing_judged_documents: 4" in errors[0]
    assert sorted(p.name for p in out.iterdir()) == before  # no queries-/qrels-test file


def test_judged_documents_missing_within_the_allowance_are_counted_and_reported(tmp_path):
    """Two of four judged documents absent: refused under the default allowance (0) and under 1;
    with `max_missing_judged_documents: 2` the split is written, its judgements kept, and the count
    reaches the qrels manifest and the tables' provenance."""
    folder = tmp_path / "tiny"
    entry = tiny_beir(folder, ["d1", "d2", "d3"], ["d1", "gone-a", "d2", "gone-b"])
    out = tmp_path / "results" / "datasets" / "tiny"
    datasets.prepare_corpus(entry, out, data_root=str(tmp_path))
    for allowed in (None, 1):
        strict = entry if allowed is None else dict(entry, max_missing_judged_documents=allowed)
        qrels, corpus = (re.escape(str(folder / n)) for n in ("qrels/test.tsv", "corpus.jsonl"))
        with pytest.raises(
            DatasetError,
            match=rf"2 of the 4 documents judged in {qrels} are missing from the corpus {corpus} "
            rf"\(it holds 2; missing e\.g\. 'gone-a', 'gone-b'\).*"
            rf"`max_missing_judged_documents: 2`.*\(now {allowed or 0}\)",
        ):
            datasets.prepare_split(strict, "test", out, data_root=str(tmp_path))
        assert not list(out.glob("*-test.*"))
    stats = datasets.prepare_split(
        dict(entry, max_missing_judged_documents=2), "test", out, data_root=str(tmp_path)
    )
    assert stats["judged_documents"] == 4 and stats["judged_documents_missing"] == 2
    manifest = json.loads((out / "qrels-test.manifest.json").read_text())
    assert manifest["stats"]["judged_documents_missing_examples"] == ["gone-a", "gone-b"]
    assert manifest["params"]["max_missing_judged_documents"] == 2
    assert pl.read_parquet(out / "qrels-test.parquet").height == 4  # kept: unretrievable relevants
    from retrieval_pretraining.tables.provenance import missing_judged_documents

    [line] = missing_judged_documents(tmp_path / "results", [("tiny", "test")])
    assert line.endswith("tiny/test 2 (allowed: 2)")


# --- qrels that judge queries the queries file does not hold ------------------------------------
def _dl_entry(topics: str, qrels: str) -> dict:
    """An msmarco entry over the shipped TREC DL topics and qrels (corpus: a stand-in)."""
    folder = "data/msmarco-topics-qrels"
    return {
        "name": "dl", "format": "msmarco", "title": "none", "exclude_query_id": False,
        "corpus": {"path": "unused"},
        "splits": [{"name": "test", "queries": {"path": f"{folder}/{topics}"},
                    "qrels": {"path": f"{folder}/{qrels}"}}],
    }


def test_topics_and_qrels_of_different_years_are_refused_naming_both_files(tmp_path):
    """DL20 topics with DL19 qrels share no query id: every judgement names an unknown query, and
    the split used to be published with 0 queries and 0 qrels (scoring then blamed retrieval)."""
    entry = _dl_entry("topics.dl20.txt", "qrels.dl19-passage.txt")
    pl.DataFrame({"doc_id": ["0"]}).write_parquet(tmp_path / "corpus.parquet")
    with pytest.raises(DatasetError) as refused:
        datasets.prepare_split(entry, "test", tmp_path, data_root=str(ROOT))
    message = str(refused.value)
    assert "topics.dl20.txt" in message and "qrels.dl19-passage.txt" in message, message
    assert "43 queries judged" in message and "none of them" in message, message
    assert "'19335'" in message, message  # an example unknown id (DL19's first query)
    assert not list(tmp_path.glob("*-test.*"))


def test_one_unknown_judged_query_is_refused_unless_allowed(quirky_beir, tmp_path):
    """The quirky qrels judge q9, absent from queries.jsonl: refused under the default allowance,
    written (its judgement dropped, counted) with `max_unknown_judged_queries: 1`."""
    entry = dict(quirky_entry(quirky_beir))
    del entry["max_unknown_judged_queries"]
    out = tmp_path / "out"
    datasets.prepare_corpus(entry, out, data_root=str(tmp_path))
    queries, qrels = (re.escape(str(quirky_beir / n)) for n in ("queries.jsonl", "qrels/test.tsv"))
    with pytest.raises(DatasetError, match=rf"1 queries judged in {qrels} are not in {queries} "
                                           r".*'q9'.*`max_unknown_judged_queries: 1`.*\(now 0\)"):
        datasets.prepare_split(entry, "test", out, data_root=str(tmp_path))
    assert not list(out.glob("*-test.*"))
    stats = datasets.prepare_split(dict(entry, max_unknown_judged_queries=1), "test", out,
                                   data_root=str(tmp_path))
    assert stats["judged_queries_unknown"] == 1 and stats["qrels_unknown_query"] == 1
    manifest = json.loads((out / "qrels-test.manifest.json").read_text())
    assert manifest["params"]["max_unknown_judged_queries"] == 1


def test_a_split_whose_qrels_judge_nothing_is_refused(tmp_path):
    folder = tmp_path / "tiny"
    entry = tiny_beir(folder, ["d1"], [])
    out = tmp_path / "out"
    datasets.prepare_corpus(entry, out, data_root=str(tmp_path))
    with pytest.raises(DatasetError, match=r"0 queries.*qrels/test\.tsv judges no query"):
        datasets.prepare_split(entry, "test", out, data_root=str(tmp_path))


@pytest.mark.parametrize("bad", ["d 4", "d\t4", "d\v4", "d\f4", "d\r4", "d\n4", ""])
def test_a_doc_id_no_trec_run_line_can_hold_is_refused_at_preparation(
        quirky_beir, tmp_path, monkeypatch, bad):
    """A TREC run line's fields end at C's whitespace (contracts.runs.TREC_WHITESPACE): a doc id
    holding one (or an empty one) can never be written as one field, and the failure showed only
    at evaluation, after the whole corpus was encoded and searched. Refused while the corpus is
    prepared, naming the file, the record (counted across batches) and the id."""
    monkeypatch.setattr(dataset_files, "CORPUS_BATCH_ROWS", 2)
    records = (quirky_beir / "corpus.jsonl").read_text().splitlines(keepends=True)
    records.insert(3, json.dumps({"_id": bad, "text": "a document"}) + "\n")
    (quirky_beir / "corpus.jsonl").write_text("".join(records))
    out = tmp_path / "out"
    where = re.escape(f"{quirky_beir / 'corpus.jsonl'}, record 4: doc id {bad!r}")
    with pytest.raises(DatasetError, match=where) as refused:
        datasets.prepare_corpus(quirky_entry(quirky_beir), out, data_root=str(tmp_path))
    assert "\n" not in str(refused.value) and "rename" in str(refused.value)
    assert not (out / "corpus.parquet").exists()


def test_query_and_judged_doc_ids_no_trec_line_can_hold_are_refused(quirky_beir, tmp_path):
    """A query id holding a space cannot head a run line; a judged doc id holding one (here one
    the corpus lacks) cannot be a TREC qrels field. Each is refused naming its file and record;
    a query no qrels judge is not published, so its id is not refused."""
    entry = quirky_entry(quirky_beir)
    out = tmp_path / "out"
    write_jsonl(quirky_beir / "queries.jsonl", [
        {"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"},
        {"_id": "q3", "text": ""}, {"_id": "never judged", "text": "unjudged"}])
    datasets.prepare(entry, out, data_root=str(tmp_path))  # the unjudged id is not published
    qrels = quirky_beir / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text().replace("q1\tgone", "q1\tgone\x0cdoc"))
    with pytest.raises(DatasetError, match=re.escape(f"{qrels}, record 2: doc id 'gone\\x0cdoc'")):
        datasets.prepare_split(entry, "test", out, data_root=str(tmp_path))
    qrels.write_text(qrels.read_text().replace("gone\x0cdoc", "gone").replace("q2\t", "q 2\t"))
    write_jsonl(quirky_beir / "queries.jsonl", [
        {"_id": "q1", "text": "first"}, {"_id": "q 2", "text": "second"},
        {"_id": "q3", "text": ""}])
    queries = quirky_beir / "queries.jsonl"
    with pytest.raises(DatasetError, match=re.escape(f"{queries}, record 2: query id 'q 2'")):
        datasets.prepare_split(entry, "test", out, data_root=str(tmp_path))


def test_ids_holding_unicode_spaces_are_prepared_whole(tmp_path):
    """trec_eval keeps U+00A0, U+3000, U+2028, U+0085 and \\x1c inside a field, and so do our run
    readers (contracts.runs.trec_fields): such ids are legal and kept as they are."""
    ids = ["d\u00a0a", "d\u3000b", "d\u2028c", "d\u0085e", "d\x1cf"]
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "collection.tsv").write_text(
        "".join(f"{d}\ttext {n}\n" for n, d in enumerate(ids)), encoding="utf-8")
    (downloads / "queries.tsv").write_text("q\u00a01\tquestion\n", encoding="utf-8")
    (downloads / "qrels.txt").write_text(
        "".join(f"q\u00a01 0 {d} 1\n" for d in ids), encoding="utf-8")
    entry = {"name": "spaces", "format": "msmarco", "title": "none", "exclude_query_id": False,
             "corpus": {"download": "collection.tsv"},
             "splits": [{"name": "dev", "queries": {"download": "queries.tsv"},
                         "qrels": {"download": "qrels.txt"}}]}
    out = tmp_path / "out"
    datasets.prepare(entry, out, data_root=str(tmp_path), downloads=downloads)
    assert pl.read_parquet(out / "corpus.parquet")["doc_id"].to_list() == ids
    assert pl.read_parquet(out / "qrels-dev.parquet")["doc_id"].to_list() == ids
    assert pl.read_parquet(out / "queries-dev.parquet")["query_id"].to_list() == ["q\u00a01"]
