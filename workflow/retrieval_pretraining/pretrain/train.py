"""The pre-training loop and the export of the encoder (one readable loop, knobs in the settings).

One optimiser step = one global batch = accumulation x world_size micro-batches. Loss terms are
means per micro-batch; the step's gradient is their mean, so 1 process with accumulation 2 and 2
processes with accumulation 1 compute the same update (same micro-batches, see data.py; dropout
seeded per micro-batch, so the same masks too, up to floating-point summation order).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
from safetensors.torch import save_file

from .. import artifacts, st_export, training
from ..checkpoints import _TOKENIZER_FILES
from ..model_folder import check_folder_vocabulary, check_safetensors
from ..retrieval_settings import RetrievalSettings
from ..tokenizer_files import auto_tokenizer
from . import data as pdata
from . import contrast_cache, mixture, probes
from . import store as pstore
from .model import Pretrainer

log = logging.getLogger(__name__)


# Trainer keys that cannot change the trained weights, so changing them keeps a resumable state:
# what is logged and when (log_every, probe_every: the probes run in eval mode on held-out
# chunks and dropout is reseeded per micro-batch, tensorboard), when states are saved
# (checkpoint_every: a save reads, never draws), and the loader's workers (num_workers: every
# draw is keyed by (seed, epoch, chunk), data.py). micro_batch_size is not one: it changes
# which items share a dropout seed, so a resume would match neither setting's run. Those of them
# that change no output either (settings.TRAINER_RUNTIME) come outside the rule's params.
RESULT_NEUTRAL = ("tensorboard", "log_every", "probe_every", "checkpoint_every", "num_workers")

# A step's values are read on the host after the next step is queued (the loop in _train). False
# reads each at its own end, as a GPU then idles while the host reads, logs and fetches:
# benchmarks/trainer_throughput.py --read-at-once sets it to measure what the lag buys.
READ_A_STEP_LATE = True

# Out of memory before any micro-batch (training.loading_out_of_memory_fix): pre-training's keys
# and GPU rule.
GPU_ADVICE = {"keys": "pretrain trainer key", "rules": "pretrain_model"}


class QueuedStep(NamedTuple):
    """A step queued on the device whose values have not been read yet."""

    step: int
    keys: list[str]  # the names of its values, in order
    item_ids: list[list[int]]  # per micro-batch: its chunks, named if a value is not finite
    lr: float  # the learning rate it stepped with
    read: training.QueuedRead
    started: float  # perf_counter() when its queueing began
    waited: float  # seconds of it spent waiting for the DataLoader


def raise_if_nonfinite(queued: QueuedStep) -> None:
    """A queued step's non-finite report (check_finite_step), if it has one: for when queueing
    the step after it failed, so that step s's NaN, read a step late, is not lost under the error
    of step s + 1 (called while that error is handled: the traceback shows both). A read that
    fails itself (the device lost) adds nothing to the error already raised."""
    try:
        read = queued.read.take()
    except Exception:
        return
    training.check_finite_step(read, queued.keys, step=queued.step, item_ids=queued.item_ids)


# The schedule knobs added after resumable states existed, at their defaults (the schedule those
# states were trained on): left out of the job, so that a state written before them still resumes.
SCHEDULE_DEFAULTS = {"lr_schedule": "linear", "min_lr_ratio": 0.0, "warmup_steps": None}


def resume_job(settings: dict[str, Any], checksums: dict[str, Any],
               models: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a resumable state must match (training.claim_state): same settings (less
    RESULT_NEUTRAL, and SCHEDULE_DEFAULTS's knobs while they hold their defaults), same data, same
    starting weights (`models`: weights_identity of the checkpoint and of init_heads)."""
    trainer = {k: v for k, v in settings.get("trainer", {}).items() if k not in RESULT_NEUTRAL
               and not (k in SCHEDULE_DEFAULTS and v == SCHEDULE_DEFAULTS[k])}
    return {"settings": settings | {"trainer": trainer}, "data": checksums, "models": models or {}}


def weights_identity(path: Path | None) -> dict[str, str] | None:
    """The sha256 of each safetensors file of a model folder (or of one file): an `init` model
    rebuilt at the same path has other weights, and a state trained from the old ones must not be
    resumed over them. Hashed once per file version (artifacts.sha256_once)."""
    if path is None:
        return None
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    return {file.name: artifacts.sha256_once(file) for file in files}


def _copy_tokenizer(checkpoint: Path, dest: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (checkpoint / name).exists():
            shutil.copy2(checkpoint / name, dest / name)


def shared_checksums(paths: Sequence[str | Path],
                     env: training.DistEnv) -> dict[str, dict[str, str]]:
    """data_checksums on the main rank only, sent to the others, which adopt the shards' sums for
    the store's keys and checks: every rank reading every shard was ~13 GB a rank at paper
    scale, 8 to 64 times over from one shared file system, at each start and resume."""
    sent = training.from_main(
        (pdata.data_checksums(paths), {str(p): artifacts.file_version(p) for p in paths})
        if env.is_main else None, env)
    checksums, versions = sent
    if not env.is_main:
        for path in paths:
            artifacts.adopt_sha256(path, versions[str(path)], checksums[str(path)]["sha256"])
    return checksums


def held_out_chunks(dataset: pdata.MicroBatches, chunks: list) -> dict[str, list[int]]:
    """The probes' chunk ids per corpus (the `<corpus>` of results/corpus/<corpus>/chunks/...):
    the text no step trained on, on which analyses compare models (analysis/coverage.py)."""
    rows = dataset.holdout_rows
    files = np.searchsorted(np.cumsum(dataset.store.file_rows), rows, side="right")
    ids = dataset.store.chunk_ids(rows)
    held: dict[str, list[int]] = {}
    for file, chunk_id in zip(files, ids):
        held.setdefault(Path(chunks[file]).parent.parent.name, []).append(int(chunk_id))
    return {corpus: sorted(chunk_ids) for corpus, chunk_ids in held.items()}


def export_encoder(encoder: torch.nn.Module, checkpoint: Path, out_dir: Path, info: dict[str, Any],
                   retrieval: RetrievalSettings | None = None) -> None:
    """Write the encoder (no heads) + tokenizer + training.json as an HF folder that is also a
    sentence-transformers model pooled as `retrieval` says (default: st_export.pretrained_use),
    atomically."""
    with artifacts.atomic_dir(out_dir) as tmp:
        encoder.save_pretrained(tmp, safe_serialization=True)
        _copy_tokenizer(checkpoint, tmp)
        artifacts.write_json(tmp / "training.json", info)
        card = st_export.pretrained_card(info, checkpoint)
        st_export.write(tmp, retrieval or st_export.pretrained_use(checkpoint, info["objective"]),
                        card)
        artifacts.write_manifest(
            tmp / "manifest.json", stage="pretrain", params=info["settings"],
            inputs={"checkpoint_manifest": checkpoint / "manifest.json"},
            stats={**{k: info[k] for k in ("steps", "tokens_seen") if k in info},
                   "weights": artifacts.weights_checksums(tmp)},
        )


def export_base(settings: dict[str, Any], checkpoint: Path, out_dir: Path, metrics: Path, plot: Path,
                retrieval: RetrievalSettings | None = None) -> None:
    """The `none` objective: the base checkpoint itself, exported to the encoder path (with the
    sentence-transformers files of `retrieval`, default st_export.pretrained_use: the source's own
    pooling when it is a sentence-transformers model)."""
    check_safetensors(checkpoint)  # copied as it is: a pickle must not pass through
    # Nor a tokenizer with ids past the embeddings: every encoding of the copy would fail on them.
    tokenizer = auto_tokenizer(checkpoint)
    check_folder_vocabulary(checkpoint, tokenizer)
    with artifacts.atomic_dir(out_dir) as tmp:
        for file in Path(checkpoint).iterdir():
            if file.is_file() and file.name != "manifest.json":
                shutil.copy2(file, tmp / file.name)
        info = {"settings": settings, "objective": "none", "steps": 0, "tokens_seen": 0,
                "checkpoint": str(checkpoint), "versions": artifacts.library_versions()}
        artifacts.write_json(tmp / "training.json", info)
        card = st_export.pretrained_card(info, checkpoint)
        st_export.write(tmp, retrieval or st_export.pretrained_use(checkpoint, "none"), card)
        artifacts.write_manifest(tmp / "manifest.json", stage="pretrain", params=settings,
                                 inputs={"checkpoint_manifest": Path(checkpoint) / "manifest.json"},
                                 stats={"weights": artifacts.weights_checksums(tmp)})
    training.MetricsWriter(metrics)  # an empty metrics file: nothing was trained
    training.plot_losses(metrics, plot, title=f"{settings['name']}: base checkpoint, no training")


def loader_options(cuda: bool) -> dict[str, Any]:
    """The DataLoader keywords beside the dataset, batch, worker count and seed.

    Pinned host memory only when batches go to a GPU (so `.to(device, non_blocking=True)` is
    asynchronous; on CPU pinning is wasted copying). torch's other defaults are the right ones:
    2 micro-batches queued per worker (8 per rank with paper.yaml's 4 workers: ~0.25 s of GPU work
    at bert-base speed, enough to hide the epoch order each worker draws at an epoch's first
    batch) and workers that are not persistent (the loader is iterated once, over every remaining
    step)."""
    return {
        "pin_memory": cuda,
        # Slurm's SIGTERM/SIGUSR1 reach the workers too: only the main process may act on them.
        "worker_init_fn": training.ignore_stop_signals,
    }


def lr_warmup_steps(trainer: dict[str, Any], schedule_steps: int) -> int:
    """The lr warm-up in steps: `warmup_steps` when set (the BoW authors' 4000; it wins over
    warmup_ratio, as in fine-tuning), otherwise round(warmup_ratio x schedule_steps), as before."""
    if trainer["warmup_steps"] is not None:
        return trainer["warmup_steps"]
    return int(round(trainer["warmup_ratio"] * schedule_steps))


def head_warmup_steps(setting: int | str, fresh_head: bool, lr_warmup: int) -> int:
    """Steps that train the heads alone before the schedule: `auto` = as many as the lr warm-up
    when the MLM head is freshly initialised (at least 1), none when the checkpoint brought it."""
    if setting != "auto":
        return int(setting)
    return max(1, lr_warmup) if fresh_head else 0


def _tensorboard(log_dir: Path, start: int) -> training.TensorBoardLog:
    """TensorBoard log beside metrics.jsonl (not a declared output). A fresh run replaces an old
    log; a resumed one hides what the stopped run logged after its saved step."""
    if start == 0:
        shutil.rmtree(log_dir, ignore_errors=True)
    return training.TensorBoardLog(log_dir, purge_step=start + 1 if start else None)


def train(settings: dict[str, Any], *, state_dir: Path, store_dir: Path | None = None,
          **kwargs: Any) -> int:
    """`_train`, registered as a reader of the data store for its whole run, so that the workflow's
    onsuccess does not delete the store under it (store.registered_reader)."""
    with pstore.registered_reader(store_dir or Path(state_dir) / "data"):
        return _train(settings, state_dir=state_dir, store_dir=store_dir, **kwargs)


def _train(
    settings: dict[str, Any], *, chunks: Sequence, spans: Sequence | None,
    checkpoint: Path, encoder_out: Path, metrics_out: Path, plot_out: Path, state_dir: Path,
    init_heads: Path | None = None, retrieval: RetrievalSettings | None = None,
    store_dir: Path | None = None,
) -> int:
    """Train (or resume) one model; returns 0 when exported, RESUME_EXIT_CODE when stopped by a signal.

    `chunks` (and `spans`): the shards of one corpus, or one list per corpus of the settings'
    `corpora` (a mixture). `store_dir`: the data store folder, shared with the other models
    (store.py; default: `state_dir`/data). `init_heads`: the heads of the model `checkpoint` was
    exported from."""
    tr, objective = settings["trainer"], settings["objective"]
    if tr.get("tensorboard"):
        training.require_tensorboard()  # on every rank, before any work: a clear error, no hang
    env = training.init_distributed()
    checkpoint, state_dir = Path(checkpoint), Path(state_dir)
    training.seed_everything(settings["seed"])  # head initialisation is the same on every rank
    groups, span_groups = mixture.corpus_groups(chunks), mixture.corpus_groups(spans)
    mixed = mixture.proportions(settings, groups, span_groups)
    chunks = [path for group in groups for path in group]
    spans = [path for group in span_groups for path in group] if span_groups else None
    tokenizer = auto_tokenizer(checkpoint)
    # Before the data store and the model: masking draws random ids from the tokenizer's.
    check_folder_vocabulary(checkpoint, tokenizer)
    vocab = pdata.Vocab.from_tokenizer(tokenizer)
    pdata.check_tokenizer(chunks, tokenizer, checkpoint)
    pdata.check_positions(chunks, checkpoint)

    # Data: converted into the shared store by this job's processes between them (those another
    # job has converted are kept), then memory-mapped by every process.
    checksums = shared_checksums(list(chunks) + list(spans or []), env)
    store_files = pstore.prepare_store(chunks, spans, store_dir or state_dir / "data",
                                       share=(env.rank, env.world_size))
    pstore.wait_for_store(store_files)
    training.barrier(env)
    accumulation = training.accumulation_steps(tr["global_batch_size"], tr["micro_batch_size"], env.world_size)
    cache = contrast_cache.caches(settings, accumulation)
    if cache:
        log.info("gathered contrast set over %d micro-batches a process: its gradient is cached "
                 "(contrast_cache.py), so the pool is the global batch of %d texts",
                 accumulation, tr["global_batch_size"])
    dataset = pdata.MicroBatches(
        store_files, vocab=vocab, seed=settings["seed"], global_batch_size=tr["global_batch_size"],
        micro_batch_size=tr["micro_batch_size"], rank=env.rank, world_size=env.world_size,
        holdout=tr["probe_chunks"], corpus_files=[len(g) for g in groups] if mixed else None,
        proportions=mixed, **pdata.objective_inputs(settings),
    )
    schedule_steps = tr["max_steps"] or tr["epochs"] * dataset.steps_per_epoch
    warmup = lr_warmup_steps(tr, schedule_steps)

    bag_prior = dataset.mean_bag_size() / vocab.size if objective in ("cpdae", "cpdae_r") else None
    with training.oom_guard(tr["micro_batch_size"], fix=training.loading_out_of_memory_fix(
            "the model", env.device, **GPU_ADVICE)):
        model = Pretrainer(checkpoint, settings, tr["attn_implementation"], bag_prior,
                           init_heads=init_heads).to(env.device)
    head_warmup = head_warmup_steps(tr["head_warmup_steps"], model.fresh_head, warmup)
    total_steps = head_warmup + schedule_steps
    dataset.total_steps = total_steps
    optimizer = training.build_optimizer(
        model, lr=tr["lr"], weight_decay=tr["weight_decay"], betas=(tr["adam_beta1"], tr["adam_beta2"]),
        eps=tr["adam_eps"],
    )
    scheduler = training.lr_scheduler(optimizer, warmup_steps=warmup, total_steps=total_steps,
                                      hold_steps=head_warmup, shape=tr["lr_schedule"],
                                      min_ratio=tr["min_lr_ratio"])
    if env.is_main and warmup > schedule_steps:
        log.warning("the lr warm-up (%d steps) outlasts the schedule (%d): the lr never reaches "
                    "its peak (pretrain trainer.warmup_steps)", warmup, schedule_steps)
    ckpt_dir = state_dir / "checkpoints"
    # Another job's state is moved to `<state_dir>.superseded-<time>/`, outside the folder a
    # finished run deletes.
    models = {"checkpoint": weights_identity(checkpoint),
              "init_heads": weights_identity(init_heads)}
    training.claim_state(ckpt_dir, resume_job(settings, checksums, models), env, aside=state_dir)
    # A resumed state brings AdamW's moments (twice the weights) onto the GPU, before any step.
    with training.oom_guard(tr["micro_batch_size"], fix=training.loading_out_of_memory_fix(
            "the resumed optimiser state", env.device, **GPU_ADVICE)):
        resumed = training.load_state(ckpt_dir, model=model, optimizer=optimizer,
                                      scheduler=scheduler)
    start = resumed["step"] if resumed else 0
    training.check_same_start(start, env)
    tokens_seen = resumed["extra"].get("tokens_seen", 0) if resumed else 0
    log.info("objective %s: %d steps (%d per epoch over %d chunks, %d held out for the probes), "
             "global batch %d = %d x %d processes x %d accumulation, head warm-up %d (encoder "
             "frozen), lr warm-up %d, starting at step %d",
             objective, total_steps, dataset.steps_per_epoch, len(dataset.store),
             len(dataset.holdout_rows), tr["global_batch_size"], tr["micro_batch_size"],
             env.world_size, accumulation, head_warmup, warmup, start)

    with training.oom_guard(tr["micro_batch_size"],
                            fix=training.data_parallel_out_of_memory_fix(env.device, **GPU_ADVICE)):
        ddp = training.data_parallel(model, env)
    forward = torch.compile(ddp) if tr["compile"] else ddp
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(dataset, range(start * accumulation, total_steps * accumulation)),
        batch_size=None, num_workers=tr["num_workers"],
        # Worker seeds come from this generator, not the global RNG, so resuming does not shift it.
        generator=torch.Generator().manual_seed(settings["seed"]),
        **loader_options(env.device.type == "cuda"),
    )
    metrics = training.MetricsWriter(metrics_out, resume_step=start, enabled=env.is_main,
                                     history=ckpt_dir / "metrics.jsonl")
    board = _tensorboard(Path(metrics_out).parent / "tensorboard", start) \
        if tr.get("tensorboard") and env.is_main else None
    held_out = dataset.probe_batches() if env.is_main else []

    def probe_scores() -> dict[str, float]:
        """The objective's probes on the held-out chunks (main rank; nothing when none)."""
        # A probe batch is at most micro_batch_size chunks (data.probe_batches), without gradients.
        with training.oom_guard(tr["micro_batch_size"]), \
                training.autocast(env.device, tr["precision"]):
            return probes.probe_batches(model, [
                {k: v.to(env.device) for k, v in b.items()} for b in held_out])

    if held_out and start == 0:
        # tokens_seen (0 here: a run resumed past step 0 writes no step-0 record) lets the loss
        # curves keep their tokens-seen axis, which needs it on every record.
        metrics.write({"step": 0, "tokens_seen": tokens_seen, **probe_scores()})
    stop = training.StopFlag()
    bar = training.Progress(total_steps, initial=start, enabled=env.is_main, desc=settings["name"])
    training.reap_workers_at_exit()  # workers ignore SIGTERM: never let the exit wait on them
    batches = iter(loader)

    def close_outputs() -> None:
        training.close_loader(batches)
        bar.close()
        if board is not None:
            board.close()

    def save(step: int) -> None:
        training.save_state(
            ckpt_dir, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
            data_position={"step": step, "epoch": step // dataset.steps_per_epoch,
                           "micro_batch": step * accumulation},
            extra={"tokens_seen": tokens_seen},
        )

    started = time.perf_counter()
    record: dict[str, Any] = {}  # the last step's record: what the encoder's card states
    # The seconds the steps since the last record waited for the DataLoader, over the wall seconds
    # from the first one's start to the next one's (or the read's, with none queued): at most the
    # share of time an input pipeline left a GPU idle (a wait overlaps the kernels of the step or
    # micro-batch queued before it).
    waited, interval_start = 0.0, None

    def fetch() -> tuple[dict[str, torch.Tensor], list[int], int, float]:
        """The next micro-batch on the device, its chunk ids (on the host: no read), its real
        tokens, and the seconds spent waiting for it."""
        asked = time.perf_counter()
        host_batch = next(batches)
        wait = time.perf_counter() - asked
        return ({k: v.to(env.device, non_blocking=True) for k, v in host_batch.items()},
                host_batch["chunk_ids"].tolist(), int(host_batch["n_tokens"]), wait)

    def seed_micro(step: int, micro: int) -> None:
        # Dropout masks keyed by (seed, step, global micro-batch index): identical on resume and
        # for any number of processes, without per-rank RNG state in the checkpoint.
        training.seed_torch(settings["seed"], step, micro * env.world_size + env.rank)

    @contextlib.contextmanager
    def guarded():
        with training.oom_guard(tr["micro_batch_size"]), training.autocast(env.device, tr["precision"]):
            yield

    cache_fix = contrast_cache.out_of_memory_fix(tr["global_batch_size"], env.world_size)

    def cache_guarded():  # what a caching step holds at once is no micro-batch's memory
        return training.oom_guard(tr["global_batch_size"], "global_batch_size", fix=cache_fix)

    def queue_step(step: int) -> QueuedStep:
        """Step `step`, queued on the device: its micro-batches, the update, the read of its values
        on their way to the host (nothing here waits for the GPU)."""
        started, waited = time.perf_counter(), 0.0
        terms: list[torch.Tensor] = []  # per micro-batch: its output values, in `keys` order
        keys: list[str] = []
        item_ids: list[list[int]] = []  # per micro-batch: its chunks, named if a value is not finite
        tokens = 0
        # A tensor, not a float: compiled, a float's value would be guarded (see Pretrainer.forward).
        progress = torch.full((), step / total_steps, dtype=torch.float64, device=env.device)
        # Caching the contrastive gradient needs every micro-batch of the step before the first.
        with cache_guarded():
            fetched = [fetch() for _ in range(accumulation)] if cache else []
        cached = contrast_cache.cached_contrast(
            model, [f[0] for f in fetched], lambda micro: seed_micro(step, micro), guarded,
            cache_guarded,
        ) if cache else None
        for micro in range(accumulation):
            with training.oom_guard(tr["micro_batch_size"]):
                batch, ids, n_tokens, wait = fetched[micro] if cache else fetch()
            item_ids.append(ids)
            tokens += n_tokens
            waited += wait
            seed_micro(step, micro)
            sync = ddp.no_sync() if env.distributed and micro < accumulation - 1 else contextlib.nullcontext()
            with sync, guarded():
                # `cached` only when caching: a row that does not cache calls forward as always.
                out = forward(batch, progress=progress, **({"cached": cached[micro]} if cache else {}))
                loss = out["loss"] / accumulation
                if cache:  # the contrastive term's gradient, whole (contrast_cache.py)
                    loss = loss + out.pop("contrast_surrogate")
                loss.backward()
            keys = keys or sorted(out)
            terms.append(torch.stack([out[key].detach().float() for key in keys]))
        if step < head_warmup:  # only the heads learn: the encoder's gradients are dropped
            for parameter in model.encoder.parameters():
                parameter.grad = None
        # The optimiser's first step allocates AdamW's state (twice the weights) in what the
        # micro-batches left free: out of memory there, a smaller micro-batch is the fix too.
        with training.oom_guard(tr["micro_batch_size"]):
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tr["max_grad_norm"])
            values = torch.stack(terms)
            # Skipped on every process if one's values are NaN/inf (raised when they are read).
            training.step_if_finite(optimizer, values, grad_norm, distributed=env.distributed)
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        read = training.queue_read(values, grad_norm, tokens=tokens, stop=stop.requested, env=env)
        return QueuedStep(step, keys, item_ids, lr, read, started, waited)

    def probe_due(done: int) -> bool:
        # The held-out rows, not `held_out` (the main rank's alone): every rank reads the step
        # before the probes at once, so all take a stop from the same step's values.
        probed = len(dataset.holdout_rows) > 0
        return probed and (done % tr["probe_every"] == 0 or done == total_steps)

    def save_due(done: int) -> bool:
        return bool(tr["checkpoint_every"]) and done % tr["checkpoint_every"] == 0 and done < total_steps

    def finish(queued: QueuedStep, next_started: float | None) -> bool:
        """Read a queued step's values and log them; True if a stop signal reached a process (the
        verdict every process reads in the same step). `next_started`: when the step queued after
        it began (None: none is)."""
        nonlocal tokens_seen, record, waited, interval_start
        step, keys = queued.step, queued.keys
        read = queued.read.take()
        until = time.perf_counter() if next_started is None else next_started
        waited += queued.waited
        interval_start = queued.started if interval_start is None else interval_start
        training.check_finite_step(read, keys, step=step, item_ids=queued.item_ids)
        tokens_seen += int(read.tokens)
        record = dict(zip(keys, read.means))
        rate = bar.update(int(read.tokens), loss=record["loss"])
        done = step + 1
        if env.is_main and (done % tr["log_every"] == 0 or done == total_steps or probe_due(done)):
            record |= {
                "step": done, "lr": queued.lr, "grad_norm": read.grad_norm, "tokens_per_s": rate,
                "tokens_seen": tokens_seen, "memory_mb": training.memory_mb(env.device),
                "encoder_frozen": step < head_warmup,
                "input_wait_share": round(waited / (until - interval_start), 4),
            }
            if probe_due(done):  # the weights step `step` left: no later step is queued
                record |= probe_scores()
            metrics.write(record)
            if board is not None:
                board.write(record)
            waited, interval_start = 0.0, None  # the probes' time not counted
        return read.stop

    model.train()  # dropout on (from_pretrained loads in eval mode)
    # Nothing in a step reads a value on the host: the losses, the gradient norm and the token
    # count stay on the device until its one read (queue_read), taken after the next step is
    # queued, so a GPU never idles while Python waits for the values, logs them and fetches the
    # next batch. A step whose weights are read next (the probes, a save, the export) or after
    # which the run stops is read at once instead, with nothing queued after it.
    pending: QueuedStep | None = None
    for step in range(start, total_steps):
        try:
            queued = queue_step(step)
        except Exception:
            if pending is not None:  # its NaN, if any, first: this error may follow from it
                raise_if_nonfinite(pending)
            raise
        stopping = finish(pending, queued.started) if pending is not None else False
        pending = queued
        done = step + 1
        if READ_A_STEP_LATE and not (stopping or probe_due(done) or save_due(done)
                                     or done == total_steps):
            continue
        pending = None
        # A stop seen at the step before is seen here too (a process's flag never clears).
        stopping = finish(queued, None) or stopping
        if env.is_main and save_due(done):
            save(done)
        if done < total_steps and training.run_or_resume_exit(stopping, env, lambda: save(done)):
            close_outputs()
            log.warning("stopped at step %d on %s; rerun the same command to resume", done,
                        stop.signal_name or "another process's signal")
            training.teardown_distributed()
            return training.RESUME_EXIT_CODE
    close_outputs()
    model.eval()

    if env.is_main:
        info = {
            "settings": settings, "objective": objective, "steps": total_steps,
            "tokens_seen": tokens_seen, "world_size": env.world_size, "accumulation": accumulation,
            "contrast_cache": cache,  # a gathering row's contrastive gradient cached (contrast_cache.py)
            "steps_per_epoch": dataset.steps_per_epoch, "chunks": len(dataset.store),
            "head_warmup_steps": head_warmup, "fresh_mlm_head": model.fresh_head,
            "probe_chunks": len(dataset.holdout_rows),
            "held_out_chunks": held_out_chunks(dataset, chunks),
            "chunk_files": len(chunks), "span_files": len(spans or []),
            "resumed_from_step": start, "train_seconds_this_run": round(time.perf_counter() - started, 1),
            "checkpoint": str(checkpoint), "init_heads": str(init_heads) if init_heads else None,
            "corpora": settings.get("corpora"), "corpus_quotas": dataset.quotas.tolist(),
            "data": checksums, "versions": artifacts.library_versions(),
            "final_metrics": st_export.measured(record),  # the last step's losses and probes
        }
        export_encoder(model.encoder, checkpoint, encoder_out, info, retrieval)
        # The heads are not part of the encoder; kept beside it for the analyses (vocabulary
        # projection of [CLS], CPDAE's decoder words). Tied embeddings are not repeated.
        heads = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                 if not k.startswith("encoder.")}
        with artifacts.atomic_path(Path(encoder_out).parent / "heads.safetensors") as tmp:
            save_file(heads, str(tmp), metadata={"objective": objective})
        training.plot_losses(metrics_out, plot_out, title=f"{settings['name']} ({objective})")
        # A finished run leaves no state behind: a later rerun (new code) must start afresh, and
        # the data copy (as large as the corpus) is not kept once per model.
        shutil.rmtree(state_dir, ignore_errors=True)
    training.teardown_distributed()
    return 0
