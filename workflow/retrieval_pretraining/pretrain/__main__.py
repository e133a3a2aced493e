"""Pre-train one encoder (or export the base checkpoint for objective `none`).

    python -m retrieval_pretraining.pretrain --config '<resolved model settings JSON>' \
        --checkpoint results/checkpoints/X --chunks shard-0000.parquet ... [--spans ...] \
        [--chunks <a second corpus's shards> [--spans ...]] [--init-heads heads.safetensors] \
        --encoder results/pretrain/M/encoder --metrics .../metrics.jsonl --plot .../loss.png \
        --state results/state/pretrain/M [--store results/state/pretrain-data] \
        [--retrieval '{"pooling": "mean", ...}'] [--trainer-options '{"num_workers": 2, ...}']
Multi-GPU / multi-node: launch the same command under `torchrun`.
Exit status 75 = stopped by SIGTERM/SIGUSR1 after saving state; rerun to resume.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..config import refuse_unknown, stage_parser
from ..errors import command
from ..retrieval_settings import RetrievalSettings
from .settings import ENCODER_USE, TRAINER_RUNTIME, check_resolved, merge_runtime


@command
def main(argv: list[str] | None = None) -> int:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="base checkpoint HF folder")
    parser.add_argument("--chunks", type=Path, nargs="*", action="append", default=[],
                        help="chunk shards, in shard order; once per corpus of a mixture, in the "
                             "order of the settings' corpora")
    parser.add_argument("--spans", type=Path, nargs="*", action="append", default=[],
                        help="span shards (costa), as --chunks")
    parser.add_argument("--init-heads", type=Path,
                        help="heads.safetensors of the model this one continues from (init)")
    parser.add_argument("--encoder", type=Path, required=True, help="output encoder folder")
    parser.add_argument("--metrics", type=Path, required=True, help="output metrics .jsonl")
    parser.add_argument("--plot", type=Path, required=True, help="output loss curve .png")
    parser.add_argument("--state", type=Path, help="resume state folder (outside declared outputs)")
    parser.add_argument("--store", type=Path,
                        help="data store folder shared by the models (pretrain/store.py; "
                             "default: <state>/data)")
    parser.add_argument("--retrieval", type=json.loads, default=None,
                        help="how the encoder is to be used, as JSON (pooling, similarity, q_len, "
                             "p_len): written into its sentence-transformers files and card "
                             "(default: [CLS] + dot product; a sentence-transformers base exported "
                             "by `none` keeps its own; st_export.pretrained_use)")
    parser.add_argument("--trainer-options", type=json.loads, default={},
                        help="trainer keys that change neither the weights nor the metrics "
                             f"({', '.join(TRAINER_RUNTIME)}), as JSON: merged into the "
                             "settings' trainer block (kept out of the rule's params)")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    settings = merge_runtime(args.config, args.trainer_options)
    check_resolved(settings)
    retrieval = None
    if args.retrieval is not None:
        refuse_unknown(args.retrieval, ENCODER_USE, "pretrain --retrieval")
        retrieval = RetrievalSettings(**args.retrieval)
    from .train import export_base, train  # after logging: importing torch takes a while

    if settings["objective"] == "none":
        export_base(settings, args.checkpoint, args.encoder, args.metrics, args.plot, retrieval)
        return 0
    chunks = [group for group in args.chunks if group]
    if not chunks:
        parser.error("--chunks is required for a training objective")
    if args.state is None:
        parser.error("--state is required for a training objective")
    spans = [group for group in args.spans if group] or None
    return train(settings, chunks=chunks if len(chunks) > 1 else chunks[0],
                 spans=spans if spans is None or len(spans) > 1 else spans[0],
                 checkpoint=args.checkpoint, encoder_out=args.encoder, metrics_out=args.metrics,
                 plot_out=args.plot, state_dir=args.state, store_dir=args.store,
                 init_heads=args.init_heads, retrieval=retrieval)


if __name__ == "__main__":
    from .. import training

    training.exit_process(main())
