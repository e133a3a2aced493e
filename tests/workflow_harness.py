"""Run the real workflow on a throw-away copy of the project (so tests never touch ./results)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# What a fresh clone has, minus generated state; copying these makes a self-contained project.
_COPIED = ("Snakefile", "config.yaml", "rules", "workflow", "envs", "data", "profiles", "slurm")


def copy_project(dest: Path, config_overrides: dict | None = None) -> Path:
    """Copy the project into `dest`; deep-merge `config_overrides` into its config.yaml."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        elif source.exists():
            shutil.copy2(source, dest / name)
    if config_overrides:
        config = yaml.safe_load((dest / "config.yaml").read_text())
        _merge(config, config_overrides)
        (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def merged_configs(*paths: Path) -> dict:
    """The config Snakemake builds from these YAML files in order (`configfile:` then each
    `--configfile`): dicts merge key by key, lists and values replace."""
    config: dict = {}
    for path in paths:
        _merge(config, yaml.safe_load(Path(path).read_text()))
    return config


def local_dump(project: Path) -> Path:
    """A config file, to pass last, that reads the copied project's Wikipedia sample (source:
    local). A source=dumps experiment's parts are known only once the fetch_dumpstatus checkpoint
    ran, so its dry run plans no job past it (the statistics page, hence `all`, lists every
    article file); with this one it plans the whole DAG."""
    parts = yaml.safe_load((project / "config.yaml").read_text())["wikipedia"]["parts"]
    path = project / "local-dump.yaml"
    path.write_text(yaml.safe_dump({"wikipedia": {"source": "local", "parts": parts}}))
    return path


def _merge(base: dict, overrides: dict) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def start_snakemake(project: Path, *args: str, log: Path, nice: int = 0) -> subprocess.Popen:
    """Start this environment's snakemake in `project` in the background, output to `log`, its
    process tree at niceness `nice` (> 0: it takes only CPU time nothing else wants)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", *args],
                                cwd=project, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: os.nice(nice)) if nice else None)


# Each `snakemake` call below runs in a process forked from a fork server that has imported
# Snakemake's command line once per pytest worker: a dry run spends half of its ~1.5 CPU-seconds
# importing Snakemake (pandas, SQLAlchemy, its plugins), and the suite makes ~50 of them. The
# forked process then parses the workflow and runs or plans it exactly as `python -m snakemake`.
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(["snakemake.cli"])


def _snakemake_main(project: str, argv: list[str], env: dict[str, str], out: str, err: str):
    """`python -m snakemake *argv` in `project` with `env`, stdout to `out`, stderr to `err`
    (in a forked process: its exit status is Snakemake's, from the SystemExit of `main`)."""
    os.chdir(project)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    from snakemake import cli

    sys.argv = [str(Path(cli.__file__).with_name("__main__.py")), *argv]  # as `-m snakemake` sets it
    cli.main(argv)


def snakemake(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run this environment's snakemake in `project`; the output is returned for assertions."""
    argv = ["--cores", "2", *args]
    with tempfile.TemporaryDirectory() as logs:
        out, err = Path(logs, "stdout"), Path(logs, "stderr")
        run = _FORKS.Process(target=_snakemake_main,
                             args=(str(project), argv, _env(), str(out), str(err)))
        run.start()
        run.join()
        result = subprocess.CompletedProcess(
            [sys.executable, "-m", "snakemake", *argv], run.exitcode,
            out.read_text(), err.read_text(),
        )
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def planned_rules(project: Path, *targets: str) -> dict[str, int]:
    """The jobs a dry run would execute, as {rule: count} (parsed from the job-stats table)."""
    result = snakemake(project, "--dry-run", *targets)
    return plan_of(result.stdout + result.stderr)


def plan_of(output: str) -> dict[str, int]:
    """{rule: count} from a dry run's output (for a test that also reads the rest of it: a dry
    run of the demo DAG costs seconds of Snakemake's own parsing)."""
    counts: dict[str, int] = {}
    if "Job stats:" not in output:
        # An empty plan must be Snakemake saying so, not output this parser failed to read.
        assert "Nothing to be done" in output, f"unreadable dry-run output:\n{output}"
        return counts
    table = output.split("Job stats:", 1)[1]
    for line in table.splitlines()[3:]:  # skip the header and its rule of dashes
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit():
            break
        if fields[0] != "total":
            counts[fields[0]] = int(fields[1])
    return counts


def edit_config(project: Path, edit) -> str:
    """Apply `edit` (a function of the config dict) to the project's config.yaml; return the
    original text, for the caller to restore."""
    path = project / "config.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    edit(config)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return original


def _params_main(project: str, argv: list[str], env: dict[str, str], out: str, err: str,
                 dump: str):
    """_snakemake_main, writing each planned job's params (as Snakemake compares them for its
    `params` rerun trigger: the repr of each non-derived param) to `dump`, one JSON per line."""
    import json

    from snakemake import jobs

    log_info = jobs.Job.log_info

    def logged(job, *args, **kwargs):
        record = {"rule": job.rule.name, "output": sorted(map(str, job.output)),
                  "input": sorted(map(str, job.input)),
                  # What the trigger compares (params computed from input or output excluded).
                  "params": sorted(map(repr, job.non_derived_params)),
                  # What the `code` trigger compares (a shell rule's command as written).
                  "code": job.dag.workflow.persistence._code(job.rule),
                  "named": {name: repr(value) for name, value in job.params.items()}}
        with open(dump, "a") as file:
            file.write(json.dumps(record) + "\n")
        return log_info(job, *args, **kwargs)

    jobs.Job.log_info = logged
    _snakemake_main(project, argv, env, out, err)


def planned_params(project: Path, *targets: str) -> dict[tuple[str, str], dict]:
    """Every job of a dry run (with --forceall: finished jobs too), keyed by (rule, its outputs
    output): {"params": [what the trigger compares], "named": {name: repr},
    "input": [paths], "code": what the code trigger compares}. A job reruns when its params
    change."""
    import json

    argv = ["--cores", "2", "--dry-run", "--forceall", *targets]
    with tempfile.TemporaryDirectory() as logs:
        out, err, dump = (str(Path(logs, name)) for name in ("stdout", "stderr", "dump"))
        run = _FORKS.Process(target=_params_main, args=(str(project), argv, _env(), out, err, dump))
        run.start()
        run.join()
        if run.exitcode != 0:
            output = Path(out).read_text() + "\n" + Path(err).read_text()
            raise AssertionError(f"dry run failed:\n{output}")
        records = [json.loads(line) for line in Path(dump).read_text().splitlines()]
    return {(r["rule"], " ".join(r["output"])): r for r in records}
