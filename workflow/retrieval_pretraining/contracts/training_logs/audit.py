"""How `audit` shows and checks a trainer's metrics.jsonl (steps increasing, numbers finite) and
the resume state records of results/state/."""

from __future__ import annotations

import json
import math

from ..base import (
    RANK_JSON, RANK_NAME, Audit, Kind, NotAnArtifact, describe_origin, json_kind, short,
)

FILES = [
    ("pretrain/*/loss.png", "pre-training loss curve (from metrics.jsonl beside it)",
     "pretrain_model / export_base_encoder"),
    ("finetune/*/loss.png", "fine-tuning loss curve (from metrics.jsonl beside it)",
     "finetune_stage1 / finetune_stage2"),
    ("state/*",
     "resume state of a training job (outside the declared outputs; deleted when the job ends)",
     "pretrain_model / finetune_stage1 / finetune_stage2"),
]


def audit_jsonl(a: Audit, n: int) -> None:
    a.kind = "training metrics (JSON lines)"
    records = []
    for number, line in enumerate(a.path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise NotAnArtifact(f"{a.path}:{number}: not a JSON line ({error})") from error
    steps = [r["step"] for r in records if "step" in r]
    a.say(f"-- {len(records)} records, keys {sorted({k for r in records for k in r})}")
    a.check("steps increase", all(x < y for x, y in zip(steps, steps[1:])))
    numeric = [v for r in records for v in r.values() if isinstance(v, float)]
    a.check("every logged number finite", all(math.isfinite(v) for v in numeric))
    for r in records[:n] + (records[-1:] if len(records) > n else []):
        a.say("  " + short(json.dumps(r, sort_keys=True), 240))


def audit_state_json(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "resume state record (JSON)"
    describe_origin(a, "a resume state record")
    a.say(short(json.dumps(data, sort_keys=True), 1000))


KINDS = [
    Kind(".jsonl", RANK_NAME + 1, "file", lambda p: p.name.endswith(".jsonl"),
         audit_jsonl),
    json_kind("a resume state record", RANK_JSON + 8, lambda p: p.rel.startswith("state/"),
              audit_state_json),
]
