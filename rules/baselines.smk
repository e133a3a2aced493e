# Baseline encoders (evaluate.baselines): a published checkpoint (a `checkpoints` entry, staged by
# stage_checkpoint) or one of our pre-trained encoders as it is (`pretrain:<model>`), evaluated
# zero-shot with the commands our models use: corpus encoding in shards -> FAISS index -> dense
# run -> scoring (score_run). A report table lists them (`baseline_rows`) and so asks for their
# runs on its columns. The system is the baseline's name: results/runs/{dataset}/{baseline}/.
import re as _re

from retrieval_pretraining.retrieval_settings import corpus_keys

BASELINE_DIR = "results/baselines"


def baselines():
    return config["evaluate"].get("baselines") or []


def baseline_entry(name):
    return named(baselines(), name)


def _baseline_names():
    """The wildcard pattern of configured baseline names (matching nothing when there are none)."""
    return "|".join(_re.escape(b["name"]) for b in baselines()) or "(?!)"


def baseline_encoder(name):
    """The encoder folder: results/pretrain/<model>/encoder or results/checkpoints/<entry>."""
    source = baseline_entry(name)["checkpoint"]
    if source.startswith("pretrain:"):
        return f"results/pretrain/{source.removeprefix('pretrain:')}/encoder"
    return f"results/checkpoints/{source}"


def baseline_dataset_knobs(dataset):
    """finetune's knobs for the runs on `dataset`: the section's, with the overrides of the
    fine-tuning entry whose encoders search it (finetune_overrides), as finetune_knobs gives our
    encoders' runs there; so a table's baseline and fine-tuned rows on one dataset are searched
    as deep and stored as precisely, in as many shards. The section's alone on a dataset
    nothing is fine-tuned for."""
    shared = {
        k: v for k, v in config["finetune"].items() if k not in ("models", "datasets")
    }
    return shared | finetune_overrides(dataset)


def baseline_knobs(name, dataset):
    """encode.py's and dense_search.py's slice for a baseline on a dataset: its own pooling,
    similarity, lengths and prefixes; the dataset's dtype and search depth (finetune's, its
    overrides applied: baseline_dataset_knobs), title mode and query-id rule (as our models get
    them). Its encode_batch_size travels as `--runtime` (dense.smk `retrieval_runtime`).
    """
    entry, shared = baseline_entry(name), baseline_dataset_knobs(dataset)
    knobs = {k: shared[k] for k in ("dtype", "search_depth")}
    own = ("pooling", "similarity", "q_len", "p_len", "query_prefix", "passage_prefix")
    knobs |= {k: entry[k] for k in own if k in entry}
    data = named("datasets", dataset)
    knobs |= {"title": data["title"], "exclude_self": data["exclude_query_id"]}
    knobs["use_gpu"] = config["mining"]["index"].get("use_gpu", "auto")
    return knobs


def baseline_argument(wildcards):
    return experiment_config.stage_argument(
        baseline_knobs(wildcards.baseline, wildcards.dataset)
    )


def baseline_encode_argument(wildcards):
    """encode.py's slice: the passage-side retrieval knobs (corpus_keys) and passage_prefix
    alone, so that a search knob (search_depth, exclude_self, use_gpu) or a query-side one
    (q_len, query_prefix) re-encodes no corpus."""
    knobs = baseline_knobs(wildcards.baseline, wildcards.dataset)
    return experiment_config.stage_argument(
        only(knobs, corpus_keys() | {"passage_prefix"})
    )


def baseline_shards(wildcards):
    folder = f"{BASELINE_DIR}/{wildcards.baseline}/{wildcards.dataset}"
    shards = range(baseline_dataset_knobs(wildcards.dataset)["shards"])
    return {
        "npy": [f"{folder}/shard-{s:04d}.npy" for s in shards],
        "ids": [f"{folder}/shard-{s:04d}.ids.parquet" for s in shards],
    }


def baseline_report():
    """What the tables need of each baseline a table lists: label, encoder, published numbers,
    and the shard count of its corpus encoding on each dataset of its columns (its logs).
    """
    columns = {}
    for table in config["report"]["tables"]:
        for name in table.get("baseline_rows") or []:
            columns.setdefault(name, set()).update(
                c["dataset"] for c in table["columns"]
            )
    return {
        b["name"]: {
            "label": b.get("label") or b["name"],
            "encoder": baseline_encoder(b["name"]),
            "published": b.get("published") or [],
            # The tables' provenance names each encoded shard's log (encode_baseline_shard).
            "shards": {
                dataset: baseline_dataset_knobs(dataset)["shards"]
                for dataset in sorted(columns[b["name"]])
            },
        }
        for b in baselines()
        if b["name"] in columns
    }


def baseline_artifacts():
    """The index and runs behind every baseline cell of the tables (per-stage statistics)."""
    cells = {
        (c["dataset"], name, c["split"])
        for t in config["report"]["tables"]
        for name in t.get("baseline_rows") or []
        for c in t["columns"]
    }
    return sorted(
        {f"{BASELINE_DIR}/{b}/{d}/faiss" for d, b, _ in cells}
        | {f"results/runs/{d}/{b}/{s}.trec" for d, b, s in cells}
    )


# One contiguous slice of the corpus -> vectors (.npy) + doc ids, with the baseline's knobs.
rule encode_baseline_shard:
    input:
        encoder=lambda wc: baseline_encoder(wc.baseline),
        corpus="results/datasets/{dataset}/corpus.parquet",
        code=module_source("claim_run", "encode"),
    output:
        npy=encoded_vectors(
            f"{BASELINE_DIR}/{{baseline}}/{{dataset}}/shard-{{shard}}.npy"
        ),
        ids=encoded_vectors(
            f"{BASELINE_DIR}/{{baseline}}/{{dataset}}/shard-{{shard}}.ids.parquet"
        ),
    log:
        "results/logs/encode_baseline_shard/{baseline}/{dataset}/{shard}.log",
    wildcard_constraints:
        baseline=_baseline_names(),
        dataset="[A-Za-z0-9_.-]+",
    conda:
        conda_env("torch")
    threads: 2
    resources:
        gpu=1,
        retrieval_runtime=lambda wc: retrieval_runtime(
            baseline_dataset_knobs(wc.dataset)
        ),
    params:
        encode=baseline_encode_argument,
        shards=lambda wc: baseline_dataset_knobs(wc.dataset)["shards"],
    shell:
        ENCODE_SHELL


rule build_baseline_index:
    input:
        unpack(baseline_shards),
        code=module_source("faiss_index"),
    output:
        index=directory(f"{BASELINE_DIR}/{{baseline}}/{{dataset}}/faiss"),
    log:
        "results/logs/build_baseline_index/{baseline}/{dataset}.log",
    wildcard_constraints:
        baseline=_baseline_names(),
        dataset="[A-Za-z0-9_.-]+",
    conda:
        conda_env("faiss")
    params:
        index=lambda wc: index_argument(),
    shell:
        INDEX_SHELL


# A split's queries against the baseline's index (its query prefix and length) as a TREC run.
rule baseline_search:
    input:
        index=f"{BASELINE_DIR}/{{baseline}}/{{dataset}}/faiss",
        encoder=lambda wc: baseline_encoder(wc.baseline),
        queries="results/datasets/{dataset}/queries-{split}.parquet",
        code=module_source("claim_run", "dense_search"),
    output:
        run="results/runs/{dataset}/{baseline}/{split}.trec",
    log:
        "results/logs/baseline_search/{dataset}/{baseline}/{split}.log",
    wildcard_constraints:
        # Only configured names; config_checks.cross_check refuses bm25 and <model>-stage<k>.
        baseline=_baseline_names(),
        dataset="[A-Za-z0-9_.-]+",
        split="[A-Za-z0-9_.-]+",
    conda:
        conda_env("faiss")
    resources:
        gpu=1,
        retrieval_runtime=lambda wc: retrieval_runtime(
            baseline_dataset_knobs(wc.dataset)
        ),
    params:
        search=baseline_argument,
    shell:
        "python -m retrieval_pretraining.claim_run --gpus {resources.gpu} "
        "--module retrieval_pretraining.dense_search -- --config '{params.search}' "
        "--runtime '{resources.retrieval_runtime}' --index {input.index} "
        "--encoder {input.encoder} --queries {input.queries} --tag {wildcards.baseline} "
        "--out {output.run} &> {log}"
