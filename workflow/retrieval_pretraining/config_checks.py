"""The whole experiment config checked, where Snakemake parses the workflow (rules/common.smk):
the schema composed from one fragment per section (`schemas/<section>.schema.yaml`, so each stage
documents its own keys next to the others), then what one fragment cannot say (cross_check), then
advisories. A bad value fails before any job runs, with a message that names the key and what is
allowed.

Parse time only: no stage imports this module, so it is no rule's code input (code_deps), and
correcting a check, a message or a published number reruns no job. What a stage reads of its config
when it runs (its slice's parser, ConfigError, path resolution, its own unknown-key check) is
config.py, every rule's code input.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema

from . import corpora, dataset_aliases, paper_numbers, schema_messages
from .config import PROJECT_ROOT, SCHEMA_DIR, STAGE_PATTERN, ConfigError, _read_yaml


# The shipped overlays (workflow/experiments/) and the files each is passed after, in order, as its
# header comment's command names them (tests/test_config.py keeps the two equal). Given without
# them, an overlay fails validation on keys only they define ("'t3' is not a spans entry"): the
# error then names the command (overlay_hints).
EXPERIMENTS = PROJECT_ROOT / "workflow" / "experiments"
OVERLAYS = {
    "ablations.yaml": ("paper.yaml",),
    "bow.yaml": ("paper.yaml",),
    "bow-recipe.yaml": ("paper.yaml", "bow.yaml"),
}


class ConfigWarning(UserWarning):
    """A config that runs, but whose meaning can change between runs (advisories)."""


def load_schema() -> dict[str, Any]:
    """The whole-config schema: `schemas/root.schema.yaml` plus one fragment per section."""
    root = _read_yaml(SCHEMA_DIR / "root.schema.yaml")
    for fragment in sorted(SCHEMA_DIR.glob("*.schema.yaml")):
        section = fragment.name.removesuffix(".schema.yaml")
        if section == "root":
            continue
        root["properties"][section] = _read_yaml(fragment)
        root.setdefault("required", []).append(section)
    return root


def _strict_integer(checker, instance) -> bool:
    # JSON Schema counts 2.0 as an integer; a config value of 2.0 for a count is a typo that would
    # fail later inside a stage (range(2.0)) without the key, so only whole-number literals pass.
    return isinstance(instance, int) and not isinstance(instance, bool)


# The validator every config check uses: Draft 2020-12 with integers that are ints.
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)


def _branch_errors(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """For `anyOf`/`oneOf` (a block that may be null, a value that may be one of several shapes):
    the errors of the branches the value was meant for, i.e. all but those saying the value itself
    has another type, so that a misspelled key inside a nullable block is named."""
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return [error]
    meant = [e for e in error.context if not (e.validator == "type" and not e.relative_path)]
    if not meant:
        return [error]
    return [leaf for e in meant for leaf in _branch_errors(e)]


def _describe(error: jsonschema.ValidationError) -> str:
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    schema = error.schema if isinstance(error.schema, dict) else {}
    allowed = ""
    if error.validator == "type" and error.validator_value == "integer":
        allowed = "; write a whole number, without a decimal point"
    elif "enum" in schema:
        allowed = f"; allowed values: {', '.join(map(str, schema['enum']))}"
    elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        allowed = f"; {error.validator} is {error.validator_value}"
    elif error.validator == "additionalProperties" and "properties" in schema:
        allowed = f"; known keys: {', '.join(sorted(schema['properties']))}"
    elif error.validator == "pattern" and "description" in schema:
        allowed = f"; {schema['description']}"  # a regular expression alone says not why
    return f"config key '{key}': {error.message}{allowed}"


def validate(config: dict[str, Any], configfiles: Iterable[str | Path] = ()) -> dict[str, Any]:
    """Raise ConfigError listing every violation; return the config unchanged when valid.
    `configfiles`: the command line's --configfile files, in order (overlay_hints)."""
    validator = Validator(load_schema())
    errors = [leaf for e in validator.iter_errors(config) for leaf in _branch_errors(e)]
    errors.sort(key=lambda e: list(map(str, e.absolute_path)))
    unknown = schema_messages.unknown_keys(config, errors)
    # Where a key is unknown to every shape, that one line stands for the shapes' complaints
    # (a branch's, `parent` set: its unexpected and missing keys); the rest are still said.
    messages = list(dict.fromkeys(
        unknown[path] if path in unknown and (e.validator == "additionalProperties" or e.parent)
        else _describe(e)
        for e in errors for path in [tuple(e.absolute_path)]))
    if not messages:  # cross-checks assume the shapes the schema guarantees
        messages = _alias_mistakes(config) or cross_check(_resolved(config))
    if messages:
        messages += overlay_hints(configfiles)
        raise ConfigError("invalid config:\n  " + "\n  ".join(messages))
    for advice in advisories(config):
        warnings.warn(advice, ConfigWarning, stacklevel=2)
    return config


def overlay_hints(configfiles: Iterable[str | Path]) -> list[str]:
    """One line for each shipped overlay among `configfiles` given without the files it is passed
    after (OVERLAYS), in that order before it: the command to use. Only this project's files
    (by resolved path); a copy elsewhere may be a whole config."""
    given = [Path(f).resolve() for f in configfiles]
    hints = []
    for position, path in enumerate(given):
        if path.parent != EXPERIMENTS or path.name not in OVERLAYS:
            continue
        needed = iter(given[:position])
        if all(EXPERIMENTS / name in needed for name in OVERLAYS[path.name]):
            continue  # each needed file before it, in order (`in` consumes the iterator)
        names = OVERLAYS[path.name]
        command = " ".join(_shown(EXPERIMENTS / name) for name in (*names, path.name))
        hints.append(f"{_shown(path)} is an overlay on {' and '.join(names)}: pass "
                     f"--configfile {command}")
    return hints


def _shown(path: Path) -> str:
    """`path` relative to the working directory where it lies below it, else absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def advisories(config: dict[str, Any]) -> list[str]:
    """What is allowed but worth a warning: a Hub checkpoint with `revision: null` is `main`,
    which moves; the commit staged is recorded, so the run can be pinned afterwards (with its
    staging metadata cleaned: pinning changes the staging rules' params, not their bytes)."""
    messages = []
    for i, entry in enumerate(config.get("checkpoints") or []):
        if entry["source"] == "hub" and entry.get("revision") is None:
            name = entry["name"]
            messages.append(
                f"config key 'checkpoints.{i}.revision': '{name}' is fetched from the Hub's "
                "`main`, which can move; the commit staged is recorded as stats.resolved_revision "
                f"in results/checkpoints/{name}/manifest.json (and results/tokenizers/{name}/): "
                "set revision to that 40-hex commit to pin it, then run `snakemake "
                f"--cleanup-metadata results/checkpoints/{name} results/tokenizers/{name}` so "
                "that the changed params of the same bytes do not restage them and rerun every "
                "job after them"
            )
    return messages


def _alias_mistakes(config: dict[str, Any]) -> list[str]:
    """Dataset aliases (`same_as`) that name no earlier entry (dataset_aliases.problems)."""
    return dataset_aliases.problems(config["datasets"])


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """The config with each dataset alias as its source's entry under its own name (what the
    rules read), and `dataset_aliases`: {alias: source} for the checks that must see through one."""
    datasets = config["datasets"]
    return config | {"datasets": dataset_aliases.resolve(datasets),
                     "dataset_aliases": dataset_aliases.sources(datasets)}


def _names(entries: list[dict[str, Any]] | None) -> list[str]:
    return [entry["name"] for entry in entries or []]


def cross_check(config: dict[str, Any]) -> list[str]:
    """What one schema fragment cannot say: bounds that must be ordered, names that must exist.

    Checked at parse time so a typo fails before any job runs, not hours later in the stage.
    """
    messages = []
    for section in ("checkpoints", "spans", "datasets"):
        names = _names(config.get(section))
        for name in sorted({n for n in names if names.count(n) > 1}):
            messages.append(f"config key '{section}': the name '{name}' is used twice")
    models = _names(config["pretrain"]["models"])
    for name in sorted({n for n in models if models.count(n) > 1}):
        messages.append(f"config key 'pretrain.models': the name '{name}' is used twice")
    # One entry per dataset where the rules read the first entry naming it (finetune_entry,
    # bm25_negatives_entry, zero_shot_source): a second one's settings would be ignored unsaid.
    for key, entries in (("finetune.datasets", config["finetune"]["datasets"]),
                         ("bm25.negatives", config["bm25"].get("negatives") or []),
                         ("evaluate.zero_shot", config["evaluate"].get("zero_shot") or [])):
        first: dict[str, int] = {}
        for i, entry in enumerate(entries):
            dataset = entry["dataset"]
            if dataset in first:
                messages.append(
                    f"config key '{key}.{i}.dataset': '{dataset}' has an entry already "
                    f"({key}.{first[dataset]}), the one the rules read; merge the two")
            first.setdefault(dataset, i)
    for i, entry in enumerate(config["datasets"]):
        splits = _names(entry.get("splits"))
        for name in sorted({n for n in splits if splits.count(n) > 1}):
            messages.append(f"config key 'datasets.{i}.splits': the split '{name}' is listed twice")

    for i, entry in enumerate(config["datasets"]):
        if entry.get("titles") and entry["format"] != "msmarco":
            messages.append(
                f"config key 'datasets.{i}.titles': a titles file is joined onto MS MARCO "
                f"collections only (format msmarco; {entry['format']} corpora carry their own "
                "titles, and it would be ignored); remove it"
            )
        if entry["format"] == "beir":  # a BEIR folder's layout names a split's files
            for j, split in enumerate(entry.get("splits") or []):
                for key in ("queries", "qrels"):
                    if key in split:
                        messages.append(
                            f"config key 'datasets.{i}.splits.{j}.{key}': a beir split reads "
                            f"queries.jsonl and qrels/{split['name']}.tsv of its folder, so this "
                            "file would be ignored; remove the key (for another qrels file, link "
                            f"it as qrels/{split['name']}.tsv)"
                        )

    wikipedia = config["wikipedia"]
    if wikipedia["source"] == "local" and not wikipedia["parts"]:
        messages.append(
            "config key 'wikipedia.parts': source=local needs at least one dump file; "
            "list one, or set source: dumps"
        )

    for i, entry in enumerate(config["spans"]):
        for name, granularity in (entry.get("granularities") or {}).items():
            low, high = granularity.get("min_len"), granularity.get("max_len")
            if low is not None and high is not None and low > high:
                messages.append(
                    f"config key 'spans.{i}.granularities.{name}': min_len {low} > max_len {high}"
                )

    def must_name(key: str, value: str | None, section: str) -> None:
        known = _names(config.get(section))
        if value is not None and value not in known:
            messages.append(
                f"config key '{key}': '{value}' is not a {section} entry; known: {', '.join(known)}"
            )

    must_name("corpus.checkpoint", config["corpus"]["checkpoint"], "checkpoints")
    must_name("pretrain.checkpoint", config["pretrain"]["checkpoint"], "checkpoints")
    messages += _corpus_mistakes(config, must_name)
    for i, model in enumerate(config["pretrain"]["models"]):
        must_name(f"pretrain.models.{i}.spans", model.get("spans"), "spans")
    for i, entry in enumerate(config["finetune"]["datasets"]):
        must_name(f"finetune.datasets.{i}.dataset", entry["dataset"], "datasets")
    for i, entry in enumerate(config["evaluate"]["splits"]):
        must_name(f"evaluate.splits.{i}.dataset", entry["dataset"], "datasets")
    for i, entry in enumerate(config["bm25"].get("negatives") or []):
        must_name(f"bm25.negatives.{i}.dataset", entry["dataset"], "datasets")

    finetuned = [entry["dataset"] for entry in config["finetune"]["datasets"]]
    evaluated = {entry["dataset"] for entry in config["evaluate"]["splits"]}
    for i, entry in enumerate(config["evaluate"].get("zero_shot") or []):
        key, target = f"evaluate.zero_shot.{i}", entry["dataset"]
        must_name(f"{key}.dataset", target, "datasets")
        if entry["trained_on"] not in finetuned:
            messages.append(
                f"config key '{key}.trained_on': '{entry['trained_on']}' is not fine-tuned on; "
                f"finetune.datasets has: {', '.join(finetuned)}"
            )
        # An alias is its source's collection: a target fine-tuned on under another name is
        # in-domain too.
        aliases = config.get("dataset_aliases") or {}
        if aliases.get(target, target) in {aliases.get(f, f) for f in finetuned}:
            messages.append(
                f"config key '{key}.dataset': '{target}' is fine-tuned on (or is the data of "
                "an entry that is: same_as), so its runs are in-domain; a zero-shot target must "
                "not be in finetune.datasets"
            )
        if target not in evaluated:
            messages.append(
                f"config key '{key}.dataset': add an evaluate.splits entry for '{target}' "
                "(which split, which measures)"
            )
    messages += _baseline_checks(config, must_name)
    messages += _negatives_mistakes(config)
    messages += _benchmark_mistakes(config)
    return messages


def _negatives_mistakes(config: dict[str, Any]) -> list[str]:
    """bm25.negatives `source: dpr` reads the lists of the DPR training JSON a split was built
    from: only a format dpr dataset's `biencoder` split has one; `dpr_lists` only with it."""
    messages = []
    datasets = {entry["name"]: entry for entry in config["datasets"]}
    for i, entry in enumerate(config["bm25"].get("negatives") or []):
        key, dataset = f"bm25.negatives.{i}", datasets.get(entry["dataset"])
        if entry["source"] != "dpr":
            if "dpr_lists" in entry:
                messages.append(f"config key '{key}.dpr_lists': read only by source dpr "
                                f"(this entry's source is {entry['source']}); remove it")
            continue
        if dataset is None:  # must_name reports it
            continue
        if dataset["format"] != "dpr":
            messages.append(
                f"config key '{key}.source': dpr reads the negatives DPR's biencoder JSON lists, "
                f"and '{dataset['name']}' is format {dataset['format']}; use bm25 (or triples)")
            continue
        split = next((s for s in dataset["splits"] if s["name"] == entry["split"]), None)
        if split is not None and "biencoder" not in split:
            messages.append(
                f"config key '{key}.split': source dpr reads the split's biencoder JSON, and "
                f"split '{entry['split']}' of '{dataset['name']}' is a qa.csv (`questions`, no "
                "negatives listed); name a `biencoder` split or use source bm25")
        elif split is None:
            messages.append(f"config key '{key}.split': '{dataset['name']}' has no split "
                            f"'{entry['split']}'")
    return messages


def _benchmark_mistakes(config: dict[str, Any]) -> list[str]:
    """A table column's `benchmark` selects the published numbers beside it: it must be one
    paper_numbers knows, of the column's own dataset and split (paper_numbers.BENCHMARKS)."""
    messages = []
    aliases = config.get("dataset_aliases") or {}  # an alias's column is its source's benchmark
    for table in config["report"]["tables"]:
        for i, column in enumerate(table["columns"]):
            if "benchmark" not in column:
                continue
            dataset = aliases.get(column["dataset"], column["dataset"])
            why = paper_numbers.benchmark_mistake(column["benchmark"], dataset, column["split"])
            if why:
                messages.append(f"config key 'report.tables[{table['name']}].columns.{i}"
                                f".benchmark': {why}")
    return messages


def _baseline_checks(config: dict[str, Any], must_name) -> list[str]:
    """evaluate.baselines: unique names that no other system has, checkpoints that exist, and
    tables that list only configured baselines."""
    messages = []
    baselines = config["evaluate"].get("baselines") or []
    names = _names(baselines)
    models = _names(config["pretrain"]["models"])
    for name in sorted({n for n in names if names.count(n) > 1}):
        messages.append(f"config key 'evaluate.baselines': the name '{name}' is used twice")
    ours = re.compile(
        "(" + "|".join(map(re.escape, models)) + ")-" + STAGE_PATTERN
    )
    for i, entry in enumerate(baselines):
        key, name = f"evaluate.baselines.{i}", entry["name"]
        if name == "bm25" or ours.fullmatch(name):
            messages.append(
                f"config key '{key}.name': '{name}' is the name of one of our systems "
                "(bm25, <model>-stage<k>); choose another"
            )
        checkpoint = entry["checkpoint"]
        if checkpoint.startswith("pretrain:"):
            model = checkpoint.removeprefix("pretrain:")
            if model not in models:
                messages.append(
                    f"config key '{key}.checkpoint': '{model}' is not a pretrain.models entry; "
                    f"known: {', '.join(models)}"
                )
        else:
            must_name(f"{key}.checkpoint", checkpoint, "checkpoints")
        for j, item in enumerate(entry.get("published") or []):
            messages += _published_mistakes(config, item, f"{key}.published.{j}")
    for table in config["report"]["tables"]:
        for name in table.get("baseline_rows") or []:
            if name not in names:
                messages.append(
                    f"config key 'report.tables[{table['name']}].baseline_rows': '{name}' is not "
                    f"an evaluate.baselines entry; known: {', '.join(names) or '(none)'}"
                )
    return messages


def _published_mistakes(config: dict[str, Any], item: dict[str, Any], key: str) -> list[str]:
    """A baseline's published number must sit beside a value measured in its own setting: a
    dataset entry without `subset` (a sample's score is not the full corpus's), one of its splits,
    a measure evaluate.splits computes there. The table shows it whatever compare_published says,
    so a wrong key would print a delta against another setting, a misspelt one lose the number."""
    datasets = {d["name"]: d for d in config.get("datasets") or []}
    dataset = datasets.get(item["dataset"])
    if dataset is None:
        return [f"config key '{key}.dataset': '{item['dataset']}' is not a datasets entry; "
                f"known: {', '.join(datasets) or '(none)'}"]
    if dataset.get("subset"):
        return [f"config key '{key}.dataset': '{item['dataset']}' is a sample (`subset`), not the "
                "setting a number is published for; name a datasets entry of the full corpus"]
    splits = [s["name"] for s in dataset["splits"]]
    if item["split"] not in splits:
        return [f"config key '{key}.split': '{item['split']}' is not a split of "
                f"'{item['dataset']}'; known: {', '.join(splits)}"]
    measures = [m for s in config["evaluate"]["splits"]
                if (s["dataset"], s["split"]) == (item["dataset"], item["split"])
                for m in s["measures"]]
    if item["measure"] not in measures:
        return [f"config key '{key}.measure': '{item['measure']}' is not measured on "
                f"{item['dataset']}/{item['split']}; evaluate.splits lists: "
                f"{', '.join(measures) or '(no entry: add one)'}"]
    return []


def _corpus_mistakes(config: dict[str, Any], must_name) -> list[str]:
    """Corpora: unique names, each source's keys, models naming corpora that exist (a mixture
    of distinct ones) and an `init` model listed before them."""
    section, messages = config["corpus"], []
    known = corpora.names(section)
    for name in sorted({n for n in known if known.count(n) > 1}):
        messages.append(f"config key 'corpus.corpora': the name '{name}' is used twice")
    datasets = _names(config.get("datasets"))
    for i, entry in enumerate(section["corpora"]):
        messages += corpora.problems(entry, f"corpus.corpora.{i}", datasets)
        must_name(f"corpus.corpora.{i}.checkpoint", entry.get("checkpoint"), "checkpoints")

    def corpus_named(key: str, value: str) -> None:
        if value not in known:
            messages.append(f"config key '{key}': '{value}' is not a corpus.corpora entry; "
                            f"known: {', '.join(known)}")

    corpus_named("pretrain.corpus", config["pretrain"]["corpus"])
    earlier: list[str] = []
    for i, model in enumerate(config["pretrain"]["models"]):
        key = f"pretrain.models.{i}"
        chosen = model.get("corpus")
        if isinstance(chosen, str):
            corpus_named(f"{key}.corpus", chosen)
        for j, part in enumerate(chosen if isinstance(chosen, list) else []):
            corpus_named(f"{key}.corpus.{j}.name", part["name"])
        mixed = [part["name"] for part in chosen] if isinstance(chosen, list) else []
        for name in sorted({n for n in mixed if mixed.count(n) > 1}):
            messages.append(f"config key '{key}.corpus': '{name}' is listed twice")
        if "init" in model and model["init"] not in earlier:
            messages.append(
                f"config key '{key}.init': '{model['init']}' is not a pre-training model listed "
                f"before '{model['name']}'; known before it: {', '.join(earlier) or 'none'}"
            )
        if ("init" in model or "corpus" in model) and model["objective"] == "none":
            messages.append(f"config key '{key}': objective none trains nothing; remove "
                            "corpus / init")
        earlier.append(model["name"])
    return messages


def load(path: str | Path = PROJECT_ROOT / "config.yaml") -> dict[str, Any]:
    return validate(_read_yaml(path))
