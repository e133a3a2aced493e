"""Artifact contracts: one folder per artifact type, the one place its contract is written.

    contracts/<type>/__init__.py   the contract in words, and what its writer imports: the Arrow
                                   schema (where it is Parquet), constants, error types, and where
                                   the writer checks its rows before publishing (chunks, spans;
                                   datasets: its checks.py, which needs polars) the validator it
                                   calls, raising an error that names the file, the row and the
                                   fix; the other writers build their rows to the contract, and
                                   `audit` checks them after
    contracts/<type>/audit.py      how `audit` recognises, summarises and checks such a file
                                   (`KINDS`, and `FILES` for files whose contents do not say what
                                   they are); its column checks derive from the schema above

Adding an artifact type is adding a folder (registry.py finds it); adding a column is a change to
its schema in `<type>/__init__.py` alone.

Why two modules per type: a rule declares as its code input every package file its stage imports
(code_deps.py). A writer imports its type's `__init__` (and columns.py, which holds what the
validators share), never an audit module, base.py (the audits' shared display helpers) or
registry.py; so changing how `audit` prints an artifact reruns no stage. `__init__` modules import
no audit code (tests/test_contracts.py checks both).
"""
