"""A model folder's tokenizer files, checked before transformers reads them and after it builds.

transformers reads a folder's JSON files (config.json for the tokenizer's class, tokenizer.json,
tokenizer_config.json, special_tokens_map.json) as the objects and AddedToken fields it expects:
one cut short, or a value of another shape, was a TypeError, AttributeError or KeyError traceback
inside it naming neither file nor key; and a folder with no tokenizer file, or one holding no word,
loaded silently as a tokenizer of its special tokens alone, which reads every word as [UNK].
`auto_tokenizer`, every loader's one way to a tokenizer (staging both ways, encoding, the
trainers, the analyses), checks those files first and what transformers built after
(`check_tokenizer_files`), and turns an error reading a tokenizer file into one InputFileError
naming the file or the folder and the fix. Imports no transformers until it loads.

A folder's weights and config.json, and whether its tokenizer's ids fit its embedding table
(`check_folder_vocabulary`), are model_folder.py's. This module reads config.json through
model_folder.read_config; model_folder imports nothing from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import (REBUILD, InputFileError, expect_flags, expect_section, expect_token,
                     json_shown, json_value_kind, read_json_object, reading)
from .model_folder import read_config

# What transformers raises for a tokenizer file it cannot read: OSError (a file it cannot open),
# ValueError (JSONDecodeError, UnicodeDecodeError; no file it can build a tokenizer from), KeyError
# (a tokenizer.json lacking a member). The tokenizers library raises a bare Exception for a file
# it cannot parse (a vocab.txt that is not UTF-8): `type(error) is Exception`, never a subclass.
TOKENIZER_FILE_ERRORS = (OSError, ValueError, KeyError)
# The files that the tokenizers library parses, in the order transformers prefers them: the fast
# tokenizer's tokenizer.json (a WordPiece vocabulary is then taken from it, never from vocab.txt),
# else the vocab.txt a BERT tokenizer builds its WordPiece model from.
PARSED_FILES = ("tokenizer.json", "vocab.txt")
# The tokenizer files read before transformers does, as the objects it indexes (tokenizer.json's
# `model` too): a list there was a TypeError or AttributeError inside transformers.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json")
# The special tokens of tokenizer_config.json that transformers takes as a string or an AddedToken
# (its SPECIAL_TOKENS_ATTRIBUTES), raising a TypeError for any other value.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
# Its lists of further special tokens: null, an array, or (transformers 5) an object of named
# tokens, each entry a string or an AddedToken object; any other was a TypeError in transformers.
# additional_special_tokens, the older name, is read in place of an extra_special_tokens that is
# no array with entries.
EXTRA_TOKENS = ("extra_special_tokens", "additional_special_tokens")


def expect_extra_tokens(config: dict[str, Any], path: Path, what: str) -> None:
    """Refuse an EXTRA_TOKENS list of `config` (tokenizer_config.json) transformers cannot read,
    naming the file and the entry (errors.expect_token)."""
    extra = config.get("extra_special_tokens")
    for key in EXTRA_TOKENS:
        if key == "additional_special_tokens" and isinstance(extra, list) and extra:
            continue  # transformers ignores it
        expect_token_list(config.get(key), key, path, what)


def expect_added_tokens(config: dict[str, Any], path: Path, what: str) -> None:
    """Refuse an added_tokens_decoder of `config` (tokenizer_config.json) transformers cannot
    read, naming the file and the key: it takes it, where present, as an object of added tokens
    by id (`int(id)`), each the fields of an AddedToken (`AddedToken(**entry)`). Any other value
    (null included) was an AttributeError traceback inside transformers, an entry that is no
    object, or whose content is neither a string nor null or whose flags are no booleans
    (expect_flags), a TypeError, an id that is no integer a ValueError naming the folder."""
    if "added_tokens_decoder" not in config:
        return
    decoder = config["added_tokens_decoder"]
    if not isinstance(decoder, dict):
        raise InputFileError(
            f"{path}: added_tokens_decoder is not a JSON object but {json_value_kind(decoder)} "
            f"(read as {what}); {REBUILD}")
    for key, token in decoder.items():
        try:
            int(key)
        except ValueError:
            raise InputFileError(
                f"{path}: added_tokens_decoder has the key {json.dumps(key)}, not a token id "
                f"(read as {what}); {REBUILD}") from None
        expect_token_object(token, f"added_tokens_decoder.{key}", path, what)


def expect_token_object(token: Any, key: str, path: Path, what: str,
                        special: bool = True) -> None:
    """Refuse an object (read at `key` in `path`) that transformers builds the tokenizers
    library's AddedToken of as its fields (`AddedToken(**token)`, unknown fields ignored) where
    that is a TypeError traceback: no object at all, a content neither a string nor null, or a
    flag that is no boolean (expect_flags; its "special" left unchecked unless `special`:
    special_tokens_map.json drops it)."""
    if not isinstance(token, dict):
        raise InputFileError(
            f"{path}: {key} is not a JSON object but {json_value_kind(token)}, as an "
            f"AddedToken's fields are (read as {what}); {REBUILD}")
    content = token.get("content")
    if content is not None and not isinstance(content, str):
        raise InputFileError(
            f"{path}: {key}.content is {json_value_kind(content)}, not a string (read as "
            f"{what}); {REBUILD}")
    expect_flags(token if special else {k: v for k, v in token.items() if k != "special"}, key,
                 path, what)


def expect_token_list(value: Any, key: str, path: Path, what: str, named: bool = True,
                      fields: bool = False) -> None:
    """Refuse an EXTRA_TOKENS list (`value`, at `key` in `path`) transformers cannot read: null,
    an array of special tokens (errors.expect_token; with `fields`, an object entry is the
    fields of an AddedToken: expect_token_fields) or, where `named`, an object of named ones."""
    if isinstance(value, dict) and named:
        for name, token in value.items():
            expect_token(token, f"{key}.{name}", path, what, null=False)
    elif isinstance(value, list):
        for i, token in enumerate(value):
            if fields and isinstance(token, dict):
                expect_token_fields(token, f"{key}[{i}]", path, what)
            else:
                expect_token(token, f"{key}[{i}]", path, what, null=False)
    elif value is not None:
        raise InputFileError(
            f"{path}: {key} is {json_value_kind(value)}, neither an array of special tokens"
            f"{' nor an object of named ones' if named else ''} (read as {what}); {REBUILD}")


def expect_token_fields(token: dict[str, Any], key: str, path: Path, what: str) -> None:
    """Refuse an object entry of special_tokens_map.json's extra_special_tokens array that
    transformers cannot read as the fields of an AddedToken (`AddedToken(**token, special=True)`:
    a "__type" is ignored, a "special" is a TypeError, as is a flag that is no boolean:
    expect_flags) or whose content is no string."""
    if isinstance(token.get("content"), str) and "special" not in token:
        expect_flags(token, key, path, what)
        return
    raise InputFileError(
        f"{path}: {key} is {json_shown(token)}, neither a string "
        f'nor the fields of an AddedToken ({{"content": "...", "lstrip": false, ...}}, without '
        f'"special") (read as {what}); {REBUILD}')


def expect_named_tokens(tokens: dict[str, Any], path: Path, what: str) -> None:
    """Refuse a token of special_tokens_map.json (`tokens`, read from `path`) outside its
    EXTRA_TOKENS lists that transformers cannot read: it builds `AddedToken(**entry,
    special=True)` of an object there, its "special" dropped (a content neither a string nor
    null, a flag that is no boolean: expect_flags), and takes a named special token
    (SPECIAL_TOKENS) as a string, null or such an object; anything else was a TypeError
    traceback inside transformers. Its other keys it passes on as they are."""
    for key, value in tokens.items():
        if key in EXTRA_TOKENS:
            continue
        if isinstance(value, dict):
            expect_token_object(value, key, path, what, special=False)
        elif key in SPECIAL_TOKENS and value is not None and not isinstance(value, str):
            raise InputFileError(
                f"{path}: {key} is {json_shown(value)}, neither "
                f'a string nor the fields of an AddedToken ({{"content": "...", "lstrip": false, '
                f"...}}) (read as {what}); {REBUILD}")


def expect_tokenizer_added_tokens(tokenizer: dict[str, Any], path: Path) -> None:
    """Refuse tokenizer.json's added_tokens (`tokenizer`, read from `path`) where transformers
    cannot read them: where tokenizer_config.json has no added_tokens_decoder, it builds an
    AddedToken of each entry's fields (its "id" taken out) before the tokenizers library reads
    the file. An entry's content neither a string nor null or a flag that is no boolean
    (expect_token_object), null there or an entry that is no object, was a TypeError or
    AttributeError traceback inside transformers. (A tokenizer.json without added_tokens, or an
    entry without its id, is a KeyError, one line naming the folder.)"""
    what = "a tokenizer.json"
    tokens = tokenizer.get("added_tokens", [])
    if not isinstance(tokens, list):
        raise InputFileError(
            f"{path}: added_tokens is not a JSON array but {json_value_kind(tokens)} (read as "
            f"{what}); {REBUILD}")
    for i, token in enumerate(tokens):
        expect_token_object(token, f"added_tokens[{i}]", path, what)


def check_special_tokens_map(folder: str | Path, tokenizer_config: dict[str, Any]) -> None:
    """Refuse a special_tokens_map.json (an older transformers' file: transformers 5 writes none)
    whose EXTRA_TOKENS lists transformers cannot read, naming the file and the entry, as for
    tokenizer_config.json's (expect_extra_tokens), or whose named special tokens it cannot read
    (expect_named_tokens): a TypeError inside transformers, and a file cut short or of another
    JSON value a JSONDecodeError naming the folder or an AttributeError.
    transformers reads it only where tokenizer_config.json has no added_tokens_decoder, and not as
    it reads tokenizer_config.json: an object entry of its extra_special_tokens array is the
    fields of an AddedToken (expect_token_fields); its additional_special_tokens, an array alone,
    is read only where neither file leaves an extra_special_tokens that is not an object."""
    path = Path(folder) / "special_tokens_map.json"
    if "added_tokens_decoder" in tokenizer_config or not path.is_file():
        return
    what = "a special_tokens_map.json"
    tokens = read_json_object(path, what)
    expect_named_tokens(tokens, path, what)
    extra = tokens.get("extra_special_tokens")
    expect_token_list(extra, "extra_special_tokens", path, what, fields=True)
    # The extra_special_tokens each file leaves (tokenizer_config.json's additional_special_tokens
    # stands in for one with no entries); an object of named tokens is taken out of the list.
    config_key = ("additional_special_tokens" if "additional_special_tokens" in tokenizer_config
                  and not tokenizer_config.get("extra_special_tokens") else "extra_special_tokens")
    left = ((tokenizer_config, config_key), (tokens, "extra_special_tokens"))
    if not any(key in read and not isinstance(read[key], dict) for read, key in left):
        expect_token_list(tokens.get("additional_special_tokens"), "additional_special_tokens",
                          path, what, named=False)


def auto_tokenizer(folder: str | Path, **kwargs: Any):
    """transformers' AutoTokenizer of a local folder (never downloads). transformers reads the
    folder's config.json for the tokenizer's class: one cut short failed there as an OSError
    naming no fix, a list as a TypeError; both, a tokenizer.json or tokenizer_config.json of
    another shape (a special token neither a string nor an AddedToken object, named or in its
    EXTRA_TOKENS lists: errors.expect_token; an added_tokens_decoder that is no object of
    AddedToken fields by id: expect_added_tokens; tokenizer.json's added_tokens that are no
    array of them: expect_tokenizer_added_tokens), a special_tokens_map.json whose tokens it
    cannot read (check_special_tokens_map), and a tokenizer file it cannot read are
    InputFileError naming the file (one the tokenizers library cannot parse: PARSED_FILES) or
    the folder, as is a folder with none of the tokenizer's files, or whose file holds no word
    (check_tokenizer_files). Any other error from transformers (a RuntimeError, a TypeError) is
    a bug, and keeps its traceback."""
    from transformers import AutoTokenizer

    if (Path(folder) / "config.json").is_file():
        read_config(folder)
    tokenizer_json: dict[str, Any] = {}
    tokenizer_config: dict[str, Any] = {}
    for name in TOKENIZER_JSON:
        path = Path(folder) / name
        if path.is_file():
            read = read_json_object(path, f"a {name}")
            if name == "tokenizer.json":
                expect_section(read, "model", path, "a tokenizer.json")
                tokenizer_json = read
            else:
                for key in SPECIAL_TOKENS:
                    expect_token(read.get(key), key, path, f"a {name}")
                expect_extra_tokens(read, path, f"a {name}")
                expect_added_tokens(read, path, f"a {name}")
                tokenizer_config = read
    if "added_tokens_decoder" not in tokenizer_config:
        expect_tokenizer_added_tokens(tokenizer_json, Path(folder) / "tokenizer.json")
    check_special_tokens_map(folder, tokenizer_config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
    except Exception as error:
        if not isinstance(error, TOKENIZER_FILE_ERRORS) and type(error) is not Exception:
            raise
        path, what = Path(folder), "a model folder's tokenizer"
        parsed = [path / name for name in PARSED_FILES if (path / name).is_file()]
        if type(error) is Exception and parsed:  # the tokenizers library's: the file it parsed
            path, what = parsed[0], f"a {parsed[0].name}"
        with reading(path, what):  # names it (a FILE_ERRORS as it is)
            raise
    check_tokenizer_files(folder, tokenizer)
    return tokenizer


def check_tokenizer_files(folder: str | Path, tokenizer: Any) -> None:
    """Refuse a tokenizer transformers built from none of its class's files (`vocab_files_names`:
    tokenizer.json, or a vocabulary such as BERT's vocab.txt): a BERT folder with no tokenizer
    file loaded silently as a BertTokenizer of its 5 special tokens, which reads every word as
    [UNK], and no vocabulary check catches it (5 ids fit any embedding table). A fast tokenizer
    is built from tokenizer.json whatever its class names: transformers 5's GPT2Tokenizer (and
    Funnel's, Luke's, ...) lists only its slow files (vocab.json, merges.txt), and saves only
    tokenizer.json. A tokenizer built from one of them that holds no word is refused naming it
    (expect_words)."""
    files = getattr(type(tokenizer), "vocab_files_names", None)
    if not isinstance(files, dict) or not files:
        return
    fast = {"tokenizer.json"} if getattr(tokenizer, "is_fast", False) else set()
    names = sorted(set(files.values()) | fast, key=lambda name: (name != "tokenizer.json", name))
    present = [Path(folder) / name for name in names if (Path(folder) / name).is_file()]
    if present:
        expect_words(present[0], tokenizer)
        return
    rest = " and ".join(name for name in names if name != "tokenizer.json")
    expected = " or ".join(part for part in ("tokenizer.json" if "tokenizer.json" in names
                                             else "", rest) if part)
    raise InputFileError(
        f"{folder}: no tokenizer file ({expected}): transformers built a "
        f"{type(tokenizer).__name__} of {len(tokenizer)} tokens from the special tokens alone, "
        f"which reads every word as unknown; {REBUILD}")


def expect_words(path: Path, tokenizer: Any) -> None:
    """Refuse a tokenizer built from `path` (its tokenizer.json, else its vocabulary file) whose
    vocabulary holds no token but its special ones (and blank ones: an empty line of vocab.txt):
    an empty vocab.txt, or one of [UNK] alone, loaded silently as a BertTokenizer of its 5
    special tokens, as check_tokenizer_files's folder without one did, which reads every word as
    [UNK] or fails at the first (WordPiece's bare "Missing [UNK] token" Exception)."""
    special = tokenizer.all_special_tokens
    if any(token.strip() and token not in special for token in tokenizer.get_vocab()):
        return
    shown = ", ".join(special[:5]) + (", ..." if len(special) > 5 else "")
    raise InputFileError(
        f"{path}: no token but the special ones ({shown}): transformers built a "
        f"{type(tokenizer).__name__} of {len(tokenizer)} tokens from it, which reads no word; "
        f"{REBUILD}")
