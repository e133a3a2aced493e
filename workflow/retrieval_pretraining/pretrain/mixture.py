"""Pre-training on a mixture of corpora: which shards belong to which corpus, and how many chunks
of each a global batch holds (data.MicroBatches draws them; its docstring says how)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import BadInput


class DataError(BadInput, ValueError):
    """The chunk or span shards break their contract; the message names the file, row and fix."""


def corpus_groups(paths: Sequence | None) -> list[list[Path]] | None:
    """Shard paths grouped per corpus: a flat list is one corpus, a list of lists one per corpus."""
    if paths is None:
        return None
    paths = list(paths)
    if paths and not isinstance(paths[0], (str, Path)):
        return [[Path(p) for p in group] for group in paths]
    return [[Path(p) for p in paths]]


def quotas(proportions: Sequence[float], batch: int) -> np.ndarray:
    """Chunks of each corpus per global batch: proportions x batch, normalised, rounded by largest
    remainder (ties to the earlier corpus); a corpus that would get none is an error."""
    share = np.asarray(proportions, dtype=np.float64)
    if len(share) == 0 or np.any(share <= 0):
        raise DataError(f"corpus proportions {list(proportions)} must all be positive")
    exact = share / share.sum() * batch
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[:batch - int(counts.sum())]:
        counts[i] += 1
    if np.any(counts == 0):
        raise DataError(
            f"corpus proportions {list(proportions)} give corpus {int(np.argmin(counts))} no chunk "
            f"of a global batch of {batch}; raise its proportion or trainer.global_batch_size"
        )
    return counts


def proportions(settings: dict, chunks: list[list[Path]], spans: list[list[Path]] | None
                ) -> list[float] | None:
    """The mixture's proportions (None for one corpus), once the shard groups are checked against
    the settings' corpora: one group of chunks (and of spans) per corpus, in their order."""
    corpora = settings.get("corpora") or [{"name": "(one)", "proportion": 1.0}]
    names = [c["name"] for c in corpora]
    if len(chunks) != len(corpora) or (spans is not None and len(spans) != len(corpora)):
        raise DataError(
            f"{len(chunks)} groups of chunk shards (--chunks given once per corpus)"
            + (f" and {len(spans)} of span shards" if spans is not None else "")
            + f" for the corpora {names}; give one group per corpus, in this order"
        )
    return [float(c["proportion"]) for c in corpora] if len(corpora) > 1 else None
