"""The process group: who this process is, joining and leaving together, cross-rank tensors.

Launched by torchrun (RANK/WORLD_SIZE set), a trainer joins a group (nccl on CUDA, gloo on CPU);
launched plainly, it runs alone and every helper here is a no-op.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os

import torch
import torch.distributed as dist

from ..gpu_check import refuse_unusable_gpus


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
        refuse_unusable_gpus()  # a Slurm job granted GPUs must not train on the CPU
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        # device_id binds the group to this process's GPU: NCCL's barriers and collectives then
        # use it without guessing (a bare barrier otherwise warns that it guesses the device).
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=_dt.timedelta(minutes=timeout_minutes),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


_LEFT_A_GLOO_GROUP = False


def teardown_distributed() -> None:
    """Leave the process group together: called where every rank arrives (the end of training, or
    the step all ranks agreed to stop at)."""
    global _LEFT_A_GLOO_GROUP
    if dist.is_available() and dist.is_initialized():
        gloo = dist.get_backend() == "gloo"
        dist.barrier()
        dist.destroy_process_group()
        # After a complete gloo run, the interpreter's final clean-up of torch's gloo/store threads
        # aborts now and then ("terminate called without an active exception", SIGABRT: 2 of 10
        # two-process CPU runs here), which would fail a job whose outputs are all written.
        # lifecycle.exit_process() then skips that clean-up.
        _LEFT_A_GLOO_GROUP |= gloo


def left_a_gloo_group() -> bool:
    """Whether this process tore down a gloo group (its exit must skip the interpreter clean-up)."""
    return _LEFT_A_GLOO_GROUP


def barrier(env: DistEnv) -> None:
    """Wait for every rank (nothing to wait for when running alone)."""
    if env.distributed:
        dist.barrier()


def from_main(value, env: DistEnv):
    """The main rank's `value` on every rank (picklable; the others pass anything, e.g. None)."""
    if not env.distributed:
        return value
    box = [value if env.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_same_start(step: int, env: DistEnv) -> None:
    """Raise on every rank unless all resumed at the same step (one all-reduce of [step, -step]
    with MAX): ranks that read different states (a state folder not shared between nodes) would
    otherwise train on mismatched batches or wait for each other forever."""
    if not env.distributed:
        return
    bounds = torch.tensor([step, -step], dtype=torch.int64, device=env.device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    highest, lowest = int(bounds[0]), -int(bounds[1])
    if highest != lowest:
        raise RuntimeError(
            f"the processes resumed at different steps ({lowest} to {highest}; this one at "
            f"{step}): every node must see the same state folder (a shared filesystem)")


def data_parallel(model: torch.nn.Module, env: DistEnv) -> torch.nn.Module:
    """DDP around `model` when several processes train (else the model itself), on a GPU too
    without device_ids: given them, DDP copies each micro-batch's inputs to the GPU itself, and a
    copy from host memory without non_blocking makes the host wait for all the GPU's queued work
    (every micro-batch: the loop could not queue the next one ahead). Without them the inputs
    reach the model as the loop moved them (pre-training: on the device, non_blocking; fine-
    tuning: as pinned host tensors, which encode_batch copies asynchronously)."""
    return torch.nn.parallel.DistributedDataParallel(model) if env.distributed else model


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


@dataclasses.dataclass(frozen=True)
class StepRead:
    """What a training step's one host read returns (host_read)."""

    terms: list[list[float]]  # this process's output values, one list per micro-batch
    grad_norm: float | None  # the gradient's norm before clipping (the same on every process:
    # DDP averaged the gradients); None for a step that did not clip
    means: list[float]  # each value averaged over micro-batches and processes
    tokens: float  # tokens of the step over all processes
    stop: bool  # a stop signal reached some process: all stop at this step


class QueuedRead:
    """A step's values on their way to the host (queue_read); `take()` returns them as a StepRead.

    On CUDA the copy goes into pinned memory behind the step's kernels, and an event marks its
    end: `take` waits for that event alone, so it can come after the next step is queued without
    waiting for the next step's kernels (a `.tolist()` then would queue its copy behind them, and
    the GPU would idle while the host caught up). Elsewhere the values are already computed."""

    def __init__(self, values: torch.Tensor, micro: int, width: int, has_norm: bool):
        self._shape = (micro, width, int(has_norm))
        self._copied = None
        if values.device.type == "cuda":
            self._values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._values.copy_(values, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        else:
            self._values = values

    def take(self) -> StepRead:
        """The values, once the step's kernels (only they) are done: the step's one wait."""
        if self._copied is not None:
            self._copied.synchronize()
        values = self._values.tolist()
        micro, width, has_norm = self._shape
        flat, rest = values[:micro * width], values[micro * width:]
        return StepRead(terms=[flat[i * width:(i + 1) * width] for i in range(micro)],
                        grad_norm=rest[0] if has_norm else None, means=rest[has_norm:-2],
                        tokens=rest[-2], stop=rest[-1] > 0)


def queue_read(terms: torch.Tensor, grad_norm: torch.Tensor | None, *, tokens: int, stop: bool,
               env: DistEnv) -> QueuedRead:
    """The step's values, reduced over processes, queued for one device-to-host copy.

    `terms` [micro-batches, values] on the device. The token count and the stop flag are known on
    the host; they travel in the same all-reduce as the means (written on the device by fill
    kernels, not copied from pageable host memory, which would wait for the device as a read
    does), so a step costs one reduction and one read however many values it logs."""
    extra = torch.stack([terms.new_full((), float(tokens)), terms.new_full((), float(stop))])
    reduced = torch.cat([terms.mean(0), extra])
    if env.distributed:
        dist.all_reduce(reduced)
        reduced = torch.cat([reduced[:-2] / env.world_size, reduced[-2:]])
    norm = [] if grad_norm is None else [grad_norm.detach().float().reshape(1)]
    micro, width = terms.shape
    return QueuedRead(torch.cat([terms.flatten(), *norm, reduced]), micro, width, bool(norm))


def host_read(terms: torch.Tensor, grad_norm: torch.Tensor | None, *, tokens: int, stop: bool,
              env: DistEnv) -> StepRead:
    """queue_read's values, taken at once: a read at the step's end, with nothing queued after."""
    return queue_read(terms, grad_norm, tokens=tokens, stop=stop, env=env).take()
