"""How a trainer process stops and ends: stop signals, DataLoader workers, the exit itself.

Slurm signals (SIGTERM, or USR1 with --signal) every process of a job step before a time-out or a
preemption. The trainer saves its state at the next step boundary and exits RESUME_EXIT_CODE (75)
when it runs as one process; under torchrun every worker exits 75, and so does torchrun as the
launcher starts it (retrieval_pretraining.torchrun: torchrun alone would exit 1, reporting a failed
worker), told so by the marker file each node's first worker writes once the state is saved.
Slurm's requeue or `snakemake --retries` reruns the same command on any failure, which resumes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any, Callable

import torch.distributed as dist

from .distributed import DistEnv, left_a_gloo_group

# Exit status of a run that stopped on SIGTERM/SIGUSR1 after saving its state (EX_TEMPFAIL): a
# scheduler (Slurm requeue, `snakemake --retries`) reruns the same command, which resumes.
RESUME_EXIT_CODE = 75
# The file retrieval_pretraining.torchrun names for its workers: written (LOCAL_RANK 0) when they
# stop after the state is saved, so that torchrun's failure is turned into RESUME_EXIT_CODE.
STOP_MARKER_ENV = "RETRIEVAL_PRETRAINING_STOP_MARKER"


class StopFlag:
    """SIGTERM / SIGUSR1 set `requested`; the loop saves its state at the next step and exits.

    Slurm sends SIGTERM (or the signal chosen with --signal, e.g. USR1) before a time-out or
    preemption; the handler only sets a flag because saving, or even logging (its lock may be
    held by the code interrupted), inside a signal handler is unsafe: the trainer logs the stop
    at the step boundary.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)):
        self.requested = False
        self.signal_name: str | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name


def run_or_resume_exit(requested: bool, env: DistEnv, save: Callable[[], None]) -> bool:
    """If any rank got a stop signal: save (main rank), sync, return True (caller exits).

    `requested`: the verdict every rank agrees on, StopFlag.requested reduced over the ranks with
    the step's values (host_read), so that all stop at the same step. After the barrier every
    node's first worker marks the stop for its torchrun (STOP_MARKER_ENV, where set)."""
    if not requested:
        return False
    if env.is_main:
        save()
    if env.distributed:
        dist.barrier()
    marker = os.environ.get(STOP_MARKER_ENV)
    if marker and env.local_rank == 0:  # past the barrier: the main rank's save is complete
        with open(marker, "w") as file:
            file.write(f"rank {env.rank} stopped after saving\n")
    return True


def ignore_stop_signals(worker_id: int = 0) -> None:
    """DataLoader `worker_init_fn`: workers ignore SIGTERM and SIGUSR1; the main process saves.

    Slurm signals every process of a job step. PyTorch's workers exit on a SIGTERM sent by anyone
    but their parent (and on SIGUSR1 by default), after which the main process raises "DataLoader
    worker killed" instead of saving its state. Workers still end when the main process shuts the
    loader down, and their watchdog ends them if it dies.
    """
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def reap_workers_at_exit() -> None:
    """Kill DataLoader workers still alive at exit, before multiprocessing waits for them.

    Workers ignore SIGTERM (ignore_stop_signals), and multiprocessing's own exit hook stops daemonic
    children with SIGTERM and then joins them: on any exit that did not shut the loader down first
    (an exception, a forgotten iterator) that join would wait forever, holding a GPU job until its
    time limit. atexit runs the last registered hook first, so this one runs before
    multiprocessing's.
    """
    import atexit
    import multiprocessing.util  # noqa: F401  (registers its exit hook now, i.e. before ours)

    if getattr(reap_workers_at_exit, "_installed", False):
        return
    atexit.register(_kill_workers)
    reap_workers_at_exit._installed = True  # type: ignore[attr-defined]


def _kill_workers() -> None:
    """SIGKILL this process's daemonic children (DataLoader workers) and wait for them."""
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join(5)


def close_loader(iterator: Any) -> None:
    """Shut a DataLoader iterator's workers down now (they exit on the sentinel it sends)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def exit_process(code: int) -> None:
    """End a trainer process with `code`: sys.exit, or after a gloo run (see
    distributed.teardown_distributed) flush and os._exit, skipping the interpreter's clean-up."""
    if not left_a_gloo_group():
        sys.exit(code)
    _kill_workers()  # os._exit skips the exit hook reap_workers_at_exit registered
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
