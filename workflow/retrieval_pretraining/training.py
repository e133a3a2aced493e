"""Trainer core shared by pre-training and fine-tuning: the parts every training loop needs.

A loop built on these helpers reads like nanoGPT's: init_distributed() -> build_optimizer() ->
linear_schedule() -> load_state() -> for each step: accumulate micro-batches under autocast(),
check_finite(), clip, step, MetricsWriter.write(), save_state() every N steps or when
StopFlag.requested -> exit(RESUME_EXIT_CODE); a rerun of the same command resumes from the state folder.

Stable API (fine-tuning depends on it):
    DistEnv, init_distributed, teardown_distributed, all_gather_with_grad, broadcast_flag
    accumulation_steps, build_optimizer, linear_schedule, autocast
    save_state, load_state, StopFlag, RESUME_EXIT_CODE
    MetricsWriter, Progress, check_finite, NonFiniteLossError, oom_guard, plot_losses, seed_everything
    (added, used by pre-training) seed_torch, ignore_stop_signals, check_finite_grad_norm,
    NonFiniteGradientError, require_tensorboard, TensorBoardLog

Checkpoints are written WITHOUT pickle: tensors go to safetensors files, everything else to JSON,
inside a folder that is renamed into place (atomic); `latest.json` names the newest complete one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from . import artifacts

log = logging.getLogger(__name__)

# Exit status of a run that stopped on SIGTERM/SIGUSR1 after saving its state (EX_TEMPFAIL): a
# scheduler (Slurm requeue, `snakemake --retries`) reruns the same command, which resumes.
RESUME_EXIT_CODE = 75


# ---------------------------------------------------------------- distributed -------------------
@dataclasses.dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(timeout_minutes: int = 30) -> DistEnv:
    """Join the process group when launched by torchrun (RANK/WORLD_SIZE set), else run alone.

    nccl on CUDA, gloo on CPU; each process uses GPU `LOCAL_RANK`.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=_dt.timedelta(minutes=timeout_minutes),
        )
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


_EXIT_WITHOUT_FINALIZATION = False


def teardown_distributed() -> None:
    """Leave the process group together: called where every rank arrives (the end of training, or
    the step all ranks agreed to stop at)."""
    global _EXIT_WITHOUT_FINALIZATION
    if dist.is_available() and dist.is_initialized():
        gloo = dist.get_backend() == "gloo"
        dist.barrier()
        dist.destroy_process_group()
        # After a complete gloo run, the interpreter's final clean-up of torch's gloo/store threads
        # aborts now and then ("terminate called without an active exception", SIGABRT: 2 of 10
        # two-process CPU runs here), which would fail a job whose outputs are all written.
        # exit_process() then skips that clean-up.
        _EXIT_WITHOUT_FINALIZATION |= gloo


def exit_process(code: int) -> None:
    """End a trainer process with `code` (sys.exit, or os._exit after a gloo run; see above)."""
    if not _EXIT_WITHOUT_FINALIZATION:
        sys.exit(code)
    _kill_workers()  # os._exit skips the exit hook reap_workers_at_exit registered
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate `tensor` from every rank (dim 0, rank order); gradients flow back to each owner.

    torch.distributed.nn's all_gather sums the incoming gradients across ranks in backward, so the
    gradient of a loss that uses other ranks' rows reaches the rank that produced them (the common
    "replace my own slice" trick drops those cross terms). Sizes must match on every rank.
    Without a process group it returns the tensor unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(tensor), dim=0)


def broadcast_flag(flag: bool, env: DistEnv) -> bool:
    """True on every rank if `flag` is true on any rank (so all ranks stop at the same step)."""
    if not env.distributed:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


# ---------------------------------------------------------------- batch arithmetic --------------
def accumulation_steps(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Micro-batches each process accumulates so that one optimiser step sees `global_batch_size`.

    global = micro * world * accumulation must hold exactly; otherwise the fix is named.
    """
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size "
            f"{micro_batch_size} x world size {world_size}; choose a global batch divisible by "
            f"{per_step} or change micro_batch_size"
        )
    return global_batch_size // per_step


# ---------------------------------------------------------------- optimisation ------------------
def build_optimizer(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    device: torch.device | None = None,
) -> torch.optim.AdamW:
    """AdamW with no weight decay on biases and LayerNorm weights (1-d tensors); fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    fused = device is not None and device.type == "cuda"
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


def linear_schedule(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from 0 to the peak lr over `warmup_steps`, then linear decay to 0 at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast(device: torch.device, precision: str = "auto") -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA ("auto" or "bf16"), plain fp32 otherwise (CPU bf16 is slow and noisy)."""
    if device.type == "cuda" and precision in ("auto", "bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_torch(seed: int, *key: int) -> None:
    """Seed torch's generators (CPU and every GPU) from (seed, *key), e.g. (seed, step, micro-batch).

    Called before each micro-batch, it makes dropout a function of which micro-batch is computed,
    not of how many were computed before in this process: a resumed run and a run with another
    number of processes draw the same dropout masks (on the same kind of device).
    """
    words = np.random.SeedSequence([seed, *key]).generate_state(2, np.uint32)
    torch.manual_seed(((int(words[0]) << 32) | int(words[1])) & (2**63 - 1))


# ---------------------------------------------------------------- checkpoint state --------------
def _flatten(prefix: str, obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace every tensor inside a nested dict/list by a reference; collect the tensors."""
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"{prefix}"
        tensors[key] = torch.from_numpy(obj.copy())
        return {"__tensor__": key, "__numpy__": True}
    if isinstance(obj, dict):
        # JSON keys are strings: remember integer keys (optimizer state is keyed by param index).
        return {
            "__dict__": [
                [k, isinstance(k, int), _flatten(f"{prefix}.{k}", v, tensors)] for k, v in obj.items()
            ]
        }
    if isinstance(obj, (list, tuple)):
        return {
            "__seq__": [_flatten(f"{prefix}.{i}", v, tensors) for i, v in enumerate(obj)],
            "tuple": isinstance(obj, tuple),
        }
    if callable(obj):
        return None  # LambdaLR keeps its lambdas in state_dict as None-able entries; they are rebuilt
    return obj


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            tensor = tensors[obj["__tensor__"]]
            return tensor.numpy() if obj.get("__numpy__") else tensor
        if "__dict__" in obj:
            return {(int(k) if is_int else k): _unflatten(v, tensors) for k, is_int, v in obj["__dict__"]}
        if "__seq__" in obj:
            items = [_unflatten(v, tensors) for v in obj["__seq__"]]
            return tuple(items) if obj["tuple"] else items
    return obj


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


def save_state(
    state_dir: str | os.PathLike,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    data_position: dict[str, Any],
    extra: dict[str, Any] | None = None,
    keep: int = 1,
) -> Path:
    """Write a resumable checkpoint `state_dir/step-XXXXXXXX/` atomically; keep the newest `keep`.

    Call on the main rank only (after the step: all ranks hold the same weights). RNG states are
    those of the calling process; every rank's data randomness is derived from (seed, item id),
    so other ranks need none saved.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    tmp = state_dir / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model_sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    # Tied weights share storage; safetensors refuses shared tensors, so store clones.
    save_file({k: v.clone() for k, v in model_sd.items()}, tmp / "model.safetensors")
    tensors: dict[str, torch.Tensor] = {}
    meta = {
        "step": step,
        "data_position": data_position,
        "extra": extra or {},
        "optimizer": _flatten("optimizer", optimizer.state_dict(), tensors),
        "scheduler": _flatten("scheduler", scheduler.state_dict(), tensors),
        "rng": _flatten("rng", rng_state(), tensors),
        "saved": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    save_file(tensors, tmp / "state.safetensors")
    (tmp / "state.json").write_text(json.dumps(meta, indent=1))
    final = state_dir / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    artifacts.write_json(state_dir / "latest.json", {"checkpoint": name, "step": step})
    for old in sorted(state_dir.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("saved resumable state at step %d -> %s", step, final)
    return final


def load_state(
    state_dir: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> dict[str, Any] | None:
    """Restore the newest checkpoint in `state_dir` into model/optimizer/scheduler and the RNGs.

    Returns {"step", "data_position", "extra"} or None when there is nothing to resume.
    """
    latest = Path(state_dir) / "latest.json"
    if not latest.exists():
        return None
    folder = Path(state_dir) / artifacts.read_json(latest)["checkpoint"]
    model.load_state_dict(load_file(folder / "model.safetensors"))
    tensors = load_file(folder / "state.safetensors")
    meta = json.loads((folder / "state.json").read_text())
    optimizer.load_state_dict(_unflatten(meta["optimizer"], tensors))
    sched = _unflatten(meta["scheduler"], tensors)
    # The schedule function is rebuilt from config; LambdaLR stores None for plain functions.
    sched["lr_lambdas"] = [None] * len(sched.get("lr_lambdas") or [None])
    scheduler.load_state_dict(sched)
    set_rng_state(_unflatten(meta["rng"], tensors))
    log.info("resumed from %s (step %d)", folder, meta["step"])
    return {"step": meta["step"], "data_position": meta["data_position"], "extra": meta["extra"]}


class StopFlag:
    """SIGTERM / SIGUSR1 set `requested`; the loop saves its state at the next step and exits.

    Slurm sends SIGTERM (or the signal chosen with --signal, e.g. USR1) before a time-out or
    preemption; the handler only sets a flag because saving inside a signal handler is unsafe.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)):
        self.requested = False
        self.signal_name: str | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        log.warning("received %s: will save state after this step and exit %d", self.signal_name,
                    RESUME_EXIT_CODE)


def reap_workers_at_exit() -> None:
    """Kill DataLoader workers still alive at exit, before multiprocessing waits for them.

    Workers ignore SIGTERM (ignore_stop_signals), and multiprocessing's own exit hook stops daemonic
    children with SIGTERM and then joins them: on any exit that did not shut the loader down first
    (an exception, a forgotten iterator) that join would wait forever, holding a GPU job until its
    time limit. atexit runs the last registered hook first, so this one runs before multiprocessing's.
    """
    import atexit
    import multiprocessing.util  # noqa: F401  (registers its exit hook now, i.e. before ours)

    if getattr(reap_workers_at_exit, "_installed", False):
        return
    atexit.register(_kill_workers)
    reap_workers_at_exit._installed = True  # type: ignore[attr-defined]


def _kill_workers() -> None:
    """SIGKILL this process's daemonic children (DataLoader workers) and wait for them."""
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join(5)


def close_loader(iterator: Any) -> None:
    """Shut a DataLoader iterator's workers down now (they exit on the sentinel it sends)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def ignore_stop_signals(worker_id: int = 0) -> None:
    """DataLoader `worker_init_fn`: workers ignore SIGTERM and SIGUSR1; the main process saves.

    Slurm signals every process of a job step. PyTorch's workers exit on a SIGTERM sent by anyone
    but their parent (and on SIGUSR1 by default), after which the main process raises "DataLoader
    worker killed" instead of saving its state. Workers still end when the main process shuts the
    loader down, and their watchdog ends them if it dies.
    """
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


# ---------------------------------------------------------------- observability -----------------
class MetricsWriter:
    """Append one JSON object per logged step to a .jsonl file (main rank only).

    `history` (a file in the resume-state folder) mirrors every record: Snakemake deletes a job's
    declared outputs before it reruns, so after a preemption the output file is gone and the
    history restores the steps before the resume. On resume, lines beyond the resumed step are
    dropped first, so the file never holds two records for one step.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int = 0, enabled: bool = True,
                 history: str | os.PathLike | None = None):
        self.path = Path(path)
        self.history = Path(history) if history else None
        self.enabled = enabled
        if not enabled:
            return
        kept: list[str] = []
        if resume_step:
            source = next((p for p in (self.path, self.history) if p and p.exists()), None)
            if source is not None:
                kept = [
                    line for line in source.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step
                ]
        for target in (self.path, self.history):
            if target is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                with artifacts.atomic_path(target) as tmp:
                    tmp.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(record, sort_keys=True) + "\n"
        for target in (self.path, self.history):
            if target is not None:
                with target.open("a") as handle:
                    handle.write(line)


class Progress:
    """A tqdm bar over optimiser steps showing loss, tokens/s and the ETA (main rank only)."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, disable=not enabled, desc=desc,
                        dynamic_ncols=True, mininterval=2.0)
        self._last = time.perf_counter()

    def update(self, tokens: int, **postfix: float) -> float:
        """Advance one step; returns this step's tokens/s."""
        now = time.perf_counter()
        rate = tokens / max(now - self._last, 1e-9)
        self._last = now
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()} | {"tok/s": f"{rate:,.0f}"},
                             refresh=False)
        self.bar.update(1)
        return rate

    def close(self) -> None:
        self.bar.close()


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN/inf; the message names the step and the items of the batch."""


def check_finite(losses: dict[str, torch.Tensor], *, step: int, item_ids: Any) -> None:
    for name, value in losses.items():
        if not torch.isfinite(value.detach()).all():
            ids = item_ids.tolist() if hasattr(item_ids, "tolist") else list(item_ids)
            raise NonFiniteLossError(
                f"loss term '{name}' is {value.item()} at step {step} for batch items {ids}; "
                "lower the learning rate, check those inputs, or use precision fp32"
            )


class NonFiniteGradientError(NonFiniteLossError):
    """The losses were finite but the gradient norm is NaN/inf (raised before the optimiser step)."""


def check_finite_grad_norm(norm: torch.Tensor | float, *, step: int, item_ids: Any) -> None:
    """Raise NonFiniteGradientError naming the step and items if `norm` (clip_grad_norm_'s result)
    is NaN/inf: clipping would scale every gradient by NaN and the step would destroy the weights."""
    value = float(norm)
    if not math.isfinite(value):
        ids = item_ids.tolist() if hasattr(item_ids, "tolist") else list(item_ids)
        raise NonFiniteGradientError(
            f"gradient norm is {value} at step {step} for batch items {ids} (the losses were "
            "finite); lower the learning rate, check those inputs, or use precision fp32"
        )


@contextlib.contextmanager
def oom_guard(micro_batch_size: int, hint: str = "micro_batch_size") -> Iterator[None]:
    """Turn an out-of-memory error into a message naming the config change that fixes it."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        raise RuntimeError(
            f"out of memory with {hint}={micro_batch_size}: lower '{hint}' (the global batch stays "
            "the same: gradient accumulation grows to compensate), or shorten max_len"
        ) from error


def plot_losses(metrics_path: str | os.PathLike, png_path: str | os.PathLike,
                title: str = "training loss") -> None:
    """Plot every `loss*` key of a metrics .jsonl against step; an empty file gives a labelled blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(metrics_path)
    records = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = sorted({k for r in records for k in r if k.startswith("loss")})
    for key in keys:
        points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
        if points:
            ax.plot(*zip(*points), label=key, linewidth=1)
    if not records:
        ax.text(0.5, 0.5, "no training steps", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    if keys:
        ax.legend(fontsize=8)
        if all(r[k] > 0 for r in records for k in keys if k in r and r[k] is not None):
            ax.set_yscale("log")
    fig.tight_layout()
    with artifacts.atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def require_tensorboard() -> None:
    """Fail at start (not after hours of training) when TensorBoard logging is on but not installed."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            "trainer.tensorboard is on but the `tensorboard` package is not installed: "
            "`pip install tensorboard` in this environment, or set trainer.tensorboard: false"
        ) from error


class TensorBoardLog:
    """The MetricsWriter records as TensorBoard scalars (one tag per numeric key, x = "step").

    `purge_step` (the first step after a resume) hides events a stopped run wrote past its saved
    state, so a resumed curve has one value per step, as metrics.jsonl does.
    """

    def __init__(self, log_dir: str | os.PathLike, purge_step: int | None = None):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


def memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except Exception:  # pragma: no cover - non-POSIX
        return math.nan


def run_or_resume_exit(stop: StopFlag, env: DistEnv, save: Callable[[], None]) -> bool:
    """If any rank got a stop signal: save (main rank), sync, return True (caller exits)."""
    if not broadcast_flag(stop.requested, env):
        return False
    if env.is_main:
        save()
    if env.distributed:
        dist.barrier()
    return True
