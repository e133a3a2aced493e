"""The passages fine-tuning reads (finetune/passages.py): right rows, collisions, and memory.

A process must not hold the passage texts in its own memory (the old dict of strings cost ~4 GB
per GPU at MS MARCO scale): the memory test measures anonymous memory (RssAnon: what a process
owns, not the page cache the memory-mapped file lives in) at 1x and 10x the passages, and a
control shows the measurement sees a dict of the same texts.
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


def test_a_negative_absent_from_the_corpus_is_named_and_nothing_is_written(tmp_path):
    corpus = _corpus(tmp_path / "corpus.parquet", 10)
    with pytest.raises(InputFileError, match=r"1 negative doc ids are not in .*'nope'"):
        write_passages(corpus, {"d1", "nope"}, tmp_path / "p.arrow")
    assert list(tmp_path.iterdir()) == [corpus]


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
