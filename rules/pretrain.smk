# Pre-training: one encoder per `pretrain.models` entry (retrieval_pretraining.pretrain).
# Trained objectives run `pretrain_model` (resumable: state in results/state/pretrain/{model}/, outside
# the declared outputs; exit 75 = stopped by SIGTERM/SIGUSR1 after saving, under torchrun too;
# a rerun or --retries resumes),
# reading the data store shared by every model (PRETRAIN_DATA, below);
# objective `none` is the cheap local rule `export_base_encoder`; an entry that reuses another's
# pre-training (`reuse_pretraining`: it differs only in how it is fine-tuned) copies its outputs.
# Started by retrieval_pretraining.launch (1 process, torchrun, or srun + torchrun per node): it
# execs, so SIGTERM/SIGUSR1 reach the trainer (torchrun and srun forward them to the workers).
import re

# torch-free: resolving settings at parse time must not import torch
from retrieval_pretraining.pretrain import settings as pretrain_settings_lib


def pretrain_settings(model):
    """The resolved settings of one model: all that its training job depends on."""
    return pretrain_settings_lib.resolve_model(
        config["pretrain"], model, config["seed"]
    )


def loss_settings(model):
    """What the provenance needs to state a model's loss reductions (its objective, micro- and
    global batch, own option block): pretrain.settings.loss_settings."""
    return pretrain_settings_lib.loss_settings(pretrain_settings(model))


pretrain_settings_lib.check_entries(config["pretrain"], config["seed"])


def pretrain_models(trained):
    return [
        m["name"]
        for m in config["pretrain"]["models"]
        if (m["objective"] != "none") == trained and not m.get("reuse_pretraining")
    ]


def reused_outputs(wildcards):
    """The outputs of the entry whose pre-training model `wildcards.model` reuses."""
    source = pretrain_settings_lib.reused_source(config["pretrain"], wildcards.model)
    folder = f"results/pretrain/{source}"
    return {
        "encoder": f"{folder}/encoder",
        "metrics": f"{folder}/metrics.jsonl",
        "plot": f"{folder}/loss.png",
        "heads": f"{folder}/heads.safetensors",
    }


def reusing_models():
    return [
        m["name"] for m in config["pretrain"]["models"] if m.get("reuse_pretraining")
    ]


def used_corpora():
    """The corpora the trained models read (and those span indexes are built on), in config order."""
    names = [
        c["name"]
        for m in pretrain_models(trained=True)
        for c in pretrain_settings(m)["corpora"]
    ]
    names += [corpus for corpus, _ in span_indexes()]
    return [c for c in corpora_lib.names(config["corpus"]) if c in names]


def model_pattern(names):
    # A regex matching exactly these model names (or nothing), so the two rules never overlap.
    return "|".join(map(re.escape, names)) if names else "(?!x)x"


def get_pretrain_inputs(wildcards):
    """The base checkpoint (or the `init` model's encoder and heads), then the chunks (and span
    shards) of each corpus the model trains on, corpus after corpus."""
    settings = pretrain_settings(wildcards.model)
    inputs = {"checkpoint": f"results/checkpoints/{settings['checkpoint']}"}
    if settings.get("init"):
        inputs["checkpoint"] = f"results/pretrain/{settings['init']}/encoder"
        if pretrain_settings(settings["init"])["objective"] != "none":
            inputs["heads"] = f"results/pretrain/{settings['init']}/heads.safetensors"
    corpora = [c["name"] for c in settings["corpora"]]
    inputs["chunks"] = [path for corpus in corpora for path in chunk_paths(corpus)]
    if settings.get("spans"):
        inputs["spans"] = expand(
            "results/corpus/{corpus}/spans/{spans}/shard-{shard}.parquet",
            corpus=corpora,
            spans=settings["spans"],
            shard=shard_ids(),
        )
    return inputs


def data_options(input):
    """`--chunks <corpus 1's shards> --chunks <corpus 2's> ...` (and --spans alike), from the
    flat input lists: every corpus has as many shards (corpus.shards)."""
    n = len(shard_ids())
    options = []
    for option in ("chunks", "spans"):
        paths = list(input[option]) if option in input.keys() else []
        options += [
            f"--{option} " + " ".join(paths[i : i + n]) for i in range(0, len(paths), n)
        ]
    if "heads" in input.keys():
        options.append(f"--init-heads {input.heads}")
    return " ".join(options)


# torchrun: what the launcher execs for several processes (run, not imported by launch.py).
PRETRAIN_CODE = module_source("launch", "torchrun", "pretrain")

# The pre-training data store (retrieval_pretraining/pretrain/store.py): the shards converted into
# memory-mapped files named by their checksums, one copy for every model (paper.yaml's seven
# Wikipedia models: ~43 GB once, not seven times). A cache, not a declared output: a file Snakemake
# remade would rerun every model that reads it. The trainers convert what is missing; a run of the
# workflow that succeeds deletes it (not a dry run, not the jobs' own Snakemake: --no-hooks)
# unless a trainer reads it: another Snakemake run in this directory (other targets) may be
# training from it (each trainer process leaves a marker in .readers/ while it runs).
PRETRAIN_DATA = "results/state/pretrain-data"


onsuccess:
    from retrieval_pretraining.pretrain import store as pretrain_store

    print(pretrain_store.delete_unless_read(PRETRAIN_DATA)[1], file=sys.stderr)


def pretrain_argument(model):
    """The model's settings less the trainer keys passed as `trainer_options` (the job's params)."""
    settings, _ = pretrain_settings_lib.split_runtime(pretrain_settings(model))
    return experiment_config.stage_argument(settings)


def pretrain_runtime(model):
    """`--trainer-options` of the model: its trainer keys that change no weights (JSON)."""
    _, runtime = pretrain_settings_lib.split_runtime(pretrain_settings(model))
    return experiment_config.stage_argument(runtime)


rule pretrain_model:
    input:
        unpack(get_pretrain_inputs),
        code=PRETRAIN_CODE,
    output:
        encoder=directory("results/pretrain/{model}/encoder"),
        metrics="results/pretrain/{model}/metrics.jsonl",
        plot=report(
            "results/pretrain/{model}/loss.png",
            caption="../workflow/report/pretrain_loss.rst",
            category="2. Pre-training",
            subcategory="Loss per model",
            labels={"model": "{model}"},
        ),
        # Projector / decoder / MLM head (dropped from the encoder), for the analyses.
        heads="results/pretrain/{model}/heads.safetensors",
    log:
        "results/logs/pretrain_model/{model}.log",
    benchmark:
        "results/benchmarks/pretrain_model/{model}.tsv"
    wildcard_constraints:
        model=model_pattern(pretrain_models(trained=True)),
    conda:
        conda_env("torch")
    # Intrinsic needs of the demo; paper-scale values (8 GPUs, hours) are set per rule in
    # profiles/default/config.yaml. The launcher starts min(gpu, visible GPUs) processes; `nodes`
    # reaches it on the command line (an `mpi` job's shell has no SLURM_NNODES to read).
    threads: 2
    resources:
        gpu=1,
        nodes=1,
        mem_mb=8000,
        runtime=60,
        # Not params: a worker count or a saving interval changes no weights (no rerun trigger).
        trainer_options=lambda wc: pretrain_runtime(wc.model),
    params:
        settings=lambda wc: pretrain_argument(wc.model),
        data=lambda wc, input: data_options(input),
        state="results/state/pretrain/{model}",
        store=PRETRAIN_DATA,
    shell:
        "TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 "
        "python -m retrieval_pretraining.launch --module retrieval_pretraining.pretrain "
        "--gpus {resources.gpu} --nodes {resources.nodes} -- "
        "--config '{params.settings}' --trainer-options '{resources.trainer_options}' "
        "--checkpoint {input.checkpoint} {params.data} "
        "--encoder {output.encoder} --metrics {output.metrics} --plot {output.plot} "
        "--state {params.state} --store {params.store} &> {log}"


rule export_base_encoder:
    input:
        checkpoint=lambda wc: f"results/checkpoints/{pretrain_settings(wc.model)['checkpoint']}",
        # pretrain alone: the command runs no launcher, so an edit to launch, torchrun or
        # gpu_claim must not re-export the base encoder (and rerun every stage after it).
        code=module_source("pretrain"),
    output:
        encoder=directory("results/pretrain/{model}/encoder"),
        metrics="results/pretrain/{model}/metrics.jsonl",
        plot=report(
            "results/pretrain/{model}/loss.png",
            caption="../workflow/report/pretrain_loss.rst",
            category="2. Pre-training",
            subcategory="Loss per model",
            labels={"model": "{model}"},
        ),
    log:
        "results/logs/export_base_encoder/{model}.log",
    wildcard_constraints:
        model=model_pattern(pretrain_models(trained=False)),
    localrule: True
    conda:
        conda_env("torch")
    params:
        settings=lambda wc: pretrain_argument(wc.model),
    shell:
        "python -m retrieval_pretraining.pretrain --config '{params.settings}' "
        "--checkpoint {input.checkpoint} --encoder {output.encoder} "
        "--metrics {output.metrics} --plot {output.plot} &> {log}"


# An entry that is another's pre-training (`reuse_pretraining`, checked to resolve to the same
# settings at parse time): its outputs are copies, so only its fine-tuning differs.
rule reuse_pretraining:
    input:
        unpack(reused_outputs),
    output:
        encoder=directory("results/pretrain/{model}/encoder"),
        metrics="results/pretrain/{model}/metrics.jsonl",
        plot="results/pretrain/{model}/loss.png",
        heads="results/pretrain/{model}/heads.safetensors",
    log:
        "results/logs/reuse_pretraining/{model}.log",
    wildcard_constraints:
        model=model_pattern(reusing_models()),
    localrule: True
    shell:
        "(cp -r {input.encoder} {output.encoder} && cp {input.metrics} {output.metrics} "
        "&& cp {input.plot} {output.plot} && cp {input.heads} {output.heads}) &> {log}"
