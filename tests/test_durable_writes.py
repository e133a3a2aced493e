"""Every write that a later run trusts as whole is flushed to disk before it takes its final
name: artifacts (files and folders), resumable training states, verified downloads and the
pre-training store. Without the flush, a node crash soon after the rename can leave the final name
on an empty file (XFS; ext4 for new files), which a resume or a rerun would read as complete.

Each test records the flushes and renames in order; it fails when a flush is missing or comes
after the rename."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from retrieval_pretraining import artifacts, fetch
from retrieval_pretraining.pretrain import store
from retrieval_pretraining.training import state


@pytest.fixture
def events(monkeypatch):
    """[("sync", path) | ("rename", source) | ("link", source)], in the order they happen."""
    seen: list[tuple[str, Path]] = []
    real_fsync, real_replace, real_rename = artifacts._fsync, os.replace, Path.rename
    real_link = os.link

    def fsync(path):
        seen.append(("sync", Path(path)))
        real_fsync(path)

    def replace(src, dst, *args, **kwargs):
        seen.append(("rename", Path(src)))
        return real_replace(src, dst, *args, **kwargs)

    def rename(self, target):
        seen.append(("rename", Path(self)))
        return real_rename(self, target)

    def link(src, dst, *args, **kwargs):
        seen.append(("link", Path(src)))
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(artifacts, "_fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "rename", rename)
    monkeypatch.setattr(os, "link", link)
    return seen


def flushed_before_moved(seen, moved: Path, files: list[Path]) -> None:
    """Each of `files` (by their path before the move) was flushed before `moved` was renamed or
    linked, and the folder that received the name was flushed after."""
    [move] = [i for i, (kind, path) in enumerate(seen) if kind != "sync" and path == moved]
    synced = {path for kind, path in seen[:move] if kind == "sync"}
    missing = [f for f in files if f not in synced]
    assert not missing, f"not flushed before {moved.name} was renamed: {missing}"
    return move


def test_an_artifact_file_is_flushed_before_its_rename(tmp_path, events):
    with artifacts.atomic_path(tmp_path / "out.json") as tmp:
        tmp.write_text("{}")
    move = flushed_before_moved(events, tmp, [tmp])
    assert ("sync", tmp_path) in events[move:], "the folder's new entry was not flushed"


def test_an_artifact_folder_is_flushed_file_by_file_before_its_rename(tmp_path, events):
    with artifacts.atomic_dir(tmp_path / "index") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "a.bin").write_bytes(b"a")
        (tmp / "sub" / "b.bin").write_bytes(b"b")
    move = flushed_before_moved(events, tmp, [tmp / "a.bin", tmp / "sub" / "b.bin", tmp / "sub"])
    assert ("sync", tmp_path) in events[move:]


def test_a_training_state_is_flushed_before_latest_json_can_name_it(tmp_path, events):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    final = state.save_state(tmp_path, step=3, model=model, optimizer=optimizer,
                             scheduler=scheduler, data_position={"step": 3})
    tmp = tmp_path / f".{final.name}.tmp"
    move = flushed_before_moved(
        events, tmp, [tmp / "model.safetensors", tmp / "state.safetensors", tmp / "state.json"])
    latest = [i for i, (kind, path) in enumerate(events)
              if kind == "rename" and path.name.startswith(".latest.json.")]
    assert latest and latest[0] > move, "latest.json named the state before it was on disk"


def test_a_verified_download_is_flushed_before_its_final_name(tmp_path, events):
    source = tmp_path / "source.bin"
    source.write_bytes(b"abc")
    dest = tmp_path / "dest" / "file.bin"
    dest.parent.mkdir()
    fetch.fetch(source.as_uri(), dest, sha1="a9993e364706816aba3e25717850c26c9cd0d89d")
    [part] = [path for kind, path in events if kind == "rename"]
    flushed_before_moved(events, part, [part])
    assert dest.read_bytes() == b"abc"


def test_a_store_file_is_flushed_before_it_is_published(tmp_path, events):
    schema = pa.schema([("x", pa.int64())])
    batch = pa.record_batch([pa.array([1, 2, 3])], schema=schema)
    target = tmp_path / "store.arrow"
    store._write(iter([batch]), schema, target)
    [published] = [path for kind, path in events if kind in ("link", "rename")]
    flushed_before_moved(events, published, [published])
    assert target.exists()
