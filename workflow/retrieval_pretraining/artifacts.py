"""Writing auditable artifacts: atomic files, Parquet with explicit schemas, JSON manifests.

Every stage writes its outputs through these helpers so that (1) a crash never leaves a half file
that looks whole to Snakemake, and (2) every artifact carries a manifest saying what produced it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

# read_json and read_json_object live in errors.py, which imports no pyarrow, for the readers
# that must not (model_folder); the stages read them from here.
from .errors import expect_manifest, read_json, read_json_object  # noqa: F401

# Libraries whose versions matter for reproducing an artifact; missing ones are skipped.
_TRACKED_LIBRARIES = (
    "torch", "transformers", "tokenizers", "pyarrow", "polars", "numpy", "faiss-cpu",
    "pyserini", "ir_measures", "mwparserfromhell", "spacy", "snakemake",
)

log = logging.getLogger(__name__)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync(path: str | os.PathLike) -> None:
    """Flush a file, or a folder and every file in it, to disk. A rename is only as durable as
    the data it names: on file systems that do not order the two (XFS, and ext4 for a new file
    without auto_da_alloc), a node crash soon after the rename leaves the final name on an empty
    or short file, which a resume or a rerun would then trust as complete."""
    path = Path(path)
    if not path.is_dir():
        _fsync(path)
        return
    for child in sorted(path.rglob("*")):
        if child.is_symlink():
            continue
        if child.is_dir():
            sync_folder(child)
        elif child.is_file():
            _fsync(child)
    sync_folder(path)


def sync_folder(path: str | os.PathLike) -> None:
    """Flush a folder's entries (the names a rename changed). Some network file systems refuse
    to fsync a folder; their renames are the server's to make durable, so that is let pass."""
    try:
        _fsync(Path(path))
    except OSError:
        pass


def temp_prefix(path: Path, kind: str = "") -> str:
    """The start of the names of `path`'s temps (`.<name>.`, or `.<name>.<kind>.` for a writer's
    other temps, such as a spill folder); tempfile adds 8 random characters and ".tmp"."""
    return f".{path.name}.{kind + '.' if kind else ''}"


def remove_leftover_temps(path: Path, kind: str = "") -> None:
    """Delete the temps an earlier attempt at `path` left behind: a job killed outright (a time
    limit's SIGKILL, the OOM killer) runs no `finally`, so its temp (~27 GB for an MS MARCO dense
    index) stayed beside the output, and every rerun left another. Only names of `path`'s own
    scheme are matched: tempfile's random part holds no dot, so the temps of another output in
    the folder (`X.a`'s are `.X.a.<8>.tmp`) are never taken, and Snakemake never runs two jobs
    for one output at once. Call before making this attempt's temp."""
    pattern = re.compile(re.escape(temp_prefix(path, kind)) + r"[a-z0-9_]{8}\.tmp")
    if not path.parent.is_dir():
        return
    for entry in path.parent.iterdir():
        if not pattern.fullmatch(entry.name):
            continue
        size = _size(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        log.info("removed %s (%s bytes), left by an earlier attempt at %s killed part-way",
                 entry, f"{size:,}", path.name)


@contextlib.contextmanager
def temp_dir(path: Path, kind: str = "") -> Iterator[Path]:
    """A temporary folder beside `path`, named by its temp scheme (temp_prefix) after an earlier
    attempt's leftovers are removed (remove_leftover_temps), deleted on exit: a writer's scratch
    (a BM25 build's collection, a checkpoint's staging, chunking's spill with kind "spill")."""
    remove_leftover_temps(path, kind)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=temp_prefix(path, kind),
                                     suffix=".tmp") as tmp:
        yield Path(tmp)


def _size(path: Path) -> int:
    """Bytes in a file or folder, for the log (0 for what cannot be read)."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir() or p.is_symlink())
    except OSError:
        return 0


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_leftover_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600 files; artifacts are meant to be read by collaborators too.
        if tmp_path.exists():
            tmp_path.chmod(0o644)
            sync(tmp_path)
        os.replace(tmp_path, path)
        sync_folder(path.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; it replaces `path` only if the block succeeds.

    For artifacts that are folders (an index, an encoder): a failure part-way (a full disk) leaves
    no folder that looks whole, only nothing; the temp folder is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_leftover_temps(path)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp creates 0700 folders; artifacts are meant to be shared
        sync(tmp)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        sync_folder(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_manifest(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """read_json_object of a manifest (write_manifest's): its `params` and `stats` are objects
    ({} where absent or null); any other value there is InputFileError naming `path`."""
    return expect_manifest(read_json(path, what), path, what)


def write_parquet(path: str | os.PathLike, table: pa.Table, schema: pa.Schema) -> None:
    """Write `table` cast to `schema` (the stage's declared contract), atomically, with zstd."""
    if table.schema != schema:
        table = table.select(schema.names).cast(schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


# sha256 per file version (resolved path, size, modification time) in this process.
_SHA256: dict[tuple[str, int, int], str] = {}


def file_version(path: str | os.PathLike) -> tuple[str, int, int]:
    path = Path(path)
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def sha256_once(path: str | os.PathLike) -> str:
    """sha256_file, computed once per file version in this process: a sharded stage records the
    same inputs in every shard's manifest (64 shards x every article part, ~20 GB, at paper
    scale), and the trainer checks, caches and records the same shards (~13 GB of chunks)."""
    version = file_version(path)
    if version not in _SHA256:
        _SHA256[version] = sha256_file(version[0])
    return _SHA256[version]


def adopt_sha256(path: str | os.PathLike, version: tuple[str, int, int], digest: str) -> None:
    """Take `digest`, computed by another process for `version` of `path`, as this process's
    sha256_once of it, if the file is still that version here (same size and modification time
    on a shared file system); otherwise sha256_once will read the file itself."""
    here = file_version(path)
    if tuple(here[1:]) == tuple(version[1:]):
        _SHA256[here] = digest


def library_versions() -> dict[str, str]:
    return dict(_library_versions())


@functools.lru_cache(maxsize=1)  # reading the packages' metadata costs ~30 ms per manifest
def _library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TRACKED_LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


PACKAGE_DIR = Path(__file__).resolve().parent


def git_version(root: Path = PACKAGE_DIR.parents[1]) -> str:
    """`git describe` of the checkout, or a note that there is none (e.g. a copied project)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=root, capture_output=True, text=True, timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown (not a git checkout)"


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """Which code wrote an artifact: the git version and a digest of the package's source files.

    The digest identifies the code even outside git (a copied project, a cluster node's copy).
    Taken once per process, when this module is imported (below), not at the first manifest.
    """
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*")):
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0")
            digest.update(path.read_bytes())
    return {"git": git_version(), "package_sha256": digest.hexdigest()}


# Now, as the stage starts (every stage imports this module with its own modules), not when its
# first manifest is written: that can be the end of a days-long job, after a `git pull` in the
# project, and the manifest would then name code that did not run.
code_version()


def manifest_path(artifact: str | os.PathLike) -> Path:
    """Beside an artifact: `x.parquet` -> `x.manifest.json`, `d/` -> `d/manifest.json`."""
    artifact = Path(artifact)
    if artifact.is_dir():
        return artifact / "manifest.json"
    return artifact.with_name(artifact.name.split(".")[0] + ".manifest.json")


# The files that hold a model folder's weights (the encoder's; COSTA's projector when it has one).
WEIGHT_FILES = ("model.safetensors", "projector.safetensors")


def weights_checksums(folder: str | os.PathLike) -> dict[str, str]:
    """sha256 of the model folder's weight files: what identifies its weights (config.json, the
    same for every model of one architecture, does not)."""
    return {name: sha256_once(Path(folder) / name) for name in WEIGHT_FILES
            if (Path(folder) / name).is_file()}


def write_manifest(
    path: str | os.PathLike,
    *,
    stage: str,
    params: dict[str, Any],
    inputs: dict[str, str | os.PathLike] | None = None,
    stats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record what produced an artifact: stage, params, input checksums, statistics, versions."""
    input_entries = {}
    for name, input_path in (inputs or {}).items():
        input_path = Path(input_path)
        entry: dict[str, Any] = {"path": str(input_path)}
        if input_path.is_file():
            entry["sha256"] = sha256_once(input_path)
            entry["bytes"] = input_path.stat().st_size
        input_entries[name] = entry
    manifest = {
        "stage": stage,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "params": params,
        "inputs": input_entries,
        "stats": stats or {},
        "versions": library_versions(),
        "code": code_version(),
    }
    write_json(path, manifest)
    return manifest
