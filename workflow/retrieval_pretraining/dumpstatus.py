"""Wikimedia's `dumpstatus.json`: which multistream parts (and their indexes) a dump run has.

Wikimedia publishes `{mirror}/{wiki}/{date}/dumpstatus.json` for every dump run; its
`articlesmultistreamdump` job lists the split multistream parts
(`enwiki-20230301-pages-articles-multistream1.xml-p1p41242.bz2`) and their offset indexes
(`...-pages-articles-multistream-index1.txt-p1p41242.bz2`), with sha1/md5 once the run has computed
them and always a size. `parse_dump_parts` pairs each part with its index under a wildcard-safe name
(`multistream1-p1p41242`). `dump_date: latest` resolves to the newest listed run whose job is
done (`fetch_dumpstatus`).

In practice the job lists sizes only (the enwiki 20230301 capture: 128 files, no checksum), while
every run publishes `{wiki}-{date}-sha1sums.txt` beside it. `fetch_dumpstatus` fills each file's
missing `sha1` from there (`add_sha1sums`), so a 20 GB download is verified by its sha1, not its
size alone; a run without that file keeps its sizes, with a warning, and so do the files it does
not list yet (a run still in progress).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any

from . import artifacts
from .errors import (
    BadInput, InputFileError, expect_object, expect_positive_int, expect_section, fixed_by, reading,
)
from .fetch import DownloadError, NotFound, read_url

log = logging.getLogger(__name__)

MULTISTREAM_JOB = "articlesmultistreamdump"
# How many dump runs `dump_date: latest` looks back through for one whose job is done.
LATEST_LOOKBACK = 5


# The fix for a dumpstatus.json of another shape: the saved copy (`download dumpstatus` wrote it),
# or the one a mirror serves (no stage of ours writes it).
SAVED_FIX = "fetch it again with `download dumpstatus`, or fix the path"
MIRROR_FIX = ("the mirror serves it so: try again later, another wikipedia.mirror, or pin "
              "wikipedia.dump_date to another run")


class DumpStatusError(BadInput, ValueError):
    """A dumpstatus.json is unusable: the job is missing or not done, or lists unexpected files."""


_PART_FILE = re.compile(
    r"^(?P<wiki>[a-z_]+)-(?P<date>\d{8}|latest)-pages-articles-multistream(?P<n>\d*)\.xml"
    r"(?:-p(?P<first>\d+)p(?P<last>\d+))?\.bz2$"
)
_INDEX_FILE = re.compile(
    r"^(?P<wiki>[a-z_]+)-(?P<date>\d{8}|latest)-pages-articles-multistream-index(?P<n>\d*)\.txt"
    r"(?:-p(?P<first>\d+)p(?P<last>\d+))?\.bz2$"
)


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    url: str
    size: int | None = None
    sha1: str | None = None
    md5: str | None = None


@dataclasses.dataclass(frozen=True)
class DumpPart:
    """One multistream part and its index, under a name safe for a Snakemake wildcard."""

    name: str
    data: RemoteFile
    index: RemoteFile


def _part_name(match: re.Match) -> str:
    """`multistream1-p1p41242`; a small wiki's single unsplit file is just `multistream`."""
    name = f"multistream{match['n']}"
    return f"{name}-p{match['first']}p{match['last']}" if match["first"] else name


def parse_dump_parts(
    status: dict[str, Any], mirror: str, job: str = MULTISTREAM_JOB,
    source: str | os.PathLike = "dumpstatus.json", fix: str = SAVED_FIX,
) -> list[DumpPart]:
    """The parts of `job` in a parsed dumpstatus.json, each paired with its index, in part order.
    `source` (the saved file, or its URL) is named where the job, its files or a file's entry
    is no object (an AttributeError from .get naming neither it nor the member), with `fix`
    (MIRROR_FIX for a URL's)."""
    with fixed_by(fix):
        return _parse_dump_parts(status, mirror, job, source, fix)


def _parse_dump_parts(status: Any, mirror: str, job: str, source: str | os.PathLike, fix: str
                      ) -> list[DumpPart]:
    what = "a dumpstatus.json"
    status = expect_object(status, source, what)
    jobs = status.get("jobs")
    if not isinstance(jobs, dict) or job not in jobs:
        known = ", ".join(sorted(jobs)) if isinstance(jobs, dict) else "none"
        raise DumpStatusError(f"dumpstatus.json has no job '{job}' (jobs: {known})")
    entry = expect_section(status, f"jobs.{job}", source, what)
    if entry.get("status") != "done":
        raise DumpStatusError(
            f"job '{job}' is '{entry.get('status')}' (last updated "
            f"{entry.get('updated') or 'never'}), not 'done': its files are incomplete. Wait for "
            "the dump run to finish, or set wikipedia.dump_date to an earlier finished run (or "
            "'latest', which picks the newest finished one)."
        )
    data: dict[tuple, tuple[re.Match, dict]] = {}
    index: dict[tuple, tuple[re.Match, dict]] = {}
    for file_name, meta in sorted(expect_section(status, f"jobs.{job}.files", source,
                                                 what).items()):
        if not isinstance(meta, dict):
            raise InputFileError(
                f"{source}: jobs.{job}.files['{file_name}'] is {json.dumps(meta)[:40]}, not a "
                f"JSON object (read as {what}); {fix}")
        _check_entry(meta, f"jobs.{job}.files['{file_name}']", source, what, fix)
        for pattern, found in ((_PART_FILE, data), (_INDEX_FILE, index)):
            match = pattern.match(file_name)
            if match:
                found[(match["n"], match["first"], match["last"])] = (match, meta)
                break
        else:
            raise DumpStatusError(
                f"job '{job}' lists '{file_name}', neither a multistream part nor its index: the "
                "dump layout changed; update the patterns in retrieval_pretraining/dumpstatus.py"
            )
    if not data:
        raise DumpStatusError(f"job '{job}' is done but lists no multistream part files")
    unpaired = sorted(set(data) ^ set(index))
    if unpaired:
        names = [(data.get(key) or index.get(key))[0].string for key in unpaired]
        raise DumpStatusError(
            f"job '{job}': files without their data/index partner: {', '.join(names)}"
        )

    def remote(match: re.Match, meta: dict) -> RemoteFile:
        path = meta.get("url") or f"/{match['wiki']}/{match['date']}/{match.string}"
        return RemoteFile(
            url=mirror.rstrip("/") + "/" + path.lstrip("/"),
            size=meta.get("size"),
            sha1=meta.get("sha1"),
            md5=meta.get("md5"),
        )

    def order(key: tuple) -> tuple[int, int]:
        return int(key[0] or 0), int(key[1] or 0)

    return [
        DumpPart(name=_part_name(data[key][0]), data=remote(*data[key]), index=remote(*index[key]))
        for key in sorted(data, key=order)
    ]


# A file entry's checksums: how each is named and its hex digits (add_sha1sums compares them
# lowered; the download verifies the file against them).
_DIGESTS = {"sha1": ("a sha1", 40), "md5": ("an md5", 32)}


def _check_entry(meta: dict[str, Any], key: str, source: str | os.PathLike, what: str,
                 fix: str) -> None:
    """A file entry's url (remote(): .lstrip of it), size (summed into the manifest, compared
    with the download's bytes) and checksums (.lower() in add_sha1sums) as the readers use them,
    absent or null where not given: of another type, each failed later, naming no entry."""
    url = meta.get("url")
    if url is not None and not isinstance(url, str):
        raise InputFileError(f"{source}: {key}.url is {json.dumps(url)[:40]}, not a string "
                             f"(read as {what}); {fix}")
    expect_positive_int(meta.get("size"), f"{key}.size", source, what)
    for name, (called, digits) in _DIGESTS.items():
        digest = meta.get(name)
        if digest not in (None, "") and not (
                isinstance(digest, str) and re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", digest)):
            raise InputFileError(
                f"{source}: {key}.{name} is {json.dumps(digest)[:60]}, not {called} ({digits} "
                f"hexadecimal digits) (read as {what}); {fix}")


def sha1sums_url(mirror: str, wiki: str, date: str) -> str:
    return f"{mirror.rstrip('/')}/{wiki}/{date}/{wiki}-{date}-sha1sums.txt"


def parse_sha1sums(text: str) -> dict[str, str]:
    """{file name: sha1} from a `sha1sum` listing (`<40 hex>  <name>` per line)."""
    sums = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([0-9a-fA-F]{40}) [ *]?(\S+)\s*", line)
        if match:
            sums[match[2]] = match[1].lower()
    return sums


def add_sha1sums(status: dict[str, Any], sums: dict[str, str], job: str = MULTISTREAM_JOB) -> int:
    """Fill the missing `sha1` of `job`'s files from `sums` (in place); a sha1 the status already
    gives must agree. Returns how many were added."""
    added = 0
    for name, meta in ((status.get("jobs") or {}).get(job, {}).get("files") or {}).items():
        if name not in sums:
            continue
        if meta.get("sha1") and meta["sha1"].lower() != sums[name]:
            raise DumpStatusError(
                f"{name}: dumpstatus.json gives sha1 {meta['sha1']}, sha1sums.txt {sums[name]}; "
                "the run's files changed while it was read: fetch the status again"
            )
        if not meta.get("sha1"):
            meta["sha1"] = sums[name]
            added += 1
    return added


def _add_published_sha1sums(status, mirror, wiki, date, retries, sleep) -> None:
    """`add_sha1sums` from the run's sha1sums.txt on the mirror (a warning where it has none)."""
    try:
        text = read_url(sha1sums_url(mirror, wiki, date), retries=retries, sleep=sleep)
    except NotFound as error:
        log.warning("%s; the dump files are verified by their size only", error)
        return
    add_sha1sums(status, parse_sha1sums(text.decode("utf-8", "replace")))
    # A run still in progress may publish a sha1sums.txt without this job's files yet.
    files = ((status.get("jobs") or {}).get(MULTISTREAM_JOB, {}).get("files") or {})
    unsummed = sorted(name for name, meta in files.items() if not meta.get("sha1"))
    if unsummed:
        log.warning(
            "%d of the %d '%s' files have no sha1 in dumpstatus.json nor in %s (e.g. %s): they "
            "are verified by their size only (a run still in progress lists the rest when it is "
            "done)", len(unsummed), len(files), MULTISTREAM_JOB, sha1sums_url(mirror, wiki, date),
            unsummed[0])


def status_url(mirror: str, wiki: str, date: str) -> str:
    return f"{mirror.rstrip('/')}/{wiki}/{date}/dumpstatus.json"


def listed_runs(listing: str) -> list[str]:
    """The dump runs (YYYYMMDD folders) of a mirror's `{wiki}/` directory listing, newest first."""
    return sorted(set(re.findall(r'href="(\d{8})/?"', listing)), reverse=True)


def fetch_dumpstatus(
    mirror: str, wiki: str, dump_date: str, *, retries: int = 3, sleep=time.sleep
) -> tuple[str, dict[str, Any], list[DumpPart]]:
    """(resolved date, status document, parts). `latest` = the newest run whose job is done.
    The document's missing sha1s are filled from the run's sha1sums.txt (module doc)."""
    date, status = _resolve(mirror, wiki, dump_date, retries, sleep)
    _add_published_sha1sums(status, mirror, wiki, date, retries, sleep)
    return date, status, parse_dump_parts(status, mirror, source=status_url(mirror, wiki, date),
                                          fix=MIRROR_FIX)


def _resolve(mirror, wiki, dump_date, retries, sleep) -> tuple[str, dict[str, Any]]:
    """(date, status) of the run `dump_date` names, its job checked done."""
    if dump_date != "latest":
        url = status_url(mirror, wiki, dump_date)
        document = read_url(url, retries=retries, sleep=sleep)
        with fixed_by(MIRROR_FIX), reading(url, "a dumpstatus.json"):  # an HTML page, cut short
            status = json.loads(document)
        # raises unless the job is done
        parse_dump_parts(status, mirror, source=url, fix=MIRROR_FIX)
        return dump_date, status
    listing = read_url(f"{mirror.rstrip('/')}/{wiki}/", retries=retries, sleep=sleep).decode(
        "utf-8", "replace"
    )
    dates = listed_runs(listing)
    if not dates:
        raise DumpStatusError(
            f"no dump runs (YYYYMMDD/ folders) listed at {mirror}/{wiki}/; check mirror and wiki"
        )
    reasons = []
    for date in dates[:LATEST_LOOKBACK]:
        # A run is passed over only when it is known unfinished (its job not done, or no status
        # published yet); a mirror that fails to answer (after the retries) stops the lookup, or
        # which Wikipedia an experiment uses would depend on the mirror's load that day.
        try:
            document = read_url(status_url(mirror, wiki, date), retries=retries, sleep=sleep)
        except NotFound as error:
            reasons.append(f"{date}: {error}")
            log.warning("dump_date latest: passing over %s (%s)", date, error)
            continue
        except DownloadError as error:
            raise DownloadError(
                f"dump_date latest: the status of run {date} of {wiki} could not be read ({error}); "
                "rerun later, or pin wikipedia.dump_date to a run"
            ) from error
        try:
            status = json.loads(document)
            parts = parse_dump_parts(status, mirror, source=status_url(mirror, wiki, date),
                                     fix=MIRROR_FIX)
        except (DumpStatusError, ValueError) as error:
            reasons.append(f"{date}: {error}")
            log.warning("dump_date latest: passing over %s (%s)", date, error)
            continue
        log.info("dump_date latest -> %s (%d parts)", date, len(parts))
        return date, status
    raise DumpStatusError(
        f"none of the {min(len(dates), LATEST_LOOKBACK)} newest runs of {wiki} at {mirror} has "
        f"a finished '{MULTISTREAM_JOB}' job:\n  " + "\n  ".join(reasons)
    )


def dump_parts_from_file(path: str | os.PathLike, mirror: str) -> list[DumpPart]:
    """The parts listed in a saved dumpstatus.json (what the Snakemake checkpoint wrote); one cut
    short, not JSON or not an object, or whose job, files or a file's entry is no object, is one
    error naming it (read when the workflow plans)."""
    with fixed_by(SAVED_FIX):
        status = artifacts.read_json_object(path, "a saved dumpstatus.json")
    return parse_dump_parts(status, mirror, source=path)
