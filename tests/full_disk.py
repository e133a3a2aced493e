"""A disk that fills during a write, simulated without root: RLIMIT_FSIZE.

Inside `full_disk(n)`, a write that would take any file of this process (and of the processes it
starts) past n bytes fails with OSError EFBIG, part-way through, as a write to a full disk fails
with ENOSPC. The kernel would also send SIGXFSZ, which kills the process; it is ignored meanwhile
so the write raises instead. Only the soft limit is lowered (the hard one stays), so the limit is
lifted again at the end of the block: a rerun "after space is back".
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def full_disk(max_bytes: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def is_full_disk_error(error: BaseException) -> bool:
    """The write failed for want of space: EFBIG here, as ENOSPC on a real disk. Not every writer
    raises OSError (safetensors raises its own error naming the OS error), so the message counts."""
    if isinstance(error, OSError) and error.errno == errno.EFBIG:
        return True
    return os.strerror(errno.EFBIG) in str(error)


def files_under(folder: Path) -> list[str]:
    """Every file and folder below `folder` (hidden ones included), relative, sorted."""
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))
