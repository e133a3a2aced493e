"""What the baseline objectives cut from a chunk beside its masked copy (numpy, one chunk at a time).

* coCondenser (`segment_pair`): two disjoint random contiguous segments of the chunk, each
  re-wrapped as [CLS] ... [SEP]; the pair are positives of each other, every other segment of the
  batch a negative. coCondenser's own data samples two of a document's pre-cut passages; ours cuts
  both from one chunk (ARCHITECTURE.md says why).
* Enhanced decoding (`decoder_visibility`): for every decoder row i, the positions it may attend
  to (RetroMAE): [CLS] (the sentence embedding) and [SEP] always, never its own position nor
  padding, and of the other inner tokens a fresh random share 1 - rate, drawn per row.

Both draw from a generator the caller seeds with (seed, epoch, chunk_id, stream), like masking.
"""

from __future__ import annotations

import numpy as np

SEGMENTS = 0xC0C0  # generator streams, apart from masking's views (0, 1, ...)
DECODER = 0xDEC0
COPY = 0xAEC0  # the auto-encoding decoder's masked copy of the chunk


def segment_length(inner: int, span_tokens: int | None) -> int:
    """Tokens of each segment: `span_tokens`, at most half the chunk's inner tokens (null = half)."""
    half = inner // 2
    return half if span_tokens is None else min(span_tokens, half)


def segment_pair(ids: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator,
                 span_tokens: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(ids, word_starts)] x 2: disjoint segments of `segment_length` inner tokens, each as
    [CLS] tokens [SEP], in random order. The free tokens are split at random into the gaps before,
    between and after them. A segment's first token counts as a word start (a word cut by the
    segment's edge is a word of the segment). A chunk of fewer than 2 inner tokens gives itself twice."""
    inner = len(ids) - 2
    length = segment_length(inner, span_tokens)
    if length < 1:
        return [(ids.copy(), word_starts.copy()), (ids.copy(), word_starts.copy())]
    free = inner - 2 * length
    a, b = np.sort(rng.integers(0, free + 1, size=2))
    starts = np.array([1 + a, 1 + b + length])[rng.permutation(2)]
    out = []
    for start in starts:
        end = start + length
        body = ids[start:end]
        inside = word_starts[(word_starts > start) & (word_starts < end)] - start + 1
        out.append((np.concatenate([ids[:1], body, ids[-1:]]),
                    np.concatenate([[1], inside]).astype(word_starts.dtype)))
    return out


def decoder_visibility(length: int, word_starts: np.ndarray, rng: np.random.Generator,
                       rate: float, whole_word: bool) -> np.ndarray:
    """[length, length] bool: row i may attend to column j.

    Each row hides each inner token (whole words with `whole_word`: every token of a word alike)
    independently with probability `rate`, so a row sees 1 - rate of the inner tokens on average
    (RetroMAE samples whole-word masks at its decoder rate); then its own position. Column 0
    ([CLS], where the decoder puts the sentence embedding) and the final [SEP] stay visible.
    """
    visible = np.ones((length, length), dtype=bool)
    inner = length - 2
    if inner <= 0:
        return visible
    if whole_word and len(word_starts):
        starts = word_starts if word_starts[0] == 1 else np.concatenate([[1], word_starts])
        widths = np.diff(np.append(starts, length - 1))
        word_of = np.repeat(np.arange(len(starts)), widths)
        hidden = (rng.random((length, len(starts))) < rate)[:, word_of]
    else:
        hidden = rng.random((length, inner)) < rate
    visible[:, 1:length - 1] = ~hidden
    rows = np.arange(1, length - 1)
    visible[rows, rows] = False
    return visible
