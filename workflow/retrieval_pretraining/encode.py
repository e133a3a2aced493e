"""Encode texts with a bi-encoder: corpus shards to `.npy` + ids, and queries in memory.

One function (`embed`) turns texts into vectors for every consumer: fine-tuning uses the same
`pool` so training and retrieval can never disagree on pooling or normalisation; the knobs are
`RetrievalSettings` (retrieval_settings.py), which every dense-retrieval stage reads. The corpus
is encoded in contiguous row ranges (`shard_rows`), one Snakemake job per shard, so a large corpus
spreads over GPUs and a crash loses one shard, not the whole encoding.

Output of one shard: `shard-XXXX.npy` (float16 or float32, rows in corpus order) and
`shard-XXXX.ids.parquet` (doc_id string, same order) + `shard-XXXX.manifest.json`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from . import artifacts, gpu_check
from . import projector as text_projector
from .config import ConfigError, stage_parser
from .contracts.embeddings import IDS_SCHEMA
from .contracts.datasets import join_title
from .contracts.models import NORMALIZE, POOLING_FLAGS
from .errors import (BadInput, command, expect_list, expect_positive_int, expect_section,
                     reading)
from .model_folder import ModelFolderError, check_folder_vocabulary, load_model, read_config
from .parallel import bounded_map
from .retrieval_settings import (PREFIX_KEYS, SEARCH_KEYS, RetrievalSettings, add_runtime_option,
                                 with_runtime)
from .tokenizer_files import auto_tokenizer

log = logging.getLogger(__name__)


def settings(config: dict[str, Any]) -> RetrievalSettings:
    """The retrieval knobs of the slice the encode_corpus_shard rule passes (encode_argument), or
    a baseline's (rules/baselines.smk, which adds its passage prefix). A corpus encoding reads the
    passage side only: its slice holds no q_len or query prefix (QUERY_KEYS), and the defaults
    standing in for them are neither read nor recorded (`corpus_record`)."""
    return RetrievalSettings.from_config(config, added=SEARCH_KEYS + PREFIX_KEYS, stage="encode")


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    gpu_check.refuse_unusable_gpus()  # a Slurm job granted GPUs must not encode on the CPU
    return torch.device("cpu")


# Where a loaded encoder keeps its folder's text projector (a registered submodule, so it moves,
# trains and switches train/eval with the encoder; `encode_batch` applies it to the pooled [CLS]).
PROJECTOR = "text_projector"


def load_encoder(folder: str | Path, dev: torch.device | None = None):
    """A Hugging Face encoder + fast tokenizer from a local folder (never downloads, no remote code).

    A folder holding `projector.safetensors` (a model fine-tuned through COSTA's projector) comes
    with its projector attached as `model.text_projector`: every consumer embeds through it. A
    tokenizer with ids past the model's word embeddings is refused here, before any text: the
    first one holding such an id would fail mid-corpus (a device-side assert on CUDA)."""
    model = load_model(folder, add_pooling_layer=False)  # safetensors only: a pickle is refused
    attach_projector(model, text_projector.load(Path(folder)))
    tokenizer = auto_tokenizer(folder, use_fast=True)
    check_folder_vocabulary(folder, tokenizer)
    return model.to(dev or device()), tokenizer


def attach_projector(model, module: torch.nn.Module | None) -> None:
    """Embed [CLS] through `module` from now on (None: the raw pooled vector)."""
    setattr(model, PROJECTOR, module)


def projector_of(model) -> torch.nn.Module | None:
    return getattr(model, PROJECTOR, None)


def encoder_state(model) -> dict[str, torch.Tensor]:
    """The encoder's own weights (what save_pretrained writes), without an attached projector."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith(PROJECTOR + ".")}


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str, similarity: str,
         projector: torch.nn.Module | None = None) -> torch.Tensor:
    """Sequence vectors from last-layer states: [CLS] (through the text projector when given) or
    mean over real tokens; cosine normalises."""
    if pooling == "cls":
        vectors = hidden[:, 0]
        if projector is not None:
            # In fp32 under bf16 autocast too: its output is the vector itself, stored in fp16 (3
            # more bits than bf16) and normalised; the states it reads are fp32 there already.
            with torch.autocast(vectors.device.type, enabled=False):
                vectors = projector(vectors.float())
    elif pooling == "mean":
        if projector is not None:
            raise ValueError("a text projector embeds [CLS]; use pooling 'cls'")
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        vectors = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    else:
        raise ValueError(f"pooling '{pooling}' is unknown; use 'cls' or 'mean'")
    if similarity == "cosine":
        vectors = torch.nn.functional.normalize(vectors.float(), dim=-1).to(vectors.dtype)
    elif similarity != "dot":
        raise ValueError(f"similarity '{similarity}' is unknown; use 'dot' or 'cosine'")
    return vectors


def tokenize(tokenizer, texts: Sequence[str], max_len: int, titles: Sequence[str] | None = None,
             title: str = "space", prefix: str = "") -> dict[str, torch.Tensor]:
    """Tokenise queries (titles=None) or documents joined with their titles as `datasets` defines
    it (none / sep = title [SEP] text / space = title + " " + text), `prefix` put before each
    (a baseline's "query: " / "passage: "), truncated to max_len."""
    if titles is not None:
        check_title_separator(tokenizer, title)
        texts = [join_title(t, x, title, tokenizer.sep_token) for t, x in zip(titles, texts)]
    if prefix:
        texts = [prefix + text for text in texts]
    backend = _padded_backend(tokenizer, max_len)
    if backend is None or not texts:
        return tokenizer(list(texts), truncation=True, max_length=max_len, padding=True,
                         return_tensors="pt")
    texts = list(texts)
    cut = [_cut(text, CUT_CHARS_PER_TOKEN * max_len) for text in texts] \
        if _cuts_exactly(tokenizer, backend) else texts
    encodings = backend.encode_batch_fast(cut)
    # A cut text that did not fill max_len tokens might have needed what was cut: the batch again
    # with those texts whole (rare: ~8 characters a token on average in their first part).
    short = [i for i, e in enumerate(encodings)
             if cut[i] is not texts[i] and sum(e.attention_mask) < max_len]
    if short:
        whole = set(short)
        cut = [texts[i] if i in whole else text for i, text in enumerate(cut)]
        encodings = backend.encode_batch_fast(cut)
    return {key: torch.from_numpy(np.array([getattr(e, field) for e in encodings], dtype=np.int64))
            for key, field in _FIELDS.items() if key in tokenizer.model_input_names}


def check_title_separator(tokenizer, title: str) -> None:
    """Refuse title mode sep with a tokenizer that splits special tokens (transformers'
    `split_special_tokens`, which a folder's tokenizer_config.json can set): `sep` writes the
    tokenizer's [SEP] into the one string a passage is, so such a tokenizer would tokenise the
    separator as the pieces of "[SEP]", text, not the separator id. The other modes join no
    special token. A tokenizer without a separator token is refused too: the join would write
    the text "None" between title and text."""
    if title == "sep" and tokenizer.sep_token is None:
        raise ModelFolderError(
            "title mode 'sep' joins title and text with the tokenizer's separator token, and this "
            "tokenizer has none; use title mode space or none, or an encoder with a [SEP] token")
    if title == "sep" and getattr(tokenizer, "split_special_tokens", False):
        raise ModelFolderError(
            f"title mode 'sep' joins title and text with {tokenizer.sep_token!r}, which this "
            "tokenizer (split_special_tokens=True) would split into text pieces; set "
            "\"split_special_tokens\": false in the encoder folder's tokenizer_config.json")


# Texts longer than this many characters per token of max_len are cut before tokenising: a long
# document (MS MARCO's average ~1,500 tokens, some 100k characters) would otherwise be tokenised
# whole and truncated after, at a fraction of the rate (benchmarks/RESULTS.md, "Cutting long
# texts"). English WordPiece averages ~4.5 characters a token, so 8 leaves a wide margin.
CUT_CHARS_PER_TOKEN = 8


def _cut(text: str, chars: int) -> str:
    """`text` up to its last space within `chars` characters (itself when shorter, or when it has
    no space there)."""
    if len(text) <= chars:
        return text
    space = text.rfind(" ", 0, chars + 1)
    return text[:space] if space > 0 else text


def _cuts_exactly(tokenizer, backend) -> bool:
    """Whether a text cut at a space tokenises to a prefix of the whole text's tokens, so that a
    cut text that still fills max_len gives the same ids: truncation keeps the start, the
    normaliser works character by character and the pre-tokeniser splits at every space (BERT's
    WordPiece tokenizers). Others are tokenised whole."""
    normalizer = type(backend.normalizer).__name__ if backend.normalizer is not None else None
    return (tokenizer.truncation_side == "right"
            and type(backend.pre_tokenizer).__name__ == "BertPreTokenizer"
            and normalizer in (None, "BertNormalizer"))


# What `tokenizer(..., return_tensors="pt")` returns, in its order, and each key's Encoding field.
_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
_BACKENDS: "weakref.WeakKeyDictionary[Any, dict[tuple, Any]]" = weakref.WeakKeyDictionary()


def _padded_backend(tokenizer, max_len: int):
    """A copy of a fast tokenizer's Rust tokenizer set up as `tokenizer(texts, truncation=True,
    max_length=max_len, padding=True)` sets up its own (truncation: longest_first on the
    tokenizer's side; padding: to the longest, its side, pad token and type id); None for a
    tokenizer whose batches this cannot reproduce (slow, or other model inputs).

    Why: transformers turns every token id into a Python int and back into a tensor through
    nested lists (half the time of a 512-token batch); `tokenize` takes the ids as one array per
    batch and skips the character offsets nobody reads (`encode_batch_fast`). The tensors are
    the same (tests/test_encode.py compares them with transformers' own on random texts)."""
    if (not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token is None
            or not set(tokenizer.model_input_names) <= set(_FIELDS)):
        return None  # transformers' own call (and its error when there is no pad token)
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    key = (max_len, tokenizer.truncation_side, tokenizer.padding_side, tokenizer.pad_token_id,
           tokenizer.pad_token_type_id, tokenizer.pad_token, split)
    backends = _BACKENDS.setdefault(tokenizer, {})
    if key not in backends:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.enable_truncation(max_len, stride=0, strategy="longest_first",
                                  direction=tokenizer.truncation_side)
        backend.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id,
                               pad_type_id=tokenizer.pad_token_type_id,
                               pad_token=tokenizer.pad_token)
        backend.encode_special_tokens = split
        backends[key] = backend
    return backends[key]


def encode_batch(model, batch: dict[str, torch.Tensor], pooling: str, similarity: str) -> torch.Tensor:
    dev = next(model.parameters()).device
    # Asynchronous from pinned memory (fine-tuning pins its inputs); from pageable memory the copy
    # is what a blocking one would be.
    batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
    hidden = model(**batch).last_hidden_state
    return pool(hidden, batch["attention_mask"], pooling, similarity, projector_of(model))


def safe_threads(tokenizer, wanted: int, *max_lens: int) -> int:
    """How many of `wanted` threads may call `tokenize` at once: all of them where each max_len
    has its Rust tokenizer set up once (_padded_backend, set up here in the calling thread); 1
    where `tokenize` falls back to the transformers tokenizer, whose every call resets its padding
    and truncation."""
    if wanted > 1 and any(_padded_backend(tokenizer, n) is None for n in max_lens):
        return 1
    return wanted


# Batches tokenised at once, ahead of a GPU model, on threads (the Rust tokenizer releases the GIL).
# In turn with the model, tokenising 512-token passages (~1,450 a CPU-second) would leave a GPU
# that encodes several thousand a second idle most of the time; two threads are the 2 cores per
# GPU the input pipeline is sized for (benchmarks/RESULTS.md, issue 17), and fine-tuning's
# prefetch takes that many. On CPU the model needs the same cores: tokenising ahead only competes
# with it (3% fewer passages/s measured).
TOKENIZER_THREADS = 2
# Encoding takes more where its job has the cores: on an H200, bert-base encoded 2,733 passages/s
# at 512 tokens on 2 threads, what 2 threads tokenise (~1,800 a second each in Rust, then ~9,000 a
# second of id lists turned into arrays under the GIL): the tokenizer, not the GPU, set the pace.
# The GIL-held part bounds what more threads can add, hence the cap.
MAX_TOKENIZER_THREADS = 8


def gpu_tokenizer_threads() -> int:
    """Threads that tokenise ahead of a GPU encoder: the cores this process may run on (a Slurm
    job's --cpus-per-task, the profile's 8 a GPU) but one, which drives the GPU; at least
    TOKENIZER_THREADS, at most MAX_TOKENIZER_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(TOKENIZER_THREADS, min(MAX_TOKENIZER_THREADS, cores - 1))


@torch.inference_mode()
def embed(model, tokenizer, texts: Sequence[str], *, max_len: int, pooling: str, similarity: str,
          titles: Sequence[str] | None = None, title: str = "space", batch_size: int = 256,
          desc: str = "encode", prefix: str = "", tokenizer_threads: int | None = None) -> np.ndarray:
    """float32 vectors for `texts`, in order. Texts are length-sorted so padding is minimal.
    `tokenizer_threads`: threads tokenising the next batches while the model encodes one (0: in
    turn with it); default gpu_tokenizer_threads() on a GPU, 0 on CPU."""
    model.eval()
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    cuda = next(model.parameters()).is_cuda

    def inputs(rows: np.ndarray) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        batch = tokenize(tokenizer, [texts[i] for i in rows], max_len,
                         None if titles is None else [titles[i] for i in rows], title, prefix)
        # Pinned: the copy to the GPU (encode_batch) then runs without waiting for it.
        return rows, {k: v.pin_memory() for k, v in batch.items()} if cuda else batch

    blocks = [(order[start:start + batch_size],) for start in range(0, len(texts), batch_size)]
    threads = safe_threads(tokenizer, (gpu_tokenizer_threads() if cuda else 0)
                           if tokenizer_threads is None else tokenizer_threads, max_len)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="encode-inputs") if threads \
        else contextlib.nullcontext()
    fits = [batch_size]  # the largest batch known to fit (lowered by an out-of-memory error)
    with pool as executor:  # None: in this thread
        for rows, batch in tqdm(bounded_map(inputs, blocks, executor, in_flight=threads + 1),
                                total=len(blocks), desc=desc, mininterval=10,
                                disable=len(texts) <= batch_size):
            out[rows] = encode_fitting(model, batch, pooling, similarity, fits)
    return out


def encode_fitting(model, batch: dict[str, torch.Tensor], pooling: str, similarity: str,
                   fits: list[int]) -> np.ndarray:
    """The batch's vectors (float32, on the host), in pieces of at most `fits[0]` rows; a piece
    that runs out of GPU memory is halved, and `fits[0]` lowered for the batches after it.

    A configured encode_batch_size sized for an 80 GB card, or a shard of unusually long texts,
    then costs a slower encoding and a warning, not a failed job (and its GPU-hours). The texts
    come longest first, so the batches after one that did not fit need no more memory than it.
    Pieces are encoded as they would be alone: each row's vector is the same up to the
    arithmetic of a narrower padding."""
    cuda = next(model.parameters()).is_cuda
    rows = batch["input_ids"].shape[0]
    if rows > fits[0]:
        step = fits[0]  # fixed for this split: a piece that does not fit lowers fits[0] itself
        return np.concatenate([
            encode_fitting(model, {k: v[i:i + step] for k, v in batch.items()}, pooling,
                           similarity, fits) for i in range(0, rows, step)])
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            return encode_batch(model, batch, pooling, similarity).float().cpu().numpy()
    except torch.OutOfMemoryError:
        if rows == 1:
            raise
    # Outside the handler: the exception's frames (and their activations) are released by now.
    if cuda:
        torch.cuda.empty_cache()
    fits[0] = rows // 2
    log.warning("out of GPU memory encoding %d texts of %d tokens: encoding at most %d at a "
                "time from here on (lower encode_batch_size to skip this retry)", rows,
                batch["input_ids"].shape[1], fits[0])
    return encode_fitting(model, batch, pooling, similarity, fits)


class NonFiniteVectors(BadInput, ValueError):
    """An encoder's vectors hold NaN or inf. Written on, a NaN document was never retrieved by any
    query and a NaN query retrieved nothing: runs that silently lost them, and tables scored
    from those runs."""


def finite_vectors(vectors: np.ndarray, dtype: str, ids: Sequence[str], where: str, what: str,
                   encoder: Any) -> np.ndarray:
    """`vectors` (float32, from `embed`) in `dtype`, refused where a row is not finite: the
    encoder's own output (a diverged fine-tuning) or a component past float16's 65504, which
    the cast turns into inf. The message names `where`, the rows and some of their `what` ids."""
    with np.errstate(over="ignore"):  # an overflow is refused below, naming its rows
        stored = vectors.astype(dtype, copy=False)
    # A row's sum in float64 is finite exactly when its every component is (no float32 or float16
    # components sum past float64's range): a value a row, not a mask the size of the shard.
    bad = np.flatnonzero(~np.isfinite(np.add.reduce(stored, axis=1, dtype=np.float64)))
    if not len(bad):
        return stored
    examples = ", ".join(str(ids[int(i)]) for i in bad[:3]) + (", ..." if len(bad) > 3 else "")
    output = int((~np.isfinite(vectors[bad]).all(axis=1)).sum())
    causes = []
    if output:
        causes.append(f"{output} come from the encoder {encoder} itself (NaN / inf: most likely "
                      "its fine-tuning diverged; retrain it, from a checkpoint before the loss "
                      "went non-finite or with a lower learning rate)")
    if len(bad) > output:
        causes.append(f"{len(bad) - output} overflow float16 (a component above 65504 becomes "
                      "inf when stored): set finetune.dtype: float32")
    raise NonFiniteVectors(f"{where}: {len(bad)} of {len(stored)} {what} vectors are not finite "
                           f"(e.g. {what} ids {examples}); {'; '.join(causes)}. Nothing was "
                           "written: a non-finite vector is never retrieved, or retrieves "
                           "nothing")


def shard_rows(num_rows: int, shard: int, shards: int) -> tuple[int, int]:
    """Contiguous row range [lo, hi) of `shard` out of `shards` (sizes differ by at most one)."""
    if not 0 <= shard < shards:
        raise ConfigError(f"shard {shard} is outside 0..{shards - 1}; check the shard wildcard")
    return num_rows * shard // shards, num_rows * (shard + 1) // shards


def use_mismatches(encoder: Path, knobs: RetrievalSettings,
                   lengths: Sequence[str] = ("q_len", "p_len")) -> list[str]:
    """How `knobs` differ from what a staged checkpoint (a baseline's encoder) states: its source's
    sentence-transformers pooling, normalisation and max_seq_length (stats.sentence_transformers),
    and its position limit. A baseline's knobs are config values nothing else checks: cls on a
    mean-pooled model encodes another model, silently. `lengths`: the length knobs the caller
    encodes with (a corpus encoding p_len, a search q_len; each is checked where it is read)."""
    manifest = Path(encoder) / "manifest.json"
    if not manifest.is_file():
        return []
    what = "an encoder's manifest"
    staged = artifacts.read_manifest(manifest, what)
    if staged.get("stage") != "stage_checkpoint":
        return []
    limit = read_config(encoder).get("max_position_embeddings")
    lengths = {name: getattr(knobs, name) for name in lengths}
    messages = [f"{name} {value} is above the model's position limit {limit}"
                for name, value in lengths.items() if limit and value > limit]
    record = expect_section(staged, "stats.sentence_transformers", manifest, what)
    if not record:
        return messages
    flags = expect_section(staged, "stats.sentence_transformers.pooling", manifest, what)
    pooling = next((name for name, flag in POOLING_FLAGS.items() if flags.get(flag)), None)
    modules = expect_list(record.get("modules"), "stats.sentence_transformers.modules", manifest,
                          what)
    similarity = "cosine" if NORMALIZE in modules else "dot"
    if pooling is not None and knobs.pooling != pooling:
        messages.append(f"pooling {knobs.pooling}, but the source pools with {pooling}")
    if knobs.similarity != similarity:
        messages.append(f"similarity {knobs.similarity}, but the source's is {similarity}")
    longest = expect_positive_int(record.get("max_seq_length"),
                                  "stats.sentence_transformers.max_seq_length", manifest, what)
    messages += [f"{name} {value} is above the source's max_seq_length {longest}"
                 for name, value in lengths.items() if longest and value > longest]
    return messages


def recorded_weights(encoder: Path) -> dict[str, str] | None:
    """The sha256 of the encoder's weight files as its own manifest records them (stats.weights,
    artifacts.weights_checksums at export: pre-trained and fine-tuned encoders), read, not
    rehashed; None where it records none (a staged checkpoint) or has no readable manifest."""
    try:
        manifest = artifacts.read_manifest(artifacts.manifest_path(encoder),
                                           "an encoder's manifest")
    except (OSError, ValueError):
        return None
    weights = manifest["stats"].get("weights")
    return weights if isinstance(weights, dict) and weights else None


def record_encoder_weights(manifest_file: Path, manifest: dict[str, Any],
                           weights: dict[str, str] | None) -> None:
    """Add `weights` (recorded_weights, read before the encoder was loaded) to the manifest's
    `encoder` input: a folder has no sha256 of its own, so its path alone named the encoder, and
    one retrained at that path passed for the one these outputs came from (`audit` compares them
    with the encoder's manifest). The manifest is written again only when there are weights."""
    if weights:
        manifest["inputs"]["encoder"]["weights"] = weights
        artifacts.write_json(manifest_file, manifest)


def encode_corpus_shard(corpus: Path, encoder: Path, shard: int, shards: int, out_npy: Path,
                        out_ids: Path, config: dict[str, Any]) -> dict[str, Any]:
    import polars as pl  # here, not above: embedding imports without it (the bare GPU machine)

    knobs = settings(config)
    with reading(corpus, "a corpus Parquet file"):
        num_rows = pl.scan_parquet(corpus).select(pl.len()).collect().item()
        lo, hi = shard_rows(num_rows, shard, shards)
        frame = (pl.scan_parquet(corpus).slice(lo, hi - lo)
                 .select("doc_id", "title", "text").collect())
    mismatches = use_mismatches(encoder, knobs, lengths=("p_len",))
    for message in mismatches:
        log.warning("%s: %s (the baseline's knobs in evaluate.baselines)", encoder, message)
    weights = recorded_weights(encoder)
    model, tokenizer = load_encoder(encoder)
    vectors = embed(model, tokenizer, frame["text"].fill_null("").to_list(),
                    titles=frame["title"].fill_null("").to_list(), max_len=knobs.p_len,
                    pooling=knobs.pooling, similarity=knobs.similarity, title=knobs.title,
                    batch_size=knobs.encode_batch_size, desc=f"encode shard {shard}",
                    prefix=knobs.passage_prefix)
    stored = finite_vectors(vectors, knobs.dtype, frame["doc_id"], f"{out_npy} (shard {shard} "
                           f"of {shards}, corpus rows {lo}..{hi - 1})", "doc", encoder)
    with artifacts.atomic_path(out_npy) as tmp:
        with open(tmp, "wb") as handle:  # np.save on a path would append ".npy" to the temp name
            np.save(handle, stored, allow_pickle=False)
        # Shape and dtype alone pass another shard's array of the same shape; hashed from the file
        # written (a second or two a shard, beside minutes of encoding).
        digest = artifacts.sha256_file(tmp)
    artifacts.write_parquet(out_ids, pa.table({"doc_id": frame["doc_id"].to_arrow()}), IDS_SCHEMA)
    stats = {"rows": hi - lo, "row_range": [lo, hi], "dim": int(vectors.shape[1]),
             "dtype": knobs.dtype, "sha256": digest}
    if mismatches:  # kept where the vectors are, so a table's number can be traced to them
        stats["use_mismatches"] = mismatches
    manifest = artifacts.write_manifest(
        artifacts.manifest_path(out_npy), stage="encode_corpus", params=knobs.corpus_record(),
        inputs={"corpus": corpus, "encoder": encoder}, stats=stats)
    record_encoder_weights(artifacts.manifest_path(out_npy), manifest, weights)
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="canonical corpus.parquet")
    parser.add_argument("--encoder", type=Path, required=True, help="Hugging Face encoder folder")
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--out-npy", type=Path, required=True)
    parser.add_argument("--out-ids", type=Path, required=True)
    args = add_runtime_option(parser).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stats = encode_corpus_shard(args.corpus, args.encoder, args.shard, args.shards, args.out_npy,
                                args.out_ids, with_runtime(args.config, args.runtime))
    log.info("encoded %s", stats)


if __name__ == "__main__":
    main()
