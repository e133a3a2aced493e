"""The GPU-stage launcher (retrieval_pretraining.launch): process count from the visible GPUs, the
torchrun / srun commands (checked with torchrun's own argument parser), and that signals reach the
program it starts. No GPU or Slurm: CUDA_VISIBLE_DEVICES, SLURM_*, scontrol and srun are faked."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from retrieval_pretraining import launch

ROOT = Path(__file__).resolve().parents[1]
MODULE = "retrieval_pretraining.pretrain"


def _torchrun_args(cmd):
    """What torchrun would understand from our command (its own parser, not ours)."""
    from torch.distributed.run import get_args_parser

    assert cmd[:3] == [sys.executable, "-m", "retrieval_pretraining.torchrun"], cmd
    return get_args_parser().parse_args(cmd[3:])


def _env(tmp_path, **extra):
    """A clean environment: no SLURM_*/CUDA_* leaking from the machine running the tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_"))}
    # The caller's path kept after ours: a GPU machine's carried wheels live on PYTHONPATH.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tmp_path), str(ROOT / "workflow"), os.environ.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _fake_tool(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0,1,2,3", 4),
        ("3", 1),
        (" 0 , 1 ", 2),
        ("", 0),
        ("-1", 0),
        ("NoDevFiles", 0),  # what Slurm sets on a node without GPUs
        ("0,1,-1,3", 2),  # CUDA stops enumerating at the first invalid entry
        ("GPU-8e2c7f1a-0b2d-4c3e-9f11-2a6b5d4c3e21,GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718", 2),
        ("MIG-GPU-8e2c7f1a-0b2d-4c3e-9f11-2a6b5d4c3e21/1/0", 1),
    ],
)
def test_cuda_visible_devices_parsing(value, expected):
    assert launch.parse_visible_devices(value) == expected
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == expected


def test_without_cuda_visible_devices_nvidia_smi_counts_the_gpus(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "nvidia-smi", """\
        echo "GPU 0: NVIDIA H100 (UUID: GPU-a)"
        echo "GPU 1: NVIDIA H100 (UUID: GPU-b)"
        echo "GPU 2: NVIDIA H100 (UUID: GPU-c)"
    """)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert launch.visible_gpus({}) == 3
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi: a CPU machine
    assert launch.visible_gpus({}) == 0


@pytest.mark.parametrize("visible", [0, 1])
def test_zero_or_one_gpu_runs_the_module_in_plain_python(visible):
    cmd = launch.command(MODULE, 8, ["--config", "{}", "--x"], visible=visible)
    assert cmd == [sys.executable, "-m", MODULE, "--config", "{}", "--x"]


def test_eight_gpus_run_torchrun_standalone_forwarding_sigusr1():
    cmd = launch.command(MODULE, 8, ["--config", "{}", "--x"], visible=8)
    ns = _torchrun_args(cmd)
    assert ns.standalone and ns.module and ns.training_script == MODULE
    assert ns.training_script_args == ["--config", "{}", "--x"]
    assert ns.nproc_per_node == "8"
    assert "SIGUSR1" in ns.signals_to_handle.split(",") and "SIGTERM" in ns.signals_to_handle
    if "--shutdown-timeout" in launch.installed_torchrun_options():  # torch 2.11's has none
        assert ns.shutdown_timeout >= 60  # workers get time to save their state
    # The job's request caps the count: 2 of 8 visible GPUs -> 2 workers.
    assert _torchrun_args(launch.command(MODULE, 2, [], visible=8)).nproc_per_node == "2"


def test_the_options_read_from_torchrun_s_source_are_the_ones_its_parser_accepts():
    from torch.distributed.run import get_args_parser

    accepted = set(get_args_parser()._option_string_actions)
    assert launch.installed_torchrun_options() == {
        option for option in launch.OPTIONAL_OPTIONS if option in accepted}
    # torch 2.11's run.py declares --signals-to-handle and no --shutdown-timeout.
    source_2_11 = '''
    parser.add_argument(
        "--signals-to-handle",
        "--signals_to_handle",
        action=env,
        type=str,
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    )'''
    assert launch.known_options(source_2_11) == {"--signals-to-handle"}
    assert launch.known_options(source_2_11 + '\n    "--shutdown-timeout",') == set(
        launch.OPTIONAL_OPTIONS)
    assert launch.known_options("add_argument('--shutdown-timeout')") == {"--shutdown-timeout"}
    assert launch.known_options("--shutdown-timeout-s") == set()  # a literal, not a prefix


@pytest.mark.parametrize("known", [(), ("--signals-to-handle",), launch.OPTIONAL_OPTIONS])
def test_a_torchrun_option_this_torch_lacks_is_left_out_with_a_warning(known):
    """An older torchrun refuses the whole command for one option it does not know (torch 2.11:
    `unrecognized arguments: --shutdown-timeout=300`): each optional one goes in only if known."""
    env = {**SLURM, "SLURM_NODEID": "1"}
    for cmd in (launch.command(MODULE, 8, ["--x"], visible=8, torchrun_options=known),
                launch.command(MODULE, 8, ["--x"], visible=8, env=env, on_node=True,
                               hostname=lambda nodes: "gpu03", torchrun_options=known)):
        passed = {arg.split("=")[0] for arg in cmd if arg.startswith("--")}
        assert passed & set(launch.OPTIONAL_OPTIONS) == set(known), cmd
        if set(known) <= launch.installed_torchrun_options():
            ns = _torchrun_args(cmd)  # this torch's parser takes what is left
            assert ns.training_script == MODULE and ns.training_script_args == ["--x"]
    warnings = " ".join(launch.torchrun_warnings(known, 300))
    assert ("SIGUSR1" in warnings) == ("--signals-to-handle" not in known)
    assert ("30 s" in warnings and "not 300 s" in warnings) == ("--shutdown-timeout" not in known)


def test_cli_counts_cuda_visible_devices(tmp_path):
    def dry_run(devices, gpus):
        out = subprocess.run(
            [sys.executable, "-m", "retrieval_pretraining.launch", "--module", MODULE,
             "--gpus", str(gpus), "--dry-run", "--", "--config", "{}"],
            env=_env(tmp_path, CUDA_VISIBLE_DEVICES=devices, PATH=str(tmp_path)),
            capture_output=True, text=True, check=True,
        )
        return json.loads(out.stdout)

    assert dry_run("", 8) == [sys.executable, "-m", MODULE, "--config", "{}"]
    assert dry_run("5", 8) == [sys.executable, "-m", MODULE, "--config", "{}"]
    assert _torchrun_args(dry_run("0,1,2,3,4,5,6,7", 8)).nproc_per_node == "8"
    assert _torchrun_args(dry_run("0,1,2", 8)).nproc_per_node == "3"


def test_the_launcher_reads_its_torch_s_torchrun_options_and_warns_of_a_missing_one(tmp_path):
    """A torch package first on the path whose run.py declares --signals-to-handle alone (as torch
    2.11's): the launcher's command leaves --shutdown-timeout out and says what that costs."""
    package = tmp_path / "oldtorch" / "torch"
    (package / "distributed").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "distributed" / "run.py").write_text('parser.add_argument("--signals-to-handle")\n')
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="0,1", PATH=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(package.parent), env["PYTHONPATH"]])
    out = subprocess.run(
        [sys.executable, "-m", "retrieval_pretraining.launch", "--module", MODULE, "--gpus", "2",
         "--shutdown-timeout", "120", "--dry-run", "--", "--config", "{}"],
        env=env, capture_output=True, text=True, check=True)
    cmd = json.loads(out.stdout)
    assert cmd[1:3] == ["-m", "retrieval_pretraining.torchrun"]
    assert not any(arg.startswith("--shutdown-timeout") for arg in cmd)
    assert f"--signals-to-handle={launch.FORWARDED_SIGNALS}" in cmd
    assert "no --shutdown-timeout" in out.stderr and "30 s" in out.stderr
    assert "not 120 s" in out.stderr and "SIGUSR1" not in out.stderr


SLURM = {"SLURM_NNODES": "4", "SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gpu[03-06]"}


def _fake_scontrol(folder):
    # Real scontrol expands the bracket list; ours knows just this one.
    return _fake_tool(folder, "scontrol", """\
        if [ "$1 $2 $3" = "show hostnames gpu[03-06]" ]; then
            printf 'gpu03\\ngpu04\\ngpu05\\ngpu06\\n'
        else
            echo "scontrol: unexpected arguments: $*" >&2; exit 1
        fi
    """)


def test_multi_node_job_relaunches_itself_with_srun_once_per_node():
    cmd = launch.command(MODULE, 8, ["--config", "{}"], visible=8, env=SLURM)
    assert cmd[0] == "srun"
    opts = cmd[1:cmd.index(sys.executable)]
    assert {"--nodes=4", "--ntasks=4", "--ntasks-per-node=1"} <= set(opts)
    inner = cmd[len(opts) + 1:]
    assert inner[:4] == [sys.executable, "-m", "retrieval_pretraining.launch", "--on-node"]
    assert inner[inner.index("--module") + 1] == MODULE and inner[inner.index("--gpus") + 1] == "8"
    assert inner[inner.index("--") + 1:] == ["--config", "{}"]
    # One node (srun -n1 step, or SLURM_NNODES=1) is not multi-node.
    assert launch.command(MODULE, 8, [], visible=8, env={**SLURM, "SLURM_NNODES": "1"})[0] != "srun"


def _dry_run(tmp_path, *options, **env):
    """The launcher's --dry-run in a clean environment (plus `env`): its command and stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "retrieval_pretraining.launch", "--module", MODULE, *options,
         "--dry-run", "--", "--config", "{}"],
        env=_env(tmp_path, **env), capture_output=True, text=True)
    return out


def test_an_mpi_job_s_shell_without_slurm_nnodes_still_runs_srun_on_every_node(tmp_path):
    """The slurm-jobstep plugin starts an `mpi` job's rule shell with every SLURM_* variable but
    the job id removed: the node count must come from the rule (--nodes), as the rule passes it."""
    _fake_tool(tmp_path, "srun", "exit 0\n")  # on PATH, as in the batch step
    jobstep = {"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
               "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    out = _dry_run(tmp_path, "--gpus", "0", "--nodes", "4", **jobstep)
    assert out.returncode == 0, out.stderr
    cmd = json.loads(out.stdout)
    assert cmd[:2] == ["srun", "--nodes=4"] and "--ntasks-per-node=1" in cmd, cmd
    inner = cmd[cmd.index(sys.executable):]
    assert inner[inner.index("--nodes") + 1] == "4"  # each node's torchrun gets --nnodes=4
    rule = (ROOT / "rules" / "pretrain.smk").read_text().split("rule pretrain_model:", 1)[1]
    assert "--nodes {resources.nodes}" in rule.split("\nrule ", 1)[0]


def test_the_node_count_from_the_rule_reaches_each_node_s_torchrun(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gpu[03-06]", "SLURM_NODEID": "3",
           "SLURM_NNODES": "1"}  # a step's own count must not override the job's
    ns = _torchrun_args(launch.command(MODULE, 0, [], visible=8, env=env, on_node=True, nodes=4))
    assert (ns.nnodes, ns.node_rank, ns.nproc_per_node) == ("4", 3, "8")


def test_gpus_0_with_several_gpus_on_one_node_is_refused(tmp_path):
    """`gpu: 0` is the multi-node profile's value (GPUs come from `gres`): on one node it once
    trained in one process on one of eight GPUs."""
    with pytest.raises(SystemExit, match="--gpus 0 with 8 GPUs"):
        launch.command(MODULE, 0, [], visible=8, env={"SLURM_JOB_ID": "1"}, nodes=1)
    out = _dry_run(tmp_path, "--gpus", "0", CUDA_VISIBLE_DEVICES="0,1")
    assert out.returncode != 0 and "--nodes K > 1" in out.stderr, out
    # No GPU or one: plain python, as before.
    for visible in (0, 1):
        assert launch.command(MODULE, 0, ["--x"], visible=visible) == [
            sys.executable, "-m", MODULE, "--x"]


def test_fewer_gpus_than_asked_for_warn_and_none_in_a_slurm_job_fails(tmp_path):
    """A Slurm job whose GRES gave it no GPU would pre-train on the CPU for its whole time limit."""
    fewer = _dry_run(tmp_path, "--gpus", "8", CUDA_VISIBLE_DEVICES="0,1,2")
    assert fewer.returncode == 0 and _torchrun_args(json.loads(fewer.stdout)).nproc_per_node == "3"
    assert "--gpus 8 asked for, 3 visible" in fewer.stderr, fewer.stderr
    enough = _dry_run(tmp_path, "--gpus", "2", CUDA_VISIBLE_DEVICES="0,1,2")
    assert "warning: --gpus" not in enough.stderr, enough.stderr
    laptop = _dry_run(tmp_path, "--gpus", "1", CUDA_VISIBLE_DEVICES="", PATH=str(tmp_path))
    assert laptop.returncode == 0 and "on the CPU" in laptop.stderr, laptop.stderr
    for devices in ("", "NoDevFiles"):
        broken = _dry_run(tmp_path, "--gpus", "1", CUDA_VISIBLE_DEVICES=devices,
                          SLURM_JOB_ID="77", PATH=str(tmp_path))
        assert broken.returncode != 0 and not broken.stdout, broken
        assert "Slurm job 77 asked for GPUs" in broken.stderr and "GRES" in broken.stderr
    # A CPU job (--gpus 0) in Slurm is what it asked for; one node of a multi-node job is not.
    assert _dry_run(tmp_path, "--gpus", "0", CUDA_VISIBLE_DEVICES="", SLURM_JOB_ID="77",
                    PATH=str(tmp_path)).returncode == 0
    with pytest.raises(SystemExit, match="asked for GPUs"):
        launch.gpu_warnings(0, 0, {"SLURM_JOB_ID": "77"}, on_node=True)


def test_several_nodes_outside_slurm_names_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="needs a Slurm job"):
        launch.command(MODULE, 8, [], visible=8, env={}, nodes=2)
    assert _dry_run(tmp_path, "--gpus", "1", "--nodes", "0").returncode == 2


def test_each_node_runs_one_torchrun_meeting_at_the_first_host(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    env = {**SLURM, "SLURM_NODEID": "2"}
    ns = _torchrun_args(launch.command(MODULE, 0, ["--x"], visible=8, env=env, on_node=True))
    assert (ns.nnodes, ns.node_rank, ns.nproc_per_node) == ("4", 2, "8")  # gpu 0 = all visible
    assert ns.rdzv_backend == "c10d" and ns.rdzv_id == "1234"
    host, port = ns.rdzv_endpoint.split(":")
    assert host == "gpu03" and 1024 < int(port) < 65536
    assert "SIGUSR1" in ns.signals_to_handle
    assert ns.training_script == MODULE and ns.training_script_args == ["--x"]
    # Every node derives the same port from the job id.
    other = launch.command(MODULE, 0, [], visible=8, env={**env, "SLURM_NODEID": "0"}, on_node=True)
    assert _torchrun_args(other).rdzv_endpoint == ns.rdzv_endpoint
    # Node 0 (the first host) hosts the rendezvous store, the others connect: no guessing.
    assert (_torchrun_args(other).rdzv_conf, ns.rdzv_conf) == ("is_host=1", "is_host=0")
    # --gpus N still caps the workers per node.
    capped = launch.command(MODULE, 4, [], visible=8, env=env, on_node=True)
    assert _torchrun_args(capped).nproc_per_node == "4"
    # ... and a node that shows fewer than asked for runs one per visible GPU: a worker past
    # them would have no GPU of its LOCAL_RANK (training.init_distributed).
    short = launch.command(MODULE, 8, [], visible=4, env=env, on_node=True)
    assert _torchrun_args(short).nproc_per_node == "4"


def _port(job, **ports):
    return launch.rendezvous_port({"SLURM_JOB_ID": str(job)}, 0, **ports)


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux")
def test_the_rendezvous_port_is_outside_this_machine_s_ephemeral_range():
    """Outgoing connections take their source ports from net.ipv4.ip_local_port_range: a
    rendezvous port in it (20000 + job id % 20000 was, for 36% of job ids) may already be held
    on the first node, and the rendezvous host then cannot bind it."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {job: _port(job) for job in range(1, 100_000, 7)}
    assert not {job: p for job, p in ports.items() if low <= p <= high}
    assert all(1024 <= p <= 65535 for p in ports.values())
    # Jobs 20000 apart, once the same port, now differ; nearby jobs never share one.
    assert _port(12345) != _port(32345)
    assert len({_port(job) for job in range(50_000, 60_000)}) == 10_000


@pytest.mark.parametrize("ephemeral, free", [
    ("32768\t60999\n", "20000-32767, 61000-65535"),  # Linux's default
    ("15000 65000", "1024-14999, 65001-65535"),  # too little above 20000: from 1024 up
    ("1024 65535", "20000-65535"),  # every port is ephemeral: none can be avoided
    (None, "20000-32767, 61000-65535"),  # no such file (not Linux): Linux's default range
])
def test_the_rendezvous_port_avoids_the_ephemeral_range_read_from_proc(tmp_path, ephemeral, free):
    path = tmp_path / "ip_local_port_range"
    if ephemeral is not None:
        path.write_text(ephemeral)
    allowed = set()
    for span in free.split(", "):
        first, last = map(int, span.split("-"))
        allowed |= set(range(first, last + 1))
    # Every job takes an allowed port, and the jobs use the whole window.
    assert {_port(job, ephemeral_range=path) for job in range(100_000)} == allowed
    assert launch.rendezvous_port({"SLURM_JOB_ID": "5"}, 4321, ephemeral_range=path) == 4321


def test_srun_chain_end_to_end_with_fake_srun_and_scontrol(tmp_path):
    """The launcher execs srun (same PID); srun's task (node 1) runs the launcher again, which
    builds that node's torchrun. The fake srun drops its options and runs the task in --dry-run."""
    record = tmp_path / "srun.json"
    _fake_scontrol(tmp_path)
    _fake_tool(tmp_path, "srun", f"""\
        python3 -c 'import json, os, sys; json.dump({{"pid": os.getppid(), "argv": sys.argv[1:]}},
            open("{record}", "w"))' "$@"
        while [[ "$1" == --* ]]; do shift; done
        prog="$1"; shift 3  # python -m retrieval_pretraining.launch
        SLURM_NODEID=1 exec "$prog" -m retrieval_pretraining.launch --dry-run "$@"
    """)
    env = _env(tmp_path, **SLURM, CUDA_VISIBLE_DEVICES="0,1",
               PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "retrieval_pretraining.launch", "--module", MODULE, "--gpus", "2",
         "--", "--config", "{}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    srun = json.loads(record.read_text())
    assert srun["pid"] == proc.pid, "the launcher must exec srun, not run it as a child"
    assert "--ntasks-per-node=1" in srun["argv"]
    ns = _torchrun_args(json.loads(out))
    assert (ns.nnodes, ns.node_rank, ns.nproc_per_node) == ("4", 1, "2")
    assert ns.rdzv_endpoint.startswith("gpu03:") and ns.training_script_args == ["--config", "{}"]


def test_on_node_outside_slurm_or_without_scontrol_names_the_fix(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="SLURM_NODEID"):
        launch.command(MODULE, 1, [], visible=1, env={"SLURM_NNODES": "2"}, on_node=True)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="scontrol"):
        launch.command(MODULE, 1, [], visible=1, env={**SLURM, "SLURM_NODEID": "0"}, on_node=True)


# A stand-in trainer: records SIGUSR1 the way the real one reacts to it (flag, then clean exit).
RECORDER = """\
import os, signal, sys, time
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ.get("RANK", "0")
got = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
(out / f".ready-{rank}").write_text(str(os.getpid()))  # then renamed: never seen half-written
(out / f".ready-{rank}").rename(out / f"ready-{rank}")
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
if got:
    (out / f"got-{rank}").write_text(signal.Signals(got[0]).name)
sys.exit(75 if got else 1)
"""


def _launch_recorder(tmp_path, gpus, devices):
    (tmp_path / "sigrecorder.py").write_text(RECORDER)
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES=devices)
    return subprocess.Popen(
        [sys.executable, "-m", "retrieval_pretraining.launch", "--module", "sigrecorder",
         "--gpus", str(gpus), "--", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(paths, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"workers never became ready: {proc.communicate()[0]}")
        time.sleep(0.05)


def _recorded_devices(tmp_path, name, proc):
    """The CUDA_VISIBLE_DEVICES the job `name` recorded (DEVICE_RECORDER), once it has."""
    _wait_for([tmp_path / f"{name}.devices"], proc)
    return (tmp_path / f"{name}.devices").read_text()


def test_sigusr1_sent_to_the_launcher_reaches_the_single_process_trainer(tmp_path):
    proc = _launch_recorder(tmp_path, gpus=1, devices="0")
    _wait_for([tmp_path / "ready-0"], proc)
    assert int((tmp_path / "ready-0").read_text()) == proc.pid  # exec: same process
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 75
    assert (tmp_path / "got-0").read_text() == "SIGUSR1"


def test_sigusr1_sent_to_the_launcher_reaches_every_torchrun_worker(tmp_path):
    # "2 visible GPUs": torchrun starts 2 workers (which never touch CUDA) in their own sessions,
    # so only torchrun's forwarding (--signals-to-handle) can get the signal to them.
    proc = _launch_recorder(tmp_path, gpus=2, devices="0,1")
    try:
        _wait_for([tmp_path / "ready-0", tmp_path / "ready-1"], proc)
        proc.send_signal(signal.SIGUSR1)
        proc.communicate(timeout=60)
        assert (tmp_path / "got-0").read_text() == "SIGUSR1"
        assert (tmp_path / "got-1").read_text() == "SIGUSR1"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_torchrun_s_failure_is_75_only_for_a_stop_its_workers_marked(tmp_path):
    """Workers that exit 75 without having written the stop marker (no state saved for a stop)
    leave torchrun's own failure (1); the marker the trainer writes after its save makes it 75
    (the trainer's side: test_pretrain_train.py's torchrun tests)."""
    (tmp_path / "exits75.py").write_text(
        "import os, sys\n"
        "if sys.argv[1] == 'mark' and os.environ['LOCAL_RANK'] == '0':\n"
        "    open(os.environ['RETRIEVAL_PRETRAINING_STOP_MARKER'], 'w').close()\n"
        "sys.exit(75)\n")
    codes = []
    temp = tmp_path / "temp"
    temp.mkdir()
    for mode in ("plain", "mark"):
        proc = subprocess.run(
            [sys.executable, "-m", "retrieval_pretraining.launch", "--module", "exits75",
             "--gpus", "2", "--", mode],
            env=_env(tmp_path, CUDA_VISIBLE_DEVICES="0,1", TMPDIR=str(temp)),
            capture_output=True, text=True, timeout=120)
        codes.append(proc.returncode)
    assert codes == [1, 75], proc.stderr[-3000:]
    assert not list(temp.glob("retrieval-pretraining-stop*"))  # each run removed its marker


class _WorkerFailed(Exception):
    """Stands in for torchrun's ChildFailedError."""


def _fake_torchrun(monkeypatch, tmp_path, jobs):
    """torch's torchrun main replaced by `jobs[argv[0]](marker)`, each wrapper run's temp folder
    in tmp_path; returns the markers the runs named, in order."""
    from torch.distributed import run as torchrun_module

    from retrieval_pretraining.training.lifecycle import STOP_MARKER_ENV

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(STOP_MARKER_ENV, raising=False)  # restored after the test
    markers = []

    def main(argv):
        markers.append(Path(os.environ[STOP_MARKER_ENV]))
        jobs[argv[0]](markers[-1])

    monkeypatch.setattr(torchrun_module, "main", main)
    return markers


def test_another_job_s_stop_with_this_pid_does_not_make_a_failure_75(tmp_path, monkeypatch):
    """A job in another PID namespace (a container sharing /tmp) or on a node sharing TMPDIR may
    have this wrapper's PID; its stop marker must not turn this run's failed worker into 75."""
    from retrieval_pretraining import torchrun

    def fails_while_the_other_job_stops(marker):
        # the marker a run with this PID was named before: another job with it stops now
        Path(tempfile.gettempdir(), f"retrieval-pretraining-stopped-{os.getpid()}").write_text("")
        raise _WorkerFailed("worker exited 1")

    _fake_torchrun(monkeypatch, tmp_path, {"fails": fails_while_the_other_job_stops})
    with pytest.raises(_WorkerFailed):
        torchrun.run(["fails"])


def test_concurrent_wrapper_runs_with_one_pid_keep_their_own_stop(tmp_path, monkeypatch):
    """Two wrapper runs at once with the same PID (two PID namespaces): each names its own marker;
    one's stop (75) stays the other's failure, and neither run's end removes the other's stop.
    Each run's folder is gone after it."""
    from retrieval_pretraining import torchrun

    def fails(marker):
        raise _WorkerFailed("worker exited 1")

    outcomes = []

    def stops_while_another_run_fails(marker):
        marker.write_text("rank 0 stopped after saving\n")
        with pytest.raises(_WorkerFailed):
            torchrun.run(["fails"])
        outcomes.append("other run failed")
        raise _WorkerFailed("worker exited 75")

    markers = _fake_torchrun(
        monkeypatch, tmp_path, {"fails": fails, "stops": stops_while_another_run_fails})
    assert torchrun.run(["stops"]) == 75
    assert outcomes == ["other run failed"]
    assert len(set(markers)) == 2, markers
    assert list(tmp_path.iterdir()) == []


RANKS = """\
import json, os, sys
from pathlib import Path

keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK")
Path(sys.argv[1], f"rank-{os.environ['RANK']}.json").write_text(
    json.dumps({k: int(os.environ[k]) for k in keys}))
"""


@pytest.mark.parametrize("inherited, workers, expected", [
    ("64", 8, "8"), ("64", 3, "21"), ("4", 8, "1"), ("1", 2, "1"), (None, 1, None)])
def test_each_worker_gets_its_share_of_the_job_s_threads(inherited, workers, expected):
    env = {} if inherited is None else {"OMP_NUM_THREADS": inherited}
    threads = launch.threads_per_worker(workers, env)
    if expected is None:  # unset: the CPUs this process may use
        assert threads == len(os.sched_getaffinity(0))
    else:
        assert str(threads) == expected


def test_torchrun_workers_see_omp_num_threads_divided_by_their_count(tmp_path):
    """Snakemake sets OMP_NUM_THREADS to the rule's threads; torchrun keeps a set value, so
    without the launcher's share each worker would run all of them."""
    (tmp_path / "threadrecorder.py").write_text(
        "import os, sys\nfrom pathlib import Path\n"
        "threads = os.environ['OMP_NUM_THREADS']\n"
        "Path(sys.argv[1], 'omp-' + os.environ['RANK']).write_text(threads)\n")
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="0,1")
    env["OMP_NUM_THREADS"] = "8"
    out = subprocess.run(
        [sys.executable, "-m", "retrieval_pretraining.launch", "--module", "threadrecorder",
         "--gpus", "2", "--", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [(tmp_path / f"omp-{r}").read_text() for r in (0, 1)] == ["4", "4"]
    dry = _dry_run(tmp_path, "--gpus", "2", CUDA_VISIBLE_DEVICES="0,1", OMP_NUM_THREADS="64")
    assert "OMP_NUM_THREADS=32 for each of 2 workers" in dry.stderr, dry.stderr


# What Snakemake's shell sets to the rule's threads (snakemake/shell.py).
SNAKEMAKE_THREAD_VARIABLES = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                              "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def test_torchrun_workers_get_their_share_of_every_thread_variable_snakemake_sets(tmp_path):
    """Snakemake's shell sets MKL_NUM_THREADS (and the BLAS variables) to the rule's threads too,
    and torch's intra-op pool takes MKL_NUM_THREADS over OMP_NUM_THREADS: with OMP alone
    divided, each of 8 workers ran 64 intra-op threads on 64 cores, and numpy's OpenBLAS 64 more."""
    (tmp_path / "torchthreads.py").write_text(
        "import json, os, sys\nfrom pathlib import Path\nimport torch\n"
        f"names = {list(SNAKEMAKE_THREAD_VARIABLES)!r}\n"
        "Path(sys.argv[1], 'threads-' + os.environ['RANK']).write_text(json.dumps(\n"
        "    [torch.get_num_threads(), {name: os.environ[name] for name in names}]))\n")
    snakemake = {name: "2" for name in SNAKEMAKE_THREAD_VARIABLES}  # a rule with `threads: 2`
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="0,1", **snakemake)
    out = subprocess.run(
        [sys.executable, "-m", "retrieval_pretraining.launch", "--module", "torchthreads",
         "--gpus", "2", "--", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    for rank in (0, 1):
        intra_op, variables = json.loads((tmp_path / f"threads-{rank}").read_text())
        assert intra_op == 1 and set(variables.values()) == {"1"}, (intra_op, variables)


# "0.0.0.0" stands for a first host whose name torch does not take for this machine (one that
# resolves to a secondary NIC's address, say): connecting to it reaches this machine, but torch's
# own is_host guess says no, and the rendezvous then had no host at all.
@pytest.mark.parametrize("first_host", ["localhost", "0.0.0.0"])
def test_two_on_node_launchers_meet_at_the_rendezvous(tmp_path, first_host):
    """Two 'nodes' on this machine (node ids 0 and 1, scontrol naming `first_host` first) run the
    per-node torchrun commands for real: they must agree on one world of 2 ranks."""
    import socket

    (tmp_path / "rankrecorder.py").write_text(RANKS)
    _fake_tool(tmp_path, "scontrol", f"printf '{first_host}\\n{first_host}\\n'\n")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in (0, 1):
        env = _env(tmp_path, SLURM_NNODES="2", SLURM_NODEID=str(node), SLURM_JOB_ID="77",
                   SLURM_JOB_NODELIST="fake[1-2]", CUDA_VISIBLE_DEVICES="0",
                   PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "retrieval_pretraining.launch", "--on-node", "--module",
             "rankrecorder", "--gpus", "1", "--port", str(port), "--", str(tmp_path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert {r["WORLD_SIZE"] for r in ranks} == {2}
    assert sorted(r["GROUP_RANK"] for r in ranks) == [0, 1]  # one node each
    assert {r["LOCAL_RANK"] for r in ranks} == {0}


DEVICE_RECORDER = """\
import os, sys, time
from pathlib import Path

folder = Path(sys.argv[1])
name = sys.argv[2]
(folder / f"{name}.devices").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
while not (folder / "release").exists():
    time.sleep(0.1)
"""


def test_local_jobs_without_a_scheduler_each_claim_their_own_gpus(tmp_path):
    """Snakemake's local executor with `--resources gpu=2` runs two one-GPU jobs side by side and
    sets no CUDA_VISIBLE_DEVICES: both computed on GPU 0. Each now claims a GPU (a lock under the
    lock folder), a third waits for one, and a crashed job's GPU is free again."""
    (tmp_path / "devicerecorder.py").write_text(DEVICE_RECORDER)
    _fake_tool(tmp_path, "nvidia-smi", """\
        echo "GPU 0: NVIDIA H100 (UUID: GPU-a)"
        echo "GPU 1: NVIDIA H100 (UUID: GPU-b)"
    """)
    env = _env(tmp_path, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
               RETRIEVAL_PRETRAINING_GPU_LOCKS=str(tmp_path / "locks"))

    def job(name):
        return subprocess.Popen(
            [sys.executable, "-m", "retrieval_pretraining.launch", "--module", "devicerecorder",
             "--gpus", "1", "--", str(tmp_path), name],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = {name: job(name) for name in ("a", "b")}
    try:
        assert sorted(_recorded_devices(tmp_path, n, p) for n, p in procs.items()) == ["0", "1"]
        procs["c"] = job("c")  # both GPUs taken: it waits
        time.sleep(3)
        assert procs["c"].poll() is None and not (tmp_path / "c.devices").exists()
        procs["a"].kill()  # a crash: the kernel drops its lock
        procs["a"].wait()
        assert _recorded_devices(tmp_path, "c", procs["c"]) == (tmp_path / "a.devices").read_text()
    finally:
        (tmp_path / "release").write_text("")
        outputs = {n: p.communicate(timeout=60)[0] for n, p in procs.items()}
    assert procs["b"].returncode == procs["c"].returncode == 0, outputs
    assert "waiting for 1 of the 2 GPUs" in outputs["c"], outputs["c"]


def test_a_dry_run_claims_no_gpus_and_says_which_it_would(tmp_path):
    """--dry-run prints what it would run: on a machine whose GPUs other jobs hold it waited for
    them (it claimed as a real launch does); now it claims none, holds no lock, and prints the
    command the claimed GPUs would give."""
    from retrieval_pretraining import gpu_claim

    _fake_tool(tmp_path, "nvidia-smi", """\
        echo "GPU 0: NVIDIA H100 (UUID: GPU-a)"
        echo "GPU 1: NVIDIA H100 (UUID: GPU-b)"
        echo "GPU 2: NVIDIA H100 (UUID: GPU-c)"
    """)
    locks = tmp_path / "locks"
    held = gpu_claim.try_claim(locks, 3, 3)  # every GPU busy with another job
    try:
        out = subprocess.run(
            [sys.executable, "-m", "retrieval_pretraining.launch", "--module", MODULE,
             "--gpus", "2", "--dry-run", "--", "--config", "{}"],
            env=_env(tmp_path, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
                     RETRIEVAL_PRETRAINING_GPU_LOCKS=str(locks)),
            capture_output=True, text=True, timeout=30)
    finally:
        for fd in held.values():
            os.close(fd)
    assert out.returncode == 0, out.stderr
    assert _torchrun_args(json.loads(out.stdout)).nproc_per_node == "2"
    assert "would claim the first 2 free of the 3 GPUs" in out.stderr
    assert "waiting" not in out.stderr


def test_a_claim_is_all_or_nothing_and_only_where_no_scheduler_chose(tmp_path):
    from retrieval_pretraining import gpu_claim

    held = gpu_claim.try_claim(tmp_path, 1, 3)
    assert list(held) == [0]
    assert gpu_claim.try_claim(tmp_path, 3, 3) is None  # two free of three: none kept
    other = gpu_claim.try_claim(tmp_path, 2, 3)
    assert sorted(other) == [1, 2]
    for fd in [*held.values(), *other.values()]:
        os.close(fd)
    assert sorted(gpu_claim.try_claim(tmp_path, 3, 3)) == [0, 1, 2]  # closed: free again
    assert gpu_claim.needs_claim(1, 2, {})
    assert not gpu_claim.needs_claim(1, 2, {"SLURM_JOB_ID": "7"})  # Slurm chose them
    assert not gpu_claim.needs_claim(1, 2, {"CUDA_VISIBLE_DEVICES": "1"})  # someone chose them
    assert not gpu_claim.needs_claim(1, 0, {}) and not gpu_claim.needs_claim(0, 2, {})


def test_another_users_lock_files_can_be_locked(tmp_path, monkeypatch):
    """The lock folder is shared by every user's jobs. A lock file made under a umask of 077
    (0600) could not be opened by a second user's job, and with fs.protected_regular (systemd's
    default) an O_CREAT open of another user's file in the sticky folder fails even where its
    mode allows: either way the second user's job crashed instead of claiming a GPU. A lock file
    is made readable by all, and one that exists is opened without O_CREAT."""
    from retrieval_pretraining import gpu_claim

    old_umask = os.umask(0o077)
    try:
        for fd in gpu_claim.try_claim(tmp_path, 2, 2).values():
            os.close(fd)
    finally:
        os.umask(old_umask)
    for name in ("claim.lock", "gpu-0.lock", "gpu-1.lock"):
        assert (tmp_path / name).stat().st_mode & 0o444 == 0o444, name
    real_open = os.open

    def protected_regular(path, flags, *mode):  # as the kernel answers the second user
        if flags & os.O_CREAT and Path(path).exists():
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(os, "open", protected_regular)
    assert sorted(gpu_claim.try_claim(tmp_path, 2, 2)) == [0, 1]


def test_a_lock_folder_that_cannot_be_made_names_its_variable(tmp_path):
    """A temp folder the job cannot write (read-only, say) stopped every local GPU job with a
    bare OSError, naming neither the folder's variable nor why a GPU job wants a folder."""
    from retrieval_pretraining import gpu_claim

    (tmp_path / "file").write_text("")  # a folder below a file cannot be made, even by root
    env = {gpu_claim.LOCK_FOLDER_ENV: str(tmp_path / "file" / "locks")}
    with pytest.raises(SystemExit, match=f"cannot lock .* set {gpu_claim.LOCK_FOLDER_ENV} to"):
        gpu_claim.claim(1, 2, env)


def test_one_process_gpu_stages_claim_their_own_gpus_where_no_scheduler_chose(tmp_path):
    """claim_run, which starts encoding, mining and search: started directly, two local one-GPU
    jobs side by side both saw every GPU (torch computed on GPU 0, FAISS on both). Each now gets a
    GPU of its own, held after the exec (a third waits); on a CPU, in a Slurm job, with
    CUDA_VISIBLE_DEVICES set or with `gpu` 0 the stage starts as before."""
    (tmp_path / "devicerecorder.py").write_text(DEVICE_RECORDER)
    gpus, cpu = tmp_path / "gpus", tmp_path / "cpu"
    gpus.mkdir(), cpu.mkdir()
    _fake_tool(gpus, "nvidia-smi", """\
        echo "GPU 0: NVIDIA H100 (UUID: GPU-a)"
        echo "GPU 1: NVIDIA H100 (UUID: GPU-b)"
    """)
    _fake_tool(cpu, "nvidia-smi", "exit 9\n")  # no driver: the stage runs on the CPU

    def job(name, tools=gpus, count=1, **extra):
        env = _env(tmp_path, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}",
                   RETRIEVAL_PRETRAINING_GPU_LOCKS=str(tmp_path / "locks"), **extra)
        return subprocess.Popen(
            [sys.executable, "-m", "retrieval_pretraining.claim_run", "--gpus", str(count),
             "--module", "devicerecorder", "--", str(tmp_path), name],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = {name: job(name) for name in ("a", "b")}
    try:
        assert sorted(_recorded_devices(tmp_path, n, p) for n, p in procs.items()) == ["0", "1"]
        procs["c"] = job("c")  # the stages hold both GPUs' locks: it waits
        time.sleep(3)
        assert procs["c"].poll() is None and not (tmp_path / "c.devices").exists()
    finally:
        (tmp_path / "release").write_text("")
        outputs = {n: p.communicate(timeout=60)[0] for n, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), outputs
    assert _recorded_devices(tmp_path, "c", procs["c"]) in ("0", "1")
    unchanged = {"cpu": job("cpu", tools=cpu), "slurm": job("slurm", SLURM_JOB_ID="7"),
                 "chosen": job("chosen", CUDA_VISIBLE_DEVICES="1"), "none": job("none", count=0)}
    for name, proc in unchanged.items():
        assert proc.wait(timeout=60) == 0, proc.communicate()[0]
    assert {n: _recorded_devices(tmp_path, n, p) for n, p in unchanged.items()} == {
        "cpu": "unset", "slurm": "unset", "chosen": "1", "none": "unset"}
