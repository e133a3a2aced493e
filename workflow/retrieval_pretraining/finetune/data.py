"""The fine-tuning data: which queries train, with which passages, in which order, on which rank.

Training queries are the split's queries with a positive (relevance > 0) in the corpus: a qrel
naming a document absent from the corpus is kept by datasets.py (it is an unretrievable relevant for
scoring) but cannot be trained on, so it is dropped here, and a query left without positives is
skipped; both are counted (log, metrics `start` event, encoder manifest). A query without negatives
(MS MARCO's triples do not cover every judged query) is dropped or padded with random corpus
documents (`queries_without_negatives`: drop | pad, Tevatron's padding), counted too. Padding draws
from a seeded pool of at most PAD_POOL documents (the whole corpus when smaller), so no process
holds the whole corpus in memory.

Each training query brings a group of `group_size` passages (1 positive + n-1 negatives) and is
scored against every passage of its *contrast set* (`contrast_plan`): batch_size / sub_batches
queries' passages. Batches are a pure function of (seed, epoch, query id): the query order of an
epoch comes from (seed, epoch), a query's positive and negatives from (seed, epoch, query id). So
a resumed run, or one on a different number of GPUs, sees the same groups.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl

from .. import training
from ..errors import InputFileError, reading
from ..mine import rng_for
from .passages import PassageStore
from .settings import FinetuneSettings

PAD_POOL = 100_000  # corpus documents padding draws from (a seeded sample; all of a smaller corpus)


# ---------------------------------------------------------------- the contrast plan -------------
@dataclasses.dataclass(frozen=True)
class ContrastPlan:
    """How a batch is split: queries per micro-batch, micro-batches per process and step, the
    queries of one contrast set, and the negatives each query is contrasted with."""

    micro_batch: int
    accumulation: int
    contrast_queries: int
    negatives_per_query: int

    def record(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def contrast_plan(settings: FinetuneSettings, world_size: int) -> ContrastPlan:
    """sub_batches=8 with batch 64 reproduces the COSTA authors' 8 GPUs x 8 queries without
    gathering (63 negatives per query) on any number of GPUs; sub_batches=1 contrasts the whole
    batch (511).
    gather=true lets one contrast set span GPUs (passages all-gathered with gradients); with
    gather=false a contrast set must fit on one GPU (it is one micro-batch)."""
    batch, subs = settings.batch_size, settings.sub_batches
    if batch % subs:
        raise ValueError(f"finetune.batch_size {batch} is not divisible by sub_batches {subs}")
    contrast = batch // subs
    if settings.gather:
        if contrast % world_size:
            raise ValueError(f"a contrast set of {contrast} queries cannot be split over "
                             f"{world_size} GPUs; choose batch_size/sub_batches divisible by it")
        micro = contrast // world_size
    else:
        micro = contrast
    accumulation = training.accumulation_steps(batch, micro, world_size)
    return ContrastPlan(micro_batch=micro, accumulation=accumulation, contrast_queries=contrast,
                        negatives_per_query=contrast * settings.group_size - 1)


def step_queries(query_ids: list[str], seed: int, step: int, batch_size: int
                 ) -> tuple[int, list[str]]:
    """(epoch, the batch's query ids) of optimiser step `step` (0-based)."""
    steps_per_epoch = len(query_ids) // batch_size
    epoch, in_epoch = divmod(step, steps_per_epoch)
    order = epoch_order(len(query_ids), seed, epoch)
    return epoch, [query_ids[i] for i in order[in_epoch * batch_size:(in_epoch + 1) * batch_size]]


def micro_batches_of_rank(batch_ids: list[str], plan: ContrastPlan, gather: bool, rank: int,
                          world_size: int) -> list[list[str]]:
    """This process's micro-batches of a batch: contrast sets in order, each split over ranks when
    gathering (rank r takes the r-th share of every set), else whole sets dealt out in blocks."""
    micro = plan.micro_batch
    chunks = [batch_ids[i:i + micro] for i in range(0, len(batch_ids), micro)]
    if gather:
        return chunks[rank::world_size]
    return chunks[rank * plan.accumulation:(rank + 1) * plan.accumulation]


# ---------------------------------------------------------------- the training set --------------
def training_queries(queries: Path, qrels: Path, negative_files: list[Path],
                     settings: FinetuneSettings, seed: int, corpus: Path | None = None
                     ) -> tuple[list[str], dict[str, str], dict[str, list[str]],
                                dict[str, list[str]], dict[str, int]]:
    """(query ids in a stable order, query texts, positives, negatives, counts) of the training set.

    Negatives of several files (e.g. mined + BM25) are unioned in file order, duplicates dropped.
    With `corpus`, positives absent from it are dropped and queries left without one skipped; with
    queries_without_negatives=drop, queries without negatives are skipped. Both happen before the
    low-resource sample is drawn, so a sample of N queries holds N trainable queries.
    """
    with reading(queries, "a queries Parquet file"):
        texts = dict(pl.read_parquet(queries, columns=["query_id", "text"]).iter_rows())
    with reading(qrels, "a qrels Parquet file"):
        pos_frame = (pl.scan_parquet(qrels).filter(pl.col("relevance") > 0).group_by("query_id")
                     .agg(pl.col("doc_id").unique().sort()).collect())
    positives = dict(zip(pos_frame["query_id"].to_list(), pos_frame["doc_id"].to_list()))
    negatives: dict[str, list[str]] = {}
    for path in negative_files:
        with reading(path, "a negatives Parquet file"):
            frame = pl.read_parquet(path, columns=["query_id", "negative_ids"])
        for qid, negs in frame.iter_rows():
            merged = negatives.setdefault(qid, [])
            seen = set(merged)
            merged.extend(n for n in (negs or []) if n not in seen and not seen.add(n))
    missing = sorted(set(positives) - set(texts))
    if missing:
        raise InputFileError(f"{qrels} names {len(missing)} queries absent from {queries} "
                             f"(e.g. {missing[:3]}); rebuild the dataset")
    counts = {"positives_absent_from_corpus": 0, "queries_without_positive_in_corpus": 0,
              "queries_without_negatives_dropped": 0}
    if corpus is not None:
        wanted = {d for docs in positives.values() for d in docs}
        present = set(corpus_rows(corpus, wanted, ["doc_id"])["doc_id"].to_list())
        for qid in sorted(positives):
            kept = [d for d in positives[qid] if d in present]
            counts["positives_absent_from_corpus"] += len(positives[qid]) - len(kept)
            if kept:
                positives[qid] = kept
            else:
                del positives[qid]
                counts["queries_without_positive_in_corpus"] += 1
    ids = sorted(positives)
    if settings.queries_without_negatives == "drop":
        kept_ids = [q for q in ids if negatives.get(q)]
        counts["queries_without_negatives_dropped"] = len(ids) - len(kept_ids)
        ids = kept_ids
    if settings.train_queries is not None and settings.train_queries < len(ids):
        # Low-resource sample k of N queries: seeded by (seed, N, k), independent of anything else.
        pick = rng_for(seed, "train-queries", settings.train_queries, settings.train_sample).choice(
            len(ids), size=settings.train_queries, replace=False)
        ids = [ids[i] for i in np.sort(pick)]
    return ids, texts, positives, negatives, counts


def corpus_rows(corpus: Path, doc_ids: set[str], columns: list[str]) -> pl.DataFrame:
    """`columns` of the corpus rows whose doc_id is in `doc_ids` (scanned, not loaded whole)."""
    wanted = pl.LazyFrame({"doc_id": sorted(doc_ids)}, schema={"doc_id": pl.String})
    with reading(corpus, "a corpus Parquet file"):
        return (pl.scan_parquet(corpus).select(columns)
                .join(wanted, on="doc_id", how="semi").collect())


def padding_pool(corpus: Path, seed: int, size: int = PAD_POOL) -> list[str]:
    """Doc ids that groups without negatives are padded from: the whole corpus (in file order) when
    it has at most `size` documents, else `size` of them drawn from (seed) alone, in file order."""
    with reading(corpus, "a corpus Parquet file"):
        doc_ids = pl.read_parquet(corpus, columns=["doc_id"])["doc_id"]
    if len(doc_ids) <= size:
        return doc_ids.to_list()
    rows = np.sort(rng_for(seed, "padding-pool").choice(len(doc_ids), size=size, replace=False))
    return doc_ids.gather(rows).to_list()


def sample_group(qid: str, positives: list[str], negatives: list[str], fallback: list[str],
                 group_size: int, seed: int, epoch: int) -> list[str]:
    """[positive, n-1 negatives] for one query in one epoch, from (seed, epoch, query id) alone.

    Too few negatives: sampled with replacement; none at all: random corpus documents (`fallback`,
    positives excluded), as Tevatron pads groups.
    """
    rng = rng_for(seed, "group", epoch, qid)
    group = [positives[rng.integers(len(positives))]]
    pool = negatives
    if not pool:
        excluded = set(positives)
        pool = [d for d in (fallback[i] for i in rng.choice(len(fallback), 4 * group_size))
                if d not in excluded]
    need = group_size - 1
    if need:
        picks = rng.choice(len(pool), size=need, replace=len(pool) < need)
        group.extend(pool[i] for i in picks)
    return group


def epoch_order(num_queries: int, seed: int, epoch: int) -> np.ndarray:
    return rng_for(seed, "order", epoch).permutation(num_queries)


@dataclasses.dataclass(frozen=True)
class TrainingSet:
    """Everything a step reads: the training queries (ids in a stable order) and their texts, their
    positives and negatives, the padding pool, the passages (`passages.PassageStore`, attached
    once the main process has written them: `with_passages`), and the counts of what was dropped
    or padded."""

    query_ids: list[str]
    query_texts: dict[str, str]
    positives: dict[str, list[str]]
    negatives: dict[str, list[str]]
    padding: list[str]
    counts: dict[str, int]
    passages: PassageStore | None = None

    def needed_passages(self) -> set[str]:
        """Every passage a group can draw: positives, negatives and the padding pool."""
        needed = {d for q in self.query_ids for d in self.positives[q]}
        needed |= {d for q in self.query_ids for d in self.negatives.get(q, [])}
        return needed | set(self.padding)

    def with_passages(self, store: PassageStore) -> TrainingSet:
        return dataclasses.replace(self, passages=store)

    def micro_batch(self, query_ids: list[str], group_size: int, seed: int, epoch: int
                    ) -> tuple[list[str], list[str], list[str]]:
        """(query texts, passage titles, passage texts) of a micro-batch, group by group."""
        groups = [sample_group(q, self.positives[q], self.negatives.get(q, []), self.padding,
                               group_size, seed, epoch) for q in query_ids]
        titles, texts = self.passages.lookup([d for group in groups for d in group])
        return [self.query_texts[q] for q in query_ids], titles, texts


def load_training_set(queries: Path, qrels: Path, corpus: Path, negative_files: list[Path],
                      settings: FinetuneSettings, seed: int) -> TrainingSet:
    """The training set of one stage, without passage texts: the main process writes the ones
    training can use with `passages.write_passages(corpus, set.needed_passages(), file)` and every
    process attaches them (`with_passages`), so no process holds them in its own memory."""
    ids, texts, positives, negatives, counts = training_queries(
        queries, qrels, negative_files, settings, seed, corpus=corpus)
    # Left after a drop policy: none; after pad: their groups come from the padding pool.
    no_negatives = sum(1 for q in ids if not negatives.get(q))
    counts["queries_without_negatives_padded"] = no_negatives
    fallback = padding_pool(corpus, seed) if no_negatives else []
    return TrainingSet(query_ids=ids, query_texts=texts, positives=positives, negatives=negatives,
                       padding=fallback, counts=counts)
