"""The documents name code that exists. ARCHITECTURE.md promises that a newcomer finds any
stage's code in one hop; a name left behind by a rename, a move or a deletion breaks that.

Read without importing the package: `ast` on the .py files, `^rule NAME:` in the Snakefile and
rules/*.smk, the Makefile's targets by a regex. In README.md, ARCHITECTURE.md,
benchmarks/RESULTS.md, benchmarks/gpu_runs/*/README.md and data/**/README.md:

1. a path that starts with a top-level folder (`rules/dense.smk`, `profiles/local`) exists, and so
   does a code file named by its end (`chunk.py`, `pretrain/train.py`); `{a,b}` stands for each
   of its names, `{x}`, `<x>`, `*` and `...` for any; what a run writes is not checked (SKIPPED);
2. a test id `tests/x.py::test_y` (and `::test_z` after it on its line) names a test function
   of that file, and a test named without its file (`test_y`) is one of some test file;
3. a backticked `module.name` whose first part is a package module's name (`faiss_index.search`,
   `pretrain/settings.check_entries`, `masking.Vocab.excluded`), and `retrieval_pretraining.x`
   anywhere, names a module of the package and a function, class, constant or method in it;
   a config key (`evaluate.zero_shot`, by the schemas) is none;
4. the rules of ARCHITECTURE.md's stage table (its second column) and "rule `x`" / "`x` rule"
   are rules, and so is a rule-shaped target of a documented `snakemake ...` command
   (`snakemake --cores 1 download_dump`) and a name after its `--until`, `-R`, `--forcerun` or
   `--omit-from`;
5. `make X` is a Makefile target;
6. a flag (`--x`, `-x`) of a documented command of ours (`python -m retrieval_pretraining.x`,
   `python benchmarks/y.py`, `python -m benchmarks.y`; inline or in a code block, continued with
   `\\` over lines) is declared by an `add_argument` of the module, or of a function of the
   package it calls to build its parser (`config.stage_parser`); of a parser with subcommands
   (`download fetch`, `trainer_throughput.py run`), the first word that is not a flag names one,
   and the flags are that subcommand's parser's or the parent's (`rejected`, which
   tests/test_rule_flags.py reads the rules' commands with too); another program's flags
   (snakemake, torchrun, pip) are not checked.
Where a few mentions are not ours, the extraction says why (`peers_cited`, "(now `new`)",
`PASSED_ON`).
"""

from __future__ import annotations

import ast
import bisect
import fnmatch
import itertools
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "workflow" / "retrieval_pretraining"
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "RESULTS.md",
        *sorted((ROOT / "benchmarks" / "gpu_runs").glob("*/README.md")),
        *sorted((ROOT / "data").glob("**/README.md"))]

# What a run writes (gitignored): named in the documents, never in a fresh checkout.
SKIPPED = ("results/", "data/downloads/")
# Never searched for a named file: git's, environments, caches, outputs.
NOT_SEARCHED = {".git", ".venv", ".snakemake", ".pytest_cache", ".ruff_cache", "results",
                "__pycache__"}
CODE_SUFFIXES = ("py", "smk", "sh")


@cache
def repo_files() -> tuple[frozenset[str], frozenset[str]]:
    """Every file and folder of the checkout (relative, posix), outside NOT_SEARCHED."""
    files, folders = set(), set()

    def walk(folder: Path) -> None:
        for entry in folder.iterdir():
            rel = entry.relative_to(ROOT).as_posix()
            if entry.name in NOT_SEARCHED or entry.name.startswith(".gpu-carry") or any(
                    (rel + "/").startswith(skipped) for skipped in SKIPPED):
                continue
            if entry.is_dir():
                folders.add(rel)
                walk(entry)
            else:
                files.add(rel)

    walk(ROOT)
    return frozenset(files), frozenset(folders)


class Line(NamedTuple):
    doc: str  # relative to ROOT
    number: int
    text: str
    code: bool  # in a fenced or an indented code block
    section: str  # the "## " heading above it

    @property
    def at(self) -> str:
        return f"{self.doc}:{self.number}"


@cache
def doc_lines() -> tuple[Line, ...]:
    out = []
    for path in DOCS:
        doc = path.relative_to(ROOT).as_posix()
        fenced, indented, previous, section = False, False, "", ""
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if text.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                if text.startswith("## "):
                    section = text[3:].strip()
                # an indented block starts after a blank line (a list's own lines follow it)
                indented = text.startswith("    ") and (indented or not previous.strip())
                out.append(Line(doc, number, text, indented, section))
            else:
                out.append(Line(doc, number, text, True, section))
            previous = text
    return tuple(out)


@cache
def code_spans() -> tuple[tuple[Line, str, str], ...]:
    """(line, span, the text after it on its line) for every `span` of the prose; a span may go on
    to the next line of its paragraph (it is given with the line it starts on)."""
    out = []
    paragraph: list[Line] = []
    for line in [*doc_lines(), None]:
        if paragraph and (line is None or line.code or not line.text.strip()
                          or line.doc != paragraph[-1].doc):
            text = "\n".join(item.text for item in paragraph)
            starts = list(itertools.accumulate(len(item.text) + 1 for item in paragraph))
            for match in re.finditer(r"`([^`]+)`", text):
                index = bisect.bisect_right(starts, match.start())
                after = text[match.end():].split("\n")[0]
                out.append((paragraph[index], " ".join(match.group(1).split()), after))
            paragraph = []
        if line is not None and not line.code and line.text.strip():
            paragraph.append(line)
    return tuple(out)


# -- 1. paths ------------------------------------------------------------------------------------

@cache
def top_level() -> frozenset[str]:
    _, folders = repo_files()
    return frozenset({folder.split("/")[0] for folder in folders} | {"results"})


def path_mentions() -> list[tuple[Line, str]]:
    """(line, path) for every path that starts with a top-level folder, and every code file named
    alone (`chunk.py`) or under a folder of the repository (`pretrain/train.py`); the latter not
    in ARCHITECTURE.md's "Decisions the papers left open", which cites the papers' code by its own
    names (`create_pretraining_data.py`)."""
    roots = "|".join(re.escape(name) for name in sorted(top_level()))
    rooted = re.compile(rf"(?<![\w./$~-])((?:{roots})/"  # `{a,b}` whole, else not a brace
                        rf"(?:\{{[^}}\s]*\}}|[^\s`'\"()\[\]{{}};:|,!?])*)")
    alone = re.compile(rf"(?<![\w./$~-])((?:[\w-]+/)*[\w-]+\.(?:{'|'.join(CODE_SUFFIXES)}))"
                       r"(?![\w/-])")
    ours = {Path(folder).name for folder in repo_files()[1]}
    found = []
    for line in doc_lines():
        text = re.sub(r"https?://\S+", " ", line.text)
        for match in rooted.finditer(text):
            found.append((line, match.group(1).rstrip(".")))  # (a sentence's full stop)
        if peers_cited(line):
            continue
        for match in alone.finditer(rooted.sub(" ", text)):
            path = match.group(1)
            if "/" not in path or path.split("/")[0] in ours:  # not `torch/distributed/run.py`
                found.append((line, path))
    return found


def peers_cited(line: Line) -> bool:
    return line.doc == "ARCHITECTURE.md" and line.section == "Decisions the papers left open"


def exists(path: str) -> bool:
    """Whether `path` (from the root, or the end of one) is a file or folder of the checkout;
    `{a,b}` for each of a and b, `{x}`, `<x>`, `*` and `...` for any name."""
    files, folders = repo_files()
    path = path.rstrip("/")
    choice = re.search(r"\{([^{}]*,[^{}]*)\}", path)  # `envs/{torch,faiss}.yaml`: each one
    if choice:
        return all(exists(path[:choice.start()] + one + path[choice.end():])
                   for one in choice.group(1).split(","))
    pattern = re.sub(r"\{[^}]*\}|<[^>]*>|\.\.\.|…", "*", path)
    if path.split("/")[0] not in top_level():
        pattern = "*/" + pattern
    elif "*" not in pattern:
        return path in files or path in folders
    return any(fnmatch.fnmatchcase(name, pattern) for name in files | folders)


def test_every_path_a_document_names_exists():
    mentions = path_mentions()
    assert len(mentions) > 200  # the extraction still finds them
    missing = [f"{line.at}: {path}" for line, path in mentions
               if not path.startswith(SKIPPED) and not exists(path)]
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


# -- 2. test ids ---------------------------------------------------------------------------------

@cache
def functions_by_test_file() -> dict[str, frozenset[str]]:
    """tests/x.py -> the names of its test functions (and methods)."""
    out = {}
    for path in (ROOT / "tests").rglob("*.py"):
        tree = ast.parse(path.read_text())
        out[path.relative_to(ROOT).as_posix()] = frozenset(
            node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test"))
    return out


def named_test_ids() -> list[tuple[Line, str, str]]:
    """(line, file, test) for `tests/x.py::test_y`, and `::test_z` after it on the same line."""
    found = []
    for line in doc_lines():
        current = None
        for match in re.finditer(r"(tests/[\w/]+\.py)?::(\w+)", line.text):
            current = match.group(1) or current
            if current is not None:
                found.append((line, current, match.group(2)))
    return found


def test_every_test_id_names_a_test_function():
    tests = functions_by_test_file()
    ids = named_test_ids()
    assert len(ids) > 20  # the extraction still finds them
    missing = [f"{line.at}: {file}::{name}" for line, file, name in ids
               if name not in tests.get(file, ())]
    assert not missing, "no such test:\n" + "\n".join(missing)


def test_every_test_named_without_its_file_exists():
    known = set().union(*functions_by_test_file().values())
    known |= {Path(file).stem for file in functions_by_test_file()}
    missing = [f"{line.at}: {match.group(1)}" for line in doc_lines()
               for match in re.finditer(r"(?<![\w/:.])(test_\w+)(?![\w./-])", line.text)
               if match.group(1) not in known]
    assert not missing, "no such test:\n" + "\n".join(missing)


# -- 3. module.name ------------------------------------------------------------------------------

@cache
def package_modules() -> dict[str, Path]:
    """Dotted name within the package ("pretrain.data", "chunk", "pretrain") -> its file."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = path
    return out


@cache
def defined(path: Path) -> dict[str, frozenset[str]]:
    """A module's names (functions, classes, constants, also in top-level if/try blocks, and what
    it imports: `artifacts.read_json`) -> what each class defines (methods, attributes, fields)."""
    names: dict[str, frozenset[str]] = {}

    def assigned(node) -> list[str]:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]

    def visit(body) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names[node.name] = frozenset()
            elif isinstance(node, ast.ClassDef):
                names[node.name] = frozenset(itertools.chain.from_iterable(
                    [item.name] if hasattr(item, "name") else assigned(item) for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                                  | ast.Assign | ast.AnnAssign)))
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                names.update(dict.fromkeys(assigned(node), frozenset()))
            elif isinstance(node, ast.ImportFrom):
                names.update({a.asname or a.name: frozenset() for a in node.names
                              if (a.asname or a.name) not in names})
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return names


@cache
def config_keys() -> tuple[frozenset[str], frozenset[str]]:
    """(section names and properties, properties) of the config schemas, at any depth."""
    sections, properties = set(), set()

    def collect(node) -> None:
        if isinstance(node, dict):
            properties.update(node.get("properties", {}) if isinstance(node.get("properties"),
                                                                        dict) else {})
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for schema in (PACKAGE / "schemas").glob("*.schema.yaml"):
        sections.add(schema.name.split(".")[0])
        collect(yaml.safe_load(schema.read_text()))
    return frozenset(sections | properties), frozenset(properties)


def config_key(name: str) -> bool:
    """`evaluate.zero_shot`, `bm25.overrides`: a config key, though its first part is a module."""
    sections, properties = config_keys()
    first, *rest = name.split(".")
    return "/" not in name and first in sections and all(part in properties for part in rest)


# `model.safetensors`, `training.json`: files, though their first part is a module's name.
FILE_SUFFIXES = {"py", "smk", "sh", "yaml", "json", "jsonl", "md", "txt", "tsv", "csv", "parquet",
                 "safetensors", "png", "bin", "trec", "cpp", "html", "npy"}


def qualified_names() -> list[tuple[Line, str]]:
    """(line, name) for every backticked `module.name` whose first part is a package module's name
    (`faiss_index.search`, `pretrain/settings.check_entries`, `masking.Vocab.excluded`), the name
    after a backticked module file (`finetune/model.py` `cached_contrast_set`), and every
    `retrieval_pretraining.module` (also in code blocks). Not `old` (now `new`): history."""
    short = {name.split(".")[-1] for name in package_modules()} | {"retrieval_pretraining"}
    dotted = re.compile(r"(?<![\w./-])((?:\w+/)*\w+(?:\.\w+)+)(?![\w/-])")
    found = []
    for line, span, after in code_spans():
        if after.startswith(" (now `"):
            continue
        for match in dotted.finditer(span):
            name = match.group(1)
            if re.split(r"[./]", name)[0] in short and name.split(".")[-1] not in FILE_SUFFIXES:
                found.append((line, name))
    for line in doc_lines():
        if line.code:
            found += [(line, name) for name in re.findall(r"\bretrieval_pretraining(?:\.\w+)+",
                                                           line.text)]
        else:
            for match in re.finditer(r"`((?:\w+/)*\w+)\.py`\s+`(\w+)`", line.text):
                if match.group(1).split("/")[0] in short:
                    found.append((line, f"{match.group(1)}.{match.group(2)}"))
    return found


def resolves(name: str) -> bool | None:
    """Whether `name` names a package module, or a name (or a class's member) in one; None where
    no package module has its module part. The module may be named by its last parts (`masking`,
    `pretrain/data`, `contracts/datasets/checks`) or in full after the package's name
    (`retrieval_pretraining.pretrain.train`). A method may be named after its class or after its
    module alone (`data.probe_batches`: a class of that module defines it)."""
    full = name.startswith("retrieval_pretraining.")
    parts = re.split(r"[./]", name.removeprefix("retrieval_pretraining."))
    folders = len(name.split(".")[0].split("/"))  # `pretrain/data.x`: the module is pretrain/data
    module_found = False
    for split in range(len(parts), folders - 1, -1):
        module, rest = parts[:split], parts[split:]
        for dotted, path in package_modules().items():
            components = dotted.split(".")
            if components != module if full else components[-len(module):] != module:
                continue
            module_found = True
            names = defined(path)
            if (not rest or (len(rest) == 1 and rest[0] in set(names).union(*names.values()))
                    or (len(rest) == 2 and rest[1] in names.get(rest[0], ()))):
                return True
    return False if module_found else None


def test_every_module_qualified_name_exists():
    names = qualified_names()
    assert len(names) > 100  # the extraction still finds them
    missing = []
    for line, name in names:
        found = config_key(name) or resolves(name)
        if found is None and peers_cited(line):
            continue  # a peer's module: bowdpr's `finetune/data_utils.TrainDataset`
        if not found:
            missing.append(f"{line.at}: {name}")
    assert not missing, "no such module, or no such name in it:\n" + "\n".join(missing)


# -- 4. rules ------------------------------------------------------------------------------------

@cache
def rules() -> frozenset[str]:
    text = "\n".join(path.read_text() for path in [ROOT / "Snakefile",
                                                    *sorted((ROOT / "rules").glob("*.smk"))])
    return frozenset(re.findall(r"^(?:rule|checkpoint) (\w+):", text, re.M))


def rule_column() -> list[tuple[Line, str]]:
    """(line, name) for the rules in the second column of ARCHITECTURE.md's first table (stage ->
    rule -> module -> artifact): in a cell that starts with a backticked name, the backticked
    names outside parentheses before the cell's first `;`. The rest of the cell explains (files,
    config keys, constants, `f()` input functions), as do cells that start otherwise ("every
    stage's `main`", "`rules/common.smk` (...)", "(command)")."""
    found = []
    table = [line for line in doc_lines() if line.doc == "ARCHITECTURE.md"
             and line.section.startswith("Stage") and line.text.startswith("|")]
    for line in table:
        cell = re.split(r"(?<!\\)\|", line.text)[2].strip()
        if not re.match(r"`\w+`", cell):
            continue
        depth, names = 0, []
        for part in re.split(r"(`[^`]*`)", cell):
            if part.startswith("`"):
                names += [part[1:-1]] if depth == 0 else []
                continue
            for char in part:
                if depth == 0 and char == ";":
                    break
                depth += {"(": 1, ")": -1}.get(char, 0)
            else:
                continue
            break
        found += [(line, name) for name in names if re.fullmatch(r"\w+", name)]
    return found


def rule_mentions() -> list[tuple[Line, str]]:
    """(line, name) for "rule `x`" and "`x` rule" in the prose."""
    return [(line, match.group(1) or match.group(2)) for line in doc_lines() if not line.code
            for match in re.finditer(r"\brule `(\w+)`|`(\w+)` rule\b", line.text)]


def test_every_rule_the_documents_name_exists():
    named = rule_column()
    assert len(named) > 40  # the extraction still finds the table's rules
    missing = [f"{line.at}: {name}" for line, name in named + rule_mentions()
               if name not in rules()]
    assert not missing, "no such rule in the Snakefile or rules/*.smk:\n" + "\n".join(missing)


# snakemake's options that take values: a rule-shaped word after one is its value (`--profile
# slurm`), not a target. A flag in neither list is taken to take one value (so a new flag's value
# is never mistaken for a target); one in RULE_LISTS names rules up to the next flag.
ONE_VALUE = {"--cores", "-c", "--jobs", "-j", "--local-cores", "--profile", "--workflow-profile",
             "--report", "--directory", "-d", "--snakefile", "-s", "--latency-wait",
             "--executor", "-e"}
MANY_VALUES = {"--configfile", "--configfiles", "--config", "-C", "--software-deployment-method",
               "--sdm", "--rerun-triggers", "--resources", "--set-threads", "--set-resources",
               "--default-resources", "--cleanup-metadata", "--cm"}
NO_VALUE = {"-n", "--dry-run", "--dryrun", "-p", "--printshellcmds", "--touch", "-t", "--lint",
            "--rerun-incomplete", "--ri", "--keep-going", "-k", "--use-conda", "--forceall", "-F",
            "--conda-create-envs-only", "--list", "--summary", "--dag", "--quiet", "-q"}
RULE_LISTS = {"--until", "-U", "--forcerun", "-R", "--omit-from", "-O"}


def snakemake_targets() -> list[tuple[Line, str]]:
    """(line, word) for each rule-shaped word (no `/`, no `.`, no placeholder) that a documented
    `snakemake ...` command gives as a target (after the options, or after a lone `--`) or after
    `--until`, `-R`, `--forcerun` or `--omit-from`. A command ends as in documented_commands;
    quoted text is a value."""
    found = []
    for line, text in command_texts():
        text = re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)
        for match in re.finditer(r"(?<![\w/.-])snakemake(?![\w.-])", text):
            rest = re.split(r"&&|\|\||;|\||\s#", text[match.end():])[0]
            skip, rule_list, targets_only = 0, False, False
            for word in rest.split():
                if word == "--":
                    skip, rule_list, targets_only = 0, False, True
                elif word.startswith("-") and not targets_only:
                    flag = word.split("=")[0]
                    rule_list = flag in RULE_LISTS and "=" not in word
                    skip = (0 if "=" in word or flag in NO_VALUE or rule_list
                            else -1 if flag in MANY_VALUES else 1)
                elif skip:  # an option's value (skip -1: values up to the next flag)
                    skip -= skip > 0
                elif re.fullmatch(r"[A-Za-z_]\w*", word):
                    found.append((line, word))
    return found


def test_every_rule_a_documented_snakemake_command_targets_exists():
    named = snakemake_targets()
    assert len(named) > 5  # the extraction still finds `all`, `-R chunk_articles`, `--until`
    missing = [f"{line.at}: snakemake ... {name}" for line, name in named if name not in rules()]
    assert not missing, "no such rule in the Snakefile or rules/*.smk:\n" + "\n".join(missing)


# -- 5. make targets -----------------------------------------------------------------------------

def test_every_make_target_the_documents_name_exists():
    targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = [(line, match.group(1)) for line, span, _ in code_spans()
             for match in [re.match(r"make ([\w-]+)", span)] if match]
    named += [(line, target) for line in doc_lines() if line.code
              for target in re.findall(r"(?:^|&&|;|#|=)\s*make ([\w-]+)", line.text.strip())]
    assert len(named) > 20  # the extraction still finds `make demo`
    missing = [f"{line.at}: make {target}" for line, target in named if target not in targets]
    assert not missing, "no such Makefile target:\n" + "\n".join(missing)


# -- 6. command-line flags -----------------------------------------------------------------------

# Modules that hand their whole command line to another program: its flags are that program's.
PASSED_ON = {"pyserini_setup": "pyserini's entry points", "torchrun": "torchrun's own main"}


@cache
def syntax_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def imported_from(path: Path, node: ast.ImportFrom, name: str) -> tuple[Path, str | None] | None:
    """(file, name in it; None for a module) that `from ... import name` in `path` binds, where
    it is the package's (relative, or `retrieval_pretraining.x`) or a script's beside `path`
    (`from pretrain_step_time import make_checkpoint`); None for any other library."""
    module = node.module.split(".") if node.module else []
    if node.level:
        base, parts = path.parents[node.level - 1], module
    elif module[0] == "retrieval_pretraining":
        base, parts = PACKAGE, module[1:]
    else:
        base, parts = path.parent, module
    folder = base.joinpath(*parts)
    for file in (folder / f"{name}.py", folder / name / "__init__.py"):
        if file.is_file():
            return file, None
    for file in (folder.with_suffix(".py"), folder / "__init__.py"):
        if file.is_file():
            return file, name
    return None


@cache
def bindings(path: Path) -> dict[str, tuple[Path, str | None]]:
    """What the `from ... import name`s of `path` (anywhere in it) bind: name -> imported_from."""
    return {(alias.asname or alias.name): target for node in ast.walk(syntax_tree(path))
            if isinstance(node, ast.ImportFrom) for alias in node.names
            for target in [imported_from(path, node, alias.name)] if target}


def constant_strings(path: Path, name: str) -> tuple[str, ...]:
    """The strings of a top-level tuple or list constant `name` of `path`, or of the module it
    imports it from (`fetch.CHECKSUMS`); () where it is none."""
    for node in syntax_tree(path).body:
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id == name
                                                for target in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return ()
            return tuple(value) if isinstance(value, tuple | list) and all(
                isinstance(item, str) for item in value) else ()
    file, imported = bindings(path).get(name, (None, None))
    return constant_strings(file, imported) if file and imported else ()


def spellings(arg: ast.expr, loop: dict[str, tuple[str, ...]]) -> list[str]:
    """The strings `arg` is: a literal, or an f-string over the names of enclosing `for name in
    CONSTANT:` loops (`f"--{name}"` for each of fetch.CHECKSUMS)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if not isinstance(arg, ast.JoinedStr):
        return []
    parts = []
    for value in arg.values:
        if isinstance(value, ast.Constant):
            parts.append([str(value.value)])
        elif isinstance(value.value, ast.Name) and value.value.id in loop:
            parts.append(list(loop[value.value.id]))
        else:
            return []
    return ["".join(choice) for choice in itertools.product(*parts)]


@cache
def builds_parsers(path: Path) -> bool:
    return "add_argument" in path.read_text()


def followed(file: Path, node: ast.Call, local: bool) -> tuple[Path, str] | None:
    """(file, function) that `node`, a call in `file`, runs where it is the package's or a
    script's (`stage_parser(...)`, `errors.add_debug_option(...)`; with `local`, a function of
    `file` itself), or None."""
    called, bound = node.func, bindings(file)
    if isinstance(called, ast.Name) and bound.get(called.id, (None, None))[1]:
        return bound[called.id]
    if isinstance(called, ast.Name) and local and called.id in {
            item.name for item in syntax_tree(file).body if isinstance(item, ast.FunctionDef)}:
        return file, called.id
    if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name) \
            and called.value.id in bound and bound[called.value.id][1] is None:
        return bound[called.value.id][0], called.attr
    return None


def loop_names(file: Path, scope: ast.AST) -> dict[int, dict[str, tuple[str, ...]]]:
    """{id(node): {name: its strings}} for the nodes inside `for name in CONSTANT:` loops."""
    loops: dict[int, dict[str, tuple[str, ...]]] = {}
    for loop in ast.walk(scope):
        if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) \
                and isinstance(loop.iter, ast.Name):
            values = constant_strings(file, loop.iter.id)
            for inner in ast.walk(loop):
                loops.setdefault(id(inner), {})[loop.target.id] = values
    return loops


def option_strings(node: ast.Call, loops: dict[int, dict[str, tuple[str, ...]]]) -> set[str]:
    """The option strings of an `add_argument` call (none of a positional argument)."""
    return {flag for arg in node.args for flag in spellings(arg, loops.get(id(node), {}))
            if flag.startswith("-")}


def flags_from(todo: list[tuple[Path, str | None]]) -> frozenset[str]:
    """The option strings of the `add_argument` calls in each (file, function; None: the whole
    file) of `todo`, and in the functions of the package those call, and those call."""
    flags: set[str] = set()
    seen: set[tuple[Path, str | None]] = set()
    while todo:
        file, function = todo.pop()
        if (file, function) in seen or not builds_parsers(file):
            continue
        seen.add((file, function))
        tree = syntax_tree(file)
        scope = tree if function is None else next(
            (node for node in tree.body if isinstance(node, ast.FunctionDef)
             and node.name == function), None)
        if scope is None:
            continue
        loops = loop_names(file, scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "add_argument":
                flags.update(option_strings(node, loops))
            elif isinstance(node, ast.Call) and (
                    target := followed(file, node, function is not None)):
                todo.append(target)
    return frozenset(flags)


@cache
def declared_flags(path: Path) -> frozenset[str]:
    """The option strings (`--config`, `-x`) of the `add_argument` calls in the script or module
    `path`, and in the functions it calls, and those call, to build its parser (of a file that
    has an `add_argument` call: config.stage_parser, errors.add_debug_option,
    retrieval_settings.add_runtime_option), whatever the subcommand (subcommand_flags: one's)."""
    return flags_from([(path, None)])


PARENT = ""  # subcommand_flags: the parent parser's, not a subcommand's


def is_add_parser(node: ast.Call) -> bool:
    """`SUBPARSERS.add_parser("name", ...)`: a subcommand, named by a literal."""
    return isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser" \
        and bool(node.args) and isinstance(node.args[0], ast.Constant) \
        and isinstance(node.args[0].value, str)


@cache
def subcommand_flags(path: Path) -> dict[str, frozenset[str]]:
    """{name: the option strings `path NAME ...` takes} for a script or module whose parser has
    subcommands (`SUBPARSERS.add_parser("name", ...)` in its own file), {} for one without.

    A parser is a variable, up to the next assignment to it, or a call chained on add_parser
    (`add_parser("x").add_argument(...)`): the one add_parser returns (a subcommand's), and the
    one `add_subparsers` is called on (the parent). Each takes the `add_argument` calls on it, and
    the flags of the functions called with it (`add_debug_option(fetch_cmd)`) or in its
    constructor's arguments (`parents=[stage_parser("")]`), as declared_flags follows them. A
    subcommand takes its own and the parent's (argparse takes the parent's before the subcommand
    only: not checked)."""
    if "add_parser" not in path.read_text():
        return {}
    tree = syntax_tree(path)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = {node.args[0].value for node in calls if is_add_parser(node)}
    if not names:
        return {}
    parents = {node.func.value.id for node in calls if isinstance(node.func, ast.Attribute)
               and node.func.attr == "add_subparsers" and isinstance(node.func.value, ast.Name)}
    # (line, column, variable, whose parser it is: a subcommand, PARENT or None) of each assignment.
    assigned = sorted(
        (node.lineno, node.col_offset, target.id,
         node.value.args[0].value if isinstance(node.value, ast.Call)
         and is_add_parser(node.value) else PARENT if target.id in parents else None)
        for node in ast.walk(tree) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Name))

    def whose(parser: ast.expr, at: ast.AST) -> str | None:
        """The subcommand (or PARENT) whose parser `parser` is where `at` is, or None."""
        if isinstance(parser, ast.Call) and is_add_parser(parser):
            return parser.args[0].value
        if not isinstance(parser, ast.Name):
            return None
        latest = [name for line, column, variable, name in assigned
                  if variable == parser.id and (line, column) < (at.lineno, at.col_offset)]
        return latest[-1] if latest else PARENT if parser.id in parents else None

    own: dict[str, set[str]] = {name: set() for name in [*names, PARENT]}
    todo: dict[str, list[tuple[Path, str | None]]] = {name: [] for name in own}
    loops = loop_names(path, tree)
    for node in calls:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument" and (
                name := whose(node.func.value, node)):
            own[name].update(option_strings(node, loops))
        elif given := [name for arg in node.args if (name := whose(arg, node))]:
            todo[given[0]] += [target for target in [followed(path, node, True)] if target]
    for node in ast.walk(tree):  # what a parser's constructor calls: `parents=[stage_parser()]`
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                name := whose(node.targets[0], node.value)):
            todo[name] += [target for inner in ast.walk(node.value) if inner is not node.value
                           and isinstance(inner, ast.Call)
                           for target in [followed(path, inner, True)] if target]
    parent = own[PARENT] | flags_from(todo[PARENT])
    return {name: frozenset(own[name] | flags_from(todo[name]) | parent) for name in names}


FLAG = re.compile(r"--?[A-Za-z][\w-]*")


def rejected(path: Path, words: list[str]) -> list[str]:
    """What of a command's words after the script or module `path` its parser does not take: a
    flag (`--x`, `--x=1`, `-x`) none of its `add_argument` calls declares (declared_flags); and,
    where the parser has subcommands, a first positional word (one not starting with `-`) that
    names none of them, or the flags the named one does not take (subcommand_flags)."""
    flags = [word.split("=")[0] for word in words if FLAG.fullmatch(word.split("=")[0])]
    subcommands = subcommand_flags(path)
    if not subcommands:
        return [flag for flag in flags if flag not in declared_flags(path)]
    name = next((word for word in words if not word.startswith("-")), None)
    if name not in subcommands:
        return [f"{name or '(no subcommand)'}: not a subcommand (one of "
                f"{', '.join(sorted(subcommands))})"]
    return [f"{name} {flag}" for flag in flags if flag not in subcommands[name]]


def module_file(name: str) -> Path | None:
    """The file `python -m retrieval_pretraining.<name>` runs (a package's __main__.py), or None
    where the package has no such module."""
    path = package_modules().get(name)
    return path.with_name("__main__.py") if path is not None and path.name == "__init__.py" \
        else path


def command_texts() -> list[tuple[Line, str]]:
    """(line, text) for every backticked span of the prose and every command of a code block, a
    command continued with `\\` over lines given whole with the line it starts on."""
    found = [(line, span) for line, span, _ in code_spans()]
    pending: list[Line] = []
    for line in [*doc_lines(), None]:
        if pending and (line is None or not line.code or line.doc != pending[-1].doc
                        or not pending[-1].text.rstrip().endswith("\\")):
            found.append((pending[0], " ".join(item.text.rstrip().removesuffix("\\")
                                               for item in pending)))
            pending = []
        if line is not None and line.code:
            pending.append(line)
    return found


def documented_commands() -> list[tuple[Line, str, Path | None, list[str]]]:
    """(line, program, its file or None, words) for each documented command of ours, its words
    the first that is no flag (a subcommand's place; not one starting with `-`, `[` or `(`), if
    any, then its flags:
    `python -m retrieval_pretraining.x ...` (also after torchrun), `python benchmarks/y.py ...`,
    `python -m benchmarks.y ...`. A command ends at `&&`, `||`, `;`, `|`, ` #` (a comment) or a
    lone `--` (what follows is another program's); quoted text (a `--config` JSON) is a value.
    Not a module named by a placeholder (`retrieval_pretraining.<stage>`), not PASSED_ON."""
    start = re.compile(r"(?<!\S)-m\s+(retrieval_pretraining(?:\.\w+)+|benchmarks(?:\.\w+)+)"
                       r"(?![\w.<])|(?<![\w.-])python3?\s+((?:\./)?benchmarks/\w+\.py)\b")
    found = []
    for line, text in command_texts():
        text = re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)
        for match in start.finditer(text):
            program = match.group(1) or match.group(2).removeprefix("./")
            rest = re.split(r"&&|\|\||;|\||\s#|(?<!\S)--(?!\S)", text[match.end():])[0]
            if program.startswith("benchmarks"):
                path = ROOT / (program if program.endswith(".py")
                               else program.replace(".", "/") + ".py")
            else:
                name = program.removeprefix("retrieval_pretraining.")
                if name in PASSED_ON:
                    continue
                path = module_file(name)
            first = next((word for word in rest.split() if word[0] not in "-[("), None)
            found.append((line, program, path if path and path.is_file() else None,
                          [first] * bool(first)
                          + re.findall(r"(?<![^\s\[(])(--?[A-Za-z][\w-]*)", rest)))
    return found


def test_every_flag_a_documented_command_passes_is_declared():
    named = documented_commands()
    # The extraction still finds `--config`, `--scales`, `--encoder`, and `download fetch`.
    assert sum(word.startswith("-") for *_, words in named for word in words) > 100
    assert sum(bool(subcommand_flags(path)) for _, _, path, _ in named if path) >= 4
    missing = [f"{line.at}: {program} {problem}" for line, program, path, words in named
               for problem in (rejected(path, words) if path else ["(no such file)"])]
    assert not missing, "no such option or subcommand in the command's parser:\n" + "\n".join(
        missing)
