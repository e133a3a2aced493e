"""workflow/experiments/bow.yaml, the Bag-of-Word paper's experiments as an overlay on paper.yaml:
valid, in sync with the paper.yaml entries it repeats (lists replace whole), and planned by a dry
run to every one of its tables (the downloads are planned, never fetched)."""

import json

import pytest
import yaml

from retrieval_pretraining import config_checks
from retrieval_pretraining.pretrain.settings import resolve_model
from workflow_harness import ROOT, merged_configs

EXPERIMENTS = ROOT / "workflow" / "experiments"


def _load(name):
    return yaml.safe_load((EXPERIMENTS / name).read_text())


def merged() -> dict:
    return merged_configs(EXPERIMENTS / "paper.yaml", EXPERIMENTS / "bow.yaml")


def test_the_bow_overlay_is_valid_and_repeats_the_paper_entries_it_replaces():
    paper, overlay, config = _load("paper.yaml"), _load("bow.yaml"), merged()
    config_checks.validate(config)
    assert config["experiment"] == "paper-bow"
    for path in (("pretrain", "models"), ("datasets",), ("bm25", "negatives"), ("bm25", "overrides"),
                 ("finetune", "datasets"), ("evaluate", "zero_shot")):
        ours, theirs = overlay, paper
        for key in path:
            ours, theirs = ours[key], theirs[key]
        assert ours[:len(theirs)] == theirs, f"{'.'.join(path)}: keep paper.yaml's entries first, unchanged"
    splits = {(s["dataset"], s["split"]): s for s in overlay["evaluate"]["splits"]}
    for split in paper["evaluate"]["splits"]:
        assert set(split["measures"]) <= set(splits[split["dataset"], split["split"]]["measures"])


def test_the_bow_rows_are_the_papers_settings():
    """Decoders with BoW's encoder masking and 1 layer; Table 6's mask ratios 15 / 30 / 45%."""
    section = merged()["pretrain"]
    settings = {m["name"]: resolve_model(section, m["name"], seed=0) for m in section["models"]}
    assert settings["ae-decoder"]["ae_decoder"] == {"layers": 1, "mask_rate": 0.15, "weight": 1.0}
    assert settings["ar-decoder"]["ar_decoder"] == {"layers": 1, "weight": 1.0}
    for name in ("ae-decoder", "ar-decoder", "retromae", "bow"):
        assert settings[name]["mlm"] == {"mask_rate": 0.3, "whole_word": True}, name
    assert [settings[n]["mlm"]["mask_rate"] for n in ("bow-mask15", "bow", "bow-mask45")] == [0.15, 0.3, 0.45]
    same = lambda s: {k: v for k, v in s.items() if k not in ("name", "mlm")}  # noqa: E731
    assert same(settings["bow-mask15"]) | {"name": 0} == same(settings["bow"]) | {"name": 0}


@pytest.fixture(scope="module")
def tables_plan(tmp_path_factory) -> list[dict]:
    """`snakemake -n --configfile paper.yaml bow.yaml -- results/tables.md`, job by job."""
    from test_finetune_rules import planned_jobs
    from workflow_harness import copy_project

    project = copy_project(tmp_path_factory.mktemp("bow") / "project")
    return planned_jobs(project, "--configfile", str(EXPERIMENTS / "paper.yaml"),
                        str(EXPERIMENTS / "bow.yaml"), "--", "results/tables.md")


@pytest.mark.timeout(600)
def test_a_dry_run_plans_every_bow_table(tables_plan):
    """The tables' plan has make_tables with every table's rows trained, fine-tuned and scored
    (NQ / TriviaQA by answer accuracy)."""
    jobs = tables_plan
    rules = {j["rule"] for j in jobs}
    assert "make_tables" in rules, sorted(rules)
    pretrained = {j["wildcards"]["model"] for j in jobs if j["rule"] == "pretrain_model"}
    assert {"ae-decoder", "ar-decoder", "bow-mask15", "bow-mask45", "retromae"} <= pretrained
    scored = {(j["wildcards"]["dataset"], j["wildcards"].get("system", "")) for j in jobs
              if j["rule"] == "score_run"}
    for table in _load("bow.yaml")["report"]["tables"]:
        for column in table["columns"]:
            for row in table["rows"]:
                assert any(d == column["dataset"] and s.startswith(row["model"] + "-") for d, s in scored), (
                    table["name"], column["dataset"], row["model"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("dataset", ["nq", "trivia"])
def test_the_qa_sets_restart_stage_2_from_the_pretrained_encoder_at_p_len_256(tables_plan,
                                                                             dataset):
    """coCondenser's and the BoW authors' stage 2 restarts from the pre-trained encoder, and
    passages are cut at 256 tokens (Tevatron's coCondenser NQ example; 128 cut 76% of the DPR
    sample's passages); the job planned for NQ / TriviaQA gets both."""
    from test_finetune_rules import job, stage_config, values

    stage2 = job(tables_plan, "finetune_stage2", model="bow", dataset=dataset,
                 stage="stage2")["args"]
    assert values(stage2, "--init") == ["results/pretrain/bow/encoder"]
    assert stage_config(stage2)["p_len"] == 256
    encode = job(tables_plan, "encode_corpus_shard", model="bow", dataset=dataset,
                 stage="stage2", shard="0000")["args"]
    assert stage_config(encode)["p_len"] == 256


@pytest.mark.timeout(600)
def test_the_qa_sets_train_and_mine_as_the_authors_qa_scripts(tables_plan):
    """bowdpr's train_dpr_{nq,trivia}.sh: 16 passages a query, 1000 warm-up steps then a cosine
    to 0.1 x lr; stage 2 (10 epochs) on the mined AND the BM25 negatives, each file its own
    examples, as their train_hn folder holds both; mined: every answer-free passage of the top
    100."""
    from test_finetune_rules import job, stage_config, values

    for dataset in ("nq", "trivia"):
        stage2 = job(tables_plan, "finetune_stage2", model="bow", dataset=dataset,
                     stage="stage2")["args"]
        knobs = stage_config(stage2)
        assert {k: knobs[k] for k in ("group_size", "lr_schedule", "min_lr_ratio", "warmup_steps",
                                      "epochs")} == {
            "group_size": 16, "lr_schedule": "cosine", "min_lr_ratio": 0.1,
            "warmup_steps": 1000, "epochs": 10}, dataset
        assert knobs["negative_files"] == "separate", dataset
        assert sorted(values(stage2, "--negatives")) == sorted([
            f"results/finetune/bow/{dataset}/stage1/hard-negatives.parquet",
            f"results/bm25/{dataset}/negatives.parquet"])
        stage1 = job(tables_plan, "finetune_stage1", model="bow", dataset=dataset,
                     stage="stage1")["args"]
        assert stage_config(stage1)["epochs"] == 20 and "negative_files" not in stage_config(
            stage1), dataset
        # Read by separate examples alone: stage 1 (one list) is no job of it, nor reruns for it.
        assert "example_positives" not in stage_config(stage1), dataset
        mine = job(tables_plan, "mine_hard_negatives", model="bow", dataset=dataset,
                   stage="stage1")["args"]
        policy = stage_config(mine)
        assert (policy["depth"], policy["num_negatives"], policy["rank_window"]) == (100, None, None)
        # annotate.py --build_hn: answer-bearing top-100 passages are the mined file's positives.
        assert policy["answer_positives"] is True and policy["negative_filter"] == "answers"
        assert policy["min_negatives"] == 4  # annotate.py's min_neg_size
        assert knobs["example_positives"] == "file", dataset


@pytest.mark.timeout(600)
def test_the_msmarco_tables_run_the_bow_authors_recipe_on_an_alias(tables_plan):
    """The BoW tables' MS MARCO and SciFact columns read msmarco-passage-bow / scifact-bow,
    paper.yaml's collections under second names (copies: nothing prepared or downloaded twice),
    fine-tuned by bowdpr's train_dpr_msmarco.sh: 128 triples negatives, 16 passages of 144
    tokens, lr 2e-5 on the cosine schedule, 3 + 3 epochs, stage 2 restarted from the pre-trained
    encoder on places 3-200 of stage 1's top 1000 less the positives, 128 sampled."""
    from test_finetune_rules import job, stage_config, values

    prepared = {j["wildcards"].get("dataset") for j in tables_plan
                if j["rule"] in ("prepare_dataset", "prepare_dataset_split",
                                 "download_dataset_file")}
    assert not prepared & {"msmarco-passage-bow", "scifact-bow"}, prepared
    negatives = job(tables_plan, "bm25_negatives", dataset="msmarco-passage-bow")["args"]
    assert json.loads(values(negatives, "--config")[0])["negatives"]["count"] == 128
    assert values(negatives, "--triples") == [
        "results/downloads/datasets/msmarco-passage/qidpidtriples.train.full.2.tsv.gz"]
    recipe = {"lr": 2e-5, "lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 1000,
              "group_size": 16, "p_len": 144, "epochs": 3}
    for stage in ("stage1", "stage2"):
        args = job(tables_plan, f"finetune_{stage}", model="bow-marco",
                   dataset="msmarco-passage-bow", stage=stage)["args"]
        knobs = stage_config(args)
        assert {k: knobs[k] for k in recipe} == recipe, stage
    assert values(args, "--init") == ["results/pretrain/bow-marco/encoder"]
    assert values(args, "--negatives") == [
        "results/finetune/bow-marco/msmarco-passage-bow/stage1/hard-negatives.parquet"]
    mine = job(tables_plan, "mine_hard_negatives", model="bow-marco",
               dataset="msmarco-passage-bow", stage="stage1")["args"]
    policy = stage_config(mine)
    assert (policy["depth"], policy["rank_window"], policy["num_negatives"],
            policy["sample"]) == (1000, [3, 201], 128, "random")
    # build_train_hn's negatives[2:200], sliced after the positives are removed.
    assert policy["rank_window_counts"] == "candidates"
    zero_shot = job(tables_plan, "dense_search", model="bow", dataset="scifact-bow",
                    stage="stage2", split="test")["args"]
    assert any("msmarco-passage-bow/stage2" in a for a in zero_shot), zero_shot


@pytest.mark.timeout(600)
def test_the_bow_recipe_joins_title_and_text_with_a_space_and_bm25_indexes_as_before(
        tables_plan):
    """bowdpr's TrainCollator and EncodeCollator (finetune/data_utils.py: `self.separator = " "`)
    feed title + " " + text: NQ, TriviaQA and the alias msmarco-passage-bow are `title: space` in
    their fine-tuning and encoding, scifact-bow through scifact; BM25 indexes what it did before:
    MS MARCO's text alone (bm25.overrides), the alias's index a copy of that one, DPR's passages
    title + " " + text (bm25.title), trivia's a copy of nq's."""
    from test_finetune_rules import job, stage_config

    for model, dataset in (("bow", "nq"), ("bow", "trivia"),
                           ("bow-marco", "msmarco-passage-bow"), ("bow", "scifact-bow")):
        jobs = [j for j in tables_plan if j["wildcards"].get("dataset") == dataset
                and j["wildcards"].get("model") == model
                and j["rule"] in ("finetune_stage1", "finetune_stage2", "encode_corpus_shard",
                                  "dense_search")]
        rules = {j["rule"] for j in jobs}
        assert rules >= {"encode_corpus_shard", "dense_search"}, (dataset, rules)
        if dataset != "scifact-bow":  # zero-shot: encoded, not fine-tuned
            assert rules >= {"finetune_stage1", "finetune_stage2"}, (dataset, rules)
        for planned in jobs:
            assert stage_config(planned["args"])["title"] == "space", (dataset, planned["rule"])
    built = {j["wildcards"]["dataset"]: stage_config(j["args"])["title"]
             for j in tables_plan if j["rule"] == "build_bm25_index"}
    assert built == {"msmarco-passage": "none", "nq": "space", "scifact": "space"}, built
    copied = {j["wildcards"]["dataset"] for j in tables_plan if j["rule"] == "alias_bm25_index"}
    assert copied == {"msmarco-passage-bow", "trivia", "scifact-bow"}, copied
    search = job(tables_plan, "bm25_search", dataset="msmarco-passage-bow", split="dev")
    assert stage_config(search["args"])["title"] == "none"


@pytest.mark.timeout(600)
def test_all_pre_trains_no_model_the_bow_report_leaves_out(tmp_path):
    """`snakemake ... -- all` (tables, statistics page, loss curves, coverage) pre-trains and
    fine-tunes only the models the BoW report reaches: not paper.yaml's COSTA and CPDAE, which the
    overlay keeps in pretrain.models but tables nowhere."""
    from test_finetune_rules import planned_jobs
    from workflow_harness import copy_project, local_dump

    project = copy_project(tmp_path / "project")
    jobs = planned_jobs(project, "--configfile", str(EXPERIMENTS / "paper.yaml"),
                        str(EXPERIMENTS / "bow.yaml"), str(local_dump(project)), "--", "all")
    assert {"stage_statistics", "loss_curves"} <= {j["rule"] for j in jobs}
    pretrained = {j["wildcards"]["model"] for j in jobs if j["rule"] == "pretrain_model"}
    assert "bow" in pretrained and not pretrained & {"costa", "cpdae"}, sorted(pretrained)
    finetuned = {j["wildcards"]["model"] for j in jobs if j["rule"].startswith("finetune_stage")}
    assert not finetuned & {"costa", "cpdae"}, sorted(finetuned)


def test_the_published_bow_numbers_say_their_masking_differs_from_bow_marco_s():
    """The BoW paper's MS MARCO numbers (15% masking, Table 6) sit beside bow-marco, which masks
    as paper.yaml's bow rows do: their note says both rates, so the gap is not read as ours."""
    from retrieval_pretraining.paper_numbers import PAPER

    rate = resolve_model(_load("paper.yaml")["pretrain"], "bow-marco", seed=0)["mlm"]["mask_rate"]
    published = [p for p in PAPER if p.system == "bow" and p.benchmark == "msmarco-passage-dev"]
    assert published and rate != 0.15
    for number in published:
        assert "15% masking" in number.note and f"{rate:.0%}" in number.note, number.note


@pytest.mark.parametrize("overlay", [(), ("bow.yaml",)])
def test_condenser_and_cocondenser_mask_whole_words_as_their_code_does(overlay):
    """The authors' CondenserCollator is a DataCollatorForWholeWordMask (CoCondenserCollator
    inherits it): their rows mask whole words at the section's 15%, not single tokens."""
    section = merged_configs(*(EXPERIMENTS / n for n in ("paper.yaml", *overlay)))["pretrain"]
    for name in ("condenser", "cocondenser"):
        assert resolve_model(section, name, seed=0)["mlm"] == {"mask_rate": 0.15,
                                                               "whole_word": True}, name


# workflow/experiments/bow-recipe.yaml: the BoW authors' pre-training recipe as two more rows.
AUTHORS = {"lr": 3e-4, "lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 4000,
           "global_batch_size": 2048}
RECIPE_ROWS = ["bow-authors", "bow-marco-authors"]


def test_the_recipe_overlay_is_valid_and_repeats_the_bow_lists_it_extends():
    """A --configfile replaces lists whole: bow-recipe.yaml's pretrain.models are bow.yaml's, in
    order and unchanged, then its two rows; its report.tables are bow.yaml's, the MS MARCO
    table's rows ending with the two."""
    bow, recipe = _load("bow.yaml"), _load("bow-recipe.yaml")
    config = merged_configs(*(EXPERIMENTS / n for n in ("paper.yaml", "bow.yaml",
                                                         "bow-recipe.yaml")))
    config_checks.validate(config)
    assert set(recipe) == {"pretrain", "report"} and set(recipe["pretrain"]) == {"models"}
    assert set(recipe["report"]) == {"tables"}
    models = recipe["pretrain"]["models"]
    assert models[:len(bow["pretrain"]["models"])] == bow["pretrain"]["models"]
    assert [m["name"] for m in models[len(bow["pretrain"]["models"]):]] == RECIPE_ROWS
    ours, theirs = recipe["report"]["tables"], bow["report"]["tables"]
    assert [t["name"] for t in ours] == [t["name"] for t in theirs]
    for mine, source in zip(ours, theirs):
        if mine["name"] != "bow-msmarco":
            assert mine == source, mine["name"]
            continue
        assert {k: v for k, v in mine.items() if k != "rows"} == {
            k: v for k, v in source.items() if k != "rows"}
        assert mine["rows"][:len(source["rows"])] == source["rows"]
        assert [r["model"] for r in mine["rows"][len(source["rows"]):]] == RECIPE_ROWS


def test_the_recipe_rows_differ_from_bow_s_by_the_authors_optimisation_alone():
    """bow-authors is paper.yaml's bow but for the authors' lr, schedule and batch, and 140,000
    steps; bow-marco-authors is bow-marco but for the same, 80,000 steps and its init."""
    section = merged_configs(*(EXPERIMENTS / n for n in ("paper.yaml", "bow.yaml",
                                                          "bow-recipe.yaml")))["pretrain"]
    resolved = {n: resolve_model(section, n, seed=0) for n in
                ("bow", "bow-marco", "bow-authors", "bow-marco-authors")}
    for ours, theirs, steps in (("bow-authors", "bow", 140000),
                                ("bow-marco-authors", "bow-marco", 80000)):
        a, b = resolved[ours], resolved[theirs]
        assert {k: a["trainer"][k] for k in AUTHORS} == AUTHORS, ours
        assert a["trainer"]["max_steps"] == steps
        assert a["trainer"] == b["trainer"] | AUTHORS | {"max_steps": steps}, ours
        same = {k for k in a if k not in ("name", "trainer", "init")}
        assert {k: a[k] for k in same} == {k: b[k] for k in same}, ours
    assert resolved["bow-marco-authors"]["init"] == "bow-authors"
    assert resolved["bow-authors"]["mlm"] == {"mask_rate": 0.3, "whole_word": True}
    assert resolved["bow-authors"]["bow"]["weight_end"] == 0.1


@pytest.fixture(scope="module")
def recipe_plan(tmp_path_factory) -> list[dict]:
    """`snakemake -n --configfile paper.yaml bow.yaml bow-recipe.yaml -- results/tables.md`."""
    from test_finetune_rules import planned_jobs
    from workflow_harness import copy_project

    project = copy_project(tmp_path_factory.mktemp("bow-recipe") / "project")
    return planned_jobs(project, "--configfile", *(str(EXPERIMENTS / n) for n in (
        "paper.yaml", "bow.yaml", "bow-recipe.yaml")), "--", "results/tables.md")


@pytest.mark.timeout(600)
def test_a_dry_run_plans_the_authors_recipe_rows(recipe_plan):
    """Both rows pre-trained with the authors' trainer (the Wikipedia one from bert-base-uncased,
    the MS MARCO one from its encoder), fine-tuned on msmarco-passage-bow by bow.yaml's BoW
    recipe, and bow-marco-authors beside the BoW paper's published MS MARCO numbers."""
    from retrieval_pretraining import paper_numbers
    from test_finetune_rules import job, stage_config, values

    planned = {}
    for name in RECIPE_ROWS:
        args = job(recipe_plan, "pretrain_model", model=name)["args"]
        planned[name] = (stage_config(args), values(args, "--checkpoint"))
    for name, steps in zip(RECIPE_ROWS, (140000, 80000)):
        trainer = planned[name][0]["trainer"]
        assert {k: trainer[k] for k in AUTHORS} == AUTHORS, name
        assert (trainer["max_steps"], trainer["micro_batch_size"]) == (steps, 32), name
    wiki, marco = planned["bow-authors"][0], planned["bow-marco-authors"][0]
    assert wiki["corpora"] == [{"name": "wikipedia", "proportion": 1.0}]
    assert "init" not in wiki and planned["bow-authors"][1] == [
        "results/checkpoints/bert-base-uncased"]
    assert marco["corpora"] == [{"name": "msmarco-passage", "proportion": 1.0}]
    assert marco["init"] == "bow-authors" and planned["bow-marco-authors"][1] == [
        "results/pretrain/bow-authors/encoder"]
    recipe = {"lr": 2e-5, "lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 1000,
              "group_size": 16, "p_len": 144, "epochs": 3}
    for name in RECIPE_ROWS:
        for stage in ("stage1", "stage2"):
            args = job(recipe_plan, f"finetune_{stage}", model=name,
                       dataset="msmarco-passage-bow", stage=stage)["args"]
            assert {k: stage_config(args)[k] for k in recipe} == recipe, (name, stage)
        assert values(args, "--init") == [f"results/pretrain/{name}/encoder"]
    scored = {j["wildcards"].get("system") for j in recipe_plan if j["rule"] == "score_run"
              and j["wildcards"].get("dataset") == "msmarco-passage-bow"}
    assert {f"{n}-{s}" for n in RECIPE_ROWS for s in ("stage1", "stage2")} <= scored
    models = {m["name"]: m for m in stage_config(job(recipe_plan, "make_tables")["args"])["models"]}
    for name, published in (("bow-authors", False), ("bow-marco-authors", True)):
        model = models[name]
        number = paper_numbers.paper_value(
            "bow", "msmarco-passage-dev", "RR@10", "hard-negatives", final_group=True,
            in_domain="msmarco-passage-bow" in model["pretrained_on"], base=model["base"])
        assert (number is not None) == published, name
        if published:
            assert number.value == 0.401


def test_nq_and_trivia_download_parse_and_index_dpr_s_passages_once(tmp_path):
    """trivia's corpus is nq's (corpus: {same_as: nq}): psgs_w100 (4.7 GB, 21M passages) is
    fetched, parsed and BM25-indexed once, under nq, and trivia's corpus and index are copies;
    trivia's own questions and training file are its own."""
    from test_finetune_rules import planned_jobs
    from workflow_harness import copy_project

    project = copy_project(tmp_path / "project")
    jobs = planned_jobs(project, "--configfile", str(EXPERIMENTS / "paper.yaml"),
                        str(EXPERIMENTS / "bow.yaml"), "--", "results/bm25/nq/index",
                        "results/bm25/trivia/index", "results/bm25/trivia/negatives.parquet",
                        "results/datasets/trivia/answers-test.parquet")
    planned = sorted((j["rule"], j["wildcards"].get("dataset"), j["wildcards"].get("file"))
                     for j in jobs if j["rule"] != "prepare_dataset_answers")
    assert planned == [
        ("alias_bm25_index", "trivia", None),
        ("bm25_negatives", "trivia", None),
        ("build_bm25_index", "nq", None),
        ("download_dataset_file", "nq", "psgs_w100.tsv.gz"),
        ("download_dataset_file", "trivia", "biencoder-trivia-train.json.gz"),
        ("download_dataset_file", "trivia", "trivia-test.qa.csv.gz"),
        ("prepare_dataset", "nq", None),
        ("prepare_dataset_split", "trivia", None),
        ("share_dataset_corpus", "trivia", None),
    ], planned


@pytest.mark.timeout(600)
def test_the_bow_recipe_contrasts_the_whole_batch_through_the_gradient_cache(tables_plan):
    """bowdpr's model gathers the whole batch: each query against 64 x 16 = 1,024 passages. bow.yaml
    trains that set on one GPU: sub_batches 1 and cache_chunk 8 (8 queries x 16 passages a
    forward pass), on both stages of msmarco-passage-bow, nq and trivia; paper.yaml's
    msmarco-passage keeps COSTA's 8 sets of 8 queries, uncached."""
    from retrieval_pretraining.finetune.data import cached_chunk, contrast_plan
    from retrieval_pretraining.finetune.settings import FinetuneSettings
    from test_finetune_rules import job, stage_config

    for model, dataset in (("bow-marco", "msmarco-passage-bow"), ("bow", "nq"), ("bow", "trivia")):
        for stage in ("stage1", "stage2"):
            knobs = stage_config(job(tables_plan, f"finetune_{stage}", model=model,
                                     dataset=dataset, stage=stage)["args"])
            settings = FinetuneSettings.from_config(knobs)
            plan = contrast_plan(settings, 1)
            assert (knobs["sub_batches"], knobs["cache_chunk"], knobs["gather"]) == (
                1, 8, False), (dataset, stage)
            assert (plan.contrast_queries, plan.negatives_per_query) == (64, 1023), dataset
            assert cached_chunk(settings, plan) == 8
            # bowdpr's TrainDataset (Tevatron's): groups cycle through per-query orders.
            assert settings.group_sampling == "cycle", (dataset, stage)
    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    assert (paper["finetune"]["sub_batches"], paper["finetune"]["cache_chunk"]) == (8, None)
    assert paper["finetune"]["group_sampling"] == "cycle"  # the COSTA authors ran Tevatron too


def test_the_msmarco_mining_pool_is_build_train_hns_on_the_authors_rank_file():
    """bowdpr's train_dpr_msmarco.sh runs faiss_retriever without --depth (its default: 1000 a
    query), then build_train_hn drops the positives and slices negatives[2:200]: places 3-200 of
    the list left, which reach search rank 201 or beyond wherever a positive ranks in the top 200.
    msmarco-passage-bow's policy must give that pool (before the 128 are drawn) on any ranking:
    restated here from their two scripts, on random 1,000-deep lists with 1-3 positives."""
    import numpy as np

    from retrieval_pretraining import mine
    from retrieval_pretraining.references import mining_policy

    knobs = mine.policy({**mining_policy(merged(), "msmarco-passage-bow"),
                         "negative_filter": "qrels", "exclude_self": False})
    knobs["num_negatives"] = None  # the pool the 128 are drawn from
    rng = np.random.default_rng(3)
    for case in range(50):
        ranking = [f"p{i}" for i in rng.permutation(5000)[:1000]]  # their rank file's 1000
        positives = set(rng.choice(ranking[:300], size=int(rng.integers(1, 4)), replace=False))
        theirs = [d for d in ranking if d not in positives][2:200]
        searched = ranking[:knobs["depth"]]  # what our search returns
        ours = mine.select_negatives(f"q{case}", searched, np.linspace(1, 0, len(searched)),
                                     np.arange(1, len(searched) + 1), positives, knobs, 0)[0]
        assert ours == theirs, (case, sorted(positives, key=ranking.index))
