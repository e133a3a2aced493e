"""The download contract: fetched files (dump parts, the multistream index, dataset files;
download.py) and the dump status they were chosen from (results/wikipedia/dumpstatus.json).

A download keeps its name and gets `NAME.manifest.json` beside it (the whole name: `x.xml.bz2` ->
`x.xml.bz2.manifest.json`) recording the URL, the size and the sha256 it had when verified.
"""

from __future__ import annotations

from pathlib import Path


def download_manifest_path(path: Path) -> Path:
    """download.py's manifest keeps the whole name: `x.xml.bz2` -> `x.xml.bz2.manifest.json`."""
    return path.with_name(path.name + ".manifest.json")
