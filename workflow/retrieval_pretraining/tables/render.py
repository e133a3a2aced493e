"""A built table as Markdown: the cells with their marks and published values, and the legend."""

from __future__ import annotations

import re
from typing import Any

from .layout import MEASURED_MARK, Cell, Group, column_label, shown
from .significance import (CORRECTIONS, TESTS, WORSE, baselines_for, family_sizes, settings,
                           tested_baselines)


# Markdown's inline specials, and `|` (it would end a table cell): a label's own are shown, not
# rendered as emphasis, code, a tag, an entity or a link (markdown_html.py reads the escapes back).
SPECIALS = re.compile(r"([\\`*_<\[\]|~&])")


def escaped(label: str) -> str:
    """A free-text label (or title) as Markdown text: each special character backslash-escaped."""
    return SPECIALS.sub(r"\\\1", label)


def heading(title: str) -> str:
    """A table's (or section's) title as a level-3 heading, shown as written: escaped, and a
    trailing run of `#` escaped too, which Markdown would take for the heading's closing hashes
    and drop ("Table 3 #" would show as "Table 3")."""
    return "### " + re.sub(r"(#+\s*)$", r"\\\1", escaped(title))


def fmt(value: float | None, decimals: int) -> str:
    return "–" if value is None else f"{value:.{decimals}f}"


def signed(delta: float, decimals: int) -> str:
    """+0.012, -0.003, or ±0.000 where the delta rounds to nothing (not "-0.000")."""
    text = f"{delta:+.{decimals}f}"
    return f"±{abs(delta):.{decimals}f}" if float(text) == 0 else text


def render_cell(cell: Cell, decimals: int) -> str:
    text = fmt(cell.value, decimals)
    if cell.bold:
        text = f"**{text}**"
    text += cell.marks
    if cell.published is not None:
        value, published = cell.value, cell.published.value
        # The difference of the two numbers shown, so that a reader's own subtraction agrees.
        gap = None if value is None else shown(value, decimals) - shown(published, decimals)
        delta = "" if gap is None else f", Δ {signed(gap, decimals)}"
        # A number measured here, not published, is marked as a reference row marks it.
        mark = MEASURED_MARK if cell.published.measured_here else ""
        text += f" ({cell.published.value:.{decimals}f}{mark}{delta})"
    return text


def render_table(spec: dict[str, Any], groups: list[Group], params: dict[str, Any]) -> str:
    decimals = params["report"].get("decimals", 3)
    cols = spec["columns"]
    lines = [
        heading(spec.get("title") or spec["name"]),
        "",
        "| system | " + " | ".join(escaped(column_label(c)) for c in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for group in groups:
        lines.append(f"| *{escaped(group.label)}* |" + " |" * len(cols))
        for row in group.rows:
            lines.append(
                f"| {escaped(row.label)} | "
                + " | ".join(render_cell(c, decimals) for c in row.cells) + " |"
            )
    lines += ["", legend(spec, groups, params), ""]
    return "\n".join(lines)


def method(spec: dict[str, Any], groups: list[Group], params: dict[str, Any]) -> str:
    """The test, the correction and its family, as the legend states them."""
    sig = settings(params)
    test = TESTS[sig["test"]] + " over per-query scores"
    if sig["test"] == "permutation":
        test += f" ({sig['permutations']:,} random sign flips)"
    if sig["correction"] == "none":
        return f"{test}, p ≤ {sig['alpha']:g}, not corrected for multiple testing"
    sizes = family_sizes(spec, groups, params)
    family = ", ".join(f"{mark} {m} test{'s' if m != 1 else ''}" for mark, m in sizes.items())
    return (
        f"{test}, {CORRECTIONS[sig['correction']]}-adjusted p ≤ {sig['alpha']:g}; the "
        "correction's family is one mark in one column, i.e. every row tested against that "
        "baseline there"
        + (f": {family}" if family else "")
    )


def thresholds(spec: dict[str, Any], groups: list[Group]) -> str:
    """Which grade a column's binary measure counted as relevant, where not 1 (TREC DL passage
    recall at grade >= 2): the label alone ("DL19 R@1000") does not say."""
    lines = []
    for i, column in enumerate(spec["columns"]):
        levels = sorted({r.cells[i].threshold for g in groups for r in g.rows
                         if r.cells[i].threshold is not None})
        if levels:
            grades = " or ".join(f"≥ {n}" for n in levels)
            lines.append(f" {escaped(column_label(column))} counts grade {grades} as relevant.")
    return "".join(lines)


def untested(spec: dict[str, Any], params: dict[str, Any]) -> str:
    """Why a table has no marks: it names no baselines, or none of them is a scored row of it."""
    if not baselines_for(spec, params):
        return "the table names no baselines"
    return "none of the baselines it names is a row here with scores"


def legend(spec: dict[str, Any], groups: list[Group], params: dict[str, Any]) -> str:
    parts = []
    for b in tested_baselines(spec, groups, params):
        who = b.get("label") or b.get("system") or (
            f"{b['model']} (same fine-tuning stage)" if "model" in b
            else f"the same model at {b['stage']}"
        )
        parts.append(f"{b['mark']} significantly different from {escaped(who)}")
    text = (
        f"{'; '.join(parts)} ({method(spec, groups, params)}); a mark followed by {WORSE} means "
        "significantly worse, a bare mark significantly better. "
        if parts
        else f"no significance tests ({untested(spec, params)}). "
    ) + "Bold: best value of the column within its group." + thresholds(spec, groups)
    if any(c.published for g in groups for r in g.rows for c in r.cells):
        sources = sorted(
            {
                c.published.source + (f" [{c.published.note}]" if c.published.note else "")
                for g in groups
                for r in g.rows
                for c in r.cells
                if c.published
            }
        )
        measured = any(c.published and c.published.measured_here
                       for g in groups for r in g.rows for c in r.cells)
        text += (
            " In parentheses: the published value"
            + (f" ({MEASURED_MARK}: not published but measured on the same data)"
               if measured else "")
            + " and our delta (ours − published); sources: " + "; ".join(sources) + "."
        )
    if any(r.reference for g in groups for r in g.rows):
        text += " Reference rows are published numbers on the same data, not produced by this run"
        measured = sorted({c.reference_source for g in groups for r in g.rows if r.reference
                           for c in r.cells if c.reference_source})
        text += (f"; {MEASURED_MARK} marks a value not published but measured on the same data "
                 f"({'; '.join(measured)})." if measured else ".")
    return "Legend: " + text
