"""The shipped Slurm profile against a real one-node Slurm cluster (tests/slurm_cluster.py).

The workflow runs through `--profile slurm` exactly as shipped; the test adds only what a real site
changes: a second profile with the status command (no accounting database here, so `squeue`), a
short first status check, the small experiment instead of the paper one, and a copy of the workflow
profile whose requests are capped to this 2-CPU node (GPU counts stay > 0). Then:
- every non-local job of the plan went through sbatch (slurmctld's own job records say so),
- GPU rules asked Slurm for GPUs and CPU rules did not,
- the outputs equal those of a plain local run of the same targets;
and a trainer job that Slurm requeues mid-run (SIGTERM to its step, as before a preemption) resumes
from its checkpoint and ends with the weights of an uninterrupted run.

Needs root and apt (Debian's slurm packages are installed when missing and purged again after);
skipped with the reason otherwise. Marked `slurm`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402
import workflow_harness  # noqa: E402

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
# The small experiment's targets: CPU stages (extraction, chunking) and one trained encoder (a GPU
# rule), whose job is requeued mid-run. Every job is a Slurm job chained on the previous one's
# outputs, and each link costs a status poll (its interval grows by 10 s per poll that sees no
# change), so the chain stays as short as what it proves: CPU and GPU requests, a requeue.
TRAINED_MODEL = "mlm"
TARGETS = [
    "results/wikipedia/articles/enwiki-sample.parquet",
    "results/corpus/wikipedia/chunks/shard-0000.parquet",
    "results/corpus/wikipedia/chunks/shard-0001.parquet",
    f"results/pretrain/{TRAINED_MODEL}/encoder",
]
STATE = f"results/state/pretrain/{TRAINED_MODEL}"
# Small trainer steps (2 chunks each) so the run takes well under a minute on 2 shared cores; a
# resumable state every 2 steps gives the requeue something to resume from.
CONFIG_OVERRIDES: dict = {
    "pretrain": {
        "trainer": {
            "max_steps": 8, "checkpoint_every": 2, "num_workers": 0,
            "global_batch_size": 2, "micro_batch_size": 2,
        }
    }
}  # fmt: skip
# Values that legitimately differ between two runs (clock, speed, where a run resumed): these keys
# and any key naming a duration or a rate.
VOLATILE_KEYS = {"created", "memory_mb", "resumed_from_step", "input_wait_share"}
VOLATILE_KEY = re.compile(r"(seconds|_per_s|elapsed|duration)")
GPU_RULES = {
    "pretrain_model", "finetune_stage1", "finetune_stage2", "encode_corpus_shard",
    "mine_hard_negatives", "dense_search",
}  # fmt: skip
# Requests capped to the test node (the "limits" a real site would not need to touch).
NODE_CAPS = {"gpu": 1, "cpus_per_gpu": 1, "mem_mb": 3000, "runtime": 30}
MAX_THREADS = 2


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="slurm-test-"))
    root.chmod(0o755)  # munged runs as `munge` and must traverse into the cluster folder
    try:
        running = slurm_cluster.start(root / "cluster")
    except slurm_cluster.ClusterUnavailable as error:
        subprocess.run(["rm", "-rf", str(root)], check=False)
        pytest.skip(f"no Slurm cluster possible here: {error}")
    except BaseException:
        subprocess.run(["rm", "-rf", str(root)], check=False)
        raise
    try:
        yield running
    finally:
        slurm_cluster.stop(running)
        subprocess.run(["rm", "-rf", str(root)], check=False)


def capped_workflow_profile(project: Path, dest: Path) -> Path:
    """The shipped workflow profile with each request capped to what the test node has."""
    profile = yaml.safe_load((project / "profiles" / "default" / "config.yaml").read_text())
    for resources in profile.get("set-resources", {}).values():
        for key, cap in NODE_CAPS.items():
            if key in resources:
                resources[key] = min(int(resources[key]), cap)
    for rule, threads in profile.get("set-threads", {}).items():
        profile["set-threads"][rule] = min(int(threads), MAX_THREADS)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "profile.yaml").write_text(yaml.safe_dump(profile))
    return dest


def site_override_profile(project: Path, dest: Path) -> Path:
    """What this test site changes on top of the shipped slurm/ profile (and nothing else)."""
    dest.mkdir(parents=True, exist_ok=True)
    override = {
        "configfile": str(project / "config.yaml"),  # the small experiment, not the paper one
        "slurm-status-command": "squeue",  # no accounting database on this cluster
        # MinJobAge (300 s) must exceed 3 x this; short so the test does not idle.
        "slurm-init-seconds-before-status-checks": 2,
        "latency-wait": 5,
    }
    (dest / "profile.yaml").write_text(yaml.safe_dump(override))
    return dest


def start_on_slurm(cluster: slurm_cluster.Cluster, project: Path, log: Path) -> subprocess.Popen:
    """`snakemake --profile slurm` (+ the site override and the capped workflow profile)."""
    wf_profile = capped_workflow_profile(project, project.parent / f"{project.name}-wfprofile")
    site = site_override_profile(project, project.parent / f"{project.name}-site")
    env = dict(
        cluster.env, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    command = [
        sys.executable, "-m", "snakemake", "--profile", "slurm", "--profile", str(site),
        "--workflow-profile", str(wf_profile), *TARGETS,
    ]  # fmt: skip
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)


def local_rules(project: Path) -> set[str]:
    """Rules marked `localrule: True` in the rule files (they never go to Slurm)."""
    names = set()
    for smk in (project / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=(?:rule|checkpoint) )", smk.read_text()):
            match = re.match(r"(?:rule|checkpoint) (\w+):", block)
            if match and re.search(r"^\s+localrule:\s*True", block, re.MULTILINE):
                names.add(match.group(1))
    return names


def submitted_jobs(cluster: slurm_cluster.Cluster) -> list[dict[str, str]]:
    """slurmctld's record of each job: the plugin puts `rule_<name>[_wildcards_...]` in Comment."""
    jobs = []
    for job in cluster.jobs():
        match = re.match(r"rule_(\w+?)(?:_wildcards_|$)", job.get("Comment", ""))
        if match:
            jobs.append({**job, "rule": match.group(1)})
    return jobs


def _strip(value, about_a_manifest: bool = False):
    """Drop volatile fields; a checksum or size OF a manifest is volatile too (manifests carry
    their creation time), while checksums of data files are kept."""
    if isinstance(value, dict):
        return {
            k: _strip(v, about_a_manifest or "manifest" in k) for k, v in value.items()
            if k not in VOLATILE_KEYS and not VOLATILE_KEY.search(k)
            and not (about_a_manifest and k in ("sha256", "bytes"))
            and not k.endswith("manifest_sha256")
        }  # fmt: skip
    if isinstance(value, list):
        return [_strip(v, about_a_manifest) for v in value]
    return value


def _close(a, b, path: str = "") -> None:
    """Equal, with floats compared to a relative 1e-5 (training on another process layout)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-7), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_content(ours: Path, reference: Path) -> None:
    """Tables by value, weights by value, JSON without clock/speed fields, the rest byte for byte."""
    if ours.suffix == ".parquet":
        assert pq.read_table(ours).equals(pq.read_table(reference)), ours
    elif ours.suffix == ".safetensors":
        from safetensors.numpy import load_file

        a, b = load_file(ours), load_file(reference)
        assert sorted(a) == sorted(b), ours
        for name in a:
            difference = float(abs(a[name].astype("float64") - b[name]).max()) if a[name].size else 0
            assert difference <= 1e-5, f"{ours}: {name} differs by {difference}"
    elif ours.suffix == ".json":
        _close(_strip(json.loads(ours.read_text())), _strip(json.loads(reference.read_text())), ours.name)
    elif ours.suffix == ".jsonl":
        rows = [_strip(json.loads(line)) for line in ours.read_text().splitlines() if line.strip()]
        expected = [_strip(json.loads(l)) for l in reference.read_text().splitlines() if l.strip()]
        _close(rows, expected, ours.name)
    else:
        assert ours.read_bytes() == reference.read_bytes(), ours


def result_files(project: Path) -> dict[str, Path]:
    """Every artifact under results/, minus logs, timings and pictures (same numbers, but PNG
    bytes are not a promise) and the resume state (deleted by a finished run anyway)."""
    files = {}
    for path in (project / "results").rglob("*"):
        relative = path.relative_to(project).as_posix()
        skipped = ("results/logs/", "results/benchmarks/", "results/state/")
        if (
            path.is_file() and not relative.startswith(skipped)
            and path.name != ".snakemake_timestamp" and path.suffix != ".png"
        ):  # fmt: skip
            files[relative] = path
    return files


@pytest.fixture(scope="module")
def runs(cluster):
    """The targets run twice: on Slurm (the trainer's job requeued once it has saved a resumable
    state, as Slurm does when it preempts: SIGTERM, back to the queue, start again) and locally."""
    base = Path(tempfile.mkdtemp(prefix="slurm-run-"))
    local_run = None
    try:
        on_slurm = workflow_harness.copy_project(base / "slurm", CONFIG_OVERRIDES)
        local = workflow_harness.copy_project(base / "local", CONFIG_OVERRIDES)
        for project in (on_slurm, local):  # rules name their conda env files (`conda:`)
            if not (project / "envs").exists():
                shutil.copytree(ROOT / "envs", project / "envs")
        plan = workflow_harness.planned_rules(on_slurm, *TARGETS)
        expected = {rule: n for rule, n in plan.items() if rule not in local_rules(on_slurm)}

        started = time.monotonic()
        log = base / "snakemake-slurm.log"
        run = start_on_slurm(cluster, on_slurm, log)
        # The local reference run meanwhile, niced: the Slurm run mostly waits on status polls,
        # and a job that ends a few seconds late waits for the next poll (10 s more apart each
        # time), so the reference run takes only the CPU time the Slurm jobs leave.
        local_run = workflow_harness.start_snakemake(local, *TARGETS, log=base / "snakemake-local.log",
                                                     nice=10)
        requeued = None
        try:
            while run.poll() is None and time.monotonic() - started < 420:
                if requeued is None and any((on_slurm / STATE).rglob("step-*")):
                    running = [
                        j for j in submitted_jobs(cluster)
                        if j["rule"] == "pretrain_model" and j["JobState"] == "RUNNING"
                    ]  # fmt: skip
                    if running:
                        requeued = running[0]["JobId"]
                        cluster.run("scontrol", "requeue", requeued)
                time.sleep(0.5)
            returncode = run.wait(timeout=60)
        finally:
            if run.poll() is None:
                run.terminate()
                run.wait()
        slurm_seconds = time.monotonic() - started
        assert returncode == 0, (
            f"snakemake --profile slurm failed ({returncode}):\n{log.read_text()[-8000:]}\n"
            f"slurmctld:\n{cluster.log('slurmctld')[-3000:]}"
        )
        jobs = submitted_jobs(cluster)  # MinJobAge keeps them 300 s
        assert local_run.wait(timeout=600) == 0, (base / "snakemake-local.log").read_text()[-8000:]
        print(f"slurm run {slurm_seconds:.0f} s; jobs {[(j['rule'], j['JobId']) for j in jobs]}")
        yield {
            "on_slurm": on_slurm, "local": local, "expected": expected, "jobs": jobs,
            "requeued": requeued, "log": log.read_text(),
        }  # fmt: skip
    finally:
        if local_run is not None and local_run.poll() is None:
            local_run.terminate()
            local_run.wait()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_every_cluster_job_went_through_sbatch(runs):
    counts: dict[str, int] = {}
    for job in runs["jobs"]:
        counts[job["rule"]] = counts.get(job["rule"], 0) + 1
        assert job["JobState"] == "COMPLETED", f"{job['rule']}: {job['JobState']}"
    assert runs["expected"], "the targets plan no cluster job at all"
    assert counts == runs["expected"], (
        f"jobs seen by Slurm {counts} != non-local jobs planned {runs['expected']}\n"
        f"{runs['log'][-3000:]}"
    )


def test_gpu_rules_requested_gpus_and_cpu_rules_did_not(runs):
    gpu_jobs = [j for j in runs["jobs"] if j["rule"] in GPU_RULES]
    assert gpu_jobs, "no GPU rule among the targets: the GPU request is untested"
    for job in runs["jobs"]:
        tres = job.get("TresPerJob", "") + job.get("TresPerNode", "")
        if job["rule"] in GPU_RULES:
            assert "gres:gpu" in tres, f"GPU rule {job['rule']} requested no GPU: {job}"
            assert job["Partition"] == "gpu", job  # picked from the profile's partition list
        else:
            assert "gpu" not in tres, f"CPU rule {job['rule']} requested a GPU: {tres}"
            assert job["Partition"] == "cpu", job


METRICS = f"results/pretrain/{TRAINED_MODEL}/metrics.jsonl"


def _rows(path: Path) -> list[dict]:
    return [_strip(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def test_outputs_equal_a_local_run(runs):
    ours, reference = result_files(runs["on_slurm"]), result_files(runs["local"])
    assert sorted(ours) == sorted(reference)
    assert any(name.endswith("model.safetensors") for name in ours)
    failures = []
    for name in ours:
        try:
            if name == METRICS:  # full history: see the test below; each logged step must agree
                by_step = {row["step"]: row for row in _rows(reference[name])}
                for row in _rows(ours[name]):
                    _close(row, by_step.get(row["step"]), f"{name} step {row['step']}")
            else:
                assert_same_content(ours[name], reference[name])
        except AssertionError as error:
            failures.append(f"{name}: {str(error).splitlines()[0]}")
    assert not failures, "outputs differ from the local run:\n" + "\n".join(failures)


def test_requeued_trainer_keeps_the_whole_metrics_history(runs):
    ours = _rows(runs["on_slurm"] / METRICS)
    reference = _rows(runs["local"] / METRICS)
    assert [row["step"] for row in ours] == [row["step"] for row in reference]


def test_requeued_trainer_resumed_from_its_checkpoint(runs):
    assert runs["requeued"], "the trainer finished before it could be requeued (make it longer)"
    record = next(j for j in runs["jobs"] if j["JobId"] == runs["requeued"])
    assert record["JobState"] == "COMPLETED" and int(record["Restarts"]) >= 1, record
    encoder = runs["on_slurm"] / f"results/pretrain/{TRAINED_MODEL}/encoder"
    training = json.loads((encoder / "training.json").read_text())
    assert training["resumed_from_step"] > 0, (
        f"the requeued job trained from scratch instead of resuming: {training}"
    )
    # ... and still ended with the uninterrupted run's weights (test_outputs_equal_a_local_run).


