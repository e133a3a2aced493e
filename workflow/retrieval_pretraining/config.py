"""What a stage reads of the experiment config when it runs: its slice's parser (`--config JSON`),
ConfigError, path resolution inside the project, and its own unknown-key check against a section's
schema fragment (`schemas/<section>.schema.yaml`).

Every rule declares this module as a code input (rules/common.smk: every stage runs it), so it holds
nothing else: the whole config's validation at parse time (the schema, the cross-checks, the
advisories) is config_checks.py, which no stage imports, so a correction there reruns no job.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from .errors import BadInput, add_debug_option

SCHEMA_DIR = Path(__file__).parent / "schemas"
PROJECT_ROOT = Path(__file__).resolve().parents[2]

# A fine-tuning stage as the rules name it: stage<k>, or n<N>s<K>-stage<k> (N sampled training
# queries, sample K). The one definition (here, as references.py imports this module): the system
# names below, references' checks, finetune.smk's parse_stage and dense.smk's {stage} constraint
# read it, so they accept the same stages; the schema's stage1_init pattern restates STAGE_PATTERN
# (tests/test_config.py holds them equal).
STAGE = re.compile(r"(n(?P<size>[0-9]+)s(?P<sample>[0-9]+)-)?stage(?P<number>[0-9]+)")
# Without its named groups: a wildcard constraint (Snakemake would take them for wildcards), or
# part of a longer pattern.
STAGE_PATTERN = re.sub(r"\(\?P<\w+>([^()]*)\)", r"\1", STAGE.pattern)


# libyaml's safe loader where PyYAML was built with it (its wheels are): the Snakefile reads the
# schema's eleven files on every parse of the workflow, ten times faster than in pure Python.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: str | Path) -> Any:
    """A YAML file's value, read with the safe loader."""
    return yaml.load(Path(path).read_text(), Loader=_YAML_LOADER)


class ConfigError(BadInput, ValueError):
    """A config value is missing, of the wrong type, or outside what the stage accepts."""


def section_schema(section: str) -> dict[str, Any]:
    """One section's schema fragment (`schemas/<section>.schema.yaml`)."""
    return _read_yaml(SCHEMA_DIR / f"{section}.schema.yaml")


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


def object_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object branch of a block that may be null (`anyOf`/`oneOf`), else `schema` itself."""
    for branch in [*schema.get("anyOf", []), *schema.get("oneOf", [])]:
        if isinstance(branch, Mapping) and "properties" in branch:
            return branch
    return schema


def unknown_keys(value: Any, schema: Mapping[str, Any], where: str = "") -> list[str]:
    """Messages naming each key of `value`, at any depth, that a closed object of `schema`
    (`additionalProperties: false`) does not list, with the keys it does list."""
    schema = object_schema(schema)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [m for i, item in enumerate(value)
                for m in unknown_keys(item, schema["items"], f"{where}{i}.")]
    if not isinstance(value, Mapping) or "properties" not in schema:
        return []
    known = schema["properties"]
    unknown = sorted(k for k in value if k not in known)
    messages = []
    if unknown and schema.get("additionalProperties", True) is False:
        block = f" of '{where.rstrip('.')}'" if where else ""
        messages.append(f"unknown config key(s) {', '.join(repr(where + k) for k in unknown)}; "
                        f"known keys{block}: {', '.join(sorted(known))}")
    for key in sorted(set(value) & set(known)):
        messages += unknown_keys(value[key], known[key], f"{where}{key}.")
    return messages


def closed(keys: Iterable[str], **blocks: Mapping[str, Any]) -> dict[str, Any]:
    """A schema for a slice of `keys` (any values) and nested `blocks` (schemas): no other key."""
    properties: dict[str, Any] = {key: {} for key in keys}
    properties |= blocks
    return {"type": "object", "additionalProperties": False, "properties": properties}


def refuse_unknown(config: Mapping[str, Any], known: Iterable[str] | Mapping[str, Any],
                   stage: str) -> None:
    """Raise ConfigError naming every key of a stage's slice outside `known` and the known keys.

    `known`: key names (the slice's top level only), or a schema with `properties` (checked at
    every depth; `closed` builds one). Each stage checks its own slice this way, before it reads
    any input, so a misspelt key is refused where it would otherwise fall back to its default
    without a word.
    """
    schema = known if isinstance(known, Mapping) and "properties" in known else closed(known)
    messages = unknown_keys(config, schema)
    if messages:
        raise ConfigError(f"{stage}: " + "; ".join(messages))


def stage_argument(params: dict[str, Any]) -> str:
    """Serialise a stage's config slice for the command line (read back by `parse_stage_args`).
    The rules put it in single quotes, so an apostrophe in a value (a table title "BoW's ...")
    is written as JSON's \\u0027 escape, which reads back as the same string."""
    return json.dumps(params, sort_keys=True, separators=(",", ":")).replace("'", "\\u0027")


def stage_parser(description: str) -> argparse.ArgumentParser:
    """An argparse parser with the `--config JSON` and `--debug` options every stage takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--config", type=json.loads, default={}, help="this stage's config slice as JSON"
    )
    return add_debug_option(parser)
