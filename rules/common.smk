# Shared by every rule file: config validation, the Python package on the path, input functions.
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from retrieval_pretraining import code_deps  # noqa: E402
from retrieval_pretraining import config as experiment_config  # noqa: E402
from retrieval_pretraining import config_checks  # noqa: E402
from retrieval_pretraining import dataset_aliases  # noqa: E402
from retrieval_pretraining import references as config_references  # noqa: E402

config_checks.validate(config, workflow.overwrite_configfiles)
# A dataset alias ({name, same_as[, title]}) is its source's entry under its own name (and title
# mode, where it sets one) from here on, so every
# rule reads it as a full entry; DATASET_ALIASES ({alias: source}) says whose files it copies
# (rules/retrieval.smk `alias_dataset_file`) and what sees through it (in-domain checks).
DATASET_ALIASES = dataset_aliases.sources(config["datasets"])
# A shared corpus (datasets[].corpus.same_as) is its source's corpus files from here on too;
# CORPUS_SOURCES ({name: source}) says whose prepared corpus it copies (`share_dataset_corpus`).
CORPUS_SOURCES = dataset_aliases.corpus_sources(config["datasets"])
# An alias's own title mode where it differs from its collection's ({alias: {"title": mode}}):
# its encoders read it from its resolved entry; its dataset.json is written with it
# (rules/retrieval.smk `alias_dataset_info`) instead of copied.
ALIAS_OWN_SETTINGS = dataset_aliases.own_settings(config["datasets"])
config["datasets"] = dataset_aliases.resolve(config["datasets"])
# The splits and stages the sections name (a module no stage imports: no job's code input).
config_references.check(config)

# Every `python -m retrieval_pretraining.<stage>` runs the code of this checkout, whatever is installed.
PACKAGE_DIR = Path(workflow.basedir) / "workflow"
# (Braces are doubled because Snakemake formats the prefix like any shell command.)
shell.prefix(
    "set -euo pipefail; export PYTHONPATH="
    + str(PACKAGE_DIR)
    + "${{PYTHONPATH:+:$PYTHONPATH}}; "
)


wildcard_constraints:
    part="[A-Za-z0-9_.-]+",
    checkpoint="[A-Za-z0-9_.-]+",
    shard="[0-9]{4}",
    spans="[A-Za-z0-9_.-]+",
    corpus="[A-Za-z0-9_.-]+",
    model="[A-Za-z0-9_.-]+",


def module_source(*entries):
    """Every package file the entry modules run (their imports followed: code_deps.py), declared
    as inputs so that editing any of them reruns the rule and editing anything else does not.
    """
    # Plain paths, not workflow.source_path(): Snakemake records a source-cache path for those
    # whose temp folder changes every invocation, so reverting an edit would still rerun the rule.
    # config.py is run by every stage (argument parsing, path resolution), so it is always declared.
    files = code_deps.source_files(*entries, "config")
    return [str(workdir_relative(path)) for path in files]


def workdir_relative(path):
    """An absolute `path` relative to the working directory (the project root) where it lies
    inside it, else unchanged: what a rule declares as an input. Snakemake records each job's
    input paths as written and reruns the job when they differ, so an absolute path into the
    project changed with every move or copy of it and every job reran ("Set of input files has
    changed"). A path outside (a data_root elsewhere; the code, when --directory names another
    folder) does not move with the working directory, so it stays absolute.
    """
    # Snakemake parses the workflow in the working directory (--directory's, when given).
    try:
        return Path(path).relative_to(Path.cwd())
    except ValueError:
        return Path(path)


def config_path(path):
    """A path from the config, resolved inside the project or data_root (refused elsewhere:
    config.resolve_path), as a rule input (workdir_relative)."""
    return workdir_relative(experiment_config.resolve_path(path, config["data_root"]))


def data_root_option():
    """`--data-root D` for stages that resolve config paths, or "" when no data root is set."""
    root = config["data_root"]
    return f"--data-root {shlex.quote(root)}" if root else ""


def conda_env(toolchain):
    """envs/<toolchain>.yaml for a rule's `conda:` (used with --software-deployment-method conda):
    "torch" (every Python stage, CUDA torch), "faiss" (faiss-gpu: index, mining, dense search),
    "pyserini" (BM25, OpenJDK 21). Without that flag the rule runs in Snakemake's own environment.
    Every rule that runs `python -m retrieval_pretraining...` names one, local rules included
    (tests/test_environments.py checks it against the modules each environment provides for).
    """
    return str(Path(workflow.basedir) / "envs" / f"{toolchain}.yaml")


def stage_config(*keys):
    """The JSON-serialised config slice a rule passes to its module (only what that stage reads)."""
    node = config
    for key in keys:
        node = node[key]
    return experiment_config.stage_argument(node)


def named(section, name):
    """The entry called `name` in a config list of named entries (checkpoints, spans, models)."""
    entries = section if isinstance(section, list) else config[section]
    for entry in entries:
        if entry["name"] == name:
            return entry
    raise ValueError(f"no entry named {name!r} in {section!r}")


def bm25_settings(dataset):
    """The bm25 slice for one dataset: shared settings with its `overrides` entry applied
    (used by the BM25 rules and by the report, which labels each BM25 cell with its k1/b).
    """
    settings = {
        k: v for k, v in config["bm25"].items() if k not in ("negatives", "overrides")
    }
    for override in config["bm25"].get("overrides", []):
        if override["dataset"] == dataset:
            settings |= {k: v for k, v in override.items() if k != "dataset"}
    return settings


def mining_settings(dataset):
    """The mining policy for one dataset: the section's policy keys with its `overrides` entry
    applied (references.mining_policy, the one the parse-time check validates)."""
    return config_references.mining_policy(config, dataset)


def shard_ids():
    return [f"{i:04d}" for i in range(config["corpus"]["shards"])]


def all_targets():
    """What `rule all` builds: the tables and analyses (which pull in every stage), plus the
    audits of the span indexes they read (reported_span_indexes: an audit reads a whole index).
    Call from an input function: the dump's parts may come from a checkpoint.
    """
    return report_targets() + [
        f"results/corpus/{corpus}/spans/{spans}/{audit}"
        for corpus, spans in reported_span_indexes()
        for audit in ("lengths.png", "sample.md")
    ]


def span_indexes():
    """(corpus, spans) pairs a spans entry is built on: the corpora of the models that use it, or
    `pretrain.corpus` when no model does (the paper's ablation indexes, built when named as a
    target; `all` builds and audits only reported_span_indexes()).
    """
    pairs = []
    for entry in config["spans"]:
        users = [
            pretrain_settings(m["name"])
            for m in config["pretrain"]["models"]
            if m.get("spans") == entry["name"] and m["objective"] == "costa"
        ]
        corpora = [c["name"] for s in users for c in s["corpora"]]
        for corpus in dict.fromkeys(corpora or [config["pretrain"]["corpus"]]):
            pairs.append((corpus, entry["name"]))
    return pairs
