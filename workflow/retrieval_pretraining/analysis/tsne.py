"""One query's top-k candidates under several fine-tuned models, relevant documents marked (COSTA
Figure 3; sklearn t-SNE on the models' own embeddings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import artifacts
from ..config import ConfigError
from ..errors import InputFileError, reading
from ..model_folder import check_safetensors
from ..retrieval_settings import RetrievalSettings, retrieval_keys
from ..contracts.runs import trec_fields, utf8_lines
from .common import encoder_weights, pyplot, save_figure, write_manifest


def pick_query(
    qrels: dict[str, set[str]], runs: dict[str, dict[str, list[str]]], wanted: str | None
) -> str:
    """The configured query, else the first query id (sorted) that is in every run and has >= 2
    judged-relevant documents (whether the runs retrieved them or not), else the first judged
    query in every run."""
    if wanted is not None:
        if wanted not in qrels or any(wanted not in r for r in runs.values()):
            raise ConfigError(
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
    raise InputFileError(f"no judged query appears in every run ({', '.join(runs)}); check "
                         "that the runs are of this dataset and split")


def check_candidates(
    runs: dict[str, dict[str, list[str]]], qid: str, docs: dict[str, Any], corpus: Path
) -> None:
    """Refuse a run whose candidates for `qid` name a document the corpus lacks (a run of
    another dataset, or of a corpus prepared again since), naming the run, the id and the corpus."""
    for name, run in runs.items():
        missing = [d for d in run[qid] if d not in docs]
        if missing:
            raise InputFileError(
                f"run {name!r} ranks doc id {missing[0]!r} for query {qid!r} ({len(missing)} "
                f"missing in all), which is not in {corpus}; the run is of another corpus: rerun "
                "its dense search"
            )


def read_run(path: Path, depth: int) -> dict[str, list[str]]:
    ranked: dict[str, list[tuple[int, str]]] = {}
    for number, line in utf8_lines(path, InputFileError):
        parts = trec_fields(line)
        if len(parts) != 6:
            raise InputFileError(f"{path}:{number}: expected 'qid Q0 docid rank score tag'")
        ranked.setdefault(parts[0], []).append((int(parts[3]), parts[2]))
    return {q: [d for _, d in sorted(v)[:depth]] for q, v in ranked.items()}


def tsne_points(vectors: np.ndarray, seed: int) -> np.ndarray:
    """2-d t-SNE; perplexity capped for small sets (sklearn requires perplexity < n: the floor
    of 2 alone refused a query with one candidate, 2 points; a query is never drawn alone).

    Cosine distance for every run, dot-product ones too: t-SNE needs a dissimilarity, and the
    inner product is none (a vector need not be its own nearest neighbour under it). The angle
    is what a cosine run ranks by; a dot-product run also weighs the norms, which the figure
    leaves out. Which metric COSTA's Figure 3 used is not recorded (ARCHITECTURE.md)."""
    from sklearn.manifold import TSNE

    perplexity = float(min(30.0, max(2.0, (len(vectors) - 1) / 3), len(vectors) - 1))
    return TSNE(
        n_components=2, perplexity=perplexity, init="pca", random_state=seed, metric="cosine"
    ).fit_transform(vectors.astype(np.float32))


def retrieval_settings(cfg: dict[str, Any]) -> RetrievalSettings:
    """The retrieval knobs among the t-SNE slice's keys (defaults for those missing)."""
    return RetrievalSettings(**{k: v for k, v in cfg.items() if k in retrieval_keys()})


def tsne(
    models: dict[str, tuple[Path, Path]],
    dataset_dir: Path,
    split: str,
    cfg: dict[str, Any],
    seed: int,
    out_png: Path,
    out_json: Path,
) -> dict[str, Any]:
    """models: name -> (fine-tuned encoder folder, run file). A document is relevant when its
    grade is at least `cfg["relevance_level"]` (the split's evaluate level; default 1). Queries
    and documents are embedded as the runs' encoding and search did: with the retrieval knobs in
    `cfg` (pooling, similarity, q_len, p_len, title..., rules/analysis.smk tsne_config)."""
    import polars as pl
    import torch

    from .. import datasets, encode

    for encoder_dir, _ in models.values():  # fail before any work on a missing or pickled encoder
        check_safetensors(encoder_dir)

    knobs = retrieval_settings(cfg)
    torch.manual_seed(seed)
    with reading(dataset_dir / f"qrels-{split}.parquet", "a qrels Parquet file"):
        # The split's own level: at 2 (TREC DL passage) a grade-1 "related" passage is not one.
        qrels = datasets.read_qrels(
            dataset_dir / f"qrels-{split}.parquet", cfg.get("relevance_level", 1)
        )
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
    check_candidates(runs, qid, docs, dataset_dir / "corpus.parquet")
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(models), figsize=(4.2 * len(models), 4.4), squeeze=False, layout="constrained"
    )
    summary: dict[str, Any] = {
        "query_id": qid,
        "query": query,
        "relevant": sorted(qrels[qid]),
        "models": {},
    }
    # Each panel's own candidate count: in the legend when every panel shares it, else in each
    # title (the legend, drawn once, gave the first panel's count for every panel).
    counts = {name: len(runs[name][qid]) for name in models}
    shared = len(set(counts.values())) == 1
    for ax, (name, (encoder_dir, _)) in zip(axes[0], models.items()):
        ids = runs[name][qid]
        model, tokenizer = encode.load_encoder(encoder_dir, torch.device("cpu"))
        opts = {"pooling": knobs.pooling, "similarity": knobs.similarity}
        q_vec = encode.embed(
            model, tokenizer, [query], max_len=knobs.q_len, prefix=knobs.query_prefix, **opts
        )
        d_vec = encode.embed(
            model,
            tokenizer,
            [docs[d][1] for d in ids],
            titles=[docs[d][0] for d in ids],
            title=knobs.title,
            max_len=knobs.p_len,
            prefix=knobs.passage_prefix,
            **opts,
        )
        points = tsne_points(np.vstack([q_vec, d_vec]), seed)
        relevant = np.array([d in qrels[qid] for d in ids])
        others = points[1:][~relevant]
        ax.scatter(others[:, 0], others[:, 1], s=12, c="lightgray",
                   label=f"top-{len(ids)} candidates" if shared else "candidates")
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
        ax.set_title(name if shared else f"{name} (top {len(ids)})")
        ax.set_xticks([])
        ax.set_yticks([])
        summary["models"][name] = {
            "candidates": len(ids),
            "relevant_retrieved": int(relevant.sum()),
            "relevant_ranks": [i + 1 for i, r in enumerate(relevant) if r],
        }
    # Below the panels, not inside one: a legend in the axes may hide the query or a candidate.
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize="small")
    fig.suptitle(f"query {qid}: {query[:80]}", fontsize="small")
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
