"""Chunk/span shards -> micro-batches: contract checks on bad inputs, deterministic order, the same
micro-batches for any number of processes, padding."""

import os
import shutil
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pretrain_fixtures import ROOT, SPAN_SCHEMA, build_corpus, tokenizer
from retrieval_pretraining import artifacts, wordpiece
from retrieval_pretraining.pretrain import data as pdata
from retrieval_pretraining.pretrain import store as pstore


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"), docs=20)


@pytest.fixture(scope="module")
def vocab():
    return pdata.Vocab.from_tokenizer(tokenizer())


def _rewrite_spans(path, out, edit):
    table = pq.read_table(path).to_pylist()
    edit(table)
    artifacts.write_parquet(out, pa.Table.from_pylist(table, SPAN_SCHEMA), SPAN_SCHEMA)
    return out


def test_valid_shards_pass_and_spans_are_kept(corpus, tmp_path):
    chunks, spans = corpus
    store = pstore.ChunkStore(pstore.prepare_store(chunks, spans, tmp_path))
    expected = sum(pq.read_metadata(p).num_rows for p in chunks)
    assert len(store) == expected and store.has_spans
    first = pq.read_table(spans[0]).to_pylist()[0]
    assert store.get("span_start", 0).tolist() == first["span_start"]


def test_store_reads_every_row_of_every_file_without_copying(corpus, tmp_path, monkeypatch):
    chunks, spans = corpus
    monkeypatch.setattr(pstore, "BATCH_ROWS", 7)  # files of several record batches, as at scale
    paths = pstore.prepare_store(chunks, spans, tmp_path)
    allocated = pa.total_allocated_bytes()
    store = pstore.ChunkStore(paths)
    # Views on the memory-mapped files: no Arrow buffer was allocated (concatenating would copy all).
    # <=, not ==: an earlier test's buffers may be freed meanwhile (the pool counts every live one).
    assert pa.total_allocated_bytes() <= allocated
    # ... and no NumPy copy either: every column's arrays are views (a copy owns its data).
    arrays = [a for parts in store._chunks.cols.values() for pair in parts for a in pair]
    arrays += store._chunks.chunk_ids
    assert arrays and not any(a.flags.owndata for a in arrays)
    rows = [r | s for c, sp in zip(chunks, spans)
            for r, s in zip(pq.read_table(c).to_pylist(), pq.read_table(sp).to_pylist())]
    assert len(store) == len(rows) and len(chunks) == 2 and len(store._chunks.starts) > 4
    assert store.chunk_ids(np.arange(len(rows))[::-1]).tolist() == [r["chunk_id"] for r in rows[::-1]]
    for i, row in enumerate(rows):  # global row i = file order, then row order
        for name in ("input_ids", "word_starts", "span_start", "span_end", "granularity"):
            assert store.get(name, i).tolist() == row[name], (i, name)
    assert store.max_spans == max(len(r["span_start"]) for r in rows)


def test_models_on_one_corpus_share_its_chunk_files_and_a_span_set_adds_only_spans(corpus,
                                                                                     tmp_path):
    """A store with spans and one without, in one folder: the same chunk files (so the paper's
    seven models on Wikipedia convert its chunks once), and span files a fraction of their size."""
    chunks, spans = corpus
    with_spans = pstore.prepare_store(chunks, spans, tmp_path)
    without = pstore.prepare_store(chunks, None, tmp_path)
    assert [f.chunks for f in with_spans] == [f.chunks for f in without]
    assert all(f.spans is None for f in without) and len(list(tmp_path.iterdir())) == 4
    for file in with_spans:
        assert file.spans.stat().st_size < file.chunks.stat().st_size / 2
    assert pstore.ChunkStore(without).get("input_ids", 5).tolist() == \
        pstore.ChunkStore(with_spans).get("input_ids", 5).tolist()
    with pytest.raises(pdata.DataError, match="no span files"):
        pstore.ChunkStore(without).get("span_start", 0)


def _count_conversions(monkeypatch) -> list[Path]:
    written = []
    for name in ("write_chunk_file", "write_span_file"):
        original = getattr(pstore, name)
        monkeypatch.setattr(pstore, name, lambda *a, _f=original: written.append(Path(a[-1]))
                            or _f(*a))
    return written


def test_a_job_s_processes_split_the_conversion_and_wait_for_each_other(corpus, tmp_path,
                                                                         monkeypatch):
    """prepare_store's `share`: each of a job's processes converts its part of the files, no file
    twice; each then waits for the others' files with wait_for_store, which converts those
    nobody has claimed (here: rank 1 has not started yet)."""
    chunks, spans = corpus
    written = _count_conversions(monkeypatch)
    first = pstore.prepare_store(chunks, spans, tmp_path, share=(0, 2))
    assert len(written) == 2  # of the 4 files (2 chunk files, 2 span files)
    pstore.wait_for_store(first, timeout_s=5)
    assert pstore.prepare_store(chunks, spans, tmp_path, share=(1, 2)) == first
    pstore.wait_for_store(first, timeout_s=1)
    assert sorted(written) == sorted(p for f in first for p in f.paths())
    assert pstore.prepare_store(chunks, spans, tmp_path) == first and len(written) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for f in first
                                                                for p in f.paths())


def test_span_outside_its_chunk_is_rejected_naming_row(corpus, tmp_path):
    chunks, spans = corpus

    def break_row_3(rows):
        rows[3]["span_end"][0] = 10_000

    bad = _rewrite_spans(spans[0], tmp_path / "spans" / "shard-0000.parquet", break_row_3)
    with pytest.raises(pdata.DataError, match=r"row 3 .*outside the chunk"):
        pstore.prepare_store(chunks[:1], [bad], tmp_path / "cache")


def test_span_covering_cls_is_rejected(corpus, tmp_path):
    chunks, spans = corpus

    def cover_cls(rows):
        rows[0]["span_start"][0] = 0

    bad = _rewrite_spans(spans[0], tmp_path / "spans" / "shard-0000.parquet", cover_cls)
    with pytest.raises(pdata.DataError, match="row 0"):
        pstore.prepare_store(chunks[:1], [bad], tmp_path / "cache")


def test_span_index_of_other_chunks_is_rejected(corpus, tmp_path):
    chunks, spans = corpus
    # Shard 1's span index paired with shard 0's chunks: chunk ids differ.
    with pytest.raises(pdata.DataError, match="does not match chunk shard"):
        pstore.prepare_store(chunks[:1], spans[1:], tmp_path)


def test_span_index_of_the_same_chunks_in_another_order_is_rejected(corpus, tmp_path):
    """Row r of a span file describes row r of its chunk file: a span index as long as its chunks
    but in another row order would attach every span to another chunk."""
    chunks, spans = corpus
    bad = _rewrite_spans(spans[0], tmp_path / "spans" / "shard-0000.parquet",
                         lambda rows: rows.reverse())
    with pytest.raises(pdata.DataError, match="does not match chunk shard.*differing chunk_id at row 0"):
        pstore.prepare_store(chunks[:1], [bad], tmp_path / "cache")


def test_span_of_no_tokens_is_rejected(corpus, tmp_path):
    """A span [s, s) holds no token: its pooled vector would divide by zero."""
    chunks, spans = corpus

    def empty_span(rows):
        rows[2]["span_end"][1] = rows[2]["span_start"][1]

    bad = _rewrite_spans(spans[0], tmp_path / "spans" / "shard-0000.parquet", empty_span)
    with pytest.raises(pdata.DataError, match=r"row 2 .*outside the chunk"):
        pstore.prepare_store(chunks[:1], [bad], tmp_path / "cache")


def test_two_span_indexes_of_one_chunk_shard_get_their_own_span_files(corpus, tmp_path):
    """COSTA's span ablations sample other spans from the same chunks, into one store folder: each
    span index gets its own span file (named by its checksum too), never the other's."""
    chunks, spans = corpus

    def shorter(rows):
        for row in rows:
            row["span_end"] = [s + 1 for s in row["span_start"]]

    other = _rewrite_spans(spans[0], tmp_path / "spans" / "shard-0000.parquet", shorter)
    first = pstore.prepare_store(chunks[:1], spans[:1], tmp_path / "cache")
    second = pstore.prepare_store(chunks[:1], [other], tmp_path / "cache")
    assert first[0].chunks == second[0].chunks and first[0].spans != second[0].spans
    for files, source in ((first, spans[0]), (second, other)):
        rows = pq.read_table(source).to_pylist()
        store = pstore.ChunkStore(files)
        assert [store.get("span_end", r).tolist() for r in range(len(rows))] == \
            [row["span_end"] for row in rows]


def test_span_manifest_checksum_mismatch_is_rejected(corpus, tmp_path):
    chunks, spans = corpus
    span_copy = tmp_path / "spans" / "shard-0000.parquet"
    span_copy.parent.mkdir()
    span_copy.write_bytes(spans[0].read_bytes())
    # Same chunk ids, but the manifest says the spans were sampled from another file's bytes.
    manifest = artifacts.read_json(artifacts.manifest_path(spans[0]))
    manifest["inputs"]["chunks"]["sha256"] = "0" * 64
    artifacts.write_json(artifacts.manifest_path(span_copy), manifest)
    with pytest.raises(pdata.DataError, match="different shard-0000.parquet"):
        pstore.prepare_store(chunks[:1], [span_copy], tmp_path / "cache")


def test_chunks_of_another_vocabulary_are_rejected(corpus, tmp_path):
    """The chunk manifest's vocabulary fingerprint must be the model tokenizer's."""
    chunks, _ = corpus
    tok = tokenizer()
    chunk_copy = tmp_path / "chunks" / "shard-0000.parquet"
    chunk_copy.parent.mkdir()
    chunk_copy.write_bytes(chunks[0].read_bytes())
    tokens = sorted(tok.get_vocab(), key=tok.get_vocab().get)
    for fingerprint, ok in ((wordpiece.vocab_sha256(tokens), True),
                            (wordpiece.vocab_sha256(tokens[:-1] + ["[cased]"]), False)):
        artifacts.write_manifest(
            artifacts.manifest_path(chunk_copy), stage="chunk_articles", params={},
            stats={"tokenizer": {"name": "other (BertTokenizer)", "vocab_sha256": fingerprint}})
        if ok:
            pdata.check_tokenizer([chunk_copy], tok, tmp_path / "model")
        else:
            with pytest.raises(pdata.DataError, match="tokenised with other.*same tokenizer"):
                pdata.check_tokenizer([chunk_copy], tok, tmp_path / "model")


@pytest.mark.parametrize("max_len, ok", [(512, True), (1024, False)])
def test_chunks_longer_than_the_model_positions_are_rejected(corpus, tmp_path, max_len, ok):
    """A corpus chunked to 1024 tokens cannot feed a model of 512 positions: refused at start-up,
    not at the first forward."""
    chunk_copy = tmp_path / "chunks" / "shard-0000.parquet"
    chunk_copy.parent.mkdir()
    chunk_copy.write_bytes(corpus[0][0].read_bytes())
    artifacts.write_manifest(artifacts.manifest_path(chunk_copy), stage="chunk_articles",
                             params={"max_len": max_len}, stats={})
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert", "max_position_embeddings": 512}')
    if ok:
        pdata.check_positions([chunk_copy], model)
    else:
        with pytest.raises(pdata.DataError, match="up to 1024 tokens.*max_position_embeddings 512"):
            pdata.check_positions([chunk_copy], model)


def _dataset(corpus, cache, vocab, rank, world, micro, **kw):
    chunks, spans = corpus
    ds = pdata.MicroBatches(pstore.prepare_store(chunks, spans, cache), vocab=vocab, seed=3,
                            global_batch_size=8, micro_batch_size=micro, rank=rank, world_size=world,
                            mask_rate=0.15, whole_word=False, need_spans=True, need_bags=True, **kw)
    ds.total_steps = 2 * ds.steps_per_epoch + 1  # crosses two epoch boundaries
    return ds


def test_a_worker_that_is_not_forked_receives_the_store_s_paths_not_its_pages(corpus, tmp_path,
                                                                              vocab):
    """A DataLoader worker started by spawn or forkserver (Python 3.14's default) gets the dataset
    pickled: its size must not grow with the corpus, and the worker maps the files itself."""
    import pickle

    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 4)
    assert len(ds.store) > 0  # the parent opened it (the trainer does, for its counts)
    payload = pickle.dumps(ds)
    assert len(payload) < ds.store.nbytes / 4, (len(payload), ds.store.nbytes)
    worker = pickle.loads(payload)
    for k in (0, 3, len(ds) - 1):
        for key, value in ds[k].items():
            assert torch.equal(worker[k][key], value), (k, key)


def test_a_process_waits_for_files_another_writes_on_the_filesystem(corpus, tmp_path):
    """A process waits for store files another process (or job) converts to appear (not in a
    collective, whose timeout a slow conversion could outlast), and gives up naming what is
    missing."""
    import threading

    chunks, spans = corpus
    paths = pstore.store_paths(chunks, spans, tmp_path / "store")
    claims = _claim_all(paths)  # another job has claimed every file and is converting it
    with pytest.raises(pdata.DataError, match=r"not written within 0 s .*missing .*shard-0000-"):
        pstore.wait_for_store(paths, timeout_s=0.2, poll_s=0.05)

    def the_other_job():
        for claim in claims:
            claim.unlink()  # (a real writer publishes first, then removes its claim)
        pstore.prepare_store(chunks, spans, tmp_path / "store")

    writer = threading.Timer(0.3, the_other_job)
    writer.start()
    pstore.wait_for_store(paths, poll_s=0.05)  # returns once the other's files are there
    writer.join()
    assert pstore.prepare_store(chunks, spans, tmp_path / "store") == paths


def _claim_all(files) -> list[Path]:
    """Claims on every file of `files`, as a writer creates them (`<file>.claim`)."""
    claims = [p.with_name(p.name + ".claim") for f in files for p in f.paths()]
    claims[0].parent.mkdir(parents=True, exist_ok=True)
    for claim in claims:
        claim.write_text('{"host": "elsewhere", "pid": 1}')
    return claims


def test_a_store_deleted_under_a_waiting_process_is_converted_again(corpus, tmp_path):
    """Rank 0 converted its share, then the folder was deleted (the audit's repro: another run's
    onsuccess); rank 1 converts its share afterwards: rank 0 must not wait for files nobody
    writes (12 h, every GPU idle) but convert them itself."""
    chunks, spans = corpus
    cache = tmp_path / "store"
    files = pstore.prepare_store(chunks, spans, cache, share=(0, 2))
    shutil.rmtree(cache)
    pstore.prepare_store(chunks, spans, cache, share=(1, 2))
    pstore.wait_for_store(files, timeout_s=5, poll_s=0.05)
    assert all(p.exists() for f in files for p in f.paths())
    store = pstore.ChunkStore(files)
    assert len(store) == sum(pq.read_metadata(p).num_rows for p in chunks)


def test_a_claim_whose_writer_is_gone_is_taken_over(corpus, tmp_path, monkeypatch):
    """A writer killed mid-conversion leaves its claim and a partial temporary file: a waiting
    process takes over once neither has changed for `stale_s`, and removes the leftovers; a
    writer that shows progress is waited for."""
    chunks, spans = corpus
    files = pstore.store_paths(chunks, spans, tmp_path)
    claims = _claim_all(files)
    partial = tmp_path / f".{files[0].chunks.name}.deadhost-1-0000.tmp"
    partial.write_bytes(b"ARROW1 half a file")
    written = _count_conversions(monkeypatch)
    with pytest.raises(pdata.DataError, match="claims"):  # within stale_s: waits
        pstore.wait_for_store(files, timeout_s=0.3, poll_s=0.05, stale_s=60)
    assert written == []
    pstore.wait_for_store(files, timeout_s=5, poll_s=0.05, stale_s=0.2)
    assert sorted(written) == sorted(p for f in files for p in f.paths())
    assert not partial.exists() and not any(c.exists() for c in claims)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for f in files
                                                                for p in f.paths())


def test_a_writer_whose_temporary_file_grows_is_never_taken_over(corpus, tmp_path, monkeypatch):
    """A conversion may outlast `stale_s` (Wikipedia's ~43 GB on a busy filesystem): its claim is
    written once, so the growth of its temporary file is what shows it alive. Each poll here
    waits longer than stale_s (a clock of its own) while the writer writes on for 5 polls, then
    dies: it is taken over after that, never while it wrote."""
    chunks, spans = corpus
    files = pstore.store_paths(chunks, spans, tmp_path)
    _claim_all(files)
    partial = tmp_path / f".{files[0].chunks.name}.slowhost-1-0000.tmp"
    partial.write_bytes(b"ARROW1")
    clock, polls, lost = [0.0], [0], []

    def sleep(seconds):
        clock[0] += 100.0
        polls[0] += 1
        if polls[0] <= 5:
            if not partial.exists():
                lost.append(polls[0])  # taken over while it wrote
            else:
                partial.write_bytes(partial.read_bytes() + b"x")

    monkeypatch.setattr(pstore, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], sleep=sleep, time=time.time))
    written = _count_conversions(monkeypatch)
    pstore.wait_for_store(files, timeout_s=1e6, stale_s=60)
    assert lost == [] and polls[0] > 5
    assert sorted(written) == sorted(p for f in files for p in f.paths())
    assert not partial.exists()


def test_a_store_file_once_published_is_never_replaced(tmp_path):
    """A second writer of a published file (one that took a conversion over, judging its first
    writer gone) keeps the file there: a process may have it mapped (os.replace would swap its
    pages under it). Both have the same content, named by the shards' checksums."""
    schema = pa.schema([("x", pa.int64())])
    target = tmp_path / "store.arrow"
    pstore._write(iter([pa.record_batch([pa.array([1, 2, 3])], schema=schema)]), schema, target)
    inode = target.stat().st_ino
    pstore._write(iter([pa.record_batch([pa.array([4, 5])], schema=schema)]), schema, target)
    assert target.stat().st_ino == inode
    assert pa.ipc.open_file(pa.memory_map(str(target))).read_all()["x"].to_pylist() == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["store.arrow"]  # no temporary file left


# A child Python finds the package the way the rules' shells do (pytest's `pythonpath` setting
# reaches only this process).
_PACKAGE_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    filter(None, [str(ROOT / "workflow"), os.environ.get("PYTHONPATH")]))}

_JOB = """
import json, os, sys, time
from pathlib import Path
from retrieval_pretraining.pretrain import store
folder, go, chunks, spans = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:5], sys.argv[5:7]
written = []
for name in ("write_chunk_file", "write_span_file"):
    original = getattr(store, name)
    setattr(store, name, lambda *a, _f=original: written.append(Path(a[-1]).name) or _f(*a))
(go.parent / f"ready-{os.getpid()}").touch()
while not go.exists():  # both jobs start together
    time.sleep(0.001)
files = store.prepare_store(chunks, spans, folder)
mapped = {p.name: os.stat(p).st_ino for f in files for p in f.paths() if p.exists()}
store.wait_for_store(files, poll_s=0.02)
print(json.dumps({"written": written, "mapped": mapped}))
"""


def test_jobs_that_start_together_convert_each_file_once_and_never_swap_one(corpus, tmp_path):
    """Two jobs on one folder, released together: every file is converted by one of them, and a
    file one has seen (and would have mapped) is never replaced by the other's copy."""
    import json
    import os
    import subprocess
    import sys

    chunks, spans = corpus
    go = tmp_path / "go"
    command = [sys.executable, "-c", _JOB, str(tmp_path / "store"), str(go),
               *map(str, chunks), *map(str, spans)]
    jobs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=_PACKAGE_ENV)
            for _ in range(2)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < 2:  # both imported and polling
        if time.monotonic() > deadline or any(job.poll() is not None for job in jobs):
            for job in jobs:
                job.kill()
            pytest.fail("the two jobs did not both start (see their stderr above)")
        time.sleep(0.01)
    go.touch()
    results = [json.loads(job.communicate(timeout=60)[0]) for job in jobs]
    final = {p.name: os.stat(p).st_ino for p in (tmp_path / "store").iterdir()}
    assert len(final) == 4  # 2 chunk files, 2 span files, nothing else left behind
    assert sorted(name for r in results for name in r["written"]) == sorted(final)
    for r in results:
        assert all(final[name] == inode for name, inode in r["mapped"].items())


def test_same_micro_batches_for_one_or_two_processes(corpus, tmp_path, vocab):
    single = _dataset(corpus, tmp_path, vocab, 0, 1, 4)
    ranks = [_dataset(corpus, tmp_path, vocab, r, 2, 4) for r in range(2)]
    assert single.accumulation == 2 and ranks[0].accumulation == 1
    for step in range(single.total_steps):
        one = [single[step * 2 + a] for a in range(2)]
        two = [ranks[r][step] for r in range(2)]
        for a, b in zip(one, two):  # micro-batch j: accumulation j on 1 process = rank j on 2
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), (step, key)


def test_a_rank_s_micro_batch_is_the_one_the_trainer_seeds_its_dropout_for(corpus, tmp_path,
                                                                          vocab):
    """Rank r's micro-batch m of a step is global micro-batch j = m x world_size + r, the index
    the trainer keys its dropout masks by (train.py's seed_micro): 2 processes accumulating 2
    then train as 1 process accumulating 4, whatever the accumulation."""
    single = _dataset(corpus, tmp_path, vocab, 0, 1, 2)
    ranks = [_dataset(corpus, tmp_path, vocab, r, 2, 2) for r in range(2)]
    assert single.accumulation == 4 and ranks[0].accumulation == 2
    for step in range(single.total_steps):
        for r, ds in enumerate(ranks):
            for m in range(ds.accumulation):
                j = m * 2 + r
                assert np.array_equal(ds.rows_for(step, m), single.rows_for(step, j)), (step, r, m)
                assert torch.equal(ds[step * 2 + m]["input_ids"],
                                   single[step * 4 + j]["input_ids"]), (step, r, m)


def test_every_step_takes_a_full_global_batch_of_chunks_not_held_out(corpus, tmp_path, vocab):
    """With chunks held out for the probes, an epoch has as many steps as the chunks left fill:
    counting the held-out ones too would end each epoch on batches cut short (or empty)."""
    chunks, spans = corpus
    n = len(pstore.ChunkStore(pstore.prepare_store(chunks, None, tmp_path)))
    holdout = n % 8 + 1  # one more than the remainder: the held-out chunks cost a whole step
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8, holdout=holdout)
    assert ds.steps_per_epoch == (n - holdout) // 8 == n // 8 - 1
    for epoch in range(2):
        steps = range(epoch * ds.steps_per_epoch, (epoch + 1) * ds.steps_per_epoch)
        rows = np.concatenate([ds.global_batch(s)[0] for s in steps])
        assert all(len(ds.global_batch(s)[0]) == 8 for s in steps)
        assert len(set(rows.tolist())) == len(rows) and not np.isin(rows, ds.holdout_rows).any()


def test_the_probes_hold_out_exactly_probe_chunks_whatever_the_row_order(corpus, tmp_path,
                                                                         vocab):
    """trainer.probe_chunks = k sets aside k chunks, no more: the probe batches hold exactly
    those, and which chunks they are depends on the chunk ids, not on their rows' order (a
    count one off leaves steps_per_epoch unchanged in the test above)."""
    for holdout in (1, 5):
        ds = _dataset(corpus, tmp_path / str(holdout), vocab, 0, 1, 8, holdout=holdout)
        held = ds.store.chunk_ids(ds.holdout_rows)
        assert len(ds.holdout_rows) == holdout
        probed = np.concatenate([b["chunk_ids"].numpy() for b in ds.probe_batches()])
        assert sorted(probed.tolist()) == sorted(held.tolist())
    ids = ds.store.all_chunk_ids()
    backwards = ids[::-1].copy()
    assert sorted(backwards[pdata.held_out_rows(backwards, 5, 3)].tolist()) == sorted(held.tolist())


def test_a_row_s_generator_keys_on_the_whole_chunk_id_the_corpus_and_the_stream(corpus, tmp_path,
                                                                                 vocab):
    """Wikipedia's chunk ids pass 2**32 (page ids of ~70M, shifted by 16 bits): two chunks equal
    in their low 32 bits draw different masks, as do equal chunk ids of two corpora of a mixture,
    two epochs and two streams (views). The corpus fixture's ids are all below 2**32, so the
    batches above cannot tell."""
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8)

    def draw(epoch, chunk_id, corpus, stream):
        return ds._rng((epoch, chunk_id, corpus), stream).random(4).tolist()

    p = 0x2A0003
    base = draw(0, p, 0, 1)
    assert base == draw(0, p, 0, 1)
    others = [draw(0, (1 << 32) | p, 0, 1), draw(0, p, 1, 1), draw(1, p, 0, 1), draw(0, p, 0, 0)]
    assert all(other != base for other in others)


def test_order_is_a_function_of_seed_and_epoch(corpus, tmp_path, vocab):
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8)
    spe = ds.steps_per_epoch
    epoch0 = np.concatenate([ds.rows_for(s, 0) for s in range(spe)])
    epoch1 = np.concatenate([ds.rows_for(s, 0) for s in range(spe, 2 * spe)])
    assert len(set(epoch0)) == len(epoch0) == spe * 8  # no chunk twice within an epoch
    assert not np.array_equal(epoch0, epoch1)  # reshuffled every epoch
    again = _dataset(corpus, tmp_path, vocab, 0, 1, 8)
    assert torch.equal(ds[3]["input_ids"], again[3]["input_ids"])  # same masks on a re-run
    assert not torch.equal(ds[0]["input_ids"], ds[spe]["input_ids"])


def test_every_label_tensor_comes_with_its_predicted_positions(corpus, tmp_path, vocab):
    """What the model selects its MLM rows by: every label != -100, in order, nothing else (a
    naive loop over the padded labels)."""
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8, views=2)
    for k in range(3):
        batch = ds[k]
        labels = batch["labels"]
        width = labels.shape[1]
        want = [row * width + col for row in range(labels.shape[0]) for col in range(width)
                if labels[row, col] != -100]
        assert batch["label_positions"].tolist() == want and len(want) > 0
        assert batch["label_positions"].dtype == torch.int64


def test_padding_and_span_tensors(corpus, tmp_path, vocab):
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8, views=2)
    batch = ds[0]
    rows = ds.rows_for(0, 0)
    lengths = [len(ds.store.get("input_ids", r)) for r in rows]
    assert batch["input_ids"].shape == (16, max(lengths))  # two views, padded to the longest
    assert batch["attention_mask"][:8].sum(1).tolist() == lengths
    # The tokens the step encodes (tokens_seen, the loss curves' axis): both views, no padding.
    assert int(batch["n_tokens"]) == int(batch["attention_mask"].sum()) == 2 * sum(lengths)
    assert batch["span_start"].shape[1] == ds.store.max_spans
    for i, r in enumerate(rows):
        n = len(ds.store.get("span_start", r))
        assert batch["span_mask"][i].sum() == n
        assert batch["span_end"][i, :n].tolist() == ds.store.get("span_end", r).tolist()


def test_the_store_is_kept_while_a_process_reads_it_and_deleted_after(corpus, tmp_path):
    """The workflow's onsuccess (`delete_unless_read`): another Snakemake run in the same
    directory may still train from the store when this one succeeds."""
    chunks, spans = corpus
    folder = tmp_path / "pretrain-data"
    files = pstore.prepare_store(chunks, spans, folder)
    with pstore.registered_reader(folder) as marker:
        with pstore.registered_reader(folder):  # another process of the job, or another job
            deleted, message = pstore.delete_unless_read(folder)
            assert not deleted and "2 process(es) read it" in message
            assert f"rm -r {folder}" in message  # a SIGKILLed reader's marker: what to do
        assert not pstore.delete_unless_read(folder)[0] and marker.exists()
        assert all(p.exists() for f in files for p in f.paths())
    assert pstore.store_readers(folder) == [] and not (folder / pstore.READERS).exists()
    deleted, message = pstore.delete_unless_read(folder)
    assert deleted and not folder.exists() and "deleted" in message
    assert pstore.delete_unless_read(folder)[0] is False  # nothing there: nothing to do


def test_a_stop_signal_before_the_trainer_s_handlers_removes_the_marker(tmp_path):
    """SIGTERM during the conversion (before training.StopFlag) ends the process as before, but
    its marker goes first: a leftover marker would keep the store from deletion."""
    import signal
    import subprocess
    import sys

    code = ("import os, signal, sys, time\n"
            "from retrieval_pretraining.pretrain import store\n"
            "with store.registered_reader(sys.argv[1]) as marker:\n"
            "    print(marker, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env=_PACKAGE_ENV)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.strip() and not Path(done.stdout.strip()).exists()
    assert pstore.store_readers(tmp_path) == []


def test_a_trainer_is_a_reader_of_its_store_for_its_whole_run(tmp_path, monkeypatch):
    from retrieval_pretraining.pretrain import train as ptrain

    seen = []

    def fake_train(settings, **kwargs):
        seen.append(pstore.store_readers(kwargs["store_dir"] or kwargs["state_dir"] / "data"))
        if settings.get("fail"):
            raise RuntimeError("a failed run")
        return 75

    monkeypatch.setattr(ptrain, "_train", fake_train)
    assert ptrain.train({}, state_dir=tmp_path / "state", store_dir=tmp_path / "store") == 75
    with pytest.raises(RuntimeError):
        ptrain.train({"fail": True}, state_dir=tmp_path / "state")
    assert [len(readers) for readers in seen] == [1, 1]
    assert pstore.store_readers(tmp_path / "store") == []
    assert pstore.store_readers(tmp_path / "state" / "data") == []


def test_span_end_covering_the_final_sep_is_rejected(corpus, tmp_path):
    chunks, spans = corpus
    length = len(pq.read_table(chunks[0]).to_pylist()[0]["input_ids"])

    def cover_sep(rows):
        rows[0]["span_end"][0] = length  # [start, length) includes the final [SEP]

    bad = _rewrite_spans(spans[0], tmp_path / "spans" / "shard-0000.parquet", cover_sep)
    with pytest.raises(pdata.DataError, match="row 0"):
        pstore.prepare_store(chunks[:1], [bad], tmp_path / "cache")


def test_two_views_are_masked_independently(corpus, tmp_path, vocab):
    """CPDAE's two views of a chunk: different in every row, their masks independent draws (the
    share of view 0's selection also selected in view 1 near the rate, not 1)."""
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8, views=2)
    both = expected = selected = 0
    for k in range(ds.steps_per_epoch):
        batch = ds[k]
        n = batch["input_ids"].shape[0] // 2
        for i in range(n):
            assert not torch.equal(batch["input_ids"][i], batch["input_ids"][n + i]), (k, i)
        views = batch["labels"][:n] != -100, batch["labels"][n:] != -100
        inner = batch["attention_mask"][:n].sum(1) - 2
        both += int((views[0] & views[1]).sum())
        selected += int(views[0].sum())
        expected += float((views[0].sum(1) * views[1].sum(1) / inner).sum())
    assert selected > 200
    assert abs(both - expected) / selected < 0.05, (both, expected, selected)


def test_batch_spans_and_bags_are_the_store_s_rows(corpus, tmp_path, vocab):
    """span_start and span_end of every row are its store row's (padding a valid empty span
    [1, 2), masked out); the bag is the original ids' (a masked token that occurs once stays)."""
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 8, views=2)
    masked_once = 0
    for k in range(3):
        batch = ds[k]
        for i, r in enumerate(ds.rows_for(k, 0)):
            starts, ends = ds.store.get("span_start", r), ds.store.get("span_end", r)
            n = len(starts)
            assert batch["span_start"][i, :n].tolist() == starts.tolist(), (k, i)
            assert batch["span_end"][i, :n].tolist() == ends.tolist(), (k, i)
            assert (batch["span_start"][i, n:] == 1).all() and (batch["span_end"][i, n:] == 2).all()
            assert not batch["span_mask"][i, n:].any() and batch["span_mask"][i, :n].all()
            original = ds.store.get("input_ids", r)
            bag = batch["bag_ids"][i][batch["bag_mask"][i]].tolist()
            assert sorted(bag) == sorted(set(original.tolist()) - set(vocab.excluded.tolist()))
            ids, counts = np.unique(original, return_counts=True)
            once = set(ids[counts == 1].tolist()) - set(vocab.excluded.tolist())
            hidden = batch["input_ids"][i][: len(original)].numpy() == vocab.mask_id
            masked_once += len(once & set(original[hidden].tolist()))
    assert masked_once > 0  # the case the bag must survive happened


def test_a_two_view_batch_restated_from_the_store_row_by_row(corpus, tmp_path, vocab):
    """CPDAE's micro-batch written out by hand: rows [view 0 of the m chunks; view 1 of them] (the
    layout the model's `bag.repeat(2, 1)` and its positives assume), view v of chunk c masked
    (whole words) from its own generator (seed, epoch, chunk_id's two halves, v, corpus 0), padded
    with [PAD] and attention 0, its bag the unmasked chunk's ids less the excluded ones, across an
    epoch boundary."""
    ds = _dataset(corpus, tmp_path, vocab, 0, 1, 4, views=2)
    ds.whole_word = True
    for k in (0, 3, 2 * ds.steps_per_epoch + 1):
        batch, step = ds[k], k // ds.accumulation
        epoch = step // ds.steps_per_epoch
        rows = ds.rows_for(step, k % ds.accumulation)
        m = len(rows)
        assert batch["input_ids"].shape[0] == 2 * m
        for i, r in enumerate(rows):
            ids, words = ds.store.get("input_ids", r), ds.store.get("word_starts", r)
            chunk = int(ds.store.chunk_ids([r])[0])
            n = len(ids)
            for v in range(2):
                rng = np.random.default_rng([3, epoch, chunk & 0xFFFFFFFF, chunk >> 32, v, 0])
                masked, labels = pdata.mask_tokens(ids, words, rng, vocab, 0.15, True)
                row = v * m + i
                assert batch["input_ids"][row, :n].tolist() == masked.tolist(), (k, i, v)
                assert batch["labels"][row, :n].tolist() == labels.tolist(), (k, i, v)
                assert (batch["input_ids"][row, n:] == vocab.pad_id).all()
                assert (batch["labels"][row, n:] == -100).all()
                assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (
                    batch["attention_mask"].shape[1] - n)
            bag = batch["bag_ids"][i][batch["bag_mask"][i]].tolist()
            assert bag == sorted(set(ids.tolist()) - set(vocab.excluded.tolist())), (k, i)
        assert batch["chunk_ids"].tolist() == ds.store.chunk_ids(rows).tolist()
