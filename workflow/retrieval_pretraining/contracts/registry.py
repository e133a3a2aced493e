"""Which artifact types `audit` knows: every folder of contracts/ is one, and its `audit` module
says how `audit` recognises, summarises and checks it (`KINDS`; optionally `FILES`: what a file
below results/ is and which rule writes it, for files whose contents do not say so).

Found at run time, so adding an artifact type is adding one folder. Only audit code imports this
module (it imports every type's audit); writers import their type's `__init__` alone.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

CONTRACTS = __name__.rpartition(".")[0]  # the contracts package


def type_names() -> list[str]:
    """The artifact types: the folders (packages) of contracts/, by name."""
    folder = str(Path(__file__).parent)
    return sorted(m.name for m in pkgutil.iter_modules([folder]) if m.ispkg)


@functools.cache
def audit_modules() -> tuple[ModuleType, ...]:
    """Every type's `audit` module, by type name."""
    return tuple(importlib.import_module(f"{CONTRACTS}.{name}.audit") for name in type_names())


def kinds() -> list:
    """Every kind of artifact `audit` knows, in the order it tries them (`Kind.rank`)."""
    return sorted((kind for m in audit_modules() for kind in m.KINDS), key=lambda k: k.rank)


def known_files() -> list[tuple[str, str, str]]:
    """(pattern below results/, what the file is, the rule that writes it) of every type."""
    return [entry for m in audit_modules() for entry in getattr(m, "FILES", ())]
