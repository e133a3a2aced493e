"""dataset.json of a dataset whose corpus is another's (`datasets[].corpus.same_as`).

The rule (rules/retrieval.smk `share_dataset_corpus`) copies the source's corpus.parquet and its
manifest; this writes the dataset.json beside it: the source's (its corpus counts, and a sample's
description) with the settings the dataset sets itself (name, format, title mode, query-id rule),
what `datasets corpus` writes for it from the same corpus. A module of its own, not a command of
datasets.py: every dataset job declares that file as code, and an edit there reruns them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import artifacts
from .config import stage_parser
from .errors import command


def shared_info(settings: dict[str, Any], source: Path, out: Path) -> dict[str, Any]:
    """Write `out`: the source's dataset.json with `settings` (the dataset's own keys) in place."""
    info = artifacts.read_json_object(source, "a dataset.json")
    info |= settings
    artifacts.write_json(out, info)
    return info


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("Write dataset.json of a dataset whose corpus is another's.")
    parser.add_argument("--source", required=True, type=Path,
                        help="dataset.json of the dataset whose corpus this one shares")
    parser.add_argument("--out", required=True, type=Path, help="this dataset's dataset.json")
    args = parser.parse_args(argv)
    shared_info(args.config, args.source, args.out)


if __name__ == "__main__":
    main()
