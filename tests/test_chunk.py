"""Chunking, checked against naive restatements of its rules (token strings, decoded text)."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from retrieval_pretraining import artifacts, audit, checkpoints, chunk, chunker  # noqa: E402
from retrieval_pretraining import wordpiece  # noqa: E402
from retrieval_pretraining.config import ConfigError  # noqa: E402
from retrieval_pretraining.contracts import chunks as contract  # noqa: E402

from shipped_data import ONE_LAYER_MINILM, ROOT, SCIFACT_CORPUS  # noqa: E402
SCIFACT = SCIFACT_CORPUS
DEMO_CHECKPOINT = ONE_LAYER_MINILM


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "minilm-l2"
    checkpoints.stage(DEMO_CHECKPOINT, out)
    return out


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return wordpiece.load_tokenizer(checkpoint)


def write_articles(path, rows):
    table = pa.table(
        {
            "page_id": pa.array([r[0] for r in rows], pa.int64()),
            "title": [str(r[0]) for r in rows],
            "text": pa.array([r[1] for r in rows], pa.large_string()),
            "revision_id": pa.array([1] * len(rows), pa.int64()),
        }
    )
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="module")
def articles(tmp_path_factory):
    """Real prose (SciFact abstracts, title as its own paragraph) in two parts, plus long
    multi-paragraph articles and edge cases."""
    docs = [json.loads(line) for line in SCIFACT.open()][:240]
    rows = [(int(d["_id"]), d["title"] + "\n\n" + d["text"]) for d in docs]
    long_articles = [
        (10_000_000 + i, "\n\n".join(d["text"] for d in docs[i * 8 : (i + 1) * 8]))
        for i in range(10)
    ]
    edge = [
        (20_000_001, ""),
        (20_000_002, "Hi."),
        (20_000_003, "Before [SEP] after [CLS] end [MASK]."),
    ]
    folder = tmp_path_factory.mktemp("articles")
    return [
        write_articles(folder / "a.parquet", rows[:120] + edge),
        write_articles(folder / "b.parquet", rows[120:] + long_articles),
    ]


def run(articles, checkpoint, out_dir, processes=1, batch_size=16, **overrides):
    section = {
        "checkpoint": "minilm-l2",
        "max_len": 64,
        "min_tail_len": 8,
        "shards": 3,
        **overrides,
    }
    cfg = chunker.ChunkConfig.from_dict(section)
    outs = [Path(out_dir) / f"shard-{i:04d}.parquet" for i in range(cfg.shards)]
    stats = chunk.chunk_corpus(articles, checkpoint, outs, cfg, processes=processes,
                               batch_size=batch_size)
    return outs, stats


def read_all(outs):
    return pa.concat_tables([pq.read_table(p) for p in outs]).to_pylist()


@pytest.fixture(scope="module")
def default_run(articles, checkpoint, tmp_path_factory):
    return run(articles, checkpoint, tmp_path_factory.mktemp("chunks"))


def test_chunks_fit_max_len_and_never_split_a_word(default_run, tokenizer):
    outs, _ = default_run
    rows = read_all(outs)
    assert len(rows) > 300
    for row in rows:
        tokens = [tokenizer.id_to_token(i) for i in row["input_ids"]]
        assert len(tokens) <= 64
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert "[CLS]" not in tokens[1:-1] and "[SEP]" not in tokens[1:-1]
        # A word begins at every token that is not a "##" continuation; chunks begin with a word.
        naive_starts = [i for i in range(1, len(tokens) - 1) if not tokens[i].startswith("##")]
        assert row["word_starts"] == naive_starts
        assert naive_starts[0] == 1
    # The piece after a chunk's end (first of the next chunk of the page) never continues a word.
    assert not any(tokenizer.id_to_token(r["input_ids"][1]).startswith("##") for r in rows)


def test_round_trip_decodes_to_the_article_text(default_run, articles, tokenizer):
    outs, _ = default_run
    text = {}
    for path in articles:
        text.update(
            zip(pq.read_table(path)["page_id"].to_pylist(), pq.read_table(path)["text"].to_pylist())
        )
    pieces = {}
    for row in sorted(read_all(outs), key=lambda r: r["chunk_id"]):
        pieces.setdefault(row["page_id"], []).extend(
            tokenizer.id_to_token(i) for i in row["input_ids"][1:-1]
        )
    # Every article with text has chunks (the decoding below then covers the whole input).
    assert set(pieces) == {page for page, body in text.items() if body.strip()}
    checked = 0
    for page, toks in pieces.items():
        if "[UNK]" in toks:
            continue
        decoded = "".join(t[2:] if t.startswith("##") else t for t in toks)
        normalised = tokenizer.normalizer.normalize_str(text[page])
        assert decoded == "".join(normalised.split()), page
        checked += 1
    assert checked >= 0.9 * len(pieces)
    assert 20_000_001 not in pieces  # the empty article has no chunk


def test_shards_follow_the_chunks_contract(default_run):
    """The writer's output is its contract's: the contract's schema, every audit check passing."""
    outs, _ = default_run
    for path in outs:
        assert pq.read_schema(path) == contract.SCHEMA
        result = audit.audit(path)
        assert result.kind == "chunks" and result.passed, result.render()


def test_sharding_ids_order_and_manifest(default_run):
    outs, stats = default_run
    total = 0
    for shard, path in enumerate(outs):
        table = pq.read_table(path)
        ids = table["chunk_id"].to_pylist()
        assert ids == sorted(set(ids))
        for row in table.select(["chunk_id", "page_id", "chunk_index"]).to_pylist():
            assert row["page_id"] % 3 == shard
            assert row["chunk_id"] == row["page_id"] * 65536 + row["chunk_index"]
        manifest = artifacts.read_json(artifacts.manifest_path(path))
        assert manifest["stats"]["shard"]["chunks"] == table.num_rows
        assert len(manifest["stats"]["tokenizer"]["vocab_sha256"]) == 64
        total += table.num_rows
    rows = read_all(outs)
    assert stats["chunks"] == total == sum(stats["length_histogram"]["counts"])
    assert stats["tokens"] == sum(len(r["input_ids"]) for r in rows)
    # chunk_index runs 0, 1, 2, ... within a page
    by_page = {}
    for r in rows:
        by_page.setdefault(r["page_id"], []).append(r["chunk_index"])
    assert all(sorted(v) == list(range(len(v))) for v in by_page.values())


def test_result_independent_of_processes_and_shards(default_run, articles, checkpoint, tmp_path):
    outs, _ = default_run
    outs2, _ = run(articles, checkpoint, tmp_path / "p2", processes=2)
    assert [p.read_bytes() for p in outs] == [p.read_bytes() for p in outs2]
    outs1, _ = run(articles, checkpoint, tmp_path / "s1", shards=1)
    key = lambda r: r["chunk_id"]  # noqa: E731
    assert sorted(read_all(outs1), key=key) == sorted(read_all(outs), key=key)


def test_bytes_independent_of_the_batch_size(default_run, articles, checkpoint, tmp_path):
    """--batch-size is speed only: the same shards from batches of 16 and of 1,024 articles."""
    outs, stats = default_run
    large, large_stats = run(articles, checkpoint, tmp_path / "b1024", batch_size=1024)
    assert [p.read_bytes() for p in outs] == [p.read_bytes() for p in large]
    assert stats == large_stats


def test_a_row_group_is_the_same_bytes_from_small_or_large_runs(tmp_path):
    """The runs phase 2 writes are the spilled batches, sized by --batch-size. A row group of
    more than a data page (1 MB encoded) of token ids, written as the runs' chunks, had its pages
    cut where the runs meet: here 3,000 chunks of 500-512 tokens (most chunks fill max_len) from
    runs of 16 and of 1,024."""
    rng = np.random.default_rng(0)
    chunks = 3000
    lengths = rng.integers(500, 513, chunks)
    table = pa.table(
        [pa.array(np.arange(chunks, dtype=np.int64) << 16), pa.array(np.arange(chunks)),
         pa.array(np.zeros(chunks, np.int32)),
         pa.array([rng.integers(1000, 30000, n, dtype=np.int32) for n in lengths],
                  pa.list_(pa.int32())),
         pa.array([np.arange(0, n, 2, dtype=np.int32) for n in lengths], pa.list_(pa.int32()))],
        schema=contract.SCHEMA)
    cfg = chunker.ChunkConfig.from_dict({"checkpoint": "x", "max_len": 512, "min_tail_len": 8,
                                         "shards": 1})
    written = []
    for rows in (16, 1024):
        out = tmp_path / f"runs-{rows}.parquet"
        chunk._write_shard(iter(table.to_batches(max_chunksize=rows)), out, cfg)
        written.append(out.read_bytes())
    assert pq.ParquetFile(tmp_path / "runs-16.parquet").metadata.num_row_groups == 1
    assert written[0] == written[1]


def text_lengths(outs):
    return [len(r["input_ids"]) - 2 for r in sorted(read_all(outs), key=lambda r: r["chunk_id"])]


@pytest.mark.parametrize(
    ("rule", "expected"), [("keep", [14, 2, 2]), ("drop", [14]), ("rebalance", [11, 5, 2])]
)
def test_short_tail_rules(rule, expected, checkpoint, tmp_path):
    # 16 one-piece words, no sentence end: a full chunk of 14 + a tail of 2; then a 2-token article.
    articles = [
        write_articles(tmp_path / "a.parquet", [(1, " ".join(["cell"] * 16)), (2, "cell cell")])
    ]
    outs, stats = run(
        articles,
        checkpoint,
        tmp_path / "out",
        max_len=16,
        min_tail_len=5,
        shards=1,
        short_tail=rule,
    )
    assert text_lengths(outs) == expected


def test_cuts_prefer_paragraph_then_sentence_starts(checkpoint, tmp_path):
    words = lambda k: " ".join(["cell"] * k)  # noqa: E731
    # paragraph start at token 8, sentence start at token 12, hard limit 14
    text = f"{words(7)}.\n\n{words(3)}. {words(8)}"
    articles = [write_articles(tmp_path / "a.parquet", [(1, text)])]
    for slack, first in ((0.5, 8), (0.0, 14)):
        outs, _ = run(
            articles,
            checkpoint,
            tmp_path / str(slack),
            max_len=16,
            min_tail_len=0,
            shards=1,
            boundary_slack=slack,
        )
        assert text_lengths(outs)[0] == first
    text = f"{words(10)}. {words(10)}"  # only a sentence start, at token 11
    articles = [write_articles(tmp_path / "b.parquet", [(1, text)])]
    outs, _ = run(
        articles,
        checkpoint,
        tmp_path / "s",
        max_len=16,
        min_tail_len=0,
        shards=1,
        boundary_slack=0.5,
    )
    assert text_lengths(outs)[0] == 11


@pytest.mark.parametrize(("start", "first_cut", "kind"), [
    (14, 14, "paragraph"), (13, 13, "paragraph"), (12, 12, "paragraph"),  # inside the slack
    (11, 14, "word"), (10, 14, "word"), (9, 14, "word"),  # before it: the window's last word
])
def test_the_slack_window_is_the_windows_final_tokens(start, first_cut, kind):
    """max_len 16: a window of 14 text tokens [0, 14); boundary_slack 0.2: int(0.2 * 14) = 2, its
    final tokens 12 and 13. A paragraph (and sentence) start there, or at 14 (the window's end),
    is the cut; one at 11 or before is not, and the cut falls at the last word start, 14.
    Every token starts a word; 20 tokens: the rest after the cut fits one chunk."""
    cfg = chunker.ChunkConfig(checkpoint="unused", max_len=16, min_tail_len=0,
                              boundary_slack=0.2)
    stats = Counter()
    plan = chunker.plan_chunks(0, 20, np.arange(20), np.array([start]), np.array([start]), cfg,
                               stats)
    assert plan == [(0, first_cut), (first_cut, 20)]
    assert stats == {f"cuts_at_{kind}": 1}


def test_plan_bounds_a_full_window_and_a_tail_of_min_tail_len_are_kept():
    """The bounds of the rules, on plan_chunks itself (every token a word, no sentence or
    paragraph start): an article of exactly max_len - 2 tokens is one chunk, not two; a tail of
    exactly min_tail_len tokens is no short tail ("fewer than min_tail_len") and is kept as cut;
    a rebalancing cut may leave the tail a whole window (max_len 12: 10 text tokens)."""
    cfg = chunker.ChunkConfig(checkpoint="unused", max_len=12, min_tail_len=4,
                              short_tail="drop")
    none = np.zeros(0, np.int64)

    def plan(hi, words):
        return chunker.plan_chunks(0, hi, np.asarray(words), none, none, cfg, Counter())

    assert plan(10, np.arange(10)) == [(0, 10)]
    assert plan(14, np.arange(14)) == [(0, 10), (10, 14)]
    # 13 tokens, words at 0, 3 and 10: the window ends at 10, leaving a tail of 3; the only word
    # start that gives the tail 4 is 3, making it 10 tokens long: the whole window, allowed.
    rebalance = chunker.ChunkConfig(checkpoint="unused", max_len=12, min_tail_len=4,
                                    short_tail="rebalance")
    stats = Counter()
    assert chunker.plan_chunks(0, 13, np.array([0, 3, 10]), none, none, rebalance,
                               stats) == [(0, 3), (3, 13)]
    assert stats["short_tails_rebalanced"] == 1
    # The rebalancing cut may leave the previous chunk a single word.
    assert chunker.plan_chunks(0, 11, np.array([0, 1, 10]), none, none, rebalance,
                               Counter()) == [(0, 1), (1, 11)]


def test_plan_drops_exactly_the_overlong_word():
    """A word of 12 tokens (8..19) cannot fit a 10-token window: it alone is dropped and
    counted, token by token; the next chunk starts at the next word (20), not inside it."""
    cfg = chunker.ChunkConfig(checkpoint="unused", max_len=12, min_tail_len=0)
    none = np.zeros(0, np.int64)
    stats = Counter()
    words = np.array([0, 5, 8, 20, 21, 22, 23, 24])
    assert chunker.plan_chunks(0, 25, words, none, none, cfg, stats) == [(0, 8), (20, 25)]
    assert stats["overlong_words_dropped"] == 1 and stats["overlong_tokens_dropped"] == 12


def test_sentence_and_paragraph_marks(checkpoint, tokenizer):
    """A sentence ends at ".", "!" or "?" (the docstring's three); paragraphs are split at blank
    lines, a line of spaces or tabs included; min_tail_len may not pass the window."""
    cfg = chunker.ChunkConfig(checkpoint="unused", max_len=16)
    table = chunker.Chunker(checkpoint, cfg).sentence_final
    assert [bool(table[tokenizer.token_to_id(t)]) for t in (".", "!", "?", ",", ";")] == [
        True, True, True, False, False]
    assert chunker.PARAGRAPH_SPLIT.split("a\n\nb\n \t\nc\nd") == ["a", "b", "c\nd"]
    with pytest.raises(ConfigError, match="min_tail_len"):
        chunker.ChunkConfig.from_dict({"checkpoint": "x", "max_len": 16, "min_tail_len": 15})
    assert chunker.ChunkConfig.from_dict({"checkpoint": "x", "max_len": 16, "min_tail_len": 14})


def test_a_heading_is_a_short_paragraph_of_at_most_heading_tokens():
    """HEADING_TOKENS (16) tokens without a sentence end read as a heading, 17 do not; a
    sentence end inside makes any short paragraph prose."""
    assert chunker.HEADING_TOKENS == 16
    assert chunker._heading_ends(np.array([0, 16, 40]), np.zeros(0, np.int64)).tolist() == [16]
    assert chunker._heading_ends(np.array([0, 17, 40]), np.zeros(0, np.int64)).tolist() == []
    assert chunker._heading_ends(np.array([0, 16, 40]), np.array([15])).tolist() == []


@pytest.mark.parametrize("headings", [["Snow albedo"], ["Climate", "Snow albedo"]])
def test_a_heading_stays_with_its_body(headings, checkpoint, tokenizer, tmp_path):
    """A heading is its own paragraph (wikitext.py), so its start and its body's are both paragraph
    starts; with both inside the slack window the cut must go before the heading (and before the
    first of nested headings), not between the heading and its body."""
    words = lambda k: " ".join(["cell"] * k)  # noqa: E731
    text = "\n\n".join([f"{words(20)}.", *headings, f"{words(20)}."])
    # the headings start at token 21 and end by token 25, inside the window (14, 30]
    articles = [write_articles(tmp_path / "a.parquet", [(1, text)])]
    outs, _ = run(articles, checkpoint, tmp_path / "out", max_len=32, min_tail_len=0, shards=1,
                  boundary_slack=0.5)
    first, second = [tokenizer.decode(r["input_ids"], skip_special_tokens=True)
                     for r in sorted(read_all(outs), key=lambda r: r["chunk_id"])][:2]
    assert first == f"{words(20)}."
    assert second.startswith(" ".join(headings).lower() + " cell")


def test_literal_special_tokens_and_overlong_words(checkpoint, tokenizer, tmp_path):
    long_word = "qzxv" * 12  # one word of many pieces, longer than a 14-token window
    assert len(tokenizer.encode(long_word, add_special_tokens=False).ids) > 14
    articles = [
        write_articles(
            tmp_path / "a.parquet", [(1, f"cell [SEP] cell {long_word} cell cell"), (2, "[CLS]")]
        )
    ]
    outs, stats = run(articles, checkpoint, tmp_path / "out", max_len=16, min_tail_len=0, shards=1)
    rows = read_all(outs)
    assert stats["overlong_words_dropped"] == 1
    for row in rows:
        assert row["input_ids"].count(tokenizer.token_to_id("[SEP]")) == 1
        assert row["input_ids"].count(tokenizer.token_to_id("[CLS]")) == 1
    assert [tokenizer.id_to_token(i) for i in rows[-1]["input_ids"]][1:4] == ["[", "cl", "##s"]


def test_bad_config_and_inputs_fail_with_the_fix(articles, checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="min_tail_len"):
        chunker.ChunkConfig.from_dict({"checkpoint": "x", "max_len": 16, "min_tail_len": 20})
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"page_id": pa.array([1], pa.int64())}), bad)
    with pytest.raises(ValueError, match="bad.parquet.*text"):
        run([bad], checkpoint, tmp_path / "out", shards=1)
    duplicate = write_articles(tmp_path / "dup.parquet", [(1, "cell cell"), (1, "cell")])
    with pytest.raises(ValueError, match="duplicate page_id"):
        run([duplicate], checkpoint, tmp_path / "out2", shards=1)


def test_a_page_id_that_cannot_form_a_chunk_id_is_refused(checkpoint, tmp_path):
    """chunk_id = page_id << 16 + chunk_index must fit an int64: page ids in [0, 2**47). The
    largest is chunked; 2**47 (whose chunk_id would wrap to a negative number) and -1 are
    refused, naming the file."""
    top = (1 << 47) - 1
    outs, _ = run([write_articles(tmp_path / "top.parquet", [(top, "cell cell")])], checkpoint,
                  tmp_path / "out", shards=1)
    assert [r["chunk_id"] for r in read_all(outs)] == [top << 16]
    for page_id in (1 << 47, -1):
        bad = write_articles(tmp_path / f"bad{page_id}.parquet", [(page_id, "cell cell")])
        with pytest.raises(chunk.InputFileError, match=rf"bad{page_id}.parquet: page_id outside"):
            run([bad], checkpoint, tmp_path / f"out{page_id}", shards=1)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda r: r.update(chunk_index=r["chunk_index"] + 1), "chunk_id != "),
        (lambda r: r.update(input_ids=r["input_ids"][1:]), "does not start with \\[CLS\\]"),
        (lambda r: r.update(input_ids=r["input_ids"][:-1]), "does not end with \\[SEP\\]"),
        (lambda r: r["input_ids"].__setitem__(2, r["input_ids"][-1]), "\\[CLS\\]/\\[SEP\\] inside"),
        (lambda r: r.update(input_ids=r["input_ids"] * 40), "length outside"),
        (lambda r: r.update(word_starts=[]), "no word start"),
        (lambda r: r.update(word_starts=r["word_starts"][1:]), "start with a word"),
        (lambda r: r.update(word_starts=r["word_starts"][:-1]), "not exactly its word-starting"),
        (lambda r: r["word_starts"].__setitem__(1, r["word_starts"][1] + 1), "not exactly"),
    ],
)
def test_validation_names_the_corrupted_row(default_run, checkpoint, corrupt, message):
    """Each rule of the chunks contract, broken in one row of a real batch, stops the stage."""
    outs, _ = default_run
    rows = pq.read_table(outs[0]).slice(0, 6).to_pylist()
    cfg = chunker.ChunkConfig.from_dict({"checkpoint": "x", "max_len": 64})
    worker = chunker.Chunker(str(checkpoint), cfg)

    def validate(rows):
        batch = pa.RecordBatch.from_pylist(rows, schema=contract.SCHEMA)
        special = (worker.cls_id, worker.sep_id)
        contract.validate_chunks(batch, 64, worker.continues_word, special, "here")

    validate(rows)  # the real rows pass
    target = next(i for i, r in enumerate(rows) if i > 0 and len(r["word_starts"]) > 2)
    corrupt(rows[target])
    with pytest.raises(ValueError, match=f"here: chunk \\d+ \\(row {target}\\) .*{message}"):
        validate(rows)


@pytest.mark.parametrize("folder", ["checkpoint", "tokenizer"])
def test_max_len_beyond_the_model_positions_is_refused_before_chunking(articles, checkpoint,
                                                                      tmp_path, folder):
    """max_len 1024 against a model of 512 positions: refused here, not hours later at the first
    forward of pre-training. A checkpoint says so in its config.json, a staged tokenizer folder in
    its manifest (stage_tokenizer records its source's)."""
    if folder == "tokenizer":
        source = {"name": "minilm-l2", "source": "local", "location": str(checkpoint)}
        checkpoints.stage_tokenizer(source, tmp_path / "tokenizer",
                                    data_root=str(checkpoint.parent))
        assert not (tmp_path / "tokenizer" / "config.json").exists()
        folder = tmp_path / "tokenizer"
    else:
        folder = checkpoint
    with pytest.raises(ConfigError, match="max_len is 1024 tokens.*max_position_embeddings 512"):
        run(articles, folder, tmp_path / "out", max_len=1024)
    assert not (tmp_path / "out").exists()  # refused before any work


def test_a_page_in_two_parts_is_named(checkpoint, tmp_path):
    a = write_articles(tmp_path / "a.parquet", [(7, "One sentence here.")])
    b = write_articles(tmp_path / "b.parquet", [(7, "Another one.")])
    with pytest.raises(ValueError, match="duplicate page_id 7"):
        run([a, b], checkpoint, tmp_path / "out", shards=2, processes=2)


def test_a_worker_killed_midway_fails_the_stage_instead_of_hanging(checkpoint, tmp_path):
    """As the kernel's OOM killer would: SIGKILL one worker. The stage must exit with the fix, not
    wait forever for the batch that worker held (multiprocessing.Pool did)."""
    docs = [json.loads(line) for line in SCIFACT.open()]
    rows = [(c * 10**6 + int(d["_id"]), d["title"] + "\n\n" + d["text"]) for c in range(6)
            for d in docs]
    articles = write_articles(tmp_path / "articles.parquet", rows)
    config = json.dumps({"checkpoint": "minilm-l2", "max_len": 128, "shards": 2})
    outs = [tmp_path / f"shard-{i}.parquet" for i in range(2)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "retrieval_pretraining.chunk", "--config", config, "--articles",
         str(articles), "--checkpoint", str(checkpoint), "--out", *map(str, outs),
         "--processes", "2", "--batch-size", "64"],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "workflow")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        worker = None
        deadline = time.monotonic() + 60
        while worker is None and time.monotonic() < deadline and proc.poll() is None:
            worker = next(iter(_spawned_workers(proc.pid)), None)
            time.sleep(0.2)
        assert worker is not None, "no worker process appeared"
        time.sleep(2)  # let it take batches
        os.kill(worker, signal.SIGKILL)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "worker process died" in output and "Lower --processes" in output, output[-2000:]
    assert not any(p.exists() for p in outs)


def _spawned_workers(pid: int) -> list[int]:
    """The multiprocessing workers among `pid`'s children (not its resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    workers = []
    for child in map(int, children):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmdline:
            workers.append(child)
    return workers


# ----------------------------------------- phase 2 puts whole runs in order when it can ---------
@pytest.fixture(scope="module")
def articles_in_page_order(tmp_path_factory):
    """What a dump gives: two parts, each in page order, the second's pages after the first's."""
    docs = [json.loads(line) for line in SCIFACT.open()][:200]
    rows = sorted((int(d["_id"]), d["title"] + "\n\n" + d["text"]) for d in docs)
    folder = tmp_path_factory.mktemp("ordered")
    return [write_articles(folder / "a.parquet", rows[:100]),
            write_articles(folder / "b.parquet", rows[100:])]


def test_merged_runs_write_what_a_sort_writes(articles_in_page_order, checkpoint, tmp_path,
                                             monkeypatch):
    merged = []
    merge = chunk._merged_runs
    monkeypatch.setattr(chunk, "_merged_runs", lambda streams: merged.append(len(streams)) or merge(streams))
    monkeypatch.setattr(chunk, "_sorted_in_memory", None)  # the sort must not be needed
    monkeypatch.setattr(chunk, "ROW_GROUP_ROWS", 50)  # several row groups, cut inside runs
    outs, stats = run(articles_in_page_order, checkpoint, tmp_path / "merged", shards=2)
    assert merged == [1, 1]  # one process: one stream per shard
    for out in outs:  # row groups cut inside a page's chunks still count each page once
        rows = pq.read_table(out)
        shard = json.loads(artifacts.manifest_path(out).read_text())["stats"]["shard"]
        assert pq.ParquetFile(out).metadata.num_row_groups > 2
        assert shard["pages"] == len(set(rows["page_id"].to_pylist()))
        assert shard["tokens"] == sum(len(ids) for ids in rows["input_ids"].to_pylist())

    def unordered(streams):
        raise chunk._RunsOutOfOrder
        yield

    monkeypatch.undo()
    monkeypatch.setattr(chunk, "ROW_GROUP_ROWS", 50)
    monkeypatch.setattr(chunk, "_merged_runs", unordered)  # force the sort
    sorted_outs, sorted_stats = run(articles_in_page_order, checkpoint, tmp_path / "sorted", shards=2)
    assert [p.read_bytes() for p in outs] == [p.read_bytes() for p in sorted_outs]
    assert stats == sorted_stats


def test_two_processes_merge_their_streams_into_the_same_shards(articles_in_page_order, checkpoint,
                                                                tmp_path):
    """Each worker spills its own stream per shard; phase 2 merges both (batches of 16 articles,
    so each stream holds several runs)."""
    one, _ = run(articles_in_page_order, checkpoint, tmp_path / "p1", shards=2)
    two, _ = run(articles_in_page_order, checkpoint, tmp_path / "p2", shards=2, processes=2)
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]
    for out in two:  # the manifest says how: here without a sort
        manifest = json.loads(artifacts.manifest_path(out).read_text())
        assert manifest["stats"]["shard"]["ordered_by"] == "merging runs"


@pytest.mark.parametrize("statistics", [True, False])
def test_dump_parts_are_read_in_page_order_not_name_order(checkpoint, tmp_path, statistics):
    """Real part names sort wrong as text (multistream10 before multistream2): read in that order,
    a stream gets pages 200.. before pages 1.., and phase 2 would sort every shard in memory.
    Without row-group statistics the first page_id comes from the column itself."""
    docs = [json.loads(line) for line in SCIFACT.open()][:200]
    texts = [d["title"] + "\n\n" + d["text"] for d in docs]
    low = [(page, texts[page - 1]) for page in range(1, 101)]
    high = [(page, texts[page - 101]) for page in range(200, 301)]
    parts = []
    for name, rows in [("enwiki-20230301-pages-articles-multistream10.xml-p200p300.parquet", high),
                       ("enwiki-20230301-pages-articles-multistream2.xml-p1p100.parquet", low)]:
        table = pa.table({"page_id": pa.array([r[0] for r in rows], pa.int64()),
                          "text": pa.array([r[1] for r in rows], pa.large_string())})
        pq.write_table(table, tmp_path / name, write_statistics=statistics)
        parts.append(tmp_path / name)
    assert sorted(parts)[0].name.startswith("enwiki-20230301-pages-articles-multistream10")
    outs, _ = run(parts, checkpoint, tmp_path / "chunks", shards=2)
    for out in outs:
        manifest = json.loads(artifacts.manifest_path(out).read_text())
        assert manifest["stats"]["shard"]["ordered_by"] == "merging runs"


def _streams(folder: Path, *per_process: list[list[int]]) -> list[Path]:
    """Spill streams as processes leave them: each a list of runs (chunk ids of page 0..)."""
    paths = []
    for pid, runs in enumerate(per_process):
        paths.append(folder / f"{pid}-0000.arrows")
        with pa.ipc.new_stream(pa.OSFile(str(paths[-1]), "wb"), contract.SCHEMA) as sink:
            for ids in runs:
                n = len(ids)
                sink.write_batch(pa.record_batch(
                    [pa.array(ids, pa.int64()), pa.array(ids, pa.int64()), pa.array([0] * n, pa.int32()),
                     pa.array([[101, 102]] * n, pa.list_(pa.int32())), pa.array([[]] * n, pa.list_(pa.int32()))],
                    schema=contract.SCHEMA))
    return paths


def test_runs_merge_in_order_and_an_overlap_or_unsorted_run_asks_for_a_sort(tmp_path):
    def merged(*per_process):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        return [r.column(0).to_pylist() for r in chunk._merged_runs(_streams(folder, *per_process))]

    assert merged([[1, 2], [7], [9, 10]], [[], [3, 5]], [[6]]) == [[1, 2], [3, 5], [6], [7], [9, 10]]
    assert merged() == [] and merged([[]]) == []
    for bad in ([[[1, 5]], [[3, 4]]],  # two runs overlap
                [[[1, 2]], [[2, 3]]],  # one chunk id twice (a page in two article parts)
                [[[2, 1]]],  # a run out of order
                [[[5], [1]]]):  # a process's runs out of order (articles not in page order)
        with pytest.raises(chunk._RunsOutOfOrder):
            merged(*bad)


_MEASURE_FINISH = """
from retrieval_pretraining import chunk, chunker

def unordered(streams):
    raise chunk._RunsOutOfOrder
    yield

spill, out = Path(sys.argv[2]), Path(sys.argv[3])
chunk.ROW_GROUP_ROWS = 2048  # many row groups at 1x already, so 1x and 10x hold the same one
if sys.argv[4] == "sort":  # the control: every shard sorted in memory, as phase 2 once did
    chunk._merged_runs = unordered
cfg = chunker.ChunkConfig.from_dict({"checkpoint": "x", "max_len": 128, "shards": 1})
before = status_kb("VmRSS")
chunk._finish_shard(0, spill, out, cfg)
print(json.dumps({"peak_grew_kb": status_kb("VmHWM") - before}))
"""


def _spill(folder: Path, chunks: int, batch: int = 2048) -> int:
    """A shard's spill as two workers leave it: batches of consecutive pages (one 128-token
    chunk each) alternating between the two streams. Returns its bytes."""
    import numpy as np

    folder.mkdir(parents=True)
    sinks = [pa.ipc.new_stream(pa.OSFile(str(folder / f"{pid}-0000.arrows"), "wb"), contract.SCHEMA)
             for pid in (1, 2)]
    for k, start in enumerate(range(0, chunks, batch)):
        pages = np.arange(start, min(start + batch, chunks), dtype=np.int64)
        ids = pa.ListArray.from_arrays(np.arange(len(pages) + 1, dtype=np.int32) * 128,
                                       pa.array(np.ones(len(pages) * 128, dtype=np.int32)))
        words = pa.ListArray.from_arrays(np.zeros(len(pages) + 1, dtype=np.int32),
                                         pa.array([], pa.int32()))
        sinks[k % 2].write_batch(pa.record_batch(
            [pa.array(pages << contract.CHUNK_INDEX_BITS), pa.array(pages),
             pa.array(np.zeros(len(pages), dtype=np.int32)), ids, words], schema=contract.SCHEMA))
    for sink in sinks:
        sink.close()
    return sum(p.stat().st_size for p in folder.iterdir())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_phase_two_holds_no_sorted_copy_of_its_shard_at_10x(tmp_path):
    import memory_probe

    chunks, peak, size = 8_000, {}, {}
    for scale in (1, 10):
        size[scale] = _spill(tmp_path / f"spill{scale}", chunks * scale)
        for how in ("runs", "sort") if scale == 10 else ("runs",):
            out = tmp_path / f"out-{scale}-{how}.parquet"
            peak[scale, how] = memory_probe.run(_MEASURE_FINISH, tmp_path / f"spill{scale}", out,
                                                how)["peak_grew_kb"]
    grown_kb = (size[10] - size[1]) // 1024  # ~35 MB more spill
    # A merge holds a row group (2,048 chunks of 128 tokens here: 1 MB of ids, its Parquet levels
    # and pages) and a batch per stream, whatever the shard's size: 9x more rows may add little.
    bound = 8 * 1024
    assert peak[10, "runs"] - peak[1, "runs"] <= bound, (peak, bound)
    # Control: sorting in memory reads the shard and copies it: the bound sees it.
    assert peak[10, "sort"] - peak[1, "runs"] > max(bound, grown_kb), (peak, bound, grown_kb)


_MEASURE_CHUNK_BATCH = """
import numpy as np
from retrieval_pretraining import chunker
checkpoint, text, articles = sys.argv[2], Path(sys.argv[3]).read_text(), int(sys.argv[4])
chunker.ENCODE_CHARS = int(sys.argv[5])
worker = chunker.Chunker(checkpoint, chunker.ChunkConfig(checkpoint="x", max_len=512))
worker.chunk_batch(np.arange(2), [text[:5000]] * 2)  # warm: the tokenizer's first-call state
before = status_kb("VmRSS")
batch, _ = worker.chunk_batch(np.arange(articles), [text] * articles)
tokens = len(batch.column("input_ids").values)
print(json.dumps({"peak_grew_kb": status_kb("VmHWM") - before, "tokens": tokens}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_batch_of_long_articles_holds_tens_of_bytes_a_token(checkpoint, tmp_path):
    """A worker's peak while it chunks 3, then 30 articles of ~31k tokens (0.94M tokens): the
    tokenizer's Encoding objects and Python id lists (~150 bytes a token) live one slice of
    ENCODE_CHARS at a time, and the rows are placed by byte masks, so each further token costs the
    int32 ids and the masks and positions around them (~65 bytes). Control: the same batch
    encoded in one slice (ENCODE_CHARS past the batch), as it once was: ~115 bytes a token."""
    import memory_probe

    abstracts = [json.loads(line)["text"] for line in SCIFACT.open()]
    text = tmp_path / "article.txt"
    text.write_text("\n\n".join(abstracts[:100]))
    grown = {}
    for articles in (3, 30):
        for chars in (chunker.ENCODE_CHARS, 1 << 40) if articles == 30 else (chunker.ENCODE_CHARS,):
            grown[articles, chars] = memory_probe.run(_MEASURE_CHUNK_BATCH, checkpoint, text,
                                                      articles, chars)
    small, large = grown[3, chunker.ENCODE_CHARS], grown[30, chunker.ENCODE_CHARS]
    more_tokens = large["tokens"] - small["tokens"]

    def bytes_a_token(measured):
        return (measured["peak_grew_kb"] - small["peak_grew_kb"]) * 1024 / more_tokens

    assert bytes_a_token(large) <= 90, grown
    assert bytes_a_token(grown[30, 1 << 40]) > 90, grown


def test_a_killed_run_s_spill_folder_is_removed_by_the_rerun(default_run, articles, checkpoint,
                                                             tmp_path, monkeypatch):
    """A run killed outright (time limit, OOM killer) runs no clean-up: its spill folder (every
    chunk row: tens of GB of Wikipedia) stayed beside the shards and each rerun added one. The
    rerun removes its own run's spill, never another output's, and writes the same shards."""
    leftover = tmp_path / ".shard-0000.parquet.spill.k991ce18.tmp"  # the random part: tempfile's
    (leftover / "worker").mkdir(parents=True)
    (leftover / "worker" / "rows").write_bytes(b"x" * 100)
    other = tmp_path / ".other.parquet.spill.k991ce18.tmp"
    other.mkdir()
    from test_leftover_temps import recorded_temp_dirs

    made = recorded_temp_dirs(monkeypatch)
    outs, _ = run(articles, checkpoint, tmp_path)
    assert not leftover.exists() and other.exists()
    # What a kill would leave is named as the leftover above, so it is what the next run removes.
    assert [p.name[:-len("k991ce18.tmp")] for p in made] == [".shard-0000.parquet.spill."]
    assert made[0].name.endswith(".tmp") and made[0].parent == tmp_path
    assert [p.read_bytes() for p in outs] == [p.read_bytes() for p in default_run[0]]
