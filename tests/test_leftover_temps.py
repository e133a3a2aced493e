"""A job killed outright (a time limit's SIGKILL, the OOM killer) runs no `finally`: the temp its
atomic writer was filling stays beside the output (~27 GB for an MS MARCO dense index). The next
write of that output removes it, and only it: another output's temp in the same folder may
belong to a job that is running now.

The leftovers here are made by the writers themselves, in a forked process killed with SIGKILL
inside the write."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pyarrow as pa
import pytest

from retrieval_pretraining import artifacts, checkpoints

SCHEMA = pa.schema([("doc_id", pa.string()), ("n", pa.int64())])
TABLE = pa.table({"doc_id": ["a", "b"], "n": [1, 2]}, schema=SCHEMA)


def recorded_temp_dirs(monkeypatch) -> list[Path]:
    """The paths of the temporary folders made from now on (tempfile.TemporaryDirectory's)."""
    made: list[Path] = []
    real = artifacts.tempfile.TemporaryDirectory

    def recorded(*args, **kwargs):
        folder = real(*args, **kwargs)
        made.append(Path(folder.name))
        return folder

    monkeypatch.setattr(artifacts.tempfile, "TemporaryDirectory", recorded)
    return made


def killed_while_writing(writer, path: Path) -> None:
    """Run `writer(path)` (a context manager yielding a temp) in a child killed mid-write."""
    pid = os.fork()
    if pid == 0:
        try:
            with writer(path) as tmp:
                if tmp.is_dir():
                    (tmp / "part").write_bytes(b"x" * 5000)
                else:
                    tmp.write_bytes(b"x" * 5000)
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)  # never back into pytest
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def temps(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.*"))


@pytest.mark.parametrize("writer", [artifacts.atomic_path, artifacts.atomic_dir])
def test_a_killed_write_s_temp_is_removed_by_the_next_write_of_that_output_only(
        writer, tmp_path, caplog):
    out = tmp_path / "index.faiss"
    other = tmp_path / "index.faiss.a"  # another output whose name starts with this one's
    killed_while_writing(writer, out)
    killed_while_writing(writer, other)
    left, others = temps(tmp_path, out.name), temps(tmp_path, other.name)
    assert len(others) == 1 and others[0] in left  # both writers' leftovers are there
    mine = [p for p in left if p not in others]
    assert len(mine) == 1

    with caplog.at_level(logging.INFO, logger="retrieval_pretraining.artifacts"):
        with writer(out) as tmp:
            (tmp / "part" if writer is artifacts.atomic_dir else tmp).write_bytes(b"whole")

    assert not mine[0].exists()
    assert others[0].exists()  # never another output's temp
    assert temps(tmp_path, out.name) == others
    removed = [r.getMessage() for r in caplog.records if "earlier attempt" in r.getMessage()]
    assert len(removed) == 1 and mine[0].name in removed[0] and "5,000 bytes" in removed[0]


def test_the_output_is_what_a_write_in_a_clean_folder_makes(tmp_path):
    clean, dirty = tmp_path / "clean" / "x.parquet", tmp_path / "dirty" / "x.parquet"
    dirty.parent.mkdir()
    killed_while_writing(artifacts.atomic_path, dirty)
    artifacts.write_parquet(clean, TABLE, SCHEMA)
    artifacts.write_parquet(dirty, TABLE, SCHEMA)
    assert dirty.read_bytes() == clean.read_bytes()
    assert sorted(p.name for p in dirty.parent.iterdir()) == ["x.parquet"]


def test_a_killed_checkpoint_staging_is_removed_by_the_next_staging(tmp_path):
    out = tmp_path / "minilm"
    killed_while_writing(checkpoints._staging, out)
    killed_while_writing(checkpoints._staging, tmp_path / "minilm-l2")  # another checkpoint
    with checkpoints._staging(out) as staged:
        staged.mkdir()
        (staged / "config.json").write_text("{}")
    assert temps(tmp_path, out.name) == []
    assert len(temps(tmp_path, "minilm-l2")) == 1
    assert (out / "config.json").read_text() == "{}"
