"""The run contract (results/runs/{dataset}/{system}/{split}.trec: bm25.py, dense_search.py).

TREC format, one hit per line: `query_id Q0 doc_id rank score tag`; per query, ranks 1..k in order,
scores non-increasing, no document twice. evaluate.py parses runs strictly and fails on anything
else (its `read_run`).
"""
