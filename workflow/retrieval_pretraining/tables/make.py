"""tables.md (+ its JSON and HTML copies, + the low-resource figure) from the report config; or the
low-resource section alone with its figure (`make_low_resource`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import artifacts
from ..markdown_html import markdown_to_html
from .build import build_table
from .layout import column_label
from .low_resource import low_resource
from .metrics import MetricsCache
from .provenance import missing_files, provenance
from .render import render_table


def make_tables(
    params: dict[str, Any],
    results: Path,
    out: Path,
    json_out: Path | None = None,
    figure: Path | None = None,
    allow_missing: bool = False,
    html_out: Path | None = None,
) -> dict[str, Any]:
    """Write tables.md (+ JSON, + HTML for the report, + the low-resource figure when given)."""
    cache = MetricsCache(results, allow_missing)
    report = params["report"]
    built = [(spec, build_table(spec, params, cache)) for spec in report["tables"]]
    parts = [f"# Results: experiment `{params.get('experiment', 'unknown')}`", ""]
    for spec, groups in built:
        parts.append(render_table(spec, groups, params))
    lowres_summary = None
    if report.get("low_resource"):
        text, lowres_summary = low_resource(report["low_resource"], params, cache, figure)
        parts.append(text)
    parts.append(provenance(params, results, built, cache))
    with artifacts.atomic_path(out) as tmp:
        tmp.write_text("\n".join(parts))
    if html_out is not None:
        with artifacts.atomic_path(html_out) as tmp:
            tmp.write_text(
                markdown_to_html("\n".join(parts), f"Results: {params.get('experiment')}")
            )
    summary = {
        "tables": {
            spec["name"]: [
                {
                    "group": g.label,
                    "rows": [
                        {
                            "label": r.label,
                            "system": r.system,
                            "cells": [
                                {
                                    "column": column_label(c),
                                    "value": cell.value,
                                    "marks": cell.marks,
                                    "bold": cell.bold,
                                    "tests": json_tests(cell.tests),
                                    "published": cell.published.value if cell.published else None,
                                }
                                for c, cell in zip(spec["columns"], r.cells)
                            ],
                        }
                        for r in g.rows
                    ],
                }
                for g in groups
            ]
            for spec, groups in built
        },
        "low_resource": lowres_summary,
        "missing": [str(p) for p in cache.missing],
        # The config whose hash the provenance block prints, so that the hash can be checked.
        "resolved_config": params.get("resolved_config"),
    }
    if json_out is not None:
        artifacts.write_json(json_out, summary)
    return summary


def json_tests(tests: dict[str, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """A cell's tests with null for a value that is not a finite number: identical scores leave
    t and p undefined (NaN) and a constant difference makes t infinite, which json.dumps would
    write as NaN and Infinity, not JSON to any reader but Python's."""
    return {
        base: {k: v if not isinstance(v, float) or math.isfinite(v) else None
               for k, v in test.items()}
        for base, test in tests.items()
    }


def make_low_resource(
    params: dict[str, Any], results: Path, out: Path, figure: Path | None = None,
    allow_missing: bool = False,
) -> dict[str, Any]:
    """Write the low-resource section alone (the same Markdown tables.md holds) and its figure,
    reading only the low-resource runs' metrics: the figure's rule depends on nothing else."""
    spec = params["report"].get("low_resource")
    if not spec:
        raise ValueError("the report has no low_resource section to write")
    cache = MetricsCache(results, allow_missing)
    text, summary = low_resource(spec, params, cache, figure)
    # What it went without, as tables.md's provenance lists it: else a cell could average fewer
    # splits than the text says with no file named.
    left_out = missing_files(cache, "left out of their cells' means; a size with none shows –")
    with artifacts.atomic_path(out) as tmp:
        tmp.write_text(text + "\n".join(left_out) + ("\n" if left_out else ""))
    return summary
