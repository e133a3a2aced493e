"""Two pre-training corpora (the shipped Wikipedia sample and the SciFact corpus): changing one
reruns its chunks, its span index and the models that read it, and nothing of the other, as
Snakemake's own dry-run plan says."""

from pathlib import Path

import pytest
import yaml

from tiny_experiment import SUBSET_DIR, write_scifact_subset
from workflow_harness import copy_project, edit_config, plan_of, planned_rules, snakemake

# The demo's models (costa reads Wikipedia: chunks + the costa span index) plus costa-sf on SciFact
# and mix on both; the three are the targets.
DEMO_MODELS = yaml.safe_load((Path(__file__).parents[1] / "config.yaml").read_text())["pretrain"]["models"]
MODELS = [
    {"name": "costa", "objective": "costa", "spans": "costa"},
    {"name": "costa-sf", "objective": "costa", "spans": "costa", "corpus": "scifact"},
    {"name": "mix", "objective": "mlm",
     "corpus": [{"name": "wikipedia", "proportion": 0.75}, {"name": "scifact", "proportion": 0.25}]},
]
# SciFact's corpus: a ~100-abstract BEIR subset of it (what is planned does not depend on its size).
CORPORA = [{"name": "wikipedia", "source": "wikipedia"},
           {"name": "scifact", "source": "beir", "path": str(SUBSET_DIR), "max_len": 96}]
ENCODERS = [f"results/pretrain/{m['name']}/encoder" for m in MODELS]
PRETRAIN_OUTPUTS = ("encoder/config.json", "metrics.jsonl", "loss.png", "heads.safetensors")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Chunks of both corpora built for real (their params record is what the edit changes); the
    jobs after them (span indexes, pre-training) and the staged checkpoint are stand-in files that
    `snakemake --touch` records as up to date: a plan reads their inputs' times, not their bytes."""
    project = copy_project(tmp_path_factory.mktemp("corpora") / "project", {
        "corpus": {"corpora": CORPORA}, "pretrain": {"models": DEMO_MODELS + MODELS[1:]}})
    write_scifact_subset(project, train=10, test=10, others=40)
    shards = [(corpus, shard) for corpus in ("wikipedia", "scifact") for shard in range(2)]
    snakemake(project, *(f"results/corpus/{c}/chunks/shard-{s:04d}.parquet" for c, s in shards))
    stand_ins = [f"results/corpus/{c}/spans/costa/shard-{s:04d}{suffix}" for c, s in shards
                 for suffix in (".parquet", ".manifest.json")]
    stand_ins += [f"{Path(encoder).parent}/{name}" for encoder in ENCODERS
                  for name in PRETRAIN_OUTPUTS]
    for name in [*stand_ins, "results/checkpoints/minilm-l1/config.json"]:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("stand-in\n")
    snakemake(project, "--touch", *ENCODERS)  # in DAG order (records mtimes, not params)
    assert planned_rules(project, *ENCODERS) == {}
    return project


def settings(config: dict, model: str) -> dict:
    from retrieval_pretraining.pretrain.settings import resolve_model

    return resolve_model(config["pretrain"], model, config["seed"])


@pytest.mark.parametrize("corpus, models", [
    ("scifact", {"costa-sf", "mix"}),
    ("wikipedia", {"costa", "mix"}),
])
def test_changing_one_corpus_reruns_only_what_reads_it(built, corpus, models):
    def edit(config):
        entry = next(c for c in config["corpus"]["corpora"] if c["name"] == corpus)
        entry["max_len"] = 64

    original = edit_config(built, edit)
    # Touched jobs have no params record, so the plan shows input changes only: the models'
    # params (their resolved settings) must not hold any corpus's chunking keys either.
    edited = yaml.safe_load((built / "config.yaml").read_text())
    before = yaml.safe_load(original)
    for model in MODELS:
        assert settings(edited, model["name"]) == settings(before, model["name"]), model
    try:
        result = snakemake(built, "--dry-run", *ENCODERS)
        plan = plan_of(result.stdout + result.stderr)
        assert plan == {"chunk_articles": 1, "sample_spans": 2, "pretrain_model": len(models)}, plan
        output = result.stdout + result.stderr
        assert f"wildcards: corpus={corpus}\n" in output
        other = "wikipedia" if corpus == "scifact" else "scifact"
        assert f"corpus={other}\n" not in output
        for model in {m["name"] for m in MODELS}:
            assert (f"wildcards: model={model}\n" in output) == (model in models), model
    finally:
        (built / "config.yaml").write_text(original)
    assert planned_rules(built, *ENCODERS) == {}
