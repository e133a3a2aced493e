# Fine-tuning and dense retrieval: stage 1 on BM25 negatives -> encode the corpus in shards -> FAISS
# index -> mine hard negatives -> stage 2 (-> more rounds for documents) -> TREC runs of every stage.
#
# {stage} is `stage<k>`, or `n<N>s<K>-stage<k>` for the low-resource mode (N sampled training
# queries, sample K); systems are named `{model}-{stage}` (results/runs/{dataset}/{model}-{stage}/).
# Resume state of a training job lives in results/state/finetune/, outside the declared outputs.
import re as _re

_STAGE_RE = r"(n[0-9]+s[0-9]+-)?stage[0-9]+"
_FINETUNE_CODE = ("launch", "finetune")


def finetune_models():
    names = [m["name"] for m in config["pretrain"]["models"]]
    chosen = config["finetune"]["models"]
    unknown = sorted(set(chosen or []) - set(names))
    if unknown:
        raise ValueError(
            f"finetune.models names {unknown}, not in pretrain.models ({names})"
        )
    return chosen or names


def finetune_entry(dataset):
    for entry in config["finetune"]["datasets"]:
        if entry["dataset"] == dataset:
            return entry
    raise ValueError(
        f"dataset '{dataset}' is not in finetune.datasets; add an entry for it"
    )


def zero_shot_source(dataset):
    """The dataset whose fine-tuned encoders `dataset` is evaluated with zero-shot (None: in-domain)."""
    for entry in config["evaluate"].get("zero_shot") or []:
        if entry["dataset"] == dataset:
            return entry["trained_on"]
    return None


def trained_on(dataset):
    """The dataset a run on `dataset` takes its fine-tuned encoder (and fine-tuning knobs) from."""
    return zero_shot_source(dataset) or dataset


def stage_encoder(wildcards):
    """The fine-tuned encoder that encodes and searches `dataset`: its own, or the zero-shot source's."""
    source = trained_on(wildcards.dataset)
    return f"results/finetune/{wildcards.model}/{source}/{wildcards.stage}/encoder"


def parse_stage(stage):
    """`n500s0-stage2` -> ("n500s0-", 500, 0, 2); `stage1` -> ("", None, None, 1)."""
    match = _re.fullmatch(r"(?:n([0-9]+)s([0-9]+)-)?stage([0-9]+)", stage)
    if not match:
        raise ValueError(f"stage '{stage}' is not stage<k> or n<N>s<K>-stage<k>")
    n, k, number = match.groups()
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


def finetune_argument(wildcards):
    return experiment_config.stage_argument(
        finetune_knobs(wildcards.dataset, wildcards.stage)
    )


def mining_argument(wildcards):
    mining = config["mining"]
    knobs = finetune_knobs(wildcards.dataset, wildcards.stage)
    knobs |= {k: v for k, v in mining.items() if k != "index"}
    knobs["use_gpu"] = mining["index"].get("use_gpu", "auto")
    return experiment_config.stage_argument(knobs)


def search_argument(wildcards):
    knobs = finetune_knobs(wildcards.dataset, wildcards.stage)
    knobs["use_gpu"] = config["mining"]["index"].get("use_gpu", "auto")
    return experiment_config.stage_argument(knobs)


def train_split_files(wildcards):
    split = finetune_entry(wildcards.dataset)["split"]
    folder = f"results/datasets/{wildcards.dataset}"
    return {
        "queries": f"{folder}/queries-{split}.parquet",
        "qrels": f"{folder}/qrels-{split}.parquet",
    }


def get_finetune_inputs(wildcards):
    """Init encoder and negatives of a stage: stage 1 = pre-trained encoder + BM25 negatives;
    stage k > 1 = stage k-1 (or the pre-trained encoder) + negatives mined with stage k-1.
    """
    prefix, _, _, number = parse_stage(wildcards.stage)
    base = f"results/finetune/{wildcards.model}/{wildcards.dataset}"
    pretrained = f"results/pretrain/{wildcards.model}/encoder"
    bm25 = f"results/bm25/{wildcards.dataset}/negatives.parquet"
    knobs = finetune_knobs(wildcards.dataset, wildcards.stage)
    inputs = train_split_files(wildcards) | {
        "corpus": f"results/datasets/{wildcards.dataset}/corpus.parquet"
    }
    if number == 1:
        source = knobs["stage1_init"]
        init = (
            pretrained
            if source == "pretrained"
            else f"results/finetune/{wildcards.model}/{source}/encoder"
        )
        return inputs | {"init": init, "negatives": [bm25]}
    previous = f"{base}/{prefix}stage{number - 1}"
    mined = [f"{previous}/hard-negatives.parquet"]
    return inputs | {
        "init": (
            f"{previous}/encoder" if knobs["stage2_init"] == "previous" else pretrained
        ),
        "negatives": mined + ([bm25] if knobs["stage2_negatives"] == "union" else []),
    }


def encoded_shards(wildcards):
    shards = finetune_knobs(wildcards.dataset, wildcards.stage)["shards"]
    folder = f"results/index/{wildcards.model}/{wildcards.dataset}/{wildcards.stage}"
    return {
        "npy": [f"{folder}/shard-{s:04d}.npy" for s in range(shards)],
        "ids": [f"{folder}/shard-{s:04d}.ids.parquet" for s in range(shards)],
    }


def dense_run_cells():
    """(dataset, model, stage, split) of every dense run: each fine-tuned model, stage (1 + rounds)
    and evaluated split, in-domain and on every zero-shot target (with its source's rounds).
    """
    sources = [(e["dataset"], e["dataset"]) for e in config["finetune"]["datasets"]]
    sources += [
        (e["dataset"], e["trained_on"])
        for e in config["evaluate"].get("zero_shot") or []
    ]
    for dataset, trained in sources:
        rounds = finetune_knobs(trained)["rounds"]
        splits = [
            e["split"] for e in config["evaluate"]["splits"] if e["dataset"] == dataset
        ]
        for model in finetune_models():
            for number in range(1, rounds + 2):
                for split in splits:
                    yield dataset, model, f"stage{number}", split


def get_dense_run_targets():
    """TREC runs of every fine-tuned model, stage and evaluated split (dense_run_cells)."""
    return [
        f"results/runs/{dataset}/{model}-{stage}/{split}.trec"
        for dataset, model, stage, split in dense_run_cells()
    ]


# Started by retrieval_pretraining.launch: min(gpu, visible GPUs) processes (torchrun for > 1), or
# srun + one torchrun per node in a multi-node Slurm job; it execs, so SIGTERM/SIGUSR1 reach the trainer.
_FINETUNE_SHELL = (
    "python -m retrieval_pretraining.launch --module retrieval_pretraining.finetune "
    "--gpus {resources.gpu} -- --config '{params.finetune}' --init {input.init} "
    "--queries {input.queries} --qrels {input.qrels} --corpus {input.corpus} "
    "--negatives {input.negatives} --seed {params.seed} --out {output.encoder} "
    "--state {params.state} --metrics {output.metrics} &> {log}"
)


# Fine-tune a pre-trained encoder on BM25 negatives.
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
        seed=config["seed"],
        state="results/state/finetune/{model}/{dataset}/{stage}",
    shell:
        _FINETUNE_SHELL


# One contiguous slice of the corpus -> vectors (.npy) + doc ids.
rule encode_corpus_shard:
    input:
        encoder=stage_encoder,
        corpus="results/datasets/{dataset}/corpus.parquet",
        code=module_source("encode"),
    output:
        npy="results/index/{model}/{dataset}/{stage}/shard-{shard}.npy",
        ids="results/index/{model}/{dataset}/{stage}/shard-{shard}.ids.parquet",
    log:
        "results/logs/encode_corpus_shard/{model}/{dataset}/{stage}/{shard}.log",
    wildcard_constraints:
        stage=_STAGE_RE,
    conda:
        conda_env("torch")
    threads: 2
    params:
        encode=search_argument,
        shards=lambda wc: finetune_knobs(wc.dataset, wc.stage)["shards"],
    shell:
        "python -m retrieval_pretraining.encode --config '{params.encode}' --corpus {input.corpus} "
        "--encoder {input.encoder} --shard {wildcards.shard} --shards {params.shards} "
        "--out-npy {output.npy} --out-ids {output.ids} &> {log}"


# The FAISS index of a stage's corpus vectors, saved as Pyserini's FaissSearcher reads it.
rule build_dense_index:
    input:
        unpack(encoded_shards),
        code=module_source("faiss_index"),
    output:
        index=directory("results/index/{model}/{dataset}/{stage}/faiss"),
    log:
        "results/logs/build_dense_index/{model}/{dataset}/{stage}.log",
    wildcard_constraints:
        stage=_STAGE_RE,
    conda:
        conda_env("faiss")
    params:
        index=lambda wc: experiment_config.stage_argument(config["mining"]["index"]),
    shell:
        "python -m retrieval_pretraining.faiss_index --config '{params.index}' --npy {input.npy} "
        "--ids {input.ids} --out {output.index} &> {log}"


# Search the training queries with a stage's encoder; keep non-positives by the mining policy.
rule mine_hard_negatives:
    input:
        unpack(train_split_files),
        index="results/index/{model}/{dataset}/{stage}/faiss",
        encoder="results/finetune/{model}/{dataset}/{stage}/encoder",
        code=module_source("mine"),
    output:
        negatives="results/finetune/{model}/{dataset}/{stage}/hard-negatives.parquet",
    log:
        "results/logs/mine_hard_negatives/{model}/{dataset}/{stage}.log",
    wildcard_constraints:
        stage=_STAGE_RE,
    conda:
        conda_env("faiss")
    params:
        mining=mining_argument,
        seed=config["seed"],
    shell:
        "python -m retrieval_pretraining.mine --config '{params.mining}' --index {input.index} "
        "--encoder {input.encoder} --queries {input.queries} --qrels {input.qrels} "
        "--seed {params.seed} --out {output.negatives} &> {log}"


# A split's queries against a stage's index, depth search_depth, as a TREC run. A zero-shot target
# (evaluate.zero_shot) is encoded and searched with the encoder fine-tuned on its source dataset.
rule dense_search:
    input:
        index="results/index/{model}/{dataset}/{stage}/faiss",
        encoder=stage_encoder,
        queries="results/datasets/{dataset}/queries-{split}.parquet",
        code=module_source("dense_search"),
    output:
        run="results/runs/{dataset}/{model}-{stage}/{split}.trec",
    log:
        "results/logs/dense_search/{dataset}/{model}-{stage}/{split}.log",
    wildcard_constraints:
        # Only configured model names: `costa-n500s0-stage1` must not parse as model `costa-n500s0`.
        model="|".join(_re.escape(m["name"]) for m in config["pretrain"]["models"]),
        stage=_STAGE_RE,
        split="[A-Za-z0-9_.-]+",
    conda:
        conda_env("faiss")
    params:
        search=search_argument,
    shell:
        "python -m retrieval_pretraining.dense_search --config '{params.search}' --index {input.index} "
        "--encoder {input.encoder} --queries {input.queries} --tag {wildcards.model}-{wildcards.stage} "
        "--out {output.run} &> {log}"
