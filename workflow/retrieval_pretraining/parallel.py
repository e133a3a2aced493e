"""Worker processes for the CPU stages: a bounded, ordered map over a lazily produced task stream.

`multiprocessing.Pool.imap` hangs forever when a worker dies (the kernel's OOM killer, say): the
task it held is never answered. A `ProcessPoolExecutor` turns that into BrokenProcessPool, which
the stages report with the fix. `Executor.map` would read the whole task stream up front (every
article of a 20 GB dump part); `bounded_map` keeps at most `in_flight` tasks submitted.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def process_pool(
    processes: int,
    start_method: str,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
) -> contextlib.AbstractContextManager[cf.ProcessPoolExecutor | None]:
    """A process pool, or None (run in this process) for processes <= 1.

    start_method "fork" falls back to "spawn" where the platform has no fork.
    """
    if processes <= 1:
        return contextlib.nullcontext()
    methods = multiprocessing.get_all_start_methods()
    method = start_method if start_method in methods else "spawn"
    return cf.ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context(method),
        initializer=initializer,
        initargs=initargs,
    )


def bounded_map(
    function: Callable[..., Any],
    tasks: Iterable[tuple],
    pool: cf.Executor | None,
    in_flight: int,
) -> Iterator[Any]:
    """`function(*task)` for every task, results in task order, at most `in_flight` submitted
    (to processes, or to threads: the encoder tokenises ahead of its model with it)."""
    if pool is None:
        for task in tasks:
            yield function(*task)
        return
    pending: deque[cf.Future] = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(function, *task))
            if len(pending) >= in_flight:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # a failed or abandoned run: do not start what is still queued
            future.cancel()
