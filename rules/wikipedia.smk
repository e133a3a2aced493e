# Wikipedia stages: acquire the dump (download rules, run locally), extract articles to Parquet.


# --- Stage 1: acquire the dump ------------------------------------------------------------------
# source=local: the files listed in wikipedia.parts (paths, file:// or http(s) URLs).
# source=dumps: the checkpoint saves the run's dumpstatus.json; one download job per multistream
# part and one per index then follow. The part list is only known after the checkpoint ran, so
# get_dump_parts()/get_dump_index()/get_all_articles() may only be called from input functions
# (`input: lambda wc: get_all_articles()`), never at parse time.
#
# The download rules and the checkpoint declare neither the code, the retry count nor the mirror
# as inputs/params on purpose: what they produce is fixed by the run (wiki, date), the file's path
# and its checksum, and an edit to download.py / fetch.py, to `retries` or to `mirror` must not
# re-fetch 20 GB, nor resolve `dump_date: latest` again (a newer run would replace the dump under
# every model). The retry count, the mirror and `local_files` (copy or link a local file) travel
# as resources (no rerun trigger); the files' URLs are given relative to the mirror
# (`download fetch --mirror`).
# dumps.wikimedia.org allows few connections per IP: each download job holds one
# `dump_connections`, which the Slurm profile caps at 2 (`--resources dump_connections=2` elsewhere).
import dataclasses
import functools
import shlex

from retrieval_pretraining import dumpstatus as dump_status
from retrieval_pretraining import fetch as dump_fetch

DUMP_DIR = "results/wikipedia/dump"
DUMPSTATUS = "results/wikipedia/dumpstatus.json"


@functools.lru_cache(maxsize=4)
def _parts_from_status(path, mtime, mirror):
    return {p.name: p for p in dump_status.dump_parts_from_file(path, mirror)}


def dump_part_entries():
    """{part name: {url, sha1, md5, sha256, size, index_url, index_sha1, ...}} for either source."""
    wikipedia = config["wikipedia"]
    if wikipedia["source"] == "local":
        return {part["name"]: part for part in wikipedia["parts"]}
    status = checkpoints.fetch_dumpstatus.get().output.status
    parts = _parts_from_status(
        status, Path(status).stat().st_mtime, wikipedia["mirror"]
    )
    entries = {}
    for name, part in parts.items():
        data, index = dataclasses.asdict(part.data), dataclasses.asdict(part.index)
        entries[name] = {
            "name": name,
            **data,
            **{f"index_{key}": v for key, v in index.items()},
        }
    return entries


def dump_part_entry(part):
    entries = dump_part_entries()
    if part not in entries:
        raise ValueError(
            f"dump part '{part}' is not in this experiment (parts: {', '.join(entries)}); "
            "check wikipedia.parts or the target you asked for"
        )
    return entries[part]


def get_dump_parts():
    """Names of the dump parts of this experiment (source=local: the configured files; source=dumps:
    the parts listed by the checkpoint's dumpstatus.json). Call from input functions only.
    """
    return list(dump_part_entries())


def get_dump_index(part):
    """The index file of a multistream part, or [] for a part without one (plain bz2 dumps)."""
    if dump_part_entry(part).get("index_url"):
        return f"{DUMP_DIR}/{part}.index.txt.bz2"
    return []


def get_all_dump_files():
    """Every dump part and index file of the experiment (the target of `snakemake download_dump`)."""
    files = []
    for part in get_dump_parts():
        files.append(f"{DUMP_DIR}/{part}.xml.bz2")
        if index := get_dump_index(part):
            files.append(index)
    return files


def _local_file(entry, prefix=""):
    """The local file a part's (prefix="index_": its index's) URL names, as an input (checked to
    lie inside the project or data_root), or [] for an http(s) URL.

    A pinned file is `ancient`: its content is fixed by the checksum the fetch verifies, so a newer
    modification time (a cluster's anti-purge touch, `cp` without -p, a move to another file
    system) must not fetch it again and rerun everything after it (~480 GPU-hours at paper
    scale). An unpinned file keeps the time as its only sign of a replaced file."""
    url = entry[f"{prefix}url"]
    path = dump_fetch.local_path(url)
    if path is None:
        return []
    # Raises, naming the fix, when the file lies outside the project and data_root.
    experiment_config.resolve_path(path, config["data_root"])
    path = dump_fetch.local_path(_in_project(url))
    pinned = any(entry.get(f"{prefix}{key}") for key in dump_fetch.CHECKSUMS)
    return ancient(str(path)) if pinned else str(path)


def _in_project(url):
    """`url`, or for a relative path the project's file it names, as the working directory sees
    it (workdir_relative): a relative config path is relative to the project (config.resolve_path),
    and under `--directory <elsewhere>` the working directory is not the project, so the input and
    the fetch looked for the dump there. Run in the project, `url` itself, as written: the path
    is not resolved (unlike config_path) so that a symlinked dump, and the input and the --url
    recorded by existing runs, stay what they were (a change reruns the download and everything
    after it)."""
    path = dump_fetch.local_path(url)
    if path is None or path.is_absolute():
        return url
    anchored = workdir_relative(experiment_config.PROJECT_ROOT / path)
    return url if anchored == path else str(anchored)


def _dump_mirror():
    """The mirror the dump files are read from ('' for source=local: their URLs are whole)."""
    wikipedia = config["wikipedia"]
    return wikipedia["mirror"] if wikipedia["source"] == "dumps" else ""


def _fetch_flags(entry, prefix=""):
    """The content-defining `download fetch` options of one file of a part (rerun when they change)."""
    # A dump file is named by its path on the mirror; the mirror itself comes as a resource.
    flags = [
        "--url",
        dump_fetch.path_on_mirror(_in_project(entry[f"{prefix}url"]), _dump_mirror()),
    ]
    # Only the strongest checksum given: fetch verifies that one (sha256 > sha1 > md5).
    for key in dump_fetch.CHECKSUMS:
        if entry.get(f"{prefix}{key}"):
            flags += [f"--{key}", entry[f"{prefix}{key}"]]
            break
    if entry.get(f"{prefix}size") is not None:
        flags += ["--size", str(entry[f"{prefix}size"])]
    return " ".join(shlex.quote(flag) for flag in flags)


def _index_entry(part):
    entry = dump_part_entry(part)
    if not entry.get("index_url"):
        raise ValueError(
            f"dump part '{part}' has no index file; add index_url to its entry in wikipedia.parts "
            "(multistream dumps only)"
        )
    return entry


checkpoint fetch_dumpstatus:
    output:
        status=DUMPSTATUS,
        manifest="results/wikipedia/dumpstatus.manifest.json",
    log:
        "results/logs/fetch_dumpstatus.log",
    localrule: True
    conda:
        conda_env("torch")
    resources:
        download_retries=config["wikipedia"]["retries"],
        dump_mirror=config["wikipedia"]["mirror"],
    params:
        run=lambda wc: experiment_config.stage_argument(
            {key: config["wikipedia"][key] for key in ("wiki", "dump_date")}
        ),
    shell:
        "python -m retrieval_pretraining.download dumpstatus --config '{params.run}' "
        "--mirror={resources.dump_mirror:q} --retries {resources.download_retries} "
        "--out {output.status} &> {log}"


rule download_dump_part:
    input:
        source=lambda wc: _local_file(dump_part_entry(wc.part)),
    output:
        dump=f"{DUMP_DIR}/{{part}}.xml.bz2",
        manifest=f"{DUMP_DIR}/{{part}}.xml.bz2.manifest.json",
    log:
        "results/logs/download_dump_part/{part}.log",
    localrule: True
    conda:
        conda_env("torch")
    resources:
        dump_connections=1,
        download_retries=config["wikipedia"]["retries"],
        dump_mirror=_dump_mirror(),
        # Whether a local file is copied or linked: the same content either way.
        dump_link=config["wikipedia"]["local_files"],
    params:
        fetch=lambda wc: _fetch_flags(dump_part_entry(wc.part)),
    shell:
        "python -m retrieval_pretraining.download fetch {params.fetch} "
        "--mirror={resources.dump_mirror:q} --retries {resources.download_retries} "
        "--link {resources.dump_link} --out {output.dump} --manifest {output.manifest} &> {log}"


rule download_dump_index:
    input:
        source=lambda wc: _local_file(_index_entry(wc.part), "index_"),
    output:
        index=f"{DUMP_DIR}/{{part}}.index.txt.bz2",
        manifest=f"{DUMP_DIR}/{{part}}.index.txt.bz2.manifest.json",
    log:
        "results/logs/download_dump_index/{part}.log",
    localrule: True
    conda:
        conda_env("torch")
    resources:
        dump_connections=1,
        download_retries=config["wikipedia"]["retries"],
        dump_mirror=_dump_mirror(),
        # Whether a local file is copied or linked: the same content either way.
        dump_link=config["wikipedia"]["local_files"],
    params:
        fetch=lambda wc: _fetch_flags(_index_entry(wc.part), "index_"),
    shell:
        "python -m retrieval_pretraining.download fetch {params.fetch} "
        "--mirror={resources.dump_mirror:q} --retries {resources.download_retries} "
        "--link {resources.dump_link} --out {output.index} --manifest {output.manifest} &> {log}"


rule download_dump:
    """Fetch every part and index (e.g. on a login node before submitting the GPU work)."""
    input:
        lambda wc: get_all_dump_files(),
    localrule: True


# --- Stage 2: extract articles ------------------------------------------------------------------
def get_all_articles():
    """The articles file of every dump part (call from input functions only, like get_dump_parts)."""
    return expand("results/wikipedia/articles/{part}.parquet", part=get_dump_parts())


def extract_params():
    """The extract config slice without `processes`: the output does not depend on it, so changing
    the process count must not rerun extraction (it arrives through {threads} instead).
    """
    return experiment_config.stage_argument(
        {key: value for key, value in config["extract"].items() if key != "processes"}
    )


rule extract_articles:
    input:
        dump=f"{DUMP_DIR}/{{part}}.xml.bz2",
        # Multistream parts: the offset index lets workers decompress streams in parallel.
        index=lambda wc: get_dump_index(wc.part),
        code=module_source("extract"),
    output:
        articles="results/wikipedia/articles/{part}.parquet",
        manifest="results/wikipedia/articles/{part}.manifest.json",
    log:
        "results/logs/extract_articles/{part}.log",
    conda:
        conda_env("torch")
    threads: config["extract"]["processes"]
    resources:
        # Measured: ~200 MB for the main process, well under 512 MB per worker (benchmarks/RESULTS.md).
        mem_mb=lambda wc, threads: 1024 + 512 * threads,
    params:
        extract=extract_params(),
        index=lambda wc, input: f"--index {input.index}" if input.index else "",
    shell:
        "python -m retrieval_pretraining.extract --config '{params.extract}' --processes {threads} "
        "--dump {input.dump} {params.index} --out {output.articles} &> {log}"
