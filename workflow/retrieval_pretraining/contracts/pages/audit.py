"""How `audit` shows and checks the pages: HTML complete with visible text, Markdown with its
headings and rows (tables.md: its provenance section names what it must), tables.json's cells."""

from __future__ import annotations

import html as _html
import json
import re
from typing import Any

from ..base import (
    RANK_JSON, RANK_NAME, Audit, Kind, NotAnArtifact, describe_origin, json_kind, read_manifest,
    short, show_manifest, show_snakemake_record,
)

FILES = [
    ("tables.md", "the results tables with significance marks and provenance", "make_tables"),
    ("report/tables.html", "the results tables as HTML (Snakemake report)", "make_tables"),
    ("report/tables.json", "the results tables as JSON (values, marks, tests)", "make_tables"),
    ("report/stage-statistics.html", "per-stage statistics from the artifacts' manifests",
     "stage_statistics"),
    ("report.html", "the Snakemake report", "`snakemake --report`"),
]
# What the provenance block of results/tables.md (tables.provenance) must name, and its line.
PROVENANCE_FIELDS = {
    "config hash": "- config hash",
    "code version": "- tables built with",
    "date": "- date",
    "hardware": "- tables built on",
}


def _page_text(a: Audit, label: str) -> str:
    try:
        return a.path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise NotAnArtifact(f"{a.path}: not a UTF-8 {label} ({error})") from error


def audit_html(a: Audit, n: int) -> None:
    text = _page_text(a, "HTML page")
    if "<html" not in text[:4000].lower():
        raise NotAnArtifact(f"{a.path}: no <html> element: not an HTML page")
    a.kind = "report page (HTML)"
    describe_origin(a, "an HTML page")
    title = re.search(r"<title>(.*?)</title>", text, re.S | re.I)
    rows = len(re.findall(r"<tr[ >]", text, re.I))
    a.say(
        f"-- title {_html.unescape(title.group(1).strip()) if title else None!r}, "
        f"{a.path.stat().st_size:,} bytes, {len(re.findall(r'<table', text, re.I))} tables, "
        f"{rows} table rows"
    )
    source = {"tables.html": a.path.parent.parent / "tables.md"}.get(
        a.path.name, a.path.with_suffix(".md")
    )
    if source.is_file():
        a.say(f"  the same as Markdown: {source}")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    body = re.sub(r"(?s)<(script|style|head)\b.*?</\1>", " ", text)
    words = _html.unescape(" ".join(re.sub(r"<[^>]+>", " ", body).split()))
    a.say(f"  text: {short(words, 400)}")
    a.check("complete HTML document (ends with </html>)", text.rstrip().lower().endswith("</html>"))
    a.check("has visible text", bool(words))


def audit_markdown(a: Audit, n: int) -> None:
    text = _page_text(a, "Markdown page")
    a.kind = "Markdown page"
    describe_origin(a, "a Markdown page")
    lines = text.splitlines()
    headings = [l.lstrip("#").strip() for l in lines if l.startswith("#")]
    rows = [l for l in lines if l.startswith("|") and not re.fullmatch(r"\|[\s:|-]+\|", l)]
    a.say(f"-- {len(lines)} lines, {a.path.stat().st_size:,} bytes, {len(rows)} table rows")
    a.say(f"  headings: {short(' / '.join(headings), 300)}")
    show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    for line in [l for l in lines if l.strip()][: n * 3]:
        a.say(f"  {short(line, 200)}")
    a.check("not empty", bool(text.strip()))
    if a.path.name == "tables.md":
        provenance = text.split("## Provenance", 1)[1] if "## Provenance" in text else ""
        a.check("has a Provenance section", bool(provenance))
        for label, line in PROVENANCE_FIELDS.items():
            a.check(f"provenance names the {label}", line in provenance)


def _cell(c: dict[str, Any]) -> str:
    return f"{c['column']} " + (
        "–" if c["value"] is None else f"{c['value']:.4f}{c.get('marks') or ''}"
    )


def audit_tables_json(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "results tables (JSON)"
    describe_origin(a, "a tables JSON")
    show_snakemake_record(a, a.path)
    empty = []
    for name, groups in data["tables"].items():
        rows = [r for g in groups for r in g["rows"]]
        a.say(f"-- table {name}: {len(groups)} groups, {len(rows)} rows")
        for g in groups:
            a.say(f"  {g['group']}")
            for r in g["rows"][: n * 3]:
                values = ", ".join(_cell(c) for c in r["cells"])
                a.say(f"    {r['label']} [{r['system'] or 'reference'}]: {values}")
        empty += [
            f"{name}: {r['label']}"
            for r in rows
            if r["system"] is not None and any(c["value"] is None for c in r["cells"])
        ]
    if data.get("low_resource"):
        a.say(f"-- low-resource: {short(json.dumps(data['low_resource'], sort_keys=True), 300)}")
    a.check(
        "no metrics file missing",
        not data["missing"],
        ", ".join(data["missing"][:5]) if data["missing"] else "",
    )
    a.check("every system row has a value in every column", not empty, ", ".join(empty[:5]))


KINDS = [
    Kind(".html", RANK_NAME + 7, "file", lambda p: p.name.endswith(".html"),
         audit_html),
    Kind(".md", RANK_NAME + 8, "file", lambda p: p.name.endswith(".md"),
         audit_markdown),
    json_kind("tables.json", RANK_JSON + 3,
              lambda p: isinstance(p.data, dict) and {"tables", "missing"} <= set(p.data),
              audit_tables_json),
]
