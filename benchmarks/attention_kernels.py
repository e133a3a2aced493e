"""bert-base's attention, forward + backward, through each kernel that could run it in training.

The trainer's padded path passes a padding mask, and a mask rules flash attention out: torch
then runs cuDNN's attention on sm90/sm100 cards with a recent cuDNN (its CUDA dispatch puts cuDNN
first there, as it did on an H200 with torch 2.11, 2026-11-28) and the memory-efficient kernel
elsewhere (cuDNN after the math fallback in the order torch reports). `trainer.unpad` instead
runs flash attention's variable-length kernel over the real tokens alone
(bert.varlen_attention). This times each at one GPU's micro-batch, with attention dropout
on (as in training), and checks each against float64 attention with dropout off (the error of
the output and of the query gradient at the real tokens):

    python benchmarks/attention_kernels.py --device cuda          # bf16 (gpu_checks.sh `attn`)
    python benchmarks/attention_kernels.py --batch 4 --length 64  # CPU, fp32: what runs there

Rows: padded (memory-efficient) and padded (cuDNN): the mask [batch, 1, 1, length] over the
padded batch; no mask (flash): the same tensors with no mask, the bound a batch without padding
would get; real tokens (flash varlen): bert.varlen_attention over the real tokens only. A kernel
that cannot run these inputs prints why. Lengths: a share of the rows full, the rest uniform
from 64 up, the share set so that the mean is --mean-length (the trainer's 512-token SciFact
chunks average 445).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from retrieval_pretraining.bert import varlen_attention  # noqa: E402

SHORTEST = 64


def lengths_with_mean(batch: int, length: int, mean: float,
                      generator: torch.Generator) -> torch.Tensor:
    """Row lengths: full for a share of the rows, uniform in [SHORTEST, length) for the rest (from
    a quarter of the length for shapes under 256), the share chosen so that the expected length is
    `mean`."""
    low = min(SHORTEST, max(1, length // 4))
    partial = (low + length - 1) / 2
    share = min(1.0, max(0.0, (mean - partial) / (length - partial)))
    full = torch.rand(batch, generator=generator) < share
    drawn = torch.randint(low, length, (batch,), generator=generator)
    return torch.where(full, length, drawn)


def padded(backend: SDPBackend | None, masked: bool):
    """Attention over the padded batch: q, k, v [batch, heads, length, dim], `backend` alone."""
    def run(q, k, v, mask, offsets, dropout_p):
        with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if masked else None,
                                                  dropout_p=dropout_p)
    return run


def real_tokens(q, k, v, mask, offsets, dropout_p):
    """bert.varlen_attention over the real tokens only: q, k, v [tokens, heads, dim], the layout
    the unpadded layers' projections already give it (main gathers them before the timing and
    scatters the output back after, for the error check). Gathering them here, with a boolean
    index, timed four host waits and three copies beside the kernel: 2.5 ms against the padded
    kernels' 0.7-0.8 on an H200 (2026-11-28), where the unpadded step was 5% slower in all."""
    return varlen_attention(q, k, v, offsets, mask.shape[-1], dropout_p)


VARIANTS = {
    "padded, memory-efficient (mask)": padded(SDPBackend.EFFICIENT_ATTENTION, masked=True),
    "padded, cuDNN (mask)": padded(SDPBackend.CUDNN_ATTENTION, masked=True),
    "padded, torch's choice (mask)": padded(None, masked=True),
    "no mask, flash": padded(SDPBackend.FLASH_ATTENTION, masked=False),
    "real tokens, flash varlen": real_tokens,
}
UNPADDED = {"real tokens, flash varlen"}  # run on the real tokens' rows: Rows.gather, Rows.scatter


class Rows:
    """[batch, heads, length, dim] <-> the real tokens' rows [tokens, heads, dim]."""

    def __init__(self, real: torch.Tensor):
        self.positions = real.reshape(-1).nonzero().squeeze(1)
        self.batch, self.length = real.shape

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        heads, dim = t.shape[1], t.shape[3]
        return t.transpose(1, 2).reshape(-1, heads, dim).index_select(0, self.positions)

    def scatter(self, t: torch.Tensor) -> torch.Tensor:
        full = t.new_zeros(self.batch * self.length, *t.shape[1:]).index_copy(0, self.positions, t)
        return full.view(self.batch, self.length, *t.shape[1:]).transpose(1, 2)


def measure(run, inputs, grad, repeats, dropout_p):
    """Median seconds of forward + backward with dropout, and the output and dq without it."""
    q, k, v, mask, offsets = inputs
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
        if q.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run(q_, k_, v_, mask, offsets, dropout_p)
        out.backward(grad)
        if q.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = run(q_, k_, v_, mask, offsets, 0.0)
    out.backward(grad)
    return statistics.median(times[1:] or times), out.detach(), q_.grad


def relative_error(value: torch.Tensor, reference: torch.Tensor, real: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| over the real tokens' query rows."""
    rows = real[:, None, :, None]  # [batch, 1, length, 1]
    diff = ((value.double() - reference) * rows).norm()
    return float(diff / (reference * rows).norm())


def arguments() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="one GPU's micro-batch")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--mean-length", type=float, default=445.0)
    parser.add_argument("--dropout", type=float, default=0.1, help="BERT's attention dropout")
    parser.add_argument("--repeats", type=int, default=10)
    return parser


def main() -> None:
    args = arguments().parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator().manual_seed(0)
    lengths = lengths_with_mean(args.batch, args.length, args.mean_length, generator)
    real = (torch.arange(args.length)[None, :] < lengths[:, None]).to(device)
    shape = (args.batch, args.heads, args.length, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=generator).to(device, dtype) for _ in range(4))
    grad = grad * real[:, None, :, None]  # the loss reads the real tokens only
    mask = real[:, None, None, :]
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(device, torch.int32)
    inputs = (q, k, v, mask, offsets)
    rows = Rows(real)

    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        reference = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask)
    reference.backward(grad.double())
    reference, reference_dq = reference.detach(), q64.grad

    # 4 FLOP a (query, key) pair and head dimension, x3 for forward + backward, the real pairs only
    flops = 4 * float((lengths ** 2).sum()) * args.heads * args.head_dim * 3
    mean = float(lengths.float().mean())
    print(f"{args.batch} rows of <= {args.length} tokens (mean {mean:.0f}, "
          f"{int((lengths == args.length).sum())} full), {args.heads} heads x {args.head_dim}, "
          f"{str(dtype).removeprefix('torch.')}, dropout {args.dropout}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""))
    print("| kernel | ms (fwd + bwd) | TFLOP/s of the real pairs | error: output | error: dq |\n"
          "|---|---:|---:|---:|---:|")
    for name, run in VARIANTS.items():
        with warnings.catch_warnings(record=True) as caught:  # torch says why a kernel is refused
            warnings.simplefilter("always")
            try:
                if name in UNPADDED:
                    seconds, out, dq = measure(run, (*map(rows.gather, (q, k, v)), mask, offsets),
                                               rows.gather(grad), args.repeats, args.dropout)
                    out, dq = rows.scatter(out), rows.scatter(dq)
                else:
                    seconds, out, dq = measure(run, inputs, grad, args.repeats, args.dropout)
            except RuntimeError as error:
                reasons = (str(w.message).split(" (Triggered")[0] for w in caught)
                why = "; ".join(dict.fromkeys(reasons))
                print(f"| {name} | unavailable: {why or str(error).splitlines()[0]} | | | |",
                      flush=True)
                continue
        exact = name != "no mask, flash"  # it attends over the padding too: timing only
        errors = (f"{relative_error(out, reference, real):.1e} | "
                  f"{relative_error(dq, reference_dq, real):.1e}") if exact else "- | -"
        print(f"| {name} | {seconds * 1e3:.3g} | {flops / seconds / 1e12:.3g} | {errors} |",
              flush=True)


if __name__ == "__main__":
    main()
