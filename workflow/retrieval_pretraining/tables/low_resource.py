"""The low-resource fine-tuning summary: mean ± sd over sampled training-query splits per
(model, N), as a table and as a Figure-4-style plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import artifacts
from .layout import model_labels
from .metrics import MetricsCache, measure_value
from .render import escaped, heading


def low_resource(
    spec: dict[str, Any], params: dict[str, Any], cache: MetricsCache, figure: Path | None
) -> tuple[str, dict[str, Any]]:
    """Mean and standard deviation over K sampled splits per (model, N): the table (Markdown),
    and the Figure-4-style plot when `figure` is given."""
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
    # Every configured model and size, None where no split was scored (partial tables): the
    # Markdown's – and tables.json's null, as a main table's missing cell is a null value.
    summary = {
        model: {n: summarise(data.get(model, {}).get(n)) for n in spec["sizes"]}
        for model in spec["models"]
    }
    decimals = params["report"].get("decimals", 3)
    k = spec["splits"]
    over = (f"mean ± sd over {k} sampled training-query splits per size" if k > 1 else
            "one sampled training-query split per size, so a mean without sd")
    lines = [
        heading(spec.get("title") or "Low-resource fine-tuning"),
        "",
        f"{spec['dataset']} {spec['split']} {spec['measure']}, {over}.",
        "",
        "| model | " + " | ".join(f"N={n}" for n in spec["sizes"]) + " |",
        "|---|" + "---:|" * len(spec["sizes"]),
    ]
    # Every configured model has its row: one whose runs were all missing shows – throughout.
    for model in spec["models"]:
        cells = [render_cell(summary[model][n], k, decimals) for n in spec["sizes"]]
        lines.append(f"| {escaped(labels.get(model, model))} | " + " | ".join(cells) + " |")
    found = [c for per_n in summary.values() for c in per_n.values() if c is not None]
    if any(c["splits"] < k for c in found):
        lines += ["", legend(k, found)]
    if figure is not None:
        plot_low_resource(points(summary), spec, labels, figure)
        if k == 1:
            bars = "means of one split each, no error bars"
        else:
            bars = "mean ± sd error bars" + (
                "; none on a point over one split" if any(c["std"] is None for c in found) else "")
        lines += ["", f"Figure: `{figure}` ({bars})."]
    return "\n".join(lines) + "\n", summary


def summarise(values: list[float] | None) -> dict[str, Any] | None:
    """Mean, sd and count of one (model, N)'s split values; None where none was found."""
    if not values:
        return None
    return {
        "mean": float(np.mean(values)),
        # The sd of one value is undefined, not 0 (no spread): None in tables.json.
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
        "splits": len(values),
    }


def points(summary: dict[str, dict[int, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """The cells the figure can draw: a size without a value has no point, a model without any
    no line (nor a legend entry)."""
    drawn = {model: {n: c for n, c in per_n.items() if c is not None}
             for model, per_n in summary.items()}
    return {model: per_n for model, per_n in drawn.items() if per_n}


def render_cell(cell: dict[str, Any] | None, splits: int, decimals: int) -> str:
    """mean ± sd; "± n/a" where one split of several was found (the sd of one value is
    undefined); how many splits, where fewer than the `splits` the text above the table states
    (the others' metrics missing: partial tables); – where none was."""
    if cell is None:
        return "–"
    text = f"{cell['mean']:.{decimals}f}"
    if splits > 1:
        sd = "n/a" if cell["std"] is None else f"{cell['std']:.{decimals}f}"
        text += f" ± {sd}"
    if cell["splits"] < splits:
        text += f" ({cell['splits']} of {splits} splits)"
    return text


def legend(splits: int, found: list[dict[str, Any]]) -> str:
    """What the marks on cells over fewer splits mean, as the main tables' legends explain
    theirs; written only where such a cell is shown."""
    text = (f"Legend: a cell over fewer than {splits} splits says how many were found; the "
            "others' metrics files are missing (listed under Missing) and left out of its mean")
    if any(c["std"] is None for c in found):
        text += "; ± n/a: one split, whose sd is undefined"
    return text + "."


def plot_low_resource(summary, spec, labels, figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model, per_n in summary.items():
        ns = sorted(per_n)
        ax.errorbar(
            ns,
            [per_n[n]["mean"] for n in ns],
            # NaN draws no bar: a bar of 0 would read as no spread between splits.
            yerr=[np.nan if per_n[n]["std"] is None else per_n[n]["std"] for n in ns],
            marker="o",
            capsize=3,
            label=labels.get(model, model),
        )
    ax.set_xscale("log")
    ax.set_xticks(spec["sizes"], [str(n) for n in spec["sizes"]])
    # A log axis also labels its minor ticks ("6x10^2" over "500"): the sizes alone are named.
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training queries (N)")
    ax.set_ylabel(spec["measure"])
    ax.set_title(f"{spec['dataset']} {spec['split']}")
    ax.legend()
    fig.tight_layout()
    with artifacts.atomic_path(figure) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
