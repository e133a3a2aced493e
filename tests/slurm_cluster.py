"""A real one-node Slurm cluster on this machine, for the cluster tests (and by hand).

    python tests/slurm_cluster.py up DIR     # install Debian's packages if missing, start, print env
    python tests/slurm_cluster.py down DIR   # stop the daemons by PID, remove DIR

What it does, in order (every step reversible, nothing outside DIR and 127.0.0.1 is touched
except the Debian packages themselves):
1. `apt-get install --no-install-recommends slurmctld slurmd slurm-client munge` when missing
   (daemon start-up by the packages is blocked with a temporary policy-rc.d if the machine has none);
   `teardown` purges them again when this helper installed them (unless KEEP_SLURM_PACKAGES=1).
2. munged as the `munge` user with its own key, socket, pid and log files inside DIR.
3. a slurm.conf + gres.conf inside DIR: one node (this host as 127.0.0.1, its real CPUs, ~90% of its
   memory, fake GPUs backed by /dev/null), partitions `cpu` (default) and `gpu` over that node,
   no accounting database (so snakemake must poll with `squeue`; MinJobAge 300 s keeps finished
   jobs visible long enough), free TCP ports.
4. slurmctld and slurmd in the foreground (-D) as children of this process, so they are stopped by
   their own PIDs; `SLURM_CONF` points every client (sbatch, squeue, the snakemake plugin) at DIR.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
POLICY_RC = Path("/usr/sbin/policy-rc.d")
MUNGE_USER = "munge"
FAKE_GPU_DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom"]


class ClusterUnavailable(RuntimeError):
    """Slurm cannot be set up here (no apt, no root): tests skip with this message."""


def _missing_packages() -> list[str]:
    missing = []
    for package in PACKAGES:
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
        )
        if "install ok installed" not in status.stdout:
            missing.append(package)
    return missing


def _installed_packages() -> set[str]:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\\n"], capture_output=True, text=True
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.endswith("install ok installed")}


def install_packages() -> list[str]:
    """Install the Slurm packages that are missing; return every package this call installed
    (dependencies included), so that exactly those are purged again."""
    if shutil.which("dpkg-query") is None or shutil.which("apt-get") is None:
        raise ClusterUnavailable("apt-get/dpkg not available: Slurm tests need Debian's packages")
    missing = _missing_packages()
    if not missing:
        return []
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"Slurm packages {missing} missing and not root: cannot apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # The packages' maintainer scripts would start the daemons system-wide; a policy-rc.d that
    # answers 101 ("action forbidden") stops that, so the only daemons are the ones we start.
    own_policy = not POLICY_RC.exists()
    if own_policy:
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    before = _installed_packages()
    try:
        command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:  # stale package lists: refresh once and retry
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterUnavailable(
                f"apt-get install {' '.join(missing)} failed:\n{result.stderr[-2000:]}"
            )
    finally:
        if own_policy:
            POLICY_RC.unlink(missing_ok=True)
    return sorted(_installed_packages() - before)


def purge_packages(packages: list[str]) -> None:
    """Remove packages this helper installed (leave the machine as it was found)."""
    if not packages or os.environ.get("KEEP_SLURM_PACKAGES") == "1":
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Exactly the packages the install added (no autoremove: it could take unrelated orphans).
    subprocess.run(
        ["apt-get", "purge", "-y", "-q", *packages], env=env, capture_output=True, text=True
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_memory_mb() -> int:
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return int(int(fields["RealMemory"]) * 0.9)


@dataclasses.dataclass
class Cluster:
    """A running one-node cluster; `env` is what clients need (SLURM_CONF)."""

    root: Path
    node: str
    cpus: int
    memory_mb: int
    gpus: int
    processes: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)
    installed: list[str] = dataclasses.field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        path = f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return dict(os.environ, SLURM_CONF=str(self.conf), PATH=path)

    def run(self, *command: str, check: bool = True) -> str:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr}")
        return result.stdout

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still remembers (MinJobAge keeps finished ones for 300 s)."""
        out = self.run("scontrol", "show", "job", "--oneliner", check=False)
        jobs = []
        for line in out.splitlines():
            if line.startswith("JobId="):
                jobs.append(dict(f.split("=", 1) for f in line.split() if "=" in f))
        return jobs


def _write_configs(root: Path, node: str, cpus: int, memory_mb: int, gpus: int) -> None:
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "log", "run"):
        (root / sub).mkdir(exist_ok=True)
    munge_socket = root / "munge" / "munge.socket"
    conf = f"""# one-node test cluster written by tests/slurm_cluster.py
ClusterName=testcluster
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job becomes eligible this many seconds (+1) later (default 120)
AuthInfo=socket={munge_socket},cred_expire=5
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# finished jobs stay visible to squeue for 300 s (> 3 x snakemake's first status check)
MinJobAge=300
# how long a job has between SIGTERM and SIGKILL when cancelled, requeued or out of time
KillWait=10
ReturnToService=2
SchedulerType=sched/backfill
# A job that becomes eligible later (a requeued one) waits for a periodic pass of the scheduler
# (60 s main loop, 30 s backfill by default); every second here, as the test waits on it.
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} Gres=gpu:{gpus} State=UNKNOWN
PartitionName=cpu Nodes={node} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={node} Default=NO MaxTime=INFINITE State=UP
"""
    (etc / "slurm.conf").write_text(conf)
    # Fake GPUs: the scheduler counts them and sets CUDA_VISIBLE_DEVICES; without File= the
    # node is declared invalid, and each device needs its own file: harmless character devices.
    gres = "AutoDetect=off\n" + "".join(
        f"NodeName={node} Name=gpu File={device}\n" for device in FAKE_GPU_DEVICES[:gpus]
    )
    (etc / "gres.conf").write_text(gres)
    # Inside a job, snakemake's slurm-jobstep plugin strips every SLURM_* variable (SLURM_CONF too)
    # before its `srun`; a real cluster's clients find /etc/slurm/slurm.conf. This shim, first on
    # the PATH that sbatch exports, hands srun our config instead of touching /etc.
    shim = root / "bin" / "srun"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\nSLURM_CONF={etc / "slurm.conf"} exec /usr/bin/srun "$@"\n')
    shim.chmod(0o755)


def _start_munge(root: Path) -> subprocess.Popen:
    munge_dir = root / "munge"
    munge_dir.mkdir(exist_ok=True)
    munge_dir.chmod(0o755)  # clients (slurmctld, sbatch) must reach the socket inside
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    shutil.chown(munge_dir, MUNGE_USER, MUNGE_USER)
    shutil.chown(key, MUNGE_USER, MUNGE_USER)
    # munged refuses group/world-writable parents of its files unless they carry the sticky bit;
    # the cluster root is made private for the same reason.
    root.chmod(0o755)
    command = [
        "munged", "--foreground",
        f"--socket={munge_dir}/munge.socket", f"--key-file={key}",
        f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
        f"--seed-file={munge_dir}/munged.seed",
    ]  # fmt: skip
    # Started as our direct child under the munge user (not via runuser, which would leave
    # munged orphaned when stopped), so `stop` can signal and reap it by PID.
    process = subprocess.Popen(
        command, user=MUNGE_USER, group=MUNGE_USER, extra_groups=[],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    for _ in range(100):
        if (munge_dir / "munge.socket").exists():
            return process
        if process.poll() is not None:
            raise RuntimeError(f"munged exited: {process.stderr.read().decode()}")
        time.sleep(0.1)
    raise RuntimeError("munged did not create its socket within 10 s")


def start(root: Path, gpus: int = 2, install: bool = True) -> Cluster:
    """Start munged, slurmctld and slurmd under `root`; return once the node is idle."""
    installed = install_packages() if install else []
    if os.geteuid() != 0:
        raise ClusterUnavailable("the one-node Slurm cluster needs root (SlurmUser=root)")
    if not 1 <= gpus <= len(FAKE_GPU_DEVICES):
        raise ValueError(f"gpus={gpus}: the test cluster fakes 1 to {len(FAKE_GPU_DEVICES)} GPUs")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    closed = [p for p in root.parents if not p.stat().st_mode & 0o001]
    if closed:
        raise RuntimeError(
            f"{closed[0]} is not traversable by other users (mode {closed[0].stat().st_mode:o}); "
            "munged runs as `munge`: put the cluster folder under a world-traversable one (chmod o+x)"
        )
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    cluster = Cluster(root, node, cpus, _real_memory_mb(), gpus, installed=installed)
    _write_configs(root, node, cpus, cluster.memory_mb, gpus)
    try:
        cluster.processes["munged"] = _start_munge(root)
        for daemon, args in (("slurmctld", ["-D", "-c", "-i"]), ("slurmd", ["-D"])):
            log = open(root / "log" / f"{daemon}.stdout", "w")
            cluster.processes[daemon] = subprocess.Popen(
                [daemon, *args, "-f", str(cluster.conf)], env=cluster.env,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name, process in cluster.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited early:\n{cluster.log(name)[-3000:]}")
            state = cluster.run("sinfo", "-h", "-N", "-o", "%t", check=False).split()
            if state and all(s.startswith("idle") for s in state):
                return cluster
            time.sleep(0.5)
        raise RuntimeError(
            f"node not idle after 60 s: {state}\n{cluster.log('slurmctld')[-2000:]}"
        )
    except BaseException:
        stop(cluster)
        raise


def _processes_of(conf: Path) -> list[int]:
    """PIDs whose environment names this cluster's slurm.conf: its job steps and their children
    (slurmstepd detaches from slurmd, so they are not our children and need finding)."""
    marker = f"SLURM_CONF={conf}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def stop(cluster: Cluster, purge: bool = True) -> None:
    """Cancel remaining jobs, stop the daemons by PID, remove the state folder."""
    if cluster.processes.get("slurmctld") and cluster.processes["slurmctld"].poll() is None:
        subprocess.run(["scancel", "--full", "--user=root"], env=cluster.env, capture_output=True)
        for _ in range(60):  # job steps get SIGTERM, then SIGKILL after KillWait (10 s)
            if not cluster.run("squeue", "-h", "-t", "RUNNING,COMPLETING", check=False).strip():
                break
            time.sleep(0.5)
    for name in ("slurmd", "slurmctld", "munged"):
        process = cluster.processes.get(name)
        if process is None or process.poll() is not None:
            continue
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # Anything of this cluster still alive (a step slurmd could not finish off) goes by PID.
    leftovers = [pid for pid in _processes_of(cluster.conf) if pid != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftovers:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if leftovers and sig == signal.SIGTERM:
            time.sleep(2)
    shutil.rmtree(cluster.root, ignore_errors=True)
    if purge:
        purge_packages(cluster.installed)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    if argv[0] == "up":
        cluster = start(root)
        cluster.processes["munged"].stderr.close()
        # Hand the daemons over: record their PIDs so that `down` (another process) stops them.
        state = {name: p.pid for name, p in cluster.processes.items()}
        state["installed"] = cluster.installed
        (root / "pids.json").write_text(json.dumps(state))
        print(f"export SLURM_CONF={cluster.conf} PATH={root / 'bin'}:$PATH")
        return 0
    state = json.loads((root / "pids.json").read_text())
    subprocess.run(
        ["scancel", "--full", "--user=root"],
        env=dict(os.environ, SLURM_CONF=str(root / "etc" / "slurm.conf")),
        capture_output=True,
    )
    for name in ("slurmd", "slurmctld", "munged"):
        try:
            os.kill(state[name], signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(2)
    shutil.rmtree(root, ignore_errors=True)
    purge_packages(state.get("installed", []))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
