"""The scores contract (results/metrics/{dataset}/{system}/{split}.json, written by evaluate.py).

{"aggregate": {measure: value}, "per_query": {measure: {query_id: value}}, "run": path,
"qrels": path, "measures": [...], "queries": n, "queries_missing_from_run": n,
"run_queries_without_qrels": n, "run_depth": n, ...}, with ir_measures' measure names; every qrels
query is scored (0 when the run misses it, but NumQ 1 and NumRel its relevant documents, as
trec_eval -c counts it), a run query without qrels is not (trec_eval), so
each aggregate is the mean of its per-query values (the total for ir_measures' counts, NumQ,
NumRet, NumRel, NumRelRet, as it and trec_eval sum them); each of those two counts (and Acc@k's
"questions_missing_from_run", "run_queries_without_answers") comes with "<count>_examples", a few
of its ids (evaluate.EXAMPLE_IDS, sorted); `run_depth` is the most hits of any query,
`run_sha256` and `code_version` name the run file and the code that scored it. The file carries
its own statistics: it has no manifest beside it.
"""
