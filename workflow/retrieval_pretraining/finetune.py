"""Bi-encoder fine-tuning (Tevatron-style): shared encoder, contrastive loss over groups + in-batch.

Each training query brings a group of `group_size` passages (1 positive + n-1 negatives). A query is
scored against every passage of its *contrast set* and trained with cross-entropy towards its own
positive. What the contrast set is decides the number of negatives, and the papers disagree on it
silently (REFERENCE.md), so here it is explicit and logged as `negatives_per_query`:

  contrast set = batch_size / sub_batches queries' passages.
  sub_batches=8 with batch 64 reproduces the COSTA authors' 8 GPUs x 8 queries without gathering
  (63 negatives per query) on any number of GPUs; sub_batches=1 contrasts the whole batch (511).
  gather=true lets one contrast set span GPUs (passages all-gathered with gradients); with
  gather=false a contrast set must fit on one GPU (it is one micro-batch).

Batches are a pure function of (seed, epoch, query id): the query order of an epoch comes from
(seed, epoch), a query's positive and negatives from (seed, epoch, query id). So a resumed run,
or one on a different number of GPUs, sees the same groups. Trainer mechanics (DDP, accumulation,
AdamW + warm-up, bf16, resumable state, metrics) come from `training.py`.

Training queries are the split's queries with a positive (relevance > 0) in the corpus: a qrel naming
a document absent from the corpus is kept by datasets.py (it is an unretrievable relevant for
scoring) but cannot be trained on, so it is dropped here, and a query left without positives is
skipped; both are counted (log, metrics `start` event, encoder manifest). A query without negatives
(MS MARCO's triples do not cover every judged query) is dropped or padded with random corpus
documents (`queries_without_negatives`: drop | pad, Tevatron's padding), counted too. Padding draws
from a seeded pool of at most PAD_POOL documents (the whole corpus when smaller), so no process
holds the whole corpus in memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from . import artifacts, training
from .config import stage_parser
from .encode import encode_batch, settings, tokenize
from .mine import rng_for

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "group_size": 8,
    "batch_size": 64,         # queries per optimiser step, over all GPUs
    "sub_batches": 1,         # fixed contrast sets per batch (see module docstring)
    "gather": False,          # all-gather passages across GPUs within a contrast set
    "lr": 5e-6,
    "warmup_ratio": 0.1,
    "weight_decay": 0.0,
    "max_grad_norm": None,    # Tevatron / the COSTA scripts do not clip
    "epochs": 3,
    "precision": "auto",      # auto (bf16 on CUDA) | fp32
    "train_queries": None,    # low-resource mode / demo: N sampled training queries (null = all)
    "train_sample": 0,        # which of the K seeded samples of N queries (low-resource splits)
    "queries_without_negatives": "pad",  # pad (random corpus documents, Tevatron) | drop
    "save_every_steps": 500,
    "log_every_steps": 10,
}


WITHOUT_NEGATIVES = ("pad", "drop")
PAD_POOL = 100_000  # corpus documents padding draws from (a seeded sample; all of a smaller corpus)


def options(config: dict[str, Any]) -> dict[str, Any]:
    cfg = {**settings(config), **{k: config.get(k, v) for k, v in DEFAULTS.items()}}
    if cfg["queries_without_negatives"] not in WITHOUT_NEGATIVES:
        raise ValueError(f"finetune.queries_without_negatives {cfg['queries_without_negatives']!r} "
                         "is unknown; use 'pad' or 'drop'")
    return cfg


# ---------------------------------------------------------------- loss ---------------------------
def contrastive_loss(q: torch.Tensor, p: torch.Tensor, group_size: int, temperature: float = 1.0,
                     query_offset: int = 0) -> torch.Tensor:
    """Mean cross-entropy of queries `q` (b x d) over passages `p` (m x d).

    Query i's positive is passage (query_offset + i) * group_size: passages are laid out group by
    group, positive first. query_offset is this process's first query within a gathered contrast set.
    """
    scores = q @ p.T / temperature
    targets = (torch.arange(len(q), device=q.device) + query_offset) * group_size
    return F.cross_entropy(scores.float(), targets)


def contrast_plan(cfg: dict[str, Any], world_size: int) -> dict[str, int]:
    """Queries per micro-batch, micro-batches per step, and the negatives each query sees."""
    batch, subs = cfg["batch_size"], cfg["sub_batches"]
    if batch % subs:
        raise ValueError(f"finetune.batch_size {batch} is not divisible by sub_batches {subs}")
    contrast = batch // subs
    if cfg["gather"]:
        if contrast % world_size:
            raise ValueError(f"a contrast set of {contrast} queries cannot be split over "
                             f"{world_size} GPUs; choose batch_size/sub_batches divisible by it")
        micro = contrast // world_size
    else:
        micro = contrast
    accumulation = training.accumulation_steps(batch, micro, world_size)
    return {"micro_batch": micro, "accumulation": accumulation, "contrast_queries": contrast,
            "negatives_per_query": contrast * cfg["group_size"] - 1}


# ---------------------------------------------------------------- data ---------------------------
def training_queries(queries: Path, qrels: Path, negative_files: list[Path], cfg: dict[str, Any],
                     seed: int, corpus: Path | None = None
                     ) -> tuple[list[str], dict[str, str], dict[str, list[str]],
                                dict[str, list[str]], dict[str, int]]:
    """(query ids in a stable order, query texts, positives, negatives, counts) of the training set.

    Negatives of several files (e.g. mined + BM25) are unioned in file order, duplicates dropped.
    With `corpus`, positives absent from it are dropped and queries left without one skipped; with
    queries_without_negatives=drop, queries without negatives are skipped. Both happen before the
    low-resource sample is drawn, so a sample of N queries holds N trainable queries.
    """
    texts = dict(pl.read_parquet(queries, columns=["query_id", "text"]).iter_rows())
    pos_frame = (pl.scan_parquet(qrels).filter(pl.col("relevance") > 0).group_by("query_id")
                 .agg(pl.col("doc_id").unique().sort()).collect())
    positives = dict(zip(pos_frame["query_id"].to_list(), pos_frame["doc_id"].to_list()))
    negatives: dict[str, list[str]] = {}
    for path in negative_files:
        frame = pl.read_parquet(path, columns=["query_id", "negative_ids"])
        for qid, negs in frame.iter_rows():
            merged = negatives.setdefault(qid, [])
            seen = set(merged)
            merged.extend(n for n in (negs or []) if n not in seen and not seen.add(n))
    missing = sorted(set(positives) - set(texts))
    if missing:
        raise ValueError(f"{qrels} names {len(missing)} queries absent from {queries} "
                         f"(e.g. {missing[:3]}); rebuild the dataset")
    counts = {"positives_absent_from_corpus": 0, "queries_without_positive_in_corpus": 0,
              "queries_without_negatives_dropped": 0}
    if corpus is not None:
        wanted = {d for docs in positives.values() for d in docs}
        present = set(corpus_rows(corpus, wanted, ["doc_id"])["doc_id"].to_list())
        for qid in sorted(positives):
            kept = [d for d in positives[qid] if d in present]
            counts["positives_absent_from_corpus"] += len(positives[qid]) - len(kept)
            if kept:
                positives[qid] = kept
            else:
                del positives[qid]
                counts["queries_without_positive_in_corpus"] += 1
    ids = sorted(positives)
    if cfg["queries_without_negatives"] == "drop":
        kept_ids = [q for q in ids if negatives.get(q)]
        counts["queries_without_negatives_dropped"] = len(ids) - len(kept_ids)
        ids = kept_ids
    if cfg["train_queries"] is not None and cfg["train_queries"] < len(ids):
        # Low-resource sample k of N queries: seeded by (seed, N, k), independent of anything else.
        pick = rng_for(seed, "train-queries", cfg["train_queries"], cfg["train_sample"]).choice(
            len(ids), size=cfg["train_queries"], replace=False)
        ids = [ids[i] for i in np.sort(pick)]
    return ids, texts, positives, negatives, counts


def corpus_rows(corpus: Path, doc_ids: set[str], columns: list[str]) -> pl.DataFrame:
    """`columns` of the corpus rows whose doc_id is in `doc_ids` (a scan: the corpus is not loaded)."""
    wanted = pl.LazyFrame({"doc_id": sorted(doc_ids)}, schema={"doc_id": pl.String})
    return pl.scan_parquet(corpus).select(columns).join(wanted, on="doc_id", how="semi").collect()


def padding_pool(corpus: Path, seed: int, size: int = PAD_POOL) -> list[str]:
    """Doc ids that groups without negatives are padded from: the whole corpus (in file order) when
    it has at most `size` documents, else `size` of them drawn from (seed) alone, in file order."""
    doc_ids = pl.read_parquet(corpus, columns=["doc_id"])["doc_id"]
    if len(doc_ids) <= size:
        return doc_ids.to_list()
    rows = np.sort(rng_for(seed, "padding-pool").choice(len(doc_ids), size=size, replace=False))
    return doc_ids.gather(rows).to_list()


def sample_group(qid: str, positives: list[str], negatives: list[str], fallback: list[str],
                 group_size: int, seed: int, epoch: int) -> list[str]:
    """[positive, n-1 negatives] for one query in one epoch, from (seed, epoch, query id) alone.

    Too few negatives: sampled with replacement; none at all: random corpus documents (`fallback`,
    positives excluded), as Tevatron pads groups.
    """
    rng = rng_for(seed, "group", epoch, qid)
    group = [positives[rng.integers(len(positives))]]
    pool = negatives
    if not pool:
        excluded = set(positives)
        pool = [d for d in (fallback[i] for i in rng.choice(len(fallback), 4 * group_size))
                if d not in excluded]
    need = group_size - 1
    if need:
        picks = rng.choice(len(pool), size=need, replace=len(pool) < need)
        group.extend(pool[i] for i in picks)
    return group


def epoch_order(num_queries: int, seed: int, epoch: int) -> np.ndarray:
    return rng_for(seed, "order", epoch).permutation(num_queries)


# ---------------------------------------------------------------- training -----------------------
def train(init: Path, queries: Path, qrels: Path, corpus: Path, negative_files: list[Path],
          out: Path, state_dir: Path, metrics_path: Path, config: dict[str, Any], seed: int) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoModel, AutoTokenizer

    cfg = options(config)
    env = training.init_distributed()
    training.seed_everything(seed)  # dropout; data order never depends on it
    plan = contrast_plan(cfg, env.world_size)
    ids, qtexts, positives, negatives, counts = training_queries(
        queries, qrels, negative_files, cfg, seed, corpus=corpus)
    steps_per_epoch = len(ids) // cfg["batch_size"]
    if steps_per_epoch == 0:
        raise ValueError(f"{len(ids)} training queries are fewer than one batch of "
                         f"{cfg['batch_size']}; lower finetune.batch_size")
    total_steps = steps_per_epoch * cfg["epochs"]
    # Left after a drop policy: none; after pad: their groups come from the padding pool.
    no_negatives = sum(1 for q in ids if not negatives.get(q))
    counts["queries_without_negatives_padded"] = no_negatives
    fallback = padding_pool(corpus, seed) if no_negatives else []
    needed = {d for q in ids for d in positives[q]}
    needed |= {d for q in ids for d in negatives.get(q, [])} | set(fallback)
    # Only the texts training can use are held in memory (8.8M MS MARCO passages need not be).
    docs = {d: (t or "", x or "")
            for d, t, x in corpus_rows(corpus, needed, ["doc_id", "title", "text"]).iter_rows()}
    absent = needed - set(docs)
    if absent:  # positives were checked against the corpus above, so these are negatives
        raise ValueError(f"{len(absent)} negative doc ids are not in {corpus} (e.g. "
                         f"{sorted(absent)[:3]}); the negatives were built for another corpus")

    model = AutoModel.from_pretrained(init, local_files_only=True, trust_remote_code=False,
                                      add_pooling_layer=False).to(env.device)
    tokenizer = AutoTokenizer.from_pretrained(init, local_files_only=True, use_fast=True)
    optimizer = training.build_optimizer(model, lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                         device=env.device)
    scheduler = training.linear_schedule(optimizer, total_steps=total_steps,
                                         warmup_steps=math.ceil(cfg["warmup_ratio"] * total_steps))
    if env.is_main:
        discard_stale_state(state_dir, {"config": cfg, "seed": seed, "init": str(init),
                                        "negatives": [str(p) for p in negative_files]})
    if env.distributed:
        torch.distributed.barrier()
    resumed = training.load_state(state_dir, model=model, optimizer=optimizer, scheduler=scheduler)
    step = resumed["step"] if resumed else 0
    ddp = DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda"
                                  else None) if env.distributed else model
    metrics = training.MetricsWriter(metrics_path, resume_step=step, enabled=env.is_main,
                                     history=state_dir / "metrics.jsonl")
    progress = training.Progress(total_steps, initial=step, enabled=env.is_main, desc="finetune")
    stop = training.StopFlag()
    if env.is_main:
        log.info("%d training queries, %d steps; plan %s on %d process(es); %d positives absent "
                 "from the corpus dropped, %d queries left without a positive skipped; queries "
                 "without negatives (%s): %d dropped, %d padded from the corpus", len(ids),
                 total_steps, plan, env.world_size, counts["positives_absent_from_corpus"],
                 counts["queries_without_positive_in_corpus"], cfg["queries_without_negatives"],
                 counts["queries_without_negatives_dropped"],
                 counts["queries_without_negatives_padded"])
        metrics.write({"step": step, "event": "start", **plan, "train_queries": len(ids),
                       **counts, "world_size": env.world_size})

    def save() -> None:
        training.save_state(state_dir, step=step, model=model, optimizer=optimizer,
                            scheduler=scheduler, data_position={"step": step})

    ddp.train()
    while step < total_steps:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        order = epoch_order(len(ids), seed, epoch)
        batch_ids = [ids[i] for i in order[in_epoch * cfg["batch_size"]:
                                          (in_epoch + 1) * cfg["batch_size"]]]
        # This process's micro-batches: contrast sets in order, each split over ranks if gathering.
        micro = plan["micro_batch"]
        chunks = [batch_ids[i:i + micro] for i in range(0, len(batch_ids), micro)]
        mine = chunks[env.rank::env.world_size] if cfg["gather"] else \
            chunks[env.rank * plan["accumulation"]:(env.rank + 1) * plan["accumulation"]]
        total_loss, tokens = 0.0, 0
        for k, chunk in enumerate(mine):
            groups = [sample_group(q, positives[q], negatives.get(q, []), fallback,
                                   cfg["group_size"], seed, epoch) for q in chunk]
            flat = [d for g in groups for d in g]
            qb = tokenize(tokenizer, [qtexts[q] for q in chunk], cfg["q_len"])
            pb = tokenize(tokenizer, [docs[d][1] for d in flat], cfg["p_len"],
                          [docs[d][0] for d in flat], cfg["title"])
            tokens += int(qb["attention_mask"].sum() + pb["attention_mask"].sum())
            last = k == len(mine) - 1
            sync = ddp.no_sync() if env.distributed and not last else contextlib.nullcontext()
            with sync, training.autocast(env.device, cfg["precision"]):
                q = encode_batch(ddp, qb, cfg["pooling"], cfg["similarity"])
                p = encode_batch(ddp, pb, cfg["pooling"], cfg["similarity"])
                offset = 0
                if cfg["gather"] and env.distributed:
                    p = training.all_gather_with_grad(p.contiguous())
                    offset = env.rank * len(chunk)
                loss = contrastive_loss(q, p, cfg["group_size"], cfg["temperature"], offset)
                training.check_finite({"loss": loss}, step=step, item_ids=chunk)
                (loss / len(mine)).backward()
            total_loss += loss.item() / len(mine)
        if cfg["max_grad_norm"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        rate = progress.update(tokens * env.world_size, loss=total_loss)
        if env.is_main and (step % cfg["log_every_steps"] == 0 or step == total_steps or step == 1):
            metrics.write({"step": step, "epoch": epoch, "loss": total_loss,
                           "lr": scheduler.get_last_lr()[0], "tokens_per_s": rate,
                           "negatives_per_query": plan["negatives_per_query"]})
        if training.run_or_resume_exit(stop, env, save):
            training.teardown_distributed()
            training.exit_process(training.RESUME_EXIT_CODE)
        if env.is_main and step % cfg["save_every_steps"] == 0 and step < total_steps:
            save()
    progress.close()
    if env.is_main:
        export(model, tokenizer, out, cfg, seed, plan, step,
               inputs={"init": init / "config.json", "queries": queries, "qrels": qrels,
                       **{f"negatives{i}": p for i, p in enumerate(negative_files)}},
               stats={"train_queries": len(ids), **counts})
        training.plot_losses(metrics_path, metrics_path.with_name("loss.png"), "fine-tuning loss")
        # The encoder is complete: a rerun must start afresh, not resume a finished run.
        shutil.rmtree(state_dir, ignore_errors=True)
    training.teardown_distributed()


def discard_stale_state(state_dir: Path, fingerprint: dict[str, Any]) -> None:
    """Resume only a run of the same job: state left by other settings or inputs is deleted."""
    marker = state_dir / "job.json"
    if marker.exists() and artifacts.read_json(marker) != json.loads(json.dumps(fingerprint)):
        log.warning("state in %s belongs to other settings; starting afresh", state_dir)
        shutil.rmtree(state_dir)
    if not marker.exists():
        artifacts.write_json(marker, fingerprint)


def export(model, tokenizer, out: Path, cfg: dict[str, Any], seed: int, plan: dict[str, int],
           steps: int, inputs: dict[str, Path], stats: dict[str, Any]) -> None:
    """The fine-tuned encoder as a Hugging Face folder (safetensors) + training.json + manifest."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    provenance = {"config": cfg, "seed": seed, "plan": plan, "steps": steps,
                  "inputs": {k: str(v) for k, v in inputs.items()}}
    artifacts.write_json(out / "training.json", provenance)
    artifacts.write_manifest(out / "manifest.json", stage="finetune", params=cfg, inputs=inputs,
                             stats={**stats, **plan, "steps": steps})


def main() -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--init", type=Path, required=True, help="encoder folder to start from")
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--qrels", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--negatives", type=Path, nargs="+", required=True,
                        help="negatives Parquet file(s); several are unioned in order")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="encoder folder to write")
    parser.add_argument("--state", type=Path, required=True, help="resume state (outside outputs)")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics .jsonl")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    train(args.init, args.queries, args.qrels, args.corpus, args.negatives, args.out, args.state,
          args.metrics, args.config, args.seed)
    training.exit_process(0)


if __name__ == "__main__":
    main()
