"""Input-token coverage of [CLS] projected to the vocabulary, top-k for several k, per model
(Bag-of-Word paper, Algorithm 1 / Figure 4).

The projection needs a head. A trained encoder is exported without heads, so the MLM head saved
beside it (`heads.safetensors`, key prefix `mlm_head.`) is used; a base checkpoint exported as it
is (objective `none`) keeps its own MLM head in its weights (`cls.predictions.`), which is used
too, so that a `bert` row is read through the same kind of projection as the trained rows. The
exception is a BoW model of the paper's form (`bow.form: paper` in its training.json), which
trained h_CLS . E^T; without a head, and for that form, coverage uses the BoW paper's own formula
h_CLS . E^T with the tied word embeddings, and says which projection it used in its output.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import artifacts
from ..errors import InputFileError, reading
from ..model_folder import check_folder_vocabulary, check_safetensors, load_model
from ..tokenizer_files import auto_tokenizer
from .common import (
    encoder_weights,
    excluded_ids,
    load_heads,
    pyplot,
    save_figure,
    write_manifest,
)

log = logging.getLogger(__name__)


def coverage_at_k(
    ranked_ids: np.ndarray, inputs: Sequence[set[int]], ks: Sequence[int]
) -> dict[int, float]:
    """BoW Alg. 1: mean over texts of |top-k projected tokens ∩ T| / |T|, T the text's tokens.

    The share of the input's tokens that the top k cover (a recall: it grows with k and reaches 1
    once every input token ranks in the top k). `ranked_ids[i]` lists vocabulary ids by
    decreasing projected score for text i; a text with an empty T is skipped.
    """
    out = {}
    for k in ks:
        hits = [len(set(row[:k].tolist()) & bag) / len(bag)
                for row, bag in zip(ranked_ids, inputs) if bag]
        out[int(k)] = float(np.mean(hits)) if hits else math.nan
    return out


def training_info(encoder_dir: Path) -> dict[str, Any]:
    """The encoder's training.json ({} without one); a damaged one is one error naming it."""
    path = Path(encoder_dir) / "training.json"
    return artifacts.read_json_object(path, "an encoder's training.json") if path.is_file() else {}


def bow_form(encoder_dir: Path) -> str | None:
    """The BoW projection an encoder was pre-trained with (`bow.form` of its training.json:
    `code` = the MLM head on [CLS], `paper` = h_CLS . E^T), None for other objectives."""
    settings = training_info(encoder_dir).get("settings") or {}
    return (settings.get("bow") or {}).get("form") if settings.get("objective") == "bow" else None


def mlm_head(encoder, encoder_dir: Path, heads: dict[str, Any]):
    """The encoder's MLM head, eval mode: the one saved beside it (`heads.safetensors`,
    `mlm_head.*`), else the one a base checkpoint keeps in its own weights (`cls.predictions.*`,
    which export_base copies as is); None when it has neither."""
    from ..pretrain.model import MLMHead, load_mlm_head

    head = MLMHead(encoder.config, encoder.get_input_embeddings())
    saved = {k.removeprefix("mlm_head."): v for k, v in heads.items() if k.startswith("mlm_head.")}
    if saved:
        head.load_state_dict(saved, strict=True)
    elif not load_mlm_head(head, encoder_dir):
        return None
    return head.eval()


def vocabulary_projector(encoder, head, form: str | None = None):
    """(callable h_CLS -> vocabulary logits, name of the projection used).

    The MLM head where there is one (`head`, from mlm_head), for every row alike. It is the
    projection MLM trained, and the one BoW of the code's form trained on [CLS]; for COSTA, CPDAE
    and the baselines it is the head of their MLM term (trained on masked positions), not what
    their objective trained from [CLS]: CPDAE's is its decoder, which cpdae-words shows. A BoW
    model of the paper's form (`form` "paper") trained h_CLS . E^T, so it is read through E^T
    although its MLM head is saved too; a model without a head falls back to E^T."""
    import torch.nn.functional as F

    if head is not None and form != "paper":
        return head, "mlm_head"
    embeddings = encoder.get_input_embeddings()
    return (lambda h: F.linear(h, embeddings.weight)), "embeddings"


def corpus_name(shard: Path | str) -> str:
    """`<corpus>` of results/corpus/<corpus>/chunks/shard-NNNN.parquet."""
    return Path(shard).parent.parent.name


def trained_on_corpus(encoder_dir: Path, corpus: str) -> bool:
    """Whether the encoder was pre-trained on chunks of `corpus` (training.json's `data`)."""
    return any(Path(p).parent.name == "chunks" and corpus_name(p) == corpus
               for p in training_info(encoder_dir).get("data") or {})


def held_out_sample(models: dict[str, Path], corpus: str) -> tuple[set[int] | None, str]:
    """The chunk ids of `corpus` that no model trained on (None: any chunk will do), and why.

    Coverage is what the BoW loss trains on, so measured on training chunks it favours BoW by
    what that model memorised. Every model pre-trained on the corpus names the chunks its probes
    held out (training.json's `held_out_chunks`); a model that never trained on the corpus (a base
    checkpoint, another corpus's model) constrains nothing. Without such a list (probe_chunks 0,
    a run from before the list existed) or with none in common (different seeds), the sample
    falls back to chunks some model trained on, and says so."""
    common: set[int] | None = None
    for name, encoder_dir in models.items():
        if not trained_on_corpus(encoder_dir, corpus):
            continue
        held = (training_info(encoder_dir).get("held_out_chunks") or {}).get(corpus)
        if not held:
            return None, f"training chunks: {name} names no held-out chunks of {corpus}"
        common = set(held) if common is None else common & set(held)
    if common is None:
        return None, f"no model trained on {corpus}"
    if not common:
        return None, f"training chunks: the models held out no chunk of {corpus} in common"
    return common, f"chunks of {corpus} held out of every model's pre-training"


def sample_chunks(shards: Sequence[Path], samples: int,
                  chunk_ids: set[int] | None = None) -> list[list[int]]:
    """The token ids of the first `samples` chunks (of `chunk_ids` only, when given), in shard
    order. Only those rows become Python lists: a paper-scale shard (~70M tokens) converted whole
    takes ~3.7 GB, near a job's default memory."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = pa.array(sorted(chunk_ids), pa.int64()) if chunk_ids is not None else None
    rows: list[list[int]] = []
    for path in shards:
        with reading(path, "a chunks Parquet file"):
            for batch in pq.ParquetFile(path).iter_batches(columns=["chunk_id", "input_ids"]):
                tokens = batch.column(1)
                if wanted is not None:
                    tokens = tokens.filter(pc.is_in(batch.column(0), value_set=wanted))
                rows += tokens.slice(0, samples - len(rows)).to_pylist()
                if len(rows) >= samples:
                    return rows
    return rows


def project_cls(encoder, projector, input_ids: list[list[int]], pad_id: int, batch: int = 32):
    import torch

    logits = []
    with torch.inference_mode():
        for start in range(0, len(input_ids), batch):
            rows = input_ids[start : start + batch]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(rows):
                ids[i, : len(r)] = torch.tensor(r)
                mask[i, : len(r)] = 1
            cls = encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
            logits.append(projector(cls).float())
    return torch.cat(logits)


def coverage(
    models: dict[str, Path],
    chunks: Sequence[Path],
    ks: Sequence[int],
    samples: int,
    out_png: Path,
    out_json: Path,
) -> dict[str, Any]:
    import torch

    for encoder_dir in models.values():  # fail before any work on a missing or pickled encoder,
        check_safetensors(encoder_dir)   # or one whose tokenizer has ids past its embeddings
        check_folder_vocabulary(
            encoder_dir, auto_tokenizer(encoder_dir))
    # The figure draws each model's line through the ks in this order: increasing and distinct,
    # whatever the config's order, or a line doubles back on the log axis.
    ks = sorted({int(k) for k in ks})
    shards = [Path(c) for c in chunks]
    corpus = corpus_name(shards[0])
    held_out, sample = held_out_sample(models, corpus)
    # Chunks no model trained on: a corpus none of them pre-trained on (base checkpoints) is as
    # unseen as held-out chunks; only chunks some model trained on are "training (!)" chunks.
    unseen = held_out is not None or not any(trained_on_corpus(p, corpus) for p in models.values())
    (log.info if unseen else log.warning)("coverage sample: %s", sample)
    input_ids = sample_chunks(shards, samples, held_out)
    if not input_ids:
        raise InputFileError(f"{shards[0].parent} has no chunks to sample; build the corpus "
                             "stage first")
    result: dict[str, Any] = {"chunks": [str(c) for c in shards], "samples": len(input_ids),
                              "held_out": unseen, "sample": sample, "models": {}}
    for name, encoder_dir in models.items():
        tokenizer = auto_tokenizer(encoder_dir)
        encoder = load_model(encoder_dir, add_pooling_layer=False).eval()
        heads = load_heads(Path(encoder_dir).parent / "heads.safetensors")
        projector, kind = vocabulary_projector(
            encoder, mlm_head(encoder, encoder_dir, heads), bow_form(encoder_dir)
        )
        logits = project_cls(encoder, projector, input_ids, tokenizer.pad_token_id or 0)
        skip = excluded_ids(tokenizer)
        logits[:, skip] = -math.inf
        ranked = torch.topk(logits, max(ks), dim=1).indices.numpy()
        bags = [set(r) - set(skip) for r in input_ids]
        result["models"][name] = {"projection": kind, "coverage": coverage_at_k(ranked, bags, ks)}
        log.info("%s (%s): %s", name, kind, result["models"][name]["coverage"])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, info in result["models"].items():
        ax.plot(
            list(ks),
            [info["coverage"][k] for k in ks],
            marker="o",
            label=f"{name} ({'MLM head' if info['projection'] == 'mlm_head' else 'E^T'})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("k (top-k tokens of [CLS] projected to the vocabulary)")
    ax.set_ylabel("input-token coverage")
    ax.set_title(f"{len(input_ids)} {'held-out' if unseen else 'training (!)'} "
                 "chunks", fontsize="small")
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, out_png)
    plt.close(fig)
    artifacts.write_json(out_json, result)
    write_manifest(
        out_png,
        "analysis.coverage",
        {"ks": [int(k) for k in ks], "samples": samples, "sample": sample},
        {f"chunks_{i:04d}": Path(c) for i, c in enumerate(shards)}
        | {name: encoder_weights(path) for name, path in models.items()}
        | {
            f"{name}_heads": Path(path).parent / "heads.safetensors"
            for name, path in models.items()
            if (Path(path).parent / "heads.safetensors").is_file()
        },
        {name: info["coverage"] for name, info in result["models"].items()},
    )
    return result
