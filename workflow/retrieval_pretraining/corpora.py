"""Pre-training corpora: what a `corpus.corpora` entry means, resolved for its chunking stage.

A corpus is a named entry: where its texts come from (`source`: the Wikipedia articles, a
`datasets` entry's corpus, a BEIR folder, a JSONL or TSV file) and how it is chunked (the
`corpus` section's keys, each overridable per entry but `shards`, which every corpus shares: one
rule writes all shards of a corpus, and a rule's outputs cannot vary in number per corpus).
`resolve` gives the chunk stage's whole slice, so that changing one corpus changes only its own
chunking job's params (and what reads its chunks). Torch- and polars-free: the Snakefile imports it.
"""

from __future__ import annotations

from typing import Any, Iterable

SOURCES = ("wikipedia", "dataset", "beir", "jsonl", "tsv")
# The keys that decide how a corpus is chunked (ChunkConfig's); `shards` is the section's only.
CHUNK_KEYS = ("checkpoint", "max_len", "min_tail_len", "short_tail", "boundary_slack")
# The keys that decide where its texts come from (besides `source`).
SOURCE_KEYS = ("dataset", "path", "member", "title")
# What the stage reads of a `datasets` entry (not its splits, BM25 or fine-tuning settings).
DATASET_KEYS = ("name", "format", "path", "corpus", "titles", "title")
# Which source keys each source needs / allows.
NEEDS = {"wikipedia": (), "dataset": ("dataset",), "beir": ("path",), "jsonl": ("path",),
         "tsv": ("path",)}
ALLOWS = {"wikipedia": (), "dataset": ("dataset", "title"), "beir": ("path", "title"),
          "jsonl": ("path", "title"), "tsv": ("path", "member", "title")}


def names(section: dict[str, Any]) -> list[str]:
    return [entry["name"] for entry in section["corpora"]]


def entry(section: dict[str, Any], name: str) -> dict[str, Any]:
    """The `corpus.corpora` entry called `name`."""
    for candidate in section["corpora"]:
        if candidate["name"] == name:
            return candidate
    raise ValueError(f"no corpus named {name!r} in corpus.corpora; known: {names(section)}")


def problems(entry: dict[str, Any], key: str, datasets: Iterable[str]) -> list[str]:
    """Messages for keys an entry's source needs but lacks, or has but cannot use."""
    source = entry["source"]
    messages = [f"config key '{key}.{k}': source={source} needs it" for k in NEEDS[source]
                if k not in entry]
    messages += [f"config key '{key}.{k}': source={source} does not read it; remove it"
                 for k in SOURCE_KEYS if k in entry and k not in ALLOWS[source]]
    known = list(datasets)
    if source == "dataset" and "dataset" in entry and entry["dataset"] not in known:
        messages.append(f"config key '{key}.dataset': '{entry['dataset']}' is not a datasets "
                        f"entry; known: {', '.join(known)}")
    return messages


def resolve(section: dict[str, Any], name: str, datasets: list[dict[str, Any]]) -> dict[str, Any]:
    """The chunk stage's slice for corpus `name`: its name and source, then the section's chunking
    keys with the entry's overrides, and `shards` (not `processes`: it changes speed only)."""
    own = entry(section, name)
    resolved: dict[str, Any] = {"name": name, "source": own["source"]}
    if own["source"] == "dataset":
        data = next(d for d in datasets if d["name"] == own["dataset"])
        resolved["dataset"] = {k: data[k] for k in DATASET_KEYS if data.get(k) is not None}
        resolved["title"] = own.get("title", data["title"])
    elif own["source"] != "wikipedia":
        resolved |= {k: own[k] for k in ("path", "member") if k in own}
        resolved["title"] = own.get("title", "space")
    for key in CHUNK_KEYS:
        value = own.get(key, section.get(key))
        if value is not None:
            resolved[key] = value
    resolved["shards"] = section["shards"]
    return resolved


def model_corpora(pretrain: dict[str, Any], model: dict[str, Any]) -> list[dict[str, Any]]:
    """[{name, proportion}] a model entry trains on: its `corpus` (a name or a mixture), else the
    section's `corpus`, with proportion 1."""
    chosen = model.get("corpus", pretrain["corpus"])
    if isinstance(chosen, str):
        return [{"name": chosen, "proportion": 1.0}]
    return [{"name": c["name"], "proportion": float(c["proportion"])} for c in chosen]


def pretraining_chain(pretrain: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Model `name`'s entry and those its weights come through, in order: the entry it copies
    (`reuse_pretraining`) or else the model it continues (`init`), to the first of the chain
    (a cycle ends it)."""
    models = {m["name"]: m for m in pretrain["models"]}
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    while name is not None and name not in seen:
        seen.add(name)
        chain.append(models[name])
        name = chain[-1].get("reuse_pretraining") or chain[-1].get("init")
    return chain


def pretraining_datasets(pretrain: dict[str, Any], section: dict[str, Any], name: str) -> list[str]:
    """The `datasets` entries whose own corpus model `name` was pre-trained on: its corpora's and,
    through `init` and `reuse_pretraining`, those of the pre-training it continues or copies. The
    results tables place a number published for a model pre-trained in-domain (the BoW paper's
    MS MARCO rows) only beside a model pre-trained on that benchmark's own collection."""
    found: set[str] = set()
    for model in pretraining_chain(pretrain, name):
        if model.get("reuse_pretraining") or model["objective"] == "none":
            continue  # a copy trains nothing itself; nor does the base
        for corpus in model_corpora(pretrain, model):
            own = entry(section, corpus["name"])
            if own["source"] == "dataset":
                found.add(own["dataset"])
    return sorted(found)
