"""One configured table built from the metrics: a BM25 row, one group of rows per fine-tuning
stage, a group of baseline encoders (evaluate.baselines), optional published reference rows; every
row tested against the table's significance baselines."""

from __future__ import annotations

from typing import Any

from .. import paper_numbers
from .layout import MEASURED_MARK, Cell, Group, Row, model_labels
from .metrics import Metrics, MetricsCache, MetricsError, measure_name, measure_value
from .significance import mark_best, mark_significance


# The k1/b part of bm25.run_label, the label each BM25 run records (not imported: bm25.py belongs
# to the Pyserini toolchain, which the tables' environment does not carry).
def k1_b(k1: float, b: float) -> str:
    return f"k1={k1:g}, b={b:g}"


def _recorded(bm25: dict[str, Any] | None) -> bool:
    return bool(bm25) and bm25.get("k1") is not None and bm25.get("b") is not None


# What a BM25 index holds, by bm25.title (its own setting: the dataset entry's `title` is how the
# encoders join title and text, so MS MARCO's encoders read titles its text-only index lacks).
INDEXED = {"none": "text only", "space": "title + text"}


def bm25_parts(bm25: dict[str, Any] | None) -> tuple[str, str]:
    """(k1/b, indexed text) as a label prints them."""
    bm25 = bm25 or {}
    k1b = k1_b(bm25["k1"], bm25["b"]) if _recorded(bm25) else "k1/b not recorded"
    title = bm25.get("title")
    return k1b, INDEXED.get(title, f"title {title}") if title else "title not recorded"


def bm25_settings(params: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The k1/b (and title setting) BM25 ran with on `dataset` (bm25.overrides applied), else the
    shared values."""
    return (params.get("bm25_by_dataset") or {}).get(dataset) or params.get("bm25") or {}


def bm25_row_label(params: dict[str, Any], columns: list[dict[str, Any]]) -> str:
    """The k1/b and the indexed text (title + text, or text only) every column's BM25 shares,
    then each dataset's own where they differ: "BM25 (k1=0.9, b=0.4; msmarco-passage: text only;
    scifact: title + text)". The title is always said: the papers' BM25 numbers differ by it."""
    per_dataset = {c["dataset"]: bm25_parts(bm25_settings(params, c["dataset"])) for c in columns}
    if not per_dataset:
        return f"BM25 ({', '.join(bm25_parts(params.get('bm25')))})"
    values = list(per_dataset.values())
    shared = [i for i in range(2) if all(v[i] == values[0][i] for v in values)]
    parts = [", ".join(values[0][i] for i in shared)] if shared else []
    if len(shared) < 2:
        parts += [f"{d}: {', '.join(v[i] for i in range(2) if i not in shared)}"
                  for d, v in per_dataset.items()]
    return f"BM25 ({'; '.join(parts)})"


def measured_cell(m: Metrics | None, measure: str,
                  published: paper_numbers.Published | None = None) -> Cell:
    """Our value (None where the metrics file is missing) and the grade it counted relevant."""
    if m is None:
        return Cell(None, published=published)
    return Cell(measure_value(m, measure), published=published, threshold=m.threshold(measure))


def build_table(spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache) -> list[Group]:
    report = params["report"]
    models = params["models"]
    by_name = {m["name"]: m for m in models}
    labels = model_labels(models)
    stages = spec.get("groups") or report["stages"]
    # rows: null = every model; [] = none (a table of baseline encoders alone).
    row_specs = [{"model": m["name"]} for m in models] if spec.get("rows") is None else spec["rows"]
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
                    bm25.get("k1"), bm25.get("b"), bm25.get("title"), c.get("benchmark", ""),
                    measure_name(c["measure"]),
                )
                if compare
                else None
            )
            row.cells.append(measured_cell(m, c["measure"], pub))
        groups.append(Group("Sparse retrieval", [row]))

    for gi, stage in enumerate(stages if row_specs else []):
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
                        measure_name(c["measure"]),
                        stage.get("paper_group"),
                        final_group=final,
                        in_domain=c["dataset"] in model.get("pretrained_on", ()),
                        zero_shot=c["dataset"] in (params.get("trained_on") or {}),
                        base=model.get("base"),
                    )
                row.cells.append(measured_cell(m, c["measure"], pub))
            rows.append(row)
        groups.append(Group(stage["label"], rows, stage["suffix"]))

    if spec.get("baseline_rows"):
        groups.append(baseline_group(spec, params, cache))
    mark_significance(groups, spec, params, cache)  # one family per baseline mark and column

    refs = [
        Row(paper_numbers.ANCHORS[name]["label"], None, reference=True)
        for name in spec.get("reference_rows") or []
    ]
    for name, row in zip(spec.get("reference_rows") or [], refs):
        for c in columns:
            p = paper_numbers.anchor_value(name, c.get("benchmark", ""),
                                           measure_name(c["measure"]))
            measured = p is not None and p.measured_here
            row.cells.append(Cell(p.value if p else None, marks=MEASURED_MARK if measured else "",
                                  reference_source=p.source if measured else ""))
    if refs:
        groups.append(Group("Published references (not ours; same data)", refs))

    for group in groups:
        mark_best(group, report.get("decimals", 3))
    return groups


def baseline_published(
    entry: dict[str, Any], column: dict[str, Any]
) -> paper_numbers.Published | None:
    """The baseline's published number for exactly this column's dataset, split and measure."""
    for p in entry.get("published") or []:
        if (p["dataset"], p["split"], measure_name(p["measure"])) == (
            column["dataset"], column["split"], measure_name(column["measure"])
        ):
            return paper_numbers.Published(
                p["source"], "baseline", f"{p['dataset']}/{p['split']}", p["measure"],
                p["value"], note=p.get("note", ""),
            )  # fmt: skip
    return None


def baseline_group(spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache) -> Group:
    """One row per listed baseline encoder (evaluate.baselines; rules/baselines.smk), its published
    number beside its value wherever the config gives one (whatever compare_published says: it is
    the baseline's own number, keyed by our dataset name)."""
    info = params.get("baselines") or {}
    rows = []
    for name in spec["baseline_rows"]:
        if name not in info:
            raise MetricsError(
                f"table {spec['name']!r}: baseline row {name!r} is not an evaluate.baselines "
                f"entry the report slice carries (known: {', '.join(info) or 'none'})"
            )
        row = Row(info[name].get("label") or name, name, objective="baseline")
        for c in spec["columns"]:
            m = cache.get(c["dataset"], name, c["split"])
            row.cells.append(measured_cell(m, c["measure"], baseline_published(info[name], c)))
        rows.append(row)
    return Group("Baseline encoders (zero-shot, not fine-tuned here)", rows)
