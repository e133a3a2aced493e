"""The figure contract: PNG figures (span lengths, loss curves, the analyses) and the numbers
behind each (analysis.py writes `x.png` with `x.json` and a manifest beside them; a loss curve is
drawn from metrics.jsonl beside it, span lengths from the span shards beside them).
"""
