"""How `audit` checks a figure (an intact PNG with the numbers behind it beside it) and an
analysis's numbers (the figure they describe exists, every number finite)."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from ..base import (
    RANK_JSON, RANK_NAME, Audit, Kind, NotAnArtifact, describe_origin, json_kind, read_manifest,
    results_relative, short, show_manifest, show_snakemake_record,
)

FILES = [
    ("analysis/low-resource.*", "low-resource fine-tuning figure and its numbers",
     "low_resource_figure"),
    ("analysis/loss-curves.*", "every pre-training run's loss terms on shared axes",
     "loss_curves"),
    ("analysis/tsne/*", "t-SNE of one query's top candidates per fine-tuned model",
     "tsne_candidates"),
    ("analysis/coverage.*", "input-token coverage of [CLS] projected to the vocabulary",
     "token_coverage"),
    ("analysis/cpdae-top-words.*", "the CPDAE decoder's top words for sample texts",
     "cpdae_top_words"),
]


def audit_png(a: Audit, n: int) -> None:
    with open(a.path, "rb") as handle:
        head = handle.read(24)
    if not head.startswith(b"\x89PNG\r\n\x1a\n") or head[12:16] != b"IHDR":
        raise NotAnArtifact(f"{a.path}: not a PNG image (starts with {head[:8]!r})")
    width, height = struct.unpack(">II", head[16:24])
    a.kind = "figure (PNG)"
    describe_origin(a, "a PNG image")
    a.say(f"-- {width} x {height} pixels, {a.path.stat().st_size:,} bytes")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    from PIL import Image

    try:
        with Image.open(a.path) as image:
            image.verify()  # chunk checksums: a truncated or damaged file fails here
        intact = True, ""
    except Exception as error:  # PIL raises several types for a damaged image
        intact = False, str(error)
    a.check("PNG intact (chunk checksums verify)", *intact)
    a.check("image has pixels", width > 0 and height > 0, f"{width} x {height}")
    source = {
        "loss.png": a.path.with_name("metrics.jsonl"),
        "lengths.png": a.path.parent,
    }.get(a.path.name, a.path.with_suffix(".json"))
    if source.exists() or (results_relative(a.path) or "").startswith("analysis/"):
        a.check(f"the numbers behind it exist ({source.name})", source.exists(), str(source))


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def audit_analysis_json(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "analysis numbers (JSON)"
    describe_origin(a, "an analysis JSON")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    a.say("-- " + short(json.dumps(data, sort_keys=True), 1500))
    figure = a.path.with_suffix(".png")
    a.check("the figure these numbers describe exists", figure.is_file(), str(figure))
    a.check("not empty", bool(data))
    numbers = _numbers(data)
    a.check("every number finite", all(math.isfinite(v) for v in numbers))


KINDS = [
    Kind(".png", RANK_NAME + 6, "file", lambda p: p.name.endswith(".png"), audit_png),
    json_kind("an analysis's numbers", RANK_JSON + 7, lambda p: p.rel.startswith("analysis/"),
              audit_analysis_json),
]
