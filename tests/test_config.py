"""The experiment config: the shipped configs validate, bad values fail naming the key, paths stay inside."""

import copy
import itertools
import json
import re
from pathlib import Path

import pytest
import yaml

from retrieval_pretraining import config as experiment_config
from retrieval_pretraining import config_checks
from retrieval_pretraining import references

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_shipped_demo_config_is_valid(demo):
    config_checks.validate(demo)


def test_every_section_has_a_schema_fragment(demo):
    schema = config_checks.load_schema()
    assert set(demo) == set(schema["properties"]), "config sections and schema fragments disagree"


def test_unknown_key_is_rejected_with_the_known_keys(demo):
    bad = copy.deepcopy(demo)
    bad["corpus"]["max_lenght"] = 128
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    message = str(error.value)
    assert "corpus" in message and "max_lenght" in message and "max_len" in message


def test_a_typo_in_a_file_reference_is_one_line_naming_the_entry(demo):
    """A split's file (a `path` or a `download`): each shape's complaint in one line, with the
    dataset and split it is in, not the unexpected key and then each missing required one."""
    bad = copy.deepcopy(demo)
    entry = next(e for e in bad["datasets"] if e.get("format") == "beir")
    entry["titles"] = {"pth": "titles.tsv"}
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    lines = str(error.value).splitlines()[1:]
    i = bad["datasets"].index(entry)
    assert lines == [f"  config key 'datasets.{i}.titles' (dataset '{entry['name']}'): unknown "
                     "key 'pth'; known keys: download, member, path"], lines


@pytest.mark.parametrize("corpus,said", [
    ({"member": "collection.tsv"}, "'path' is a required property"),
    ({"path": "a.tsv", "download": "a.tsv"}, "is valid under each of"),
    ({"path": 5}, "5 is not of type 'string'"),
])
def test_a_known_key_of_another_shape_is_never_called_unknown(demo, corpus, said):
    """`corpus` is a file (path or download, member) or another entry's (same_as). A mistake that
    misspells no key (member without its file, both path and download, a number for a path) was
    said as 'unknown key member; known keys: same_as': the known keys only of the shape that
    complained of extra keys, the file shape's own complaint dropped. Each shape's is said."""
    bad = copy.deepcopy(demo)
    entry = next(e for e in bad["datasets"] if e.get("format") == "beir")
    entry["corpus"] = corpus
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    message = str(error.value)
    assert "unknown key" not in message and said in message, message


def test_enum_violation_names_the_key_and_allowed_values(demo):
    bad = copy.deepcopy(demo)
    bad["wikipedia"]["source"] = "torrent"
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    assert "wikipedia.source" in str(error.value)
    assert "local" in str(error.value) and "dumps" in str(error.value)


def test_range_violation_names_the_bound(demo):
    bad = copy.deepcopy(demo)
    bad["corpus"]["shards"] = 0
    with pytest.raises(experiment_config.ConfigError, match=r"corpus\.shards.*minimum is 1"):
        config_checks.validate(bad)


def test_a_split_name_with_a_dot_is_refused_saying_why(demo):
    """A file's manifest is named by the part of its name before the first dot
    (artifacts.manifest_path): splits `test` and `test.small` would share qrels-test.manifest.json,
    and a run `dev.small.trec` would write dev.manifest.json, not the declared output."""
    bad = copy.deepcopy(demo)
    bad["datasets"][0]["splits"].append({"name": "test.small"})
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    message = str(error.value)
    assert "datasets.0.splits" in message and "'test.small' does not match" in message, message
    assert "no dots" in message and "test and test.small would share one" in message, message
    # A BEIR user with qrels/test.small.tsv learns how to keep the file (a beir split reads only
    # qrels/<name>.tsv: its `qrels:` key would not help).
    assert "ln -s test.small.tsv qrels/test-small.tsv" in message, message
    assert "a beir split reads only qrels/<name>.tsv" in message, message


@pytest.mark.parametrize("section, key, value", [("corpus", "shards", 2.0), ("corpus", "max_len", 128.0),
                                                ("finetune", "batch_size", 32.0),
                                                ("corpus", "shards", True)])  # a bool is an int
def test_a_count_written_as_a_float_is_refused_at_parse_time(demo, section, key, value):
    # JSON Schema's `integer` admits 2.0; the stage would then fail on range(2.0) without the key.
    bad = copy.deepcopy(demo)
    bad[section][key] = value
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    assert f"'{section}.{key}'" in str(error.value) and "whole number" in str(error.value)
    good = copy.deepcopy(demo)
    good[section][key] = int(value)
    config_checks.validate(good)


@pytest.mark.parametrize("where", ["seed", "datasets subset seed"])
def test_a_seed_beyond_what_every_stage_accepts_is_refused_at_parse_time(demo, where):
    """A seed of 2**64 passed the schema and stopped span sampling with numpy's OverflowError
    (spans.chunk_keys: a uint64); t-SNE's random_state (sklearn) takes no more than 2**32 - 1.
    The largest seed every consumer accepts is valid; one more is refused naming the key and
    the bound."""

    def with_seed(seed):
        config = copy.deepcopy(demo)
        if where == "seed":
            config["seed"] = seed
            return config, "'seed'"
        index = next(i for i, d in enumerate(config["datasets"]) if "subset" in d)
        config["datasets"][index]["subset"]["seed"] = seed
        return config, f"'datasets.{index}.subset.seed'"

    for seed in (2**64, 2**32, -1):
        bad, key = with_seed(seed)
        with pytest.raises(experiment_config.ConfigError) as error:
            config_checks.validate(bad)
        message = str(error.value)
        assert key in message and ("maximum is 4294967295" in message
                                   or "minimum is 0" in message), message
    for seed in (0, 2**32 - 1):
        config_checks.validate(with_seed(seed)[0])


def test_the_largest_valid_seed_is_one_every_seeded_stage_accepts(demo):
    import numpy as np
    from sklearn.utils import check_random_state

    from retrieval_pretraining import seeding, spans
    from retrieval_pretraining.training import optim

    top = config_checks.load_schema()["properties"]["seed"]["maximum"]
    spans.chunk_keys(top, np.arange(3))  # numpy uint64
    check_random_state(top)  # t-SNE's random_state (sklearn): the narrowest
    optim.seed_everything(top)  # random, numpy, torch.manual_seed
    optim.seed_torch(top, 1, 2)
    seeding.rng_for(top, "order", 0)


def test_a_rank_window_without_its_first_rank_is_refused_at_parse_time(demo):
    """mining.rank_window is [lo, hi) with hi null for "up to the depth"; a null lo passed the
    schema and stopped the mining job with Python's "'<' not supported between NoneType and int"."""
    bad = copy.deepcopy(demo)
    bad["mining"]["rank_window"] = [None, 100]
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    assert "mining.rank_window" in str(error.value), str(error.value)
    for window in ([3, None], [1, 100], None):
        good = copy.deepcopy(demo)
        good["mining"]["rank_window"] = window
        config_checks.validate(good)


def test_a_typo_inside_a_block_that_may_be_null_names_the_key(demo):
    bad = copy.deepcopy(demo)
    bad["report"]["analysis"]["tsne"]["querry"] = None
    with pytest.raises(experiment_config.ConfigError) as error:
        config_checks.validate(bad)
    message = str(error.value)
    assert "report.analysis.tsne" in message and "'querry' was unexpected" in message, message
    assert "known keys:" in message and "query" in message
    assert "is not valid under any of the given schemas" not in message, message


def test_missing_section_is_reported(demo):
    bad = copy.deepcopy(demo)
    del bad["extract"]
    with pytest.raises(experiment_config.ConfigError, match="extract"):
        config_checks.validate(bad)


def _zero_shot_unscored(config):
    """A zero-shot target (a second copy of scifact-full) no evaluate.splits entry scores."""
    config["datasets"].append(dict(config["datasets"][1], name="sf2"))
    config["evaluate"]["zero_shot"] = [{"dataset": "sf2", "trained_on": "scifact"}]


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda c: c["spans"][0]["granularities"]["phrase"].update(min_len=20, max_len=8),
            r"spans\.0\.granularities\.phrase.*min_len 20 > max_len 8",
        ),
        (lambda c: c["wikipedia"].update(source="local", parts=[]), r"wikipedia\.parts"),
        (
            lambda c: c["datasets"][0].update(titles={"path": "data/titles.tsv"}),
            r"datasets\.0\.titles': a titles file is joined onto MS MARCO collections only",
        ),
        (  # a beir split's files are its folder's: the key would be ignored without a word
            lambda c: c["datasets"][0]["splits"][0].update(qrels={"path": "data/other.tsv"}),
            r"datasets\.0\.splits\.0\.qrels': a beir split reads queries\.jsonl and "
            r"qrels/train\.tsv of its folder",
        ),
        (lambda c: c["corpus"].update(checkpoint="bert-large"), r"corpus\.checkpoint.*'bert-large'"),
        (lambda c: c["pretrain"].update(checkpoint="bert-large"),
         r"pretrain\.checkpoint.*'bert-large'"),
        (lambda c: c["finetune"]["datasets"][0].update(dataset="nfcorpus"),
         r"finetune\.datasets\.0\.dataset': 'nfcorpus' is not a datasets entry"),
        (lambda c: c["bm25"]["negatives"][0].update(dataset="nfcorpus"),
         r"bm25\.negatives\.0\.dataset': 'nfcorpus' is not a datasets entry"),
        (lambda c: c["evaluate"].update(
            zero_shot=[{"dataset": "scifact-full", "trained_on": "scifact-full"}]),
         r"evaluate\.zero_shot\.0\.trained_on': 'scifact-full' is not fine-tuned on"),
        (_zero_shot_unscored,
         r"evaluate\.zero_shot\.0\.dataset': add an evaluate\.splits entry for 'sf2'"),
        (lambda c: c["bm25"]["negatives"][0].update(dpr_lists=["hard_negative_ctxs"]),
         r"bm25\.negatives\.0\.dpr_lists': read only by source dpr"),
        (lambda c: c["bm25"]["negatives"][0].update(source="dpr"),
         r"bm25\.negatives\.0\.source': dpr reads the negatives DPR's biencoder JSON lists, "
         r"and 'scifact' is format beir"),
        (  # one token past the bound: a phrase of 9 to 8 tokens
            lambda c: c["spans"][0]["granularities"]["phrase"].update(min_len=9, max_len=8),
            r"spans\.0\.granularities\.phrase.*min_len 9 > max_len 8",
        ),
        (
            lambda c: c["datasets"][0]["splits"][0].update(queries={"path": "data/q.jsonl"}),
            r"datasets\.0\.splits\.0\.queries': a beir split reads queries\.jsonl",
        ),
        (
            lambda c: c["pretrain"]["models"][2].update(spans="costa-typo"),
            r"pretrain\.models\.2\.spans.*'costa-typo'.*known: costa",
        ),
        (
            lambda c: c["evaluate"]["splits"][0].update(dataset="nfcorpus"),
            r"evaluate\.splits\.0\.dataset.*'nfcorpus'",
        ),
        (
            lambda c: c["pretrain"]["models"].append({"name": "mlm", "objective": "mlm"}),
            r"pretrain\.models.*'mlm' is used twice",
        ),
        # Corpora: a model naming a missing corpus, a source without what it reads, init order.
        (
            lambda c: c["pretrain"]["models"][1].update(corpus="wikipedia-typo"),
            r"pretrain\.models\.1\.corpus.*'wikipedia-typo' is not a corpus.corpora entry; known: wikipedia",
        ),
        (
            lambda c: c["pretrain"]["models"][1].update(
                corpus=[{"name": "wikipedia", "proportion": 1}, {"name": "scifact", "proportion": 1}]),
            r"pretrain\.models\.1\.corpus\.1\.name.*'scifact'",
        ),
        (lambda c: c["pretrain"].update(corpus="nowhere"), r"pretrain\.corpus.*'nowhere'"),
        (
            lambda c: c["corpus"]["corpora"].append({"name": "sf", "source": "dataset"}),
            r"corpus\.corpora\.1\.dataset': source=dataset needs it",
        ),
        (
            lambda c: c["corpus"]["corpora"].append(
                {"name": "sf", "source": "dataset", "dataset": "nfcorpus"}),
            r"corpus\.corpora\.1\.dataset': 'nfcorpus' is not a datasets entry; known: scifact",
        ),
        (
            lambda c: c["corpus"]["corpora"][0].update(path="data/x.jsonl"),
            r"corpus\.corpora\.0\.path': source=wikipedia does not read it",
        ),
        (
            lambda c: c["pretrain"]["models"][1].update(init="bow"),
            r"pretrain\.models\.1\.init': 'bow' is not a pre-training model listed before 'mlm'",
        ),
        # evaluate.baselines: a name that is one of our systems, a checkpoint that is neither a
        # checkpoints entry nor one of our models, a table row naming no baseline.
        (
            lambda c: c["evaluate"]["baselines"][0].update(name="costa-stage1"),
            r"evaluate\.baselines\.0\.name.*'costa-stage1' is the name of one of our systems",
        ),
        (
            lambda c: c["evaluate"]["baselines"][0].update(name="bm25"),
            r"evaluate\.baselines\.0\.name.*'bm25' is the name of one of our systems",
        ),
        (
            lambda c: c["evaluate"]["baselines"].append(
                copy.deepcopy(c["evaluate"]["baselines"][0])),
            r"'evaluate\.baselines': the name '[^']+' is used twice",
        ),
        (
            lambda c: c["pretrain"]["models"][1].update(
                corpus=[{"name": "wikipedia", "proportion": 1}] * 2),
            r"pretrain\.models\.1\.corpus': 'wikipedia' is listed twice",
        ),
        (
            lambda c: c["corpus"]["corpora"][0].update(checkpoint="bert-large"),
            r"corpus\.corpora\.0\.checkpoint': 'bert-large' is not a checkpoints entry",
        ),
        (
            lambda c: c["corpus"]["corpora"].append(copy.deepcopy(c["corpus"]["corpora"][0])),
            r"'corpus\.corpora': the name 'wikipedia' is used twice",
        ),
        (  # a model initialised from itself
            lambda c: c["pretrain"]["models"][1].update(init="mlm"),
            r"pretrain\.models\.1\.init': 'mlm' is not a pre-training model listed before 'mlm'",
        ),
        (  # bert, objective none: a corpus trains nothing
            lambda c: c["pretrain"]["models"][0].update(corpus="wikipedia"),
            r"pretrain\.models\.0': objective none trains nothing",
        ),
        (
            lambda c: c["evaluate"]["baselines"][0].update(checkpoint="minilm-l12"),
            r"evaluate\.baselines\.0\.checkpoint.*'minilm-l12' is not a checkpoints entry",
        ),
        (
            lambda c: c["evaluate"]["baselines"][0].update(checkpoint="pretrain:retromae"),
            r"evaluate\.baselines\.0\.checkpoint.*'retromae' is not a pretrain\.models entry",
        ),
        (
            lambda c: c["report"]["tables"][-1].update(baseline_rows=["e5-base"]),
            r"baseline_rows.*'e5-base' is not an evaluate\.baselines entry",
        ),
        # A baseline's published number is shown whatever compare_published says: it must name
        # the full corpus (not the demo's 1,500-abstract sample), a split and a measure we score.
        (
            lambda c: c["evaluate"]["baselines"][0]["published"][0].update(dataset="scifact"),
            r"evaluate\.baselines\.0\.published\.0\.dataset.*'scifact' is a sample",
        ),
        (
            lambda c: c["evaluate"]["baselines"][0]["published"][0].update(dataset="scifact-ful"),
            r"evaluate\.baselines\.0\.published\.0\.dataset.*'scifact-ful' is not a datasets",
        ),
        (
            lambda c: c["evaluate"]["baselines"][0]["published"][0].update(split="dev"),
            r"evaluate\.baselines\.0\.published\.0\.split.*'dev' is not a split",
        ),
        (
            lambda c: c["evaluate"]["baselines"][0]["published"][0].update(measure="NDCG@10"),
            r"evaluate\.baselines\.0\.published\.0\.measure.*'NDCG@10' is not measured",
        ),
        # A column's benchmark selects the published numbers beside it: a misspelt one would drop
        # them all, another dataset's would print that benchmark's number beside our scores.
        (
            lambda c: c["report"]["tables"][0]["columns"][0].update(
                benchmark="msmarco-pasage-dev"),
            r"report\.tables\[main\]\.columns\.0\.benchmark': 'msmarco-pasage-dev' is not a "
            r"known benchmark; known: msmarco-passage-dev",
        ),
        (
            lambda c: c["report"]["tables"][0]["columns"][0].update(benchmark="dl19-passage"),
            r"columns\.0\.benchmark': 'dl19-passage' is msmarco-passage/dl19, but the column "
            r"scores scifact/test",
        ),
    ],
)
def test_cross_field_mistakes_fail_at_parse_time(demo, edit, expected):
    bad = copy.deepcopy(demo)
    edit(bad)
    with pytest.raises(experiment_config.ConfigError, match=expected):
        config_checks.validate(bad)


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda c: c["finetune"]["datasets"][0].update(split="trian"),
            r"finetune\.datasets\.0\.split': 'trian' is not a split of 'scifact'; its splits: "
            r"train, test",
        ),
        (
            lambda c: c["evaluate"]["splits"][0].update(split="dev"),
            r"evaluate\.splits\.0\.split': 'dev' is not a split of 'scifact'",
        ),
        (
            lambda c: c["bm25"]["negatives"][0].update(split="Train"),
            r"bm25\.negatives\.0\.split': 'Train' is not a split of 'scifact'",
        ),
        (
            lambda c: c["report"]["analysis"]["tsne"].update(split="train"),
            r"report\.analysis\.tsne\.split': no evaluate\.splits entry scores scifact train",
        ),
        (
            lambda c: c["report"]["stages"][2].update(suffix="stgae2"),
            r"report\.stages\.2\.suffix': 'stgae2' is not a fine-tuning stage",
        ),
        (
            lambda c: c["report"]["stages"].append({"suffix": "stage3", "label": "round 2"}),
            r"report\.stages\.3\.suffix': 'stage3' on 'scifact' would train mining round 2, "
            r"and finetune\.rounds is 1 there",
        ),
        (
            lambda c: c["report"]["analysis"]["tsne"].update(stage="stage 2"),
            r"report\.analysis\.tsne\.stage': 'stage 2' is not a fine-tuning stage",
        ),
        (
            lambda c: c["report"]["significance"]["baselines"][0].update(system="BM25"),
            r"report\.significance\.baselines\.0\.system': 'BM25' is no system the workflow "
            r"builds: bm25, an evaluate\.baselines name \(all-minilm-l6-v2\)",
        ),
        (
            lambda c: c["report"]["tables"][0]["columns"][1].update(dataset="scifact-full"),
            r"report\.tables\[main\]\.columns\.1\.dataset': our models' runs on "
            r"'scifact-full' .* neither fine-tuned on nor an evaluate\.zero_shot target",
        ),
        (
            lambda c: c["finetune"].update(stage1_init="scifcat/stage2"),
            r"finetune\.stage1_init': 'scifcat' in 'scifcat/stage2' is not another "
            r"finetune\.datasets entry",
        ),
        (
            lambda c: c["report"].update(low_resource={
                "dataset": "scifact", "split": "test", "measure": "nDCG@10", "sizes": [100],
                "splits": 2, "models": ["costa"], "system": "{model}-stage1"}),
            r"report\.low_resource\.system': '\{model\}-stage1' gives 'costa-stage1' for model "
            r"costa, size 100, split 0",
        ),
        # Each split of a size must read its own sample's run: a pattern that fixes the sample
        # would average one run K times and show its sd as 0.
        (
            lambda c: c["report"].update(low_resource={
                "dataset": "scifact", "split": "test", "measure": "nDCG@10", "sizes": [100],
                "splits": 2, "models": ["costa"], "system": "{model}-n{size}s0-stage1"}),
            r"report\.low_resource\.system': '\{model\}-n\{size\}s0-stage1' gives "
            r"'costa-n100s0-stage1' for model costa, size 100, split 1",
        ),
        # Each sample's stage is checked, not the first one's alone: stage{split} reads
        # n100s3-stage3, mining round 2 of a one-round dataset.
        (
            lambda c: c["report"].update(low_resource={
                "dataset": "scifact", "split": "test", "measure": "nDCG@10", "sizes": [100],
                "splits": 4, "models": ["costa"],
                "system": "{model}-n{size}s{split}-stage{split}"}),
            r"report\.low_resource\.system': 'n100s3-stage3' on 'scifact' would train mining "
            r"round 2",
        ),
        # Patterns str.format refuses with an AttributeError or a TypeError (an attribute or an
        # index of a field): the same one-line refusal, not a traceback at parse time.
        *[(
            lambda c, system=system: c["report"].update(low_resource={
                "dataset": "scifact", "split": "test", "measure": "nDCG@10", "sizes": [100],
                "splits": 2, "models": ["costa"], "system": system}),
            r"report\.low_resource\.system': '.*' does not format with \{model\}, \{size\} "
            r"and \{split\}",
        ) for system in ("{model.x}-n{size}s{split}-stage1", "{model[x]}-n{size}s{split}-stage1")],
    ],
)
def test_a_split_or_stage_nothing_builds_is_refused_naming_the_key(demo, edit, expected):
    """The rules build what a section names: a misspelt split or stage stopped the dry run at a
    missing file or an input function's error naming no key (a training split: the bm25.negatives
    one), and a stage past `rounds` trained mining rounds no config key asked for."""
    bad = copy.deepcopy(demo)
    edit(bad)
    config_checks.validate(bad)  # a stage reference is no schema or cross-check matter
    with pytest.raises(experiment_config.ConfigError, match=expected):
        references.check(bad)


def test_the_check_and_the_rules_read_one_list_of_a_table_s_systems(demo):
    """rules/report.smk builds the cells of references.report_systems, and the check covers
    table_systems, the same list with the key each system comes from: each baseline kind
    (a fixed system, a model at the table's stages, each row's model at a stage) included."""
    config = copy.deepcopy(demo)
    table = config["report"]["tables"][0]  # rows: null, the significance baselines
    table["rows"] = [{"model": "costa"}]
    systems = references.table_systems(config, table)
    assert systems == [
        ("report.tables[main].bm25", "bm25", ""),
        *[(f"report.stages.{i}.suffix", f"costa-stage{i}", f"stage{i}") for i in range(3)],
        ("report.significance.baselines.0.system", "bm25", ""),
        *[(f"report.stages.{i}.suffix", f"bert-stage{i}", f"stage{i}") for i in range(3)],
        ("report.significance.baselines.2.stage", "costa-stage0", "stage0"),
    ]
    assert references.report_systems(config, table) == [
        ("scifact", system, "test") for _ in table["columns"] for _, system, _ in systems]
    # A column of another dataset and split: its cells are that dataset's and split's runs.
    table["columns"].append({"dataset": "nfcorpus", "split": "dev", "measure": "nDCG@10"})
    cells = references.report_systems(config, table)
    assert cells[-len(systems):] == [("nfcorpus", system, "dev") for _, system, _ in systems]
    assert {(d, s) for d, _, s in cells[:-len(systems)]} == {("scifact", "test")}
    table["columns"].pop()
    table["rows"] = []  # no model rows: no model baselines either
    assert references.table_systems(config, table) == systems[:1] + systems[4:5]


def test_a_fine_tuned_model_nothing_pre_trains_is_refused_where_the_report_lists_its_rows(demo):
    """A table's rows: null reads finetune.models through finetune_models, which refuses a name
    pretrain.models lacks: else the report planned runs of it that nothing builds."""
    config = copy.deepcopy(demo)
    config["finetune"]["models"] = ["nope"]
    with pytest.raises(ValueError, match=r"finetune\.models names \['nope'\], not in pretrain"):
        references.report_systems(config, config["report"]["tables"][0])


def test_a_system_of_a_model_whose_name_extends_another_is_its_own(demo):
    """`costa-x-stage1` is model costa-x's stage1, not costa's stage `x-stage1`."""
    config = copy.deepcopy(demo)
    costa = next(m for m in config["pretrain"]["models"] if m["name"] == "costa")
    config["pretrain"]["models"].append(costa | {"name": "costa-x"})
    config["report"]["significance"]["baselines"].append(
        {"system": "costa-x-stage1", "mark": "*"})
    references.check(config)


def test_the_schema_s_stage1_init_pattern_restates_the_one_stage_pattern():
    """A JSON-Schema pattern is a literal in YAML: held equal to config.STAGE_PATTERN, or the
    schema refuses a stage1_init stage the rules build (or admits one they cannot parse)."""
    schema = experiment_config.section_schema("finetune")["properties"]["stage1_init"]
    assert schema["pattern"] == (
        "^(pretrained|[A-Za-z0-9_.-]+/" + experiment_config.STAGE_PATTERN + ")$")


def test_the_stage_pattern_is_written_once():
    """The rules' {stage} constraint, the system names and the checks read config.STAGE: a copy
    written out elsewhere can drift, so the check accepts a stage the rules cannot parse."""
    root = Path(__file__).resolve().parents[1]
    code = [root / "Snakefile", *sorted((root / "rules").glob("*.smk")),
            *sorted((root / "workflow").rglob("*.py"))]
    assert [str(p.relative_to(root)) for p in code if "stage[0-9]" in p.read_text()] == []
    assert "stage(?P<number>[0-9]+)" in experiment_config.STAGE.pattern


@pytest.mark.parametrize("section, edit, expected", [
    ("report", lambda c: c["stages"][1].update(suffix="stage-1"),
     "config key 'report.stages.1.suffix': 'stage-1' is not a fine-tuning stage"),
    ("evaluate", lambda c: c["splits"][0].update(split="tset"),
     "config key 'evaluate.splits.0.split': 'tset' is not a split of 'scifact'"),
])
def test_a_misspelt_stage_or_split_fails_the_dry_run_naming_the_key(demo, tmp_path, section,
                                                                    edit, expected):
    """The check runs when the workflow parses, before the DAG: the dry run names the key (a
    misspelt evaluate split was reported as columns that no evaluate.splits entry scores)."""
    from workflow_harness import copy_project, snakemake

    block = copy.deepcopy(demo[section])
    edit(block)
    project = copy_project(tmp_path / "project", {section: block})
    result = snakemake(project, "--dry-run", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert expected in output, output


@pytest.mark.parametrize(
    "key, value, measure, expected",
    [
        ("finetune", {"search_depth": 100}, "R@1000",
         "finetune.search_depth is 100 for scifact, shallower than R@1000 of its test split"),
        ("bm25", {"depth": 50}, "AP",  # AP reads the whole run: R@100 is the deepest cutoff
         "bm25.depth is 50 for scifact, shallower than R@100 of its test split"),
    ],
)
def test_a_run_depth_below_a_measured_cutoff_fails_the_dry_run(demo, tmp_path, key, value,
                                                               measure, expected):
    """A depth below a split's deepest cutoff stops the workflow before any job, naming the key
    and the measure: R@1000 on the demo's 100-deep dense runs would be R@100 under R@1000's name."""
    from workflow_harness import copy_project, snakemake

    splits = copy.deepcopy(demo["evaluate"]["splits"])
    splits[0]["measures"].append(measure)
    project = copy_project(tmp_path / "project", {"evaluate": {"splits": splits}, key: value})
    result = snakemake(project, "--dry-run", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert expected in output, output


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda c: c["corpus"]["corpora"][0].update(max_length=128),
         r"corpus\.corpora\.0.*'max_length'.*known keys: .*max_len"),
        (lambda c: c["pretrain"]["models"][1].update(
            corpus=[{"name": "wikipedia", "proportion": 0}]), r"proportion.*exclusiveMinimum is 0"),
        (lambda c: c["pretrain"]["models"][1].update(
            corpus=[{"name": "wikipedia", "share": 1}]), r"'share'"),
    ],
)
def test_corpus_keys_are_validated(demo, edit, expected):
    bad = copy.deepcopy(demo)
    edit(bad)
    with pytest.raises(experiment_config.ConfigError, match=expected):
        config_checks.validate(bad)


def test_the_demo_chunks_its_one_wikipedia_corpus_and_paper_adds_the_bow_msmarco_corpus(demo):
    """The demo's single corpus is the shipped Wikipedia sample; the paper adds the BoW paper's
    in-domain MS MARCO corpus (144 tokens, passage text without the dataset's titles, as the
    authors' collator reads only a record's `text`) and a model continuing from the Wikipedia BoW
    model with its hyper-parameters."""
    from retrieval_pretraining import corpora
    from retrieval_pretraining.pretrain.settings import resolve_model

    assert corpora.names(demo["corpus"]) == ["wikipedia"] == [demo["pretrain"]["corpus"]]
    assert corpora.resolve(demo["corpus"], "wikipedia", demo["datasets"])["max_len"] == 128
    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    marco = corpora.resolve(paper["corpus"], "msmarco-passage", paper["datasets"])
    assert marco["max_len"] == 144 and marco["dataset"]["name"] == "msmarco-passage"
    # The chunk job's title mode is the corpus entry's, not the dataset's `sep` (its encoders').
    assert marco["title"] == "none" and marco["dataset"]["title"] == "sep"
    wikipedia = corpora.resolve(paper["corpus"], "wikipedia", paper["datasets"])
    assert wikipedia["max_len"] == 512 and "title" not in wikipedia
    bow = resolve_model(paper["pretrain"], "bow", seed=0)
    marco_bow = resolve_model(paper["pretrain"], "bow-marco", seed=0)
    assert marco_bow["init"] == "bow" and marco_bow["corpora"] == [
        {"name": "msmarco-passage", "proportion": 1.0}]
    same = {k: v for k, v in marco_bow.items() if k not in ("name", "init", "corpora")}
    assert same == {k: v for k, v in bow.items() if k not in ("name", "corpora")}


def test_paths_inside_the_project_resolve(tmp_path):
    resolved = experiment_config.resolve_path("data/README.md")
    assert resolved == ROOT / "data" / "README.md"


def test_paths_escaping_the_project_are_refused(tmp_path):
    with pytest.raises(experiment_config.ConfigError, match="outside the project"):
        experiment_config.resolve_path("../../etc/passwd")
    with pytest.raises(experiment_config.ConfigError, match="data_root"):
        experiment_config.resolve_path(tmp_path / "dump.xml.bz2")


def test_paths_inside_a_configured_data_root_resolve(tmp_path):
    target = tmp_path / "dump.xml.bz2"
    assert experiment_config.resolve_path(target, data_root=tmp_path) == target.resolve()


def test_the_data_root_itself_and_the_project_itself_resolve(tmp_path):
    """A BEIR dataset's `path` may be the data root (data_root: /data/scifact, path: the same):
    the root is inside itself, as the project is, not refused as lying outside."""
    assert experiment_config.resolve_path(tmp_path, data_root=tmp_path) == tmp_path.resolve()
    assert experiment_config.resolve_path(".") == experiment_config.PROJECT_ROOT


def _scalar_keys(node, prefix=""):
    """Dotted paths of every mapping key (lists are replaced whole by --configfile, so not descended)."""
    if not isinstance(node, dict):
        return set()
    keys = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        keys.add(path)
        keys |= _scalar_keys(value, path + ".")
    return keys


def test_paper_config_is_valid_and_sets_every_key_the_demo_sets(demo):
    """`--configfile paper.yaml` deep-merges over config.yaml: any demo key the paper file omits
    would silently leak demo settings (tiny batches, 2 layers) into a paper-scale run."""
    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    config_checks.validate(paper)
    missing = _scalar_keys(demo) - _scalar_keys(paper)
    assert not missing, f"paper.yaml must set these demo keys explicitly: {sorted(missing)}"
    assert paper["experiment"] == "paper"


def test_the_ablation_overlay_on_the_paper_config_is_valid():
    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    overlay = yaml.safe_load((ROOT / "workflow" / "experiments" / "ablations.yaml").read_text())

    def merge(base, override):  # Snakemake's --configfile semantics: dicts merge, lists replace
        for key, value in override.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value

    merge(paper, overlay)
    config_checks.validate(paper)
    names = [m["name"] for m in paper["pretrain"]["models"]]
    assert len(names) == len(set(names)) and len(names) > 5


EXPERIMENTS = ROOT / "workflow" / "experiments"


def _documented_bases(overlay: Path) -> tuple[str, ...]:
    """The files the header comment's `snakemake --configfile ...` names before `overlay`."""
    header = []
    for line in overlay.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    words = [w for w in " ".join(header).split() if w != "\\"]  # continuation lines joined
    files = list(itertools.takewhile(lambda w: w.endswith(".yaml"),
                                     words[words.index("--configfile") + 1:]))
    assert files[-1] == f"workflow/experiments/{overlay.name}", files
    return tuple(f.removeprefix("workflow/experiments/") for f in files[:-1])


def test_the_overlays_config_checks_knows_are_those_their_header_comments_document():
    """config_checks.OVERLAYS (the hint's source) and each file's documented command agree
    (every experiment file's header names its `--configfile` command)."""
    documented = {path.name: bases for path in sorted(EXPERIMENTS.glob("*.yaml"))
                  if (bases := _documented_bases(path))}
    assert documented == config_checks.OVERLAYS


def test_an_overlay_hint_needs_its_bases_before_it_in_order_and_the_project_s_own_file(tmp_path):
    hints = config_checks.overlay_hints
    paper, bow, recipe = (EXPERIMENTS / n for n in ("paper.yaml", "bow.yaml", "bow-recipe.yaml"))
    assert not hints([paper, bow]) and not hints([paper, tmp_path / "x.yaml", bow, recipe])
    assert hints([bow, paper]) and hints([paper, recipe]) and hints([bow, paper, recipe])
    copy = tmp_path / "bow.yaml"  # a user's own file of that name: maybe a whole config
    copy.write_text(bow.read_text())
    assert not hints([copy])


def test_a_valid_config_given_by_an_overlay_alone_gets_no_hint(demo):
    """The hint comes with a failure only: an overlay that validates alone is the user's call."""
    config_checks.validate(copy.deepcopy(demo), [EXPERIMENTS / "bow.yaml"])


@pytest.fixture(scope="module")
def overlay_project(tmp_path_factory):
    from workflow_harness import copy_project

    return copy_project(tmp_path_factory.mktemp("overlays") / "project")


def _dry_run(project, *names):
    from workflow_harness import snakemake

    files = (str(project / "workflow" / "experiments" / n) for n in names)
    return snakemake(project, "--dry-run", "--configfile", *files, "--", "results/tables.md",
                     check=False)


@pytest.mark.parametrize("given, hint", [
    (["bow.yaml"], "workflow/experiments/bow.yaml is an overlay on paper.yaml: pass --configfile "
     "workflow/experiments/paper.yaml workflow/experiments/bow.yaml"),
    (["paper.yaml", "bow-recipe.yaml"],
     "workflow/experiments/bow-recipe.yaml is an overlay on paper.yaml and bow.yaml: pass "
     "--configfile workflow/experiments/paper.yaml workflow/experiments/bow.yaml "
     "workflow/experiments/bow-recipe.yaml"),
])
def test_an_overlay_without_the_files_before_it_fails_naming_the_command(overlay_project, given,
                                                                          hint):
    """Given alone, an overlay failed on keys only paper.yaml defines ("'t3' is not a spans
    entry"), naming no missing file: the error's last line now says which to pass first."""
    result = _dry_run(overlay_project, *given)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "invalid config:" in output, output
    assert "\n  " + hint + "\n" in output, output


def test_an_overlay_after_the_files_it_needs_plans(overlay_project):
    result = _dry_run(overlay_project, "paper.yaml", "bow.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is an overlay on" not in result.stdout + result.stderr


def test_every_published_number_names_a_benchmark_a_column_can_name():
    """Else a column could never be given that number: BENCHMARKS must list each one."""
    from retrieval_pretraining import paper_numbers

    named = {p.benchmark for p in paper_numbers.PAPER}
    named |= {p.benchmark for values in paper_numbers.BM25.values() for p in values}
    named |= {p.benchmark for a in paper_numbers.ANCHORS.values() for p in a["values"]}
    assert named <= set(paper_numbers.BENCHMARKS), named - set(paper_numbers.BENCHMARKS)


def test_the_ablation_tables_name_the_data_their_columns_score():
    """The titles of the Table 5-7 reproductions do not say which data their "MRR@10" is: each
    column's label must name it, as the passage and document tables' labels do."""
    overlay = yaml.safe_load((ROOT / "workflow" / "experiments" / "ablations.yaml").read_text())
    names = {("msmarco-passage", "dev"): "MS MARCO dev", ("msmarco-passage", "dl19"): "DL19",
             ("msmarco-doc", "dev"): "MS MARCO doc dev", ("msmarco-doc", "dl19"): "DL19 doc"}
    for table in overlay["report"]["tables"]:
        for column in table["columns"]:
            label = column.get("label", "")
            assert label.startswith(names[column["dataset"], column["split"]] + " "), (
                table["name"], label)


def test_the_ablations_run_as_the_costa_paper_ran_them():
    """COSTA section 5.3: every ablation model samples T = 3 spans per granularity, contrasts at
    temperature 1, pre-trains 3 epochs (half the schedule) with the projector on, and changes one of
    these; dropping a granularity keeps 12 spans per text. Table 6 is the projector, Table 7 the
    temperature. Read through the trainer's own resolution of a model entry."""
    from retrieval_pretraining.pretrain.settings import resolve_model

    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    overlay = yaml.safe_load((ROOT / "workflow" / "experiments" / "ablations.yaml").read_text())
    section = {**paper["pretrain"], "models": overlay["pretrain"]["models"]}
    spans = {s["name"]: s for s in paper["spans"]}
    main = {m["name"] for m in paper["pretrain"]["models"]}
    ablated = [m["name"] for m in overlay["pretrain"]["models"] if m["name"] not in main]

    def protocol(name):
        model = resolve_model(section, name, seed=0)
        span = spans[model["spans"]]
        kept = sum(g.get("enabled", True) for g in span["granularities"].values())
        return {"T": span["spans_per_granularity"], "granularities": kept,
                "temperature": model["costa"]["temperature"], "projector": model["costa"]["projector"],
                "epochs": model["trainer"]["epochs"]}

    base = protocol("costa-abl")
    assert base == {"T": 3, "granularities": 4, "temperature": 1.0,
                    "projector": paper["pretrain"]["costa"]["projector"], "epochs": 3}, base
    assert paper["pretrain"]["trainer"]["epochs"] == 6 and base["projector"] != "none"
    for name in ablated:
        variant = protocol(name)
        changed = {k for k in base if variant[k] != base[k]}
        if variant["granularities"] == 3:  # drop one: 12 spans per text, as with all four at T = 3
            assert changed == {"T", "granularities"} and variant["T"] * 3 == 12, (name, variant)
        else:
            assert len(changed) <= 1 and "epochs" not in changed, (name, changed)
    titles = {t["name"]: t["title"] for t in overlay["report"]["tables"]}
    assert "Table 6" in titles["ablation-projector"] and "Table 7" in titles["ablation-temperature"]
    # Table 6, fine-tuning phase: the projector models fine-tuned through their projector reuse
    # their pre-training (the same settings, checked), so only the fine-tuning differs.
    from retrieval_pretraining.pretrain.settings import check_entries

    check_entries(section, seed=0)
    entries = {m["name"]: m for m in overlay["pretrain"]["models"]}
    through = {n: m["reuse_pretraining"] for n, m in entries.items()
               if (m.get("finetune") or {}).get("projector")}
    assert through == {"costa-abl-ftproj": "costa-abl", "costa-abl-linear-ftproj": "costa-abl-linear"}
    assert all(not entries[source].get("finetune") for source in through.values())
    assert "Table 6" in titles["ablation-projector-finetuning"]
    rows = next(t for t in overlay["report"]["tables"] if t["name"] == "ablation-projector-finetuning")
    assert {r["model"] for r in rows["rows"]} == set(through) | set(through.values())


def test_a_config_value_with_an_apostrophe_survives_the_single_quoted_command_line():
    """The rules wrap `stage_argument` in single quotes: an apostrophe in a title would end the
    quoting and break the shell command."""
    import shlex

    params = {"title": "BoW paper's Table 6", "nested": [{"label": "it's"}]}
    argument = experiment_config.stage_argument(params)
    assert "'" not in argument
    assert json.loads(shlex.split(f"--config '{argument}'")[1]) == params



def test_an_unpinned_hub_checkpoint_warns_where_its_commit_is_recorded(demo):
    """revision null on a Hub entry is `main`, which moves: allowed, but the parse says where the
    staged commit is recorded and how to pin it (a package source is fixed by its install)."""
    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    with pytest.warns(config_checks.ConfigWarning) as caught:
        config_checks.validate(paper)
    text = "\n".join(str(w.message) for w in caught)
    assert "'bert-base-uncased'" in text and "'bge-base-en-v1.5'" in text
    assert "all-minilm-l6-v2" not in text
    assert "stats.resolved_revision" in text and "set revision" in text
    # the pin changes the staging rules' params only: the same bytes must not rerun GPU-days
    cleanup = "`snakemake --cleanup-metadata results/checkpoints/{0} results/tokenizers/{0}`"
    assert all(cleanup.format(name) in text for name in ("bert-base-uncased", "bge-base-en-v1.5"))
    pinned = copy.deepcopy(paper)
    for entry in pinned["checkpoints"]:
        entry["revision"] = "a5beb1e3e68b9ab74eb54cfd186867f64f240e1a"
    assert not config_checks.advisories(pinned)


def test_a_measure_no_provider_computes_fails_the_dry_run(demo, tmp_path):
    """NumRel on a split scored at relevance level 2 stops the workflow before any job, naming
    the measure (evaluate.check_computable), not in each scoring job after the runs were built."""
    from workflow_harness import copy_project, snakemake

    splits = copy.deepcopy(demo["evaluate"]["splits"])
    splits[0]["measures"].append("NumRel")
    splits[0]["relevance_level"] = 2
    project = copy_project(tmp_path / "project", {"evaluate": {"splits": splits}})
    result = snakemake(project, "--dry-run", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "'NumRel' at relevance_level 2 is NumRel(rel=2)" in output, output


def test_a_split_listed_twice_in_evaluate_splits_fails_the_dry_run(demo, tmp_path):
    """One metrics file per (dataset, split): scoring read the first entry's measures, the
    report's parse-time check the last one's, so a column naming a measure of the second entry
    passed the plan and failed make_tables after every run, its metrics lacking the measure."""
    from workflow_harness import copy_project, snakemake

    splits = copy.deepcopy(demo["evaluate"]["splits"])
    splits.append({**splits[0], "measures": ["P@5"]})
    project = copy_project(tmp_path / "project", {"evaluate": {"splits": splits}})
    result = snakemake(project, "--dry-run", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    expected = (f"evaluate.splits.{len(splits) - 1} lists {splits[0]['dataset']} "
                f"{splits[0]['split']} again (evaluate.splits.0)")
    assert expected in output, output


@pytest.mark.parametrize("stage1_init", ["pretrained", "scifact-full/stage0"])
def test_a_projector_model_s_untrained_stage1_on_the_pre_trained_encoder_is_refused(demo,
                                                                                  stage1_init):
    """stage1: init on the pre-trained encoder makes stage 1 that folder, which has no
    projector.safetensors: a model fine-tuned through COSTA's projector would mine round 1 (and
    score its stage-1 rows) on the raw [CLS], and train every later stage through the
    projector. A fine-tuned stage as the init (its folder carries the projector) stays
    accepted, and so does the same stage 1 for a model without the projector."""
    config = copy.deepcopy(demo)
    scifact = config["finetune"]["datasets"][0]
    scifact["overrides"] = {"stage1": "init", "stage1_init": stage1_init}
    if stage1_init != "pretrained":
        config["finetune"]["datasets"].append({"dataset": "scifact-full", "split": "test"})
    config_checks.validate(config)
    references.check(config)  # no model embeds through a projector
    costa = next(m for m in config["pretrain"]["models"] if m["name"] == "costa")
    costa["finetune"] = {"projector": True}
    config_checks.validate(config)
    with pytest.raises(experiment_config.ConfigError,
                       match=r"'finetune.stage1' on 'scifact': .*raw \[CLS\].*costa"):
        references.check(config)
    scifact["overrides"]["stage1"] = "bm25"
    references.check(config)  # stage 1 is trained: it embeds through the projector


def _twice(key, *path):
    """An edit listing the first entry of the list at `path` again, with `key` changed."""
    def edit(config):
        entries = config
        for name in path:
            entries = entries[name]
        entries.append(dict(entries[0], **key))
    return edit


def _zero_shot_twice(config):
    config["evaluate"]["zero_shot"] = [{"dataset": "scifact-full", "trained_on": "scifact"}] * 2


@pytest.mark.parametrize("edit, expected", [
    (_twice({"overrides": {"lr": 1e-3}}, "finetune", "datasets"),
     r"finetune\.datasets\.1\.dataset': 'scifact' has an entry already \(finetune\.datasets\.0\)"),
    (_twice({"count": 3}, "bm25", "negatives"),
     r"bm25\.negatives\.1\.dataset': 'scifact' has an entry already \(bm25\.negatives\.0\)"),
    (_zero_shot_twice,
     r"evaluate\.zero_shot\.1\.dataset': 'scifact-full' has an entry already"),
    (lambda c: c["datasets"][0]["splits"].append({"name": "train"}),
     r"datasets\.0\.splits': the split 'train' is listed twice"),
])
def test_a_second_entry_the_rules_would_never_read_is_refused(demo, edit, expected):
    """finetune_entry, bm25_negatives_entry and zero_shot_source read the first entry naming a
    dataset (and a split's jobs the first split of its name): a second entry, with other
    overrides, another negatives count or another trained_on, was accepted and ignored, so the
    run trained with settings the config did not say."""
    bad = copy.deepcopy(demo)
    edit(bad)
    with pytest.raises(experiment_config.ConfigError, match=expected):
        config_checks.validate(bad)


_ENTRY = experiment_config.closed(["name"])
_SLICE = experiment_config.closed(
    [], entries={"type": "array", "items": _ENTRY},
    block={"oneOf": [{"type": "null"}, _ENTRY]}, open={"type": "object", "properties": {}})


@pytest.mark.parametrize("value, named", [
    ({"entries": [{"name": "a"}, {"nmae": "b"}]}, "'entries.1.nmae'"),  # a list's entry
    ({"block": {"nmae": "b"}}, "'block.nmae'"),  # a block that may be null (oneOf)
    ({"entries": [], "nmae": 1}, "'nmae'"),
])
def test_a_stage_refuses_an_unknown_key_at_any_depth_of_its_slice(value, named):
    """refuse_unknown, each stage's own check of its --config slice: a key inside a list's entry
    or inside a nullable block is refused by name, as at the top level."""
    with pytest.raises(experiment_config.ConfigError, match=named):
        experiment_config.refuse_unknown(value, _SLICE, "stage")


def test_a_stage_accepts_any_key_of_an_open_block():
    """A block whose schema does not close it (no additionalProperties: false) takes any key."""
    experiment_config.refuse_unknown({"open": {"anything": 1}, "block": None}, _SLICE, "stage")


@pytest.mark.parametrize("section", ["checkpoints", "spans", "datasets"])
def test_a_name_used_twice_in_a_section_is_refused(demo, section):
    """The rules find an entry by its name (`named`), the first one: a second entry of that name,
    whatever it sets, would be ignored without a word."""
    bad = copy.deepcopy(demo)
    bad[section].append(copy.deepcopy(bad[section][0]))
    name = bad[section][0]["name"]
    with pytest.raises(experiment_config.ConfigError,
                       match=rf"'{section}': the name '{name}' is used twice"):
        config_checks.validate(bad)


def test_a_titles_file_on_a_dpr_corpus_is_refused(demo):
    """Only an MS MARCO collection is joined with a titles file; a DPR corpus (psgs_w100) carries
    its titles, so the file would be ignored."""
    from test_dataset_reruns import _dpr_entry

    bad = copy.deepcopy(demo)
    bad["datasets"].append(_dpr_entry(ROOT) | {"titles": {"path": "data/titles.tsv"}})
    with pytest.raises(experiment_config.ConfigError,
                       match=r"titles': a titles file is joined onto MS MARCO collections only"):
        config_checks.validate(bad)


def test_dpr_negatives_of_a_split_without_its_biencoder_json_are_refused(demo):
    """source dpr reads the lists of the biencoder JSON a split was built from: a qa.csv split
    (`questions`) has none, and the negatives would be built from nothing."""
    from test_dataset_reruns import DPR, _dpr_entry

    bad = copy.deepcopy(demo)
    bad["datasets"].append(_dpr_entry(ROOT))
    bad["bm25"]["negatives"].append(
        {"dataset": DPR, "split": "test", "source": "dpr", "count": 30})
    with pytest.raises(experiment_config.ConfigError, match=r"bm25\.negatives\.1\.split': "
                       r"source dpr reads the split's biencoder JSON"):
        config_checks.validate(bad)


def test_a_span_granularity_of_one_length_is_valid(demo):
    good = copy.deepcopy(demo)
    good["spans"][0]["granularities"]["phrase"].update(min_len=8, max_len=8)
    config_checks.validate(good)


def _setter(path, value):
    """An edit setting the key at dotted `path` (list indexes as numbers) to `value`; DELETE
    removes it."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]

    def edit(config):
        node = config
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return edit


DELETE = object()


@pytest.mark.parametrize("path, bad, good", [
    ("finetune.q_len", 3, 4),  # the stage's own floor (retrieval_settings: q_len >= 4)
    ("bm25.b", 1.01, 1),
    ("finetune.temperature", 0, 0.01),  # scores are divided by it
    ("spans.0.beta_alpha", 0, 0.5),  # Beta(0, .) is no distribution
    ("bm25.negatives.0.count", 0, 1),
    ("mining.num_negatives", 0, 1),
    ("finetune.min_lr_ratio", 1, 0.5),  # the decay would end at lr itself: no decay
    ("finetune.datasets", [], None),
    ("finetune.dtype", DELETE, None),  # required: the encoding slice would fall back unsaid
])
def test_a_value_past_its_schema_bound_is_refused_before_any_job_runs(demo, path, bad, good):
    """Each bound of the schema, one step past it: refused when the workflow parses, naming the
    key (a stage would refuse it hours in, or run with it); the bound itself is accepted."""
    config = copy.deepcopy(demo)
    _setter(path, bad)(config)
    with pytest.raises(experiment_config.ConfigError, match=re.escape(f"'{path}")
                       if bad is not DELETE else "dtype"):
        config_checks.validate(config)
    if good is not None:
        config = copy.deepcopy(demo)
        _setter(path, good)(config)
        config_checks.validate(config)


@pytest.mark.parametrize("entry, key", [
    ({"name": "scifact-2", "same_as": "scifact", "exclude_query_id": False}, "exclude_query_id"),
])
def test_an_alias_setting_what_is_its_collection_s_is_refused(demo, entry, key):
    config = copy.deepcopy(demo)
    config["datasets"].append(entry)
    with pytest.raises(experiment_config.ConfigError, match=key):
        config_checks.validate(config)


def test_a_misspelt_fine_tuning_override_is_refused_at_parse_time(demo):
    config = copy.deepcopy(demo)
    config["finetune"]["datasets"][0]["overrides"] = {"q_lenn": 64}
    with pytest.raises(experiment_config.ConfigError, match="q_lenn"):
        config_checks.validate(config)


@pytest.mark.parametrize("key, past, bound", [
    ("q_len", 3, 4), ("p_len", 7, 8), ("encode_batch_size", 0, 1),
    ("pooling", "max", "mean"), ("similarity", "l2", "cosine"), ("dtype", "bfloat16", "float32"),
])
def test_the_retrieval_knobs_are_checked_by_their_stage_as_the_schema_checks_them(key, past, bound):
    """Each stage builds its RetrievalSettings from the slice on its command line, which no
    parse-time check saw when the stage is run by hand: one step past the schema's bound is
    refused there too, naming the knob (a dtype of bfloat16 stored vectors numpy cannot read
    back), and the schema's bound is accepted."""
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    schema = experiment_config.section_schema("finetune")["$defs"]["knobs"][key]
    assert (schema["minimum"] == bound if "minimum" in schema
            else bound in schema["enum"] and past not in schema["enum"])
    with pytest.raises(experiment_config.ConfigError, match=f"finetune.{key} {past!r}"):
        RetrievalSettings(**{key: past})
    assert getattr(RetrievalSettings(**{key: bound}), key) == bound


def test_the_retrieval_defaults_are_the_reference_s_the_schema_states():
    """RetrievalSettings' defaults are what a slice without the knob gets, and what the card of
    a not-yet-fine-tuned export and mteb_eval (a folder stating none) use: the reference's
    (REFERENCE.md), as the schema's descriptions state them."""
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    knobs = experiment_config.section_schema("finetune")["$defs"]["knobs"]
    defaults = RetrievalSettings()
    for key in ("q_len", "p_len"):
        stated = re.search(r"reference (\d+)", knobs[key]["description"])
        assert getattr(defaults, key) == int(stated[1]), key
    assert (defaults.pooling, defaults.similarity) == ("cls", "dot")
    assert "[CLS] (reference)" in knobs["pooling"]["description"]
    assert "dot product (reference)" in knobs["similarity"]["description"]
