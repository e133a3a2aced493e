# Corpus stages: base checkpoint, chunking to max_len tokens, the span index.


rule stage_checkpoint:
    input:
        code=module_source("checkpoints"),
    output:
        directory("results/checkpoints/{checkpoint}"),
    log:
        "results/logs/stage_checkpoint/{checkpoint}.log",
    localrule: True
    conda:
        conda_env("torch")
    params:
        entry=lambda wc: experiment_config.stage_argument(
            named("checkpoints", wc.checkpoint)
        ),
        data_root=data_root_option(),
    shell:
        "python -m retrieval_pretraining.checkpoints --config '{params.entry}' --out {output} "
        "{params.data_root} &> {log}"


def tokenizer_entry(name):
    """The keys of a checkpoint entry that decide its tokenizer (checkpoints.TOKENIZER_KEYS; not
    num_layers: truncating the encoder must not re-chunk the corpus)."""
    return experiment_config.stage_argument(
        {
            key: value
            for key, value in named("checkpoints", name).items()
            if key in ("name", "source", "location", "revision")
        }
    )


rule stage_tokenizer:
    input:
        code=module_source("checkpoints"),
    output:
        directory("results/tokenizers/{checkpoint}"),
    log:
        "results/logs/stage_tokenizer/{checkpoint}.log",
    localrule: True
    conda:
        conda_env("torch")
    params:
        entry=lambda wc: tokenizer_entry(wc.checkpoint),
        data_root=data_root_option(),
    shell:
        "python -m retrieval_pretraining.checkpoints --tokenizer-only --config '{params.entry}' "
        "--out {output} {params.data_root} &> {log}"


# --- Stage 3: tokenise and chunk (owner: corpus) -------------------------------------------------
def corpus_tokenizer():
    """The tokenizer folder the corpus stages use (that of the `corpus.checkpoint` entry)."""
    return f"results/tokenizers/{config['corpus']['checkpoint']}"


def corpus_params():
    """The corpus slice without `processes`: the chunks do not depend on it, so changing the process
    count must not rerun chunking (it arrives through {threads} instead)."""
    return experiment_config.stage_argument(
        {key: value for key, value in config["corpus"].items() if key != "processes"}
    )


rule chunk_articles:
    input:
        articles=lambda wc: get_all_articles(),
        tokenizer=corpus_tokenizer(),
        code=module_source("chunk"),
    output:
        chunks=expand("results/corpus/chunks/shard-{shard}.parquet", shard=shard_ids()),
        manifests=expand(
            "results/corpus/chunks/shard-{shard}.manifest.json", shard=shard_ids()
        ),
    log:
        "results/logs/chunk_articles/chunks.log",
    benchmark:
        "results/benchmarks/chunk_articles/chunks.tsv"
    conda:
        conda_env("torch")
    threads: config["corpus"]["processes"]
    params:
        corpus=corpus_params(),
    shell:
        "python -m retrieval_pretraining.chunk --config '{params.corpus}' --processes {threads} "
        "--articles {input.articles} --checkpoint {input.tokenizer} --out {output.chunks} &> {log}"


# --- Stage 4: the span index (owner: corpus) -----------------------------------------------------
def span_params(name):
    """Only this span config entry and the global seed (the span stream is keyed by both)."""
    return experiment_config.stage_argument(
        {"seed": config["seed"], **named("spans", name)}
    )


rule sample_spans:
    input:
        chunks="results/corpus/chunks/shard-{shard}.parquet",
        tokenizer=corpus_tokenizer(),
        code=module_source("spans"),
    output:
        spans="results/corpus/spans/{spans}/shard-{shard}.parquet",
        manifest="results/corpus/spans/{spans}/shard-{shard}.manifest.json",
    log:
        "results/logs/sample_spans/{spans}/shard-{shard}.log",
    conda:
        conda_env("torch")
    params:
        spans=lambda wc: span_params(wc.spans),
    shell:
        "python -m retrieval_pretraining.spans sample --config '{params.spans}' "
        "--chunks {input.chunks} --checkpoint {input.tokenizer} --out {output.spans} &> {log}"


rule audit_spans:
    input:
        chunks=expand("results/corpus/chunks/shard-{shard}.parquet", shard=shard_ids()),
        spans=lambda wc: expand(
            "results/corpus/spans/{spans}/shard-{shard}.parquet",
            spans=wc.spans,
            shard=shard_ids(),
        ),
        tokenizer=corpus_tokenizer(),
        code=module_source("spans"),
    output:
        plot=report(
            "results/corpus/spans/{spans}/lengths.png",
            caption="../workflow/report/span_lengths.rst",
            category="2. Pre-training",
            subcategory="Span lengths",
            labels={"span index": "{spans}"},
        ),
        sample="results/corpus/spans/{spans}/sample.md",
    log:
        "results/logs/audit_spans/{spans}.log",
    conda:
        conda_env("torch")
    params:
        spans=lambda wc: span_params(wc.spans),
    shell:
        "python -m retrieval_pretraining.spans audit --config '{params.spans}' --chunks {input.chunks} "
        "--spans {input.spans} --checkpoint {input.tokenizer} --plot {output.plot} "
        "--sample {output.sample} &> {log}"
