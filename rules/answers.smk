# Open-domain QA datasets (datasets[].format dpr: Natural Questions, TriviaQA): answer lists,
# answer-recall scoring (Acc@k, rules/evaluate.smk) and the answers negative filter (BM25
# negatives in rules/retrieval.smk, FAISS mining in rules/dense.smk).
from retrieval_pretraining.answer_accuracy import acc_cutoffs


def negative_filter(dataset):
    """mining.negative_filter for one dataset (its mining.overrides entry applied): auto =
    answers for format dpr, else qrels."""
    chosen = mining_settings(dataset).get("negative_filter", "auto")
    is_dpr = dataset_entry(dataset)["format"] == "dpr"
    if chosen == "answers" and not is_dpr:
        raise ValueError(
            f"mining.negative_filter (or its mining.overrides entry) is answers, but dataset "
            f"'{dataset}' has no answer lists "
            "(only format dpr datasets do); set it to auto"
        )
    if chosen == "auto":
        return "answers" if is_dpr else "qrels"
    return chosen


def answer_match(dataset):
    """How the dataset's answers match text: the answer_match of the evaluate.splits entries of
    its collection (it, its alias source, their aliases: one set of answers; regex for
    CuratedTREC). The answers filter must match as Acc@k does, or the passages Acc@k counts as
    answers become negatives; an alias fine-tuned but not scored matched by plain string.
    """
    own = dataset_aliases.collection(dataset, DATASET_ALIASES)
    modes = {
        entry.get("answer_match", "string")
        for entry in config["evaluate"]["splits"]
        if dataset_aliases.collection(entry["dataset"], DATASET_ALIASES) == own
    }
    if len(modes) > 1:
        raise ValueError(
            f"dataset '{dataset}': the evaluate.splits entries of its collection '{own}' "
            f"disagree on answer_match ({', '.join(sorted(modes))}); its answers are of one kind"
        )
    return modes.pop() if modes else "string"


def negative_filter_policy(dataset):
    """The filter's keys for a negatives job: answer_match only with the answers filter (jobs
    filtered by qrels keep their parameters)."""
    chosen = negative_filter(dataset)
    if chosen == "answers":
        return {"negative_filter": chosen, "answer_match": answer_match(dataset)}
    return {"negative_filter": chosen}


def answer_files(dataset, split):
    folder = f"{DATASETS_DIR}/{dataset}"
    return {
        "answers": f"{folder}/answers-{split}.parquet",
        "corpus": f"{folder}/corpus.parquet",
    }


def negative_filter_inputs(dataset, split):
    """The answers and corpus files when the dataset's negatives are filtered by answers."""
    if negative_filter(dataset) == "answers":
        return answer_files(dataset, split)
    return {}


def mining_filter_inputs(wildcards):
    split = finetune_entry(wildcards.dataset)["split"]
    return negative_filter_inputs(wildcards.dataset, split)


def input_options(input, *names):
    """`--<name> <path>` for each of `names` among a job's inputs (optional inputs)."""
    return " ".join(f"--{name} {input[name]}" for name in names if name in input.keys())


def score_run_inputs(wildcards):
    """qrels for the ir_measures measures; answers and corpus for Acc@k."""
    measures = evaluate_entry(wildcards.dataset, wildcards.split)["measures"]
    cutoffs = acc_cutoffs(measures)
    inputs = {}
    if len(cutoffs) < len(measures):
        folder = f"{DATASETS_DIR}/{wildcards.dataset}"
        inputs["qrels"] = f"{folder}/qrels-{wildcards.split}.parquet"
    if cutoffs:
        inputs |= answer_files(wildcards.dataset, wildcards.split)
    return inputs


# One split's answer lists (format dpr), read from the same file as its queries.
rule prepare_dataset_answers:
    input:
        sources=get_dataset_split_sources,
        code=module_source("datasets"),
    output:
        answers=f"{DATASETS_DIR}/{{dataset}}/answers-{{split}}.parquet",
    log:
        "results/logs/prepare_dataset_answers/{dataset}/{split}.log",
    wildcard_constraints:
        dataset=prepared_pattern(),
        split="[A-Za-z0-9_.-]+",
    conda:
        conda_env("torch")
    params:
        args=lambda wc: split_arguments(wc.dataset, wc.split, allowances=False),
        out=lambda wc: f"{DATASETS_DIR}/{wc.dataset}",
    shell:
        "python -m retrieval_pretraining.datasets answers --split {wildcards.split} "
        "{params.args} --out {params.out} &> {log}"
