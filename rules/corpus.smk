# Corpus stages: base checkpoint, chunking each pre-training corpus to its max_len tokens, the span
# indexes: results/corpus/{corpus}/chunks/, results/corpus/{corpus}/spans/{spans}/.
from types import SimpleNamespace

from retrieval_pretraining import corpora as corpora_lib


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
def corpus_settings(corpus):
    """Corpus `corpus` as its chunk job reads it (corpora.resolve): name, source, chunking keys."""
    return corpora_lib.resolve(config["corpus"], corpus, config["datasets"])


def corpus_tokenizer(corpus):
    """The tokenizer folder a corpus is chunked with (its `checkpoint`, else the section's)."""
    return f"results/tokenizers/{corpus_settings(corpus)['checkpoint']}"


def chunk_paths(corpus, suffix="parquet"):
    return expand(
        "results/corpus/{corpus}/chunks/shard-{shard}.{suffix}",
        corpus=corpus,
        shard=shard_ids(),
        suffix=suffix,
    )


def get_corpus_texts(wildcards):
    """What a corpus is read from: the extracted articles (wikipedia; a function, as the dump's
    parts may come from a checkpoint) or the files of its source."""
    settings = corpus_settings(wildcards.corpus)
    source = settings["source"]
    if source == "wikipedia":
        return get_all_articles()
    if source == "dataset" and settings["dataset"]["format"] != "beir":
        # The MS MARCO collection (and titles file): a path, or a download rule's output.
        return get_dataset_corpus_sources(
            SimpleNamespace(dataset=settings["dataset"]["name"])
        )
    path = settings["dataset"]["path"] if source == "dataset" else settings["path"]
    path = config_path(path)
    return [str(path / "corpus.jsonl" if source in ("dataset", "beir") else path)]


def corpus_arguments(corpus, texts):
    """The chunk command's input options: the articles (wikipedia), or where a source's own
    files resolve (its config paths; a dataset's downloads)."""
    settings = corpus_settings(corpus)
    if settings["source"] == "wikipedia":
        return "--articles " + " ".join(texts)
    options = data_root_option()
    if settings["source"] == "dataset":
        # An alias's downloads are its source's (datasets[].same_as), a shared corpus's files
        # its source's (datasets[].corpus.same_as): fetched once, there.
        dataset = corpus_holder(settings["dataset"]["name"])
        options += f" --downloads {DATASET_DOWNLOADS}/{dataset}"
    return options


rule chunk_articles:
    input:
        texts=get_corpus_texts,
        tokenizer=lambda wc: corpus_tokenizer(wc.corpus),
        code=module_source("chunk"),
    output:
        chunks=expand(
            "results/corpus/{{corpus}}/chunks/shard-{shard}.parquet", shard=shard_ids()
        ),
        manifests=expand(
            "results/corpus/{{corpus}}/chunks/shard-{shard}.manifest.json",
            shard=shard_ids(),
        ),
    log:
        "results/logs/chunk_articles/{corpus}.log",
    benchmark:
        "results/benchmarks/chunk_articles/{corpus}.tsv"
    conda:
        conda_env("torch")
    threads: config["corpus"]["processes"]
    params:
        # The resolved entry without `processes`: the chunks do not depend on it, so changing the
        # process count must not rerun chunking (it arrives through {threads} instead).
        corpus=lambda wc: experiment_config.stage_argument(corpus_settings(wc.corpus)),
        texts=lambda wc, input: corpus_arguments(wc.corpus, input.texts),
    shell:
        "python -m retrieval_pretraining.chunk --config '{params.corpus}' --processes {threads} "
        "{params.texts} --checkpoint {input.tokenizer} --out {output.chunks} &> {log}"


# --- Stage 4: the span index (owner: corpus) -----------------------------------------------------
def span_params(name):
    """Only this span config entry and the global seed (the span stream is keyed by both)."""
    return experiment_config.stage_argument(
        {"seed": config["seed"], **named("spans", name)}
    )


rule sample_spans:
    input:
        chunks="results/corpus/{corpus}/chunks/shard-{shard}.parquet",
        tokenizer=lambda wc: corpus_tokenizer(wc.corpus),
        code=module_source("spans"),
    output:
        spans="results/corpus/{corpus}/spans/{spans}/shard-{shard}.parquet",
        manifest="results/corpus/{corpus}/spans/{spans}/shard-{shard}.manifest.json",
    log:
        "results/logs/sample_spans/{corpus}/{spans}/shard-{shard}.log",
    conda:
        conda_env("torch")
    params:
        spans=lambda wc: span_params(wc.spans),
    shell:
        "python -m retrieval_pretraining.spans sample --config '{params.spans}' "
        "--chunks {input.chunks} --checkpoint {input.tokenizer} --out {output.spans} &> {log}"


rule audit_spans:
    input:
        chunks=lambda wc: chunk_paths(wc.corpus),
        spans=lambda wc: expand(
            "results/corpus/{corpus}/spans/{spans}/shard-{shard}.parquet",
            corpus=wc.corpus,
            spans=wc.spans,
            shard=shard_ids(),
        ),
        tokenizer=lambda wc: corpus_tokenizer(wc.corpus),
        code=module_source("span_audit"),
    output:
        plot=report(
            "results/corpus/{corpus}/spans/{spans}/lengths.png",
            caption="../workflow/report/span_lengths.rst",
            category="2. Pre-training",
            subcategory="Span lengths",
            labels={"corpus": "{corpus}", "span index": "{spans}"},
        ),
        sample="results/corpus/{corpus}/spans/{spans}/sample.md",
    log:
        "results/logs/audit_spans/{corpus}/{spans}.log",
    conda:
        conda_env("torch")
    params:
        spans=lambda wc: span_params(wc.spans),
    shell:
        "python -m retrieval_pretraining.span_audit --config '{params.spans}' "
        "--chunks {input.chunks} --spans {input.spans} --checkpoint {input.tokenizer} "
        "--plot {output.plot} "
        "--sample {output.sample} &> {log}"
