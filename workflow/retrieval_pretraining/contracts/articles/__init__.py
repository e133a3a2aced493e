"""The articles contract (results/wikipedia/articles/{part}.parquet, written by extract.py).

One row per kept page, in dump order: page_id, title, the clean text (paragraphs separated by a
blank line, each heading its own paragraph) and the revision id.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA = pa.schema(
    [
        pa.field("page_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.large_string(), nullable=False),
        pa.field("revision_id", pa.int64(), nullable=False),
    ]
)
