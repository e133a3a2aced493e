"""The provenance block of tables.md: what produced every number (config hash, code version,
hardware, and for each row its run, metrics, model and training logs)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from .. import artifacts
from .layout import Group, Row
from .metrics import Metrics, MetricsCache, metrics_path
from .render import escaped


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of a resolved config as JSON with sorted keys, first 16 hex digits. The config is
    written into tables.json (`resolved_config`), so a reader can recompute the hash printed."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def printed_hash(params: dict[str, Any]) -> str:
    config = params.get("resolved_config")
    return "unknown" if config is None else config_hash(config)


def encoder_dataset(params: dict[str, Any], dataset: str) -> str:
    """The dataset whose fine-tuned encoder produced runs on `dataset` (itself, or its zero-shot
    source from evaluate.zero_shot)."""
    return (params.get("trained_on") or {}).get(dataset, dataset)


def hardware(results: Path, models: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"tables built on: {platform.node() or 'unknown host'}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs"
    ]
    for m in models:
        training = results / "pretrain" / m["name"] / "encoder" / "training.json"
        if training.is_file():
            info = artifacts.read_json_object(training, "a training.json")
            hw = {
                k: v
                for k, v in info.items()
                if k in ("hardware", "device", "devices", "world_size")
            }
            if hw:
                lines.append(f"pre-training `{m['name']}`: {json.dumps(hw, sort_keys=True)}")
    return lines


def provenance(
    params: dict[str, Any],
    results: Path,
    tables: list[tuple[dict, list[Group]]],
    cache: MetricsCache,
) -> str:
    lines = [
        "## Provenance",
        "",
        f"- experiment: `{params.get('experiment', 'unknown')}`",
        f"- config hash (sha256 of the resolved config): `{printed_hash(params)}`",
        "- the resolved config: `resolved_config` in results/report/tables.json; the hash is "
        "sha256 of `json.dumps(resolved_config, sort_keys=True)`, its first 16 hex digits",
        f"- tables built with: `{artifacts.git_version()}` (each row's scoring code: its "
        "`scored with` column)",
        f"- date: {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}",
    ]
    # Only the records make_tables declares as inputs (report_params' `declared`): one read
    # undeclared would not rebuild the tables when it changed.
    declared = params.get("declared") or {}
    trained = set(declared.get("pretraining") or ())
    lines += [f"- {h}" for h in hardware(results, [m for m in params["models"]
                                                   if m["name"] in trained])]
    lines += loss_reductions(params.get("losses") or {})
    columns = [(c["dataset"], c["split"]) for spec, _ in tables for c in spec["columns"]
               if f"{c['dataset']}/{c['split']}" in (declared.get("qrels") or ())]
    lines += missing_judged_documents(results, columns)
    lines += [
        "",
        "| system | dataset/split | run file | run sha256 | metrics | scored with | model "
        "| training log |",
        "|---|---|---|---|---|---|---|---|",
    ]
    seen = set()
    for spec, groups in tables:
        for group in groups:
            for row in group.rows:
                if row.system is None:
                    continue
                for c in spec["columns"]:
                    key = (row.system, c["dataset"], c["split"])
                    if key in seen:
                        continue
                    seen.add(key)
                    m = cache.get(c["dataset"], row.system, c["split"])
                    lines.append(
                        "| "
                        + " | ".join(
                            [
                                # Names may hold `_` (the schemas' [A-Za-z0-9_.-]):
                                # one at a name's edge ("_nq_") would open emphasis.
                                escaped(row.system),
                                escaped(f"{c['dataset']}/{c['split']}"),
                                f"`{m.run}`" if m and m.run else "–",
                                f"`{m.run_sha256[:16]}`" if m and m.run_sha256 else "–",
                                f"`{metrics_path(results, c['dataset'], row.system, c['split'])}`",
                                scored_with(m),
                                model_location(results, row, c["dataset"], group, params),
                                log_location(results, row, c["dataset"], group, c["split"], params),
                            ]
                        )
                        + " |"
                    )
    shown = "shown as –" + ("; a low-resource cell averages the splits found, saying how many"
                            if params["report"].get("low_resource") else "")
    lines += missing_files(cache, shown)
    return "\n".join(lines) + "\n"


def missing_files(cache: MetricsCache, shown: str) -> list[str]:
    """The metrics files partial tables (`--allow-missing`) went without, and what their cells
    show: the last line of tables.md, and of the low-resource section written alone."""
    if not cache.missing:
        return []
    return ["", f"Missing ({shown}): " + ", ".join(f"`{p}`" for p in cache.missing)]


def scored_with(m: Metrics | None) -> str:
    """The code version evaluate.py recorded in a metrics file ("–" for one written before)."""
    version = (m.code_version or {}) if m else {}
    if not version:
        return "–"
    return f"`{version.get('git', '?')}` (package `{version.get('package_sha256', '?')[:12]}`)"


def missing_judged_documents(results: Path, columns: list[tuple[str, str]]) -> list[str]:
    """How many documents each scored split's qrels judge that its corpus lacks (from the qrels
    manifest datasets.py wrote; `max_missing_judged_documents` allows them): their judgements stay,
    and every system scores them as misses."""
    counts = []
    for dataset, split in dict.fromkeys(columns):
        path = artifacts.manifest_path(results / "datasets" / dataset / f"qrels-{split}.parquet")
        if not path.is_file():
            continue
        manifest = artifacts.read_manifest(path, "a manifest")
        missing = manifest.get("stats", {}).get("judged_documents_missing")
        if missing is None:  # written before the count existed
            continue
        allowed = manifest.get("params", {}).get("max_missing_judged_documents", 0)
        note = f" (allowed: {allowed})" if missing else ""
        counts.append(f"{escaped(f'{dataset}/{split}')} {missing}{note}")
    if not counts:
        return []
    return [
        "- judged documents missing from the corpus (their judgements are kept and every system "
        "scores them as misses, as the official evaluations do): " + "; ".join(counts)
    ]


REDUCED = {"sum": "summed", "mean": "averaged"}


def contrast_set(info: dict[str, Any], opts: dict[str, Any]) -> tuple[int, str]:
    """(texts, where): the texts a model's contrastive term averages over. A row that gathers its
    negatives contrasts the whole global batch (across processes, and across micro-batches through
    contrast_cache.py), so its mean, and the lambda the papers' sum would need, are over that."""
    if opts.get("gather_negatives"):
        return info["global_batch_size"], "of the global batch (gathered)"
    return info["micro_batch_size"], "of a micro-batch"


def loss_reductions(losses: dict[str, dict[str, Any]]) -> list[str]:
    """How each trained model's loss terms are reduced, and what that does to the papers' lambda
    (the papers write their contrastive terms as sums; we average, so results do not depend on
    the batch size)."""
    lines = []
    for name, info in losses.items():
        objective, opts = info["objective"], info.get("options") or {}
        n = info.get("micro_batch_size")
        if objective == "none":
            continue
        text = "MLM: mean cross-entropy over the micro-batch's masked tokens"
        if objective == "costa":
            lam, (texts, where) = opts["lambda"], contrast_set(info, opts)
            text += (
                f"; L_GWC: Eq. 8 averaged over the {texts} texts {where} (the paper sums "
                f"over them), so lambda = {lam:g} on the mean weighs it as lambda = "
                f"{lam / texts:.4g} would on the sum"
            )
        elif objective in ("cpdae", "cpdae_r"):
            lam, (texts, where) = opts["lambda"], contrast_set(info, opts)
            text += (
                f"; L_REC: BCE {REDUCED[opts['reconstruction']]} over the vocabulary, averaged "
                f"over the {2 * n} views of a micro-batch; L_CL: InfoNCE averaged over the "
                f"{2 * texts} views {where} (Eq. 5 sums over them), so lambda = {lam:g} on the "
                f"mean weighs it as lambda = {lam / (2 * texts):.4g} would on the sum"
            )
        elif objective == "bow":
            schedule = (
                f"{opts['weight']:g} decaying to {opts['weight_end']:g} on a cosine"
                if opts.get("weight_schedule") == "cosine" else f"{opts['weight']:g}, constant"
            )
            recipe = opts.get("recipe", "code")
            source = "the paper as written" if recipe == "paper" else "the authors' code"
            head = ("h_CLS . E^T" if opts.get("form") == "paper"
                    else "the MLM head on [CLS]")
            masked = "whole words" if opts.get("whole_word") else "tokens"
            if "mask_rate" in opts:
                source += f"; {opts['mask_rate']:g} of the {masked} masked"
            text += (
                f"; BoW recipe `{recipe}` ({source}); L_BoW: {opts.get('reduction', 'mean')} over each text's "
                f"unique input tokens of -log p(token | [CLS]) through {head}, averaged over the "
                f"texts; weight {schedule}"
            )
        elif objective in ("condenser", "cocondenser"):
            text += "; the Condenser head's MLM loss the same mean, added with weight 1"
            if objective == "cocondenser":
                texts, where = contrast_set(info, opts)
                text += (
                    f"; span-pair InfoNCE over [CLS] dot products / {opts['temperature']:g}, "
                    f"averaged over the {2 * texts} segments {where}, weight {opts['lambda']:g}"
                )
        elif objective == "retromae":
            text += (
                "; decoder: mean cross-entropy over every inner token of the micro-batch's "
                f"chunks (each row hides {opts['decoder_mask_rate']:.0%} of them), weight 1"
            )
        elif objective == "ae_decoder":
            text += (
                f"; {opts['layers']}-layer auto-encoding decoder: the same mean over the masked "
                f"tokens of its copy ({opts['mask_rate']:.0%} masked), weight {opts['weight']:g}"
            )
        elif objective == "ar_decoder":
            text += (
                f"; {opts['layers']}-layer auto-regressive decoder: mean next-token cross-entropy "
                f"over every real position of the micro-batch, weight {opts['weight']:g}"
            )
        lines.append(f"- loss reduction, `{name}` ({objective}): {text}")
    return lines


def model_location(
    results: Path, row: Row, dataset: str, group: Group, params: dict[str, Any] | None = None
) -> str:
    if row.objective == "baseline":  # its checkpoint (or pre-trained encoder), as staged
        encoder = ((params or {}).get("baselines") or {}).get(row.system, {}).get("encoder")
        return f"`{results.parent / encoder}`" if encoder else "–"
    if row.model is None:
        return f"`{results / 'bm25' / dataset / 'index'}`"
    # The rules say which encoder a system used (stage 0: the pre-trained one; stage 1 with
    # `stage1: init`: its init encoder); older params lack the map.
    known = (params or {}).get("encoders") or {}
    if f"{dataset}/{row.system}" in known:
        return f"`{results.parent / known[f'{dataset}/{row.system}']}`"
    trained_on = encoder_dataset(params or {}, dataset)
    return f"`{results / 'finetune' / row.model / trained_on / group.suffix / 'encoder'}`"


def log_location(
    results: Path,
    row: Row,
    dataset: str,
    group: Group,
    split: str | None = None,
    params: dict[str, Any] | None = None,
) -> str:
    """The Snakemake job logs behind a row (rules/*.smk `log:`): BM25's index, search and the copy
    of its run to results/runs/ (publish_bm25_run, as a reused pre-training names its copy), or the
    model's pre-training and this fine-tuning stage (on the zero-shot source, for a target), then
    the encoding, index and search that made the row's run (dense_logs)."""
    logs = results / "logs"
    if row.objective == "baseline":
        paths = baseline_logs(logs, row.system, dataset, split, params)
        return ", ".join(f"`{p}`" for p in paths)
    if row.model is None and row.system != "bm25":
        return "–"
    if row.model is None:
        # An alias's index copied from its source's (rules/retrieval.smk alias_bm25_index): the
        # copy's log, then the source's build, where the index was made from the corpus (as a
        # reused pre-training names its copy, then the training). build_bm25_index/<alias>.log
        # is no job's log there.
        source = ((params or {}).get("bm25_index_copies") or {}).get(dataset)
        paths = ([logs / "alias_bm25_index" / f"{dataset}.log",
                  logs / "build_bm25_index" / f"{source}.log"] if source
                 else [logs / "build_bm25_index" / f"{dataset}.log"])
        if split:
            paths += [logs / "bm25_search" / dataset / f"{split}.log",
                      logs / "publish_bm25_run" / dataset / f"{split}.log"]
    else:
        entry = next((m for m in (params or {}).get("models", []) if m["name"] == row.model), {})
        if row.objective == "none":
            paths = [logs / "export_base_encoder" / f"{row.model}.log"]
        elif entry.get("reuse_pretraining"):  # a copy of another entry's pre-training: the copy's
            paths = [logs / "reuse_pretraining" / f"{row.model}.log",  # log, then the training's
                     logs / "pretrain_model" / f"{entry['reuse_pretraining']}.log"]
        else:
            paths = [logs / "pretrain_model" / f"{row.model}.log"]
        encoder = ((params or {}).get("encoders") or {}).get(f"{dataset}/{row.system}", "")
        if encoder.startswith("results/finetune/"):  # a fine-tuned encoder: its own log
            paths.append(logs / "finetune" / Path(encoder).relative_to("results/finetune")
                         .parent.with_suffix(".log"))
        elif not encoder:
            paths.append(logs / "finetune" / row.model / encoder_dataset(params or {}, dataset)
                         / f"{group.suffix}.log")
        paths += dense_logs(logs, row.model, str(group.suffix), dataset, split, params)
    return ", ".join(f"`{p}`" for p in paths)


def baseline_logs(
    logs: Path, baseline: str, dataset: str, split: str | None, params: dict[str, Any] | None
) -> list[Path]:
    """rules/baselines.smk's job logs behind a baseline's run: one per encoded corpus shard (the
    rules pass the shard count per dataset as `baselines.<name>.shards`; older params, one count
    for every dataset), its index's and its search's."""
    shards = ((params or {}).get("baselines") or {}).get(baseline, {}).get("shards")
    if isinstance(shards, dict):
        shards = shards.get(dataset)
    paths = shard_logs(logs / "encode_baseline_shard" / baseline / dataset, shards)
    paths.append(logs / "build_baseline_index" / baseline / f"{dataset}.log")
    if split:
        paths.append(logs / "baseline_search" / dataset / baseline / f"{split}.log")
    return paths


def dense_logs(
    logs: Path, model: str, stage: str, dataset: str, split: str | None,
    params: dict[str, Any] | None,
) -> list[Path]:
    """rules/dense.smk's job logs behind a dense row's run: one per encoded corpus shard (the
    rules pass each dataset's shard count as `dense_shards`), its index's and its search's. A
    zero-shot target's corpus is encoded, indexed and searched under the target's name."""
    shards = ((params or {}).get("dense_shards") or {}).get(dataset)
    paths = shard_logs(logs / "encode_corpus_shard" / model / dataset / stage, shards)
    paths.append(logs / "build_dense_index" / model / dataset / f"{stage}.log")
    if split:
        paths.append(logs / "dense_search" / dataset / f"{model}-{stage}" / f"{split}.log")
    return paths


def shard_logs(folder: Path, shards: int | None) -> list[Path]:
    """The encoding jobs' logs in `folder`, one per corpus shard (`shards` as the rules pass it);
    params without the count: the shard logs that are there."""
    if shards is None:
        return sorted(folder.glob("*.log"))
    return [folder / f"{shard:04d}.log" for shard in range(shards)]
