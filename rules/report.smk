# Results: results/tables.md (+ HTML for the report), the low-resource figure, per-stage
# statistics. Everything here is driven by the `report` config section; `report_targets()` lists
# what to build. The analyses (`report.analysis`) have their rules in rules/analysis.smk.


def report_models():
    """Each model's name and objective, the entry it copies, and the datasets whose own corpus
    it was pre-trained on (which published numbers may sit beside it)."""
    return [
        {k: m[k] for k in ("name", "objective", "reuse_pretraining") if k in m}
        | {
            "pretrained_on": corpora_lib.pretraining_datasets(
                config["pretrain"], config["corpus"], m["name"]
            )
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
    """A table's model rows: its own, or (rows: null) the models fine-tuned and evaluated
    (finetune.models); [] = none (a table of baselines alone)."""
    rows = table.get("rows")
    return [{"model": m} for m in finetune_models()] if rows is None else rows


def report_systems(table):
    """(dataset, system, split) of every cell of one configured table."""
    stages = table.get("groups") or config["report"]["stages"]
    models = [r["model"] for r in table_rows(table)]
    systems = (["bm25"] if table.get("bm25", True) else []) + [
        f"{m}-{s['suffix']}" for s in stages for m in models
    ]
    systems += table.get("baseline_rows") or []  # rules/baselines.smk
    own = table.get("baselines")  # [] = no tests (tables/significance.baselines_for)
    for baseline in (
        config["report"]["significance"]["baselines"] if own is None else own
    ):
        if "system" in baseline:
            systems.append(baseline["system"])
        elif "model" in baseline and models:
            systems += [f"{baseline['model']}-{s['suffix']}" for s in stages]
        else:  # each row's own model at that stage (e.g. stage0, before fine-tuning)
            systems += [f"{m}-{baseline['stage']}" for m in models]
    return [
        (c["dataset"], system, c["split"])
        for c in table["columns"]
        for system in systems
    ]


def low_resource_systems():
    spec = config["report"]["low_resource"]
    if not spec:
        return []
    return [
        (
            spec["dataset"],
            spec["system"].format(model=m, size=n, split=k),
            spec["split"],
        )
        for m in spec["models"]
        for n in spec["sizes"]
        for k in range(spec["splits"])
    ]


def get_report_metrics():
    """Every metrics JSON a table, a significance test or the low-resource figure reads."""
    cells = [
        c for t in config["report"]["tables"] for c in report_systems(t)
    ] + low_resource_systems()
    return sorted(
        {f"results/metrics/{d}/{system}/{split}.json" for d, system, split in cells}
    )


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
            "bm25": {
                k: config["bm25"][k] for k in ("k1", "b") if k in config.get("bm25", {})
            },
            # Per dataset, with bm25.overrides applied: what each BM25 run really used.
            "bm25_by_dataset": {
                e["dataset"]: {
                    k: bm25_settings(e["dataset"]).get(k) for k in ("k1", "b")
                }
                for e in config["evaluate"]["splits"]
            },
            "trained_on": {
                e["dataset"]: e["trained_on"]
                for e in config["evaluate"].get("zero_shot") or []
            },
            "baselines": baseline_report(),  # label, encoder, published numbers
        }
    )


def get_stage_artifacts():
    """Artifacts whose manifests feed the per-stage statistics page."""
    datasets = [d["name"] for d in config["datasets"]]
    return (
        get_all_articles()
        + chunk_paths(used_corpora())
        + [
            path
            for corpus, spans in span_indexes()
            for path in expand(
                "results/corpus/{corpus}/spans/{spans}/shard-{shard}.parquet",
                corpus=corpus,
                spans=spans,
                shard=shard_ids(),
            )
        ]
        + expand(
            "results/pretrain/{model}/encoder",
            model=[m["name"] for m in report_models()],
        )
        + expand("results/datasets/{dataset}/corpus.parquet", dataset=datasets)
        + [
            f"results/bm25/{n['dataset']}/negatives.parquet"
            for n in config["bm25"]["negatives"]
        ]
        + finetune_stage_artifacts()
        + baseline_artifacts()
    )


def finetune_stage_artifacts():
    """Every fine-tuning stage's encoder and mined hard negatives, the dense index behind every
    dense run, the runs (BM25's own copy, which has the manifest) and the metrics the tables read
    (a metrics JSON holds its own statistics)."""
    encoders, negatives = [], []
    for entry in config["finetune"]["datasets"]:
        rounds = finetune_knobs(entry["dataset"])["rounds"]
        for model in finetune_models():
            base = f"results/finetune/{model}/{entry['dataset']}"
            encoders += [
                f"{base}/stage{k}/encoder" for k in trained_stages(entry["dataset"])
            ]
            negatives += [
                f"{base}/stage{k}/hard-negatives.parquet" for k in range(1, rounds + 1)
            ]
    indexes = sorted(
        {
            f"results/index/{model}/{dataset}/{stage}/faiss"
            for dataset, model, stage, _ in dense_run_cells()
        }
    )
    bm25_runs = sorted(  # the BM25 runs a table reads
        {
            f"results/bm25/{d}/runs/{split}.trec"
            for t in config["report"]["tables"]
            for d, system, split in report_systems(t)
            if system == "bm25"
        }
    )
    runs = bm25_runs + get_dense_run_targets()
    return encoders + negatives + indexes + runs + get_report_metrics()


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


rule low_resource_figure:
    input:
        metrics=get_report_metrics(),
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
        "--out {output.tables} --figure {output.figure} &> {log}"


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
