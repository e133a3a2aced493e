"""The tensor file contract: safetensors files (a model folder's weights, the pre-training heads
left out of the encoder, a staged checkpoint's MLM head, a trainer's resume state).

Tensors are stored as safetensors, never as a pickle. Heads are sized by their encoder: every
dimension is its hidden or vocabulary size; heads.safetensors records the objective that trained
them, which equals the encoder's training.json's.
"""
