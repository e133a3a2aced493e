"""What a table is made of: cells, rows, groups of rows, and how models and columns are labelled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import paper_numbers

# Beside a reference row's value that was measured, not published (paper_numbers' "measured here").
MEASURED_MARK = "*"


def shown(value: float, decimals: int) -> float:
    """The value as a cell shows it: what bold and a published number's delta compare."""
    return float(f"{value:.{decimals}f}")

DISPLAY = {
    "none": "BERT",
    "mlm": "MLM",
    "costa": "COSTA",
    "cpdae": "CPDAE",
    "cpdae_r": "CPDAE_R",
    "bow": "BoW",
    "condenser": "Condenser",
    "cocondenser": "coCondenser",
    "retromae": "RetroMAE (enhanced decoding)",
    "ae_decoder": "AE decoder",
    "ar_decoder": "AR decoder",
}


@dataclass
class Cell:
    value: float | None
    marks: str = ""
    published: paper_numbers.Published | None = None
    bold: bool = False
    tests: dict[str, dict[str, float]] = field(default_factory=dict)
    # A reference row's value measured here rather than published: its source, shown in the legend.
    reference_source: str = ""
    # The lowest grade the measure counted as relevant, where not 1 (Metrics.threshold).
    threshold: int | None = None


@dataclass
class Row:
    label: str
    system: str | None  # None for a published reference row
    model: str | None = None
    objective: str | None = None
    cells: list[Cell] = field(default_factory=list)
    reference: bool = False


@dataclass
class Group:
    label: str
    rows: list[Row]
    suffix: str | None = None


def model_labels(models: list[dict[str, Any]]) -> dict[str, str]:
    """'COSTA' for the only costa model, 'COSTA (costa-t10)' when several share an objective."""
    counts: dict[str, int] = {}
    for m in models:
        counts[m["objective"]] = counts.get(m["objective"], 0) + 1
    labels = {}
    for m in models:
        base = DISPLAY.get(m["objective"], m["objective"])
        labels[m["name"]] = base if counts[m["objective"]] == 1 else f"{base} ({m['name']})"
    return labels


def column_label(c: dict[str, Any]) -> str:
    return c.get("label") or f"{c['dataset']} {c['split']} {c['measure']}"
