"""What a lent GPU's minutes cannot afford to find wrong: the arithmetic the GPU benchmarks report
with (the GPU's busy time of a profiled step, benchmarks/pretrain_step_time.py), and
benchmarks/gpu_checks.sh itself (its parts, their arguments, its budget, the gloo tests beside)."""

import argparse
import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pretrain_step_time  # noqa: E402


def test_busy_time_counts_overlapping_device_work_once_and_ignores_host_events():
    events = [
        {"cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 10.0},
        {"cat": "kernel", "name": "softmax", "ts": 5.0, "dur": 15.0},  # overlaps: 0-20 busy
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 100.0},  # the host's
        {"cat": "gpu_memcpy", "name": "copy", "ts": 30.0, "dur": 10.0},
        {"cat": "kernel", "name": "gemm", "ts": 32.0, "dur": 2.0},  # inside the copy's interval
        {"cat": "kernel", "name": "marker", "ts": 50.0},  # no duration
    ]
    count, busy, by_name = pretrain_step_time.busy_time(events)
    assert (count, busy) == (4, 30.0)
    assert by_name == [("softmax", 15.0), ("gemm", 12.0), ("copy", 10.0)]


class _Parsed(Exception):
    """Raised by the patched parse_args once the arguments parsed: the benchmark does no work."""


def refusal(monkeypatch, name: str, words: list[str]) -> int | None:
    """Run benchmarks/`name`.py's main() on `words` up to argparse (stopped there, nothing run):
    None when the arguments parse, else argparse's exit status (its message went to stderr)."""
    parse = argparse.ArgumentParser.parse_args

    def parsed_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parsed_then_stop)
        patch.setattr(sys, "argv", [f"benchmarks/{name}.py", *words])
        try:
            importlib.import_module(name).main()
        except _Parsed:
            return None
        except SystemExit as exit_:
            return exit_.code
    raise AssertionError(f"{name}.py's main() returned without parsing its arguments")



@pytest.mark.parametrize("broken, order", [("steps", "in-turn"), ("steps", "round-robin"),
                                           ("build", "in-turn")])
def test_step_time_reports_a_failing_objective_and_times_the_rest(monkeypatch, capsys, broken,
                                                                  order):
    # An objective that fails (cuDNN's attention, a compiled graph: never run on a GPU before)
    # must not take the later objectives and the summary with it on a lent GPU's minutes.
    real = pretrain_step_time.Pretrainer

    def pretrainer(checkpoint, settings, attention):
        if settings["name"] == "costa" and broken == "build":
            raise RuntimeError("no such attention")
        model = real(checkpoint, settings, attention)
        if settings["name"] == "costa":
            def forward(*args, **kwargs):
                raise RuntimeError("kernel not supported")
            model.forward = forward
        return model

    monkeypatch.setattr(pretrain_step_time, "Pretrainer", pretrainer)
    monkeypatch.setattr(sys, "argv", ["pretrain_step_time.py", "--steps", "1", "--warmup", "1",
                                      "--max-len", "32", "--batch", "2", "--order", order,
                                      "--objectives", "mlm", "costa", "bow"])
    assert pretrain_step_time.main() == 1
    out = capsys.readouterr().out
    error = "no such attention" if broken == "build" else "kernel not supported"
    assert f"costa: failed: RuntimeError: {error}" in out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert rows == ["objective", "mlm", "bow"]  # the table covers what ran
    assert "  bow: " in out.split("Projected wall time")[1]
    assert f"Failed (not in the figures above): costa: RuntimeError: {error}" in out


def test_step_time_profiles_only_after_every_objective_is_timed(monkeypatch, capsys):
    # A CUDA profile leaves CUPTI loaded for the rest of the process (Kineto tears it down only
    # under TEARDOWN_CUPTI=1), which slows later kernel launches: profiled in turn, BoW, timed
    # after six objectives' profiles, came out 1.21x MLM on an H200 (unprofiled, 1.00x).
    real = pretrain_step_time.Pretrainer
    timed, profiling, at_first_profile = Counter(), [], []

    def pretrainer(checkpoint, settings, attention):
        model = real(checkpoint, settings, attention)
        own = model.forward

        def forward(*args, **kwargs):
            if not profiling:
                timed[settings["name"]] += 1
            return own(*args, **kwargs)
        model.forward = forward
        return model

    def profiled(step, seconds):
        at_first_profile.append(at_first_profile[0] if at_first_profile else dict(timed))
        profiling.append(True)
        step()
        profiling.pop()
        return "stand-in profile"

    monkeypatch.setattr(pretrain_step_time, "Pretrainer", pretrainer)
    monkeypatch.setattr(pretrain_step_time, "profiled", profiled)
    monkeypatch.setattr(sys, "argv", ["pretrain_step_time.py", "--steps", "2", "--warmup", "1",
                                      "--max-len", "32", "--batch", "2", "--order", "in-turn",
                                      "--profile", "--objectives", "mlm", "costa", "bow"])
    assert pretrain_step_time.main() == 0
    # warm-up + timed steps of every objective, all before the first profile
    assert at_first_profile[0] == {"mlm": 3, "costa": 3, "bow": 3}
    out = capsys.readouterr().out
    assert [f"  profile of {name}: stand-in profile" in out for name in ("mlm", "costa", "bow")] \
        == [True] * 3
    assert re.search(r"  mlm timed again after the profiles: [0-9.]+ s a step \([0-9.]+x", out)
    assert timed["mlm"] == 3 + 3  # and the re-timing's 1 + --steps


def test_step_time_profile_gives_the_host_s_time_to_queue_a_step(monkeypatch, capsys):
    """--profile's line ends with the host's median time to queue a timed step's work (the
    figure the real trainer's host regions are set against, trainer_throughput.py --profile):
    on the CPU the work itself, so at most the step."""
    for order in ("in-turn", "round-robin"):
        monkeypatch.setattr(sys, "argv", ["pretrain_step_time.py", "--steps", "2", "--warmup",
                                          "1", "--max-len", "32", "--batch", "2", "--order", order,
                                          "--profile", "--objectives", "mlm", "bow"])
        assert pretrain_step_time.main() == 0
        out = capsys.readouterr().out
        for name in ("mlm", "bow"):
            step = float(re.search(rf"\| {name} \| [^|]* \| ([0-9.]+) \|", out).group(1))
            host = float(re.search(rf"  profile of {name}: .*; the host queued a step in "
                                   r"([0-9.]+) ms \(median\)", out).group(1))
            assert 0 < host <= step * 1e3 + 0.1, (order, name, out)


# benchmarks/gpu_checks.sh, run against a stand-in `python3` and `nvidia-smi`: a lent GPU's 15
# minutes must not go to a part that never starts (a benchmark refusing its arguments, a test file
# renamed) or to a budget the script does not keep.
ALL_PARTS = ["tests", "compiled", "steps", "js", "attn", "gcache", "unpadded", "trainer", "dense",
             "compiled_more", "trainer_more"]  # `all`; gloo beside the tests
FIRST_PARTS = ["tests", "trainer_more", "compiled_more"]  # the default; gloo beside
SECOND_PARTS = ["steps", "attn", "dense"]
OUTPUT_FILES = 8  # the most a lent machine sends back from $OUT

# Records each call's arguments (one JSON list a line) and acts as the GPU machine's python3 would
# enough for the script: xdist installed, pip and pytest succeeding after STUB_<kind>_SECONDS.
STUB_PYTHON = r'''#!{python}
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if args[:1] == ["-c"]:  # `import xdist` succeeds; the versions are printed
    if "torch" in args[1]:
        print("3.12.3 torch 2.11.0+cu130 transformers 5.23.0 cuda True")
    sys.exit(0)
if "tests/test_launch.py" in args:  # the gloo tests
    open(os.environ["STUB_GLOO_PID"], "w").write(str(os.getpid()))
    kind = "GLOO"
elif "tests/test_gpu.py" in args:
    kind = "TESTS"
elif args and args[0].startswith("benchmarks/"):
    kind = os.path.basename(args[0]).removesuffix(".py").upper()
else:  # pip
    kind = "OTHER"
print(kind.lower(), "ran", flush=True)
time.sleep(float(os.environ.get(f"STUB_{kind}_SECONDS", "0")))
'''


def run_gpu_checks(tmp_path, *parts, budget=300, plan=False, **stub_seconds):
    """gpu_checks.sh copied into a bare tree (its .gpu-carry holding one wheel) and run there with
    the stand-ins first on PATH; returns (exit status, machine.txt lines, the calls, seconds)."""
    tree, bin_dir, out = tmp_path / "tree", tmp_path / "bin", tmp_path / "out"
    (tree / "benchmarks").mkdir(parents=True)
    (tree / ".gpu-carry/wheels").mkdir(parents=True)
    (tree / ".gpu-carry/wheels/stub-0-py3-none-any.whl").touch()
    shutil.copy2(ROOT / "benchmarks/gpu_checks.sh", tree / "benchmarks")
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STUB_PYTHON.replace("{python}", sys.executable))
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'name, memory.total [MiB]'\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "GPU_CHECKS_SECONDS": str(budget), **({"GPU_CHECKS_PLAN": "1"} if plan else {}),
           "STUB_LOG": str(tmp_path / "calls.jsonl"), "STUB_GLOO_PID": str(tmp_path / "gloo.pid"),
           **{f"STUB_{kind.upper()}": str(s) for kind, s in stub_seconds.items()}}
    started = time.monotonic()
    done = subprocess.run(["bash", "benchmarks/gpu_checks.sh", str(out), *parts], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)
    log = tmp_path / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    machine_file = out / "machine.txt"
    machine = machine_file.read_text().splitlines() if machine_file.exists() else []
    return done, machine, calls, time.monotonic() - started


def part_status(machine):
    """{part: exit status} from machine.txt's `part: exit N at S s` lines."""
    return {line.split(":")[0]: int(line.split("exit ")[1].split()[0])
            for line in machine if " exit " in line}


def test_gpu_checks_runs_every_part_in_order_with_arguments_its_scripts_accept(tmp_path,
                                                                              monkeypatch):
    done, machine, calls, _ = run_gpu_checks(tmp_path, "all", tests_seconds=3)  # gloo ends first
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "out").rglob("*"))) <= OUTPUT_FILES
    status = part_status(machine)
    assert status == {"gloo (beside the tests)": 0, **{part: 0 for part in ALL_PARTS}}
    assert [line.split(":")[0] for line in machine if " exit " in line][1:] == ALL_PARTS

    # Every benchmark call parses with the benchmark's own command line (a renamed option or an
    # unknown objective exits 2 there), and every test file it names exists.
    scripts = [call for call in calls if call[0].startswith("benchmarks/")]
    assert {call[0] for call in scripts} == {
        f"benchmarks/{name}.py" for name in ("pretrain_step_time", "cpdae_js", "attention_kernels",
                                             "gradient_cache", "trainer_throughput",
                                             "encode_and_search")}
    # The gradient cache's part: bow.yaml's NQ fine-tuning shape on the GPU, then a contrast set
    # whose uncached step fits beside its cached ones.
    shape = ["--device", "cuda", "--arch", "bert-base", "--group-size", "16", "--q-len", "32",
             "--p-len", "256", "--steps", "5", "--micro-batch"]
    assert [args for script, *args in scripts if script == "benchmarks/gradient_cache.py"] == [
        [*shape, "64", "--chunks", "8", "16"], [*shape, "16"]]
    for script, *args in scripts:
        assert (ROOT / script).exists()
        assert refusal(monkeypatch, Path(script).stem, args) is None, (script, args)
    pytest_calls = [call[2:] for call in calls if call[:2] == ["-m", "pytest"]]
    test_files = {arg for call in pytest_calls for arg in call if arg.startswith("tests/")}
    assert test_files == {f"tests/{name}.py" for name in ("test_gpu", "test_pretrain_train",
                                                          "test_launch")}
    for args in pytest_calls:  # pytest itself takes the options and finds the tests (one process)
        spread = {i for i, arg in enumerate(args) if arg in ("-n", "--dist") for i in (i, i + 1)}
        args = [arg for i, arg in enumerate(args) if i not in spread]
        args += ["--collect-only", "-n", "0"]
        collected = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT,
                                   capture_output=True, text=True, timeout=300)
        assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    # .gpu-carry's wheels installed
    assert ["-m", "pip"] == next(call for call in calls if "pip" in call)[:2]



@pytest.mark.parametrize("preset, budget, parts", [((), 560, FIRST_PARTS),
                                                   (("second",), 200, SECOND_PARTS)])
def test_gpu_checks_presets_start_every_part_within_their_call_s_budget(tmp_path, preset, budget,
                                                                        parts):
    # A lent GPU's session: one 560-second call, then a second of ~200 s. The first run's parts'
    # caps summed past its budget and its last parts were cut or never started.
    done, _, calls, _ = run_gpu_checks(tmp_path, *preset, budget=budget, plan=True)
    assert done.returncode == 0, done.stderr
    assert not calls and not (tmp_path / "out").exists()  # a plan runs nothing
    plan = dict(line.split() for line in done.stdout.splitlines())
    total = int(plan.pop("total"))
    caps = {part: int(seconds) for part, seconds in plan.items()}
    assert [part for part in caps if part != "gloo"] == parts
    assert total == sum(caps.values()) <= budget
    # A part starts with 15 s left: every part does even when each before it runs to its cap.
    assert all(seconds >= 15 for part, seconds in caps.items() if part != "gloo")
    assert caps.get("gloo", 0) == 0  # beside the tests, on the CPU

    done, machine, _, _ = run_gpu_checks(tmp_path / "run", *preset, budget=budget,
                                         tests_seconds=3)
    assert done.returncode == 0, done.stderr
    ran = {part: code for part, code in part_status(machine).items() if "gloo" not in part}
    assert ran == {part: 0 for part in parts}
    assert len(list((tmp_path / "run/out").rglob("*"))) <= OUTPUT_FILES


def test_gpu_checks_plan_counts_the_gradient_cache_part_s_cap_in_all_alone(tmp_path):
    # `gcache` is new and not yet run: in `all` (no budget) and by name, never in the lent
    # machine's first or second call, whose caps fill their budgets.
    plans = {}
    for preset in ("all", "first", "second", "gcache"):
        done, _, calls, _ = run_gpu_checks(tmp_path / preset, preset, plan=True)
        assert done.returncode == 0 and not calls, done.stderr
        plans[preset] = dict(line.split() for line in done.stdout.splitlines())
    assert plans["gcache"] == {"gcache": "120", "total": "120"}
    assert plans["all"]["gcache"] == "120"
    assert int(plans["all"]["total"]) == sum(int(v) for k, v in plans["all"].items()
                                             if k != "total")
    assert "gcache" not in plans["first"] and "gcache" not in plans["second"]


def test_gpu_checks_stops_the_gloo_tests_when_the_gpu_tests_end(tmp_path):
    # The gloo tests run beside the GPU tests on the other cores and must not run on into the
    # timings: they are stopped (their whole process group) when the GPU tests end.
    done, machine, _, seconds = run_gpu_checks(tmp_path, "tests", "gloo", tests_seconds=1,
                                               gloo_seconds=60)
    assert seconds < 30
    assert part_status(machine) == {"gloo (beside the tests)": 124, "tests": 0}
    assert done.returncode == 1  # the gloo tests did not finish: not a clean run
    assert gone(int((tmp_path / "gloo.pid").read_text()))


def gone(pid, seconds=10.0):
    """Whether process `pid` ends (or is left a zombie for its new parent to reap) in `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_gpu_checks_keeps_its_budget_cutting_a_part_and_skipping_the_rest(tmp_path):
    # 16 s of budget: `steps` is cut at what is left, and with under 15 s left `js` never starts.
    done, machine, calls, seconds = run_gpu_checks(tmp_path, "steps", "js", budget=16,
                                                   pretrain_step_time_seconds=60)
    assert seconds < 16 + 10
    assert part_status(machine) == {"steps": 124, "js": 124}
    assert done.returncode == 1
    assert not any(call[0] == "benchmarks/cpdae_js.py" for call in calls)


def test_gpu_checks_refuses_an_unknown_part(tmp_path):
    done, _, _, _ = run_gpu_checks(tmp_path, "stepz")
    assert done.returncode == 2
    assert "unknown part: stepz" in done.stderr



def test_gpu_carry_keeps_the_old_carry_when_a_download_fails(tmp_path):
    # Without network pip fails: the carry a lent GPU needs must not be deleted first.
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    (tree / ".venv/bin").mkdir(parents=True)
    shutil.copy2(ROOT / "benchmarks/gpu_carry.sh", tree / "benchmarks")
    (tree / "requirements.txt").write_text("jsonschema==4.0\ntransformers==5.0\ntokenizers==0.1\n")
    (tree / "requirements-nodeps.txt").write_text("")
    stub = tree / ".venv/bin/python"
    stub.write_text("#!/bin/sh\necho 'no network' >&2\nexit 1\n")
    stub.chmod(0o755)
    (tree / ".gpu-carry/wheels").mkdir(parents=True)
    (tree / ".gpu-carry/wheels/old-1-py3-none-any.whl").write_text("old")
    done = subprocess.run(["bash", "benchmarks/gpu_carry.sh"], cwd=tree, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert (tree / ".gpu-carry/wheels/old-1-py3-none-any.whl").read_text() == "old"
    assert sorted(path.name for path in tree.iterdir()) == [".gpu-carry", ".venv", "benchmarks",
                                                           "requirements-nodeps.txt",
                                                           "requirements.txt"]  # no leftovers


# benchmarks/attention_kernels.py: what it reports as each kernel's error must be the error.
import attention_kernels  # noqa: E402


def test_attention_lengths_have_the_asked_mean():
    lengths = attention_kernels.lengths_with_mean(20_000, 512, 445.0,
                                                  torch.Generator().manual_seed(0))
    assert abs(float(lengths.float().mean()) - 445.0) < 3
    assert int(lengths.min()) >= attention_kernels.SHORTEST and int(lengths.max()) == 512


def test_attention_kernels_agree_with_float64_attention_at_the_real_tokens():
    """On the CPU: torch's choice and the variable-length path (its block-diagonal stand-in)
    within float32 rounding of float64 attention; a path that mixed rows would be far off."""
    done = subprocess.run(
        [sys.executable, "benchmarks/attention_kernels.py", "--batch", "6", "--length", "48",
         "--heads", "2", "--head-dim", "8", "--mean-length", "36", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "workflow")})
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:]
            for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| kernel |")}
    assert set(rows) == set(attention_kernels.VARIANTS)
    for name in ("padded, torch's choice (mask)", "real tokens, flash varlen"):
        errors = [float(value.strip(" |")) for value in rows[name][-2:]]
        assert all(error < 1e-5 for error in errors), (name, rows[name])


def test_the_timed_variable_length_call_is_the_kernel_alone(monkeypatch):
    """The varlen row timed bert.varlen_attention and, beside it, a boolean gather of q, k and v
    and a scatter back (four host waits, three copies on a GPU): 2.5 ms against the padded
    kernels' 0.7-0.8 on an H200, where the unpadded layers, which never gather around attention,
    made a step 5% slower in all. The timed call now dispatches the kernel's op and nothing else;
    the gather and scatter around it (outside the timing) are each other's inverse."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    real = torch.arange(6)[None, :] < torch.tensor([6, 3, 4])[:, None]
    q, k, v = (torch.randn(3, 2, 6, 4) for _ in range(3))
    offsets = torch.tensor([0, 6, 9, 13], dtype=torch.int32)
    rows = attention_kernels.Rows(real)
    flat = [rows.gather(t) for t in (q, k, v)]
    monkeypatch.setattr(attention_kernels, "varlen_attention",
                        lambda q, k, v, offsets, longest, p: torch.ops.aten.mul(q, 1.0))
    mask = real[:, None, None, :]
    with Ops() as ops:
        attention_kernels.real_tokens(*flat, mask, offsets, 0.0)
    assert ops.names == ["mul"]
    assert flat[0].shape == (13, 2, 4)
    restored = rows.scatter(flat[0])
    torch.testing.assert_close(restored * real[:, None, :, None], q * real[:, None, :, None])


def test_the_attention_error_sees_a_wrong_row():
    real = torch.tensor([[True, True, False], [True, False, False]])
    reference = torch.randn(2, 1, 3, 4, dtype=torch.float64)
    wrong = reference.clone()
    wrong[1, 0, 0] += 1.0  # a real token
    padding = reference.clone()
    padding[1, 0, 2] += 100.0  # the padding: not read
    assert attention_kernels.relative_error(padding, reference, real) == 0.0
    assert attention_kernels.relative_error(wrong, reference, real) > 0.1


# benchmarks/trainer_throughput.py --profile: where the real trainer's step loses time against the
# model step's. Its GPU figures come from a lent GPU's trace alone, so their arithmetic is checked
# here on a trace written by hand: one profiled step of 1,000 us (after a warm-up step), the host's
# marked calls, a copy, a forward kernel, a backward kernel launched from autograd's thread and
# the optimizer's kernel, with the idle stretches they leave worked out below.
import trainer_throughput  # noqa: E402


def _annotation(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts,
            "dur": dur}


def _launched(cat, name, ts, dur, correlation, launch_ts, tid=1):
    """A piece of device work and the runtime call that launched it."""
    return [{"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
             "args": {"correlation": correlation}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
             "ts": launch_ts, "dur": 1, "args": {"correlation": correlation}}]


def _op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


HAND_TRACE = [
    _annotation("trainer step", 0, 1000),  # the profiler's warm-up step: not counted
    *_launched("kernel", "warm_up_gemm", 100, 500, 9, 50),
    _annotation("trainer step", 1000, 1000),
    _annotation("trainer:log", 1000, 10),
    _annotation("trainer:fetch", 1010, 40),
    # 1050-1060 unmarked between fetch and seed: "to device"
    _annotation("trainer:seed", 1060, 10),
    # 1070-1400 unmarked between seed and backward: "forward"
    _annotation("trainer:backward", 1400, 300),
    # 1700-1800 unmarked between backward and read: "loop"
    _annotation("trainer:read", 1800, 200),
    _op("aten::copy_", 1052, 6),
    *_launched("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1100, 10, 1, 1055),
    _op("aten::linear", 1075, 15), _op("aten::addmm", 1078, 7),
    *_launched("kernel", "gemm", 1150, 240, 2, 1080),
    _op("autograd::engine::evaluate_function: MmBackward0", 1405, 10, tid=2),
    *_launched("kernel", "gemm_backward", 1420, 360, 3, 1410, tid=2),
    *_launched("kernel", "adam", 1781, 9, 4, 1705),
    {"ph": "X", "cat": "kernel", "name": "marker", "pid": 0, "tid": 7, "ts": 1795},  # no duration
]


def test_trainer_profile_charges_each_idle_stretch_to_the_host_region_that_ended_it():
    found = trainer_throughput.gpu_summary(HAND_TRACE, steps=1)
    # busy: copy 10 + gemm 240 + backward 360 + adam 9; idle: 100 before the copy, 40 before
    # gemm, 30 before the backward kernel, 1 before adam, 210 after it.
    assert found["steps"] == 1 and found["work_a_step"] == 4
    assert (found["step_ms"], found["busy_ms"], found["idle_ms"]) == (1.0, 0.619, 0.381)
    assert found["busy_share"] == 0.619
    assert found["idle_before_first_work_ms"] == 0.1
    assert found["idle_between_work_ms"] == 0.071
    assert found["idle_after_last_work_ms"] == 0.21
    assert found["gaps_of_20us_or_more_a_step"] == 2  # 40 and 30; not the lead, not adam's 1
    assert found["idle_by_host_region_ms"] == {"after the last work": 0.21, "to device": 0.1,
                                               "forward": 0.04, "backward": 0.03, "loop": 0.001}
    assert found["largest_idle"][:3] == [
        {"ms": 0.1, "host_region": "to device", "ended_by": "Memcpy HtoD (Pinned -> Device)",
         "launched_by": "aten::copy_"},
        {"ms": 0.04, "host_region": "forward", "ended_by": "gemm",
         "launched_by": "aten::linear > aten::addmm"},
        {"ms": 0.03, "host_region": "backward", "ended_by": "gemm_backward",
         "launched_by": "autograd::engine::evaluate_function: MmBackward0"}]


def test_trainer_profile_splits_a_step_into_its_host_regions():
    windows, marks = trainer_throughput.trace_steps(HAND_TRACE, steps=1)
    assert windows == [(1000, 2000)]
    found = trainer_throughput.host_summary(marks, [1000, 2000], to_ms=1e-3)
    assert found["steps"] == 1 and found["step_ms"] == 1.0
    assert found["regions_ms"] == {"forward": 0.33, "backward": 0.3, "read": 0.2, "loop": 0.1,
                                   "fetch": 0.04, "log": 0.01, "to device": 0.01, "seed": 0.01}


def test_trainer_profile_prints_a_gpu_report(tmp_path, capsys):
    """The readable lines of a CUDA run's report (written here from the hand trace)."""
    report = tmp_path / "profile.json"
    windows, marks = trainer_throughput.trace_steps(HAND_TRACE, steps=1)
    report.write_text(json.dumps({
        "host": {**trainer_throughput.host_summary(marks, [1000, 2000], to_ms=1e-3),
                 "waits_for_gpu_a_step": 1.0, "wait_sites": {"distributed.py:151": 3}},
        "gpu": trainer_throughput.gpu_summary(HAND_TRACE, steps=1)}))
    trainer_throughput.print_profile("mlm", report, step_seconds=0.002)
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["profile"]["gpu"]["busy_ms"] == 0.619
    assert lines[1].endswith("waits for the GPU: 1 a step (distributed.py:151)")
    assert "busy 0.6 ms (62%; 31% of the unprofiled 2.0 ms)" in lines[2]
    assert "largest: 0.10 ms in to device, ended by Memcpy HtoD" in lines[2]


def test_trainer_profile_counts_the_cuda_events_the_host_waits_on(monkeypatch, tmp_path):
    """QueuedRead.take waits for a step's values on a CUDA event, which torch's sync debug mode
    does not warn of: the host steps' waits for the GPU count each such wait, at its line. (CUDA
    stood in for: only the Tracer's accounting runs here.)"""
    import torch

    class Profiler:
        def __init__(self, activities):
            pass

        start = stop = lambda self: None

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda event: None)
    monkeypatch.setattr(torch.profiler, "profile", Profiler)
    tracer = trainer_throughput.Tracer(after=1, steps=1, report=str(tmp_path / "profile.json"))
    torch.cuda.Event.synchronize(None)  # a step before the host steps: not counted
    tracer.step_done()
    for _ in range(trainer_throughput.HOST_STEPS):
        torch.cuda.Event.synchronize(None)  # as QueuedRead.take waits for the step's copy
        tracer.step_done()
    tracer.abandon()
    torch.cuda.Event.synchronize(None)  # after them: not counted, the method put back
    host = tracer.result["host"]
    assert host["waits_for_gpu_a_step"] == 1
    [(site, count)] = host["wait_sites"].items()
    assert site.startswith("test_benchmark_tools.py:") and count == trainer_throughput.HOST_STEPS
    assert torch.cuda.Event.synchronize.__name__ == "<lambda>"


def test_trainer_throughput_profile_runs_on_the_cpu_and_leaves_the_timed_steps_alone(
        monkeypatch, tmp_path, capsys):
    """--profile traces steps after the timed ones: the same timed steps and row as without it,
    then its report (on the CPU: the host's regions, no GPU). At the trainer tests' size: their
    tiny BERT for the benchmark's checkpoint, 40 SciFact abstracts in 48-token chunks,
    micro-batches of 4."""
    import pretrain_fixtures as fx

    checkpoint = fx.tiny_checkpoint(tmp_path / "checkpoint")
    chunks, spans = fx.build_corpus(tmp_path / "built", docs=40, max_len=48, shards=1)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path, name in ((chunks[0], "chunks"), (spans[0], "spans")):
        shutil.copy(path, corpus / f"{name}.parquet")
        shutil.copy(path.with_suffix(".manifest.json"), corpus / f"{name}.manifest.json")
    monkeypatch.setattr(pretrain_step_time, "make_checkpoint", lambda arch, folder: checkpoint)

    def tiny(objective, steps, compile_=False, unpad=False, accumulate=1):
        return fx.model_settings(objective, max_steps=steps, global_batch_size=4 * accumulate,
                                 micro_batch_size=4, log_every=1)

    monkeypatch.setattr(trainer_throughput, "settings_for", tiny)

    def printed(*argv):
        args = trainer_throughput.arguments().parse_args(
            ["run", "--corpus", str(corpus), "--objectives", "mlm", "--steps", "7", *argv])
        assert trainer_throughput.run(args) == 0
        return capsys.readouterr().out.splitlines()

    plain, profiled = printed(), printed("--profile", "--profile-steps", "2", "--workers", "1")
    assert not any("profile" in line for line in plain), plain
    rows = [json.loads(lines[0]) for lines in (plain, profiled)]
    assert rows[0].keys() == rows[1].keys()
    assert (rows[0]["workers"], rows[1]["workers"]) == (0, 1)  # the tiny settings', --workers
    assert rows[0]["steps_timed"] == rows[1]["steps_timed"] == 7 - trainer_throughput.WARMUP_STEPS
    table = [[line for line in lines if line.startswith("|")] for lines in (plain, profiled)]
    assert len(table[0]) == len(table[1]) == 3 and table[0][:2] == table[1][:2]

    report = json.loads(profiled[1])
    assert report["objective"] == "mlm"
    found = report["profile"]
    assert "error" not in found and found["gpu"] is None  # no CUDA device here
    host = found["host"]
    assert host["steps"] == trainer_throughput.HOST_STEPS
    assert {"fetch", "to device", "seed", "forward", "backward", "clip", "optimizer", "read",
            "log"} <= host["regions_ms"].keys()
    assert sum(host["regions_ms"].values()) == pytest.approx(host["step_ms"], rel=1e-3)
    assert host["regions_ms"]["forward"] > 0 and host["regions_ms"]["backward"] > 0
    assert found["profiled_host"]["steps"] == 2
    assert any(line.startswith("  mlm host, 3 steps unprofiled:") for line in profiled), profiled
    assert found["read_a_step_late"] is True

    # Each profiled window holds one step's queueing, the last one too: the trainer's last step
    # (read at once, nothing queued after it) comes after the profiled ones.
    one = json.loads(printed("--profile", "--profile-steps", "1")[1])["profile"]
    assert {"fetch", "forward", "backward", "read"} <= one["profiled_host"]["regions_ms"].keys()

    # --read-at-once: the same trainer with train.py's READ_A_STEP_LATE off inside it (the report
    # says so from there), its row named for it.
    at_once = printed("--read-at-once", "--profile", "--profile-steps", "1")
    assert json.loads(at_once[0])["objective"] == "mlm (read at once)"
    assert json.loads(at_once[1])["profile"]["read_a_step_late"] is False


# Every benchmark command the documents record (benchmarks/RESULTS.md, the README, the GPU runs'
# notes, the benchmarks' own usage lines) still parses with that benchmark's command line: a
# figure is only as good as the command that reproduces it.
COMMAND = re.compile(r"python3?\s+(benchmarks/(\w+)\.py)(.*)")
RECORDS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks/RESULTS.md",
           *sorted((ROOT / "benchmarks/gpu_runs").glob("*/README.md")),
           *sorted((ROOT / "benchmarks").glob("*.py"))]


def recorded_commands():
    """(where, script name, arguments) of each `python benchmarks/X.py ...` in the records: a
    trailing backslash continues it, a backtick, table bar or comment ends it; a usage line's
    optional [brackets] are read as given, `...` dropped, <placeholders> filled in."""
    for record in RECORDS:
        lines = record.read_text().splitlines()
        for number, line in enumerate(lines):
            found = COMMAND.search(line.replace("\\\\", "\\"))
            if not found:
                continue
            rest, following = found.group(3), number
            while rest.rstrip().endswith("\\") and following + 1 < len(lines):
                following += 1
                rest = rest.rstrip()[:-1] + " " + lines[following].replace("\\\\", "\\")
            while True:  # a quoted argument may go on over the next lines
                command = re.split(r"`|\||\s#\s|\s#$|\)$", rest)[0]
                command = re.sub(r"<[^>]*>", "placeholder", command)
                try:
                    words = shlex.split(command.replace("[", " ").replace("]", " "))
                    break
                except ValueError:
                    following += 1
                    rest += " " + lines[following]
            words = [w for w in words if "..." not in w]
            yield f"{record.relative_to(ROOT)}:{number + 1}", found.group(2), words


def test_every_recorded_benchmark_command_still_parses(monkeypatch):
    commands = list(recorded_commands())
    assert len(commands) > 50 and {name for _, name, _ in commands} >= {
        "pretrain_step_time", "scale", "trainer_throughput", "encode_and_search", "cpdae_js"}
    refused = [f"{where}: {name} {' '.join(words)} (exit {code})" for where, name, words in commands
               if (code := refusal(monkeypatch, name, words)) is not None]
    assert refused == [], "\n".join(refused)


# What the benchmarks take from this repository's own modules (the package, tests/'s helpers)
# still exists under that name: parsing a command (above) imports a benchmark, not the names it
# reaches after parse_args, inside its functions or in the code it hands a child process (a
# `python -c` string). When answers.top_k_accuracy moved to answer_accuracy.py (93bdea0), only
# a run of answer_matching.py would have found it still calling answers.top_k_accuracy.
PLACEHOLDER = re.compile(r"\{\w+(?:![rsa])?\}")  # a str.format field of a child's code


def repository_module(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.origin and Path(spec.origin).is_relative_to(ROOT))


def benchmark_code(path: Path):
    """The benchmark's syntax tree, then those of the Python strings it holds that parse."""
    tree = ast.parse(path.read_text())
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(
                r"^\s*(from \S+ )?import ", node.value, re.M):
            try:
                yield ast.parse(PLACEHOLDER.sub("None", node.value))
            except SyntaxError:  # prose: a docstring that mentions imports
                pass


def missing_names(path: Path) -> list[str]:
    """`file:line: what` for each name the benchmark imports from, or reads or sets on, one of
    the repository's modules (and classes reached through them) that is not there."""
    missing = []
    for tree in benchmark_code(path):
        names = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and repository_module(
                    node.module):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if hasattr(module, alias.name):
                        names[alias.asname or alias.name] = getattr(module, alias.name)
                    elif repository_module(f"{node.module}.{alias.name}"):
                        names[alias.asname or alias.name] = importlib.import_module(
                            f"{node.module}.{alias.name}")
                    else:
                        missing.append(f"{path.name}:{node.lineno}: from {node.module} import "
                                       f"{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if repository_module(alias.name):
                        bound = alias.name if alias.asname else alias.name.partition(".")[0]
                        importlib.import_module(alias.name)
                        names[alias.asname or bound] = importlib.import_module(bound)

        def resolve(node):
            if isinstance(node, ast.Name):
                return names.get(node.id)
            if isinstance(node, ast.Attribute):
                owner = resolve(node.value)
                if isinstance(owner, types.ModuleType | type):
                    if hasattr(owner, node.attr):
                        return getattr(owner, node.attr)
                    missing.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            return None

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                resolve(node)
    return sorted(set(missing))


BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_the_benchmarks_reach_only_names_the_repository_still_has():
    assert len(BENCHMARKS) > 20
    missing = [name for path in BENCHMARKS for name in missing_names(path)]
    assert missing == [], "\n".join(missing)


def test_a_moved_name_is_found_after_parse_args_and_in_a_childs_code(tmp_path):
    # answer_matching.py before 93bdea0 (answers.top_k_accuracy, read after parse_args), and
    # bert_native.py's child process code with a name the package never had.
    old = (ROOT / "benchmarks/answer_matching.py").read_text().replace(
        "answer_accuracy.top_k_accuracy(", "answers.top_k_accuracy(")
    child = (ROOT / "benchmarks/bert_native.py").read_text().replace(
        "encode.load_encoder(", "encode.load_encoders(")
    assert old.count("answers.top_k_accuracy(") == 1 and child.count("load_encoders(") == 1
    (tmp_path / "answer_matching.py").write_text(old)
    (tmp_path / "bert_native.py").write_text(child)
    assert [line.split(": ", 1)[1] for line in missing_names(tmp_path / "answer_matching.py")] == [
        "answers.top_k_accuracy"]
    assert [line.split(": ", 1)[1] for line in missing_names(tmp_path / "bert_native.py")] == [
        "encode.load_encoders"]


# benchmarks/gradient_cache.py: its --device plumbing on the CPU, and its GPU path (timing, peak
# memory, a row out of memory, the table) against stand-ins for torch.cuda's calls, so that a lent
# GPU's minutes do not find a typo in code only a GPU runs.
import gradient_cache  # noqa: E402

TINY = ["--arch", "minilm-l2", "--micro-batch", "4", "--group-size", "2", "--q-len", "8",
        "--p-len", "16", "--steps", "1"]


def test_gradient_cache_runs_on_the_cpu_with_its_device_and_chunks_options():
    done = subprocess.run([sys.executable, "benchmarks/gradient_cache.py", "--device", "cpu",
                           *TINY, "--chunks", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "workflow")})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("minilm-l2, micro-batch 4 queries x 2 passages, 8 / 16 tokens, CPU")
    assert [line.split(" | ")[0] for line in lines[3:5]] == ["| null", "| 2"]
    result = json.loads(lines[-1])
    assert result["args"]["device"] == "cpu" and result["args"]["chunks"] == [2]
    assert [row["cache_chunk"] for row in result["rows"]] == [None, 2]
    assert all(row["peak_mb"] > 0 and row["cpu_s"] > 0 for row in result["rows"])


class StandInEvent:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


@pytest.mark.parametrize("out_of_memory", [None, 0, 2])
def test_gradient_cache_gpu_path_times_measures_and_reports_a_row_out_of_memory(
        monkeypatch, out_of_memory):
    allocated = {"now": 1000 * 2**20, "peak": 0}
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: allocated.update(peak=allocated["now"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "stand-in GPU")
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    real_setup = gradient_cache.setup

    def setup(args, device):
        step, gradients_mb = real_setup(args, device)

        def stand_in_step(number, chunk):  # a step's peak: 100 MB a query of the chunk
            if chunk == out_of_memory and number == 1:  # after the warm-up
                step.optimizer.zero_grad()  # as the optimizer's state would be: set
                raise torch.cuda.OutOfMemoryError("stand-in")
            step(number, chunk)
            allocated["peak"] = max(allocated["peak"],
                                    allocated["now"] + 100 * 2**20 * (chunk or 4))

        stand_in_step.optimizer = step.optimizer
        return stand_in_step, gradients_mb

    monkeypatch.setattr(gradient_cache, "setup", setup)
    args = argparse.Namespace(**{k.removeprefix("--").replace("-", "_"): v for k, v in zip(
        TINY[::2], [TINY[1], *map(int, TINY[3::2])])})
    measured = json.loads(json.dumps(gradient_cache.on_gpu(args, [0, 1, 2], torch.device("cpu"))))
    report = gradient_cache.gpu_report(args, [0, 1, 2], measured)
    assert report[0].endswith("stand-in GPU, bf16 autocast, median of 1 steps")
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in report[3:6]}
    assert measured["oom"] == ([] if out_of_memory is None else [out_of_memory])
    for chunk, name in ((0, "null"), (1, "1"), (2, "2")):
        if chunk == out_of_memory:
            assert rows[name][1] == "out of memory"
            continue
        assert float(rows[name][1]) > 0
        assert rows[name][3] == f"{100 * (chunk or 4)}"  # above what was allocated before
        assert rows[name][5] == f"{1000 + 100 * (chunk or 4):,} |"
        if out_of_memory == 0:  # no uncached row to compare with
            assert rows[name][2] == "" and rows[name][4] == ""
        else:
            assert rows[name][4] == f"{(chunk or 4) / 4:.2f}"
    assert report[-1].startswith("of which the gradients: ")
