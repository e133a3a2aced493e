# Analyses where a picture says more than a table: loss curves, t-SNE of candidates, input-token
# coverage, CPDAE top words (python -m retrieval_pretraining.analysis <subcommand>). Driven by
# `report.analysis`; each is optional (false or null skips it); `analysis_targets()` lists them.
# Uses reached_models() from rules/report.smk, which the Snakefile includes first.


def analysis_targets():
    """The figures of the configured analyses (part of report_targets(), hence of `rule all`)."""
    analysis = config["report"]["analysis"]
    targets = []
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
    """The t-SNE slice plus the retrieval knobs its runs were encoded and searched with (pooling,
    similarity, q_len, p_len, title...: the dataset's and stage's `finetune_knobs`, overrides
    included, as dense.smk `retrieval_knobs` hands them to encoding and search), so the figure
    embeds what the runs ranked; and the split's relevance level (its evaluate.splits entry): the
    figure marks as relevant what the split's binary measures count (TREC DL passage: grade 2 up,
    not the related 1s). The block's own `pooling` (an explicit override) wins."""
    tsne = config["report"]["analysis"]["tsne"]
    knobs = only(finetune_knobs(tsne["dataset"], tsne["stage"]), retrieval_keys())
    entry = evaluate_entry(tsne["dataset"], tsne["split"])
    level = {"relevance_level": int(entry.get("relevance_level", 1))}
    return experiment_config.stage_argument(knobs | tsne | level)


rule loss_curves:
    input:
        # Only the models the report reaches (reached_models): a curve must not pre-train a model
        # that the overlay lists but tables nowhere.
        metrics=expand("results/pretrain/{model}/metrics.jsonl", model=reached_models()),
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
            f"--model {m}={path}" for m, path in zip(reached_models(), input.metrics)
        ),
    shell:
        "python -m retrieval_pretraining.analysis loss-curves {params.models} "
        "--out {output.figure} --json {output.json} &> {log}"


def tsne_inputs(wildcards):
    """The runs of the configured stage and the encoders that searched them (dense.smk
    `stage_encoder`: stage 0's pre-trained encoder, a `stage1: init` stage's init encoder, a
    zero-shot target's source encoder), so the figure asks for no encoder the runs did not use.
    """
    cfg = config["report"]["analysis"]["tsne"]
    ds, stage = wildcards.dataset, cfg["stage"]
    return {
        "encoders": [encoder_path(m, trained_on(ds), stage) for m in cfg["models"]],
        "runs": [
            f"results/runs/{ds}/{m}-{stage}/{wildcards.split}.trec"
            for m in cfg["models"]
        ],
        "corpus": f"results/datasets/{ds}/corpus.parquet",
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


def pretrain_heads(models):
    """heads.safetensors beside each model's encoder, which the analyses read (none beside a base
    checkpoint exported by objective `none`)."""
    return [
        f"results/pretrain/{m}/heads.safetensors"
        for m in models
        if pretrain_settings(m)["objective"] != "none"
    ]


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
        heads=pretrain_heads(
            (config["report"]["analysis"]["coverage"] or {}).get("models", [])
        ),
        # Coverage is measured on chunks of the corpus the models train on by default: those
        # every model held out of pre-training (training.json's held_out_chunks).
        chunks=chunk_paths(config["pretrain"]["corpus"]),
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
        "python -m retrieval_pretraining.analysis coverage --config '{params.coverage}' "
        "{params.models} --chunks {input.chunks} --out {output.figure} --json {output.json} &> {log}"


rule cpdae_top_words:
    input:
        encoder=(
            f"results/pretrain/{config['report']['analysis']['cpdae_top_words']['model']}/encoder"
            if config["report"]["analysis"]["cpdae_top_words"]
            else []
        ),
        heads=pretrain_heads(
            [(config["report"]["analysis"]["cpdae_top_words"] or {}).get("model")]
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
        "python -m retrieval_pretraining.analysis cpdae-words --config '{params.words}' "
        "{params.model} --out {output.words} --html {output.html} &> {log}"
