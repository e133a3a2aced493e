"""Cutting articles into chunks: word-aligned, at most max_len tokens, cut at paragraphs or
sentences where possible. chunk.py runs it over the corpus, in parallel.

Rules (each one is a documented decision; see ARCHITECTURE.md):
- Words are WordPiece words: a token starting with the tokenizer's continuation prefix ("##")
  continues the word before it, anything else starts a word (punctuation marks are words of their
  own, as in BERT's whole-word masking). A chunk never starts or ends inside a word.
- Chunks are cut greedily: each chunk holds at most max_len - 2 text tokens ([CLS] and [SEP] added).
  The cut goes at the last paragraph start inside the final `boundary_slack * (max_len - 2)` tokens
  of the window, else at the last sentence start there (a word after ".", "!" or "?"), else at the
  last word start. A paragraph start right after a heading-like paragraph (at most HEADING_TOKENS
  tokens, no sentence-final token) is no paragraph start: the heading's own start is, so a heading
  begins the chunk of its body rather than ending the one before.
- A word longer than the whole window (only possible with a tiny max_len: BERT turns words of more
  than 100 characters into one [UNK]) cannot be placed without splitting it: it is dropped and
  counted.
- The short tail (last chunk of an article with fewer than min_tail_len text tokens), by
  `short_tail`: `rebalance` (default) moves whole words from the end of the previous chunk into the
  tail until it has min_tail_len tokens (so no text is lost and no chunk exceeds max_len); an
  article shorter than min_tail_len stays one short chunk. `drop` drops the tail (and so articles
  shorter than min_tail_len). `keep` keeps it as it is.
- chunk_id = (page_id << 16) + chunk_index; a chunk's shard is page_id % shards, so the chunk set,
  its ids and each chunk's shard depend on neither the process count nor the batch size; rows are
  sorted by chunk_id.
- Literal "[SEP]"/"[CLS]" text in an article is tokenised as text, never as the special token.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from .config import ConfigError, refuse_unknown
from .contracts.chunks import CHUNK_INDEX_BITS, SCHEMA
from .corpora import SOURCE_KEYS
from .wordpiece import load_tokenizer, tokenizer_info

SENTENCE_FINAL = (".", "!", "?")
PARAGRAPH_SPLIT = re.compile(r"\n[ \t\r\f\v]*\n")
# A paragraph of at most this many tokens with no sentence-final token reads as a heading (a
# section title is its own paragraph: wikitext.py); the start of the paragraph after it is then no
# paragraph cut, so a chunk does not end with a dangling heading (ARCHITECTURE.md).
HEADING_TOKENS = 16
# Paragraphs are tokenised about this many characters (~250k tokens) at a time (Chunker._token_ids).
ENCODE_CHARS = 1 << 20


@dataclass(frozen=True)
class ChunkConfig:
    """How a corpus is cut (the `corpus` section's keys with a corpus entry's overrides: those that
    change the chunks; `processes` only the speed)."""

    checkpoint: str
    max_len: int = 512
    min_tail_len: int = 16
    short_tail: str = "rebalance"
    boundary_slack: float = 0.1
    shards: int = 1

    @classmethod
    def from_dict(cls, section: dict[str, Any]) -> "ChunkConfig":
        # `processes` is the section's too (the chunk command takes it as --processes); a
        # resolved corpus entry (corpora.resolve) adds its name and where its texts come from.
        corpus_keys = ("name", "source", *SOURCE_KEYS)
        refuse_unknown(section, [*cls.__dataclass_fields__, "processes", *corpus_keys],
                       "chunk (corpus)")
        known = {k: v for k, v in section.items() if k in cls.__dataclass_fields__}
        cfg = cls(**known)
        if cfg.short_tail not in ("rebalance", "drop", "keep"):
            raise ConfigError(f"corpus.short_tail={cfg.short_tail!r}; use rebalance, drop or keep")
        if not 0 <= cfg.min_tail_len <= cfg.max_len - 2:
            raise ConfigError(
                f"corpus.min_tail_len={cfg.min_tail_len} must lie in "
                f"[0, max_len - 2 = {cfg.max_len - 2}]"
            )
        if not 0 <= cfg.boundary_slack < 1:
            raise ConfigError(f"corpus.boundary_slack={cfg.boundary_slack} must lie in [0, 1)")
        return cfg

    @property
    def budget(self) -> int:
        return self.max_len - 2


class Chunker:
    """Cuts batches of articles; holds what a process needs: the tokenizer and id lookup tables."""

    def __init__(self, checkpoint_dir: str, cfg: ChunkConfig):
        info = tokenizer_info(checkpoint_dir)
        self.cfg = cfg
        self.tokenizer = load_tokenizer(checkpoint_dir)
        self.cls_id = info["special_ids"]["cls"]
        self.sep_id = info["special_ids"]["sep"]
        prefix = info["continuation_prefix"]
        self.continues_word = np.array([t.startswith(prefix) for t in info["tokens"]], dtype=bool)
        self.sentence_final = np.array([t in SENTENCE_FINAL for t in info["tokens"]], dtype=bool)

    def _token_ids(self, paragraphs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each paragraph's token count and all their ids, concatenated (int32). Encoded a slice of
        ENCODE_CHARS characters at a time: the tokenizer's Encoding objects and the ids as Python
        lists take ~150 bytes a token, so a whole batch of long articles at once held ~0.9 GB per
        process (6M tokens), where the int32 ids take 4 bytes a token (issue 17)."""
        lengths: list[int] = []
        pieces = [np.zeros(0, np.int32)]
        start = 0
        while start < len(paragraphs):
            end, chars = start, 0
            while end < len(paragraphs) and (end == start or chars < ENCODE_CHARS):
                chars += len(paragraphs[end])
                end += 1
            # encode_batch_fast: no character offsets (chunking needs ids only), ~25% faster.
            id_lists = [e.ids for e in self.tokenizer.encode_batch_fast(
                paragraphs[start:end], add_special_tokens=False)]
            counts = [len(ids) for ids in id_lists]
            lengths += counts
            pieces.append(np.fromiter(itertools.chain.from_iterable(id_lists), np.int32, sum(counts)))
            start = end
        return np.asarray(lengths, np.int64), np.concatenate(pieces)

    def chunk_batch(
        self, page_ids: np.ndarray, texts: Sequence[str | None]
    ) -> tuple[pa.RecordBatch, Counter]:
        """Tokenise a batch of articles and cut them into chunks (arrays over the whole batch)."""
        cfg, stats = self.cfg, Counter()
        paragraphs, para_article = [], []
        for a, text in enumerate(texts):
            pieces = [p for p in PARAGRAPH_SPLIT.split(text or "") if p.strip()]
            paragraphs.extend(pieces)
            para_article.extend([a] * len(pieces))
        para_len, flat = self._token_ids(paragraphs)
        para_start = np.concatenate([[0], np.cumsum(para_len)])
        # Token ranges of the articles in `flat` (an article without text gets an empty range).
        article_tokens = np.bincount(
            np.asarray(para_article, np.int64), para_len, minlength=len(texts)
        )
        article_start = np.concatenate([[0], np.cumsum(article_tokens)]).astype(np.int64)

        is_word = ~self.continues_word[flat]
        is_para = np.zeros(len(flat) + 1, bool)
        is_para[para_start] = True
        is_para[_heading_ends(para_start, np.flatnonzero(self.sentence_final[flat]))] = False
        is_sent = np.zeros(len(flat), bool)
        is_sent[1:] = self.sentence_final[flat[:-1]] & is_word[1:]
        words, sents, paras = (
            np.flatnonzero(is_word),
            np.flatnonzero(is_sent),
            np.flatnonzero(is_para),
        )

        starts, ends, owners, indices = [], [], [], []
        for a in range(len(texts)):
            lo, hi = int(article_start[a]), int(article_start[a + 1])
            if hi == lo:
                stats["articles_empty"] += 1
                continue
            spans = plan_chunks(lo, hi, words, sents, paras, cfg, stats)
            starts.extend(s for s, _ in spans)
            ends.extend(e for _, e in spans)
            owners.extend([a] * len(spans))
            indices.extend(range(len(spans)))
        stats["articles"] += len(texts)
        return self._build(page_ids, flat, is_word, starts, ends, owners, indices), stats

    def _build(self, page_ids, flat, is_word, starts, ends, owners, indices) -> pa.RecordBatch:
        cs, ce = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        out_off = np.concatenate([[0], np.cumsum(ce - cs + 2)])
        # The chunks lie in `flat` in order and apart (dropped words and tails are gaps), so masks
        # of a byte a token place their tokens: index arrays over every token (8 bytes a token
        # each, several alive at once) made this the batch's peak (issue 17).
        edges = np.zeros(len(flat) + 1, np.int8)
        np.add.at(edges, cs, 1)
        np.add.at(edges, ce, -1)
        inside = np.cumsum(edges[:-1], dtype=np.int8).astype(bool)
        del edges
        content = np.ones(out_off[-1], bool)
        content[out_off[:-1]] = False
        content[out_off[1:] - 1] = False
        out = np.empty(out_off[-1], np.int32)
        out[content] = flat[inside]
        out[out_off[:-1]] = self.cls_id
        out[out_off[1:] - 1] = self.sep_id
        word_at = np.zeros(out_off[-1], bool)
        word_at[content] = is_word[inside]
        del inside, content
        words = np.flatnonzero(word_at)  # positions in `out`; a word's chunk is the row holding it
        del word_at
        row = np.searchsorted(out_off, words, side="right") - 1
        word_pos = (words - out_off[row]).astype(np.int32)
        del row
        word_off = np.searchsorted(words, out_off)
        page = np.asarray(page_ids, np.int64)[np.asarray(owners, np.int64)]
        index = np.asarray(indices, np.int64)
        if len(index) and index.max() >= 1 << CHUNK_INDEX_BITS:
            raise ValueError(
                f"page {page[index.argmax()]} has more than 65536 chunks; raise max_len"
            )
        return pa.RecordBatch.from_arrays(
            [
                pa.array((page << CHUNK_INDEX_BITS) + index, pa.int64()),
                pa.array(page, pa.int64()),
                pa.array(index, pa.int32()),
                pa.ListArray.from_arrays(pa.array(out_off, pa.int32()), pa.array(out, pa.int32())),
                pa.ListArray.from_arrays(
                    pa.array(word_off, pa.int32()), pa.array(word_pos, pa.int32())
                ),
            ],
            schema=SCHEMA,
        )


def _heading_ends(para_start: np.ndarray, finals: np.ndarray) -> np.ndarray:
    """Where the heading-like paragraphs end: the positions that must not count as paragraph
    starts (`para_start`: each paragraph's first token, then the end; `finals`: the sorted
    positions of sentence-final tokens). Short and without a sentence end is all a heading is told
    by (the text carries no markup); a short paragraph that is no heading (a caption, a one-line
    list) only moves the cut before it, to the paragraph start before it."""
    length = np.diff(para_start)
    inside = np.searchsorted(finals, para_start[1:]) - np.searchsorted(finals, para_start[:-1])
    heading = (length > 0) & (length <= HEADING_TOKENS) & (inside == 0)
    return para_start[1:][heading]


def _last_in(positions: np.ndarray, lo: int, hi: int) -> int:
    """The largest value v of sorted `positions` with lo < v <= hi, or -1."""
    i = int(np.searchsorted(positions, hi, side="right")) - 1
    return int(positions[i]) if i >= 0 and positions[i] > lo else -1


def _best_cut(s: int, hi: int, words, sents, paras, slack: int) -> tuple[int, str]:
    """Where to end a chunk starting at s that may end at hi at the latest (and why)."""
    near = max(s, hi - slack - 1)
    for kind, positions in (("paragraph", paras), ("sentence", sents)):
        cut = _last_in(positions, near, hi)
        if cut > 0:
            return cut, kind
    return _last_in(words, s, hi), "word"


def plan_chunks(
    lo: int, hi: int, words, sents, paras, cfg: ChunkConfig, stats: Counter
) -> list[tuple[int, int]]:
    """Cut the tokens [lo, hi) of one article into chunks [(start, end), ...] (batch positions).

    `words`, `sents`, `paras` are the sorted positions where words, sentences and paragraphs start.
    """
    budget, slack = cfg.budget, int(cfg.boundary_slack * cfg.budget)
    chunks: list[tuple[int, int]] = []
    s = lo
    while hi - s > budget:
        cut, kind = _best_cut(s, s + budget, words, sents, paras, slack)
        if cut < 0:  # one word longer than the whole window: drop it rather than split it
            i = int(np.searchsorted(words, s, side="right"))
            nxt = min(int(words[i]), hi) if i < len(words) else hi
            stats["overlong_words_dropped"] += 1
            stats["overlong_tokens_dropped"] += nxt - s
            s = nxt
            continue
        stats[f"cuts_at_{kind}"] += 1
        chunks.append((s, cut))
        s = cut
    if s >= hi:
        return chunks
    if hi - s >= cfg.min_tail_len or cfg.short_tail == "keep":
        chunks.append((s, hi))
    elif cfg.short_tail == "drop":
        stats["short_tails_dropped"] += 1
        stats["short_tail_tokens_dropped"] += hi - s
    elif chunks and chunks[-1][1] == s:  # rebalance with the previous chunk
        prev = chunks[-1][0]
        cut, _ = _best_cut(
            max(prev, hi - budget - 1), hi - cfg.min_tail_len, words, sents, paras, slack
        )
        if cut > prev:
            chunks[-1] = (prev, cut)
            chunks.append((cut, hi))
            stats["short_tails_rebalanced"] += 1
        else:
            chunks.append((s, hi))
            stats["short_tails_kept"] += 1
    else:
        chunks.append((s, hi))
        stats["short_articles_kept"] += 1
    return chunks
