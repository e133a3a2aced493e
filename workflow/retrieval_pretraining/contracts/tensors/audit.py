"""How `audit` shows and checks a safetensors file: its tensors (listed without loading weights),
every value finite (read a slice at a time), heads sized by their encoder, the heads' objective
equal to the encoder's. `safetensors_tensors` also serves the model folders' audit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..base import (
    RANK_NAME, Audit, Kind, NotAnArtifact, describe_origin, read_manifest, results_relative, short,
    show_manifest, show_snakemake_record,
)

FILES = [
    ("pretrain/*/heads.safetensors",
     "pre-training heads left out of the exported encoder (MLM head, COSTA projector, "
     "CPDAE decoder)",
     "pretrain_model"),
]


def safetensors_tensors(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """({name: {shape, dtype}}, metadata) read with safetensors' safe_open (no weights loaded)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            tensors = {}
            for key in handle.keys():
                view = handle.get_slice(key)
                tensors[key] = {"shape": list(view.get_shape()), "dtype": view.get_dtype()}
            return tensors, handle.metadata() or {}
    except Exception as error:  # SafetensorError (a plain Exception subclass) for a bad header
        raise NotAnArtifact(f"{path}: not a safetensors file ({error})") from error


# A float is nan or inf when every bit of its exponent is set. Checked through the bits because
# bfloat16, what mixed-precision training saves, has no numpy type.
EXPONENT_BITS = {
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F32": (np.uint32, 0x7F800000),
    "F64": (np.uint64, 0x7FF0000000000000),
}
VALUES_PER_READ = 1 << 24  # memory stays bounded whatever a tensor's size


def tensors_not_finite(path: Path) -> list[str]:
    """The float tensors holding a nan or inf, each read a slice at a time from a memory map
    (a run that diverged saves such weights, and they load without complaint)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    bad = []
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in EXPONENT_BITS:
            continue
        bits, mask = EXPONENT_BITS[info["dtype"]]
        begin, end = info["data_offsets"]
        count = (end - begin) // np.dtype(bits).itemsize
        if count == 0:
            continue
        values = np.memmap(path, dtype=bits, mode="r", offset=8 + size + begin, shape=(count,))
        if any(
            np.any(values[i : i + VALUES_PER_READ] & bits(mask) == bits(mask))
            for i in range(0, count, VALUES_PER_READ)
        ):
            bad.append(name)
    return bad


def audit_safetensors(a: Audit, n: int) -> None:
    tensors, metadata = safetensors_tensors(a.path)
    rel = results_relative(a.path) or ""
    config_path = a.path.parent / "config.json"
    if a.path.name == "heads.safetensors":
        a.kind = "pre-training heads (safetensors)"
        config_path = a.path.parent / "encoder" / "config.json"
    elif a.path.name == "mlm_head.safetensors":
        a.kind = "checkpoint MLM head (safetensors)"
    elif rel.startswith("state/"):
        a.kind = "resume state tensors (safetensors)"
    else:
        a.kind = "model weights (safetensors)"
    describe_origin(a, "a safetensors file")
    if a.kind.startswith("model weights"):
        a.say(f"  (one file of the model folder {a.path.parent}: audit the folder for the rest)")
    params = sum(int(np.prod(t["shape"])) for t in tensors.values())
    dtypes = sorted({t["dtype"] for t in tensors.values()})
    a.say(f"-- {len(tensors)} tensors, {params:,} parameters, dtypes {dtypes}")
    if metadata:
        a.say(f"  metadata: {short(json.dumps(metadata, sort_keys=True), 300)}")
    groups: dict[str, int] = {}
    for name in tensors:
        groups[name.split(".")[0]] = groups.get(name.split(".")[0], 0) + 1
    a.say("  groups: " + ", ".join(f"{g} ({k} tensors)" for g, k in sorted(groups.items())))
    for name, t in list(tensors.items())[: n * 6]:
        a.say(f"  {name}: {t['shape']} {t['dtype']}")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.check("holds at least one tensor", bool(tensors))
    bad = tensors_not_finite(a.path)
    detail = f"{len(bad)} tensors, e.g. {bad[:3]}" if bad else ""
    a.check("every value finite (no nan, inf)", not bad, detail)
    if a.kind.startswith(("pre-training heads", "checkpoint MLM head")) and config_path.is_file():
        cfg = json.loads(config_path.read_text())
        sizes = {cfg.get("hidden_size"), cfg.get("vocab_size")}
        odd = [k for k, t in tensors.items() if not set(t["shape"]) <= sizes]
        a.check(
            f"every dimension is the encoder's hidden or vocabulary size ({config_path})",
            not odd,
            f"e.g. {odd[:3]}" if odd else "",
        )
    if a.path.name == "heads.safetensors" and "objective" in metadata:
        training = a.path.parent / "encoder" / "training.json"
        if training.is_file():
            objective = json.loads(training.read_text()).get("objective")
            a.check(
                "objective equals the encoder's training.json",
                objective == metadata["objective"],
                f"{metadata['objective']} vs {objective}",
            )


KINDS = [
    Kind(".safetensors", RANK_NAME + 5, "file", lambda p: p.name.endswith(".safetensors"),
         audit_safetensors),
]
