"""Bi-encoder fine-tuning (Tevatron-style): a shared encoder, a contrastive loss over each query's
group (1 positive + group_size-1 negatives) and the other groups of its contrast set.

What the contrast set is decides the number of negatives, and the papers disagree on it silently
(the COSTA authors' "batch 64" was 8 GPUs x 8 queries, not gathered), so here it is explicit (`sub_batches`, `gather`) and logged as
`negatives_per_query`. Batches are a pure function of (seed, epoch, query id), so a resumed run, or
one on a different number of GPUs, sees the same groups.

Modules, as in pretrain/: settings (the slice the rules pass, typed and checked; no torch), data
(the training set, group sampling, epoch order, the contrast plan, each rank's micro-batches),
model (the bi-encoder and its loss), train (the loop and the export). Trainer mechanics (DDP,
accumulation, AdamW + warm-up, bf16, resumable state, metrics) come from `training/`. Run as
`python -m retrieval_pretraining.finetune` (under retrieval_pretraining.launch for GPUs).
"""
