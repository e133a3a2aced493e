"""Scoring: metric values against hand-computed examples, trec_eval -c semantics, loud failures."""

import json
import math
from pathlib import Path

import pytest

from retrieval_pretraining import evaluate

QRELS = """\
q1 0 d1 1
q1 0 d3 1
q2 0 d2 2
q2 0 d5 1
q3 0 d9 1
q4 0 d7 1
"""
# q1: relevant at ranks 2 and 4; q2: grade 1 at rank 1, grade 2 at rank 2; q3 absent from the run;
# q4: its only relevant document at rank 11 (outside every @10 cutoff).
RUN = """\
q1 Q0 d2 1 9.0 t
q1 Q0 d1 2 8.0 t
q1 Q0 d4 3 7.0 t
q1 Q0 d3 4 6.0 t
q2 Q0 d5 1 5.0 t
q2 Q0 d2 2 4.0 t
""" + "".join(f"q4 Q0 x{i} {i} {20 - i}.0 t\n" for i in range(1, 11)) + "q4 Q0 d7 11 1.0 t\n"


def log2(x):
    return math.log(x, 2)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "qrels.txt").write_text(QRELS)
    (tmp_path / "run.trec").write_text(RUN)
    return tmp_path / "run.trec", tmp_path / "qrels.txt"


def test_values_match_hand_computation(files):
    run, qrels = files
    result = evaluate.evaluate(run, qrels, None, {"measures": ["RR@10", "R@2", "nDCG@10", "R@100"]})
    per = result["per_query"]
    # Reciprocal rank with its cutoff: q4's relevant at rank 11 gives 0, not 1/11.
    assert per["RR@10"] == {"q1": 0.5, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert per["R@2"] == {"q1": 0.5, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert per["R@100"]["q4"] == 1.0
    # trec_eval nDCG: linear gains, log2(rank + 1) discounts.
    ndcg_q1 = (1 / log2(3) + 1 / log2(5)) / (1 + 1 / log2(3))
    ndcg_q2 = (1 + 2 / log2(3)) / (2 + 1 / log2(3))
    assert per["nDCG@10"]["q1"] == pytest.approx(ndcg_q1, abs=1e-9)
    assert per["nDCG@10"]["q2"] == pytest.approx(ndcg_q2, abs=1e-9)
    # Every qrels query counts in the mean, answered or not (trec_eval -c).
    assert result["aggregate"]["RR@10"] == pytest.approx(1.5 / 4)
    assert result["aggregate"]["nDCG@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 4)
    assert result["queries"] == 4 and result["queries_missing_from_run"] == 1


def test_relevance_level_applies_to_binary_measures_only(files):
    run, qrels = files
    result = evaluate.evaluate(
        run, qrels, None, {"measures": ["RR@10", "R@1", "nDCG@10"], "relevance_level": 2}
    )
    assert result["measures"] == ["RR(rel=2)@10", "R(rel=2)@1", "nDCG@10"]
    # q2's only grade-2 document is at rank 2; q1 and q4 have no grade-2 document at all.
    assert result["per_query"]["RR(rel=2)@10"]["q2"] == 0.5
    assert result["per_query"]["R(rel=2)@1"]["q2"] == 0.0
    # nDCG keeps the graded gains whatever the level.
    assert result["per_query"]["nDCG@10"]["q2"] == pytest.approx(
        (1 + 2 / log2(3)) / (2 + 1 / log2(3))
    )


def test_cli_writes_the_scores_contract(files, tmp_path):
    run, qrels = files
    out = tmp_path / "metrics" / "test.json"
    evaluate.main(
        [
            "--run",
            str(run),
            "--qrels",
            str(qrels),
            "--out",
            str(out),
            "--config",
            json.dumps({"measures": ["nDCG@10", "R@100"]}),
        ]
    )
    scores = json.loads(out.read_text())
    assert {"aggregate", "per_query", "run", "qrels", "measures"} <= set(scores)
    assert set(scores["aggregate"]) == {"nDCG@10", "R@100"} == set(scores["per_query"])
    assert scores["run"] == str(run)


def test_the_metrics_record_the_queries_the_run_and_qrels_do_not_share(files, tmp_path, capsys):
    """q3 is judged but not in the run (scores 0), q0 and q9 are in the run but not judged (not
    scored): a warning alone was lost once the log was; the metrics file counts both sides with
    example ids, and its audit shows them."""
    from retrieval_pretraining import audit

    run, qrels = files
    extra = tmp_path / "extra.trec"
    extra.write_text(run.read_text() + "q9 Q0 d1 1 2.0 t\nq0 Q0 d3 1 1.0 t\n")
    out = tmp_path / "metrics" / "test.json"
    evaluate.main(["--run", str(extra), "--qrels", str(qrels), "--out", str(out),
                   "--config", json.dumps({"measures": ["nDCG@10"]})])
    scores = json.loads(out.read_text())
    assert scores["queries_missing_from_run"] == 1
    assert scores["queries_missing_from_run_examples"] == ["q3"]
    assert scores["run_queries_without_qrels"] == 2
    assert scores["run_queries_without_qrels_examples"] == ["q0", "q9"]  # sorted, not file order
    assert set(scores["per_query"]["nDCG@10"]) == {"q1", "q2", "q3", "q4"}
    capsys.readouterr()
    assert audit.main([str(out)]) == 0
    shown = capsys.readouterr().out
    assert "qrels queries the run does not answer (each scores 0): 1, e.g. ['q3']" in shown
    assert "run queries without qrels (not scored, as trec_eval): 2, e.g. ['q0', 'q9']" in shown


def test_the_example_ids_are_capped(tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"j{i:02d} 0 d1 1\n" for i in range(20)))
    run = tmp_path / "run.trec"
    run.write_text("j00 Q0 d1 1 1.0 t\n" + "".join(f"u{i:02d} Q0 d1 1 1.0 t\n" for i in range(30)))
    scores = evaluate.evaluate(run, qrels, None, {"measures": ["R@1"]})
    assert scores["queries_missing_from_run"] == 19 and scores["run_queries_without_qrels"] == 30
    assert scores["queries_missing_from_run_examples"] == [f"j{i:02d}" for i in range(1, 6)]
    assert scores["run_queries_without_qrels_examples"] == [f"u{i:02d}" for i in range(5)]


@pytest.mark.parametrize(
    "line, message",
    [
        ("q1 Q0 d1 1 3.0", "5 fields"),
        ("q1 Q0 d1 one 3.0 t", "rank 'one'"),
        ("q1 Q0 d1 1.5 3.0 t", "rank '1.5'"),
        ("q1 Q0 d1 1 high t", "score 'high'"),
        ("q1 Q0 d1 1 nan t", "not finite"),
        ("q1 Q0 d1 1 inf t", "not finite"),
        ("q1 Q0 d1 1 -Infinity t", "not finite"),
        # A doc id holding a space: its line has a field too many, it must not be read as
        # another document nor fail as a bare unpacking error.
        ("q1 Q0 my doc 1 3.0 t", "7 fields"),
    ],
)
def test_malformed_run_lines_fail_naming_the_line(tmp_path, files, line, message):
    _, qrels = files
    run = tmp_path / "bad.trec"
    run.write_text("q1 Q0 d9 1 4.0 t\n" + line + "\n")
    with pytest.raises(evaluate.EvaluationError, match=rf"bad\.trec, line 2: .*{message}"):
        evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})


def test_duplicate_documents_empty_runs_and_disjoint_runs_fail(tmp_path, files):
    _, qrels = files
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d1 2 1.0 t\n")
    with pytest.raises(evaluate.EvaluationError, match="line 2: document d1 is ranked twice"):
        evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})
    run.write_text("\n")
    with pytest.raises(evaluate.EvaluationError, match="is empty"):
        evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})
    run.write_text("other Q0 d1 1 2.0 t\n")
    with pytest.raises(evaluate.EvaluationError, match="none of its 1 queries appear in the qrels"):
        evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})
    with pytest.raises(evaluate.EvaluationError, match="does not exist"):
        evaluate.evaluate(tmp_path / "missing.trec", qrels, None, {"measures": ["nDCG@10"]})


def test_malformed_qrels_and_unknown_measures_fail(tmp_path, files):
    run, _ = files
    qrels = tmp_path / "bad-qrels.txt"
    qrels.write_text("q1 0 d1 1\nq1 0 d2\n")
    with pytest.raises(evaluate.EvaluationError, match="bad-qrels.txt, line 2: 3 fields"):
        evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})
    qrels.write_text("q1 0 d1 yes\n")
    with pytest.raises(evaluate.EvaluationError, match="relevance 'yes'"):
        evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})
    # A fifth column (a doc id holding a space, or another format's extra field) would shift
    # which field is read as the grade.
    qrels.write_text("q1 0 d1 1\nq1 0 d 2 1\n")
    with pytest.raises(evaluate.EvaluationError, match="bad-qrels.txt, line 2: 5 fields"):
        evaluate.read_qrels(qrels)
    qrels.write_text("\n")
    with pytest.raises(evaluate.EvaluationError, match="bad-qrels.txt is empty"):
        evaluate.read_qrels(qrels)
    with pytest.raises(evaluate.EvaluationError, match="nDGC@10"):
        evaluate.parse_measures(["nDGC@10"])


def test_parquet_qrels_keep_their_grades_and_name_a_missing_column(files, tmp_path):
    """The canonical qrels-{split}.parquet scores as the same judgements in TREC text do, graded
    (nDCG's gains, a relevance level of 2), and one without a column fails naming it."""
    import polars as pl

    run, text = files
    rows = [line.split() for line in QRELS.splitlines()]
    frame = pl.DataFrame({"query_id": [r[0] for r in rows], "doc_id": [r[2] for r in rows],
                          "relevance": [int(r[3]) for r in rows]},
                         schema={"query_id": pl.String, "doc_id": pl.String,
                                 "relevance": pl.Int32})
    parquet = tmp_path / "qrels-test.parquet"
    frame.write_parquet(parquet)
    config = {"measures": ["nDCG@10", "R@2"], "relevance_level": 2}
    from_text = evaluate.evaluate(run, text, None, config)
    from_parquet = evaluate.evaluate(run, parquet, None, config)
    assert from_parquet["per_query"] == from_text["per_query"]
    assert from_parquet["per_query"]["R(rel=2)@2"] == {"q1": 0.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    frame.drop("relevance").write_parquet(parquet)
    with pytest.raises(evaluate.EvaluationError, match=r"missing columns \['relevance'\]"):
        evaluate.read_qrels(parquet)


def test_qrels_judging_a_pair_twice_fail_naming_the_line_or_row(files, tmp_path):
    """trec_eval refuses qrels that judge a document twice for one query. Read as given, the
    pair scored with its last grade in R@k and nDCG (pytrec_eval) and as relevant if any grade
    is in RR@k (ir_measures' own), so one row of a table mixed two judgements; the datasets'
    own qrels judge each pair once, a qrels file passed by hand need not."""
    import polars as pl

    run, _ = files
    qrels = tmp_path / "twice.txt"
    qrels.write_text("q1 0 d1 1\nq1 0 d3 1\n\nq1 0 d1 0\nq2 0 d2 2\n")
    with pytest.raises(evaluate.EvaluationError,
                       match=r"twice\.txt, line 4: document d1 is judged twice for query q1"):
        evaluate.evaluate(run, qrels, None, {"measures": ["RR@10", "R@10"]})
    parquet = tmp_path / "twice.parquet"
    pl.DataFrame({"query_id": ["q1", "q2", "q1"], "doc_id": ["d1", "d1", "d1"],
                  "relevance": [1, 1, 0]}).write_parquet(parquet)
    with pytest.raises(evaluate.EvaluationError,
                       match=r"twice\.parquet, row 3: document d1 is judged twice for query q1"):
        evaluate.read_qrels(parquet)
    qrels.write_text("q1 0 d1 1\nq2 0 d1 0\n")  # one document judged for two queries
    assert len(evaluate.read_qrels(qrels)) == 2


@pytest.mark.parametrize("relevance, said", [
    ([1, None], "row 2: document d3 of query q1 has no relevance (null)"),
    (["high", "1"], "row 1: relevance 'high' of query q1, document d1 is not an integer"),
    (["1", "2"], "row 1: relevance '1' of query q1, document d1 is not an integer"),
    ([True, False], "row 1: relevance True of query q1, document d1 is not an integer"),
    ([1.0, 0.5], "row 2: relevance 0.5 of query q1, document d3 is not an integer"),
    ([1.0, float("inf")], "row 2: relevance inf of query q1, document d3 is not an integer")])
def test_a_parquet_qrels_row_without_an_integer_relevance_fails_naming_it(files, tmp_path,
                                                                        relevance, said):
    """int() of a null relevance was a bare TypeError in scoring (of a word, a ValueError),
    naming neither the file nor the row: one line naming both, and the query and document. A
    fractional grade was truncated silently (0.5 judged not relevant), where the TREC text
    reader refuses it; an infinite one was a bare OverflowError. A grade stored as a string
    ("1") or a boolean was taken as its int(): a column of another type than the prepare
    stage's integers, so a qrels file this workflow did not write. A float column's whole
    grades (1.0) are grades."""
    import polars as pl

    run, _ = files
    parquet = tmp_path / "qrels.parquet"
    pl.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["d1", "d3"],
                  "relevance": relevance}).write_parquet(parquet)
    with pytest.raises(evaluate.EvaluationError) as refused:
        evaluate.evaluate(run, parquet, None, {"measures": ["RR@10"]})
    message = str(refused.value)
    assert message.startswith(f"{parquet}, {said}") and "\n" not in message, message
    assert message.endswith("; give every judged pair an integer grade"), message
    if isinstance(relevance[0], float):
        pl.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["d1", "d3"],
                      "relevance": [1.0, 2.0]}).write_parquet(parquet)
        assert [q.relevance for q in evaluate.read_qrels(parquet)] == [1, 2]


@pytest.mark.parametrize("dtype", ["Int8", "Int32", "Int64", "UInt8", "UInt64"])
def test_a_parquet_qrels_integer_column_of_any_width_is_read_as_its_grades(tmp_path, dtype):
    """The prepare stage writes int32 grades (`dataset_files.read_qrels_file`, `dpr_dataset`);
    a qrels file written by another tool may hold int64 or another integer width: all are
    grades, while a string or boolean column is refused (above)."""
    import polars as pl

    parquet = tmp_path / "qrels.parquet"
    pl.DataFrame({"query_id": ["q1", "q1", "q2"], "doc_id": ["d1", "d3", "d2"],
                  "relevance": [1, 0, 2]},
                 schema_overrides={"relevance": getattr(pl, dtype)}).write_parquet(parquet)
    grades = [q.relevance for q in evaluate.read_qrels(parquet)]
    assert grades == [1, 0, 2] and all(type(grade) is int for grade in grades)


def test_a_parquet_qrels_decimal_column_s_whole_grades_are_grades(tmp_path):
    """A DECIMAL column (a database's export) holds Decimals: whole ones are grades, as int()
    took them before strings and booleans were refused; a fraction is refused as a float's."""
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "qrels.parquet"
    for scale in (0, 2):
        grades = pa.array([Decimal(1), Decimal(0), Decimal(2)], pa.decimal128(5, scale))
        pq.write_table(pa.table({"query_id": ["q1", "q1", "q2"], "doc_id": ["d1", "d3", "d2"],
                                 "relevance": grades}), parquet)
        read = [q.relevance for q in evaluate.read_qrels(parquet)]
        assert read == [1, 0, 2] and all(type(grade) is int for grade in read)
    pq.write_table(pa.table({"query_id": ["q1"], "doc_id": ["d1"],
                             "relevance": pa.array([Decimal("0.50")], pa.decimal128(5, 2))}),
                   parquet)
    with pytest.raises(evaluate.EvaluationError, match=r"row 1: relevance Decimal\('0\.50'\) of"):
        evaluate.read_qrels(parquet)


@pytest.mark.parametrize("column", ["query_id", "doc_id"])
def test_a_parquet_qrels_row_with_a_null_id_fails_naming_it(files, tmp_path, column):
    """str() of a null id was the id 'None': a judged query no run answers (scored 0 in every
    mean) or a relevant document no run retrieves (lost recall), silently. One line naming the
    file, the row and the column."""
    import polars as pl

    run, _ = files
    parquet = tmp_path / "qrels.parquet"
    ids = {"query_id": ["q1", "q1"], "doc_id": ["d1", "d3"]}
    ids[column][1] = None
    pl.DataFrame(ids | {"relevance": [1, 1]}).write_parquet(parquet)
    with pytest.raises(evaluate.EvaluationError) as refused:
        evaluate.evaluate(run, parquet, None, {"measures": ["RR@10"]})
    message = str(refused.value)
    assert message.startswith(f"{parquet}, row 2: {column} is null; ") and "\n" not in message, \
        message


def test_the_run_depth_is_the_deepest_querys_wherever_it_stands(files, tmp_path):
    """rules/evaluate.smk and the shallow-run warning read `run_depth`: the most hits of any
    query, not of the last one read (q4's 11 hits come first here)."""
    _, qrels = files
    run = tmp_path / "run.trec"
    lines = RUN.splitlines(keepends=True)
    run.write_text("".join(lines[6:] + lines[:6]))  # q4, then q1 (4 hits), then q2 (2)
    assert evaluate.evaluate(run, qrels, None, {"measures": ["R@100"]})["run_depth"] == 11


def test_a_run_with_a_byte_that_is_not_utf8_fails_naming_the_line(tmp_path, files, capsys):
    """A Latin-1 byte in a run (an editor's re-save): one error line naming the file, the line, the
    byte and the fix, exit 1 (it was a bare UnicodeDecodeError); every reader of runs (and of
    TREC qrels) says the same."""
    from retrieval_pretraining import audit
    from retrieval_pretraining.analysis import tsne

    _, qrels = files
    run = tmp_path / "latin1.trec"
    run.write_bytes("q1 Q0 d1 1 2.0 t\nq1 Q0 caf\u00e9 2 1.0 t\n".encode("latin-1"))
    out = tmp_path / "metrics.json"
    with pytest.raises(SystemExit) as stopped:
        evaluate.main(["--run", str(run), "--qrels", str(qrels), "--out", str(out),
                       "--config", json.dumps({"measures": ["nDCG@10"]})])
    assert stopped.value.code == 1 and not out.exists()
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert error == (
        f"error: {run}, line 2: byte 0xe9 at column 10 is not valid UTF-8 (a TREC run is UTF-8 text); "
        "re-save the file as UTF-8, or rerun the step that wrote it"
    )
    with pytest.raises(ValueError, match=r"latin1\.trec, line 2: byte 0xe9 .* re-save the file"):
        tsne.read_run(run, depth=10)
    with pytest.raises(audit.NotAnArtifact, match=r"latin1\.trec, line 2: byte 0xe9"):
        audit.audit(run)
    qrels_text = tmp_path / "latin1-qrels.txt"
    qrels_text.write_bytes(b"q1 0 d1 1\nq1 0 d\xff 1\n")
    with pytest.raises(evaluate.EvaluationError, match=r"qrels\.txt, line 2: byte 0xff .*qrels"):
        evaluate.read_qrels(qrels_text)


# Ids holding a character Python's str.split() takes for whitespace and trec_eval (C's isspace:
# space, \t, \n, \v, \f, \r) does not: a no-break space, an ideographic space, a file separator.
UNICODE_SPACED = ["d\u00a0nbsp", "d\u3000ideo", "d\x1cfs"]


def test_ids_holding_unicode_spaces_round_trip_through_both_run_writers_and_every_reader(tmp_path):
    """trec_eval reads a run's and qrels' fields between ASCII whitespace, so a doc id holding
    U+00A0 or U+3000 is one id to it; str.split() made it two fields, and a legal run that both
    writers write (BM25's ids from Anserini, dense ids from the index) failed as malformed in
    scoring, the audit and t-SNE. Each reader gets back the ids written, scored as trec_eval
    scores them."""
    import numpy as np

    from retrieval_pretraining import audit, bm25, dense_search
    from retrieval_pretraining.analysis import tsne

    ids = UNICODE_SPACED + ["d4"]
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"q\u00a0{i} 0 {d} 1\n" for i, d in enumerate(UNICODE_SPACED)),
                     encoding="utf-8")
    # Query i ranks UNICODE_SPACED[i] at rank i + 1 (after the other ids, in list order).
    rankings = [(f"q\u00a0{i}", [d for d in ids if d != ids[i]][:i] + [ids[i]]
                 + [d for d in ids if d != ids[i]][i:]) for i in range(len(UNICODE_SPACED))]
    dense_run, bm25_run = tmp_path / "dense.trec", tmp_path / "bm25.trec"
    dense_search.write_trec(dense_run, [
        (q, docs, np.linspace(1, 0, len(docs), dtype=np.float32), np.arange(1, len(docs) + 1))
        for q, docs in rankings], "dense")
    bm25.write_run(bm25_run, [(q, [(d, 10.0 - r) for r, d in enumerate(docs)])
                              for q, docs in rankings])
    for run in (dense_run, bm25_run):
        result = evaluate.evaluate(run, qrels, None, {"measures": ["RR@10", "R@1"]})
        assert result["per_query"]["RR@10"] == {"q\u00a00": 1.0, "q\u00a01": 0.5,
                                                "q\u00a02": pytest.approx(1 / 3)}
        assert result["queries_missing_from_run"] == result["run_queries_without_qrels"] == 0
        assert tsne.read_run(run, depth=10) == dict(rankings)
        checked = audit.audit(run)
        assert checked.passed, checked.render()
    assert [q.doc_id for q in evaluate.read_qrels(qrels)] == UNICODE_SPACED


def test_trec_fields_split_where_c_isspace_does_and_nowhere_else():
    """Every code point against bytes.split(), which splits on C's isspace in the C locale
    (space, \\t, \\n, \\v, \\f, \\r): what trec_eval's parser splits a line on."""
    from retrieval_pretraining.contracts.runs import trec_fields

    for point in range(0x110000):
        if 0xD800 <= point < 0xE000:
            continue  # surrogates: no UTF-8 file holds them
        char = chr(point)
        line = f" a{char}b\tc{char}\n"
        expected = [f.decode() for f in line.encode().split()]
        assert trec_fields(line) == expected, hex(point)


def test_scoring_time_grows_linearly_with_the_queries():
    """8x the queries costs ~8x the time: the per-query clean-up once rebuilt the set of judged
    queries for every scored query (O(queries^2): 112 s for 30,000 queries, issue 17)."""
    import time

    from ir_measures import Qrel, ScoredDoc

    def seconds(n: int) -> float:
        qrels = [Qrel(f"q{i}", f"d{i}", 1) for i in range(n)]
        run = [ScoredDoc(f"q{i}", f"d{i + k}", 1.0 / (k + 1)) for i in range(n) for k in range(3)]
        measures = evaluate.parse_measures(["nDCG@10", "R@100"])
        # The process's CPU time, not the wall clock: a busy neighbour on a shared machine made
        # the wall-clock ratio fail on the linear code.
        start = time.process_time()
        evaluate.score(evaluate.query_blocks(run), qrels, measures)
        return time.process_time() - start

    small, large = min(seconds(2000) for _ in range(2)), seconds(16000)
    assert large < 24 * small + 0.5, (small, large)  # quadratic would be ~64x


def _random_run(rng, queries: int, depth: int) -> tuple[list[str], str]:
    """Run lines (grouped by query, ties included) and TREC qrels: graded, some queries judged
    but absent from the run, some answered but unjudged."""
    lines, qrels = [], []
    for q in range(queries):
        hits = rng.sample(range(3 * depth), rng.randint(1, depth))
        scores = [round(rng.random(), 1) for _ in hits]  # one decimal: many ties
        lines += [f"q{q} Q0 d{d} {r} {s} t" for r, (d, s) in enumerate(zip(hits, scores), 1)]
    for q in range(queries + 5):
        if q % 7 != 3:  # q3, q10, ... answered, never judged
            qrels += [f"q{q} 0 d{d} {rng.choice([0, 1, 2])}" for d in rng.sample(range(60), 6)]
    return lines, "\n".join(qrels) + "\n"


def test_streamed_batches_score_what_one_call_over_the_whole_run_does(tmp_path):
    """Scoring streams the run a batch of whole queries at a time, each with its own qrels; every
    value must equal ir_measures' one call over the whole run and qrels (the old way), for batches
    of one query up to all of them, and for the same lines shuffled (read whole: the fallback)."""
    import random

    import ir_measures

    rng = random.Random(5)
    lines, qrels_text = _random_run(rng, queries=40, depth=30)
    qrels_path, run_path = tmp_path / "qrels.txt", tmp_path / "run.trec"
    qrels_path.write_text(qrels_text)
    run_path.write_text("\n".join(lines) + "\n")
    names = ["nDCG@10", "RR@10", "R@20", "AP", "P@5", "Judged@10", "nDCG"]
    measures = evaluate.parse_measures(names, relevance_level=2)
    qrels = evaluate.read_qrels(qrels_path)
    whole = [ir_measures.ScoredDoc(q, d, float(s)) for q, _, d, _, s, _ in map(str.split, lines)]
    expected: dict[str, dict[str, float]] = {str(m): {} for m in measures}
    for found in ir_measures.iter_calc(measures, qrels, whole):
        expected[str(found.measure)][found.query_id] = found.value
    judged = {q.query_id for q in qrels}
    for values in expected.values():
        values |= {q: 0.0 for q in judged - set(values)}  # trec_eval -c
    shuffled = tmp_path / "shuffled.trec"
    shuffled.write_text("\n".join(rng.sample(lines, len(lines))) + "\n")
    for path, batch in [(run_path, 1), (run_path, 37), (run_path, 10**6), (shuffled, 50)]:
        got = evaluate.evaluate(path, qrels_path, None, {"measures": names, "relevance_level": 2},
                                batch_lines=batch)
        assert got["per_query"].keys() == expected.keys()
        for measure, values in expected.items():
            assert got["per_query"][measure] == pytest.approx(values, abs=1e-12), (path, batch)
        assert got["queries"] == len(judged) and got["queries_missing_from_run"] == 5
        assert got["run_queries_without_qrels"] == 6


def test_a_query_seen_again_later_is_scored_whole_and_a_duplicate_across_its_lines_fails(tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 1\nq2 0 d2 1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d9 1 3.0 t\nq2 Q0 d2 1 2.0 t\nq1 Q0 d1 2 1.0 t\n")
    got = evaluate.evaluate(run, qrels, None, {"measures": ["R@2"]})
    assert got["per_query"]["R@2"] == {"q1": 1.0, "q2": 1.0}
    run.write_text("q1 Q0 d1 1 3.0 t\nq2 Q0 d2 1 2.0 t\nq1 Q0 d1 2 1.0 t\n")
    with pytest.raises(evaluate.EvaluationError, match="line 3: document d1 is ranked twice"):
        evaluate.evaluate(run, qrels, None, {"measures": ["R@2"]})


_MEASURE_SCORING = """
from retrieval_pretraining import evaluate
run, qrels, batch = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
before = status_kb("VmRSS")
evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10", "R@100"]}, batch_lines=batch)
print(json.dumps({"peak_grew_kb": status_kb("VmHWM") - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_scoring_memory_does_not_grow_with_the_run_at_10x(tmp_path):
    """100 queries with 200, then 2,000 hits each (200k lines): a run whose queries' lines are
    together is scored a batch at a time (4,096 lines here), so 10x the lines adds next to nothing
    to the peak; control: the same lines interleaved across queries are read whole (the fallback,
    and what every run cost before), and the bound sees that."""
    import memory_probe

    queries, peak = 100, {}
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"q{q} 0 d{q}-{q % 50} 1\n" for q in range(queries)))
    for scale in (1, 10):
        depth = 200 * scale
        line = "q{q} Q0 d{q}-{k} {r} {s} run\n"
        grouped = [line.format(q=q, k=k, r=k + 1, s=depth - k) for q in range(queries)
                   for k in range(depth)]
        (tmp_path / f"grouped-{scale}.trec").write_text("".join(grouped))
        if scale == 10:
            (tmp_path / "interleaved.trec").write_text("".join(
                line.format(q=q, k=k, r=k + 1, s=depth - k) for k in range(depth)
                for q in range(queries)))
    for name in ("grouped-1", "grouped-10", "interleaved"):
        peak[name] = memory_probe.run(_MEASURE_SCORING, tmp_path / f"{name}.trec", qrels,
                                      4096)["peak_grew_kb"]
    bound = 12 * 1024  # the 180k more lines take ~50 MB as objects; a batch is 4,096 of them
    assert peak["grouped-10"] - peak["grouped-1"] <= bound, peak
    assert peak["interleaved"] - peak["grouped-1"] > 3 * bound, peak


def test_a_run_shallower_than_a_cutoff_or_missing_queries_is_scored_with_warnings(tmp_path, caplog):
    """R@1000 on a run of two hits per query is R@2: the score keeps trec_eval's value, but the
    metrics record the run's depth and the log says which measures it cuts short and how many
    qrels queries the run does not answer."""
    (tmp_path / "qrels.txt").write_text(QRELS)
    run = tmp_path / "run.trec"
    lines = RUN.splitlines(keepends=True)
    run.write_text("".join(lines[i] for i in (0, 1, 4, 5)))  # q1's first two hits, q2's two
    with caplog.at_level("WARNING", logger="retrieval_pretraining.evaluate"):
        result = evaluate.evaluate(run, tmp_path / "qrels.txt", None,
                                   {"measures": ["R@1000", "nDCG@2", "AP"]})
    assert result["run_depth"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("the cutoff of R@1000: " in w for w in warnings), warnings  # not nDCG@2, not AP
    assert any("queries_missing_from_run = 2" in w for w in warnings), warnings


def test_a_querys_top_docs_are_ranked_by_score_not_by_file_order():
    """Acc@k reads each question's top k by score, descending (as ir_measures ranks for the qrels
    measures), whatever order the run file lists them in; ties keep the file's order."""
    hits = [evaluate.ScoredDoc("q", "a", 1.0), evaluate.ScoredDoc("q", "b", 5.0),
            evaluate.ScoredDoc("q", "d", 3.0), evaluate.ScoredDoc("q", "c", 3.0)]
    assert evaluate.ranked(hits, 1) == ["b"]
    assert evaluate.ranked(hits, 10) == ["b", "d", "c", "a"]  # the tie in file order, not by id


@pytest.mark.parametrize(
    "name, cutoff",
    [("R@1000", 1000), ("R(rel=2)@1000", 1000), ("nDCG@10", 10), ("Acc@20", 20), ("AP", None),
     ("Bpref", None), ("IPrec@0.1", None)],
)
def test_a_measures_cutoff_is_the_rank_it_reads_down_to(name, cutoff):
    assert evaluate.measure_cutoff(name) == cutoff


def test_acc_at_zero_is_no_measure_and_is_refused_before_scoring():
    """Acc@k needs k >= 1: Acc@0 (or Acc@05, a cutoff mistyped) would score every question 0 and
    show a column of 0.000; it is refused by name, as a measure nothing computes."""
    assert evaluate.answer_recall.acc_cutoffs(["Acc@0", "Acc@05", "Acc@1", "Acc@100"]) == {
        "Acc@1": 1, "Acc@100": 100}
    for name in ("Acc@0", "Acc@05"):
        with pytest.raises(evaluate.EvaluationError, match=f"measure '{name}' is not"):
            evaluate.check_computable([name])


def test_every_measure_with_a_relevance_threshold_takes_the_splits_level():
    """At relevance level 2, each measure ir_measures gives a `rel` parameter counts grade 2 up
    (Bpref and the Set family too, not only R/RR/AP/P), while graded ones keep their gains."""
    names = ["Bpref", "infAP", "SetP", "SetR", "SetF", "SetAP", "IPrec@0.1", "R@100", "nDCG@10",
             "nDCG", "ERR@10", "Judged@10", "R(rel=3)@100"]
    got = [str(m) for m in evaluate.parse_measures(names, 2)]
    assert got == ["Bpref(rel=2)", "infAP(rel=2)", "SetP(rel=2)", "SetR(rel=2)", "SetF(rel=2)",
                   "SetAP(rel=2)", "IPrec(rel=2)@0.1", "R(rel=2)@100", "nDCG@10", "nDCG",
                   "ERR@10", "Judged@10", "R(rel=3)@100"]
    assert [str(m) for m in evaluate.parse_measures(names, 1)] == names


def test_metrics_name_the_run_and_the_code_that_scored_it(files):
    """A table built later (perhaps from another checkout) can say which run file and which code
    gave each number: the run's sha256 and evaluate's code version are in the metrics."""
    import hashlib

    from retrieval_pretraining import artifacts

    run, qrels = files
    result = evaluate.evaluate(run, qrels, None, {"measures": ["nDCG@10"]})
    assert result["run_sha256"] == hashlib.sha256(run.read_bytes()).hexdigest()
    assert result["code_version"] == artifacts.code_version()
    assert set(result["code_version"]) == {"git", "package_sha256"}


def test_count_measures_are_summed_over_the_queries_as_trec_eval_and_ir_measures_do(files):
    """NumRet, NumRel, NumRelRet and NumQ are totals in trec_eval's summary and in ir_measures'
    own aggregate (SumAgg): a mean over the queries would report 2 relevant documents retrieved
    where the run retrieved 5 of them. Every other measure stays a mean."""
    import ir_measures

    run, qrels = files
    names = ["NumRet", "NumRelRet", "NumRel", "R@100"]
    result = evaluate.evaluate(run, qrels, None, {"measures": names})
    for key, values in result["per_query"].items():
        total = sum(values.values())
        expected = total if key.startswith("Num") else total / result["queries"]
        assert result["aggregate"][key] == pytest.approx(expected), key
    # q1 retrieves 2 of its relevant documents, q2 2, q4 1; q3, not in the run, retrieves none
    # but has its relevant document (trec_eval -c: the test below).
    assert result["aggregate"]["NumRet(rel=1)"] == 5
    assert result["aggregate"]["NumRet"] == 17 and result["aggregate"]["NumRel"] == 6
    measures = evaluate.parse_measures(names)
    reference = ir_measures.calc_aggregate(
        measures, evaluate.read_qrels(qrels), ir_measures.read_trec_run(str(run)))
    # ir_measures fills 0 for q3 in NumRel too (dropping its relevant document): not compared.
    reference = {str(m): v for m, v in reference.items() if str(m) != "NumRel"}
    assert reference == pytest.approx({m: result["aggregate"][m] for m in reference})


def trec_dicts(text: str, qrels: bool) -> dict[str, dict[str, float]]:
    """QRELS or RUN as pytrec_eval's {query: {doc: grade or score}}."""
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        qid, _, doc, grade_or_rank, *score = line.split()
        found.setdefault(qid, {})[doc] = int(grade_or_rank) if qrels else float(score[0])
    return found


def test_a_query_the_run_misses_counts_in_num_q_and_num_rel_as_trec_eval_c_counts_it(files):
    """trec_eval -c scores a qrels query the run does not answer as an empty ranking: num_q 1,
    num_rel its relevant documents (at -l's level), num_ret and num_rel_ret 0. Filled with 0,
    NumQ's total left the query out (3 queries where every mean divides by 4) and NumRel its
    relevant documents. Every other measure still scores it 0, so no mean changes."""
    import ir_measures
    import pytrec_eval

    run, qrels = files
    names = ["NumQ", "NumRel", "NumRet", "NumRelRet", "R@100", "nDCG@10"]
    result = evaluate.evaluate(run, qrels, None, {"measures": names})
    per, total = result["per_query"], result["aggregate"]
    # By hand: q3, absent from the run, has one judgement, grade 1.
    assert per["NumQ"]["q3"] == 1 and per["NumRel"]["q3"] == 1
    assert per["NumRet"]["q3"] == 0 and per["NumRet(rel=1)"]["q3"] == 0
    assert total["NumQ"] == 4 == result["queries"]
    assert total["NumRel"] == 2 + 2 + 1 + 1
    assert total["NumRet"] == 17 and total["NumRet(rel=1)"] == 5
    assert per["R@100"]["q3"] == 0 and total["R@100"] == pytest.approx(3 / 4)
    assert per["nDCG@10"]["q3"] == 0
    # trec_eval's own code (pytrec_eval) given q3 as the empty ranking trec_eval -c scores.
    evaluator = pytrec_eval.RelevanceEvaluator(
        trec_dicts(QRELS, qrels=True), {"num_q", "num_rel", "num_ret", "num_rel_ret"})
    reference = evaluator.evaluate(trec_dicts(RUN, qrels=False) | {"q3": {}})
    for ours, theirs in (("NumQ", "num_q"), ("NumRel", "num_rel"), ("NumRet", "num_ret"),
                         ("NumRet(rel=1)", "num_rel_ret")):
        assert per[ours] == {qid: values[theirs] for qid, values in reference.items()}, ours
    # At another level (ir_measures' providers compute NumRel(rel=2) for no answered query, so
    # the fill is checked alone): q3's grade-1 document is not relevant at 2, q2's grade 2 is.
    at_2 = ir_measures.parse_measure("NumRel(rel=2)")
    judged = evaluate.read_qrels(qrels)
    assert evaluate._unanswered(at_2, [q for q in judged if q.query_id == "q3"]) == 0
    assert evaluate._unanswered(at_2, [q for q in judged if q.query_id == "q2"]) == 1


def test_a_measure_no_provider_computes_at_the_split_s_level_is_refused_before_scoring():
    """NumRel at level 2 becomes NumRel(rel=2), which ir_measures parses but no provider computes:
    refused by name (the rules call this at parse time), where scoring failed in every job with
    ir_measures' bare ValueError. The paper's measures at both levels pass."""
    evaluate.check_computable(["nDCG@10", "R@1000", "RR@10", "AP", "NumRel", "Acc@20"], 1)
    evaluate.check_computable(["nDCG@10", "R@1000", "RR@10", "NumRet", "NumRelRet"], 2)
    evaluate.check_computable(["NumRel(rel=1)"], 2)
    with pytest.raises(evaluate.EvaluationError,
                       match=r"'NumRel' at relevance_level 2 is NumRel\(rel=2\), which no"):
        evaluate.check_computable(["nDCG@10", "NumRel"], 2)


def _trec_eval_c(qrels, run, level, cutoffs):
    """Every measure of the property test below for every qrels query, as trec_eval -c gives it,
    from trec_eval's own code (pytrec_eval): a query the run misses is given as an empty ranking;
    RR@k, which trec_eval lacks, by hand in ir_measures' MS MARCO order (score descending, doc id
    ascending: ARCHITECTURE.md, "documents tied on score")."""
    import pytrec_eval

    ndcg, recall, rr = cutoffs
    run = {q: run.get(q, {}) for q in qrels}
    graded = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{ndcg}", "num_q", "num_rel_ret"})
    binary = pytrec_eval.RelevanceEvaluator(
        qrels, {f"recall.{recall}", "recip_rank", "map", "P.5", "num_ret"}, relevance_level=level)
    by_graded, by_binary = graded.evaluate(run), binary.evaluate(run)
    expected = {}
    for qid in qrels:
        g, b = by_graded[qid], by_binary[qid]
        top = sorted(run[qid].items(), key=lambda hit: (-hit[1], hit[0]))[:rr]
        first = next((i for i, (doc, _) in enumerate(top, 1) if qrels[qid].get(doc, -9) >= level),
                     None)
        expected[qid] = {
            f"nDCG@{ndcg}": g[f"ndcg_cut_{ndcg}"], f"R@{recall}": b[f"recall_{recall}"],
            "RR": b["recip_rank"], "AP": b["map"], "P@5": b["P_5"], f"RR@{rr}": 1 / first if first
            else 0.0, "NumQ": g["num_q"], "NumRet": b["num_ret"], "NumRelRet": g["num_rel_ret"],
        }
    return expected


def test_every_measure_equals_trec_eval_c_on_random_runs_and_qrels(tmp_path):
    """Random qrels (grades -1..3, judged-negative documents, queries with no relevant one) and
    runs (many ties, documents no qrels judge, queries the run misses or the qrels lack, queries
    with more relevant documents than a cutoff), at relevance levels 1 and 2, the measures in a
    random order (ir_measures shares pytrec_eval calls between them), streamed in small batches:
    every per-query value and mean within 1e-9 of trec_eval's own code. NumRelRet is
    ir_measures' NumRet(rel=1), so it counts grade >= 1 at any level (evaluate's docstring)."""
    import random

    rng = random.Random(11)
    for trial in range(150):
        docs = [f"d{rng.randint(0, 30)}" for _ in range(rng.randint(1, 15))]
        qrels, run = {}, {}
        for q in (f"q{i}" for i in range(rng.randint(1, 6))):
            if rng.random() < 0.85:
                qrels[q] = {d: rng.choice([-1, 0, 0, 1, 2, 3]) for d in rng.sample(docs, len(docs))[
                    :rng.randint(1, len(docs))]}
            if rng.random() < 0.85:
                pool = docs + [f"x{i}" for i in range(5)]
                run[q] = {d: float(rng.choice([1, 2, 3, rng.random()]))
                          for d in rng.sample(pool, rng.randint(1, len(docs)))}
        if not set(qrels) & set(run):
            continue
        level, cutoffs = rng.choice([1, 2]), tuple(rng.choice([1, 2, 3, 5, 10]) for _ in range(3))
        names = [f"nDCG@{cutoffs[0]}", f"R@{cutoffs[1]}", "RR", "AP", "P@5", f"RR@{cutoffs[2]}",
                 "NumQ", "NumRet", "NumRelRet"]
        rng.shuffle(names)
        (tmp_path / "qrels.txt").write_text("".join(
            f"{q} 0 {d} {g}\n" for q, judged in qrels.items() for d, g in judged.items()))
        (tmp_path / "run.trec").write_text("".join(
            f"{q} Q0 {d} {r} {s!r} t\n" for q, hits in run.items()
            for r, (d, s) in enumerate(hits.items(), 1)))
        result = evaluate.evaluate(tmp_path / "run.trec", tmp_path / "qrels.txt", None,
                                   {"measures": names, "relevance_level": level},
                                   batch_lines=rng.randint(1, 20))
        expected = _trec_eval_c(qrels, run, level, cutoffs)
        for name in names:
            stored = evaluate.stored_name(name, level)
            want = {q: values[name] for q, values in expected.items()}
            got = result["per_query"][stored]
            assert got.keys() == want.keys(), (trial, name)
            assert all(abs(got[q] - want[q]) <= 1e-9 for q in want), (trial, name, got, want)
            total = sum(want.values()) / (1 if name.startswith("Num") else len(want))
            assert abs(result["aggregate"][stored] - total) <= 1e-9, (trial, name)
