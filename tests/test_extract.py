"""Stage 2 (extract): formats, counts, determinism, the multistream index, and every bad-input case.

Expected values come from independent statements: the data README's page counts, counts taken with
plain regular expressions over the decompressed XML, and small dumps generated here whose content
is known by construction.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import escape

import pyarrow.parquet as pq
import pytest
from retrieval_pretraining import artifacts
from retrieval_pretraining import dump_reader
from retrieval_pretraining import extract as ex

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT / "data" / "wikipedia"
ENWIKI = (
    WIKI / "enwiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
TABLES = WIKI / "enwiki-sample" / "enwiki-table-markup.xml.bz2"
MULTI = WIKI / "multistream-sample" / "pages-articles-p2566p2583.multistream.xml.bz2"
MULTI_INDEX = WIKI / "multistream-sample" / "pages-articles-p2566p2583.multistream-index.xml.bz2"
CONFIG = {"processes": 1, "drop_disambiguation": True, "min_chars": 1}
CONTRACT = [
    ("page_id", "int64"),
    ("title", "string"),
    ("text", "large_string"),
    ("revision_id", "int64"),
]


# --- generated dumps ------------------------------------------------------------------------------
def page_xml(
    page_id, title, text="Some prose.", ns=0, redirect=None, model="wikitext", text_xml=None
):
    redirect_xml = f'<redirect title="{escape(redirect)}" />' if redirect else ""
    if text_xml is None:
        text_xml = f'<text xml:space="preserve">{escape(text)}</text>'
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"    {redirect_xml}\n    <revision>\n      <id>{page_id * 10}</id>\n"
        f"      <model>{model}</model>\n      <format>text/x-wiki</format>\n      {text_xml}\n"
        f"    </revision>\n  </page>\n"
    ).encode()


def header_xml(version="0.10", siteinfo=True):
    site = (
        "  <siteinfo>\n    <sitename>Test</sitename>\n    <namespaces>\n"
        '      <namespace key="0" case="first-letter" />\n'
        '      <namespace key="6" case="first-letter">Datei</namespace>\n'
        '      <namespace key="14" case="first-letter">Kategorie</namespace>\n'
        "    </namespaces>\n  </siteinfo>\n"
        if siteinfo
        else ""
    )
    return (
        f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-{version}/" version="{version}" '
        f'xml:lang="de">\n{site}'
    ).encode()


def dump_bytes(pages, version="0.10", siteinfo=True):
    return header_xml(version, siteinfo) + b"".join(pages) + b"</mediawiki>\n"


def simple_pages(n=12):
    return [
        page_xml(i, f"Title {i}", f"Paragraph of page {i}.\n\n== Part ==\nMore text {i}.")
        for i in range(1, n + 1)
    ]


def run(tmp_path, dump, config=None, index=None, name="out"):
    out = tmp_path / f"{name}.parquet"
    stats = ex.extract(dump, out, {**CONFIG, **(config or {})}, index)
    return pq.read_table(out), stats, out


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_no_output(tmp_path, name="out"):
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith((name, f".{name}"))]
    assert leftovers == [], f"a failed run left {leftovers}"


# --- the real samples ------------------------------------------------------------------------------
def test_enwiki_sample_counts_and_contract(tmp_path):
    xml = bz2.decompress(ENWIKI.read_bytes()).decode()
    pages = re.findall(r"<page>.*?</page>", xml, re.S)
    # Independent counts: raw regex over the XML (README: 206 pages, 100 redirects, 1 other ns).
    other_ns = [p for p in pages if "<ns>0</ns>" not in p]
    redirects_ns0 = [p for p in pages if "<redirect" in p and "<ns>0</ns>" in p]
    disamb = [
        p
        for p in pages
        if "<redirect" not in p and re.search(r"\{\{\s*(disambiguation|geodis)", p, re.I)
    ]
    table, stats, out = run(tmp_path, ENWIKI)
    assert [(f.name, str(f.type)) for f in table.schema] == CONTRACT
    assert stats["pages_seen"] == len(pages) == 206
    assert stats["other_namespace"] == len(other_ns) == 1
    assert stats["redirect"] == len(redirects_ns0)
    assert stats["disambiguation"] == len(disamb) == 8
    assert stats["articles"] + stats["disambiguation"] == 106  # WikiExtractor also writes 106
    assert stats["articles"] == table.num_rows
    assert sum(stats[r] for r in ex.DROP_REASONS) + stats["articles"] == stats["pages_seen"]
    rows = table.to_pylist()
    titles = {r["title"] for r in rows}
    assert "Austin (disambiguation)" not in titles and "Aberdeen (disambiguation)" not in titles
    assert {"Anarchism", "Alberta", "Albert Einstein"} <= titles
    # Ids and revision ids as in the XML, dump order kept.
    first = re.search(
        r"<title>Anarchism</title>\s*<ns>0</ns>\s*<id>(\d+)</id>\s*<revision>\s*<id>(\d+)", xml
    )
    anarchism = next(r for r in rows if r["title"] == "Anarchism")
    assert (anarchism["page_id"], anarchism["revision_id"]) == (
        int(first.group(1)),
        int(first.group(2)),
    )
    assert [r["page_id"] for r in rows] == [
        int(i)
        for i in re.findall(r"<ns>0</ns>\s*<id>(\d+)</id>", xml)
        if int(i) in {r["page_id"] for r in rows}
    ]
    for row in rows:
        assert row["text"] and row["text"] == row["text"].strip() and "\n\n\n" not in row["text"]
    assert stats["characters"] == sum(len(r["text"]) for r in rows)
    manifest = json.loads((tmp_path / "out.manifest.json").read_text())
    assert manifest["inputs"]["dump"]["sha256"] == hashlib.sha256(ENWIKI.read_bytes()).hexdigest()
    assert manifest["stats"]["pages_seen"] == 206 and "pyarrow" in manifest["versions"]
    # Which code wrote it: a digest of the package source, identical to what this checkout has.
    assert manifest["code"]["package_sha256"] == artifacts.code_version()["package_sha256"]
    assert "processes" not in manifest["params"]  # the output does not depend on it


def test_the_code_digest_follows_the_package_source(tmp_path, monkeypatch):
    """package_sha256 names the source: an edit to any module (or config schema) changes it, a
    file that is neither (here a stray note) does not."""
    import shutil

    package = shutil.copytree(artifacts.PACKAGE_DIR, tmp_path / "retrieval_pretraining",
                              ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(artifacts, "PACKAGE_DIR", package)

    def digest() -> str:
        artifacts.code_version.cache_clear()
        return artifacts.code_version()["package_sha256"]

    try:
        first = digest()
        (package / "notes.txt").write_text("not code")
        assert digest() == first
        for edited in (package / "extract.py", package / "schemas" / "corpus.schema.yaml"):
            edited.write_text(edited.read_text() + "\n# an edit\n")
            assert digest() != first, edited.name
            first = digest()
    finally:
        artifacts.code_version.cache_clear()


def test_the_manifest_names_the_code_the_process_started_with(tmp_path):
    """A stage that runs for days records the code it ran, not code edited under it: a `git pull`
    in the project during the run (an edited module, a new commit) must not change the manifest's
    code version, which is taken as the process imports its modules, not at the first manifest."""
    import shutil

    root = tmp_path / "project"
    package = shutil.copytree(artifacts.PACKAGE_DIR, root / "workflow" / "retrieval_pretraining",
                              ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "ran"]):
        subprocess.run([*git, *args], check=True)
    env = {**os.environ, "PYTHONPATH": str(root / "workflow")}
    version = "import json; from retrieval_pretraining import artifacts as a; " \
              "print(json.dumps(a.code_version()))"

    def code_version() -> dict[str, str]:
        out = subprocess.run([sys.executable, "-c", version], env=env, check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)

    ran = code_version()
    stage = (
        "import subprocess, sys\n"
        "from retrieval_pretraining import artifacts\n"
        "edited = artifacts.PACKAGE_DIR / 'extract.py'\n"  # the pull, while the stage runs
        "edited.write_text(edited.read_text() + '\\n# pulled during the run\\n')\n"
        f"subprocess.run({git!r} + ['commit', '-qam', 'pulled'], check=True)\n"
        "artifacts.write_manifest(sys.argv[1], stage='test', params={})\n"
    )
    subprocess.run([sys.executable, "-c", stage, str(tmp_path / "out.manifest.json")], env=env,
                   check=True)
    pulled = code_version()
    assert pulled["git"] != ran["git"] and pulled["package_sha256"] != ran["package_sha256"]
    assert json.loads((tmp_path / "out.manifest.json").read_text())["code"] == ran
    assert (package / "extract.py").read_text().endswith("# pulled during the run\n")


def test_processes_and_compression_do_not_change_output(tmp_path):
    plain = write(tmp_path, "tables.xml", bz2.decompress(TABLES.read_bytes()))
    a, _, _ = run(tmp_path, TABLES, {"processes": 1}, name="a")
    b, _, _ = run(tmp_path, TABLES, {"processes": 2}, name="b")
    c, stats, _ = run(tmp_path, plain, {"processes": 2}, name="c")
    assert a.num_rows == 5 and stats["format"] == "xml"  # this sample has no <siteinfo>
    assert a.equals(b) and a.equals(c)
    for text in a.column("text").to_pylist():
        assert "{|" not in text and "|}" not in text and "||" not in text


def test_multistream_sample_with_and_without_index(tmp_path):
    seq, s1, _ = run(tmp_path, MULTI, {"processes": 1}, name="seq")
    par, s2, _ = run(tmp_path, MULTI, {"processes": 2}, index=MULTI_INDEX, name="par")
    index_lines = bz2.decompress(MULTI_INDEX.read_bytes()).decode().splitlines()
    streams = {line.split(":")[0] for line in index_lines}
    assert s2["format"] == "multistream+index" and s2["streams"] == len(streams) == 4
    assert s1["pages_seen"] == s2["pages_seen"] == len(index_lines) == 17
    assert seq.equals(par)
    # The one non-article is the category page; Greek category/file links are removed via <siteinfo>.
    assert s1["other_namespace"] == 1 and seq.num_rows == 16
    assert not any("Κατηγορία:" in t or "Αρχείο:" in t for t in seq.column("text").to_pylist())


def test_generated_multistream_matches_sequential(tmp_path):
    pages = [
        page_xml(i, f"P{i}", f"Text {i} [[Datei:x.png|thumb|cap]] [[Kategorie:K]] end.")
        for i in range(1, 41)
    ]
    pages[5] = page_xml(6, "R", "#REDIRECT [[P1]]", redirect="P1")
    dump, index = tmp_path / "m.xml.bz2", tmp_path / "m.index.txt.bz2"
    streams = dump_reader.write_multistream(
        header_xml("0.11"), pages, dump, index, pages_per_stream=3
    )
    assert streams == 14
    seq, s1, _ = run(tmp_path, dump, {"processes": 1}, name="seq")
    par, s2, _ = run(tmp_path, dump, {"processes": 2}, index=index, name="par")
    assert seq.equals(par) and s1["redirect"] == s2["redirect"] == 1 and par.num_rows == 39
    # Localised namespace names from <siteinfo> (Datei = File, Kategorie = Category) are removed.
    assert par.column("text").to_pylist()[0] == "Text 1 end."


def test_index_of_another_dump_is_refused(tmp_path):
    dump, index = tmp_path / "m.xml.bz2", tmp_path / "m.index.txt.bz2"
    dump_reader.write_multistream(header_xml(), simple_pages(9), dump, index, pages_per_stream=3)
    other_dump, other_index = tmp_path / "o.xml.bz2", tmp_path / "o.index.txt.bz2"
    dump_reader.write_multistream(
        header_xml(), simple_pages(9)[:8], other_dump, other_index, pages_per_stream=2
    )
    with pytest.raises(ex.ExtractError, match="index"):
        run(tmp_path, dump, index=other_index)
    assert_no_output(tmp_path)


def test_truncated_multistream_with_its_index_is_named_truncated(tmp_path):
    """The real multistream sample cut short, given with its index: the dump is named truncated,
    with its size and the first indexed stream past its end (this used to blame the index)."""
    for size, first_past in ((10000, 12237), (600, 718)):  # streams start at 718, 4735, ... 12237
        dump = write(tmp_path, "cut.xml.bz2", MULTI.read_bytes()[:size])
        with pytest.raises(
            ex.ExtractError,
            match=rf"cut\.xml\.bz2: the file is {size} bytes but its index \S+index\.xml\.bz2 "
            rf"names .*the first at byte {first_past} .*the dump is truncated, re-download it",
        ):
            run(tmp_path, dump, index=MULTI_INDEX)
        assert_no_output(tmp_path)


def _index_lines(index):
    return bz2.decompress(index.read_bytes()).decode().splitlines()


def _write_index(path, lines):
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    return path


def assert_disagree(error, dump, index, offset):
    """The index-and-dump message: both files, the offset, what to check; no "re-download"."""
    message = str(error.value)
    assert f"{dump} and its index {index} disagree at byte {offset}: " in message
    assert "different dumps (another dump date" in message and "dumpstatus.json" in message
    assert "damaged, re-download" not in message and "re-download the file" not in message
    assert type(error.value).__name__ == "IndexMismatch"


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("moved", [718, 8475], ids=["first stream", "third stream"])
def test_an_index_offset_inside_a_stream_names_both_files_and_the_offset(tmp_path, moved,
                                                                         processes):
    """The real sample's index with one stream put 100 bytes into the dump's stream (an index of
    another dump, offsets that happen to fall inside the file). The stream before it then ends
    inside a bz2 stream: this said the dump "ends at byte X" and to re-download it, which only
    downloads the same two files again. Now: the two files disagree at that offset."""
    lines = [
        f"{int(offset) + 100}:{rest}" if int(offset) == moved else f"{offset}:{rest}"
        for offset, rest in (line.split(":", 1) for line in _index_lines(MULTI_INDEX))
    ]
    index = _write_index(tmp_path / "moved.index.txt.bz2", lines)
    with pytest.raises(ex.ExtractError) as error:
        run(tmp_path, MULTI, {"processes": processes}, index=index)
    assert_disagree(error, MULTI, index, moved + 100)
    assert f"none does in the dump (the stream that starts at byte {moved} runs on" in str(
        error.value
    )
    assert_no_output(tmp_path)


def test_the_index_of_another_dump_date_names_where_they_part(tmp_path):
    """The next dump of the same part: one page longer, so its streams after that page lie
    elsewhere. The old index on the new dump agrees up to that page's stream, and the next
    offset it names falls inside the new dump's longer stream."""
    pages = simple_pages(9)
    old, old_index = tmp_path / "old.xml.bz2", tmp_path / "old.index.txt.bz2"
    dump_reader.write_multistream(header_xml(), pages, old, old_index, pages_per_stream=3)
    edited = page_xml(5, "Title 5", "An edit that made this page much longer. " * 40)
    new, new_index = tmp_path / "new.xml.bz2", tmp_path / "new.index.txt.bz2"
    dump_reader.write_multistream(
        header_xml(), pages[:4] + [edited] + pages[5:], new, new_index, pages_per_stream=3
    )
    offsets = sorted({int(line.split(":")[0]) for line in _index_lines(old_index)})
    new_offsets = sorted({int(line.split(":")[0]) for line in _index_lines(new_index)})
    assert offsets[:2] == new_offsets[:2] and offsets[2] < new_offsets[2]  # as described
    with pytest.raises(ex.ExtractError) as error:
        run(tmp_path, new, {"processes": 2}, index=old_index)
    assert_disagree(error, new, old_index, offsets[2])
    assert_no_output(tmp_path)


def test_a_stream_boundary_inside_a_page_is_a_disagreement_not_damage(tmp_path):
    """A dump whose second bz2 stream starts in the middle of page 4 (recompressed by a tool that
    does not cut at pages), with an index of those streams: every stream decompresses, so no
    byte is damaged; the first stream "ended inside the page (truncated); re-download"."""
    pages = simple_pages(9)
    body = b"".join(pages)
    cut = len(b"".join(pages[:3])) + 40  # 40 bytes into page 4
    streams = [bz2.compress(header_xml()), bz2.compress(body[:cut]), bz2.compress(body[cut:]),
               bz2.compress(b"</mediawiki>\n")]
    dump = write(tmp_path, "split.xml.bz2", b"".join(streams))
    first, second = len(streams[0]), len(streams[0]) + len(streams[1])
    index = _write_index(
        tmp_path / "split.index.txt.bz2",
        [f"{first}:{i}:Title {i}" for i in range(1, 5)]
        + [f"{second}:{i}:Title {i}" for i in range(5, 10)],
    )
    with pytest.raises(ex.ExtractError) as error:
        run(tmp_path, dump, index=index)
    assert_disagree(error, dump, index, second)
    page_4 = len(b"".join(pages[:3])) + pages[3].index(b"<page>")
    assert (f"the stream at byte {first} ends there, but its page at decompressed byte {page_4} "
            "runs on past that point: a page split across two streams") in str(error.value)
    assert_no_output(tmp_path)


def test_a_stream_cut_short_where_the_index_puts_the_next_is_damage(tmp_path):
    """The streams start where the index says, but the first one is cut short before the second
    (a splice of two copies): the dump itself is damaged, and the message says re-download it."""
    pages = simple_pages(9)
    streams = [bz2.compress(header_xml()), bz2.compress(b"".join(pages[:4])),
               bz2.compress(b"".join(pages[4:])), bz2.compress(b"</mediawiki>\n")]
    streams[1] = streams[1][: len(streams[1]) // 2]
    dump = write(tmp_path, "spliced.xml.bz2", b"".join(streams))
    first, second = len(streams[0]), len(streams[0]) + len(streams[1])
    index = _write_index(
        tmp_path / "spliced.index.txt.bz2",
        [f"{first}:{i}:Title {i}" for i in range(1, 5)]
        + [f"{second}:{i}:Title {i}" for i in range(5, 10)],
    )
    with pytest.raises(
        ex.ExtractError,
        match=rf"spliced\.xml\.bz2: the bz2 stream that starts at byte {first} is cut short at "
        rf"byte {second}, where the next one starts .*the file is damaged, re-download it",
    ):
        run(tmp_path, dump, index=index)
    assert_no_output(tmp_path)


# --- bad input --------------------------------------------------------------------------------------
def test_truncated_bz2_is_an_error_naming_the_offset(tmp_path):
    data = bz2.compress(dump_bytes(simple_pages(200)))
    path = write(tmp_path, "t.xml.bz2", data[: len(data) // 2])
    with pytest.raises(
        ex.ExtractError, match=rf"t\.xml\.bz2.*ends at byte {len(data) // 2}.*truncated"
    ):
        run(tmp_path, path)
    assert_no_output(tmp_path)


def test_corrupt_bz2_stream_is_an_error_naming_the_stream(tmp_path):
    pages = simple_pages(300)
    first = bz2.compress(header_xml() + b"".join(pages[:3]))  # a 2-stream file; damage stream 2
    second = bytearray(bz2.compress(b"".join(pages[3:]) + b"</mediawiki>\n"))
    second[len(second) // 2] ^= 0xFF
    path = write(tmp_path, "c.xml.bz2", first + bytes(second))
    with pytest.raises(
        ex.ExtractError, match=rf"corrupt bz2 data in the stream starting at byte {len(first)}"
    ):
        run(tmp_path, path)
    assert_no_output(tmp_path)


def test_corrupt_stream_in_indexed_multistream(tmp_path):
    dump, index = tmp_path / "m.xml.bz2", tmp_path / "m.index.txt.bz2"
    dump_reader.write_multistream(header_xml(), simple_pages(9), dump, index, pages_per_stream=3)
    offsets = sorted(
        {
            int(line.split(":")[0])
            for line in bz2.decompress(index.read_bytes()).decode().splitlines()
        }
    )
    data = bytearray(dump.read_bytes())
    data[offsets[1] + 40] ^= 0xFF
    dump.write_bytes(bytes(data))
    # The streams are where the index says: the damage is the dump's own.
    with pytest.raises(
        ex.ExtractError, match=rf"stream starting at byte {offsets[1]} .*damaged, re-download it"
    ):
        run(tmp_path, dump, {"processes": 2}, index=index)
    assert_no_output(tmp_path)


def test_malformed_xml_names_the_page(tmp_path):
    pages = simple_pages(4)
    pages[2] = page_xml(3, "Broken", text_xml="<text>unclosed <b> element</text>")
    path = write(tmp_path, "m.xml", dump_bytes(pages))
    offset = dump_bytes(pages).index(pages[2]) + pages[2].index(b"<page>")  # where <page> starts
    with pytest.raises(
        ex.ExtractError, match=rf"malformed XML in page 3 at decompressed byte {offset}"
    ):
        run(tmp_path, path)
    bad_ns = simple_pages(2) + [page_xml(3, "Bad ns").replace(b"<ns>0</ns>", b"<ns>main</ns>")]
    with pytest.raises(ex.ExtractError, match=r"page 'Bad ns' .* no numeric <ns>"):
        run(tmp_path, write(tmp_path, "m.xml", dump_bytes(bad_ns)))
    pages[2] = pages[2].replace(b"</page>", b"")
    with pytest.raises(ex.ExtractError, match="has no </page>"):
        run(tmp_path, write(tmp_path, "m.xml", dump_bytes(pages)))
    with pytest.raises(ex.ExtractError, match="without </mediawiki>"):
        run(tmp_path, write(tmp_path, "m.xml", dump_bytes(simple_pages(4))[:-14]))
    with pytest.raises(ex.ExtractError, match="neither bz2"):
        run(tmp_path, write(tmp_path, "m.xml", b"PK\x03\x04 not a dump"))
    assert_no_output(tmp_path)


def test_invalid_utf8_page_is_skipped_and_counted(tmp_path):
    pages = simple_pages(5)
    pages[1] = pages[1].replace(b"Paragraph", b"Para\xff\xfegraph")
    table, stats, _ = run(tmp_path, write(tmp_path, "u.xml", dump_bytes(pages)), {"processes": 2})
    assert stats["invalid_utf8"] == 1 and stats["invalid_utf8_page_ids"] == [2]
    assert table.column("page_id").to_pylist() == [1, 3, 4, 5]


def test_pages_without_text_and_other_drops(tmp_path):
    pages = [
        page_xml(1, "Kept", "Real text."),
        page_xml(2, "Empty", text_xml='<text xml:space="preserve" />'),
        page_xml(3, "Deleted", text_xml='<text deleted="deleted" />'),
        page_xml(4, "Missing", text_xml=""),
        page_xml(5, "Only markup", "{{Infobox|a=b}}\n[[Kategorie:X]]"),
        page_xml(6, "Talk", ns=1),
        page_xml(7, "Wikidata item", '{"type":"item"}', model="wikibase-item"),
        page_xml(8, "Redirect text only", "#redirect [[Kept]]"),
        page_xml(9, "Dab", "'''Dab''' may mean:\n* [[A]]\n* [[B]]\n{{Disambiguation|geo}}"),
        page_xml(10, "Short", "Tiny."),
    ]
    table, stats, _ = run(tmp_path, write(tmp_path, "d.xml", dump_bytes(pages)), {"min_chars": 6})
    assert table.column("title").to_pylist() == ["Kept"]
    expected = {
        "no_text": 3,
        "empty": 2,
        "other_namespace": 1,
        "other_model": 1,
        "redirect": 1,
        "disambiguation": 1,
    }
    assert {k: stats[k] for k in expected} == expected
    table, stats, _ = run(
        tmp_path, write(tmp_path, "d.xml", dump_bytes(pages)), {"drop_disambiguation": False}
    )
    assert "Dab" in table.column("title").to_pylist() and stats["disambiguation"] == 0


@pytest.mark.parametrize("siteinfo", [True, False])
def test_dump_without_pages_gives_an_empty_file(tmp_path, siteinfo):
    path = write(
        tmp_path, "e.xml.bz2", bz2.compress(dump_bytes([], version="0.11", siteinfo=siteinfo))
    )
    table, stats, _ = run(tmp_path, path)
    assert table.num_rows == 0 and [(f.name, str(f.type)) for f in table.schema] == CONTRACT
    assert stats["pages_seen"] == 0 and json.loads((tmp_path / "out.manifest.json").read_text())


def test_zero_byte_part_is_an_error(tmp_path):
    with pytest.raises(ex.ExtractError, match=r"empty \(0 bytes\)"):
        run(tmp_path, write(tmp_path, "z.xml.bz2", b""))
    assert_no_output(tmp_path)


def test_export_versions_and_missing_siteinfo(tmp_path):
    pages = [page_xml(1, "A", "x [[File:f.png|thumb|caption]] y [[Category:C]]")]
    for version in ("0.10", "0.11"):
        for siteinfo in (True, False):
            table, _, _ = run(
                tmp_path, write(tmp_path, "v.xml", dump_bytes(pages, version, siteinfo))
            )
            # English names are always known; File/Category links go with or without <siteinfo>.
            assert table.column("text").to_pylist() == ["x y"]


def test_command_line_reports_bad_input_without_traceback(tmp_path):
    bad = write(tmp_path, "t.xml.bz2", bz2.compress(dump_bytes(simple_pages(50)))[:300])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "retrieval_pretraining.extract",
            "--config",
            json.dumps(CONFIG),
            "--dump",
            str(bad),
            "--out",
            str(tmp_path / "out.parquet"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        "t.xml.bz2" in result.stderr
        and "truncated" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert_no_output(tmp_path)


def _dying_worker(*task):
    os._exit(9)  # as the kernel's OOM killer would end a worker: no exception, no result


@pytest.mark.parametrize("indexed", [False, True])
def test_a_dead_worker_fails_with_the_fix_and_writes_nothing(tmp_path, monkeypatch, indexed):
    """chunk.py's answer to a dead worker, for extraction: name the fix (lower --processes)."""
    if indexed:
        dump, index = tmp_path / "m.xml.bz2", tmp_path / "m.index.txt.bz2"
        dump_reader.write_multistream(header_xml(), simple_pages(9), dump, index,
                                      pages_per_stream=3)
        monkeypatch.setattr(ex, "parse_streams", _dying_worker)
    else:
        dump, index = write(tmp_path, "m.xml", dump_bytes(simple_pages(9))), None
        monkeypatch.setattr(ex, "parse_batch", _dying_worker)  # forked workers inherit it
    with pytest.raises(RuntimeError, match=r"worker process died.*Lower --processes"):
        run(tmp_path, dump, {"processes": 2}, index=index)
    assert_no_output(tmp_path)


def test_a_text_of_exactly_min_chars_is_kept_and_the_latest_revision_is_read():
    """min_chars is the shortest text kept: 6 characters pass min_chars 6, 5 do not. Of a
    full-history export's revisions the last (the latest) is the article."""
    options = ex.Options(min_chars=6)
    assert ex.parse_page(0, page_xml(1, "Six", "Sixch."), "t", options) == (
        "kept", (1, "Six", "Sixch.", 10))
    assert ex.parse_page(0, page_xml(2, "Five", "Five."), "t", options) == ("empty", 2)
    revision = ('<revision><id>{}</id><model>wikitext</model>'
                '<text xml:space="preserve">{}</text></revision>')
    history = ("<page><title>History</title><ns>0</ns><id>3</id>"
               + revision.format(30, "Old prose.") + revision.format(31, "New prose.")
               + "</page>")
    assert ex.parse_page(0, history.encode(), "t", options) == (
        "kept", (3, "History", "New prose.", 31))


def test_redirect_tags_and_namespace_names_from_the_siteinfo():
    """A page with a <redirect> tag is a redirect whatever its text says. Without <ns> (old
    exports), a title that starts with any namespace's name other than the main one's, the
    negative ones (Media, Special) included, is no article; the Media namespace's name is a
    file link prefix too."""
    assert ex.parse_page(0, page_xml(1, "Moved", "Some prose.", redirect="Target"), "t",
                         ex.Options()) == ("redirect", 1)
    header = (b'<mediawiki><siteinfo><namespaces><namespace key="-2">Medium</namespace>'
              b'<namespace key="-1">Spezial</namespace><namespace key="0" />'
              b'<namespace key="6">Datei</namespace></namespaces></siteinfo>')
    options = ex.site_options(header, "t", ex.Options())
    assert {"medium", "datei"} <= options.cleaner.file_prefixes

    def without_ns(title):
        return page_xml(7, title, "Some prose.").replace(b"<ns>0</ns>", b"")

    for title in ("Datei:X.png", "Spezial:Export", "Medium:Y.ogg"):
        assert ex.parse_page(0, without_ns(title), "t", options) == ("other_namespace", 7), title
    assert ex.parse_page(0, without_ns("Plain"), "t", options)[0] == "kept"
