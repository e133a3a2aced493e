"""What the artifact types' audits share: the audit record, kinds and probes, manifests, Snakemake's
records, and the common shape of a Parquet artifact's audit. Audit code alone imports it (audit.py,
contracts/*/audit.py): a writer never runs it, so editing it reruns no stage.

A `Kind` says how `audit` recognises one kind of artifact (`matches`, given a `Probe` of the path)
and audits it (`audit(record, rows)`: say what it is, show its manifest and the rule that wrote it,
render a few rows as text, record each contract check). Kinds are tried in `rank` order; the bands
below keep the orders that matter (a folder is only a folder kind; a download is a download whatever
its name; a kind recognised by less goes after the kinds it would shadow).
"""

from __future__ import annotations

import base64
import datetime as _dt
import fnmatch
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import artifacts
from ..errors import MANIFEST_SECTIONS, BadInput, json_value_kind
from .downloads import download_manifest_path

# Kind.rank bands (first match wins; ranks are unique across the contracts).
RANK_FOLDER = 100  # folders, by their entries
RANK_DOWNLOAD = 200  # a download, whatever its name (before every name- or content-based kind)
RANK_PARQUET = 300  # Parquet files, by their columns
RANK_JSON = 400  # JSON files: by contents, then by name, then by place below results/
RANK_NAME = 500  # other files, by name
RANK_MEMBER = 900  # files of an index folder, which have no name of their own


class NotAnArtifact(BadInput, ValueError):
    """The path is not something this workflow writes (or is damaged beyond recognition)."""


@dataclass
class Audit:
    path: Path
    kind: str = "unknown"
    lines: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        self.lines.append(text)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        return bool(ok)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def render(self) -> str:
        out = [f"== {self.path}  [{self.kind}]", *self.lines, "", "-- checks"]
        out += [
            f"  {'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else "")
            for name, ok, detail in self.checks
        ] or ["  (none)"]
        return "\n".join(out)


class Probe:
    """What recognition may look at, each read at most once: the path, its place below results/,
    a folder's entries, a Parquet file's columns, a JSON file's contents."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.is_dir = path.is_dir()
        self.rel = results_relative(path) or ""  # '' outside a results/ folder
        self.section = self.rel.split("/")[0]

    @functools.cached_property
    def entries(self) -> set[str]:
        return {p.name for p in self.path.iterdir()}

    @functools.cached_property
    def columns(self) -> set[str]:
        try:
            return set(pq.ParquetFile(self.path).schema_arrow.names)
        except Exception as error:  # pyarrow raises several types for a damaged file
            raise NotAnArtifact(f"{self.path} is not a readable Parquet file: {error}") from error

    @functools.cached_property
    def data(self) -> Any:
        try:
            return json.loads(self.path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise NotAnArtifact(f"{self.path}: not JSON ({error})") from error


@dataclass(frozen=True)
class Kind:
    """One kind of artifact: how `audit` recognises it and how it audits it."""

    name: str  # how a refusal lists it: "chunks", ".trec", "a Lucene index (segments_* ...)"
    rank: int  # the order kinds are tried in (bands above)
    form: str  # "folder" (tried on folders only), or "Parquet", "JSON", "file" (on files)
    matches: Callable[[Probe], bool]
    audit: Callable[[Audit, int], None]
    schema: pa.Schema | None = None  # a Parquet kind's contract


def json_kind(name: str, rank: int, test: Callable[[Probe], bool], audit) -> Kind:
    """A JSON artifact: a `.json` file for which `test` holds (`probe.data` is its contents)."""

    def matches(p: Probe) -> bool:
        if not p.name.endswith(".json"):
            return False
        p.data  # a file that does not parse is refused as "not JSON", whatever its name
        return test(p)

    return Kind(name, rank, "JSON", matches, audit)


def parquet_kind(
    name: str, rank: int, schema: pa.Schema, recognise: Callable[[set[str]], bool], render,
    shown_as: str | None = None, columns: list[str] | None = None,
    counted_by: tuple[str, ...] = ("rows",), manifest_objects: tuple[str, ...] = (),
    manifest_counts: tuple[str, ...] = (),
) -> Kind:
    """A Parquet artifact, recognised by its column names: the manifest, the rule, the schema
    (checked against `schema`), the row count against the manifest's (its stats at the keys
    `counted_by`: each writer names its count), then `render(audit, table, manifest, rows)` for
    the rows and the kind's own checks. `table` holds the `columns` its checks read in full (all
    when None): a corpus's texts are most of its size, and checking its doc_ids needs none of them
    (the rows shown are read by `head`). `manifest_objects` and `manifest_counts`: the members of
    the manifest `render` reads deeper (load_manifest)."""

    def audit(a: Audit, n: int) -> None:
        try:
            pf = pq.ParquetFile(a.path)
        except Exception as error:  # pyarrow raises several types for a damaged file
            raise NotAnArtifact(f"{a.path} is not a readable Parquet file: {error}") from error
        a.kind = shown_as or name
        manifest = read_manifest(a.path, manifest_objects, manifest_counts)
        show_manifest(a, manifest)
        show_snakemake_record(a, a.path)
        schema_summary(a, pf)
        sound = check_schema(a, pf.schema_arrow, schema)
        table = pf.read(columns=columns)
        sound = check_no_nulls(a, pf, schema, table) and sound
        rows = pf.metadata.num_rows
        recorded = recorded_stat(manifest, counted_by)
        if recorded is not None:
            a.check(
                "row count equals the manifest's",
                recorded == rows,
                f"{rows} vs {recorded} (stats.{'.'.join(counted_by)})",
            )
        if not sound:  # a renderer reads the columns as the contract has them
            a.say("-- rows not shown, the kind's own checks not run: the schema checks failed")
            return
        render(a, table, manifest, n)

    def matches(p: Probe) -> bool:
        return p.name.endswith(".parquet") and recognise(p.columns)

    return Kind(name, rank, "Parquet", matches, audit, schema)


def recorded_stat(manifest: dict[str, Any] | None, keys: tuple[str, ...]) -> Any:
    """The manifest's stats at the nested `keys` (("shard", "chunks"): stats.shard.chunks), or
    None where it records none."""
    value: Any = (manifest or {}).get("stats")
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


# ----------------------------------------------------------------------------- places
def results_root(path: Path) -> Path | None:
    """The `results/` folder an artifact lives in (its siblings are found relative to it)."""
    for parent in [path, *path.resolve().parents]:
        if parent.name == "results":
            return parent
    return None


def results_relative(path: Path) -> str | None:
    """The path below its `results/` folder ('pretrain/costa/loss.png'), or None outside one."""
    root = results_root(path)
    if root is None:
        return None
    return path.resolve().relative_to(root.resolve()).as_posix()


def input_path(recorded: str, near: Path | None) -> Path:
    """Where a manifest's input lies. Stages run in the project root (Snakemake's working
    directory, the folder holding `results/`) and record relative paths as given, so a relative
    one is resolved against the project that `near` (a path at or below `results/`) lies in, not
    against the current directory; an absolute one, or one outside any project, is kept."""
    path = Path(recorded)
    root = results_root(near) if near is not None else None
    if path.is_absolute() or root is None:
        return path
    return root.resolve().parent / path


def known_file(path: Path) -> tuple[str, str] | None:
    """(what it is, which rule writes it) for a path below results/ that a contract's FILES names.
    First match wins; the patterns are fnmatch's (`*` also matches `/`)."""
    from .registry import known_files  # the registry imports every type's audit, which import this

    rel = results_relative(path)
    if rel is None:
        return None
    for pattern, what, rule in known_files():
        if fnmatch.fnmatchcase(rel, pattern):
            return what, rule
    return None


def describe_origin(a: Audit, label: str, required: bool = True, rule: str | None = None) -> None:
    """Say what the file is and which rule wrote it; refuse a file this workflow does not write
    (unless not `required`: its contents already identify it). The rule is Snakemake's record's
    (the job that wrote the file or its folder), else `rule` (what the caller read in the
    artifact), else the one FILES names: a copy of another dataset's file (an alias's, a shared
    corpus's) is the copying rule's, not the rule that writes the original."""
    known = known_file(a.path)
    if known is not None:
        rule = recorded_rule(a.path) or rule or known[1]
        who = rule if rule.startswith("`") else f"rule {rule}"
        a.say(f"-- {known[0]}; written by {who}")
    elif required and snakemake_record(a.path) is None and read_manifest(a.path) is None:
        raise NotAnArtifact(
            f"{a.path}: {label}, but not one this workflow writes (not a known file below "
            "results/, no Snakemake record, no manifest)"
        )


# ----------------------------------------------------------------------------- manifests
# The key of what load_manifest returns for a manifest it cannot read.
UNREADABLE = "unreadable"


def load_manifest(path: Path, objects: tuple[str, ...] = (), counts: tuple[str, ...] = ()
                  ) -> dict[str, Any]:
    """The manifest at `path`. One cut short or damaged (not JSON, not an object, its stats or
    params not an object: the kinds' audits read into both; its inputs or an input's entry not an
    object: show_manifest reads them) comes back as {UNREADABLE: why}: read elsewhere it is a
    manifest with nothing in it, and show_manifest fails its check, so the audit goes on, names
    the file and exits 1 instead of a traceback. So does one whose member a kind reads deeper is
    damaged: `objects` (dotted keys, "stats.verified") that are no object, `counts`
    ("params.max_len") that are no positive integer, where present; and an input's `path` that
    is no string (show_manifest and the kinds resolve it as a path)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return {UNREADABLE: f"{path}: {error}"}
    if not isinstance(data, dict):
        return {UNREADABLE: f"{path}: not a JSON object but {json_value_kind(data)}"}
    inputs = data.get("inputs")
    entries = [f"inputs.{name}" for name in inputs] if isinstance(inputs, dict) else []
    for key in (*MANIFEST_SECTIONS, "inputs", *entries, *objects):
        member = _member(data, key)
        if member is not None and not isinstance(member, dict):
            return {UNREADABLE: f"{path}: its {key} is not a JSON object but "
                                f"{json_value_kind(member)}"}
    for name, entry in (inputs.items() if isinstance(inputs, dict) else ()):
        member = (entry or {}).get("path")  # show_manifest and the kinds take Path() of it
        if member is not None and not isinstance(member, str):
            return {UNREADABLE: f"{path}: its inputs.{name}.path is {json.dumps(member)}, not "
                                "a string"}
    for key in counts:
        member = _member(data, key)
        if member is not None and (isinstance(member, bool) or not isinstance(member, int)
                                   or member < 1):
            return {UNREADABLE: f"{path}: its {key} is {json.dumps(member)}, not a positive "
                                "integer"}
    return data


def _member(data: dict[str, Any], key: str) -> Any:
    """`data` at the dotted `key` ("stats.verified"; an input's name may hold dots); None where it,
    or an object on the way, is absent (one on the way that is no object is checked first)."""
    head, _, rest = key.partition(".")
    value = data.get(head)
    if not rest:
        return value
    if head == "inputs":
        return value.get(rest) if isinstance(value, dict) else None
    return _member(value, rest) if isinstance(value, dict) else None


def folder_stage(folder: Path) -> str | None:
    """The stage the folder's own manifest.json names (the writer that made the folder), or None:
    none there, or one that does not read. A folder kind recognised by its files alone could not
    fail the check that a defining file is there: the folder missing it was refused as no
    artifact (exit 2) rather than failed (exit 1)."""
    stage = load_manifest(folder / "manifest.json").get("stage")
    return stage if isinstance(stage, str) else None


def read_manifest(path: Path, objects: tuple[str, ...] = (), counts: tuple[str, ...] = ()
                  ) -> dict[str, Any] | None:
    """The manifest beside `path` (load_manifest's, with its members checked), or None when there
    is none."""
    for candidate in (artifacts.manifest_path(path), download_manifest_path(path)):
        if candidate.is_file() and candidate.resolve() != path.resolve():
            return load_manifest(candidate, objects, counts)
    return None


def show_manifest(a: Audit, manifest: dict[str, Any] | None) -> None:
    a.say("-- manifest")
    if manifest is None:
        a.say("  (no manifest beside it)")
        return
    if UNREADABLE in manifest:
        a.check("manifest readable", False, f"{manifest[UNREADABLE]}; rerun the rule that wrote it")
        return
    a.say(f"  stage: {manifest.get('stage')}   created: {manifest.get('created')}")
    a.say(f"  params: {short(json.dumps(manifest.get('params', {}), sort_keys=True), 400)}")
    if manifest.get("stats"):
        a.say(f"  stats: {short(json.dumps(manifest['stats'], sort_keys=True), 400)}")
    for name, entry in (manifest.get("inputs") or {}).items():
        status = ""
        source = input_path(entry.get("path", ""), a.path)
        if "sha256" in entry and source.is_file():
            # Once per file version and audit run: every shard's manifest records the same
            # inputs (all the article parts, a whole corpus), hashed again for each shard
            # made auditing a results tree quadratic in its size.
            same = artifacts.sha256_once(source) == entry["sha256"]
            status = "unchanged" if same else "CHANGED since"
            a.check(f"input '{name}' still has the recorded checksum", same, str(source))
        elif "weights" in entry:
            status = check_folder_weights(a, name, source, entry["weights"])
        elif "sha256" in entry:
            status = "not found now"
        elif source.is_dir():
            status = "(a folder; its weights' sha256 not recorded: not compared)"
        a.say(f"  input {name}: {source} {status}")
    versions = manifest.get("versions") or {}
    if versions:
        a.say("  versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))


def check_folder_weights(a: Audit, name: str, folder: Path, recorded: Any) -> str:
    """A model folder input recorded with its weights' sha256 (the encoder of embeddings, mined
    negatives and dense runs: encode.record_encoder_weights, copied from the folder's manifest)
    against what the folder's manifest records now; its status. The files themselves are the
    folder's own audit's (weights match the sha256 manifest.json records)."""
    if not folder.is_dir():
        return "not found now"
    current = (read_manifest(folder) or {}).get("stats") or {}
    same = current.get("weights") == recorded
    detail = "" if same else (
        f"{folder}: changed since (its manifest.json records "
        f"{current.get('weights') or 'no weights'}, this manifest {recorded}); rerun the rule "
        "that wrote this with the encoder there now"
    )
    a.check(f"input '{name}' still has the recorded weights (sha256 in its manifest.json)", same,
            detail or str(folder))
    return "unchanged" if same else "CHANGED since"


# ----------------------------------------------------------------------------- Snakemake records
def snakemake_metadata(path: Path) -> tuple[Path, Path] | None:
    """(working directory, its .snakemake/metadata folder) of the project `path` lies in."""
    for workdir in path.resolve().parents:
        meta = workdir / ".snakemake" / "metadata"
        if meta.is_dir():
            return workdir, meta
    return None


def snakemake_record(path: Path) -> tuple[str, dict[str, Any]] | None:
    """(output, record) of the Snakemake job that wrote `path`, or the folder output holding it."""
    found = snakemake_metadata(path)
    if found is None:
        return None
    workdir, meta = found
    target = path.resolve()
    while target != workdir:
        rel = str(target.relative_to(workdir))
        record = meta / base64.urlsafe_b64encode(rel.encode()).decode()
        if record.is_file():
            return rel, json.loads(record.read_text())
        target = target.parent
    return None


def recorded_rule(path: Path) -> str | None:
    """The rule of the Snakemake job that wrote `path` (or the folder output holding it)."""
    try:
        record = snakemake_record(path)
    except (OSError, ValueError):  # a record cut short reads as none: the FILES table's rule
        return None
    return None if record is None else record[1].get("rule")


def show_snakemake_record(a: Audit, path: Path) -> None:
    """Which rule, inputs and command produced it, from Snakemake's per-output metadata record."""
    found = snakemake_metadata(path)
    if found is None:
        return
    rel = str(path.resolve().relative_to(found[0]))
    a.say("-- produced by")
    record = snakemake_record(path)
    if record is None:
        a.say(f"  no Snakemake record for {rel} (built outside Snakemake, or long path)")
        return
    output, info = record
    if output != rel:
        a.say(f"  (part of the folder output {output})")
    end = info.get("endtime")
    when = (
        _dt.datetime.fromtimestamp(end, _dt.timezone.utc).isoformat(timespec="seconds")
        if isinstance(end, (int, float))
        else end
    )
    a.say(f"  rule {info.get('rule')}  (finished {when})")
    for item in info.get("input") or []:
        a.say(f"  input {item}")
    if info.get("log"):
        a.say(f"  log {', '.join(info['log'])}")
    if info.get("shellcmd"):
        a.say(f"  command: {short(' '.join(info['shellcmd'].split()), 300)}")


# ----------------------------------------------------------------------------- text and tables
def short(text: str, limit: int = 160) -> str:
    text = text.replace("\n", " ⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def schema_summary(a: Audit, table_or_file: pq.ParquetFile) -> None:
    meta = table_or_file.metadata
    a.say(f"-- schema ({meta.num_rows} rows, {meta.num_row_groups} row groups)")
    for f in table_or_file.schema_arrow:
        a.say(f"  {f.name}: {f.type}")


def check_schema(a: Audit, schema: pa.Schema, expected: pa.Schema) -> bool:
    """Each column of the contract present with its type; True when all are."""
    sound = True
    for f in expected:
        got = schema.field(f.name).type if f.name in schema.names else None
        detail = f"found {got}" if got != f.type else ""
        sound = a.check(f"column {f.name} is {f.type}", got == f.type, detail) and sound
    return sound


def null_count(pf: pq.ParquetFile, name: str, table: pa.Table) -> int:
    """The nulls of a column: the read `table`'s, else from the row groups' statistics where
    every one has them (a flat column), else read (that column alone)."""
    if name in table.column_names:
        return table[name].null_count
    if not pa.types.is_nested(pf.schema_arrow.field(name).type):
        index = pf.schema_arrow.get_field_index(name)
        stats = [pf.metadata.row_group(g).column(index).statistics
                 for g in range(pf.metadata.num_row_groups)]
        if all(s is not None and s.has_null_count for s in stats):
            return sum(s.null_count for s in stats)
    return pf.read(columns=[name]).column(name).null_count


def check_no_nulls(a: Audit, pf: pq.ParquetFile, expected: pa.Schema, table: pa.Table) -> bool:
    """No null in a column the contract declares not nullable: a check of types alone passed a
    null page_id (to_numpy makes it a NaN, which np.unique counts as distinct)."""
    sound = True
    for f in expected:
        if f.nullable or f.name not in pf.schema_arrow.names:
            continue
        nulls = null_count(pf, f.name, table)
        sound = a.check(f"column {f.name} has no null", not nulls,
                        f"{nulls} nulls" if nulls else "") and sound
    return sound


def check_unique(a: Audit, name: str, column: pa.Array | pa.ChunkedArray) -> bool:
    """The check `<name> unique`; failing, its detail names how many values repeat and the first
    (in row order) with its rows: a file of millions of rows is otherwise searched by hand."""
    if len(pc.unique(column)) == len(column):
        return a.check(f"{name} unique", True)
    counts = pc.value_counts(column)  # in the order the values first appear
    again = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
    # A null equals nothing (equal() is null), so a repeated null's rows are its null rows.
    first = again[0]
    same = pc.equal(column, first) if first.is_valid else pc.is_null(column)
    rows = np.flatnonzero(pc.fill_null(same, False).to_numpy(zero_copy_only=False))
    return a.check(f"{name} unique", False,
                   f"{len(again)} values repeated; first "
                   f"{repr(first.as_py()) if first.is_valid else 'null'} at rows "
                   f"{rows[:5].tolist()}{' ...' if len(rows) > 5 else ''}")


def head(path: Path, n: int) -> pa.Table:
    """The first `n` rows, every column (read from the first row group, not the whole file)."""
    batches = pq.ParquetFile(path).iter_batches(batch_size=max(n, 1))
    first = next(batches, None)
    return pa.Table.from_batches([first]).slice(0, n) if first is not None else pa.table({})


def render_table_rows(key: str | None):
    """A renderer for tables of ids and texts: `key` unique (when given), then a few rows (read by
    `head`: the table may hold the key column alone)."""

    def render(a: Audit, t: pa.Table, manifest, n: int) -> None:
        if key is not None:
            check_unique(a, key, t[key])
        a.say("-- rows")
        for row in head(a.path, n).to_pylist():
            a.say("  " + " | ".join(f"{k}={short(str(v), 120)}" for k, v in row.items()))

    return render

