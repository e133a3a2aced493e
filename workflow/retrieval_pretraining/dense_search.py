"""Dense retrieval: encode a split's queries, search the saved FAISS index, write a TREC run.

Run format (what trec_eval and ir_measures read): `qid Q0 docid rank score tag`, ranks from 1,
scores strictly as ranked (descending), depth 1000 by default. A query whose id equals a document
id never retrieves that document (BEIR's `ignore_identical_ids`, Anserini's convention), so dense
and BM25 rows of a table are scored the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from . import artifacts, faiss_index
from .config import stage_parser
from .encode import (embed, finite_vectors, load_encoder, record_encoder_weights,
                     recorded_weights, use_mismatches)
from .errors import command, reading
from .retrieval_settings import (PREFIX_KEYS, SEARCH_KEYS, RetrievalSettings, add_runtime_option,
                                 check_bool, check_choice, check_int, with_runtime)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """The slice the dense_search rule passes (search_argument): the retrieval knobs, the run's
    depth, the dataset's query-id rule and whether FAISS may use GPUs (a baseline's slice adds its
    query / passage prefixes: rules/baselines.smk)."""

    retrieval: RetrievalSettings
    search_depth: int = 1000
    exclude_self: bool = True  # a hit equal to the query id is dropped (BEIR), not for MS MARCO
    use_gpu: str = "auto"      # auto | never

    def __post_init__(self) -> None:
        check_int("finetune.search_depth", self.search_depth, 1)
        check_bool("exclude_self (the dataset's exclude_query_id)", self.exclude_self)
        check_choice("mining.index.use_gpu", self.use_gpu, ("auto", "never"))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "SearchSettings":
        retrieval = RetrievalSettings.from_config(config, added=SEARCH_KEYS + PREFIX_KEYS,
                                                 stage="dense_search")
        own = {k: config[k] for k in ("search_depth", "exclude_self", "use_gpu") if k in config}
        return cls(retrieval=retrieval, **own)


def encode_queries(encoder: Path | tuple, queries: Path, knobs: RetrievalSettings
                   ) -> tuple[list[str], np.ndarray]:
    """(query ids, float32 vectors) of a canonical queries Parquet; `encoder` = folder or (model, tok)."""
    with reading(queries, "a queries Parquet file"):
        frame = pl.read_parquet(queries, columns=["query_id", "text"])
    loaded = isinstance(encoder, Path)
    model, tokenizer = load_encoder(encoder) if loaded else encoder
    vectors = embed(model, tokenizer, frame["text"].fill_null("").to_list(), max_len=knobs.q_len,
                    pooling=knobs.pooling, similarity=knobs.similarity,
                    batch_size=knobs.encode_batch_size, desc="encode queries",
                    prefix=knobs.query_prefix)
    # Before any search: a NaN query gets no hit, which read as an index that found too few.
    vectors = finite_vectors(vectors, "float32", frame["query_id"], str(queries), "query",
                             encoder if loaded else "in memory")
    if loaded and next(model.parameters()).is_cuda:
        # torch's allocator keeps the encoder's memory cached; faiss-gpu, which mining and dense
        # search load an index into next, allocates on its own and cannot use it.
        del model
        torch.cuda.empty_cache()
    return frame["query_id"].to_list(), vectors


def fetch_depth(depth: int, exclude_self: bool) -> int:
    """The neighbours `rank` asks the index for: one extra when excluding the query's own id, so
    the depth stays `depth`."""
    return depth + (1 if exclude_self else 0)


def rank(index, doc_ids: pa.Array, query_ids: list[str], query_vectors: np.ndarray, depth: int,
         exclude_self: bool = True) -> Iterable[tuple[str, list[str], np.ndarray, np.ndarray]]:
    """Per query: (query id, doc ids best first, their scores, their 1-based ranks). `doc_ids`:
    the index's rows' ids (faiss_index.load)."""
    scores, rows = faiss_index.search(index, query_vectors, fetch_depth(depth, exclude_self))
    for qid, qscores, qrows in zip(query_ids, scores, rows):
        keep = qrows >= 0
        ids = doc_ids.take(qrows[keep]).to_pylist()
        qscores = qscores[keep]
        if exclude_self:
            mask = np.array([d != qid for d in ids], dtype=bool)
            ids = [d for d, m in zip(ids, mask) if m]
            qscores = qscores[mask]
        ids, qscores = ids[:depth], qscores[:depth]
        yield qid, ids, qscores, np.arange(1, len(ids) + 1, dtype=np.int32)


def counting(rankings: Iterable[tuple], counts: list[int]) -> Iterable[tuple]:
    """`rankings` passed through, each query's number of hits appended to `counts`."""
    for ranking in rankings:
        counts.append(len(ranking[1]))
        yield ranking


def depth_reached(counts: list[int], depth: int, limits: dict[str, Any],
                  exclude_self: bool = False) -> dict[str, Any]:
    """The candidates per query the search found, for the manifest; a warning naming the index's
    settings (`limits`: faiss_index.search_limits) where a query got fewer than a complete search
    finds from an approximate index (an IVF index's nprobe cells, or an HNSW search's efSearch,
    can hold fewer), since a manifest that says `depth` would hide it. A complete search finds
    `depth`, or the whole index in a corpus smaller than the depth (less the query's own id
    where `exclude_self` drops it): fewer than the depth there is said, with no setting to
    raise, whatever the index."""
    if not counts:
        return {"candidates_per_query_min": 0, "candidates_per_query_mean": 0.0}
    low = int(min(counts))
    if low < depth:
        short = sum(c < depth for c in counts)
        complete = min(depth, limits["ntotal"] - (1 if exclude_self else 0))
        missed = 0 if limits["exact"] else sum(c < complete for c in counts)
        if missed:
            log.warning("%d of %d queries got fewer than the %d candidates asked (min %d, mean "
                        "%.1f) from the index %s; raise nprobe or ef_search in mining.index, or "
                        "lower the depth", missed, len(counts), complete, low,
                        float(np.mean(counts)), limits)
        else:
            log.info("%d of %d queries got fewer than the %d candidates asked (min %d): the index "
                     "holds only %d documents (a query's own id, where excluded, among them)",
                     short, len(counts), depth, low, limits["ntotal"])
    return {"candidates_per_query_min": low, "candidates_per_query_mean": float(np.mean(counts))}


def write_trec(path: Path, rankings: Iterable[tuple[str, list[str], np.ndarray, np.ndarray]],
               tag: str) -> int:
    """Write a TREC run atomically; returns the number of lines. Scores keep 9 significant digits,
    which a float32 needs to read back exactly: evaluators sort by score and ignore the rank column,
    so two scores printed alike (0.8123451 and 0.8123449 at 6 decimals) would be re-ordered by doc
    id, away from the ranking searched."""
    if any(ch.isspace() for ch in tag):
        raise ValueError(f"run tag {tag!r} contains whitespace; TREC runs are space-separated")
    lines = []
    for qid, ids, scores, ranks in rankings:
        lines.extend(f"{qid} Q0 {d} {r} {s:.9g} {tag}\n" for d, s, r in zip(ids, scores, ranks))
    with artifacts.atomic_path(path) as tmp:
        tmp.write_text("".join(lines))
    return len(lines)


def dense_run(index_dir: Path, encoder: Path, queries: Path, out: Path, tag: str,
              config: dict[str, Any]) -> dict[str, int]:
    """Encode `queries`, search the saved index, write the TREC run and its manifest."""
    knobs = SearchSettings.from_config(config)
    # The index mapped, not read: a bad index folder fails before the queries are encoded.
    index, doc_ids = faiss_index.load(index_dir)
    # A baseline's q_len against its staged source is checked here, where queries are encoded
    # (its corpus encoding, handed no q_len, checks p_len; both check pooling and similarity).
    mismatches = use_mismatches(encoder, knobs.retrieval, lengths=("q_len",))
    for message in mismatches:
        log.warning("%s: %s (the baseline's knobs in evaluate.baselines)", encoder, message)
    weights = recorded_weights(encoder)
    query_ids, vectors = encode_queries(encoder, queries, knobs.retrieval)
    # Only now, the encoder gone from the GPU, is the index copied there: a copy made first held
    # the GPU memory the encoder loads into, and was wasted where the encoder failed to load.
    limits = faiss_index.search_limits(index)  # as loaded: a GPU copy reports neither
    index = faiss_index.to_search_device(index, knobs.use_gpu,
                                         fetch_depth(knobs.search_depth, knobs.exclude_self))
    counts: list[int] = []
    lines = write_trec(out, counting(rank(index, doc_ids, query_ids, vectors, knobs.search_depth,
                                          knobs.exclude_self), counts), tag)
    stats = {"queries": len(query_ids), "lines": lines,
             **depth_reached(counts, knobs.search_depth, limits, knobs.exclude_self)}
    if mismatches:  # kept where the run is, as the corpus encoding keeps its own
        stats["use_mismatches"] = mismatches
    manifest_file = out.with_name(out.name.split(".")[0] + ".manifest.json")
    manifest = artifacts.write_manifest(
        manifest_file, stage="dense_run",
        params={**knobs.retrieval.record(), "search_depth": knobs.search_depth,
                "exclude_self": knobs.exclude_self},
        inputs={"queries": queries, "index": index_dir / "index", "encoder": encoder}, stats=stats)
    record_encoder_weights(manifest_file, manifest, weights)
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True, help="folder with `index` + `docid`")
    parser.add_argument("--encoder", type=Path, required=True)
    parser.add_argument("--queries", type=Path, required=True, help="canonical queries-{split}.parquet")
    parser.add_argument("--out", type=Path, required=True, help="TREC run file")
    parser.add_argument("--tag", required=True, help="run tag (the system name)")
    args = add_runtime_option(parser).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stats = dense_run(args.index, args.encoder, args.queries, args.out, args.tag,
                      with_runtime(args.config, args.runtime))
    log.info("wrote %s -> %s", stats, args.out)


if __name__ == "__main__":
    main()
