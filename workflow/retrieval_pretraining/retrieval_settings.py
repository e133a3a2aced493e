"""The retrieval knobs (their one home) and the config slice the dense-retrieval rules hand out.

`RetrievalSettings` decide what a vector is: how queries and passages are cut (q_len, p_len),
how a passage is joined with its title, how last-layer states are pooled and compared, and how
corpus vectors are stored and batched. Fine-tuning, corpus encoding, mining and dense search all
build them from the same slice, so training and retrieval can never disagree on them.

The slice: rules/finetune.smk builds one per dataset and stage (`finetune_knobs`): the `finetune`
section's knobs (schemas/finetune.schema.yaml) with the dataset's overrides, plus the dataset's
title mode (`title`) and query-id rule (`exclude_self`). Each job is handed only the part it reads,
since Snakemake reruns a job whose params changed: fine-tuning its own knobs
(finetune/settings.trainer_keys), corpus encoding the retrieval knobs less the query-side ones
(`corpus_keys`: it reads passages only), dense search the retrieval knobs (`retrieval_keys`), its
depth, `exclude_self` and `use_gpu`, mining those less the depth plus its policy keys. The batch
size of encoding (RUNTIME_KEYS) reaches those three with `--runtime` instead. Each stage accepts
the rest of the slice too (and ignores it); a key outside it is refused, naming it and the known
keys, since a misspelt knob would otherwise fall back to its default without a word. Torch-free.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from typing import Any, Iterable, Mapping

from .config import ConfigError, refuse_unknown, section_schema
from .contracts.datasets import TITLE_MODES

# What `finetune_knobs` adds from the dataset entry: its title mode and its exclude_query_id rule;
# and what the fine-tuning rule adds from the model's entry (`pretrain.models[].finetune`).
DATASET_KEYS = ("title", "exclude_self")
MODEL_KEYS = ("projector",)
# What `search_argument` adds for corpus encoding and dense search (mine.py names mining's keys).
SEARCH_KEYS = ("use_gpu",)
# What a baseline encoder's slice adds (rules/baselines.smk `baseline_argument`): the texts its
# authors put before every query / passage (E5's "query: ", "passage: "). Fine-tuning never
# receives them, so they stay "" there and in every slice of our own encoders.
PREFIX_KEYS = ("query_prefix", "passage_prefix")
# What only the encoding of queries reads (dense search and mining; q_len fine-tuning too): a
# corpus encoding is never handed them (`corpus_keys`) nor records them, so a new query length
# re-encodes no corpus (hours of GPU at MS MARCO scale, then its index and all after it).
QUERY_KEYS = ("q_len", "query_prefix")
# Speed and memory only: texts per forward pass (encode.py halves it itself after an out-of-memory
# error; the vectors differ by rounding at most). The rules pass it with `--runtime`, outside their
# params: lowering it must re-encode no corpus, and so re-mine and retrain nothing after it.
RUNTIME_KEYS = ("encode_batch_size",)


@functools.lru_cache(maxsize=1)
def finetune_section_knobs() -> frozenset[str]:
    """The knobs of the `finetune` section (and of a dataset's `overrides`), from its schema."""
    return frozenset(section_schema("finetune")["$defs"]["knobs"])


def slice_keys(*added: str) -> frozenset[str]:
    """Every key of a fine-tuning slice, plus the keys a rule `added` for its stage."""
    return (finetune_section_knobs() | frozenset(DATASET_KEYS) | frozenset(MODEL_KEYS)
            | frozenset(added))


# ---------------------------------------------------------------- value checks ------------------
def _alternatives(choices: Iterable[str]) -> str:
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(f"{key} {value!r} is unknown; use {_alternatives(choices)}")


def check_int(key: str, value: Any, minimum: int, *, nullable: bool = False) -> None:
    if nullable and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} {value!r} must be an integer >= {minimum}"
                          + (" or null" if nullable else ""))


def check_number(key: str, value: Any, *, low: float, high: float | None = None,
                 low_open: bool = False, nullable: bool = False) -> None:
    """A number in [low, high] (or (low, high] with low_open); null allowed when nullable."""
    if nullable and value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (not number or value < low or (low_open and value == low)
            or (high is not None and value > high)):
        bounds = f"{'>' if low_open else '>='} {low}"
        bounds += f" and <= {high}" if high is not None else ""
        raise ConfigError(f"{key} {value!r} must be a number {bounds}"
                          + (" or null" if nullable else ""))


def check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} {value!r} must be true or false")


# ---------------------------------------------------------------- the retrieval knobs -----------
@dataclasses.dataclass(frozen=True)
class RetrievalSettings:
    pooling: str = "cls"            # cls | mean
    similarity: str = "dot"         # dot | cosine (cosine = L2-normalised vectors + inner product)
    q_len: int = 32                 # query tokens
    p_len: int = 128                # passage tokens, title included
    title: str = "space"            # none | space | sep: the dataset's title mode (join_title)
    encode_batch_size: int = 256    # texts per forward pass when encoding
    dtype: str = "float16"          # stored corpus vectors; search always runs in float32
    query_prefix: str = ""          # put before every query text (a baseline's own convention)
    passage_prefix: str = ""        # put before every passage (before its title, when joined)

    def __post_init__(self) -> None:
        check_choice("finetune.pooling", self.pooling, ("cls", "mean"))
        check_choice("finetune.similarity", self.similarity, ("dot", "cosine"))
        check_int("finetune.q_len", self.q_len, 4)
        check_int("finetune.p_len", self.p_len, 8)
        check_choice("title (the dataset's title mode)", self.title, TITLE_MODES)
        check_int("finetune.encode_batch_size", self.encode_batch_size, 1)
        check_choice("finetune.dtype", self.dtype, ("float16", "float32"))
        for key in PREFIX_KEYS:
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"{key} {getattr(self, key)!r} must be a string (\"\" = none)")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, added: Iterable[str] = (),
                    stage: str = "retrieval") -> "RetrievalSettings":
        """The retrieval knobs of a slice (defaults for missing keys); `added`: what the stage's
        rule adds to the slice (refused otherwise)."""
        refuse_unknown(config, slice_keys(*added), stage)
        return cls(**{f.name: config[f.name] for f in dataclasses.fields(cls) if f.name in config})

    def record(self) -> dict[str, Any]:
        """As manifests record them (one flat dict; a prefix only when one is set, so the records
        of our own encoders, which never have one, are what they were)."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if not (k in PREFIX_KEYS and v == "")}

    def corpus_record(self) -> dict[str, Any]:
        """`record` less the QUERY_KEYS: what a corpus encoding read (it was handed no q_len, and
        the default standing in for it decided nothing)."""
        return {k: v for k, v in self.record().items() if k not in QUERY_KEYS}


def retrieval_keys() -> frozenset[str]:
    """The retrieval knobs of a fine-tuning slice that the search and mining jobs get as params
    (their rerun trigger; a corpus encoding gets `corpus_keys`): all but the prefixes (a
    baseline's, never in that slice) and the RUNTIME_KEYS (sent with `--runtime`)."""
    fields = frozenset(f.name for f in dataclasses.fields(RetrievalSettings))
    return fields - set(PREFIX_KEYS) - set(RUNTIME_KEYS)


def corpus_keys() -> frozenset[str]:
    """The retrieval knobs a corpus encoding gets as params: `retrieval_keys` less the QUERY_KEYS
    (a baseline's slice adds its passage_prefix, rules/baselines.smk)."""
    return retrieval_keys() - set(QUERY_KEYS)


def add_runtime_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `--runtime JSON` option of encoding, mining and search (RUNTIME_KEYS)."""
    parser.add_argument("--runtime", type=json.loads, default={},
                        help=f"speed and memory settings ({', '.join(RUNTIME_KEYS)}) as JSON, "
                             "merged into --config (the rules keep them out of their params)")
    return parser


def with_runtime(config: dict[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The stage's --config slice with its --runtime keys merged in; any other key in --runtime is
    refused (a knob that decides the vectors belongs in the params)."""
    refuse_unknown(runtime, RUNTIME_KEYS, "--runtime")
    return config | dict(runtime)
