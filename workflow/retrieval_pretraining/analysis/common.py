"""What the analyses share: saving a figure, the manifest beside its outputs, and an encoder's
files (its weights, the heads saved beside it, the ids its projections never count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import artifacts
from ..errors import reading


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on cluster nodes), imported when needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    with artifacts.atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=120)


def write_manifest(
    out: Path,
    stage: str,
    params: dict[str, Any],
    inputs: dict[str, Path],
    stats: dict[str, Any] | None = None,
) -> None:
    """One manifest for an analysis's outputs (`x.png` + `x.json` -> `x.manifest.json`), so that
    `python -m retrieval_pretraining.audit` can say what a figure was made from."""
    artifacts.write_manifest(
        artifacts.manifest_path(out), stage=stage, params=params, inputs=inputs, stats=stats
    )


def encoder_weights(encoder_dir: Path) -> Path:
    """The file that identifies an encoder folder in a manifest (its checksum is recorded)."""
    return Path(encoder_dir) / "model.safetensors"


def excluded_ids(tokenizer) -> list[int]:
    """Special and [unused] ids: never counted (the BoW authors' filter)."""
    vocab = tokenizer.get_vocab()
    return sorted(
        set(tokenizer.all_special_ids) | {i for t, i in vocab.items() if t.startswith("[unused")}
    )


def load_heads(path: Path) -> dict[str, Any]:
    """The heads saved beside an exported encoder (`heads.safetensors`), or {} if there are none."""
    from safetensors.torch import load_file

    if not path.is_file():
        return {}
    with reading(path, "a safetensors file"):
        return load_file(str(path))
