"""Natural Questions / TriviaQA in DPR's formats (data/dpr-sample/): streamed readers, DPR's
has_answer, Acc@k against Pyserini's DPR evaluation and a naive loop, the answers negative filter,
and the workflow's plan for an NQ-format dataset."""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import re
import shutil
import sys
import unicodedata

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from retrieval_pretraining import answers, audit, bm25, datasets, dpr_files, evaluate, mine
from retrieval_pretraining.contracts.datasets import ANSWERS_SCHEMA, DatasetError

from shipped_data import ROOT
from workflow_harness import copy_project, planned_rules

SAMPLE = "data/dpr-sample"
NQ_SAMPLE = {
    "name": "nq-sample",
    "format": "dpr",
    "corpus": {"path": f"{SAMPLE}/psgs_w100.tsv"},
    "splits": [
        {"name": "train", "biencoder": {"path": f"{SAMPLE}/biencoder-nq-train.json"}},
        {"name": "test", "questions": {"path": f"{SAMPLE}/nq-test.qa.csv"}},
    ],
    "title": "sep",
    "exclude_query_id": False,
}


@pytest.fixture(scope="module")
def nq(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nq-sample")
    datasets.prepare(NQ_SAMPLE, folder)
    return folder


# --- readers: DPR's layouts, streamed ---------------------------------------------------------


class SizedReadsOnly(io.StringIO):
    """A text stream that refuses a read of the whole rest (read() / read(-1) / readlines())."""

    def __init__(self, text):
        super().__init__(text)
        self.consumed = 0

    def read(self, size=-1):
        assert size is not None and size > 0, "read() without a size would load the whole file"
        chunk = super().read(size)
        self.consumed += len(chunk)
        return chunk

    def readlines(self, hint=-1):
        raise AssertionError("readlines() would load the whole file")


def test_the_json_list_reader_holds_one_element_and_one_step_at_a_time():
    records = [{"question": f"q{i}", "answers": [str(i)], "positive_ctxs": [], "pad": "x" * (i % 97)}
               for i in range(2000)]
    pieces = [json.dumps(r) for r in records]
    text = "[\n" + ",\n".join(pieces) + "\n]\n"
    handle, step = SizedReadsOnly(text), 512
    ends, position = [], 2
    for piece in pieces:
        position += len(piece)
        ends.append(position)
        position += 2
    for i, record in enumerate(dpr_files.iter_json_list(handle, "mem.json", step=step)):
        assert record == records[i]
        # Never more than one read step beyond the element just returned.
        assert handle.consumed - ends[i] <= step + 2
    assert i == len(records) - 1


@pytest.mark.parametrize("step", [1, 2, 3])
def test_a_number_split_by_a_read_step_is_read_whole(step):
    """A number that ends where a read ends may go on in the next read: '33' of '333' decodes."""
    text = "[1, 22, 333]"
    assert list(dpr_files.iter_json_list(io.StringIO(text), "x.json", step=step)) == json.loads(text)


@pytest.mark.parametrize("text,message", [
    ('{"question": "q"}', "expected a JSON list"),
    ('[{"question": "q", "answers": []}, {"question": "cut', "malformed or cut-short JSON"),
    ('[{"question": "q", "answers": []} {"question": "r"}]', "expected `,` or `]`"),
    ('[{"question": "q", "answers": []},', "cut-short JSON at character 34"),
    ('[{"question": "q", "answers": []}', "ends without `]`"),
])
def test_a_damaged_training_json_is_named_with_its_position(text, message):
    with pytest.raises(DatasetError, match=re.escape(message)):
        list(dpr_files.iter_json_list(io.StringIO(text), "x.json", step=8))


def test_the_passage_reader_streams_line_by_line_and_unquotes_like_dpr(tmp_path, monkeypatch):
    text = ('id\ttext\ttitle\n1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n'
            '2\tplain text, no quotes\tAaron\n3\tthird\t"Title ""quoted"""\n')
    handles = []

    def guarded(path, member=None):
        handles.append(SizedReadsOnly(text))
        import contextlib
        return contextlib.nullcontext(handles[-1])

    monkeypatch.setattr(dpr_files, "open_text", guarded)
    batches = list(dpr_files.read_passages_batches(tmp_path / "psgs_w100.tsv", rows=2))
    assert [b.height for b in batches] == [2, 1]  # batches of `rows`, never the whole file
    rows = pl.concat(batches).rows()
    assert rows[0] == ("1", "Aaron", 'Aaron Aaron ( or ; "Ahärôn") is a prophet')
    assert rows[2] == ("3", 'Title "quoted"', "third")


def test_the_shipped_passages_read_as_dpr_reads_them(tmp_path):
    gz = tmp_path / "psgs_w100.tsv.gz"
    gz.write_bytes(gzip.compress((ROOT / SAMPLE / "psgs_w100.tsv").read_bytes()))
    frame = pl.concat(list(dpr_files.read_passages_batches(gz, rows=64)))
    assert frame.height == 300 and frame["doc_id"].to_list() == [str(i) for i in range(1, 301)]
    words = frame["text"].str.split(" ").list.len()
    assert words.max() == 100 and (words == 100).sum() > 250  # 100-word blocks, shorter tails


def test_question_files_parse_literals_safely(tmp_path):
    qa = tmp_path / "trivia-test.qa.csv"
    qa.write_text('who sang "blue bayou"\t[\'Roy Orbison\']\n'
                  '"a ""quoted"" question"\t"[\'say ""hi""\', \'x\']"\n')
    assert list(dpr_files.read_questions(qa)) == [
        ("0", 'who sang "blue bayou"', ["Roy Orbison"]),
        ("1", 'a "quoted" question', ['say "hi"', "x"]),
    ]
    # Ids are record positions, as Pyserini numbers dpr-*-test: a question whose quoted text
    # spans two lines, or a byte-order mark, shifts or renames none of them.
    qa.write_bytes('\ufeff"a question\nover two lines"\t[\'A\']\nsecond\t[\'B\']\nthird\t[\'C\']\n'
                   .encode())
    assert [(i, q) for i, q, _ in dpr_files.read_questions(qa)] == [
        ("0", "a question\nover two lines"), ("1", "second"), ("2", "third")]
    bad = tmp_path / "bad.qa.csv"
    bad.write_text("q\t__import__('os').system('true')\n")
    with pytest.raises(DatasetError, match=r"bad.qa.csv, line 1: .*not a Python list literal"):
        list(dpr_files.read_questions(bad))
    bad.write_text("q\t['a', 3]\n")
    with pytest.raises(DatasetError, match="list of strings"):
        list(dpr_files.read_questions(bad))
    jsonl = tmp_path / "NQ-open.dev.jsonl"
    jsonl.write_text('{"question": "q1", "answer": ["A"]}\n{"id": "x7", "question": "q2", '
                     '"answers": ["B", "C"]}\n')
    assert list(dpr_files.read_questions(jsonl)) == [("0", "q1", ["A"]), ("x7", "q2", ["B", "C"])]


def test_a_null_json_lines_question_id_is_its_line_as_an_absent_one(tmp_path):
    """`"id": null` is no id, as DPR's JsonlQASrc reads it: the question takes its line's id, as
    one without `id` does, where str(None) made every such question the query id "None"."""
    jsonl = tmp_path / "NQ-open.dev.jsonl"
    jsonl.write_text('{"id": null, "question": "q1", "answer": ["A"]}\n'
                     '{"id": "x7", "question": "q2", "answer": ["B"]}\n'
                     '{"id": null, "question": "q3", "answer": ["C"]}\n')
    assert [qid for qid, _, _ in dpr_files.read_questions(jsonl)] == ["0", "x7", "2"]


@pytest.mark.parametrize("line,message", [
    ('["q1", ["A"]]', "line 2: not a JSON object but an array"),
    ('"q1"', "line 2: not a JSON object but a string"),
    ('{"question": 7, "answers": ["A"]}', "line 2: the question must be a string, got 7"),
    ('{"question": null, "answers": ["A"]}', "line 2: the question must be a string, got None"),
])
def test_a_malformed_json_lines_question_is_named_with_its_line(tmp_path, line, message):
    """Each line of NQ-open's JSON-lines files is one object whose question is a string: another
    value failed unnamed (an AttributeError, or polars' type error when the split was written)."""
    jsonl = tmp_path / "NQ-open.dev.jsonl"
    jsonl.write_text('{"question": "q0", "answer": ["A"]}\n' + line + "\n")
    with pytest.raises(DatasetError, match=re.escape(f"NQ-open.dev.jsonl, {message}")):
        list(dpr_files.read_questions(jsonl))


@pytest.mark.parametrize("question", [7, None, ["q"]])
def test_a_training_record_whose_question_is_not_a_string_is_named(tmp_path, question):
    """A biencoder record's question that is no string stopped the split in polars, unnamed."""
    path = tmp_path / "biencoder-nq-dev.json"
    path.write_text(json.dumps([{"question": "q0", "answers": ["A"], "positive_ctxs": []},
                                {"question": question, "answers": ["A"], "positive_ctxs": []}]))
    with pytest.raises(DatasetError, match=re.escape(
            f"biencoder-nq-dev.json, question 1: the question must be a string, got {question}")):
        list(dpr_files.read_biencoder(path))


def test_an_unquoted_field_that_starts_with_a_quote_reads_as_dpr_reads_it(tmp_path):
    """DPR and Pyserini read qa.csv and psgs_w100.tsv with csv.reader's default (non-strict)
    dialect: a field that opens with a quoted phrase and goes on is read, not refused (a strict
    reader would stop a 21M-passage job hours in)."""
    line = '"The Last Supper" is by whom?\t[\'Leonardo da Vinci\']'
    qa = tmp_path / "nq-test.qa.csv"
    qa.write_text(line + "\n")
    question, answers = next(csv.reader([line], delimiter="\t"))  # as DPR's qa reader
    assert list(dpr_files.read_questions(qa)) == [("0", question, ["Leonardo da Vinci"])]
    passages = tmp_path / "psgs_w100.tsv"
    passages.write_text(f"id\ttext\ttitle\n1\t{line.split(chr(9))[0]} It hangs in Milan.\tX\n")
    [frame] = dpr_files.read_passages_batches(passages)
    assert frame["text"].to_list() == [
        next(csv.reader([passages.read_text().splitlines()[1]], delimiter="\t"))[1]]


def test_the_sample_becomes_the_datasets_contract(nq):
    corpus = pl.read_parquet(nq / "corpus.parquet")
    assert corpus.height == 300 and corpus.row(0)[1] == "Anarchism"
    test_queries = pl.read_parquet(nq / "queries-test.parquet")
    assert test_queries.height == 12 and test_queries["query_id"].to_list()[:2] == ["0", "1"]
    assert pl.read_parquet(nq / "qrels-test.parquet").height == 0  # scored by answers
    assert pq.read_schema(nq / "answers-test.parquet").remove_metadata().equals(ANSWERS_SCHEMA)
    train = pl.read_parquet(nq / "qrels-train.parquet")
    expected = [c["passage_id"] for r in json.loads((ROOT / SAMPLE / "biencoder-nq-train.json")
                                                    .read_text()) for c in r["positive_ctxs"]]
    assert train["doc_id"].to_list() == expected and set(train["relevance"]) == {1}
    for name in ("answers-test.parquet", "queries-test.parquet", "qrels-train.parquet"):
        result = audit.audit(nq / name)
        assert result.passed, (name, result.checks)
    assert audit.audit(nq / "answers-test.parquet").kind == "answers"


def test_answers_without_a_token_are_kept_and_counted(tmp_path):
    """DPR's qa files are kept as they are: an answer with no token (found in every passage by
    DPR's rule, so by Acc@k) stays in answers-{split}.parquet, counted in the manifest; a question
    with no answer at all stays with an empty list (Acc@k scores it 0). The audit checks both
    counts against the file."""
    qa = tmp_path / "dev.qa.csv"
    qa.write_text("q0\t['Paris', '']\nq1\t[' ', '']\nq2\t['Rome']\nq3\t[]\n")
    entry = {**NQ_SAMPLE, "splits": [{"name": "dev", "questions": {"path": str(qa)}}]}
    stats = datasets.prepare_answers(entry, "dev", tmp_path, data_root=str(tmp_path))
    frame = pl.read_parquet(tmp_path / "answers-dev.parquet")
    assert frame["answers"].to_list() == [["Paris", ""], [" ", ""], ["Rome"], []]
    assert stats["answers_without_tokens"] == 3
    assert stats["questions_with_answers_without_tokens"] == 2  # q1's two count it once
    assert stats["questions_without_answers"] == 1 and stats["answers"] == 5
    result = audit.audit(tmp_path / "answers-dev.parquet")
    assert result.passed, result.checks


def test_a_dpr_split_must_name_one_source(tmp_path):
    entry = {**NQ_SAMPLE, "splits": [{"name": "dev"}]}
    datasets.prepare_corpus(entry, tmp_path)
    with pytest.raises(DatasetError, match="exactly one of `questions`"):
        datasets.prepare_split(entry, "dev", tmp_path)


# --- has_answer: DPR's normalisation, by hand ---------------------------------------------------


@pytest.mark.parametrize("text,answer,expected", [
    ("The capital is Montgomery.", "montgomery", True),             # case
    ("The capital is MONTGOMERY!", "Montgomery", True),
    ("a prophet (Ahärôn) of old", "Ahärôn", True),                  # accents, composed in both
    ("a prophet (Aha\u0308ro\u0302n) of old", "Ahärôn", True),      # decomposed text (NFD both)
    ("a prophet (Aharon) of old", "Ahärôn", False),                 # marks are kept, not stripped
    ("composed by George Gershwin's band", "George Gershwin", True),  # multi-token, then "'"
    ("composed by George and Ira Gershwin", "George Gershwin", False),  # tokens must be adjacent
    ("born in the U.S. in 1809", "U.S.", True),                      # punctuation tokens: u . s .
    ("born in the US in 1809", "U.S.", False),
    ("born in the U.S in 1809", "U.S.", False),                      # "u . s" lacks the last "."
    ("Parisian cafés", "Paris", False),                              # whole tokens only
    ("it was surpassed by UTF-8, which", "utf-8", True),
    ("it was surpassed by UTF 8, which", "UTF-8", False),
    ("undesirable, unnecessary, and harmful.", "undesirable , unnecessary, and harmful", True),
    ("anything at all", "", True),                # no token: found everywhere, as in DPR's loop
    ("", " \t", True),                                               # even in an empty passage
    ("anything at all", "!!", False),
    ("1,000 people", "1,000", True),
    ("1000 people", "1,000", False),
])
def test_has_answer_hand_computed_cases(text, answer, expected):
    assert answers.has_answer(text, [answer]) is expected


def test_regex_mode_is_curated_trecs():
    assert answers.has_answer("Born in 1809 in Kentucky", [r"18\d\d"], mode="regex")
    assert answers.has_answer("KENTUCKY", ["kentucky"], mode="regex")  # case-insensitive
    assert not answers.has_answer("Born in Kentucky", ["(unclosed"], mode="regex")
    with pytest.raises(answers.AnswerError, match="string, regex"):
        answers.has_answer("x", ["x"], mode="fuzzy")


def dpr_regex_has_answer(text, patterns):
    """DPR's regex mode as dpr/data/qa_validation.py runs it: the third-party `regex` module
    (`import regex as re`), IGNORECASE + UNICODE + MULTILINE, NFD pattern and text."""
    regex = pytest.importorskip("regex")
    for pattern in patterns:
        try:
            compiled = regex.compile(unicodedata.normalize("NFD", pattern),
                                     flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)
        except BaseException:
            continue
        if compiled.search(unicodedata.normalize("NFD", text)) is not None:
            return True
    return False


@pytest.mark.filterwarnings("ignore:Possible nested set:FutureWarning")
def test_regex_mode_agrees_with_dprs_regex_module_on_the_usual_syntax():
    """answers.py compiles CuratedTREC's patterns with the standard `re`, as Pyserini does; DPR
    compiles them with `regex`. On the constructs such patterns are made of (words, alternation,
    \\s, \\b, \\d{4}, optional groups, lazy .*?, case pairs that NFD and case folding meet)
    the two agree on every sample passage; they part only on syntax `re` lacks or reads
    otherwise, listed last (ARCHITECTURE.md, answer match)."""
    rng = random.Random(5)
    texts = [line.split("\t")[1] for line in
             (ROOT / SAMPLE / "psgs_w100.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    texts += ["İstanbul STRASSE Straße ﬁne Kelvin \u212a 1809", "U.S. 1,024 bytes"]
    words = sorted({w for t in texts for w in re.findall(r"\w+", t)})
    pieces = [r"\s+", r"\.?", r"[0-9]+", r"\d{4}", r"\b", "(?:the )?", "s?", ",? ", r"\-",
              "'s", "[a-z]+", "ß", "STRASSE", "İ", "ﬁ", "K", ".*?", r"1,?024", "(U\\.S\\.|US)"]
    for _ in range(1500):
        pattern = "".join(rng.choice([rng.choice(words), rng.choice(pieces)])
                          for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.3:
            pattern += "|" + rng.choice(words)
        for text in rng.sample(texts, 4):
            assert answers.has_answer(text, [pattern], "regex") == dpr_regex_has_answer(
                text, [pattern]), (pattern, text[:60])
    parted = {r"\p{Lu}": "Paris", "[[:alpha:]]+": "Paris", "x(?i)y": "xy"}  # re: none found
    assert not any(answers.has_answer(t, [p], "regex") for p, t in parted.items())
    assert all(dpr_regex_has_answer(t, [p]) for p, t in parted.items())


def naive_tokens(text):
    """DPR's SimpleTokenizer as its documentation states it, one character at a time: NFD, a run
    of letters, digits and marks is one token, any other character that is no separator (Z*) or
    other (C*) is a token alone; tokens lower-cased."""
    out, run = [], ""
    for char in unicodedata.normalize("NFD", text):
        kind = unicodedata.category(char)[0]
        if kind in "LNM":
            run += char
            continue
        if run:
            out.append(run.lower())
            run = ""
        if kind not in "ZC":
            out.append(char.lower())
    return out + ([run.lower()] if run else [])


def naive_has_answer(text, answer_list):
    """DPR's loop: an answer's token list equal to a slice of the text's, at each of the
    len(text) - len(answer) + 1 positions (so a token-less answer equals the empty slice at 0)."""
    words = naive_tokens(text)
    for answer in answer_list:
        needle = naive_tokens(answer)
        if any(words[i:i + len(needle)] == needle for i in range(len(words) - len(needle) + 1)):
            return True
    return False


def test_tokens_agree_with_a_naive_character_walk_over_every_code_point():
    """Every code point (in runs of 64, so that each meets its neighbours' categories), and the
    sample's passages, tokenised as DPR's documentation states: no Pyserini needed."""
    points = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(points[i:i + 64]) for i in range(0, len(points), 64)]
    texts += [line.split("\t")[1] for line in
              (ROOT / SAMPLE / "psgs_w100.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    assert [answers.tokens(t) for t in texts] == [naive_tokens(t) for t in texts]


def test_has_answer_agrees_with_a_naive_loop_on_answer_lists():
    """Lists of answers (any one found is enough: phrases of any passage, a passage's own first
    or last words, accents, punctuation, token-less ones) over the sample's passages, against
    DPR's loop restated naively."""
    rng = random.Random(7)
    passages = [line.split("\t")[1] for line in
                (ROOT / SAMPLE / "psgs_w100.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    pool = ["Ahärôn", "Aha\u0308ro\u0302n", "U.S.", "u.s", "1,000", "", "!!", "the", "of the"]
    for passage in passages:
        words = passage.split()
        for _ in range(4):
            start = rng.randrange(len(words))
            pool.append(" ".join(words[start:start + rng.randint(1, 3)]))
    for passage in passages:
        words = passage.split()
        edges = [" ".join(words[:rng.randint(1, 3)]), " ".join(words[-rng.randint(1, 3):])]
        for _ in range(6):
            answer_list = rng.sample(pool, rng.randint(1, 4)) + rng.sample(edges, rng.randint(0, 1))
            assert answers.has_answer(passage, answer_list) == dpr_passage_has_answer(
                passage, answer_list), (answer_list, passage[:80])
    assert not answers.has_answer("anything", [])


def naive_regex_has_answer(text, patterns):
    """CuratedTREC's rule a pair at a time: each NFD pattern compiled case-insensitively (one
    that does not compile never matches), searched in the NFD text."""
    for pattern in patterns:
        try:
            compiled = re.compile(unicodedata.normalize("NFD", pattern),
                                  re.IGNORECASE | re.UNICODE | re.MULTILINE)
        except re.error:
            continue
        if compiled.search(unicodedata.normalize("NFD", text)):
            return True
    return False


def dpr_passage_has_answer(text, answer_list, mode="string"):
    """DPR's validation, restated: its loader (CsvCtxSrc) keeps psgs_w100's text column with '"'
    stripped from both ends (after csv unquoting; the title is never matched), then has_answer."""
    text = text.strip('"')
    if mode == "regex":
        return naive_regex_has_answer(text, answer_list)
    return naive_has_answer(text, answer_list)


@pytest.mark.parametrize("mode", answers.MATCH_MODES)
def test_matching_pairs_is_has_answer_on_every_pair(mode, tmp_path):
    """matching_pairs tokenises (or compiles) each question's answers once and each passage once,
    however many questions share it: the pairs it finds are exactly those a pair-at-a-time
    restatement of DPR's rule (CuratedTREC's, in regex mode) finds, on the sample's passages with
    answer lists of their own phrases in other cases, accents composed and decomposed,
    punctuation, token-less answers and patterns that do not compile, passages shared by many
    questions, and a question the answers file lacks."""
    rng = random.Random(11)
    lines = (ROOT / SAMPLE / "psgs_w100.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = {f"d{i}": line.split("\t")[1] for i, line in enumerate(lines)}
    texts["decomposed"] = "a prophet (Aha\u0308ro\u0302n) of old, born in the U.S. in 1809"
    texts["composed"] = "a prophet (Ah\u00e4r\u00f4n) of old"  # matched only after NFD, both
    pool = ["Ahärôn", "Aha\u0308ro\u0302n", "U.S.", "u.s", "1,000", "", "!!", "the", "of the",
            "18\\d\\d", "(unclosed", "KENTUCKY", "[a-z]+ of old"]
    for text in texts.values():
        words = text.split()
        for _ in range(2):
            start = rng.randrange(len(words))
            phrase = " ".join(words[start:start + rng.randint(1, 4)])
            pool.append(rng.choice([str, str.lower, str.upper])(phrase))
    docs = sorted(texts)
    gold = {f"q{q}": rng.sample(pool, rng.randint(1, 15)) for q in range(60)}
    gold["accented"] = ["Ah\u00e4r\u00f4n"]
    pairs = {q: set(rng.sample(docs, rng.randint(1, 40))) for q in [*gold, "absent"]}
    pairs["accented"] |= {"composed", "decomposed"}
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc_id": docs, "title": docs, "text": [texts[d] for d in docs]}),
                   corpus)
    found = answers.matching_pairs(pairs, gold, corpus, mode)
    expected = {q: {d for d in ds if dpr_passage_has_answer(texts[d], gold.get(q, ()), mode)}
                for q, ds in pairs.items()}
    assert found == expected
    assert expected["accented"] >= {"composed", "decomposed"} and expected["absent"] == set()
    hits, tried = sum(map(len, expected.values())), sum(map(len, pairs.values()))
    assert 200 < hits < tried - 200  # hits and misses both common: either way is tested


def test_tokens_agree_with_pyserinis_dpr_tokenizer():
    pyserini_eval = pytest.importorskip("pyserini.eval.evaluate_dpr_retrieval")
    tokenizer = pyserini_eval.SimpleTokenizer()
    texts = [line.split("\t")[1] for line in
             (ROOT / SAMPLE / "psgs_w100.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    texts += ["Ｆｕｌｌ width ½ 𝔸 zero\u00adwidth İstanbul ß ﬁ", "a\u200bb\tc—d «e» 3.14"]
    for text in texts:
        theirs = tokenizer.tokenize(pyserini_eval._normalize(text)).words(uncased=True)
        assert answers.tokens(text) == theirs


# --- Acc@k ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["", " ", "\t\u200b"])
def test_a_token_less_answer_is_found_in_every_passage_as_dpr_and_pyserini_find_it(answer,
                                                                                    tmp_path):
    """DPR's has_answer (and Pyserini's copy of it) slides an answer's token list over the
    passage's at len(passage) - len(answer) + 1 positions: a token-less answer equals the empty
    slice at position 0 of every passage, an empty one included. So its question counts as
    answered by its first passage, and Acc@k counts it so (a question missing from the run still
    scores 0). They were dropped at preparation, where Acc@k counted the question a miss."""
    texts = {"d1": "Mobile", "d2": "", "d3": "Montgomery is the capital"}
    gold = {"q1": ["Huntsville", answer], "q2": ["Huntsville"], "q3": [answer]}
    write_corpus(tmp_path / "corpus.parquet", texts)
    write_answers(tmp_path / "answers.parquet", gold)
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 3 t\nq1 Q0 d3 2 2 t\n"
                                       "q2 Q0 d2 1 3 t\nq2 Q0 d1 2 2 t\n")
    result = evaluate.evaluate(tmp_path / "run.trec", None, None, {"measures": ["Acc@1", "Acc@2"]},
                               tmp_path / "answers.parquet", tmp_path / "corpus.parquet")
    assert result["per_query"]["Acc@1"] == {"q1": 1.0, "q2": 0.0, "q3": 0.0}
    assert result["per_query"]["Acc@2"] == {"q1": 1.0, "q2": 0.0, "q3": 0.0}
    assert all(answers.has_answer(t, [answer]) for t in texts.values())
    assert all(dpr_passage_has_answer(t, [answer]) for t in texts.values())
    pyserini_eval = pytest.importorskip("pyserini.eval.evaluate_dpr_retrieval")
    tokenizer = pyserini_eval.SimpleTokenizer()
    for text in texts.values():
        for answer_list in gold.values():
            assert answers.has_answer(text, answer_list) == pyserini_eval.has_answers(
                text, answer_list, tokenizer), (text, answer_list)



def overlap_run(folder, path, depth=100):
    """A deterministic run: passages by shared lower-case words with the question."""
    corpus = pl.read_parquet(folder / "corpus.parquet")
    lines = []
    for qid, question in pl.read_parquet(folder / "queries-test.parquet").iter_rows():
        words = set(question.lower().split())
        scored = sorted(((len(words & set((t + " " + x).lower().split())), d)
                         for d, t, x in corpus.iter_rows()), key=lambda s: (-s[0], int(s[1])))
        lines += [f"{qid} Q0 {d} {r} {depth - r + s:.1f} overlap\n"
                  for r, (s, d) in enumerate(scored[:depth], 1)]
    path.write_text("".join(lines))
    return path


def naive_accuracy(run_path, folder, k):
    """Acc@k by the definition, one question at a time (no shared code path with top_k_accuracy)."""
    texts = dict(pl.read_parquet(folder / "corpus.parquet").select("doc_id", "text").iter_rows())
    gold = dict(pl.read_parquet(folder / "answers-test.parquet").iter_rows())
    ranked = {}
    for line in run_path.read_text().splitlines():
        qid, _, doc, rank, _, _ = line.split()
        ranked.setdefault(qid, []).append((int(rank), doc))
    hits = [any(answers.has_answer(texts[d], gold[q]) for _, d in sorted(ranked.get(q, []))[:k])
            for q in gold]
    return sum(hits) / len(gold)


def test_acc_at_k_matches_pyserinis_dpr_evaluation_and_a_naive_loop(nq, tmp_path, capsys):
    run = overlap_run(nq, tmp_path / "test.trec")
    config = {"measures": ["Acc@5", "Acc@20", "Acc@100"]}
    result = evaluate.evaluate(run, None, tmp_path / "m.json", config,
                               nq / "answers-test.parquet", nq / "corpus.parquet")
    for k in (5, 20, 100):
        assert result["aggregate"][f"Acc@{k}"] == pytest.approx(naive_accuracy(run, nq, k))
    assert 0 < result["aggregate"]["Acc@5"] < result["aggregate"]["Acc@100"] < 1  # mona lisa: 0
    assert result["per_query"]["Acc@100"]["11"] == 0.0
    # Pyserini's own DPR evaluation (pure Python: no Java needed) on the same retrieval, written in
    # its retrieval JSON layout ("title\ntext" contexts, in rank order).
    pyserini_eval = pytest.importorskip("pyserini.eval.evaluate_dpr_retrieval")
    corpus = {d: (t, x) for d, t, x in pl.read_parquet(nq / "corpus.parquet").iter_rows()}
    gold = dict(pl.read_parquet(nq / "answers-test.parquet").iter_rows())
    retrieval = {}
    for line in run.read_text().splitlines():
        qid, _, doc, _, _, _ = line.split()
        entry = retrieval.setdefault(qid, {"question": "", "answers": gold[qid], "contexts": []})
        entry["contexts"].append({"docid": doc, "text": "\n".join(corpus[doc])})
    (tmp_path / "retrieval.json").write_text(json.dumps(retrieval))
    capsys.readouterr()
    pyserini_eval.evaluate_retrieval(str(tmp_path / "retrieval.json"), [5, 20, 100])
    printed = dict(re.findall(r"Top(\d+)\taccuracy: ([0-9.]+)", capsys.readouterr().out))
    for k in (5, 20, 100):
        assert round(result["aggregate"][f"Acc@{k}"], 4) == float(printed[str(k)])


def test_acc_cli_writes_per_question_hits_and_misses_count_zero(nq, tmp_path, capsys):
    run = overlap_run(nq, tmp_path / "full.trec", depth=20)
    kept = [line for line in run.read_text().splitlines(True) if not line.startswith("3 ")]
    kept.append("not-a-question Q0 x 1 1.0 t\n")  # not scored, but counted
    (tmp_path / "cut.trec").write_text("".join(kept))
    out = tmp_path / "metrics.json"
    evaluate.main(["--config", json.dumps({"measures": ["Acc@20", "Acc@5"]}), "--run",
                   str(tmp_path / "cut.trec"), "--answers", str(nq / "answers-test.parquet"),
                   "--corpus", str(nq / "corpus.parquet"), "--out", str(out)])
    metrics = json.loads(out.read_text())
    per = metrics["per_query"]["Acc@20"]
    assert len(per) == 12 and per["3"] == 0.0 and metrics["questions_missing_from_run"] == 1
    assert metrics["questions"] == 12  # every question of the answers file, the missed one too
    assert metrics["questions_missing_from_run_examples"] == ["3"]
    assert metrics["run_queries_without_answers"] == 1
    assert metrics["run_queries_without_answers_examples"] == ["not-a-question"]
    assert metrics["aggregate"]["Acc@20"] == pytest.approx(np.mean(list(per.values())))
    assert all(per[q] >= metrics["per_query"]["Acc@5"][q] for q in per)
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(["--config", json.dumps({"measures": ["Acc@20"]}), "--run", str(run),
                       "--out", str(tmp_path / "x.json")])
    assert exit_.value.code == 1 and "need --answers" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_acc_at_k_ranks_a_run_out_of_score_order_by_score(tmp_path):
    """A run whose lines are not in score order: Acc@1 reads the best-scored passage, not the
    first line. q1's answer is in its second line, the higher score (Acc@1 = 1); q2's is in its
    first line, the lower score (Acc@1 = 0); both are within the top 2."""
    write_corpus(tmp_path / "corpus.parquet", {"d1": "Birmingham", "d2": "Montgomery is capital",
                                               "d3": "Huntsville", "d4": "Mobile"})
    write_answers(tmp_path / "answers.parquet", {"q1": ["Montgomery"], "q2": ["Huntsville"]})
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 1.0 t\nq1 Q0 d2 2 5.0 t\n"
                                       "q2 Q0 d3 1 1.0 t\nq2 Q0 d4 2 2.0 t\n")
    result = evaluate.evaluate(tmp_path / "run.trec", None, None,
                               {"measures": ["Acc@1", "Acc@2"]}, tmp_path / "answers.parquet",
                               tmp_path / "corpus.parquet")
    assert result["per_query"]["Acc@1"] == {"q1": 1.0, "q2": 0.0}
    assert result["per_query"]["Acc@2"] == {"q1": 1.0, "q2": 1.0}
    assert result["aggregate"] == {"Acc@1": 0.5, "Acc@2": 1.0}


@pytest.mark.parametrize("mode", answers.MATCH_MODES)
def test_acc_at_k_matches_the_passage_text_as_dpr_loads_it(mode, tmp_path):
    """DPR matches answers in `row[text].strip('"')`: a quote that opens or closes a passage is
    no token of it, so an answer that begins or ends with a quote is not found at its edge."""
    texts = {"opens": '"Weird Al" Yankovic is a singer', "closes": 'he sang "Amish Paradise"',
             "inside": 'the hit "Eat It" was a parody'}
    gold = {"q1": ['"Weird Al"'], "q2": ['"Amish Paradise"'], "q3": ['"Eat It"']}
    if mode == "regex":
        gold = {q: [re.escape(a) for a in a_list] for q, a_list in gold.items()}
    write_corpus(tmp_path / "corpus.parquet", texts)
    write_answers(tmp_path / "answers.parquet", gold)
    (tmp_path / "run.trec").write_text(
        "q1 Q0 opens 1 3 t\nq2 Q0 closes 1 3 t\nq3 Q0 inside 1 3 t\n")
    result = evaluate.evaluate(tmp_path / "run.trec", None, None,
                               {"measures": ["Acc@1"], "answer_match": mode},
                               tmp_path / "answers.parquet", tmp_path / "corpus.parquet")
    expected = {q: float(dpr_passage_has_answer(texts[d], gold[q], mode))
                for q, d in (("q1", "opens"), ("q2", "closes"), ("q3", "inside"))}
    assert expected == {"q1": 0.0, "q2": 0.0, "q3": 1.0}
    assert result["per_query"]["Acc@1"] == expected
    assert [answers.has_answer(texts[d], gold[q], mode) for q, d in
            (("q1", "opens"), ("q2", "closes"), ("q3", "inside"))] == [False, False, True]


FUZZ_WORDS = ["Paris", "paris", "PARIS", "café", "cafe\u0301", "Ahärôn", "Aha\u0308ro\u0302n",
              "Zürich", "ZU\u0308RICH", "ß", "İstanbul", "1,000", "1000", "42", "4.2", "U.S.",
              "u.s", "'s", "-", "(", ")", '"', "«", "»", "—", "½", "the", "of", "x"]


def fuzz_text(rng, words=(1, 12)):
    """Words of FUZZ_WORDS glued by a space, nothing, a tab or a no-break space; a quote opens or
    closes it now and then."""
    parts = rng.choices(FUZZ_WORDS, k=rng.randint(*words))
    text = "".join(p + rng.choice([" ", " ", "", "\t", "\u00a0"]) for p in parts).rstrip()
    return rng.choice(['"', "", "", ""]) + text + rng.choice(['"', '""', "", "", ""])


def test_acc_at_k_fuzzed_against_dprs_definition(tmp_path):
    """Random corpora from a small vocabulary (case, accents composed and decomposed, numbers,
    punctuation, quotes at a passage's edges), answers cut from passages at any character
    (partial tokens, edges) or drawn from the vocabulary (token-less ones included), titles that
    hold the answers (never matched), runs out of score order with ties, questions missing from
    the run, run queries that are no question and cutoffs beyond the run's depth: Acc@k is DPR's,
    restated one question at a time (score descending, ties in file order; a missing question
    scores 0; the mean over every question)."""
    rng = random.Random(2020)
    for trial in range(25):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        texts = {f"d{i}": fuzz_text(rng) for i in range(30)}
        gold = {}
        for q in range(20):
            answer_list = []
            for _ in range(rng.randint(1, 3)):
                source = rng.choice(list(texts.values()))
                start = rng.randrange(len(source))
                answer_list.append(rng.choice([
                    source[start:start + rng.randint(1, 12)], fuzz_text(rng, (1, 2)),
                    rng.choice(FUZZ_WORDS), rng.choice(["", " ", "\t"])]))
            gold[f"q{q}"] = answer_list
        titles = {d: rng.choice(sum(gold.values(), [])) for d in texts}
        pl.DataFrame({"doc_id": list(texts), "title": list(titles.values()),
                      "text": list(texts.values())}).write_parquet(folder / "corpus.parquet")
        write_answers(folder / "answers.parquet", gold)
        run, lines = {}, []
        for q in [*rng.sample(sorted(gold), 16), "not-a-question"]:
            docs = rng.sample(sorted(texts), rng.randint(1, 8))
            run[q] = [(d, float(rng.randint(0, 3))) for d in docs]  # ties common
            lines += [f"{q} Q0 {d} {r} {s} t\n" for r, (d, s) in enumerate(run[q], 1)]
        (folder / "run.trec").write_text("".join(lines))
        cutoffs = [1, 2, 3, 5, 20]  # the run is at most 8 deep
        result = evaluate.evaluate(folder / "run.trec", None, None,
                                   {"measures": [f"Acc@{k}" for k in cutoffs]},
                                   folder / "answers.parquet", folder / "corpus.parquet")
        for k in cutoffs:
            expected = {}
            for q, answer_list in gold.items():
                ranked = [d for d, _ in sorted(run.get(q, []), key=lambda hit: -hit[1])]
                expected[q] = float(any(dpr_passage_has_answer(texts[d], answer_list)
                                        for d in ranked[:k]))
            assert result["per_query"][f"Acc@{k}"] == expected, (trial, k)
            assert result["aggregate"][f"Acc@{k}"] == pytest.approx(sum(expected.values()) / 20)
        assert result["questions_missing_from_run"] == 4
    hits = [sum(dpr_passage_has_answer(t, a) for t in texts.values()) for a in gold.values()]
    assert 0 < sum(map(bool, hits)) < len(hits)  # both outcomes occur


def test_acc_at_k_fails_on_a_single_retrieved_passage_the_corpus_lacks(tmp_path):
    """One retrieved passage of three missing from the corpus is an error naming the count, not a
    question scored as if that passage held no answer (Acc@k would then read low, silently)."""
    write_corpus(tmp_path / "corpus.parquet", {"d1": "Montgomery", "d2": "Mobile"})
    write_answers(tmp_path / "answers.parquet", {"q1": ["Montgomery"], "q2": ["Huntsville"]})
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 t\nq2 Q0 d2 1 2.0 t\n"
                                       "q2 Q0 d9 2 1.0 t\n")
    with pytest.raises(answers.AnswerError, match="1 of the 3 passages to match are not in"):
        evaluate.evaluate(tmp_path / "run.trec", None, None, {"measures": ["Acc@2"]},
                          tmp_path / "answers.parquet", tmp_path / "corpus.parquet")


# --- negatives filtered by answers ---------------------------------------------------------------


def write_answers(path, rows):
    pl.DataFrame({"query_id": list(rows), "answers": list(rows.values())},
                 schema={"query_id": pl.String, "answers": pl.List(pl.String)}).write_parquet(path)


def write_corpus(path, texts):
    pl.DataFrame({"doc_id": list(texts), "title": ["t"] * len(texts),
                  "text": list(texts.values())}).write_parquet(path)


def test_mining_with_the_answers_filter_drops_passages_that_contain_an_answer(tmp_path, monkeypatch):
    import faiss

    texts = {"d1": "Montgomery is the capital", "d2": "Birmingham is the largest city",
             "d3": "the capital moved to MONTGOMERY.", "d4": "Huntsville", "d5": "Mobile"}
    docs = list(texts)
    index = faiss.IndexFlatIP(1)
    index.add(np.array([[5], [4], [3], [2], [1]], dtype=np.float32))
    monkeypatch.setattr(mine.faiss_index, "load", lambda folder: (index, pa.array(docs)))
    monkeypatch.setattr(mine, "encode_queries",
                        lambda encoder, queries, config: (["q"], np.array([[1]], np.float32)))
    pl.DataFrame({"query_id": ["q"], "doc_id": ["d2"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    write_answers(tmp_path / "answers.parquet", {"q": ["Montgomery"]})
    write_corpus(tmp_path / "corpus.parquet", texts)
    base = {"depth": 5, "rank_window": None, "sample": "top", "num_negatives": None,
            "exclude_self": False, "use_gpu": "never"}
    found = {}
    for policy in ("qrels", "answers"):
        out = tmp_path / f"mined-{policy}.parquet"
        stats = mine.mine_to_file(tmp_path / "index", tmp_path / "enc", tmp_path / "q.parquet",
                                  tmp_path / "qrels.parquet", out, base | {"negative_filter": policy},
                                  seed=0, answers=tmp_path / "answers.parquet",
                                  corpus=tmp_path / "corpus.parquet")
        found[policy] = (pl.read_parquet(out).row(0, named=True), stats)
    assert found["qrels"][0]["negative_ids"] == ["d1", "d3", "d4", "d5"]
    assert found["answers"][0]["negative_ids"] == ["d4", "d5"]
    assert found["answers"][0]["negative_ranks"] == [4, 5]  # ranks as searched
    assert found["answers"][0]["positive_ids"] == ["d2"]  # answer passages are not positives
    assert found["answers"][1]["answer_passages_removed"] == 2
    with pytest.raises(answers.AnswerError, match="needs --answers"):
        mine.mine_to_file(tmp_path / "index", tmp_path / "enc", tmp_path / "q.parquet",
                          tmp_path / "qrels.parquet", tmp_path / "x.parquet",
                          base | {"negative_filter": "answers"}, seed=0)


def test_bm25_negatives_with_the_answers_filter(tmp_path):
    triples = tmp_path / "triples.tsv.gz"
    with gzip.open(triples, "wt") as handle:
        handle.write("1\t10\t20\n1\t10\t21\n1\t10\t22\n")
    pl.DataFrame({"query_id": ["1"], "text": ["capital of alabama"]}).write_parquet(tmp_path / "q.parquet")
    pl.DataFrame({"query_id": ["1"], "doc_id": ["10"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    write_answers(tmp_path / "answers.parquet", {"1": ["Montgomery"]})
    write_corpus(tmp_path / "corpus.parquet", {"10": "Montgomery", "20": "in Montgomery, Alabama",
                                                "21": "Mobile", "22": "Huntsville"})
    config = {"negatives": {"source": "triples", "count": 30, "seed": 0,
                            "negative_filter": "answers"}}
    stats = bm25.mine_negatives(tmp_path / "q.parquet", tmp_path / "qrels.parquet",
                                tmp_path / "n.parquet", config, triples=triples,
                                answers=tmp_path / "answers.parquet",
                                corpus=tmp_path / "corpus.parquet")
    row = pl.read_parquet(tmp_path / "n.parquet").row(0, named=True)
    assert row["negative_ids"] == ["21", "22"] and stats["answer_passages_removed"] == 1
    manifest = json.loads((tmp_path / "n.manifest.json").read_text())
    assert manifest["params"]["negative_filter"] == "answers"


def test_the_answers_filter_matches_as_the_split_scores(tmp_path, monkeypatch):
    """CuratedTREC's answers are regular expressions (answer_match: regex): a passage Acc@k counts
    as an answer must not be a negative, for FAISS mining and BM25 negatives alike."""
    import faiss

    texts = {"d1": "the answer is 1,024 bytes", "d2": "a positive", "d3": "nothing here"}
    index = faiss.IndexFlatIP(1)
    index.add(np.array([[3], [2], [1]], dtype=np.float32))
    monkeypatch.setattr(mine.faiss_index, "load", lambda folder: (index, pa.array(list(texts))))
    monkeypatch.setattr(mine, "encode_queries",
                        lambda encoder, queries, config: (["1"], np.array([[1]], np.float32)))
    pl.DataFrame({"query_id": ["1"], "doc_id": ["d2"], "relevance": [1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    pl.DataFrame({"query_id": ["1"], "text": ["how big"]}).write_parquet(tmp_path / "q.parquet")
    write_answers(tmp_path / "answers.parquet", {"1": [r"1,?024 bytes"]})
    write_corpus(tmp_path / "corpus.parquet", texts)
    files = {"answers": tmp_path / "answers.parquet", "corpus": tmp_path / "corpus.parquet"}
    triples = tmp_path / "triples.tsv.gz"
    with gzip.open(triples, "wt") as handle:
        handle.write("1\td2\td1\n1\td2\td3\n")
    mined, listed = {}, {}
    for mode in answers.MATCH_MODES:
        policy = {"depth": 3, "rank_window": None, "sample": "top", "num_negatives": None,
                  "exclude_self": False, "use_gpu": "never", "negative_filter": "answers",
                  "answer_match": mode}
        mine.mine_to_file(tmp_path / "index", tmp_path / "enc", tmp_path / "q.parquet",
                          tmp_path / "qrels.parquet", tmp_path / f"m-{mode}.parquet", policy,
                          seed=0, **files)
        mined[mode] = pl.read_parquet(tmp_path / f"m-{mode}.parquet")["negative_ids"][0].to_list()
        config = {"negatives": {"source": "triples", "count": 30, "seed": 0,
                                "negative_filter": "answers", "answer_match": mode}}
        bm25.mine_negatives(tmp_path / "q.parquet", tmp_path / "qrels.parquet",
                            tmp_path / f"n-{mode}.parquet", config, triples=triples, **files)
        listed[mode] = pl.read_parquet(tmp_path / f"n-{mode}.parquet")["negative_ids"][0].to_list()
    # The pattern is no token string: string matching finds nothing; regex drops d1.
    assert mined == {"string": ["d1", "d3"], "regex": ["d3"]}
    assert {m: sorted(n) for m, n in listed.items()} == {"string": ["d1", "d3"], "regex": ["d3"]}
    manifest = json.loads((tmp_path / "n-regex.manifest.json").read_text())
    assert manifest["params"]["answer_match"] == "regex"
    with pytest.raises(answers.AnswerError, match="answer_match 'regexp' unknown"):
        answers.answer_exclusions({"1": ["d1"]}, "answers", files["answers"], files["corpus"],
                                  "regexp")


@pytest.mark.parametrize("mode", answers.MATCH_MODES)
def test_an_answer_found_in_every_passage_removes_no_negative(tmp_path, mode):
    """An answer that DPR's rule finds in every passage (no token; in regex mode a pattern that
    matches the empty text) says nothing about which passages answer the question: followed
    literally it would remove every candidate and leave the question without negatives. The
    filter ignores it and removes what the question's other answers match."""
    texts = {"d1": "Montgomery is the capital", "d2": "a positive", "d3": "Mobile",
             "d4": "Huntsville"}
    everywhere = "" if mode == "string" else "(x)?"
    pl.DataFrame({"query_id": ["1", "2"], "text": ["capital", "city"]}
                 ).write_parquet(tmp_path / "q.parquet")
    pl.DataFrame({"query_id": ["1", "2"], "doc_id": ["d2", "d2"], "relevance": [1, 1]},
                 schema={"query_id": pl.String, "doc_id": pl.String, "relevance": pl.Int32}
                 ).write_parquet(tmp_path / "qrels.parquet")
    write_answers(tmp_path / "answers.parquet", {"1": ["Montgomery", everywhere],
                                                 "2": [everywhere, "\t"]})
    write_corpus(tmp_path / "corpus.parquet", texts)
    assert all(answers.has_answer(t, [everywhere], mode) for t in texts.values())
    triples = tmp_path / "triples.tsv.gz"
    with gzip.open(triples, "wt") as handle:
        handle.write("".join(f"{q}\td2\t{d}\n" for q in "12" for d in ("d1", "d3", "d4")))
    config = {"negatives": {"source": "triples", "count": 30, "seed": 0,
                            "negative_filter": "answers", "answer_match": mode}}
    stats = bm25.mine_negatives(tmp_path / "q.parquet", tmp_path / "qrels.parquet",
                                tmp_path / "n.parquet", config, triples=triples,
                                answers=tmp_path / "answers.parquet",
                                corpus=tmp_path / "corpus.parquet")
    rows = {r["query_id"]: sorted(r["negative_ids"])
            for r in pl.read_parquet(tmp_path / "n.parquet").iter_rows(named=True)}
    assert rows == {"1": ["d3", "d4"], "2": ["d1", "d3", "d4"]}
    assert stats["answer_passages_removed"] == 1


# --- DPR's own negatives (bm25.negatives source: dpr) --------------------------------------------

TRAIN_JSON = ROOT / SAMPLE / "biencoder-nq-train.json"


def naive_dpr_negatives(records, lists, corpus_texts=None, answer_lists=None):
    """{question position: [passage ids]} straight from the JSON: the lists in order, first
    occurrence kept, the question's positives dropped, and (given the corpus texts and answers)
    every passage whose text holds an answer."""
    table = {}
    for position, record in enumerate(records):
        positives = {c["passage_id"] for c in record["positive_ctxs"]}
        ids = []
        for name in lists:
            for context in record.get(name) or []:
                pid = context["passage_id"]
                if pid in positives or pid in ids:
                    continue
                if answer_lists and answers.has_answer(corpus_texts[pid], answer_lists[position]):
                    continue
                ids.append(pid)
        table[str(position)] = ids
    return table


def dpr_negatives(folder, out, biencoder, **policy):
    config = {"negatives": {"source": "dpr", "count": 30, "seed": 0} | policy}
    files = {}
    if policy.get("negative_filter") == "answers":
        files = {"answers": folder / "answers-train.parquet", "corpus": folder / "corpus.parquet"}
    stats = bm25.mine_negatives(folder / "queries-train.parquet", folder / "qrels-train.parquet",
                                out, config, biencoder=biencoder, **files)
    return pl.read_parquet(out), stats


@pytest.mark.parametrize("lists", [["hard_negative_ctxs"], ["negative_ctxs"],
                                   ["hard_negative_ctxs", "negative_ctxs"]])
def test_dpr_negatives_are_the_lists_of_the_training_json(nq, tmp_path, lists):
    records = json.loads(TRAIN_JSON.read_text())
    frame, stats = dpr_negatives(nq, tmp_path / "n.parquet", TRAIN_JSON, dpr_lists=lists)
    expected = naive_dpr_negatives(records, lists)
    assert dict(zip(frame["query_id"], frame["negative_ids"].to_list())) == expected
    for row in frame.iter_rows(named=True):  # ranks: 1-based positions in the joined lists
        joined = [c["passage_id"] for n in lists for c in records[int(row["query_id"])][n]]
        assert [joined.index(d) + 1 for d in row["negative_ids"]] == row["negative_ranks"]
        assert row["positive_ids"] == [c["passage_id"]
                                       for c in records[int(row["query_id"])]["positive_ctxs"]]
    manifest = json.loads((tmp_path / "n.manifest.json").read_text())
    assert manifest["params"]["source"] == "dpr" and manifest["params"]["dpr_lists"] == lists
    assert manifest["inputs"]["biencoder"]["path"] == str(TRAIN_JSON)
    assert stats["negatives"] == sum(map(len, expected.values()))


def test_a_passage_dpr_lists_twice_keeps_its_first_rank(tmp_path):
    """A passage in both lists (or twice in one) is one candidate, ranked at its first place: the
    ranks stay the 1-based positions the naive reference finds, in increasing order."""
    records = json.loads(TRAIN_JSON.read_text())
    hard = records[0]["hard_negative_ctxs"]
    records[0]["negative_ctxs"] = [hard[0], *records[0]["negative_ctxs"], hard[1]]
    records[1]["hard_negative_ctxs"] = [*records[1]["hard_negative_ctxs"],
                                        records[1]["hard_negative_ctxs"][0]]
    edited = tmp_path / "train.json"
    edited.write_text(json.dumps(records))
    entry = NQ_SAMPLE | {"splits": [{"name": "train", "biencoder": {"path": str(edited)}}]}
    datasets.prepare(entry, tmp_path / "nq", data_root=str(tmp_path))
    lists = ["hard_negative_ctxs", "negative_ctxs"]
    frame, _ = dpr_negatives(tmp_path / "nq", tmp_path / "n.parquet", edited, dpr_lists=lists)
    expected = naive_dpr_negatives(records, lists)
    for row in frame.iter_rows(named=True):
        joined = [c["passage_id"] for n in lists for c in records[int(row["query_id"])][n]]
        assert row["negative_ids"] == expected[row["query_id"]]
        assert row["negative_ranks"] == [joined.index(d) + 1 for d in row["negative_ids"]]
        assert row["negative_ranks"] == sorted(row["negative_ranks"])


def test_the_default_dpr_list_is_the_hard_negatives(nq, tmp_path):
    """Tevatron's coCondenser NQ recipe and the Bag-of-Word authors' converter train on DPR's
    hard_negative_ctxs only."""
    frame, _ = dpr_negatives(nq, tmp_path / "n.parquet", TRAIN_JSON)
    expected = naive_dpr_negatives(json.loads(TRAIN_JSON.read_text()), ["hard_negative_ctxs"])
    assert dict(zip(frame["query_id"], frame["negative_ids"].to_list())) == expected


def test_dpr_negatives_are_sampled_by_seed_and_query_not_by_order(nq, tmp_path):
    lists = ["hard_negative_ctxs", "negative_ctxs"]
    pools = naive_dpr_negatives(json.loads(TRAIN_JSON.read_text()), lists)
    samples = {}
    for seed in range(8):
        frame, stats = dpr_negatives(nq, tmp_path / f"s{seed}.parquet", TRAIN_JSON, count=2,
                                     seed=seed, dpr_lists=lists)
        samples[seed] = dict(zip(frame["query_id"], frame["negative_ids"].to_list()))
        for qid, negatives in samples[seed].items():
            # Two of the pool, shown in the lists' order.
            assert len(negatives) == 2 and negatives == [d for d in pools[qid] if d in negatives]
    assert len({tuple(map(tuple, s.values())) for s in samples.values()}) > 1  # seed matters
    again, _ = dpr_negatives(nq, tmp_path / "again.parquet", TRAIN_JSON, count=2, seed=3,
                             dpr_lists=lists)
    assert dict(zip(again["query_id"], again["negative_ids"].to_list())) == samples[3]
    # Another order of the split's queries, and a subset of them: each query's sample unchanged.
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    queries = pl.read_parquet(nq / "queries-train.parquet")
    queries.reverse().write_parquet(shuffled / "queries-train.parquet")
    shutil.copy(nq / "qrels-train.parquet", shuffled / "qrels-train.parquet")
    frame, _ = dpr_negatives(shuffled, tmp_path / "r.parquet", TRAIN_JSON, count=2, seed=3,
                             dpr_lists=lists)
    assert dict(zip(frame["query_id"], frame["negative_ids"].to_list())) == samples[3]
    queries.filter(pl.col("query_id") == "2").write_parquet(shuffled / "queries-train.parquet")
    frame, _ = dpr_negatives(shuffled, tmp_path / "one.parquet", TRAIN_JSON, count=2, seed=3,
                             dpr_lists=lists)
    assert frame.to_dicts()[0]["negative_ids"] == samples[3]["2"]


def test_the_dpr_negatives_manifest_says_whether_count_cut_any_list(tmp_path):
    """queries_sampled counts the lists longer than count (after removals), so sampled down;
    longest_candidate_list is the longest list read: what confirms that a count kept them all."""
    records = json.loads(TRAIN_JSON.read_text())
    for record, keep in zip(records, (3, 2, 1)):  # hard negatives per question
        record["hard_negative_ctxs"] = record["hard_negative_ctxs"][:keep]
    assert len({c["passage_id"] for c in records[0]["hard_negative_ctxs"]}) == 3
    edited = tmp_path / "train.json"
    edited.write_text(json.dumps(records))
    entry = NQ_SAMPLE | {"splits": [{"name": "train", "biencoder": {"path": str(edited)}}]}
    folder = tmp_path / "nq"
    datasets.prepare(entry, folder, data_root=str(tmp_path))
    _, stats = dpr_negatives(folder, tmp_path / "two.parquet", edited, count=2)
    assert stats["queries_sampled"] == 1 and stats["longest_candidate_list"] == 3
    assert stats["queries_with_fewer_negatives"] == 1  # the list of 1; the list of 2 is full
    _, stats = dpr_negatives(folder, tmp_path / "three.parquet", edited, count=3)
    assert stats["queries_sampled"] == 0 and stats["longest_candidate_list"] == 3
    assert stats["queries_with_fewer_negatives"] == 2
    manifest = json.loads((tmp_path / "three.manifest.json").read_text())
    assert manifest["stats"]["queries_sampled"] == 0


def distinctive_word(text, others):
    """The longest alphabetic word of `text` that none of `others` holds (ties: alphabetical)."""
    seen = {w for other in others for w in answers.tokens(other)}
    words = sorted({w for w in answers.tokens(text) if w.isalpha() and w not in seen},
                   key=lambda w: (-len(w), w))
    return words[0]


def test_the_answers_filter_removes_dpr_negatives_that_hold_an_answer(tmp_path):
    """The training JSON edited so that the answers name passages DPR lists as negatives: those
    are removed (the naive reference agrees); a question left with none, or listed with none,
    gets an empty row, counted, as a BM25 query without hits."""
    records = json.loads(TRAIN_JSON.read_text())
    texts = {r["doc_id"]: r["text"] for r in datasets_corpus()}
    # Question 1: an answer only its second hard negative holds.
    hard = [c["passage_id"] for c in records[1]["hard_negative_ctxs"]]
    target = hard[1]
    others = [texts[d] for d in hard if d != target]
    others += [texts[c["passage_id"]] for c in records[1]["positive_ctxs"]]
    records[1]["answers"] = records[1]["answers"] + [distinctive_word(texts[target], others)]
    # Question 0: an answer in each of its listed passages; question 2: no list at all.
    records[0]["answers"] = records[0]["answers"] + [
        distinctive_word(texts[c["passage_id"]], []) for c in records[0]["hard_negative_ctxs"]]
    records[2]["hard_negative_ctxs"] = []
    edited = tmp_path / "train.json"
    edited.write_text(json.dumps(records))
    entry = NQ_SAMPLE | {"splits": [{"name": "train", "biencoder": {"path": str(edited)}}]}
    folder = tmp_path / "nq"
    datasets.prepare(entry, folder, data_root=str(tmp_path))
    answer_lists = [r["answers"] for r in records]
    found = {}
    for policy in ("qrels", "answers"):
        frame, stats = dpr_negatives(folder, tmp_path / f"{policy}.parquet", edited,
                                     negative_filter=policy)
        found[policy] = (dict(zip(frame["query_id"], frame["negative_ids"].to_list())), stats)
    unfiltered = naive_dpr_negatives(records, ["hard_negative_ctxs"])
    filtered = naive_dpr_negatives(records, ["hard_negative_ctxs"], texts, answer_lists)
    assert found["qrels"][0] == unfiltered and found["answers"][0] == filtered
    assert target in unfiltered["1"] and target not in filtered["1"]
    assert filtered["0"] == [] and filtered["2"] == [] and unfiltered["0"]
    removed = sum(len(unfiltered[q]) - len(filtered[q]) for q in unfiltered)
    assert found["answers"][1]["answer_passages_removed"] == removed > 0
    assert found["answers"][1]["queries_with_fewer_negatives"] == 3  # every one below 30
    assert found["answers"][1]["queries"] == 3


def datasets_corpus():
    return [{"doc_id": i, "text": t} for i, t, _ in
            csv.reader(open(ROOT / SAMPLE / "psgs_w100.tsv", encoding="utf-8"),
                       delimiter="\t")][1:]


def test_dpr_negatives_need_the_splits_biencoder_file(nq, tmp_path):
    with pytest.raises(bm25.ConfigError, match="needs --biencoder"):
        dpr_negatives(nq, tmp_path / "n.parquet", None)
    # Another file (its questions in another order) would pair questions with others' lists.
    records = json.loads(TRAIN_JSON.read_text())
    (tmp_path / "other.json").write_text(json.dumps(records[::-1]))
    with pytest.raises(bm25.ConfigError, match="file the split was built from"):
        dpr_negatives(nq, tmp_path / "n.parquet", tmp_path / "other.json")
    with pytest.raises(bm25.ConfigError, match="dpr_lists"):
        dpr_negatives(nq, tmp_path / "n.parquet", TRAIN_JSON, dpr_lists=["positive_ctxs"])


@pytest.mark.parametrize("question", [7, {"q": 1}, ["q"]])
def test_dpr_negatives_refuse_a_non_string_question_naming_the_file_and_record(
        nq, tmp_path, question):
    """A mismatched biencoder file whose question is a number or an object raised a bare
    TypeError (slicing it for the mismatch message); refused, naming the file and record."""
    records = json.loads(TRAIN_JSON.read_text())
    records[1]["question"] = question
    (tmp_path / "other.json").write_text(json.dumps(records))
    with pytest.raises(DatasetError, match=re.escape(
            "other.json, question 1: the question must be a string, got ")):
        dpr_negatives(nq, tmp_path / "n.parquet", tmp_path / "other.json")


@pytest.mark.parametrize("negatives, expected", [
    ({"dataset": "scifact", "split": "test", "source": "dpr", "count": 30},
     r"bm25\.negatives\.1\.source.*'scifact' is format beir"),
    ({"dataset": "nq-sample", "split": "test", "source": "dpr", "count": 30},
     r"bm25\.negatives\.1\.split.*split 'test' of 'nq-sample' is a qa\.csv"),
    ({"dataset": "nq-sample", "split": "train", "source": "bm25", "count": 30,
      "dpr_lists": ["hard_negative_ctxs"]},
     r"bm25\.negatives\.1\.dpr_lists.*read only by source dpr"),
])
def test_source_dpr_is_refused_where_no_dpr_training_file_lists_negatives(negatives, expected):
    from retrieval_pretraining import config as experiment_config
    from retrieval_pretraining import config_checks
    import yaml

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["datasets"].append(NQ_SAMPLE)
    config["bm25"]["negatives"].append(negatives)
    with pytest.raises(experiment_config.ConfigError, match=expected):
        config_checks.validate(config)
    config["bm25"]["negatives"][-1] = {"dataset": "nq-sample", "split": "train", "source": "dpr",
                                       "count": 30, "dpr_lists": ["hard_negative_ctxs"]}
    config_checks.validate(config)


# --- the workflow: an NQ-format dataset evaluated with Acc@20 (planned jobs only) ----------------


BM25_NEGATIVES = {"dataset": "nq-sample", "split": "train", "source": "bm25", "depth": 200,
                  "count": 30}


def nq_project(folder: Path, splits: list[dict], negatives: dict = BM25_NEGATIVES) -> Path:
    """A project whose one dataset is the NQ sample: `negatives` (BM25 ones) and fine-tuning on its
    train split, `splits` evaluated, a table of Acc@20."""
    return copy_project(folder, {
        "datasets": [NQ_SAMPLE | {"downloads": [
            {"file": "nq-dev.qa.csv", "url": "https://dl.fbaipublicfiles.com/dpr/data/retriever/"
             "nq-dev.qa.csv", "md5": None}]}],
        "bm25": {"negatives": [negatives]},
        "finetune": {"datasets": [{"dataset": "nq-sample", "split": "train"}]},
        # No baselines: theirs are published on SciFact, a dataset this project does not have.
        "evaluate": {"baselines": [], "splits": splits},
        # No t-SNE: the demo's is of SciFact, which this project does not have.
        "report": {"analysis": {"tsne": None}, "tables": [{"name": "main", "rows": None,
                   "columns": [{"dataset": "nq-sample", "split": "test", "measure": "Acc@20"}]}]},
    })


def test_a_dry_run_plans_an_nq_format_dataset_scored_by_answers(tmp_path):
    project = nq_project(tmp_path / "project", [
        {"dataset": "nq-sample", "split": "test", "measures": ["Acc@20", "Acc@100"]}])
    metrics = "results/metrics/nq-sample/bm25/test.json"
    assert planned_rules(project, metrics) == {
        "prepare_dataset": 1, "prepare_dataset_split": 1, "prepare_dataset_answers": 1,
        "build_bm25_index": 1, "bm25_search": 1, "publish_bm25_run": 1, "score_run": 1,
    }
    negatives = planned_rules(project, "results/bm25/nq-sample/negatives.parquet")
    assert negatives["prepare_dataset_answers"] == 1  # the train split's answers filter them
    mined = planned_rules(project, "results/finetune/bert/nq-sample/stage1/hard-negatives.parquet")
    assert mined["mine_hard_negatives"] == 1 and mined["prepare_dataset_answers"] == 1


def test_a_dry_run_plans_dpr_negatives_from_the_splits_training_json(tmp_path):
    """source: dpr reads the biencoder file the train split was built from: no BM25 index."""
    from workflow_harness import plan_of, snakemake

    negatives = {"dataset": "nq-sample", "split": "train", "source": "dpr", "count": 30}
    project = nq_project(tmp_path / "project", [
        {"dataset": "nq-sample", "split": "test", "measures": ["Acc@20"]}], negatives)
    plan = snakemake(project, "--dry-run", "--printshellcmds",
                     "results/bm25/nq-sample/negatives.parquet")
    output = plan.stdout + plan.stderr
    counts = plan_of(output)
    assert counts["bm25_negatives"] == 1 and "build_bm25_index" not in counts
    assert counts["prepare_dataset_answers"] == 1  # the answers filter (format dpr: auto)
    commands = [line for line in output.splitlines() if "bm25 negatives" in line]
    assert len(commands) == 1 and "--index" not in commands[0]
    assert re.search(r"--biencoder \S*data/dpr-sample/biencoder-nq-train\.json ", commands[0])
    assert '"source":"dpr"' in commands[0] and '"negative_filter":"answers"' in commands[0]


def negatives_commands(project, targets) -> list[str]:
    """The planned shell commands of the jobs that filter negatives by answers (BM25 negatives
    and mining) on the way to `targets`."""
    from workflow_harness import snakemake

    plan = snakemake(project, "--dry-run", "--printshellcmds", *targets)
    return [line for line in (plan.stdout + plan.stderr).splitlines()
            if "retrieval_pretraining.mine " in line or "bm25 negatives" in line]


def test_negatives_jobs_match_answers_as_the_datasets_splits_score(tmp_path):
    """A dataset scored with answer_match: regex (CuratedTREC) has its negatives filtered with
    regex matching too, by mining and BM25 alike; splits that disagree are refused."""
    from workflow_harness import snakemake

    splits = [{"dataset": "nq-sample", "split": "test", "measures": ["Acc@20"],
               "answer_match": "regex"}]
    project = nq_project(tmp_path / "project", splits)
    targets = ("results/bm25/nq-sample/negatives.parquet",
               "results/finetune/bert/nq-sample/stage1/hard-negatives.parquet")
    commands = negatives_commands(project, targets)
    assert len(commands) == 2 and all('"answer_match":"regex"' in c for c in commands), commands
    splits.append(splits[0] | {"split": "dev", "answer_match": "string"})
    project = nq_project(tmp_path / "disagree", splits)
    config = yaml.safe_load((project / "config.yaml").read_text())  # a dev split to disagree on
    config["datasets"][0]["splits"].append(
        {"name": "dev", "questions": {"download": "nq-dev.qa.csv"}})
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    failed = snakemake(project, "--dry-run", targets[0], check=False)
    assert failed.returncode != 0 and "disagree on answer_match" in failed.stdout + failed.stderr


def test_an_alias_fine_tuned_but_not_scored_matches_answers_as_its_collection_is_scored(
        tmp_path):
    """An alias (same_as) has its source's answers: fine-tuned but not evaluated itself, its
    negatives were filtered by plain string match while its source's Acc@k matched by regex."""
    project = nq_project(tmp_path / "project", [
        {"dataset": "nq-sample", "split": "test", "measures": ["Acc@20"],
         "answer_match": "regex"}])
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["datasets"].append({"name": "nq-alias", "same_as": "nq-sample"})
    config["bm25"]["negatives"].append(config["bm25"]["negatives"][0] | {"dataset": "nq-alias"})
    config["finetune"]["datasets"].append({"dataset": "nq-alias", "split": "train"})
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    targets = ("results/bm25/nq-alias/negatives.parquet",
               "results/finetune/bert/nq-alias/stage1/hard-negatives.parquet")
    commands = negatives_commands(project, targets)
    assert len(commands) == 2 and all("nq-alias" in c for c in commands), commands
    assert all('"answer_match":"regex"' in c for c in commands), commands


def test_a_dataset_s_mining_override_sets_its_negative_filter_for_mining_and_bm25_alike(tmp_path):
    """mining.overrides may give one dataset another negative_filter (qrels on NQ, to measure
    the answers filter): its BM25 negatives and mining jobs both get it, and read no answers."""
    from workflow_harness import plan_of, snakemake

    project = nq_project(tmp_path / "project", [
        {"dataset": "nq-sample", "split": "test", "measures": ["Acc@20"]}])
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["mining"]["overrides"] = [{"dataset": "nq-sample", "negative_filter": "qrels"}]
    (project / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    targets = ("results/bm25/nq-sample/negatives.parquet",
               "results/finetune/bert/nq-sample/stage1/hard-negatives.parquet")
    plan = snakemake(project, "--dry-run", "--printshellcmds", *targets)
    output = plan.stdout + plan.stderr
    commands = [line for line in output.splitlines()
                if "retrieval_pretraining.mine " in line or "bm25 negatives" in line]
    assert len(commands) == 2, commands
    assert all('"negative_filter":"qrels"' in c and "--answers" not in c for c in commands)
    assert "prepare_dataset_answers" not in plan_of(output)


def test_biencoder_questions_without_positives_count_as_queries_without_qrels(tmp_path):
    """Every question is kept (scored by answers); one with no positive passage has no qrels, and
    the manifests say so (they used to report 0 queries without qrels). A question keeps every
    positive it names, a repeat once."""
    positives = [{"passage_id": "1"}, {"passage_id": "2"}, {"passage_id": "1"}]
    records = [{"question": "q0", "answers": ["a"], "positive_ctxs": positives},
               {"question": "q1", "answers": ["b"], "positive_ctxs": []}]
    (tmp_path / "train.json").write_text(json.dumps(records))
    entry = {"name": "mini-qa", "format": "dpr", "title": "space", "exclude_query_id": False,
             "corpus": {"path": str(tmp_path / "psgs.tsv")},
             "splits": [{"name": "train", "biencoder": {"path": str(tmp_path / "train.json")}}]}
    pl.DataFrame({"doc_id": ["1", "2"]}).write_parquet(tmp_path / "corpus.parquet")
    stats = datasets.prepare_split(entry, "train", tmp_path, data_root=str(tmp_path))
    assert stats["queries"] == 2 and stats["questions_without_positives"] == 1
    assert stats["queries_without_qrels"] == 1
    assert stats["qrels"] == 2 and stats["repeated_positives"] == 1
    qrels = pl.read_parquet(tmp_path / "qrels-train.parquet")
    assert set(zip(qrels["query_id"], qrels["doc_id"])) == {("0", "1"), ("0", "2")}
    assert qrels.height == 2
