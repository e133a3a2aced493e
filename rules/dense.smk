# Dense retrieval with fine-tuned encoders: encode the corpus in shards -> FAISS index -> mine hard
# negatives for the next fine-tuning stage (rules/finetune.smk), and TREC runs of every stage.
#
# Systems are named `{model}-{stage}` (results/runs/{dataset}/{model}-{stage}/); {stage} as in
# rules/finetune.smk. A zero-shot target (evaluate.zero_shot) is encoded and searched with the
# encoder fine-tuned on its source dataset (`stage_encoder`).
import re as _re

from retrieval_pretraining.retrieval_settings import RUNTIME_KEYS as RETRIEVAL_RUNTIME
from retrieval_pretraining.retrieval_settings import corpus_keys, retrieval_keys

_STAGE_RE = experiment_config.STAGE_PATTERN  # a wildcard constraint: no named groups


def stage_encoder(wildcards):
    """The encoder that encodes and searches `dataset` at a stage: its own (or, for a zero-shot
    target, its source dataset's) encoder of that stage (finetune.smk `encoder_path`).
    """
    return encoder_path(wildcards.model, trained_on(wildcards.dataset), wildcards.stage)


def reported_stages():
    """Stage suffixes the report's tables show (report.stages, or a table's own groups)."""
    section = config["report"]
    groups = [t.get("groups") or section["stages"] for t in section["tables"]]
    return {g["suffix"] for table in groups for g in table}


def reported_encoders():
    """{"<dataset>/<model>-<stage>": encoder folder} for every dense system a table may show."""
    datasets = [e["dataset"] for e in config["finetune"]["datasets"]]
    datasets += [e["dataset"] for e in config["evaluate"].get("zero_shot") or []]
    return {
        f"{dataset}/{model}-{stage}": encoder_path(model, trained_on(dataset), stage)
        for dataset in datasets
        for model in finetune_models()
        for stage in sorted(reported_stages())
    }


def reported_shards():
    """{dataset: corpus shard count} of every dataset a dense system may be reported on: the
    tables' provenance names each encode_corpus_shard log (a dataset's overrides may change it).
    """
    datasets = [e["dataset"] for e in config["finetune"]["datasets"]]
    datasets += [e["dataset"] for e in config["evaluate"].get("zero_shot") or []]
    return {dataset: finetune_knobs(dataset)["shards"] for dataset in datasets}


def retrieval_knobs(wildcards, *added):
    """The retrieval knobs of the stage's fine-tuning slice and the slice keys `added`: not the
    training knobs (lr...), so that changing one re-encodes nothing a training job did not change
    (stage 0, an untrained stage-1 init encoder)."""
    knobs = finetune_knobs(wildcards.dataset, wildcards.stage)
    return only(knobs, retrieval_keys() | set(added))


def retrieval_runtime(knobs):
    """`--runtime` of encoding, mining and search: the RETRIEVAL_RUNTIME keys of `knobs` (JSON).
    A resource, not params: lowering encode_batch_size after an out-of-memory error must not
    re-encode the corpus and so re-mine and retrain every later stage."""
    return experiment_config.stage_argument(only(knobs, RETRIEVAL_RUNTIME))


def stage_runtime(wildcards):
    return retrieval_runtime(finetune_knobs(wildcards.dataset, wildcards.stage))


def index_argument():
    """faiss_index's slice: mining.index less use_gpu, which only the searches read (a job's
    params are its rerun trigger: searching on the CPU must not rebuild the index)."""
    index = config["mining"]["index"]
    return experiment_config.stage_argument(
        {k: v for k, v in index.items() if k != "use_gpu"}
    )


def mining_argument(wildcards):
    """mine.py's slice: the retrieval knobs, exclude_self, the dataset's mining policy (its
    mining.overrides entry applied) and use_gpu."""
    knobs = retrieval_knobs(wildcards, "exclude_self")
    knobs |= mining_settings(wildcards.dataset)
    knobs["use_gpu"] = config["mining"]["index"].get("use_gpu", "auto")
    knobs |= negative_filter_policy(wildcards.dataset)
    return experiment_config.stage_argument(knobs)


def encode_argument(wildcards):
    """encode.py's slice: the retrieval knobs a corpus encoding reads (corpus_keys): no q_len,
    which only queries read, so that a new one re-encodes no corpus (nor rebuilds its index).
    """
    knobs = finetune_knobs(wildcards.dataset, wildcards.stage)
    return experiment_config.stage_argument(only(knobs, corpus_keys()))


def search_argument(wildcards):
    """dense_search.py's slice: the retrieval knobs, search_depth, exclude_self and use_gpu."""
    knobs = retrieval_knobs(wildcards, "search_depth", "exclude_self")
    knobs["use_gpu"] = config["mining"]["index"].get("use_gpu", "auto")
    return experiment_config.stage_argument(knobs)


def encoded_shards(wildcards):
    shards = finetune_knobs(wildcards.dataset, wildcards.stage)["shards"]
    folder = f"results/index/{wildcards.model}/{wildcards.dataset}/{wildcards.stage}"
    return {
        "npy": [f"{folder}/shard-{s:04d}.npy" for s in range(shards)],
        "ids": [f"{folder}/shard-{s:04d}.ids.parquet" for s in range(shards)],
    }


def encoded_vectors(path):
    """An encoding job's output: kept, or with mining.keep_vectors false temporary (Snakemake
    deletes it once its index is built and does not rebuild it while the index stands; the index
    holds the same vectors in fp32)."""
    return path if config["mining"].get("keep_vectors", True) else temp(path)


# The commands of corpus encoding and indexing, shared with the baselines (rules/baselines.smk).
# The GPU stages (encoding here, mining and searches below) start through claim_run: on a
# local run it claims the rule's `gpu` GPUs for the job, as the trainers' launcher does.
ENCODE_SHELL = (
    "python -m retrieval_pretraining.claim_run --gpus {resources.gpu} "
    "--module retrieval_pretraining.encode -- --config '{params.encode}' "
    "--runtime '{resources.retrieval_runtime}' --corpus {input.corpus} "
    "--encoder {input.encoder} --shard {wildcards.shard} --shards {params.shards} "
    "--out-npy {output.npy} --out-ids {output.ids} &> {log}"
)
INDEX_SHELL = (
    "python -m retrieval_pretraining.faiss_index --config '{params.index}' --npy {input.npy} "
    "--ids {input.ids} --out {output.index} &> {log}"
)


# One contiguous slice of the corpus -> vectors (.npy) + doc ids.
rule encode_corpus_shard:
    input:
        encoder=stage_encoder,
        corpus="results/datasets/{dataset}/corpus.parquet",
        code=module_source("claim_run", "encode"),
    output:
        npy=encoded_vectors("results/index/{model}/{dataset}/{stage}/shard-{shard}.npy"),
        ids=encoded_vectors(
            "results/index/{model}/{dataset}/{stage}/shard-{shard}.ids.parquet"
        ),
    log:
        "results/logs/encode_corpus_shard/{model}/{dataset}/{stage}/{shard}.log",
    wildcard_constraints:
        stage=_STAGE_RE,
    conda:
        conda_env("torch")
    threads: 2
    resources:
        gpu=1,
        retrieval_runtime=stage_runtime,
    params:
        encode=encode_argument,
        shards=lambda wc: finetune_knobs(wc.dataset, wc.stage)["shards"],
    shell:
        ENCODE_SHELL


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
        index=lambda wc: index_argument(),
    shell:
        INDEX_SHELL


# Search the training queries with a stage's encoder; keep non-positives by the mining policy.
rule mine_hard_negatives:
    input:
        unpack(train_split_files),
        unpack(mining_filter_inputs),
        index="results/index/{model}/{dataset}/{stage}/faiss",
        encoder=lambda wc: encoder_path(wc.model, wc.dataset, wc.stage),
        code=module_source("claim_run", "mine"),
    output:
        negatives="results/finetune/{model}/{dataset}/{stage}/hard-negatives.parquet",
    log:
        "results/logs/mine_hard_negatives/{model}/{dataset}/{stage}.log",
    wildcard_constraints:
        stage=_STAGE_RE,
    conda:
        conda_env("faiss")
    resources:
        gpu=1,
        retrieval_runtime=stage_runtime,
    params:
        mining=mining_argument,
        seed=config["seed"],
        answers=lambda wc, input: input_options(input, "answers", "corpus"),
    shell:
        "python -m retrieval_pretraining.claim_run --gpus {resources.gpu} "
        "--module retrieval_pretraining.mine -- --config '{params.mining}' --index {input.index} "
        "--encoder {input.encoder} --queries {input.queries} --qrels {input.qrels} "
        "--runtime '{resources.retrieval_runtime}' --seed {params.seed} {params.answers} "
        "--out {output.negatives} &> {log}"


# A split's queries against a stage's index, depth search_depth, as a TREC run. A zero-shot target
# (evaluate.zero_shot) is encoded and searched with the encoder fine-tuned on its source dataset.
rule dense_search:
    input:
        index="results/index/{model}/{dataset}/{stage}/faiss",
        encoder=stage_encoder,
        queries="results/datasets/{dataset}/queries-{split}.parquet",
        code=module_source("claim_run", "dense_search"),
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
    resources:
        gpu=1,
        retrieval_runtime=stage_runtime,
    params:
        search=search_argument,
    shell:
        "python -m retrieval_pretraining.claim_run --gpus {resources.gpu} "
        "--module retrieval_pretraining.dense_search -- --config '{params.search}' "
        "--runtime '{resources.retrieval_runtime}' --index {input.index} "
        "--encoder {input.encoder} --queries {input.queries} --tag {wildcards.model}-{wildcards.stage} "
        "--out {output.run} &> {log}"
