"""Build, save and search a FAISS index over encoded corpus shards.

The saved folder is what Pyserini's `FaissSearcher` loads (`index` = a FAISS index file, `docid` =
one doc id per line, in index order), so our models can be searched with tools users know.
Exact inner product (`flat`) is the default: it is what the papers' miners used and, on a corpus
the size of MS MARCO, it is one GEMM per query batch. IVF / HNSW / IVF-PQ trade exactness for
memory and speed on large corpora. faiss-gpu is used when it is installed and a GPU is visible.

The build reads the shards memory-mapped and adds them a block at a time into storage sized up
front (flat codes, HNSW's graph, each IVF list), so its peak is the index plus one block (not
float32 copies of the corpus beside it, nor a doubled buffer); IVF kinds train on a uniform
sample of faiss's own size.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import faiss
import numpy as np
import pyarrow as pa
from tqdm import tqdm

from . import artifacts
from .config import ConfigError, refuse_unknown, stage_parser
from .contracts.embeddings import BLOCK_ROWS, float32_blocks, open_shards
from .errors import InputFileError, command, reading

log = logging.getLogger(__name__)

# Index knobs (the `mining.index` config block); defaults = exact search.
INDEX_DEFAULTS: dict[str, Any] = {
    "type": "flat",      # flat | ivf | hnsw | ivfpq
    "nlist": 4096,       # IVF cells (ivf, ivfpq)
    "nprobe": 64,        # cells visited per query (ivf, ivfpq)
    "hnsw_m": 32,        # graph degree (hnsw)
    "ef_search": 256,    # HNSW search breadth
    "pq_m": 64,          # PQ sub-quantisers (ivfpq); must divide the dimension
    "use_gpu": "auto",   # auto | never
}


def index_settings(config: dict[str, Any] | None) -> dict[str, Any]:
    config = config or {}
    refuse_unknown(config, tuple(INDEX_DEFAULTS), "faiss_index (mining.index)")
    return {**INDEX_DEFAULTS, **config}


# k-means (IVF) and PQ learn from at most this many points per centroid; faiss samples more down to
# it anyway, so an index over a large corpus trains on a sample of this size, drawn from the shards.
POINTS_PER_CENTROID = 256


def empty_index(dim: int, rows: int, knobs: dict[str, Any]) -> faiss.Index:
    """An inner-product index of `knobs`' type for `rows` vectors of `dim`, before training."""
    kind = knobs["type"]
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, knobs["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = knobs["ef_search"]
        return index
    if kind in ("ivf", "ivfpq"):
        # Fewer cells than 39 points per cell makes k-means warn and the index useless.
        nlist = max(1, min(knobs["nlist"], rows // 39))
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        else:
            if dim % knobs["pq_m"]:
                raise ConfigError(f"pq_m={knobs['pq_m']} does not divide the dimension {dim}; "
                                  "choose a divisor of it in mining.index.pq_m")
            index = faiss.IndexIVFPQ(quantizer, dim, nlist, knobs["pq_m"], 8,
                                     faiss.METRIC_INNER_PRODUCT)
        index.nprobe = knobs["nprobe"]
        if nlist < knobs["nlist"]:
            log.info("nlist %d cut to %d for %d vectors (at least 39 a cell)", knobs["nlist"],
                     nlist, rows)
        if index.nprobe >= nlist:
            # Then every cell is visited: an exact search at IVF's cost, not the trade asked for.
            log.warning("nprobe %d >= nlist %d: every IVF cell is searched; lower nprobe in "
                        "mining.index for an approximate search", index.nprobe, nlist)
        return index
    raise ConfigError(f"index type '{kind}' is unknown; use flat, ivf, hnsw or ivfpq")


def training_size(index: faiss.Index) -> int:
    """How many vectors `index` needs to train: 0 when it needs none."""
    if index.is_trained:
        return 0
    centroids = faiss.extract_index_ivf(index).nlist
    if isinstance(index, faiss.IndexIVFPQ):
        centroids = max(centroids, 1 << index.pq.nbits)  # each PQ codebook is a k-means too
    return POINTS_PER_CENTROID * centroids


def training_sample(shards: Sequence[np.ndarray], size: int, seed: int = 0) -> np.ndarray:
    """Every vector when the shards hold at most `size`, in order; otherwise `size` of them drawn
    uniformly without replacement (float32): what k-means would have sampled from the whole."""
    total = sum(len(s) for s in shards)
    if total <= size:
        return np.concatenate([np.asarray(s, dtype=np.float32) for s in shards])
    chosen = np.sort(np.random.default_rng(seed).choice(total, size, replace=False))
    starts = np.cumsum([0] + [len(s) for s in shards])
    return np.concatenate([
        np.asarray(shard[chosen[(chosen >= lo) & (chosen < hi)] - lo], dtype=np.float32)
        for shard, lo, hi in zip(shards, starts[:-1], starts[1:])
    ])  # fmt: skip


def _keep_capacity(vector, size: int) -> None:
    """Give a faiss vector room for `size` elements without changing its length: resizing down
    keeps the capacity, so later appends copy in place instead of doubling it (a doubling holds
    the old and the new buffer at once)."""
    length = vector.size()
    if size > length:
        vector.resize(size)
        vector.resize(length)


def reserve(index: faiss.Index, rows: int, cells: np.ndarray | None = None) -> None:
    """Room for `rows` more vectors before they are added a block at a time: a flat (or HNSW's
    flat) storage at its final size; HNSW's graph at its expected size (2M links a vector on
    level 0, and M on the levels above, which hold 1/M, 1/M^2, ... of the vectors: < 2M + 2 in
    all); each IVF list at its final size, from `cells`, the vectors' cells (`assign`)."""
    if isinstance(index, faiss.IndexHNSW):
        graph = index.hnsw
        links = 2 * graph.nb_neighbors(1) + 2  # nb_neighbors(1) = M
        _keep_capacity(graph.neighbors, graph.neighbors.size() + rows * links)
        _keep_capacity(graph.levels, graph.levels.size() + rows)
        _keep_capacity(graph.offsets, graph.offsets.size() + rows)
        index = faiss.downcast_index(index.storage)
    if isinstance(index, faiss.IndexFlatCodes):
        _keep_capacity(index.codes, (index.ntotal + rows) * index.code_size)
    if cells is not None:
        ivf = faiss.extract_index_ivf(index)
        lists = faiss.downcast_InvertedLists(ivf.invlists)
        for cell, count in enumerate(np.bincount(cells, minlength=ivf.nlist)):
            if count:
                held = lists.list_size(cell)
                lists.resize(cell, held + int(count))
                lists.resize(cell, held)


def assign(index: faiss.Index, shards: Sequence[np.ndarray]) -> np.ndarray | None:
    """An IVF index's cell for every vector (its coarse quantizer, a block at a time), which
    `fill` hands to `add_core` as faiss's own `add` would; None for the other kinds."""
    if not isinstance(index, faiss.IndexIVF):
        return None
    quantizer = index.quantizer
    return np.concatenate([quantizer.assign(block, 1).ravel() for block in float32_blocks(shards)]
                          or [np.zeros(0, np.int64)])


def add_block(index: faiss.Index, block: np.ndarray, cells: np.ndarray | None) -> None:
    """Add one float32 block; an IVF index gets the block's cells from `assign` (`add_core`:
    what IndexIVF.add does after assigning them itself)."""
    if cells is None:
        index.add(block)
    else:
        cells = np.ascontiguousarray(cells)
        index.add_core(len(block), faiss.swig_ptr(block), None, faiss.swig_ptr(cells))


def fill(index: faiss.Index, shards: Sequence[np.ndarray]) -> faiss.Index:
    """Train `index` if it must be, then add the shards' vectors a block at a time into storage
    reserved for all of them."""
    if size := training_size(index):
        index.train(training_sample(shards, size))
    total = sum(len(s) for s in shards)
    cells = assign(index, shards)
    reserve(index, total, cells)
    done = 0
    with tqdm(total=total, desc="index", unit="vec", mininterval=10,
              disable=total <= 10 * BLOCK_ROWS) as bar:
        for block in float32_blocks(shards):
            add_block(index, block, None if cells is None else cells[done:done + len(block)])
            done += len(block)
            bar.update(len(block))
            del block  # before the next one is read: one block held at a time
    return index


def build(vectors: np.ndarray, config: dict[str, Any] | None = None) -> faiss.Index:
    """An inner-product index over `vectors` (row i = doc i)."""
    knobs = index_settings(config)
    return fill(empty_index(vectors.shape[1], len(vectors), knobs), [vectors])


# The most neighbours faiss-gpu selects per query (its k-selection kernels; faiss issue 2103).
GPU_MAX_K = 2048
# The index types faiss-gpu's cloner holds (GpuCloner.cpp). One GPU's refuses any other; faiss's
# own several-GPU cloner (ToGpuClonerMultiple, which replicate_on_gpus replaces) copies any other
# on the CPU without a word.
GPU_TYPES = (faiss.IndexFlat, faiss.IndexIVFFlat, faiss.IndexIVFScalarQuantizer, faiss.IndexIVFPQ)


def to_search_device(index: faiss.Index, use_gpu: str = "auto", k: int = 0) -> faiss.Index:
    """Move the index to all visible GPUs when faiss-gpu is installed; otherwise keep it on CPU.

    `k`: the neighbours each query will ask for. The index stays on the CPU, with a warning that
    says why, where faiss-gpu cannot search it: more than GPU_MAX_K neighbours, an index type it
    does not hold (HNSW: not offered to it, which names the reason plainly; faiss's own
    several-GPU cloner copied one on the CPU, read whole from the mapped file, without an
    error), or what it reports as it converts (PQ
    layouts beyond its shared memory, nprobe above GPU_MAX_K, too little GPU memory). These would
    otherwise fail the job after the index and the queries are loaded, or search on the CPU from
    a second copy of the index while the log said GPUs."""
    if (use_gpu == "never" or not hasattr(faiss, "StandardGpuResources")
            or faiss.get_num_gpus() == 0):
        return index
    if k > GPU_MAX_K:
        log.warning("searching on CPU: %d neighbours a query, faiss-gpu selects at most %d "
                    "(set use_gpu: never to silence this)", k, GPU_MAX_K)
        return index
    if not isinstance(index, GPU_TYPES):
        log.warning("searching on CPU: faiss-gpu cannot hold this %s (set use_gpu: never to "
                    "silence this)", type(index).__name__)
        return index
    try:
        moved = replicate_on_gpus(index, faiss.get_num_gpus())
    except RuntimeError as error:  # faiss's C++ exceptions arrive as RuntimeError
        log.warning("searching on CPU: faiss-gpu cannot hold this %s (%s)",
                    type(index).__name__, gpu_refusal(error))
        return index
    log.info("searching on %d GPU(s)", faiss.get_num_gpus())
    return moved


def gpu_refusal(error: RuntimeError) -> str:
    """faiss-gpu's reason for refusing an index, for the log: without the C++ function, source
    line and failed condition faiss puts first (some 200 characters, which pushed the end of the
    reason past the 300-character cut: "cudaMalloc error out of memory" on a full GPU); where
    faiss suggests float16 lookup tables, why they are not used."""
    reason = str(error).strip().splitlines()[-1]
    reason = re.sub(r"^Error in .*? at \S+:\d+: ", "", reason)
    reason = re.sub(r"^Error: '.*?' failed: ", "", reason)[:300]
    if "useFloat16LookupTables" in reason:
        reason += ("; float16 lookup tables are not used, since they would change the scores: "
                   "lower pq_m in mining.index to search this index on the GPU")
    return reason


def replicate_on_gpus(index: faiss.Index, gpus: int) -> faiss.Index:
    """A copy of `index` on each of GPUs 0..gpus-1, searched together (an IndexReplicas; the copy
    itself on one GPU): what faiss.index_cpu_to_all_gpus builds, made here a GPU at a time.

    faiss's multi-GPU cloner (ToGpuClonerMultiple) adds each copy to an IndexReplicas it holds by
    a bare pointer: when a later copy fails (out of memory on GPU 1), neither that IndexReplicas
    nor the copies already made are ever freed, so the earlier GPUs kept a whole index each (and
    their resources' memory) while the search fell back to the CPU. Here a failure releases them
    before it is raised."""
    copies = []
    try:
        for gpu in range(gpus):
            # A GPU index holds its resources itself (a shared_ptr), as faiss's own wrapper assumes.
            copies.append(faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), gpu, index))
    except BaseException:
        copies.clear()  # the traceback keeps this frame's list alive until the error is handled
        raise
    if gpus == 1:
        return copies[0]
    replicas = faiss.IndexReplicas()
    for copy in copies:
        replicas.addIndex(copy)  # faiss's wrapper keeps each copy alive with the replicas
    return replicas


def save(folder: Path, index: faiss.Index, doc_ids: Sequence[str]) -> None:
    """Pyserini's FaissSearcher layout: `folder/index` and `folder/docid` (one id per line)."""
    if index.ntotal != len(doc_ids):
        raise ValueError(f"index holds {index.ntotal} vectors but {len(doc_ids)} doc ids were given")
    if any("\n" in d for d in doc_ids):
        raise InputFileError("a doc id contains a newline; the docid file holds one id per line")
    folder.mkdir(parents=True, exist_ok=True)
    with artifacts.atomic_path(folder / "index") as tmp:
        faiss.write_index(index, str(tmp))
    with artifacts.atomic_path(folder / "docid") as tmp:
        tmp.write_text("".join(f"{d}\n" for d in doc_ids))


def load(folder: Path) -> tuple[faiss.Index, pa.LargeStringArray]:
    """The index, its vectors memory-mapped from the file (read-only), and its doc ids.

    Mapped, not read: a search job starts without reading the index (27 GB for MS MARCO passages
    at 768 dimensions) into memory of its own; its pages are the page cache's, shared by the jobs
    that search one index on a node and reclaimable, and a GPU search copies them to the GPU. The
    doc ids are one Arrow array (row -> id: `ids.take(rows)`), not a Python string each (~600 MB
    for MS MARCO's 8.8M)."""
    with reading(folder / "index", "a FAISS index"):
        index = faiss.read_index(str(folder / "index"), faiss.IO_FLAG_MMAP_IFC)
    doc_ids = read_doc_ids(folder / "docid")
    if index.ntotal != len(doc_ids):
        raise InputFileError(f"{folder}: index holds {index.ntotal} vectors but docid has "
                             f"{len(doc_ids)} lines; rebuild the folder with build_dense_index")
    return index, doc_ids


def read_doc_ids(path: Path) -> pa.LargeStringArray:
    """The lines of a `docid` file (one id per line, as `save` writes it) as one Arrow array,
    built from the file's bytes without a Python object per id."""
    with reading(path, "a docid file"):
        raw = np.fromfile(path, dtype=np.uint8)
        if len(raw) and raw[-1] != ord("\n"):  # a last line without its newline
            raw = np.append(raw, np.uint8(ord("\n")))
        ends = np.flatnonzero(raw == ord("\n"))
        lengths = np.diff(ends, prepend=-1) - 1
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets),
                                               pa.py_buffer(np.delete(raw, ends)))
        ids.validate(full=True)  # UTF-8, as save wrote it
    return ids


# The CPU index types whose search multiplies queries by vectors with BLAS (flat; IVF's coarse
# quantizer is a flat index), which `search` runs a FAISS call at a time on one OpenMP thread (and
# so one BLAS thread: faiss-cpu's bundled OpenBLAS is its OpenMP build), calls side by side. HNSW
# scores a query at a time (OpenMP over queries: the thread count changes nothing) and GPU indexes
# (and their IndexReplicas) are none of these: they are searched as before, a call after another.
ONE_THREAD_TYPES = (faiss.IndexFlat, faiss.IndexIVF)


def _one_openmp_thread() -> None:
    """A pool thread's own OpenMP thread count (libgomp keeps one per thread: the caller's is
    left as it is)."""
    faiss.omp_set_num_threads(1)


# Queries a FAISS call in `search` (part of what a flat search writes: see its docstring).
SEARCH_BATCH = 4096


def calls_at_once(index: faiss.Index) -> int:
    """The FAISS calls `search` runs side by side on `index`: the calling thread's OpenMP count
    on the CPU types it runs one thread a call (ONE_THREAD_TYPES), one otherwise."""
    return max(1, faiss.omp_get_max_threads()) if isinstance(index, ONE_THREAD_TYPES) else 1


def search(index: faiss.Index, queries: np.ndarray, depth: int,
           batch_size: int = SEARCH_BATCH) -> tuple[np.ndarray, np.ndarray]:
    """Top-`depth` (scores, rows) per query, best first. `depth` is clipped to the index's size;
    rows are -1 where an approximate index found fewer neighbours than that (IVF / IVF-PQ see
    only the vectors of their `nprobe` cells), which `dense_search.rank` drops. Each batch's
    results are written into the returned arrays (D= and I=): a batch's own arrays, copied in,
    were 12 B a query and neighbour more, two batches' worth alive at once. `batch_size` is part
    of the results: a flat search's scores round differently with the queries in a FAISS call
    (one BLAS product), so another size, or a `mine.QUERY_BATCH` that is not a multiple of it,
    moves near ties and changes the mined files, though a smaller call holds less
    (benchmarks/RESULTS.md, "Where depth 1000's peak comes from").

    The thread count is not: on the CPU each FAISS call runs on one OpenMP / BLAS thread (a
    product split over threads rounds otherwise), and the calling thread's OpenMP count
    (OMP_NUM_THREADS: the job's threads) of them run side by side, FAISS releasing the GIL. A
    search at any thread count writes what a one-thread search writes; each call running holds
    its own k-selection (2 x depth candidates a query for depth >= 100, 12 B each) and BLAS
    block (17 MB)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    depth = min(depth, index.ntotal)
    scores = np.empty((len(queries), depth), dtype=np.float32)
    rows = np.empty((len(queries), depth), dtype=np.int64)
    starts = range(0, len(queries), batch_size)

    def call(start: int) -> None:
        end = start + batch_size
        index.search(queries[start:end], depth, D=scores[start:end], I=rows[start:end])

    progress = dict(total=len(starts), desc="search", mininterval=10,
                    disable=len(queries) <= batch_size)
    if not isinstance(index, ONE_THREAD_TYPES):
        for start in tqdm(starts, **progress):
            call(start)
        return scores, rows
    workers = max(1, min(calls_at_once(index), len(starts)))
    with ThreadPoolExecutor(workers, initializer=_one_openmp_thread) as pool:
        for _ in tqdm(pool.map(call, starts), **progress):
            pass
    return scores, rows


def search_knobs(index: faiss.Index) -> dict[str, Any]:
    """What bounds the neighbours a search of `index` can find: its type and size, and the nlist
    and nprobe of an IVF index or the efSearch of an HNSW one, as they are (not as asked)."""
    knobs: dict[str, Any] = {"index": type(index).__name__, "ntotal": int(index.ntotal)}
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        knobs |= {"nlist": int(ivf.nlist), "nprobe": int(ivf.nprobe)}
    if isinstance(index, faiss.IndexHNSW):
        knobs["ef_search"] = int(index.hnsw.efSearch)
    return knobs


def search_limits(index: faiss.Index) -> dict[str, Any]:
    """search_knobs, and whether a search of `index` is exact (flat: every vector is scored, so
    a query gets min(k, ntotal) neighbours and fewer than asked means a smaller corpus, never
    too few nprobe cells or too narrow an efSearch). Of the index as loaded: faiss names a GPU
    copy's type otherwise and reports no nprobe for it."""
    return {**search_knobs(index), "exact": isinstance(index, faiss.IndexFlat)}


def index_shards(npy: list[Path], ids: list[Path], out: Path, config: dict[str, Any]) -> dict:
    """Build the index over encoded shards and save it in Pyserini's layout, with a manifest."""
    params = index_settings(config)  # a bad slice fails before the shards are read
    shards, doc_ids = open_shards(npy, ids)  # memory-mapped: the index is the only full copy held
    if len(set(doc_ids)) != len(doc_ids):
        raise InputFileError(f"duplicate doc ids across {ids}; the corpus must have unique doc_id")
    dim = shards[0].shape[1]
    index = fill(empty_index(dim, len(doc_ids), params), shards)
    # The settings as built (nlist is cut to the corpus), not as asked: params keep those.
    built = {k: v for k, v in search_knobs(index).items() if k != "ntotal"}
    stats = {"documents": len(doc_ids), "dim": int(dim), "faiss": faiss.__version__, **built}
    with artifacts.atomic_dir(out) as tmp:
        save(tmp, index, doc_ids)
        artifacts.write_manifest(tmp / "manifest.json", stage="build_dense_index",
                                 params=params,
                                 inputs={f"shard{i}": p for i, p in enumerate(npy)}, stats=stats)
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--npy", type=Path, nargs="+", required=True, help="encoded shards, in order")
    parser.add_argument("--ids", type=Path, nargs="+", required=True, help="their doc id files")
    parser.add_argument("--out", type=Path, required=True, help="folder for `index` + `docid`")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stats = index_shards(args.npy, args.ids, args.out, args.config)
    log.info("indexed %s -> %s", stats, args.out)


if __name__ == "__main__":
    main()
