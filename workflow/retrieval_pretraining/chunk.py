"""Stage 3: tokenise the articles and cut them into word-aligned chunks of at most max_len tokens.

How a text is cut is chunker.py's (its docstring lists the rules); what a chunk row must be is the
chunks contract (contracts/chunks/). This module runs the cutting over the whole corpus:
- Every row is validated in the stage (in the worker that built it) by the contract's validator:
  [CLS] text [SEP] within max_len, no special token inside the text, word_starts exactly the text's
  word-starting tokens, chunk_id formed from page_id and chunk_index; after sorting, no chunk_id
  twice.
- The chunk set, its ids and each chunk's shard (page_id % shards) depend on neither the process
  count nor the batch size.

Input: article Parquet parts (page_id, text) for a Wikipedia corpus, or any other text collection
of a `corpus.corpora` entry (a dataset's corpus, a BEIR folder, a JSONL or TSV file: corpus_texts.py
streams it as (page_id = position, text) batches). Output: one Parquet file per shard + a manifest
beside each, recording the corpus name and source.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import artifacts, corpus_texts, parallel
from .chunker import ChunkConfig, Chunker
from .corpora import SOURCE_KEYS
from .config import ConfigError, stage_parser
from .contracts.chunks import CHUNK_INDEX_BITS, SCHEMA, check_order, validate_chunks
from .errors import InputFileError, command, reading
from .wordpiece import check_max_len, tokenizer_info

log = logging.getLogger(__name__)

# Phase 1: the main process reads batches of articles and hands them out as Arrow batches (cheap to
# send); a worker tokenises, cuts and validates a batch and appends each shard's rows to its own
# spill stream. Only statistics travel back, so the main process stays nearly idle and leaves the
# cores to the tokenizer. Phase 2 (per shard, in the same workers) gathers that shard's streams,
# merges them in chunk_id order, checks that no chunk_id occurs twice and writes the Parquet file.

_WORKER: Chunker | None = None
_SPILL: _SpillStreams | None = None


class _SpillStreams:
    """This process's spill: one Arrow IPC stream per shard, `<spill_dir>/<pid>-<shard>.arrows`.

    The streams are unbuffered and never closed: a stream without its end marker reads up to the
    end of the file, and every write has returned before the task's statistics reach the main
    process, so phase 2 (which starts after the last result) sees every row.
    """

    def __init__(self, spill_dir: str):
        self.spill_dir = Path(spill_dir)
        self.streams: dict[int, pa.ipc.RecordBatchStreamWriter] = {}

    def write(self, shard: int, batch: pa.RecordBatch) -> None:
        if shard not in self.streams:
            sink = pa.OSFile(str(self.spill_dir / f"{os.getpid()}-{shard:04d}.arrows"), "wb")
            self.streams[shard] = pa.ipc.new_stream(sink, SCHEMA)
        self.streams[shard].write_batch(batch)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()


def _init_worker(checkpoint_dir: str, cfg: ChunkConfig, spill_dir: str) -> None:
    global _WORKER, _SPILL
    _WORKER = Chunker(checkpoint_dir, cfg)
    _SPILL = _SpillStreams(spill_dir)


def _work(articles: pa.RecordBatch) -> Counter:
    """Phase 1 for one batch of articles: chunk, validate and spill it; return statistics."""
    page_ids = articles.column("page_id").to_numpy(zero_copy_only=False).astype(np.int64)
    batch, stats = _WORKER.chunk_batch(page_ids, articles.column("text").to_pylist())
    # Every row is checked here, in the workers, while the batch is small and in cache.
    validate_chunks(
        batch,
        _WORKER.cfg.max_len,
        _WORKER.continues_word,
        (_WORKER.cls_id, _WORKER.sep_id),
        f"chunks of page_id {page_ids.min()}..{page_ids.max()}" if len(page_ids) else "",
    )
    shard = batch.column("page_id").to_numpy() % _WORKER.cfg.shards
    for i in np.unique(shard):
        _SPILL.write(int(i), batch.filter(pa.array(shard == i)))
    return stats


def _article_batches(paths: Sequence[Path], batch_size: int) -> Iterator[pa.RecordBatch]:
    for path in paths:
        with reading(path, "an articles Parquet file"):
            handle = pq.ParquetFile(path)
        missing = {"page_id", "text"} - set(handle.schema_arrow.names)
        if missing:
            raise InputFileError(
                f"{path}: articles lack column(s) {sorted(missing)}; re-run extract_articles"
            )
        for batch in handle.iter_batches(batch_size=batch_size, columns=["page_id", "text"]):
            bounds = pc.min_max(batch.column("page_id"))
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is not None and (low < 0 or high >= 1 << (63 - CHUNK_INDEX_BITS)):
                raise InputFileError(f"{path}: page_id outside [0, 2**47) cannot form a chunk_id")
            yield batch


def _binned(histogram: np.ndarray, bins: int = 32) -> dict[str, Any]:
    """A length histogram for a manifest: counts of lengths [i * width, (i + 1) * width)."""
    width = max(1, (len(histogram) - 1) // bins)  # max_len 512 -> width 16, 33 bins
    counts = np.add.reduceat(histogram, np.arange(0, len(histogram), width))
    return {"bin_width": width, "counts": counts.tolist(), "max_len_chunks": int(histogram[-1])}


# Rows per Parquet row group of a shard (~50 MB of token ids at 512 tokens): phase 2 holds one row
# group and one spilled batch per stream, never the shard.
ROW_GROUP_ROWS = 16_384


class _RunsOutOfOrder(Exception):
    """A spilled batch is unsorted or overlaps one already written: the shard needs a sort."""


def _merged_runs(streams: Sequence[Path]) -> Iterator[pa.RecordBatch]:
    """The spilled batches ("runs") of every process's stream in chunk_id order, one run per
    stream read at a time.

    Articles read in page order (a dump's, a collection's) make every run sorted and every
    stream's runs increasing (a worker finishes one batch before it takes the next), so a merge
    of whole runs is the sort. Each run is checked to be sorted and to start after the last one
    yielded (so the output is strictly increasing: no chunk_id twice); a run that is not raises
    _RunsOutOfOrder."""
    readers = [pa.ipc.open_stream(pa.OSFile(str(path))) for path in streams]  # read, not mapped
    heads: dict[int, pa.RecordBatch] = {}

    def advance(k: int) -> None:
        for run in readers[k]:
            if run.num_rows:
                heads[k] = run
                return
        heads.pop(k, None)

    for k in range(len(readers)):
        advance(k)
    last = None
    while heads:
        k = min(heads, key=lambda j: heads[j].column("chunk_id")[0].as_py())
        run = heads[k]
        ids = run.column("chunk_id").to_numpy()
        if (np.diff(ids) <= 0).any() or (last is not None and ids[0] <= last):
            raise _RunsOutOfOrder
        last = ids[-1]
        yield run
        advance(k)


def _sorted_in_memory(streams: Sequence[Path]) -> pa.Table:
    """Every spilled row of a shard, sorted by chunk_id (articles not in page order)."""
    parts = []
    for path in streams:
        with pa.memory_map(str(path)) as source:
            parts.append(pa.ipc.open_stream(source).read_all())
    table = pa.concat_tables(parts) if parts else SCHEMA.empty_table()
    return table.take(pc.sort_indices(table["chunk_id"]))


def _write_shard(runs: Iterator[pa.RecordBatch], out: Path, cfg: ChunkConfig) -> dict[str, Any]:
    """Write rows in chunk_id order as row groups of ROW_GROUP_ROWS; return the shard's stats."""
    lengths = np.zeros(cfg.max_len + 1, dtype=np.int64)
    rows = pages = 0
    last_page = None

    def flush(writer: pq.ParquetWriter, table: pa.Table) -> None:
        nonlocal rows, pages, last_page
        # One contiguous chunk per column: the writer cuts data pages where a table's chunks meet,
        # so a row group written as the spilled runs would depend on --batch-size. The copy is
        # one row group (ROW_GROUP_ROWS at most), which phase 2 holds anyway.
        table = table.combine_chunks()
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        lengths[:] += np.bincount(pc.list_value_length(table["input_ids"]).to_numpy(
            zero_copy_only=False), minlength=cfg.max_len + 1)
        page_ids = table["page_id"].to_numpy()  # non-decreasing: rows are in chunk_id order
        pages += int((np.diff(page_ids) != 0).sum()) + int(page_ids[0] != last_page)
        rows, last_page = rows + table.num_rows, page_ids[-1]

    with artifacts.atomic_path(out) as tmp:
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer:
            pending: list[pa.RecordBatch] = []
            held = 0
            for run in runs:
                pending.append(run)
                held += run.num_rows
                while held >= ROW_GROUP_ROWS:
                    table = pa.Table.from_batches(pending, SCHEMA)
                    flush(writer, table.slice(0, ROW_GROUP_ROWS))
                    pending, held = table.slice(ROW_GROUP_ROWS).to_batches(), held - ROW_GROUP_ROWS
            if held:
                flush(writer, pa.Table.from_batches(pending, SCHEMA))
    log.info("shard -> %s: %d chunks", out, rows)
    return {"chunks": rows, "tokens": int((lengths * np.arange(len(lengths))).sum()),
            "pages": pages, "length_histogram": lengths.tolist()}


def _finish_shard(i: int, spill_dir: Path, out: Path, cfg: ChunkConfig) -> dict[str, Any]:
    """Phase 2 for one shard: its spilled rows in chunk_id order (a merge of whole runs, or a sort
    in memory when the articles were not in page order), no chunk_id twice, written."""
    streams = sorted(spill_dir.glob(f"*-{i:04d}.arrows"))
    try:
        stats, ordered_by = _write_shard(_merged_runs(streams), out, cfg), "merging runs"
    except _RunsOutOfOrder:  # the partial file was discarded (atomic_path)
        table = _sorted_in_memory(streams)
        check_order(table["chunk_id"].to_numpy(), str(out))
        stats, ordered_by = _write_shard(iter(table.to_batches()), out, cfg), "sorting in memory"
    return {"shard": i, **stats, "ordered_by": ordered_by}


def _first_page_id(path: Path) -> int | None:
    """The smallest page_id of an articles part (None: no rows, or no page_id column, which
    _article_batches reports): from the row groups' statistics, else from the column itself."""
    with reading(path, "an articles Parquet file"):
        handle = pq.ParquetFile(path)
    leaves = [handle.schema.column(c).path for c in range(len(handle.schema))]
    if "page_id" not in leaves:
        return None
    column = leaves.index("page_id")
    lows = []
    for g in range(handle.metadata.num_row_groups):
        group = handle.metadata.row_group(g)
        stats = group.column(column).statistics
        if group.num_rows and (stats is None or not stats.has_min_max):  # written without them
            return pc.min(handle.read(columns=["page_id"])["page_id"]).as_py()
        if group.num_rows:
            lows.append(stats.min)
    return min(lows, default=None)


def _in_page_order(paths: Iterator[Path]) -> list[Path]:
    """Article parts by their first page_id, then name. A dump's part names do not sort as text
    (`multistream10.xml-p4045403...` before `multistream2.xml-p41243...`, `multistream13.xml-
    p10672789...` before `multistream13.xml-p9172789...`), and parts read out of page order give a
    worker's spill stream a high-id run before a low-id one: phase 2 then sorts each shard in
    memory (~8x the memory of the merge) instead of merging runs."""
    def key(path: Path) -> tuple:
        first = _first_page_id(path)
        # An empty part (no first page) adds no rows; it goes first so the order stays total.
        return (first is not None, first or 0, path.name, str(path))

    return sorted(paths, key=key)


def _sources(
    article_paths: Sequence[str | os.PathLike], corpus: dict[str, Any] | None,
    data_root: str | None, downloads: Path | None, batch_size: int,
) -> tuple[Iterator[pa.RecordBatch], dict[str, Path], int | None]:
    """(page_id/text batches, the files read, how many documents when known beforehand)."""
    if corpus is not None and corpus.get("source", "wikipedia") != "wikipedia":
        if article_paths:
            raise ConfigError(f"corpus {corpus.get('name')!r} (source {corpus['source']}) reads "
                              "its own files; give no --articles")
        batches, inputs, _ = corpus_texts.text_batches(corpus, data_root, downloads, batch_size)
        return batches, inputs, None
    if not article_paths:
        raise ConfigError("a wikipedia corpus is chunked from --articles; give the article parts")
    article_paths = _in_page_order(Path(p) for p in article_paths)
    total_articles = 0
    for path in article_paths:
        with reading(path, "an articles Parquet file"):
            total_articles += pq.ParquetFile(path).metadata.num_rows
    inputs = {f"articles:{p.name}": p for p in article_paths}
    return _article_batches(article_paths, batch_size), inputs, total_articles


def chunk_corpus(
    article_paths: Sequence[str | os.PathLike],
    checkpoint_dir: str | os.PathLike,
    out_paths: Sequence[str | os.PathLike],
    cfg: ChunkConfig,
    processes: int = 1,
    batch_size: int = 1024,
    *,
    corpus: dict[str, Any] | None = None,
    data_root: str | None = None,
    downloads: Path | None = None,
) -> dict[str, Any]:
    """Chunk all articles (or the texts of `corpus`, a resolved corpus entry) into `out_paths`
    (shard i -> out_paths[i]); return corpus statistics."""
    out_paths = [Path(p) for p in out_paths]
    if len(out_paths) != cfg.shards:
        raise ConfigError(f"{len(out_paths)} output paths given for corpus.shards={cfg.shards}")
    check_max_len(cfg.max_len, checkpoint_dir, "corpus.max_len")
    info = tokenizer_info(checkpoint_dir)
    batches, inputs, total_articles = _sources(article_paths, corpus, data_root, downloads,
                                               batch_size)
    stats: Counter = Counter()
    out_paths[0].parent.mkdir(parents=True, exist_ok=True)
    # Named by the first shard, so a killed run's spill (every chunk row) is found by the rerun.
    with artifacts.temp_dir(out_paths[0], "spill") as spill_dir:
        started = time.perf_counter()
        worker_args = (str(checkpoint_dir), cfg, str(spill_dir))
        if processes > 1:
            # spawn: no tokenizer state is inherited; each worker loads its own, single-threaded.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        else:
            _init_worker(*worker_args)
        try:
            with parallel.process_pool(processes, "spawn", _init_worker, worker_args) as pool:
                # Phase 1: chunk batches (in parallel); each process spills its own rows per shard.
                tasks = ((batch,) for batch in batches)
                results = parallel.bounded_map(_work, tasks, pool, in_flight=2 * processes)
                try:
                    with tqdm(total=total_articles, unit="article", mininterval=10) as progress:
                        for batch_stats in results:
                            stats.update(batch_stats)
                            progress.update(batch_stats["articles"])
                finally:
                    if pool is None:
                        _SPILL.close()
                log.info("phase 1 (tokenise and cut) took %.1f s", time.perf_counter() - started)
                # Phase 2: per shard (in parallel), chunk_id order, check for duplicates, write.
                jobs = [(i, spill_dir, out, cfg) for i, out in enumerate(out_paths)]
                shard_stats = list(
                    parallel.bounded_map(_finish_shard, jobs, pool, in_flight=len(jobs))
                )
        except BrokenProcessPool as error:
            raise RuntimeError(
                "a chunking worker process died or failed to start (a worker's error, if it had "
                "one, is printed above; else killed for lack of memory?); nothing was written. "
                "Lower --processes (corpus.processes) or --batch-size and rerun"
            ) from error
        histogram = np.sum([s["length_histogram"] for s in shard_stats], axis=0, dtype=np.int64)
    totals = dict(stats)
    totals["chunks"] = int(histogram.sum())
    totals["tokens"] = int((histogram * np.arange(len(histogram))).sum())
    totals["text_tokens"] = totals["tokens"] - 2 * totals["chunks"]
    totals["length_histogram"] = _binned(histogram)
    for shard in shard_stats:
        shard["length_histogram"] = _binned(np.asarray(shard["length_histogram"]))
    tokenizer = {k: v for k, v in info.items() if k != "tokens"}
    inputs["tokenizer"] = Path(checkpoint_dir) / "tokenizer.json"
    params = asdict(cfg)
    if corpus is not None:  # which corpus, from where (a dataset entry, a file, the articles)
        params |= {k: corpus[k] for k in ("name", "source", *SOURCE_KEYS) if k in corpus}
    for out, shard in zip(out_paths, shard_stats):
        artifacts.write_manifest(
            artifacts.manifest_path(out),
            stage="chunk_articles",
            params=params,
            inputs=inputs,
            stats={
                "shard": shard,
                "corpus": totals,
                "tokenizer": tokenizer,
                "sharding": f"page_id % {cfg.shards}",
                "chunk_id": "(page_id << 16) + chunk_index",
                "page_id": "the article's page id" if total_articles is not None
                else "the document's 0-based position in the collection",
            },
        )
    log.info(
        "chunked %d articles into %d chunks, %d tokens in %.1f s",
        totals.get("articles", 0),
        totals["chunks"],
        totals["tokens"],
        time.perf_counter() - started,
    )
    return totals


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--articles", type=Path, nargs="*", default=[],
        help="article Parquet parts (a wikipedia corpus; other sources read their own files)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="tokenizer folder (rule stage_tokenizer) or a checkpoint folder",
    )
    parser.add_argument(
        "--out", type=Path, nargs="+", required=True, help="one path per shard, in order"
    )
    parser.add_argument("--processes", type=int, default=1, help="tokenizer processes (speed only)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1024,
        help="articles per task (speed only; small tasks cost the main process ~3 ms each)",
    )
    parser.add_argument("--data-root", help="config paths may also point inside this folder")
    parser.add_argument(
        "--downloads", type=Path, help="a dataset source's downloads folder (source: dataset)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = ChunkConfig.from_dict(args.config)
    chunk_corpus(
        args.articles,
        args.checkpoint,
        args.out,
        cfg,
        args.processes,
        args.batch_size,
        corpus=args.config if "source" in args.config else None,
        data_root=args.data_root,
        downloads=args.downloads,
    )


if __name__ == "__main__":
    main()
