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
# The knobs `pretrain --retrieval` may set: how an exported encoder is to be used, written into its
# sentence-transformers files and card (st_export.py; default st_export.pretrained_use).
ENCODER_USE = ("pooling", "similarity", "q_len", "p_len")


def check_resolved(settings: dict[str, Any]) -> None:
    """Refuse a key the resolved settings (what `resolve_model` returns) cannot hold, at any depth
    of the option blocks: a misspelt knob would otherwise train with its default."""
    from ..config import closed, refuse_unknown, section_schema

    blocks = section_schema("pretrain")["properties"]
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
    resolved["mlm"] = _merge(section["mlm"], entry.get("mlm", {}))
    for block in OBJECTIVE_BLOCKS[objective]:
        resolved[block] = _merge(section[block], entry.get(block, {}))
    return resolved
