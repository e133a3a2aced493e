"""Stage 1, acquiring the dump: the real downloader against a local HTTP server with Range support
and injected faults, dumpstatus.json parsing on a real capture, and the Snakemake download jobs."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retrieval_pretraining import download, dumpstatus, fetch

from http_mirror import Mirror, serve
from workflow_harness import ROOT, copy_project, planned_rules, snakemake

DATA = ROOT / "data" / "wikipedia"
ENWIKI_SAMPLE = (
    DATA / "enwiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
MULTISTREAM = DATA / "multistream-sample" / "pages-articles-p2566p2583.multistream.xml.bz2"
MULTISTREAM_INDEX = (
    DATA / "multistream-sample" / "pages-articles-p2566p2583.multistream-index.xml.bz2"
)
CAPTURE = DATA / "dump-metadata" / "enwiki_20230301_dumpstatus.json"


def multistream_local_config(project: Path) -> dict:
    """The test config of a local multistream experiment: the demo's enwiki sample plus the real
    multistream sample (as an absolute file:// URL into `project`) with its index."""
    return {
        "wikipedia": {
            "source": "local",
            "parts": [
                {"name": "enwiki-sample", "url": str(ENWIKI_SAMPLE.relative_to(ROOT))},
                {
                    "name": "elwikivoyage-multistream",
                    "url": (project / MULTISTREAM.relative_to(ROOT)).as_uri(),
                    "sha1": "1cf40a366af6b4af2c924b9d58a3e9da0efdd28d",
                    "index_url": str(MULTISTREAM_INDEX.relative_to(ROOT)),
                    "index_sha1": "fe6d28904df9acbd29df615dc2ecd61d6c23761f",
                },
            ],
        }
    }


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


# ------------------------------------------------------------------------------------------------
# A small dump mirror on 127.0.0.1 with Range support and scripted faults: tests/http_mirror.py


@pytest.fixture
def mirror():
    with serve() as state:
        yield state


def _fetch(url, dest, **kwargs):
    kwargs.setdefault("backoff", 0.0)  # no sleeping in tests
    kwargs.setdefault("chunk_size", 4096)
    return fetch.fetch(url, dest, **kwargs)


# ------------------------------------------------------------------------------------------------
# fetch over HTTP


def test_clean_download_is_verified_and_manifested(mirror, tmp_path):
    data = ENWIKI_SAMPLE.read_bytes()
    mirror.files["/dump.bz2"] = data
    dest = tmp_path / "out" / "dump.xml.bz2"
    info = _fetch(mirror.url + "/dump.bz2", dest, sha1=sha1(data))
    assert dest.read_bytes() == data
    assert info["verified"] == {"check": "sha1", "expected": sha1(data), "actual": sha1(data)}
    assert info["sha256"] == hashlib.sha256(data).hexdigest()
    assert info["attempts"] == 1 and mirror.requests == [("/dump.bz2", None)]
    assert not dest.with_name(dest.name + ".part").exists()


def test_cut_download_resumes_with_range(mirror, tmp_path):
    data = ENWIKI_SAMPLE.read_bytes()
    cut = 700_000
    mirror.files["/dump.bz2"] = data
    mirror.faults["/dump.bz2"] = [("drop", cut)]
    dest = tmp_path / "dump.xml.bz2"
    info = _fetch(mirror.url + "/dump.bz2", dest, md5=hashlib.md5(data).hexdigest(), size=len(data))
    assert dest.read_bytes() == data
    assert len(mirror.requests) == 2 and mirror.requests[0][1] is None
    resumed_from = int(mirror.requests[1][1].removeprefix("bytes=").removesuffix("-"))
    # The second request asked only for what was missing (the client may drop a partial last block).
    assert cut - 4096 <= resumed_from <= cut
    assert mirror.bytes_sent == cut + len(data) - resumed_from
    assert info["attempts"] == 2 and info["verified"]["check"] == "md5"


def test_part_file_left_by_an_interrupted_run_is_resumed(mirror, tmp_path):
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    dest = tmp_path / "ms.xml.bz2"
    dest.with_name(dest.name + ".part").write_bytes(data[:5000])
    info = _fetch(mirror.url + "/ms.bz2", dest, sha256=hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data
    assert mirror.requests == [("/ms.bz2", "bytes=5000-")]
    assert info["resumed_bytes"] == 5000


def test_corrupt_byte_is_retried_then_fails_naming_file_and_checksums(mirror, tmp_path):
    """Each copy damaged at another byte (damage on the way): retried `retries` times."""
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("corrupt", 1232), ("corrupt", 1233), ("corrupt", 1234)]
    dest = tmp_path / "ms.xml.bz2"
    corrupt = data[:1234] + bytes([data[1234] ^ 0xFF]) + data[1235:]  # the last copy
    with pytest.raises(fetch.ChecksumError) as error:
        _fetch(mirror.url + "/ms.bz2", dest, sha1=sha1(data), retries=2)
    message = str(error.value)
    assert str(dest) in message and sha1(data) in message and sha1(corrupt) in message
    assert len(mirror.requests) == 3  # the first try and two retries, each from byte 0
    assert all(range_header is None for _, range_header in mirror.requests)
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial one


def test_corrupt_byte_once_then_a_clean_retry_succeeds(mirror, tmp_path):
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("corrupt", 10)]
    dest = tmp_path / "ms.xml.bz2"
    info = _fetch(mirror.url + "/ms.bz2", dest, sha1=sha1(data))
    assert dest.read_bytes() == data and info["attempts"] == 2


def test_size_is_checked_when_there_is_no_checksum(mirror, tmp_path):
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    with pytest.raises(
        fetch.ChecksumError, match=f"size {len(data) + 1} bytes.*size {len(data)} bytes"
    ):
        _fetch(mirror.url + "/ms.bz2", tmp_path / "ms.bz2", size=len(data) + 1, retries=0)
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("served,check", [
    ("same size, other bytes", "md5"), ("same size, other bytes", "sha256"),
    ("longer", "sha1"), ("longer", "size"),
])
def test_a_server_returning_another_file_is_refused_and_nothing_is_kept(mirror, tmp_path, served,
                                                                         check):
    """The mirror answers every request with a file that is not the one configured: of the right
    size but other bytes (another dump's part), or the right one with bytes appended. It is refused
    after the retries with both values named, and neither the file nor a .part a later run would
    resume is left. (A corrupt byte, sha1: test_corrupt_byte_is_retried_then_fails_...)"""
    data = MULTISTREAM.read_bytes()
    other = data[::-1] if served == "same size, other bytes" else data + b"appended"
    mirror.files["/ms.bz2"] = other
    expected = {"size": len(data)}
    if check != "size":
        expected[check] = hashlib.new(check, data).hexdigest()
    with pytest.raises(fetch.ChecksumError) as error:
        _fetch(mirror.url + "/ms.bz2", tmp_path / "ms.bz2", retries=5, **expected)
    message = str(error.value)
    if len(other) != len(data):  # the size is compared first when it is given
        assert f"size {len(data)} bytes" in message and f"size {len(other)} bytes" in message
    else:
        assert expected[check] in message and hashlib.new(check, other).hexdigest() in message
    # The second copy is the first again: no third download (test_two_identical_bad_copies_...).
    assert f"same file (sha256 {hashlib.sha256(other).hexdigest()})" in message
    assert len(mirror.requests) == 2 and all(r is None for _, r in mirror.requests)
    assert list(tmp_path.iterdir()) == []


def test_two_identical_bad_copies_end_the_retries_saying_what_to_check(mirror, tmp_path):
    """The mirror serves another file than the one pinned (a stale pin or dumpstatus.json, a
    rebuilt dump): every complete copy has the same wrong sha1. Downloading a 20 GB part `retries`
    more times cannot change that: the second identical copy (here the first was cut and resumed,
    the second whole) ends the fetch, with an error that says so, names what was expected and
    what arrived, and what to check."""
    data = MULTISTREAM.read_bytes()
    other = data[::-1]
    mirror.files["/ms.bz2"] = other
    mirror.faults["/ms.bz2"] = [("drop", len(other) // 2)]
    with pytest.raises(fetch.ChecksumError) as error:
        _fetch(mirror.url + "/ms.bz2", tmp_path / "ms.bz2", sha1=sha1(data), retries=5)
    message = str(error.value)
    assert "2 complete downloads failed verification, and two of them were the same file" in message
    assert f"expected sha1 {sha1(data)}, got sha1 {sha1(other)} both times" in message
    assert "dumpstatus.json" in message and "another mirror" in message
    assert "re-download" not in message
    assert [r is None for _, r in mirror.requests] == [True, False, True]  # cut, resumed, whole
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("left", ["shorter, of another file", "longer than the file",
                                  "the file's size, other bytes"])
def test_a_part_file_that_is_not_a_prefix_of_the_file_is_not_trusted(mirror, tmp_path, left):
    """A .part an earlier run left that is not the start of this file (the mirror's copy changed
    since, or it was another file) is re-hashed with what the resume adds, refused, deleted, and
    the file fetched again from byte 0: never completed from it. Longer or as long as the file,
    the resume gets 416 (nothing left to send) and the .part alone is refused."""
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    dest = tmp_path / "ms.xml.bz2"
    stale = {"shorter, of another file": ENWIKI_SAMPLE.read_bytes()[:5000],
             "longer than the file": data + b"junk",
             "the file's size, other bytes": data[::-1]}[left]
    dest.with_name(dest.name + ".part").write_bytes(stale)
    info = _fetch(mirror.url + "/ms.bz2", dest, sha1=sha1(data))
    assert dest.read_bytes() == data and info["attempts"] == 2
    assert mirror.requests == [("/ms.bz2", f"bytes={len(stale)}-"), ("/ms.bz2", None)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


@pytest.mark.parametrize("check", ["sha1", "size", "sha1, other bytes", "nothing"])
def test_a_bare_416_to_a_complete_part_keeps_it_where_the_config_can_tell(mirror, tmp_path, check):
    """A resume of a complete .part is answered 416 without Content-Range (allowed: nothing says
    the file's length). With a checksum, or the configured size equal to the part's, the part is
    verified and kept (no second GET); bytes the checksum refuses are fetched again from byte 0,
    and with neither check nothing can tell, so the part is fetched again too."""
    data = MULTISTREAM.read_bytes()
    mirror.etags = True  # what lets a part be resumed without a checksum (_kept_part)
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("status", 416)]  # no Content-Range
    url, dest = mirror.url + "/ms.bz2", tmp_path / "ms.bz2"
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(data[::-1] if check == "sha1, other bytes" else data)
    part.with_name(part.name + ".meta.json").write_text(json.dumps(
        {"url": url, "etag": f'"{sha1(data)}"', "last_modified": None, "total": len(data)}))
    pins = {"size": {"size": len(data)}, "nothing": {}}.get(check, {"sha1": sha1(data)})
    info = _fetch(url, dest, **pins)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]
    if check in ("sha1", "size"):
        assert mirror.requests == [("/ms.bz2", f"bytes={len(data)}-")]
        assert info["attempts"] == 1 and info["resumed_bytes"] == len(data)
    else:
        assert mirror.requests == [("/ms.bz2", f"bytes={len(data)}-"), ("/ms.bz2", None)]
        assert info["resumed_bytes"] == 0


def test_a_second_fetch_of_the_same_file_fails_at_once_naming_the_first(mirror, tmp_path):
    """A job fetching the file holds `<file>.part.lock` (here: this test, as another process
    would); a second fetch of it (the same rule run from another terminal after `--unlock`) must
    not write the .part too (the two downloads were spliced into a corrupt, "verified" file): it
    fails before any request, naming the holder, and leaves the other's .part as it was."""
    import fcntl

    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    dest = tmp_path / "ms.bz2"
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(data[:5000])
    lock = dest.with_name(dest.name + ".part.lock")
    with open(lock, "w") as held:
        held.write("pid 4242 on elsewhere\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(fetch.DownloadError, match="already being fetched by pid 4242"):
            _fetch(mirror.url + "/ms.bz2", dest, sha1=sha1(data))
    assert mirror.requests == [] and part.read_bytes() == data[:5000] and not dest.exists()
    # Once the holder is gone the fetch runs, and leaves no lock file behind.
    _fetch(mirror.url + "/ms.bz2", dest, sha1=sha1(data))
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


def test_bytes_written_to_the_part_by_someone_else_are_never_published(mirror, tmp_path):
    """Something appends to the .part between two attempts (what a second writer did before the
    lock): the resume then starts past the bytes received, and with no checksum the old code
    published a file of the right length holding those foreign bytes. The .part must hold exactly
    the bytes hashed, else it is discarded and the file fetched again."""
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("drop", 6000)]
    dest = tmp_path / "ms.bz2"
    part = dest.with_name(dest.name + ".part")
    intruded = []

    def other_writer(_delay):
        if not intruded:
            with open(part, "ab") as handle:
                handle.write(b"X" * 1000)
            intruded.append(True)

    _fetch(mirror.url + "/ms.bz2", dest, sleep=other_writer)
    assert intruded and dest.read_bytes() == data


def test_a_bad_copy_on_a_flaky_mirror_fails_after_the_retries(mirror, tmp_path):
    """Every other answer is cut half-way, and every complete copy fails its checksum, each
    damaged at another byte (so the copies differ: no two alike end the retries early). The
    resumes make progress, which must not reset the count of bad copies: the job fails after
    `retries` more whole downloads instead of downloading the file forever."""
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    cut = ("drop", len(data) // 2)
    mirror.faults["/ms.bz2"] = [f for k in range(50) for f in (cut, ("corrupt", len(data) - 1 - k))]
    with pytest.raises(fetch.ChecksumError, match="checksum mismatch on 3 complete downloads"):
        _fetch(mirror.url + "/ms.bz2", tmp_path / "ms.bz2", sha1=sha1(data), retries=2)
    assert len(mirror.requests) == 6  # three downloads, each cut once then resumed
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("check", ["md5", None])
def test_a_content_encoding_header_does_not_decode_the_file_on_disk(mirror, tmp_path, check):
    """A server that labels a .gz file `Content-Encoding: gzip` (an object store's metadata)
    despite Accept-Encoding: identity: the bytes on disk are the bytes served, so the checksum
    holds and, unchecked (the DPR files have no checksum), the file is still the .gz."""
    data = gzip.compress(MULTISTREAM.read_bytes()[:20000])
    mirror.files["/qa.tsv.gz"] = data
    mirror.faults["/qa.tsv.gz"] = [("header", "Content-Encoding", "gzip")] * 2
    dest = tmp_path / "qa.tsv.gz"
    expected = {"md5": hashlib.md5(data).hexdigest()} if check else {}
    info = _fetch(mirror.url + "/qa.tsv.gz", dest, retries=0, **expected)
    assert dest.read_bytes() == data and info["bytes"] == len(data)


def test_a_part_longer_than_the_file_is_not_kept_without_a_checksum(mirror, tmp_path):
    """A .part longer than the remote file, with nothing to verify against and no record of the
    remote file it was started from: it is dropped and the file fetched again from byte 0."""
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    dest = tmp_path / "ms.bz2"
    dest.with_name(dest.name + ".part").write_bytes(data + b"junk")
    info = _fetch(mirror.url + "/ms.bz2", dest)
    assert dest.read_bytes() == data and info["resumed_bytes"] == 0
    assert mirror.requests == [("/ms.bz2", None)]


@pytest.mark.parametrize("etags", [False, True], ids=["no validators", "etag"])
@pytest.mark.parametrize("check", ["none", "size"])
def test_a_file_replaced_between_two_gets_is_never_spliced(mirror, tmp_path, etags, check):
    """The first GET is cut; before the resume the mirror publishes a new version of the file
    (same length). With no checksum (the DPR/RocketQA files) or a size alone, the old resume
    appended the new version's tail to the old one's head and published the mix. The result must
    be the new file whole: the If-Range of the recorded ETag gets the whole file, and without
    validators the part is not resumed at all."""
    old = MULTISTREAM.read_bytes()
    new = old[::-1]
    mirror.etags = etags
    mirror.files["/ms.bz2"] = old
    mirror.faults["/ms.bz2"] = [("drop", 6000), ("replace", new)]
    dest = tmp_path / "ms.bz2"
    _fetch(mirror.url + "/ms.bz2", dest, **({"size": len(old)} if check == "size" else {}))
    assert dest.read_bytes() == new
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


def test_a_part_whose_etag_still_matches_is_resumed_without_a_checksum(mirror, tmp_path):
    """Resuming stays possible without a checksum where the server identifies its file: the run
    killed after a cut left the part and its ETag, and the rerun asks only for the rest."""
    data = MULTISTREAM.read_bytes()
    mirror.etags = True
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("drop", 6000)]
    dest = tmp_path / "ms.bz2"

    def killed(_delay):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _fetch(mirror.url + "/ms.bz2", dest, sleep=killed)
    kept = dest.with_name(dest.name + ".part").stat().st_size
    info = _fetch(mirror.url + "/ms.bz2", dest)
    assert dest.read_bytes() == data and info["resumed_bytes"] == kept > 0
    assert mirror.requests[-1] == ("/ms.bz2", f"bytes={kept}-")


@pytest.mark.parametrize("change", ["same length", "longer"])
def test_a_server_that_ignores_if_range_cannot_splice_a_changed_file(mirror, tmp_path, change):
    """The server sends ETags but serves the Range whatever If-Range says: the resume's 206 is of
    the new version. Its ETag (same length) or its Content-Range total (longer) shows the change:
    the kept bytes are dropped and the file fetched again whole, never old head + new tail."""
    old = MULTISTREAM.read_bytes()
    new = old[::-1] if change == "same length" else old + old[:999]
    mirror.etags, mirror.if_range = True, False
    mirror.files["/ms.bz2"] = old
    mirror.faults["/ms.bz2"] = [("drop", 6000), ("replace", new)]
    dest = tmp_path / "ms.bz2"
    info = _fetch(mirror.url + "/ms.bz2", dest)
    assert dest.read_bytes() == new and info["resumed_bytes"] == 0
    first, resume, again = mirror.requests
    assert first[1] is None and resume[1].startswith("bytes=") and again[1] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name]


@pytest.mark.parametrize("etags", [False, True], ids=["no validators", "etag"])
@pytest.mark.parametrize("check", [None, "sha1"])
def test_giving_up_says_what_a_rerun_does_with_the_kept_bytes(mirror, tmp_path, etags, check):
    """Cut after 6000 bytes, then a busy mirror until the retries run out. The message says
    whether a rerun resumes the kept bytes (a checksum or an ETag makes that safe) or starts from
    byte 0, and the rerun does what it said."""
    data = MULTISTREAM.read_bytes()
    mirror.etags = etags
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("drop", 6000), ("status", 503), ("status", 503)]
    dest = tmp_path / "ms.bz2"
    pin = {"sha1": sha1(data)} if check else {}
    with pytest.raises(fetch.DownloadError, match="giving up after 3 attempts") as error:
        _fetch(mirror.url + "/ms.bz2", dest, retries=1, **pin)
    message = str(error.value)
    resumes = re.search(r"Rerun to resume from the (\d+) bytes kept in (\S+?\.part)\b", message)
    assert bool(resumes) == (etags or check is not None), message
    assert resumes or message.endswith("a rerun starts from byte 0."), message
    if etags and not check:
        assert "if the server's ETag is still the one recorded" in message
    _fetch(mirror.url + "/ms.bz2", dest, **pin)
    assert dest.read_bytes() == data
    assert mirror.requests[-1][1] == (f"bytes={resumes.group(1)}-" if resumes else None)


@pytest.mark.parametrize("check", ["none", "sha256"])
def test_a_range_reply_shorter_than_asked_is_resumed_to_the_end(mirror, tmp_path, check):
    """A server that caps its 206 replies (Content-Range `bytes 6000-9999/N`) sends fewer bytes
    than the Range asked. The fetch was complete when the reply's own Content-Length was: without
    a checksum (the DPR/RocketQA files, resumed by their ETag) the truncated file was published,
    with one it was thrown away and fetched again from byte 0. It must resume until byte N."""
    data = MULTISTREAM.read_bytes()
    mirror.etags, mirror.range_cap = True, 4000
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("drop", 6000)]
    dest = tmp_path / "ms.bz2"
    pin = {"sha256": hashlib.sha256(data).hexdigest()} if check == "sha256" else {}
    delays = []
    info = _fetch(mirror.url + "/ms.bz2", dest, sleep=delays.append, **pin)
    assert dest.read_bytes() == data
    assert len(delays) == 1  # the cut connection's back-off; a short reply is no failure
    assert mirror.requests[0][1] is None and all(r for _, r in mirror.requests[1:])
    assert mirror.bytes_sent == 6000 + len(data) - int(mirror.requests[1][1][6:-1])
    assert info["attempts"] == len(mirror.requests) > 2


def test_resumed_bytes_is_zero_when_the_server_ignored_the_range(mirror, tmp_path):
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    mirror.faults["/ms.bz2"] = [("ignore-range",)]
    dest = tmp_path / "ms.bz2"
    dest.with_name(dest.name + ".part").write_bytes(data[:5000])
    info = _fetch(mirror.url + "/ms.bz2", dest, sha1=sha1(data))
    assert dest.read_bytes() == data and info["attempts"] == 1 and info["resumed_bytes"] == 0


def test_cli_fetch_takes_several_checksums_and_verifies_the_strongest(mirror, tmp_path):
    """A dataset entry pinned with both md5 and sha256 (the README suggests adding a sha256):
    the rule passes both, and the sha256 is the one verified."""
    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    out = tmp_path / "ms.bz2"
    download.main(["fetch", "--url", mirror.url + "/ms.bz2", "--out", str(out),
                   "--md5", hashlib.md5(data).hexdigest(),
                   "--sha256", hashlib.sha256(data).hexdigest()])
    manifest = json.loads(download.manifest_for(out).read_text())
    assert manifest["stats"]["verified"]["check"] == "sha256" and out.read_bytes() == data


def test_not_found_fails_without_retrying(mirror, tmp_path):
    with pytest.raises(fetch.DownloadError, match="404"):
        _fetch(mirror.url + "/missing.bz2", tmp_path / "x.bz2", retries=3)
    assert len(mirror.requests) == 1


def test_unreachable_server_gives_up_after_the_retries(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    delays = []
    with pytest.raises(fetch.DownloadError, match="giving up after 3 attempts"):
        fetch.fetch(
            f"http://127.0.0.1:{port}/x.bz2", tmp_path / "x.bz2", retries=2, sleep=delays.append
        )
    assert delays == [2.0, 4.0]  # exponential back-off
    assert not (tmp_path / "x.bz2").exists()


# ------------------------------------------------------------------------------------------------
# fetch from local files


@pytest.mark.parametrize("form", ["path", "file-url"])
@pytest.mark.parametrize("link", ["copy", "symlink"])
def test_local_path_and_file_url(tmp_path, form, link):
    url = str(MULTISTREAM) if form == "path" else MULTISTREAM.as_uri()
    dest = tmp_path / "ms.xml.bz2"
    info = fetch.fetch(url, dest, sha1="1cf40a366af6b4af2c924b9d58a3e9da0efdd28d", link=link)
    assert dest.read_bytes() == MULTISTREAM.read_bytes()
    assert dest.is_symlink() == (link == "symlink")
    assert info["mode"] == link


def test_a_symlinked_part_left_behind_is_never_written_through(tmp_path):
    """A symlink-mode run whose manifest could not be written keeps its verified `.part`, a link
    to the user's own file: a copy-mode rerun must replace the link, not truncate that file."""
    source = tmp_path / "mine" / "ms.xml.bz2"
    source.parent.mkdir()
    source.write_bytes(MULTISTREAM.read_bytes())
    dest = tmp_path / "results" / "ms.xml.bz2"
    dest.parent.mkdir()
    dest.with_name(dest.name + ".part").symlink_to(source)
    fetch.fetch(str(source), dest, sha1="1cf40a366af6b4af2c924b9d58a3e9da0efdd28d", link="copy")
    assert source.read_bytes() == MULTISTREAM.read_bytes()
    assert dest.read_bytes() == MULTISTREAM.read_bytes() and not dest.is_symlink()


def test_a_file_system_without_flock_fetches_unlocked_with_a_warning(tmp_path, monkeypatch,
                                                                        caplog):
    def no_flock(fd, operation):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(fetch.fcntl, "flock", no_flock)
    dest = tmp_path / "ms.xml.bz2"
    fetch.fetch(str(MULTISTREAM), dest, sha1="1cf40a366af6b4af2c924b9d58a3e9da0efdd28d")
    assert dest.read_bytes() == MULTISTREAM.read_bytes()
    assert "has no flock" in caplog.text and not list(tmp_path.glob("*.lock"))


def test_local_checksum_mismatch_writes_nothing(tmp_path):
    with pytest.raises(fetch.ChecksumError, match="expected sha1 0{40}, got sha1 1cf40a36"):
        fetch.fetch(str(MULTISTREAM), tmp_path / "ms.bz2", sha1="0" * 40)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["fetch", "--url", str(MULTISTREAM)], ["dumpstatus"]])
def test_a_negative_retry_count_is_refused(command, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        download.main([*command, "--out", str(tmp_path / "x"), "--retries", "-1"])
    assert stop.value.code == 2 and "-1 is negative" in capsys.readouterr().err


def test_cli_fetch_writes_file_and_manifest(tmp_path):
    dest = tmp_path / "ms.xml.bz2"
    download.main(
        [
            "fetch",
            "--url",
            MULTISTREAM.as_uri(),
            "--out",
            str(dest),
            "--sha1",
            "1cf40a366af6b4af2c924b9d58a3e9da0efdd28d",
        ]
    )
    manifest = json.loads((tmp_path / "ms.xml.bz2.manifest.json").read_text())
    assert manifest["stats"]["verified"]["check"] == "sha1"
    assert manifest["stats"]["sha256"] == hashlib.sha256(MULTISTREAM.read_bytes()).hexdigest()
    # A failure exits 1 with the message on stderr and leaves no file (as Snakemake sees it).
    env = dict(os.environ, PYTHONPATH=str(ROOT / "workflow"))
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "retrieval_pretraining.download",
            "fetch",
            "--url",
            str(MULTISTREAM),
            "--out",
            str(tmp_path / "bad.bz2"),
            "--md5",
            "0" * 32,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "expected md5 " + "0" * 32 in bad.stderr
    assert not (tmp_path / "bad.bz2").exists()


def test_a_manifest_that_cannot_be_written_keeps_the_verified_file_for_the_rerun(
    mirror, tmp_path, monkeypatch
):
    """The disk fills while the manifest is written, after the file was verified. Renamed to its
    final name first, the file was a failed job's output, which Snakemake deletes (a multi-GB
    download lost). The manifest is written first: the job fails with no file, the verified
    .part is kept, and the rerun with space downloads nothing again."""
    import errno

    from retrieval_pretraining import artifacts

    data = MULTISTREAM.read_bytes()
    mirror.files["/ms.bz2"] = data
    out = tmp_path / "ms.bz2"
    argv = ["fetch", "--url", mirror.url + "/ms.bz2", "--out", str(out), "--sha1", sha1(data)]

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(artifacts, "write_manifest", full)
        with pytest.raises(OSError, match="No space"):
            download.main(argv)
    assert not out.exists() and not download.manifest_for(out).exists()
    assert out.with_name(out.name + ".part").read_bytes() == data
    download.main(argv)
    assert out.read_bytes() == data and download.manifest_for(out).is_file()
    assert mirror.requests[-1] == ("/ms.bz2", f"bytes={len(data)}-")  # (416: nothing to send)


@pytest.mark.parametrize("pin", ["md5", "sha256", "size"])
def test_a_pin_added_after_an_unpinned_fetch_is_compared_until_the_file_is_deleted(tmp_path, pin):
    """A dataset file fetched before its checksum was pinned (the rules check pins at DAG build,
    download.check_fetched): a pin of another file is refused, naming the fix "delete the file";
    md5, the checksum MS MARCO publishes, too (it was compared only when it had been verified).
    Once the file is deleted, its stale manifest must not keep refusing (a dead end)."""
    source = tmp_path / "qrels.src"
    source.write_bytes(b"old contents\n")
    out = tmp_path / "downloads" / "qrels.train.tsv"
    download.main(["fetch", "--url", str(source), "--out", str(out)])

    def value(data: bytes):
        return len(data) if pin == "size" else hashlib.new(pin, data).hexdigest()

    download.check_fetched(out, {pin: value(b"old contents\n")})
    with pytest.raises(ValueError, match=f"pins {pin} .*delete the file"):
        download.check_fetched(out, {pin: value(b"newer contents\n")})
    out.unlink()
    download.check_fetched(out, {pin: value(b"newer contents\n")})


# ------------------------------------------------------------------------------------------------
# dumpstatus.json


@pytest.fixture(scope="module")
def capture():
    return json.loads(CAPTURE.read_text())


def test_real_capture_lists_64_parts_each_paired_with_its_index(capture):
    parts = dumpstatus.parse_dump_parts(capture, "https://dumps.wikimedia.org")
    files = capture["jobs"]["articlesmultistreamdump"]["files"]
    assert len(files) == 128 and len(parts) == 64
    assert len({p.name for p in parts}) == 64
    assert parts[0].name == "multistream1-p1p41242"
    assert parts[0].data.url == (
        "https://dumps.wikimedia.org/enwiki/20230301/"
        "enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2"
    )
    assert parts[0].index.url.endswith(
        "/enwiki-20230301-pages-articles-multistream-index1.txt-p1p41242.bz2"
    )
    assert parts[0].data.size == 268162707 and parts[0].index.size == 226729
    for part in parts:
        # Independent pairing check: data and index names carry the same number and page range.
        data_name, index_name = part.data.url.rsplit("/", 1)[1], part.index.url.rsplit("/", 1)[1]
        assert (
            data_name.replace("multistream", "multistream-index").replace(".xml-", ".txt-")
            == index_name
        )
        assert part.data.sha1 is None and part.data.size > 0  # captured mid-run: sizes only
    # Page ranges tile the page ids without gaps, in part order.
    ranges = [tuple(map(int, re.search(r"-p(\d+)p(\d+)$", p.name).groups())) for p in parts]
    assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:]))


def test_mirror_with_a_path_prefix_is_joined(capture):
    parts = dumpstatus.parse_dump_parts(capture, "https://mirror.example/wikimedia/dumps/")
    assert parts[0].data.url.startswith("https://mirror.example/wikimedia/dumps/enwiki/20230301/")


def test_job_not_done_is_a_clear_error(capture):
    status = copy.deepcopy(capture)
    status["jobs"]["articlesmultistreamdump"]["status"] = "in-progress"
    with pytest.raises(
        dumpstatus.DumpStatusError, match="'articlesmultistreamdump' is 'in-progress'.*dump_date"
    ):
        dumpstatus.parse_dump_parts(status, "https://dumps.wikimedia.org")


def test_unpaired_or_unknown_files_are_errors(capture):
    status = copy.deepcopy(capture)
    files = status["jobs"]["articlesmultistreamdump"]["files"]
    del files["enwiki-20230301-pages-articles-multistream-index2.txt-p41243p151573.bz2"]
    with pytest.raises(dumpstatus.DumpStatusError, match="multistream2.xml-p41243p151573.bz2"):
        dumpstatus.parse_dump_parts(status, "https://dumps.wikimedia.org")
    files["enwiki-20230301-pages-articles-multistream.xml.bz2.md5"] = {"size": 1}
    with pytest.raises(dumpstatus.DumpStatusError, match="neither a multistream part nor its index"):
        dumpstatus.parse_dump_parts(status, "https://dumps.wikimedia.org")



@pytest.mark.parametrize("body", [b'{"jobs": {', b"[]", b"\xff\xfe"])
def test_a_damaged_saved_dumpstatus_is_one_error_naming_it(tmp_path, body):
    """The workflow reads the saved dumpstatus.json when it plans the parts: a file cut short,
    of another JSON kind or not UTF-8 is one error naming it, not a traceback from json or .get."""
    from retrieval_pretraining.errors import InputFileError

    path = tmp_path / "dumpstatus.json"
    path.write_bytes(body)
    with pytest.raises(InputFileError, match="dumpstatus.json"):
        dumpstatus.dump_parts_from_file(path, "https://dumps.wikimedia.org")

@pytest.mark.parametrize("member, value, said", [
    ("job", [1], "jobs.articlesmultistreamdump is not a JSON object but an array"),
    ("files", "none", "jobs.articlesmultistreamdump.files is not a JSON object but a string"),
    ("a file", 5, "jobs.articlesmultistreamdump.files"
                  "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'] is 5, not "
                  "a JSON object"),
    ("url", ["/x"], "jobs.articlesmultistreamdump.files"
                    "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'].url is "
                    '["/x"], not a string'),
    ("size", "1024", "jobs.articlesmultistreamdump.files"
                     "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'].size is "
                     '"1024", not a positive integer'),
    ("size", True, "jobs.articlesmultistreamdump.files"
                   "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'].size is "
                   "true, not a positive integer"),
    ("sha1", 5, "jobs.articlesmultistreamdump.files"
                "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'].sha1 is 5, not "
                "a sha1 (40 hexadecimal digits)"),
    ("sha1", "abc", "jobs.articlesmultistreamdump.files"
                    "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'].sha1 is "
                    '"abc", not a sha1 (40 hexadecimal digits)'),
    ("md5", ["x"], "jobs.articlesmultistreamdump.files"
                   "['enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2'].md5 is "
                   '["x"], not an md5 (32 hexadecimal digits)')])
def test_a_saved_dumpstatus_whose_job_or_files_are_no_objects_is_named(capture, tmp_path,
                                                                       member, value, said):
    """A job, its files or one file's entry that is no object was an AttributeError from .get
    (or .items) naming neither the file nor the member; so was an entry's url that is no string
    (.lstrip of it). An entry's size or checksum of another type went unchecked: a size that is
    a string failed the manifest's byte sum (a TypeError), a sha1 that is a number failed
    add_sha1sums' .lower(), and either reached the download of a 20 GB part as its check."""
    from retrieval_pretraining.errors import InputFileError

    status = copy.deepcopy(capture)
    job = status["jobs"]["articlesmultistreamdump"]
    if member == "job":
        status["jobs"]["articlesmultistreamdump"] = value
    elif member == "files":
        job["files"] = value
    elif member in ("url", "size", "sha1", "md5"):
        job["files"]["enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2"][member] = value
    else:
        job["files"]["enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2"] = value
    path = tmp_path / "dumpstatus.json"
    path.write_text(json.dumps(status))
    with pytest.raises(InputFileError) as refused:
        dumpstatus.dump_parts_from_file(path, "https://dumps.wikimedia.org")
    message = str(refused.value)
    assert message.startswith(f"{path}: {said}") and "\n" not in message, message
    assert message.endswith("; fetch it again with `download dumpstatus`, or fix the path"), \
        message


def _publish_run(mirror: Mirror, date: str, status: str = "done") -> list[bytes]:
    """Serve a two-part multistream run of `testwiki` made of the real samples; return the bodies."""
    bodies = [
        MULTISTREAM.read_bytes(),
        MULTISTREAM_INDEX.read_bytes(),
        ENWIKI_SAMPLE.read_bytes(),
        MULTISTREAM_INDEX.read_bytes(),
    ]
    names = [
        f"testwiki-{date}-pages-articles-multistream1.xml-p1p2583.bz2",
        f"testwiki-{date}-pages-articles-multistream-index1.txt-p1p2583.bz2",
        f"testwiki-{date}-pages-articles-multistream2.xml-p2584p30302.bz2",
        f"testwiki-{date}-pages-articles-multistream-index2.txt-p2584p30302.bz2",
    ]
    files = {}
    for name, body in zip(names, bodies):
        path = f"/testwiki/{date}/{name}"
        mirror.files[path] = body
        files[name] = {
            "size": len(body),
            "url": path,
            "sha1": sha1(body),
            "md5": hashlib.md5(body).hexdigest(),
        }
    job = {
        "status": status,
        "updated": f"{date[:4]}-01-02 03:04:05",
        "files": files if status == "done" else {},
    }
    document = {"jobs": {"articlesmultistreamdump": job}, "version": "0.8"}
    mirror.files[f"/testwiki/{date}/dumpstatus.json"] = json.dumps(document).encode()
    return bodies


def _publish_sizes_only(mirror: Mirror, date: str) -> list[bytes]:
    """A run whose status lists sizes only, as Wikimedia's does (the enwiki capture), with the
    run's sha1sums.txt beside it."""
    bodies = _publish_run(mirror, date)
    path = f"/testwiki/{date}/dumpstatus.json"
    status = json.loads(mirror.files[path])
    files = status["jobs"]["articlesmultistreamdump"]["files"]
    sums = "".join(f"{meta.pop('sha1')}  {name}\n" for name, meta in files.items())
    for meta in files.values():
        del meta["md5"]
    mirror.files[path] = json.dumps(status).encode()
    mirror.files[f"/testwiki/{date}/testwiki-{date}-sha1sums.txt"] = (
        f"{'0' * 40}  testwiki-{date}-pages-articles.xml.bz2\n" + sums).encode()
    return bodies


def test_a_status_with_sizes_only_gets_the_sha1s_of_the_runs_sha1sums(mirror, tmp_path):
    """A corrupt byte keeps the size: verified by size alone, a bad 20 GB part would be accepted
    (and only fail at extraction, with the download already counted done). The sha1s come from
    the run's sha1sums.txt; without one, the sizes are all there is."""
    bodies = _publish_sizes_only(mirror, "20260101")
    date, status, parts = dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "latest",
                                                      sleep=lambda s: None)
    assert [p.data.sha1 for p in parts] == [sha1(bodies[0]), sha1(bodies[2])]
    assert [p.index.sha1 for p in parts] == [sha1(bodies[1]), sha1(bodies[3])]
    part = parts[0].data
    mirror.faults[part.url.removeprefix(mirror.url)] = [("corrupt", 100)] * 2
    with pytest.raises(fetch.ChecksumError, match="sha1"):
        _fetch(part.url, tmp_path / "part.bz2", sha1=part.sha1, size=part.size, retries=1)
    del mirror.files["/testwiki/20260101/testwiki-20260101-sha1sums.txt"]
    _, _, parts = dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "20260101",
                                              sleep=lambda s: None)
    assert [p.data.sha1 for p in parts] == [None, None] and parts[0].data.size == len(bodies[0])


def test_files_the_runs_sha1sums_does_not_list_yet_are_named_in_a_warning(mirror, caplog):
    """A run still in progress publishes its sha1sums.txt before every job's files are in it:
    the files it lacks were verified by their size alone without a word (a missing
    sha1sums.txt says so)."""
    bodies = _publish_sizes_only(mirror, "20260101")
    path = "/testwiki/20260101/testwiki-20260101-sha1sums.txt"
    lines = mirror.files[path].decode().splitlines(keepends=True)
    mirror.files[path] = "".join(l for l in lines if "multistream2" not in l).encode()
    with caplog.at_level("WARNING", logger="retrieval_pretraining.dumpstatus"):
        _, _, parts = dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "20260101",
                                                  sleep=lambda s: None)
    assert [p.data.sha1 for p in parts] == [sha1(bodies[0]), None]
    warned = [r.getMessage() for r in caplog.records if "no sha1" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("1 of the 4 'articlesmultistreamdump' files")
    assert "multistream2.xml-p2584p30302.bz2" in warned[0] and "size only" in warned[0]


def test_a_sha1sums_entry_that_contradicts_the_status_is_refused():
    status = {"jobs": {"articlesmultistreamdump": {"status": "done", "files": {
        "w-20260101-pages-articles-multistream.xml.bz2": {"size": 1, "sha1": "a" * 40}}}}}
    with pytest.raises(dumpstatus.DumpStatusError, match="changed while it was read"):
        dumpstatus.add_sha1sums(status, {"w-20260101-pages-articles-multistream.xml.bz2": "b" * 40})


def test_runs_are_read_from_a_real_mirror_listing():
    listing = (DATA / "dump-metadata" / "enwiki_index.html").read_text()
    runs = dumpstatus.listed_runs(listing)
    assert runs[0] == "20230301" and runs[-1] == "20221201" and len(runs) == 7  # not `latest/`


def test_latest_picks_the_newest_finished_run(mirror):
    _publish_run(mirror, "20260101")
    _publish_run(mirror, "20260120", status="in-progress")
    date, _, parts = dumpstatus.fetch_dumpstatus(
        mirror.url, "testwiki", "latest", sleep=lambda s: None
    )
    assert date == "20260101"
    assert [p.name for p in parts] == ["multistream1-p1p2583", "multistream2-p2584p30302"]
    with pytest.raises(dumpstatus.DumpStatusError, match="in-progress"):
        dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "20260120")


def test_latest_does_not_pass_over_a_run_the_mirror_failed_to_answer_for(mirror):
    """The newest run's status answers 503 (a loaded mirror) even after the retries: `latest` must
    not quietly settle on an older run (which dump an experiment uses would depend on the
    mirror's load that day); it fails naming the run. A run without a status yet (404) is passed
    over."""
    _publish_run(mirror, "20260101")
    _publish_run(mirror, "20260120")
    newest = "/testwiki/20260120/dumpstatus.json"
    mirror.faults[newest] = [("status", 503)] * 3
    with pytest.raises(fetch.DownloadError, match="run 20260120 of testwiki could not be read"):
        dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "latest", retries=2,
                                    sleep=lambda s: None)
    del mirror.files[newest]
    date, _, _ = dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "latest",
                                             sleep=lambda s: None)
    assert date == "20260101"


def test_a_served_dumpstatus_that_is_no_object_is_named_and_latest_passes_it_over(mirror):
    """A run's dumpstatus.json that parses to a list was an AttributeError from .get, naming
    neither the URL nor the fix; `latest` crashed on it rather than passing over the run, as it
    passes over another unusable status."""
    from retrieval_pretraining.errors import InputFileError

    _publish_run(mirror, "20260101")
    mirror.files["/testwiki/20260120/dumpstatus.json"] = b"[1]"
    with pytest.raises(InputFileError) as refused:
        dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "20260120", sleep=lambda s: None)
    message = str(refused.value)
    assert message.startswith(f"{mirror.url}/testwiki/20260120/dumpstatus.json: ") and \
        "not a JSON object but an array" in message and "\n" not in message, message
    date, _, _ = dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "latest",
                                             sleep=lambda s: None)
    assert date == "20260101"


@pytest.mark.parametrize("body, said", [
    (b"[1]", "not a JSON object but an array"),
    (b'{"jobs": {"articlesmultistreamdump": "done"}}',
     "jobs.articlesmultistreamdump is not a JSON object but a string"),
    (b'{"jobs": {"articlesmultistreamdump": {"status": "done", "files": {"x.bz2": 5}}}}',
     "jobs.articlesmultistreamdump.files['x.bz2'] is 5, not a JSON object"),
    (b"<html>502 Bad Gateway</html>", "cannot read it as a dumpstatus.json (JSONDecodeError")])
def test_a_served_dumpstatus_of_another_shape_says_what_to_do_with_the_mirror(mirror, body,
                                                                                said):
    """A dumpstatus.json a mirror serves that is no object (or has members that are none) was
    refused with "rebuild it with the stage that writes it" (no stage of ours writes it) or,
    for the saved copy's reader, "fetch it again with `download dumpstatus`" (which fetches it
    from the same mirror); one that is no JSON (an error page) was a JSONDecodeError traceback
    naming no URL. Each names the URL and what to do with the mirror."""
    from retrieval_pretraining.errors import InputFileError

    url = f"{mirror.url}/testwiki/20260120/dumpstatus.json"
    mirror.files["/testwiki/20260120/dumpstatus.json"] = body
    with pytest.raises(InputFileError) as refused:
        dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "20260120", sleep=lambda s: None)
    message = str(refused.value)
    assert message.startswith(f"{url}: ") and said in message and "\n" not in message, message
    assert message.endswith(f"; {dumpstatus.MIRROR_FIX}"), message
    assert "stage that writes it" not in message and "download dumpstatus" not in message


@pytest.mark.parametrize("member, value", [("sha1", 5), ("size", "1024")])
def test_a_served_dumpstatus_entry_of_another_type_is_named_before_its_sha1s_are_added(
        mirror, member, value):
    """add_sha1sums compared a listed sha1 through .lower(): a number there was an
    AttributeError naming neither the URL nor the entry; a size that is a string was summed
    into the manifest's bytes later. Refused with the URL, the entry and the member."""
    from retrieval_pretraining.errors import InputFileError

    _publish_sizes_only(mirror, "20260120")
    path = "/testwiki/20260120/dumpstatus.json"
    status = json.loads(mirror.files[path])
    name = "testwiki-20260120-pages-articles-multistream1.xml-p1p2583.bz2"
    status["jobs"]["articlesmultistreamdump"]["files"][name][member] = value
    mirror.files[path] = json.dumps(status).encode()
    with pytest.raises(InputFileError) as refused:
        dumpstatus.fetch_dumpstatus(mirror.url, "testwiki", "20260120", sleep=lambda s: None)
    message = str(refused.value)
    assert message.startswith(f"{mirror.url}{path}: jobs.articlesmultistreamdump.files['{name}']"
                              f".{member} is {json.dumps(value)}, not a"), message
    assert message.endswith(f"; {dumpstatus.MIRROR_FIX}") and "\n" not in message, message


def test_file_mirror_works_like_a_web_mirror(tmp_path):
    # A pre-downloaded dump folder laid out like dumps.wikimedia.org, used as a file:// mirror.
    run = tmp_path / "testwiki" / "20260101"
    run.mkdir(parents=True)
    name = "testwiki-20260101-pages-articles-multistream.xml.bz2"
    (run / name).write_bytes(MULTISTREAM.read_bytes())
    (run / "testwiki-20260101-pages-articles-multistream-index.txt.bz2").write_bytes(b"index")
    files = {p.name: {"size": p.stat().st_size} for p in run.iterdir()}  # no url: built from names
    job = {"status": "done", "files": files}
    (run / "dumpstatus.json").write_text(json.dumps({"jobs": {"articlesmultistreamdump": job}}))
    date, _, parts = dumpstatus.fetch_dumpstatus(tmp_path.as_uri(), "testwiki", "latest")
    assert date == "20260101" and [p.name for p in parts] == ["multistream"]  # a small wiki
    dest = tmp_path / "out.bz2"
    fetch.fetch(parts[0].data.url, dest, size=parts[0].data.size)
    assert dest.read_bytes() == MULTISTREAM.read_bytes()


# ------------------------------------------------------------------------------------------------
# Snakemake: one download job per part


def test_snakemake_dumps_source_plans_one_download_per_part_and_index(mirror, tmp_path):
    bodies = _publish_run(mirror, "20260101")
    project = copy_project(
        tmp_path / "project",
        {
            "wikipedia": {
                "source": "dumps",
                "wiki": "testwiki",
                "dump_date": "20260101",
                "mirror": mirror.url,
            }
        },
    )
    snakemake(project, "results/wikipedia/dumpstatus.json")  # the checkpoint, for real
    assert planned_rules(project, "download_dump") == {
        "download_dump_part": 2,
        "download_dump_index": 2,
        "download_dump": 1,
    }
    # And the downloads themselves, verified against the status file's sha1s and sizes.
    snakemake(project, "download_dump")
    dump = project / "results" / "wikipedia" / "dump"
    assert (dump / "multistream2-p2584p30302.xml.bz2").read_bytes() == bodies[2]
    assert (dump / "multistream1-p1p2583.index.txt.bz2").read_bytes() == bodies[1]
    manifest = json.loads((dump / "multistream2-p2584p30302.xml.bz2.manifest.json").read_text())
    assert manifest["stats"]["verified"]["expected"] == sha1(bodies[2])
    # Raising the retry count is operational: it must not re-download anything.
    config_file = project / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["wikipedia"]["retries"] += 3
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    assert planned_rules(project, "download_dump") == {}


def test_latest_is_resolved_once_and_the_mirror_is_not_part_of_a_file(mirror, tmp_path):
    """`dump_date: latest` names a run once: after Wikimedia publishes a newer run, neither an edit
    to a shared module (artifacts.py, which the downloader imports) nor a switch to another mirror
    of the same files re-resolves it or re-fetches anything; a file missing later comes from the
    new mirror, of the run resolved at first."""
    bodies = _publish_run(mirror, "20260101")
    project = copy_project(tmp_path / "project", {"wikipedia": {
        "source": "dumps", "wiki": "testwiki", "dump_date": "latest", "mirror": mirror.url}})
    snakemake(project, "download_dump")
    _publish_run(mirror, "20260120")
    shared = project / "workflow" / "retrieval_pretraining" / "artifacts.py"
    shared.write_text(shared.read_text() + "\n# an unrelated edit\n")
    assert planned_rules(project, "download_dump") == {}
    with serve() as other:
        _publish_run(other, "20260101")
        config_file = project / "config.yaml"
        config = yaml.safe_load(config_file.read_text())
        config["wikipedia"]["mirror"] = other.url
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        assert planned_rules(project, "download_dump") == {}
        dump = project / "results" / "wikipedia" / "dump"
        (dump / "multistream2-p2584p30302.xml.bz2").unlink()
        snakemake(project, "download_dump")
        assert (dump / "multistream2-p2584p30302.xml.bz2").read_bytes() == bodies[2]
        assert [path for path, _ in other.requests] == [
            "/testwiki/20260101/testwiki-20260101-pages-articles-multistream2.xml-p2584p30302.bz2"
        ]


def test_snakemake_local_parts_with_a_multistream_index(tmp_path):
    project = tmp_path / "project"
    copy_project(project, multistream_local_config(project))
    # Two parts (the demo's enwiki sample and the multistream sample), one index: the enwiki
    # sample is a plain bz2 dump without one.
    assert planned_rules(project, "download_dump") == {
        "download_dump_part": 2,
        "download_dump_index": 1,
        "download_dump": 1,
    }
    # And run: local files pass no mirror (an empty one must still make a valid command line).
    snakemake(project, "download_dump")
    dump = project / "results" / "wikipedia" / "dump"
    assert (dump / "elwikivoyage-multistream.index.txt.bz2").read_bytes() == MULTISTREAM_INDEX.read_bytes()


def test_local_parts_are_read_from_the_project_when_run_in_another_directory(tmp_path):
    """`snakemake --directory <elsewhere>` keeps the results there, but a relative part path names
    a file in the project, as every config path does (config.resolve_path): it was looked up in
    the working directory, so the plan failed ("Missing input files") and the fetch would have
    opened the wrong file. The part and the index (plain paths) and the file:// part all arrive."""
    project = tmp_path / "project"
    copy_project(project, multistream_local_config(project))
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text((project / "config.yaml").read_text())
    snakemake(project, "--directory", str(work), "download_dump")
    dump = work / "results" / "wikipedia" / "dump"
    assert (dump / "enwiki-sample.xml.bz2").read_bytes() == ENWIKI_SAMPLE.read_bytes()
    assert (dump / "elwikivoyage-multistream.index.txt.bz2").read_bytes() == (
        MULTISTREAM_INDEX.read_bytes())
    assert not (project / "results").exists()


def test_another_directory_without_a_config_yaml_takes_the_projects_under_an_overlay(tmp_path):
    """Under `--directory <elsewhere>` holding no config.yaml, the project's is the base of a
    `--configfile` overlay: Snakemake skips a missing `configfile:` without a word when the
    command line names one, so the overlay alone was validated and refused ("'seed' is a
    required property", one line per missing section)."""
    project = copy_project(tmp_path / "project", multistream_local_config(tmp_path / "project"))
    work = tmp_path / "work"
    work.mkdir()
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"experiment": "elsewhere"}))
    result = snakemake(project, "--directory", str(work), "--configfile", str(overlay),
                       "--dry-run", "download_dump")
    assert "download_dump_part" in result.stdout and "required property" not in result.stderr


def test_local_part_outside_the_project_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.xml.bz2"
    outside.write_bytes(b"x")
    project = copy_project(
        tmp_path / "project", {"wikipedia": {"parts": [{"name": "outside", "url": str(outside)}]}}
    )
    result = snakemake(project, "--dry-run", "download_dump", check=False)
    assert result.returncode != 0 and "data_root" in result.stdout + result.stderr
