"""The model contract: Hugging Face folders (staged checkpoints, pre-trained and fine-tuned
encoders; checkpoints.py, pretrain/, finetune.py), their files, and staged tokenizers.

A model folder holds config.json, safetensors weights (never a pickle), tokenizer.json with BERT's
special tokens, and (trained encoders) training.json; a tokenizer folder (results/tokenizers/) holds
the tokenizer files and no weights. The loose safetensors files are tensors.py's.
"""
