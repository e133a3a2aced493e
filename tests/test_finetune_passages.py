"""The passages fine-tuning reads (finetune/passages.py): right rows, collisions, and memory.

A process must not hold the passage texts in its own memory (the old dict of strings cost ~4 GB
per GPU at MS MARCO scale), nor its training queries' negatives as Python objects (dicts of lists
of strings: 7.1 GB at 809k queries x 30 negatives, benchmarks/RESULTS.md). The memory tests
measure anonymous memory (RssAnon: what a process owns, not the page cache the memory-mapped file
lives in) at 1x and 10x, and a control shows the measurement sees the Python objects.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from retrieval_pretraining.errors import InputFileError
from retrieval_pretraining.finetune import passages
from retrieval_pretraining.finetune.passages import PassageStore, write_passages

import memory_probe


def _corpus(path: Path, n: int, text_bytes: int = 40) -> Path:
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz    ", dtype="S1")
    texts = [rng.choice(letters, text_bytes).tobytes().decode() for _ in range(n)]
    pl.DataFrame({
        "doc_id": [f"d{i}" for i in range(n)],
        "title": [None if i % 3 == 0 else f"title {i}" for i in range(n)],
        "text": texts,
    }).write_parquet(path)
    return path


def test_lookup_returns_the_corpus_rows_in_the_asked_order(tmp_path):
    corpus = _corpus(tmp_path / "corpus.parquet", 50)
    frame = pl.read_parquet(corpus)
    wanted = ["d7", "d3", "d42", "d0", "d3"]  # repeats are fine (a negative drawn twice)
    assert write_passages(corpus, set(wanted), tmp_path / "p.arrow") == 4
    titles, texts = PassageStore(tmp_path / "p.arrow").lookup(wanted)
    rows = {d: (t or "", x) for d, t, x in frame.iter_rows()}
    assert list(zip(titles, texts)) == [rows[d] for d in wanted]


def test_hash_collisions_are_resolved_by_the_stored_id(tmp_path, monkeypatch):
    real = passages.doc_id_hashes
    monkeypatch.setattr(passages, "doc_id_hashes", lambda ids: real(ids) % 3)  # 3 buckets
    corpus = _corpus(tmp_path / "corpus.parquet", 30)
    write_passages(corpus, {f"d{i}" for i in range(30)}, tmp_path / "p.arrow")
    store = PassageStore(tmp_path / "p.arrow")
    wanted = [f"d{i}" for i in (29, 0, 14, 15)]
    assert store.lookup(wanted)[1] == [pl.read_parquet(corpus)["text"][int(d[1:])] for d in wanted]
    with pytest.raises(KeyError, match="'d99'"):
        store.rows(["d99"])


def test_lookup_across_record_batches_and_collisions(tmp_path, monkeypatch):
    """A large file is several record batches (18 at 1.5M passages): rows on either side of every
    batch boundary come back right, hash collisions included."""
    import pyarrow.ipc as ipc

    real = passages.doc_id_hashes
    monkeypatch.setattr(passages, "doc_id_hashes", lambda ids: real(ids) % 7)  # 7 buckets
    corpus = _corpus(tmp_path / "corpus.parquet", 100)
    write_passages(corpus, {f"d{i}" for i in range(100)}, tmp_path / "whole.arrow")
    table = ipc.open_file(tmp_path / "whole.arrow").read_all()
    with ipc.new_file(tmp_path / "batches.arrow", table.schema) as writer:
        for batch in table.to_batches(max_chunksize=17):  # 6 batches, the last one short
            writer.write_batch(batch)
    store = PassageStore(tmp_path / "batches.arrow")
    assert len(store) == 100 and len(store._starts) == 7
    wanted = [f"d{i}" for i in (99, 16, 17, 0, 33, 34, 35, 84, 85, 17)]
    rows = {d: (t or "", x) for d, t, x in pl.read_parquet(corpus).iter_rows()}
    titles, texts = store.lookup(wanted)
    assert list(zip(titles, texts)) == [rows[d] for d in wanted]


def test_a_negative_absent_from_the_corpus_is_named_and_nothing_is_written(tmp_path):
    corpus = _corpus(tmp_path / "corpus.parquet", 10)
    with pytest.raises(InputFileError, match=r"1 negative doc ids are not in .*'nope'"):
        write_passages(corpus, {"d1", "nope"}, tmp_path / "p.arrow")
    assert list(tmp_path.iterdir()) == [corpus]


def test_partial_passage_files_of_interrupted_writes_are_removed(tmp_path, monkeypatch):
    """A write killed part-way (OOM killer, time limit) leaves its temp file in the state folder,
    ~20 GB at MS MARCO documents: the next write removes it; a failing write removes its own."""
    corpus = _corpus(tmp_path / "corpus.parquet", 10)
    state = tmp_path / "state"
    state.mkdir()
    stale = state / ".p.arrow.12345.tmp"  # the pid of a process that is gone
    stale.write_bytes(b"partial")
    write_passages(corpus, {"d1", "d2"}, state / "p.arrow")
    assert sorted(p.name for p in state.iterdir()) == ["p.arrow"]

    def full_disk(self, path, **kwargs):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.LazyFrame, "sink_ipc", full_disk)
    with pytest.raises(Exception, match="No space"):  # `reading` words it as the corpus's
        write_passages(corpus, {"d1", "d2"}, state / "q.arrow")
    assert sorted(p.name for p in state.iterdir()) == ["p.arrow"]


_MEASURE = """
import numpy as np
import polars as pl, pyarrow
from retrieval_pretraining.finetune.passages import PassageStore
file, kind = Path(sys.argv[2]), sys.argv[3]
ids = [f"d{i}" for i in np.random.default_rng(1).integers(0, int(sys.argv[4]), 2000)]
before = anon_kb()
if kind == "store":
    store = PassageStore(file)
    for start in range(0, len(ids), 64):  # training's access pattern: a micro-batch at a time
        store.lookup(ids[start:start + 64])
else:  # the old way: every passage's (title, text) as Python strings
    import pyarrow.ipc as ipc
    table = ipc.open_file(file).read_all()
    held = dict(zip(table["doc_id"].to_pylist(), zip(table["title"].to_pylist(),
                                                     table["text"].to_pylist())))
    del table
print(json.dumps({"grew_kb": anon_kb() - before}))
"""


def _grew_kb(file: Path, kind: str, n: int) -> int:
    return memory_probe.run(_MEASURE, file, kind, n)["grew_kb"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_process_holds_16_bytes_a_passage_not_the_texts_at_10x(tmp_path):
    text_bytes, n = 2000, 2_000
    grown = {}
    for scale in (1, 10):
        corpus = _corpus(tmp_path / f"corpus-{scale}.parquet", n * scale, text_bytes)
        write_passages(corpus, {f"d{i}" for i in range(n * scale)}, tmp_path / f"p-{scale}.arrow")
        grown[scale] = _grew_kb(tmp_path / f"p-{scale}.arrow", "store", n * scale)
    texts_kb_10x = n * 10 * text_bytes // 1024  # ~39 MB of text at 10x
    # 9 x n more passages may cost their hash and order (16 bytes each) plus allocator slack.
    assert grown[10] - grown[1] <= 9 * n * 16 // 1024 + 4096, (grown, texts_kb_10x)
    # Control: the measurement sees the texts when a process does hold them.
    assert _grew_kb(tmp_path / "p-10.arrow", "dict", n * 10) >= texts_kb_10x, grown


def _training_data(folder: Path, queries: int, negatives: int = 30) -> Path:
    """Queries q<i> with one positive and `negatives` random negatives among 10 x `queries` docs."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = 10 * queries
    qids = pl.Series([f"q{i}" for i in range(queries)])
    pl.DataFrame({"doc_id": [f"d{i}" for i in range(docs)], "title": "", "text": "t"}).write_parquet(
        folder / "corpus.parquet")
    pl.DataFrame({"query_id": qids, "text": [f"query {i}" for i in range(queries)]}).write_parquet(
        folder / "queries.parquet")
    pl.DataFrame({"query_id": qids, "doc_id": [f"d{i}" for i in range(queries)], "relevance": 1},
                 schema_overrides={"relevance": pl.Int32}).write_parquet(folder / "qrels.parquet")
    picks = np.random.default_rng(0).integers(0, docs, (queries, negatives))
    pl.DataFrame({"query_id": qids, "negative_ids": [[f"d{j}" for j in row] for row in picks]}
                 ).write_parquet(folder / "negatives.parquet")
    return folder


_MEASURE_SET = """
import polars as pl
from retrieval_pretraining.finetune.data import load_training_set
from retrieval_pretraining.finetune.settings import FinetuneSettings
folder, kind = Path(sys.argv[2]), sys.argv[3]
pl.DataFrame({"a": [1]}).group_by("a").len()  # polars' thread pool started before measuring
before = anon_kb()
if kind == "columnar":
    held = load_training_set(folder / "queries.parquet", folder / "qrels.parquet",
                             folder / "corpus.parquet", [folder / "negatives.parquet"],
                             FinetuneSettings.from_config({}), seed=1)
else:  # the old way: each query's negatives as a list of Python strings
    held = {q: list(n) for q, n in pl.read_parquet(folder / "negatives.parquet").iter_rows()}
print(json.dumps({"grew_kb": anon_kb() - before}))
"""


def _set_grew_kb(folder: Path, kind: str) -> int:
    return memory_probe.run(_MEASURE_SET, folder, kind, env=memory_probe.HELD_ONLY)["grew_kb"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_process_holds_its_training_negatives_in_arrow_buffers_at_10x(tmp_path):
    """2,000 then 20,000 queries x 30 negatives: the 540k more listed negatives cost their ids
    in Arrow buffers (under 32 bytes each: the ids here are ~7 bytes, plus an 8-byte offset),
    where a dict of Python lists costs over 48 bytes each (a str object and a pointer)."""
    queries, negatives = 2_000, 30
    grown = {scale: _set_grew_kb(_training_data(tmp_path / f"x{scale}", queries * scale), "columnar")
             for scale in (1, 10)}
    more = 9 * queries * negatives
    assert grown[10] - grown[1] <= more * 32 // 1024, grown
    held = _set_grew_kb(tmp_path / "x10", "dicts")
    assert held >= 10 * queries * negatives * 48 // 1024, (held, grown)
