"""Pre-training of text encoders for dense retrieval: MLM, COSTA, CPDAE(_R), Bag-of-Word, none.

Modules: settings (resolve one model's config; no torch, imported by the Snakefile), store (shards ->
the memory-mapped data store every model shares), data (store -> masked, padded micro-batches),
objectives (the losses as pure functions), model (encoder + heads), train (the loop and the export). Run as `python -m retrieval_pretraining.pretrain`.
"""
