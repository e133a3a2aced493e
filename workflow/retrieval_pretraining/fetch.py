"""Fetch one file to `P`, verified and resumable, from a local path, a file:// or http(s) URL.

- http(s): the body streams into `P.part`; after a dropped connection the next attempt resumes it
  with an HTTP Range request; a 206 shorter than asked (a server capping its range replies) is
  continued at once the same way, up to the length its Content-Range gives. What identifies the
  remote file (ETag, Last-Modified, length) is kept in `P.part.meta.json`: the resume sends
  If-Range and starts over from byte 0 when the file changed since. Without a checksum, a part
  with no ETag or Last-Modified is never resumed: the bytes appended could be of another version
  of the file. Failures are retried with exponential back-off; an attempt that made progress
  resets the count, so a flaky mirror cannot exhaust the retries on a 20 GB part. Giving up says
  whether a rerun resumes the bytes kept, and by what.
- The strongest checksum given is verified (sha256 > sha1 > md5), and the size where one is given.
  A mismatch deletes the partial file and starts over; mismatches have their own count, which
  progress never resets (a mirror serving a bad copy must not be downloaded forever), and the final
  error names the file, the URL, the expected and the actual checksum. A second complete copy
  identical to an earlier bad one (same sha256) ends the retries at once: the mirror serves
  another file than the one pinned (a stale pin or dumpstatus.json, a rebuilt dump), which no
  re-download changes; copies that differ (damage on the way) are retried as above. `P` only
  ever appears complete and verified (rename at the end), and only if `P.part` holds exactly the
  bytes that were hashed. The body is written as the server sent it: a `Content-Encoding: gzip`
  reply to a `.gz` file is not decoded on the way to disk.
- One fetch of `P` at a time: the whole fetch holds an exclusive lock on `P.part.lock`, and a
  second one (the same job started in another terminal) fails at once naming the first. Where the
  file system has no flock the fetch goes on unlocked, with a warning; a node-local flock excludes
  only fetches on the same node.
- Local paths and file:// URLs are copied (default: results/ is then self-contained and a later
  change to the source cannot alter an artifact silently) or symlinked (`--link symlink`, for a
  multi-GB pre-downloaded dump on the same machine). Either way the checksum is verified first.

`fetch` returns what the manifest records (URL, bytes, verified checksum, sha256 and md5,
attempts); the command line that writes it (before `P` takes its name) is
`python -m retrieval_pretraining.download fetch` (download.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import re
import socket
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from . import artifacts
from .errors import BadInput

log = logging.getLogger(__name__)

# Strongest first: the first one given is the one verified.
CHECKSUMS = ("sha256", "sha1", "md5")
_BLOCK = 1 << 20


class DownloadError(BadInput, RuntimeError):
    """A file could not be fetched (network, HTTP status, missing source) after all retries."""


class ChecksumError(DownloadError):
    """The fetched bytes do not match the expected checksum or size."""


class NotFound(DownloadError):
    """The server (or the file system) says the document does not exist: not worth retrying."""


# ------------------------------------------------------------------------------------------------
# Verification


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a fetched file must match: the strongest checksum given, and the size where given."""

    sha256: str | None = None
    sha1: str | None = None
    md5: str | None = None
    size: int | None = None

    @property
    def algorithm(self) -> str | None:
        return next((name for name in CHECKSUMS if getattr(self, name)), None)


# Recorded in every manifest whatever is verified: md5 too (cheap beside sha256, in the same
# pass), because the published MS MARCO checksums are md5s, and a pin added after an unpinned fetch
# can then be compared with the fetched file without fetching it again (download.check_fetched).
RECORDED = ("sha256", "md5")


class _Digests:
    """The RECORDED digests plus the algorithm being verified, fed in one pass."""

    def __init__(self, algorithm: str | None):
        self.names = list(RECORDED) + ([algorithm] if algorithm not in (None, *RECORDED) else [])
        self.reset()
        self.restarted = False  # whether the bytes were ever thrown away after the start

    def reset(self) -> None:
        self._hashes = {name: hashlib.new(name) for name in self.names}
        self.bytes = 0
        self.restarted = True

    def update(self, block: bytes) -> None:
        for digest in self._hashes.values():
            digest.update(block)
        self.bytes += len(block)

    def hexdigest(self, name: str) -> str:
        return self._hashes[name].hexdigest()

    @classmethod
    def of_file(cls, path: Path, algorithm: str | None) -> "_Digests":
        digests = cls(algorithm)
        with open(path, "rb") as handle:
            while block := handle.read(_BLOCK):
                digests.update(block)
        return digests


def _mismatch(digests: _Digests, expected: Expected) -> tuple[str, str] | None:
    """(expected, actual) descriptions when the file fails its strongest check, else None."""
    if expected.size is not None and digests.bytes != expected.size:
        return f"size {expected.size} bytes", f"size {digests.bytes} bytes"
    name = expected.algorithm
    if name and digests.hexdigest(name) != getattr(expected, name).lower():
        return f"{name} {getattr(expected, name)}", f"{name} {digests.hexdigest(name)}"
    return None


def _same_copy_error(dest: Path, url: str, copies: int, sha256: str, bad: tuple[str, str]):
    """The error for a complete copy identical to an earlier one that failed verification."""
    return ChecksumError(
        f"{dest} (from {url}): {copies} complete downloads failed verification, and two of them "
        f"were the same file (sha256 {sha256}): expected {bad[0]}, got {bad[1]} both times. The "
        "mirror serves another file than the one pinned, not a copy damaged on the way, so "
        "downloading it again would not help; the partial file was deleted. Check the pinned "
        "checksum: for a dump file, compare the run's dumpstatus.json on the mirror now (its "
        "'updated' date and this file's entry) with the one saved in results/wikipedia/ (the "
        "mirror may have rebuilt or replaced the run since), or pick another mirror "
        "(wikipedia.mirror); for a dataset file, fix its pin in the config."
    )


def _part_mismatch(part: Path, digests: _Digests) -> tuple[str, str] | None:
    """(expected, actual) when `part` does not hold exactly the bytes hashed: something else
    wrote to it (the lock keeps other fetches out; this catches what it cannot), so the checksum
    or size verified would not be the file's."""
    on_disk = part.stat().st_size if part.exists() else 0
    if on_disk != digests.bytes:
        return f"{digests.bytes} bytes in {part.name} (those received)", f"{on_disk} bytes"
    return None


# flock's errors where the file system does not offer it (not "held by another process").
_NO_FLOCK = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL})


@contextlib.contextmanager
def _fetch_lock(dest: Path):
    """Hold `dest.part.lock` for a whole fetch, or fail at once naming the holder.

    Two fetches of one file (a user who runs the downloads and the experiment in two terminals,
    following Snakemake's `--unlock` hint) would append to one `.part` together: the file would be
    a splice of both, and each would verify only the bytes it received. flock is released by the
    kernel when its holder dies, so a killed job leaves no stale lock. On a file system without
    flock (Lustre mounted noflock, some FUSE and NFS mounts) the fetch goes on unlocked, with a
    warning; on one whose flock is node-local (Lustre localflock, BeeGFS's default, NFS nolock) it
    excludes only fetches on the same node.
    """
    lock = dest.with_name(dest.name + ".part.lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DownloadError(
                f"{dest} is already being fetched by {holder} (it holds {lock}); let that job "
                "finish (its file is then reused) or stop it, then rerun"
            ) from None
        except OSError as error:
            os.close(fd)
            if error.errno not in _NO_FLOCK:
                raise
            # No flock on this file system: go on unlocked rather than refuse every download.
            lock.unlink(missing_ok=True)
            log.warning("%s: this file system has no flock (%s): fetching unlocked, so do not "
                        "fetch this file from two jobs at once", dest, error.strerror)
            yield
            return
        # The previous holder deletes the lock file on its way out: a lock taken on the file it
        # deleted excludes nobody, so take the one now at that name instead.
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        lock.unlink(missing_ok=True)  # while still held: no one can have taken it meanwhile
        os.close(fd)


# ------------------------------------------------------------------------------------------------
# Fetching


def path_on_mirror(url: str, mirror: str | None) -> str:
    """A URL on `mirror` as its `/path` there (what the dump rules name a file by), else `url`;
    `mirrored_url` turns it back."""
    base = (mirror or "").rstrip("/")
    if base and url.startswith(base + "/"):
        return url[len(base) :]
    return url


def mirrored_url(mirror: str | None, url: str) -> str:
    """`url` as given, or, for a mirror and a `/path`, that path on the mirror."""
    if mirror and url.startswith("/"):
        return mirror.rstrip("/") + url
    return url


def local_path(url: str) -> Path | None:
    """The local file a URL names (a plain path or a file:// URL), or None for an http(s) URL."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise DownloadError(
                f"{url}: a file:// URL must be absolute (file:///abs/path); for a path relative to "
                "the project write the plain path instead"
            )
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # (a one-letter scheme is a Windows drive)
        raise DownloadError(
            f"unsupported URL scheme {parsed.scheme!r} in {url}; use http(s)://, file:// or a path"
        )
    return Path(url)


def _progress(total: int | None, initial: int, name: str):
    from tqdm.auto import tqdm

    # In a Snakemake log (not a terminal) refresh rarely so the log stays readable.
    return tqdm(
        total=total,
        initial=initial,
        desc=name,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        mininterval=0.5 if sys.stderr.isatty() else 30,
        file=sys.stderr,
    )


def _fetch_local(source: Path, dest: Path, expected: Expected, link: str) -> dict[str, Any]:
    if not source.is_file():
        raise DownloadError(
            f"local source {source} does not exist (or is not a file); fix the path or URL"
        )
    part = dest.with_name(dest.name + ".part")
    # A local mismatch is deterministic: retrying would read the same bytes, so fail at once.
    if link == "symlink":
        digests = _Digests.of_file(source, expected.algorithm)
    else:
        digests = _Digests(expected.algorithm)
        with (
            open(source, "rb") as reader,
            open(part, "wb") as writer,
            _progress(source.stat().st_size, 0, dest.name) as bar,
        ):
            while block := reader.read(_BLOCK):
                digests.update(block)
                writer.write(block)
                bar.update(len(block))
    bad = _mismatch(digests, expected)
    if bad:
        part.unlink(missing_ok=True)
        raise ChecksumError(
            f"{source} (for {dest}): expected {bad[0]}, got {bad[1]}; the local copy is corrupt or "
            "the configured checksum is wrong. Nothing was written."
        )
    if link == "symlink":
        part.unlink(missing_ok=True)
        part.symlink_to(source.resolve())
    return {"attempts": 1, "resumed_bytes": 0, "digests": digests}


class HTTPStatusError(DownloadError):
    """The server answered with an error status; 408/425/429/5xx are worth retrying, others not."""

    def __init__(self, url: str, status: int, reason: str):
        super().__init__(f"GET {url}: HTTP {status} {reason}")
        self.retryable = status in (408, 425, 429) or status >= 500


def _meta_path(part: Path) -> Path:
    return part.with_name(part.name + ".meta.json")


def _discard(part: Path) -> None:
    part.unlink(missing_ok=True)
    _meta_path(part).unlink(missing_ok=True)


def _record_source(part: Path, url: str, response, total: int | None) -> None:
    """Keep, beside a `.part` started from byte 0, what identifies the remote file it is a copy
    of: a resume must not append another version of the file to it."""
    artifacts.write_json(
        _meta_path(part),
        {
            "url": url,
            "etag": response.headers.get("ETag"),
            "last_modified": response.headers.get("Last-Modified"),
            "total": total,
        },
    )


def _part_meta(part: Path, url: str) -> dict[str, Any]:
    """What was recorded of the remote file `part` is a copy of ({}: nothing, or another URL's)."""
    try:
        meta = artifacts.read_json(_meta_path(part))
    except (OSError, ValueError):
        meta = {}
    return meta if isinstance(meta, dict) and meta.get("url") == url else {}


def _resumable(meta: dict[str, Any], checked: bool) -> bool:
    """Whether kept bytes may be resumed: a checksum verifies the result, or a recorded ETag or
    Last-Modified shows (by If-Range and the 206's headers) that the remote file is the same."""
    return checked or bool(meta.get("etag") or meta.get("last_modified"))


def _kept_part(part: Path, url: str, checked: bool) -> dict[str, Any] | None:
    """What was recorded of the remote file `part` is a copy of, when `part` may be resumed;
    None (and `part` deleted) when there is nothing to resume or nothing to resume it safely by.

    A resume appends the remote file's current bytes to the kept ones. Without a checksum to
    verify the result, only an ETag or Last-Modified recorded when the part was started shows
    that those bytes are of the same version (the DPR and RocketQA files have no checksum).
    """
    if not part.exists():
        return None
    meta = _part_meta(part, url)
    if _resumable(meta, checked):
        return meta
    log.warning(
        "%s: nothing shows the %d bytes kept in %s are of the file served now (no checksum "
        "configured, no ETag or Last-Modified recorded); fetching it again from byte 0",
        url,
        part.stat().st_size,
        part.name,
    )
    _discard(part)
    return None


def _rerun_note(part: Path, url: str, kept: int, checked: bool) -> str:
    """What a rerun will do with the `kept` bytes of `part`, by _kept_part's own test."""
    if not kept or not part.exists():
        return "Nothing was kept: a rerun starts from byte 0."
    meta = _part_meta(part, url)
    if not _resumable(meta, checked):
        return (f"The {kept} bytes kept in {part} will not be resumed (no checksum configured, "
                "and the server sent no ETag or Last-Modified to show that they are of the file "
                "it serves then): a rerun starts from byte 0.")
    if checked:
        return f"Rerun to resume from the {kept} bytes kept in {part} (verified by the checksum)."
    validator = "ETag" if meta.get("etag") else "Last-Modified"
    return (f"Rerun to resume from the {kept} bytes kept in {part} if the server's {validator} "
            "is still the one recorded; if the file changed, a rerun starts from byte 0.")


def _if_range(meta: dict[str, Any]) -> dict[str, str]:
    # If-Range takes a strong ETag or a date; a weak ETag (W/"...") may not be used there.
    etag = meta.get("etag")
    if etag and not etag.startswith("W/"):
        return {"If-Range": etag}
    return {"If-Range": meta["last_modified"]} if meta.get("last_modified") else {}


def _changed_since(meta: dict[str, Any], response) -> str | None:
    """Why a 206 reply is of another version of the file than the kept bytes, else None."""
    total = re.fullmatch(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", ""))
    if meta.get("total") is not None and total and int(total.group(1)) != meta["total"]:
        return f"its length is now {total.group(1)} bytes, not {meta['total']}"
    for key, header in (("etag", "ETag"), ("last_modified", "Last-Modified")):
        now = response.headers.get(header)
        if meta.get(key) and now and now != meta[key]:
            return f"its {header} is now {now}, not {meta[key]}"
    return None


class _ShortRange(DownloadError):
    """A 206 reply that ended where it said, before the file's end: no failure, the next GET
    asks for the rest at once."""


def _http_attempt(
    session,
    url: str,
    part: Path,
    digests: _Digests,
    timeout: float,
    chunk_size: int,
    expected: Expected,
) -> None:
    """One GET that resumes `part` from its current length; raises on a transport or HTTP problem.

    `digests` covers the bytes already in `part` and is updated with what arrives.
    """
    meta = _kept_part(part, url, checked=expected.algorithm is not None)
    if meta is None and digests.bytes:
        digests.reset()
    offset = part.stat().st_size if meta is not None else 0
    headers = {"Range": f"bytes={offset}-", **_if_range(meta)} if offset else {}
    with session.get(url, headers=headers, stream=True, timeout=timeout) as response:
        if response.status_code == 416 and offset:
            # Range not satisfiable: nothing is left to send if `part` is complete. It is when the
            # server says the file has exactly its length (`Content-Range: bytes */N`), the
            # length it had when the part was started. A 416 without Content-Range (servers may
            # send none) leaves it to what the config knows: the configured `size` equal to the
            # part's, or (no size configured) a checksum; the caller verifies both and starts over
            # from byte 0 on a mismatch. A longer part, a Content-Range that says otherwise, or a
            # bare 416 where nothing can tell, cannot be trusted: start over from byte 0.
            stated = response.headers.get("Content-Range")
            match = re.fullmatch(r"bytes \*/(\d+)", stated or "")
            if match:
                complete = int(match.group(1)) == offset
            else:
                complete = stated is None and (
                    expected.size == offset
                    or (expected.size is None and expected.algorithm is not None))
            if complete and meta.get("total") in (None, offset):
                return
            _discard(part)
            digests.reset()
            raise DownloadError(
                f"GET {url}: the {offset} bytes kept in {part.name} do not match the remote file "
                f"(HTTP 416, Content-Range {response.headers.get('Content-Range')!r}); "
                "restarting from byte 0"
            )
        if response.status_code not in (200, 206):
            raise HTTPStatusError(url, response.status_code, response.reason)
        whole = None  # the file's length as a 206's Content-Range gives it
        if response.status_code == 206:
            content_range = response.headers.get("Content-Range", "")
            match = re.match(r"bytes (\d+)-(?:\d+/(\d+))?", content_range)
            if not match or int(match.group(1)) != offset:
                raise DownloadError(
                    f"GET {url}: asked for bytes {offset}- but got Content-Range "
                    f"{response.headers.get('Content-Range')!r}"
                )
            changed = _changed_since(meta, response)
            if changed:
                # (A server that honours If-Range answers 200 instead; this one did not.)
                _discard(part)
                digests.reset()
                raise DownloadError(
                    f"GET {url}: the remote file changed since {part.name} was started "
                    f"({changed}); restarting from byte 0"
                )
            whole = int(match.group(2)) if match.group(2) else None
        elif offset:
            # The server ignored the Range header, or If-Range said the file changed: start
            # over rather than append a second copy.
            log.warning("%s: the server sent the whole file; restarting from byte 0", url)
            offset = 0
            digests.reset()
        length = response.headers.get("Content-Length")
        sent = offset + int(length) if length is not None else None
        # A 206 may hold fewer bytes than asked (a server capping its range replies): the file
        # ends at its Content-Range length, not where this reply does.
        total = whole or (sent if sent is not None else expected.size)
        if not offset:
            _record_source(part, url, response, int(length) if length is not None else None)
        with (
            open(part, "ab" if offset else "wb") as writer,
            _progress(total, offset, part.name.removesuffix(".part")) as bar,
        ):
            # The raw stream, not iter_content: requests would decode a Content-Encoding it
            # was sent despite Accept-Encoding: identity, and the checksum is of the raw bytes.
            for block in response.raw.stream(chunk_size, decode_content=False):
                writer.write(block)
                digests.update(block)
                bar.update(len(block))
        if total is not None and digests.bytes < total:
            if digests.bytes == sent:
                raise _ShortRange(f"GET {url}: the reply ended at byte {sent} of {total}")
            raise DownloadError(
                f"GET {url}: connection closed after {digests.bytes} of {total} bytes"
            )


def _fetch_http(
    url: str,
    dest: Path,
    expected: Expected,
    *,
    retries: int,
    backoff: float,
    timeout: float,
    chunk_size: int,
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    import requests
    import urllib3

    # The body is read from urllib3's raw stream, whose errors requests does not wrap.
    transport_errors = (requests.RequestException, urllib3.exceptions.HTTPError, DownloadError)
    part = dest.with_name(dest.name + ".part")
    # Resume what an interrupted earlier run left, where that is safe (_kept_part); its bytes are
    # re-hashed, never trusted.
    kept = _kept_part(part, url, checked=expected.algorithm is not None) is not None
    digests = _Digests.of_file(part, expected.algorithm) if kept else _Digests(expected.algorithm)
    resumed_bytes = digests.bytes
    # failures: fruitless transport attempts in a row (progress resets them); corrupt: complete
    # files that failed verification (never reset: each one cost a whole download); bad_copies:
    # their (bytes, sha256), to tell a file the mirror serves as it is from damage on the way.
    failures, corrupt, attempts = 0, 0, 0
    bad_copies: set[tuple[int, str]] = set()
    with requests.Session() as session:
        # identity: the bytes on disk must be the bytes the checksum was computed on.
        session.headers.update(
            {
                "User-Agent": "retrieval-pretraining-download/0.1 (python-requests)",
                "Accept-Encoding": "identity",
            }
        )
        while True:
            attempts += 1
            before = digests.bytes
            try:
                _http_attempt(session, url, part, digests, timeout, chunk_size, expected)
            except transport_errors as error:
                if not getattr(error, "retryable", True):
                    raise DownloadError(f"{dest}: {error}; check the URL") from error
                # Progress resets the count: only fruitless attempts in a row exhaust the retries.
                failures = 0 if digests.bytes > before else failures + 1
                if isinstance(error, _ShortRange) and not failures:
                    continue
                reason = f"{type(error).__name__}: {error}"
                if failures > retries:
                    rerun = _rerun_note(part, url, digests.bytes, expected.algorithm is not None)
                    raise DownloadError(
                        f"{dest} (from {url}): giving up after {attempts} attempts ({failures} "
                        f"in a row without progress); last error: {reason}. {rerun}"
                    ) from error
                delay = min(backoff * 2 ** max(failures - 1, 0), 300.0)
            else:
                foreign = _part_mismatch(part, digests)
                bad = foreign or _mismatch(digests, expected)
                if bad is None:
                    break
                # (A part someone else wrote to is not a copy the mirror served.)
                copy = None if foreign else (digests.bytes, digests.hexdigest("sha256"))
                # A corrupt file cannot be repaired by resuming: drop it and start over.
                _discard(part)
                digests.reset()
                corrupt += 1
                reason = f"expected {bad[0]}, got {bad[1]}"
                if copy in bad_copies:
                    # Damage on the way does not repeat itself byte for byte: this is the file
                    # the mirror serves, and every further download would be this file again.
                    raise _same_copy_error(dest, url, corrupt, copy[1], bad)
                if copy is not None:
                    bad_copies.add(copy)
                if corrupt > retries:
                    raise ChecksumError(
                        f"{dest} (from {url}): checksum mismatch on {corrupt} complete downloads "
                        f"({attempts} attempts): {reason}; the partial file was deleted. If the "
                        "mirror serves a bad copy, try another mirror; if the expected checksum "
                        "is wrong, fix it in the config."
                    )
                delay = min(backoff * 2 ** (corrupt - 1), 300.0)
            log.warning(
                "%s: attempt %d failed (%s); retrying in %.1f s", url, attempts, reason, delay
            )
            sleep(delay)
    # Bytes kept from an earlier run count as resumed only if they survived to the end.
    resumed_bytes = 0 if digests.restarted else resumed_bytes
    return {"attempts": attempts, "resumed_bytes": resumed_bytes, "digests": digests}


def _publish(part: Path, dest: Path) -> None:
    """Give the verified `part` its final name `dest`."""
    if not part.is_symlink():
        artifacts.sync(part)  # verified: on disk before it takes the final name
    os.replace(part, dest)
    artifacts.sync_folder(dest.parent)
    _meta_path(part).unlink(missing_ok=True)


def fetch(
    url: str,
    dest: str | os.PathLike,
    *,
    sha1: str | None = None,
    md5: str | None = None,
    sha256: str | None = None,
    size: int | None = None,
    retries: int = 5,
    backoff: float = 2.0,
    timeout: float = 60.0,
    link: str = "copy",
    chunk_size: int = 1 << 16,
    sleep: Callable[[float], None] = time.sleep,
    on_verified: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Fetch `url` to `dest`, verified; return what the manifest records (see the module doc).

    `on_verified(info)` runs before the file takes its name (to write its manifest): if it fails
    (a full disk), no `dest` exists for Snakemake to delete as a failed job's output, and the
    verified `dest.part` stays for the rerun, which then downloads nothing again where it may resume
    it (a checksum, or the recorded ETag / Last-Modified).
    """
    if link not in ("copy", "symlink"):
        raise ValueError(f"link must be 'copy' or 'symlink', not {link!r}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected = Expected(sha256=sha256, sha1=sha1, md5=md5, size=size)
    if expected.algorithm is None and size is None:
        log.warning("%s: no checksum and no size given: the download cannot be verified", url)
    started = time.monotonic()
    source = local_path(url)
    with _fetch_lock(dest):
        part = dest.with_name(dest.name + ".part")
        if part.is_symlink():  # left by a symlink-mode run: writing through it would overwrite
            part.unlink()      # the user's own file (a copy-mode or HTTP rerun opens it "wb"/"ab")
            _meta_path(part).unlink(missing_ok=True)
        if source is not None:
            result = _fetch_local(source, dest, expected, link)
        else:
            result = _fetch_http(
                url,
                dest,
                expected,
                retries=retries,
                backoff=backoff,
                timeout=timeout,
                chunk_size=chunk_size,
                sleep=sleep,
            )
        digests: _Digests = result.pop("digests")
        algorithm = expected.algorithm
        info = {
            "url": url,
            "path": str(dest),
            "bytes": digests.bytes,
            "sha256": digests.hexdigest("sha256"),
            "md5": digests.hexdigest("md5"),
            "verified": {
                "check": algorithm or ("size" if size is not None else "none"),
                "expected": getattr(expected, algorithm) if algorithm else size,
                "actual": digests.hexdigest(algorithm) if algorithm else digests.bytes,
            },
            "mode": ("symlink" if link == "symlink" else "copy") if source is not None else "http",
            "seconds": round(time.monotonic() - started, 3),
            **result,
        }
        if on_verified is not None:
            on_verified(info)
        _publish(dest.with_name(dest.name + ".part"), dest)
    log.info(
        "fetched %s -> %s (%d bytes, %s verified)",
        url,
        dest,
        digests.bytes,
        info["verified"]["check"],
    )
    return info


# ------------------------------------------------------------------------------------------------
# Small documents


def read_url(url: str, *, retries: int = 3, timeout: float = 60.0, sleep=time.sleep) -> bytes:
    """A small document (a status file, a listing) from http(s), file:// or a path, with retries."""
    source = local_path(url)
    if source is not None:
        if source.is_dir():  # a file:// mirror: list it like a web server would
            return "".join(
                f'<a href="{p.name}/">{p.name}/</a>\n' for p in sorted(source.iterdir())
            ).encode()
        if not source.is_file():
            raise NotFound(f"{url} does not exist")
        return source.read_bytes()
    import requests

    for attempt in range(retries + 1):
        try:
            response = requests.get(url, timeout=timeout)
            if response.status_code == 404:
                raise NotFound(f"GET {url}: HTTP 404 Not Found")
            response.raise_for_status()
            return response.content
        except requests.RequestException as error:
            if attempt == retries:
                raise DownloadError(
                    f"GET {url} failed after {attempt + 1} attempts: {error}"
                ) from error
            sleep(min(2.0 * 2**attempt, 60.0))
    raise AssertionError("unreachable")
