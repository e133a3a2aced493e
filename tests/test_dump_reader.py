"""dump_reader on its own: bytes in, pages and streams out, whatever the block boundaries."""

import bz2
from pathlib import Path

import pytest

from retrieval_pretraining import dump_reader

SAMPLE = Path(__file__).resolve().parents[1] / "data/wikipedia/multistream-sample"
SAMPLE_DUMP = SAMPLE / "pages-articles-p2566p2583.multistream.xml.bz2"
SAMPLE_INDEX = SAMPLE / "pages-articles-p2566p2583.multistream-index.xml.bz2"
HEADER = b"<mediawiki><siteinfo><sitename>t</sitename></siteinfo>\n"


def page(i: int) -> bytes:
    revision = "<revision><text>x</text></revision>"
    return f"<page><title>P{i}</title><id>{i}</id>{revision}</page>\n".encode()


def one_byte_blocks(data: bytes):
    return (data[i : i + 1] for i in range(len(data)))


def test_pages_are_cut_at_their_tags_with_their_offsets_even_from_one_byte_blocks():
    data = HEADER + b"".join(page(i) for i in range(1, 4)) + b"</mediawiki>\n"
    cut = list(dump_reader.split_pages(one_byte_blocks(data), "d.xml"))
    assert cut[0] == (-1, HEADER)
    starts = [i for i in range(len(data)) if data.startswith(b"<page>", i)]
    assert [offset for offset, _ in cut[1:]] == starts
    assert [raw for _, raw in cut[1:]] == [page(i).rstrip(b"\n") for i in range(1, 4)]


def test_a_missing_footer_is_an_error_naming_the_offset():
    data = HEADER + page(1)
    with pytest.raises(dump_reader.ExtractError, match=rf"ends at decompressed byte {len(data)}"):
        list(dump_reader.split_pages([data], "d.xml"))


def test_concatenated_streams_decompress_to_their_concatenation():
    parts = [HEADER, page(1) * 50, b"</mediawiki>\n"]
    compressed = b"".join(bz2.compress(p) for p in parts)
    out = b"".join(dump_reader.decompress_bz2(one_byte_blocks(compressed), "d.bz2"))
    assert out == b"".join(parts)


def test_the_index_written_is_the_index_read_and_tasks_cover_it_in_order(tmp_path):
    dump, index = tmp_path / "d.xml.bz2", tmp_path / "d.index.txt.bz2"
    streams = dump_reader.write_multistream(
        HEADER, [page(i) for i in range(1, 11)], dump, index, pages_per_stream=4
    )
    read = dump_reader.read_index(index, dump.stat().st_size)
    assert streams == len(read) == 3
    assert [(s.pages, s.id_sum) for s in read] == [(4, 1 + 2 + 3 + 4), (4, 5 + 6 + 7 + 8), (2, 19)]
    assert read[0].offset == len(bz2.compress(HEADER))  # stream 0 is the header alone
    # Each stream ends where the next begins; the last at the end of the file (the </mediawiki>
    # stream is read with it).
    assert all(a.offset + a.length == b.offset for a, b in zip(read, read[1:]))
    assert read[-1].offset + read[-1].length == dump.stat().st_size
    tasks = dump_reader.plan_tasks(read, processes=2, dump_size=dump.stat().st_size)
    assert [s for task in tasks for s in task] == read


def test_a_plain_text_index_reads_as_its_bz2_original(tmp_path):
    """The index may be decompressed by hand (read_index's docstring: bz2 or plain); the dump's
    format check refused it before, asking for a pages-articles dump."""
    plain = tmp_path / "index.txt"
    plain.write_bytes(bz2.decompress(SAMPLE_INDEX.read_bytes()))
    size = SAMPLE_DUMP.stat().st_size
    streams = dump_reader.read_index(SAMPLE_INDEX, size, SAMPLE_DUMP)
    assert len(streams) == 4
    assert dump_reader.read_index(plain, size, SAMPLE_DUMP) == streams
    gzipped = tmp_path / "index.txt.gz"
    gzipped.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(dump_reader.ExtractError, match="cannot read the index"):
        dump_reader.read_index(gzipped, size, SAMPLE_DUMP)


def test_an_index_past_the_end_blames_the_index_unless_the_dump_was_cut(tmp_path):
    """Offsets past the end: another dump's index (its streams elsewhere) is named as such; this
    dump's own index on a cut copy names the dump truncated."""
    big, big_index = tmp_path / "big.xml.bz2", tmp_path / "big.index.txt.bz2"
    dump_reader.write_multistream(HEADER, [page(i) for i in range(1, 41)], big, big_index, 2)
    small, small_index = tmp_path / "small.xml.bz2", tmp_path / "small.index.txt.bz2"
    dump_reader.write_multistream(HEADER, [page(i) for i in range(1, 10)], small, small_index, 3)
    size = small.stat().st_size
    with pytest.raises(dump_reader.ExtractError, match=rf"do not fit the dump \S+small\.xml\.bz2 "
                       rf"of {size} bytes; the index belongs to another file"):
        dump_reader.read_index(big_index, size, small)
    cut = tmp_path / "cut.xml.bz2"
    cut.write_bytes(big.read_bytes()[:size])
    with pytest.raises(dump_reader.ExtractError, match=rf"cut\.xml\.bz2: the file is {size} bytes"
                       r".*truncated, re-download it"):
        dump_reader.read_index(big_index, size, cut)


def test_an_xml_dump_with_a_byte_order_mark_or_leading_space_is_xml(tmp_path):
    for prefix in (b"\xef\xbb\xbf", b"\n  ", b"\xef\xbb\xbf\n"):
        path = tmp_path / "d.xml"
        path.write_bytes(prefix + HEADER + b"</mediawiki>\n")
        assert dump_reader.detect_format(path) == "xml", prefix


def test_content_between_pages_is_malformed_xml_named_by_its_offset():
    """Named by where the gap after the first page's </page> begins."""
    data = HEADER + page(1) + b"<junk/>\n" + page(2) + b"</mediawiki>\n"
    gap = len(HEADER) + len(page(1)) - 1  # page() ends in a newline
    with pytest.raises(dump_reader.ExtractError,
                       match=rf"'<junk/>' between pages at decompressed byte {gap};"):
        list(dump_reader.split_pages(iter([data]), "d.xml"))


def test_content_after_the_last_page_of_a_stream_is_a_cut_page():
    """A multistream stream holds pages only (the final one may be followed by </mediawiki>):
    anything else after its last page is a page cut by the stream's end."""
    stream = page(1) + page(2)
    assert len(list(dump_reader.split_pages(iter([stream + b"</mediawiki>\n"]), "s",
                                            header=False, footer=False))) == 2
    with pytest.raises(dump_reader.CutPage, match="after the last page"):
        list(dump_reader.split_pages(iter([stream + b"<junk/>"]), "s", header=False,
                                     footer=False))
