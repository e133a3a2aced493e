"""Which source files a stage runs: its module and every package module it imports, transitively.

Read from the source with `ast` (nothing is imported, so the Snakefile can call it at parse time
without torch). Two consumers: `rules/common.smk` declares these files as a rule's inputs, so that
editing any module a stage runs reruns that stage (and nothing that does not run it), and
`tests/test_environments.py` checks that each conda environment provides the third-party imports
of the stages it serves. A subpackage entry (`pretrain`, `finetune`, `contracts`) stands for all its
modules, those of its own subpackages included. Imports by name at run time (importlib), which
`ast` cannot see, are listed in DYNAMIC_IMPORTS.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name
# Modules that import others by name at run time, and what they may load (a subpackage: all its
# modules). contracts/registry.py imports every contracts/<type>/audit.py it finds, so a rule that
# runs the registry (stage_statistics, through audit) must rerun when any contract changes.
DYNAMIC_IMPORTS = {"contracts.registry": ("contracts",)}


def module_file(name: str) -> Path | None:
    """The file of package module `name` ('chunk', 'pretrain.data', 'pretrain'), or None."""
    path = PACKAGE_DIR.joinpath(*name.split(".")) if name else PACKAGE_DIR
    if path.is_dir():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _statements(body: list[ast.AST]):
    """Every statement in `body` and the blocks nested in it (functions, classes, if/try/with,
    except handlers, match cases): where an import can be. Expressions are not visited, which
    makes this a tenth of `ast.walk`'s time, paid on every parse of the workflow."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from _statements(block)


@functools.lru_cache(maxsize=None)  # each file is parsed once per process, not once per closure
def _imports(path: Path, name: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """(package modules, third-party top-level modules) imported anywhere in one file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = [], set()
    for node in _statements(ast.parse(path.read_text(), filename=str(path)).body):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative: inside the package
            base = package.split(".") if package else []
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
            if prefix:  # "" would be the package itself, whose __init__ imports nothing
                inside.append(prefix)
            # `from . import x` names modules; `from .x import f` names attributes (no file).
            inside += [f"{prefix}.{alias.name}".strip(".") for alias in node.names]
            continue
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
            top, _, rest = modules[0].partition(".")
            if top == PACKAGE:  # as the relative branch: the names may be modules
                inside += [f"{rest}.{alias.name}".strip(".") for alias in node.names]
        else:
            continue
        for module in modules:
            top, _, rest = module.partition(".")
            if top == PACKAGE:
                inside.append(rest)
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                outside.add(top)
    return tuple(inside), frozenset(outside)


def _with_submodules(name: str) -> list[str]:
    """`name` and, for a subpackage, all its modules and those of its own subpackages."""
    names = [name]
    first = module_file(name)
    if first is not None and first.name == "__init__.py":
        for path in first.parent.rglob("*.py"):
            parts = path.relative_to(first.parent).with_suffix("").parts
            names.append(".".join((name, *parts)).removesuffix(".__init__"))
    return names


@functools.lru_cache(maxsize=None)
def closure(entry: str) -> tuple[tuple[Path, ...], frozenset[str]]:
    """(package files, third-party top-level modules) that running `entry` may execute."""
    seen: set[str] = set()
    todo = _with_submodules(entry)  # a subpackage entry stands for all its modules
    files: set[Path] = set()
    third_party: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        path = module_file(name)
        if path is None:  # an attribute imported with `from .x import f`, not a module
            continue
        files.add(path)
        if "." in name:  # importing pretrain.model runs pretrain/__init__.py first
            todo.append(name.rpartition(".")[0])
        inside, outside = _imports(path, name)
        todo += inside
        todo += [module for target in DYNAMIC_IMPORTS.get(name, ()) for module in
                 _with_submodules(target)]
        third_party |= outside
    return tuple(sorted(files)), frozenset(third_party)


def source_files(*entries: str) -> list[str]:
    """Every package file the entries run, as sorted path strings (a rule's `code` input)."""
    files = {path for entry in entries for path in closure(entry)[0]}
    return sorted(map(str, files))


def third_party_imports(entry: str) -> set[str]:
    """Top-level third-party modules `entry` and the package modules it runs import."""
    return set(closure(entry)[1])


if __name__ == "__main__":  # python -m retrieval_pretraining.code_deps chunk
    for file in source_files(*sys.argv[1:]):
        print(Path(file).relative_to(PACKAGE_DIR))
