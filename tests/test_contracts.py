"""contracts/: every artifact type's contract lives in one folder that audit finds by itself; its
writer imports the folder's `__init__` (schema, validator) and never audit code, so changing how
`audit` shows an artifact reruns no stage; no writer keeps a schema of its own."""

import ast
import importlib
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retrieval_pretraining import audit, code_deps, contracts
from retrieval_pretraining.contracts import registry
from retrieval_pretraining.contracts.base import Kind

PACKAGE = code_deps.PACKAGE_DIR
CONTRACTS = Path(contracts.__file__).resolve().parent
KINDS = registry.kinds()
PARQUET_KINDS = [k for k in KINDS if k.form == "Parquet"]
# Modules of contracts/ that are no artifact type: audit's shared helpers, the registry, and what
# the writers' validators share.
SHARED = {"__init__", "base", "registry", "columns"}
# The entry modules of the stages that write artifacts (what rules run: module_source).
WRITERS = [
    "chunk", "spans", "extract", "datasets", "bm25", "mine", "encode", "evaluate", "faiss_index",
    "dense_search", "finetune", "pretrain", "checkpoints", "download", "tables",
]  # fmt: skip
# What a type's `__init__` may import besides the standard library: what validators need.
WRITER_SIDE_LIBRARIES = {"numpy", "pyarrow", "polars"}


def test_every_artifact_type_is_a_folder_whose_audit_module_is_registered():
    loose = {p.stem for p in CONTRACTS.glob("*.py")} - SHARED
    assert not loose, f"contracts/ modules outside a type folder (the registry skips them): {loose}"
    folders = sorted(p.parent.name for p in CONTRACTS.glob("*/__init__.py"))
    assert registry.type_names() == folders
    for module in registry.audit_modules():
        assert Path(module.__file__).name == "audit.py", module.__name__
        assert module.KINDS, f"{module.__name__} declares no KINDS"
        assert all(isinstance(k, Kind) for k in module.KINDS), module.__name__


def test_kinds_have_one_order_and_a_known_form():
    ranks = [k.rank for k in KINDS]
    assert len(set(ranks)) == len(ranks), "two kinds share a rank: their order would be arbitrary"
    assert {k.form for k in KINDS} <= set(audit.FORMS)
    assert all(k.schema is not None for k in PARQUET_KINDS)


def test_a_parquet_kind_checks_the_schema_its_writer_imports():
    """Adding a column is a change to the type's `__init__` alone: its audit checks that schema."""
    for module in registry.audit_modules():
        package = importlib.import_module(module.__name__.removesuffix(".audit"))
        schemas = [v for v in vars(package).values() if isinstance(v, pa.Schema)]
        for kind in (k for k in module.KINDS if k.form == "Parquet"):
            assert any(kind.schema is s for s in schemas), (package.__name__, kind.name)


@pytest.mark.parametrize("kind", PARQUET_KINDS, ids=lambda k: k.name)
def test_a_file_with_a_contract_schema_is_recognised_as_that_contract(kind, tmp_path):
    path = tmp_path / "artifact.parquet"
    pq.write_table(kind.schema.empty_table(), path)
    assert audit.detect(path) is kind
    result = audit.audit(path)
    checks = [name for name, _, _ in result.checks if name.startswith("column ")]
    assert checks == [f"column {f.name} is {f.type}" for f in kind.schema] + [
        f"column {f.name} has no null" for f in kind.schema if not f.nullable
    ]


@pytest.mark.parametrize("kind", PARQUET_KINDS, ids=lambda k: k.name)
def test_a_column_of_another_type_fails_its_schema_check(kind, tmp_path):
    """Recognition reads column names alone: a column written with another type (an id as
    large_string, a count as a string) is recognised, and its type check is what fails it."""
    field = kind.schema.field(0)
    other = pa.large_string() if field.type == pa.string() else pa.string()
    schema = kind.schema.set(0, field.with_type(other))
    path = tmp_path / "artifact.parquet"
    pq.write_table(schema.empty_table(), path)
    assert audit.detect(path) is kind
    checks = {name: ok for name, ok, _ in audit.audit(path).checks}
    assert checks[f"column {field.name} is {field.type}"] is False
    assert all(ok for name, ok in checks.items() if name.startswith("column ")
               and not name.startswith(f"column {field.name} is "))


def test_known_file_patterns_name_a_rule():
    """Each pattern audit knows names the rules (" / " between several) that write it, as
    rules/*.smk defines them; the report's is the `snakemake --report` command."""
    rules_dir = Path(__file__).resolve().parents[1] / "rules"
    defined = {line.split()[1].rstrip(":") for f in rules_dir.glob("*.smk")
               for line in f.read_text().splitlines() if line.startswith(("rule ", "checkpoint "))}
    for pattern, what, rule in registry.known_files():
        assert pattern and what and rule, (pattern, what, rule)
        if rule != "`snakemake --report`":
            assert set(rule.split(" / ")) <= defined, (pattern, rule)


# ----------------------------------------------------------------------------- writer / audit seam
def is_audit_code(path: Path) -> bool:
    """audit.py, contracts/base.py, contracts/registry.py or a type's contracts/<type>/audit.py."""
    return path in (PACKAGE / "audit.py", CONTRACTS / "base.py", CONTRACTS / "registry.py") or (
        path.name == "audit.py" and path.parent.parent == CONTRACTS
    )


@pytest.mark.parametrize("entry", WRITERS)
def test_no_writer_runs_audit_code(entry):
    """A rule's code input is what its stage imports: audit code there would rerun the stage (and
    everything after it) whenever `audit`'s output changes."""
    found = [
        Path(f).relative_to(PACKAGE).as_posix()
        for f in code_deps.source_files(entry)
        if is_audit_code(Path(f))
    ]
    assert not found, f"{entry} runs audit code (its rule would rerun when audit changes): {found}"


def test_the_seam_check_sees_audit_code():
    files = [Path(f) for f in code_deps.source_files("audit", "contracts")]
    assert {p.relative_to(PACKAGE).as_posix() for p in files if is_audit_code(p)} >= {
        "audit.py", "contracts/base.py", "contracts/registry.py", "contracts/chunks/audit.py",
    }  # fmt: skip


def _imports(path: Path, root: Path = CONTRACTS) -> tuple[set[str], set[str]]:
    """(modules below `root` it imports relatively, as 'chunks', 'chunks.audit', 'base' or '' for
    the package `root` itself; third-party top-level modules) of one file below `root`."""
    package = list(path.relative_to(root).parent.parts)
    relative, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            prefix = package[: len(package) - (node.level - 1)] + [node.module or ""]
            relative.add(".".join(filter(None, prefix)))
            for alias in node.names:  # `from . import audit` imports a module, not a name
                name = ".".join(filter(None, [*prefix, alias.name]))
                target = root.joinpath(*name.split("."))
                if target.is_dir() or target.with_suffix(".py").is_file():
                    relative.add(name)
        elif isinstance(node, ast.Import):
            outside |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            outside.add(node.module.split(".")[0])
    return relative, outside - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("name", registry.type_names())
def test_a_type_init_imports_only_what_a_writer_may_run(name):
    """`<type>/__init__.py` is the writer's side: it may import other types' `__init__`,
    columns.py and the package's errors.py (the stdlib-only BadInput base of every error class),
    never audit code, and no library a validator does not need."""
    relative, outside = _imports(CONTRACTS / name / "__init__.py")
    allowed = {"", "columns", "errors", *registry.type_names()}
    assert relative <= allowed, f"contracts/{name}/__init__.py imports {relative - allowed}"
    assert outside <= WRITER_SIDE_LIBRARIES, f"contracts/{name}/__init__.py imports {outside}"


def test_the_import_scan_sees_audit_code_however_it_is_imported(tmp_path):
    for module in ("base.py", "chunks/__init__.py", "chunks/audit.py", "spans/audit.py"):
        (tmp_path / module).parent.mkdir(exist_ok=True)
        (tmp_path / module).write_text("")
    init = tmp_path / "spans" / "__init__.py"
    init.write_text(
        "import numpy\nimport json\nfrom ..chunks import word_extents\nfrom ..base import y\n"
        "from . import audit\nfrom ..chunks import audit as chunks_audit\n"
    )
    relative, outside = _imports(init, tmp_path)
    assert relative == {"chunks", "base", "spans", "spans.audit", "chunks.audit"}
    assert outside == {"numpy"}


# ----------------------------------------------------------------------------- schemas
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


def test_arrow_schemas_are_defined_only_in_the_types_init_modules():
    """A writer imports its schema from its contract, and audit checks that one: one place to add
    a column."""
    found = {
        str(p.relative_to(PACKAGE)): lines
        for p in PACKAGE.rglob("*.py")
        if not (p.name == "__init__.py" and p.parent.parent == CONTRACTS)
        and (lines := _schema_calls(p))
    }
    assert not found, f"Arrow schemas outside contracts/<type>/__init__.py (module: lines): {found}"


def test_the_scan_sees_a_schema_written_as_the_writers_wrote_theirs(tmp_path):
    sample = tmp_path / "writer.py"
    sample.write_text('import pyarrow as pa\n\nSCHEMA = pa.schema([("doc_id", pa.string())])\n')
    assert _schema_calls(sample) == [3]
