"""code_deps: the package files a stage runs (declared as its rule's `code` input).

Checked against the interpreter itself: every package module that importing a stage loads must be
in the stage's closure (otherwise an edit to it would not rerun the stage).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from retrieval_pretraining import code_deps

PACKAGE = code_deps.PACKAGE_DIR
STAGES = ["chunk", "spans", "extract", "download", "datasets", "bm25", "encode", "mine",
          "dense_search", "faiss_index", "evaluate", "tables", "audit", "checkpoints", "launch",
          "span_audit"]


def _loaded_by_import(module: str, then: str = "") -> set[Path]:
    """Package files loaded by importing `module` (and running the code `then`)."""
    script = (
        "import importlib, json, sys\n"
        f"importlib.import_module('retrieval_pretraining.{module}')\n{then}"
        "print(json.dumps([m.__file__ for n, m in list(sys.modules.items())\n"
        "                  if n.startswith('retrieval_pretraining.') and getattr(m, '__file__', None)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=PACKAGE.parent, check=True)
    return {Path(f).resolve() for f in json.loads(out.stdout.splitlines()[-1])}


@pytest.mark.parametrize("stage", STAGES)
def test_closure_holds_every_module_the_interpreter_loads(stage):
    declared = {Path(f) for f in code_deps.source_files(stage)}
    loaded = _loaded_by_import(stage) - {PACKAGE / "__init__.py"}
    assert loaded <= declared, f"{stage} loads {sorted(loaded - declared)} undeclared"


@pytest.mark.parametrize("trainer", ["pretrain", "finetune"])
def test_a_subpackage_entry_stands_for_all_its_modules(trainer):
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files(trainer)}
    modules = {p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / trainer).glob("*.py")}
    assert modules <= files
    shared = {p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "training").glob("*.py")}
    assert shared <= files  # followed from its imports (training/__init__.py imports them all)


def test_a_subpackage_entry_stands_for_its_own_subpackages_too():
    # contracts/ holds one folder per artifact type; audit loads their audit modules at run time.
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files("contracts")}
    modules = {p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "contracts").rglob("*.py")}
    assert modules <= files
    assert "contracts/chunks/audit.py" in files and "contracts/chunks/__init__.py" in files


def _rule_code_entries(smk: str, rule: str) -> list[str]:
    """The module_source(...) entries of a rule's `code` input, read from its rule file."""
    text = (PACKAGE.parents[1] / "rules" / smk).read_text().split(f"rule {rule}:", 1)[1]
    call = re.search(r"code=module_source\(([^)]*)\)", text.split("\nrule ", 1)[0])
    return [*ast.literal_eval(f"({call.group(1)},)"), "config"]  # module_source adds config


def test_editing_the_span_audit_reruns_the_audit_and_no_span_sampling():
    """sample_spans' shards are what every pre-training reads: an edit to the audit's plot or
    sample (span_audit.py, rule audit_spans) must rerun the audit alone, not every sampling job
    (64 per index at paper scale) and, by their new modification times, every pre-training."""
    def code(rule: str) -> set[Path]:
        return {Path(f) for f in code_deps.source_files(*_rule_code_entries("corpus.smk", rule))}

    assert PACKAGE / "span_audit.py" not in code("sample_spans")
    assert {PACKAGE / "span_audit.py", PACKAGE / "spans.py"} <= code("audit_spans")
    shell = (PACKAGE.parents[1] / "rules" / "corpus.smk").read_text().split(
        "rule audit_spans:", 1)[1].split("\nrule ", 1)[0]
    assert "python -m retrieval_pretraining.span_audit " in shell  # the module it declares runs


def test_stage_statistics_declares_the_contract_audits_its_registry_imports_by_name():
    """contracts/registry.py loads every contracts/<type>/audit.py with importlib, which `ast`
    cannot follow: editing a contract's audit must still rerun stage_statistics."""
    declared = {Path(f) for f in code_deps.source_files(
        *_rule_code_entries("report.smk", "stage_statistics"))}
    loaded = _loaded_by_import(
        "audit", then="from retrieval_pretraining.contracts import registry\n"
        "registry.audit_modules()\n") - {PACKAGE / "__init__.py"}
    assert PACKAGE / "contracts" / "chunks" / "audit.py" in loaded  # the run-time imports ran
    assert loaded <= declared, f"stage_statistics runs {sorted(loaded - declared)} undeclared"


def test_every_import_by_name_is_listed_in_dynamic_imports():
    # A new importlib call elsewhere would load modules no rule declares.
    by_name = {path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
               for path in PACKAGE.rglob("*.py")
               if "import_module(" in path.read_text() or "__import__(" in path.read_text()}
    assert by_name <= set(code_deps.DYNAMIC_IMPORTS), sorted(by_name)


def test_imports_inside_functions_are_followed():
    # analysis/ imports pretrain.model lazily (torch heads only when a figure needs them).
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files("analysis")}
    assert "pretrain/model.py" in files


def test_an_import_in_any_block_is_found(tmp_path):
    # The statement walk against ast.walk (every node) on imports in each kind of block.
    source = tmp_path / "blocks.py"
    source.write_text(textwrap.dedent("""
        import a
        class C:
            import b
            def f(self):
                import c
        if x:
            import d
        else:
            import e
        for i in y:
            import f
        while z:
            import g
        with w:
            import h
        try:
            import i
        except ImportError:
            import j
        else:
            import k
        finally:
            import l
        match v:
            case 1:
                import m
        lambda: __import__("not_a_statement")
        def g():
            from retrieval_pretraining import chunker
            from retrieval_pretraining.contracts import chunks, columns as cols
    """))
    tree = ast.parse(source.read_text())
    walked = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
              for alias in node.names}
    assert walked == set("abcdefghijklm")
    assert set(code_deps._imports(source, "blocks")[1]) == walked
    # An absolute `from <package>[.sub] import name`: the names may be modules, as relative ones.
    inside = set(code_deps._imports(source, "blocks")[0])
    assert {"chunker", "contracts", "contracts.chunks", "contracts.columns"} <= inside


def test_an_unrelated_module_is_not_declared():
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files("chunk")}
    assert not {f for f in files if f.startswith(("finetune/", "training/"))}
    assert not {f for f in files if f.startswith("tables/")}


def test_third_party_imports_are_top_level_names():
    names = code_deps.third_party_imports("chunk")
    assert {"numpy", "pyarrow"} <= names
    assert not {n for n in names if "." in n} and "retrieval_pretraining" not in names
    # The standard library is no environment's to provide (chunk imports pathlib, at least).
    assert not names & sys.stdlib_module_names, sorted(names & sys.stdlib_module_names)


def test_fine_tuning_does_not_run_the_mining_code():
    """Fine-tuning shares mining's seeded generator (seeding.py), not mining itself: an edit to the
    miner, dense search, FAISS or answer matching must not rerun every fine-tuning job."""
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files("finetune")}
    assert not {"mine.py", "dense_search.py", "faiss_index.py", "answers.py"} & files
    assert "seeding.py" in files


@pytest.mark.parametrize("stage", ["extract", "chunk", "pretrain", "finetune", "encode", "download",
                                   "checkpoints"])
def test_a_published_number_is_no_code_input_of_a_stage_that_only_validates_with_it(stage):
    """config_checks.py checks a table column's benchmark against paper_numbers at parse time
    only: correcting a published number must rerun the tables, not extraction or pre-training."""
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files(stage)}
    assert "config.py" in files and "paper_numbers.py" not in files
    assert "schema_messages.py" not in files  # config_checks.validate's wording, parse time too
    assert "paper_numbers.py" in {Path(f).relative_to(PACKAGE).as_posix()
                                  for f in code_deps.source_files("tables")}



def test_the_whole_config_checks_are_no_rule_code_input():
    """config.py is every rule's code input (module_source adds it): the parse-time validation
    (schema, cross-checks, advisories) lives in a module no stage runs, so correcting a check or
    its message reruns no job. Every rule's declared code is checked."""
    checks = {file for function in ("validate", "cross_check", "advisories", "load_schema")
              for file in _defining(function)}
    assert checks == {"config_checks.py"}
    calls = [call for smk in (PACKAGE.parents[1] / "rules").glob("*.smk")
             for call in re.findall(r"module_source\((\"[^)]*)\)", smk.read_text())]
    calls.append(",".join(map(repr, ("launch", "torchrun", "finetune"))))  # finetune.smk's tuple
    assert len(calls) > 20  # every rule file's code inputs were found (literal entries)
    for call in calls:
        files = {Path(f).relative_to(PACKAGE).as_posix()
                 for f in code_deps.source_files(*ast.literal_eval(f"({call},)"), "config")}
        assert "config.py" in files and not checks & files, call

def _defining(function: str) -> set[str]:
    """The package files that define a top-level function `function`."""
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if any(isinstance(node, ast.FunctionDef) and node.name == function
                   for node in ast.parse(path.read_text()).body)}


@pytest.mark.parametrize("entries", [("launch", "torchrun", "finetune"), ("mine",), ("bm25",),
                                     ("datasets",)])
def test_editing_acc_at_k_scoring_reruns_no_negatives_and_no_fine_tuning(entries):
    """Acc@k's scoring (top_k_accuracy, the measure names) lives apart from the answer rule that
    dataset preparation, the answers negative filter and so every fine-tuning share: an edit to
    scoring must rerun score_run and the tables, not GPU-days of fine-tuning. The scoring files are
    found by what they define, so moving scoring back into a shared module fails here too."""
    scoring = _defining("top_k_accuracy") | _defining("acc_cutoffs")
    assert scoring
    for entry in ("evaluate", "tables"):
        files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files(entry)}
        assert scoring <= files
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files(*entries)}
    assert not scoring & files


@pytest.mark.parametrize("entry", ["audit", "publish"])
def test_editing_the_tokenizer_checks_reruns_no_audit_and_no_publishing(entry):
    """The tokenizer-file checks (auto_tokenizer, check_tokenizer_files) left model_folder.py for
    a module of their own so that the stages that read a model folder's weights and config.json
    but load no tokenizer (audit, publish) do not take them as code: an edit to a tokenizer check
    must rerun what loads a tokenizer (encoding, staging), not every audit. The checks are found
    by what they define, so moving them back into model_folder.py fails here too."""
    checks = _defining("auto_tokenizer") | _defining("check_tokenizer_files")
    assert checks
    for loader in ("encode", "checkpoints"):
        files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files(loader)}
        assert checks <= files
    files = {Path(f).relative_to(PACKAGE).as_posix() for f in code_deps.source_files(entry)}
    assert "model_folder.py" in files  # it reads model folders, so it could take them
    assert not checks & files, sorted(checks & files)
