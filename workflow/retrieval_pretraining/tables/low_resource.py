"""The low-resource fine-tuning summary: mean ± sd over sampled training-query splits per
(model, N), as a table and as a Figure-4-style plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import artifacts
from .layout import model_labels
from .metrics import MetricsCache, measure_value


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
