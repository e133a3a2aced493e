"""Acquire input files: a resumable, verified downloader and Wikimedia `dumpstatus.json` parsing.

The command line of both (what the rules run); the work is done in fetch.py and dumpstatus.py.

`fetch` is generic (every stage that downloads calls it, through this stable CLI):

    python -m retrieval_pretraining.download fetch --url U --out P [--mirror M] \
        [--sha1 X] [--md5 X] [--sha256 X] [--size N] [--retries N] [--link copy|symlink]

With several checksums the strongest is verified (sha256 > sha1 > md5). With `--mirror`, a `--url`
of the form `/path` is read from that mirror: the rules pass the dump mirror this way, outside
their rerun-triggering params, so that switching to another copy of the same files re-fetches
nothing (the files are named by their path and checksum).

Beside `P` it writes `P.manifest.json` (URL, bytes, verified checksum, sha256 and md5, attempts),
before `P` takes its name; `check_fetched` compares checks pinned later with it (the rules call it
when they build the DAG). The manifest name keeps the whole file name because downloads have
multi-part extensions (`x.xml.bz2` and `x.index.txt.bz2` must not share a manifest).

`dumpstatus` saves a dump run's dumpstatus.json as Wikimedia published it, except that a sha1 the
job's entry lacks is filled in from the run's sha1sums.txt (dumpstatus.py), with a manifest
recording the resolved date and the parts (config: wiki, dump_date, mirror; `--mirror` overrides
the config's):

    python -m retrieval_pretraining.download dumpstatus --config '<JSON>' --out P [--retries N] \
        [--mirror M]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from . import artifacts
from .config import ConfigError, refuse_unknown, stage_parser
from .dumpstatus import MULTISTREAM_JOB, fetch_dumpstatus, sha1sums_url, status_url
from .errors import add_debug_option, command, expect_section
from .fetch import CHECKSUMS, fetch, mirrored_url

log = logging.getLogger(__name__)


def manifest_for(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".manifest.json")


def check_fetched(path: str | os.PathLike, pins: dict) -> None:
    """Refuse a pin (md5, sha256, size in `pins`) that the fetched file at `path` contradicts,
    compared with what its manifest recorded: a pin added after the fetch needs no second 13 GB
    fetch. A file fetched before md5 was recorded is compared on what its manifest has.

    Without the file there is nothing to compare: it was deleted to be fetched again (what the
    error says to do) and its manifest is stale; the fetch verifies the pins itself.
    """
    path = Path(path)
    manifest = manifest_for(path)
    if not path.exists() or not manifest.is_file():
        return
    what = "a fetched file's manifest"
    read = artifacts.read_manifest(manifest, what)
    stats, verified = read["stats"], expect_section(read, "stats.verified", manifest, what)
    recorded = {"sha256": stats.get("sha256"), "md5": stats.get("md5"), "size": stats.get("bytes")}
    if verified.get("check") == "md5":
        recorded["md5"] = verified.get("actual")
    for key, value in recorded.items():
        pinned = pins.get(key)
        if pinned is None or value is None:
            continue
        if (pinned.lower() if isinstance(pinned, str) else pinned) != value:
            raise ValueError(
                f"{path}: the config pins {key} {pinned}, but the file fetched has {value} (its "
                "manifest); fix the pin, or delete the file to fetch it again"
            )


def _cmd_fetch(args: argparse.Namespace) -> None:
    checks = {name: getattr(args, name) for name in CHECKSUMS if getattr(args, name)}
    args.url = mirrored_url(args.mirror, args.url)
    params = {
        "url": args.url,
        "retries": args.retries,
        "link": args.link,
        "size": args.size,
        **checks,
    }

    def write_manifest(info: dict) -> None:
        artifacts.write_manifest(
            args.manifest or manifest_for(args.out), stage="download", params=params, stats=info
        )

    # The manifest first (fetch.fetch's on_verified): a failure writing it leaves the verified
    # file as OUT.part for the rerun, not as OUT for Snakemake to delete.
    fetch(
        args.url,
        args.out,
        size=args.size,
        retries=args.retries,
        backoff=args.backoff,
        timeout=args.timeout,
        link=args.link,
        on_verified=write_manifest,
        **checks,
    )


# The `wikipedia` keys that name a dump run (rules/wikipedia.smk passes exactly these).
DUMPSTATUS_KEYS = ("wiki", "dump_date", "mirror")


def _cmd_dumpstatus(args: argparse.Namespace) -> None:
    cfg = args.config
    if args.mirror:
        cfg = {**cfg, "mirror": args.mirror}
    refuse_unknown(cfg, DUMPSTATUS_KEYS, "download dumpstatus")
    missing = [key for key in DUMPSTATUS_KEYS if key not in cfg]
    if missing:
        raise ConfigError(f"download dumpstatus: the config lacks {', '.join(missing)}; pass the "
                          f"wikipedia section's {', '.join(DUMPSTATUS_KEYS)}")
    date, status, parts = fetch_dumpstatus(
        cfg["mirror"], cfg["wiki"], cfg["dump_date"], retries=args.retries
    )
    # What Wikimedia published for this run, the job's missing sha1s filled from the run's
    # sha1sums.txt (dumpstatus.py); the manifest counts the files that have one.
    artifacts.write_json(args.out, status)
    stats = {
        "resolved_dump_date": date,
        "status_url": status_url(cfg["mirror"], cfg["wiki"], date),
        "job": MULTISTREAM_JOB,
        "parts": len(parts),
        "bytes": sum((p.data.size or 0) + (p.index.size or 0) for p in parts),
        "with_sha1": sum(bool(p.data.sha1) for p in parts),
        "sha1s_from": sha1sums_url(cfg["mirror"], cfg["wiki"], date),
        "files": [dataclasses.asdict(p) for p in parts],
    }
    artifacts.write_manifest(
        artifacts.manifest_path(args.out), stage="fetch_dumpstatus", params=cfg, stats=stats
    )
    log.info("%s %s: %d parts, %.1f GB", cfg["wiki"], date, len(parts), stats["bytes"] / 1e9)


# The early stop is fetch's: two identical complete copies that fail verification are the file the
# mirror serves, not damage on the way, and no further attempt would change them.
RETRIES_HELP = (
    "attempts after the first (default 5); a second complete copy identical to an earlier one "
    "that failed its checksum stops at once"
)


def _retries(text: str) -> int:
    """A retry count: a whole number >= 0 (a negative one would give up before the first try)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give 0 (no retry) or more")
    return value


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    fetch_cmd = commands.add_parser(
        "fetch", help="download (or copy) one file, verified, resumable"
    )
    fetch_cmd.add_argument(
        "--url", required=True, help="http(s):// or file:// URL, or a local path"
    )
    fetch_cmd.add_argument("--out", required=True, type=Path, help="destination file")
    fetch_cmd.add_argument(
        "--mirror", help="base URL a --url of the form /path is read from (the dump mirror)"
    )
    for name in CHECKSUMS:
        fetch_cmd.add_argument(
            f"--{name}", help=f"expected {name} (hex); of several, the strongest is verified"
        )
    fetch_cmd.add_argument("--size", type=int, help="expected size in bytes (checked too)")
    fetch_cmd.add_argument(
        "--retries", type=_retries, default=5, help=RETRIES_HELP
    )
    fetch_cmd.add_argument(
        "--backoff", type=float, default=2.0, help="first retry delay in s, doubling"
    )
    fetch_cmd.add_argument("--timeout", type=float, default=60.0, help="socket timeout in s")
    fetch_cmd.add_argument(
        "--link", choices=("copy", "symlink"), default="copy", help="for local sources"
    )
    fetch_cmd.add_argument(
        "--manifest", type=Path, help="manifest path (default: OUT.manifest.json)"
    )
    add_debug_option(fetch_cmd)
    fetch_cmd.set_defaults(run=_cmd_fetch)

    status_cmd = commands.add_parser(
        "dumpstatus",
        parents=[stage_parser("")],
        add_help=False,
        help="save a dump run's dumpstatus.json (config: wiki, dump_date, mirror)",
    )
    status_cmd.add_argument("--out", required=True, type=Path, help="where to save dumpstatus.json")
    status_cmd.add_argument(
        "--retries", type=_retries, default=5, help=RETRIES_HELP
    )
    status_cmd.add_argument("--mirror", help="the mirror to read (overrides the config's)")
    status_cmd.set_defaults(run=_cmd_dumpstatus)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.run(args)


if __name__ == "__main__":
    main()
