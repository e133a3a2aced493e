"""The encoded corpus contract (results/index/{model}/{dataset}/{stage}/, written by encode.py).

shard-XXXX.npy holds one float vector per document of the shard's row range, in corpus order (a
plain .npy array, never a pickle); shard-XXXX.ids.parquet holds their doc ids in the same order
(row i = vector i); the manifest beside the .npy records the range, dimension and dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from ...errors import InputFileError, reading

IDS_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False)])


def load_shards(npy_files: Sequence[Path], id_files: Sequence[Path]) -> tuple[np.ndarray, list[str]]:
    """Concatenate encoded shards (float32) and their doc ids, checking that each pair matches
    (here, not in encode.py: the index build reads shards without importing torch)."""
    vectors, ids = [], []
    for npy, id_file in zip(npy_files, id_files, strict=True):
        with reading(npy, "a .npy array"):
            block = np.load(npy, allow_pickle=False)
        with reading(id_file, "a doc ids Parquet file"):
            block_ids = pl.read_parquet(id_file)["doc_id"].to_list()
        if len(block) != len(block_ids):
            raise InputFileError(f"{npy} has {len(block)} rows but {id_file} has "
                                 f"{len(block_ids)} ids; re-run the encode_corpus job of that shard")
        vectors.append(block.astype(np.float32))
        ids.extend(block_ids)
    return np.concatenate(vectors), ids
