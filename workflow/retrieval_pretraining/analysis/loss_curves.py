"""Every pre-training run's loss terms (metrics.jsonl) on shared axes, one panel per term."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import artifacts
from ..errors import InputFileError
from .common import pyplot, save_figure, write_manifest


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise InputFileError(
                    f"{path}:{number}: not a JSON line ({error}); rerun the "
                    "pre-training rule that wrote it"
                ) from error
    return records


def run_styles(names: list[str]) -> dict[str, dict[str, Any]]:
    """One colour (and line style) per run, fixed once for every panel and the legend: a panel
    in which only some runs log a term (loss_gwc, loss_bow...) must not recolour them. Up to 10
    runs take tab10, up to 20 tab20; past 20 the line style changes with each round of tab20."""
    from matplotlib import colormaps

    palette = colormaps["tab10" if len(names) <= 10 else "tab20"].colors
    dashes = ["-", "--", ":", "-."]
    return {
        name: {
            "color": palette[i % len(palette)],
            "linestyle": dashes[(i // len(palette)) % len(dashes)],
        }
        for i, name in enumerate(names)
    }


def loss_curves(
    runs: dict[str, Path], out_png: Path, out_json: Path | None = None
) -> dict[str, Any]:
    """One panel per loss term (loss, loss_mlm, loss_gwc, ...), one line per pre-training run."""
    curves = {name: read_jsonl(path) for name, path in runs.items()}
    terms = sorted(
        {
            k
            for recs in curves.values()
            for r in recs
            for k in r
            if k.startswith("loss") and isinstance(r[k], (int, float))
        }
    )
    plt = pyplot()
    fig, axes = plt.subplots(
        1,
        max(1, len(terms)),
        figsize=(4 * max(1, len(terms)) + 1.5, 3.2),
        squeeze=False,
        layout="constrained",
    )
    styles = run_styles(list(curves))
    summary: dict[str, Any] = {}
    for ax, term in zip(axes[0], terms or ["loss"]):
        for name, recs in curves.items():
            points = [(r["step"], r[term]) for r in recs if term in r and "step" in r]
            if points:
                ax.plot(*zip(*points), label=name, **styles[name])
                summary.setdefault(name, {})[term] = {
                    "first": points[0][1],
                    "last": points[-1][1],
                    "steps": points[-1][0],
                }
        ax.set_title(term)
        ax.set_xlabel("step")
        values = [y for line in ax.get_lines() for y in line.get_ydata()]
        if values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")  # objectives differ in scale (CPDAE's summed BCE is ~100x MLM)
    if not terms:
        axes[0][0].text(
            0.5,
            0.5,
            "no training steps logged (base checkpoints only)",
            ha="center",
            va="center",
            transform=axes[0][0].transAxes,
        )
    from matplotlib.lines import Line2D

    # The legend from the styles, not from a panel: a panel may lack some runs.
    drawn = [name for name in curves if name in summary]
    if drawn:
        handles = [Line2D([], [], **styles[name]) for name in drawn]
        fig.legend(handles, drawn, loc="outside right upper", fontsize="small")
    save_figure(fig, out_png)
    plt.close(fig)
    if out_json is not None:
        artifacts.write_json(out_json, summary)
    write_manifest(
        out_png,
        "analysis.loss_curves",
        {"runs": list(runs)},
        {name: Path(path) for name, path in runs.items()},
        {"terms": terms, "runs_with_steps": sorted(summary)},
    )
    return summary
