"""The pre-training driver end to end on a tiny model (that losses go down and probes rise:
test_pretrain_learns.py): the export loads and encodes,
a NaN loss or gradient stops the run naming the step and items (and never reaches the weights),
a step reads its values on the host once and logs their micro-batch means, training runs with
dropout on, Pretrainer builds the heads the papers and settings name and its forward combines
the terms as each objective says (and traces to one graph), runs that skip the padding or are
compiled equal the padded eager ones, a real SIGUSR1 + restart (and an
in-process stop + resume with dropout) equals an uninterrupted run, SIGTERM to the whole process
group (DataLoader worker included) saves and exits 75, 2 gloo processes equal 1 process at the same
global batch, optional TensorBoard logging."""

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer

import pretrain_fixtures as fx
from pretrain_fixtures import restore_stop_handlers  # noqa: F401 (a fixture)
from full_disk import full_disk, is_full_disk_error
from host_reads import HostReads, HostWaits, counted
from retrieval_pretraining import training
from retrieval_pretraining.pretrain import objectives as obj
from retrieval_pretraining.pretrain.masking import with_positions
from retrieval_pretraining.pretrain.model import Pretrainer
from retrieval_pretraining.pretrain.train import export_base, resume_job, train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return fx.tiny_setup(tmp_path_factory.mktemp("pretrain"))


@pytest.fixture(scope="module")
def dropout_setup(setup, tmp_path_factory):
    """The same corpus with a checkpoint that has BERT's dropout (0.1)."""
    checkpoint = fx.tiny_checkpoint(tmp_path_factory.mktemp("dropout") / "checkpoint", dropout=0.1)
    return checkpoint, setup[1], setup[2]


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory):
    """A checkpoint whose [CLS] depends on the input (initializer_range 0.5). At BERT's 0.02
    every text's [CLS], hence every CPDAE view's word distribution, is nearly the same: the JS
    contrast is then ~log(2m - 1) whatever its temperature, and views given each other's bags
    lose the same."""
    return fx.tiny_checkpoint(tmp_path_factory.mktemp("wide") / "checkpoint", initializer_range=0.5)


def _run(settings, setup, out: Path, store_dir: Path | None = None):
    checkpoint, chunks, spans = setup
    code = train(settings, chunks=chunks, spans=spans if settings["objective"] == "costa" else None,
                 checkpoint=checkpoint, encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl",
                 plot_out=out / "loss.png", state_dir=out / "state", store_dir=store_dir)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return code, records


def test_a_trainer_start_reads_each_shard_once_to_hash_it(setup, tmp_path, monkeypatch):
    """The trainer checks, caches (the store's key) and records (training.json) the shards'
    sha256: computed once a file and process, not three or four times (~13 GB of Wikipedia
    chunks at 0.9 GB/s is ~15 s a pass, with every GPU idle)."""
    from retrieval_pretraining import artifacts

    hashed = []
    sha256_file = artifacts.sha256_file
    monkeypatch.setattr(artifacts, "sha256_file", lambda path, *a: hashed.append(Path(path).name)
                        or sha256_file(path, *a))
    monkeypatch.setattr(artifacts, "_SHA256", {})  # earlier tests hashed the same files
    checkpoint, chunks, spans = setup
    assert _run(fx.model_settings("costa", max_steps=1), setup, tmp_path)[0] == 0
    shards = [Path(p).name for p in [*chunks, *spans]]
    assert sorted(name for name in hashed if name in shards) == sorted(shards)


def test_the_step_0_probe_record_counts_tokens_so_loss_curves_use_them(setup, tmp_path):
    """The probes before the first step are logged with tokens_seen (0), like every later record:
    the loss curves plot runs of different batch sizes against tokens seen only when every record
    logs it."""
    from retrieval_pretraining.analysis import loss_curves

    settings = fx.model_settings("mlm", max_steps=2, probe_chunks=4, probe_every=1, log_every=1)
    code, records = _run(settings, setup, tmp_path)
    assert code == 0 and records[0]["step"] == 0 and records[0]["tokens_seen"] == 0
    assert any(key.startswith("probe_") for key in records[0])
    assert all(isinstance(r["tokens_seen"], int) for r in records)
    assert loss_curves.x_axis({"mlm": records}) == ("tokens_seen", "tokens seen")


def test_only_the_main_rank_reads_the_shards_to_hash_them(setup, tmp_path, monkeypatch):
    """Every rank reading every shard at each start was ~13 GB a rank at paper scale, 8 to 64
    times over from one shared file system: the main rank hashes, the others adopt its sums
    (for the file versions they see) and read nothing; a file changed since is read again."""
    import shutil

    from retrieval_pretraining import artifacts
    from retrieval_pretraining.pretrain.train import shared_checksums

    paths = [shutil.copy(p, tmp_path / f"{i}-{Path(p).name}") for i, p in
             enumerate([*setup[1], *setup[2]])]
    sent = {}
    monkeypatch.setattr(training, "from_main", lambda value, env: sent.setdefault("v", value)
                        if env.is_main else sent["v"])
    expected = shared_checksums(paths, types.SimpleNamespace(is_main=True))
    hashed = []
    sha256_file = artifacts.sha256_file
    monkeypatch.setattr(artifacts, "sha256_file", lambda path, *a: hashed.append(Path(path).name)
                        or sha256_file(path, *a))
    monkeypatch.setattr(artifacts, "_SHA256", {})  # another process: nothing hashed yet
    other = types.SimpleNamespace(is_main=False)
    assert shared_checksums(paths, other) == expected
    assert [artifacts.sha256_once(p) for p in paths] == [expected[str(p)]["sha256"] for p in paths]
    assert hashed == []
    stat = os.stat(paths[0])
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    monkeypatch.setattr(artifacts, "_SHA256", {})
    shared_checksums(paths, other)
    assert artifacts.sha256_once(paths[0]) == expected[str(paths[0])]["sha256"]
    assert hashed == [Path(paths[0]).name]


def test_a_model_on_a_store_another_model_made_converts_nothing_and_trains_the_same(
        setup, tmp_path, monkeypatch):
    """The workflow's models share one store folder (--store): after COSTA has converted the
    chunks (and its spans) there, an MLM trainer converts nothing and trains step for step as an
    MLM trainer with a store of its own."""
    from retrieval_pretraining.pretrain import store as pstore

    chunks = setup[1]
    written = []
    for name in ("write_chunk_file", "write_span_file"):
        original = getattr(pstore, name)
        monkeypatch.setattr(pstore, name, lambda *a, _f=original: written.append(Path(a[-1]).name)
                            or _f(*a))

    def run(objective, out, store):
        return _run(fx.model_settings(objective, max_steps=2), setup, out, store)[0]

    shared = tmp_path / "pretrain-data"
    assert run("costa", tmp_path / "costa", shared) == 0
    assert len(written) == 2 * len(chunks) and len(list(shared.iterdir())) == 2 * len(chunks)
    assert run("mlm", tmp_path / "mlm", shared) == 0
    assert len(written) == 2 * len(chunks)  # nothing converted for MLM
    assert _run(fx.model_settings("mlm", max_steps=2), setup, tmp_path / "own")[0] == 0
    assert len(written) == 3 * len(chunks)  # its own store: the chunk files again
    same = (tmp_path / "mlm" / "metrics.jsonl").read_text().splitlines()
    own = (tmp_path / "own" / "metrics.jsonl").read_text().splitlines()
    assert _untimed(map(json.loads, same)) == _untimed(map(json.loads, own))
    _assert_same_weights(_weights(tmp_path / "mlm"), _weights(tmp_path / "own"), atol=0)


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
    assert not (tmp_path / "tensorboard").exists()  # TensorBoard logging is off by default
    assert folder.stat().st_mode & 0o777 == 0o755  # published from a 0700 temp folder, shared


def test_training_json_names_the_chunks_the_probes_held_out(setup, tmp_path):
    """The analyses compare models on text none trained on (analysis/coverage.py): the export
    names, per corpus, the chunk ids of the rows held out, read here from the shards themselves."""
    import pyarrow.parquet as pq

    from retrieval_pretraining.pretrain.data import held_out_rows

    settings = fx.model_settings("mlm", max_steps=1, probe_chunks=6)
    assert _run(settings, setup, tmp_path)[0] == 0
    info = json.loads((tmp_path / "encoder" / "training.json").read_text())
    ids = np.concatenate([pq.read_table(p, columns=["chunk_id"])["chunk_id"].to_numpy()
                          for p in setup[1]])
    expected = sorted(ids[held_out_rows(ids, 6, settings["seed"])].tolist())
    assert info["held_out_chunks"] == {setup[1][0].parent.parent.name: expected}
    assert len(expected) == 6


def test_none_objective_exports_the_base_checkpoint(setup, tmp_path):
    checkpoint = setup[0]
    export_base({"name": "bert", "objective": "none", "seed": 1, "checkpoint": "x"}, checkpoint,
                tmp_path / "encoder", tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    model = AutoModel.from_pretrained(tmp_path / "encoder", local_files_only=True)
    base = AutoModel.from_pretrained(checkpoint, local_files_only=True)
    for (name, a), (_, b) in zip(model.state_dict().items(), base.state_dict().items()):
        assert torch.equal(a, b), name
    assert (tmp_path / "metrics.jsonl").read_text() == "" and (tmp_path / "loss.png").exists()
    # Published from a temp folder (mkdtemp: 0700), yet readable by collaborators like any artifact.
    assert (tmp_path / "encoder").stat().st_mode & 0o777 == 0o755
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


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


def _wrap_forward(monkeypatch, before=None, after=None):
    """Patch Pretrainer.forward to call `before(model, batch)` / `after(model, batch, out)` around it."""
    forward = Pretrainer.forward

    def wrapped(self, batch, progress=0.0):
        if before:
            before(self, batch)
        out = forward(self, batch, progress)
        return after(self, batch, out) if after else out

    monkeypatch.setattr(Pretrainer, "forward", wrapped)


def _infinite_slope_at_step_1(model, batch, out):
    """A `_wrap_forward` `after`: at step 1, a loss term whose value is 0 (sqrt at 0: every loss
    stays finite) and whose slope is inf (the gradient is not)."""
    if int(batch["step"]) == 1:
        bias = model.mlm_head.bias[0]
        out["loss"] = out["loss"] + (bias - bias.detach()).sqrt()
    return out


def test_nonfinite_gradient_stops_naming_step_and_items(setup, tmp_path, monkeypatch):
    _wrap_forward(monkeypatch, after=_infinite_slope_at_step_1)
    # Both micro-batches of the step (2 x 4 chunks) are named.
    with pytest.raises(training.NonFiniteGradientError,
                       match=r"gradient norm is (inf|nan) at step 1 for batch items \[\d+(, \d+){7}\]"):
        _run(fx.model_settings("mlm", max_steps=3), setup, tmp_path)


def test_a_nonfinite_step_leaves_the_weights_unchanged(setup, tmp_path, monkeypatch):
    """The check comes after the optimiser step was queued (one read a step); the step itself
    must not have applied: step 1's update leaves every weight as it was (steps 0 and 2 move
    them), and with the check off the run ends with finite weights."""
    _wrap_forward(monkeypatch, after=_infinite_slope_at_step_1)
    monkeypatch.setattr(training, "check_finite_step", lambda *a, **k: None)
    step_if_finite, moved = training.step_if_finite, []

    def watched(optimizer, *args, **kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        step_if_finite(optimizer, *args, **kwargs)
        moved.append(any(not torch.equal(b, p) for b, p in zip(before, params)))

    monkeypatch.setattr(training, "step_if_finite", watched)
    code, records = _run(fx.model_settings("mlm", max_steps=3), setup, tmp_path)
    assert code == 0 and not math.isfinite(records[1]["grad_norm"])
    assert moved == [True, False, True]
    weights = load_file(tmp_path / "encoder" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert all(torch.isfinite(w).all() for w in load_file(tmp_path / "heads.safetensors").values())


@pytest.mark.parametrize("objective", ["costa", "cpdae", "bow"])
def test_a_step_reads_its_values_on_the_host_once(objective, setup, tmp_path, monkeypatch):
    """Every value the model returns and the gradient norm are counted; what is logged must still
    be right (the mean over micro-batches: test_logged_values_are_the_micro_batch_means)."""
    HostReads.count = 0
    _wrap_forward(monkeypatch, after=lambda model, batch, out: {
        key: counted(value) for key, value in out.items()})
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: counted(clip(*a, **k)))
    code, records = _run(fx.model_settings(objective, max_steps=3), setup, tmp_path)
    assert code == 0 and len(records) == 3 and all(math.isfinite(r["grad_norm"]) for r in records)
    assert HostReads.count == 3  # 3 steps of 2 micro-batches, each with 3-5 values


def _read_order(monkeypatch, settings, setup, out: Path) -> tuple[list[str], list[dict]]:
    """A run's order of events: q<step> when a step's first micro-batch is queued (forward in
    training mode), r<step> when its values are taken to the host, P a probe, S a state save."""
    from retrieval_pretraining.pretrain import train as ptrain

    events, forwards = [], []

    def queued(model, batch):
        if model.training:
            forwards.append(1)
            if len(forwards) % 2 == 1:  # 2 micro-batches a step
                events.append(f"q{len(forwards) // 2}")

    with monkeypatch.context() as patch:
        _wrap_forward(patch, before=queued)
        take, probe, save = training.QueuedRead.take, ptrain.probes.probe_batches, training.save_state
        patch.setattr(training.QueuedRead, "take", lambda self: (
            events.append(f"r{len([e for e in events if e[0] == 'r'])}"), take(self))[1])
        patch.setattr(ptrain.probes, "probe_batches", lambda *a, **k: (events.append("P"),
                                                                        probe(*a, **k))[1])
        patch.setattr(training, "save_state", lambda *a, **k: (events.append("S"), save(*a, **k))[1])
        code, records = _run(settings, setup, out)
    assert code == 0
    return events, records


def test_a_step_is_read_after_the_next_is_queued_unless_its_weights_are_read_next(
        setup, tmp_path, monkeypatch):
    """A step's values are taken to the host once the next step is queued (on a GPU the read then
    waits for its own kernels while the next step's run), except a step whose weights are read
    next: before the probes (every 3 steps and the last), a state save (step 5) and the export.
    Read a step late or at once, a run logs the same values (timings aside)."""
    from retrieval_pretraining.pretrain import train as ptrain

    settings = fx.model_settings("mlm", max_steps=7, probe_chunks=4, probe_every=3,
                                 checkpoint_every=5, log_every=1)
    late, late_records = _read_order(monkeypatch, settings, setup, tmp_path / "late")
    assert late == ["P", "q0", "q1", "r0", "q2", "r1", "r2", "P", "q3", "q4", "r3", "r4", "S",
                    "q5", "r5", "P", "q6", "r6", "P"]
    monkeypatch.setattr(ptrain, "READ_A_STEP_LATE", False)
    at_once, records = _read_order(monkeypatch, settings, setup, tmp_path / "at_once")
    assert at_once == ["P", "q0", "r0", "q1", "r1", "q2", "r2", "P", "q3", "r3", "q4", "r4", "S",
                       "q5", "r5", "P", "q6", "r6", "P"]
    timing = {"tokens_per_s", "input_wait_share", "memory_mb"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in late_records] == \
        [{k: v for k, v in r.items() if k not in timing} for r in records]


@pytest.mark.parametrize("where", ["forward", "backward", "optimizer step", "fetch", "probes"])
def test_out_of_memory_in_a_step_names_the_micro_batch_size_that_fixes_it(where, setup, tmp_path,
                                                                         monkeypatch):
    """A micro-batch's forward and backward, and the optimiser step (whose first call allocates
    AdamW's state beside the weights), are where a step runs out of GPU memory: each says to
    lower micro_batch_size, which gradient accumulation compensates. So do a micro-batch's copy
    to the device and the probes (batches of at most micro_batch_size held-out chunks). A
    caching step's own: test_pretrain_contrast_cache.py."""
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, {where})")

    settings = fx.model_settings("mlm", max_steps=2, probe_chunks=4 if where == "probes" else 0)
    if where == "fetch":  # the trainer's one non-blocking copy: a micro-batch to the device
        to = torch.Tensor.to
        monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: out_of_memory()
                            if k.get("non_blocking") else to(self, *a, **k))
    elif where == "probes":
        from retrieval_pretraining.pretrain import train as ptrain

        monkeypatch.setattr(ptrain.probes, "probe_batches", out_of_memory)
    elif where == "forward":
        _wrap_forward(monkeypatch, before=out_of_memory)
    elif where == "backward":
        _wrap_forward(monkeypatch, after=lambda model, batch, out: out | {
            "loss": OutOfMemoryInBackward.apply(out["loss"])})
    else:
        monkeypatch.setattr(training, "step_if_finite", out_of_memory)
    with pytest.raises(RuntimeError, match=r"out of memory with micro_batch_size=4: lower "
                                           r"'micro_batch_size' \(the global batch stays") as raised:
        _run(settings, setup, tmp_path)
    assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)


@pytest.mark.parametrize("where", ["model", "resumed state", "DDP"])
def test_out_of_memory_before_any_step_names_the_gpu_not_the_micro_batch_size(where, setup,
                                                                              tmp_path,
                                                                              monkeypatch):
    """Moving the model onto the GPU, loading a resumed optimiser state (AdamW's, twice the
    weights) and wrapping the model in DDP (gradient buffers the size of the weights, with several
    processes) come before any micro-batch: out of memory there, lowering micro_batch_size (the
    steps' advice) changes nothing, so the message names what does, the GPU's other tenants and
    its size (pre-training's rule, not fine-tuning's), and a saved state survives for the rerun."""
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, {where})")

    settings = fx.model_settings("mlm", max_steps=4, checkpoint_every=1)
    latest = tmp_path / "state" / "checkpoints" / "latest.json"
    if where == "resumed state":
        with monkeypatch.context() as patch, pytest.raises(RuntimeError, match="micro_batch_size"):
            _wrap_forward(patch, before=lambda model, batch: out_of_memory()
                          if int(batch["step"]) == 2 else None)
            _run(settings, setup, tmp_path)
        saved = json.loads(latest.read_text())
        assert saved["step"] > 0
        monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", out_of_memory)
    elif where == "DDP":  # DDP's constructor, where its gradient buffers are allocated
        monkeypatch.setattr(training, "data_parallel", out_of_memory)
    else:
        monkeypatch.setattr(Pretrainer, "to", out_of_memory)
    with pytest.raises(RuntimeError) as raised:
        _run(settings, setup, tmp_path)
    message = str(raised.value)
    assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)
    doing = {"model": "loading the model onto ", "DDP": "wrapping the model in DDP on ",
             "resumed state": "loading the resumed optimiser state onto "}[where]
    assert message.startswith(f"out of memory with micro_batch_size=4: {doing}")
    assert "lower 'micro_batch_size'" not in message and "finetune" not in message
    assert "no pretrain trainer key lowers this" in message
    assert "nvidia-smi" in message and "gpu_model on pretrain_model in" in message
    # Multi-node pre-training asks for its GPUs through gres (gpu: 0): the model goes there.
    assert "where the rule sets gres instead" in message and "gres, e.g. gpu:a100:8" in message
    if where == "DDP":
        assert "DDP's gradient buffers" in message and "nor do more GPUs" in message
    if where == "resumed state":  # kept, whole, for the rerun on a GPU with room
        assert json.loads(latest.read_text()) == saved
        assert (latest.parent / saved["checkpoint"] / "state.safetensors").is_file()


def test_a_tokenizer_with_ids_past_the_embedding_table_is_refused_before_any_work(setup,
                                                                                   tmp_path):
    """A token added to the tokenizer and not to the model is an id the word embeddings have no
    row for: the first text, or random replacement, holding it fails the lookup (a device-side
    assert on CUDA) hours in. Refused before the data store is built, naming both sizes and the
    checkpoint."""
    from retrieval_pretraining.model_folder import ModelFolderError

    checkpoint = fx.add_tokens(fx.tiny_checkpoint(tmp_path / "checkpoint"), "zzqword")
    with pytest.raises(ModelFolderError) as raised:
        _run(fx.model_settings("mlm", max_steps=2), (checkpoint, *setup[1:]), tmp_path / "out")
    message = str(raised.value)
    assert f"the tokenizer of {checkpoint} has 30523 tokens (ids up to 30522)" in message
    assert "word embeddings have 30522 rows" in message and "'zzqword'" in message
    assert not (tmp_path / "out" / "state").exists()  # no data store, no state: nothing began


def test_an_embedding_table_padded_past_the_tokenizer_pre_trains(setup, tmp_path):
    """A table with more rows than the tokenizer has ids (padded to a multiple of 64) is fine: the
    extra rows are never looked up, and the heads' outputs (MLM, CPDAE's bag) span the table."""
    checkpoint = fx.tiny_checkpoint(tmp_path / "checkpoint", vocab_size=30528)
    settings = fx.model_settings("cpdae", max_steps=2)
    code, records = _run(settings, (checkpoint, *setup[1:]), tmp_path / "out")
    losses = [r["loss"] for r in records if "loss" in r]
    assert code == 0 and len(losses) == 2 and all(math.isfinite(v) for v in losses)
    encoder = AutoModel.from_pretrained(tmp_path / "out" / "encoder")
    assert encoder.get_input_embeddings().num_embeddings == 30528


@pytest.mark.parametrize("nan", [True, False])
def test_a_nonfinite_step_read_late_is_reported_before_the_next_steps_error(nan, setup, tmp_path,
                                                                          monkeypatch):
    """Step s's values are read after step s+1 is queued: when queueing s+1 fails (out of memory
    here), step s's NaN loss, what a user must fix first, is still the error raised, with the
    later one as its context (on the traceback too), not lost with the unread values. A finite
    step s leaves the later error as it was."""
    def nan_at_step_0(model, batch, out):
        return out | {"loss": out["loss"] * math.nan} if nan and int(batch["step"]) == 0 else out

    def out_of_memory_at_step_1(model, batch):
        if int(batch["step"]) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, step 1)")

    _wrap_forward(monkeypatch, before=out_of_memory_at_step_1, after=nan_at_step_0)
    with pytest.raises(Exception) as raised:
        _run(fx.model_settings("mlm", max_steps=3), setup, tmp_path)
    later = raised.value.__context__ if nan else raised.value
    if nan:
        assert isinstance(raised.value, training.NonFiniteLossError)
        assert re.match(r"loss term 'loss' is nan at step 0 for batch items \[\d+",
                        str(raised.value))
    assert type(later) is RuntimeError and "out of memory with micro_batch_size" in str(later)
    assert isinstance(later.__cause__, torch.OutOfMemoryError)


class OutOfMemoryInBackward(torch.autograd.Function):
    """The identity, whose backward runs out of memory."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated, backward)")


def test_each_step_clips_every_weight_s_gradient_at_max_grad_norm(setup, tmp_path, monkeypatch):
    """trainer.max_grad_norm bounds the global L2 norm of every weight's gradient, the
    heads' too (BERT's 1.0, ARCHITECTURE.md): the losses and weights of a run are blind to the
    bound where the norms stay under it, so the bound and what it covers are read here."""
    clips, original = [], torch.nn.utils.clip_grad_norm_

    def spy(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        norm = original(parameters, max_norm, *args, **kwargs)
        after = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(p.grad) for p in parameters if p.grad is not None]))
        clips.append((max_norm, len(parameters), float(norm), float(after)))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    models = []
    _wrap_forward(monkeypatch, before=lambda model, batch: models.append(model))
    code, records = _run(fx.model_settings("mlm", max_steps=2, max_grad_norm=0.01), setup,
                         tmp_path)
    assert code == 0 and len(clips) == 2
    trained = len(list(models[0].parameters()))  # every one, the heads' too
    for (bound, tensors, norm, after), record in zip(clips, records):
        assert (bound, tensors) == (0.01, trained)
        assert norm > 0.01 and after == pytest.approx(0.01, rel=1e-3)  # it did clip
        assert record["grad_norm"] == pytest.approx(norm)  # the norm logged is before clipping


def test_every_micro_batch_gets_the_progress_of_its_step(setup, tmp_path, monkeypatch):
    """`progress` (what the BoW weight's cosine and the like read) is step / total_steps, 0 at the
    first step, for each of a step's micro-batches."""
    seen, forward = [], Pretrainer.forward

    def spy(self, batch, progress=0.0, **kwargs):
        seen.append(float(progress))
        return forward(self, batch, progress, **kwargs)

    monkeypatch.setattr(Pretrainer, "forward", spy)
    assert _run(fx.model_settings("mlm", max_steps=4), setup, tmp_path)[0] == 0
    assert seen == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75]  # 2 micro-batches a step


def test_with_max_steps_null_a_run_is_its_epochs_of_whole_global_batches(setup, tmp_path):
    """max_steps null: epochs x steps_per_epoch steps (config.yaml), an epoch the training
    chunks' whole global batches."""
    code, records = _run(fx.model_settings("mlm", max_steps=None, epochs=2), setup, tmp_path)
    info = json.loads((tmp_path / "encoder" / "training.json").read_text())
    assert code == 0 and info["steps_per_epoch"] == info["chunks"] // 8 > 0
    assert info["steps"] == 2 * info["steps_per_epoch"] == records[-1]["step"]


def test_logged_values_are_the_micro_batch_means(setup, tmp_path, monkeypatch):
    seen, tokens = [], []

    def keep(model, batch, out):
        seen.append({key: float(value.detach()) for key, value in out.items()})
        tokens.append(int(batch["n_tokens"]))
        return out

    _wrap_forward(monkeypatch, after=keep)
    code, records = _run(fx.model_settings("costa", max_steps=3), setup, tmp_path)
    assert code == 0 and len(seen) == 6 and set(records[0]) >= set(seen[0]) >= {"loss", "loss_gwc"}
    for step, record in enumerate(records):
        for key in seen[0]:
            mean = (seen[2 * step][key] + seen[2 * step + 1][key]) / 2
            assert record[key] == pytest.approx(mean, rel=1e-6), (step, key)
        assert record["tokens_seen"] == sum(tokens[:2 * step + 2])


def test_each_record_gives_the_share_of_time_spent_waiting_for_input(setup, tmp_path,
                                                                     monkeypatch):
    """`input_wait_share`: the loop's seconds waiting for the DataLoader over the interval's wall
    seconds, what tells a user whether the input pipeline leaves a GPU idle. A loader slowed by
    0.5 s a micro-batch makes it most of each step; the same run unslowed, far less. (0.2 s was
    too little on two cores shared with a demo run: the slowed share came out under 0.6.)"""
    from retrieval_pretraining.pretrain.data import MicroBatches

    code, fast = _run(fx.model_settings("mlm", max_steps=3), setup, tmp_path / "fast")
    getitem = MicroBatches.__getitem__

    def slow(self, k):
        time.sleep(0.5)
        return getitem(self, k)

    monkeypatch.setattr(MicroBatches, "__getitem__", slow)
    code_slow, slowed = _run(fx.model_settings("mlm", max_steps=3), setup, tmp_path / "slow")
    assert code == code_slow == 0 and len(fast) == len(slowed) == 3
    assert all(0.0 <= r["input_wait_share"] <= 1.0 for r in fast + slowed)
    assert all(r["input_wait_share"] > 0.6 for r in slowed)
    assert max(r["input_wait_share"] for r in fast) < min(r["input_wait_share"] for r in slowed) - 0.3


def test_training_steps_run_with_dropout_on(dropout_setup, tmp_path, monkeypatch):
    modes = []
    _wrap_forward(monkeypatch, before=lambda model, batch: modes.append(
        all(m.training for m in model.modules())))
    code, _ = _run(fx.model_settings("mlm", max_steps=2), dropout_setup, tmp_path)
    assert code == 0 and modes == [True] * 4  # 2 steps x 2 micro-batches


def test_a_new_pretrainer_is_in_training_mode(dropout_setup):
    model = Pretrainer(dropout_setup[0], fx.model_settings("mlm"))
    ids = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        assert model.training and model.encoder.training
        assert not torch.equal(model.hidden(batch), model.hidden(batch))  # dropout draws
        model.eval()
        assert torch.equal(model.hidden(batch), model.hidden(batch))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_checkpoint_trains_fp32_weights(setup, tmp_path, dtype):
    """A checkpoint saved in bf16 or fp16 (config.json's dtype) is pre-trained in fp32, through
    the trainer end to end (model_folder.load_model upcasts; its own tests cover the loaders):
    in its own dtype the encoder's weights were half precision beside fp32 heads, where an
    lr-5e-5 AdamW update (~1e-3 of a weight) is under half bf16's spacing and rounds away (on a
    GPU, silently, under autocast; on the CPU the fp32 MLM head refused the bf16 states)."""
    checkpoint = tmp_path / "half"
    BertModel = type(AutoModel.from_pretrained(setup[0], local_files_only=True))
    half = BertModel.from_pretrained(setup[0], local_files_only=True, dtype=dtype)
    half.save_pretrained(checkpoint)
    AutoTokenizer.from_pretrained(setup[0], local_files_only=True).save_pretrained(checkpoint)
    stored = load_file(checkpoint / "model.safetensors")
    model = Pretrainer(checkpoint, fx.model_settings("mlm"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for key, value in model.encoder.state_dict().items():  # the stored values, upcast exactly
        if key in stored and value.is_floating_point():
            assert stored[key].dtype == dtype and torch.equal(value, stored[key].float()), key
    settings = fx.model_settings("mlm", max_steps=2)
    code, _ = _run(settings, (checkpoint, *setup[1:]), tmp_path / "run")
    assert code == 0
    exported = load_file(tmp_path / "run" / "encoder" / "model.safetensors")
    assert {v.dtype for v in exported.values() if v.is_floating_point()} == {torch.float32}
    config = json.loads((tmp_path / "run" / "encoder" / "config.json").read_text())
    assert config["dtype"] == "float32"  # what loads it (dtype "auto") reads


def _hand_batch(views: int) -> dict:
    """Two texts (the second padded), masked by hand; `views` stacks differently masked copies."""
    original = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102],
                             [101, 2019, 3231, 2003, 2986, 102, 0, 0]])
    attention = (original != 0).long()
    masked_at = [[(2, 5), (3,)], [(1, 6), (2, 4)]]  # per view, per text: masked positions
    inputs, labels = [], []
    for view in range(views):
        for text in range(2):
            ids, label = original[text].clone(), torch.full_like(original[text], -100)
            where = list(masked_at[view][text])
            label[where], ids[where] = original[text, where], 103
            inputs.append(ids)
            labels.append(label)
    return {
        "input_ids": torch.stack(inputs), "attention_mask": attention.repeat(views, 1),
        "labels": torch.stack(labels), "original_ids": original,
        "span_start": torch.tensor([[1, 2, 4], [1, 3, 1]]), "span_end": torch.tensor([[2, 5, 7], [3, 5, 2]]),
        "span_mask": torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool),
        # Bags without [CLS]/[SEP]/[PAD], padded with 0.
        "bag_ids": torch.tensor([[1996, 2006, 2938, 4937, 13523], [2003, 2019, 2986, 3231, 0]]),
        "bag_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool),
    }


@pytest.mark.parametrize("variant", ["mlm", "costa", "costa-unmasked", "costa-knobs", "cpdae",
                                     "cpdae-mean", "cpdae-knobs", "cpdae_r", "cpdae_r-knobs", "bow",
                                     "bow-knobs", "bow-paper"])
def test_pretrainer_forward_combines_the_terms(wide_checkpoint, variant):
    """Each total = the objective's formula over terms computed here from the encoder's outputs,
    with the settings' choices (CPDAE's reconstruction reduction; BoW's paper recipe: h_CLS . E^T,
    summed over the bag, a constant weight). The -knobs variants set the loss knobs away from the
    shipped defaults (COSTA's temperature 1 and lambda of its ablations, explicit CPDAE
    temperatures, another end of BoW's cosine weight): each must reach the loss, not only the
    default that a hard-coded value would also give."""
    objective = variant.split("-")[0]
    settings = fx.model_settings(objective)
    if variant == "costa-unmasked":
        settings["costa"]["span_pass"] = "unmasked"
    if variant == "costa-knobs":
        settings["costa"].update(temperature=1.0, **{"lambda": 0.3})
    if variant in ("cpdae-knobs", "cpdae_r-knobs"):
        settings["cpdae"].update(temperature=0.5, **{"lambda": 0.4})
    if variant == "bow-knobs":
        settings["bow"].update(weight=2.0, weight_end=0.5)
    if variant == "cpdae-mean":
        settings["cpdae"]["reconstruction"] = "mean"
    if variant == "bow-paper":
        settings["bow"].update(form="paper", reduction="sum", weight_schedule="constant", weight=0.7)
    model = Pretrainer(wide_checkpoint, settings).eval()
    batch = _hand_batch(2 if objective.startswith("cpdae") else 1)
    with torch.no_grad():
        out = model(batch, progress=0.25)
        # As the trainer's batches come: the predicted positions found on the host.
        positioned = model(with_positions(dict(batch)), progress=0.25)
        hidden = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        # MLM: the head on every position, padding and unmasked positions ignored.
        mlm = torch.nn.functional.cross_entropy(model.mlm_head(hidden).flatten(0, 1), batch["labels"].flatten())
        cls = hidden[:, 0]
        if objective == "costa":
            opts = settings["costa"]
            source = hidden if opts["span_pass"] == "masked" else model.encoder(
                input_ids=batch["original_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            spans = torch.stack([torch.stack([source[b, s:e].mean(0) for s, e in zip(
                batch["span_start"][b].tolist(), batch["span_end"][b].tolist())]) for b in range(2)])
            gwc = obj.costa_loss(model.projector(cls), spans, batch["span_mask"], temperature=opts["temperature"])
            expected = {"loss_mlm": mlm, "loss_gwc": gwc, "loss": mlm + opts["lambda"] * gwc,
                        # the other text and every real span of the batch
                        "contrast_pool": torch.tensor(2 - 1 + batch["span_mask"].sum().item())}
        elif objective.startswith("cpdae"):
            opts = settings["cpdae"]
            # None, the shipped default: the per-variant temperature (1 for -JS, 0.1 for cosine)
            assert (opts["temperature"] is None) == (variant in ("cpdae", "cpdae-mean", "cpdae_r"))
            tau = opts["temperature"]
            logits = model.decoder(cls)
            target = torch.zeros(2, model.vocab_size)
            for b in range(2):
                target[b, batch["bag_ids"][b][batch["bag_mask"][b]]] = 1
            rec = obj.reconstruction_loss(logits, torch.cat([target, target]), opts["reconstruction"])
            if objective == "cpdae":
                cl = obj.cpdae_contrastive(logits, 1.0 if tau is None else tau)
            else:
                cl = obj.dense_contrastive(cls, 0.1 if tau is None else tau)
            expected = {"loss_mlm": mlm, "loss_rec": rec, "loss_cl": cl, "loss": rec + mlm + opts["lambda"] * cl,
                        "contrast_pool": torch.tensor(2 * 2 - 1)}  # 2 texts x 2 views, minus itself
        elif objective == "bow":
            opts = settings["bow"]
            if variant != "bow-paper":  # the code recipe: MLM head, mean over the bag, cosine
                bow = obj.bow_loss(model.mlm_head(cls), batch["bag_ids"], batch["bag_mask"], "mean")
                weight = opts["weight_end"] + (opts["weight"] - opts["weight_end"]) * 0.5 * (
                    1 + math.cos(math.pi * 0.25))
            else:  # the paper recipe: h_CLS . E^T, summed over the bag, the constant weight
                logits = cls @ model.encoder.embeddings.word_embeddings.weight.T
                bow, weight = obj.bow_loss(logits, batch["bag_ids"], batch["bag_mask"], "sum"), 0.7
            expected = {"loss_mlm": mlm, "loss_bow": bow, "bow_weight": torch.tensor(weight), "loss": mlm + weight * bow}
        else:
            expected = {"loss_mlm": mlm, "loss": mlm}
    assert out.keys() == expected.keys() == positioned.keys()
    for key, value in expected.items():
        torch.testing.assert_close(out[key].float(), value.float(), msg=key)
        torch.testing.assert_close(positioned[key].float(), value.float(), msg=key)


def test_costa_text_vector_stays_fp32_under_bf16_autocast(setup):
    """The projector runs in fp32 under bf16 autocast: a bf16 text vector would have lost, before
    fp32_scores, the precision those similarity scores are in fp32 for. The probe projects the
    same way. Outside autocast it is the projector as before, bit for bit."""
    from retrieval_pretraining.pretrain import probes

    model = Pretrainer(setup[0], fx.model_settings("costa")).eval()
    batch = _hand_batch(1)
    with torch.no_grad():
        hidden = model.hidden(batch)
        want = model.projector(hidden[:, 0])
        assert torch.equal(model.contrast_inputs(batch, hidden)["text"], want)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            text = model.contrast_inputs(batch)["text"]
            bf16 = model.projector(hidden[:, 0])
    assert bf16.dtype == torch.bfloat16  # what the old code compared: autocast does reach it
    assert text.dtype == torch.float32
    torch.testing.assert_close(text, want, rtol=0.02, atol=0.02)  # the bf16 encoder's states
    projected = []
    model.projector.register_forward_hook(lambda module, args, out: projected.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probes.probe(model, batch)
    assert projected == [torch.float32]


@pytest.mark.parametrize("kind, layers", [("nonlinear", [torch.nn.Linear, torch.nn.Tanh]),
                                          ("linear", [torch.nn.Linear]), ("none", [])])
def test_costa_s_projector_is_the_one_the_settings_name(setup, kind, layers):
    """COSTA's text projector is Tanh(Linear) on [CLS] (the paper's), and its Table 6 ablations
    (Linear, none) must build what costa.projector names."""
    settings = fx.model_settings("costa")
    settings["costa"]["projector"] = kind
    projector = Pretrainer(setup[0], settings).projector
    modules = list(projector) if isinstance(projector, torch.nn.Sequential) else [projector]
    assert [type(m) for m in modules if not isinstance(m, torch.nn.Identity)] == layers
    cls = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.equal(projector(cls), cls) == (kind == "none")


def test_cpdae_decoder_is_two_ffn_blocks_to_the_vocabulary_starting_at_the_bag_prior(setup):
    """CPDAE's MLP decoder on [CLS]: two FFN layers, each Linear, GELU, LayerNorm, then |V|
    logits; with a bag prior (the data's word-set density) every sigmoid output starts there."""
    model = Pretrainer(setup[0], fx.model_settings("cpdae"), bag_prior=0.05)
    nn = torch.nn
    assert [type(m) for m in model.decoder] == [nn.Linear, nn.GELU, nn.LayerNorm] * 2 + [nn.Linear]
    assert [m.out_features for m in model.decoder if isinstance(m, nn.Linear)] == [32, 32, 30522]
    torch.testing.assert_close(torch.sigmoid(model.decoder[-1].bias), torch.full((30522,), 0.05),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("objective, varlen", [("costa", False), ("cpdae", False),
                                                ("condenser", False), ("retromae", False),
                                                ("costa", True), ("condenser", True)])
def test_skipping_the_padding_trains_as_the_padded_run(objective, varlen, setup, tmp_path,
                                                       monkeypatch):
    """trainer.unpad: the encoder's layers compute the real tokens only (dropout is off in this
    checkpoint, so the runs can agree): the same losses step by step, Condenser's early-layer
    states included, on batches that have padding to skip. `varlen`: attention too, as on a GPU."""
    from retrieval_pretraining import bert

    if varlen:
        monkeypatch.setattr(bert, "VARLEN_DEVICES", ("cpu",))
    skipped = []

    def count(model, batch):
        skipped.append(batch["attention_mask"].numel() - len(batch["token_positions"]))

    padded_code, padded = _run(fx.model_settings(objective, max_steps=3), setup,
                               tmp_path / "padded")
    _wrap_forward(monkeypatch, before=count)
    code, unpadded = _run(fx.model_settings(objective, max_steps=3, unpad=True), setup,
                          tmp_path / "unpadded")
    assert code == padded_code == 0 and sum(skipped) > 0
    assert len(unpadded) == len(padded) == 3
    for a, b in zip(unpadded, padded):
        for key in a:
            if key.startswith(("loss", "probe")):
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (a["step"], key)


@pytest.mark.parametrize("objective, unpad", [
    *[(o, False) for o in ("mlm", "costa", "cpdae", "cpdae_r", "bow", "condenser", "cocondenser",
                           "retromae", "ae_decoder", "ar_decoder")],
    ("costa", True), ("condenser", True)])
def test_a_step_and_the_probes_make_every_tensor_on_the_device_of_their_inputs(
        objective, unpad, setup, tmp_path, monkeypatch):
    """Inside a training step's forward and the held-out probes, a tensor made
    without a device would be made on the CPU and, on a GPU, meet CUDA tensors: a crash there (the
    probes had two, found by reading before any GPU ran them). Here the step and the probes run
    with torch's default device set to "meta": such a tensor lands there and fails at its first
    use with the CPU's."""
    from retrieval_pretraining.pretrain import probes

    forward, probe = Pretrainer.forward, probes.pooled_probe
    ran = []

    def on_meta(function):
        def run(*args, **kwargs):
            ran.append(function.__name__)
            with torch.device("meta"):
                return function(*args, **kwargs)
        return run

    monkeypatch.setattr(Pretrainer, "forward", on_meta(forward))
    monkeypatch.setattr(probes, "pooled_probe", on_meta(probe))
    code, records = _run(fx.model_settings(objective, max_steps=2, unpad=unpad, probe_chunks=4,
                                           probe_every=1), setup, tmp_path)
    assert code == 0 and {"forward", "pooled_probe"} <= set(ran)
    assert any(key.startswith("probe_") for key in records[0])  # step 0's probes were written


@pytest.mark.parametrize("objective, unpad", [
    *[(o, False) for o in ("mlm", "costa", "cpdae", "cpdae_r", "bow", "condenser", "cocondenser",
                           "retromae", "ae_decoder", "ar_decoder")],
    ("mlm", True), ("costa", True)])
def test_no_objective_s_forward_makes_the_host_wait(objective, unpad, setup, tmp_path,
                                                    monkeypatch):
    """The first lent GPU counted one wait a step inside COSTA's and the two-view objectives'
    losses (an assignment of True into a mask: a copy from host memory). Here, on the CPU, every
    operation a step's forward dispatches is recorded, and none may be one that waits on a GPU."""
    waits = HostWaits()
    forward = Pretrainer.forward

    def recorded(self, batch, progress=0.0):
        with waits:
            return forward(self, batch, progress)

    monkeypatch.setattr(Pretrainer, "forward", recorded)
    code, records = _run(fx.model_settings(objective, max_steps=2, unpad=unpad), setup, tmp_path)
    assert code == 0 and len(records) == 2
    assert waits.waits == []


@pytest.mark.parametrize("variant", ["bow", "costa", "cpdae", "cpdae-gathered"])
def test_a_compiled_trainer_follows_the_eager_run_without_recompiling_each_step(
        variant, setup, tmp_path, monkeypatch):
    """`compile: true` through dynamo and AOT autograd (the aot_eager backend: inductor's code
    generation takes minutes on CPU; the GPU checks time it). BoW's weight changes every step: as a
    Python float it was guarded by value, a recompilation a step until dynamo failed. CPDAE's JS
    term is a hand-written autograd Function, traced with its own backward; gathered, its 2
    micro-batches a step go through the compiled pass with their cached contrastive gradient."""
    from torch._dynamo.utils import counters

    objective, _, gathered = variant.partition("-")

    def settings(**trainer):
        out = fx.model_settings(objective, max_steps=6, **trainer)
        if gathered:
            out[objective]["gather_negatives"] = True
        return out

    _, eager = _run(settings(), setup, tmp_path / "eager")
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile_(model, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    code, compiled = _run(settings(compile=True), setup, tmp_path / "compiled")
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert code == 0 and 1 <= graphs <= 3  # the first shapes, then dynamic ones (+ the last batch)
    torch.testing.assert_close([r["loss"] for r in compiled], [r["loss"] for r in eager],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("objective", ["mlm", "costa", "cpdae", "cpdae_r", "bow", "condenser",
                                       "cocondenser", "retromae", "ae_decoder", "ar_decoder"])
@pytest.mark.parametrize("unpad", [False, True])
def test_every_objective_s_step_traces_to_one_graph(objective, unpad, setup, tmp_path, monkeypatch):
    """On the trainer's own batches, torch.compile captures the whole forward pass: no graph
    break, so nothing in it reads a value on the host (a boolean mask's count, .item()), which on
    a GPU would make the host wait for the device every step."""
    import torch._dynamo

    forward, found = Pretrainer.forward, []

    def explain(model, batch):
        if not found:
            torch._dynamo.reset()
            found.append(torch._dynamo.explain(forward)(model, batch, progress=0.5))

    _wrap_forward(monkeypatch, before=explain)
    assert _run(fx.model_settings(objective, max_steps=1, unpad=unpad), setup, tmp_path)[0] == 0
    torch._dynamo.reset()
    assert [r.reason for r in found[0].break_reasons] == [] and found[0].graph_count == 1


# The baselines' heads use dropout and their inputs (segments, decoder rows) are drawn per chunk:
# a resumed run must redraw both exactly.
@pytest.mark.parametrize("objective", ["mlm", "condenser", "cocondenser", "retromae", "ae_decoder", "ar_decoder"])
def test_stop_and_resume_with_dropout_equals_uninterrupted_run(dropout_setup, tmp_path, monkeypatch,
                                                               restore_stop_handlers, objective):
    settings = fx.model_settings(objective, max_steps=5)
    code, whole = _run(settings, dropout_setup, tmp_path / "whole")
    assert code == 0
    calls = []

    def signal_at_step_1(model, batch):
        calls.append(1)
        if len(calls) == 3:  # first micro-batch of step 1: its values (and the stop) are read
            os.kill(os.getpid(), signal.SIGUSR1)  # once step 2 is queued, so it stops after 2

    _wrap_forward(monkeypatch, before=signal_at_step_1)
    code, records = _run(settings, dropout_setup, tmp_path / "part")
    assert code == training.RESUME_EXIT_CODE and [r["step"] for r in records] == [1, 2, 3]
    monkeypatch.undo()
    code, records = _run(settings, dropout_setup, tmp_path / "part")
    assert code == 0 and [r["step"] for r in records] == [1, 2, 3, 4, 5]
    # Dropout masks are keyed by (seed, step, micro-batch), so resuming draws the same ones.
    _assert_same_weights(_weights(tmp_path / "part"), _weights(tmp_path / "whole"), atol=0.0)
    # ... and the records after the resume are the whole run's: its lr, and the tokens seen
    # counted on from the saved state's (a count restarted at 0 shifts the loss curves' axis).
    for key in ("loss", "lr", "grad_norm", "tokens_seen"):
        assert [r[key] for r in records] == [r[key] for r in whole], key


def test_a_resumed_cosine_schedule_continues_where_it_stopped(dropout_setup, tmp_path,
                                                             monkeypatch, restore_stop_handlers):
    """The BoW authors' schedule knobs reach the trainer (a head-warm-up hold, then warmup_steps,
    then a cosine to min_lr_ratio x lr), and a run stopped part-way resumes it: each step's lr
    and the final weights are the uninterrupted run's (LambdaLR's state is the step count)."""
    from test_lr_schedule import _cosine

    settings = fx.model_settings("mlm", max_steps=5, head_warmup_steps=1, lr_schedule="cosine",
                                 min_lr_ratio=0.1, warmup_steps=2, warmup_ratio=0.5, log_every=1)
    code, whole = _run(settings, dropout_setup, tmp_path / "whole")
    assert code == 0 and [r["step"] for r in whole] == [1, 2, 3, 4, 5, 6]
    peak = settings["trainer"]["lr"]
    expected = [_cosine(s, 2, 6, 0.1, hold=1, peak=peak) for s in range(6)]
    assert [r["lr"] for r in whole] == pytest.approx(expected, rel=1e-12)
    assert whole[-1]["lr"] < peak and whole[1]["lr"] == pytest.approx(peak / 2)
    calls = []

    def signal_at_step_1(model, batch):
        calls.append(1)
        if len(calls) == 3:  # step 1's first micro-batch: it stops after step 2, as above
            os.kill(os.getpid(), signal.SIGUSR1)

    _wrap_forward(monkeypatch, before=signal_at_step_1)
    code, records = _run(settings, dropout_setup, tmp_path / "part")
    assert code == training.RESUME_EXIT_CODE and [r["step"] for r in records] == [1, 2, 3]
    monkeypatch.undo()
    code, records = _run(settings, dropout_setup, tmp_path / "part")
    assert code == 0 and [r["lr"] for r in records] == [r["lr"] for r in whole]
    _assert_same_weights(_weights(tmp_path / "part"), _weights(tmp_path / "whole"), atol=0.0)




def test_a_state_is_not_resumed_over_a_rebuilt_checkpoint_or_heads(setup, tmp_path, monkeypatch,
                                                                    restore_stop_handlers):
    """An `init` model rebuilt at the same path (other weights, same name) starts afresh: the
    state holds updates to the old weights. So do other init_heads."""
    checkpoint, chunks, spans = setup
    upstream = fx.copy_tree(checkpoint, tmp_path / "upstream")
    settings = fx.model_settings("mlm", max_steps=4)

    def stopped_run(out, init_heads=None):
        calls = []

        def signal_at_step_1(model, batch):
            calls.append(1)
            if len(calls) == 3:  # first micro-batch of step 1: read once step 2 is queued,
                os.kill(os.getpid(), signal.SIGUSR1)  # so the run stops after step 2

        with monkeypatch.context() as patch:
            patch.setattr(Pretrainer, "forward", _forwarding(Pretrainer.forward, signal_at_step_1))
            assert train(settings, chunks=chunks, spans=None, checkpoint=upstream,
                         encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl",
                         plot_out=out / "loss.png", state_dir=out / "state",
                         init_heads=init_heads) == training.RESUME_EXIT_CODE

    def resumed_from(out, init_heads=None):
        assert train(settings, chunks=chunks, spans=None, checkpoint=upstream,
                     encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl",
                     plot_out=out / "loss.png", state_dir=out / "state",
                     init_heads=init_heads) == 0
        return json.loads((out / "encoder" / "training.json").read_text())["resumed_from_step"]

    stopped_run(tmp_path / "same")
    assert resumed_from(tmp_path / "same") == 3  # the control: nothing changed, it resumes
    stopped_run(tmp_path / "rebuilt")
    weights = load_file(upstream / "model.safetensors")
    save_file({k: v + 0.5 for k, v in weights.items()}, str(upstream / "model.safetensors"))
    assert resumed_from(tmp_path / "rebuilt") == 0
    assert list(tmp_path.glob("rebuilt/state.superseded-*/latest.json"))  # set aside, not deleted

    heads = {k: v for k, v in load_file(tmp_path / "same" / "heads.safetensors").items()}
    save_file(heads, str(tmp_path / "heads.safetensors"))
    stopped_run(tmp_path / "heads", init_heads=tmp_path / "heads.safetensors")
    save_file({k: v + 0.5 for k, v in heads.items()}, str(tmp_path / "heads.safetensors"))
    assert resumed_from(tmp_path / "heads", init_heads=tmp_path / "heads.safetensors") == 0


def _forwarding(forward, before):
    def wrapped(self, batch, progress=0.0, **kwargs):
        before(self, batch)
        return forward(self, batch, progress, **kwargs)
    return wrapped


def test_a_full_disk_during_a_state_save_leaves_no_state_or_encoder_and_a_rerun_recovers(
    setup, tmp_path, restore_stop_handlers
):
    """The disk fills while the first resumable state is written (its weights are larger than
    the limit): the run fails with the OS error, leaving no state folder, no temp folder and no
    encoder; the rerun once there is space again trains to the weights and the metrics of a run
    on a disk with room."""
    settings = fx.model_settings("mlm", max_steps=4, checkpoint_every=2)
    code, roomy = _run(settings, setup, tmp_path / "roomy")
    assert code == 0
    part = tmp_path / "part"
    with pytest.raises(Exception) as error, full_disk(
            (tmp_path / "roomy" / "encoder" / "model.safetensors").stat().st_size // 2):
        _run(settings, setup, part)
    assert is_full_disk_error(error.value), error.value
    assert not (part / "encoder").exists()
    assert sorted(p.name for p in (part / "state" / "checkpoints").iterdir()) == [
        "job.json", "metrics.jsonl"]
    code, rerun = _run(settings, setup, part)
    assert code == 0 and _untimed(rerun) == _untimed(roomy)
    _assert_same_weights(_weights(part), _weights(tmp_path / "roomy"), atol=0.0)


def _wait_until_training(proc, metrics: Path, seconds: float = 180) -> None:
    """Until the run has logged two records (it is past its start and stepping), while it lives."""
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0][-3000:]


def _untimed(records):
    """Metrics records without what depends on the machine's speed and memory."""
    return [{k: v for k, v in r.items()
             if k not in ("tokens_per_s", "memory_mb", "input_wait_share")}
            for r in records]

# Run in a child process: train() as the CLI runs it, SIGKILLed (as the OOM killer kills) once the
# save of step 4 has written its first file, a moment a kill can land in.
_KILLED_DURING_THE_SAVE_OF_STEP_4 = """
import json, os, signal, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from retrieval_pretraining.training import state
from retrieval_pretraining.pretrain.train import train

def save_file(tensors, path, *args, **kwargs):
    real_save_file(tensors, path, *args, **kwargs)
    if Path(path).parent.name == ".step-00000004.tmp":
        os.kill(os.getpid(), signal.SIGKILL)

real_save_file, state.save_file = state.save_file, save_file
settings, checkpoint, chunks, out = json.loads(sys.argv[1])
out = Path(out)
train(settings, chunks=[Path(c) for c in chunks], spans=None, checkpoint=Path(checkpoint),
      encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl", plot_out=out / "loss.png",
      state_dir=out / "state")
"""


def test_a_trainer_killed_during_a_save_resumes_to_the_uninterrupted_run(
    dropout_setup, tmp_path, restore_stop_handlers
):
    """SIGKILL leaves no chance to save: the run resumes from its last complete state (step 2; the
    half-written folder of step 4 is never read) and ends with the weights and the metrics history
    (timings aside) of a run never stopped, dropout included."""
    checkpoint, chunks, _ = dropout_setup
    settings = fx.model_settings("mlm", max_steps=6, checkpoint_every=2)
    code, whole = _run(settings, dropout_setup, tmp_path / "whole")
    assert code == 0
    part = tmp_path / "part"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(fx.ROOT / "workflow"),
                                                        os.environ.get("PYTHONPATH")])))
    argument = json.dumps([settings, str(checkpoint), [str(c) for c in chunks], str(part)])
    killed = subprocess.run([sys.executable, "-c", _KILLED_DURING_THE_SAVE_OF_STEP_4, argument],
                            env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    state = part / "state" / "checkpoints"
    assert json.loads((state / "latest.json").read_text())["checkpoint"] == "step-00000002"
    assert (state / ".step-00000004.tmp" / "model.safetensors").is_file()  # half a state
    assert not (part / "encoder").exists()
    code, resumed = _run(settings, dropout_setup, part)
    assert code == 0
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert _untimed(resumed) == _untimed(whole)
    info = json.loads((part / "encoder" / "training.json").read_text())
    assert info["resumed_from_step"] == 2
    _assert_same_weights(_weights(part), _weights(tmp_path / "whole"), atol=0.0)

def test_sigterm_to_the_process_group_with_a_worker_saves_and_exits_75(setup, tmp_path):
    checkpoint, chunks, _ = setup
    settings = fx.model_settings("mlm", max_steps=10_000, num_workers=1)
    proc = fx.run_module(settings, checkpoint, chunks, None, tmp_path, wait=False, new_session=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    # As Slurm does: every process of the step, the DataLoader worker included, gets the signal.
    os.killpg(proc.pid, signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == training.RESUME_EXIT_CODE, output[-3000:]
    assert (tmp_path / "state" / "checkpoints" / "latest.json").exists()
    assert "DataLoader worker" not in output


def test_a_stop_signal_to_one_of_two_gloo_processes_stops_both_with_the_state_saved(setup,
                                                                                     tmp_path):
    """Under torchrun a signal may reach one worker first (or only one): the stop flag travels in
    the step's all-reduce, so both ranks stop at the same step, the main rank saves, and both
    exit 75. torchrun as the launcher runs it (retrieval_pretraining.torchrun) then exits 75 too,
    where torchrun alone reports a failed worker (exit 1)."""
    checkpoint, chunks, _ = setup
    settings = fx.model_settings("mlm", max_steps=10_000, log_every=1)
    proc = fx.run_module(settings, checkpoint, chunks, None, tmp_path, nproc=2, wait=False,
                         new_session=True)
    workers: list[str] = []
    try:
        _wait_until_training(proc, tmp_path / "metrics.jsonl")
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                 text=True).stdout.split()
        assert len(workers) == 2, workers
        os.kill(int(workers[-1]), signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *map(int, workers)]:  # hung: torchrun's workers lead own sessions
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the ranks did not stop together (one waited for the other)")
    finally:
        if proc.poll() is None:  # a failed assertion before the signal
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == training.RESUME_EXIT_CODE, output[-3000:]
    assert output.count("rerun the same command to resume") == 2, output[-3000:]
    assert len(re.findall(r"exitcode\s*:\s*75\b", output)) >= 1, output[-3000:]
    assert json.loads((tmp_path / "state" / "checkpoints" / "latest.json").read_text())["step"] > 0


# The trainer as `python -m retrieval_pretraining.pretrain` runs it, rank 1 sending itself a
# SIGUSR1 as it queues step 1 (whose values the next probes' step reads).
SIGNAL_ON_RANK_1_AT_STEP_1 = """\
import os, runpy, signal
from retrieval_pretraining.pretrain.model import Pretrainer
forward = Pretrainer.forward
def signalled(self, batch, *args, **kwargs):
    if os.environ["RANK"] == "1" and self.training and int(batch["step"]) == 1:
        os.kill(os.getpid(), signal.SIGUSR1)
    return forward(self, batch, *args, **kwargs)
Pretrainer.forward = signalled
runpy.run_module("retrieval_pretraining.pretrain", run_name="__main__", alter_sys=True)
"""


def test_two_gloo_processes_stop_at_the_same_step_where_only_the_main_one_probes(setup, tmp_path):
    """Only the main rank holds the probes' batches, yet every rank must read the step before the
    probes at once: a rank that read it a step late saw the stop one step after the main rank,
    which had stopped (saving, then at the barrier) while it queued the next step's reductions."""
    checkpoint, chunks, _ = setup
    settings = fx.model_settings("mlm", max_steps=4, probe_chunks=4, probe_every=2, log_every=1)
    (tmp_path / "signalled.py").write_text(SIGNAL_ON_RANK_1_AT_STEP_1)
    proc = fx.run_module(settings, checkpoint, chunks, None, tmp_path, nproc=2, wait=False,
                         new_session=True, entry=(str(tmp_path / "signalled.py"),))
    try:
        output = proc.communicate(timeout=180)[0]
    except subprocess.TimeoutExpired:
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                 text=True).stdout.split()
        for pid in [proc.pid, *map(int, workers)]:  # torchrun's workers lead own sessions
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the ranks did not stop together (one waited for the other)")
    assert proc.returncode == training.RESUME_EXIT_CODE, output[-3000:]
    assert output.count("stopped at step 2 on") == 2, output[-3000:]
    assert json.loads((tmp_path / "state" / "checkpoints" / "latest.json").read_text())["step"] == 2


# The trainer as `python -m retrieval_pretraining.pretrain` runs it, with CUDA hidden first (CUDA
# reads CUDA_VISIBLE_DEVICES once, at its first call): a worker on the CPU, under gloo, whatever
# GPUs the host has and whatever its launcher was told.
CPU_TRAINER = """\
import os, runpy
os.environ["CUDA_VISIBLE_DEVICES"] = ""
runpy.run_module("retrieval_pretraining.pretrain", run_name="__main__", alter_sys=True)
"""


def test_sigterm_to_the_launcher_of_two_gloo_workers_ends_the_job_with_75(setup, tmp_path):
    """The launcher execs torchrun, which gets the signal, forwards it, waits for the workers to
    save, and then fails on its own signal: the job must still end with 75, stopped after saving
    (torchrun alone exits 1).

    The launcher is told of 2 GPUs (CUDA_VISIBLE_DEVICES=0,1), so it starts torchrun with 2
    workers; they run the trainer through CPU_TRAINER. Given 0,1 themselves, on a host with one
    real GPU (the H200 of benchmarks/gpu_checks.sh's gloo part) rank 1 asked for cuda:1 and the
    job failed at its start."""
    checkpoint, chunks, _ = setup
    settings = fx.model_settings("mlm", max_steps=10_000, log_every=1)
    (tmp_path / "cpu_trainer.py").write_text(CPU_TRAINER)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="0,1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), str(fx.ROOT / "workflow"),
                                                        os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "retrieval_pretraining.launch", "--module",
           "cpu_trainer", "--gpus", "2", "--", "--config",
           json.dumps(settings), "--checkpoint", str(checkpoint), "--chunks", *map(str, chunks),
           "--encoder", str(tmp_path / "encoder"), "--metrics", str(tmp_path / "metrics.jsonl"),
           "--plot", str(tmp_path / "loss.png"), "--state", str(tmp_path / "state")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        _wait_until_training(proc, tmp_path / "metrics.jsonl")
        proc.send_signal(signal.SIGTERM)  # to the launcher only: torchrun forwards it
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "SignalException" in output, output[-3000:]  # torchrun itself got the signal
    assert proc.returncode == training.RESUME_EXIT_CODE, output[-3000:]
    assert json.loads((tmp_path / "state" / "checkpoints" / "latest.json").read_text())["step"] > 0


@pytest.mark.parametrize("max_steps", [3, 4])  # 4 steps = every item drawn from the loader
def test_a_finished_run_with_a_worker_exits(setup, tmp_path, max_steps):
    """Workers ignore SIGTERM, so multiprocessing's exit hook (SIGTERM, then join) once waited on
    them forever after a finished run: the job never ended."""
    checkpoint, chunks, _ = setup
    settings = fx.model_settings("mlm", max_steps=max_steps, num_workers=1)
    proc = fx.run_module(settings, checkpoint, chunks, None, tmp_path, wait=False, new_session=True)
    try:
        output = proc.communicate(timeout=180)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the trainer finished but did not exit (waiting on its DataLoader worker)")
    assert proc.returncode == 0, output[-3000:]
    assert (tmp_path / "encoder" / "config.json").is_file()


def test_a_worker_is_killed_when_the_trainer_dies_on_an_error(tmp_path):
    """Any exit that did not close the loader (an exception) must not wait on the workers."""
    code = (
        "import signal, sys, time, torch\n"
        f"sys.path.insert(0, {str(fx.ROOT / 'workflow')!r})\n"
        "from retrieval_pretraining import training\n"
        "class Slow(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 1000\n"
        "    def __getitem__(self, i): time.sleep(0.01); return i\n"
        "training.reap_workers_at_exit()\n"
        "loader = torch.utils.data.DataLoader(Slow(), num_workers=1,\n"
        "    worker_init_fn=training.ignore_stop_signals)\n"
        "batches = iter(loader); next(batches)\n"
        "raise RuntimeError('boom')  # the iterator is still referenced by the traceback's frame\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the process raised but did not exit (waiting on its DataLoader worker)")
    assert proc.returncode == 1 and "boom" in output, output[-2000:]


def test_tensorboard_without_the_package_fails_at_start(setup, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    with pytest.raises(RuntimeError, match=r"`pip install tensorboard`"):
        _run(fx.model_settings("mlm", max_steps=2, tensorboard=True), setup, tmp_path)
    assert not (tmp_path / "state").exists()  # before any work


def test_tensorboard_gets_the_metric_records(setup, tmp_path, monkeypatch):
    calls = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter (package optional)
        def __init__(self, log_dir, purge_step=None):
            calls.append(("open", log_dir, purge_step))

        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

        def close(self):
            calls.append(("close",))

    board = types.ModuleType("torch.utils.tensorboard")
    board.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "tensorboard", types.ModuleType("tensorboard"))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", board)
    code, records = _run(fx.model_settings("mlm", max_steps=3, tensorboard=True), setup, tmp_path)
    assert code == 0
    assert calls[0] == ("open", str(tmp_path / "tensorboard"), None) and calls[-1] == ("close",)
    expected = [(k, v, r["step"]) for r in records for k, v in r.items() if k != "step"]
    assert sorted(calls[1:-1]) == sorted(expected)
    # Logging only: switching it on or off keeps a resumable state.
    off = fx.model_settings("mlm", max_steps=3)
    assert resume_job(off, {}) == resume_job(fx.model_settings("mlm", max_steps=3, tensorboard=True), {})


def _weights(folder):
    return load_file(Path(folder) / "encoder" / "model.safetensors")


def _assert_same_weights(a, b, atol):
    assert a.keys() == b.keys()
    worst = max((x - b[k]).abs().max().item() for k, x in a.items())
    assert worst <= atol, f"largest weight difference {worst}"


@pytest.mark.slow
def test_resume_after_sigusr1_equals_uninterrupted_run(setup, tmp_path):
    checkpoint, chunks, spans = setup
    settings = fx.model_settings("costa", max_steps=12, micro_batch_size=4, checkpoint_every=None)
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
    assert 3 <= stopped_at < 12
    assert (part / "state" / "checkpoints" / "latest.json").exists()
    assert not (part / "encoder").exists()
    again = fx.run_module(settings, checkpoint, chunks, spans, part)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"starting at step {stopped_at}" in again.stderr
    assert whole.wait(timeout=180) == 0
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 13))
    # Same process count and thread count: the resumed run is bit-for-bit the uninterrupted one.
    _assert_same_weights(_weights(part), _weights(tmp_path / "whole"), atol=0.0)


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(dropout_setup, tmp_path):
    checkpoint, chunks, spans = dropout_setup
    # Global batch 8 of micro-batches of 4: 1 process accumulates 2, 2 processes accumulate 1.
    # With dropout on: its masks are seeded per (step, micro-batch), not per process.
    settings = fx.model_settings("costa", max_steps=4, micro_batch_size=4)
    two = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "two", nproc=2, wait=False)
    one = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.wait(timeout=300) == 0, two.communicate()[0][-3000:]
    info = json.loads((tmp_path / "two" / "encoder" / "training.json").read_text())
    assert info["world_size"] == 2 and info["accumulation"] == 1
    _assert_same_weights(_weights(tmp_path / "two"), _weights(tmp_path / "one"), atol=1e-5)
    # The step's gradient itself, not only the weights: AdamW is nearly blind to a constant
    # factor on the gradient and clipping at 1.0 evens out larger ones, so a loss left undivided
    # by the accumulation (or divided by the process count as well) trains weights within atol
    # of these, while the logged norm, and what max_grad_norm clips at, is 2x off.
    records = {n: [json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text()
                   .splitlines()] for n in ("one", "two")}
    for key in ("loss", "grad_norm"):
        torch.testing.assert_close([r[key] for r in records["two"]],
                                   [r[key] for r in records["one"]], rtol=1e-4, atol=1e-6)


COMPILED_TRAINER = """\
import functools, runpy, torch
torch.compile = functools.partial(torch.compile, backend="aot_eager")
runpy.run_module("retrieval_pretraining.pretrain", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_two_compiled_gloo_processes_equal_one_eager_process(setup, tmp_path):
    """`compile: true` under DDP, as on several GPUs: two processes compile the DDP-wrapped model
    (aot_eager, as the compiled test above) and accumulate 2 micro-batches of 2 each (no_sync
    before the last) with CPDAE's gathered contrast cached; they train the weights of one eager
    process accumulating the 4 (the same micro-batches and dropout seeds)."""
    checkpoint, chunks, _ = setup
    settings = fx.model_settings("cpdae", max_steps=3, micro_batch_size=2, compile=True)
    settings["cpdae"]["gather_negatives"] = True
    (tmp_path / "compiled_trainer.py").write_text(COMPILED_TRAINER)
    two = fx.run_module(settings, checkpoint, chunks, None, tmp_path / "two", nproc=2, wait=False,
                        entry=(str(tmp_path / "compiled_trainer.py"),))
    eager = settings | {"trainer": settings["trainer"] | {"compile": False}}
    one = fx.run_module(eager, checkpoint, chunks, None, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.wait(timeout=300) == 0, two.communicate()[0][-3000:]
    info = json.loads((tmp_path / "two" / "encoder" / "training.json").read_text())
    assert (info["world_size"], info["accumulation"], info["contrast_cache"]) == (2, 2, True)
    assert info["settings"]["trainer"]["compile"]
    losses = {n: [json.loads(line)["loss"]
                  for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
              for n in ("one", "two")}
    torch.testing.assert_close(losses["two"], losses["one"], rtol=1e-5, atol=1e-5)
    _assert_same_weights(_weights(tmp_path / "two"), _weights(tmp_path / "one"), atol=1e-5)

