"""What a run shows while it trains and leaves behind: metrics records, a progress bar, the loss
curve, TensorBoard scalars (optional) and peak memory."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from .. import artifacts


class MetricsWriter:
    """Append one JSON object per logged step to a .jsonl file (main rank only).

    `history` (a file in the resume-state folder) mirrors every record: Snakemake deletes a job's
    declared outputs before it reruns, so after a preemption the output file is gone and the
    history restores the steps before the resume. On resume, lines beyond the resumed step (and a
    last line cut short) are dropped first, so the file never holds two records for one step.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int = 0, enabled: bool = True,
                 history: str | os.PathLike | None = None):
        self.path = Path(path)
        self.history = Path(history) if history else None
        self.enabled = enabled
        if not enabled:
            return
        kept: list[str] = []
        if resume_step:
            source = next((p for p in (self.path, self.history) if p and p.exists()), None)
            if source is not None:
                # Complete lines only: a record the disk filling up (or a kill) cut short has no
                # newline, and it is past the saved step anyway.
                complete = source.read_text().split("\n")[:-1]
                kept = [
                    line for line in complete
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step
                ]
        for target in (self.path, self.history):
            if target is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                with artifacts.atomic_path(target) as tmp:
                    tmp.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(record, sort_keys=True) + "\n"
        for target in (self.path, self.history):
            if target is not None:
                with target.open("a") as handle:
                    handle.write(line)


class Progress:
    """A tqdm bar over optimiser steps showing loss, tokens/s and the ETA (main rank only)."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, disable=not enabled, desc=desc,
                        dynamic_ncols=True, mininterval=2.0)
        self._last = time.perf_counter()

    def update(self, tokens: int, **postfix: float) -> float:
        """Advance one step; returns this step's tokens/s."""
        now = time.perf_counter()
        rate = tokens / max(now - self._last, 1e-9)
        self._last = now
        shown = {k: f"{v:.4g}" for k, v in postfix.items()} | {"tok/s": f"{rate:,.0f}"}
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)
        return rate

    def close(self) -> None:
        self.bar.close()


def plot_losses(metrics_path: str | os.PathLike, png_path: str | os.PathLike,
                title: str = "training loss") -> None:
    """Plot every `loss*` key of a metrics .jsonl against step, and beside it every `probe_*` key
    (held-out scores in [0, 1], pretrain/probes.py) when there are any; no records give a
    labelled blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(metrics_path)
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines if line.strip()]
    probe_keys = sorted({k for r in records for k in r if k.startswith("probe_")})
    fig, axes = plt.subplots(1, 2 if probe_keys else 1, figsize=(12 if probe_keys else 7, 4),
                             squeeze=False)
    ax = axes[0][0]
    keys = sorted({k for r in records for k in r if k.startswith("loss")})
    for key in keys:
        points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
        if points:
            ax.plot(*zip(*points), label=key, linewidth=1)
    if not records:
        ax.text(0.5, 0.5, "no training steps", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    if keys:
        ax.legend(fontsize=8)
        if all(r[k] > 0 for r in records for k in keys if k in r and r[k] is not None):
            ax.set_yscale("log")
    if probe_keys:
        probe_ax = axes[0][1]
        for key in probe_keys:
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            probe_ax.plot(*zip(*points), marker="o", markersize=3, label=key.removeprefix("probe_"))
        probe_ax.set_ylim(0, 1)
        probe_ax.set_xlabel("optimiser step")
        probe_ax.set_ylabel("held-out score")
        probe_ax.set_title("probes on held-out chunks")
        probe_ax.legend(fontsize=8)
    fig.tight_layout()
    with artifacts.atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def require_tensorboard() -> None:
    """Fail at start (not after hours of training) when TensorBoard logging is on but missing."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            "trainer.tensorboard is on but the `tensorboard` package is not installed: "
            "`pip install tensorboard` in this environment, or set trainer.tensorboard: false"
        ) from error


class TensorBoardLog:
    """The MetricsWriter records as TensorBoard scalars (one tag per numeric key, x = "step").

    `purge_step` (the first step after a resume) hides events a stopped run wrote past its saved
    state, so a resumed curve has one value per step, as metrics.jsonl does.
    """

    def __init__(self, log_dir: str | os.PathLike, purge_step: int | None = None):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):  # a flag (bool) as 0 / 1
                self.writer.add_scalar(key, int(value) if isinstance(value, bool) else value, step)

    def close(self) -> None:
        self.writer.close()


def memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except Exception:  # pragma: no cover - non-POSIX
        return math.nan
