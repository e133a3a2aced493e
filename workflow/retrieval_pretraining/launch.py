"""Start a GPU stage with one process per usable GPU, on one node or on every node of a Slurm job.

    python -m retrieval_pretraining.launch --module retrieval_pretraining.pretrain --gpus N \
        --nodes K -- ARGS

N is what the job asked for (the rule's `gpu` resource), K its node count (the rule's `nodes`
resource, default 1). K comes from the rule, not from SLURM_NNODES: for a job with an `mpi`
resource the slurm-jobstep plugin starts the rule's shell with every SLURM_* variable but the job
id removed. The launcher then *replaces itself* (exec, same PID) by one of:

- 0 or 1 usable GPU: `python -m <module> <args>` (1 CPU process on a laptop, where a profile's
  `gpu: 8` is ignored by the local scheduler);
- n = min(N, visible GPUs) > 1: `torchrun --standalone --nproc_per_node=n -m <module> <args>`;
- K > 1, inside a Slurm job (resources `nodes: K` + `mpi: "srun"`): `srun` starting one task per
  node, each running this launcher with `--on-node`, which execs one torchrun per node
  (`--nnodes K --node_rank $SLURM_NODEID`, c10d rendezvous at the job's first host, which node 0
  hosts: torch's own guess compares the name with this machine's and, missing a name that
  resolves to a secondary NIC's address, left every node a client until it timed out). Per node it
  starts min(N, visible GPUs) workers, or all visible GPUs when N is 0 (`gres: "gpu:8"` per node).
  The rendezvous port (`--port`, else from the job id) lies outside the ephemeral range, where an
  outgoing connection may hold it (rendezvous_port); `--standalone` binds a port the kernel picks.

Outside Slurm with CUDA_VISIBLE_DEVICES unset (a local run: Snakemake's local executor names no
GPUs), the launcher claims the min(N, visible) GPUs it uses with a lock each, held until the job
ends, a crash included, and names them in CUDA_VISIBLE_DEVICES (gpu_claim): local jobs running
side by side each get GPUs of their own, not all the first one. `--dry-run` claims none: it prints
the command the claimed GPUs would give, and which it would claim.

Fewer GPUs visible than N: a warning. A Slurm job that asked for GPUs (N > 0, or any node of a
multi-node job) and sees none stops with an error: broken GRES would otherwise pre-train on the
CPU for the whole time limit.

N = 0 means "all visible GPUs" only per node of a multi-node job: on one node with several GPUs
visible it is refused (a multi-node profile whose `nodes` did not reach the launcher would
otherwise train in one process on one GPU).

The global batch is in the stage's config, so the process count changes only the gradient
accumulation. Threads: where it starts torchrun, the launcher sets OMP_NUM_THREADS for the workers
to max(1, threads // workers), threads being the inherited OMP_NUM_THREADS (Snakemake sets it to
the rule's threads, 64 for pre-training) or else the CPUs this process may use: torchrun lowers it
only where it is unset, so each of 8 workers would otherwise run 64 intra-op threads. The same
share goes to every thread variable Snakemake sets (THREAD_VARIABLES): torch's intra-op pool takes
MKL_NUM_THREADS over OMP_NUM_THREADS, and numpy's OpenBLAS reads OPENBLAS_NUM_THREADS.

"torchrun" is torchrun's own code run by retrieval_pretraining.torchrun, which ends with 75 where
torchrun alone would exit 1 after its workers stopped on a signal and saved (it reports their 75 as
a failure): a stopped job's status says "stopped after saving, resubmit" on every path.

Signals: because of exec, whatever signal reaches the launcher reaches the program it became: the
trainer itself (SIGTERM/SIGUSR1: save state, exit 75); torchrun, told to forward
SIGUSR1 too (`--signals-to-handle`) and to give workers `--shutdown-timeout` seconds to save before
SIGKILL (torch 2.11's torchrun lacks that option and refuses a command that has it: an option the
installed torchrun lacks is left out, with a warning of what it costs); or srun, which forwards
signals to its tasks. Slurm's `--signal=TERM@600` (no `B:`) signals every process of the job's
steps. With `B:` only the batch shell gets the signal and nothing below it does, so do not use
`B:`. Imports no torch.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

from . import gpu_claim
from .gpu_check import parse_visible_devices

# torchrun forwards these to its workers; its default list lacks SIGUSR1, on which torchrun would
# otherwise just die (default action) and leave the workers unsaved.
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# torchrun options we pass that some torch versions lack (torch 2.11's has no --shutdown-timeout):
# torchrun refuses an option it does not know, so each is passed only where it is known.
OPTIONAL_OPTIONS = ("--signals-to-handle", "--shutdown-timeout")
# What torchrun gives workers after a signal without --shutdown-timeout (torch's PContext.close).
TORCH_SHUTDOWN_SECONDS = 30
# torchrun's main, with exit 75 for a run stopped after saving (torchrun's own exits 1); after
# sys.executable.
TORCHRUN = ["-m", "retrieval_pretraining.torchrun"]
# Where Linux says which ports outgoing connections take (net.ipv4.ip_local_port_range).
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# What Snakemake's shell sets to the rule's threads, each read by some library a worker loads
# (torch's intra-op pool takes MKL_NUM_THREADS over OMP_NUM_THREADS): all get the worker's share.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

def visible_gpus(env: Mapping[str, str] = os.environ) -> int:
    if "CUDA_VISIBLE_DEVICES" in env:
        return parse_visible_devices(env["CUDA_VISIBLE_DEVICES"])
    if shutil.which("nvidia-smi"):
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if result.returncode == 0:
            return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))
    return 0


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list ("gpu[03-04]" -> "gpu03"), expanded by scontrol."""
    try:
        result = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"launch: cannot expand SLURM_JOB_NODELIST={nodelist!r} with "
                         f"`scontrol show hostnames` ({error}); run inside a Slurm job with "
                         "scontrol on PATH") from error
    hosts = result.stdout.split()
    if not hosts:
        raise SystemExit(f"launch: `scontrol show hostnames {nodelist}` printed no host")
    return hosts[0]


def slurm_nodes(env: Mapping[str, str]) -> int:
    return int(env.get("SLURM_NNODES", "1") or 1)


def ephemeral_ports(path: Path = EPHEMERAL_RANGE) -> range:
    """The ports this machine's outgoing connections take theirs from (Linux's default where
    `path` cannot be read)."""
    try:
        low, high = map(int, path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


@functools.lru_cache
def rendezvous_ports(ephemeral: range) -> tuple[int, ...]:
    """The ports a rendezvous may take: outside `ephemeral`, from 20000 up (more registered
    services sit below), or from 1024 up where that leaves fewer than 1024; where the ephemeral
    range covers every port, any from 20000 up (none avoids it)."""
    for floor in (20000, 1024):
        ports = tuple(p for p in range(floor, 65536) if p not in ephemeral)
        if len(ports) >= 1024:
            return ports
    return ports or tuple(range(20000, 65536))


def rendezvous_port(env: Mapping[str, str], port: int,
                    ephemeral_range: Path = EPHEMERAL_RANGE) -> int:
    """`port`, or one derived from the job id outside the ephemeral range, where an outgoing
    connection may hold it. Read by the batch step (the first node, which hosts the rendezvous)
    and passed to every node with --port. Consecutive ids take consecutive ports, so two jobs
    sharing a first node collide only where their ids differ by a multiple of the window (17,304
    ports for Linux's default range)."""
    if port:
        return port
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return 29500
    ports = rendezvous_ports(ephemeral_ports(ephemeral_range))
    return ports[int(job) % len(ports)]


def known_options(run_source: str) -> frozenset[str]:
    """Which of OPTIONAL_OPTIONS a torchrun whose `torch/distributed/run.py` reads `run_source`
    accepts (each is declared there as a string literal, in either quotes)."""
    return frozenset(option for option in OPTIONAL_OPTIONS
                     if f'"{option}"' in run_source or f"'{option}'" in run_source)


def installed_torchrun_options() -> frozenset[str]:
    """OPTIONAL_OPTIONS the installed torch's torchrun accepts, read from its source: importing
    torch to ask its parser would cost every job seconds. Where the source cannot be read, all of
    them (torchrun then names what it refuses)."""
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            return known_options((Path(folder) / "distributed" / "run.py").read_text())
        except OSError:
            continue
    return frozenset(OPTIONAL_OPTIONS)


def torchrun_warnings(known: Collection[str], shutdown_timeout: int) -> list[str]:
    """What a torchrun without some of OPTIONAL_OPTIONS changes for a stopped job."""
    try:
        torch = f"torch {importlib.metadata.version('torch')}"
    except importlib.metadata.PackageNotFoundError:
        torch = "this torch"
    warnings = []
    if "--signals-to-handle" not in known:
        warnings.append(f"launch: warning: {torch}'s torchrun has no --signals-to-handle, so it "
                        "cannot pass SIGUSR1 to its workers (it would die and leave them unsaved): "
                        "stop jobs with SIGTERM (the profile's --signal=TERM@600 does)")
    if "--shutdown-timeout" not in known:
        warnings.append(f"launch: warning: {torch}'s torchrun has no --shutdown-timeout: after a "
                        f"stop signal its workers get torch's {TORCH_SHUTDOWN_SECONDS} s to save "
                        f"their state, not {shutdown_timeout} s (a save cut short is not used: "
                        "the rerun resumes from the one before)")
    return warnings


def _torchrun(nproc: int, shutdown_timeout: int, known: Collection[str] | None) -> list[str]:
    """torchrun's options; `known`: which of OPTIONAL_OPTIONS it takes (None: read them)."""
    known = installed_torchrun_options() if known is None else known
    options = {"--signals-to-handle": FORWARDED_SIGNALS, "--shutdown-timeout": shutdown_timeout}
    return [sys.executable, *TORCHRUN, f"--nproc_per_node={nproc}",
            *(f"{option}={value}" for option, value in options.items() if option in known)]


def command(module: str, gpus: int, args: list[str], *, visible: int,
            env: Mapping[str, str] | None = None, on_node: bool = False, port: int = 0,
            shutdown_timeout: int = 300, hostname=first_host,
            torchrun_options: Collection[str] | None = None,
            nodes: int | None = None) -> list[str]:
    """The command the launcher execs (see the module docstring). `nodes`: the job's node count
    (None: SLURM_NNODES). `torchrun_options`: which of OPTIONAL_OPTIONS torchrun takes (default:
    the installed torch's)."""
    env = {} if env is None else env
    target = ["-m", module, *args]
    nodes = slurm_nodes(env) if nodes is None else nodes
    if nodes > 1 and not on_node:
        if "SLURM_JOB_ID" not in env:
            raise SystemExit(f"launch: --nodes {nodes} needs a Slurm job (the launcher starts "
                             "one task per node with srun); outside Slurm set the rule's "
                             "`nodes` resource to 1")
        inner = [sys.executable, "-m", "retrieval_pretraining.launch", "--on-node",
                 "--module", module, "--gpus", str(gpus), "--nodes", str(nodes),
                 "--port", str(rendezvous_port(env, port)),
                 "--shutdown-timeout", str(shutdown_timeout), "--", *args]
        # One task per node; all the node's CPUs and GPUs go to that task (no -c: srun then
        # gives the step every CPU of the allocation). A failed node ends the whole step.
        return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=1", "--export=ALL", *inner]
    if on_node:
        for key in ("SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_JOB_ID"):
            if key not in env:
                raise SystemExit(f"launch: --on-node needs {key} (set by srun inside a Slurm job)")
        nproc = max(1, min(gpus, visible) if gpus > 0 else visible)
        endpoint = f"{hostname(env['SLURM_JOB_NODELIST'])}:{rendezvous_port(env, port)}"
        return [*_torchrun(nproc, shutdown_timeout, torchrun_options), f"--nnodes={nodes}",
                f"--node_rank={env['SLURM_NODEID']}", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}", f"--rdzv_id={env['SLURM_JOB_ID']}",
                f"--rdzv_conf=is_host={int(env['SLURM_NODEID'] == '0')}", *target]
    if gpus == 0 and visible > 1:
        raise SystemExit(f"launch: --gpus 0 with {visible} GPUs visible on one node: give the "
                         "GPU count (the rule's `gpu` resource); a multi-node job with `gpu: 0` "
                         "and `gres` per node needs --nodes K > 1 (the rule's `nodes` resource)")
    nproc = min(gpus, visible)
    if nproc > 1:
        return [*_torchrun(nproc, shutdown_timeout, torchrun_options), "--standalone", *target]
    return [sys.executable, *target]


def gpu_warnings(gpus: int, visible: int, env: Mapping[str, str], on_node: bool) -> list[str]:
    """What the visible GPUs change from the request (see the module docstring); SystemExit for a
    Slurm job that asked for GPUs and sees none."""
    asked = gpus > 0 or on_node  # per node of a multi-node job, 0 = all the node's GPUs
    if asked and visible == 0 and "SLURM_JOB_ID" in env:
        devices = env.get("CUDA_VISIBLE_DEVICES", "unset")
        raise SystemExit(f"launch: Slurm job {env['SLURM_JOB_ID']} asked for GPUs (--gpus {gpus}) "
                         f"and sees none (CUDA_VISIBLE_DEVICES={devices}, no GPU from nvidia-smi): "
                         "check its GRES (`scontrol show job`, the node's gres.conf) rather than "
                         "train on the CPU")
    if gpus > visible:
        runs = f"one process per visible GPU ({visible})" if visible else "one process on the CPU"
        return [f"launch: warning: --gpus {gpus} asked for, {visible} visible: {runs}"]
    return []


def threads_per_worker(workers: int, env: Mapping[str, str]) -> int:
    """Intra-op threads for each of `workers` processes sharing the job's threads (see the module
    docstring)."""
    inherited = env.get("OMP_NUM_THREADS", "").strip()
    if inherited.isdigit() and int(inherited) > 0:
        threads = int(inherited)
    elif hasattr(os, "sched_getaffinity"):  # the cores Slurm's cgroup / taskset gives the job
        threads = len(os.sched_getaffinity(0))
    else:
        threads = os.cpu_count() or 1
    return max(1, threads // workers)


def torchrun_workers(cmd: list[str]) -> int:
    """Workers per node of a torchrun command from `command`."""
    return next(int(arg.split("=", 1)[1]) for arg in cmd if arg.startswith("--nproc_per_node="))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True,
                        help="module to run, e.g. retrieval_pretraining.pretrain")
    parser.add_argument("--gpus", type=int, default=0,
                        help="GPUs the job asked for (per node in a multi-node job, where 0 = "
                        "all visible)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="nodes of the job (the rule's `nodes` resource; default: "
                        "SLURM_NNODES, which an `mpi` job's rule shell lacks)")
    parser.add_argument("--port", type=int, default=0,
                        help="multi-node rendezvous port (default: from SLURM_JOB_ID, outside "
                        "net.ipv4.ip_local_port_range)")
    parser.add_argument("--shutdown-timeout", type=int, default=300,
                        help="seconds torchrun gives workers to save after a signal before SIGKILL")
    # Set by the srun step of a multi-node job: this is one node's launcher, build its torchrun.
    parser.add_argument("--on-node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the command as JSON; run nothing, claim no GPUs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the module's arguments")
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.gpus < 0:
        parser.error(f"--gpus {ns.gpus}: must be >= 0 (the rule's `gpu` resource)")
    if ns.nodes is not None and ns.nodes < 1:
        parser.error(f"--nodes {ns.nodes}: must be >= 1 (the rule's `nodes` resource)")
    known = installed_torchrun_options()
    visible = visible_gpus()
    if gpu_claim.needs_claim(ns.gpus, visible, os.environ):  # no scheduler chose our GPUs
        count = min(ns.gpus, visible)
        if ns.dry_run:  # claims nothing (a busy machine would keep it waiting): the same command
            print(f"launch: dry run: would claim the first {count} free of the {visible} GPUs "
                  f"(locks in {gpu_claim.lock_folder(os.environ)}); none claimed",
                  file=sys.stderr, flush=True)
            visible = count
        else:
            devices = gpu_claim.claim(count, visible, os.environ)
            os.environ["CUDA_VISIBLE_DEVICES"] = devices
            print(f"launch: CUDA_VISIBLE_DEVICES={devices} (claimed: no scheduler named this "
                  "job's GPUs)", file=sys.stderr, flush=True)
            visible = visible_gpus()
    cmd = command(ns.module, ns.gpus, args, visible=visible, env=os.environ,
                  on_node=ns.on_node, port=ns.port, shutdown_timeout=ns.shutdown_timeout,
                  torchrun_options=known, nodes=ns.nodes)
    if cmd[0] != "srun":  # this node's processes: the GPUs are the ones seen here
        for warning in gpu_warnings(ns.gpus, visible, os.environ, ns.on_node):
            print(warning, file=sys.stderr, flush=True)
    if cmd[1:3] == TORCHRUN:
        for warning in torchrun_warnings(known, ns.shutdown_timeout):
            print(warning, file=sys.stderr, flush=True)
        # exec keeps os.environ: torchrun and its workers inherit the share.
        workers = torchrun_workers(cmd)
        share = str(threads_per_worker(workers, os.environ))
        os.environ.update(dict.fromkeys(THREAD_VARIABLES, share))
        print(f"launch: OMP_NUM_THREADS={share} for each of {workers} workers (and "
              f"{', '.join(THREAD_VARIABLES[1:])})", file=sys.stderr, flush=True)
    if ns.dry_run:
        print(json.dumps(cmd))
        return
    shown = " ".join(cmd[:14]) + (" ..." if len(cmd) > 14 else "")
    print("launch:", shown, file=sys.stderr, flush=True)
    # exec, not a child: the scheduler's signals land on the trainer / torchrun / srun themselves.
    try:
        os.execvp(cmd[0], cmd)
    except OSError as error:
        raise SystemExit(f"launch: cannot start {cmd[0]!r} ({error}); "
                         "a multi-node job needs srun on PATH") from error


if __name__ == "__main__":
    main()
