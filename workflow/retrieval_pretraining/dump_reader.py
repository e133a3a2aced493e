"""Reading a MediaWiki dump's bytes: format detection, bz2 decompression in bounded blocks, cutting
the XML into pages, and a multistream dump's `offset:pageid:title` index.

What the pages say is extract.py's business; everything here works on bytes and names the file and
the (compressed or decompressed) byte offset in its errors, so that a damaged download is found.
With an index, an error reading one of its streams is first checked against the dump
(`indexed_range_error`): where the index's offsets are not where the dump's streams start, or a
stream it names begins or ends inside a page, the two files disagree (`IndexMismatch`, naming both
and the offset), which says nothing about either being damaged: "re-download it" is said only
where the streams are where the index says and the dump's own bytes are bad.
`write_multistream` is the inverse of the index reader (tests and benchmarks build inputs with it).
"""

from __future__ import annotations

import bz2
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import BadInput

READ_BLOCK = 1 << 20  # compressed bytes read at a time
# Most decompressed bytes produced at a time (bounded memory on repetitive text).
OUT_BLOCK = 4 << 20
MAX_TASK_BYTES = 2 << 20  # compressed bytes of bz2 streams per worker task (with an index)
MAX_HEADER_BYTES = 64 << 20  # no <page> within this many bytes: not a dump


class ExtractError(BadInput, RuntimeError):
    """The input is damaged or not a MediaWiki export.

    The message names the file, the position and the fix.
    """


class StreamError(ExtractError):
    """An error inside the bz2 stream that starts at byte `stream_start`."""

    def __init__(self, message: str, stream_start: int = 0):
        super().__init__(message)
        self.stream_start = stream_start


class CorruptStream(StreamError):
    """bz2 data that does not decompress."""


class CutStream(StreamError):
    """The data ends inside a bz2 stream."""


class CutPage(ExtractError):
    """Blocks of pages that start (`at_start`) or end inside a page (the one at decompressed byte
    `page_at`)."""

    def __init__(self, message: str, at_start: bool = False, page_at: int = 0):
        super().__init__(message)
        self.at_start = at_start
        self.page_at = page_at


class IndexMismatch(ExtractError):
    """A multistream dump and its index do not describe the same file (neither known damaged)."""


# --- bytes -> decompressed blocks -----------------------------------------------------------------
def detect_format(path: Path) -> str:
    with open(path, "rb") as handle:
        head = handle.read(64)
    if not head:
        raise ExtractError(
            f"{path}: the file is empty (0 bytes); the download is incomplete, re-download it"
        )
    if head.startswith(b"BZh"):
        return "bz2"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<"):
        return "xml"
    raise ExtractError(
        f"{path}: neither bz2 (magic 'BZh') nor XML at byte 0 (starts with {head[:8]!r}); "
        "pass a MediaWiki pages-articles dump"
    )


def decompress_bz2(data_blocks: Iterable[bytes], name: str, start: int = 0) -> Iterator[bytes]:
    """Decompress concatenated bz2 streams; output comes in bounded blocks whatever the ratio.

    Errors name the compressed byte offset where the damaged stream starts.
    """
    decompressor = bz2.BZ2Decompressor()
    fed = stream_start = start  # compressed bytes read so far / where the current stream starts
    for block in data_blocks:
        fed += len(block)
        data = block
        while True:
            try:
                out = decompressor.decompress(data, OUT_BLOCK)
            except OSError as error:
                raise CorruptStream(
                    f"{name}: corrupt bz2 data in the stream starting at byte {stream_start} "
                    f"({error}); the file is damaged, re-download it",
                    stream_start,
                ) from None
            data = b""
            if out:
                yield out
            if decompressor.eof:  # the next stream (multistream files) starts right after
                data = decompressor.unused_data
                stream_start = fed - len(data)
                decompressor = bz2.BZ2Decompressor()
                if not data:
                    break
            elif decompressor.needs_input:
                break
    if not decompressor.eof and fed > stream_start:
        raise CutStream(
            f"{name}: the file ends at byte {fed} inside the bz2 stream that starts at byte "
            f"{stream_start} (truncated, or corrupt data hid the end of the stream); "
            "re-download the file",
            stream_start,
        )


def read_blocks(path: Path, start: int = 0, length: int | None = None) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = length
        while remaining is None or remaining > 0:
            block = handle.read(READ_BLOCK if remaining is None else min(READ_BLOCK, remaining))
            if not block:
                return
            if remaining is not None:
                remaining -= len(block)
            yield block


# --- cutting XML into pages -----------------------------------------------------------------------
def split_pages(
    blocks: Iterable[bytes], name: str, *, header: bool = True, footer: bool = True
) -> Iterator[tuple[int, bytes]]:
    """Yield (decompressed byte offset, bytes) for the header (offset -1) and then every <page>.

    `header`: the blocks start with the export's header (<mediawiki>, <siteinfo>), yielded first;
    `footer`: they must end with </mediawiki>. A complete export has both; a multistream stream
    holds pages only, and the last one is followed by the footer. Blocks that start or end inside
    a page raise CutPage (in a multistream stream: a page split across two streams).
    """
    buf = b""
    base = 0  # decompressed offset of buf[0]
    header_done = not header
    first = True  # no <page> found yet
    for block in blocks:
        buf += block
        pos = 0
        while True:
            start = buf.find(b"<page>", pos)
            if start < 0:
                break
            between = buf[pos:start]
            if not header_done:
                header_done = True
                yield -1, between
            elif first and not header and between.strip():
                raise CutPage(
                    f"{name}: {between.strip()[:40]!r} before the first <page>, at decompressed "
                    "byte 0: these pages start inside a page",
                    at_start=True,
                )
            elif between.strip():
                raise ExtractError(
                    f"{name}: malformed XML: unexpected content {between.strip()[:40]!r} between "
                    f"pages at decompressed byte {base + pos}; the file is damaged, re-download it"
                )
            end = buf.find(b"</page>", start)
            if end < 0:
                pos = start
                break
            nested = buf.find(b"<page>", start + 6, end)
            if nested >= 0:
                raise ExtractError(
                    f"{name}: malformed XML: the page at decompressed byte {base + start} has no "
                    "</page> before the next <page>; the file is damaged, re-download it"
                )
            end += len(b"</page>")
            first = False
            yield base + start, buf[start:end]
            pos = end
        # Keep only what may still be part of a page; a partial "<page" tag at the end stays too.
        if not header_done and len(buf) > MAX_HEADER_BYTES:
            raise ExtractError(
                f"{name}: no <page> in the first {MAX_HEADER_BYTES} bytes: not a MediaWiki dump"
            )
        if header_done:
            base += pos
            buf = buf[pos:]
    if not header_done:
        yield -1, buf  # a dump without pages: all of it is header
        header_done, rest = True, buf
    else:
        rest = buf
        if b"<page>" in rest:
            page_at = base + rest.find(b"<page>")
            raise CutPage(
                f"{name}: the XML ends inside the page at decompressed byte {page_at} "
                "(truncated); re-download the file",
                page_at=page_at,
            )
    if footer and b"</mediawiki>" not in rest:
        raise ExtractError(
            f"{name}: the XML ends at decompressed byte {base + len(rest)} without </mediawiki> "
            "(truncated); re-download the file"
        )
    if not footer and rest.strip() and rest.strip() != b"</mediawiki>":
        raise CutPage(
            f"{name}: malformed XML: unexpected content {rest.strip()[:40]!r} after the last page "
            f"at decompressed byte {base}; the file is damaged, re-download it",
            page_at=base,
        )


# --- multistream with an index --------------------------------------------------------------------
@dataclass(frozen=True)
class Stream:
    offset: int
    length: int
    pages: int  # pages the index lists in this stream
    id_sum: int  # sum of their ids (cheap cross-check that index and dump belong together)


def read_index(index_path: Path, dump_size: int, dump: Path | None = None) -> list[Stream]:
    """Streams of a multistream dump from its `offset:pageid:title` index (bz2 or plain).

    With `dump`, an index naming streams past the dump's end tells a truncated dump (the streams
    inside the file start where the index says) from an index of another file.
    """
    counts: dict[int, list[int]] = {}
    try:
        # Not detect_format: that one is for dumps and refuses a plain-text index as not XML.
        with open(index_path, "rb") as raw:
            is_bz2 = raw.read(3) == b"BZh"
        opener = bz2.open if is_bz2 else open
        with opener(index_path, "rt", encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                parts = line.split(":", 2)
                try:
                    offset, page_id = int(parts[0]), int(parts[1])
                except (ValueError, IndexError):
                    raise ExtractError(
                        f"{index_path}: line {line_no} is not 'offset:pageid:title': "
                        f"{line.strip()[:80]!r}"
                    ) from None
                entry = counts.setdefault(offset, [0, 0])
                entry[0] += 1
                entry[1] += page_id
    except (OSError, EOFError, UnicodeDecodeError) as error:  # the last: neither bz2 nor text
        raise ExtractError(
            f"{index_path}: cannot read the index ({error}); re-download it"
        ) from None
    offsets = sorted(counts)
    if not offsets:
        raise ExtractError(f"{index_path}: the index lists no streams")
    if offsets[0] <= 0 or offsets[-1] >= dump_size:
        inside = [offset for offset in offsets if offset < dump_size]
        if offsets[0] > 0 and dump is not None and streams_start_at(dump, inside):
            found = (
                f"the {len(inside)} inside the file start where the index says"
                if inside else "none lies inside the file, or the index is of a larger one"
            )
            raise ExtractError(
                f"{dump}: the file is {dump_size} bytes but its index {index_path} names "
                f"{len(offsets) - len(inside)} of its {len(offsets)} streams at or past that "
                f"point, the first at byte {offsets[len(inside)]} ({found}): the dump is "
                "truncated, re-download it"
            )
        raise ExtractError(
            f"{index_path}: stream offsets {offsets[0]}..{offsets[-1]} do not fit the dump"
            + (f" {dump}" if dump is not None else "")
            + f" of {dump_size} bytes; the index belongs to another file (check both against "
            "the dump's dumpstatus.json or sha1sums.txt)"
        )
    ends = offsets[1:] + [dump_size]
    return [Stream(o, e - o, *counts[o]) for o, e in zip(offsets, ends)]


# What follows "BZh" and the block-size digit at a bz2 stream's start: a block, or the stream's end.
BZ2_BLOCK_MAGIC = (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")


def streams_start_at(dump: Path, offsets: list[int]) -> bool:
    """Whether a bz2 stream starts at every one of `offsets` of `dump`."""
    with open(dump, "rb") as handle:
        for offset in offsets:
            handle.seek(offset)
            head = handle.read(10)
            if head[:3] != b"BZh" or not head[3:4].isdigit() or head[4:] not in BZ2_BLOCK_MAGIC:
                return False
    return True


def index_mismatch(dump: Path, index: Path, offset: int, what: str) -> IndexMismatch:
    """The error for a multistream dump and an index that disagree at byte `offset`."""
    return IndexMismatch(
        f"{dump} and its index {index} disagree at byte {offset}: {what}. Neither file is known "
        "to be damaged: most likely they are of different dumps (another dump date, or another "
        "part), or one of them is truncated. Check both against the sha1 and size that the "
        "dump's dumpstatus.json (or sha1sums.txt) lists for them, and replace the one that differs"
    )


def indexed_range_error(
    dump: Path, index: Path, start: int, end: int, error: ExtractError
) -> ExtractError:
    """What to report for `error`, raised reading the bytes `start`..`end` of `dump` that its
    `index` says are whole bz2 streams of whole pages (`start` 0: the header before them).

    Only where a stream starts at both ends, as the index says, and the pages are not cut there,
    is the damage the dump's own; otherwise the index and the dump disagree at that offset.
    """
    size = dump.stat().st_size
    for offset in (start, end):
        if offset < size and not streams_start_at(dump, [offset]):
            what = "the index says a bz2 stream starts there, but none does in the dump"
            if isinstance(error, CutStream) and offset == end:
                what += f" (the stream that starts at byte {error.stream_start} runs on past it)"
            return index_mismatch(dump, index, offset, what)
    if isinstance(error, CutPage) and error.at_start:
        return index_mismatch(
            dump, index, start,
            "the index says a stream of whole pages starts there, but the dump's bz2 stream "
            "there begins inside a page (text before its first <page>): a page split across two "
            "streams, where a multistream dump's streams hold whole pages (a dump recompressed "
            "by another tool has such streams)",
        )
    if isinstance(error, CutPage) and end < size:
        return index_mismatch(
            dump, index, end,
            f"the index says the stream at byte {start} ends there, but its page at decompressed "
            f"byte {error.page_at} runs on past that point: a page split across two streams, "
            "where a multistream dump's streams hold whole pages (a dump recompressed by another "
            "tool has such streams)",
        )
    if isinstance(error, CutStream) and end < size:
        # The stream is cut where the next one starts: a splice of two copies, say.
        return CutStream(
            f"{dump}: the bz2 stream that starts at byte {error.stream_start} is cut short at "
            f"byte {end}, where the next one starts (as its index says); the file is damaged, "
            "re-download it",
            error.stream_start,
        )
    return error


def plan_tasks(streams: list[Stream], processes: int, dump_size: int) -> list[list[Stream]]:
    """Group consecutive streams into tasks: enough tasks to keep every worker busy, each
    bounded."""
    target = max(1, min(MAX_TASK_BYTES, dump_size // (4 * processes)))
    tasks, current, size = [], [], 0
    for stream in streams:
        current.append(stream)
        size += stream.length
        if size >= target:
            tasks.append(current)
            current, size = [], 0
    if current:
        tasks.append(current)
    return tasks


def write_multistream(
    header: bytes, pages: Iterable[bytes], dump: Path, index: Path, pages_per_stream: int = 100
) -> int:
    """Pack pages as a multistream dump + bz2 index, as Wikimedia does (tests, benchmarks).

    Stream 0 holds the header (<mediawiki> and <siteinfo>), then one stream per `pages_per_stream`
    pages, then one holding </mediawiki>. Returns the number of page streams.
    """
    streams = 0
    with open(dump, "wb") as out, bz2.open(index, "wt", encoding="utf-8") as idx:
        out.write(bz2.compress(header))
        for batch in batched(pages, pages_per_stream):
            offset = out.tell()
            for raw in batch:
                page = ET.fromstring(raw)
                idx.write(f"{offset}:{page.findtext('id')}:{page.findtext('title')}\n")
            out.write(bz2.compress(b"".join(batch)))
            streams += 1
        out.write(bz2.compress(b"\n</mediawiki>\n"))
    return streams


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
