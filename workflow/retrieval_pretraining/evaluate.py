"""Score a TREC run against qrels with ir_measures (trec_eval semantics), failing loudly.

    python -m retrieval_pretraining.evaluate --run runs/test.trec --qrels qrels-test.parquet \
        --out metrics/test.json --config '{"measures": ["nDCG@10", "R@100"], "relevance_level": 1}'

Output (the scores contract): {"aggregate": {measure: value}, "per_query": {measure: {qid: value}},
"run": path, "qrels": path, "measures": [...], "queries": n, "queries_missing_from_run": n,
"run_queries_without_qrels": n, each with its "..._examples" (the first ids in sorted order, at
most EXAMPLE_IDS), "run_depth": the most hits any query of the run has, "run_sha256": the run
file's digest, "code_version": {"git", "package_sha256"} of the code that scored it}.

Semantics, chosen to match the official evaluations:
- Every query of the qrels counts: one the run does not answer scores 0 (trec_eval -c), but in
  NumQ (1) and NumRel (its relevant documents), as trec_eval -c counts it. The mean is over all
  qrels queries (ir_measures' counts, NumRet and the like, are totals, as there),
  and per-query scores are kept for significance tests. A run query
  without qrels is not scored (trec_eval). Both are counted in the metrics, with example ids, so
  that an audit of the file shows them (a split's queries file may hold unjudged queries: TREC DL).
- `relevance_level` is the minimum grade counted relevant by binary measures, those ir_measures
  gives a `rel` parameter (R, RR, AP, P, Success, Rprec, Bpref, infAP, SetP/R/F/AP, IPrec, ...):
  TREC DL counts grade >= 2 for recall/MRR/MAP, while nDCG (and ERR) always use the graded gains.
  A measure written with its own `rel=` keeps it (so does NumRelRet, ir_measures' alias for
  NumRet(rel=1)); one whose `rel` is optional keeps its meaning unset (NumRet: every document
  retrieved, as trec_eval -l 2 counts num_ret; RBP: graded gains).
- RR@10 is computed by ir_measures' own implementation (the MS MARCO definition with its cutoff);
  the pytrec_eval backend would silently ignore the cutoff, so it is never used for RR@k. Ties on
  score are ordered as each implementation orders them (this one by doc id ascending, trec_eval's
  by doc id descending; ARCHITECTURE.md, "documents tied on score").
- `Acc@k` (open-domain QA answer recall, answer_accuracy.py: DPR's has_answer on the top k
  passages' text, in run order = score descending, ties in file order) is scored against
  answers-{split}.parquet and the corpus (`--answers`, `--corpus`); every question of the answers
  file counts (0 when the run misses it: "questions_missing_from_run"; a run query that is no
  question is not scored: "run_queries_without_answers", both with examples). A split may mix it
  with qrels measures; `answer_match: regex` is CuratedTREC's mode.
- A run shallower than a measure's cutoff (R@1000 on a run of depth 100 is R@100) and queries the
  run does not answer are logged as warnings: the scores are still trec_eval's, but a table would
  otherwise show them as what they name. The workflow refuses such a depth at parse time
  (rules/evaluate.smk); a run scored by hand may still be one.
- The run is streamed: each query's lines together (every run this workflow writes) are scored
  a batch of whole queries at a time (BATCH_LINES hits), so memory does not grow with the run's
  length; a run whose queries' lines are scattered is read whole first (legal TREC, a warning).
- A malformed run or qrels line (a byte that is not UTF-8 included), a duplicated (query, document)
  pair in a run or in the qrels, an empty run, or a run sharing no query with the qrels raises with
  the file and line: never a 0.0 for a parse error. The command prints it as one line and exits 1.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from decimal import Decimal
from functools import cache
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import ir_measures
import polars as pl
from ir_measures import Qrel, ScoredDoc

from . import answer_accuracy as answer_recall
from . import artifacts
from .answers import read_answers
from .config import refuse_unknown, stage_parser
from .contracts.runs import trec_fields, utf8_lines
from .errors import BadInput, command, reading

log = logging.getLogger(__name__)

class EvaluationError(BadInput, ValueError):
    """The run or qrels cannot be scored as given (the message says where and how to fix it)."""


# A batch handed to ir_measures holds whole queries and about this many run lines: enough that its
# per-call set-up is noise, few enough that scoring holds ~100 MB whatever the run's length (a run
# of 30M lines read whole held 11.7 GB as ScoredDoc objects; issue 17).
BATCH_LINES = 262_144

# Ids a metrics file names for each of its coverage counts (queries the run misses, run queries
# not judged): enough to recognise another split or id format when auditing, few enough that a
# run of another dataset does not fill the file with them.
EXAMPLE_IDS = 5

Block = tuple[str, list[ScoredDoc]]  # one query's hits, in file order


class _NotGrouped(Exception):
    """A query's lines are not together in the run (legal TREC, but it cannot be streamed)."""


def _hits(path: Path) -> Iterator[tuple[int, str, str, float]]:
    """(line number, query id, doc id, score) of every run line, parsed strictly."""
    if not path.is_file():
        raise EvaluationError(f"run file {path} does not exist")
    for number, line in utf8_lines(path, EvaluationError):
        fields = trec_fields(line)
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
        yield number, qid, did, value


def _ranked_twice(path: Path, number: int, qid: str, did: str) -> EvaluationError:
    return EvaluationError(
        f"{path}, line {number}: document {did} is ranked twice for query {qid}; "
        "a run lists each document once per query"
    )


def _empty_run(path: Path) -> EvaluationError:
    return EvaluationError(f"run file {path} is empty; the retrieval step wrote no results")


def _streamed_blocks(path: Path) -> Iterator[Block]:
    """Each query's hits as its lines end, holding one query at a time; raises _NotGrouped when a
    query's lines turn out not to be together (every run this workflow writes has them together)."""
    finished: set[str] = set()
    qid, hits, seen = None, [], set()
    for number, q, did, value in _hits(path):
        if q != qid:
            if qid is not None:
                yield qid, hits
                finished.add(qid)
            if q in finished:
                raise _NotGrouped(f"{path}, line {number}: query {q} again after other queries")
            qid, hits, seen = q, [], set()
        if did in seen:
            raise _ranked_twice(path, number, q, did)
        seen.add(did)
        hits.append(ScoredDoc(q, did, value))
    if qid is None:
        raise _empty_run(path)
    yield qid, hits


def _blocks_in_memory(path: Path) -> Iterator[Block]:
    """Each query's hits from the whole run read first: any line order, memory ~ the run."""
    by_query: dict[str, list[ScoredDoc]] = {}
    seen: set[tuple[str, str]] = set()
    for number, qid, did, value in _hits(path):
        if (qid, did) in seen:
            raise _ranked_twice(path, number, qid, did)
        seen.add((qid, did))
        by_query.setdefault(qid, []).append(ScoredDoc(qid, did, value))
    if not by_query:
        raise _empty_run(path)
    yield from by_query.items()


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
        numbered = [
            (row, Qrel(_id(path, row, "query_id", q), _id(path, row, "doc_id", d),
                       _grade(path, row, q, d, r)))
            for row, (q, d, r) in enumerate(
                frame.select("query_id", "doc_id", "relevance").iter_rows(), 1)
        ]
        unit = "row"
    else:
        numbered, unit = [], "line"
        for number, line in utf8_lines(path, EvaluationError, "a TREC qrels file"):
            fields = trec_fields(line)
            if not fields:
                continue
            if len(fields) != 4:
                raise EvaluationError(
                    f"{path}, line {number}: {len(fields)} fields, TREC qrels lines have 4 "
                    "(`query_id iteration doc_id relevance`)"
                )
            try:
                numbered.append((number, Qrel(fields[0], fields[2], int(fields[3]))))
            except ValueError:
                raise EvaluationError(
                    f"{path}, line {number}: relevance {fields[3]!r} is not an integer"
                ) from None
    if not numbered:
        raise EvaluationError(f"qrels file {path} is empty")
    return _judged_once(path, numbered, unit)


def _id(path: Path, row: int, column: str, value: Any) -> str:
    """A Parquet qrels row's query or document id: str() of a null was the id 'None', a judged
    query no run answers (0 in every mean) or a relevant document no run retrieves, silently."""
    if value is None:
        raise EvaluationError(f"{path}, row {row}: {column} is null; give every judged pair its "
                              "query and document ids")
    return str(value)


def _grade(path: Path, row: int, query_id: Any, doc_id: Any, relevance: Any) -> int:
    """A Parquet qrels row's relevance as an integer: int() of a null was a bare TypeError (of
    a word, a ValueError, of an infinity an OverflowError) in scoring, naming neither the file
    nor the row, and of a fraction (0.5) its integer part, silently, where the TREC text reader
    refuses it; of a string ("1") or a boolean, a grade from a column of another type than the
    prepare stage's integers. A float column's whole grades (1.0: a column that once held a NaN)
    are kept."""
    if relevance is None:
        raise EvaluationError(f"{path}, row {row}: document {doc_id} of query {query_id} has no "
                              "relevance (null); give every judged pair an integer grade")
    grade = None
    # A decimal column's values (a database's DECIMAL export) are Decimals: whole ones are grades.
    if isinstance(relevance, (int, float, Decimal)) and not isinstance(relevance, bool):
        try:
            grade = int(relevance)
        except (ValueError, OverflowError):  # NaN, an infinity
            pass
    if grade is None or grade != relevance:
        raise EvaluationError(f"{path}, row {row}: relevance {relevance!r} of query {query_id}, "
                              f"document {doc_id} is not an integer; give every judged pair an "
                              "integer grade")
    return grade


def _judged_once(path: Path, numbered: list[tuple[int, Qrel]], unit: str) -> list[Qrel]:
    """The qrels, refusing a (query, document) pair judged twice: trec_eval refuses it, and
    ir_measures would score it with its last grade in R@k and nDCG (pytrec_eval) and as
    relevant if any grade is in RR@k (its own implementation)."""
    seen: set[tuple[str, str]] = set()
    for number, qrel in numbered:
        pair = (qrel.query_id, qrel.doc_id)
        if pair in seen:
            raise EvaluationError(
                f"{path}, {unit} {number}: document {qrel.doc_id} is judged twice for query "
                f"{qrel.query_id}; a qrels file judges each pair once"
            )
        seen.add(pair)
    return [qrel for _, qrel in numbered]


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
        # ir_measures' own word on which measures have a relevance threshold, so that none is
        # left at rel=1 by a list kept here; nDCG and ERR have none (graded gains). A `rel` whose
        # default is no level (NumRet: every document retrieved; RBP: graded gains) is optional:
        # setting it would turn the measure into another one under a similar name.
        rel = measure.SUPPORTED_PARAMS.get("rel")
        binary = rel is not None and isinstance(rel.default, int)
        if relevance_level != 1 and binary and "rel" not in measure.params:
            measure = measure(rel=relevance_level)
        measures.append(measure)
    return measures


def stored_name(name: str, relevance_level: int = 1) -> str:
    """The key `evaluate` stores measure `name`'s scores under for a split scored at
    `relevance_level`: a binary measure carries the level (R@1000 at level 2 is stored as
    R(rel=2)@1000); nDCG, Acc@k and a measure naming its own rel= keep their names. A results
    table names a column's measure as the split's `measures` list does and finds it through this."""
    if answer_recall.acc_cutoffs([name]):
        return name
    return str(parse_measures([name], relevance_level)[0])


def check_computable(names: Iterable[str], relevance_level: int = 1) -> None:
    """Refuse a measure that no ir_measures provider computes at `relevance_level`, before any
    job: NumRel at level 2 becomes NumRel(rel=2), which parses but which no provider offers, so
    scoring failed with ir_measures' bare ValueError after every run was built. Each measure is
    scored once on a one-document toy run (a few ms)."""
    toy_qrels = [ir_measures.Qrel("q", "d", max(relevance_level, 1))]
    toy_run = [ir_measures.ScoredDoc("q", "d", 1.0)]
    for name in names:
        if answer_recall.acc_cutoffs([name]):
            continue
        [measure] = parse_measures([name], relevance_level)
        try:
            ir_measures.calc_aggregate([measure], toy_qrels, toy_run)
        except Exception as error:  # ir_measures: ValueError "Unsupported measures {...}"
            raise EvaluationError(
                f"measure {name!r} at relevance_level {relevance_level} is {measure}, which no "
                f"ir_measures provider computes ({error}); drop it from that split's measures, or "
                "give it its own rel= (e.g. NumRel(rel=1))"
            ) from None


def measure_cutoff(name: str) -> int | None:
    """The rank measure `name` reads down to (R@1000: 1000, Acc@20: 20); None for one that reads
    the whole run (AP, Bpref), which no run depth makes wrong."""
    acc = answer_recall.acc_cutoffs([name])
    if acc:
        return acc[name]
    return parse_measures([name])[0].params.get("cutoff")


def coverage(key: str, ids: set[str]) -> dict[str, Any]:
    """`{key: how many ids, key_examples: the first EXAMPLE_IDS, sorted}` for the metrics."""
    return {key: len(ids), f"{key}_examples": sorted(ids)[:EXAMPLE_IDS]}


def _warn_if_shallow(result: dict[str, Any], names: list[str], run_name: str) -> None:
    """Warn when a score is not what its name says: a cutoff below which the run has no hits, or
    queries (questions) the run does not answer, which score 0."""
    depth = result["run_depth"]
    deeper = [n for n in names if (measure_cutoff(n) or 0) > depth]
    if deeper:
        log.warning("%s: at most %d hits per query, fewer than the cutoff of %s: these score the "
                    "run to depth %d", run_name, depth, ", ".join(deeper), depth)
    for key in ("queries_missing_from_run", "questions_missing_from_run"):
        if result.get(key):
            log.warning("%s: %s = %d (each scores 0), e.g. %s", run_name, key, result[key],
                        result[f"{key}_examples"])


def _batches(blocks: Iterable[Block], lines: int) -> Iterator[list[Block]]:
    """Whole queries, gathered until a batch holds at least `lines` hits."""
    batch, held = [], 0
    for block in blocks:
        batch.append(block)
        held += len(block[1])
        if held >= lines:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def score(
    blocks: Iterable[Block], qrels: list[Qrel], measures: list, run_name: str = "run",
    batch_lines: int | None = None,
) -> dict[str, Any]:
    """Aggregate and per-query values of a run given as (query id, hits) blocks, each query once;
    qrels queries absent from the run score as trec_eval -c scores them (_unanswered). ir_measures
    scores `batch_lines` hits at a time with the qrels of those queries only: every measure is per
    query, so the values are those of one call over the whole run (tests/test_evaluate.py checks
    it)."""
    by_query: dict[str, list[Qrel]] = {}
    for qrel in qrels:
        by_query.setdefault(qrel.query_id, []).append(qrel)
    per_query: dict[str, dict[str, float]] = {str(m): {} for m in measures}
    run_queries: set[str] = set()
    for batch in _batches(blocks, batch_lines or BATCH_LINES):
        run_queries.update(qid for qid, _ in batch)
        judged_here = [qrel for qid, _ in batch for qrel in by_query.get(qid, ())]
        if not judged_here:
            continue
        docs = [doc for _, hits in batch for doc in hits]
        for result in ir_measures.iter_calc(measures, judged_here, docs):
            per_query[str(result.measure)][result.query_id] = float(result.value)
    qrels_queries = sorted(by_query)
    judged = set(qrels_queries)
    if not run_queries & judged:
        raise EvaluationError(
            f"{run_name}: none of its {len(run_queries)} queries appear in the qrels "
            f"({len(qrels_queries)} queries, e.g. {qrels_queries[:3]}); wrong split or id format?"
        )
    for measure in measures:
        values = per_query[str(measure)]
        for qid in qrels_queries:
            if qid not in values:
                values[qid] = _unanswered(measure, by_query[qid])
        for qid in [q for q in values if q not in judged]:
            del values[qid]  # queries without judgements are not scored (trec_eval)
    aggregate = {str(m): _aggregate(m, per_query[str(m)].values()) for m in measures}
    return (
        {
            "aggregate": aggregate,
            "per_query": {m: dict(sorted(v.items())) for m, v in per_query.items()},
            "measures": [str(m) for m in measures],
            "queries": len(qrels_queries),
        }
        | coverage("queries_missing_from_run", judged - run_queries)
        | coverage("run_queries_without_qrels", run_queries - judged)
    )


def _unanswered(measure, judgements: list[Qrel]) -> float:
    """A measure's value for a qrels query the run does not answer, as trec_eval -c scores it (an
    empty ranking): NumQ 1 (the query counts), NumRel the query's relevant documents at the
    measure's level (the qrels' count, whatever was retrieved), every other measure 0, NumRet
    and NumRelRet included. So the totals of NumQ and NumRel are trec_eval -c's num_q and num_rel
    (a 0 dropped the query and its relevant documents), and no mean changes."""
    if measure.NAME == "NumQ":
        return 1.0
    if measure.NAME == "NumRel":
        level = measure.params.get("rel", measure.SUPPORTED_PARAMS["rel"].default)
        return float(sum(qrel.relevance >= level for qrel in judgements))
    return 0.0


def _aggregate(measure, values: Iterable[float]) -> float:
    """The measure's value over the queries as ir_measures and trec_eval aggregate it: the mean
    (over every qrels query: `values` holds one per query), or the total for the counts (NumQ,
    NumRet, NumRel, NumRelRet), which a mean would report per query under the total's name."""
    aggregator = measure.aggregator()
    for value in values:
        aggregator.add(value)
    return float(aggregator.result())


def query_blocks(run: Iterable[ScoredDoc]) -> list[Block]:
    """A run held as ScoredDoc objects, as `score`'s blocks (each query once, file order kept)."""
    by_query: dict[str, list[ScoredDoc]] = {}
    for doc in run:
        by_query.setdefault(doc.query_id, []).append(doc)
    return list(by_query.items())


def ranked(hits: list[ScoredDoc], depth: int) -> list[str]:
    """A query's first `depth` doc ids by score, descending (ties keep the run file's order)."""
    return [d.doc_id for d in sorted(hits, key=lambda d: -d.score)[:depth]]


def score_answers(top: dict[str, list[str]], run_queries: set[str],
                  answers: dict[str, list[str]], answers_path: Path, corpus: Path,
                  cutoffs: dict[str, int], mode: str, run_name: str) -> dict[str, Any]:
    """Acc@k (answer_accuracy.py) per question and aggregated, in the scores contract's shape;
    `top` holds the ranked doc ids of every question the run answers, `run_queries` every query it
    has."""
    if not top:
        raise EvaluationError(f"{run_name}: none of its {len(run_queries)} queries are questions "
                              f"of {answers_path}; wrong split or id format?")
    per_query = answer_recall.top_k_accuracy(top, answers, corpus, cutoffs, mode)
    return ({"aggregate": {m: sum(v.values()) / len(answers) for m, v in per_query.items()},
             "per_query": per_query, "questions": len(answers)}
            | coverage("questions_missing_from_run", set(answers) - set(top))
            | coverage("run_queries_without_answers", run_queries - set(answers)))


def _score_run(blocks: Iterable[Block], qrels: Callable[[], list[Qrel]], measures: list,
               answers: dict[str, list[str]], depth: int, run_name: str,
               batch_lines: int | None) -> tuple[dict[str, Any], dict[str, list[str]], set[str]]:
    """One pass over the run's queries: the qrels measures, each question's top `depth` doc ids
    (Acc@k) and the queries the run answers (the result's `run_depth`: the most hits of
    any query). The run's first batch is parsed before the
    qrels are read, so that a bad run line there is the error reported when both are wrong."""
    top: dict[str, list[str]] = {}
    queries: set[str] = set()
    run_depth = 0

    def noting_questions(blocks: Iterable[Block]) -> Iterator[Block]:
        nonlocal run_depth
        for qid, hits in blocks:
            queries.add(qid)
            run_depth = max(run_depth, len(hits))
            if qid in answers:
                top[qid] = ranked(hits, depth)
            yield qid, hits

    passing = noting_questions(blocks)
    if measures:
        batches = _batches(passing, batch_lines or BATCH_LINES)
        head = next(batches, [])  # score cuts the same batches again: whole queries, same sizes
        result = score(chain(head, chain.from_iterable(batches)), qrels(), measures, run_name,
                       batch_lines)
    else:
        deque(passing, maxlen=0)  # Acc@k only: the pass is for `top`
        result = {"aggregate": {}, "per_query": {}}
    return result | {"run_depth": run_depth}, top, queries


def evaluate(
    run_path: Path, qrels_path: Path | None, out: Path | None, config: dict[str, Any],
    answers: Path | None = None, corpus: Path | None = None, batch_lines: int | None = None,
) -> dict[str, Any]:
    """Score a run (module docstring). The run is streamed query by query when each query's lines
    are together, as in every run this workflow writes; otherwise it is read whole first."""
    run_path = Path(run_path)
    names = config.get("measures", ["nDCG@10"])
    cutoffs = answer_recall.acc_cutoffs(names)
    measures = parse_measures([n for n in names if n not in cutoffs],
                              int(config.get("relevance_level", 1)))
    if measures and qrels_path is None:
        raise EvaluationError(f"measures {[str(m) for m in measures]} need --qrels")
    if cutoffs and (answers is None or corpus is None):
        raise EvaluationError(f"{', '.join(cutoffs)} need --answers (answers-<split>.parquet) and "
                              "--corpus (the dataset's corpus.parquet): a format dpr dataset")
    qrels = cache(lambda: read_qrels(qrels_path))  # read once, after the run's first batch
    questions = read_answers(answers) if cutoffs else {}
    if cutoffs and not questions:
        raise EvaluationError(f"answers file {answers} is empty")
    depth = max(cutoffs.values(), default=0)
    try:
        result, top, queries = _score_run(_streamed_blocks(run_path), qrels, measures, questions,
                                          depth, str(run_path), batch_lines)
    except _NotGrouped as where:
        log.warning("%s; reading the run whole (memory grows with its length)", where)
        result, top, queries = _score_run(_blocks_in_memory(run_path), qrels, measures, questions,
                                          depth, str(run_path), batch_lines)
    if cutoffs:
        mode = config.get("answer_match", "string")
        found = score_answers(top, queries, questions, answers, corpus, cutoffs, mode,
                              str(run_path))
        for key in ("aggregate", "per_query"):
            result[key] |= found.pop(key)
        result |= found | {"answers": str(answers), "answer_match": mode}
        result.setdefault("queries", found["questions"])
    result |= {
        "measures": [str(m) for m in measures] + list(cutoffs),
        "run": str(run_path),
        "qrels": str(qrels_path) if measures else None,
        "relevance_level": int(config.get("relevance_level", 1)),
        # Which run and which code gave these numbers, for the tables' provenance: the tables
        # are built later, perhaps from another checkout than the one that scored.
        "run_sha256": artifacts.sha256_once(run_path),
        "code_version": artifacts.code_version(),
    }
    _warn_if_shallow(result, names, str(run_path))
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
