"""Results tables (results/tables.md) from the per-query metrics of every configured system.

Shaped like the COSTA paper's Tables 2/3: a BM25 row, then one group of rows per fine-tuning stage
(BM25 negatives, hard negatives; for documents, mining rounds), one row per pre-trained model, one
column per (dataset, split, measure). Everything is driven by the `report` config section, so
ablation tables and the low-resource figure are new config entries, not new code.

Significance is a two-tailed paired t-test over the per-query scores of the metrics JSON files
(scores contract), computed here from its formula so that tests can check it against scipy.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from . import artifacts, paper_numbers
from .config import stage_parser

log = logging.getLogger(__name__)

DISPLAY = {
    "none": "BERT",
    "mlm": "MLM",
    "costa": "COSTA",
    "cpdae": "CPDAE",
    "cpdae_r": "CPDAE_R",
    "bow": "BoW",
}
WORSE = "↓"  # follows a baseline's mark when the row is significantly WORSE than that baseline


class MetricsError(ValueError):
    """A metrics file is missing, malformed, or lacks the measure a table asks for."""


# ----------------------------------------------------------------------------- statistics
def paired_t_test(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-tailed paired t-test of a vs b: t = mean(d) / (sd(d) / sqrt(n)), df = n - 1.

    Zero variance: identical scores give (nan, nan) (no evidence either way); a constant non-zero
    difference gives (+-inf, 0.0).
    """
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = d.size
    if n < 2:
        return math.nan, math.nan
    mean, sd = d.mean(), d.std(ddof=1)
    if sd == 0:
        return (math.nan, math.nan) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    t = mean / (sd / math.sqrt(n))
    return float(t), float(2 * stats.t.sf(abs(t), df=n - 1))


# ----------------------------------------------------------------------------- inputs
def metrics_path(results: Path, dataset: str, system: str, split: str) -> Path:
    return results / "metrics" / dataset / system / f"{split}.json"


@dataclass
class Metrics:
    path: Path
    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]
    run: str | None


def load_metrics(path: Path) -> Metrics:
    if not path.is_file():
        raise MetricsError(
            f"metrics file {path} does not exist; build it with "
            f"`snakemake {path}` (rule score_run)"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise MetricsError(f"{path}: not JSON ({error}); delete it and rerun score_run") from error
    for key in ("aggregate", "per_query"):
        if not isinstance(data.get(key), dict):
            raise MetricsError(
                f"{path}: key '{key}' missing or not an object (scores contract: "
                "aggregate, per_query, run, qrels, measures)"
            )
    return Metrics(path, data["aggregate"], data["per_query"], data.get("run"))


class MetricsCache:
    def __init__(self, results: Path, allow_missing: bool = False):
        self.results, self.allow_missing, self._cache = results, allow_missing, {}
        self.missing: list[Path] = []

    def get(self, dataset: str, system: str, split: str) -> Metrics | None:
        path = metrics_path(self.results, dataset, system, split)
        if path not in self._cache:
            try:
                self._cache[path] = load_metrics(path)
            except MetricsError:
                if not (self.allow_missing and not path.exists()):
                    raise
                self.missing.append(path)
                self._cache[path] = None
        return self._cache[path]


def measure_value(m: Metrics, measure: str) -> float:
    if measure not in m.aggregate:
        raise MetricsError(
            f"{m.path}: no aggregate value for {measure!r} (it has "
            f"{', '.join(sorted(m.aggregate))}); add it to the evaluate config"
        )
    return float(m.aggregate[measure])


def paired_scores(a: Metrics, b: Metrics, measure: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-query scores of both systems on the queries both were scored on (and how many differ)."""
    for m in (a, b):
        if measure not in m.per_query:
            raise MetricsError(
                f"{m.path}: no per-query scores for {measure!r}; the significance "
                "test needs them (scores contract: per_query)"
            )
    qa, qb = a.per_query[measure], b.per_query[measure]
    common = sorted(set(qa) & set(qb))
    unmatched = len(set(qa) ^ set(qb))
    return (
        np.array([qa[q] for q in common], dtype=np.float64),
        np.array([qb[q] for q in common], dtype=np.float64),
        unmatched,
    )


# ----------------------------------------------------------------------------- table model
@dataclass
class Cell:
    value: float | None
    marks: str = ""
    published: paper_numbers.Published | None = None
    bold: bool = False
    tests: dict[str, dict[str, float]] = field(default_factory=dict)


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


# Same format as bm25.run_label, the label each BM25 run records (not imported: bm25.py belongs to
# the Pyserini toolchain, which the tables' environment does not carry).
def k1_b(k1: float, b: float) -> str:
    return f"k1={k1:g}, b={b:g}"


def _recorded(bm25: dict[str, Any] | None) -> bool:
    return bool(bm25) and bm25.get("k1") is not None and bm25.get("b") is not None


def bm25_label(bm25: dict[str, Any] | None) -> str:
    if _recorded(bm25):
        return f"BM25 ({k1_b(bm25['k1'], bm25['b'])})"
    return "BM25 (k1/b not recorded)"


def bm25_settings(params: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The k1/b BM25 ran with on `dataset` (bm25.overrides applied), else the shared values."""
    return (params.get("bm25_by_dataset") or {}).get(dataset) or params.get("bm25") or {}


def bm25_row_label(params: dict[str, Any], columns: list[dict[str, Any]]) -> str:
    """One label when every column's BM25 used the same k1/b; otherwise each dataset's."""
    per_dataset = {c["dataset"]: bm25_settings(params, c["dataset"]) for c in columns}
    distinct = {(s.get("k1"), s.get("b")) for s in per_dataset.values()}
    if len(distinct) <= 1:
        return bm25_label(next(iter(per_dataset.values()), params.get("bm25")))
    parts = [
        f"{d}: {k1_b(s['k1'], s['b']) if _recorded(s) else 'k1/b not recorded'}"
        for d, s in per_dataset.items()
    ]
    return f"BM25 ({'; '.join(parts)})"


def encoder_dataset(params: dict[str, Any], dataset: str) -> str:
    """The dataset whose fine-tuned encoder produced runs on `dataset` (itself, or its zero-shot
    source from evaluate.zero_shot)."""
    return (params.get("trained_on") or {}).get(dataset, dataset)


def build_table(spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache) -> list[Group]:
    report = params["report"]
    models = params["models"]
    by_name = {m["name"]: m for m in models}
    labels = model_labels(models)
    stages = spec.get("groups") or report["stages"]
    row_specs = spec.get("rows") or [{"model": m["name"]} for m in models]
    for r in row_specs:
        if r["model"] not in by_name:
            raise MetricsError(
                f"table {spec['name']!r}: row model {r['model']!r} is not a "
                f"pre-training model (known: {', '.join(by_name)})"
            )
    columns = spec["columns"]
    compare = report.get("compare_published", False)
    groups: list[Group] = []

    if spec.get("bm25", True):
        row = Row(bm25_row_label(params, columns), "bm25", objective="bm25")
        for c in columns:
            m = cache.get(c["dataset"], "bm25", c["split"])
            bm25 = bm25_settings(params, c["dataset"])
            pub = (
                paper_numbers.bm25_value(
                    bm25.get("k1"), bm25.get("b"), c.get("benchmark", ""), c["measure"]
                )
                if compare
                else None
            )
            row.cells.append(Cell(measure_value(m, c["measure"]) if m else None, published=pub))
        groups.append(Group("Sparse retrieval", [row]))

    for gi, stage in enumerate(stages):
        final = gi == len(stages) - 1
        rows = []
        for r in row_specs:
            model = by_name[r["model"]]
            row = Row(
                r.get("label") or labels[model["name"]],
                f"{model['name']}-{stage['suffix']}",
                model["name"],
                model["objective"],
            )
            for c in columns:
                m = cache.get(c["dataset"], row.system, c["split"])
                pub = None
                if compare and c.get("benchmark"):
                    pub = paper_numbers.paper_value(
                        model["objective"],
                        c["benchmark"],
                        c["measure"],
                        stage.get("paper_group"),
                        final_group=final,
                    )
                row.cells.append(Cell(measure_value(m, c["measure"]) if m else None, published=pub))
            rows.append(row)
        group = Group(stage["label"], rows, stage["suffix"])
        mark_significance(group, spec, params, cache)
        groups.append(group)

    refs = [
        Row(paper_numbers.ANCHORS[name]["label"], None, reference=True)
        for name in spec.get("reference_rows") or []
    ]
    for name, row in zip(spec.get("reference_rows") or [], refs):
        for c in columns:
            p = paper_numbers.anchor_value(name, c.get("benchmark", ""), c["measure"])
            row.cells.append(Cell(p.value if p else None))
    if refs:
        groups.append(Group("Published references (not ours; same data)", refs))

    for group in groups:
        mark_best(group)
    return groups


def baselines_for(spec: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
    if spec.get("baselines") is not None:
        return spec["baselines"]
    return params["report"]["significance"]["baselines"]


def mark_significance(
    group: Group, spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache
) -> None:
    alpha = params["report"]["significance"]["alpha"]
    for baseline in baselines_for(spec, params):
        base_system = baseline.get("system") or f"{baseline['model']}-{group.suffix}"
        for row in group.rows:
            if row.system == base_system:
                continue
            for c, cell in zip(spec["columns"], row.cells):
                ours = cache.get(c["dataset"], row.system, c["split"])
                base = cache.get(c["dataset"], base_system, c["split"])
                if ours is None or base is None:
                    continue
                a, b, unmatched = paired_scores(ours, base, c["measure"])
                if unmatched:
                    log.warning(
                        "%s vs %s on %s/%s %s: %d queries scored for only one system; "
                        "testing the %d common ones",
                        row.system,
                        base_system,
                        c["dataset"],
                        c["split"],
                        c["measure"],
                        unmatched,
                        a.size,
                    )
                t, p = paired_t_test(a, b)
                cell.tests[base_system] = {"t": t, "p": p, "n": int(a.size)}
                if not math.isnan(p) and p <= alpha:
                    cell.marks += baseline["mark"] + ("" if t > 0 else WORSE)


def mark_best(group: Group) -> None:
    """Bold the best value of each column within a group (higher is better for every measure used)."""
    if len(group.rows) < 2 or any(r.reference for r in group.rows):
        return
    for j in range(len(group.rows[0].cells)):
        values = [r.cells[j].value for r in group.rows if r.cells[j].value is not None]
        if not values:
            continue
        best = max(values)
        for r in group.rows:
            if r.cells[j].value is not None and r.cells[j].value == best:
                r.cells[j].bold = True


# ----------------------------------------------------------------------------- rendering
def fmt(value: float | None, decimals: int) -> str:
    return "–" if value is None else f"{value:.{decimals}f}"


def render_cell(cell: Cell, decimals: int) -> str:
    text = fmt(cell.value, decimals)
    if cell.bold:
        text = f"**{text}**"
    text += cell.marks
    if cell.published is not None:
        delta = (
            "" if cell.value is None else f", Δ {cell.value - cell.published.value:+.{decimals}f}"
        )
        text += f" ({cell.published.value:.{decimals}f}{delta})"
    return text


def column_label(c: dict[str, Any]) -> str:
    return c.get("label") or f"{c['dataset']} {c['split']} {c['measure']}"


def render_table(spec: dict[str, Any], groups: list[Group], params: dict[str, Any]) -> str:
    decimals = params["report"].get("decimals", 3)
    cols = spec["columns"]
    lines = [
        f"### {spec.get('title') or spec['name']}",
        "",
        "| system | " + " | ".join(column_label(c) for c in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for group in groups:
        lines.append(f"| *{group.label}* |" + " |" * len(cols))
        for row in group.rows:
            lines.append(
                f"| {row.label} | " + " | ".join(render_cell(c, decimals) for c in row.cells) + " |"
            )
    lines += ["", legend(spec, groups, params), ""]
    return "\n".join(lines)


def legend(spec: dict[str, Any], groups: list[Group], params: dict[str, Any]) -> str:
    sig = params["report"]["significance"]
    parts = []
    for b in baselines_for(spec, params):
        who = b.get("label") or b.get("system") or f"{b['model']} (same fine-tuning stage)"
        parts.append(f"{b['mark']} significantly different from {who}")
    text = (
        f"{'; '.join(parts)} (two-tailed paired t-test over per-query scores, "
        f"p ≤ {sig['alpha']:g}); a mark followed by {WORSE} means significantly worse, a bare "
        "mark significantly better. Bold: best value of the column within its group."
    )
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
        text += (
            " In parentheses: the published value and our delta (ours − published); "
            "sources: " + "; ".join(sources) + "."
        )
    if any(r.reference for g in groups for r in g.rows):
        text += " Reference rows are published numbers on the same data, not produced by this run."
    return "Legend: " + text


# ----------------------------------------------------------------------------- low resource
def low_resource(
    spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache, figure: Path | None
) -> tuple[str, dict[str, Any]]:
    """Mean and standard deviation over K sampled splits per (model, N); table + Figure-4-style plot."""
    labels = model_labels(params["models"])
    data: dict[str, dict[int, list[float]]] = {}
    for model in spec["models"]:
        for n in spec["sizes"]:
            for k in range(spec["splits"]):
                system = spec["system"].format(model=model, size=n, split=k)
                m = cache.get(spec["dataset"], system, spec["split"])
                if m is not None:
                    data.setdefault(model, {}).setdefault(n, []).append(
                        measure_value(m, spec["measure"])
                    )
    summary = {
        model: {
            n: {
                "mean": float(np.mean(v)),
                "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
                "splits": len(v),
            }
            for n, v in per_n.items()
        }
        for model, per_n in data.items()
    }
    decimals = params["report"].get("decimals", 3)
    lines = [
        f"### {spec.get('title') or 'Low-resource fine-tuning'}",
        "",
        f"{spec['dataset']} {spec['split']} {spec['measure']}, mean ± sd over {spec['splits']} "
        "sampled training-query splits per size.",
        "",
        "| model | " + " | ".join(f"N={n}" for n in spec["sizes"]) + " |",
        "|---|" + "---:|" * len(spec["sizes"]),
    ]
    for model, per_n in summary.items():
        cells = [
            (
                f"{per_n[n]['mean']:.{decimals}f} ± {per_n[n]['std']:.{decimals}f}"
                if n in per_n
                else "–"
            )
            for n in spec["sizes"]
        ]
        lines.append(f"| {labels.get(model, model)} | " + " | ".join(cells) + " |")
    if figure is not None:
        plot_low_resource(summary, spec, labels, figure)
        lines += ["", f"Figure: `{figure}` (mean ± sd error bars)."]
    return "\n".join(lines) + "\n", summary


def plot_low_resource(summary, spec, labels, figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model, per_n in summary.items():
        ns = sorted(per_n)
        ax.errorbar(
            ns,
            [per_n[n]["mean"] for n in ns],
            yerr=[per_n[n]["std"] for n in ns],
            marker="o",
            capsize=3,
            label=labels.get(model, model),
        )
    ax.set_xscale("log")
    ax.set_xticks(spec["sizes"], [str(n) for n in spec["sizes"]])
    ax.set_xlabel("training queries (N)")
    ax.set_ylabel(spec["measure"])
    ax.set_title(f"{spec['dataset']} {spec['split']}")
    ax.legend()
    fig.tight_layout()
    with artifacts.atomic_path(figure) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- provenance
def hardware(results: Path, models: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"tables built on: {platform.node() or 'unknown host'}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs"
    ]
    for m in models:
        training = results / "pretrain" / m["name"] / "encoder" / "training.json"
        if training.is_file():
            info = json.loads(training.read_text())
            hw = {
                k: v
                for k, v in info.items()
                if k in ("hardware", "device", "devices", "world_size")
            }
            if hw:
                lines.append(f"pre-training `{m['name']}`: {json.dumps(hw, sort_keys=True)}")
    return lines


def provenance(
    params: dict[str, Any],
    results: Path,
    tables: list[tuple[dict, list[Group]]],
    cache: MetricsCache,
) -> str:
    lines = [
        "## Provenance",
        "",
        f"- experiment: `{params.get('experiment', 'unknown')}`",
        f"- config hash (sha256 of the resolved config): `{params.get('config_hash', 'unknown')}`",
        f"- code version: `{artifacts.git_version()}`",
        f"- date: {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}",
    ]
    lines += [f"- {h}" for h in hardware(results, params["models"])]
    lines += [
        "",
        "| system | dataset/split | run file | metrics | model | training log |",
        "|---|---|---|---|---|---|",
    ]
    seen = set()
    for spec, groups in tables:
        for group in groups:
            for row in group.rows:
                if row.system is None:
                    continue
                for c in spec["columns"]:
                    key = (row.system, c["dataset"], c["split"])
                    if key in seen:
                        continue
                    seen.add(key)
                    m = cache.get(c["dataset"], row.system, c["split"])
                    lines.append(
                        "| "
                        + " | ".join(
                            [
                                row.system,
                                f"{c['dataset']}/{c['split']}",
                                f"`{m.run}`" if m and m.run else "–",
                                f"`{metrics_path(results, c['dataset'], row.system, c['split'])}`",
                                model_location(results, row, c["dataset"], group, params),
                                log_location(results, row, c["dataset"], group, c["split"], params),
                            ]
                        )
                        + " |"
                    )
    if cache.missing:
        lines += ["", "Missing (shown as –): " + ", ".join(f"`{p}`" for p in cache.missing)]
    return "\n".join(lines) + "\n"


def model_location(
    results: Path, row: Row, dataset: str, group: Group, params: dict[str, Any] | None = None
) -> str:
    if row.model is None:
        return f"`{results / 'bm25' / dataset / 'index'}`"
    trained_on = encoder_dataset(params or {}, dataset)
    return f"`{results / 'finetune' / row.model / trained_on / group.suffix / 'encoder'}`"


def log_location(
    results: Path,
    row: Row,
    dataset: str,
    group: Group,
    split: str | None = None,
    params: dict[str, Any] | None = None,
) -> str:
    """The Snakemake job logs behind a row (rules/*.smk `log:`): BM25's index and search, or the
    model's pre-training and this fine-tuning stage (on the zero-shot source, for a target)."""
    logs = results / "logs"
    if row.model is None and row.system != "bm25":
        return "–"
    if row.model is None:
        paths = [logs / "build_bm25_index" / f"{dataset}.log"]
        paths += [logs / "bm25_search" / dataset / f"{split}.log"] if split else []
    else:
        pretrain_rule = "export_base_encoder" if row.objective == "none" else "pretrain_model"
        paths = [
            logs / pretrain_rule / f"{row.model}.log",
            logs / "finetune" / row.model / encoder_dataset(params or {}, dataset)
            / f"{group.suffix}.log",
        ]
    return ", ".join(f"`{p}`" for p in paths)


# ----------------------------------------------------------------------------- HTML for the report
def _inline(text: str) -> str:
    import html
    import re

    text = html.escape(text, quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![*\w])\*([^*]+?)\*(?![*\w])", r"<i>\1</i>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def markdown_to_html(markdown: str, title: str) -> str:
    """The small Markdown subset this package writes (headings, pipe tables, lists, paragraphs)
    as a standalone HTML page for the Snakemake report (which shows HTML, not Markdown)."""
    import html

    out, table, in_list = [], None, False
    for line in markdown.splitlines() + [""]:
        stripped = line.strip()
        if stripped.startswith("|"):
            cells = [c.strip() for c in stripped.strip("|").split("|")]
            if all(set(c) <= set("-:") and c for c in cells):
                continue  # the header separator row
            if table is None:
                table = [
                    "<table>",
                    "<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in cells) + "</tr>",
                ]
            else:
                table.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in cells) + "</tr>")
            continue
        if table is not None:
            out += table + ["</table>"]
            table = None
        if stripped.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{_inline(stripped[2:])}</li>")
            continue
        if in_list:
            out.append("</ul>")
            in_list = False
        if stripped.startswith("#"):
            level = len(stripped) - len(stripped.lstrip("#"))
            out.append(f"<h{level}>{_inline(stripped[level:].strip())}</h{level}>")
        elif stripped:
            out.append(f"<p>{_inline(stripped)}</p>")
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px}td{text-align:right}"
        "td:first-child{text-align:left}code{font-size:90%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n"
    )


# ----------------------------------------------------------------------------- driver
def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


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
                                    "tests": cell.tests,
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
    }
    if json_out is not None:
        artifacts.write_json(json_out, summary)
    return summary


def main() -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--out", type=Path, default=Path("results/tables.md"))
    parser.add_argument(
        "--json", type=Path, default=None, help="machine-readable copy of the tables"
    )
    parser.add_argument(
        "--html", type=Path, default=None, help="the tables as HTML (Snakemake report)"
    )
    parser.add_argument(
        "--figure", type=Path, default=None, help="the low-resource PNG (if configured)"
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="render a missing metrics file as – instead of failing (partial tables)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    make_tables(
        args.config, args.results, args.out, args.json, args.figure, args.allow_missing, args.html
    )
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
