# Results: results/tables.md (+ HTML for the report), the low-resource figure, per-stage
# statistics. Everything here is driven by the `report` config section; `report_targets()` lists
# what to build. The analyses (`report.analysis`) have their rules in rules/analysis.smk.

from types import SimpleNamespace

from retrieval_pretraining import paper_numbers


def report_models():
    """Each model's name and objective, the entry it copies, the datasets whose own corpus
    it was pre-trained on and the checkpoint its pre-training started from (which published
    numbers may sit beside it)."""
    return [
        {k: m[k] for k in ("name", "objective", "reuse_pretraining") if k in m}
        | {
            # An alias (datasets[].same_as) is its source's collection, and a shared corpus
            # (datasets[].corpus.same_as) its source's passages: in-domain too.
            "pretrained_on": dataset_aliases.same_collection(
                corpora_lib.pretraining_datasets(
                    config["pretrain"], config["corpus"], m["name"]
                ),
                DATASET_ALIASES,
                CORPUS_SOURCES,
            ),
            "base": paper_numbers.pretraining_base(
                config["pretrain"], config["checkpoints"], m["name"]
            ),
        }
        for m in config["pretrain"]["models"]
    ]


def check_report_models():
    """Fail at parse time, naming the key, when the report names a model that is not pre-trained."""
    known = {m["name"] for m in config["pretrain"]["models"]}
    analysis = config["report"]["analysis"]
    named_models = [
        (f"report.tables[{t['name']}].rows", r["model"])
        for t in config["report"]["tables"]
        for r in t.get("rows") or []
    ]
    named_models += [
        (f"report.tables[{t['name']}].baselines", b["model"])
        for t in config["report"]["tables"]
        for b in (t.get("baselines") or config["report"]["significance"]["baselines"])
        if "model" in b
    ]
    for key in ("tsne", "coverage"):
        named_models += [
            (f"report.analysis.{key}.models", m)
            for m in (analysis[key] or {}).get("models", [])
        ]
    if analysis["cpdae_top_words"]:
        named_models.append(
            (
                "report.analysis.cpdae_top_words.model",
                analysis["cpdae_top_words"]["model"],
            )
        )
    if config["report"]["low_resource"]:
        named_models += [
            ("report.low_resource.models", m)
            for m in config["report"]["low_resource"]["models"]
        ]
    unknown = [f"{key}: {model!r}" for key, model in named_models if model not in known]
    if unknown:
        raise ValueError(
            "the report names models that are not in pretrain.models ("
            + ", ".join(sorted(known))
            + "): "
            + "; ".join(unknown)
            + ". Add them to pretrain.models or remove them from the report section."
        )


check_report_models()


def check_report_measures():
    """Fail at parse time, not after the runs, when a table column (or the low-resource figure)
    asks for a measure its split does not score: each names an evaluate.splits entry and one of
    its `measures` as written there (R@1000 on a relevance-level-2 split is found as R(rel=2)@1000
    by the tables: tables/metrics.py)."""
    scored = {
        (e["dataset"], e["split"]): e["measures"] for e in config["evaluate"]["splits"]
    }
    named = [
        (f"report.tables[{t['name']}].columns[{i}]", c)
        for t in config["report"]["tables"]
        for i, c in enumerate(t["columns"])
    ]
    if config["report"]["low_resource"]:
        named.append(("report.low_resource", config["report"]["low_resource"]))
    problems = []
    for key, c in named:
        measures = scored.get((c["dataset"], c["split"]))
        if measures is None:
            problems.append(
                f"{key}: no evaluate.splits entry scores {c['dataset']} {c['split']}"
            )
        elif c["measure"] not in measures:
            problems.append(
                f"{key}: {c['measure']!r} is not among {c['dataset']} {c['split']}'s "
                f"evaluate measures {measures}"
            )
    if problems:
        raise ValueError(
            "the report asks for scores nothing computes: "
            + "; ".join(problems)
            + ". Add the measure to that evaluate.splits entry, or name one it has."
        )


check_report_measures()


def table_rows(table):
    return config_references.table_rows(config, table)


def report_systems(table):
    return config_references.report_systems(config, table)


def low_resource_systems():
    return config_references.low_resource_systems(config)


def metrics_paths(cells):
    return sorted(
        {f"results/metrics/{d}/{system}/{split}.json" for d, system, split in cells}
    )


def get_report_metrics():
    """Every metrics JSON a table, a significance test or the low-resource figure reads."""
    cells = [
        c for t in config["report"]["tables"] for c in report_systems(t)
    ] + low_resource_systems()
    return metrics_paths(cells)


def tables_qrels():
    """{"<dataset>/<split>": qrels file} of each table column scored against qrels (score_run's
    inputs: an Acc@k-only split has none). The provenance reads the manifest written beside each
    (judged documents missing from the corpus): declared, so that a re-prepared qrels rebuilds
    the tables, and passed in the params (`declared`), so that they read no other."""
    found = {}
    for t in config["report"]["tables"]:
        for c in t["columns"]:
            wildcards = SimpleNamespace(dataset=c["dataset"], split=c["split"])
            if qrels := score_run_inputs(wildcards).get("qrels"):
                found[f"{c['dataset']}/{c['split']}"] = qrels
    return found


def tabled_models():
    """The models whose dense runs the tables show (their cells and the low-resource section's),
    in pretrain.models order. The provenance reads each one's pre-trained encoder's
    training.json (hardware): declared and passed as tables_qrels() are; not every configured
    model, whose pre-training an overlay's tables may not need (bow.yaml's costa)."""
    cells = [c for t in config["report"]["tables"] for c in report_systems(t)]
    named = {
        parsed[0]
        for _, system, _ in cells + low_resource_systems()
        if (parsed := dense_system(system))
    }
    return [m["name"] for m in config["pretrain"]["models"] if m["name"] in named]


def report_params():
    """The tables' config slice: the report section (minus analyses), the model list, BM25's k1/b,
    and the whole resolved config (written beside the tables, its hash in the provenance block).
    """
    report_section = {k: v for k, v in config["report"].items() if k != "analysis"}
    # rows: null made explicit for the tables stage (table_rows).
    report_section["tables"] = [
        {**t, "rows": table_rows(t)} for t in report_section["tables"]
    ]
    return experiment_config.stage_argument(
        {
            "experiment": config["experiment"],
            # Written into tables.json, hashed for the provenance block (tables/provenance.py).
            "resolved_config": config,
            "report": report_section,
            "models": report_models(),
            # How each model's loss terms are reduced (stated in the provenance block).
            "losses": {m["name"]: loss_settings(m["name"]) for m in report_models()},
            # The encoder behind each reported dense system, per dataset (provenance).
            "encoders": reported_encoders(),
            # Each dataset's corpus shard count: the encoding logs behind a dense row (provenance).
            "dense_shards": reported_shards(),
            # k1, b and the indexed text (title): what a published BM25 number must match.
            "bm25": {
                k: config["bm25"][k]
                for k in ("k1", "b", "title")
                if k in config.get("bm25", {})
            },
            # Per dataset, with bm25.overrides applied: what each BM25 run really used.
            "bm25_by_dataset": {
                e["dataset"]: {
                    k: bm25_settings(e["dataset"]).get(k) for k in ("k1", "b", "title")
                }
                for e in config["evaluate"]["splits"]
            },
            # An evaluated alias or shared corpus whose BM25 index is its source's, copied
            # (alias_bm25_index): its BM25 row's provenance names the copy's log and the build.
            "bm25_index_copies": {
                dataset: bm25_index_build(dataset)
                for dataset in copied_bm25_indexes()
                if dataset in {e["dataset"] for e in config["evaluate"]["splits"]}
            },
            "trained_on": {
                e["dataset"]: e["trained_on"]
                for e in config["evaluate"].get("zero_shot") or []
            },
            "baselines": baseline_report(),  # label, encoder, published numbers
            # Which qrels manifests and pre-training records the tables read: make_tables' inputs.
            "declared": {"qrels": list(tables_qrels()), "pretraining": tabled_models()},
        }
    )


def get_stage_artifacts():
    """Artifacts whose manifests feed the per-stage statistics page: those behind what the report
    reads, not every configured model and dataset (an overlay repeats lists it tables in part).
    """
    # The datasets of the report's cells; those the dense runs train on come with their chains.
    cells = [c for t in config["report"]["tables"] for c in report_systems(t)]
    datasets = sorted({d for d, _, _ in cells + low_resource_systems()})
    # Each artifact once, in this order: a fine-tuning chain names the corpus and the pre-trained
    # encoder that the lists before it name too (the page listed them twice).
    listed = (
        get_all_articles()
        + chunk_paths(used_corpora())
        + [
            path
            for corpus, spans in reported_span_indexes()
            for path in expand(
                "results/corpus/{corpus}/spans/{spans}/shard-{shard}.parquet",
                corpus=corpus,
                spans=spans,
                shard=shard_ids(),
            )
        ]
        # Only the models the report reaches: an overlay's pretrain.models may list models that
        # its tables leave out (bow.yaml keeps paper.yaml's costa and cpdae).
        + expand("results/pretrain/{model}/encoder", model=reached_models())
        + expand("results/datasets/{dataset}/corpus.parquet", dataset=datasets)
        + finetune_stage_artifacts()
        + baseline_artifacts()
    )
    return list(dict.fromkeys(listed))


def dense_system(system):
    """(model, stage) of a dense system `{model}-{stage}`, or None (BM25, a baseline)."""
    for name in (m["name"] for m in config["pretrain"]["models"]):
        stage = system.removeprefix(f"{name}-")
        if stage != system and _re.fullmatch(_STAGE_RE, stage):
            return name, stage
    return None


def reported_dense_cells():
    """(dataset, model, stage, split) of every dense run the report reads: the tables' and the
    low-resource figure's cells (get_report_metrics) and the t-SNE figure's runs."""
    cells = [c for t in config["report"]["tables"] for c in report_systems(t)]
    cells += low_resource_systems()
    tsne = config["report"]["analysis"]["tsne"]
    if tsne:
        cells += [
            (tsne["dataset"], f"{m}-{tsne['stage']}", tsne["split"])
            for m in tsne["models"]
        ]
    found = {}
    for dataset, system, split in cells:
        if parsed := dense_system(system):
            found[(dataset, *parsed, split)] = None
    return list(found)


def reached_models():
    """The models the report reaches, in pretrain.models order: those of its dense runs and of the
    analyses of pre-trained encoders (coverage, CPDAE top words)."""
    named = {model for _, model, _, _ in reported_dense_cells()}
    analysis = config["report"]["analysis"]
    named |= set((analysis["coverage"] or {}).get("models", []))
    if analysis["cpdae_top_words"]:
        named.add(analysis["cpdae_top_words"]["model"])
    return [m["name"] for m in config["pretrain"]["models"] if m["name"] in named]


def reported_span_indexes():
    """(corpus, spans) of the span indexes the report's models pre-train on, in pretrain.models
    order: those of the reached models and of the models their pre-training starts from (`init`)
    or reuses. Not span_indexes(): an index no reached model reads (bow.yaml's costa, paper.yaml's
    ablation entries) would cost a sample_spans job per shard that the tables never need.
    """
    needed, todo = set(), list(reached_models())
    while todo:
        name = todo.pop()
        if name and name not in needed:
            needed.add(name)
            todo += [
                pretrain_settings(name).get("init"),
                pretrain_settings_lib.reused_source(config["pretrain"], name),
            ]
    pairs = {}
    for name in pretrain_models(trained=True):
        settings = pretrain_settings(name)
        if name in needed and settings["spans"]:
            for corpus in settings["corpora"]:
                pairs[(corpus["name"], settings["spans"])] = None
    return list(pairs)


def stage_chain(model, dataset, stage):
    """What system `{model}-{stage}` fine-tuned on `dataset` is built from, its encoder included:
    the dataset's corpus, the BM25 negatives and the hard negatives and mining index of each stage
    before it, back to the encoder its stage 1 starts from (the pre-trained one, or another
    dataset's stage: stage1_init)."""
    prefix, _, _, number = parse_stage(stage)
    chain = [encoder_path(model, dataset, stage)]
    if number == 0:
        return chain
    chain.append(f"results/datasets/{dataset}/corpus.parquet")
    knobs = finetune_knobs(dataset, stage)
    if (number == 1 and knobs["stage1"] == "bm25") or (
        number > 1 and knobs["stage2_negatives"] in ("union", "separate")
    ):
        chain.append(f"results/bm25/{dataset}/negatives.parquet")
    if number == 1:
        source = knobs["stage1_init"]
        if source == "pretrained":
            return chain + [f"results/pretrain/{model}/encoder"]
        return chain + stage_chain(model, *source.split("/"))
    previous = f"{prefix}stage{number - 1}"
    return (
        chain
        + [
            f"results/finetune/{model}/{dataset}/{previous}/hard-negatives.parquet",
            f"results/index/{model}/{dataset}/{previous}/faiss",
        ]
        + stage_chain(model, dataset, previous)
    )


def finetune_stage_artifacts():
    """The dense runs the report reads (reported_dense_cells), each with its index and its stage
    chain (encoders, mined negatives, mining indexes), the BM25 runs a table reads and the metrics
    the tables read (a metrics JSON holds its own statistics). Derived from what the report reads,
    not from finetune.models x finetune.datasets: a model an overlay tables on one dataset only
    (ablations.yaml) must not be fine-tuned, mined and indexed on the others for this page.
    """
    dense = set()
    for dataset, model, stage, split in reported_dense_cells():
        dense |= {
            f"results/runs/{dataset}/{model}-{stage}/{split}.trec",
            f"results/index/{model}/{dataset}/{stage}/faiss",
            *stage_chain(model, trained_on(dataset), stage),
        }
    bm25_runs = sorted(  # the BM25 runs a table reads
        {
            f"results/bm25/{d}/runs/{split}.trec"
            for t in config["report"]["tables"]
            for d, system, split in report_systems(t)
            if system == "bm25"
        }
    )
    return sorted(dense) + bm25_runs + get_report_metrics()


def report_targets():
    """What the report adds to `rule all`."""
    targets = [
        "results/tables.md",
        "results/report/tables.html",
        "results/report/stage-statistics.html",
    ]
    if config["report"]["low_resource"]:
        targets.append("results/analysis/low-resource.png")
    return targets + analysis_targets()


rule make_tables:
    input:
        metrics=get_report_metrics(),
        # What the provenance reads beside the metrics (report_params' `declared`).
        qrels=list(tables_qrels().values()),
        pretraining=expand("results/pretrain/{model}/encoder", model=tabled_models()),
        code=module_source("tables"),
    output:
        tables="results/tables.md",
        html=report(
            "results/report/tables.html",
            caption="../workflow/report/tables.rst",
            category="1. Results",
        ),
        json="results/report/tables.json",
    log:
        "results/logs/make_tables.log",
    localrule: True
    conda:
        conda_env("torch")
    params:
        tables=lambda wildcards: report_params(),  # a function: its JSON holds braces
    shell:
        "python -m retrieval_pretraining.tables --config '{params.tables}' --results results "
        "--out {output.tables} --html {output.html} --json {output.json} &> {log}"


# The low-resource section alone (tables.md holds it too) and its figure, from its runs alone.
rule low_resource_figure:
    input:
        metrics=metrics_paths(low_resource_systems()),
        code=module_source("tables"),
    output:
        figure=report(
            "results/analysis/low-resource.png",
            caption="../workflow/report/low_resource.rst",
            category="1. Results",
        ),
        tables="results/analysis/low-resource.md",
    log:
        "results/logs/low_resource_figure.log",
    localrule: True
    conda:
        conda_env("torch")
    params:
        tables=lambda wildcards: report_params(),  # a function: its JSON holds braces
    shell:
        "python -m retrieval_pretraining.tables --config '{params.tables}' --results results "
        "--low-resource-only --out {output.tables} --figure {output.figure} &> {log}"


rule stage_statistics:
    input:
        # A function: the dump's part list is known only after the fetch_dumpstatus checkpoint.
        artifacts=lambda wildcards: get_stage_artifacts(),
        code=module_source("audit"),
    output:
        html=report(
            "results/report/stage-statistics.html",
            caption="../workflow/report/stage_statistics.rst",
            category="5. Provenance",
        ),
    log:
        "results/logs/stage_statistics.log",
    localrule: True
    conda:
        conda_env("torch")
    shell:
        "python -m retrieval_pretraining.audit --stage-stats {output.html} {input.artifacts} "
        "&> {log}"
