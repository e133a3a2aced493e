# Pre-training discriminative text encoders for dense retrieval, from a raw Wikipedia dump to
# results/tables.md. Stage -> rule -> module -> artifact: see ARCHITECTURE.md.
import os

from snakemake.utils import min_version

min_version("9.0")


# The working directory's config.yaml (Snakemake's convention), else the project's: under
# `--directory <elsewhere>` with a `--configfile` overlay, Snakemake skips a missing one without a
# word and the overlay alone failed validation ("'seed' is a required property", ...).
DEFAULT_CONFIG = "config.yaml"
if not os.path.exists(DEFAULT_CONFIG):
    DEFAULT_CONFIG = os.path.join(workflow.basedir, "config.yaml")


configfile: DEFAULT_CONFIG


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
