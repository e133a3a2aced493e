"""The learning-rate schedule both trainers share (training.lr_factor / lr_scheduler) and
pre-training's schedule knobs (trainer lr_schedule, min_lr_ratio, warmup_steps): at their defaults
the lr of every step, head warm-up hold included, is the float the linear schedule gave before
they existed; the BoW authors' cosine to a floor after a warm-up in steps; the knobs checked."""

import copy
import math
from pathlib import Path

import pytest
import torch
import yaml
from retrieval_pretraining import config_checks
from retrieval_pretraining import training
from retrieval_pretraining.config import ConfigError
from retrieval_pretraining.pretrain.train import lr_warmup_steps, resume_job

ROOT = Path(__file__).resolve().parents[1]
PEAK = 1e-2
KNOBS = {"lr_schedule", "min_lr_ratio", "warmup_steps"}


def old_linear_schedule(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, hold_steps: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """training.linear_schedule as it was before the schedule knobs (at 7ed6780), verbatim: the
    schedule every existing pre-training and fine-tuning run trained on."""

    def factor(step: int) -> float:
        if step < hold_steps:
            return 1.0
        step, total = step - hold_steps, total_steps - hold_steps
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (total - step) / max(1, total - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _optimizer() -> torch.optim.Optimizer:
    torch.manual_seed(0)
    return training.build_optimizer(torch.nn.Linear(3, 2), lr=PEAK, weight_decay=0.0)


def read_lrs(scheduler, optimizer, steps: int) -> list[float]:
    """The lr of optimiser steps 0 .. steps (the loop reads it, then steps the scheduler)."""
    out = []
    for _ in range(steps + 1):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def lrs(make, steps: int) -> list[float]:
    """read_lrs of the scheduler `make(optimizer)` builds on a fresh optimiser."""
    optimizer = _optimizer()
    return read_lrs(make(optimizer), optimizer, steps)


def _trainer(**knobs) -> dict:
    """config.yaml's pretrain trainer block with `knobs`."""
    trainer = yaml.safe_load((ROOT / "config.yaml").read_text())["pretrain"]["trainer"]
    return trainer | knobs


def _pretrain_schedule(trainer: dict, schedule_steps: int, hold: int):
    """What pretrain/train.py builds for a run of `schedule_steps` after `hold` head-only steps."""
    warmup = lr_warmup_steps(trainer, schedule_steps)
    return lambda optimizer: training.lr_scheduler(
        optimizer, warmup_steps=warmup, total_steps=hold + schedule_steps, hold_steps=hold,
        shape=trainer["lr_schedule"], min_ratio=trainer["min_lr_ratio"])


# (schedule steps, warmup_ratio, head warm-up hold): paper.yaml's shape (10% of the steps), the
# demo's, no warm-up, a warm-up rounding to 0 or over the whole run, holds of 0, 1 and the warm-up.
SHAPES = [(20, 0.1, 0), (20, 0.1, 2), (281, 0.1, 28), (7, 0.1, 0), (7, 0.1, 1), (100, 0.0, 0),
          (100, 0.0, 3), (13, 0.37, 5), (3, 1.0, 0), (3, 1.0, 3), (1, 0.1, 1), (40, 0.04, 0)]


@pytest.mark.parametrize("steps,ratio,hold", SHAPES)
def test_the_defaults_give_pretraining_s_old_linear_schedule_bit_for_bit(steps, ratio, hold):
    """Every step's lr, the hold's and past the end included, is the old schedule's very float."""
    trainer = _trainer(warmup_ratio=ratio)
    assert {k: trainer[k] for k in KNOBS} == {"lr_schedule": "linear", "min_lr_ratio": 0.0,
                                              "warmup_steps": None}
    warmup = int(round(ratio * steps))  # pretrain/train.py's warm-up before the knobs
    old = lrs(lambda o: old_linear_schedule(o, warmup_steps=warmup, total_steps=hold + steps,
                                            hold_steps=hold), hold + steps + 3)
    new = lrs(_pretrain_schedule(trainer, steps, hold), hold + steps + 3)
    assert new == old


def _cosine(step: int, warmup: int, total: int, floor: float, hold: int = 0,
            peak: float = PEAK) -> float:
    """The BoW authors' shape (bowdpr/src/bowdpr/scheduler.py) with our warm-up's (step + 1),
    after `hold` steps at the peak, written out."""
    if step < hold:
        return peak
    step, total = step - hold, total - hold
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return peak * floor
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
    return peak * (floor + (1 - floor) * cosine)


@pytest.mark.parametrize("hold", [0, 3])
def test_pretraining_s_cosine_to_a_floor_after_warmup_steps(hold):
    """The authors' recipe at a small scale (4000 / 140000 -> 4 / 40): warmup_steps wins over the
    ratio; the peak at the warm-up's end, the middle of the decay, the floor at the end and
    after."""
    steps, warmup, floor = 40, 4, 0.1
    trainer = _trainer(warmup_ratio=0.5, warmup_steps=warmup, lr_schedule="cosine",
                       min_lr_ratio=floor)
    assert lr_warmup_steps(trainer, steps) == warmup  # not 0.5 x 40
    got = lrs(_pretrain_schedule(trainer, steps, hold), hold + steps + 5)
    assert got[:hold] == [PEAK] * hold  # the head warm-up holds the peak
    for step in range(hold + steps + 6):
        assert got[step] == pytest.approx(_cosine(step, warmup, hold + steps, floor, hold),
                                          rel=1e-12), step
    assert got[hold] == pytest.approx(PEAK / 4)  # the warm-up's first step already learns
    assert got[hold + warmup - 1] == got[hold + warmup] == pytest.approx(PEAK)  # warm-up end
    assert got[hold + (warmup + steps) // 2] == pytest.approx(PEAK * (floor + (1 - floor) / 2))
    assert got[hold + steps - 1] > PEAK * floor
    assert got[hold + steps] == pytest.approx(PEAK * floor)  # the end: min_lr_ratio x lr
    assert got[hold + steps + 5] == pytest.approx(PEAK * floor)  # and past it
    assert all(a >= b for a, b in zip(got[hold + warmup:], got[hold + warmup + 1:]))


def test_a_linear_decay_to_a_floor_and_a_zero_warmup():
    trainer = _trainer(warmup_steps=0, min_lr_ratio=0.25)
    got = lrs(_pretrain_schedule(trainer, 20, 0), 21)
    assert got[0] == PEAK  # warmup_steps 0: no warm-up at all, not "use the ratio"
    assert got[10] == pytest.approx(PEAK * (0.25 + 0.75 * 10 / 20), rel=1e-12)
    assert got[20] == got[21] == pytest.approx(PEAK * 0.25)


def test_a_shape_the_factor_does_not_know_is_refused():
    with pytest.raises(ValueError, match="'step'"):
        training.lr_scheduler(_optimizer(), warmup_steps=1, total_steps=5, shape="step")


@pytest.mark.parametrize("key,value", [
    ("min_lr_ratio", 1.0), ("min_lr_ratio", -0.1), ("warmup_steps", -1), ("warmup_steps", 10.5),
    ("lr_schedule", "step"),
])
def test_the_schema_refuses_bad_schedule_knobs_in_the_section_and_a_model_entry(key, value):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config_checks.validate(copy.deepcopy(config))
    bad = copy.deepcopy(config)
    bad["pretrain"]["trainer"][key] = value
    with pytest.raises(ConfigError, match=key):
        config_checks.validate(bad)
    bad = copy.deepcopy(config)
    bad["pretrain"]["models"][1].setdefault("trainer", {})[key] = value
    with pytest.raises(ConfigError, match=key):
        config_checks.validate(bad)


def test_a_model_entry_sets_the_knobs_for_itself_alone():
    from retrieval_pretraining.pretrain.settings import resolve_model

    section = yaml.safe_load((ROOT / "config.yaml").read_text())["pretrain"]
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    name = section["models"][1]["name"]
    knobs = {"lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 4}
    section["models"][1]["trainer"] = knobs
    config["pretrain"] = section
    config_checks.validate(config)
    others = [m["name"] for m in section["models"] if m["name"] != name
              and m["objective"] != "none"]
    assert {k: resolve_model(section, name, 0)["trainer"][k] for k in KNOBS} == knobs
    for other in others:
        assert resolve_model(section, other, 0)["trainer"]["lr_schedule"] == "linear", other


def test_a_state_from_before_the_knobs_still_resumes_at_their_defaults():
    """claim_state sets aside a state whose job differs: at their defaults the knobs are not in
    the job, so that a pre-training stopped before they existed resumes; any other value is a
    new job."""
    from pretrain_fixtures import model_settings

    settings = model_settings("mlm")
    before = copy.deepcopy(settings)
    for key in KNOBS:
        del before["trainer"][key]
    assert resume_job(settings, {"a": "1"}) == resume_job(before, {"a": "1"})
    for knob, value in {"lr_schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 0}.items():
        changed = model_settings("mlm", **{knob: value})
        assert resume_job(changed, {"a": "1"}) != resume_job(settings, {"a": "1"}), knob
