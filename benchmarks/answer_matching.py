"""Acc@k's answer matching (answer_accuracy.top_k_accuracy) at TriviaQA's test size: wall and CPU
seconds, and a hash of every per-question score, so that two versions of the code can be compared.

    PYTHONPATH=workflow .venv/bin/python benchmarks/answer_matching.py [--questions 11313]

TriviaQA's DPR test split: 11,313 questions, each scored over its top 100 passages, with many
answer aliases. Here: passages are 100-word windows of the shipped DPR sample's Wikipedia text
(real words, case and punctuation), tiled to `--corpus` passages with fresh ids; each question
retrieves 100 of them at random (so few passages are shared) and carries `--aliases` answers,
word runs of 2-4 words of that text in varied case (some found in a passage, most not). The
corpus is read from Parquet as the stage reads it. `--mode regex` matches the same answers as
CuratedTREC's patterns (escaped, so that they compile).
"""

import argparse
import hashlib
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from retrieval_pretraining import answer_accuracy, answers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=11_313)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--corpus", type=int, default=1_000_000)
    parser.add_argument("--aliases", type=int, default=15)
    parser.add_argument("--mode", choices=answers.MATCH_MODES, default="string")
    args = parser.parse_args()
    rng = random.Random(0)
    lines = (ROOT / "data/dpr-sample/psgs_w100.tsv").read_text(encoding="utf-8").splitlines()[1:]
    words = " ".join(line.split("\t")[1] for line in lines).split()
    starts = [rng.randrange(len(words) - 100) for _ in range(args.corpus)]
    texts = [" ".join(words[s:s + 100]) for s in starts]
    ids = [str(i) for i in range(args.corpus)]
    cases = (str, str.lower, str.upper, str.title)
    gold, ranked = {}, {}
    for q in range(args.questions):
        aliases = []
        for _ in range(args.aliases):
            s = rng.randrange(len(words) - 4)
            aliases.append(rng.choice(cases)(" ".join(words[s:s + rng.randint(2, 4)])))
        if args.mode == "regex":
            aliases = [re.escape(a) for a in aliases]
        gold[str(q)] = aliases
        ranked[str(q)] = [ids[i] for i in rng.sample(range(args.corpus), args.depth)]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.parquet"
        pq.write_table(pa.table({"doc_id": ids, "title": ids, "text": texts}), corpus)
        del texts
        t0, c0 = time.perf_counter(), time.process_time()
        scores = answer_accuracy.top_k_accuracy(ranked, gold, corpus,
                                                {"Acc@5": 5, "Acc@20": 20, "Acc@100": 100},
                                                args.mode)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    digest = hashlib.sha256(json.dumps(scores, sort_keys=True).encode()).hexdigest()
    print(json.dumps({"questions": args.questions, "depth": args.depth, "corpus": args.corpus,
                      "aliases": args.aliases, "mode": args.mode, "wall_s": round(wall, 1),
                      "cpu_s": round(cpu, 1),
                      **{m: round(sum(v.values()) / len(v), 4) for m, v in scores.items()},
                      "per_question_sha256": digest}))


if __name__ == "__main__":
    main()
