"""One configured table built from the metrics: a BM25 row, one group of rows per fine-tuning
stage (each tested against its baselines), and optional published reference rows."""

from __future__ import annotations

from typing import Any

from .. import paper_numbers
from .layout import Cell, Group, Row, model_labels
from .metrics import MetricsCache, MetricsError, measure_value
from .significance import mark_best, mark_significance


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
