"""The model contract: Hugging Face folders (staged checkpoints, pre-trained and fine-tuned
encoders; checkpoints.py, pretrain/, finetune.py), their files, and staged tokenizers.

A model folder holds config.json, safetensors weights (never a pickle), tokenizer.json with BERT's
special tokens, and (trained encoders) training.json; a tokenizer folder (results/tokenizers/) holds
the tokenizer files and no weights. The loose safetensors files are tensors.py's.

An encoder folder (results/pretrain/*/encoder, results/finetune/*/*/*/encoder) is also a
sentence-transformers model (st_export.py writes these files inside the folder's atomic publish):
`modules.json` (Transformer, Pooling, and Normalize when the similarity is cosine),
`sentence_bert_config.json` (`max_seq_length` = the passage length p_len),
`1_Pooling/config.json` (one pooling mode: cls or mean), `config_sentence_transformers.json`
(similarity function, empty query/document prompts) and a model card `README.md` whose YAML front
matter holds what the workflow knew at export time (block `retrieval_pretraining`).
"""

POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
# The files every encoder folder holds besides the Hugging Face ones (paths inside the folder).
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
            f"{POOLING_DIR}/config.json", "README.md")
# modules.json types: the names sentence-transformers has read since 2.x (6.x maps them onto its
# own), so a folder loads with older releases too.
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
# Our pooling -> sentence-transformers' legacy pooling flag (read by every release).
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
ALL_POOLING_FLAGS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                     "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
# Our similarity -> sentence-transformers' similarity_fn_name.
SIMILARITY_FN = {"cosine": "cosine", "dot": "dot"}
CARD_BLOCK = "retrieval_pretraining"  # the model card's front-matter block of our facts
