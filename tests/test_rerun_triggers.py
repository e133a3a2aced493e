"""Which config edits rerun which jobs, read from the params Snakemake compares for its `params`
rerun trigger (no profile narrows --rerun-triggers): a knob of speed, memory or logging that cannot
change a job's outputs must not be in its params (it travels as a resource), or the edit reruns
that job and, by modification time, everything after it. Likewise a local dump file's modification
time, where a checksum fixes its content.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workflow_harness import copy_project, edit_config, planned_params, planned_rules


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("rerun-triggers") / "project")


@pytest.fixture(scope="module")
def base(project) -> dict:
    return planned_params(project, "all")


def edited_plan(project: Path, edit, target: str = "all") -> dict:
    """The plan of `target` with `edit` (a function of the config dict) applied, then undone."""
    original = edit_config(project, edit)
    try:
        return planned_params(project, target)
    finally:
        (project / "config.yaml").write_text(original)


def rerun_by_params(base: dict, edited: dict, rule: str) -> list[str]:
    """The outputs of the jobs of `rule` whose params differ between the two plans."""
    jobs = [key for key in base if key[0] == rule]
    assert jobs, f"no {rule} job in the plan"
    return [key[1] for key in jobs if base[key]["params"] != edited[key]["params"]]


def test_no_job_records_where_the_project_lies(project, base):
    """Snakemake reruns a job whose recorded input paths, params or code differ from the current
    ones: one naming the project's folder changes when the project is moved or copied (results
    from scratch to project space), and every job reran ("Set of input files has changed": the
    code inputs were absolute paths). The shell prefix's PYTHONPATH is no part of the code."""
    folders = {str(project), str(project.resolve())}
    named = sorted({(rule, value) for (rule, _), job in base.items()
                    for value in (*job["input"], *job["params"], job["code"] or "")
                    if any(folder in value for folder in folders)})
    assert named == [], named[:5]


def _trainer(**values):
    return lambda config: config["pretrain"]["trainer"].update(values)


@pytest.mark.parametrize("knob, value", [("num_workers", 3), ("checkpoint_every", 7),
                                         ("tensorboard", True)])
def test_a_pretraining_knob_that_cannot_change_the_weights_reruns_no_pretraining(
        project, base, knob, value):
    assert rerun_by_params(base, edited_plan(project, _trainer(**{knob: value})),
                           "pretrain_model") == []


def test_a_pretraining_learning_rate_reruns_every_pretraining(project, base):
    edited = edited_plan(project, _trainer(lr=3e-4))
    assert len(rerun_by_params(base, edited, "pretrain_model")) == 4


def test_the_trainer_still_receives_the_options_kept_out_of_the_params(project, monkeypatch):
    """pretrain_model passes them with --trainer-options; the CLI puts them back in the trainer
    block before anything reads them."""
    import json

    from retrieval_pretraining.pretrain import __main__ as cli
    from retrieval_pretraining.config import ConfigError
    from retrieval_pretraining.pretrain import train
    from retrieval_pretraining.pretrain.settings import merge_runtime

    received = {}
    monkeypatch.setattr(train, "train", lambda settings, **kw: received.update(settings) or 0)
    command = _pretrain_command(project, "mlm")
    config = json.loads(command[command.index("--config") + 1])
    options = json.loads(command[command.index("--trainer-options") + 1])
    assert "num_workers" not in config["trainer"] and options["num_workers"] == 1
    cli.main(["--config", json.dumps(config), "--trainer-options", json.dumps(options),
              "--checkpoint", "c", "--chunks", "s.parquet", "--encoder", "e", "--metrics", "m",
              "--plot", "p", "--state", "s"])
    assert received["trainer"] == config["trainer"] | options
    assert {"num_workers", "checkpoint_every"} <= received["trainer"].keys()
    with pytest.raises(ConfigError, match="lr"):  # a weight-changing key stays in --config
        merge_runtime(config, {"lr": 1})


def _pretrain_command(project: Path, model: str) -> list[str]:
    """pretrain_model's command line for `model`, from a dry run."""
    import shlex

    from workflow_harness import snakemake

    out = snakemake(project, "--dry-run", "--printshellcmds", "--forceall",
                    f"results/pretrain/{model}/encoder").stdout
    line = next(line for line in out.splitlines() if "--trainer-options" in line)
    return shlex.split(line.split("Shell command: ", 1)[-1])


def _bm25(**values):
    return lambda config: config["bm25"].update(values)


@pytest.mark.parametrize("knob, value", [("threads", 3), ("index_threads", 3),
                                         ("java_heap", "2g"), ("batch_size", 50), ("depth", 500)])
def test_a_bm25_speed_or_memory_knob_rebuilds_no_index_and_no_negatives(project, base, knob, value):
    """A rewritten negatives.parquet reruns every fine-tuning; the top-level depth is the
    evaluation runs' (the negatives have their own)."""
    edited = edited_plan(project, _bm25(**{knob: value}))
    assert rerun_by_params(base, edited, "build_bm25_index") == []
    assert rerun_by_params(base, edited, "bm25_negatives") == []
    assert len(rerun_by_params(base, edited, "bm25_search")) == (knob == "depth")


def test_negatives_from_triples_do_not_rerun_with_the_bm25_scoring(project):
    def triples(config):
        config["bm25"]["negatives"][0].update(source="triples", triples={"download": "t.tsv.gz"})
        scifact = next(d for d in config["datasets"] if d["name"] == "scifact")
        scifact["downloads"] = [{"file": "t.tsv.gz", "url": "file:///nonexistent/t.tsv.gz"}]

    def and_k1(config):
        triples(config)
        config["bm25"]["k1"] = 1.2

    before, after = edited_plan(project, triples), edited_plan(project, and_k1)
    assert rerun_by_params(before, after, "bm25_negatives") == []
    assert len(rerun_by_params(before, after, "bm25_search")) == 1


def test_linking_local_dump_files_instead_of_copying_them_fetches_nothing_again(project, base):
    edited = edited_plan(project, lambda config: config["wikipedia"].update(local_files="symlink"))
    assert rerun_by_params(base, edited, "download_dump_part") == []


DUMP_FILES = {("pinned", "part"): "results/wikipedia/dump/pinned.xml.bz2",
              ("pinned", "index"): "results/wikipedia/dump/pinned.index.txt.bz2",
              ("unpinned", "part"): "results/wikipedia/dump/unpinned.xml.bz2",
              ("unpinned", "index"): "results/wikipedia/dump/unpinned.index.txt.bz2"}


@pytest.fixture(scope="module")
def fetched(tmp_path_factory) -> Path:
    """A project copy whose dump files (a part pinned by sha1 and one not, each with an index of
    its own, pinned or not as the part) have been fetched from local files."""
    import shutil

    import yaml
    from workflow_harness import snakemake

    project = copy_project(tmp_path_factory.mktemp("local-dump") / "project")
    # The shipped sample (1.7 MB) is over Snakemake's checksum limit (1 MB), so its modification
    # time decides, as a 20 GB part's would; each file here is a copy of it.
    sample = yaml.safe_load((project / "config.yaml").read_text())["wikipedia"]["parts"][0]
    parts = []
    for name in ("pinned", "unpinned"):
        entry = {"name": name}
        for key, file in (("", f"{name}.xml.bz2"), ("index_", f"{name}.index.bz2")):
            shutil.copyfile(project / sample["url"], project / "data" / "wikipedia" / file)
            entry[f"{key}url"] = f"data/wikipedia/{file}"
            if name == "pinned":
                entry[f"{key}sha1"] = sample["sha1"]
        parts.append(entry)
    edit_config(project, lambda config: config["wikipedia"].update(parts=parts))
    snakemake(project, *DUMP_FILES.values())
    return project


@pytest.mark.parametrize("pin", ["pinned", "unpinned"])
@pytest.mark.parametrize("file", ["part", "index"])
def test_a_touched_local_dump_file_is_fetched_again_only_when_no_checksum_pins_it(
        fetched, pin, file):
    """A cluster's anti-purge touch, `cp` without -p or a move to another file system makes a
    local dump newer than its copy; fetching it again reruns extraction and everything after it
    (~480 GPU-hours at paper scale). A pinned file's content is the checksum the fetch verifies;
    an unpinned one's modification time is the only sign that it was replaced."""
    import os

    source = fetched / "data" / "wikipedia" / (f"{pin}.xml.bz2" if file == "part"
                                               else f"{pin}.index.bz2")
    before = source.stat()
    later = (fetched / DUMP_FILES[pin, file]).stat().st_mtime + 60
    os.utime(source, (later, later))
    try:
        plan = planned_rules(fetched, *DUMP_FILES.values())
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    rule = "download_dump_part" if file == "part" else "download_dump_index"
    assert plan == ({} if pin == "pinned" else {rule: 1}), plan
    assert planned_rules(fetched, *DUMP_FILES.values()) == {}


@pytest.mark.parametrize("edit", [
    lambda config: config["finetune"].update(search_depth=150),
    lambda config: config["mining"]["index"].update(use_gpu="never"),
    lambda config: [d.update(exclude_query_id=not d.get("exclude_query_id"))
                    for d in config["datasets"]],
], ids=["search_depth", "use_gpu", "exclude_query_id"])
def test_a_search_knob_reencodes_no_baseline(project, base, edit):
    """Each baseline re-encodes the whole corpus (8.8M passages at paper scale)."""
    edited = edited_plan(project, edit)
    assert rerun_by_params(base, edited, "encode_baseline_shard") == []
    assert len(rerun_by_params(base, edited, "baseline_search")) == 1


def test_searching_on_the_gpu_or_not_rebuilds_no_index(project, base):
    """faiss_index reads use_gpu at search time only."""
    edited = edited_plan(project, lambda config: config["mining"]["index"].update(use_gpu="never"))
    assert rerun_by_params(base, edited, "build_dense_index") == []
    assert rerun_by_params(base, edited, "build_baseline_index") == []


@pytest.mark.parametrize("rule", ["token_coverage", "cpdae_top_words"])
def test_the_analyses_declare_the_heads_they_read(project, base, rule):
    """They read heads.safetensors beside each encoder: retraining a model must rerun them."""
    job = next(job for key, job in base.items() if key[0] == rule)
    encoders = [path for path in job["input"] if path.endswith("/encoder")]
    assert encoders
    for encoder in encoders:
        assert encoder.removesuffix("encoder") + "heads.safetensors" in job["input"]


def test_the_rules_pass_bm25_the_runtime_keys_it_accepts():
    """The BM25 knobs the rules send as `--runtime` (not params) are the ones bm25.py accepts
    there, from its one list: a key in a copy only would be a trigger again, or refused. No rule
    file holds a list of runtime keys of its own (a tuple or list literal naming two or more), and
    the one that sends them takes bm25.RUNTIME_KEYS."""
    import re

    from retrieval_pretraining import bm25

    rules = Path(__file__).resolve().parents[1] / "rules"
    literal = re.compile(r"[(\[]\s*((?:[\"']\w+[\"']\s*,\s*)+[\"']\w+[\"']\s*,?\s*)[)\]]")
    for path in rules.glob("*.smk"):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        for names in literal.findall(code):
            copied = set(re.findall(r"\w+", names)) & set(bm25.RUNTIME_KEYS)
            assert len(copied) < 2, f"{path.name} lists BM25 runtime keys {sorted(copied)}"
    retrieval = (rules / "retrieval.smk").read_text()
    assert re.search(r"^from retrieval_pretraining\.bm25 import RUNTIME_KEYS as BM25_RUNTIME$",
                     retrieval, re.M)
    assert "for k in BM25_RUNTIME if k in settings" in retrieval  # what bm25_runtime sends


DENSE_RULES = ("encode_corpus_shard", "build_dense_index", "mine_hard_negatives", "dense_search",
               "finetune_stage2", "encode_baseline_shard", "baseline_search")


def test_an_encoding_batch_size_reencodes_mines_and_retrains_nothing(project, base):
    """encode.py halves it itself after an out-of-memory error: lowering it by hand must not
    re-encode a corpus, since new vectors rebuild the index, re-mine the hard negatives and so
    rerun every fine-tuning stage trained on them (GPU-hours at paper scale)."""
    edited = edited_plan(project, lambda config: config["finetune"].update(encode_batch_size=32))
    for rule in DENSE_RULES:
        assert rerun_by_params(base, edited, rule) == [], rule
        assert all(base[key]["input"] == edited[key]["input"] for key in base if key[0] == rule)


def test_a_vector_dtype_reencodes_every_corpus(project, base):
    """float16 vectors rank differently from float32 ones: dtype stays a rerun trigger (the README
    says to set it before the first run)."""
    edited = edited_plan(project, lambda config: config["finetune"].update(dtype="float32"))
    for rule in ("encode_corpus_shard", "encode_baseline_shard"):
        assert len(rerun_by_params(base, edited, rule)) == sum(key[0] == rule for key in base)


def test_a_query_length_reencodes_no_corpus_but_reruns_what_encodes_queries(project, base):
    """A corpus encoding reads passages only: q_len in its params re-encoded every corpus (hours
    of GPU at MS MARCO scale) and so rebuilt every index, for the same vectors. Mining and the
    searches encode queries at q_len: they rerun. Likewise a baseline's own q_len and query
    prefix; its passage prefix does re-encode its corpus."""
    def count(rule):
        return sum(key[0] == rule for key in base)

    def baseline(**values):
        return lambda config: config["evaluate"]["baselines"][0].update(values)

    edited = edited_plan(project, lambda config: config["finetune"].update(q_len=48))
    for rule in ("encode_corpus_shard", "build_dense_index"):
        assert rerun_by_params(base, edited, rule) == [], rule
    for rule in ("mine_hard_negatives", "dense_search"):
        assert len(rerun_by_params(base, edited, rule)) == count(rule), rule
    for edit in (baseline(q_len=128), baseline(query_prefix="query: ")):
        edited = edited_plan(project, edit)
        for rule in ("encode_baseline_shard", "build_baseline_index"):
            assert rerun_by_params(base, edited, rule) == [], rule
        assert len(rerun_by_params(base, edited, "baseline_search")) == count("baseline_search")
    edited = edited_plan(project, baseline(passage_prefix="passage: "))
    assert len(rerun_by_params(base, edited, "encode_baseline_shard")) == count(
        "encode_baseline_shard")


def test_encoding_still_receives_the_batch_size_kept_out_of_the_params(project, monkeypatch,
                                                                      capsys):
    """encode_corpus_shard passes it with --runtime; encode.py merges it into its slice, and
    refuses a knob that decides the vectors there."""
    import json
    import shlex

    import yaml
    from workflow_harness import snakemake

    from retrieval_pretraining import encode

    out = snakemake(project, "--dry-run", "--printshellcmds", "--forceall",
                    "all").stdout
    line = next(line for line in out.splitlines() if "retrieval_pretraining.encode " in line)
    command = shlex.split(line.split("Shell command: ", 1)[-1])
    config = json.loads(command[command.index("--config") + 1])
    runtime = json.loads(command[command.index("--runtime") + 1])
    batch_size = yaml.safe_load((project / "config.yaml").read_text())["finetune"][
        "encode_batch_size"]
    assert "encode_batch_size" not in config and runtime == {"encode_batch_size": batch_size}
    received = {}
    monkeypatch.setattr(encode, "encode_corpus_shard", lambda *a: received.update(a[-1]) or {})
    start = command.index("--", command.index("retrieval_pretraining.encode"))  # claim_run's
    argv = command[start + 1:command.index("&>")]
    encode.main(argv)
    assert received == config | runtime
    argv[argv.index("--runtime") + 1] = json.dumps({"dtype": "float32"})
    with pytest.raises(SystemExit):  # a knob that decides the vectors belongs in the params
        encode.main(argv)
    assert "dtype" in capsys.readouterr().err


def test_a_cache_chunk_that_covers_the_contrast_set_reruns_no_fine_tuning(project, base):
    """finetune.cache_chunk at or above a contrast set's queries (the demo's batch 32 in one set)
    caches on no GPU count: each step is null's, and a state resumes under either. Its params
    changed all the same, and Snakemake reran every fine-tuning job from step 0 (hours at paper
    scale); the rules hand such a key on as null. One below the set caches: it reruns them."""
    def chunk(value):
        return lambda config: config["finetune"].update(cache_chunk=value)

    rules = ("finetune_stage1", "finetune_stage2")
    for value in (32, 1000):
        edited = edited_plan(project, chunk(value))
        for rule in rules:
            assert rerun_by_params(base, edited, rule) == [], (value, rule)
    edited = edited_plan(project, chunk(16))
    for rule in rules:
        assert len(rerun_by_params(base, edited, rule)) == sum(key[0] == rule for key in base)


# The rules that declare no code: a fetched file is the bytes its checksum names, whichever code
# fetched it, and `dump_date: latest` is resolved once (ARCHITECTURE.md, decisions table).
FETCH_RULES = ("download_dataset_file", "download_dump_part", "download_dump_index",
               "fetch_dumpstatus")


def declared_code_mistakes(plan: dict) -> tuple[dict, set]:
    """({rule: {"undeclared": files, "not run": files}}, the rules checked) over a planned_params
    plan: a job's `code` inputs against the package files of the modules its command runs."""
    import re

    from retrieval_pretraining import code_deps

    root = code_deps.PACKAGE_DIR.parents[1]
    package = str(code_deps.PACKAGE_DIR.relative_to(root)) + "/"
    module = re.compile(r"(?:python -m|--module) retrieval_pretraining\.([\w.]+)")
    checked, wrong = set(), {}
    for (rule, _), job in plan.items():
        entries = set(module.findall(job["code"] or ""))
        if not entries or rule in FETCH_RULES:
            continue
        if "launch" in entries:
            entries.add("torchrun")
        expected = {str(Path(path).relative_to(root))
                    for path in code_deps.source_files(*entries, "config")}
        declared = {p for p in job["input"] if p.startswith(package) and p.endswith(".py")}
        if declared != expected:
            wrong[rule] = {"undeclared": sorted(expected - declared),
                           "not run": sorted(declared - expected)}
        checked.add(rule)
    return wrong, checked


def test_every_job_declares_the_code_its_command_runs_and_no_other(base):
    """A job's `code` inputs are the package files of the modules its command runs (`python -m`
    and the launchers' `--module`; launch execs retrieval_pretraining.torchrun for several
    processes) and config.py, read here from the command as written, not from the rule's
    `module_source` call: an entry left out there (dense_search declared as claim_run alone) and
    an edit to the search code reruns no search; an extra one (the miner beside the encoder) and
    an edit to mining re-encodes every corpus."""
    wrong, checked = declared_code_mistakes(base)
    assert not wrong, wrong
    assert {"encode_corpus_shard", "dense_search", "mine_hard_negatives", "finetune_stage1",
            "pretrain_model", "score_run", "make_tables", "stage_statistics"} <= checked


def test_the_dataset_copies_declare_the_code_their_commands_run(tmp_path):
    """As above, for the rules the demo's `all` never plans: a shared corpus
    (share_dataset_corpus, its index hard-linked by alias_bm25_index), a DPR split's answers, and
    an alias with a title mode of its own (alias_dataset_info)."""
    from test_shared_corpus import SHARED, _add_datasets

    project = copy_project(tmp_path / "project")
    _add_datasets(project)
    alias = "scifact-none"
    edit_config(project, lambda config: config["datasets"].append(
        {"name": alias, "same_as": "scifact", "title": "none"}))
    plan = planned_params(project, f"results/bm25/{SHARED}/runs/test.trec",
                          f"results/datasets/{SHARED}/answers-test.parquet",
                          f"results/datasets/{alias}/dataset.json")
    wrong, checked = declared_code_mistakes(plan)
    assert not wrong, wrong
    assert {"share_dataset_corpus", "alias_bm25_index", "prepare_dataset_answers",
            "alias_dataset_info"} <= checked, checked


def _dicts_reversed(node):
    """`node` with the keys of every mapping in it in reverse order (lists kept in order)."""
    if isinstance(node, dict):
        return {key: _dicts_reversed(node[key]) for key in reversed(list(node))}
    if isinstance(node, list):
        return [_dicts_reversed(value) for value in node]
    return node


def test_reordering_the_keys_of_the_config_reruns_nothing(project, base):
    """The order of a mapping's keys is no setting: every job's slice is written with sorted keys
    (config.stage_argument), so moving a key within config.yaml, or an overlay that lists a
    block's keys in another order, reruns no job (unsorted, every slice built from the section,
    a fine-tuning's or an encoding's, changed with it)."""
    def edit(config):
        reordered = _dicts_reversed(config)
        config.clear()
        config.update(reordered)

    edited = edited_plan(project, edit)
    assert edited.keys() == base.keys()
    assert sorted(key for key in base if base[key]["params"] != edited[key]["params"]) == []


def _rerun_rules(base: dict, edited: dict) -> set[str]:
    """The rules with a job whose params differ between the two plans."""
    return {rule for (rule, output), job in base.items()
            if job["params"] != edited[rule, output]["params"]}


def _exclude_query_ids(value):
    return lambda config: [entry.update(exclude_query_id=value) for entry in config["datasets"]]


@pytest.mark.parametrize("edit, rules", [
    # Dropping the query-id rule: what searches, mines, pads (fine-tuning) or prepares with it.
    (_exclude_query_ids(False), {"prepare_dataset", "bm25_search", "bm25_negatives",
                                 "mine_hard_negatives", "dense_search", "baseline_search",
                                 "finetune_stage1", "finetune_stage2"}),
    # A BEIR corpus sample's size: the sampled corpus.
    (lambda config: config["datasets"][0]["subset"].update(documents=1400), {"prepare_dataset"}),
    # BM25's indexed text, and a dataset's own k1 (bm25.overrides): its index, runs, negatives.
    (lambda config: config["bm25"].update(title="none"),
     {"build_bm25_index", "bm25_search", "bm25_negatives"}),
    (lambda config: config["bm25"].update(overrides=[{"dataset": "scifact", "k1": 1.2}]),
     {"bm25_search", "bm25_negatives"}),
    # A split's allowance: that split's job (which reads it) alone.
    (lambda config: config["datasets"][0].update(max_unknown_judged_queries=5),
     {"prepare_dataset_split"}),
    # A model's own fine-tuning knob (pretrain.models[].finetune): its fine-tuning.
    (lambda config: next(m for m in config["pretrain"]["models"] if m["name"] == "costa").update(
        finetune={"projector": True}), {"finetune_stage1"}),
    # The seed: every seeded draw (spans, negatives, mining, training; the analyses' samples).
    (lambda config: config.update(seed=7), {"sample_spans", "bm25_negatives",
                                            "mine_hard_negatives", "finetune_stage1",
                                            "pretrain_model"}),
])
def test_a_setting_a_job_reads_reruns_it(project, base, edit, rules):
    """The other direction of the triggers: a setting that changes a job's output must change its
    params, or the edit reruns nothing and the results tree mixes old and new settings without a
    word (a rule that stopped passing exclude_query_id, or the seed, to one of these)."""
    edited = edited_plan(project, edit)
    assert rules <= _rerun_rules(base, edited), rules - _rerun_rules(base, edited)


def test_pinning_another_hub_revision_restages_the_checkpoint_and_its_tokenizer(project):
    """A Hub checkpoint's revision decides its weights and its tokenizer: another pin restages
    both (and so re-chunks the corpus with the tokenizer of that commit)."""
    def hub(revision):
        def edit(config):
            config["checkpoints"][0] |= {"source": "hub", "revision": revision,
                                         "location": "sentence-transformers/all-MiniLM-L6-v2"}
        return edit

    before = edited_plan(project, hub("a" * 40))
    after = edited_plan(project, hub("b" * 40))
    assert {"stage_checkpoint", "stage_tokenizer"} <= _rerun_rules(before, after)


def test_a_titles_file_joined_onto_a_collection_reprepares_its_corpus(project):
    """An MS MARCO collection's titles file is joined into its corpus.parquet: adding one must
    change the corpus job's slice (it is the slice that hands the file to the stage)."""
    folder = project / "data" / "marco-sample"
    folder.mkdir(exist_ok=True)
    (folder / "collection.tsv").write_text("0\tsnow is cold\n")
    (folder / "para.title.txt").write_text("0\tSnow\n")
    marco = {"name": "marco", "format": "msmarco", "title": "sep", "exclude_query_id": False,
             "corpus": {"path": "data/marco-sample/collection.tsv"},
             "splits": [{"name": "dev", "queries": {"path": "data/marco-sample/collection.tsv"},
                         "qrels": {"path": "data/marco-sample/collection.tsv"}}]}

    def with_marco(**extra):
        return lambda config: config["datasets"].append(marco | extra)

    target = "results/datasets/marco/corpus.parquet"
    plans = [edited_plan(project, edit, target) for edit in (
        with_marco(), with_marco(titles={"path": "data/marco-sample/para.title.txt"}))]
    assert "prepare_dataset" in _rerun_rules(*plans)


def test_a_shared_corpus_s_own_query_id_rule_rewrites_its_dataset_json(tmp_path):
    """A shared corpus's dataset.json holds its own settings (INFO_KEYS), not its source's: its
    query-id rule changed must rewrite it (share_dataset_corpus's params)."""
    from test_shared_corpus import SHARED, _add_datasets

    project = copy_project(tmp_path / "project")
    _add_datasets(project)
    target = f"results/datasets/{SHARED}/dataset.json"
    plans = [edited_plan(project, lambda config: next(
        e for e in config["datasets"] if e["name"] == SHARED).update(exclude_query_id=value),
        target) for value in (False, True)]
    assert "share_dataset_corpus" in _rerun_rules(*plans)


def test_an_answer_match_rule_reruns_what_scores_or_filters_by_answers(tmp_path):
    """answer_match decides which passages count as answers: Acc@k's (score_run) and the answers
    filter's of the negatives (BM25's and mining's). Changed, each must rerun, or the tables mix
    string- and regex-matched scores without a word (the demo plans no split scored by Acc@k)."""
    from test_dpr import nq_project

    project = nq_project(tmp_path / "project", [
        {"dataset": "nq-sample", "split": "test", "measures": ["Acc@20"],
         "answer_match": "string"}])
    targets = ("results/metrics/nq-sample/bm25/test.json",
               "results/bm25/nq-sample/negatives.parquet",
               "results/finetune/bert/nq-sample/stage1/hard-negatives.parquet")
    before = planned_params(project, *targets)
    edit_config(project, lambda config: config["evaluate"]["splits"][0].update(
        answer_match="regex"))
    after = planned_params(project, *targets)
    assert {"score_run", "bm25_negatives", "mine_hard_negatives"} <= _rerun_rules(before, after)


def test_a_zero_shot_target_reruns_with_its_source_s_fine_tuning_overrides(tmp_path):
    """A zero-shot target is encoded and searched with the encoder fine-tuned on its source
    (trained_on): the passage length, pooling... that encoder was trained with, the source's
    overrides, are the target's too. Changed, its encoding and search must rerun with them."""
    from test_zero_shot import TARGET, _overrides

    project = copy_project(tmp_path / "project", _overrides())

    def p_len(value):
        return lambda config: next(e for e in config["finetune"]["datasets"]
                                   if e["dataset"] == "scifact").update(overrides={"p_len": value})

    before, after = (edited_plan(project, p_len(value), "results/tables.md") for value in (64, 96))
    for rule in ("encode_corpus_shard", "dense_search"):
        target = [out for key, out in before if key == rule and f"/{TARGET}/" in out]
        assert target, f"no {rule} job on the zero-shot target"
        assert set(target) <= set(rerun_by_params(before, after, rule)), target
        assert any('"p_len":64' in value for value in before[rule, target[0]]["params"])


@pytest.mark.parametrize("knob, value, rules", [
    ("p_len", 96, {"encode_corpus_shard", "mine_hard_negatives", "dense_search"}),
    ("pooling", "cls", {"encode_corpus_shard", "mine_hard_negatives", "dense_search"}),
    ("similarity", "dot", {"encode_corpus_shard", "mine_hard_negatives", "dense_search"}),
    ("q_len", 48, {"mine_hard_negatives", "dense_search"}),
])
def test_a_knob_that_decides_the_vectors_reruns_what_encodes_or_searches_with_them(
        project, base, knob, value, rules):
    """retrieval_keys: the knobs that decide a vector are the params of every job that encodes a
    corpus or its queries, for every such job (a knob left out, and the index holds vectors of
    the old passage length while the fine-tuned encoder reads the new one). The demo's pooling
    and similarity are mean and cosine."""
    edited = edited_plan(project, lambda config: config["finetune"].update({knob: value}))
    for rule in rules:
        assert len(rerun_by_params(base, edited, rule)) == sum(key[0] == rule for key in base), rule
