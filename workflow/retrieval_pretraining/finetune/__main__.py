"""Fine-tune one encoder on one dataset's training queries (one stage).

    python -m retrieval_pretraining.finetune --config '<finetune slice JSON>' --init ENCODER \
        --queries queries-train.parquet --qrels qrels-train.parquet --corpus corpus.parquet \
        --negatives negatives.parquet [...] --seed S --out .../encoder --state STATE \
        --metrics .../metrics.jsonl [--heads results/pretrain/M/heads.safetensors] \
        [--sample-among bm25-negatives.parquet]
Multi-GPU: launch the same command under `torchrun` (retrieval_pretraining.launch does).
Exit status 75 = stopped by SIGTERM/SIGUSR1 after saving state; rerun to resume.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import stage_parser
from ..errors import command
from .settings import FinetuneSettings


@command
def main(argv: list[str] | None = None) -> int:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--init", type=Path, required=True, help="encoder folder to start from")
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--qrels", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--negatives", type=Path, nargs="+", required=True,
                        help="negatives Parquet file(s); several are unioned in order")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="encoder folder to write")
    parser.add_argument("--state", type=Path, required=True, help="resume state (outside outputs)")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics .jsonl")
    parser.add_argument("--heads", type=Path, default=None,
                        help="pre-training heads.safetensors: the COSTA projector (finetune.projector)")
    parser.add_argument("--sample-among", type=Path, nargs="+", default=None,
                        help="negatives file(s) of the chain's stage 1: a low-resource sample "
                             "(train_queries) is drawn among the queries with a negative in them")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = FinetuneSettings.from_config(args.config)  # a bad slice fails before torch loads
    from .train import train

    return train(settings, init=args.init, queries=args.queries, qrels=args.qrels,
                 corpus=args.corpus, negatives=args.negatives, seed=args.seed, out=args.out,
                 state_dir=args.state, metrics_path=args.metrics, heads=args.heads,
                 sample_among=args.sample_among)


if __name__ == "__main__":
    from .. import training

    training.exit_process(main())
