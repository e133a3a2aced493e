# Pre-training discriminative text encoders for dense retrieval, from a raw Wikipedia dump to
# results/tables.md. Stage -> rule -> module -> artifact: see ARCHITECTURE.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "rules/common.smk"
include: "rules/wikipedia.smk"
include: "rules/corpus.smk"
include: "rules/pretrain.smk"
include: "rules/retrieval.smk"
include: "rules/answers.smk"
include: "rules/finetune.smk"
include: "rules/dense.smk"
include: "rules/baselines.smk"
include: "rules/evaluate.smk"
include: "rules/report.smk"
include: "rules/analysis.smk"


rule all:
    input:
        # A function: the dump's part list is known only after the fetch_dumpstatus checkpoint.
        lambda wildcards: all_targets(),
