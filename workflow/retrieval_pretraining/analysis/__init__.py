"""Analyses where a picture says more than a table.

- `loss-curves`: the given pre-training runs' loss terms (metrics.jsonl) on shared axes (the rule
  passes the models the report reaches).
- `tsne`: one query's top-k candidates under several fine-tuned models, relevant documents marked
  (COSTA Figure 3; sklearn t-SNE on the models' own embeddings).
- `coverage`: input-token coverage of [CLS] projected to the vocabulary, top-k for several k, per
  model (Bag-of-Word paper, Algorithm 1 / Figure 4).
- `cpdae-words`: the CPDAE decoder's top words for sample texts.

The projection to the vocabulary needs a head. Trained encoders are exported without heads, so
the heads saved beside them (`results/pretrain/{model}/heads.safetensors`, keys as in the
pre-training module: `mlm_head.*`, `decoder.*`) are used when present, and a base checkpoint's
own MLM head (`cls.predictions.*`, kept in its weights); otherwise coverage falls back to the BoW
paper's own formula h_CLS . E^T with the tied word embeddings, and says so in its output.

Each analysis writes one manifest beside its outputs (`coverage.png` + `coverage.json` ->
`coverage.manifest.json`): parameters, inputs with checksums (an encoder by its weights file) and
the headline numbers, so that `python -m retrieval_pretraining.audit` says what a figure came from.

Modules: common (figures, manifests, encoder files and heads shared by the analyses), loss_curves,
coverage, cpdae_words, tsne; `__main__` is the command line the rules run
(`python -m retrieval_pretraining.analysis <loss-curves|tsne|coverage|cpdae-words> ...`).
"""
