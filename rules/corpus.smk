# Corpus stages: base checkpoint, chunking to max_len tokens, the span index.


rule stage_checkpoint:
    output:
        directory("results/checkpoints/{checkpoint}"),
    input:
        code=module_source("checkpoints.py", "artifacts.py"),
    params:
        entry=lambda wc: experiment_config.stage_argument(named("checkpoints", wc.checkpoint)),
    log:
        "results/logs/stage_checkpoint/{checkpoint}.log",
    localrule: True
    shell:
        "python -m retrieval_pretraining.checkpoints --config '{params.entry}' --out {output} &> {log}"
