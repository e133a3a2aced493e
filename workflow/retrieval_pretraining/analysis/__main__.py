"""Analyses where a picture says more than a table.

    python -m retrieval_pretraining.analysis loss-curves --model NAME=metrics.jsonl ... --out PNG
    python -m retrieval_pretraining.analysis tsne --config '<JSON>' --model NAME=ENCODER,RUN ...
        --dataset-dir results/datasets/D --seed S --out PNG --json J
    python -m retrieval_pretraining.analysis coverage --config '<JSON>' --model NAME=ENCODER ...
        --chunks SHARD ... --out PNG --json J
    python -m retrieval_pretraining.analysis cpdae-words --config '<JSON>' --model cpdae=ENCODER
        --out MD --html HTML
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import ConfigError, object_schema, refuse_unknown, section_schema, stage_parser
from ..errors import command
from ..retrieval_settings import retrieval_keys
from .coverage import coverage
from .cpdae_words import cpdae_top_words
from .loss_curves import loss_curves
from .tsne import tsne


# Each command's `report.analysis` block (loss-curves has none).
BLOCKS = {"tsne": "tsne", "coverage": "coverage", "cpdae-words": "cpdae_top_words"}


def check_config(command: str, cfg: dict) -> None:
    """Refuse a key the command's block does not have (t-SNE also gets the retrieval knobs its
    runs were encoded with and the split's relevance level, rules/analysis.smk tsne_config), and
    a block without its required keys."""
    blocks = section_schema("report")["properties"]["analysis"]["properties"]
    block = object_schema(blocks[BLOCKS[command]]) if command in BLOCKS else {"properties": {}}
    known = set(block["properties"])
    if command == "tsne":
        known |= retrieval_keys() | {"relevance_level"}
    refuse_unknown(cfg, known, f"analysis {command}")
    missing = [key for key in block.get("required", []) if key not in cfg]
    if missing:
        raise ConfigError(f"analysis {command}: the config lacks {', '.join(missing)}; pass the "
                          f"report.analysis.{BLOCKS[command]} block")


def _pairs(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=PATH, got {v!r}")
        out[name] = rest
    return out


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.prog = "python -m retrieval_pretraining.analysis"  # not "__main__.py"
    parser.add_argument("command", choices=["loss-curves", "tsne", "coverage", "cpdae-words"])
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="NAME=PATH (metrics.jsonl, encoder folder, or ENCODER,RUN for tsne); repeat",
    )
    parser.add_argument("--chunks", type=Path, nargs="+",
                        help="coverage: the corpus's chunks shards, from which the chunks every "
                        "model held out of pre-training are sampled")
    parser.add_argument("--dataset-dir", type=Path, help="tsne: results/datasets/<dataset>")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True, help="PNG (or Markdown for cpdae-words)")
    parser.add_argument("--json", type=Path, help="numbers behind the figure")
    parser.add_argument(
        "--html", type=Path, help="cpdae-words: the same as HTML (Snakemake report)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    check_config(args.command, args.config)
    import torch

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    cfg, models = args.config, _pairs(args.model)
    if args.command == "loss-curves":
        loss_curves({k: Path(v) for k, v in models.items()}, args.out, args.json)
    elif args.command == "coverage":
        coverage(
            {k: Path(v) for k, v in models.items()},
            args.chunks,
            cfg["ks"],
            cfg["samples"],
            args.out,
            args.json,
        )
    elif args.command == "cpdae-words":
        (path,) = models.values()
        cpdae_top_words(Path(path), cfg["texts"], cfg["top"], args.out, args.html)
    else:
        pairs = {k: tuple(Path(p) for p in v.split(",")) for k, v in models.items()}
        tsne(pairs, args.dataset_dir, cfg["split"], cfg, args.seed, args.out, args.json)


if __name__ == "__main__":
    main()
