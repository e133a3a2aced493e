"""The fine-tuning loop and the export of the encoder (one readable loop, knobs in the settings).

One optimiser step = one batch of `batch_size` queries = `accumulation` micro-batches on each of
`world_size` processes (data.contrast_plan). The step's loss is the mean over this process's
micro-batches; DDP averages the gradients over processes. The logged loss is the mean over
micro-batches and processes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from safetensors import safe_open

from .. import artifacts, st_export, training
from .. import projector as text_projector
from ..bert import weight_files
from ..encode import (TOKENIZER_THREADS, encoder_state, projector_of, safe_threads,
                      tokenize)
from ..parallel import bounded_map
from .data import (ContrastPlan, cached_chunk, contrast_plan, load_training_set,
                   micro_batch_index, micro_batches_of_rank, step_queries)
from .model import cached_contrast_set, load_bi_encoder, micro_batch_loss
from .passages import PassageStore, write_passages
from .schedule import build_schedule, warmup_steps
from .settings import FinetuneSettings, caching_chunk

log = logging.getLogger(__name__)

PREFETCH = 2  # micro-batches tokenised ahead of the step (prefetched_micro_batches)
# Out of memory before any micro-batch (training.loading_out_of_memory_fix): fine-tuning's keys
# and GPU rules.
GPU_ADVICE = {"keys": "finetune key", "rules": "finetune_stage1 and finetune_stage2"}


def train(settings: FinetuneSettings, *, init: Path, queries: Path, qrels: Path, corpus: Path,
          negatives: Sequence[Path], seed: int, out: Path, state_dir: Path,
          metrics_path: Path, heads: Path | None = None,
          sample_among: Sequence[Path] | None = None) -> int:
    """Fine-tune (or resume) one encoder; returns 0 when exported, RESUME_EXIT_CODE when stopped."""
    s, r = settings, settings.retrieval
    init, state_dir, metrics_path = Path(init), Path(state_dir), Path(metrics_path)
    env = training.init_distributed()
    training.seed_everything(seed)  # draws outside the steps (dropout: per micro-batch, below)
    plan = contrast_plan(s, env.world_size)
    per_pass = cached_chunk(s, plan)  # queries a forward pass when caching; None: not caching
    among = list(sample_among) if sample_among else None
    data = load_training_set(queries, qrels, corpus, list(negatives), s, seed, among)
    steps_per_epoch = len(data.query_ids) // s.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{len(data.query_ids)} training examples are fewer than one batch of "
                         f"{s.batch_size}; lower finetune.batch_size")
    total_steps = steps_per_epoch * s.epochs

    with training.oom_guard(plan.micro_batch, "micro_batch", fix=training.loading_out_of_memory_fix(
            "the encoder", env.device, **GPU_ADVICE)):
        model, tokenizer = load_bi_encoder(init, r, env.device, projector=s.projector, heads=heads)
    optimizer = training.build_optimizer(model, lr=s.lr, weight_decay=s.weight_decay)
    scheduler = build_schedule(optimizer, s, total_steps)
    if env.is_main and warmup_steps(s, total_steps) > total_steps:  # e.g. 1000 on a small set
        log.warning("the warm-up (%d steps) outlasts the run's %d steps: the lr never reaches its "
                    "peak (finetune.warmup_steps)", warmup_steps(s, total_steps), total_steps)
    # The init's weights file (its sha256 recorded), not its config.json: the config is the same
    # for every encoder of one architecture and so does not say which weights fine-tuning began at.
    inputs = {"init": init / "model.safetensors", "queries": queries, "qrels": qrels,
              **{f"negatives{i}": p for i, p in enumerate(negatives)},
              **{f"sample_among{i}": p for i, p in enumerate(among or [])},
              **({"heads": Path(heads)} if s.projector and heads else {})}
    job = {"settings": resume_settings(s), "seed": seed,
           "inputs": _identities({**inputs, "init": init, "corpus": corpus})}
    training.claim_state(state_dir, job, env)
    # The passages once per job, memory-mapped by every process (finetune/passages.py). A resumed
    # job reuses them: claim_state kept the folder only for the same settings and inputs, and the
    # file appears whole or not at all (published by rename); documents' are ~20 GB.
    passages_file = state_dir / "passages.arrow"
    if env.is_main and not passages_file.exists():
        write_passages(corpus, data.needed_passages(), passages_file)
    training.barrier(env)
    data = data.with_passages(PassageStore(passages_file))
    # A resumed state brings AdamW's moments (twice the weights) onto the GPU, before any step.
    with training.oom_guard(plan.micro_batch, "micro_batch", fix=training.loading_out_of_memory_fix(
            "the resumed optimiser state", env.device, **GPU_ADVICE)):
        resumed = training.load_state(state_dir, model=model, optimizer=optimizer,
                                      scheduler=scheduler)
    start = resumed["step"] if resumed else 0
    training.check_same_start(start, env)
    with training.oom_guard(plan.micro_batch, "micro_batch",
                            fix=training.data_parallel_out_of_memory_fix(env.device, **GPU_ADVICE)):
        ddp = training.data_parallel(model, env)
    metrics = training.MetricsWriter(metrics_path, resume_step=start, enabled=env.is_main,
                                     history=state_dir / "metrics.jsonl")
    stop = training.StopFlag()
    bar = training.Progress(total_steps, initial=start, enabled=env.is_main, desc="finetune")
    # Each epoch trains whole batches of a fresh permutation: its last len % batch_size queries
    # wait for a later epoch's order (data.step_queries); recorded, as the papers do not say.
    trained = steps_per_epoch * s.batch_size
    counts = {**data.counts, "queries_per_epoch": trained,
              "queries_left_out_per_epoch": len(data.query_ids) - trained}
    if env.is_main:
        log.info("%d training queries, %d steps; plan %s on %d process(es); %d positives absent "
                 "from the corpus dropped, %d queries left without a positive skipped; %d "
                 "negatives that were their query's positives removed; queries without "
                 "negatives (%s): %d dropped, %d padded from the corpus",
                 data.num_queries, total_steps, plan.record(), env.world_size,
                 counts["positives_absent_from_corpus"],
                 counts["queries_without_positive_in_corpus"],
                 counts["positives_among_negatives_removed"], s.queries_without_negatives,
                 counts["queries_without_negatives_dropped"],
                 counts["queries_without_negatives_padded"])
        if data.removed_example is not None:  # data.drop_positives
            qid, doc, path = data.removed_example
            log.warning("%d negatives were their query's own positives and were removed from its "
                        "list (e.g. query %s, doc %s in %s); a passage must not train as both",
                        counts["positives_among_negatives_removed"], qid, doc, path)
        if per_pass is not None:
            log.info("gradient cache on (finetune.cache_chunk): each micro-batch of %d queries "
                     "encoded %d queries (x %d passages) a forward pass, twice (without, then "
                     "with gradients); the contrast set stays %d queries, %d negatives a query",
                     plan.micro_batch, per_pass, s.group_size, plan.contrast_queries,
                     plan.negatives_per_query)
        elif s.cache_chunk is not None:  # accepted: the same key may cache at another GPU count
            log.info("finetune.cache_chunk %d covers the micro-batch of %d queries (this "
                     "process's share of a contrast set): each is encoded in one forward pass, "
                     "no gradient cache; it caches below %d", s.cache_chunk, plan.micro_batch,
                     plan.micro_batch)
        if "train_examples" in counts:  # negative_files separate: a query per file naming it
            log.info("each negatives file its own examples: %d an epoch, %s",
                     counts["train_examples"], {k: v for k, v in counts.items()
                                                if k.startswith("examples_of_")})
        if counts["queries_left_out_per_epoch"]:
            log.info("%d queries an epoch (whole batches); the other %d, different ones each "
                     "epoch, are not trained that epoch", trained,
                     counts["queries_left_out_per_epoch"])
        if "train_queries_sampled" in counts:  # drop may leave fewer than the sample's N
            log.info("low-resource sample %d of %d queries: %d of them trained", s.train_sample,
                     counts["train_queries_sampled"], data.num_queries)
        metrics.write({"step": start, "event": "start", **plan.record(),
                       **({"cache_chunk": per_pass} if per_pass is not None else {}),
                       "train_queries": data.num_queries, **counts,
                       "world_size": env.world_size})

    def save(step: int) -> None:
        training.save_state(state_dir, step=step, model=model, optimizer=optimizer,
                            scheduler=scheduler, data_position={"step": step})

    # What an out-of-memory error names: in a micro-batch, and in the optimiser step, whose first
    # call allocates AdamW's state.
    oom_fix = out_of_memory_fix(s, plan, env.world_size)
    step_oom_fix = out_of_memory_fix(s, plan, env.world_size, adamw_state_bytes(optimizer))
    def sync(syncs: bool) -> contextlib.AbstractContextManager:
        """DDP's gradient all-reduce on this backward (`syncs`), or no_sync() to accumulate."""
        return ddp.no_sync() if env.distributed and not syncs else contextlib.nullcontext()

    model.train()  # dropout on (from_pretrained loads in eval mode)
    inputs_ahead = prefetched_micro_batches(data, plan, s, seed, tokenizer, env, start, total_steps)
    for step in range(start, total_steps):
        # The losses stay on the device until the step's one host read (as in pre-training).
        losses: list[torch.Tensor] = []
        chunks: list[list[str]] = []  # per micro-batch: its query ids, named if its loss is not finite
        tokens, last = 0, False
        while not last:  # the step's micro-batches
            epoch, k, count, chunk, qb, pb = next(inputs_ahead)
            tokens += int(qb["attention_mask"].sum() + pb["attention_mask"].sum())  # host tensors
            chunks.append(list(chunk))
            last = k == count - 1  # DDP averages gradients over ranks after it
            # Dropout keyed by (seed, step, micro-batch), as in pre-training: a resumed job draws
            # the masks of the uninterrupted one on every rank (the state holds the main rank's
            # RNG state alone), and any number of processes those of one. Cached: by (seed,
            # step, micro-batch, chunk), the same in both passes.
            index = micro_batch_index(plan, s.gather, env.rank, env.world_size, k)
            if per_pass is None:
                training.seed_torch(seed, step, index)
                with sync(last), training.oom_guard(plan.micro_batch, "micro_batch", fix=oom_fix):
                    loss = micro_batch_loss(ddp, qb, pb, s, env.device, env.rank)
                    (loss / count).backward()
            else:
                with training.oom_guard(plan.micro_batch, "micro_batch", fix=oom_fix):
                    loss = cached_contrast_set(
                        ddp, model, qb, pb, s, env.device, env.rank, chunk=per_pass,
                        seed=lambda j, step=step, index=index: training.seed_torch(
                            seed, step, index, j),
                        scale=1 / count, sync=lambda syncs, last=last: sync(last and syncs))
            losses.append(loss.detach().float().reshape(1))
        values = torch.stack(losses)  # [micro-batches, 1]
        # The norm even without clipping (max_norm inf scales by exactly 1): a finite loss can
        # have an inf/NaN gradient, which must skip the step and stop the run, not reach the
        # weights.
        with training.oom_guard(plan.micro_batch, "micro_batch", fix=step_oom_fix):
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm or math.inf)
            lr = scheduler.get_last_lr()[0]  # this step's: scheduler.step() below moves to the next
            training.step_if_finite(optimizer, values, norm, distributed=env.distributed)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        read = training.host_read(values, norm, tokens=tokens, stop=stop.requested, env=env)
        training.check_finite_step(read, ["loss"], step=step, item_ids=chunks)
        loss_mean = read.means[0]  # over the step's micro-batches and processes
        done = step + 1
        rate = bar.update(int(read.tokens), loss=loss_mean)
        if env.is_main and (done % s.log_every_steps == 0 or done == total_steps or done == 1):
            metrics.write({"step": done, "epoch": epoch, "loss": loss_mean,
                           "lr": lr, "tokens_per_s": rate,
                           "negatives_per_query": plan.negatives_per_query})
        if env.is_main and done % s.save_every_steps == 0 and done < total_steps:
            save(done)
        if done < total_steps and training.run_or_resume_exit(read.stop, env, lambda: save(done)):
            inputs_ahead.close()  # ends the prefetch thread
            bar.close()
            log.warning("stopped at step %d on %s; rerun the same command to resume", done,
                        stop.signal_name or "another process's signal")
            training.teardown_distributed()
            return training.RESUME_EXIT_CODE
    inputs_ahead.close()
    bar.close()

    if env.is_main:
        export(model.encoder, tokenizer, out, s, seed, plan, total_steps, inputs,
               stats={"train_queries": data.num_queries, **counts},
               final_metrics={"loss": loss_mean})  # the last step's loss
        training.plot_losses(metrics_path, metrics_path.with_name("loss.png"), "fine-tuning loss")
        # The encoder is complete: a rerun must start afresh, not resume a finished run.
        shutil.rmtree(state_dir, ignore_errors=True)
    training.teardown_distributed()
    return 0


def micro_batch_inputs(data, settings: FinetuneSettings, seed: int, tokenizer, epoch: int,
                       chunk: list[str], pin: bool = False
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tokenised queries and passages of one micro-batch (its query ids `chunk`); with `pin`,
    in pinned memory, so that the step's copy to the GPU does not wait for the GPU to finish."""
    r = settings.retrieval
    query_texts, titles, passage_texts = data.micro_batch(chunk, settings.group_size, seed, epoch)
    inputs = (tokenize(tokenizer, query_texts, r.q_len),
              tokenize(tokenizer, passage_texts, r.p_len, titles, r.title))
    return tuple({k: v.pin_memory() for k, v in part.items()} for part in inputs) if pin else inputs


def prefetched_micro_batches(data, plan: ContrastPlan, settings: FinetuneSettings, seed: int,
                             tokenizer, env, start: int, total_steps: int,
                             ahead: int = PREFETCH, threads: int | None = None) -> Iterator[tuple]:
    """(epoch, k, the step's count of micro-batches, query ids, queries, passages) of this
    process's every micro-batch k of every step from `start` on, in order, each prepared `ahead`
    micro-batches early on background threads: the Rust tokenizer releases the GIL, so
    tokenising the next micro-batch overlaps the current step (done in the step, it cost about
    as much time as a bert-base step on the GPU at 512 tokens; benchmarks/RESULTS.md, issue 17).
    `threads`: default encode.TOKENIZER_THREADS on a GPU (one thread's ~51 ms a 512-token
    micro-batch is close to the GPU's step, and the loop's own Python takes the GIL), 1 on CPU.
    The inputs are what the step would build itself: a pure function of (seed, step, rank)."""
    cuda = env.device.type == "cuda"
    r = settings.retrieval
    threads = safe_threads(tokenizer, threads or (TOKENIZER_THREADS if cuda else 1), r.q_len, r.p_len)
    def plans() -> Iterator[tuple]:
        for step in range(start, total_steps):
            epoch, batch_ids = step_queries(data.query_ids, seed, step, settings.batch_size)
            micro_batches = micro_batches_of_rank(batch_ids, plan, settings.gather, env.rank,
                                                  env.world_size)
            for k, chunk in enumerate(micro_batches):
                yield epoch, k, len(micro_batches), chunk

    def prepared(epoch: int, k: int, count: int, chunk: list[str]) -> tuple:
        return (epoch, k, count, chunk,
                *micro_batch_inputs(data, settings, seed, tokenizer, epoch, chunk, cuda))

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="finetune-inputs") as pool:
        yield from bounded_map(prepared, plans(), pool, in_flight=max(ahead, threads) + 1)


def out_of_memory_fix(settings: FinetuneSettings, plan: ContrastPlan, world_size: int,
                      adamw_bytes: int | None = None) -> str:
    """What an out-of-memory error in a step tells the user (training.oom_guard's `fix`; with
    `adamw_bytes`, the error was in the optimiser step). No key lowers the micro-batch alone, as
    pre-training's micro_batch_size does: without gathering it is a whole contrast set, so a
    smaller one contrasts each query with fewer negatives; cache_chunk shrinks a forward pass
    instead, the contrast set kept (gradient caching). Any setting changed starts afresh
    (resume_settings): claim_state sets the old state aside."""
    s = settings
    split = f"batch_size {s.batch_size} / sub_batches {s.sub_batches}"
    if s.gather:
        split += f" / {world_size} GPU(s)"
    spread = ("train on more GPUs: gather splits each contrast set over them (the saved state "
              "resumes: the GPU count is no setting)" if s.gather else
              "set 'finetune.gather' true and train on several GPUs: a contrast set is then split "
              "over them (a changed setting: step 0 too)")
    chunk = cached_chunk(s, plan)
    cache = ("set 'finetune.cache_chunk' below the micro-batch's queries (gradient caching: a "
             "forward pass then holds that many queries' activations, for one more forward pass "
             "a step; a changed setting: step 0 too)" if chunk is None else
             f"lower 'finetune.cache_chunk' (now {chunk}: a forward pass holds that many "
             "queries' activations; a changed setting: step 0 too)")
    where = "" if adamw_bytes is None else (
        f"in the optimiser step, whose first call allocates AdamW's state "
        f"({adamw_bytes / 2**30:.2f} GiB) beside the weights and their gradients, in the memory "
        "the micro-batches left free; ")
    return (f"{where}a micro-batch is {plan.micro_batch} queries ({split}) x group_size "
            f"{s.group_size} passages of p_len {s.retrieval.p_len} tokens. Raise "
            "'finetune.sub_batches' (a divisor of batch_size; for one dataset: its overrides): a "
            "step still trains batch_size queries, by gradient accumulation, but each query's "
            f"in-batch negatives shrink with its contrast set (now {plan.negatives_per_query}), "
            "which changes what is trained; or lower 'finetune.group_size' or 'finetune.p_len'. "
            "Any of these restarts at step 0, the saved state moved aside, not deleted "
            f"(training.claim_state). Or, keeping the negatives, {spread}; or {cache}")


def adamw_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of AdamW's two moments, one copy of each parameter it updates (made at its first
    step)."""
    return 2 * sum(p.numel() * p.element_size()
                   for group in optimizer.param_groups for p in group["params"])


# Settings that cannot change the trained weights (when to log, when to save): changing them keeps
# a resumable state (training.claim_state).
RESULT_NEUTRAL = ("save_every_steps", "log_every_steps")


# The schedule knobs added after resumable states existed, at their defaults (the schedule those
# states were trained on): left out of the job, so that a state written before them still resumes.
SCHEDULE_DEFAULTS = {"lr_schedule": "linear", "min_lr_ratio": 0.0, "warmup_steps": None}
# Likewise the knobs added later, whatever their kind: negatives files unioned, as before.
LATER_DEFAULTS = {**SCHEDULE_DEFAULTS, "negative_files": "union", "cache_chunk": None,
                  "group_sampling": "draw", "example_positives": "query", "exclude_self": False}


def resume_settings(settings: FinetuneSettings) -> dict[str, Any]:
    """The settings a resumable state must match: all but RESULT_NEUTRAL (and LATER_DEFAULTS's
    knobs while they hold their defaults). A cache_chunk of a contrast set's queries or more is
    none (settings.caching_chunk): no micro-batch on any GPU count is larger, so its steps are
    the uncached ones and a state written with or without it resumes under the other."""
    record = settings.record()
    record["cache_chunk"] = caching_chunk(record)
    return {k: v for k, v in record.items() if k not in RESULT_NEUTRAL
            and not (k in LATER_DEFAULTS and v == LATER_DEFAULTS[k])}


def _identities(inputs: dict[str, Path]) -> dict[str, Any]:
    """Each input's path and the sha256 of its manifest, which changes whenever the artifact is
    rebuilt (a resume state must not outlive its inputs). Inputs without a manifest: path only."""
    out = {}
    for name, path in inputs.items():
        manifest = artifacts.manifest_path(path)
        out[name] = {"path": str(path), "manifest_sha256":
                     artifacts.sha256_file(manifest) if manifest.is_file() else None}
    return out


def export(encoder, tokenizer, out: Path, settings: FinetuneSettings, seed: int,
           plan: ContrastPlan, steps: int, inputs: dict[str, Path], stats: dict[str, Any],
           final_metrics: dict[str, float] | None = None) -> None:
    """The fine-tuned encoder as a Hugging Face folder (safetensors) + training.json + manifest,
    also a sentence-transformers model pooled (and projected) as it was trained (st_export.py),
    written whole or not at all (a full disk must not leave a config.json that looks like one)."""
    config = settings.record()
    provenance = {"config": config, "seed": seed, "plan": plan.record(), "steps": steps,
                  "inputs": {k: str(v) for k, v in inputs.items()},
                  "final_metrics": final_metrics or {}}
    init = Path(inputs["init"])  # the init folder's model.safetensors (train) or the folder
    init = init if init.is_dir() else init.parent
    state = encoder_state(encoder)
    state.update(init_pooler(init, state, next(encoder.parameters()).dtype))
    with artifacts.atomic_dir(out) as tmp:
        # An attached projector is not part of the Hugging Face model: it travels as its own file.
        encoder.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        projector = projector_of(encoder)
        if projector is not None:
            text_projector.save(tmp, projector)
        tokenizer.save_pretrained(tmp)
        artifacts.write_json(tmp / "training.json", provenance)
        # ... and in the sentence-transformers files as a Dense module, so they embed through it.
        st_export.write(tmp, settings.retrieval, st_export.finetuned_card(provenance, init, stats),
                        projector=projector)
        artifacts.write_manifest(tmp / "manifest.json", stage="finetune", params=config,
                                 inputs=inputs, stats={**stats, **plan.record(), "steps": steps,
                                                       "weights": artifacts.weights_checksums(tmp)})


def init_pooler(init: Path, state: dict[str, torch.Tensor], dtype: torch.dtype
                ) -> dict[str, torch.Tensor]:
    """The init folder's pooler tensors (`pooler.*`) that `state` lacks, as `dtype` (the
    exported weights' float32: exact for a half-precision init). Fine-tuning loads the encoder
    without its pooler (encode.load_encoder: nothing pools through it), so the export would have
    none, and transformers and sentence-transformers would load the folder with a freshly drawn
    pooler and a MISSING report; the init's is carried over unchanged, as Tevatron's whole-model
    save keeps it (pre-training freezes it too). An init without one gives none: nothing to keep.
    Stage 2 starts from stage 1's folder and so carries the same pooler."""
    pooler: dict[str, torch.Tensor] = {}
    for file in weight_files(init):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key.startswith("pooler.") and key not in state:
                    pooler[key] = handle.get_tensor(key).to(dtype)
    return pooler
