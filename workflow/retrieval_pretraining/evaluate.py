"""Score a TREC run against qrels with ir_measures (trec_eval semantics), failing loudly.

    python -m retrieval_pretraining.evaluate --run runs/test.trec --qrels qrels-test.parquet \
        --out metrics/test.json --config '{"measures": ["nDCG@10", "R@100"], "relevance_level": 1}'

Output (the scores contract): {"aggregate": {measure: value}, "per_query": {measure: {qid: value}},
"run": path, "qrels": path, "measures": [...], "queries": n, "queries_missing_from_run": n}.

Semantics, chosen to match the official evaluations:
- Every query of the qrels counts: one the run does not answer scores 0 (trec_eval -c). The mean
  is over all qrels queries, and per-query scores are kept for significance tests.
- `relevance_level` is the minimum grade counted relevant by binary measures (R, RR, AP, P,
  Success): TREC DL counts grade >= 2 for recall/MRR/MAP, while nDCG always uses the graded gains.
  A measure written with its own `rel=` keeps it.
- RR@10 is computed by ir_measures' own implementation (the MS MARCO definition with its cutoff);
  the pytrec_eval backend would silently ignore the cutoff, so it is never used for RR.
- `Acc@k` (open-domain QA answer recall, answers.py: DPR's has_answer on the top k passages' text,
  in run order = score descending, ties in file order) is scored against answers-{split}.parquet and
  the corpus (`--answers`, `--corpus`); every question of the answers file counts (0 when the run
  misses it). A split may mix it with qrels measures; `answer_match: regex` is CuratedTREC's mode.
- A malformed run or qrels line (a byte that is not UTF-8 included), a duplicated (query, document)
  pair in a run, an empty run, or a run sharing no query with the qrels raises with the file and
  line: never a 0.0 for a parse error. The command prints it as one line and exits 1.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Iterable

import ir_measures
import polars as pl
from ir_measures import Qrel, ScoredDoc

from . import answers as answer_recall
from . import artifacts
from .config import refuse_unknown, stage_parser
from .contracts.runs import utf8_lines
from .errors import BadInput, command, reading

log = logging.getLogger(__name__)

# Measures whose relevance threshold is a parameter (`rel`) in ir_measures.
_BINARY = {"R", "RR", "AP", "P", "Success", "Rprec", "NumRelRet"}


class EvaluationError(BadInput, ValueError):
    """The run or qrels cannot be scored as given (the message says where and how to fix it)."""


def read_run(path: str | Path) -> list[ScoredDoc]:
    """Parse a TREC run strictly: 6 fields per line, integer rank, finite float score, no duplicates."""
    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"run file {path} does not exist")
    docs: list[ScoredDoc] = []
    seen: set[tuple[str, str]] = set()
    for number, line in utf8_lines(path, EvaluationError):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 6:
            raise EvaluationError(
                f"{path}, line {number}: {len(fields)} fields, a TREC run line has 6 "
                "(`query_id Q0 doc_id rank score tag`)"
            )
        qid, _, did, rank, score, _ = fields
        try:
            int(rank)
            value = float(score)
        except ValueError:
            raise EvaluationError(
                f"{path}, line {number}: rank {rank!r} must be an integer and score {score!r} a number"
            ) from None
        if not math.isfinite(value):
            raise EvaluationError(f"{path}, line {number}: score {score!r} is not finite")
        if (qid, did) in seen:
            raise EvaluationError(
                f"{path}, line {number}: document {did} is ranked twice for query {qid}; "
                "a run lists each document once per query"
            )
        seen.add((qid, did))
        docs.append(ScoredDoc(qid, did, value))
    if not docs:
        raise EvaluationError(f"run file {path} is empty; the retrieval step wrote no results")
    return docs


def read_qrels(path: str | Path) -> list[Qrel]:
    """Qrels from the canonical Parquet (query_id, doc_id, relevance) or a TREC qrels text file."""
    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"qrels file {path} does not exist")
    if path.suffix == ".parquet":
        with reading(path, "a qrels Parquet file"):
            frame = pl.read_parquet(path)
        missing = {"query_id", "doc_id", "relevance"} - set(frame.columns)
        if missing:
            raise EvaluationError(
                f"{path}: missing columns {sorted(missing)}; expected the canonical qrels"
            )
        qrels = [
            Qrel(str(q), str(d), int(r))
            for q, d, r in frame.select("query_id", "doc_id", "relevance").iter_rows()
        ]
    else:
        qrels = []
        for number, line in utf8_lines(path, EvaluationError, "a TREC qrels file"):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 4:
                raise EvaluationError(
                    f"{path}, line {number}: {len(fields)} fields, TREC qrels lines have 4 "
                    "(`query_id iteration doc_id relevance`)"
                )
            try:
                qrels.append(Qrel(fields[0], fields[2], int(fields[3])))
            except ValueError:
                raise EvaluationError(
                    f"{path}, line {number}: relevance {fields[3]!r} is not an integer"
                ) from None
    if not qrels:
        raise EvaluationError(f"qrels file {path} is empty")
    return qrels


def parse_measures(names: Iterable[str], relevance_level: int = 1) -> list:
    """ir_measures objects; binary measures get rel=relevance_level unless they name their own."""
    measures = []
    for name in names:
        try:
            measure = ir_measures.parse_measure(name)
        except Exception as error:  # ir_measures raises a bare ValueError/NameError for typos
            raise EvaluationError(
                f"measure {name!r} is not an ir_measures measure ({error})"
            ) from None
        if relevance_level != 1 and measure.NAME in _BINARY and "rel" not in measure.params:
            measure = measure(rel=relevance_level)
        measures.append(measure)
    return measures


def score(
    run: list[ScoredDoc], qrels: list[Qrel], measures: list, run_name: str = "run"
) -> dict[str, Any]:
    """Aggregate and per-query values; qrels queries absent from the run score 0 (trec_eval -c)."""
    qrels_queries = sorted({q.query_id for q in qrels})
    run_queries = {d.query_id for d in run}
    overlap = run_queries.intersection(qrels_queries)
    if not overlap:
        raise EvaluationError(
            f"{run_name}: none of its {len(run_queries)} queries appear in the qrels "
            f"({len(qrels_queries)} queries, e.g. {qrels_queries[:3]}); wrong split or id format?"
        )
    per_query: dict[str, dict[str, float]] = {str(m): {} for m in measures}
    for result in ir_measures.iter_calc(measures, qrels, run):
        per_query[str(result.measure)][result.query_id] = float(result.value)
    judged = set(qrels_queries)  # built once: inside the loop it made scoring O(queries^2)
    for values in per_query.values():
        for qid in qrels_queries:
            values.setdefault(qid, 0.0)
        for qid in [q for q in values if q not in judged]:
            del values[qid]  # queries without judgements are not scored (trec_eval)
    aggregate = {m: sum(v.values()) / len(qrels_queries) for m, v in per_query.items()}
    return {
        "aggregate": aggregate,
        "per_query": {m: dict(sorted(v.items())) for m, v in per_query.items()},
        "measures": [str(m) for m in measures],
        "queries": len(qrels_queries),
        "queries_missing_from_run": len(judged - run_queries),
        "run_queries_without_qrels": len(run_queries - judged),
    }


def ranked_lists(run: list[ScoredDoc]) -> dict[str, list[str]]:
    """Each query's doc ids by score, descending (ties keep the run file's order)."""
    by_query: dict[str, list[ScoredDoc]] = {}
    for doc in run:
        by_query.setdefault(doc.query_id, []).append(doc)
    return {q: [d.doc_id for d in sorted(docs, key=lambda d: -d.score)]
            for q, docs in by_query.items()}


def score_answers(run: list[ScoredDoc], answers_path: Path | None, corpus: Path | None,
                  cutoffs: dict[str, int], mode: str, run_name: str) -> dict[str, Any]:
    """Acc@k (answers.py) per question and aggregated, in the scores contract's shape."""
    if answers_path is None or corpus is None:
        raise EvaluationError(f"{', '.join(cutoffs)} need --answers (answers-<split>.parquet) and "
                              "--corpus (the dataset's corpus.parquet): a format dpr dataset")
    answers = answer_recall.read_answers(answers_path)
    if not answers:
        raise EvaluationError(f"answers file {answers_path} is empty")
    ranked = ranked_lists(run)
    if not set(ranked) & set(answers):
        raise EvaluationError(f"{run_name}: none of its {len(ranked)} queries are questions of "
                              f"{answers_path}; wrong split or id format?")
    per_query = answer_recall.top_k_accuracy(ranked, answers, corpus, cutoffs, mode)
    return {"aggregate": {m: sum(v.values()) / len(answers) for m, v in per_query.items()},
            "per_query": per_query, "questions": len(answers),
            "questions_missing_from_run": len(set(answers) - set(ranked))}


def evaluate(
    run_path: Path, qrels_path: Path | None, out: Path | None, config: dict[str, Any],
    answers: Path | None = None, corpus: Path | None = None,
) -> dict[str, Any]:
    names = config.get("measures", ["nDCG@10"])
    cutoffs = answer_recall.acc_cutoffs(names)
    measures = parse_measures([n for n in names if n not in cutoffs],
                              int(config.get("relevance_level", 1)))
    run = read_run(run_path)
    result: dict[str, Any] = {"aggregate": {}, "per_query": {}}
    if measures:
        if qrels_path is None:
            raise EvaluationError(f"measures {[str(m) for m in measures]} need --qrels")
        result = score(run, read_qrels(qrels_path), measures, str(run_path))
    if cutoffs:
        mode = config.get("answer_match", "string")
        found = score_answers(run, answers, corpus, cutoffs, mode, str(run_path))
        for key in ("aggregate", "per_query"):
            result[key] |= found.pop(key)
        result |= found | {"answers": str(answers), "answer_match": mode}
        result.setdefault("queries", found["questions"])
    result |= {
        "measures": [str(m) for m in measures] + list(cutoffs),
        "run": str(run_path),
        "qrels": str(qrels_path) if measures else None,
        "relevance_level": int(config.get("relevance_level", 1)),
    }
    if out is not None:
        artifacts.write_json(out, result)
    log.info("%s: %s", run_path, {m: round(v, 4) for m, v in result["aggregate"].items()})
    return result


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("Score a TREC run against qrels (ir_measures, trec_eval semantics).")
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--qrels", type=Path, help="qrels-{split}.parquet or TREC qrels")
    parser.add_argument("--answers", type=Path, help="answers-{split}.parquet (Acc@k)")
    parser.add_argument("--corpus", type=Path, help="the dataset's corpus.parquet (Acc@k)")
    parser.add_argument("--out", type=Path, required=True, help="metrics JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    refuse_unknown(args.config, ("measures", "relevance_level", "answer_match"), "evaluate")
    evaluate(args.run, args.qrels, args.out, args.config, args.answers, args.corpus)


if __name__ == "__main__":
    main()
