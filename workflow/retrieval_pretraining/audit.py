"""Print a readable summary of any artifact the workflow writes: `python -m retrieval_pretraining.audit PATH`.

For every artifact: what it is, its manifest (stage, parameters, inputs and whether they still have
the recorded checksums), which Snakemake rule produced it (from .snakemake/metadata when present),
its schema and size, a few rows rendered as text (token ids decoded with the checkpoint tokenizer
named by the manifests, spans shown inside their chunk, negatives shown with their query), and the
contract checks it passed. Exit status (the highest over the paths, each audited whatever the
others gave): 0 all checks passed, 1 a check failed (a file with a manifest beside it, or that
Snakemake records as a job's output, which no longer reads as its artifact included), 2 not an
artifact, 3 could not be audited (an error the audit did not foresee, shown as one line naming the
path; `--debug` shows the traceback).

This module only dispatches: each artifact type's contract is one folder of `contracts/` (its
`__init__` holds the schema and, where there is one, the writer's validator, its `audit` module
how it is recognised, summarised and checked), and `detect` tries their kinds in rank order. A file inside a folder
artifact (a model, Lucene or FAISS folder) is audited as part of that folder. Not artifacts (exit 2,
saying what they are instead): Snakemake's job logs (results/logs/), benchmarks
(results/benchmarks/) and `.snakemake_timestamp` markers, any file this workflow does not
write, and a folder no folder kind recognises (a stage's folder: results/datasets/<name>,
results/finetune/<model>/<dataset>/stage2), whose refusal lists the artifacts it holds to audit
instead (HELD_LEVELS down at most, the first HELD_SHOWN, then how many more).

`--stage-stats` writes instead one page of every given artifact's manifest statistics (rule
stage_statistics).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from . import artifacts
from .contracts import registry
from .contracts.base import (
    UNREADABLE, Audit, Kind, NotAnArtifact, Probe, load_manifest, read_manifest, results_relative,
    show_manifest, show_snakemake_record, snakemake_metadata, snakemake_record,
)
from .contracts.downloads import download_manifest_path
from .contracts.metrics.audit import metrics_as_manifest
from .errors import add_debug_option, command, one_line


def not_a_job_record(path: Path, section: str) -> NotAnArtifact:
    """Logs and benchmarks describe a Snakemake job; name the job's outputs to audit instead."""
    what = "log" if section == "logs" else "benchmark"
    rule, outputs = None, []
    found = snakemake_metadata(path)
    if found is not None and section == "logs":
        rel = str(path.resolve().relative_to(found[0]))
        for record in found[1].iterdir():
            try:
                info = json.loads(record.read_text())
                output = base64.urlsafe_b64decode(record.name).decode()
            except (OSError, ValueError):
                continue  # a sub-folder (long paths) or a record being written
            if rel in (info.get("log") or []):
                rule = info.get("rule")
                outputs.append(output)
    if rule is None:
        parts = (results_relative(path) or "").split("/")
        rule = parts[1] if len(parts) > 2 else None
    job = f" of rule {rule}" if rule else ""
    advice = f"; audit its outputs: {', '.join(sorted(outputs))}" if outputs else ""
    return NotAnArtifact(
        f"{path}: a Snakemake job {what}{job}, not an artifact (no manifest, no rule reads it)"
        f"{advice}"
    )


FORMS = ("folder", "Parquet", "JSON", "file")  # Kind.form: which refusal lists a kind


def _listing(names: list[str], last: str = "or") -> str:
    """'a, b or c' (names in the order audit tries them, each once)."""
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def refusal(probe: Probe, kinds: list[Kind], listing: bool = True) -> NotAnArtifact:
    """What no kind recognised, with the kinds it could have been (from the contracts); for a
    folder, what it holds to audit instead (`listing`: not while that listing is being made)."""
    names = {form: [k.name for k in kinds if k.form == form] for form in FORMS}
    path = probe.path
    if probe.is_dir:
        held = f"\n{what_it_holds(path)}" if listing else ""
        return NotAnArtifact(f"{path} is a folder but not {_listing(names['folder'], 'nor')}{held}")
    if probe.name.endswith(".parquet"):
        return NotAnArtifact(
            f"Parquet columns {sorted(probe.columns)} match no artifact contract of this workflow "
            f"({', '.join(dict.fromkeys(names['Parquet']))})"
        )
    if probe.name.endswith(".json"):
        return NotAnArtifact(
            f"{path}: JSON, but none this workflow writes ({_listing(names['JSON'])})"
        )
    return NotAnArtifact(
        f"{path}: no artifact of this workflow has this kind of name (Parquet, .json, "
        f"{', '.join(names['file'])}, or a folder: {_listing(names['folder'])})"
    )


HELD_LEVELS, HELD_SHOWN = 3, 20  # how deep, and how many, a folder's refusal lists what it holds


def accepted(path: Path) -> bool:
    """Whether `audit` would audit `path` (a kind recognises it, or it is a file the workflow
    wrote that no longer reads as its artifact), not refuse it as no artifact."""
    try:
        # A subfolder's own listing is not made: each one's would walk HELD_LEVELS further down,
        # and so on, the whole tree below, a path probed once for each way down to it.
        detect(path, listing=False)
    except NotAnArtifact:
        return written_by_the_workflow(path)
    except Exception:  # damage no check foresaw: audit says so (exit 3), not this listing
        return False
    return True


def held_artifacts(folder: Path, levels: int = HELD_LEVELS) -> list[Path]:
    """The paths `audit` accepts below a folder that is no artifact itself (a stage's folder such
    as results/datasets/<name>), shallowest first, `levels` down at most. A folder artifact's own
    files are audited with it, and a manifest with the artifact beside it, so neither is listed;
    job logs and benchmarks (results/logs/, results/benchmarks/) and hidden names are skipped."""
    found: list[Path] = []
    level = [folder]
    for _ in range(levels):
        below = []
        for parent in level:
            try:
                entries = sorted(parent.iterdir())
            except OSError:
                continue
            for path in entries:
                if path.name.startswith(".") or Probe(path).section in ("logs", "benchmarks"):
                    continue
                if accepted(path):
                    found.append(path)
                elif path.is_dir():
                    below.append(path)
        level = below
    beside = {m for p in found for m in (artifacts.manifest_path(p), download_manifest_path(p))
              if m != p}
    return [p for p in found if p not in beside]


def what_it_holds(folder: Path) -> str:
    """The refusal's advice for a folder: the artifacts in it to audit instead (HELD_SHOWN of
    them, then how many more), or that it holds none."""
    held = held_artifacts(folder)
    depth = f"{HELD_LEVELS} levels down at most"
    if not held:
        return f"  it holds no artifact either ({depth})"
    more = len(held) - HELD_SHOWN
    lines = [f"  it holds {len(held)} artifact(s) to audit instead ({depth}):"]
    lines += [f"    {p}" for p in held[:HELD_SHOWN]]
    lines += [f"    and {more} more"] if more > 0 else []
    return "\n".join(lines)


def known_kinds() -> str:
    """What audit recognises, by form and in the order it tries them (`--help`): from the
    contracts, so a new artifact type is listed once its folder is there."""
    kinds, heading = registry.kinds(), {"folder": "folders", "file": "other files"}
    forms = [(form, [k.name for k in kinds if k.form == form]) for form in FORMS]
    listed = "; ".join(f"{heading.get(form, form)}: {', '.join(dict.fromkeys(names))}"
                       for form, names in forms if names)
    return f"Artifacts it recognises (contracts/): {listed}."


def detect(path: Path, listing: bool = True) -> Kind:
    """The kind of artifact at `path` (the first, in rank order, that recognises it); else
    NotAnArtifact, a folder's listing what it holds unless `listing` is False (refusal)."""
    if not path.exists():
        raise NotAnArtifact(f"{path} does not exist")
    if path.name == ".snakemake_timestamp":
        raise NotAnArtifact(
            f"{path}: Snakemake's timestamp marker of the folder output {path.parent}, not an "
            "artifact; audit the folder"
        )
    probe = Probe(path)
    if probe.section in ("logs", "benchmarks") and path.is_file():
        raise not_a_job_record(path, probe.section)
    kinds = registry.kinds()
    for kind in kinds:
        if (kind.form == "folder") == probe.is_dir and kind.matches(probe):
            return kind
    raise refusal(probe, kinds, listing)


def written_by_the_workflow(path: Path) -> bool:
    """Whether a manifest beside the file, or Snakemake's record of it as a job's output, says
    this workflow wrote it (its name or place alone does not: random bytes named like an
    artifact are refused as what they are)."""
    if not path.is_file():
        return False
    if read_manifest(path) is not None:
        return True
    found, record = snakemake_metadata(path), snakemake_record(path)
    return record is not None and record[0] == str(path.resolve().relative_to(found[0]))


def damaged(path: Path, error: NotAnArtifact) -> Audit:
    """A file the workflow wrote that no longer reads as its artifact (cut short, overwritten):
    a failed check (exit 1) naming what is wrong, with its manifest and rule; refused as 'not an
    artifact' (exit 2), a script telling the two apart passed it by."""
    result = Audit(path, kind="damaged artifact")
    show_manifest(result, read_manifest(path))
    show_snakemake_record(result, path)
    result.check("reads as the artifact this workflow wrote", False,
                 f"{one_line(error)}; rerun the rule that wrote it")
    return result


def audit(path: str | Path, rows: int = 3) -> Audit:
    path = Path(path)
    result = Audit(path)
    try:
        detect(path).audit(result, rows)
    except NotAnArtifact as error:
        if not written_by_the_workflow(path):
            raise
        return damaged(path, error)
    return result


# ----------------------------------------------------------------------------- --stage-stats
def _scalars(stats: dict[str, Any], prefix: str = "") -> list[str]:
    """Flatten a manifest's stats to 'key=value' for scalars (histograms and lists are skipped)."""
    out = []
    for key, value in stats.items():
        if isinstance(value, dict):
            out += _scalars(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float, str, bool)) and len(str(value)) < 60:
            out.append(
                f"{prefix}{key}={value:.4g}"
                if isinstance(value, float)
                else f"{prefix}{key}={value}"
            )
    return out


def stage_statistics(paths: list[Path]) -> str:
    """Markdown: one row per artifact, grouped by the stage its manifest names, with its statistics."""
    rows = []
    for path in paths:
        manifest = (
            read_manifest(path)
            if not (path.is_file() and path.name.endswith("manifest.json"))
            else load_manifest(path)
        ) or metrics_as_manifest(path)
        if manifest is None:
            rows.append(("(no manifest)", str(path), "–", "–"))
            continue
        if UNREADABLE in manifest:
            rows.append(("(unreadable manifest)", str(path), "–", manifest[UNREADABLE]))
            continue
        stats = _scalars(manifest.get("stats") or {})
        rows.append(
            (
                manifest.get("stage", "?"),
                str(path),
                manifest.get("created", "?"),
                ", ".join(stats[:12]) + (" …" if len(stats) > 12 else ""),
            )
        )
    lines = [
        "# Per-stage statistics (from the artifacts' manifests)",
        "",
        "| stage | artifact | created | statistics |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {stage} | `{path}` | {created} | {stats} |"
        for stage, path, created, stats in sorted(rows)
    ]
    return "\n".join(lines) + "\n"


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=known_kinds())
    parser.add_argument("paths", nargs="+", type=Path, help="artifacts to audit")
    parser.add_argument("--rows", type=int, default=3, help="rows to render as text")
    parser.add_argument(
        "--stage-stats",
        type=Path,
        default=None,
        help="instead of auditing, write the manifests' statistics of PATHS as HTML here",
    )
    add_debug_option(parser)
    args = parser.parse_args(argv)
    if args.stage_stats is not None:
        from .markdown_html import markdown_to_html

        with artifacts.atomic_path(args.stage_stats) as tmp:
            tmp.write_text(markdown_to_html(stage_statistics(args.paths), "Per-stage statistics"))
        return 0
    status = 0
    for path in args.paths:
        try:
            result = audit(path, args.rows)
        except NotAnArtifact as error:
            print(f"audit: {error}", file=sys.stderr)
            status = max(status, 2)
            continue
        except Exception as error:  # damage no check foresaw, or a bug in its kind's audit
            if args.debug:
                raise
            sys.stdout.flush()
            print(f"audit: {path}: could not be audited ({type(error).__name__}: "
                  f"{one_line(error)}); --debug shows the traceback", file=sys.stderr, flush=True)
            status = max(status, 3)
            continue
        print(result.render())
        if not result.passed:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
