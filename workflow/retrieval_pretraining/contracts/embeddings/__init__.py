"""The encoded corpus contract (results/index/{model}/{dataset}/{stage}/, written by encode.py).

shard-XXXX.npy holds one float vector per document of the shard's row range, in corpus order (a
plain .npy array, never a pickle); shard-XXXX.ids.parquet holds their doc ids in the same order
(row i = vector i); the manifest beside the .npy records the range, dimension and dtype.
"""

from __future__ import annotations

import pyarrow as pa

IDS_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False)])
