"""Extract the articles of one Wikipedia dump part to Parquet (page id, title, clean text, revision id).

Input: a MediaWiki XML export (schema 0.10, 0.11, ...; with or without <siteinfo>) as plain XML, as
bz2 (single- or multi-stream) or as a multistream bz2 with its `offset:pageid:title` index. It is
read as a stream, never whole: without an index the main process decompresses and cuts the XML into
pages, and `processes` workers parse and clean them; with an index each worker decompresses its own
run of bz2 streams (seek + decompress), so decompression runs in parallel too. Either way the rows
come out in dump order, so the output does not depend on the process count or on the index.

Pages are cut at their <page> ... </page> tags (raw "<" cannot occur inside XML text) and each page
is parsed on its own, so one bad page is named by its id and byte offset. Decisions on bad input:
- truncated or corrupt bz2, malformed XML, a page without </page>, a missing </mediawiki>, an index
  that does not match the dump, a zero-byte file: error naming the file and byte offset (no output).
  An index and a dump that disagree (an offset where no bz2 stream starts, a page split across two
  of its streams, other page counts) are named both, with the offset, as of different dumps
  rather than damaged: re-downloading would fetch the same two files (dump_reader.py).
- a page that is not valid UTF-8: skipped, counted, its id listed in the manifest (one damaged page
  should not void a 20 GB part; the count makes it visible).
- a page without text (no <text> or deleted text), a redirect, a disambiguation page, another
  namespace, a non-wikitext content model (e.g. Wikidata JSON), clean text shorter than `min_chars`:
  dropped and counted.
- a well-formed dump with no pages: an empty Parquet file and a manifest saying so (plus a warning).

Disambiguation rule: a main-namespace page whose wikitext calls one of `disambiguation_templates`
(e.g. {{Disambiguation}}, {{geodis}}, {{hndis}}; case-insensitive, "_" = " ", optional "Template:").

Here: what a page says (parse_page) and the stage (extract). The bytes (format, bz2 streams,
cutting pages, the multistream index) are read by dump_reader.py; the wikitext is cleaned by
wikitext.py.
"""

from __future__ import annotations

import functools
import logging
import re
import time
import xml.etree.ElementTree as ET
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from . import artifacts, parallel, wikitext
from .config import refuse_unknown, section_schema, stage_parser
from .contracts.articles import SCHEMA
from .dump_reader import (
    CorruptStream,
    CutPage,
    CutStream,
    ExtractError,
    Stream,
    batched,
    decompress_bz2,
    detect_format,
    index_mismatch,
    indexed_range_error,
    plan_tasks,
    read_blocks,
    read_index,
    split_pages,
)
from .errors import command

log = logging.getLogger(__name__)

# Why a page was not kept; every page seen lands in exactly one of these or in "kept".
DROP_REASONS = (
    "redirect",
    "disambiguation",
    "other_namespace",
    "other_model",
    "no_text",
    "empty",
    "invalid_utf8",
)
PAGES_PER_BATCH = 64  # pages sent to a worker at once (no index)
ROWS_PER_GROUP = 2000  # Parquet row group: at most this many rows...
CHARS_PER_GROUP = 2 << 20  # ...or this many characters (keeps peak memory flat; see RESULTS.md)
LISTED_BAD_IDS = 100  # invalid-UTF-8 page ids listed in the manifest


@dataclass(frozen=True)
class Options:
    """What a worker needs to turn page XML into a row (picklable)."""

    drop_disambiguation: bool = True
    min_chars: int = 1
    disambiguation_templates: tuple[str, ...] = wikitext.DEFAULT_DISAMBIGUATION_TEMPLATES
    cleaner: wikitext.CleanerOptions = field(default_factory=wikitext.CleanerOptions)
    namespace_prefixes: frozenset[str] = frozenset()  # names of namespaces other than 0 (lowercase)


def site_options(header: bytes, name: str, base: Options) -> Options:
    """`base` plus the namespace names from <siteinfo>, if present (the file and category link
    prefixes in the wiki's language)."""
    if b"<mediawiki" not in header:
        raise ExtractError(
            f"{name}: no <mediawiki> root element before the first page; "
            "pass a MediaWiki XML export"
        )
    start, end = header.find(b"<siteinfo>"), header.find(b"</siteinfo>")
    if start < 0 or end < 0:
        return base
    try:
        siteinfo = ET.fromstring(header[start : end + len(b"</siteinfo>")])
    except ET.ParseError as error:
        raise ExtractError(f"{name}: malformed <siteinfo> ({error}); the file is damaged") from None
    names: dict[int, str] = {}
    for node in siteinfo.iter():
        if node.tag.rsplit("}", 1)[-1] == "namespace" and node.text:
            names[int(node.get("key", "0"))] = node.text.strip().lower()
    cleaner = base.cleaner
    files = set(cleaner.file_prefixes) | {names[k] for k in (6, -2) if k in names}
    categories = set(cleaner.category_prefixes) | ({names[14]} if 14 in names else set())
    return Options(
        drop_disambiguation=base.drop_disambiguation,
        min_chars=base.min_chars,
        disambiguation_templates=base.disambiguation_templates,
        cleaner=wikitext.CleanerOptions(
            file_prefixes=frozenset(files),
            category_prefixes=frozenset(categories),
            drop_sections=cleaner.drop_sections,
        ),
        namespace_prefixes=frozenset(v for k, v in names.items() if k != 0),
    )


# --- one page -> one row or a drop reason ---------------------------------------------------------
_PAGE_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")


@functools.lru_cache(maxsize=8)
def _disambiguation(names: tuple[str, ...]) -> re.Pattern:
    return wikitext.disambiguation_pattern(names)


def parse_page(offset: int, raw: bytes, name: str, options: Options) -> tuple[str, Any]:
    """('kept', row) or (drop reason, page id); malformed XML raises ExtractError."""
    try:
        text_xml = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        found = _PAGE_ID.search(raw)
        page_id = int(found.group(1)) if found else None
        log.warning(
            "%s: page %s at decompressed byte %d is not valid UTF-8 (%s): skipped",
            name,
            page_id,
            offset,
            error,
        )
        return "invalid_utf8", page_id
    try:
        page = ET.fromstring(text_xml)
    except ET.ParseError as error:
        found = _PAGE_ID.search(raw)
        raise ExtractError(
            f"{name}: malformed XML in page {found.group(1).decode() if found else '?'} at "
            f"decompressed byte {offset} ({error}); the file is damaged, re-download it"
        ) from None
    title = (page.findtext("title") or "").strip()

    def number(node: ET.Element | None, tag: str, default: int | None = None) -> int:
        value = node.findtext(tag) if node is not None else None
        if value is None and default is not None:
            return default
        try:
            return int(value or "")
        except ValueError:
            raise ExtractError(
                f"{name}: page {title!r} at decompressed byte {offset} has no numeric <{tag}> "
                f"({value!r}); the file is damaged, re-download it"
            ) from None

    page_id = number(page, "id")
    if page.find("ns") is not None:
        namespace = number(page, "ns")
    else:  # exports without <ns>: a known namespace prefix in the title says it is not an article
        prefix, colon, _ = title.partition(":")
        namespace = 1 if colon and prefix.lower() in options.namespace_prefixes else 0
    if namespace != 0:
        return "other_namespace", page_id
    revisions = page.findall("revision")
    revision = revisions[-1] if revisions else None  # full-history exports: the latest revision
    text_node = revision.find("text") if revision is not None else None
    wiki = text_node.text if text_node is not None else None
    if page.find("redirect") is not None or (wiki and wikitext.is_redirect(wiki)):
        return "redirect", page_id
    model = revision.findtext("model") if revision is not None else None
    if model is not None and model != "wikitext":
        return "other_model", page_id
    if not wiki or (text_node is not None and text_node.get("deleted") is not None):
        return "no_text", page_id
    if options.drop_disambiguation and _disambiguation(options.disambiguation_templates).search(
        wiki
    ):
        return "disambiguation", page_id
    clean = wikitext.clean(wiki, options.cleaner)
    if len(clean) < max(options.min_chars, 1):
        return "empty", page_id
    revision_id = number(revision, "id", default=-1)  # -1: an export without revision ids
    return "kept", (page_id, title, clean, revision_id)


def parse_batch(
    pages: list[tuple[int, bytes]], name: str, options: Options
) -> list[tuple[str, Any]]:
    return [parse_page(offset, raw, name, options) for offset, raw in pages]


# Errors reading an indexed stream's bytes that may be the index's, not the dump's.
_STREAM_ERRORS = (CorruptStream, CutStream, CutPage)


def parse_streams(
    path: Path, streams: list[Stream], last: bool, options: Options, index: Path
) -> tuple[list[tuple[str, Any]], int]:
    """Worker: decompress and parse a run of streams; check each against the index."""
    results: list[tuple[str, Any]] = []
    decompressed = 0
    for i, stream in enumerate(streams):
        name = f"{path} (stream at byte {stream.offset})"
        sizes: list[int] = []
        blocks = (
            sizes.append(len(block)) or block
            for block in decompress_bz2(
                read_blocks(path, stream.offset, stream.length), str(path), stream.offset
            )
        )
        is_last = last and i == len(streams) - 1  # the final stream is followed by </mediawiki>
        pages = ids = 0
        try:
            for offset, raw in split_pages(blocks, name, header=False, footer=is_last):
                pages += 1
                found = _PAGE_ID.search(raw)
                ids += int(found.group(1)) if found else 0
                results.append(parse_page(offset, raw, name, options))
        except _STREAM_ERRORS as error:
            end = stream.offset + stream.length
            raise indexed_range_error(path, index, stream.offset, end, error) from None
        decompressed += sum(sizes)
        if pages != stream.pages or ids != stream.id_sum:
            raise index_mismatch(
                path, index, stream.offset,
                f"the dump's stream there holds {pages} pages (id sum {ids}) but the index "
                f"lists {stream.pages} (id sum {stream.id_sum})",
            )
    return results, decompressed


# --- orchestration --------------------------------------------------------------------------------
def bounded_map(function, tasks: Iterable[tuple], processes: int) -> Iterator[Any]:
    """`function(*task)` for every task, results in task order, at most 2 x processes in flight."""
    # fork: workers start in milliseconds with the module already imported, and their CPU time is
    # accounted to this process (benchmarks). Nothing here holds locks or threads when forking.
    try:
        with parallel.process_pool(processes, "fork") as pool:
            yield from parallel.bounded_map(function, tasks, pool, in_flight=2 * processes)
    except BrokenProcessPool as error:  # as chunk.py: a dead worker's only clue is the fix
        raise RuntimeError(
            "an extraction worker process died or failed to start (a worker's error, if it had "
            "one, is printed above; else killed for lack of memory?); nothing was written. "
            "Lower --processes (extract.processes) and rerun"
        ) from error


def _sequential_results(path: Path, fmt: str, options: Options, processes: int, stats: Counter):
    """Pages in dump order from a plain or bz2 file; the header is parsed before any page."""
    blocks = read_blocks(path)
    if fmt == "bz2":
        blocks = decompress_bz2(blocks, str(path))

    def counted(blocks):
        for block in blocks:
            stats["decompressed_bytes"] += len(block)
            yield block

    pages = split_pages(counted(blocks), str(path))
    _, header = next(pages)
    options = site_options(header, str(path), options)
    for results in bounded_map(
        parse_batch,
        ((batch, str(path), options) for batch in batched(pages, PAGES_PER_BATCH)),
        processes,
    ):
        yield from results


def _indexed_results(path: Path, index: Path, options: Options, processes: int, stats: Counter):
    size = path.stat().st_size
    streams = read_index(index, size, path)
    stats["streams"] = len(streams)
    try:
        header_chunks = list(decompress_bz2(read_blocks(path, 0, streams[0].offset), str(path)))
    except _STREAM_ERRORS as error:
        raise indexed_range_error(path, index, 0, streams[0].offset, error) from None
    header = b"".join(header_chunks)
    stats["decompressed_bytes"] += len(header)
    if b"<page>" in header:
        raise index_mismatch(
            path, index, streams[0].offset,
            "the index says the first stream of pages starts there, but the dump has pages "
            "before it",
        )
    options = site_options(header, str(path), options)
    tasks = plan_tasks(streams, processes, size)
    calls = ((path, task, i == len(tasks) - 1, options, index) for i, task in enumerate(tasks))
    for results, decompressed in bounded_map(parse_streams, calls, processes):
        stats["decompressed_bytes"] += decompressed
        yield from results


def extract(
    dump: Path, out: Path, config: dict[str, Any], index: Path | None = None
) -> dict[str, Any]:
    """Write the articles of `dump` to `out` (Parquet, atomically) and its manifest; return the
    stats."""
    dump, out = Path(dump), Path(out)
    processes = int(config.get("processes", 1))
    options = Options(
        drop_disambiguation=bool(config.get("drop_disambiguation", True)),
        min_chars=int(config.get("min_chars", 1)),
        disambiguation_templates=tuple(
            t.lower()
            for t in config.get(
                "disambiguation_templates", wikitext.DEFAULT_DISAMBIGUATION_TEMPLATES
            )
        ),
        cleaner=wikitext.CleanerOptions(
            drop_sections=frozenset(
                s.lower() for s in config.get("drop_sections", wikitext.DEFAULT_DROP_SECTIONS)
            )
        ),
    )
    fmt = detect_format(dump)
    if index is not None and fmt != "bz2":
        raise ExtractError(f"{dump}: an index was given but the dump is not bz2; drop --index")
    stats: Counter = Counter({reason: 0 for reason in DROP_REASONS})
    stats.update(pages_seen=0, articles=0, characters=0, decompressed_bytes=0)
    bad_ids: list[int | None] = []
    wall, cpu = time.perf_counter(), time.process_time()
    if index is not None:
        results = _indexed_results(dump, Path(index), options, processes, stats)
    else:
        results = _sequential_results(dump, fmt, options, processes, stats)

    columns: dict[str, list] = {name: [] for name in SCHEMA.names}

    def flush(writer: pq.ParquetWriter) -> None:
        if columns["page_id"]:
            writer.write_table(pa.table(columns, schema=SCHEMA))
            for values in columns.values():
                values.clear()

    buffered = 0  # characters of text waiting for the next row group
    with artifacts.atomic_path(out) as tmp:
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer:
            # No tqdm monitor thread: the worker pool forks after this point.
            tqdm.monitor_interval = 0
            progress = tqdm(results, desc=f"extract {dump.name}", unit=" pages", mininterval=10)
            for status, value in progress:
                stats["pages_seen"] += 1
                if status != "kept":
                    stats[status] += 1
                    if status == "invalid_utf8" and len(bad_ids) < LISTED_BAD_IDS:
                        bad_ids.append(value)
                    continue
                for name, item in zip(SCHEMA.names, value):
                    columns[name].append(item)
                stats["articles"] += 1
                stats["characters"] += len(value[2])
                buffered += len(value[2])
                if len(columns["page_id"]) >= ROWS_PER_GROUP or buffered >= CHARS_PER_GROUP:
                    flush(writer)
                    buffered = 0
            flush(writer)
    if stats["pages_seen"] == 0:
        log.warning("%s: the dump holds no pages; wrote an empty articles file", dump)
    summary = dict(stats)
    summary.update(
        format="multistream+index" if index is not None else fmt,
        processes=processes,
        invalid_utf8_page_ids=bad_ids,
        cleaner="retrieval_pretraining.wikitext (regex, no template expansion)",
        wall_seconds=round(time.perf_counter() - wall, 3),
        main_process_cpu_seconds=round(time.process_time() - cpu, 3),
    )
    inputs = {"dump": dump} | ({"index": Path(index)} if index is not None else {})
    artifacts.write_manifest(
        artifacts.manifest_path(out),
        stage="extract_articles",
        params={k: v for k, v in config.items() if k != "processes"},
        inputs=inputs,
        stats=summary,
    )
    log.info("extracted %s -> %s: %s", dump, out, summary)
    return summary


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--dump", type=Path, required=True, help="the dump part (.xml or .xml.bz2)")
    parser.add_argument("--index", type=Path, default=None, help="the multistream index (optional)")
    parser.add_argument(
        "--out", type=Path, required=True, help="the articles Parquet file to write"
    )
    parser.add_argument(
        "--processes", type=int, default=None, help="worker processes (default: the config's)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = dict(args.config)
    refuse_unknown(config, section_schema("extract"), "extract")
    if args.processes is not None:
        config["processes"] = args.processes
    extract(args.dump, args.out, config, args.index)


if __name__ == "__main__":
    # Run main() of the imported module, not of __main__, so that worker processes find its
    # functions.
    from retrieval_pretraining.extract import main as _main

    _main()
