"""Start the trainer with one process per usable GPU: `torchrun` for several, plain python otherwise.

    python -m retrieval_pretraining.pretrain.launch --gpus N -- <trainer arguments>

N is what the job asked for (the rule's `gpu` resource); the number started is min(N, GPUs this
process can see), so the same rule runs 1 CPU process on a laptop (where a workflow profile's
`gpu: 8` is ignored by the local scheduler) and 8 workers on an 8-GPU node. The global batch is
in the config, so the process count changes only the gradient accumulation. Imports no torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys


def visible_gpus() -> int:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices is not None:
        return len([d for d in devices.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if result.returncode == 0:
            return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))
    return 0


def command(gpus: int, args: list[str], visible: int) -> list[str]:
    nproc = min(gpus, visible)
    module = ["-m", "retrieval_pretraining.pretrain", *args]
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={nproc}", *module]
    return [sys.executable, *module]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the job asked for")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the trainer's arguments")
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    cmd = command(ns.gpus, args, visible_gpus())
    print("launch:", " ".join(cmd[:6]), "...", file=sys.stderr, flush=True)
    # exec: signals from the scheduler (SIGTERM) reach the trainer / torchrun directly.
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
