"""A copied BM25 index (rules/retrieval.smk alias_bm25_index): hard links on one file system, a
byte-identical copy where a link is refused, and a copy that a rerun of its source leaves as it
was (the source's writer and Snakemake replace the source's files; they never write into them)."""

import errno
import logging
import os
import shutil

import pytest

from retrieval_pretraining import artifacts, linked_copy


def _index(folder, version: str):
    """A folder shaped like a Lucene index as bm25.build_index leaves it (atomic_dir), with the
    timestamp file Snakemake adds to a folder output."""
    with artifacts.atomic_dir(folder) as tmp:
        (tmp / "segments_1").write_text(f"segments {version}")
        (tmp / "_0.cfs").write_bytes(bytes(range(256)) * 40 + version.encode())
        (tmp / "manifest.json").write_text(f'{{"version": "{version}"}}')
        (tmp / "sub").mkdir()
        (tmp / "sub" / "part").write_text(version)
        (tmp / linked_copy.TIMESTAMP).touch()
    return folder


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


def test_a_copied_index_is_hard_links_to_its_sources_files(tmp_path, caplog):
    source = _index(tmp_path / "src" / "index", "v1")
    out = tmp_path / "copy" / "index"
    with caplog.at_level(logging.INFO):
        counts = linked_copy.linked_folder(source, out)
    assert counts == {"linked": 4, "copied": 0}
    shared = [f for f in _files(source) if f.name != linked_copy.TIMESTAMP]
    assert _files(out) == shared  # Snakemake's timestamp is the copy's own, written by it
    for name in shared:
        assert (out / name).stat().st_ino == (source / name).stat().st_ino, name
    assert "hard-linked" in caplog.text, caplog.text
    assert not [p for p in out.parent.iterdir() if p.name != "index"]  # no temp left


def test_a_refused_link_falls_back_to_a_byte_identical_copy(tmp_path, monkeypatch, caplog):
    source = _index(tmp_path / "src" / "index", "v1")
    out = tmp_path / "copy" / "index"

    def refuse(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))
    monkeypatch.setattr(os, "link", refuse)
    with caplog.at_level(logging.INFO):
        counts = linked_copy.linked_folder(source, out)
    assert counts == {"linked": 0, "copied": 4}
    for name in _files(out):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
        assert (out / name).stat().st_ino != (source / name).stat().st_ino, name
    assert "refused a hard link" in caplog.text and "cross-device" in caplog.text, caplog.text


def test_another_link_error_is_not_taken_for_a_refusal(tmp_path, monkeypatch):
    source = _index(tmp_path / "src" / "index", "v1")

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "link", full)
    try:
        linked_copy.linked_folder(source, tmp_path / "copy" / "index")
    except OSError as error:
        assert error.errno == errno.ENOSPC
    else:
        raise AssertionError("a full disk was copied around")
    assert not (tmp_path / "copy" / "index").exists()  # nothing that looks whole



def test_a_file_given_as_the_source_is_called_no_folder_not_missing(tmp_path):
    source = tmp_path / "index"
    source.write_text("a file where the index folder should be")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        linked_copy.linked_folder(source, tmp_path / "copy" / "index")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        linked_copy.linked_folder(tmp_path / "absent", tmp_path / "copy" / "index")
    assert not (tmp_path / "copy" / "index").exists()

def test_rerunning_the_source_leaves_the_copy_as_it_was(tmp_path):
    """A rerun of build_bm25_index: Snakemake removes the job's folder output first
    (snakemake/jobs.py remove_existing_output -> io.remove: shutil.rmtree), and the build
    renames a new folder into place; the copy keeps the old files, whole."""
    source = _index(tmp_path / "src" / "index", "v1")
    out = tmp_path / "copy" / "index"
    linked_copy.linked_folder(source, out)
    before = {name: (out / name).read_bytes() for name in _files(out)}
    shutil.rmtree(source)  # what Snakemake does before rerunning the source's job
    _index(source, "v2-longer")
    assert {name: (out / name).read_bytes() for name in _files(out)} == before
    assert (source / "segments_1").read_text() == "segments v2-longer"
    # Rebuilt over an existing folder without Snakemake (bm25.build_index's rmtree + rename):
    # the same.
    _index(source, "v3")
    assert {name: (out / name).read_bytes() for name in _files(out)} == before


def test_the_command_copies_a_folder(tmp_path):
    source = _index(tmp_path / "src" / "index", "v1")
    out = tmp_path / "copy" / "index"
    linked_copy.main(["--source", str(source), "--out", str(out)])
    assert (out / "segments_1").read_text() == "segments v1"
