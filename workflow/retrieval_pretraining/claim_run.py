"""Start a one-process GPU stage (encoding, mining, search) on GPUs of its own where no scheduler
names them.

    python -m retrieval_pretraining.claim_run --gpus N --module retrieval_pretraining.encode -- ARGS

N is the rule's `gpu` resource. These stages pick their device themselves: torch the first
visible GPU (encode.device), faiss-gpu every visible one (faiss_index.to_search_device). Outside
Slurm with CUDA_VISIBLE_DEVICES unset, every job saw every GPU: the jobs Snakemake's local
executor runs side by side (`--resources gpu=N`) all encoded on GPU 0 and copied their index onto
every GPU, beside the GPUs the trainers' launcher claimed. Under the launcher's conditions
(gpu_claim.needs_claim) this claims min(N, visible) GPUs as the launcher does and names them in
CUDA_VISIBLE_DEVICES, then *replaces itself* (exec, same PID) by `python -m <module> <args>`: the
stage starts with the variable set, so CUDA, which reads it once when initialised, sees only those,
and the stage holds their locks until it exits (gpu_claim). Elsewhere (no GPU, a Slurm job, the
variable set, N = 0) it execs the stage unchanged.

Not the launcher: for N > 1 it starts N torchrun workers, and it checks a Slurm job's GPUs, which
these stages do in their own way (encode.device). Not in encode.py: fine-tuning imports it, so an
edit there reruns every fine-tuning job (its code inputs). Imports no torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import MutableMapping

from . import gpu_claim


def nvidia_smi_gpus() -> int:
    """The machine's GPUs, as nvidia-smi lists them (0 without it). launch.visible_gpus does the
    same; not imported from there, so that an edit to the launcher reruns no encoding or search."""
    if shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if result.returncode == 0:
            return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))
    return 0


def claim_gpus(gpus: int, env: MutableMapping[str, str]) -> str | None:
    """Claim this process's GPUs where no scheduler chose them and name them in `env`'s
    CUDA_VISIBLE_DEVICES (returned); None, `env` unchanged, elsewhere."""
    if "CUDA_VISIBLE_DEVICES" in env:  # chosen already: no need to ask nvidia-smi
        return None
    visible = nvidia_smi_gpus()
    if not gpu_claim.needs_claim(gpus, visible, env):
        return None
    devices = gpu_claim.claim(min(gpus, visible), visible, env)
    env["CUDA_VISIBLE_DEVICES"] = devices
    return devices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True,
                        help="stage to run, e.g. retrieval_pretraining.encode")
    parser.add_argument("--gpus", type=int, default=0,
                        help="GPUs the job asked for (the rule's `gpu` resource)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the stage's arguments")
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.gpus < 0:
        parser.error(f"--gpus {ns.gpus}: must be >= 0 (the rule's `gpu` resource)")
    devices = claim_gpus(ns.gpus, os.environ)
    if devices is not None:
        print(f"claim_run: CUDA_VISIBLE_DEVICES={devices} (claimed: no scheduler named this "
              "job's GPUs)", file=sys.stderr, flush=True)
    # exec, not a child: the stage keeps the locks, this PID and the scheduler's signals.
    os.execv(sys.executable, [sys.executable, "-m", ns.module, *args])


if __name__ == "__main__":
    main()
