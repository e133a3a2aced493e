"""Analyses where a picture says more than a table.

- `loss-curves`: every pre-training run's loss terms (metrics.jsonl) on shared axes.
- `tsne`: one query's top-k candidates under several fine-tuned models, relevant documents marked
  (COSTA Figure 3; sklearn t-SNE on the models' own embeddings).
- `coverage`: input-token coverage of [CLS] projected to the vocabulary, top-k for several k, per
  model (Bag-of-Word paper, Algorithm 1 / Figure 4).
- `cpdae-words`: the CPDAE decoder's top words for sample texts.

The projection to the vocabulary needs a head. Exported encoders carry none, so the heads saved
beside them (`results/pretrain/{model}/heads.safetensors`, keys as in the pre-training module:
`mlm_head.*`, `decoder.*`) are used when present; otherwise coverage falls back to the BoW
paper's own formula h_CLS . E^T with the tied word embeddings, and says so in its output.

Each analysis writes one manifest beside its outputs (`coverage.png` + `coverage.json` ->
`coverage.manifest.json`): parameters, inputs with checksums (an encoder by its weights file) and
the headline numbers, so that `python -m retrieval_pretraining.audit` says what a figure came from.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import artifacts
from .config import stage_parser

log = logging.getLogger(__name__)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    with artifacts.atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=120)


def write_manifest(
    out: Path,
    stage: str,
    params: dict[str, Any],
    inputs: dict[str, Path],
    stats: dict[str, Any] | None = None,
) -> None:
    """One manifest for an analysis's outputs (`x.png` + `x.json` -> `x.manifest.json`), so that
    `python -m retrieval_pretraining.audit` can say what a figure was made from."""
    artifacts.write_manifest(
        artifacts.manifest_path(out), stage=stage, params=params, inputs=inputs, stats=stats
    )


def encoder_weights(encoder_dir: Path) -> Path:
    """The file that identifies an encoder folder in a manifest (its checksum is recorded)."""
    return Path(encoder_dir) / "model.safetensors"


# ----------------------------------------------------------------------------- loss curves
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{number}: not a JSON line ({error}); rerun the "
                    "pre-training rule that wrote it"
                ) from error
    return records


def loss_curves(
    runs: dict[str, Path], out_png: Path, out_json: Path | None = None
) -> dict[str, Any]:
    """One panel per loss term (loss, loss_mlm, loss_gwc, ...), one line per pre-training run."""
    curves = {name: read_jsonl(path) for name, path in runs.items()}
    terms = sorted(
        {
            k
            for recs in curves.values()
            for r in recs
            for k in r
            if k.startswith("loss") and isinstance(r[k], (int, float))
        }
    )
    plt = _pyplot()
    fig, axes = plt.subplots(
        1,
        max(1, len(terms)),
        figsize=(4 * max(1, len(terms)) + 1.5, 3.2),
        squeeze=False,
        layout="constrained",
    )
    summary: dict[str, Any] = {}
    for ax, term in zip(axes[0], terms or ["loss"]):
        for name, recs in curves.items():
            points = [(r["step"], r[term]) for r in recs if term in r and "step" in r]
            if points:
                ax.plot(*zip(*points), label=name)
                summary.setdefault(name, {})[term] = {
                    "first": points[0][1],
                    "last": points[-1][1],
                    "steps": points[-1][0],
                }
        ax.set_title(term)
        ax.set_xlabel("step")
        values = [y for line in ax.get_lines() for y in line.get_ydata()]
        if values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")  # objectives differ in scale (CPDAE's summed BCE is ~100x MLM)
    if not terms:
        axes[0][0].text(
            0.5,
            0.5,
            "no training steps logged (base checkpoints only)",
            ha="center",
            va="center",
            transform=axes[0][0].transAxes,
        )
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    save_figure(fig, out_png)
    plt.close(fig)
    if out_json is not None:
        artifacts.write_json(out_json, summary)
    write_manifest(
        out_png,
        "analysis.loss_curves",
        {"runs": list(runs)},
        {name: Path(path) for name, path in runs.items()},
        {"terms": terms, "runs_with_steps": sorted(summary)},
    )
    return summary


# ----------------------------------------------------------------------------- coverage
def coverage_at_k(
    ranked_ids: np.ndarray, inputs: Sequence[set[int]], ks: Sequence[int]
) -> dict[int, float]:
    """BoW Alg. 1: mean over texts of |top-k projected tokens ∩ the text's tokens| / k.

    `ranked_ids[i]` lists vocabulary ids by decreasing projected score for text i.
    """
    out = {}
    for k in ks:
        hits = [len(set(row[:k].tolist()) & bag) / k for row, bag in zip(ranked_ids, inputs)]
        out[int(k)] = float(np.mean(hits)) if hits else math.nan
    return out


def excluded_ids(tokenizer) -> list[int]:
    """Special and [unused] ids: never counted (the BoW authors' filter)."""
    vocab = tokenizer.get_vocab()
    return sorted(
        set(tokenizer.all_special_ids) | {i for t, i in vocab.items() if t.startswith("[unused")}
    )


def load_heads(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path)) if path.is_file() else {}


def vocabulary_projector(encoder, heads: dict[str, Any]):
    """(callable h_CLS -> vocabulary logits, name of the projection used)."""
    import torch.nn.functional as F

    mlm = {k.removeprefix("mlm_head."): v for k, v in heads.items() if k.startswith("mlm_head.")}
    embeddings = encoder.get_input_embeddings()
    if mlm:
        from .pretrain.model import MLMHead

        head = MLMHead(encoder.config, embeddings)
        head.load_state_dict(mlm, strict=True)
        head.eval()
        return head, "mlm_head"
    return (lambda h: F.linear(h, embeddings.weight)), "embeddings"


def project_cls(encoder, projector, input_ids: list[list[int]], pad_id: int, batch: int = 32):
    import torch

    logits = []
    with torch.inference_mode():
        for start in range(0, len(input_ids), batch):
            rows = input_ids[start : start + batch]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(rows):
                ids[i, : len(r)] = torch.tensor(r)
                mask[i, : len(r)] = 1
            cls = encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
            logits.append(projector(cls).float())
    return torch.cat(logits)


def coverage(
    models: dict[str, Path],
    chunks: Path,
    ks: Sequence[int],
    samples: int,
    out_png: Path,
    out_json: Path,
) -> dict[str, Any]:
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModel, AutoTokenizer

    input_ids = pq.read_table(chunks, columns=["input_ids"])["input_ids"].to_pylist()[:samples]
    if not input_ids:
        raise ValueError(f"{chunks} has no chunks to sample; build the corpus stage first")
    result: dict[str, Any] = {"chunks": str(chunks), "samples": len(input_ids), "models": {}}
    for name, encoder_dir in models.items():
        tokenizer = AutoTokenizer.from_pretrained(encoder_dir, local_files_only=True)
        encoder = AutoModel.from_pretrained(
            encoder_dir, local_files_only=True, trust_remote_code=False, add_pooling_layer=False
        ).eval()
        projector, kind = vocabulary_projector(
            encoder, load_heads(Path(encoder_dir).parent / "heads.safetensors")
        )
        logits = project_cls(encoder, projector, input_ids, tokenizer.pad_token_id or 0)
        skip = excluded_ids(tokenizer)
        logits[:, skip] = -math.inf
        ranked = torch.topk(logits, max(ks), dim=1).indices.numpy()
        bags = [set(r) - set(skip) for r in input_ids]
        result["models"][name] = {"projection": kind, "coverage": coverage_at_k(ranked, bags, ks)}
        log.info("%s (%s): %s", name, kind, result["models"][name]["coverage"])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, info in result["models"].items():
        ax.plot(
            list(ks),
            [info["coverage"][k] for k in ks],
            marker="o",
            label=f"{name} ({'MLM head' if info['projection'] == 'mlm_head' else 'E^T'})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("k (top-k tokens of [CLS] projected to the vocabulary)")
    ax.set_ylabel("input-token coverage")
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
    artifacts.write_json(out_json, result)
    write_manifest(
        out_png,
        "analysis.coverage",
        {"ks": [int(k) for k in ks], "samples": samples},
        {"chunks": Path(chunks)}
        | {name: encoder_weights(path) for name, path in models.items()}
        | {
            f"{name}_heads": Path(path).parent / "heads.safetensors"
            for name, path in models.items()
            if (Path(path).parent / "heads.safetensors").is_file()
        },
        {name: info["coverage"] for name, info in result["models"].items()},
    )
    return result


# ----------------------------------------------------------------------------- CPDAE decoder
def cpdae_top_words(
    encoder_dir: Path, texts: Sequence[str], top: int, out_md: Path, out_html: Path | None = None
) -> str:
    import torch
    from transformers import AutoModel, AutoTokenizer

    heads_path = Path(encoder_dir).parent / "heads.safetensors"
    heads = load_heads(heads_path)
    decoder_state = {
        k.removeprefix("decoder."): v for k, v in heads.items() if k.startswith("decoder.")
    }
    lines = [f"# CPDAE decoder: top {top} words", ""]
    if not decoder_state:
        lines.append(
            f"No decoder weights in `{heads_path}`: the pre-training export did not save the "
            "CPDAE heads, so the decoder's words cannot be shown."
        )
    else:
        from .pretrain.model import cpdae_decoder

        tokenizer = AutoTokenizer.from_pretrained(encoder_dir, local_files_only=True)
        encoder = AutoModel.from_pretrained(
            encoder_dir, local_files_only=True, trust_remote_code=False, add_pooling_layer=False
        ).eval()
        decoder = cpdae_decoder(
            encoder.config.hidden_size, encoder.config.vocab_size, encoder.config.layer_norm_eps
        )
        decoder.load_state_dict(decoder_state, strict=True)
        decoder.eval()
        skip = excluded_ids(tokenizer)
        for text in texts:
            batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=512)
            with torch.inference_mode():
                cls = encoder(**batch).last_hidden_state[:, 0]
                probs = torch.sigmoid(decoder(cls))[0].clone()
                probs[skip] = -1.0  # special and [unused] ids are never words
            values, ids = torch.topk(probs, top)
            inputs = set(batch["input_ids"][0].tolist())
            words = [
                f"{tokenizer.convert_ids_to_tokens(int(i))} ({v:.2f}{', in text' if int(i) in inputs else ''})"
                for v, i in zip(values.tolist(), ids.tolist())
            ]
            lines += [f"**Text:** {text}", "", "**Top words:** " + " · ".join(words), ""]
    text_out = "\n".join(lines) + "\n"
    with artifacts.atomic_path(out_md) as tmp:
        tmp.write_text(text_out)
    if out_html is not None:
        from .tables import markdown_to_html

        with artifacts.atomic_path(out_html) as tmp:
            tmp.write_text(markdown_to_html(text_out, "CPDAE decoder top words"))
    write_manifest(
        out_md,
        "analysis.cpdae_top_words",
        {"texts": list(texts), "top": top},
        {"encoder": encoder_weights(encoder_dir), "heads": heads_path},
        {"decoder_found": bool(decoder_state), "texts": len(texts)},
    )
    return text_out


# ----------------------------------------------------------------------------- t-SNE
def pick_query(
    qrels: dict[str, set[str]], runs: dict[str, dict[str, list[str]]], wanted: str | None
) -> str:
    """The configured query, else the first query id (sorted) with >= 2 relevant docs in every run."""
    if wanted is not None:
        if wanted not in qrels or any(wanted not in r for r in runs.values()):
            raise ValueError(
                f"query {wanted!r} is not judged or not in every run; pick another in "
                "report.analysis.tsne.query"
            )
        return wanted
    for qid in sorted(qrels):
        if len(qrels[qid]) >= 2 and all(qid in r for r in runs.values()):
            return qid
    for qid in sorted(qrels):
        if all(qid in r for r in runs.values()):
            return qid
    raise ValueError("no judged query appears in every run")


def read_run(path: Path, depth: int) -> dict[str, list[str]]:
    ranked: dict[str, list[tuple[int, str]]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        parts = line.split()
        if len(parts) != 6:
            raise ValueError(f"{path}:{number}: expected 'qid Q0 docid rank score tag'")
        ranked.setdefault(parts[0], []).append((int(parts[3]), parts[2]))
    return {q: [d for _, d in sorted(v)[:depth]] for q, v in ranked.items()}


def tsne_points(vectors: np.ndarray, seed: int) -> np.ndarray:
    """2-d t-SNE; perplexity capped for small sets (sklearn requires perplexity < n)."""
    from sklearn.manifold import TSNE

    perplexity = float(min(30.0, max(2.0, (len(vectors) - 1) / 3)))
    return TSNE(
        n_components=2, perplexity=perplexity, init="pca", random_state=seed, metric="cosine"
    ).fit_transform(vectors.astype(np.float32))


def tsne(
    models: dict[str, tuple[Path, Path]],
    dataset_dir: Path,
    split: str,
    cfg: dict[str, Any],
    seed: int,
    out_png: Path,
    out_json: Path,
) -> dict[str, Any]:
    """models: name -> (fine-tuned encoder folder, run file)."""
    import polars as pl
    import torch

    from . import datasets, encode

    torch.manual_seed(seed)
    info = datasets.read_info(dataset_dir)
    qrels = datasets.read_qrels(dataset_dir / f"qrels-{split}.parquet")
    runs = {name: read_run(run, cfg["depth"]) for name, (_, run) in models.items()}
    qid = pick_query(qrels, runs, cfg.get("query"))
    query = (
        pl.scan_parquet(dataset_dir / f"queries-{split}.parquet")
        .filter(pl.col("query_id") == qid)
        .collect()["text"][0]
    )
    wanted = sorted({d for r in runs.values() for d in r[qid]})
    corpus = (
        pl.scan_parquet(dataset_dir / "corpus.parquet")
        .filter(pl.col("doc_id").is_in(wanted))
        .collect()
    )
    docs = dict(zip(corpus["doc_id"], zip(corpus["title"], corpus["text"])))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 4), squeeze=False)
    summary: dict[str, Any] = {
        "query_id": qid,
        "query": query,
        "relevant": sorted(qrels[qid]),
        "models": {},
    }
    for ax, (name, (encoder_dir, _)) in zip(axes[0], models.items()):
        ids = runs[name][qid]
        model, tokenizer = encode.load_encoder(encoder_dir, torch.device("cpu"))
        opts = {
            "max_len": cfg.get("max_len", 128),
            "pooling": cfg.get("pooling", "cls"),
            "similarity": cfg.get("similarity", "dot"),
        }
        q_vec = encode.embed(model, tokenizer, [query], **opts)
        d_vec = encode.embed(
            model,
            tokenizer,
            [docs[d][1] for d in ids],
            titles=[docs[d][0] for d in ids],
            title=info.get("title", "space"),
            **opts,
        )
        points = tsne_points(np.vstack([q_vec, d_vec]), seed)
        relevant = np.array([d in qrels[qid] for d in ids])
        others = points[1:][~relevant]
        ax.scatter(
            others[:, 0], others[:, 1], s=12, c="lightgray", label=f"top-{len(ids)} candidates"
        )
        ax.scatter(
            points[1:][relevant, 0],
            points[1:][relevant, 1],
            s=60,
            marker="*",
            c="tab:red",
            label="relevant",
        )
        ax.scatter(points[0, 0], points[0, 1], s=80, marker="^", c="tab:blue", label="query")
        for rank in np.flatnonzero(relevant):  # the relevant documents' ranks in this model's run
            ax.annotate(
                str(rank + 1),
                points[1 + rank],
                textcoords="offset points",
                xytext=(4, 4),
                fontsize="x-small",
                color="tab:red",
            )
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
        summary["models"][name] = {
            "candidates": len(ids),
            "relevant_retrieved": int(relevant.sum()),
            "relevant_ranks": [i + 1 for i, r in enumerate(relevant) if r],
        }
    axes[0][0].legend(fontsize="small", loc="best")
    fig.suptitle(f"query {qid}: {query[:80]}", fontsize="small")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
    artifacts.write_json(out_json, summary)
    inputs = {"qrels": dataset_dir / f"qrels-{split}.parquet"}
    for name, (encoder_dir, run) in models.items():
        inputs |= {name: encoder_weights(encoder_dir), f"{name}_run": Path(run)}
    write_manifest(
        out_png,
        "analysis.tsne",
        cfg | {"split": split, "seed": seed},
        inputs,
        {"query_id": qid}
        | {name: info["relevant_retrieved"] for name, info in summary["models"].items()},
    )
    return summary


# ----------------------------------------------------------------------------- CLI
def _pairs(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=PATH, got {v!r}")
        out[name] = rest
    return out


def main() -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("command", choices=["loss-curves", "tsne", "coverage", "cpdae-words"])
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="NAME=PATH (metrics.jsonl, encoder folder, or ENCODER,RUN for tsne); repeat",
    )
    parser.add_argument("--chunks", type=Path, help="coverage: the chunks shard to sample")
    parser.add_argument("--dataset-dir", type=Path, help="tsne: results/datasets/<dataset>")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True, help="PNG (or Markdown for cpdae-words)")
    parser.add_argument("--json", type=Path, help="numbers behind the figure")
    parser.add_argument(
        "--html", type=Path, help="cpdae-words: the same as HTML (Snakemake report)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
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
