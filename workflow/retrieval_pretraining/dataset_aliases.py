"""Dataset aliases: a `datasets` entry `{name: A, same_as: S}` is S's data under a second name.

Everything downstream is keyed by dataset name (results/datasets/<name>, results/bm25/<name>,
fine-tuning, runs, metrics) and the per-dataset sections (finetune.datasets, bm25.negatives,
evaluate.splits, overrides) name datasets, so a second name gives one collection a second
fine-tuning recipe in the same results tree, without downloading and preparing it twice: the
rules copy the source's prepared files (rules/retrieval.smk `alias_dataset_file`).

S must be an EARLIER entry; an alias of an alias is resolved to the first entry of the chain (its
collection), which is where the files are copied from. Read at parse time only (config.validate,
rules/common.smk): no stage imports it, so it is no job's code input (code_deps.PARSE_TIME_IMPORTS).
"""

from __future__ import annotations

from typing import Any

ALIAS_KEYS = ("name", "same_as")


def is_alias(entry: dict[str, Any]) -> bool:
    return "same_as" in entry


def problems(datasets: list[dict[str, Any]]) -> list[str]:
    """Why the aliases among `datasets` cannot be resolved: a source that is not an earlier
    entry (unknown, later, the alias itself), or an alias under the name of another entry
    (resolution is by name: the checks after it would read the alias's copy of its source as
    that entry and refuse what the config does not say). Extra keys are the schema's to refuse."""
    messages, earlier = [], []
    for i, entry in enumerate(datasets):
        if is_alias(entry):
            source = entry["same_as"]
            others = [j for j, e in enumerate(datasets) if e["name"] == entry["name"] and j != i]
            if source == entry["name"]:
                messages.append(f"config key 'datasets.{i}.same_as': '{source}' is this entry "
                                "itself; name the datasets entry whose data it shares")
            elif others:
                messages.append(
                    f"config key 'datasets.{i}.name': the alias '{entry['name']}' has the name "
                    f"of datasets.{others[0]}; give the alias a name of its own")
            elif source not in earlier:
                later = any(e["name"] == source for e in datasets)
                messages.append(
                    f"config key 'datasets.{i}.same_as': '{source}' is not a datasets entry "
                    f"listed before '{entry['name']}'"
                    + ("; move this alias after it" if later else "")
                    + f"; known before it: {', '.join(earlier) or 'none'}")
        earlier.append(entry["name"])
    return messages


def sources(datasets: list[dict[str, Any]]) -> dict[str, str]:
    """{alias: the entry that holds its data} for each alias, through aliases of aliases.
    Assumes problems() found none."""
    found: dict[str, str] = {}
    for entry in datasets:
        if is_alias(entry):
            found[entry["name"]] = found.get(entry["same_as"], entry["same_as"])
    return found


def resolve(datasets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`datasets` with each alias replaced by its source's entry under the alias's own name (a
    copy: editing one entry edits no other). Entries without an alias are returned as they are."""
    full: dict[str, dict[str, Any]] = {}
    resolved = []
    for entry in datasets:
        if is_alias(entry):
            entry = dict(full[entry["same_as"]], name=entry["name"])
        full[entry["name"]] = entry
        resolved.append(entry)
    return resolved


def collection(name: str, aliases: dict[str, str]) -> str:
    """The dataset whose data `name` is: its source for an alias, else `name` itself."""
    return aliases.get(name, name)


def same_collection(names: list[str], aliases: dict[str, str]) -> list[str]:
    """Every dataset name that is the same collection as one of `names` (the names, their
    sources and every alias of either; `aliases`: sources()), sorted: what an in-domain check
    compares a column's dataset with (a model pre-trained on msmarco-passage is in-domain on its
    alias's columns too). Without aliases: `names`, sorted."""
    wanted = {collection(n, aliases) for n in names}
    every = set(names) | set(aliases) | set(aliases.values())
    return sorted(n for n in every if collection(n, aliases) in wanted)
