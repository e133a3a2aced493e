# Retrieval datasets and BM25: downloads (local rules), canonical datasets, Lucene index, BM25 runs,
# BM25 negatives. Every evaluate.splits entry gets a BM25 run, published for scoring under
# results/runs/{dataset}/bm25/{split}.trec like every other system.

import re

from retrieval_pretraining.artifacts import manifest_path
from retrieval_pretraining.bm25 import RUNTIME_KEYS as BM25_RUNTIME
from retrieval_pretraining.download import check_fetched

DATASETS_DIR = "results/datasets"
DATASET_DOWNLOADS = "results/downloads/datasets"
# The bm25 settings that shape an index (build_bm25_index's params): a dataset whose corpus is
# another's and whose settings of these are the other's has its index copied (alias_bm25_index).
BM25_INDEX_KEYS = ("title",)
# The settings dataset.json holds (datasets.py writes them from the entry, then the corpus counts):
# a shared corpus's are its own (share_dataset_corpus), its counts its source's.
INFO_KEYS = ("name", "format", "title", "exclude_query_id")
# The keys of a datasets entry each job reads: its params hold only these, so that an edit
# elsewhere in the entry (a new split, a larger allowance, a pinned checksum) reruns neither the
# corpus nor what is built on it (BM25 index, corpus encodings, fine-tuning).
CORPUS_KEYS = (
    "name",
    "format",
    "path",
    "corpus",
    "titles",
    "title",
    "exclude_query_id",
    "subset",
)
SPLIT_KEYS = ("name", "format", "path", "corpus", "title", "exclude_query_id")
SPLIT_ALLOWANCES = ("max_missing_judged_documents", "max_unknown_judged_queries")
# A checksum or size is a check on a download, not what it is: they travel as resources (no rerun
# trigger), and a file fetched before one was pinned is checked against its manifest instead.
DOWNLOAD_CHECKS = ("md5", "sha256", "size")


def dataset_entry(name):
    return named("datasets", name)


# Dataset aliases (datasets[].same_as, rules/common.smk DATASET_ALIASES): their prepared files
# are copies (alias_dataset_file), so the rules that prepare a dataset never match an alias's.
def alias_pattern(names=None):
    """A wildcard constraint matching one of `names` (the aliases) alone; none: nothing."""
    names = DATASET_ALIASES if names is None else names
    return "|".join(map(re.escape, names)) or "(?!)"


def prepared_pattern(names=None):
    """A wildcard constraint matching any dataset name but one of `names` (the aliases)."""
    names = DATASET_ALIASES if names is None else names
    if not names:
        return "[A-Za-z0-9_.-]+"
    return f"(?!(?:{alias_pattern(names)})(?![A-Za-z0-9_.-]))[A-Za-z0-9_.-]+"


def _dataset_download(dataset, file):
    for download in dataset_entry(dataset).get("downloads", []):
        if download["file"] == file:
            return download
    raise ValueError(
        f"dataset '{dataset}' lists no download with file '{file}'; add it to its `downloads`"
    )


def _check_fetched_download(dataset, download):
    """Fails at DAG build on a pin the fetched file contradicts (download.check_fetched)."""
    try:
        check_fetched(Path(DATASET_DOWNLOADS, dataset, download["file"]), download)
    except ValueError as error:
        raise ValueError(f"dataset '{dataset}': {error}") from None


def corpus_holder(dataset):
    """The dataset whose downloads hold `dataset`'s corpus files: itself, or through aliases and
    shared corpora (CORPUS_SOURCES) the entry that parses the corpus."""
    return dataset_aliases.corpus_collection(dataset, DATASET_ALIASES, CORPUS_SOURCES)


def copied_corpora():
    """The datasets whose corpus.parquet is a copy: aliases and shared corpora."""
    return [*DATASET_ALIASES, *CORPUS_SOURCES]


def _ref_path(entry, ref, holder=None):
    """The file a dataset config reference names (a project file or a download); `holder`: the
    dataset whose downloads hold it (corpus_holder, for the corpus files)."""
    if "path" in ref:
        return str(config_path(ref["path"]))
    # An alias's downloads are its source's files, fetched once under the source's name.
    dataset = holder or dataset_aliases.collection(entry["name"], DATASET_ALIASES)
    # Fails early, naming the fix (an unknown download, a pin its fetched file contradicts).
    download = _dataset_download(dataset, ref["download"])
    _check_fetched_download(dataset, download)
    return f"{DATASET_DOWNLOADS}/{dataset}/{ref['download']}"


def get_dataset_corpus_sources(wildcards):
    """The files the corpus is read from (BEIR corpus.jsonl; the MS MARCO collection and titles)."""
    entry = dataset_entry(wildcards.dataset)
    if entry["format"] == "beir":
        folder = config_path(entry["path"])
        sources = [str(folder / "corpus.jsonl")]
        # A subset keeps every judged document: it reads the qrels too.
        if entry.get("subset"):
            sources += [
                str(folder / "qrels" / f"{s['name']}.tsv") for s in entry["splits"]
            ]
        return sources
    refs = [entry["corpus"]] + ([entry["titles"]] if entry.get("titles") else [])
    # A shared corpus's files are its source's downloads (datasets[].corpus.same_as).
    holder = corpus_holder(wildcards.dataset)
    return sorted({_ref_path(entry, ref, holder) for ref in refs})


def get_dataset_split_sources(wildcards):
    """The files one split is read from (queries and qrels; a dpr split's questions)."""
    entry = dataset_entry(wildcards.dataset)
    splits = {split["name"]: split for split in entry["splits"]}
    if wildcards.split not in splits:
        raise ValueError(
            f"dataset '{wildcards.dataset}' has no split '{wildcards.split}' "
            f"(splits: {', '.join(splits)}); fix the target or datasets[].splits"
        )
    if entry["format"] == "beir":
        folder = config_path(entry["path"])
        return [
            str(folder / "queries.jsonl"),
            str(folder / "qrels" / f"{wildcards.split}.tsv"),
        ]
    # msmarco: queries + qrels; dpr: questions or biencoder.
    refs = [ref for key, ref in splits[wildcards.split].items() if key != "name"]
    return sorted({_ref_path(entry, ref) for ref in refs})


def _dataset_options(dataset, entry):
    """`--config '<slice>' --downloads D [--data-root R]` for retrieval_pretraining.datasets."""
    entry = experiment_config.stage_argument(entry)
    return f"--config '{entry}' --downloads {DATASET_DOWNLOADS}/{dataset} {data_root_option()}"


def dataset_corpus_arguments(dataset):
    """The options of `datasets corpus`: the keys the corpus is built from."""
    entry = dataset_entry(dataset)
    read = {key: entry[key] for key in CORPUS_KEYS if key in entry}
    if entry.get("subset"):  # the sample keeps every document a split's qrels judge
        read["splits"] = [{"name": split["name"]} for split in entry["splits"]]
    return _dataset_options(dataset, read)


def split_arguments(dataset, split, allowances=True):
    """The options of `datasets split` (allowances=False: `answers`): one split's entry alone."""
    entry = dataset_entry(dataset)
    keys = SPLIT_KEYS + (SPLIT_ALLOWANCES if allowances else ())
    read = {key: entry[key] for key in keys if key in entry}
    read["splits"] = [s for s in entry["splits"] if s["name"] == split]
    return _dataset_options(dataset, read)


def bm25_negatives_entry(dataset):
    for entry in config["bm25"]["negatives"]:
        if entry["dataset"] == dataset:
            return entry
    raise ValueError(
        f"no bm25.negatives entry for dataset '{dataset}'; add one to config.yaml"
    )


def exclude_query_id_flag(dataset):
    return "--exclude-query-id" if dataset_entry(dataset)["exclude_query_id"] else ""


def _fetch_options(wildcards, keys):
    """`--<key> <value>` of a download's `keys` that are set."""
    download = _dataset_download(wildcards.dataset, wildcards.file)
    return " ".join(
        shlex.quote(flag)
        for key in keys
        if download.get(key) is not None
        for flag in (f"--{key}", str(download[key]))
    )


def get_bm25_targets():
    """BM25 runs of every evaluated split and the BM25 negatives of every configured dataset."""
    runs = [
        f"results/runs/{e['dataset']}/bm25/{e['split']}.trec"
        for e in config["evaluate"]["splits"]
    ]
    negatives = [
        f"results/bm25/{e['dataset']}/negatives.parquet"
        for e in config["bm25"]["negatives"]
    ]
    return runs + negatives


# Fetch one file of a dataset (MS MARCO collections, queries, qrels, triples, RocketQA titles).
rule download_dataset_file:
    output:
        file=f"{DATASET_DOWNLOADS}/{{dataset}}/{{file}}",
    log:
        f"results/logs/download_dataset_file/{{dataset}}/{{file}}.log",
    wildcard_constraints:
        dataset="[A-Za-z0-9_.-]+",
        file="[A-Za-z0-9_.-]+",
    localrule: True
    conda:
        conda_env("torch")
    resources:
        fetch_checks=lambda wc: _fetch_options(wc, DOWNLOAD_CHECKS),
    params:
        fetch=lambda wc: _fetch_options(wc, ("url",)),
    shell:
        "python -m retrieval_pretraining.download fetch {params.fetch} {resources.fetch_checks} "
        "--out {output.file} &> {log}"


# The corpus in canonical form, and dataset.json (title mode, query-id rule, corpus quirks).
rule prepare_dataset:
    input:
        sources=get_dataset_corpus_sources,
        code=module_source("datasets"),
    output:
        corpus=f"{DATASETS_DIR}/{{dataset}}/corpus.parquet",
        info=f"{DATASETS_DIR}/{{dataset}}/dataset.json",
    log:
        "results/logs/prepare_dataset/{dataset}.log",
    wildcard_constraints:
        dataset=prepared_pattern(copied_corpora()),
    conda:
        conda_env("torch")
    params:
        args=lambda wc: dataset_corpus_arguments(wc.dataset),
        out=lambda wc: f"{DATASETS_DIR}/{wc.dataset}",
    shell:
        "python -m retrieval_pretraining.datasets corpus {params.args} --out {params.out} &> {log}"


# One split's judged queries and qrels; quirk counts (checked against the corpus) in manifests.
rule prepare_dataset_split:
    input:
        sources=get_dataset_split_sources,
        corpus=f"{DATASETS_DIR}/{{dataset}}/corpus.parquet",
        code=module_source("datasets"),
    output:
        queries=f"{DATASETS_DIR}/{{dataset}}/queries-{{split}}.parquet",
        qrels=f"{DATASETS_DIR}/{{dataset}}/qrels-{{split}}.parquet",
    log:
        "results/logs/prepare_dataset_split/{dataset}/{split}.log",
    wildcard_constraints:
        dataset=prepared_pattern(),
        split="[A-Za-z0-9_.-]+",
    conda:
        conda_env("torch")
    params:
        args=lambda wc: split_arguments(wc.dataset, wc.split),
        out=lambda wc: f"{DATASETS_DIR}/{wc.dataset}",
    shell:
        "python -m retrieval_pretraining.datasets split --split {wildcards.split} {params.args} "
        "--out {params.out} &> {log}"


# A dataset alias's prepared file (corpus, dataset.json, a split's queries, qrels or answers):
# a copy of its source's, manifest and all, so the alias downloads and parses nothing.
rule alias_dataset_file:
    input:
        file=lambda wc: f"{DATASETS_DIR}/{DATASET_ALIASES[wc.dataset]}/{wc.file}",
    output:
        file=f"{DATASETS_DIR}/{{dataset}}/{{file}}",
    log:
        "results/logs/alias_dataset_file/{dataset}/{file}.log",
    wildcard_constraints:
        dataset=alias_pattern(),
        file=r"(corpus|(queries|qrels|answers)-[A-Za-z0-9_-]+)\.parquet|dataset\.json",
    localrule: True
    params:
        manifest=lambda wc, input, output: copied_manifest(input.file, output.file),
    shell:
        "({params.manifest}cp {input.file} {output.file}) &> {log}"


# A dataset alias's dataset.json where the alias sets a title mode of its own
# (ALIAS_OWN_SETTINGS): the source's, that title in place (shared_corpus writes it as it does a
# shared corpus's), so the file records how the alias's encoders join title and text. Its
# corpus is still a copy: title and text are stored apart, joined by each encoder.
rule alias_dataset_info:
    input:
        info=lambda wc: f"{DATASETS_DIR}/{DATASET_ALIASES[wc.dataset]}/dataset.json",
        code=module_source("shared_corpus"),
    output:
        info=f"{DATASETS_DIR}/{{dataset}}/dataset.json",
    log:
        "results/logs/alias_dataset_info/{dataset}.log",
    wildcard_constraints:
        dataset=alias_pattern(ALIAS_OWN_SETTINGS),
    localrule: True
    conda:
        conda_env("torch")
    params:
        info=lambda wc: experiment_config.stage_argument(ALIAS_OWN_SETTINGS[wc.dataset]),
    shell:
        "python -m retrieval_pretraining.shared_corpus --source {input.info} "
        "--config '{params.info}' --out {output.info} &> {log}"


# Such an alias's dataset.json matches alias_dataset_file's patterns too: written, not copied.
ruleorder: alias_dataset_info > alias_dataset_file


# A shared corpus (datasets[].corpus.same_as, CORPUS_SOURCES): the source's prepared corpus,
# copied with its manifest as alias_dataset_file copies (nothing downloaded or parsed), and
# dataset.json, the source's corpus counts under this dataset's own settings (its title mode and
# query-id rule: what prepare_dataset would have written from the same corpus).
rule share_dataset_corpus:
    input:
        corpus=lambda wc: f"{DATASETS_DIR}/{CORPUS_SOURCES[wc.dataset]}/corpus.parquet",
        info=lambda wc: f"{DATASETS_DIR}/{CORPUS_SOURCES[wc.dataset]}/dataset.json",
        code=module_source("shared_corpus"),
    output:
        corpus=f"{DATASETS_DIR}/{{dataset}}/corpus.parquet",
        info=f"{DATASETS_DIR}/{{dataset}}/dataset.json",
    log:
        "results/logs/share_dataset_corpus/{dataset}.log",
    wildcard_constraints:
        dataset=alias_pattern(CORPUS_SOURCES),
    localrule: True
    conda:
        conda_env("torch")
    params:
        manifest=lambda wc, input, output: copied_manifest(input.corpus, output.corpus),
        info=lambda wc: dataset_info_arguments(wc.dataset),
    shell:
        "({params.manifest}cp {input.corpus} {output.corpus} && "
        "python -m retrieval_pretraining.shared_corpus --source {input.info} "
        "--config '{params.info}' --out {output.info}) &> {log}"


def dataset_info_arguments(dataset):
    """The keys of dataset.json a dataset sets itself (INFO_KEYS), for a shared corpus."""
    entry = dataset_entry(dataset)
    return experiment_config.stage_argument({k: entry[k] for k in INFO_KEYS})


def copied_manifest(source, copy):
    """`cp <source's manifest> <copy's> && ` (artifacts.manifest_path: `x.parquet` ->
    `x.manifest.json`); "" for dataset.json, which has none."""
    if Path(source).name == "dataset.json":
        return ""
    return f"cp {manifest_path(source)} {manifest_path(copy)} && "


# Speed and memory of the BM25 jobs: passed with `bm25 --runtime`, outside the params, so that
# editing one reruns no job (a rewritten negatives.parquet would rerun every fine-tuning). The keys
# are bm25.py's RUNTIME_KEYS (imported at the top), the ones it accepts there: a copy here could
# drift (a key in one list only would be a rerun trigger again, or refused).
def bm25_runtime(dataset):
    settings = bm25_settings(dataset)
    return experiment_config.stage_argument(
        {k: settings[k] for k in BM25_RUNTIME if k in settings}
    )


def bm25_slice(dataset, keys):
    """The keys of the dataset's bm25 settings a job's results depend on (its params)."""
    settings = bm25_settings(dataset)
    return experiment_config.stage_argument(
        {k: settings[k] for k in keys if k in settings}
    )


def copied_bm25_indexes():
    """{dataset: source} for the datasets whose BM25 index is a copy of their source's: the
    aliases and shared corpora (whose corpus.parquet is their source's, the same bytes) whose
    bm25 settings that shape an index (BM25_INDEX_KEYS: the indexed text) are the source's. An
    index is its corpus and those settings alone, so it is the same index; another `title`
    (bm25.overrides) is built."""
    return {
        dataset: source
        for dataset, source in (DATASET_ALIASES | CORPUS_SOURCES).items()
        if bm25_slice(dataset, BM25_INDEX_KEYS) == bm25_slice(source, BM25_INDEX_KEYS)
    }


def bm25_index_build(dataset):
    """The dataset whose build_bm25_index made `dataset`'s index (itself, or through the copies
    the one copied last: an alias of a shared corpus copies a copy)."""
    copies = copied_bm25_indexes()
    while dataset in copies:
        dataset = copies[dataset]
    return dataset


rule build_bm25_index:
    input:
        corpus=f"{DATASETS_DIR}/{{dataset}}/corpus.parquet",
        code=module_source("bm25"),
    output:
        index=directory("results/bm25/{dataset}/index"),
    log:
        "results/logs/build_bm25_index/{dataset}.log",
    wildcard_constraints:
        dataset=prepared_pattern(copied_bm25_indexes()),
    conda:
        conda_env("pyserini")
    threads: config["bm25"]["index_threads"]
    resources:
        bm25_runtime=lambda wc: bm25_runtime(wc.dataset),
    params:
        bm25=lambda wc: bm25_slice(wc.dataset, BM25_INDEX_KEYS),
    shell:
        "python -m retrieval_pretraining.bm25 index --config '{params.bm25}' "
        "--runtime '{resources.bm25_runtime}' --corpus {input.corpus} "
        "--out {output.index} &> {log}"


# An alias's or a shared corpus's BM25 index when it indexes the text its source's does: the
# source's files, hard-linked where the file system allows, else copied (an 8.8M-passage MS MARCO
# index takes an hour of 8 cores to build, seconds to copy; DPR's 21M passages, hours, and tens
# of GB that a link does not duplicate). Why a link is safe: linked_copy.py, ARCHITECTURE.
rule alias_bm25_index:
    input:
        index=lambda wc: f"results/bm25/{copied_bm25_indexes()[wc.dataset]}/index",
        code=module_source("linked_copy"),
    output:
        index=directory("results/bm25/{dataset}/index"),
    log:
        "results/logs/alias_bm25_index/{dataset}.log",
    wildcard_constraints:
        dataset=alias_pattern(copied_bm25_indexes()),
    localrule: True
    conda:
        conda_env("torch")
    shell:
        "python -m retrieval_pretraining.linked_copy --source {input.index} "
        "--out {output.index} &> {log}"


rule bm25_search:
    input:
        index="results/bm25/{dataset}/index",
        queries=f"{DATASETS_DIR}/{{dataset}}/queries-{{split}}.parquet",
        code=module_source("bm25"),
    output:
        run="results/bm25/{dataset}/runs/{split}.trec",
        # params.k1, params.b and params.label: what this run used (per-dataset overrides included).
        manifest="results/bm25/{dataset}/runs/{split}.manifest.json",
    log:
        "results/logs/bm25_search/{dataset}/{split}.log",
    wildcard_constraints:
        dataset="[A-Za-z0-9_.-]+",
        split="[A-Za-z0-9_.-]+",
    conda:
        conda_env("pyserini")
    threads: config["bm25"]["threads"]
    resources:
        bm25_runtime=lambda wc: bm25_runtime(wc.dataset),
    params:
        bm25=lambda wc: bm25_slice(wc.dataset, ("k1", "b", "depth", "title")),
        exclude=lambda wc: exclude_query_id_flag(wc.dataset),
    shell:
        "python -m retrieval_pretraining.bm25 search --config '{params.bm25}' "
        "--runtime '{resources.bm25_runtime}' --index {input.index} "
        "--queries {input.queries} {params.exclude} --out {output.run} &> {log}"


# The bm25 slice plus this dataset's negatives policy and the global seed.
# The training split's queries and qrels, and the index (source=bm25), the triples file
# (source=triples) or the DPR training JSON the split was built from (source=dpr).
# The BM25 run under results/runs/, where score_run finds every system's runs, with its manifest
# beside it (as dense runs have theirs): its params.label names the k1/b this run used.
rule publish_bm25_run:
    input:
        run="results/bm25/{dataset}/runs/{split}.trec",
        manifest="results/bm25/{dataset}/runs/{split}.manifest.json",
    output:
        run="results/runs/{dataset}/bm25/{split}.trec",
        manifest="results/runs/{dataset}/bm25/{split}.manifest.json",
    log:
        "results/logs/publish_bm25_run/{dataset}/{split}.log",
    wildcard_constraints:
        dataset="[A-Za-z0-9_.-]+",
        split="[A-Za-z0-9_.-]+",
    localrule: True
    conda:
        conda_env("pyserini")
    shell:
        "(cp {input.run} {output.run} && cp {input.manifest} {output.manifest}) &> {log}"


def get_bm25_negatives_inputs(wildcards):
    entry = bm25_negatives_entry(wildcards.dataset)
    folder = f"{DATASETS_DIR}/{wildcards.dataset}"
    inputs = {
        "queries": f"{folder}/queries-{entry['split']}.parquet",
        "qrels": f"{folder}/qrels-{entry['split']}.parquet",
    }
    if entry["source"] == "bm25":
        inputs["index"] = f"results/bm25/{wildcards.dataset}/index"
    elif entry["source"] == "dpr":
        inputs["biencoder"] = _ref_path(
            dataset_entry(wildcards.dataset),
            biencoder_ref(wildcards.dataset, entry["split"]),
        )
    else:
        # _ref_path checks a pin against the fetched file's manifest, as for every dataset file.
        inputs["triples"] = _ref_path(
            dataset_entry(wildcards.dataset), entry["triples"]
        )
    # answers + corpus when negatives are filtered by answers (rules/answers.smk).
    inputs |= negative_filter_inputs(wildcards.dataset, entry["split"])
    return inputs


def biencoder_ref(dataset, split):
    """The `biencoder` file reference of a dpr split (config.py checks that it has one)."""
    return next(s for s in dataset_entry(dataset)["splits"] if s["name"] == split)[
        "biencoder"
    ]


def negatives_source_options(wildcards, input):
    """Where the negatives come from: --index, --triples or --biencoder [--biencoder-member]."""
    if "index" in input.keys():
        return f"--index {input.index}"
    if "triples" in input.keys():
        return f"--triples {input.triples}"
    split = bm25_negatives_entry(wildcards.dataset)["split"]
    member = biencoder_ref(wildcards.dataset, split).get("member")
    return f"--biencoder {input.biencoder}" + (
        f" --biencoder-member {shlex.quote(member)}" if member else ""
    )


def bm25_negatives_config(dataset):
    entry = bm25_negatives_entry(dataset)
    policy = {k: v for k, v in entry.items() if k not in ("dataset", "triples")}
    policy |= {"seed": config["seed"]} | negative_filter_policy(dataset)
    # Negatives from a triples file read none of the BM25 scoring.
    settings = bm25_settings(dataset)
    scoring = ("k1", "b", "title") if entry["source"] == "bm25" else ()
    return experiment_config.stage_argument(
        {k: settings[k] for k in scoring if k in settings} | {"negatives": policy}
    )


rule bm25_negatives:
    input:
        unpack(get_bm25_negatives_inputs),
        code=module_source("bm25"),
    output:
        negatives="results/bm25/{dataset}/negatives.parquet",
    log:
        "results/logs/bm25_negatives/{dataset}.log",
    wildcard_constraints:
        dataset="[A-Za-z0-9_.-]+",
    conda:
        conda_env("pyserini")
    threads: config["bm25"]["threads"]
    resources:
        bm25_runtime=lambda wc: bm25_runtime(wc.dataset),
    params:
        bm25=lambda wc: bm25_negatives_config(wc.dataset),
        exclude=lambda wc: exclude_query_id_flag(wc.dataset),
        source=negatives_source_options,
        answers=lambda wc, input: input_options(input, "answers", "corpus"),
    shell:
        "python -m retrieval_pretraining.bm25 negatives --config '{params.bm25}' "
        "--runtime '{resources.bm25_runtime}' {params.source} "
        "--queries {input.queries} --qrels {input.qrels} {params.exclude} {params.answers} "
        "--out {output.negatives} &> {log}"
