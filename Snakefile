# Pre-training discriminative text encoders for dense retrieval, from a raw Wikipedia dump to
# results/tables.md. Stage -> rule -> module -> artifact: see ARCHITECTURE.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/wikipedia.smk"
include: "rules/corpus.smk"


rule all:
    input:
        all_targets(),
