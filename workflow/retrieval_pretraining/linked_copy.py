"""A folder output that is another's: its files hard-linked where the file system allows, else
copied (rules/retrieval.smk `alias_bm25_index`: an alias's or a shared corpus's BM25 index).

A hard link costs no bytes (DPR's psgs_w100 index is tens of GB) and is safe here for three
reasons, each checked against the installed Snakemake and the writers (ARCHITECTURE, "copies of
a BM25 index"): every writer of an index replaces its folder (bm25.build_index builds
in a temp folder and renames it; Lucene's segment files are write-once), and Snakemake deletes a
job's outputs before it reruns it, so a rerun of the source unlinks its names and leaves the
copy's files (the old inodes) as they were; the folder's time, which Snakemake reads from its
`.snakemake_timestamp` and touches after the job, is the copy's own: that file is never linked
(a linked one would move the source's time and rerun all that reads the source's index).
A file output is not linked (a corpus.parquet): Snakemake touches every file output after its
job, which on a link is the source's file too.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from . import artifacts
from .config import stage_parser
from .errors import command

log = logging.getLogger(__name__)

# Where Snakemake keeps a folder output's modification time: the copy's own, never linked.
TIMESTAMP = ".snakemake_timestamp"
# What a file system that cannot link here answers (another device, links not allowed for this
# user, none at all, too many links to one inode): a copy instead. Anything else is an error.
NO_LINK = {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP,
           errno.EOPNOTSUPP, errno.ENOSYS}


def link_or_copy(source: Path, target: Path) -> OSError | None:
    """Hard-link `target` to `source`; copy it where the file system refuses (the refusal is
    returned, None for a link)."""
    try:
        os.link(source, target)
        return None
    except OSError as error:
        if error.errno not in NO_LINK:
            raise
        shutil.copy2(source, target)
        return error


def linked_folder(source: Path, out: Path) -> dict[str, int]:
    """`out`: `source`'s files (subfolders too) linked or copied, atomically; the counts. Once one
    link is refused the rest are copied (the same file system refuses them all)."""
    if source.exists() and not source.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(source))
    if not source.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(source))
    counts, refusal = {"linked": 0, "copied": 0}, None
    with artifacts.atomic_dir(out) as tmp:
        for folder, subfolders, files in os.walk(source):
            here = tmp / Path(folder).relative_to(source)
            for name in subfolders:
                (here / name).mkdir()
            for name in files:
                if name == TIMESTAMP and Path(folder) == source:
                    continue
                if refusal is None:
                    refusal = link_or_copy(Path(folder) / name, here / name)
                    counts["copied" if refusal else "linked"] += 1
                else:
                    shutil.copy2(Path(folder) / name, here / name)
                    counts["copied"] += 1
    if refusal is None:
        log.info("%s: %d files hard-linked to %s's (no bytes copied)", out, counts["linked"],
                 source)
    else:
        log.info("%s: a copy of %s (%d files linked, %d copied): the file system refused a "
                 "hard link (%s)", out, source, counts["linked"], counts["copied"], refusal)
    return counts


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("A folder output that is another's: hard links, else a copy.")
    parser.add_argument("--source", required=True, type=Path, help="the folder to share")
    parser.add_argument("--out", required=True, type=Path, help="the folder to write")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    linked_folder(args.source, args.out)


if __name__ == "__main__":
    main()
