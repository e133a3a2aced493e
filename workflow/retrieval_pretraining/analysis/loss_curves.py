"""The given pre-training runs' loss terms (metrics.jsonl) on shared axes, one panel per term (the
rule passes the models the report reaches).

At paper scale (100k steps, a dozen runs and more) the raw values are a band of noise: each run
is drawn as a trailing mean over a twentieth of its logged points, the raw values faint behind
it, and the JSON records the smoothed last value beside the raw one. The x axis is tokens seen
when every record with a loss term logs it (CPDAE's batch differs from the others'), else the
step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import artifacts
from ..errors import InputFileError
from .common import pyplot, save_figure, write_manifest


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as error:
        raise InputFileError(f"{path}: not UTF-8 text ({error}); rerun the pre-training rule "
                             "that wrote it") from error
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputFileError(
                    f"{path}:{number}: not a JSON line ({error}); rerun the "
                    "pre-training rule that wrote it"
                ) from error
            if not isinstance(record, dict):
                raise InputFileError(f"{path}:{number}: not a JSON object, as a metrics record "
                                     "is; rerun the pre-training rule that wrote it")
            records.append(record)
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


def smoothing_window(points: int) -> int:
    """Trailing points averaged: a twentieth of a run's logged points (1 below 40: no smoothing)."""
    return max(1, points // 20)


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Each value replaced by the mean of it and the window - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def loss_terms(record: dict[str, Any]) -> list[str]:
    """The record's loss terms (loss, loss_mlm, ...): the values the panels draw."""
    return [k for k, v in record.items() if k.startswith("loss") and isinstance(v, (int, float))]


def x_axis(curves: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """(record key, axis label): tokens seen when every drawn point has it, else the step. A
    record without a loss term (the step-0 probe record of a run written before it carried
    tokens_seen) draws nothing, so it does not decide the axis."""
    steps = [r for recs in curves.values() for r in recs if "step" in r and loss_terms(r)]
    if steps and all(isinstance(r.get("tokens_seen"), (int, float)) for r in steps):
        return "tokens_seen", "tokens seen"
    return "step", "step"


def panel_grid(plt, panels: int):
    """Up to three panels a row, so a dozen terms do not make one very wide row."""
    cols = min(3, panels)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols + 2, 3.2 * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:panels])


def loss_curves(
    runs: dict[str, Path], out_png: Path, out_json: Path | None = None
) -> dict[str, Any]:
    """One panel per loss term (loss, loss_mlm, loss_gwc, ...), one line per pre-training run."""
    curves = {name: read_jsonl(path) for name, path in runs.items()}
    terms = sorted({k for recs in curves.values() for r in recs for k in loss_terms(r)})
    plt = pyplot()
    fig, axes = panel_grid(plt, max(1, len(terms)))
    styles = run_styles(list(curves))
    x_key, x_label = x_axis(curves)
    summary: dict[str, Any] = {}
    smoothed = False
    for ax, term in zip(axes, terms or ["loss"]):
        for name, recs in curves.items():
            points = [(r[x_key], r[term], r["step"]) for r in recs if term in r and "step" in r]
            if not points:
                continue
            xs, ys, steps = (list(column) for column in zip(*points))
            window = smoothing_window(len(ys))
            if window > 1:
                smoothed = True
                ax.plot(xs, ys, label=name, alpha=0.2, linewidth=0.6, **styles[name])
                ys_smooth = trailing_mean(ys, window)
                ax.plot(xs, ys_smooth, label=name, **styles[name])
            else:
                ys_smooth = ys
                ax.plot(xs, ys, label=name, **styles[name])
            summary.setdefault(name, {})[term] = {
                "first": ys[0],
                "last": ys[-1],
                "steps": steps[-1],
                "smoothed_last": ys_smooth[-1],
                "smoothing_window": window,
            }
        ax.set_title(term)
        ax.set_xlabel(x_label)
        values = [y for line in ax.get_lines() for y in line.get_ydata()]
        if values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")  # objectives differ in scale (CPDAE's summed BCE is ~100x MLM)
    if smoothed:
        fig.suptitle(
            "lines: trailing mean over a twentieth of each run's logged points; raw values faint",
            fontsize="small",
        )
    if not terms:
        axes[0].text(
            0.5,
            0.5,
            "no training steps logged (base checkpoints only)",
            ha="center",
            va="center",
            transform=axes[0].transAxes,
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
        {"runs": list(runs), "x_axis": x_key},
        {name: Path(path) for name, path in runs.items()},
        {"terms": terms, "runs_with_steps": sorted(summary)},
    )
    return summary
