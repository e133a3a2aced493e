"""The pre-training driver end to end on a tiny model: losses go down, the export loads and encodes,
a NaN stops the run naming the step and items, a real SIGUSR1 + restart equals an uninterrupted run,
2 gloo processes equal 1 process at the same global batch."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

import pretrain_fixtures as fx
from retrieval_pretraining import training
from retrieval_pretraining.pretrain.train import export_base, train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain")
    checkpoint = fx.tiny_checkpoint(root / "checkpoint")
    chunks, spans = fx.build_corpus(root / "corpus", docs=40)
    return checkpoint, chunks, spans


def _run(settings, setup, out: Path):
    checkpoint, chunks, spans = setup
    code = train(settings, chunks=chunks, spans=spans if settings["objective"] == "costa" else None,
                 checkpoint=checkpoint, encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl",
                 plot_out=out / "loss.png", state_dir=out / "state")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return code, records


# The term each objective adds, which must itself go down (BoW's weight decays, so the total would
# fall even if nothing were learnt).
# (CPDAE_R's cosine InfoNCE stays near log(2m - 1) in 60 steps of a random 32-dim model; its
# formula is covered in test_pretrain_objectives.)
OWN_TERM = {"mlm": "loss_mlm", "costa": "loss_gwc", "cpdae": "loss_rec", "cpdae_r": "loss_rec",
            "bow": "loss_bow"}


@pytest.mark.parametrize("objective", ["mlm", "costa", "cpdae", "cpdae_r", "bow"])
def test_short_run_lowers_the_loss(objective, setup, tmp_path):
    # CPDAE runs two views and an [2m, 2m, |V|] divergence: a smaller micro-batch keeps it quick.
    micro = 4 if objective.startswith("cpdae") else 8
    settings = fx.model_settings(objective, max_steps=60, lr=5e-3, micro_batch_size=micro)
    code, records = _run(settings, setup, tmp_path)
    assert code == 0 and [r["step"] for r in records] == list(range(1, 61))
    for key in ("loss", OWN_TERM[objective]):
        first = sum(r[key] for r in records[:5]) / 5
        last = sum(r[key] for r in records[-5:]) / 5
        assert last < 0.9 * first, f"{objective}: {key} {first:.4f} -> {last:.4f}"
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert not (tmp_path / "state" / "checkpoints").exists()  # a finished run leaves no state


def test_export_loads_with_automodel_and_encodes(setup, tmp_path):
    checkpoint = setup[0]
    code, _ = _run(fx.model_settings("costa", max_steps=3), setup, tmp_path)
    assert code == 0
    folder = tmp_path / "encoder"
    model = AutoModel.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    batch = tokenizer(["dense retrieval", "a second, longer text"], padding=True, return_tensors="pt")
    with torch.no_grad():
        cls = model(**batch).last_hidden_state[:, 0]
    assert cls.shape == (2, 32) and torch.isfinite(cls).all()
    weights = load_file(folder / "model.safetensors")
    base = load_file(checkpoint / "model.safetensors")
    assert set(weights) == set(base), "heads must be dropped, nothing else added or lost"
    key = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(weights[key], base[key])  # trained
    assert torch.equal(weights["pooler.dense.weight"], base["pooler.dense.weight"])  # frozen, kept
    info = json.loads((folder / "training.json").read_text())
    assert info["steps"] == 3 and info["tokens_seen"] > 3 * 8 * 8
    assert info["settings"]["objective"] == "costa" and len(info["data"]) == 4
    assert "torch" in info["versions"]
    heads = load_file(tmp_path / "heads.safetensors")
    assert {k.split(".")[0] for k in heads} == {"mlm_head", "projector"}


def test_none_objective_exports_the_base_checkpoint(setup, tmp_path):
    checkpoint = setup[0]
    export_base({"name": "bert", "objective": "none", "seed": 1, "checkpoint": "x"}, checkpoint,
                tmp_path / "encoder", tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    model = AutoModel.from_pretrained(tmp_path / "encoder", local_files_only=True)
    base = AutoModel.from_pretrained(checkpoint, local_files_only=True)
    for (name, a), (_, b) in zip(model.state_dict().items(), base.state_dict().items()):
        assert torch.equal(a, b), name
    assert (tmp_path / "metrics.jsonl").read_text() == "" and (tmp_path / "loss.png").exists()


def test_nan_loss_stops_naming_step_and_items(setup, tmp_path):
    checkpoint, chunks, spans = setup
    broken = fx.copy_tree(checkpoint, tmp_path / "broken")
    weights = load_file(broken / "model.safetensors")
    weights["embeddings.word_embeddings.weight"][:] = float("nan")
    from safetensors.torch import save_file

    save_file(weights, broken / "model.safetensors")
    with pytest.raises(training.NonFiniteLossError, match=r"at step 0 for batch items \[\d+"):
        train(fx.model_settings("mlm", max_steps=2), chunks=chunks, spans=None, checkpoint=broken,
              encoder_out=tmp_path / "enc", metrics_out=tmp_path / "m.jsonl",
              plot_out=tmp_path / "p.png", state_dir=tmp_path / "state")


def _weights(folder):
    return load_file(Path(folder) / "encoder" / "model.safetensors")


def _assert_same_weights(a, b, atol):
    assert a.keys() == b.keys()
    worst = max((x - b[k]).abs().max().item() for k, x in a.items())
    assert worst <= atol, f"largest weight difference {worst}"


@pytest.mark.slow
def test_resume_after_sigusr1_equals_uninterrupted_run(setup, tmp_path):
    checkpoint, chunks, spans = setup
    settings = fx.model_settings("costa", max_steps=30, micro_batch_size=4, checkpoint_every=None)
    whole = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "whole", wait=False)
    part = tmp_path / "part"
    proc = fx.run_module(settings, checkpoint, chunks, spans, part, wait=False)
    metrics = part / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == training.RESUME_EXIT_CODE, output[-3000:]
    stopped_at = len(metrics.read_text().splitlines())
    assert 3 <= stopped_at < 30
    assert (part / "state" / "checkpoints" / "latest.json").exists()
    assert not (part / "encoder").exists()
    again = fx.run_module(settings, checkpoint, chunks, spans, part)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"starting at step {stopped_at}" in again.stderr
    assert whole.wait(timeout=180) == 0
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 31))
    # Same process count and thread count: the resumed run is bit-for-bit the uninterrupted one.
    _assert_same_weights(_weights(part), _weights(tmp_path / "whole"), atol=0.0)


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(setup, tmp_path):
    checkpoint, chunks, spans = setup
    # Global batch 8 of micro-batches of 4: 1 process accumulates 2, 2 processes accumulate 1.
    settings = fx.model_settings("costa", max_steps=4, micro_batch_size=4)
    two = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "two", nproc=2, wait=False)
    one = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.wait(timeout=300) == 0, two.communicate()[0][-3000:]
    info = json.loads((tmp_path / "two" / "encoder" / "training.json").read_text())
    assert info["world_size"] == 2 and info["accumulation"] == 1
    _assert_same_weights(_weights(tmp_path / "two"), _weights(tmp_path / "one"), atol=1e-5)
