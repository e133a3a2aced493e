"""Every flag a planned job's shell command passes to a module of ours is one its parser declares.

The demo and the end-to-end run execute only the rules and options the demo config reaches; a
rule, or a `{params.x}` that expands to flags, that only a paper-scale experiment plans could pass
a flag a module renamed or dropped, and a cluster run would stop at hour ten with argparse's
`unrecognized arguments`. So each shipped experiment, and each overlay on the files the README
and its own header put before it, is planned with `snakemake -n -p -- all` (no job runs), with
`workflow_harness.local_dump` last, so that the Wikipedia jobs past the dump's checkpoint are
planned too, and FEWER_SHARDS (a shard count multiplies jobs, never flags); the checkpoint itself
is planned alone. In each job's command as Snakemake formats it, every
`python -m retrieval_pretraining.X` (for `launch` and `claim_run`: their own flags, then the
`--module` they start with the arguments after their `--`) names a module that exists, and every
flag it passes is an `add_argument` option of that module, read by `ast`; of a module with
subcommands (`download fetch`, `download dumpstatus`), the first word that is not a flag names
one, and the flags are that subcommand's parser's or the parent's
(test_doc_references.rejected, the reading the documented commands get). Another program's
flags (cp, torchrun's own) are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_doc_references import PASSED_ON, module_file, rejected
from test_finetune_rules import planned_jobs
from workflow_harness import ROOT, copy_project, local_dump

EXPERIMENTS = ROOT / "workflow" / "experiments"
# The config files of each run, in --configfile order; () is the demo (config.yaml alone).
# Overlays go on what their header and the README put before them.
RUNS = {
    "demo": (),
    "small": ("small.yaml",),
    "paper": ("paper.yaml",),
    "paper+ablations": ("paper.yaml", "ablations.yaml"),
    "paper+bow": ("paper.yaml", "bow.yaml"),
    "paper+bow+bow-recipe": ("paper.yaml", "bow.yaml", "bow-recipe.yaml"),
}
# Two span and two encoding shards, not paper.yaml's 64 and 8: a dry run of paper.yaml plans 907
# jobs, not 1,719 (984 of them encode_corpus_shard), in half the time; still more than one shard.
FEWER_SHARDS = {"corpus": {"shards": 2}, "finetune": {"shards": 2}}
# Modules that start another module of ours: `--module retrieval_pretraining.Y ... -- <Y's args>`.
LAUNCHERS = ("launch", "claim_run")
PACKAGE_MODULE = re.compile(r"retrieval_pretraining\.(\w+(?:\.\w+)*)")
# A shell token that ends a command: a control operator or a redirection (`&> log`, `) &> log`).
COMMAND_END = re.compile(r"^(?:&&|\|\||[;|&)]|[0-9]*>|&>)")


def commands(args: list[str]) -> list[tuple[str, list[str]]]:
    """(module, its arguments) for each `-m retrieval_pretraining.X ...` of a job's command (split
    by shlex, so a quoted `--config` JSON is one word), up to the word that ends it."""
    found = []
    for i, word in enumerate(args[:-1]):
        if word != "-m" or not args[i + 1].startswith("retrieval_pretraining"):
            continue
        rest = []
        for arg in args[i + 2:]:
            if COMMAND_END.match(arg):
                break
            rest.append(arg.removesuffix(")"))
            if arg.endswith(")"):  # `(cp a b && python -m ... --out c) &> log`
                break
        found.append((args[i + 1], rest))
    return found


def mismatches(module: str, rest: list[str]) -> list[str]:
    """What in one command no parser of ours accepts: a module that does not exist, a flag its
    parser does not declare, a subcommand it does not have (test_doc_references.rejected); a
    launcher's own flags and then its `--module`'s."""
    match = PACKAGE_MODULE.fullmatch(module)
    path = module_file(match.group(1)) if match else None
    if path is None or not path.is_file():
        return [f"{module}: no such module"]
    name = match.group(1)
    if name in PASSED_ON:
        return []
    own, passed = rest, []
    if name in LAUNCHERS:
        end = rest.index("--") if "--" in rest else len(rest)
        own, passed = rest[:end], rest[end + 1:]
        started = own[own.index("--module") + 1] if "--module" in own[:-1] else None
        if started is None:
            return [f"{module}: no --module"]
    problems = [f"{module} {problem}" for problem in rejected(path, own)]
    if name in LAUNCHERS:
        problems += mismatches(started, passed)
    return problems


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    project = copy_project(tmp_path_factory.mktemp("rule-flags") / "project")
    (project / "fewer-shards.yaml").write_text(yaml.safe_dump(FEWER_SHARDS))
    return project


def test_every_shipped_experiment_is_planned():
    """A new file under workflow/experiments is checked too: it joins RUNS."""
    planned = {name for files in RUNS.values() for name in files}
    assert planned == {path.name for path in EXPERIMENTS.glob("*.yaml")}


def undeclared(jobs: list[dict]) -> dict[str, str]:
    """{what no parser accepts: where} over the commands of `jobs` (planned_jobs), and how many
    commands of ours they ran."""
    problems: dict[str, str] = {}
    for job in jobs:
        for module, rest in commands(job["args"]):
            for problem in mismatches(module, rest):
                where = ", ".join([f"rule {job['rule']}"] + [
                    f"{key}={value}" for key, value in job["wildcards"].items()])
                problems.setdefault(problem, f"{problem} (first in {where})")
    return problems


@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", RUNS)
def test_every_flag_a_planned_job_passes_is_declared(project, run):
    files = [str(EXPERIMENTS / name) for name in RUNS[run]]
    jobs = planned_jobs(project, "--configfile", *files, str(local_dump(project)),
                        str(project / "fewer-shards.yaml"), "--", "all")
    # The extraction still finds the commands: pre-training, fine-tuning and search among them.
    rules = {job["rule"] for job in jobs}
    assert sum(len(commands(job["args"])) for job in jobs) > 50
    assert {"pretrain_model", "finetune_stage1", "dense_search", "make_tables"} <= rules, rules
    problems = undeclared(jobs)
    assert not problems, f"{run} ({' '.join(RUNS[run]) or 'config.yaml'}): no such option in " \
        "the command's parser:\n" + "\n".join(problems.values())


def test_the_dump_status_fetch_passes_declared_flags(project):
    """paper.yaml reads the dump's part list from the mirror (source: dumps): the fetch_dumpstatus
    checkpoint, which the runs above (on the local sample) never plan. The parts it lists are
    fetched by download_dump_part's command, planned above for a local part, whose flags
    (_fetch_flags: --url, the checksum, --size) are the same."""
    jobs = planned_jobs(project, "--configfile", str(EXPERIMENTS / "paper.yaml"), "--",
                        "results/wikipedia/dumpstatus.json")
    assert [job["rule"] for job in jobs] == ["fetch_dumpstatus"]
    assert [module for module, _ in commands(jobs[0]["args"])] == [
        "retrieval_pretraining.download"]
    assert not undeclared(jobs), undeclared(jobs)
