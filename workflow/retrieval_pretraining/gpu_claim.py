"""GPUs of its own for each GPU job where no scheduler assigns them: the trainers' launcher
(launch.py) and the one-process GPU stages' wrapper (claim_run.py) claim them here.

Snakemake's local executor with `--resources gpu=N` runs GPU jobs side by side but sets no
CUDA_VISIBLE_DEVICES: every job sees every GPU, so one-GPU jobs all compute on the first and a
torchrun job on all of them, on top of the others. Slurm names each job's GPUs in
CUDA_VISIBLE_DEVICES; where nothing does (no Slurm job, the variable unset), the job claims the
GPUs it will use here and names them itself.

A claim is an exclusive `flock` on `gpu-<index>.lock` in one folder per machine (LOCK_FOLDER_ENV,
default `<temp folder>/retrieval-pretraining-gpus-<host>`). Its descriptor stays open across the
launcher's (or claim_run's) exec, so the program it becomes (the trainer, torchrun, the stage)
holds it, and so do the DataLoader workers the trainer forks; the kernel drops it when the last
of them exits, a crash or SIGKILL included: nothing is left to clean up. A job that finds fewer
free GPUs than it needs (another Snakemake run on this machine, say) holds none and waits: claims
are made one at a time (`claim.lock`) and all at once, so two jobs never hold half of what each
needs. Indices are CUDA's,
so jobs that claim side by side must share CUDA_DEVICE_ORDER (one Snakemake run's jobs do).

Imports no torch.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

# Where the lock files are (default: lock_folder's); a folder of this machine's alone: a lock on a
# shared file system would hand out one machine's GPUs to jobs on another.
LOCK_FOLDER_ENV = "RETRIEVAL_PRETRAINING_GPU_LOCKS"
# How often a job waiting for GPUs tries again.
POLL_SECONDS = 2.0


def lock_folder(env: Mapping[str, str]) -> Path:
    if env.get(LOCK_FOLDER_ENV):
        return Path(env[LOCK_FOLDER_ENV])
    return Path(tempfile.gettempdir()) / f"retrieval-pretraining-gpus-{socket.gethostname()}"


def _open_folder(folder: Path) -> None:
    """Make `folder`, writable by every user (sticky, as /tmp): their jobs share the GPUs."""
    try:
        folder.mkdir(parents=True)
        folder.chmod(0o1777)
    except FileExistsError:
        pass


def _open_lock_file(path: Path) -> int:
    """`path` opened read-only (a flock needs no more), made readable by all where this makes it.
    The umask would leave a file another user's job cannot open (077: 0600), hence the fchmod;
    and an existing file is opened without O_CREAT: in a sticky folder the kernel refuses
    O_CREAT on another user's file even where its mode allows (fs.protected_regular)."""
    while True:
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # another job made it between the two opens
            continue
        os.fchmod(fd, 0o666)
        return fd


def _lock(path: Path, blocking: bool = False) -> int | None:
    """An open descriptor holding an exclusive flock on `path`; None where another holds it."""
    fd = _open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def try_claim(folder: Path, count: int, total: int) -> dict[int, int] | None:
    """{GPU index: descriptor holding its lock} for `count` free GPUs of `total`, or None (and
    nothing held) where fewer are free."""
    _open_folder(folder)
    guard = _lock(folder / "claim.lock", blocking=True)
    try:
        held: dict[int, int] = {}
        for index in range(total):
            fd = _lock(folder / f"gpu-{index}.lock")
            if fd is not None:
                held[index] = fd
                if len(held) == count:
                    return held
        for fd in held.values():
            os.close(fd)
        return None
    finally:
        os.close(guard)


def _try_claim_in(folder: Path, count: int, total: int) -> dict[int, int] | None:
    """try_claim, stopping with the fix where the folder cannot hold locks (a read-only or
    another user's temp folder): a bare OSError named neither the folder's variable nor why a
    GPU job wants a folder at all."""
    try:
        return try_claim(folder, count, total)
    except OSError as error:
        raise SystemExit(
            f"gpu_claim: cannot lock this job's GPUs in {folder} ({error}): set "
            f"{LOCK_FOLDER_ENV} to a folder of this machine's that every user's jobs can write "
            "(or run under Slurm, or set CUDA_VISIBLE_DEVICES)") from error


def claim(count: int, total: int, env: Mapping[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES for `count` GPUs of `total` claimed for the life of this process and
    what it execs (waiting while fewer are free)."""
    folder = lock_folder(env)
    said = False
    while (held := _try_claim_in(folder, count, total)) is None:
        if not said:
            print(f"gpu_claim: waiting for {count} of the {total} GPUs to be free (the others' "
                  f"jobs hold their locks in {folder})", file=sys.stderr, flush=True)
            said = True
        time.sleep(POLL_SECONDS)
    for fd in held.values():
        os.set_inheritable(fd, True)  # kept across exec: the lock lasts as long as the job
    return ",".join(map(str, sorted(held)))


def needs_claim(gpus: int, visible: int, env: Mapping[str, str]) -> bool:
    """Whether the launcher must claim its GPUs: it will use some, and no scheduler chose them."""
    return (gpus > 0 and visible > 0 and "SLURM_JOB_ID" not in env
            and "CUDA_VISIBLE_DEVICES" not in env)
