"""Results tables (results/tables.md) from the per-query metrics of every configured system.

Shaped like the COSTA paper's Tables 2/3: a BM25 row, then one group of rows per fine-tuning stage
(BM25 negatives, hard negatives; for documents, mining rounds), one row per pre-trained model, one
column per (dataset, split, measure). Everything is driven by the `report` config section, so
ablation tables and the low-resource figure are new config entries, not new code.

Significance is a paired test over the per-query scores of the metrics JSON files (scores
contract): a two-tailed t-test, computed here from its formula so that tests can check it against
scipy, or a randomisation test; Holm-Bonferroni (or Bonferroni) corrects each mark's family of
tests (one baseline, one column). Baseline encoders (evaluate.baselines) are rows of their own.

Modules, in the order the data flows: metrics (read the metrics JSON files), layout (cells, rows,
groups, labels), significance (the t-test, the marks, bold), build (one configured table),
render (Markdown and legend), low_resource (its table and figure), provenance (what produced each
number), make (tables.md, JSON, HTML). Run as `python -m retrieval_pretraining.tables`.
"""
