"""One module per artifact type: the one place its contract is written.

A contract module holds, for its artifact type: the Arrow schema (where it is Parquet), the
validator its writer calls before publishing (raising an error that names the file, the row and the
fix), and `KINDS`: how `audit` recognises such a file (`Kind.matches`) and how it summarises and
checks it (`Kind.audit`). Optionally `FILES`: what a file below results/ is and which rule writes
it, for files whose contents do not say so (a PNG, a Markdown page).

The registry is this package itself: every module here but `base` is a contract module, found by
`contract_modules()`, so adding an artifact type is adding one module, and adding a column is a
change to its module alone. `audit` tries the kinds in `Kind.rank` order (bands in base.py); the
first that matches audits the path. Nothing is imported until `audit` asks: a writer importing its
own contract loads that module and `base` only.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType

HELPERS = ("base",)  # shared helpers, not a contract


@functools.cache
def contract_modules() -> tuple[ModuleType, ...]:
    """Every contract module of this package, by name."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in HELPERS)
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)


def kinds() -> list:
    """Every kind of artifact `audit` knows, in the order it tries them (`Kind.rank`)."""
    return sorted((kind for m in contract_modules() for kind in m.KINDS), key=lambda k: k.rank)


def known_files() -> list[tuple[str, str, str]]:
    """(pattern below results/, what the file is, the rule that writes it) of every contract."""
    return [entry for m in contract_modules() for entry in getattr(m, "FILES", ())]
