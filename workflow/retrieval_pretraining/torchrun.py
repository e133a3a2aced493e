"""torchrun that ends with 75 (RESUME_EXIT_CODE) when its workers stopped after saving their state.

    python -m retrieval_pretraining.torchrun <torchrun's options> -m <module> <args>

torchrun reports any worker's non-zero status as its own failure (exit 1), and so does it after a
stop signal reached it: a run whose workers all saved their state on SIGTERM/SIGUSR1 and exited 75
would end with 1, and the job's status would no longer say "stopped after saving, resubmit".

This runs torchrun's own `main` in this process: the launcher execs it, so the signals sent to the
launcher land on torchrun's handlers as before. It names a marker file in a folder made for this run
alone (`tempfile.mkdtemp`: a name no other run can produce, where a PID is shared by jobs in other
PID namespaces or on other nodes sharing TMPDIR) in STOP_MARKER_ENV, which the workers inherit; the
node's first worker (LOCAL_RANK 0) writes it once every rank has passed the barrier after the main
rank's save (training.run_or_resume_exit). torchrun failing with the marker there ends with 75,
after printing its error; without it, torchrun's error stands (exit 1). Any failure after the
marker is written (a worker crashing in its teardown, say) ends with 75 too: safe, as the state was
saved before the marker, so a rerun resumes from it. The folder is removed at exit. Where no marker
is named (one process, no torchrun) nothing is written.

In a multi-node job, srun's `--kill-on-bad-exit` (launch.py) may kill the other nodes' torchruns
(137) once one node exits 75, before they exit 75 themselves; the step then reports 137, a failure
that a rerun also resumes from (not tested here: no multi-node cluster).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .training.lifecycle import RESUME_EXIT_CODE, STOP_MARKER_ENV


def run(argv: list[str]) -> int:
    """torchrun's main on `argv`; 0, RESUME_EXIT_CODE, or torchrun's own exception re-raised."""
    from torch.distributed import run as torchrun

    folder = Path(tempfile.mkdtemp(prefix="retrieval-pretraining-stop-"))
    marker = folder / "stopped"
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
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
