"""The texts of a pre-training corpus that is not Wikipedia, as the chunk stage reads articles.

A `corpus.corpora` entry (resolved by corpora.py) names a `datasets` entry's corpus, a BEIR
folder, or a JSONL / TSV file of texts; dataset_files.py reads each, batch by batch (never the
whole collection). Each document becomes one "article" row:
- page_id = its 0-based position in the collection (file order): a document id may be any string,
  a chunk_id needs an integer below 2**47 (contracts/chunks/). The manifest says so.
- text = its text, with its title by the entry's `title` mode: none = the text alone; space =
  title + " " + text (BEIR's title + text); sep = the title as the text's first paragraph (a chunk
  may hold no [SEP] inside it, so the separator becomes the paragraph break the chunker respects).
  Beyond that a text has the paragraphs its own blank lines give it (usually none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pyarrow as pa

from . import dataset_files
from .config import ConfigError, resolve_path

def _joined(frame: pl.DataFrame, mode: str) -> pl.Series:
    text, title = pl.col("text").fill_null(""), pl.col("title").fill_null("")
    if mode == "none":
        return frame.select(text)["text"]
    glue = "\n\n" if mode == "sep" else " "
    return frame.select(pl.when(title == "").then(text).otherwise(title + glue + text)
                        .alias("text"))["text"]


def document_batches(
    spec: dict[str, Any], data_root: str | None, downloads: Path | None = None
) -> tuple[Iterator[pl.DataFrame], dict[str, Path], str]:
    """(doc_id/title/text frames, the files read, the collection as a message names it)."""
    source = spec["source"]
    if source == "dataset":
        entry = spec["dataset"]
        batches, inputs = dataset_files.corpus_batches(entry, data_root, downloads)
        return batches, inputs, dataset_files.corpus_source(entry, data_root, downloads)
    path = resolve_path(spec["path"], data_root)
    if source == "beir":
        path = path / "corpus.jsonl"
        return dataset_files.read_jsonl_corpus_batches(path), {"corpus": path}, str(path)
    if source == "jsonl":
        batches = dataset_files.read_jsonl_corpus_batches(path, require_id=False)
        return batches, {"corpus": path}, str(path)
    if source == "tsv":
        member = spec.get("member")
        batches = dataset_files.read_corpus_tsv_batches(path, member)
        return batches, {"corpus": path}, f"{path}!{member}" if member else str(path)
    raise ConfigError(f"corpus {spec.get('name')!r}: source {source!r} is not a text collection "
                      f"(wikipedia corpora are chunked from --articles)")


def text_batches(
    spec: dict[str, Any], data_root: str | None, downloads: Path | None = None,
    batch_size: int = 1024,
) -> tuple[Iterator[pa.RecordBatch], dict[str, Path], str]:
    """The collection as (page_id, text) record batches of at most `batch_size` documents."""
    frames, inputs, where = document_batches(spec, data_root, downloads)

    def batches() -> Iterator[pa.RecordBatch]:
        position = 0
        for frame in frames:
            texts = _joined(frame, spec["title"]).to_arrow().cast(pa.large_string())
            ids = pa.array(range(position, position + frame.height), pa.int64())
            position += frame.height
            # The two columns the chunk stage reads of an articles file (contracts/articles/).
            table = pa.Table.from_arrays([ids, texts], names=["page_id", "text"])
            yield from table.to_batches(max_chunksize=batch_size)

    return batches(), inputs, where

