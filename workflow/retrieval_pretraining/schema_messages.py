"""One line for a key no shape of a value knows (config_checks.validate, at parse time only: no
stage imports this, so rewording a message reruns nothing)."""

from __future__ import annotations

from typing import Any

import jsonschema


def entry_names(config: Any, path: list[Any]) -> str:
    """` (dataset 'nq', split 'dev')`: the named list entries on `path`, by their `name`."""
    names, value, key = [], config, None
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            break
        if isinstance(part, int) and isinstance(value, dict) and isinstance(value.get("name"), str):
            names.append(f"{str(key).removesuffix('s')} {value['name']!r}")
        key = part
    return f" ({', '.join(names)})" if names else ""


def unknown_keys(config: Any, errors: list[jsonschema.ValidationError]) -> dict[tuple, str]:
    """{path: one message} for each object holding a key that no shape allowed there knows.

    A value that may take one of several shapes (`corpus`: a file, `path` or `download`, or
    another entry's, `same_as`) fails each branch its own way: a misspelt key came out as five
    lines (each branch's unexpected key and its missing required ones), none naming every key
    allowed. One line instead: the dataset, the key, every key of every shape."""
    by_path: dict[tuple, list[jsonschema.ValidationError]] = {}
    for error in errors:
        by_path.setdefault(tuple(error.absolute_path), []).append(error)
    found = {}
    for path, group in by_path.items():
        closed = any(e.validator == "additionalProperties" for e in group)
        if len(group) < 2 or not closed or not isinstance(group[0].instance, dict):
            # One complaint: jsonschema's own line already names the key and the known ones.
            continue
        known = sorted(shape_keys(group, path))
        unknown = [k for k in group[0].instance if k not in known]
        if unknown:
            key = ".".join(map(str, path))
            found[path] = (
                f"config key '{key}'{entry_names(config, list(path))}: unknown key"
                f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"known keys: {', '.join(known)}")
    return found


def shape_keys(group: list[jsonschema.ValidationError], path: tuple) -> set[str]:
    """The keys every shape allowed at `path` knows: the properties of each error's schema and of
    the schemas above it there, and of every branch of a oneOf / anyOf there. Not only those of
    the shapes that complained of an extra key: a file reference without its file (`member`
    alone) fails the file shape on `required`, and its keys are known all the same."""
    known: set[str] = set()
    for error in group:
        node = error
        while node is not None and tuple(node.absolute_path) == path:
            schemas = [node.schema]
            if node.validator in ("oneOf", "anyOf") and isinstance(node.validator_value, list):
                schemas += node.validator_value
            for schema in schemas:
                if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
                    known |= set(schema["properties"])
            node = node.parent
    return known
