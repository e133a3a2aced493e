"""torchrun that ends with 75 (RESUME_EXIT_CODE) when its workers stopped after saving their state.

    python -m retrieval_pretraining.torchrun <torchrun's options> -m <module> <args>

torchrun reports any worker's non-zero status as its own failure (exit 1), and so does it after a
stop signal reached it: a run whose workers all saved their state on SIGTERM/SIGUSR1 and exited 75
would end with 1, and the job's status would no longer say "stopped after saving, resubmit".

This runs torchrun's own `main` in this process: the launcher execs it, so the signals sent to the
launcher land on torchrun's handlers as before. It names a marker file, new for this run (this
PID, in the node's temp folder, any old one removed), in STOP_MARKER_ENV, which the workers
inherit; the node's first worker (LOCAL_RANK 0) writes it once every rank has passed the barrier
after the main rank's save (training.run_or_resume_exit). torchrun failing with the marker there
ends with 75, after printing its error; without it, torchrun's error stands (exit 1). The marker is
removed at exit. Where no marker is named (one process, no torchrun) nothing is written.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from .training.lifecycle import RESUME_EXIT_CODE, STOP_MARKER_ENV


def marker_path(pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"retrieval-pretraining-stopped-{pid}"


def run(argv: list[str]) -> int:
    """torchrun's main on `argv`; 0, RESUME_EXIT_CODE, or torchrun's own exception re-raised."""
    from torch.distributed import run as torchrun

    marker = marker_path(os.getpid())
    marker.unlink(missing_ok=True)  # a dead process's with this PID: not this run's stop
    os.environ[STOP_MARKER_ENV] = str(marker)
    try:
        torchrun.main(argv)
        return 0
    except BaseException as error:  # ChildFailedError, SignalException (torchrun got the signal)
        if not marker.exists():
            raise
        print(f"torchrun: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        print(f"torchrun: the workers stopped after the state was saved: exit {RESUME_EXIT_CODE} "
              "(a rerun resumes)", file=sys.stderr, flush=True)
        return RESUME_EXIT_CODE
    finally:
        marker.unlink(missing_ok=True)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
