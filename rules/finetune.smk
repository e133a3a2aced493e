# Fine-tuning: stage 1 on BM25 negatives -> (rules/dense.smk: encode the corpus in shards -> FAISS
# index -> mine hard negatives) -> stage 2 on the mined negatives (-> more rounds for documents).
#
# {stage} is `stage<k>`, or `n<N>s<K>-stage<k>` for the low-resource mode (N sampled training
# queries, sample K). Every fine-tuning and dense-retrieval job is handed the part of the slice
# `finetune_knobs` builds that it reads (retrieval_pretraining/retrieval_settings.py says which),
# so that no other knob is a rerun trigger of it. Resume state of a training job lives in
# results/state/finetune/, outside the declared outputs.
from retrieval_pretraining.finetune.settings import caching_chunk, trainer_keys

# torchrun: what the launcher execs for several processes (run, not imported by launch.py).
_FINETUNE_CODE = ("launch", "torchrun", "finetune")


def finetune_models():
    return config_references.finetune_models(config)


def finetune_entry(dataset):
    for entry in config["finetune"]["datasets"]:
        if entry["dataset"] == dataset:
            return entry
    raise ValueError(
        f"dataset '{dataset}' is not in finetune.datasets; add an entry for it"
    )


def finetune_overrides(dataset):
    """The overrides of the finetune.datasets entry whose encoders run on `dataset` (trained_on):
    none on a dataset nothing is fine-tuned for (a baseline's column)."""
    for entry in config["finetune"]["datasets"]:
        if entry["dataset"] == trained_on(dataset):
            return entry.get("overrides", {})
    return {}


def zero_shot_source(dataset):
    """The dataset whose fine-tuned encoders `dataset` is evaluated with zero-shot (None: in-domain)."""
    for entry in config["evaluate"].get("zero_shot") or []:
        if entry["dataset"] == dataset:
            return entry["trained_on"]
    return None


def trained_on(dataset):
    """The dataset a run on `dataset` takes its fine-tuned encoder (and fine-tuning knobs) from."""
    return zero_shot_source(dataset) or dataset


def parse_stage(stage):
    """`n500s0-stage2` -> ("n500s0-", 500, 0, 2); `stage1` -> ("", None, None, 1)."""
    match = experiment_config.STAGE.fullmatch(stage)
    if not match:
        raise ValueError(f"stage '{stage}' is not stage<k> or n<N>s<K>-stage<k>")
    n, k, number = match["size"], match["sample"], match["number"]
    prefix = f"n{n}s{k}-" if n else ""
    return prefix, (int(n) if n else None), (int(k) if k else None), int(number)


def finetune_knobs(dataset, stage="stage1"):
    """The finetune slice for one dataset and stage: shared knobs, the dataset's overrides, its title
    mode and query-id rule, the low-resource sample named by the stage, the stage's epochs.
    A zero-shot target takes the overrides (q_len, p_len, pooling...) its encoder was trained with.
    """
    knobs = {
        k: v for k, v in config["finetune"].items() if k not in ("models", "datasets")
    }
    knobs |= finetune_entry(trained_on(dataset)).get("overrides", {})
    data = named("datasets", dataset)
    knobs |= {"title": data["title"], "exclude_self": data["exclude_query_id"]}
    _, n, k, number = parse_stage(stage)
    if n is not None:
        knobs |= {"train_queries": n, "train_sample": k}
    if number > 1:
        knobs["epochs"] = knobs["epochs_mined"]
    return knobs


def model_finetune_knobs(model):
    """The model's own fine-tuning knobs (`pretrain.models[].finetune`: the projector); only
    those set, so a model without any hands out the same slice as before."""
    return named(config["pretrain"]["models"], model).get("finetune", {})


def only(knobs, keys):
    """The knobs named in `keys`: a job's params are its rerun trigger, so each gets what it
    reads."""
    return {k: v for k, v in knobs.items() if k in keys}


def finetune_argument(wildcards):
    """The trainer's slice: the keys it reads (shards, search_depth, encode_batch_size, rounds...
    are left out, so that changing them reruns no fine-tuning job). A cache_chunk that covers a
    whole contrast set caches on no GPU count: null (caching_chunk), so that setting it reruns
    nothing either."""
    knobs = finetune_knobs(wildcards.dataset, wildcards.stage)
    knobs |= model_finetune_knobs(wildcards.model)
    if parse_stage(wildcards.stage)[3] > 1 and knobs["stage2_negatives"] == "separate":
        # Each negatives file its own examples (finetune/data.py); left out otherwise, so that
        # the slice of every other job stays what it was.
        knobs["negative_files"] = "separate"
    else:
        # Read by separate examples alone: a stage on one list never reads it, so it is no
        # rerun trigger of one (bow.yaml sets it on NQ / TriviaQA, whose stage 1 is one list).
        knobs.pop("example_positives", None)
    if "cache_chunk" in knobs:
        knobs["cache_chunk"] = caching_chunk(knobs)
    return experiment_config.stage_argument(only(knobs, trainer_keys()))


def heads_argument(wildcards, input):
    return f"--heads {input.heads}" if "heads" in input.keys() else ""


def sample_among_argument(wildcards, input):
    return (
        f"--sample-among {input.sample_among}" if "sample_among" in input.keys() else ""
    )


def train_split_files(wildcards):
    split = finetune_entry(wildcards.dataset)["split"]
    folder = f"results/datasets/{wildcards.dataset}"
    return {
        "queries": f"{folder}/queries-{split}.parquet",
        "qrels": f"{folder}/qrels-{split}.parquet",
    }


def stage1_init_encoder(model, dataset, stage="stage1"):
    """The encoder stage 1 starts from: the pre-trained one, or another dataset's fine-tuned stage
    (stage1_init: msmarco-passage/stage2, the passage model the COSTA documents start from).
    """
    source = finetune_knobs(dataset, stage)["stage1_init"]
    if source == "pretrained":
        return f"results/pretrain/{model}/encoder"
    return encoder_path(model, *source.split("/"))


def encoder_path(model, dataset, stage):
    """The encoder of system `{model}-{stage}` on its fine-tuning dataset: stage 0 is the
    pre-trained encoder itself (no fine-tuning: the zero-shot rows); stage 1 with `stage1: init`
    is its init encoder, untrained; every other stage is a fine-tuned encoder."""
    _, _, _, number = parse_stage(stage)
    if number == 0:
        return f"results/pretrain/{model}/encoder"
    if number == 1 and finetune_knobs(dataset, stage)["stage1"] == "init":
        return stage1_init_encoder(model, dataset, stage)
    return f"results/finetune/{model}/{dataset}/{stage}/encoder"


def trained_stages(dataset):
    """The stage numbers that fine-tune on `dataset` (rounds + 1, less stage 1 when it is init)."""
    knobs = finetune_knobs(dataset)
    first = 1 if knobs["stage1"] == "bm25" else 2
    return range(first, knobs["rounds"] + 2)


def bm25_negatives_path(dataset):
    """The BM25 negatives a fine-tuning stage of `dataset` reads, refused when its bm25.negatives
    entry names another split than finetune.datasets trains on: negatives are keyed by query id,
    so another split's would name no training query, and each group would be padded with random
    corpus documents (queries_without_negatives: pad) without an error."""
    trained = finetune_entry(dataset)["split"]
    built = bm25_negatives_entry(dataset)["split"]
    if built != trained:
        raise ValueError(
            f"bm25.negatives names split '{built}' for {dataset}, but finetune.datasets trains "
            f"on its split '{trained}'; build the negatives of split '{trained}'"
        )
    return f"results/bm25/{dataset}/negatives.parquet"


def get_finetune_inputs(wildcards):
    """Init encoder and negatives of a stage: stage 1 = its init encoder + BM25 negatives;
    stage k > 1 = stage k-1's encoder (or the pre-trained one) + negatives mined with stage k-1.
    """
    prefix, _, _, number = parse_stage(wildcards.stage)
    model, dataset = wildcards.model, wildcards.dataset
    knobs = finetune_knobs(dataset, wildcards.stage)
    inputs = train_split_files(wildcards) | {
        "corpus": f"results/datasets/{dataset}/corpus.parquet"
    }
    if model_finetune_knobs(model).get("projector"):  # the pre-trained COSTA projector
        inputs["heads"] = f"results/pretrain/{model}/heads.safetensors"
    if (
        prefix
        and knobs["queries_without_negatives"] == "drop"
        and knobs["stage1"] == "bm25"
    ):
        # The low-resource sample is drawn among the queries stage 1 can train (those with BM25
        # negatives), at every stage: N trained queries, the same at each (finetune/data.py).
        inputs["sample_among"] = bm25_negatives_path(dataset)
    if number == 1:
        init = stage1_init_encoder(model, dataset, wildcards.stage)
        return inputs | {"init": init, "negatives": [bm25_negatives_path(dataset)]}
    previous = f"{prefix}stage{number - 1}"
    negatives = [
        f"results/finetune/{model}/{dataset}/{previous}/hard-negatives.parquet"
    ]
    if knobs["stage2_negatives"] in ("union", "separate"):
        negatives.append(bm25_negatives_path(dataset))
    return inputs | {
        "init": (
            encoder_path(model, dataset, previous)
            if knobs["stage2_init"] == "previous"
            else f"results/pretrain/{model}/encoder"
        ),
        "negatives": negatives,
    }


# Started by retrieval_pretraining.launch: min(gpu, visible GPUs) processes (torchrun for > 1), or
# srun + one torchrun per node in a multi-node Slurm job; it execs, so SIGTERM/SIGUSR1 reach the trainer.
_FINETUNE_SHELL = (
    "python -m retrieval_pretraining.launch --module retrieval_pretraining.finetune "
    "--gpus {resources.gpu} -- --config '{params.finetune}' --init {input.init} "
    "--queries {input.queries} --qrels {input.qrels} --corpus {input.corpus} "
    "--negatives {input.negatives} --seed {params.seed} --out {output.encoder} "
    "--state {params.state} --metrics {output.metrics} {params.heads} {params.sample_among} "
    "&> {log}"
)


# Fine-tune a pre-trained encoder on BM25 negatives (never asked for when stage1 is init).
rule finetune_stage1:
    input:
        unpack(get_finetune_inputs),
        code=module_source(*_FINETUNE_CODE),
    output:
        encoder=directory("results/finetune/{model}/{dataset}/{stage}/encoder"),
        metrics="results/finetune/{model}/{dataset}/{stage}/metrics.jsonl",
        loss=report(
            "results/finetune/{model}/{dataset}/{stage}/loss.png",
            caption="../workflow/report/finetune_loss.rst",
            category="3. Fine-tuning",
            subcategory="{dataset}",
            labels={"model": "{model}", "stage": "{stage}"},
        ),
    log:
        "results/logs/finetune/{model}/{dataset}/{stage}.log",
    benchmark:
        "results/benchmarks/finetune/{model}/{dataset}/{stage}.tsv"
    wildcard_constraints:
        stage=r"(n[0-9]+s[0-9]+-)?stage1",
    conda:
        conda_env("torch")
    # Intrinsic needs of the demo; paper-scale values are set per rule in profiles/default/.
    threads: 2
    resources:
        gpu=1,
        mem_mb=8000,
        runtime=60,
    params:
        finetune=finetune_argument,
        heads=heads_argument,
        sample_among=sample_among_argument,
        seed=config["seed"],
        state="results/state/finetune/{model}/{dataset}/{stage}",
    shell:
        _FINETUNE_SHELL


# Fine-tune on hard negatives mined with the previous stage (one rule for every later round).
rule finetune_stage2:
    input:
        unpack(get_finetune_inputs),
        code=module_source(*_FINETUNE_CODE),
    output:
        encoder=directory("results/finetune/{model}/{dataset}/{stage}/encoder"),
        metrics="results/finetune/{model}/{dataset}/{stage}/metrics.jsonl",
        loss=report(
            "results/finetune/{model}/{dataset}/{stage}/loss.png",
            caption="../workflow/report/finetune_loss.rst",
            category="3. Fine-tuning",
            subcategory="{dataset}",
            labels={"model": "{model}", "stage": "{stage}"},
        ),
    log:
        "results/logs/finetune/{model}/{dataset}/{stage}.log",
    benchmark:
        "results/benchmarks/finetune/{model}/{dataset}/{stage}.tsv"
    wildcard_constraints:
        stage=r"(n[0-9]+s[0-9]+-)?stage([2-9]|[1-9][0-9]+)",
    conda:
        conda_env("torch")
    # Intrinsic needs of the demo; paper-scale values are set per rule in profiles/default/.
    threads: 2
    resources:
        gpu=1,
        mem_mb=8000,
        runtime=60,
    params:
        finetune=finetune_argument,
        heads=heads_argument,
        sample_among=sample_among_argument,
        seed=config["seed"],
        state="results/state/finetune/{model}/{dataset}/{stage}",
    shell:
        _FINETUNE_SHELL
