"""contracts/: every artifact type's contract lives in one module that audit finds by itself, and
no writer keeps a schema of its own."""

import ast
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from retrieval_pretraining import audit, contracts
from retrieval_pretraining.contracts.base import Kind

PACKAGE = Path(contracts.__file__).resolve().parents[1]
CONTRACTS = Path(contracts.__file__).resolve().parent
KINDS = contracts.kinds()
PARQUET_KINDS = [k for k in KINDS if k.form == "Parquet"]


def test_every_module_of_the_package_is_a_registered_contract():
    files = {p.stem for p in CONTRACTS.glob("*.py")} - {"__init__", *contracts.HELPERS}
    modules = {m.__name__.rsplit(".", 1)[1] for m in contracts.contract_modules()}
    assert modules == files
    for module in contracts.contract_modules():
        assert module.KINDS, f"{module.__name__} declares no KINDS"
        assert all(isinstance(k, Kind) for k in module.KINDS), module.__name__


def test_kinds_have_one_order_and_a_known_form():
    ranks = [k.rank for k in KINDS]
    assert len(set(ranks)) == len(ranks), "two kinds share a rank: their order would be arbitrary"
    assert {k.form for k in KINDS} <= set(audit.FORMS)
    assert all(k.schema is not None for k in PARQUET_KINDS)


@pytest.mark.parametrize("kind", PARQUET_KINDS, ids=lambda k: k.name)
def test_a_file_with_a_contract_schema_is_recognised_as_that_contract(kind, tmp_path):
    path = tmp_path / "artifact.parquet"
    pq.write_table(kind.schema.empty_table(), path)
    assert audit.detect(path) is kind
    result = audit.audit(path)
    checks = [name for name, _, _ in result.checks if name.startswith("column ")]
    assert checks == [f"column {f.name} is {f.type}" for f in kind.schema]


def test_known_file_patterns_name_a_rule():
    for pattern, what, rule in contracts.known_files():
        assert pattern and what and rule, (pattern, what, rule)


def _schema_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "schema"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "pa"
    ]


def test_no_module_outside_contracts_defines_an_arrow_schema():
    """A writer imports its schema from its contract: one place to add a column."""
    found = {
        str(p.relative_to(PACKAGE)): lines
        for p in PACKAGE.rglob("*.py")
        if CONTRACTS not in p.parents and (lines := _schema_calls(p))
    }
    assert not found, f"Arrow schemas outside contracts/ (module: lines): {found}"


def test_the_scan_sees_a_schema_written_as_the_writers_wrote_theirs(tmp_path):
    sample = tmp_path / "writer.py"
    sample.write_text('import pyarrow as pa\n\nSCHEMA = pa.schema([("doc_id", pa.string())])\n')
    assert _schema_calls(sample) == [3]
