"""Test-session order for `make test` (pytest-xdist, one worker per core, a file per worker), and
the suite's disk hygiene (at the end: each file's temporary folders go when it is done).

Longest files first (the classic longest-processing-time rule for two machines): the two whose
module fixtures run a whole workflow (the end-to-end run, ~4 minutes in the suite; the Slurm
cluster, ~2.5, mostly waiting on status polls) start at once, one on each worker, and the short
tests fill the workers around them; started late, the session waits on them at its end. The other
names are the files with the slowest tests of the last CI log (`make test` prints them). Needs
`--no-loadscope-reorder` (the Makefile passes it): xdist otherwise re-sorts files by test count.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

LONGEST_FIRST = (
    "test_end_to_end.py", "test_slurm.py", "test_corpus_reruns.py", "test_pretrain_learns.py",
    "test_bm25.py", "test_pretrain_train.py", "test_finetune.py", "test_tables.py",
    "test_bow_experiment.py", "test_workflow_reruns.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


# Disk. The CI machine's disk is shared with other work and has run out part-way through the suite
# (ENOSPC in tmp_path_factory.mktemp, hundreds of errors after it), while pytest keeps every
# temporary folder of the session until its end. So each test file's temporaries go as soon as
# the file is done, unless one of its tests failed (then they stay for the post-mortem, as
# tmp_path_retention_policy = "failed" in pyproject.toml keeps a failed test's own tmp_path).
# No fixture here is session-scoped, so a folder made while a file runs is that file's alone
# (`--dist loadfile` keeps a file on one worker, and each worker has its own base folder).
_FILES_WITH_FAILURES: set[Path] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        _FILES_WITH_FAILURES.add(item.path)
    return report


@pytest.fixture(scope="module", autouse=True)
def _file_temporaries(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Set up before the file's own module fixtures and torn down after them (autouse fixtures
    come first within their scope): removes the folders the file made under the base folder."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.path in _FILES_WITH_FAILURES:
        return
    for path in set(base.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
