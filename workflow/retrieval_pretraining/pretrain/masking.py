"""BERT masking of one chunk and its bag of token ids: what every objective's batch is made of.

Pure functions of the token ids, the word starts and a generator (data.py keys the generator by
seed, epoch, chunk and view, so a mask never depends on worker order or resumption).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class Vocab:
    """What masking and bag-of-words targets need to know about the tokenizer."""

    size: int  # one past the highest id the tokenizer has
    mask_id: int
    pad_id: int
    excluded: np.ndarray  # ids never used as bag targets or random replacements ([CLS], [unused12], ...)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "Vocab":
        """The tokenizer's ids, added tokens included (model_folder.check_vocabulary has checked
        that each is a row of the model's word embeddings)."""
        vocab = tokenizer.get_vocab()
        excluded = set(tokenizer.all_special_ids)
        # The BoW authors' filter: special ids and BERT's [unusedN] placeholders.
        excluded |= {i for tok, i in vocab.items() if tok.startswith("[unused")}
        # An id below the highest that the tokenizer lacks names no token: no text holds it, so
        # it is no replacement either (a BERT vocabulary has no such gap).
        size = max(vocab.values()) + 1
        excluded |= set(range(size)) - set(vocab.values())
        return cls(size=size, mask_id=tokenizer.mask_token_id, pad_id=tokenizer.pad_token_id,
                   excluded=np.array(sorted(excluded), dtype=np.int64))

    @functools.cached_property
    def replacements(self) -> np.ndarray:
        """The ids a masked position may be replaced by at random: every id but the excluded ones."""
        return np.setdiff1d(np.arange(self.size, dtype=np.int64), self.excluded)


def mask_tokens(
    ids: np.ndarray, word_starts: np.ndarray, rng: np.random.Generator, vocab: Vocab,
    rate: float, whole_word: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of one chunk: select `masking_budget` of its inner tokens; 80% [MASK], 10% a
    random id (never an excluded one: `Vocab.replacements`), 10% kept. Every inner token can be
    selected, an [UNK] too (it is then predicted, as in Google's BERT), though [UNK] is excluded
    from the bag (`bag_of_ids`) and from random replacements with the other special ids.

    Returns (masked ids, labels with -100 where nothing is predicted). With `whole_word`, whole
    words (from `word_starts`; a word ends where the next begins or at the final [SEP]) are
    selected in random order while they fit in the budget.
    """
    ids = ids.astype(np.int64)
    n_inner = len(ids) - 2
    labels = np.full(len(ids), -100, dtype=np.int64)
    if n_inner <= 0:
        return ids.copy(), labels
    budget = masking_budget(len(ids), rate)
    if whole_word and len(word_starts):
        ends = np.append(word_starts[1:], len(ids) - 1)
        chosen: list[int] = []
        for w in rng.permutation(len(word_starts)):
            width = int(ends[w] - word_starts[w])
            if len(chosen) + width > budget:
                continue
            chosen.extend(range(int(word_starts[w]), int(ends[w])))
            if len(chosen) >= budget:
                break
        positions = np.array(sorted(chosen), dtype=np.int64)
    else:
        positions = np.sort(rng.choice(np.arange(1, n_inner + 1), size=budget, replace=False))
    masked = ids.copy()
    labels[positions] = ids[positions]
    action = rng.random(len(positions))
    masked[positions[action < 0.8]] = vocab.mask_id
    random_pos = positions[(action >= 0.8) & (action < 0.9)]
    # A random [CLS]/[SEP]/[PAD]/[unusedN] would be a corruption BERT never sees at fine-tuning.
    masked[random_pos] = vocab.replacements[rng.integers(0, len(vocab.replacements), size=len(random_pos))]
    return masked, labels


def masking_budget(length: int, rate: float) -> int:
    """Tokens to select in a chunk of `length` tokens, [CLS] and [SEP] included: round(rate x
    length), at least 1, as Google's BERT (`create_pretraining_data.py`) and transformers'
    `DataCollatorForWholeWordMask` count it (512 tokens at 15%: 77), though neither ever selects
    [CLS] or [SEP]. At most the inner tokens: a high rate on a tiny chunk selects them all, where
    the references stop when the candidates run out."""
    return min(length - 2, max(1, int(round(rate * length))))


def bag_of_ids(ids: np.ndarray, vocab: Vocab) -> np.ndarray:
    """The set of token ids a text contains, minus special and [unused] ids (BoW / CPDAE targets)."""
    unique = np.unique(ids.astype(np.int64))
    return unique[~np.isin(unique, vocab.excluded)]


# The label tensors of a batch and the name of the flat indices of their predicted positions.
LABEL_POSITIONS = {"labels": "label_positions", "decoder_labels": "decoder_label_positions"}


def with_positions(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`batch` with flat indices found here on the host: for each label tensor it holds, of the
    positions to predict (label != -100), and of its real tokens (attention_mask == 1) as
    `token_positions`. The model selects those rows with an index whose length it is given;
    selecting them with a boolean mask on the GPU would make the host wait for the device (the
    mask's count) and break torch.compile's graph, every step."""
    for key, name in LABEL_POSITIONS.items():
        if key in batch:
            batch[name] = torch.nonzero(batch[key].flatten() != -100).squeeze(1)
    if "attention_mask" in batch:
        batch["token_positions"] = torch.nonzero(batch["attention_mask"].flatten()).squeeze(1)
    return batch
