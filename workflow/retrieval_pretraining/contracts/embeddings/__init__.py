"""The encoded corpus contract (results/index/{model}/{dataset}/{stage}/, written by encode.py).

shard-XXXX.npy holds one float vector per document of the shard's row range, in corpus order (a
plain .npy array, never a pickle); shard-XXXX.ids.parquet holds their doc ids in the same order
(row i = vector i); the manifest beside the .npy records the range, dimension, dtype and the
.npy file's sha256.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import InputFileError, reading

IDS_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False)])
# Rows per float32 block read from a shard: 48 MB at 768-d, a few ms of FAISS adds each.
BLOCK_ROWS = 16_384


def open_shards(npy_files: Sequence[Path], id_files: Sequence[Path]) -> tuple[list[np.ndarray], list[str]]:
    """Each encoded shard memory-mapped (nothing read yet) and all doc ids in order, checking that
    each pair matches and that the shards share one dimension (here, not in encode.py: the index
    build reads shards without importing torch)."""
    shards, ids = [], []
    for npy, id_file in zip(npy_files, id_files, strict=True):
        with reading(npy, "a .npy array"):
            block = np.load(npy, mmap_mode="r", allow_pickle=False)
        with reading(id_file, "a doc ids Parquet file"):
            block_ids = pq.read_table(id_file, columns=["doc_id"]).column("doc_id").to_pylist()
        if block.ndim != 2 or block.dtype.kind != "f":
            raise InputFileError(f"{npy} holds a {block.dtype} array of shape {block.shape}, not one "
                                 "float vector per row; re-run the job that encoded that shard "
                                 "(encode_corpus_shard, or encode_baseline_shard)")
        if shards and block.shape[1] != shards[0].shape[1]:
            raise InputFileError(f"{npy} has {block.shape[1]}-d vectors but {npy_files[0]} has "
                                 f"{shards[0].shape[1]}-d; encode every shard with the same model")
        if len(block) != len(block_ids):
            raise InputFileError(f"{npy} has {len(block)} rows but {id_file} has "
                                 f"{len(block_ids)} ids; re-run the job that encoded that shard "
                                 "(encode_corpus_shard, or encode_baseline_shard)")
        shards.append(block)
        ids.extend(block_ids)
    return shards, ids


def float32_blocks(shards: Sequence[np.ndarray], rows: int = BLOCK_ROWS) -> Iterator[np.ndarray]:
    """The shards' vectors in order as float32, `rows` at a time: a consumer that adds them to an
    index holds one block beside it, never a second copy of the corpus."""
    for shard in shards:
        for start in range(0, len(shard), rows):
            yield np.ascontiguousarray(shard[start:start + rows], dtype=np.float32)
