"""Incremental reruns of the data stages, asserted through Snakemake's own dry-run plan.

Users rerun the workflow after changing one stage; these tests pin down that exactly that stage
and what depends on it reruns, and nothing upstream (issues 2 and 3, "done when").
"""

import re
import shutil
from pathlib import Path

import pytest
from retrieval_pretraining import config_checks

from workflow_harness import copy_project, edit_config, planned_rules, snakemake

SPANS_TARGET = "results/corpus/wikipedia/spans/costa/shard-0000.parquet"
ARTICLES_TARGET = "results/wikipedia/articles/enwiki-sample.parquet"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A project copy whose data stages (dump -> articles -> chunks -> spans) have run once."""
    project = copy_project(tmp_path_factory.mktemp("reruns") / "project")
    snakemake(project, SPANS_TARGET, "results/corpus/wikipedia/spans/costa/shard-0001.parquet")
    return project


def test_a_finished_run_has_nothing_to_do(finished):
    assert planned_rules(finished, SPANS_TARGET) == {}


@pytest.mark.parametrize("how", ["move", "copy"])
def test_a_moved_or_copied_project_has_nothing_to_do(finished, tmp_path, how):
    """Results trees get moved or copied (scratch to project space, a colleague's copy): with
    the code inputs recorded as absolute paths, either reran every job ("Set of input files has
    changed")."""
    elsewhere = tmp_path / "elsewhere"
    if how == "copy":  # `cp -a`: times kept, links copied as links
        shutil.copytree(finished, elsewhere, symlinks=True)
        assert planned_rules(elsewhere, SPANS_TARGET) == {}
        return
    finished.rename(elsewhere)  # `mv`: the same files, times and metadata
    try:
        assert planned_rules(elsewhere, SPANS_TARGET) == {}
    finally:
        elsewhere.rename(finished)


def test_editing_the_extraction_code_reruns_extraction_and_what_depends_on_it(finished):
    module = finished / "workflow" / "retrieval_pretraining" / "extract.py"
    original = module.read_text()
    module.write_text(original + "\n# an edit\n")
    try:
        plan = planned_rules(finished, ARTICLES_TARGET)
        assert plan == {"extract_articles": 1}, plan
        downstream = planned_rules(finished, SPANS_TARGET)
        assert "download_dump_part" not in downstream and "stage_checkpoint" not in downstream
        assert {"extract_articles", "chunk_articles", "sample_spans"} <= set(downstream)
    finally:
        module.write_text(original)
    assert planned_rules(finished, SPANS_TARGET) == {}


def test_editing_how_audit_shows_chunks_reruns_nothing_but_their_schema_reruns_chunking(finished):
    """A writer imports its contract's `__init__` (schema, validator), never audit code."""
    contracts = finished / "workflow" / "retrieval_pretraining" / "contracts"
    for module, expected in [
        (contracts / "chunks" / "audit.py", set()),
        (contracts / "base.py", set()),
        (contracts / "chunks" / "__init__.py", {"chunk_articles", "sample_spans"}),
    ]:
        original = module.read_text()
        module.write_text(original + "\n# an edit\n")
        try:
            plan = planned_rules(finished, SPANS_TARGET)
            assert set(plan) == expected, (module.relative_to(contracts), plan)
        finally:
            module.write_text(original)


def test_editing_the_span_audit_reruns_no_span_index(finished):
    """The audit's plot and sample are rule audit_spans' alone: the shards pre-training reads stay
    (no new modification time, so no pre-training reruns either)."""
    module = finished / "workflow" / "retrieval_pretraining" / "span_audit.py"
    original = module.read_text()
    module.write_text(original + "\n# an edit\n")
    try:
        assert planned_rules(finished, SPANS_TARGET) == {}
    finally:
        module.write_text(original)


def test_changing_an_extraction_parameter_reruns_extraction_only_upstream(finished):
    original = edit_config(finished, lambda c: c["extract"].update(min_chars=50))
    try:
        plan = planned_rules(finished, ARTICLES_TARGET)
        assert plan == {"extract_articles": 1}, plan
    finally:
        (finished / "config.yaml").write_text(original)


def test_changing_a_span_parameter_reruns_only_the_span_index(finished):
    def edit(config):
        config["spans"][0]["beta_alpha"] = 3.0

    original = edit_config(finished, edit)
    try:
        plan = planned_rules(finished, SPANS_TARGET)
        assert plan == {"sample_spans": 1}, plan
    finally:
        (finished / "config.yaml").write_text(original)


def test_changing_max_len_reruns_chunking_and_everything_after(finished):
    original = edit_config(finished, lambda c: c["corpus"].update(max_len=96))
    try:
        plan = planned_rules(finished, SPANS_TARGET)
        assert set(plan) == {"chunk_articles", "sample_spans"}, plan
    finally:
        (finished / "config.yaml").write_text(original)


def test_truncating_the_encoder_reruns_no_corpus_stage(finished):
    """The corpus stages read the tokenizer alone: num_layers restages the checkpoint only."""
    # The data stages ran without the encoder's weights being staged at all.
    assert planned_rules(finished, "results/checkpoints/minilm-l1") == {"stage_checkpoint": 1}
    original = edit_config(finished, lambda c: c["checkpoints"][0].update(num_layers=1))
    try:
        assert planned_rules(finished, SPANS_TARGET) == {}
    finally:
        (finished / "config.yaml").write_text(original)


def test_changing_the_tokenizer_source_reruns_the_corpus_stages(finished):
    def edit(config):
        config["checkpoints"][0]["revision"] = "main"  # a different tokenizer version

    original = edit_config(finished, edit)
    try:
        plan = planned_rules(finished, SPANS_TARGET)
        assert set(plan) == {"stage_tokenizer", "chunk_articles", "sample_spans"}, plan
    finally:
        (finished / "config.yaml").write_text(original)


def test_pinning_the_staged_commit_as_the_config_warning_says_reruns_nothing(finished, tmp_path):
    """A Hub checkpoint on `main` warns: set revision to the staged commit, then clean the staging
    folders' metadata. The pin changes the staging rules' params, not their bytes; without the
    cleanup it restages them and reruns every job after them. Fails if a Snakemake upgrade keeps
    old params through --cleanup-metadata, or a later rule puts the revision in its own params."""
    unpinned = {"name": "minilm-l1", "source": "hub", "location": "x/y", "revision": None}
    [advice] = config_checks.advisories({"checkpoints": [unpinned]})
    [command] = re.findall(r"`snakemake (--cleanup-metadata [^`]*)`", advice)
    # Not a copy of the project (its results would be copied too): the fixture's own metadata,
    # put back afterwards for the tests that need its recorded params.
    metadata = finished / ".snakemake" / "metadata"
    shutil.copytree(metadata, tmp_path / "metadata")
    original = edit_config(finished, lambda c: c["checkpoints"][0].update(revision="a" * 40))
    try:
        pinned = {"stage_tokenizer", "chunk_articles", "sample_spans"}
        assert set(planned_rules(finished, SPANS_TARGET)) == pinned
        cleanup = snakemake(finished, *command.split(), check=False)
        # The demo chunks with the tokenizer alone: the weights folder was never staged, so
        # Snakemake says it has no metadata (exit 1) and still cleans the tokenizer's.
        assert cleanup.returncode == 1
        unknown = cleanup.stderr.split("Files:")[-1]
        assert "results/checkpoints/minilm-l1" in unknown
        assert "results/tokenizers/minilm-l1" not in unknown
        assert planned_rules(finished, SPANS_TARGET) == {}
    finally:
        (finished / "config.yaml").write_text(original)
        shutil.rmtree(metadata)
        shutil.copytree(tmp_path / "metadata", metadata)
    assert planned_rules(finished, SPANS_TARGET) == {}


@pytest.mark.parametrize("section", ["extract", "corpus"])
def test_changing_the_process_count_reruns_nothing(finished, section):
    """Process counts change speed, not results, so they are not rerun triggers."""
    original = edit_config(finished, lambda c: c[section].update(processes=1))
    try:
        assert planned_rules(finished, SPANS_TARGET) == {}
    finally:
        (finished / "config.yaml").write_text(original)
