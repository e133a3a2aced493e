"""Bad input, and how every command reports it: one line, exit status 1, no traceback.

Every stage's error class for bad input (a missing or damaged file, a config value the stage cannot
use) derives from `BadInput`, and every `python -m retrieval_pretraining.<stage>` runs its `main`
through `command`, which turns such an error into one line on stderr (the input, the position when
there is one, what is wrong, the fix) and exit status 1. `--debug` (every stage parser has it)
shows the traceback instead. Anything else is a bug and keeps its traceback.

A missing, unreadable or misplaced file (FileNotFoundError, IsADirectoryError, NotADirectoryError,
PermissionError) is bad input too: its message names the path. A file that exists but cannot be
parsed is named by the stage that reads it (`reading`); a JSON file that parses to another kind
of value than the object its reader indexes (a manifest, a config.json) is named by
`expect_object`, a manifest whose `stats` or `params` is not an object by `expect_manifest`, and
one whose member a reader indexes one level deeper (`stats.tokenizer`) by `expect_section`, a
member it reads as a list (`stats.sentence_transformers.modules`) by `expect_list`; a recorded
length or limit that is no positive integer by `expect_positive_int`, a tokenizer_config.json
special token neither a string nor an AddedToken object (or one of a flag that is no boolean:
`expect_flags`) by `expect_token`. Each says to rebuild the
file with the stage that writes it (`REBUILD`); where no stage of ours writes it (a Hub
checkpoint's config.json, a mirror's dumpstatus.json), the reader wraps the read in `fixed_by`
with the fix there is.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator


class BadInput(Exception):
    """Input the stage cannot use; the message names the input, the position, what is wrong and
    the fix."""


class InputFileError(BadInput, ValueError):
    """An input file exists but is not what the stage reads (not Parquet, cut short, ...)."""


# The fix every reader here gives for a file it cannot use: one of the stages writes it (a Hub
# checkpoint's files and a mirror's dumpstatus.json say their own, through `fixed_by`).
REBUILD = "rebuild it with the stage that writes it, or fix the path"

# Errors that name a path the user gave (or a stage before wrote): bad input, not a bug.
FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
_FILE_KINDS = {FileNotFoundError: "no such file or directory", IsADirectoryError: "is a directory",
               NotADirectoryError: "not a directory", PermissionError: "permission denied"}


@contextlib.contextmanager
def reading(path: str | Path, what: str) -> Iterator[None]:
    """Name `path` in any error raised while reading it as `what` (a library's parse error
    rarely says which file it was reading)."""
    try:
        yield
    except (BadInput, *FILE_ERRORS):
        raise
    except Exception as error:  # pyarrow, polars, json, numpy, faiss: each has its own classes
        raise InputFileError(
            f"{path}: cannot read it as {what} ({type(error).__name__}: {one_line(error)}); "
            f"{REBUILD}"
        ) from error


@contextlib.contextmanager
def fixed_by(fix: str) -> Iterator[None]:
    """For a file no stage of this workflow writes (a Hub checkpoint's config.json, a mirror's
    dumpstatus.json), read inside: an InputFileError (or other BadInput: model_folder's
    ModelFolderError for a folder without safetensors) whose fix is the readers' REBUILD says
    `fix` instead (no stage rebuilds such a file). Its class and traceback are kept."""
    try:
        yield
    except BadInput as error:
        text = str(error)
        if text.endswith(REBUILD):
            error.args = (text[: -len(REBUILD)] + fix,)
        raise


def expect_object(value: Any, path: str | Path, what: str) -> dict[str, Any]:
    """`value` (read from `path` as `what`) if it is a JSON object: a list, string, number or
    null there failed later as an AttributeError or TypeError naming neither the file nor the
    fix."""
    if isinstance(value, dict):
        return value
    raise InputFileError(
        f"{path}: not a JSON object but {json_value_kind(value)}, as {what} is; {REBUILD}"
    )


def read_json(path: str | Path, what: str = "a JSON file") -> Any:
    """The JSON value in `path`. A file cut short, not UTF-8 or not JSON is InputFileError (a
    ValueError) naming `path` as `what` ("a chunk shard's manifest") and the fix; a missing one
    is FileNotFoundError, as before: callers that read a damaged or missing file as absent catch
    (OSError, ValueError). (Here, not in artifacts.py, for readers that must not import pyarrow:
    model_folder.read_config; the stages call it as artifacts.read_json.)"""
    with reading(path, what):
        return json.loads(Path(path).read_text(encoding="utf-8"))


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """read_json of a file that holds an object (a manifest, a config.json): any other JSON
    value is InputFileError naming `path` too."""
    return expect_object(read_json(path, what), path, what)


# The members of a manifest (artifacts.write_manifest) that its readers index as objects.
MANIFEST_SECTIONS = ("params", "stats")


def expect_manifest(value: Any, path: str | Path, what: str) -> dict[str, Any]:
    """`value` (read from `path` as `what`, a manifest) if it is a JSON object whose `params` and
    `stats` are objects too: a copy in which either, absent or null, is {} (so a reader's
    `.get("stats", {})` holds), while any other value there failed later as an AttributeError
    naming neither the file nor the fix."""
    manifest = dict(expect_object(value, path, what))
    for key in MANIFEST_SECTIONS:
        manifest[key] = expect_section(manifest, key, path, what)
    return manifest


def expect_section(value: dict[str, Any], key: str, path: str | Path, what: str
                   ) -> dict[str, Any]:
    """The object at `key` in `value` (read from `path` as `what`), a dotted path into nested
    objects ("stats.tokenizer"): {} where it, or an object on the way to it, is absent or null;
    any other value on the way is InputFileError naming `path` and the key, where a reader's
    `.get` on it failed as an AttributeError naming neither the file nor the fix."""
    names = key.split(".")
    section: Any = value
    for depth, name in enumerate(names, start=1):
        section = section.get(name)
        if section is None:
            return {}
        if not isinstance(section, dict):
            raise InputFileError(
                f"{path}: {'.'.join(names[:depth])} is not a JSON object but "
                f"{json_value_kind(section)} (read as {what}); {REBUILD}"
            )
    return section


def expect_list(value: Any, key: str, path: str | Path, what: str) -> list[Any]:
    """`value`, read at `key` in `path` (as `what`), if it is a JSON array ([] where it is null):
    a reader's `x in value` on a number was a bare TypeError, and on a string (a substring) or an
    object (its keys) an answer read from no list at all."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    raise InputFileError(
        f"{path}: {key} is not a JSON array but {json_value_kind(value)} (read as {what}); "
        f"{REBUILD}"
    )


def expect_positive_int(value: Any, key: str, path: str | Path, what: str,
                        null: bool = True) -> int | None:
    """`value`, read at `key` in `path` (as `what`), if it is a positive integer, or null (None)
    where `null` allows it: a string or list there was a bare ValueError or TypeError where a
    reader took int() of it or compared it, naming neither the file nor the key."""
    if ((value is None and null)
            or (isinstance(value, int) and not isinstance(value, bool) and value > 0)):
        return value
    raise InputFileError(
        f"{path}: {key} is {json.dumps(value)}, not a positive integer (read as {what}); "
        f"{REBUILD}"
    )


def expect_token(value: Any, key: str, path: str | Path, what: str,
                 null: bool = True) -> str | None:
    """The text of a special token read at `key` ("cls_token") in `path` (as `what`, a
    tokenizer_config.json): a string, null (None), or the AddedToken object transformers writes
    and reads back ({"__type": "AddedToken", "content": "[CLS]", "lstrip": false, ...}: its
    content). Any other value (an object without that type, which transformers refuses with a
    TypeError; a number, an array) is InputFileError naming the file and the key, where a
    reader's lookup of it was a bare TypeError naming neither, as is such an object with a flag
    that is no boolean (expect_flags). Null is refused unless `null` allows it (an entry of
    extra_special_tokens)."""
    if (value is None and null) or isinstance(value, str):
        return value
    if (isinstance(value, dict) and value.get("__type") == "AddedToken"
            and isinstance(value.get("content"), str)):
        expect_flags(value, key, path, what)
        return value["content"]
    raise InputFileError(
        f"{path}: {key} is {json_shown(value)}, neither a "
        f'string nor an AddedToken object ({{"__type": "AddedToken", "content": "..."}}) (read '
        f"as {what}); {REBUILD}"
    )


# The flags of an AddedToken (the tokenizers library's), which it takes as booleans alone.
ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def expect_flags(token: dict[str, Any], key: str, path: str | Path, what: str) -> None:
    """Refuse a flag (ADDED_TOKEN_FLAGS) of the AddedToken object or fields `token`, read at
    `key` in `path` (as `what`), that is no boolean (null included): transformers builds the
    tokenizers library's AddedToken of it, whose TypeError ("'str' object is not an instance of
    'bool'") named neither the file nor the key."""
    for flag in ADDED_TOKEN_FLAGS:
        if flag in token and not isinstance(token[flag], bool):
            raise InputFileError(
                f"{path}: {key}.{flag} is {json_shown(token[flag])}, "
                f"not a boolean, as an AddedToken's flags are (read as {what}); {REBUILD}")


def json_shown(value: Any) -> str:
    """`value` as JSON for a one-line message: at most 80 characters, a longer one cut with
    "..."."""
    shown = json.dumps(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def json_value_kind(value: Any) -> str:
    """The JSON kind of a parsed value as the readers' messages name it: "an object", "an
    array", "a string", "a number", "a boolean", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    return "a string" if isinstance(value, str) else "an array"


def one_line(error: BaseException) -> str:
    """The error's message on one line (a multi-line message becomes `head: a; b`)."""
    if isinstance(error, FILE_ERRORS):
        if error.filename is not None and error.strerror:
            text = f"{error.filename}: {error.strerror}"
        else:  # raised with a message of its own (pyarrow, polars, this package)
            text = " ".join(str(error).split())
            kind = _FILE_KINDS[next(c for c in FILE_ERRORS if isinstance(error, c))]
            said = any(words in text.lower() for words in (kind, "exist", "not found"))
            text += "" if said else f" ({kind})"
        return f"{text}; check the path, or run the stage that writes it first"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    head, rest = lines[0], lines[1:]
    if not rest:
        return head
    return f"{head} {'; '.join(rest)}" if head.endswith(":") else "; ".join(lines)


class _Debug(argparse.Action):
    """`--debug`: let `command` re-raise bad input with its traceback."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("help", "on bad input, show the Python traceback instead of one line")
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        _state["debug"] = True


_state = {"debug": False}


def add_debug_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--debug", action=_Debug)
    return parser


def command(main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a stage's `main(argv=None)`: bad input -> one line on stderr, exit status 1."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> Any:
        _state["debug"] = False
        try:
            return main(argv)
        except (BadInput, *FILE_ERRORS) as error:
            if _state["debug"]:
                raise
            sys.stdout.flush()
            print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    return run
