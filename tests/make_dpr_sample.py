"""Regenerate data/dpr-sample/ (deterministic): DPR-format files cut from the shipped Wikipedia text.

    .venv/bin/python tests/make_dpr_sample.py [--out data/dpr-sample]

1. The shipped dump excerpt (data/wikipedia/enwiki-sample/...shortened.bz2) is extracted with the
   project's own extract module (its default cleaning).
2. Each article in page order gives at most PASSAGES_PER_ARTICLE passages of 100 whitespace words,
   as DPR cut psgs_w100 (the title, then the article text, in disjoint 100-word blocks; the last
   block of an article may be shorter), until PASSAGES passages exist; ids run from 1.
   Written as psgs_w100.tsv: header `id text title`, tab-separated, CSV-quoted like DPR's file.
3. QUESTIONS (hand-written for this sample, not from NQ or TriviaQA) become nq-test.qa.csv in DPR's
   layout (question <tab> Python list literal of answers). The script checks that each answer is
   found (answers.has_answer) in the passage the question was written from.
4. TRAIN_QUESTIONS become biencoder-nq-train.json in DPR's training layout: positive_ctxs = the
   passage written from; hard_negative_ctxs = the other passages of the same article that contain
   no answer; negative_ctxs = the first two passages of the next article; scores are 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

import polars as pl  # noqa: E402

from retrieval_pretraining import extract  # noqa: E402
from retrieval_pretraining.answers import has_answer  # noqa: E402

DUMP = ROOT / "data/wikipedia/enwiki-sample/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
PASSAGES = 300
PASSAGES_PER_ARTICLE = 12
WORDS = 100

# (title of the article the question was written from, question, answers): hand-written.
QUESTIONS = [
    ("Albedo", "what is the albedo of fresh snow", ["0.9", "about 0.9"]),
    ("Alabama", "what is the capital of alabama", ["Montgomery"]),
    ("Abraham Lincoln", "in which state was abraham lincoln born", ["Kentucky"]),
    ("Aristotle", "who was aristotle's teacher in athens", ["Plato"]),
    ("Achilles", "who was the mother of achilles", ["Thetis"]),
    ("An American in Paris", "who composed an american in paris", ["George Gershwin", "Gershwin"]),
    ("Autism", "which gender is autism more common in", ["males", "boys"]),
    ("Anarchism", "what does anarchism consider the state to be",
     ["undesirable, unnecessary, and harmful"]),
    ("ASCII", "what does the abbreviation ascii stand for",
     ["American Standard Code for Information Interchange"]),
    ("ASCII", "which encoding overtook ascii on the web in 2007", ["UTF-8", "UTF8"]),
    ("Andre Agassi", "how many grand slam titles did andre agassi win", ["eight", "8"]),
    # Its answer is in no passage of the sample: a question every system misses.
    (None, "who painted the mona lisa", ["Leonardo da Vinci"]),
]
TRAIN_QUESTIONS = [
    ("Alabama", "what river is the state of alabama named after", ["Alabama River"]),
    ("Achilles", "which king of the myrmidons was the father of achilles", ["Peleus"]),
    ("Aristotle", "which macedonian prince did aristotle tutor", ["Alexander the Great"]),
]


def articles() -> pl.DataFrame:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "articles.parquet"
        extract.extract(DUMP, out, {"processes": 1})
        return pl.read_parquet(out).sort("page_id")


def passages(frame: pl.DataFrame) -> list[tuple[str, str, str]]:
    """(id, text, title) in DPR's manner, PASSAGES_PER_ARTICLE at most per article."""
    rows: list[tuple[str, str, str]] = []
    for title, text in frame.select("title", "text").iter_rows():
        words = f"{title} {text}".split()
        for start in range(0, min(len(words), WORDS * PASSAGES_PER_ARTICLE), WORDS):
            rows.append((str(len(rows) + 1), " ".join(words[start:start + WORDS]), title))
            if len(rows) == PASSAGES:
                return rows
    return rows


def source_passage(rows, title: str, answers: list[str]) -> tuple[str, str, str]:
    for row in rows:
        if row[2] == title and has_answer(row[1], answers):
            return row
    raise SystemExit(f"no passage of {title!r} holds any of {answers}: fix the question")


def context(row) -> dict:
    return {"title": row[2], "text": row[1], "score": 0, "title_score": 0, "passage_id": row[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data/dpr-sample")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    rows = passages(articles())
    with open(out / "psgs_w100.tsv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows(rows)
    with open(out / "nq-test.qa.csv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        for title, question, answers in QUESTIONS:
            if title is None:
                assert not any(has_answer(r[1], answers) for r in rows), question
            else:
                source_passage(rows, title, answers)
            writer.writerow([question, repr(answers)])
    titles = [t for t in dict.fromkeys(r[2] for r in rows)]
    records = []
    for title, question, answers in TRAIN_QUESTIONS:
        positive = source_passage(rows, title, answers)
        following = titles[(titles.index(title) + 1) % len(titles)]
        records.append({
            "dataset": "dpr-sample (hand-written)", "question": question, "answers": answers,
            "positive_ctxs": [context(positive)],
            "negative_ctxs": [context(r) for r in rows if r[2] == following][:2],
            "hard_negative_ctxs": [context(r) for r in rows if r[2] == title
                                   and r is not positive and not has_answer(r[1], answers)][:3],
        })
    (out / "biencoder-nq-train.json").write_text(json.dumps(records, indent=4, ensure_ascii=False)
                                                 + "\n", encoding="utf-8")
    print(f"{len(rows)} passages, {len(QUESTIONS)} test and {len(records)} training questions "
          f"-> {out}")


if __name__ == "__main__":
    main()
