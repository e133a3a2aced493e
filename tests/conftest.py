"""Test-session order for `make test` (pytest-xdist, one worker per core, a file per worker).

Longest files first (the classic longest-processing-time rule for two machines): the two whose
module fixtures run a whole workflow (the end-to-end run, ~4 minutes in the suite; the Slurm
cluster, ~2.5, mostly waiting on status polls) start at once, one on each worker, and the short
tests fill the workers around them; started late, the session waits on them at its end. The other
names are the files with the slowest tests of the last CI log (`make test` prints them). Needs
`--no-loadscope-reorder` (the Makefile passes it): xdist otherwise re-sorts files by test count.
"""

from __future__ import annotations

LONGEST_FIRST = (
    "test_end_to_end.py", "test_slurm.py", "test_corpus_reruns.py", "test_pretrain_learns.py",
    "test_bm25.py", "test_pretrain_train.py", "test_finetune.py", "test_tables.py",
    "test_bow_experiment.py", "test_workflow_reruns.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
