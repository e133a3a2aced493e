"""The negatives contract: BM25 negatives (results/bm25/{dataset}/negatives.parquet, bm25.py) and
mined hard negatives (results/finetune/.../hard-negatives.parquet, mine.py).

One row per training query: its positives, then its negatives in rank order with their 1-based
search ranks (mined: and their scores; `source: dpr`: positions in DPR's listed negatives;
`source: triples`: -1, the file being unranked). No query's own positive is ever one of its
negatives, unless the mining policy is `positives_removed: first_query` (the BoW authors' miner,
replicated on request: mine.py); the manifest records the policy and the seed.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("query_id", pa.string()),
        ("positive_ids", pa.list_(pa.string())),
        ("negative_ids", pa.list_(pa.string())),
        ("negative_ranks", pa.list_(pa.int32())),
    ]
)
# The BM25 columns plus each negative's score (mine.py has always declared query_id non-null).
MINED_SCHEMA = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("positive_ids", pa.list_(pa.string())),
        pa.field("negative_ids", pa.list_(pa.string())),
        pa.field("negative_ranks", pa.list_(pa.int32())),
        pa.field("negative_scores", pa.list_(pa.float32())),
    ]
)
