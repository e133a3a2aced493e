"""The shared trainer core (training/): batch arithmetic, schedule, pickle-free resumable state,
metrics on resume, NaN detection, cross-process gathering with correct gradients, the launcher."""

import copy
import json
import math
import random
import shutil
import signal

import numpy as np
import pytest
import torch

from full_disk import files_under, full_disk, is_full_disk_error
from retrieval_pretraining import training
from retrieval_pretraining import launch
from retrieval_pretraining.errors import BadInput, one_line
from retrieval_pretraining.pretrain import objectives as obj

torch.set_num_threads(1)


def test_accumulation_keeps_the_global_batch():
    assert training.accumulation_steps(256, 32, 8) == 1
    assert training.accumulation_steps(256, 8, 8) == 4
    assert training.accumulation_steps(16, 8, 1) == 2
    with pytest.raises(ValueError, match="not a multiple.*micro_batch_size 8 x world size 3"):
        training.accumulation_steps(16, 8, 3)


def test_linear_schedule_warms_up_then_decays_to_zero():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = training.lr_scheduler(optimizer, warmup_steps=4, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])


def test_no_weight_decay_on_biases_and_layernorm():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    groups = training.build_optimizer(model, lr=1e-3, weight_decay=0.1).param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model[0].weight)}


def test_the_fused_update_is_the_per_tensor_adamw_update():
    """build_optimizer's fused kernel against torch's reference per-tensor loop: three steps of
    the same gradients give the same weights (fp32 rounding apart), decay groups included."""
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.LayerNorm(8))
    loop_model = copy.deepcopy(fused_model)
    fused = training.build_optimizer(fused_model, lr=1e-2, weight_decay=0.1)
    loop = torch.optim.AdamW(
        [{"params": [loop_model[0].weight], "weight_decay": 0.1},
         {"params": list(loop_model[1].parameters()), "weight_decay": 0.0}],
        lr=1e-2, foreach=False, fused=False,
    )  # fmt: skip
    assert fused.defaults["fused"]
    before = [p.detach().clone() for p in loop_model.parameters()]
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for a, b in zip(fused_model.parameters(), loop_model.parameters()):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        fused.step()
        loop.step()
    for a, b, start in zip(fused_model.parameters(), loop_model.parameters(), before):
        assert (b - start).abs().mean() > 1e-3  # the weights moved: the comparison means something
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _train_steps(model, optimizer, scheduler, steps):
    out = []
    for _ in range(steps):
        x = torch.randn(4, 3)
        loss = torch.nn.functional.dropout(model(x), 0.3).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        out.append((loss.item(), random.random(), float(np.random.rand())))
    return out


def _fresh(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = training.build_optimizer(model, lr=1e-2, weight_decay=0.01)
    return model, optimizer, training.lr_scheduler(optimizer, warmup_steps=2, total_steps=20)


def test_saved_state_resumes_exactly_without_pickle(tmp_path):
    training.seed_everything(3)
    model, optimizer, scheduler = _fresh()
    _train_steps(model, optimizer, scheduler, 5)
    training.save_state(tmp_path, step=5, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={"step": 5}, extra={"tokens_seen": 123})
    expected = _train_steps(model, optimizer, scheduler, 5)  # the uninterrupted continuation

    model2, optimizer2, scheduler2 = _fresh(seed=99)  # different weights, RNGs moved on
    resumed = training.load_state(tmp_path, model=model2, optimizer=optimizer2, scheduler=scheduler2)
    assert resumed == {"step": 5, "data_position": {"step": 5}, "extra": {"tokens_seen": 123}}
    assert _train_steps(model2, optimizer2, scheduler2, 5) == expected
    assert torch.equal(model.weight, model2.weight)
    files = {p.name for p in (tmp_path / "step-00000005").iterdir()}
    assert files == {"model.safetensors", "state.safetensors", "state.json"}  # no pickle anywhere



def test_a_full_disk_during_a_state_save_keeps_the_last_state_and_leaves_no_temp_folder(tmp_path):
    """The disk fills while state.safetensors is written: the save fails with the OS error, the
    last complete state stays the one resumed, and the half-written folder is removed (on a full
    disk it would hold space a rerun needs). With space again, the rerun saves as usual."""
    training.seed_everything(3)
    model, optimizer, scheduler = _fresh()
    _train_steps(model, optimizer, scheduler, 5)
    training.save_state(tmp_path, step=5, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={"step": 5})
    _train_steps(model, optimizer, scheduler, 5)
    with pytest.raises(Exception) as error, full_disk(4096):  # model.safetensors fits, state not
        training.save_state(tmp_path, step=10, model=model, optimizer=optimizer,
                            scheduler=scheduler, data_position={"step": 10})
    assert is_full_disk_error(error.value), error.value
    saved = ("model.safetensors", "state.json", "state.safetensors")
    assert files_under(tmp_path) == ["latest.json", "step-00000005",
                                     *(f"step-00000005/{name}" for name in saved)]
    resumed = _fresh(seed=99)
    assert training.load_state(tmp_path, model=resumed[0], optimizer=resumed[1],
                               scheduler=resumed[2])["step"] == 5
    training.save_state(tmp_path, step=10, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={"step": 10})
    assert training.load_state(tmp_path, model=resumed[0], optimizer=resumed[1],
                               scheduler=resumed[2])["step"] == 10
    assert torch.equal(resumed[0].weight, model.weight)


def test_a_save_killed_part_way_is_never_resumed_and_its_folder_is_cleared(tmp_path, monkeypatch):
    """A kill (SIGKILL, the OOM killer) can land anywhere in a save. Its temp folder is never read
    and the next save clears it. Saving again the step latest.json names (the periodic save, then
    a stop signal in the same step) keeps the saved folder: deleting it first, then being killed
    before the new one was in place, left latest.json naming nothing."""
    training.seed_everything(3)
    model, optimizer, scheduler = _fresh()
    _train_steps(model, optimizer, scheduler, 5)
    save = dict(model=model, optimizer=optimizer, scheduler=scheduler)
    training.save_state(tmp_path, step=5, data_position={"step": 5}, **save)
    (tmp_path / ".step-00000007.tmp").mkdir()  # what a save killed part-way leaves
    (tmp_path / ".step-00000007.tmp" / "model.safetensors").write_bytes(b"half")

    def killed_after_deleting(path, *args, **kwargs):
        real_rmtree(path, *args, **kwargs)
        if path.name == "step-00000005":  # the saved state is gone, its replacement not in place
            raise KeyboardInterrupt("killed")  # stands in for SIGKILL, which no test survives

    real_rmtree = training.state.shutil.rmtree
    with monkeypatch.context() as patch:
        patch.setattr(training.state.shutil, "rmtree", killed_after_deleting)
        try:
            training.save_state(tmp_path, step=5, data_position={"step": 5}, **save)
        except KeyboardInterrupt:
            pass
    fresh = _fresh(seed=99)
    assert training.load_state(tmp_path, model=fresh[0], optimizer=fresh[1],
                               scheduler=fresh[2])["step"] == 5
    assert torch.equal(fresh[0].weight, model.weight)
    _train_steps(model, optimizer, scheduler, 3)
    training.save_state(tmp_path, step=8, data_position={"step": 8}, **save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step-00000008"]


def _saved_8_then_10_without_latest(tmp_path, monkeypatch, data_position):
    """Saves step 8, then step 10 with its latest.json update failing (a full disk): the model
    and the save function, for a rerun to go on from there."""
    from retrieval_pretraining.training import state as tstate

    model, optimizer, scheduler = _fresh()
    save = lambda step: training.save_state(tmp_path, step=step, model=model, optimizer=optimizer,
                                            scheduler=scheduler, data_position=data_position(step))
    save(8)
    write_json = tstate.artifacts.write_json

    def full_disk_for_latest(path, obj):
        if path.name == "latest.json":
            raise OSError(28, "No space left on device")
        return write_json(path, obj)

    monkeypatch.setattr(tstate.artifacts, "write_json", full_disk_for_latest)
    with pytest.raises(OSError):
        save(10)
    monkeypatch.setattr(tstate.artifacts, "write_json", write_json)
    return model, save


def test_a_stale_later_state_never_makes_a_save_delete_itself(tmp_path, monkeypatch):
    """A save whose latest.json update failed (full disk, kill) leaves a complete later folder;
    the rerun resumes the earlier state and saves a step before it: that save must survive the
    pruning (it is what latest.json names), and the stale later folder goes."""
    model, save = _saved_8_then_10_without_latest(tmp_path, monkeypatch, lambda step: {})
    assert training.load_state(tmp_path, **dict(zip(("model", "optimizer", "scheduler"),
                                                     _fresh())))["step"] == 8
    save(9)  # the rerun stops at step 9
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000009"]
    model2, optimizer2, scheduler2 = _fresh(seed=5)
    assert training.load_state(tmp_path, model=model2, optimizer=optimizer2,
                               scheduler=scheduler2)["step"] == 9


def test_a_rerun_that_saves_the_step_of_a_stale_later_state_names_its_own(tmp_path, monkeypatch):
    """The stale later folder of a save whose latest.json update failed is replaced, not taken
    for this run's save, when the rerun reaches that step again: latest.json names the step and
    the state it holds is the rerun's (a resume would otherwise go back to the earlier state)."""
    from retrieval_pretraining.training import state as tstate

    model, save = _saved_8_then_10_without_latest(
        tmp_path, monkeypatch, lambda step: {"step": step})
    with torch.no_grad():
        model.weight.add_(1.0)  # the rerun's step 10 differs from the stale folder's
    save(10)
    assert tstate.artifacts.read_json(tmp_path / "latest.json")["checkpoint"] == "step-00000010"
    fresh = _fresh(seed=5)
    resumed = training.load_state(tmp_path, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])
    assert resumed["step"] == 10 and torch.equal(fresh[0].weight, model.weight)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000010"]


def test_a_state_named_by_latest_json_but_missing_is_a_clear_error(tmp_path):
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    shutil.rmtree(tmp_path / "step-00000003")
    with pytest.raises(FileNotFoundError, match=r"names the state step-00000003, which is missing"
                                                r".*delete .* to start afresh"):
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)


@pytest.mark.parametrize("damaged", ["latest.json", "step-00000003/state.json",
                                     "step-00000003/state.safetensors",
                                     "step-00000003/model.safetensors"])
def test_a_damaged_state_file_is_a_clear_error_that_keeps_the_state(tmp_path, damaged):
    """A file cut short (the disk, not a save: saves are atomic) failed every requeue with a raw
    JSONDecodeError or SafetensorError naming neither the file nor the fix. The error names the
    file and the state folder to move; nothing is discarded (the file may be restorable)."""
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    path = tmp_path / damaged
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    before = files_under(tmp_path)
    with pytest.raises(BadInput) as error:
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)
    assert one_line(error.value).startswith(f"{path}: the resumable state cannot be read (")
    assert f"restore the file, or move or delete {tmp_path} to start afresh" in str(error.value)
    assert files_under(tmp_path) == before


def test_a_hand_edited_state_file_without_its_keys_is_a_clear_error(tmp_path):
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    (tmp_path / "latest.json").write_text('{"step": 3}')
    with pytest.raises(BadInput, match=r"latest\.json: .*ValueError: no checkpoint\); restore"):
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)
    (tmp_path / "latest.json").write_text("[]")
    with pytest.raises(BadInput, match=r"latest\.json: .*not a JSON object but list"):
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)


@pytest.mark.parametrize("checkpoint, kind", [("null", "NoneType"), ("3", "int")])
def test_a_hand_edited_latest_json_naming_no_folder_is_a_clear_error(tmp_path, checkpoint, kind):
    """A "checkpoint" that is not a folder name raised a raw TypeError joining it to the path."""
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    (tmp_path / "latest.json").write_text(f'{{"checkpoint": {checkpoint}, "step": 3}}')
    with pytest.raises(BadInput, match=rf"latest\.json: .*ValueError: checkpoint is not a str "
                                       rf"but {kind}\); restore"):
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)


@pytest.mark.parametrize("checkpoint", ["", ".", "../step-00000003", "/tmp"])
def test_a_latest_json_naming_no_state_folder_is_a_clear_error(tmp_path, checkpoint):
    """An empty "checkpoint" named the state folder itself, so the resume failed on a
    model.safetensors missing there, a file no save writes; a path read another folder's
    (/tmp/model.safetensors). Refused naming latest.json and the fix, nothing deleted."""
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    (tmp_path / "latest.json").write_text(json.dumps({"checkpoint": checkpoint, "step": 3}))
    before = files_under(tmp_path)
    with pytest.raises(BadInput) as error:
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)
    message = one_line(error.value)
    assert message.startswith(f"{tmp_path / 'latest.json'}: the resumable state cannot be read (")
    assert f"checkpoint is not a state folder's name (step-NNNNNNNN) but {checkpoint!r}" in message
    assert f"restore the file, or move or delete {tmp_path} to start afresh" in message
    assert files_under(tmp_path) == before


def _refused_with_state_step(tmp_path, step):
    """(state.json, the one-line refusal) after saving at step 3 and writing `step` into its
    state.json; the refusal deletes nothing."""
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    meta = tmp_path / "step-00000003" / "state.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "step": step}))
    before = files_under(tmp_path)
    with pytest.raises(BadInput) as error:
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)
    assert files_under(tmp_path) == before
    return meta, one_line(error.value)


@pytest.mark.parametrize("step", ['"3"', "-1", "true", "2.5", "null"])
def test_a_state_json_whose_step_is_no_step_count_is_a_clear_error(tmp_path, step):
    """A hand-edited step: a string failed later in the trainer's arithmetic, a negative one
    resumed and trained steps the run never had. Refused naming state.json and the fix."""
    meta, message = _refused_with_state_step(tmp_path, json.loads(step))
    assert message.startswith(f"{meta}: the resumable state cannot be read (ValueError: step is "
                              f"not a step count (an integer >= 0) but {json.loads(step)!r}); ")
    assert f"restore the file, or move or delete {tmp_path} to start afresh" in message


@pytest.mark.parametrize("step", [0, 5])
def test_a_state_json_of_another_step_than_its_folder_is_a_clear_error(tmp_path, step):
    """A state.json copied from another save (or a step edited by hand) resumed the schedule and
    the data position at one step with the weights of another. Refused naming the file and the
    fix, nothing deleted."""
    meta, message = _refused_with_state_step(tmp_path, step)
    assert message.startswith(f"{meta}: the resumable state cannot be read (ValueError: step is "
                              f"{step}, but the state's folder step-00000003 was saved at step 3)")
    assert f"restore the file, or move or delete {tmp_path} to start afresh" in message


def test_a_state_json_naming_a_tensor_its_tensors_file_lacks_is_a_clear_error(tmp_path):
    """A reference without its tensor (a hand edit, or the two files of different saves) raised
    a raw KeyError naming the tensor alone."""
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    meta = tmp_path / "step-00000003" / "state.json"
    meta.write_text(meta.read_text().replace('"__tensor__": "rng.torch"', '"__tensor__": "gone"'))
    with pytest.raises(BadInput, match=r"state\.json: .*ValueError: it names the tensor 'gone', "
                                       r"which state\.safetensors lacks\); restore"):
        training.load_state(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler)


def test_a_resume_with_fewer_visible_gpus_restores_the_states_it_can(monkeypatch):
    """A state saved by a process that saw 8 GPUs, restored where 2 are visible (a run may resume
    on another process count): the first 2 GPU generators are set, the others skipped (torch's
    set_rng_state_all would index past the visible devices). CUDA is stood in for here."""
    from retrieval_pretraining.training import state as st

    saved = {**st.rng_state(), "cuda": [torch.full((4,), i, dtype=torch.uint8) for i in range(8)]}
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda value, device: restored.append((device, int(value[0]))))
    st.set_rng_state(saved)
    assert restored == [(0, 0), (1, 1)]


def test_a_state_saved_on_a_gpu_node_restores_each_gpu_s_generator(tmp_path, monkeypatch):
    """Saved where 2 GPUs are visible (CUDA stood in for, its calls bound to torch's own
    signatures), the state file keeps each GPU generator's state (bytes, not a pickle) and the
    resume sets each on its own GPU, as uint8 tensors on the host as torch's set_rng_state takes."""
    import inspect

    gpu_states = [torch.arange(16, dtype=torch.uint8) * (i + 1) for i in range(2)]
    restored = []

    def set_rng_state(*args, **kwargs):
        inspect.signature(torch.cuda.set_rng_state).bind(*args, **kwargs)
        restored.append(args)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in gpu_states])
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=2, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    assert training.load_state(tmp_path, model=model, optimizer=optimizer,
                               scheduler=scheduler)["step"] == 2
    assert [index for _, index in restored] == [0, 1]
    for (state, _), want in zip(restored, gpu_states):
        assert state.dtype == torch.uint8 and state.device.type == "cpu"
        assert torch.equal(state, want)


def test_a_state_with_nonfinite_weights_is_not_saved(tmp_path):
    """Every resume would start from such weights and fail again: the last finite state stays."""
    model, optimizer, scheduler = _fresh()
    training.save_state(tmp_path, step=1, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"step 2: non-finite weights in \['weight'\]"):
        training.save_state(tmp_path, step=2, model=model, optimizer=optimizer,
                            scheduler=scheduler, data_position={})
    assert json.loads((tmp_path / "latest.json").read_text())["checkpoint"] == "step-00000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step-00000001"]


def test_load_state_without_checkpoint_returns_none(tmp_path):
    assert training.load_state(tmp_path, **dict(zip(("model", "optimizer", "scheduler"), _fresh()))) is None


def test_metrics_writer_drops_records_after_the_resumed_step(tmp_path):
    path = tmp_path / "m.jsonl"
    writer = training.MetricsWriter(path)
    for step in range(1, 6):
        writer.write({"step": step, "loss": 1.0 / step})
    training.MetricsWriter(path, resume_step=3).write({"step": 4, "loss": 0.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_check_finite_step_names_the_term_step_and_micro_batch():
    def read(terms, norm):
        return training.StepRead(terms=terms, grad_norm=norm, means=[], tokens=0, stop=False)

    keys = ["loss", "loss_gwc"]
    training.check_finite_step(read([[1.0, 2.0], [3.0, 4.0]], 5.0), keys, step=7, item_ids=[[1], [2]])
    with pytest.raises(training.NonFiniteLossError, match=r"'loss_gwc' is nan at step 7 .*\[11, 12\];"):
        training.check_finite_step(read([[1.0, 2.0], [3.0, math.nan]], math.inf), keys, step=7,
                                   item_ids=[[9, 10], [11, 12]])
    with pytest.raises(training.NonFiniteGradientError, match=r"is inf at step 7 .*\[9, 10, 11, 12\]"):
        training.check_finite_step(read([[1.0, 2.0], [3.0, 4.0]], math.inf), keys, step=7,
                                   item_ids=[[9, 10], [11, 12]])
    training.check_finite_step(read([[1.0, 2.0]], None), keys, step=7, item_ids=[[1]])  # no clipping


def test_check_finite_grad_norm_names_step_and_items():
    training.check_finite_grad_norm(torch.tensor(3.0), step=0, item_ids=[1])
    with pytest.raises(training.NonFiniteLossError, match=r"gradient norm is inf at step 3 .*\[4, 5\]"):
        training.check_finite_grad_norm(torch.tensor(float("inf")), step=3, item_ids=torch.tensor([4, 5]))


def test_check_vocabulary_needs_a_row_for_every_id_the_tokenizer_has():
    """Ids 0..9 and an added token at 12 (a gap at 10, 11): 13 rows are needed, more are fine (a
    padded table), 12 are refused, naming both sizes, the folder and the tokens with no row."""
    from retrieval_pretraining.model_folder import ModelFolderError, check_vocabulary

    class Tokenizer:
        def get_vocab(self):
            return {**{f"w{i}": i for i in range(10)}, "added": 12}

    for rows in (13, 64):
        check_vocabulary(Tokenizer(), rows, "ckpt")
    with pytest.raises(ModelFolderError) as raised:
        check_vocabulary(Tokenizer(), 12, "ckpt")
    assert str(raised.value).startswith(
        "the tokenizer of ckpt has 11 tokens (ids up to 12), but its model's word embeddings have "
        "12 rows (config.json vocab_size): 1 token(s) have no embedding ('added'); ")
    with pytest.raises(ModelFolderError, match=r"8 token\(s\) have no embedding "
                                               r"\('w3', 'w4', 'w5', 'w6', 'w7', \.\.\.\)"):
        check_vocabulary(Tokenizer(), 3, "ckpt")


def test_seed_torch_depends_on_the_key_not_on_earlier_draws():
    training.seed_torch(1, 2, 3)
    first = torch.rand(4)
    torch.rand(7)
    training.seed_torch(1, 2, 3)
    assert torch.equal(torch.rand(4), first)
    training.seed_torch(1, 2, 4)
    assert not torch.equal(torch.rand(4), first)


def test_worker_init_ignores_the_stop_signals():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        training.ignore_stop_signals(0)
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in saved)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_oom_message_names_the_config_key():
    with pytest.raises(RuntimeError, match="lower 'micro_batch_size'.*global batch stays"
                                           ".*moved aside, not deleted"):
        with training.oom_guard(32):
            raise torch.OutOfMemoryError("CUDA out of memory")


def _gather_worker(rank, world, init_file, inputs, out_dir, route):
    import contextlib

    import torch.distributed as dist
    from safetensors.torch import save_file

    from pretrain_fixtures import gather_backward_as_on_nccl

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    n = inputs["text"].shape[0] // world
    text = inputs["text"][rank * n:(rank + 1) * n].clone().requires_grad_(True)
    spans = inputs["spans"][rank * n:(rank + 1) * n].clone().requires_grad_(True)
    mask = inputs["mask"][rank * n:(rank + 1) * n]
    with (gather_backward_as_on_nccl() if route == "nccl" else contextlib.nullcontext([])) as calls:
        loss = obj.costa_loss(text, spans, mask, temperature=0.1, gather=True)
        loss.backward()
    save_file({"loss": loss.detach().reshape(1), "text": text.grad, "spans": spans.grad,
               "reduce_scatters": torch.tensor([len(calls)])},
              f"{out_dir}/rank{rank}.safetensors")
    # Leave gloo together and end as the trainer does (no interpreter clean-up: after gloo it
    # aborts now and then, "terminate called without an active exception").
    training.teardown_distributed()
    training.exit_process(0)


@pytest.mark.parametrize("route", ["gloo", "nccl"])
def test_gathered_costa_gradients_equal_the_full_batch(route, tmp_path):
    """2 processes, each with half the batch and gathering on, reproduce the full-batch loss and
    (after DDP's averaging) its gradient: the gather passes other ranks' gradients back, by gloo's
    route and by the one it takes on GPUs (NCCL's reduce_scatter, run here under gloo)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(0)
    inputs = {"text": torch.randn(4, 6, generator=g, dtype=torch.float64),
              "spans": torch.randn(4, 3, 6, generator=g, dtype=torch.float64),
              "mask": torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)}
    torch.multiprocessing.spawn(_gather_worker,
                                args=(2, tmp_path / "init", inputs, tmp_path, route), nprocs=2)
    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    # text, spans and the mask are gathered; the gradients of text and spans come back by one
    # reduce_scatter each (the mask has none)
    assert [int(r["reduce_scatters"]) for r in ranks] == ([2, 2] if route == "nccl" else [0, 0])
    text = inputs["text"].clone().requires_grad_(True)
    spans = inputs["spans"].clone().requires_grad_(True)
    full = obj.costa_loss(text, spans, inputs["mask"], temperature=0.1)
    full.backward()
    assert (ranks[0]["loss"] + ranks[1]["loss"]).item() / 2 == pytest.approx(full.item(), rel=1e-12)
    # DDP averages over the 2 ranks, hence the / 2.
    torch.testing.assert_close(torch.cat([r["text"] for r in ranks]) / 2, text.grad)
    torch.testing.assert_close(torch.cat([r["spans"] for r in ranks]) / 2, spans.grad)


def _nonfinite_worker(rank: int, world: int, init_file, out_dir) -> None:
    import torch.distributed as dist
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    env = training.DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))
    model = torch.nn.Module()
    model.weight = weight = torch.nn.Parameter(torch.zeros(3))
    optimizer = training.build_optimizer(model, lr=0.1, weight_decay=0.0)
    weight.grad = torch.ones(3)  # what DDP leaves: the same averaged gradient on every rank
    values = torch.tensor([[float("nan") if rank == 1 else 1.0]])  # rank 1's loss only
    training.step_if_finite(optimizer, values, distributed=True)
    read = training.host_read(values, None, tokens=0, stop=False, env=env)
    try:
        training.check_finite_step(read, ["loss"], step=7, item_ids=[[f"q{rank}"]])
        message = ""
    except training.NonFiniteLossError as error:
        message = str(error)
    (out_dir / f"rank{rank}.txt").write_text(message)
    save_file({"weight": weight.detach()}, f"{out_dir}/rank{rank}.safetensors")
    training.teardown_distributed()
    training.exit_process(0)


def test_a_nan_on_one_process_stops_every_process_with_the_weights_untouched(tmp_path):
    """With DDP every process holds the same averaged gradient, but each sees only its own loss:
    a NaN on rank 1 alone must keep rank 0 from updating too (the flag is all-reduced before the
    step) and stop it at the same step (the means over processes are checked)."""
    from safetensors.torch import load_file

    torch.multiprocessing.spawn(_nonfinite_worker, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    for rank in range(2):
        weight = load_file(tmp_path / f"rank{rank}.safetensors")["weight"]
        assert torch.equal(weight, torch.zeros(3))
    assert "'q1'" in (tmp_path / "rank1.txt").read_text()  # its own items
    assert "at step 7 on another process" in (tmp_path / "rank0.txt").read_text()


def _start_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    env = training.DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"))
    training.check_same_start(4, env)  # the same step: passes
    try:
        training.check_same_start(4 + rank, env)  # rank 1 read a later state
        outcome = "passed"
    except RuntimeError as error:
        outcome = str(error)
    (out_dir / f"rank{rank}.txt").write_text(outcome)
    training.teardown_distributed()
    training.exit_process(0)


def test_ranks_that_resumed_at_different_steps_all_stop_naming_them(tmp_path):
    torch.multiprocessing.spawn(_start_worker, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    for rank in range(2):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        assert text.startswith("the processes resumed at different steps (4 to 5; this one at "
                               f"{4 + rank})"), text


def test_the_stop_signal_handler_only_sets_the_flag(caplog):
    """Logging inside a signal handler can interrupt a log call holding its lock: the handler
    records the signal; the trainer logs the stop at the step boundary."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        stop = training.StopFlag()
        with caplog.at_level("DEBUG"):
            signal.raise_signal(signal.SIGUSR1)
        assert stop.requested and stop.signal_name == "SIGUSR1"
        assert caplog.records == []
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("rank,local_rank", [(0, 0), (8, 0), (9, 1)])
def test_each_node_s_first_worker_marks_the_stop_after_the_main_rank_s_save(tmp_path, monkeypatch,
                                                                          rank, local_rank):
    """The torchrun of every node turns its workers' 75 into its own only when the marker is
    there (retrieval_pretraining.torchrun): each node's LOCAL_RANK 0 writes it (a marker from
    global rank 0 alone left a multi-node job's other nodes exiting 1), and only past the
    barrier that follows the main rank's save (before it, the save may still fail)."""
    from retrieval_pretraining.training import lifecycle

    marker, events = tmp_path / "stopped", []
    monkeypatch.setenv(lifecycle.STOP_MARKER_ENV, str(marker))
    monkeypatch.setattr(lifecycle.dist, "barrier", lambda: events.append(
        ("barrier", marker.exists())))
    env = training.DistEnv(rank=rank, local_rank=local_rank, world_size=16,
                           device=torch.device("cpu"))
    assert not training.run_or_resume_exit(False, env, lambda: events.append("save"))
    assert events == [] and not marker.exists()
    assert training.run_or_resume_exit(True, env, lambda: events.append("save"))
    assert events == (["save"] if rank == 0 else []) + [("barrier", False)]
    assert marker.exists() == (local_rank == 0)


def test_each_worker_on_a_node_of_several_gpus_joins_nccl_on_the_gpu_of_its_local_rank(
        monkeypatch):
    """torchrun's worker of global rank 5 of 8, the second on its node (LOCAL_RANK 1), with CUDA
    stood in for: it selects GPU 1 (not 5, which a node of 4 GPUs lacks), before it joins an nccl
    group bound to that GPU (its collectives and barriers then use it), and trains there. The
    calls are checked against torch's own signatures."""
    import datetime
    import inspect

    import torch.distributed as dist

    calls = []

    def standing_in_for(real):
        def call(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)  # a name torch does not take fails
            calls.append((real.__name__, args, kwargs))
        return call

    for key, value in {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", standing_in_for(torch.cuda.set_device))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", standing_in_for(dist.init_process_group))
    env = training.init_distributed(timeout_minutes=7)
    gpu = torch.device("cuda", 1)
    assert env == training.DistEnv(rank=5, local_rank=1, world_size=8, device=gpu)
    assert not env.is_main and env.distributed
    assert calls == [
        ("set_device", (1,), {}),
        ("init_process_group", (), {"backend": "nccl", "device_id": gpu,
                                    "timeout": datetime.timedelta(minutes=7)}),
    ]


def test_launcher_uses_torchrun_only_for_several_visible_gpus():
    m = "retrieval_pretraining.pretrain"
    assert launch.command(m, 8, ["--x"], visible=0)[1:] == ["-m", "retrieval_pretraining.pretrain", "--x"]
    assert launch.command(m, 1, ["--x"], visible=4)[1:3] == ["-m", "retrieval_pretraining.pretrain"]
    cmd = launch.command(m, 8, ["--x"], visible=4)
    assert "retrieval_pretraining.torchrun" in cmd and "--nproc_per_node=4" in cmd and cmd[-1] == "--x"


def test_metrics_history_survives_the_deletion_of_the_declared_output(tmp_path):
    """Snakemake deletes a rerun job's outputs; the state-folder history restores earlier steps."""
    import json as _json

    from retrieval_pretraining.training import MetricsWriter

    out, history = tmp_path / "out" / "metrics.jsonl", tmp_path / "state" / "metrics.jsonl"
    writer = MetricsWriter(out, history=history)
    for step in range(1, 6):
        writer.write({"step": step, "loss": 1.0 / step})
    out.unlink()  # what Snakemake does before rerunning a preempted job
    resumed = MetricsWriter(out, resume_step=3, history=history)
    resumed.write({"step": 4, "loss": 0.2})
    steps = [_json.loads(line)["step"] for line in out.read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert history.read_text() == out.read_text()



def test_a_record_cut_short_by_a_full_disk_does_not_stop_the_resume(tmp_path):
    """The disk fills part-way through appending a record: the file ends in a line without its
    newline. The resume (from the state saved at step 3) keeps the complete records up to it."""
    out, history = tmp_path / "out" / "metrics.jsonl", tmp_path / "state" / "metrics.jsonl"
    writer = training.MetricsWriter(out, history=history)
    for step in range(1, 4):
        writer.write({"step": step, "loss": 1.0 / step})
    with pytest.raises(OSError) as error, full_disk(out.stat().st_size + 10):
        writer.write({"step": 4, "loss": 0.25})
    assert is_full_disk_error(error.value) and not out.read_text().endswith("\n")
    training.MetricsWriter(out, resume_step=3, history=history).write({"step": 4, "loss": 0.25})
    for path in (out, history):
        assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]

def test_a_resume_state_is_kept_for_its_own_job_only(tmp_path, caplog):
    """claim_state (both trainers): the same job resumes; other settings or inputs, or a state
    that records no job, start afresh, the log names what differs, and the old state is moved
    aside (named in the log), never deleted."""
    env = training.DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    state = tmp_path / "state"
    job = {"settings": {"lr": 1e-4, "betas": (0.9, 0.99)}, "inputs": {"init": {"sha256": "a"}}}
    training.claim_state(state, job, env)
    (state / "latest.json").write_text("{}")  # what save_state leaves
    training.claim_state(state, job, env)
    assert (state / "latest.json").exists(), "the same job must resume"
    changed = {**job, "settings": {"lr": 2e-4, "betas": (0.9, 0.99)}}
    with caplog.at_level("WARNING"):
        moved = training.claim_state(state, changed, env)
    assert not (state / "latest.json").exists() and "settings.lr" in caplog.text
    assert json.loads((state / "job.json").read_text())["settings"]["lr"] == 2e-4
    assert moved.name.startswith("state.superseded-") and str(moved) in caplog.text
    assert (moved / "latest.json").exists(), "the other job's state is kept aside"
    assert json.loads((moved / "job.json").read_text())["settings"]["lr"] == 1e-4
    (state / "job.json").unlink()
    (state / "latest.json").write_text("{}")
    again = training.claim_state(state, changed, env)
    assert not (state / "latest.json").exists(), "a state that records no job must not resume"
    assert again != moved and (again / "latest.json").exists()


def test_a_state_whose_job_json_cannot_be_read_is_moved_aside(tmp_path, caplog):
    """A job.json cut short (the disk) or edited into non-JSON raised a raw JSONDecodeError on the
    main rank, the others waiting at the barrier: nobody can tell what wrote the state, so it
    follows the rule for a state that records no job (moved aside, named in the log)."""
    env = training.DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    state = tmp_path / "state"
    job = {"settings": {"lr": 1e-4}, "seed": 1}
    training.claim_state(state, job, env)
    (state / "latest.json").write_text("{}")
    marker = state / "job.json"
    marker.write_bytes(marker.read_bytes()[:len(marker.read_bytes()) // 2])
    with caplog.at_level("WARNING"):
        moved = training.claim_state(state, job, env)
    assert "its job.json cannot be read (JSONDecodeError: " in caplog.text
    assert str(moved) in caplog.text and (moved / "latest.json").exists()
    assert not (state / "latest.json").exists()
    assert json.loads(marker.read_text()) == json.loads(json.dumps(job))


def test_changing_a_knob_that_cannot_change_the_weights_resumes_the_state(tmp_path):
    """The loader's workers, when states are saved and what is logged are not the job: changing
    them after a preemption resumes the saved state (both trainers); the learning rate is."""
    from pretrain_fixtures import model_settings
    from retrieval_pretraining.finetune.settings import FinetuneSettings
    from retrieval_pretraining.finetune.train import resume_settings
    from retrieval_pretraining.pretrain.train import resume_job

    env = training.DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    state = tmp_path / "state"
    job = resume_job(model_settings("mlm", num_workers=0, checkpoint_every=None), {"a": "1"})
    training.claim_state(state, job, env)
    model, optimizer, scheduler = _fresh()
    training.save_state(state, step=5, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={"step": 5})
    rerun = resume_job(model_settings("mlm", num_workers=4, checkpoint_every=50, log_every=7,
                                      probe_every=3, tensorboard=True), {"a": "1"})
    assert training.claim_state(state, rerun, env) is None
    assert (state / "latest.json").exists()
    model, optimizer, scheduler = _fresh(seed=1)
    assert training.load_state(state, model=model, optimizer=optimizer,
                               scheduler=scheduler)["step"] == 5
    assert resume_job(model_settings("mlm", lr=5e-4), {"a": "1"}) != job
    # micro_batch_size is: it changes which items share a dropout seed (ARCHITECTURE.md).
    assert resume_job(model_settings("mlm", micro_batch_size=2), {"a": "1"}) != job

    plain = FinetuneSettings.from_config({})
    logged = FinetuneSettings.from_config({"save_every_steps": 7, "log_every_steps": 3})
    assert resume_settings(plain) == resume_settings(logged)
    # Encoding knobs (lowered after an out-of-memory error while encoding) are not the job either.
    encoding = FinetuneSettings.from_config({"encode_batch_size": 8, "dtype": "float32"})
    assert resume_settings(plain) == resume_settings(encoding)
    assert resume_settings(plain) != resume_settings(FinetuneSettings.from_config({"lr": 1e-5}))
    # Every other knob is the job, clipping included: a state clipped at another max_grad_norm
    # trained other weights.
    from retrieval_pretraining.finetune.train import LATER_DEFAULTS, RESULT_NEUTRAL
    assert set(resume_settings(plain)) == set(plain.record()) - {*RESULT_NEUTRAL, *LATER_DEFAULTS}
    assert resume_settings(plain) != resume_settings(
        FinetuneSettings.from_config({"max_grad_norm": 1.0}))
