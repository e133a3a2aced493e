# Results: results/tables.md (+ HTML for the report), analyses, per-stage statistics.
# Everything here is driven by the `report` config section; `report_targets()` lists what to build.
import hashlib as _hashlib
import json as _json


def report_models():
    return [
        {"name": m["name"], "objective": m["objective"]}
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


def report_systems(table):
    """(dataset, system, split) of every cell of one configured table."""
    stages = table.get("groups") or config["report"]["stages"]
    models = [r["model"] for r in table.get("rows") or []] or [
        m["name"] for m in report_models()
    ]
    systems = (["bm25"] if table.get("bm25", True) else []) + [
        f"{m}-{s['suffix']}" for s in stages for m in models
    ]
    for baseline in (
        table.get("baselines") or config["report"]["significance"]["baselines"]
    ):
        systems += (
            [baseline["system"]]
            if "system" in baseline
            else [f"{baseline['model']}-{s['suffix']}" for s in stages]
        )
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
    and a hash of the whole resolved config for the provenance block."""
    report_section = {k: v for k, v in config["report"].items() if k != "analysis"}
    return experiment_config.stage_argument(
        {
            "experiment": config["experiment"],
            "config_hash": _hashlib.sha256(
                _json.dumps(config, sort_keys=True).encode()
            ).hexdigest()[:16],
            "report": report_section,
            "models": report_models(),
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
        }
    )


def get_stage_artifacts():
    """Artifacts whose manifests feed the per-stage statistics page."""
    datasets = [d["name"] for d in config["datasets"]]
    return (
        get_all_articles()
        + expand("results/corpus/chunks/shard-{shard}.parquet", shard=shard_ids())
        + expand(
            "results/corpus/spans/{spans}/shard-{shard}.parquet",
            spans=[s["name"] for s in config["spans"]],
            shard=shard_ids(),
        )
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
            encoders += [f"{base}/stage{k}/encoder" for k in range(1, rounds + 2)]
            negatives += [
                f"{base}/stage{k}/hard-negatives.parquet" for k in range(1, rounds + 1)
            ]
    indexes = sorted(
        {
            f"results/index/{model}/{dataset}/{stage}/faiss"
            for dataset, model, stage, _ in dense_run_cells()
        }
    )
    bm25_runs = [
        f"results/bm25/{e['dataset']}/runs/{e['split']}.trec"
        for e in config["evaluate"]["splits"]
    ]
    return (
        encoders
        + negatives
        + indexes
        + bm25_runs
        + get_dense_run_targets()
        + get_report_metrics()
    )


def report_targets():
    """What the report adds to `rule all`."""
    analysis = config["report"]["analysis"]
    targets = [
        "results/tables.md",
        "results/report/tables.html",
        "results/report/stage-statistics.html",
    ]
    if config["report"]["low_resource"]:
        targets.append("results/analysis/low-resource.png")
    if analysis["loss_curves"]:
        targets.append("results/analysis/loss-curves.png")
    if analysis["tsne"]:
        targets.append(
            f"results/analysis/tsne/{analysis['tsne']['dataset']}/{analysis['tsne']['split']}.png"
        )
    if analysis["coverage"]:
        targets.append("results/analysis/coverage.png")
    if analysis["cpdae_top_words"]:
        targets.append("results/analysis/cpdae-top-words.html")
    return targets


def analysis_config(key):
    return experiment_config.stage_argument(config["report"]["analysis"][key])


def tsne_config():
    """The t-SNE slice plus how the fine-tuned encoders embed text (pooling, similarity)."""
    embedding = {
        k: config["finetune"][k]
        for k in ("pooling", "similarity")
        if k in config.get("finetune", {})
    }
    return experiment_config.stage_argument(
        embedding | config["report"]["analysis"]["tsne"]
    )


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


rule loss_curves:
    input:
        metrics=expand(
            "results/pretrain/{model}/metrics.jsonl",
            model=[m["name"] for m in report_models()],
        ),
        code=module_source("analysis"),
    output:
        figure=report(
            "results/analysis/loss-curves.png",
            caption="../workflow/report/loss_curves.rst",
            category="2. Pre-training",
        ),
        json="results/analysis/loss-curves.json",
    log:
        "results/logs/analysis/loss_curves.log",
    localrule: True
    conda:
        conda_env("torch")
    params:
        models=lambda wc, input: " ".join(
            f"--model {m['name']}={path}"
            for m, path in zip(report_models(), input.metrics)
        ),
    shell:
        "python -m retrieval_pretraining.analysis loss-curves {params.models} "
        "--out {output.figure} --json {output.json} &> {log}"


def tsne_inputs(wildcards):
    cfg = config["report"]["analysis"]["tsne"]
    ds, stage = wildcards.dataset, cfg["stage"]
    return {
        "encoders": [
            f"results/finetune/{m}/{ds}/{stage}/encoder" for m in cfg["models"]
        ],
        "runs": [
            f"results/runs/{ds}/{m}-{stage}/{wildcards.split}.trec"
            for m in cfg["models"]
        ],
        "corpus": f"results/datasets/{ds}/corpus.parquet",
        "info": f"results/datasets/{ds}/dataset.json",
        "queries": f"results/datasets/{ds}/queries-{wildcards.split}.parquet",
        "qrels": f"results/datasets/{ds}/qrels-{wildcards.split}.parquet",
    }


rule tsne_candidates:
    input:
        unpack(tsne_inputs),
        code=module_source("analysis"),
    output:
        figure=report(
            "results/analysis/tsne/{dataset}/{split}.png",
            caption="../workflow/report/tsne.rst",
            category="4. Analyses",
        ),
        json="results/analysis/tsne/{dataset}/{split}.json",
    log:
        "results/logs/analysis/tsne/{dataset}/{split}.log",
    wildcard_constraints:
        dataset="[A-Za-z0-9_.-]+",
        split="[A-Za-z0-9_.-]+",
    conda:
        conda_env("torch")
    params:
        tsne=lambda wc: tsne_config(),
        models=lambda wc, input: " ".join(
            f"--model {m}={e},{r}"
            for m, e, r in zip(
                config["report"]["analysis"]["tsne"]["models"],
                input.encoders,
                input.runs,
            )
        ),
        dataset_dir=lambda wc: f"results/datasets/{wc.dataset}",
        seed=config["seed"],
    shell:
        "python -m retrieval_pretraining.analysis tsne --config '{params.tsne}' {params.models} "
        "--dataset-dir {params.dataset_dir} --seed {params.seed} --out {output.figure} "
        "--json {output.json} &> {log}"


rule token_coverage:
    input:
        encoders=(
            expand(
                "results/pretrain/{model}/encoder",
                model=config["report"]["analysis"]["coverage"]["models"],
            )
            if config["report"]["analysis"]["coverage"]
            else []
        ),
        chunks="results/corpus/chunks/shard-0000.parquet",
        code=module_source("analysis"),
    output:
        figure=report(
            "results/analysis/coverage.png",
            caption="../workflow/report/coverage.rst",
            category="4. Analyses",
        ),
        json="results/analysis/coverage.json",
    log:
        "results/logs/analysis/coverage.log",
    conda:
        conda_env("torch")
    params:
        coverage=lambda wc: analysis_config("coverage"),
        models=lambda wc, input: " ".join(
            f"--model {m}={e}"
            for m, e in zip(
                config["report"]["analysis"]["coverage"]["models"], input.encoders
            )
        ),
    shell:
        "python -m retrieval_pretraining.analysis coverage --config '{params.coverage}' {params.models} "
        "--chunks {input.chunks} --out {output.figure} --json {output.json} &> {log}"


rule cpdae_top_words:
    input:
        encoder=(
            f"results/pretrain/{config['report']['analysis']['cpdae_top_words']['model']}/encoder"
            if config["report"]["analysis"]["cpdae_top_words"]
            else []
        ),
        code=module_source("analysis"),
    output:
        words="results/analysis/cpdae-top-words.md",
        html=report(
            "results/analysis/cpdae-top-words.html",
            caption="../workflow/report/cpdae_words.rst",
            category="4. Analyses",
        ),
    log:
        "results/logs/analysis/cpdae_top_words.log",
    localrule: True
    conda:
        conda_env("torch")
    params:
        words=lambda wc: analysis_config("cpdae_top_words"),
        model=lambda wc, input: f"--model cpdae={input.encoder}",
    shell:
        "python -m retrieval_pretraining.analysis cpdae-words --config '{params.words}' {params.model} "
        "--out {output.words} --html {output.html} &> {log}"


rule stage_statistics:
    input:
        # A function: the dump's part list is known only after the fetch_dumpstatus checkpoint.
        artifacts=lambda wildcards: get_stage_artifacts(),
        code=module_source("audit", "tables"),
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
        "python -m retrieval_pretraining.audit --stage-stats {output.html} {input.artifacts} &> {log}"
