"""The span index: laws by statistical tests, word spans by decoding, determinism by re-sharding."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats as st

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from retrieval_pretraining import artifacts, audit, checkpoints, chunk, chunker  # noqa: E402
from retrieval_pretraining import span_audit, spans, wordpiece  # noqa: E402
from retrieval_pretraining.contracts import spans as contract  # noqa: E402

from full_disk import files_under, full_disk, is_full_disk_error  # noqa: E402
from shipped_data import ONE_LAYER_MINILM, ROOT, SCIFACT_CORPUS  # noqa: E402
SCIFACT = SCIFACT_CORPUS
DEMO_CHECKPOINT = ONE_LAYER_MINILM
COSTA = {
    "word": {"enabled": True},
    "phrase": {"enabled": True, "min_len": 4, "max_len": 16},
    "sentence": {"enabled": True, "min_len": 16, "max_len": 64},
    "paragraph": {"enabled": True, "min_len": 64, "max_len": 128},
}


def span_entry(granularities=COSTA, **overrides):
    """A `spans` config entry with the global seed: the slice rules sample_spans and audit_spans
    pass their module as --config."""
    return {
        "name": "t",
        "seed": 7,
        "spans_per_granularity": 5,
        "beta_alpha": 4.0,
        "beta_beta": 2.0,
        "short_chunk": "clip",
        "granularities": granularities,
        **overrides,
    }


def span_config(granularities=COSTA, **overrides):
    return spans.SpanConfig.from_dict(span_entry(granularities, **overrides))


def only(name, min_len=None, max_len=None):
    """A granularities block with one granularity switched on."""
    block = {g: {"enabled": False, "min_len": 1, "max_len": 1} for g in contract.GRANULARITIES}
    block["word"] = {"enabled": name == "word"}
    if name != "word":
        block[name] = {"enabled": True, "min_len": min_len, "max_len": max_len}
    return block


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "minilm-l2"
    checkpoints.stage(DEMO_CHECKPOINT, out)
    return out


@pytest.fixture(scope="module")
def words(checkpoint):
    return spans.WordTable(checkpoint)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return wordpiece.load_tokenizer(checkpoint)


def synthetic_chunks(tokenizer, text_lengths, first_id=1000):
    """Chunks of one-piece non-stop words ("cell"), with the given numbers of text tokens."""
    cls, sep, cell = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "cell"))
    return pa.RecordBatch.from_pydict(
        {
            "chunk_id": pa.array(np.arange(first_id, first_id + len(text_lengths)), pa.int64()),
            "input_ids": pa.array(
                [[cls] + [cell] * n + [sep] for n in text_lengths], pa.list_(pa.int32())
            ),
            "word_starts": pa.array(
                [list(range(1, n + 1)) for n in text_lengths], pa.list_(pa.int32())
            ),
        }
    )


def spans_of(batch, g):
    """(chunk row, start, end) of every span of granularity g."""
    out = []
    for row, (s, e, gr) in enumerate(
        zip(
            batch.column("span_start").to_pylist(),
            batch.column("span_end").to_pylist(),
            batch.column("granularity").to_pylist(),
        )
    ):
        out += [(row, a, b) for a, b, c in zip(s, e, gr) if c == g]
    return out


def test_lengths_follow_the_scaled_beta(tokenizer, words):
    # A range so wide that rounding is invisible: the KS test then sees Beta(4, 2) itself.
    lmin, lmax = 1, 10_001
    cfg = span_config(only("phrase", lmin, lmax), spans_per_granularity=50)
    batch = synthetic_chunks(tokenizer, [lmax] * 400)
    out = spans.sample_batch(batch, cfg, words, {})
    p = np.array([(e - s - lmin) / (lmax - lmin) for _, s, e in spans_of(out, 1)])
    assert len(p) == 20_000
    assert st.kstest(p, st.beta(4, 2).cdf).pvalue > 0.01
    assert (
        st.kstest(p, st.beta(4, 2.3).cdf).pvalue < 1e-6
    )  # the test can tell a slightly different law


def test_rounding_reaches_both_ends(tokenizer, words):
    # round-half-up of p * 12 + 4: P(16) = 1 - F(1 - 0.5 / 12) and P(4) = F(0.5 / 12).
    cfg = span_config(only("phrase", 4, 16), spans_per_granularity=50)
    out = spans.sample_batch(synthetic_chunks(tokenizer, [40] * 2000), cfg, words, {})
    lengths = np.array([e - s for _, s, e in spans_of(out, 1)])
    assert lengths.min() >= 4 and lengths.max() == 16
    expected = 1 - st.beta(4, 2).cdf(1 - 0.5 / 12)
    sigma = np.sqrt(expected * (1 - expected) / len(lengths))
    assert abs((lengths == 16).mean() - expected) < 4 * sigma


def test_starts_are_uniform_over_valid_starts(tokenizer, words):
    n, length = 30, 10
    cfg = span_config(only("sentence", length, length), spans_per_granularity=5)
    out = spans.sample_batch(synthetic_chunks(tokenizer, [n] * 4000), cfg, words, {})
    starts = np.array([s for _, s, _ in spans_of(out, 2)])
    counts = np.bincount(starts, minlength=n - length + 2)
    assert counts[0] == 0 and counts[1] > 0 and counts[n - length + 1] > 0
    assert len(counts) == n - length + 2  # never a start that would cover [SEP]
    assert st.chisquare(counts[1:]).pvalue > 0.001


def test_each_eligible_word_is_drawn_equally_often(tokenizer, words):
    """A word span is a uniform draw among the chunk's eligible words, the last one included:
    chunks "the cell the cell the cell" hold 3 eligible words (tokens 2, 4, 6; "the" is a stop
    word), each drawn with probability 1/3."""
    cls, sep, the, cell = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "the", "cell"))
    n_chunks = 2000
    batch = pa.RecordBatch.from_pydict({
        "chunk_id": pa.array(np.arange(1000, 1000 + n_chunks), pa.int64()),
        "input_ids": pa.array([[cls] + [the, cell] * 3 + [sep]] * n_chunks, pa.list_(pa.int32())),
        "word_starts": pa.array([list(range(1, 7))] * n_chunks, pa.list_(pa.int32())),
    })
    out = spans.sample_batch(batch, span_config(only("word")), words, {})
    got = spans_of(out, 0)
    assert len(got) == 5 * n_chunks and all(e == s + 1 for _, s, e in got)
    counts = np.bincount([s for _, s, _ in got], minlength=8)
    assert counts[[0, 1, 3, 5, 7]].sum() == 0  # never [CLS], a stop word or [SEP]
    assert st.chisquare(counts[[2, 4, 6]]).pvalue > 0.001, counts


def test_a_word_whose_first_piece_is_a_stop_word_is_eligible_and_unk_never(words, tokenizer):
    """The stop-word filter reads whole words: "inbound" (in ##bound) and "upregulated" (up ##re
    ##gul ##ated) begin with a stop word's piece and are words of their own; "hereupon" (here
    ##up ##on) is a stop word of several pieces. [UNK] is a special token, never a word span,
    though its text has letters (filtering a one-piece stop word by its first piece alone, or
    [UNK] by its letters, would each pass the tests above)."""
    text = "inbound upregulated hereupon glaciers"
    ids = tokenizer.encode(text, add_special_tokens=False).ids + [tokenizer.token_to_id("[UNK]")]
    tokens = [tokenizer.id_to_token(i) for i in ids]
    assert tokens[:2] == ["in", "##bound"] and tokens[2:4] == ["up", "##re"]
    kept = eligible_words(words, tokens, ids)
    assert kept == ["inbound", "upregulated", "glaciers"], kept


def eligible_words(words, tokens, ids):
    """The words of `ids` (a word: a piece and the "##" pieces after it) that `words` lets be a
    word span, as text."""
    ids = np.array(ids)
    starts = np.flatnonzero([not t.startswith("##") for t in tokens])
    lengths = np.diff(np.append(starts, len(ids)))
    eligible = words.eligible(ids, starts, lengths)
    return ["".join(tokens[s:s + n]).replace("##", "") for s, n, e in
            zip(starts, lengths, eligible) if e]


def test_a_cased_vocabulary_filters_stop_words_in_any_case(tmp_path):
    """Every shipped checkpoint is uncased; a cased one (bert-base-cased) keeps "The" and "THE" as
    pieces of their own, and splits "Hereupon" into pieces other than "hereupon"'s. A stop word
    is a stop word in lower, title and upper case, of one piece or several; a word that is no
    stop word ("Cell", "CELL", and "Inbound", whose first piece "In" is one) stays eligible."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "The", "THE", "here", "Here",
             "HERE", "##up", "##UP", "##on", "##ON", "In", "##bound", "cell", "Cell", "CELL"]
    BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=False
                      ).save_pretrained(tmp_path)
    tokenizer, words = wordpiece.load_tokenizer(tmp_path), spans.WordTable(tmp_path)

    def kept(text):
        encoding = tokenizer.encode(text, add_special_tokens=False)
        assert vocab.index("[UNK]") not in encoding.ids, encoding.tokens  # the vocabulary is cased
        return eligible_words(words, encoding.tokens, encoding.ids)

    assert tokenizer.encode("HEREUPON", add_special_tokens=False).tokens == ["HERE", "##UP", "##ON"]
    assert kept("the The THE") == []
    assert kept("hereupon Hereupon HEREUPON") == []
    assert kept("cell Cell CELL Inbound") == ["cell", "Cell", "CELL", "Inbound"]


def test_a_chunk_without_an_eligible_word_gets_no_word_span(tokenizer, words):
    """A chunk of stop words only, between two chunks with words: no word span of its own (a
    span drawn among the next chunk's words would lie outside it), counted in the statistics;
    its neighbours keep all of theirs."""
    cls, sep, the, cell = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "the", "cell"))
    texts = [[the, cell, the], [the, the, the], [cell, the, cell]]
    batch = pa.RecordBatch.from_pydict({
        "chunk_id": pa.array([1000, 1001, 1002], pa.int64()),
        "input_ids": pa.array([[cls, *t, sep] for t in texts], pa.list_(pa.int32())),
        "word_starts": pa.array([[1, 2, 3]] * 3, pa.list_(pa.int32())),
    })
    stats = {}
    out = spans.sample_batch(batch, span_config(only("word")), words, stats)
    got = spans_of(out, 0)
    assert sorted({row for row, _, _ in got}) == [0, 2] and len(got) == 10
    assert all(texts[row][s - 1] == cell and e == s + 1 for row, s, e in got)
    assert stats["word"]["chunks_without_eligible_word"] == 1
    assert stats["word"]["skipped"] == 5 and stats["word"]["spans"] == 10


@pytest.mark.parametrize("rule", ["skip", "resample", "clip"])
def test_a_length_equal_to_the_chunk_s_text_fits(rule, tokenizer, words):
    """A drawn length of exactly n (the chunk's text tokens) fits: the span is the whole text,
    kept as drawn by every rule, and counted as neither skipped, resampled nor clipped. Chunks
    of n = lmax = 16 tokens: P(length 16) is about 0.016 (test_rounding_reaches_both_ends)."""
    cfg = span_config(only("phrase", 4, 16), short_chunk=rule, spans_per_granularity=5)
    stats = {}
    out = spans.sample_batch(synthetic_chunks(tokenizer, [16] * 2000), cfg, words, stats)
    lengths = np.array([e - s for _, s, e in spans_of(out, 1)])
    assert len(lengths) == 10_000 and (lengths == 16).sum() > 100  # ~160, sd ~13
    counts = stats["phrase"]
    assert counts["skipped"] == counts["resampled"] == counts["clipped"] == 0, counts


def test_the_short_chunk_counts_agree_across_rules(tokenizer, words):
    """The three rules see the same draws (the same seed and chunk ids): the lengths that do not
    fit a chunk are clipped by `clip`, skipped by `skip`, and by `resample` resampled where lmin
    fits, skipped where it does not. So resampled = skipped(skip) - skipped(resample) and
    clipped = skipped(skip)."""
    n = [3, 10, 40, 100, 200]
    counts = {}
    for rule in ("clip", "skip", "resample"):
        stats = {}
        cfg = span_config(only("paragraph", 64, 128), short_chunk=rule, spans_per_granularity=20)
        spans.sample_batch(synthetic_chunks(tokenizer, n), cfg, words, stats)
        counts[rule] = stats["paragraph"]
    assert counts["resample"]["skipped"] == 60  # the chunks of 3, 10 and 40 tokens
    assert counts["clip"]["clipped"] == counts["skip"]["skipped"] > 60
    assert counts["resample"]["resampled"] == counts["skip"]["skipped"] - 60


@pytest.fixture(scope="module")
def scifact_chunks(checkpoint, tmp_path_factory):
    docs = [json.loads(line) for line in SCIFACT.open()][:300]
    folder = tmp_path_factory.mktemp("corpus")
    table = pa.table(
        {
            "page_id": pa.array([int(d["_id"]) for d in docs], pa.int64()),
            "text": pa.array([d["title"] + "\n\n" + d["text"] for d in docs], pa.large_string()),
        }
    )
    pq.write_table(table, folder / "articles.parquet")
    outs = {}
    for shards in (1, 3):
        cfg = chunker.ChunkConfig.from_dict(
            {"checkpoint": "x", "max_len": 128, "min_tail_len": 16, "shards": shards}
        )
        outs[shards] = [folder / f"s{shards}" / f"shard-{i:04d}.parquet" for i in range(shards)]
        chunk.chunk_corpus([folder / "articles.parquet"], checkpoint, outs[shards], cfg)
    return outs


def test_the_index_follows_the_span_contract(scifact_chunks, checkpoint, tmp_path):
    """The writer's output is its contract's: the contract's schema, and every audit check passes
    (in the results/ layout, where audit finds the chunks shard beside the spans)."""
    corpus = tmp_path / "results" / "corpus"
    chunks = corpus / "chunks" / "shard-0000.parquet"
    chunks.parent.mkdir(parents=True)
    shutil.copy(scifact_chunks[1][0], chunks)
    shutil.copy(artifacts.manifest_path(scifact_chunks[1][0]), artifacts.manifest_path(chunks))
    out = corpus / "spans" / "t" / "shard-0000.parquet"
    spans.sample_shard(chunks, checkpoint, out, span_config())
    assert pq.read_schema(out) == contract.SCHEMA
    result = audit.audit(out)
    assert result.kind == "spans" and result.passed, result.render()


def test_word_spans_are_whole_non_stop_words(scifact_chunks, checkpoint, tokenizer, tmp_path):
    from spacy.lang.en.stop_words import STOP_WORDS

    out = tmp_path / "spans.parquet"
    spans.sample_shard(scifact_chunks[1][0], checkpoint, out, span_config(spans_per_granularity=20))
    chunks = pq.read_table(scifact_chunks[1][0]).to_pylist()
    index = pq.read_table(out)
    stop_seen = 0
    for row, s, e in spans_of(index, 0):
        tokens = [tokenizer.id_to_token(i) for i in chunks[row]["input_ids"]]
        stop_seen += sum(t in STOP_WORDS for t in tokens)
        piece = tokens[s:e]
        assert not piece[0].startswith("##") and all(t.startswith("##") for t in piece[1:])
        assert e == len(tokens) - 1 or not tokens[e].startswith("##")  # the word ends at e
        word = "".join(t.removeprefix("##") for t in piece)
        assert word not in STOP_WORDS and any(c.isalnum() for c in word), word
        assert word not in {"s", "t", "ve", "ll", "re"}
    assert stop_seen > 1000  # the chunks are full of stop words: the test could fail


def test_no_piece_of_a_contraction_is_a_word_span(words, tokenizer):
    """BERT splits "don't" into don ' t: neither the stem nor the remnant is a word of its own.
    "won" (won't) stays eligible, as the verb it usually is; content words stay eligible."""
    text = ("I don't know why he isn't here; they didn't, couldn't, wouldn't, doesn't, wasn't, "
            "aren't, weren't, hasn't, won't, shan't, can't. Glaciers won prizes.")
    ids = np.array(tokenizer.encode(text, add_special_tokens=False).ids)
    tokens = [tokenizer.id_to_token(i) for i in ids]
    starts = np.flatnonzero([not t.startswith("##") for t in tokens])
    lengths = np.diff(np.append(starts, len(ids)))
    eligible = words.eligible(ids, starts, lengths)
    kept = ["".join(tokens[s:s + n]).replace("##", "") for s, n, e in
            zip(starts, lengths, eligible) if e]
    assert kept == ["know", "won", "glaciers", "won", "prizes"], kept


def test_index_is_identical_for_any_shard_count_or_batch_size(scifact_chunks, checkpoint, tmp_path):
    cfg = span_config()
    rows = {}
    for shards, paths in scifact_chunks.items():
        outs = []
        for i, path in enumerate(paths):
            outs.append(tmp_path / f"{shards}-{i}.parquet")
            spans.sample_shard(
                path, checkpoint, outs[-1], cfg, batch_size=37 if shards == 3 else 8192
            )
        table = pa.concat_tables([pq.read_table(p) for p in outs])
        rows[shards] = sorted(table.to_pylist(), key=lambda r: r["chunk_id"])
    assert rows[1] == rows[3]
    # Row order does not matter either: the same chunks reversed give the same spans per chunk.
    table = pq.read_table(scifact_chunks[1][0])
    reversed_path = tmp_path / "reversed-chunks.parquet"
    pq.write_table(table.take(np.arange(table.num_rows)[::-1].copy()), reversed_path)
    artifacts.manifest_path(reversed_path).write_text(
        artifacts.manifest_path(scifact_chunks[1][0]).read_text()
    )
    spans.sample_shard(reversed_path, checkpoint, tmp_path / "reversed.parquet", cfg)
    backwards = pq.read_table(tmp_path / "reversed.parquet").to_pylist()
    assert sorted(backwards, key=lambda r: r["chunk_id"]) == rows[1]
    again = tmp_path / "again.parquet"
    spans.sample_shard(scifact_chunks[1][0], checkpoint, again, cfg)
    assert again.read_bytes() == (tmp_path / "1-0.parquet").read_bytes()
    # a different seed gives a different index
    spans.sample_shard(scifact_chunks[1][0], checkpoint, again, span_config(seed=8))
    assert pq.read_table(again).to_pylist() != rows[1]
    manifest = artifacts.read_json(artifacts.manifest_path(again))
    assert manifest["stats"]["granularities"]["phrase"]["spans"] == 5 * manifest["stats"]["chunks"]



def test_a_full_disk_during_the_shard_write_leaves_no_shard_and_a_rerun_recovers(
    scifact_chunks, checkpoint, tmp_path
):
    """The disk fills half-way through the Parquet write: the stage fails with the OS error, the
    shard folder holds nothing (no shard, no manifest, no temp file), and the same command run
    once there is space again writes the shard a clean run writes, byte for byte."""
    cfg = span_config()
    clean = tmp_path / "clean" / "shard-0000.parquet"
    spans.sample_shard(scifact_chunks[1][0], checkpoint, clean, cfg)
    out = tmp_path / "spans" / "shard-0000.parquet"
    with pytest.raises(OSError) as error, full_disk(clean.stat().st_size // 2):
        spans.sample_shard(scifact_chunks[1][0], checkpoint, out, cfg)
    assert is_full_disk_error(error.value), error.value
    assert files_under(out.parent) == []
    spans.sample_shard(scifact_chunks[1][0], checkpoint, out, cfg)
    assert out.read_bytes() == clean.read_bytes()

def test_the_stage_validates_each_batch_before_writing(scifact_chunks, checkpoint, tmp_path,
                                                       monkeypatch):
    """A sampler that put a span on [CLS] is stopped by the contract's validator in the stage
    itself: sample_shard raises and writes no shard and no manifest."""
    sample = spans.sample_batch

    def onto_cls(batch, cfg, words, stats):
        out = sample(batch, cfg, words, stats)
        starts = out.column("span_start").to_pylist()
        starts[0][0] = 0
        field = out.schema.field("span_start")
        return out.set_column(1, field, pa.array(starts, field.type))

    monkeypatch.setattr(spans, "sample_batch", onto_cls)
    out = tmp_path / "spans" / "shard-0000.parquet"
    with pytest.raises(ValueError, match="not inside the text tokens"):
        spans.sample_shard(scifact_chunks[1][0], checkpoint, out, span_config())
    assert not out.exists() and not artifacts.manifest_path(out).exists()


def test_chunks_of_another_vocabulary_are_refused(scifact_chunks, checkpoint, tmp_path):
    """The chunk manifest's vocabulary fingerprint must be the tokenizer's: chunks tokenised
    with another vocabulary hold other ids, and their word spans would be meaningless."""
    chunks = tmp_path / "chunks.parquet"
    shutil.copy(scifact_chunks[1][0], chunks)
    manifest = artifacts.read_json(artifacts.manifest_path(scifact_chunks[1][0]))
    manifest["stats"]["tokenizer"]["vocab_sha256"] = "0" * 64
    artifacts.manifest_path(chunks).write_text(json.dumps(manifest))
    out = tmp_path / "spans.parquet"
    with pytest.raises(spans.InputFileError, match="another vocabulary"):
        spans.sample_shard(chunks, checkpoint, out, span_config())
    del manifest["stats"]["tokenizer"]["vocab_sha256"]
    artifacts.manifest_path(chunks).write_text(json.dumps(manifest))
    with pytest.raises(spans.InputFileError, match="records no stats.tokenizer.vocab_sha256"):
        spans.sample_shard(chunks, checkpoint, out, span_config())
    assert not out.exists()


@pytest.mark.parametrize("rule", ["clip", "skip", "resample"])
def test_short_chunk_rules(rule, tokenizer, words):
    n = [3, 10, 40, 100, 200]  # text tokens; the paragraph granularity is 64..128
    cfg = span_config(only("paragraph", 64, 128), short_chunk=rule, spans_per_granularity=20)
    stats = {}
    out = spans.sample_batch(synthetic_chunks(tokenizer, n), cfg, words, stats)
    contract.validate_spans(out, synthetic_chunks(tokenizer, n), cfg, words, "test")
    per_chunk = {row: [] for row in range(len(n))}
    for row, s, e in spans_of(out, 3):
        per_chunk[row].append(e - s)
        assert 1 <= s and e <= n[row] + 1
    assert all(64 <= x <= 128 for x in per_chunk[4]) and len(per_chunk[4]) == 20
    counts = stats["paragraph"]
    if rule == "clip":
        assert per_chunk[0] == [3] * 20 and per_chunk[1] == [10] * 20 and per_chunk[2] == [40] * 20
        assert all(64 <= x <= 100 for x in per_chunk[3]) and 100 in per_chunk[3]
        assert 60 < counts["clipped"] <= 60 + per_chunk[3].count(100) and counts["skipped"] == 0
    else:
        assert per_chunk[0] == per_chunk[1] == per_chunk[2] == []
        assert all(64 <= x <= 100 for x in per_chunk[3])
        if rule == "skip":
            assert 0 < len(per_chunk[3]) < 20  # P(length <= 100) is about 0.29
            assert counts["skipped"] == 60 + 20 - len(per_chunk[3])
        else:
            assert len(per_chunk[3]) == 20 and counts["resampled"] > 0 and counts["skipped"] == 60


@pytest.mark.parametrize(
    "granularity, lmin, lmax, text_lengths",
    [("phrase", 4, 16, [4, 7, 12]), ("sentence", 16, 64, [20, 40, 60]),
     ("paragraph", 64, 128, [64, 100, 120])],
)
def test_resampled_lengths_follow_the_beta_law_conditioned_on_fitting(
    granularity, lmin, lmax, text_lengths, tokenizer, words
):
    """short_chunk: resample draws from P(length = k | length <= n), exactly: the empirical CDF
    of 20,000 lengths per chunk length is within the KS bound of the exact conditional CDF
    (redrawing from the uniform that failed piled lengths next to n: paragraph, n = 100, mean
    94.6 instead of 92.2, KS distance 0.20)."""
    per_length = 4000
    cfg = span_config(only(granularity, lmin, lmax), short_chunk="resample",
                      spans_per_granularity=5)
    g = contract.GRANULARITIES.index(granularity)
    cdf = spans.length_cdf(lmin, lmax, 4.0, 2.0)
    for n in text_lengths:
        batch = synthetic_chunks(tokenizer, [n] * per_length, first_id=n * 10**6)
        lengths = np.array([e - s for _, s, e in spans_of(spans.sample_batch(batch, cfg, words, {}), g)])
        assert len(lengths) == 5 * per_length and lengths.max() <= n
        support = np.arange(lmin, min(n, lmax) + 1)
        exact = cdf[: len(support)] / cdf[len(support) - 1]  # P(L <= k | L <= n)
        empirical = np.searchsorted(np.sort(lengths), support, side="right") / len(lengths)
        distance = np.abs(empirical - exact).max()
        assert distance < 1.63 / np.sqrt(len(lengths)), (n, distance)  # KS, 1% level
        pmf = np.diff(np.concatenate([[0.0], exact]))
        assert abs(lengths.mean() - (support * pmf).sum()) <= 4 * lengths.std() / np.sqrt(len(lengths))


def test_validation_fails_loudly_on_a_bad_span(tokenizer, words):
    batch = synthetic_chunks(tokenizer, [20])
    the = tokenizer.token_to_id("the")
    ids = batch.column("input_ids").to_pylist()[0]
    ids[3] = the
    batch = batch.set_column(1, "input_ids", pa.array([ids], pa.list_(pa.int32())))
    cfg = span_config(only("word"))
    bad = pa.RecordBatch.from_pydict(
        {
            "chunk_id": batch.column("chunk_id"),
            "span_start": pa.array([[3]], pa.list_(pa.int32())),
            "span_end": pa.array([[4]], pa.list_(pa.int32())),
            "granularity": pa.array([[0]], pa.list_(pa.int8())),
        }
    )
    with pytest.raises(ValueError, match="chunk 1000 span 0 .*stop word"):
        contract.validate_spans(bad, batch, cfg, words, "test")
    cfg = span_config(only("phrase", 4, 16))
    bad = bad.set_column(2, "span_end", pa.array([[30]], pa.list_(pa.int32())))
    bad = bad.set_column(3, "granularity", pa.array([[1]], pa.list_(pa.int8())))
    with pytest.raises(ValueError, match="not inside the text tokens"):
        contract.validate_spans(bad, batch, cfg, words, "test")
    # A phrase span inside the text but shorter than the granularity's minimum (and not a clip).
    bad = bad.set_column(2, "span_end", pa.array([[5]], pa.list_(pa.int32())))
    with pytest.raises(ValueError, match=r"length outside \[4, 16\]"):
        contract.validate_spans(bad, batch, cfg, words, "test")
    # A word span covering two words (tokens 5 and 6 of the synthetic chunk are separate words).
    word_starts = batch.column("word_starts").to_pylist()[0]
    assert 5 in word_starts and 6 in word_starts and 7 in word_starts
    bad = bad.set_column(1, "span_start", pa.array([[5]], pa.list_(pa.int32())))
    bad = bad.set_column(2, "span_end", pa.array([[7]], pa.list_(pa.int32())))
    bad = bad.set_column(3, "granularity", pa.array([[0]], pa.list_(pa.int8())))
    with pytest.raises(ValueError, match="not one whole word"):
        contract.validate_spans(bad, batch, span_config(only("word")), words, "test")


def test_audit_artifacts(scifact_chunks, checkpoint, tmp_path):
    """Through span_audit's own entry, as rule audit_spans runs it."""
    cfg = span_config()
    outs = []
    for i, path in enumerate(scifact_chunks[3]):
        outs.append(tmp_path / f"shard-{i:04d}.parquet")
        spans.sample_shard(path, checkpoint, outs[-1], cfg)
    span_audit.main([str(a) for a in (
        "--config", json.dumps(span_entry()), "--chunks", *scifact_chunks[3], "--spans", *outs,
        "--checkpoint", checkpoint, "--plot", tmp_path / "lengths.png",
        "--sample", tmp_path / "sample.md")])
    assert (tmp_path / "lengths.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sample = (tmp_path / "sample.md").read_text()
    assert sample.count("| phrase |") == 15 and "## chunk" in sample



# Run in a fresh process, so that Arrow's peak allocation is the audit's alone.
_AUDIT_PEAK = """
import sys
import pyarrow as pa
from retrieval_pretraining import span_audit
from test_spans import span_config
chunks, checkpoint, out, *span_paths = sys.argv[1:]
span_audit.audit_spans([chunks], span_paths, checkpoint, span_config(), f"{out}/lengths.png",
                       f"{out}/sample.md", max_chunks=500)
print(pa.default_memory_pool().max_memory())
"""


def test_the_audit_reads_only_the_rows_it_shows(checkpoint, tmp_path):
    """sample.md shows 3 chunks and the plot max_chunks: the audit holds the first row groups
    only, not the whole first chunks shard (~0.7 GB at paper scale) or every span shard."""
    rng = np.random.default_rng(0)
    rows, tokens, spans_per_chunk = 20_000, 128, 60
    ids = pa.array([rng.integers(1000, 30000, tokens, dtype=np.int32) for _ in range(rows)])
    chunk_ids = pa.array(np.arange(rows, dtype=np.int64) << 16)
    chunks = pa.table({"chunk_id": chunk_ids, "page_id": pa.array(np.arange(rows)),
                       "chunk_index": pa.array(np.zeros(rows, np.int32)), "input_ids": ids,
                       "word_starts": ids})
    starts = [rng.integers(1, 60, spans_per_chunk, dtype=np.int32) for _ in range(rows)]
    kinds = pa.array([np.full(spans_per_chunk, 1, np.int8)] * rows, pa.list_(pa.int8()))
    span_table = pa.table([chunk_ids, pa.array(starts), pa.array([s + 4 for s in starts]), kinds],
                          schema=contract.SCHEMA)
    pq.write_table(chunks, tmp_path / "chunks.parquet", row_group_size=1000)
    span_paths = [tmp_path / f"spans-{i}.parquet" for i in range(3)]
    for path in span_paths:
        pq.write_table(span_table, path, row_group_size=1000)
    whole = chunks.nbytes + 3 * span_table.nbytes
    assert whole > 50 << 20
    path = os.pathsep.join([str(ROOT / "workflow"), str(ROOT / "tests")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", _AUDIT_PEAK, str(tmp_path / "chunks.parquet"),
                           str(checkpoint), str(tmp_path), *map(str, span_paths)],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    peak = int(done.stdout.split()[-1])
    assert peak < whole / 10, (peak, whole)
    manifest = json.loads(artifacts.manifest_path(tmp_path / "sample.md").read_text())
    assert manifest["stats"]["chunks_read"] == 500
    assert manifest["stats"]["spans_plotted"]["phrase"] == 500 * spans_per_chunk
    assert (tmp_path / "sample.md").read_text().count("## chunk") == 3


def test_the_audit_draws_and_lists_each_span_as_the_index_holds_it(checkpoint, tokenizer,
                                                                   tmp_path, monkeypatch):
    """Phrase spans of lengths 4 and 6 in two span shards of 3 chunks each, max_chunks 4: the
    histogram puts half the density on 4 and half on 6, the curve is the Beta(alpha, beta)
    density scaled to [lmin, lmax], the manifest counts the first 4 chunks' spans across both
    shards, and sample.md lists each span's [start, end), its length and its own tokens."""
    import matplotlib.pyplot as plt

    words = [tokenizer.token_to_id(w) for w in "snow ice cold white river stone field".split()]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    ids = [cls, *words, sep]
    chunk_ids = pa.array(np.arange(6, dtype=np.int64))
    pq.write_table(pa.table({"chunk_id": chunk_ids, "page_id": chunk_ids,
                             "chunk_index": pa.array(np.zeros(6, np.int32)),
                             "input_ids": pa.array([ids] * 6, pa.list_(pa.int32()))}),
                   tmp_path / "chunks.parquet")
    span_paths = [tmp_path / f"spans-{i}.parquet" for i in range(2)]
    for i, path in enumerate(span_paths):
        columns = [chunk_ids[3 * i:3 * i + 3], pa.array([[1, 2]] * 3, pa.list_(pa.int32())),
                   pa.array([[5, 8]] * 3, pa.list_(pa.int32())),
                   pa.array([[1, 1]] * 3, pa.list_(pa.int8()))]
        pq.write_table(pa.table(columns, schema=contract.SCHEMA), path)
    closed = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
    cfg = span_config(only("phrase", 4, 16))
    span_audit.audit_spans([tmp_path / "chunks.parquet"], span_paths, checkpoint, cfg,
                           tmp_path / "lengths.png", tmp_path / "sample.md", max_chunks=4)
    [ax] = closed[0].axes
    bars = {round(b.get_x() + b.get_width() / 2): b.get_height() for b in ax.patches
            if b.get_height() > 0}
    assert bars == pytest.approx({4: 0.5, 6: 0.5})
    [curve] = ax.get_lines()
    x = curve.get_xdata()
    assert curve.get_ydata() == pytest.approx(st.beta.pdf((x - 4) / 12, 4.0, 2.0) / 12)
    manifest = json.loads(artifacts.manifest_path(tmp_path / "sample.md").read_text())
    assert manifest["stats"] == {"chunks_read": 4, "spans_plotted": {"phrase": 8}}
    sample = (tmp_path / "sample.md").read_text()
    for s, e in ((1, 5), (2, 8)):
        assert f"| phrase | [{s}, {e}) | {e - s} | {tokenizer.decode(ids[s:e])} |" in sample
