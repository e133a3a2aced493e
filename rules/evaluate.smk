# Scoring: any TREC run of any system -> metrics JSON, with the measures configured for its split.
# Systems: `bm25` (rules/retrieval.smk publishes its runs here), `{model}-stage1`, `{model}-stage2`.


def evaluate_entry(dataset, split):
    for entry in config["evaluate"]["splits"]:
        if entry["dataset"] == dataset and entry["split"] == split:
            return entry
    raise ValueError(
        f"no evaluate.splits entry for dataset '{dataset}' split '{split}'; add one (with its "
        "measures) to config.yaml"
    )


def get_metrics_targets(systems):
    """The metrics JSON of every evaluated split for each of `systems` (e.g. ["bm25"])."""
    return [
        f"results/metrics/{e['dataset']}/{system}/{e['split']}.json"
        for e in config["evaluate"]["splits"]
        for system in systems
    ]


rule score_run:
    input:
        unpack(score_run_inputs),
        run="results/runs/{dataset}/{system}/{split}.trec",
        code=module_source("evaluate"),
    output:
        metrics="results/metrics/{dataset}/{system}/{split}.json",
    log:
        "results/logs/score_run/{dataset}/{system}/{split}.log",
    wildcard_constraints:
        dataset="[A-Za-z0-9_.-]+",
        system="[A-Za-z0-9_.-]+",
        split="[A-Za-z0-9_.-]+",
    localrule: True
    conda:
        conda_env("torch")
    params:
        evaluate=lambda wc: experiment_config.stage_argument(
            {
                k: v
                for k, v in evaluate_entry(wc.dataset, wc.split).items()
                if k in ("measures", "relevance_level", "answer_match")
            }
        ),
        # --qrels for ir_measures measures; --answers --corpus for Acc@k (rules/answers.smk).
        files=lambda wc, input: input_options(input, "qrels", "answers", "corpus"),
    shell:
        "python -m retrieval_pretraining.evaluate --config '{params.evaluate}' --run {input.run} "
        "{params.files} --out {output.metrics} &> {log}"
