# Scoring: any TREC run of any system -> metrics JSON, with the measures configured for its split.
# Systems: `bm25` (rules/retrieval.smk publishes its runs here), `{model}-stage1`, `{model}-stage2`.
from retrieval_pretraining.evaluate import check_computable, measure_cutoff


def check_splits_listed_once():
    """Fail at parse time on a (dataset, split) that evaluate.splits lists twice: it has one
    metrics file, which scoring fills with the first entry's measures (evaluate_entry) while
    the report's check reads the last one's, so a column passed the plan and failed at the
    end, after every run."""
    first, twice = {}, []
    for i, entry in enumerate(config["evaluate"]["splits"]):
        key = (entry["dataset"], entry["split"])
        if key in first:
            twice.append(
                f"evaluate.splits.{i} lists {key[0]} {key[1]} again "
                f"(evaluate.splits.{first[key]})"
            )
        first.setdefault(key, i)
    if twice:
        raise ValueError(
            "; ".join(twice)
            + ": a split is scored once, into one metrics file; put all its measures "
            "in one entry"
        )


def evaluate_entry(dataset, split):
    for entry in config["evaluate"]["splits"]:
        if entry["dataset"] == dataset and entry["split"] == split:
            return entry
    raise ValueError(
        f"no evaluate.splits entry for dataset '{dataset}' split '{split}'; add one (with its "
        "measures) to config.yaml"
    )


def run_depths(dataset):
    """(config key, depth) of every run scored on `dataset`, overrides applied: BM25's, and the
    dense runs' and baselines' (from the fine-tuning entry whose encoders search it, as
    rules/baselines.smk `baseline_dataset_knobs` reads it)."""
    dense = finetune_overrides(dataset).get(
        "search_depth", config["finetune"]["search_depth"]
    )
    return [
        ("bm25.depth", bm25_settings(dataset)["depth"]),
        ("finetune.search_depth", dense),
    ]


def check_run_depths():
    """Fail at parse time when a run would be shallower than its split's deepest cutoff: R@1000
    on a 100-deep run is R@100, which a table would show under R@1000's name (evaluate.py only
    warns). Measures without a cutoff (AP, Bpref) impose nothing."""
    problems = []
    for entry in config["evaluate"]["splits"]:
        cutoffs = {m: measure_cutoff(m) or 0 for m in entry["measures"]}
        deepest = max(cutoffs, key=cutoffs.get)
        for key, depth in run_depths(entry["dataset"]):
            if depth < cutoffs[deepest]:
                problems.append(
                    f"{key} is {depth} for {entry['dataset']}, shallower than {deepest} of "
                    f"its {entry['split']} split"
                )
    if problems:
        raise ValueError(
            "runs would be scored below their measures' cutoffs: "
            + "; ".join(problems)
            + ". Raise the depth to the deepest cutoff, or drop the measure from "
            "evaluate.splits."
        )


def check_measures_computable():
    """Fail at parse time on a measure no ir_measures provider computes at its split's
    relevance level (NumRel at level 2), instead of in every scoring job."""
    for entry in config["evaluate"]["splits"]:
        check_computable(entry["measures"], int(entry.get("relevance_level", 1)))


check_splits_listed_once()
check_run_depths()
check_measures_computable()


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
