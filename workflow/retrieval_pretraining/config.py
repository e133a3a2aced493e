"""The experiment config: loading, validation against the JSON schema, and per-stage slices.

The schema is composed from one fragment per config section (`schemas/<section>.schema.yaml`), so
each stage documents its own keys next to the others. Validation runs when Snakemake parses the
workflow and again when a stage starts, so a bad value fails before any work with a message that
names the key and what is allowed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_DIR = Path(__file__).parent / "schemas"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    """A config value is missing, of the wrong type, or outside what the stage accepts."""


def load_schema() -> dict[str, Any]:
    """The whole-config schema: `schemas/root.schema.yaml` plus one fragment per section."""
    root = yaml.safe_load((SCHEMA_DIR / "root.schema.yaml").read_text())
    for fragment in sorted(SCHEMA_DIR.glob("*.schema.yaml")):
        section = fragment.name.removesuffix(".schema.yaml")
        if section == "root":
            continue
        root["properties"][section] = yaml.safe_load(fragment.read_text())
        root.setdefault("required", []).append(section)
    return root


def _describe(error: jsonschema.ValidationError) -> str:
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    schema = error.schema if isinstance(error.schema, dict) else {}
    allowed = ""
    if "enum" in schema:
        allowed = f"; allowed values: {', '.join(map(str, schema['enum']))}"
    elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        allowed = f"; {error.validator} is {error.validator_value}"
    elif error.validator == "additionalProperties" and "properties" in schema:
        allowed = f"; known keys: {', '.join(sorted(schema['properties']))}"
    return f"config key '{key}': {error.message}{allowed}"


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Raise ConfigError listing every violation; return the config unchanged when valid."""
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(_describe(e) for e in errors))
    return config


def load(path: str | Path = PROJECT_ROOT / "config.yaml") -> dict[str, Any]:
    return validate(yaml.safe_load(Path(path).read_text()))


def resolve_path(path: str | Path, data_root: str | Path | None = None) -> Path:
    """Resolve a config path inside the project (or the configured data root); refuse anything else.

    Config files are data, not code: a path that climbs out of the project ('../../etc') is a
    mistake or an attack, so it is rejected unless it lies inside an explicitly configured root.
    """
    path = Path(path)
    roots = [PROJECT_ROOT] + ([Path(data_root).resolve()] if data_root else [])
    candidate = (path if path.is_absolute() else PROJECT_ROOT / path).resolve()
    if any(candidate == root or root in candidate.parents for root in roots):
        return candidate
    raise ConfigError(
        f"path '{path}' resolves to {candidate}, outside the project ({PROJECT_ROOT})"
        + (f" and the data root ({data_root})" if data_root else "")
        + "; move the file inside, or set 'data_root' in the config to the folder that holds it"
    )


def stage_argument(params: dict[str, Any]) -> str:
    """Serialise a stage's config slice for the command line (read back by `parse_stage_args`)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def stage_parser(description: str) -> argparse.ArgumentParser:
    """An argparse parser with the `--config JSON` option every stage module takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--config", type=json.loads, default={}, help="this stage's config slice as JSON"
    )
    return parser
