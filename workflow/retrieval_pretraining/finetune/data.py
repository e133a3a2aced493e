"""The fine-tuning data: which queries train, with which passages, in which order, on which rank.

Training queries are the split's queries with a positive (relevance > 0) in the corpus: a qrel
naming a document absent from the corpus is kept by datasets.py (it is an unretrievable relevant for
scoring) but cannot be trained on, so it is dropped here, and a query left without positives is
skipped; both are counted (log, metrics `start` event, encoder manifest). A low-resource sample
(`train_queries`) is drawn from the queries left (under drop: those with a negative in stage 1's
file, `sample_among`). A query without negatives (MS MARCO's triples do not cover every judged
query) is then dropped or padded with random corpus documents (`queries_without_negatives`: drop |
pad; Tevatron has no padding: its TrainDataset fails on an empty list), counted too. Padding never
draws the query's positives, nor its own id under the dataset's exclude_query_id (`exclude_self`:
mining's rule). It draws from a seeded pool of at most PAD_POOL documents (the whole corpus when
smaller), so no process holds the whole corpus in memory.

Each training query brings a group of `group_size` passages (1 positive + n-1 negatives) and is
scored against every passage of its *contrast set* (`contrast_plan`): batch_size / sub_batches
queries' passages. Batches are a pure function of (seed, epoch, query id): the query order of an
epoch comes from (seed, epoch), a query's positive and negatives from (seed, epoch, query id). So
a resumed run, or one on a different number of GPUs, sees the same groups. With group_sampling
cycle (Tevatron's TrainDataset, which the BoW authors' bowdpr keeps) a query's groups instead walk
fixed per-query orders, epoch by epoch (`sample_group`).

Several negatives files (a later stage's mined + BM25) are unioned per query, one example a query;
with negative_files: separate each file is its own set of examples (`separate_examples`), as in the
Tevatron / BoW authors' stage 2: a query is then one example per file naming negatives for it, each
drawing from that file's list alone, and the examples take the queries' place above; with
example_positives: file an example's positives add those its file's row lists (positive_ids).

A negatives file (a user's, the official triples, a mined one) may list a query's positive among
its negatives (the workflow's own writers remove them: bm25.py, mine.py): it would train as both.
Loading removes such an entry from the file's list for that query (`drop_positives`; its
positives: the qrels' in the corpus, and with example_positives: file its file row's too), counts
it (`positives_among_negatives_removed`) and names the first (`TrainingSet.removed_example`,
which the trainer logs); a query left without negatives is dropped or padded as above. A file
mined with positives_removed: first_query (its manifest says so) keeps them: the BoW authors'
miner, replicated on request, trains on them.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import polars as pl

from .. import artifacts, training
from ..errors import InputFileError, expect_section, reading
from ..seeding import keyed_digest, rng_for
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


def cached_chunk(settings: FinetuneSettings, plan: ContrastPlan) -> int | None:
    """The queries one forward pass encodes when a step caches gradients
    (model.cached_contrast_set): `cache_chunk`, where it is smaller than a micro-batch (this
    process's share of a contrast set); None (one pass a micro-batch) otherwise. The contrast
    set, and so negatives_per_query, is the same either way."""
    chunk = settings.cache_chunk
    return chunk if chunk is not None and chunk < plan.micro_batch else None


def step_queries(query_ids: pl.Series, seed: int, step: int, batch_size: int
                 ) -> tuple[int, list[str]]:
    """(epoch, the batch's query ids) of optimiser step `step` (0-based).

    An epoch is len // batch_size whole batches of its own permutation: the last len % batch_size
    queries of that order do not train in that epoch (other ones each epoch; the trainer records
    queries_per_epoch and queries_left_out_per_epoch). Wrapping them into the next epoch would
    change every existing run's batches."""
    steps_per_epoch = len(query_ids) // batch_size
    epoch, in_epoch = divmod(step, steps_per_epoch)
    order = epoch_order(len(query_ids), seed, epoch)
    batch = order[in_epoch * batch_size:(in_epoch + 1) * batch_size]
    return epoch, query_ids.gather(batch).to_list()


def micro_batches_of_rank(batch_ids: list[str], plan: ContrastPlan, gather: bool, rank: int,
                          world_size: int) -> list[list[str]]:
    """This process's micro-batches of a batch: contrast sets in order, each split over ranks when
    gathering (rank r takes the r-th share of every set), else whole sets dealt out in blocks."""
    micro = plan.micro_batch
    chunks = [batch_ids[i:i + micro] for i in range(0, len(batch_ids), micro)]
    if gather:
        return chunks[rank::world_size]
    return chunks[rank * plan.accumulation:(rank + 1) * plan.accumulation]


def micro_batch_index(plan: ContrastPlan, gather: bool, rank: int, world_size: int, k: int) -> int:
    """Where this process's k-th micro-batch (micro_batches_of_rank) stands among the batch's.
    Dropout keys on it: without gathering a contrast set is one micro-batch, so it draws the same
    masks on any number of processes, and one step is the same update."""
    return k * world_size + rank if gather else rank * plan.accumulation + k


# ---------------------------------------------------------------- the training set --------------
QUERY_SCHEMA = {"query_id": pl.String, "text": pl.String, "positives": pl.List(pl.String),
                "negatives": pl.List(pl.String)}


def training_queries(queries: Path, qrels: Path, negative_files: list[Path],
                     settings: FinetuneSettings, seed: int, corpus: Path | None = None,
                     sample_among: list[Path] | None = None
                     ) -> tuple[pl.DataFrame, dict[str, int]]:
    """(the training queries, counts): `query_set`'s, less the example of a removal."""
    frame, counts, _ = query_set(queries, qrels, negative_files, settings, seed, corpus,
                                 sample_among)
    return frame, counts


def query_set(queries: Path, qrels: Path, negative_files: list[Path],
              settings: FinetuneSettings, seed: int, corpus: Path | None = None,
              sample_among: list[Path] | None = None
              ) -> tuple[pl.DataFrame, dict[str, int], Removed]:
    """(the training queries, counts, the negatives removed as positives): one row per query
    sorted by query_id (QUERY_SCHEMA: its text, its positives sorted, its negatives; null when it
    has none), in Arrow buffers, not Python objects: at MS MARCO scale (503k queries x 30
    negatives) a dict of lists of strings cost GBs per process (benchmarks/RESULTS.md, issue 17).

    Negatives of several files (e.g. mined + BM25) are unioned in file order, duplicates dropped,
    each file's list less the query's positives (`drop_positives`). With `corpus`, positives absent
    from it are dropped and queries left without one skipped, before the low-resource sample is
    drawn. With `sample_among` (the negatives files of the chain's stage 1: the rules pass them at
    every stage under queries_without_negatives=drop), the sample is drawn among the queries with a
    negative in them: stage 1 drops none of it, and the sample depends on the qrels, corpus and
    those files alone, so every stage of a chain trains the same N queries. Drawn among all queries,
    ~20% of an MS MARCO sample (judged queries without BM25 negatives) was dropped after it: a point
    labelled N trained ~0.8 N. Queries without negatives are then skipped (drop) from the sample;
    `train_queries_sampled`, the dropped count and `queries_outside_sample_pool` say how many.
    """
    with reading(queries, "a queries Parquet file"):
        texts = pl.read_parquet(queries, columns=["query_id", "text"])
    with reading(qrels, "a qrels Parquet file"):
        pairs = (pl.scan_parquet(qrels).filter(pl.col("relevance") > 0)
                 .select("query_id", "doc_id").unique().collect())
    missing = pairs.select("query_id").unique().join(texts, on="query_id", how="anti")
    if len(missing):
        examples = sorted(missing["query_id"].to_list())[:3]
        raise InputFileError(f"{qrels} names {len(missing)} queries absent from {queries} "
                             f"(e.g. {examples}); rebuild the dataset")
    counts = {"positives_absent_from_corpus": 0, "queries_without_positive_in_corpus": 0,
              "queries_without_negatives_dropped": 0}
    if corpus is not None:
        present = pairs.join(corpus_rows(corpus, pairs["doc_id"].unique(), ["doc_id"]),
                             on="doc_id", how="semi")
        counts["positives_absent_from_corpus"] = len(pairs) - len(present)
        counts["queries_without_positive_in_corpus"] = (pairs["query_id"].n_unique()
                                                        - present["query_id"].n_unique())
        pairs = present
    positives = pairs.group_by("query_id").agg(pl.col("doc_id").sort().alias("positives"))
    negatives, removed = merged_negatives(negative_files, positives)
    counts["positives_among_negatives_removed"] = removed.count
    frame = (positives.join(texts, on="query_id", how="left")
             .join(negatives, on="query_id", how="left")
             .sort("query_id").select(list(QUERY_SCHEMA)))
    if settings.train_queries is not None:
        pool = frame if sample_among is None else eligible_queries(frame, sample_among)
        counts["queries_outside_sample_pool"] = len(frame) - len(pool)
        frame = low_resource_sample(pool, settings.train_queries, settings.train_sample, seed)
        counts["train_queries_sampled"] = len(frame)
    if settings.queries_without_negatives == "drop":
        kept = frame.filter(pl.col("negatives").list.len().fill_null(0) > 0)
        counts["queries_without_negatives_dropped"] = len(frame) - len(kept)
        frame = kept
    return frame, counts, removed


def file_positive_ids(paths: list[Path]) -> pl.Series:
    """Every doc id the files' rows list as a positive, once."""
    ids = []
    for path in paths:
        with reading(path, "a negatives Parquet file"):
            ids.append(pl.read_parquet(path, columns=["positive_ids"])["positive_ids"].explode())
    return pl.concat(ids).drop_nulls().unique()


def eligible_queries(frame: pl.DataFrame, negative_files: list[Path]) -> pl.DataFrame:
    """The rows of `frame` (order kept) whose query has a negative in `negative_files` that is
    not one of its positives (`frame`'s)."""
    named, _ = merged_negatives(negative_files, frame.select("query_id", "positives"))
    named = named.filter(pl.col("negatives").list.len() > 0)
    return frame.filter(pl.col("query_id").is_in(named["query_id"].implode()))


def low_resource_sample(frame: pl.DataFrame, n: int, k: int, seed: int) -> pl.DataFrame:
    """Sample k of n queries (rows of `frame`, sorted by query id: every query with a positive in
    the corpus, or those of them stage 1 can train): the n whose keyed digest of (seed,
    "train-queries", n, k, query id) is least, ties by query id, in `frame`'s order; all of them
    when there are at most n. A function of (seed, n, k) and the pool's ids alone, under any numpy
    (a Generator's choice is not promised across versions) and whatever the pool's row order.
    Samples of different n or k are independent draws, not nested. Drawn before the filter on the
    stage's own negatives, which differ by stage: rows of a frame filtered by them would be other
    queries."""
    if n >= len(frame):
        return frame
    ids = frame["query_id"].to_list()
    order = sorted(range(len(ids)),
                   key=lambda i: (keyed_digest(seed, "train-queries", n, k, ids[i]), ids[i]))
    return frame[sorted(order[:n])]


@dataclasses.dataclass(frozen=True)
class Removed:
    """Negatives removed as their query's positives (`drop_positives`): how many list entries,
    and the first: (query id, doc id, file)."""

    count: int = 0
    example: tuple[str, str, str] | None = None

    def __add__(self, other: Removed) -> Removed:
        return Removed(self.count + other.count, self.example or other.example)


def keeps_own_positives(path: Path) -> bool:
    """Whether `path`'s manifest says it was mined with positives_removed: first_query (the BoW
    authors' miner, replicated on request: each query's own positives stay among its negatives,
    and training on them is what it replicates)."""
    manifest = artifacts.manifest_path(path)
    if not manifest.is_file():
        return False
    what = "a negatives file's manifest"
    read = artifacts.read_manifest(manifest, what)
    policy = expect_section(read, "params.policy", manifest, what)
    return policy.get("positives_removed") == "first_query"


def drop_positives(frame: pl.DataFrame, positives: pl.DataFrame, path: Path
                   ) -> tuple[pl.DataFrame, Removed]:
    """`frame` (query_id, negatives, ...; rows from `path`) with each row's negatives less its
    query's positives (`positives`: query_id, positives), and what was removed (the example:
    the least query id's first). A frame without such a negative (every file the workflow
    writes) comes back as it is."""
    # The positives lined up with the rows, the lists themselves not copied (GBs at MS MARCO).
    aligned = frame.select("query_id").join(positives.select("query_id", "positives"),
                                            on="query_id", how="left", maintain_order="left")
    lists = frame.select("query_id", "negatives").with_columns(aligned["positives"])
    hits = lists.select(pl.col("negatives").list.set_intersection("positives").list.len()
                        .fill_null(0) > 0).to_series()
    if not hits.any():
        return frame, Removed()
    rows = hits.arg_true()
    cleaned, count, example = [], 0, None
    for qid, negatives, own in lists[rows].iter_rows():
        own = set(own)
        kept = [d for d in negatives if d not in own]
        cleaned.append(kept)
        count += len(negatives) - len(kept)
        if example is None or qid < example[0]:
            example = (qid, next(d for d in negatives if d in own), str(path))
    update = pl.DataFrame({"_row": rows.cast(pl.UInt32), "negatives": cleaned},
                          schema={"_row": pl.UInt32, "negatives": pl.List(pl.String)})
    out = frame.with_row_index("_row").update(update, on="_row").drop("_row")
    return out, Removed(count, example)


def merged_negatives(paths: list[Path], positives: pl.DataFrame | None = None
                     ) -> tuple[pl.DataFrame, Removed]:
    """(query_id, negatives): each query's negatives of every file, in file order and then list
    order, each doc id once (its first place); with `positives` (query_id, positives), each
    file's lists less them (`drop_positives`, but for a file mined to keep them), and what was
    removed."""
    frames, removed = [], Removed()
    for path in paths:
        with reading(path, "a negatives Parquet file"):
            frame = pl.read_parquet(path, columns=["query_id", "negative_ids"]).rename(
                {"negative_ids": "negatives"})
        if positives is not None and not keeps_own_positives(path):
            frame, dropped = drop_positives(frame, positives, path)
            removed += dropped
        frames.append(frame.rename({"negatives": "negative_ids"}))
    if not frames:
        return (pl.DataFrame(schema={"query_id": pl.String, "negatives": pl.List(pl.String)}),
                removed)
    frame = pl.concat(frames)
    if frame["query_id"].n_unique() < len(frame):  # several files (or rows) name a query
        frame = frame.group_by("query_id", maintain_order=True).agg(
            pl.col("negative_ids").list.explode(keep_nulls=False, empty_as_null=False))
    # Deduplicated list by list: a frame-wide unique over (query, doc) pairs held ~200 bytes a
    # pair in hash tables (129 MB at 600k pairs; GBs at MS MARCO).
    return frame.select("query_id", pl.col("negative_ids").list.drop_nulls()
                        .list.unique(maintain_order=True).alias("negatives")), removed


def separate_examples(frame: pl.DataFrame, negative_files: list[Path],
                      file_positives: pl.Series | None = None, drop: bool = False
                      ) -> tuple[pl.DataFrame, dict[str, int], Removed]:
    """(the examples, their counts) of `frame`'s training queries when each negatives file is its
    own training set (negative_files: separate). The Tevatron / BoW authors' NQ and TriviaQA
    stage 2 trains on a folder holding the mined file and a copy of the BM25 one, a line per query
    in each: a query is two examples an epoch, each group's negatives from one file's list.

    A query with negatives in file i (its positives removed: `drop_positives`) is an example of
    file i, with id `query_id@i`; one with none in any file is one example `query_id@pad`,
    padded, or under `drop` (queries_without_negatives: drop) none, counted. The
    id keys the example's draws and order as a query id does in a union (distinct ids: the part
    after the last @ names the file); its text and positives are its query's, and with
    `file_positives` (the corpus's doc ids: example_positives file) also those of the file's
    row(s) for it that the corpus holds, after the query's, in the file's order: the BoW authors'
    mined QA file lists every top-100 passage holding an answer as a positive
    (mining.answer_positives). QUERY_SCHEMA's rows, sorted by id; the counts say how many
    examples each file gave (and how many queries `drop` left out), the Removed what the files'
    lists lost (the example's positives, those its file lists among them)."""
    queries = frame.select("query_id", "text", "positives")
    parts, counts, removed, named_ids = [], {}, Removed(), []
    for i, path in enumerate(negative_files):
        named, _ = merged_negatives([path])
        part = queries.join(named, on="query_id", how="inner")
        if file_positives is not None:
            part = with_file_positives(part, path, file_positives)
        if not keeps_own_positives(path):
            part, dropped = drop_positives(part, part, path)
            removed += dropped
        part = part.filter(pl.col("negatives").list.len() > 0)
        counts[f"examples_of_negatives{i}"] = len(part)
        named_ids.append(part["query_id"])
        parts.append(part.with_columns(pl.col("query_id") + f"@{i}"))
    # Named by no file: without negatives in the frame, or (example_positives: file) left none.
    named = pl.concat([pl.Series("query_id", [], pl.String), *named_ids]).unique()
    padded = frame.filter(~pl.col("query_id").is_in(named.implode()))
    if drop:
        counts["queries_without_negatives_dropped"] = len(padded)
        padded = padded.clear()
    parts.append(padded.with_columns(pl.col("query_id") + "@pad",
                                     pl.lit(None, dtype=pl.List(pl.String)).alias("negatives")))
    examples = (pl.concat([part.select(list(QUERY_SCHEMA)).cast(QUERY_SCHEMA) for part in parts])
                .sort("query_id"))
    return examples, counts | {"train_examples": len(examples)}, removed


def with_file_positives(part: pl.DataFrame, path: Path, corpus_ids: pl.Series) -> pl.DataFrame:
    """`part` (query_id, ..., positives) with each query's positives followed by those `path`'s
    rows list for it (positive_ids) that are in `corpus_ids` and not yet among them."""
    with reading(path, "a negatives Parquet file"):
        listed = pl.read_parquet(path, columns=["query_id", "positive_ids"])
    extra = (listed.explode("positive_ids").drop_nulls("positive_ids")
             .filter(pl.col("positive_ids").is_in(corpus_ids.implode()))
             .group_by("query_id", maintain_order=True).agg(pl.col("positive_ids")))
    joined = part.join(extra, on="query_id", how="left")
    return joined.with_columns(
        pl.concat_list("positives", pl.col("positive_ids").fill_null([]))
        .list.unique(maintain_order=True).alias("positives")).drop("positive_ids")


def corpus_rows(corpus: Path, doc_ids: pl.Series, columns: list[str]) -> pl.DataFrame:
    """`columns` of the corpus rows whose doc_id is in `doc_ids` (scanned, not loaded whole)."""
    wanted = doc_ids.cast(pl.String).implode()
    with reading(corpus, "a corpus Parquet file"):  # a filter streams; a semi-join held it all
        return pl.scan_parquet(corpus).select(columns).filter(pl.col("doc_id").is_in(wanted)).collect()


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
                 group_size: int, seed: int, epoch: int, sampling: str = "draw",
                 own_id: str | None = None) -> list[str]:
    """[positive, n-1 negatives] for one query in one epoch, from (seed, epoch, query id) alone.

    draw: the positive and the negatives are drawn afresh each epoch. cycle (Tevatron's
    TrainDataset, kept by bowdpr): the positive is the (start + epoch)-th of the query's positives
    (cyclically, from a start drawn from (seed, query id)), and the negatives, at least n-1 of
    them, a fixed per-query shuffle of the list read from place epoch x (n-1) on, cyclically, so
    that every negative trains once before any trains twice. Too few negatives (either way):
    sampled with replacement; none at all: distinct random corpus documents (`fallback`,
    positives excluded, and `own_id`: the query's own id where the dataset's exclude_query_id
    makes it its document, as mining excludes it). Tevatron's TrainDataset fills a short list
    from its own negatives with replacement, as here, and has no padding.
    """
    rng = rng_for(seed, "group", epoch, qid)
    need = group_size - 1
    if sampling == "cycle":
        start = int(rng_for(seed, "cycle-positive", qid).integers(len(positives)))
        group = [positives[(start + epoch) % len(positives)]]
        if len(negatives) >= need > 0:
            order = rng_for(seed, "cycle-negatives", qid).permutation(len(negatives))
            offset = epoch * need % len(negatives)
            return group + [negatives[order[(offset + j) % len(negatives)]]
                            for j in range(need)]
    else:
        group = [positives[rng.integers(len(positives))]]
    pool = negatives
    if not pool:
        excluded = {*positives, *([] if own_id is None else [own_id])}
        drawn = (fallback[i] for i in rng.choice(len(fallback), 4 * group_size))
        # Each once: the draws are with replacement, and a group's negatives should be distinct.
        pool = list(dict.fromkeys(d for d in drawn if d not in excluded))
        if not pool:  # the draw hit positives only (a tiny corpus): the whole pool less them
            pool = [d for d in fallback if d not in excluded]
        if not pool and group_size > 1:
            raise ValueError(f"query {qid} has no negatives and the corpus holds only its "
                             f"positives (or own id) to pad its group with; use finetune."
                             f"queries_without_negatives: drop, or a larger corpus")
    if need:
        picks = rng.choice(len(pool), size=need, replace=len(pool) < need)
        group.extend(pool[i] for i in picks)
    return group


@functools.lru_cache(maxsize=2)
def epoch_order(num_queries: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's query order (read-only): made once an epoch, not once a step (a permutation of
    MS MARCO's 503k queries costs ~6 ms, a fifth of a step on 8 GPUs)."""
    order = rng_for(seed, "order", epoch).permutation(num_queries)
    order.setflags(write=False)
    return order


@dataclasses.dataclass(frozen=True)
class TrainingSet:
    """Everything a step reads: the training queries (`training_queries`' frame: ids sorted, texts,
    positives, negatives), the padding pool, the passages (`passages.PassageStore`, attached once
    the main process has written them: `with_passages`), and the counts of what was dropped or
    padded."""

    queries: pl.DataFrame
    padding: list[str]
    counts: dict[str, int]
    passages: PassageStore | None = None
    query_count: int | None = None  # the queries, when examples (separate_examples) outnumber them
    sampling: str = "draw"          # finetune.group_sampling (sample_group)
    exclude_self: bool = False      # the dataset's query-id rule: padding skips the query's own id
    # The first negative removed as its query's positive (query id, doc id, file); None: none.
    removed_example: tuple[str, str, str] | None = None

    def __post_init__(self):
        ids = self.queries["query_id"]
        if not ids.is_sorted() or ids.n_unique() != len(ids):  # micro_batch's binary search
            raise ValueError("training queries must be unique and sorted by query_id")

    @property
    def query_ids(self) -> pl.Series:
        """The examples' ids: the query ids, or separate_examples' ids."""
        return self.queries["query_id"]

    @property
    def num_queries(self) -> int:
        """The training queries (each one example or more)."""
        return len(self.queries) if self.query_count is None else self.query_count

    def needed_passages(self) -> pl.Series:
        """Every passage a group can draw: positives, negatives and the padding pool, once each."""
        return pl.concat([self.queries["positives"].explode(), self.queries["negatives"].explode(),
                          pl.Series(self.padding, dtype=pl.String)]).drop_nulls().unique()

    def own_id(self, example_id: str) -> str | None:
        """The query id padding must not draw (exclude_self), else None: a separate example's
        (`separate_examples`: query_id@file) is its query's."""
        if not self.exclude_self:
            return None
        return example_id if self.query_count is None else example_id.rsplit("@", 1)[0]

    def with_passages(self, store: PassageStore) -> TrainingSet:
        return dataclasses.replace(self, passages=store)

    def micro_batch(self, query_ids: list[str], group_size: int, seed: int, epoch: int
                    ) -> tuple[list[str], list[str], list[str]]:
        """(query texts, passage titles, passage texts) of a micro-batch, group by group."""
        # Series and frame methods, not expressions: an expression is a query plan per call.
        rows = self.query_ids.search_sorted(pl.Series(query_ids, dtype=pl.String)).to_numpy()
        batch = self.queries[np.minimum(rows, len(self.queries) - 1)]
        found = batch["query_id"].to_list()
        if found != list(query_ids):
            raise KeyError(f"not training queries: {sorted(set(query_ids) - set(found))[:3]}")
        groups = [sample_group(q, positives, negatives or [], self.padding, group_size, seed, epoch,
                               self.sampling, self.own_id(q))
                  for q, positives, negatives in zip(found, batch["positives"].to_list(),
                                                     batch["negatives"].to_list())]
        titles, texts = self.passages.lookup([d for group in groups for d in group])
        return batch["text"].to_list(), titles, texts


def load_training_set(queries: Path, qrels: Path, corpus: Path, negative_files: list[Path],
                      settings: FinetuneSettings, seed: int,
                      sample_among: list[Path] | None = None) -> TrainingSet:
    """The training set of one stage, without passage texts: the main process writes the ones
    training can use with `passages.write_passages(corpus, set.needed_passages(), file)` and every
    process attaches them (`with_passages`), so no process holds them in its own memory."""
    frame, counts, removed = query_set(queries, qrels, negative_files, settings, seed,
                                       corpus=corpus, sample_among=sample_among)
    query_count = None
    if settings.negative_files == "separate":
        listed = None
        if settings.example_positives == "file":
            listed = corpus_rows(corpus, file_positive_ids(negative_files), ["doc_id"])["doc_id"]
        drop = settings.queries_without_negatives == "drop"
        frame_queries = len(frame)
        frame, examples, removed = separate_examples(frame, negative_files, listed, drop)
        # The examples' lists are what trains: their removals are the ones counted.
        counts["positives_among_negatives_removed"] = removed.count
        left_out = examples.pop("queries_without_negatives_dropped", 0)
        counts["queries_without_negatives_dropped"] += left_out
        query_count = frame_queries - left_out
        counts |= examples
    # Left after a drop policy: none; after pad: their groups come from the padding pool.
    no_negatives = int(frame["negatives"].list.len().fill_null(0).eq(0).sum())
    counts["queries_without_negatives_padded"] = no_negatives
    fallback = padding_pool(corpus, seed) if no_negatives else []
    return TrainingSet(queries=frame, padding=fallback, counts=counts, query_count=query_count,
                       sampling=settings.group_sampling, removed_example=removed.example,
                       exclude_self=settings.exclude_self)
