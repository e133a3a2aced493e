"""Resolve one pre-training model's settings: section defaults deep-merged with the model's overrides.

Torch-free on purpose: the Snakefile imports it to build each rule's params, so that changing the
COSTA options reruns the COSTA model only.
"""

from __future__ import annotations

import copy
from typing import Any

from ..corpora import model_corpora

# Option blocks a model entry may override; each objective reads `mlm` plus its own blocks.
OPTION_BLOCKS = ("trainer", "mlm", "costa", "cpdae", "bow", "condenser", "cocondenser", "retromae",
                 "ae_decoder", "ar_decoder")
OBJECTIVE_BLOCKS: dict[str, tuple[str, ...]] = {
    "none": (), "mlm": (), "costa": ("costa",), "cpdae": ("cpdae",), "cpdae_r": ("cpdae",),
    "bow": ("bow",), "condenser": ("condenser",), "cocondenser": ("condenser", "cocondenser"),
    "retromae": ("retromae",), "ae_decoder": ("ae_decoder",), "ar_decoder": ("ar_decoder",),
}
# The Bag-of-Word recipes (`bow.recipe`): what each sets for a bow model, between the section's
# defaults and the model entry's own keys (which still override any of it).
#   code:  the authors' public code: the MLM head on [CLS], softmax CE against the uniform
#          distribution over the bag (a mean over it), weight decaying 1 -> 0.1 on a cosine,
#          30% whole-word masking;
#   paper: the paper as written: h_CLS . E^T, -log p summed over the input's unique tokens (the
#          normaliser is our literal reading, ARCHITECTURE.md), a constant weight, 15% masking
#          (its reported setting; token-level, as BERT's).
BOW_RECIPES = {
    "code": {"bow": {"form": "code", "reduction": "mean", "weight_schedule": "cosine"},
             "mlm": {"mask_rate": 0.3, "whole_word": True}},
    "paper": {"bow": {"form": "paper", "reduction": "sum", "weight_schedule": "constant"},
              "mlm": {"mask_rate": 0.15, "whole_word": False}},
}
# The knobs `pretrain --retrieval` may set: how an exported encoder is to be used, written into its
# sentence-transformers files and card (st_export.py; default st_export.pretrained_use).
ENCODER_USE = ("pooling", "similarity", "q_len", "p_len")


# Trainer keys that change neither the weights nor metrics.jsonl (train.RESULT_NEUTRAL less
# log_every and probe_every, which set its rows): the rules pass them with `--trainer-options`,
# out of the job's params, so that editing one (a worker count, how often a state is saved)
# reruns no pre-training nor what was built from it.
TRAINER_RUNTIME = ("tensorboard", "checkpoint_every", "num_workers")


def split_runtime(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`settings` without the TRAINER_RUNTIME keys of its trainer block, those keys' values)."""
    if "trainer" not in settings:
        return settings, {}
    trainer = settings["trainer"]
    runtime = {k: trainer[k] for k in TRAINER_RUNTIME if k in trainer}
    kept = {k: v for k, v in trainer.items() if k not in TRAINER_RUNTIME}
    return settings | {"trainer": kept}, runtime


def merge_runtime(settings: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """`settings` with the `--trainer-options` values put back into its trainer block."""
    from ..config import refuse_unknown

    refuse_unknown(runtime, TRAINER_RUNTIME, "pretrain --trainer-options")
    if not runtime:
        return settings
    return settings | {"trainer": settings.get("trainer", {}) | runtime}


def check_resolved(settings: dict[str, Any]) -> None:
    """Refuse a key the resolved settings (what `resolve_model` returns) cannot hold, at any depth
    of the option blocks: a misspelt knob would otherwise train with its default."""
    from ..config import closed, refuse_unknown, section_schema

    # A model entry's blocks (what a resolved block may hold: for bow, what its recipe sets too).
    blocks = section_schema("pretrain")["properties"]["models"]["items"]["properties"]
    top = ("name", "objective", "checkpoint", "seed", "spans", "corpora", "init")
    refuse_unknown(settings, closed(top, **{b: blocks[b] for b in OPTION_BLOCKS}), "pretrain")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_model(section: dict[str, Any], name: str, seed: int) -> dict[str, Any]:
    """The complete, self-contained settings of model `name` (what the training job reads)."""
    entries = {m["name"]: m for m in section["models"]}
    if name not in entries:
        raise ValueError(f"no pre-training model named {name!r}; known: {sorted(entries)}")
    entry = entries[name]
    objective = entry["objective"]
    resolved: dict[str, Any] = {
        "name": name,
        "objective": objective,
        "checkpoint": entry.get("checkpoint", section["checkpoint"]),
        "seed": seed,
    }
    if objective == "none":
        return resolved
    if objective == "costa" and not entry.get("spans"):
        raise ValueError(f"pretrain model {name!r}: objective costa needs 'spans' (a spans entry name)")
    resolved["spans"] = entry.get("spans") if objective == "costa" else None
    # [{name, proportion}]: what the chunks are (the manifests record each corpus's source).
    resolved["corpora"] = model_corpora(section, entry)
    if entry.get("init"):
        resolved["init"] = entry["init"]
    resolved["trainer"] = _merge(section["trainer"], entry.get("trainer", {}))
    recipe: dict[str, Any] = {}
    if objective == "bow":  # section defaults, then the recipe, then the entry's own keys
        name_of = entry.get("bow", {}).get("recipe", section["bow"]["recipe"])
        recipe = BOW_RECIPES[name_of]
    resolved["mlm"] = _merge(_merge(section["mlm"], recipe.get("mlm", {})), entry.get("mlm", {}))
    for block in OBJECTIVE_BLOCKS[objective]:
        resolved[block] = _merge(_merge(section[block], recipe.get(block, {})),
                                 entry.get(block, {}))
    return resolved


def gather_block(settings: dict[str, Any]) -> str | None:
    """The option block of resolved `settings` whose `gather_negatives` makes its objective
    contrast the texts of every process (with accumulation, through cached gradients:
    contrast_cache.py); None for an objective that contrasts nothing."""
    return next((block for block in OBJECTIVE_BLOCKS[settings["objective"]]
                 if "gather_negatives" in settings[block]), None)


# The option block holding each objective's loss options (lambda, temperature, weights), for
# `loss_settings`; objectives absent add no term of their own.
LOSS_BLOCK = {
    "costa": "costa", "cpdae": "cpdae", "cpdae_r": "cpdae", "bow": "bow",
    "cocondenser": "cocondenser", "retromae": "retromae", "ae_decoder": "ae_decoder",
    "ar_decoder": "ar_decoder",
}


def loss_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """What the tables' provenance needs to state resolved `settings`' loss reductions
    (tables/provenance.loss_reductions): the objective, the micro- and global batch (a row that
    gathers its negatives contrasts the whole global batch: contrast_cache.py) and the objective's
    own option block, `gather_negatives` included."""
    objective = settings["objective"]
    keep: dict[str, Any] = {"objective": objective}
    if "trainer" in settings:
        keep["micro_batch_size"] = settings["trainer"]["micro_batch_size"]
        keep["global_batch_size"] = settings["trainer"]["global_batch_size"]
    if objective in LOSS_BLOCK:
        keep["options"] = settings[LOSS_BLOCK[objective]]
    if objective == "bow":  # the recipe's masking, stated beside its loss
        keep["options"] = keep["options"] | settings["mlm"]
    return keep


def reused_source(section: dict[str, Any], name: str) -> str | None:
    """The entry whose pre-training model `name` reuses (`reuse_pretraining`), or None."""
    entries = {m["name"]: m for m in section["models"]}
    return entries[name].get("reuse_pretraining") if name in entries else None


def check_entries(section: dict[str, Any], seed: int) -> None:
    """Refuse, at parse time, a model entry whose reuse or fine-tuning knobs cannot hold: a reuse
    of an unknown, untrained or itself reusing entry, or one that would train differently (its
    copied encoder would then not be what its settings say), and a fine-tuning projector on a
    model pre-trained without one."""
    from ..config import ConfigError

    entries = {m["name"]: m for m in section["models"]}
    for name, entry in entries.items():
        source = entry.get("reuse_pretraining")
        if source is not None:
            where = f"pretrain.models {name!r}: reuse_pretraining {source!r}"
            if source not in entries:
                raise ConfigError(f"{where} names no entry; known: {sorted(entries)}")
            if entries[source].get("reuse_pretraining") or entries[source]["objective"] == "none":
                raise ConfigError(f"{where} must name a trained entry that reuses none itself")
            mine, theirs = resolve_model(section, name, seed), resolve_model(section, source, seed)
            differ = sorted(k for k in set(mine) | set(theirs) - {"name"}
                            if k != "name" and mine.get(k) != theirs.get(k))
            if differ:
                raise ConfigError(f"{where}: the entry resolves to other settings ({', '.join(differ)})"
                                  f"; repeat {source!r}'s pre-training keys (a YAML merge `<<` does)")
        if (entry.get("finetune") or {}).get("projector"):
            settings = resolve_model(section, name, seed)
            if settings["objective"] != "costa" or settings["costa"]["projector"] == "none":
                raise ConfigError(
                    f"pretrain.models {name!r}: finetune.projector needs a model pre-trained with "
                    f"objective costa and costa.projector nonlinear or linear (it has objective "
                    f"{settings['objective']!r}"
                    + (f", projector {settings['costa']['projector']!r})" if "costa" in settings
                       else ")"))
