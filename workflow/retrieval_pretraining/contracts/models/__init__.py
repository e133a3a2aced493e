"""The model contract: Hugging Face folders (staged checkpoints, pre-trained and fine-tuned
encoders; checkpoints.py, pretrain/, finetune.py), their files, and staged tokenizers.

A model folder holds config.json, safetensors weights (never a pickle), tokenizer.json with BERT's
special tokens, and (trained encoders) training.json; a tokenizer folder (results/tokenizers/) holds
the tokenizer files and no weights. The loose safetensors files are tensors.py's.

An encoder folder (results/pretrain/*/encoder, results/finetune/*/*/*/encoder) is also a
sentence-transformers model (st_export.py writes these files inside the folder's atomic publish):
`modules.json` (Transformer, Pooling, Dense when the folder holds COSTA's projector, and
Normalize when the similarity is cosine: `module_entries`), `sentence_bert_config.json`
(`max_seq_length` = the passage length p_len), `1_Pooling/config.json` (one pooling mode: cls or
mean), `config_sentence_transformers.json` (similarity function, empty query/document prompts) and
a model card `README.md` whose YAML front matter holds what the workflow knew at export time (block
`retrieval_pretraining`).

A folder with `projector.safetensors` (fine-tuned through COSTA's projector, projector.py) embeds
[CLS] through it, then normalises (cosine): its sentence-transformers pipeline has a Dense module
between Pooling and Normalize (`2_Dense/`: `config.json` with exactly the `dense_config` keys,
`model.safetensors` with tensors `linear.weight`, `linear.bias` equal to the projector's), and
Normalize moves to `3_Normalize/`. Without it, sentence-transformers would embed the raw [CLS].
"""

from __future__ import annotations

from typing import Any

POOLING_DIR = "1_Pooling"
PROJECTOR_FILE = "projector.safetensors"  # COSTA's projector in a fine-tuned folder (projector.py)
# The files every encoder folder holds besides the Hugging Face ones (paths inside the folder).
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
            f"{POOLING_DIR}/config.json", "README.md")
# modules.json types: the names sentence-transformers has read since 2.x (6.x maps them onto its
# own), so a folder loads with older releases too.
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
DENSE = "sentence_transformers.models.Dense"
# The Dense module's weights: the file and keys sentence-transformers' Dense.load reads
# (Module.load_torch_weights: model.safetensors; the module's nn.Linear is `linear`).
DENSE_WEIGHTS = "model.safetensors"
DENSE_KEYS = ("linear.weight", "linear.bias")
# projector.py's kind -> the Dense activation (the class path sentence-transformers imports).
DENSE_ACTIVATION = {"nonlinear": "torch.nn.modules.activation.Tanh",
                    "linear": "torch.nn.modules.linear.Identity"}
# Our pooling -> sentence-transformers' legacy pooling flag (read by every release).
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
ALL_POOLING_FLAGS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                     "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
# Our similarity -> sentence-transformers' similarity_fn_name.
SIMILARITY_FN = {"cosine": "cosine", "dot": "dot"}
CARD_BLOCK = "retrieval_pretraining"  # the model card's front-matter block of our facts


def module_entries(similarity: str, projector: bool) -> list[dict[str, Any]]:
    """modules.json: Transformer (the folder itself), 1_Pooling, 2_Dense when the folder has a
    projector, then {n}_Normalize when the similarity is cosine (sentence-transformers' numbering:
    the module's index, then its name), in the order encode.pool applies them."""
    kinds = [("Pooling", POOLING)] + ([("Dense", DENSE)] if projector else [])
    kinds += [("Normalize", NORMALIZE)] if similarity == "cosine" else []
    entries = [("", TRANSFORMER)] + [(f"{i}_{name}", kind)
                                     for i, (name, kind) in enumerate(kinds, 1)]
    return [{"idx": i, "name": str(i), "path": path, "type": kind}
            for i, (path, kind) in enumerate(entries)]


def module_dir(entries: list[dict[str, Any]], kind: str) -> str | None:
    """The folder of the module of type `kind` in modules.json entries (None when absent)."""
    return next((m["path"] for m in entries if m.get("type") == kind), None)


def dense_config(kind: str, dimension: int) -> dict[str, Any]:
    """{n}_Dense/config.json for a projector of `kind` (nonlinear / linear) on `dimension`-wide
    [CLS]: only the keys every sentence-transformers release's Dense accepts."""
    return {"in_features": dimension, "out_features": dimension, "bias": True,
            "activation_function": DENSE_ACTIVATION[kind]}


# Every module folder an encoder may hold (whatever its similarity and projector).
MODULE_FOLDERS = tuple(sorted({m["path"] for sim in SIMILARITY_FN for proj in (False, True)
                               for m in module_entries(sim, proj) if m["path"]}))
