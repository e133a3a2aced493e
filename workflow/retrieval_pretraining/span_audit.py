"""The span index's own audit (rule audit_spans): lengths.png, the sampled span lengths per
granularity against the scaled Beta density they are drawn from, and sample.md, the first chunks
decoded with their spans. `python -m retrieval_pretraining.span_audit` runs it; spans.py does not
import it, so that editing the audit reruns this rule alone, not every sample_spans job and the
pre-trainings that read their shards.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.stats import beta as beta_law

from . import artifacts
from .config import stage_parser
from .contracts.columns import flat
from .contracts.spans import GRANULARITIES
from .errors import command, reading
from .spans import SpanConfig
from .wordpiece import load_tokenizer


def _head(path: str | os.PathLike, rows: int, what: str,
          columns: Sequence[str] | None = None) -> pa.Table:
    """The first `rows` rows of a Parquet file, read a row group at a time and no further: a
    chunks shard is ~0.7 GB at paper scale, and the audit shows a few of its rows. (pre_buffer,
    the default, would read every row group's bytes before the first batch.)"""
    batches: list[pa.RecordBatch] = []
    held = 0
    with reading(path, what):
        handle = pq.ParquetFile(path, pre_buffer=False)
        schema = handle.schema_arrow.empty_table().select(list(columns or [])).schema \
            if columns else handle.schema_arrow
        if rows > 0:
            for batch in handle.iter_batches(batch_size=min(rows, 8192), columns=columns):
                batches.append(batch.slice(0, rows - held))
                held += batches[-1].num_rows
                if held >= rows:
                    break
    return pa.Table.from_batches(batches, schema)


def audit_spans(
    chunk_paths: Sequence[str | os.PathLike],
    span_paths: Sequence[str | os.PathLike],
    checkpoint_dir: str | os.PathLike,
    cfg: SpanConfig,
    plot: str | os.PathLike,
    sample: str | os.PathLike,
    max_chunks: int = 200_000,
    sample_chunks: int = 3,
) -> None:
    """lengths.png: span lengths against the scaled Beta density; sample.md: spans as text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = {g: [] for g in GRANULARITIES}
    seen = 0
    for path in span_paths:  # the first max_chunks chunks, shard by shard: deterministic
        if seen >= max_chunks:
            break
        table = _head(path, max_chunks - seen, "a span index Parquet file",
                      ["span_start", "span_end", "granularity"])
        seen += table.num_rows
        g, _ = flat(table["granularity"])
        ln = flat(table["span_end"])[0] - flat(table["span_start"])[0]
        for i, name in enumerate(GRANULARITIES):
            lengths[name].append(ln[g == i])
    enabled = [g for g in GRANULARITIES if cfg.enabled(g)]
    fig, axes = plt.subplots(1, len(enabled), figsize=(4 * len(enabled), 3.2), squeeze=False)
    for ax, name in zip(axes[0], enabled):
        ln = np.concatenate(lengths[name]) if lengths[name] else np.zeros(0)
        if name == "word":
            ax.hist(
                ln, bins=np.arange(0.5, max(ln.max(initial=1), 1) + 1.5), density=True, color="C0"
            )
            ax.set_title(f"word: pieces per word span (n={len(ln)})")
        else:
            lmin, lmax = cfg.bounds(name)
            ax.hist(
                ln,
                bins=np.arange(min(lmin, ln.min(initial=lmin)) - 0.5, lmax + 1.5),
                density=True,
                color="C0",
                label="sampled",
            )
            x = np.linspace(lmin, lmax, 400)
            ax.plot(
                x,
                beta_law.pdf((x - lmin) / max(lmax - lmin, 1), cfg.beta_alpha, cfg.beta_beta)
                / max(lmax - lmin, 1),
                color="C3",
                label=f"Beta({cfg.beta_alpha:g},{cfg.beta_beta:g}) scaled",
            )
            ax.set_title(f"{name} [{lmin}, {lmax}] (n={len(ln)})")
            ax.legend(fontsize=7)
        ax.set_xlabel("span length (tokens)")
    fig.suptitle(f"span lengths, spans={cfg.name}, short_chunk={cfg.short_chunk}", fontsize=9)
    fig.tight_layout()
    with artifacts.atomic_path(plot) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)

    tokenizer = load_tokenizer(checkpoint_dir)
    chunks = _head(chunk_paths[0], sample_chunks, "a chunks Parquet file").to_pylist()
    spans = _head(span_paths[0], sample_chunks, "a span index Parquet file").to_pylist()
    lines = [
        f"# Span sample: spans={cfg.name}",
        "",
        f"The first {len(chunks)} chunks of {chunk_paths[0]}, decoded, with their spans "
        "(positions index input_ids; [CLS] is position 0).",
        "",
    ]
    for chunk, row in zip(chunks, spans):
        ids = chunk["input_ids"]
        lines += [
            f"## chunk {chunk['chunk_id']} (page {chunk['page_id']}, chunk {chunk['chunk_index']}, "
            f"{len(ids)} tokens)",
            "",
            "> " + tokenizer.decode(ids, skip_special_tokens=False),
            "",
            "| granularity | [start, end) | length | text |",
            "|---|---|---|---|",
        ]
        for s, e, g in zip(row["span_start"], row["span_end"], row["granularity"]):
            text = tokenizer.decode(ids[s:e]).replace("|", "\\|")
            lines.append(f"| {GRANULARITIES[g]} | [{s}, {e}) | {e - s} | {text} |")
        lines.append("")
    with artifacts.atomic_path(sample) as tmp:
        tmp.write_text("\n".join(lines))
    params = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    inputs = {f"spans:{Path(p).name}": p for p in span_paths}
    counts = {g: int(sum(len(x) for x in lengths[g])) for g in enabled}
    for artifact in (plot, sample):
        artifacts.write_manifest(
            artifacts.manifest_path(artifact),
            stage="audit_spans",
            params=params,
            inputs=inputs,
            stats={"chunks_read": seen, "spans_plotted": counts},
        )


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser("The span index's audit: lengths.png and sample.md.")
    parser.add_argument("--chunks", type=Path, nargs="+", required=True, help="chunks shards")
    parser.add_argument("--spans", type=Path, nargs="+", required=True,
                        help="the span index shards")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="tokenizer folder (rule stage_tokenizer) or a checkpoint folder",
    )
    parser.add_argument("--plot", type=Path, required=True, help="lengths.png to write")
    parser.add_argument("--sample", type=Path, required=True, help="sample.md to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    audit_spans(args.chunks, args.spans, args.checkpoint, SpanConfig.from_dict(args.config),
                args.plot, args.sample)


if __name__ == "__main__":
    main()
