"""Seeded generators keyed by (seed, keys): the one home of `rng_for`, shared by mining and
fine-tuning, and of `keyed_digest`, a draw that needs no generator at all. Its own module so that
fine-tuning does not import the miner (code_deps would then make every mining, search and FAISS
module a code input of every fine-tuning job). Torch-free.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def rng_for(seed: int, *keys: Any) -> np.random.Generator:
    """A generator determined by (seed, keys) alone: keys are hashed, so string ids work too."""
    words = [int(seed)]
    for key in keys:
        digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
        words.append(int.from_bytes(digest, "little"))
    return np.random.default_rng(words)


def keyed_digest(seed: int, *keys: Any) -> bytes:
    """blake2b-8 of "seed/key/key/...": a pseudo-random sort key from (seed, keys) alone, the same
    under any numpy (whose Generator streams are not promised across versions) and easy to restate
    outside Python."""
    text = "/".join(str(part) for part in (int(seed), *keys))
    return hashlib.blake2b(text.encode(), digest_size=8).digest()
