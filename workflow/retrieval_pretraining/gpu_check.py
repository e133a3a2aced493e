"""Refuse to compute on the CPU in a Slurm job granted GPUs that torch cannot use.

torch falls back to the CPU without an error: `torch.cuda.is_available()` is False, with at most a
warning, when the node's NVIDIA driver is older than the torch build's CUDA needs (PyPI's torch
2.13.0 is the CUDA 13 build: driver >= 580) or when the environment holds a CPU-only torch. A GPU
stage would then pre-train, fine-tune, encode or mine on the CPU until its time limit, and its
retries would do the same. launch.py refuses a job that sees no GPU at all; this covers one that
sees GPUs its torch cannot use.

"Granted" is what Slurm sets: SLURM_JOB_ID, CUDA_VISIBLE_DEVICES listing at least one device, and
the NVIDIA driver loaded on the node (its control device exists). A laptop or CI run (no Slurm
job), a job granted no GPU, and a test cluster with fake GPUs (no driver) keep the CPU.

Imports no torch at import time: launch.py counts the visible GPUs with parse_visible_devices.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

from .errors import BadInput

# A CUDA_VISIBLE_DEVICES entry CUDA accepts: an index or a GPU/MIG UUID.
_DEVICE = re.compile(r"^([0-9]+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+)$")
# Present on every node whose NVIDIA kernel driver is loaded (CUDA opens it), whatever the
# job's device cgroup lets it open.
DRIVER_DEVICE = Path("/dev/nvidiactl")


def parse_visible_devices(value: str) -> int:
    """GPUs a CUDA_VISIBLE_DEVICES value exposes. CUDA enumerates the list up to its first invalid
    entry, so "0,1,-1,2" is 2 GPUs and "" / "-1" / Slurm's "NoDevFiles" are none."""
    count = 0
    for entry in value.split(","):
        if not _DEVICE.match(entry.strip()):
            break
        count += 1
    return count


class GPUUnusableError(BadInput, RuntimeError):
    """A Slurm job was granted GPUs that this torch cannot use."""


def cuda_unavailable_reason() -> str:
    """Why torch sees no CUDA device: its build, or the warning its CUDA initialisation gave."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.is_available()
    said = "; ".join(" ".join(str(w.message).split()) for w in caught)
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU"
            + (f": {said}" if said else ""))


def refuse_unusable_gpus(env: Mapping[str, str] = os.environ,
                         driver: Path | None = None) -> None:
    """Raise GPUUnusableError where Slurm granted this job GPUs and torch sees none (see the
    module docstring); call it where a stage would otherwise fall back to the CPU. `driver`:
    the driver's device file (default DRIVER_DEVICE)."""
    import torch

    driver = DRIVER_DEVICE if driver is None else driver
    granted = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES", ""))
    if not (granted and "SLURM_JOB_ID" in env and driver.exists()) or torch.cuda.is_available():
        return
    raise GPUUnusableError(
        f"Slurm job {env['SLURM_JOB_ID']} was granted {granted} GPU(s) "
        f"(CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}) but "
        f"{cuda_unavailable_reason()}; refusing to run on the CPU until the time limit. Install "
        "a torch built for the node's driver (envs/torch.yaml: a CUDA 12 build for a driver "
        "older than 580; `nvidia-smi` shows the driver), or ask for no GPU")
