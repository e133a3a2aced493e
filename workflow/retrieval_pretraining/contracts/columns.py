"""Reading Arrow list columns as NumPy arrays, which the writers' validators share.

Writer-side: imported by contracts' `__init__` modules and by stage modules, never by audit code
alone, so it holds nothing about how `audit` shows an artifact.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (values, offsets starting at 0)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    off = arr.offsets.to_numpy().astype(np.int64)
    return arr.flatten().to_numpy(), off - off[0]
