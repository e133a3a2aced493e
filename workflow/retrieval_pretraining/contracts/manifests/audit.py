"""How `audit` shows a manifest file on its own: what produced the artifact, from which inputs
(each checked against its recorded checksum), with which libraries."""

from __future__ import annotations

import json

from ..base import RANK_JSON, Audit, json_kind, show_manifest

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
