"""Trainer core shared by pre-training and fine-tuning: the parts every training loop needs.

Both trainers (pretrain/train.py, finetune/train.py) are one loop of this shape, as nanoGPT's is:

    env = init_distributed(); seed_everything(seed)         # ranks, device; model init seeded
    ... data and model (the trainer's own) ...
    optimizer = build_optimizer(...); scheduler = lr_scheduler(...)
    claim_state(state, job, env)          # a state of other settings or inputs: moved aside
    resumed = load_state(state, ...)      # the same job resumes where it saved
    metrics = MetricsWriter(..., history=state / "metrics.jsonl"); stop = StopFlag()
    for each step: micro-batches under autocast(), backward, their values kept on the device;
        clip; step_if_finite(optimizer, values, norm); scheduler.step();
        read = host_read(values, norm, ...)   # the step's one device-to-host read (or
            # queue_read(...) now and .take() after the next step is queued: pretrain/train.py)
        check_finite_step(read, ...); metrics.write(...); save_state(...) every N steps;
        if run_or_resume_exit(read.stop, env, save): teardown_distributed(); return RESUME_EXIT_CODE
    export the encoder, plot_losses(), delete the state; teardown_distributed(); return 0
and the `python -m` entry ends with exit_process(main()).

Modules (the trainers import only this package, `training.X`):
    distributed  DistEnv, init_distributed, teardown_distributed, barrier, all_gather_with_grad,
                 data_parallel (DDP without device_ids, or the model alone),
                 check_same_start (every rank resumed at one step), from_main (rank 0's value),
                 host_read (a step's one reduction and read: means, tokens, stop flag), StepRead,
                 queue_read / QueuedRead (the same read, taken later)
    optim        accumulation_steps, build_optimizer, lr_factor / lr_scheduler (the lr schedule
                 of both trainers: warm-up, linear or cosine decay to a floor), autocast,
                 fp32_scores, upcast, seed_everything, seed_torch
    state        save_state, load_state (pickle-free), claim_state (which job a state belongs to)
    guards       check_finite_step, check_finite_grad_norm, step_if_finite,
                 NonFiniteLossError, NonFiniteGradientError, oom_guard,
                 loading_out_of_memory_fix, data_parallel_out_of_memory_fix (oom_guard's
                 advice before any micro-batch, both trainers')
    observe      MetricsWriter, Progress, plot_losses, require_tensorboard, TensorBoardLog,
                 memory_mb
    lifecycle    StopFlag, RESUME_EXIT_CODE, run_or_resume_exit, ignore_stop_signals,
                 reap_workers_at_exit, close_loader, exit_process
"""

from .distributed import (
    DistEnv,
    QueuedRead,
    StepRead,
    all_gather_with_grad,
    barrier,
    check_same_start,
    data_parallel,
    from_main,
    host_read,
    init_distributed,
    queue_read,
    teardown_distributed,
)
from .guards import (
    NonFiniteGradientError,
    NonFiniteLossError,
    check_finite_grad_norm,
    check_finite_step,
    data_parallel_out_of_memory_fix,
    loading_out_of_memory_fix,
    oom_guard,
    step_if_finite,
)
from .lifecycle import (
    RESUME_EXIT_CODE,
    StopFlag,
    close_loader,
    exit_process,
    ignore_stop_signals,
    reap_workers_at_exit,
    run_or_resume_exit,
)
from .observe import (
    MetricsWriter,
    Progress,
    TensorBoardLog,
    memory_mb,
    plot_losses,
    require_tensorboard,
)
from .optim import (
    LR_SCHEDULES,
    accumulation_steps,
    autocast,
    build_optimizer,
    fp32_scores,
    lr_factor,
    lr_scheduler,
    seed_everything,
    seed_torch,
    upcast,
)
from .state import claim_state, load_state, save_state

__all__ = [
    "DistEnv", "init_distributed", "teardown_distributed", "barrier", "all_gather_with_grad",
    "check_same_start", "data_parallel",
    "StepRead", "host_read", "QueuedRead", "queue_read",
    "accumulation_steps", "build_optimizer", "LR_SCHEDULES", "lr_factor",
    "lr_scheduler", "autocast", "fp32_scores",
    "seed_everything", "seed_torch", "upcast",
    "save_state", "load_state", "claim_state",
    "check_finite_grad_norm", "check_finite_step", "step_if_finite",
    "NonFiniteLossError", "NonFiniteGradientError",
    "oom_guard", "loading_out_of_memory_fix", "data_parallel_out_of_memory_fix",
    "MetricsWriter", "Progress", "plot_losses", "require_tensorboard", "TensorBoardLog",
    "memory_mb",
    "StopFlag", "RESUME_EXIT_CODE", "run_or_resume_exit", "ignore_stop_signals",
    "reap_workers_at_exit", "close_loader", "exit_process",
]  # fmt: skip
