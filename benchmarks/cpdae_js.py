"""CPDAE's JS term (objectives.pairwise_js) forward + backward, against the same formula through
autograd, at the shapes a CPDAE step gives it.

    python benchmarks/cpdae_js.py                    # CPU, 2 threads
    python benchmarks/cpdae_js.py --device cuda      # also the peak memory of each

Shapes (views A against a pool of B, V = 30,522 words): 64 x 64 is one GPU's micro-batch of 32
texts without gathering; 16 x 128 is paper.yaml's (8 texts a GPU, the views of 8 GPUs gathered).
The autograd variant is the formula written out (add, /2, clamp, log, *, sum), its [r, B, V] blocks
recomputed in backward by activation checkpointing above 2^25 values, as pairwise_js computed it
before its hand-written backward. Each fp32 variant's largest error against the autograd variant
in float64 is printed for the values and the gradients (tests/test_pretrain_objectives.py holds
pairwise_js to the formula in float64). In fp32 both lose digits the same way: JS ~0.01-0.5 is a
difference of sums near -10, and its gradient one of terms near B x 5.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from retrieval_pretraining.pretrain import objectives as obj  # noqa: E402


def through_autograd(q: torch.Tensor, k: torch.Tensor, block: int = 16,
                     checkpoint_above: int = 2**25) -> torch.Tensor:
    def mix_block(rows: torch.Tensor) -> torch.Tensor:
        return obj._plogp((rows.unsqueeze(1) + k.unsqueeze(0)) / 2)

    if q.shape[0] * k.shape[0] * q.shape[1] <= checkpoint_above:
        mix = mix_block(q)
    else:
        mix = torch.cat([torch.utils.checkpoint.checkpoint(mix_block, q[i:i + block], use_reentrant=False)
                         for i in range(0, q.shape[0], block)])
    return (obj._plogp(q).unsqueeze(1) + obj._plogp(k).unsqueeze(0)) / 2 - mix


def timed(fn, q: torch.Tensor, k: torch.Tensor, repeats: int) -> tuple[float, str, torch.Tensor, tuple]:
    """Median seconds of forward + backward, peak MB on CUDA ("-" elsewhere), the value, the grads."""
    times, peak = [], "-"
    for _ in range(repeats + 1):  # the first is warm-up (repeats 0: one untimed run)
        q_, k_ = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        if q.is_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        value = fn(q_, k_)
        value.sum().backward()
        if q.is_cuda:
            torch.cuda.synchronize()
            peak = f"{(torch.cuda.max_memory_allocated() - base) / 2**20:.0f}"
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:] or times), peak, value.detach(), (q_.grad, k_.grad)


def arguments() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--shapes", nargs="*", default=["64x64", "16x128"])
    return parser


def main() -> None:
    args = arguments().parse_args()
    torch.set_num_threads(args.threads)
    print("| views x pool | autograd: s (fwd + bwd) | pairwise_js: s | speed-up | peak MB, autograd "
          "| peak MB, pairwise_js | error: value, grad (autograd) | error: value, grad (pairwise_js) |"
          "\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in args.shapes:
        a, b = map(int, shape.split("x"))
        g = torch.Generator(device=args.device).manual_seed(0)
        q = torch.rand(a, args.vocab, generator=g, device=args.device).softmax(1)
        k = torch.rand(b, args.vocab, generator=g, device=args.device).softmax(1)
        *_, true_value, true_grads = timed(through_autograd, q.double(), k.double(), 0)

        def errors(value: torch.Tensor, grads: tuple) -> str:
            grad_error = max((got.double() - want).abs().max().item() for got, want in zip(grads, true_grads))
            return f"{(value.double() - true_value).abs().max().item():.1e}, {grad_error:.1e}"

        old, old_peak, old_value, old_grads = timed(through_autograd, q, k, args.repeats)
        new, new_peak, new_value, new_grads = timed(obj.pairwise_js, q, k, args.repeats)
        print(f"| {a} x {b} | {old:.4f} | {new:.4f} | {old / new:.1f}x | {old_peak} | {new_peak} "
              f"| {errors(old_value, old_grads)} | {errors(new_value, new_grads)} |", flush=True)


if __name__ == "__main__":
    main()
