"""Dataset aliases: a `datasets` entry `{name: A, same_as: S}` is S's data under a second name.

Everything downstream is keyed by dataset name (results/datasets/<name>, results/bm25/<name>,
fine-tuning, runs, metrics) and the per-dataset sections (finetune.datasets, bm25.negatives,
evaluate.splits, overrides) name datasets, so a second name gives one collection a second
fine-tuning recipe in the same results tree, without downloading and preparing it twice: the
rules copy the source's prepared files (rules/retrieval.smk `alias_dataset_file`).

S must be an EARLIER entry; an alias of an alias is resolved to the first entry of the chain (its
collection), which is where the files are copied from.

An alias may set `title` (ALIAS_SETTINGS) and nothing else: how its encoders join a passage's
title and text, which the corpus stores apart (corpus.parquet: title, text), so the copied corpus
serves any mode; fine-tuning and encoding read it from the entry (rules/finetune.smk
`finetune_knobs`), BM25 from the bm25 section (`bm25.overrides`), not from the entry. What else
an entry says is its collection's (the query-id rule, the format, the files), the same under any
name. Where its title differs from its collection's, its dataset.json (which records the title
mode) is the source's with the alias's title in place (`own_settings`), not a copy.

A shared corpus is the same at the corpus level: a full entry with `corpus: {same_as: S}` has
its own splits, settings and downloads, and S's corpus (DPR's NQ and TriviaQA both read the 21M
passages of psgs_w100). Its corpus.parquet is a copy of S's (rules/retrieval.smk
`share_dataset_corpus`), its BM25 index a copy of S's where the settings that shape an index are
S's (`copied_bm25_indexes`), and resolve() gives it S's corpus file references (`corpus`,
`titles`), so that everything reading its entry reads the corpus it read when it named the file
itself. S must be an earlier entry of the same format (the format decides how a corpus is
parsed); a chain (S's corpus shared in turn, or S an alias) is the first entry's corpus, as for
aliases. The `titles` belong to the corpus: the sharing entry names none. In-domain checks
(same_collection) see through it: they are about the passages pre-training read.

Read at parse time only (config_checks.validate, rules/common.smk): no stage imports it, so it
is no job's code input.
"""

from __future__ import annotations

from typing import Any

ALIAS_KEYS = ("name", "same_as")
# What an alias may set for itself beside ALIAS_KEYS: how its encoders join title and text.
ALIAS_SETTINGS = ("title",)
# What a shared corpus takes from its source's entry: the files the corpus is read from.
CORPUS_REFS = ("corpus", "titles")


def is_alias(entry: dict[str, Any]) -> bool:
    return "same_as" in entry


def shares_corpus(entry: dict[str, Any]) -> bool:
    """Whether the entry's corpus is another's (`corpus: {same_as: S}`)."""
    return isinstance(entry.get("corpus"), dict) and "same_as" in entry["corpus"]


def problems(datasets: list[dict[str, Any]]) -> list[str]:
    """Why the aliases among `datasets` cannot be resolved: a source that is not an earlier
    entry (unknown, later, the alias itself), or an alias under the name of another entry
    (resolution is by name: the checks after it would read the alias's copy of its source as
    that entry and refuse what the config does not say); then corpus_problems(). Extra keys are
    the schema's to refuse."""
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
    return messages or corpus_problems(datasets)


def corpus_problems(datasets: list[dict[str, Any]]) -> list[str]:
    """Why the shared corpora (`corpus: {same_as: S}`) among `datasets` cannot be: S not an
    earlier entry, S of another format (a corpus is parsed by its format), a beir entry (which
    reads its corpus from its folder), or `titles` on the sharing entry (they are the corpus's), or
    `subset` (its corpus is the source's copy, never sampled).
    Assumes the aliases resolve (problems())."""
    messages, full = [], {}
    for i, entry in enumerate(datasets):
        key = f"config key 'datasets.{i}"
        if is_alias(entry):
            entry = full[entry["same_as"]]  # its format is its source's
        elif shares_corpus(entry):
            name, source = entry["name"], entry["corpus"]["same_as"]
            if source == name:
                messages.append(f"{key}.corpus.same_as': '{source}' is this entry itself; name "
                                "the datasets entry whose corpus it shares")
            elif source not in full:
                later = any(e["name"] == source for e in datasets)
                messages.append(
                    f"{key}.corpus.same_as': '{source}' is not a datasets entry listed before "
                    f"'{name}'" + ("; move this entry after it" if later else "")
                    + f"; known before it: {', '.join(full) or 'none'}")
            elif entry["format"] == "beir" or full[source]["format"] != entry["format"]:
                formats = {entry["format"], full[source]["format"]}
                messages.append(
                    f"{key}.corpus.same_as': '{name}' is format {entry['format']} and "
                    f"'{source}' format {full[source]['format']}: "
                    + ("a beir entry reads its corpus from its folder (`path`), not `corpus`; "
                       "for BEIR data under a second name write an alias (same_as)"
                       if "beir" in formats else
                       "the format decides how a corpus is parsed, so only an entry of the "
                       "same format can share it; give this entry a corpus of its own"))
            elif "titles" in entry:
                messages.append(
                    f"{key}.titles': the titles belong to the corpus, which is that of '{source}' "
                    "(corpus.same_as): remove the key; the corpus is read with its source's")
            elif "subset" in entry:
                messages.append(
                    f"{key}.subset': the corpus is a copy of '{source}''s (corpus.same_as), "
                    "never sampled here: remove the key (a subset is a beir entry's own corpus)")
        full[datasets[i]["name"]] = entry
    return messages


def sources(datasets: list[dict[str, Any]]) -> dict[str, str]:
    """{alias: the entry that holds its data} for each alias, through aliases of aliases.
    Assumes problems() found none."""
    found: dict[str, str] = {}
    for entry in datasets:
        if is_alias(entry):
            found[entry["name"]] = found.get(entry["same_as"], entry["same_as"])
    return found


def own_settings(datasets: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{alias: {key: value}} of the ALIAS_SETTINGS in which an alias differs from the entry whose
    files it copies (its collection: an alias of an alias inherits what its source sets), as
    resolve() gives them; aliases that differ in none are left out. What its dataset.json holds
    in place of the copied one's. Assumes problems() found none."""
    resolved = {e["name"]: e for e in resolve(datasets)}
    found = {}
    for alias, source in sources(datasets).items():
        settings = {k: resolved[alias][k] for k in ALIAS_SETTINGS
                    if resolved[alias].get(k) != resolved[source].get(k)}
        if settings:
            found[alias] = settings
    return found


def corpus_sources(datasets: list[dict[str, Any]]) -> dict[str, str]:
    """{name: S} for each entry whose corpus is S's (`corpus: {same_as: S}`, as written: S's
    prepared corpus is what it copies, itself a copy where S shares one or is an alias)."""
    return {e["name"]: e["corpus"]["same_as"] for e in datasets if shares_corpus(e)}


def corpus_collection(name: str, aliases: dict[str, str], shared: dict[str, str]) -> str:
    """The entry whose downloads hold `name`'s corpus files (the one that parses it): through
    aliases (`aliases`: sources()) and shared corpora (`shared`: corpus_sources()) to the first."""
    while True:
        name = aliases.get(name, name)
        if name not in shared:
            return name
        name = shared[name]


def resolve(datasets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each alias as its source's entry (resolved in turn) under its own name with the settings
    it sets itself (ALIAS_SETTINGS), and each entry that shares a corpus with its source's corpus
    file references (CORPUS_REFS) in place of `corpus: {same_as}` (a copy): what the rules read.
    Entries with neither are returned as they are."""
    full: dict[str, dict[str, Any]] = {}
    resolved = []
    for entry in datasets:
        if is_alias(entry):
            own = {k: entry[k] for k in ALIAS_SETTINGS if k in entry}
            entry = dict(full[entry["same_as"]], name=entry["name"]) | own
        elif shares_corpus(entry):
            source = full[entry["corpus"]["same_as"]]
            entry = {k: v for k, v in entry.items() if k != "corpus"} | {
                k: source[k] for k in CORPUS_REFS if k in source}
        full[entry["name"]] = entry
        resolved.append(entry)
    return resolved


def collection(name: str, aliases: dict[str, str]) -> str:
    """The dataset whose data `name` is: its source for an alias, else `name` itself."""
    return aliases.get(name, name)


def same_collection(names: list[str], aliases: dict[str, str],
                    shared: dict[str, str]) -> list[str]:
    """Every dataset name over the same corpus as one of `names` (the names, their sources, every
    alias of either, and every entry that shares a corpus with them; `aliases`: sources(),
    `shared`: corpus_sources()), sorted: what an in-domain check compares a column's dataset with.
    In-domain is about the passages pre-training read, so a model pre-trained on msmarco-passage
    is in-domain on its alias's columns too, and one pre-trained on NQ's corpus on TriviaQA's,
    which is NQ's (the questions differ; pre-training never reads them). Without aliases or
    shared corpora: `names`, sorted."""
    wanted = {corpus_collection(n, aliases, shared) for n in names}
    every = set(names) | set(aliases) | set(aliases.values()) | set(shared) | set(shared.values())
    return sorted(n for n in every if corpus_collection(n, aliases, shared) in wanted)
