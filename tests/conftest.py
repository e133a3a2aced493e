"""Test-session order for `make test` (pytest-xdist, one worker per core, a file per worker).

The two files whose module fixtures run a whole workflow (the end-to-end run, ~5 minutes; the
Slurm cluster, ~3) go first, so each starts on its own worker at once and the short tests fill the
workers around them; in file order they would start last and the session would wait on them.
"""

from __future__ import annotations

LONGEST_FIRST = ("test_end_to_end.py", "test_slurm.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
