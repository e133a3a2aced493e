"""How `audit` checks a download against its manifest (its size, and its sha256 up to
HASH_LIMIT_BYTES) and shows its first lines or members; how it shows dump parts, the multistream
index and dumpstatus.json."""

from __future__ import annotations

import bz2
import json
from typing import Any

from ... import artifacts
from ...errors import json_value_kind
from ..base import (
    RANK_DOWNLOAD, RANK_JSON, RANK_NAME, Audit, Kind, NotAnArtifact, describe_origin, json_kind,
    load_manifest, read_manifest, short, show_manifest, show_snakemake_record,
)
from . import download_manifest_path

FILES = [
    ("downloads/*", "a downloaded source file, verified against its manifest",
     "download_dataset_file"),
    ("wikipedia/dump/*", "a Wikipedia dump file, verified against its manifest",
     "download_dump_part / download_dump_index"),
]
# A recorded download is re-hashed up to this size; a larger one (a 20 GB dump part) only has its
# size compared, and the audit says so.
HASH_LIMIT_BYTES = 1 << 30


def check_download(a: Audit) -> dict[str, Any] | None:
    """Show download.py's manifest (`NAME.manifest.json`) and compare the file with it."""
    path = download_manifest_path(a.path)
    if not path.is_file():
        return None
    manifest = load_manifest(path, objects=("stats.verified",))
    show_manifest(a, manifest)
    stats = manifest.get("stats") or {}
    size = a.path.stat().st_size
    verified = stats.get("verified") or {}
    if verified:
        a.say(f"  verified when fetched: {verified.get('check')} {verified.get('expected')}")
    if "bytes" in stats:
        a.check("size equals the recorded download's", size == stats["bytes"],
                f"{size} vs {stats['bytes']} bytes")
    if "sha256" in stats and size <= HASH_LIMIT_BYTES:
        a.check("sha256 equals the recorded download's",
                artifacts.sha256_file(a.path) == stats["sha256"])
    elif "sha256" in stats:
        a.say(f"  sha256 not recomputed ({size / 1e9:.1f} GB): `sha256sum` it against "
              f"{stats['sha256']}")
    return manifest


def audit_dump(a: Audit, n: int) -> None:
    with open(a.path, "rb") as handle:
        head = handle.read(3)
    if head != b"BZh":
        raise NotAnArtifact(f"{a.path}: not bzip2 (starts with {head!r})")
    with bz2.open(a.path, "rt", encoding="utf-8", errors="replace") as handle:
        text = handle.read(2_000_000)
    if check_download(a) is None:
        show_manifest(a, read_manifest(a.path))
    show_snakemake_record(a, a.path)
    if "index" in a.path.name:
        a.kind = "multistream index (offset:pageid:title)"
        lines = text.splitlines()[: n * 3]
        a.check(
            "lines are offset:pageid:title",
            all(len(l.split(":", 2)) == 3 and l.split(":")[0].isdigit() for l in lines),
        )
        for l in lines:
            a.say(f"  {l}")
        return
    a.kind = "Wikipedia XML dump part"
    a.check("MediaWiki export XML", "<mediawiki" in text[:2000] or "<page>" in text)
    titles = [t.split("</title>")[0] for t in text.split("<title>")[1:]]
    a.say(f"-- first 2 MB: {text.count('<page>')} pages; titles {titles[:n * 3]}")


def _sniff(path) -> str:
    """A downloaded file's format, from its first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    for magic, kind in ((b"\x1f\x8b", "gzip"), (b"PK\x03\x04", "zip"), (b"BZh", "bzip2")):
        if head.startswith(magic):
            return kind
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not just a character cut at the 4 KiB boundary
            return "binary"
    return "text" if b"\x00" not in head else "binary"


def audit_download(a: Audit, n: int) -> None:
    if a.path.name.endswith(".part"):
        raise NotAnArtifact(
            f"{a.path}: a partial download (the next fetch of "
            f"{a.path.name.removesuffix('.part')} resumes it), not an artifact"
        )
    a.kind = "downloaded file"
    describe_origin(a, "a downloaded file")
    kind = _sniff(a.path)
    a.say(f"-- {a.path.stat().st_size:,} bytes, {kind}")
    if kind == "text":
        with open(a.path, encoding="utf-8", errors="replace") as handle:
            for _, line in zip(range(n), handle):
                a.say(f"  {short(line.rstrip(), 200)}")
    elif kind == "zip":
        import zipfile

        with zipfile.ZipFile(a.path) as archive:
            names = archive.namelist()
        a.say(f"  {len(names)} members: {names[: n * 3]}")
    manifest = check_download(a)
    a.check("download manifest beside it (NAME.manifest.json)", manifest is not None)
    show_snakemake_record(a, a.path)


def is_download(p) -> bool:
    """Below results/downloads/ (its manifests aside), or any file but a dump (.bz2, audited as
    one) with a download manifest beside it."""
    return (p.section == "downloads" and not p.name.endswith(".manifest.json")) or (
        download_manifest_path(p.path).is_file() and not p.name.endswith(".bz2")
    )


def audit_dumpstatus(a: Audit, n: int) -> None:
    data = json.loads(a.path.read_text())
    a.kind = "Wikipedia dumpstatus.json"
    jobs = data["jobs"]  # damaged (a list, a job that is a string): exit 3 from .items / .get
    if not a.check("jobs is an object of jobs", isinstance(jobs, dict),
                   "" if isinstance(jobs, dict) else
                   f"not a JSON object but {json_value_kind(jobs)}; fetch it "
                   "again with `download dumpstatus`"):
        return
    bad = {job: f"{job} is {json_value_kind(info)}" for job, info in jobs.items()
           if not isinstance(info, dict)}
    bad |= {job: f"{job}.files is {json_value_kind(info['files'])}"
            for job, info in jobs.items() if job not in bad
            and not isinstance(info.get("files") or {}, dict)}
    a.check("every job and its files is an object", not bad, "; ".join(list(bad.values())[:5]))
    for job, info in [(job, info) for job, info in jobs.items() if job not in bad][: n * 4]:
        a.say(f"  {job}: {info.get('status')} ({len(info.get('files') or {})} files)")


KINDS = [
    Kind("a download", RANK_DOWNLOAD, "file", is_download,
         audit_download),
    Kind(".bz2", RANK_NAME + 4, "file",
         lambda p: p.name.endswith(".bz2"), audit_dump),
    json_kind("a dumpstatus file", RANK_JSON + 2,
              lambda p: isinstance(p.data, dict) and "jobs" in p.data, audit_dumpstatus),
]
