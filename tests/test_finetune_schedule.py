"""Fine-tuning's learning-rate schedule (finetune/schedule.py, on training.lr_factor): the BoW
authors' cosine to a floor after a warm-up in steps, and the defaults' schedule bit for bit as it
was (the old linear_schedule's, tests/test_lr_schedule.py)."""

import copy
import math
from pathlib import Path

import pytest
import torch
import yaml
from retrieval_pretraining import config_checks
from retrieval_pretraining import training
from retrieval_pretraining.config import ConfigError
from retrieval_pretraining.finetune.schedule import build_schedule, warmup_steps
from retrieval_pretraining.finetune.settings import FinetuneSettings, trainer_keys
from retrieval_pretraining.retrieval_settings import retrieval_keys
from test_lr_schedule import old_linear_schedule, read_lrs

ROOT = Path(__file__).resolve().parents[1]
PEAK = 1e-2
NEW_KNOBS = {"lr_schedule", "min_lr_ratio", "warmup_steps"}


def _optimizer(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, training.build_optimizer(model, lr=PEAK, weight_decay=0.0)


def _settings(**knobs) -> FinetuneSettings:
    return FinetuneSettings.from_config(knobs)


def _naive_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """The BoW authors' shape (bowdpr/src/bowdpr/scheduler.py) with our warm-up's (step + 1)."""
    if step < warmup:
        return PEAK * (step + 1) / warmup
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
    return PEAK * (floor + (1 - floor) * cosine)


def test_cosine_follows_its_closed_form_from_the_warm_up_to_the_floor():
    total, warmup, floor = 40, 8, 0.1
    _, optimizer = _optimizer()
    scheduler = build_schedule(optimizer, _settings(lr_schedule="cosine", min_lr_ratio=floor,
                                                    warmup_steps=warmup), total)
    lrs = read_lrs(scheduler, optimizer, total + 3)
    for step in (0, 1, warmup - 1, warmup, warmup + 1, 17, 24, total - 1, total):
        assert lrs[step] == pytest.approx(_naive_cosine(step, warmup, total, floor), rel=1e-12)
    assert lrs[warmup - 1] == lrs[warmup] == pytest.approx(PEAK)  # the peak, then the decay
    assert lrs[(warmup + total) // 2] == pytest.approx(PEAK * (floor + (1 - floor) / 2))
    assert lrs[total] == pytest.approx(floor * PEAK)  # the end: min_lr_ratio x the peak
    assert lrs[total + 3] == pytest.approx(floor * PEAK)  # and it stays there
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1:]))


def test_a_linear_decay_to_a_floor_ends_at_the_floor():
    total, warmup, floor = 30, 5, 0.25
    _, optimizer = _optimizer()
    scheduler = build_schedule(optimizer, _settings(min_lr_ratio=floor, warmup_steps=warmup), total)
    lrs = read_lrs(scheduler, optimizer, total)
    step = 20
    linear = (total - step) / (total - warmup)
    assert lrs[step] == pytest.approx(PEAK * (floor + (1 - floor) * linear), rel=1e-12)
    assert lrs[total] == pytest.approx(floor * PEAK)


def test_warmup_steps_wins_over_warmup_ratio():
    s = _settings(warmup_ratio=0.5, warmup_steps=3)
    assert warmup_steps(s, 100) == 3
    assert warmup_steps(_settings(warmup_ratio=0.5), 100) == 50  # null: the ratio, as before
    _, optimizer = _optimizer()
    lrs = read_lrs(build_schedule(optimizer, s, 100), optimizer, 4)
    assert lrs[:3] == pytest.approx([PEAK / 3, 2 * PEAK / 3, PEAK])
    # 0 is no warm-up at all (not "use the ratio", as transformers reads 0).
    _, optimizer = _optimizer()
    no_warmup = build_schedule(optimizer, _settings(warmup_ratio=0.5, warmup_steps=0), 100)
    assert read_lrs(no_warmup, optimizer, 0) == [PEAK]


@pytest.mark.parametrize("total,ratio", [(25, 0.1), (7, 0.1), (100, 0.0), (13, 0.37), (3, 1.0)])
def test_the_defaults_give_the_old_linear_schedule_bit_for_bit(total, ratio):
    """The schedule every existing run trained on: the same floats at every step."""
    _, old_optimizer = _optimizer()
    old = old_linear_schedule(old_optimizer, total_steps=total,
                              warmup_steps=math.ceil(ratio * total))
    _, optimizer = _optimizer()
    new = build_schedule(optimizer, _settings(warmup_ratio=ratio), total)
    assert read_lrs(new, optimizer, total + 2) == read_lrs(old, old_optimizer, total + 2)


def test_a_resumed_cosine_schedule_continues_where_it_stopped(tmp_path):
    settings = _settings(lr_schedule="cosine", min_lr_ratio=0.1, warmup_steps=4)
    model, optimizer = _optimizer()
    scheduler = build_schedule(optimizer, settings, 30)
    straight = read_lrs(scheduler, optimizer, 30)

    model, optimizer = _optimizer()
    scheduler = build_schedule(optimizer, settings, 30)
    before = read_lrs(scheduler, optimizer, 10)  # steps 0..10 run: the state is at step 11
    training.save_state(tmp_path, step=11, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={"step": 11})
    model, optimizer = _optimizer(seed=1)
    scheduler = build_schedule(optimizer, settings, 30)
    assert training.load_state(tmp_path, model=model, optimizer=optimizer,
                               scheduler=scheduler)["step"] == 11
    assert before + read_lrs(scheduler, optimizer, 19) == straight


@pytest.mark.parametrize("key,value,message", [
    ("min_lr_ratio", 1.0, "< 1"), ("min_lr_ratio", -0.1, ">= 0"), ("warmup_steps", -1, ">= 0"),
    ("warmup_steps", 10.5, "integer"), ("lr_schedule", "step", "'linear' or 'cosine'"),
])
def test_settings_and_schema_refuse_bad_schedule_knobs(key, value, message):
    with pytest.raises(ConfigError, match=f"finetune.{key} .*{message}"):
        _settings(**{key: value})
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    bad = copy.deepcopy(config)
    bad["finetune"][key] = value
    with pytest.raises(ConfigError, match=f"finetune.{key}"):
        config_checks.validate(bad)
    # A dataset's overrides are checked alike.
    bad = copy.deepcopy(config)
    bad["finetune"]["datasets"][0]["overrides"] = {key: value}
    with pytest.raises(ConfigError, match=key):
        config_checks.validate(bad)


def test_the_schedule_knobs_are_the_trainer_s_alone():
    """The trainer's params slice carries them (a change reruns fine-tuning); encoding, mining
    and search slices do not (rerun by the new encoder's files only)."""
    assert NEW_KNOBS <= trainer_keys()
    assert not NEW_KNOBS & retrieval_keys()


def test_a_state_from_before_the_schedule_knobs_still_resumes_at_their_defaults():
    """claim_state sets aside a state whose job differs: at their defaults the new knobs are not
    in the job, so that a run stopped before they existed resumes; any other value is a new job."""
    from retrieval_pretraining.finetune.train import resume_settings

    defaults = resume_settings(_settings())
    assert not NEW_KNOBS & set(defaults)
    assert resume_settings(_settings(lr_schedule="linear", min_lr_ratio=0, warmup_steps=None)) \
        == defaults
    for knob, value in {"lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 0}.items():
        assert resume_settings(_settings(**{knob: value})) == defaults | {knob: value}


def test_bow_yaml_gives_nq_and_trivia_the_authors_qa_schedule():
    """Their train_dpr_nq.sh / train_dpr_trivia.sh: --warmup_steps 1000 --lr_scheduler_type cosine
    --min_lr_ratio 0.1; MS MARCO keeps paper.yaml's (COSTA's) schedule in this overlay."""
    bow = yaml.safe_load((ROOT / "workflow/experiments/bow.yaml").read_text())
    entries = {e["dataset"]: e.get("overrides", {}) for e in bow["finetune"]["datasets"]}
    for dataset in ("nq", "trivia"):
        assert {k: entries[dataset][k] for k in NEW_KNOBS} == {
            "lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 1000}, dataset
    assert not NEW_KNOBS & set(entries["msmarco-passage"])
