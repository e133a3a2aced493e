"""The manifest contract (beside every artifact: `x.manifest.json`, `folder/manifest.json`, a
download's `NAME.manifest.json`; written by artifacts.write_manifest).

{"stage", "created", "params", "inputs": {name: {path, sha256 | bytes}}, "stats", "versions", ...}:
what produced the artifact, from which inputs (with their checksums), with which libraries.
"""

from __future__ import annotations

import json

from .base import RANK_JSON, Audit, json_kind, show_manifest

KEYS = {"stage", "params", "versions"}  # what makes a JSON file a manifest


def audit_manifest(a: Audit, n: int) -> None:
    a.kind = "manifest"
    show_manifest(a, json.loads(a.path.read_text()))


KINDS = [
    json_kind(
        "a manifest", RANK_JSON + 1, lambda p: isinstance(p.data, dict) and KEYS <= set(p.data),
        audit_manifest,
    ),
]
