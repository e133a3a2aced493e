"""Answer matching as DPR scores open-domain QA retrieval: has_answer, the answers filter.

A passage answers a question when one of the question's answer strings occurs in it after DPR's
normalisation (DPR `dpr/data/qa_validation.py`, Pyserini `pyserini.eval.evaluate_dpr_retrieval`;
the facts are restated here, the code is ours):

- both texts are Unicode NFD-normalised;
- both are cut into tokens: a maximal run of letters, digits and marks (Unicode categories L*, N*,
  M*) is one token; any other character that is neither a separator (Z*) nor "other" (C*: control,
  format, unassigned) is a token of its own (so punctuation matters: "U.S." is u . s .);
- tokens are lower-cased (str.lower);
- string mode: the answer's token sequence occurs contiguously in the passage's tokens;
  regex mode (CuratedTREC): the NFD answer, compiled case-insensitively as a regular expression,
  is found anywhere in the NFD passage (a pattern that does not compile never matches).
- Only the passage TEXT is matched, never its title (as both DPR and Pyserini do), and as DPR's
  loader (`dpr/data/retriever_data.py`, CsvCtxSrc) holds it: psgs_w100's text column with '"'
  stripped from both ends (`passage_text`), so a quote that opens or closes a passage is no token
  of it (an answer `"Weird Al"` is not found in a passage `"Weird Al" Yankovic is ...`).
- An answer with no token is found in every passage, an empty one included: DPR's loop (and
  Pyserini's copy) compares the answer's tokens with the passage's at len(passage) - len(answer)
  + 1 positions, and the empty list equals the empty slice at position 0. So its question is
  answered by whatever passage comes first, for Acc@k as for DPR. The dataset stage keeps such
  answers (counted). In regex mode a pattern that matches the empty text is found likewise.
- The answers negative filter ignores an answer found in every passage (`answer_exclusions`):
  it tells no passage from another, and followed literally it would leave its question no
  negative.

Top-k accuracy (`Acc@k`) is scored in answer_accuracy.py, apart from this rule: dataset
preparation, BM25 negatives and mining run this file, so an edit here reruns every fine-tuning.

Passage texts are read from corpus.parquet in record batches, keeping only the passages a run or a
candidate list names, so the 21M-passage corpus is never held in memory; each needed passage is
tokenised once however many questions retrieved it, and each question's answers once however many
passages it retrieved (compiled once, in regex mode).
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import BadInput, reading

MATCH_MODES = ("string", "regex")
CORPUS_READ_ROWS = 65_536


class AnswerError(BadInput, ValueError):
    """An answers file, a corpus or a measure cannot be used as given."""


def _ranges(predicate, first: int, last: int) -> str:
    """A character class body covering every code point in [first, last] with
    `predicate(category)`."""
    parts, start = [], None
    for code in range(first, last + 2):
        inside = code <= last and predicate(unicodedata.category(chr(code)))
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            end = code - 1
            parts.append(re.escape(chr(start))
                         + ("" if end == start else "-" + re.escape(chr(end))))
            start = None
    return "".join(parts)


@functools.cache
def _token_re() -> re.Pattern:
    # Built once from the unicodedata tables: stdlib `re` has no \p{..} classes. Each class is
    # split where the BMP ends: `re` tests a character against a class's BMP part by a table
    # lookup but scans its astral part range by range, for every character the table did not
    # match (each space and punctuation mark): 1.2 ms a 100-word passage, a million of them per
    # Acc@100 at TriviaQA's size. The astral parts are tried only after a one-range test says a
    # character is astral, and a word's BMP characters are taken as a run: 0.1 ms, the same
    # tokens (tests/test_dpr.py checks every code point).
    word, space = (lambda c: c[0] in "LNM"), (lambda c: c[0] in "ZC")
    bmp, top = 0xFFFF, sys.maxunicode
    astral = f"[{chr(bmp + 1)}-{chr(top)}]"
    return re.compile(
        f"(?:[{_ranges(word, 0, bmp)}]+|(?={astral})[{_ranges(word, bmp + 1, top)}])+"
        f"|[^{_ranges(space, 0, bmp)}{chr(bmp + 1)}-{chr(top)}]"
        f"|(?={astral})[^{_ranges(space, bmp + 1, top)}]")


def tokens(text: str) -> list[str]:
    """DPR's SimpleTokenizer words, lower-cased, of the NFD form of `text`."""
    return [t.lower() for t in _token_re().findall(unicodedata.normalize("NFD", text))]


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    if n == 0:
        return True  # DPR's loop: [] equals the empty slice at position 0 of any passage
    first, i = needle[0], -1
    try:
        while True:  # list.index finds each place the first token occurs, in C
            i = haystack.index(first, i + 1)
            if haystack[i:i + n] == needle:
                return True
    except ValueError:
        return False


def _compiled(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error:
        return None


def _regex_match(text: str, pattern: str) -> bool:
    compiled = _compiled(pattern)
    return compiled is not None and compiled.search(text) is not None


def passage_text(text: str | None) -> str:
    """What DPR matches answers in: a passage's text with '"' stripped from both ends, as its
    CsvCtxSrc loads psgs_w100 (after csv unquoting, which the corpus has already done)."""
    return (text or "").strip('"')


def has_answer(text: str, answers: Iterable[str], mode: str = "string") -> bool:
    """Whether passage `text` contains one of `answers` (DPR's rule, module docstring)."""
    text = passage_text(text)
    if mode == "regex":
        text = unicodedata.normalize("NFD", text)
        return any(_regex_match(text, unicodedata.normalize("NFD", a)) for a in answers)
    if mode != "string":
        raise AnswerError(f"answer match mode {mode!r} unknown; use one of {', '.join(MATCH_MODES)}")
    words = tokens(text)
    return any(_contains(words, tokens(a)) for a in answers)


def read_answers(path: str | Path) -> dict[str, list[str]]:
    """{query_id: [answer, ...]} from an answers-{split}.parquet file (datasets contract)."""
    with reading(path, "an answers Parquet file"):
        table = pq.read_table(path, columns=["query_id", "answers"])
    return dict(zip(table["query_id"].to_pylist(), table["answers"].to_pylist()))


def matching_pairs(pairs: dict[str, set[str]], answers: dict[str, list[str]], corpus: Path,
                   mode: str = "string") -> dict[str, set[str]]:
    """{query_id: {doc_id whose text has one of the query's answers}} for the (query -> doc ids)
    `pairs`, streaming `corpus` (corpus.parquet) once. A doc id the corpus lacks is an error."""
    wanted: dict[str, list[str]] = {}
    for qid, docs in pairs.items():
        for doc in docs:
            wanted.setdefault(doc, []).append(qid)
    hits: dict[str, set[str]] = {qid: set() for qid in pairs}
    if not wanted:
        return hits
    value_set = pa.array(sorted(wanted), pa.string())
    found = 0
    prepared: dict[str, list] = {}  # each question's answers, tokenised or compiled once
    with reading(corpus, "a corpus Parquet file"):
        batches = pq.ParquetFile(corpus).iter_batches(CORPUS_READ_ROWS, columns=["doc_id", "text"])
        for batch in batches:
            batch = batch.filter(pc.is_in(batch.column("doc_id"), value_set=value_set))
            for doc, text in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist()):
                found += 1
                passage = _prepared_passage(passage_text(text), mode)
                for qid in wanted[doc]:
                    if qid not in prepared:
                        prepared[qid] = _prepared_answers(answers.get(qid, ()), mode)
                    if _passage_matches(passage, prepared[qid], mode):
                        hits[qid].add(doc)
    if found < len(wanted):
        raise AnswerError(
            f"{corpus}: {len(wanted) - found} of the {len(wanted)} passages to match are not in "
            "the corpus (e.g. a run of another corpus); score the run against its own dataset")
    return hits


def _prepared_passage(text: str, mode: str) -> list[str] | str:
    """What has_answer matches answers against: the text's tokens, or its NFD form (regex)."""
    return unicodedata.normalize("NFD", text) if mode == "regex" else tokens(text)


def _prepared_answers(answers: Iterable[str], mode: str) -> list:
    """A question's answers as has_answer matches them: token lists (a token-less one matches
    every passage) or compiled NFD patterns (ones that do not compile dropped: they never match).
    Done once per question, not once per retrieved passage: TriviaQA's questions carry many
    aliases, and 100 passages each."""
    if mode == "regex":
        compiled = (_compiled(unicodedata.normalize("NFD", a)) for a in answers)
        return [c for c in compiled if c is not None]
    if mode != "string":
        raise AnswerError(
            f"answer match mode {mode!r} unknown; use one of {', '.join(MATCH_MODES)}")
    return [tokens(a) for a in answers]


def _passage_matches(passage: list[str] | str, answers: list, mode: str) -> bool:
    if mode == "regex":
        return any(pattern.search(passage) is not None for pattern in answers)
    return any(_contains(passage, needle) for needle in answers)


NEGATIVE_FILTERS = ("qrels", "answers")


def found_everywhere(answer: str, mode: str = "string") -> bool:
    """Whether has_answer finds `answer` in every passage: exactly when it finds it in the empty
    text (no token; in regex mode, a pattern that matches the empty text, e.g. "" or "x?")."""
    return has_answer("", [answer], mode)


def answer_exclusions(candidates: dict[str, list[str]], negative_filter: str,
                      answers_path: Path | None, corpus: Path | None,
                      mode: str = "string") -> dict[str, set[str]]:
    """Per query, the candidates that may not be negatives beyond its qrels positives: with
    `negative_filter: answers` (DPR's and Tevatron's policy for NQ/TriviaQA) every candidate whose
    text has one of the query's answers, matched as `mode` (the dataset's evaluate splits'
    answer_match, so that no passage Acc@k counts as an answer becomes a negative), save the
    answers found in every passage (`found_everywhere`: they would exclude every candidate);
    with `qrels`, none."""
    if negative_filter not in NEGATIVE_FILTERS:
        raise AnswerError(f"negative_filter {negative_filter!r} unknown; use qrels or answers")
    if mode not in MATCH_MODES:
        raise AnswerError(f"answer_match {mode!r} unknown; use one of {', '.join(MATCH_MODES)}")
    if negative_filter == "qrels":
        return {}
    if answers_path is None or corpus is None:
        raise AnswerError("negative_filter answers needs --answers (answers-<split>.parquet) and "
                          "--corpus (corpus.parquet): a format dpr dataset")
    answers = {q: [a for a in found if not found_everywhere(a, mode)]
               for q, found in read_answers(answers_path).items()}
    return matching_pairs({q: set(d) for q, d in candidates.items()}, answers, corpus, mode)
