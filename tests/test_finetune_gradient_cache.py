"""Fine-tuning's gradient cache (finetune.cache_chunk; model.cached_contrast_set): a contrast set
encoded a chunk of queries at a time, twice, must train as one pass over the whole set does. The
gradient is checked in float64 against one autograd graph over the set (dropout on: each chunk
under the seed both passes use), against the plain uncached pass (dropout off), with sub_batches
> 1, on 2 gloo processes with gather, and through the training loop (its logged loss the uncached
run's; its weights after two steps, float64 under SGD, the uncached run's)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from retrieval_pretraining import training
from retrieval_pretraining.finetune import data as fdata
from retrieval_pretraining.finetune.model import (cached_contrast_set, contrast_set_loss,
                                                  load_bi_encoder, micro_batch_loss, rows)
from retrieval_pretraining.finetune.settings import FinetuneSettings
from test_finetune import _gloo_env, fine_tune, tiny_dataset, tiny_encoder

torch.set_num_threads(1)
CPU = torch.device("cpu")
QUERIES = ["what causes rain", "who wrote hamlet", "speed of light in glass", "why is the sky blue",
           "tallest mountain on mars", "how do vaccines work", "boiling point of water at altitude",
           "largest prime gap known"]


def _passages(n: int) -> list[str]:
    return [f"passage {i} about " + " ".join(QUERIES[i % len(QUERIES)].split()[::-1]) + " and more"
            * (i % 3) for i in range(n)]


def _encoder(folder: Path, settings: FinetuneSettings, dropout: float):
    """The 1-layer test encoder as a float64 BiEncoder in training mode, dropout `dropout`."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    config.save_pretrained(folder)
    model, tokenizer = load_bi_encoder(folder, settings.retrieval, CPU)
    return model.double().train(), tokenizer


def _inputs(tokenizer, texts: list[str], max_len: int) -> dict[str, torch.Tensor]:
    return dict(tokenizer(texts, padding=True, truncation=True, max_length=max_len,
                          return_tensors="pt"))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _no_sync(_: bool) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("gcache") / "base")


def _setup(base: Path, tmp_path: Path, dropout: float, **knobs):
    import shutil

    folder = shutil.copytree(base, tmp_path / "encoder")
    settings = FinetuneSettings.from_config({"q_len": 12, "p_len": 16, "group_size": 2,
                                             "batch_size": 8, "sub_batches": 2, **knobs})
    model, tokenizer = _encoder(folder, settings, dropout)
    plan = fdata.contrast_plan(settings, 1)
    queries = _inputs(tokenizer, QUERIES, settings.retrieval.q_len)
    passages = _inputs(tokenizer, _passages(2 * len(QUERIES)), settings.retrieval.p_len)
    micro = [(rows(queries, plan.micro_batch)[k], rows(passages, 2 * plan.micro_batch)[k])
             for k in range(plan.accumulation)]
    return settings, plan, model, micro


def _cached(settings, plan, model, micro, chunk: int) -> tuple[dict, list[float]]:
    """A step's gradient and losses the cached way: each micro-batch (contrast set) in chunks."""
    losses = []
    for k, (q_in, p_in) in enumerate(micro):
        loss = cached_contrast_set(model, model, q_in, p_in, settings, CPU, 0, chunk=chunk,
                                   seed=lambda j: training.seed_torch(7, 0, k, j),
                                   scale=1 / plan.accumulation, sync=_no_sync)
        losses.append(loss.item())
    return _grads(model), losses


@pytest.mark.parametrize("chunk", [1, 2, 3])  # 3: a micro-batch of 4 in chunks of 3 and 1
def test_the_cached_step_has_the_gradient_of_one_graph_over_each_contrast_set_dropout_on(
        base, tmp_path, chunk):
    """Dropout 0.3: the reference encodes each chunk with gradients under the seed the cached
    passes use, joins the vectors and backpropagates the contrast set's loss in one graph; two
    contrast sets of 4 queries (sub_batches 2), accumulated as the loop accumulates them."""
    settings, plan, model, micro = _setup(base, tmp_path, dropout=0.3)
    assert plan.micro_batch == 4 and plan.accumulation == 2
    assert fdata.cached_chunk(settings.__class__(**{**settings.__dict__, "cache_chunk": chunk}),
                              plan) == chunk
    want_losses = []
    for k, (q_in, p_in) in enumerate(micro):
        qs, ps = [], []
        for j, (qc, pc) in enumerate(zip(rows(q_in, chunk), rows(p_in, 2 * chunk))):
            training.seed_torch(7, 0, k, j)
            q, p = model(qc, pc)
            qs.append(q)
            ps.append(p)
        loss = contrast_set_loss(torch.cat(qs), torch.cat(ps), group_size=2,
                                 temperature=settings.temperature, gather=False, rank=0)
        (loss / plan.accumulation).backward()
        want_losses.append(loss.item())
    want = _grads(model)
    got, losses = _cached(settings, plan, model, micro, chunk)
    assert got.keys() == want.keys() and len(want) > 10
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)
    assert losses == pytest.approx(want_losses, rel=1e-12)
    # Dropout is on: a chunk under another seed would give another gradient.
    chunk_0 = rows(micro[0][0], chunk)[0], rows(micro[0][1], 2 * chunk)[0]
    vectors = []
    for j in (0, 1):
        training.seed_torch(7, 0, 0, j)
        vectors.append(model(*chunk_0)[0].detach())
    assert not torch.allclose(*vectors)


def test_without_dropout_the_cached_step_is_the_uncached_pass(base, tmp_path):
    """Dropout 0: the cached step's gradient and loss are those of micro_batch_loss, the loop's
    uncached pass, over each whole contrast set (sub_batches 2)."""
    settings, plan, model, micro = _setup(base, tmp_path, dropout=0.0)
    want_losses = []
    for q_in, p_in in micro:
        loss = micro_batch_loss(model, q_in, p_in, settings, CPU)
        (loss / plan.accumulation).backward()
        want_losses.append(loss.item())
    want = _grads(model)
    got, losses = _cached(settings, plan, model, micro, chunk=2)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)
    assert losses == pytest.approx(want_losses, rel=1e-12)


_GATHER_WORKER = r"""
import contextlib, json, os, sys, torch, torch.distributed as dist
from retrieval_pretraining import training
from retrieval_pretraining.finetune.model import cached_contrast_set, load_bi_encoder, rows
from retrieval_pretraining.finetune.settings import FinetuneSettings
rank, folder, out, inputs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
torch.set_num_threads(1)
env = training.init_distributed()
settings = FinetuneSettings.from_config(json.loads(sys.argv[5]))
model, _ = load_bi_encoder(folder, settings.retrieval, env.device)
model = model.double().train()
ddp = training.data_parallel(model, env)
q_all, p_all = torch.load(inputs)
share = len(q_all["input_ids"]) // 2
q_in = rows(q_all, share)[rank]
p_in = rows(p_all, share * settings.group_size)[rank]
def sync(syncs):
    return contextlib.nullcontext() if syncs else ddp.no_sync()
loss = cached_contrast_set(ddp, model, q_in, p_in, settings, env.device, rank, chunk=1,
                           seed=lambda j: training.seed_torch(7, 0, rank, j), scale=1.0, sync=sync)
if rank == 0:
    torch.save({"loss": loss, "grads": {n: p.grad for n, p in model.named_parameters()
                                        if p.grad is not None}}, out)
training.teardown_distributed()
training.exit_process(0)
"""


def test_two_gathering_processes_cache_to_the_gradient_of_one_graph_over_the_set(base, tmp_path):
    """gather on, 2 gloo processes, DDP: each holds 2 of a contrast set's 4 queries, encoded a
    query at a time (no_sync but for the last chunk); the averaged gradient must be the one-graph
    gradient of the set's loss with every chunk under its seed (dropout 0.3)."""
    knobs = {"q_len": 12, "p_len": 16, "group_size": 2, "batch_size": 4, "gather": True}
    settings, plan, model, micro = _setup(base, tmp_path, dropout=0.3,
                                          **{**knobs, "sub_batches": 1})
    q_in, p_in = micro[0]
    q_in = rows(q_in, 4)[0]
    p_in = rows(p_in, 8)[0]
    torch.save((q_in, p_in), tmp_path / "inputs.pt")
    script = tmp_path / "worker.py"
    script.write_text(_GATHER_WORKER)
    env = _gloo_env()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "encoder"),
                               str(tmp_path / "out.pt"), str(tmp_path / "inputs.pt"),
                               json.dumps({**knobs, "sub_batches": 1})], env=env)
             for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    qs, ps = [], []
    for rank in range(2):
        for j in range(2):
            training.seed_torch(7, 0, rank, j)
            q, p = model(rows(q_in, 1)[2 * rank + j], rows(p_in, 2)[2 * rank + j])
            qs.append(q)
            ps.append(p)
    loss = contrast_set_loss(torch.cat(qs), torch.cat(ps), group_size=2,
                             temperature=settings.temperature, gather=False, rank=0)
    loss.backward()
    want = _grads(model)
    got = torch.load(tmp_path / "out.pt")
    assert got["grads"].keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got["grads"][name], want[name], rtol=1e-9, atol=1e-12,
                                   msg=name)
    # Rank 0's loss: its 2 queries over the gathered 8 passages.
    rank0 = contrast_set_loss(torch.cat(qs[:2]), torch.cat(ps), group_size=2,
                              temperature=settings.temperature, gather=False, rank=0)
    assert got["loss"].item() == pytest.approx(rank0.item(), rel=1e-12)


def test_the_loop_with_the_cache_logs_the_uncached_loss_and_says_caching_is_on(tmp_path, caplog):
    """Through train(), dropout 0: cache_chunk 2 under sub_batches 2 (contrast sets of 4) logs the
    uncached run's losses and negatives, and the start event and the log say the cache is on."""
    import logging

    from transformers import AutoConfig

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    config = AutoConfig.from_pretrained(base, local_files_only=True)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.save_pretrained(base)
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1, "log_every_steps": 1}
    records = {}
    for name, extra in (("plain", {}), ("cached", {"cache_chunk": 2})):
        with caplog.at_level(logging.INFO, logger="retrieval_pretraining.finetune.train"):
            caplog.clear()
            assert fine_tune({**cfg, **extra}, base, data, [data["bm25"]], seed=1,
                             out=tmp_path / name, state_dir=tmp_path / f"state-{name}",
                             metrics_path=tmp_path / f"{name}.jsonl") == 0
            said = caplog.text
        records[name] = [json.loads(line) for line in
                         (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        assert ("gradient cache on" in said) == (name == "cached")
    plain, cached = records["plain"], records["cached"]
    assert "cache_chunk" not in plain[0] and cached[0]["cache_chunk"] == 2
    assert cached[0]["negatives_per_query"] == plain[0]["negatives_per_query"] == 7
    steps = [(r["step"], r["negatives_per_query"]) for r in cached[1:]]
    assert steps == [(s, 7) for s in range(1, 5)]
    # Step 1 starts from the same weights: the same loss; later steps to fp32 rounding.
    assert cached[1]["loss"] == pytest.approx(plain[1]["loss"], rel=1e-6)
    assert [r["loss"] for r in cached[1:]] == pytest.approx([r["loss"] for r in plain[1:]],
                                                           rel=1e-4)
    manifest = json.loads((tmp_path / "cached" / "manifest.json").read_text())
    assert manifest["params"]["cache_chunk"] == 2


def test_a_chunk_that_covers_the_micro_batch_is_accepted_said_and_resumes_as_none(
        tmp_path, caplog):
    """cache_chunk 4 with contrast sets of 4 (batch 8, sub_batches 2) caches nothing: one pass
    encodes each micro-batch, as without the key. It was accepted without a word, and a state
    written without it (or with it) did not resume under the other though the steps are the same:
    the log says caching is off and why, and a chunk no micro-batch on any GPU count exceeds (the
    contrast set's queries or more) is the same resumable setting as none."""
    import logging

    from retrieval_pretraining.finetune.train import resume_settings

    data = tiny_dataset(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "epochs": 1, "log_every_steps": 1, "cache_chunk": 4}
    with caplog.at_level(logging.INFO, logger="retrieval_pretraining.finetune.train"):
        assert fine_tune(cfg, base, data, [data["bm25"]], seed=1, out=tmp_path / "out",
                         state_dir=tmp_path / "state", metrics_path=tmp_path / "m.jsonl") == 0
    said = " ".join(caplog.text.split())
    assert "gradient cache on" not in said
    assert "finetune.cache_chunk 4 covers the micro-batch of 4 queries" in said, said
    assert "no gradient cache" in said, said
    start = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert "cache_chunk" not in start
    settings = FinetuneSettings.from_config
    plain = resume_settings(settings({"batch_size": 8, "sub_batches": 2}))
    for chunk in (4, 5, 64):  # never below a micro-batch: the uncached step
        assert resume_settings(settings({"batch_size": 8, "sub_batches": 2,
                                         "cache_chunk": chunk})) == plain, chunk
    # Below the contrast set: caching on some GPU count (gather splits a set), so its own.
    for gather in (False, True):
        assert resume_settings(settings({"batch_size": 8, "sub_batches": 2, "gather": gather,
                                         "cache_chunk": 3}))["cache_chunk"] == 3


@pytest.fixture(scope="module")
def loop_inputs(tmp_path_factory):
    """SciFact's tiny slice and the 1-layer encoder with dropout off: without dropout, the cached
    and the uncached step see the same activations (their dropout seeds differ by design)."""
    folder = tmp_path_factory.mktemp("gcache-loop")
    data = tiny_dataset(folder / "data")
    encoder = tiny_encoder(folder / "base")
    config = json.loads((encoder / "config.json").read_text())
    (encoder / "config.json").write_text(json.dumps(
        {**config, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    return data, encoder


def _trained_weights(loop_inputs, tmp_path: Path, monkeypatch, name: str, cfg: dict
                     ) -> dict[str, torch.Tensor]:
    """The encoder's weights after train() ran `cfg` in float64 under plain SGD (as exported)."""
    from safetensors.torch import load_file

    from retrieval_pretraining.finetune import train as ftrain

    data, encoder = loop_inputs
    load_bi_encoder = ftrain.load_bi_encoder

    def in_float64(*args, **kwargs):
        model, tokenizer = load_bi_encoder(*args, **kwargs)
        return model.double(), tokenizer

    class SGD(torch.optim.SGD):
        def step(self, closure=None):  # step_if_finite sets found_inf, which only fused reads
            assert self.__dict__.pop("found_inf").item() == 0
            return super().step(closure)

    def sgd(model, *, lr, weight_decay):
        return SGD(model.parameters(), lr=lr)

    monkeypatch.setattr(ftrain, "load_bi_encoder", in_float64)
    monkeypatch.setattr(training, "build_optimizer", sgd)
    assert fine_tune(cfg, encoder, data, [data["bm25"]], seed=5, out=tmp_path / name,
                     state_dir=tmp_path / f"state-{name}",
                     metrics_path=tmp_path / f"{name}.jsonl") == 0
    return load_file(tmp_path / name / "model.safetensors")


# (sub_batches, cache_chunk): batch 16, so contrast sets (micro-batches) of 16 and 8 queries, cut
# into chunks that divide them (4) and that do not (3, 5: a shorter last chunk).
@pytest.mark.parametrize("sub_batches,chunk", [(1, 3), (2, 4), (2, 5)])
def test_the_loop_s_weights_after_two_cached_steps_are_the_uncached_loop_s(
        loop_inputs, tmp_path, monkeypatch, sub_batches, chunk):
    """train() itself, twice on the same data and seed, dropout off: with cache_chunk and without.
    After its 2 steps the exported weights must agree, so the loop hands cached_contrast_set the
    scale of its uncached micro-batches (1 / the step's micro-batches), whatever the chunks.

    In float64 under SGD, not AdamW: AdamW's step divides the gradient by its own running norm
    (m / sqrt(v)), so a gradient scaled by any constant moves the weights alike (but for eps) and
    the weights would not show a wrong scale; SGD moves them by lr x the gradient. The tolerance
    is float64's: the weights differ by summation order alone (the chunks' matrix products), seen
    at most 2e-16 (a weight near 1 rounds at 1e-16), against updates up to 2.5e-3, which a wrong
    scale (by the step's micro-batches or the chunks: 2x and more) changes by their own size."""
    from safetensors.torch import load_file

    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 16,
           "sub_batches": sub_batches, "epochs": 1, "lr": 1.0, "warmup_steps": 0,
           "precision": "fp32", "log_every_steps": 1}
    plain = _trained_weights(loop_inputs, tmp_path, monkeypatch, "plain", cfg)
    cached = _trained_weights(loop_inputs, tmp_path, monkeypatch, "cached",
                              {**cfg, "cache_chunk": chunk})
    steps = [json.loads(line) for line in (tmp_path / "cached.jsonl").read_text().splitlines()]
    assert steps[0]["cache_chunk"] == chunk and [r["step"] for r in steps[1:]] == [1, 2]
    start = load_file(loop_inputs[1] / "model.safetensors")
    assert plain.keys() == cached.keys() == start.keys()
    moved = {k: plain[k] - start[k].double() for k in start}
    assert all(v.dtype == torch.float64 for v in plain.values())
    largest = max(v.abs().max().item() for v in moved.values())
    assert largest > 1e-3, largest  # the steps moved the weights measurably
    for name in start:
        torch.testing.assert_close(cached[name] - start[name].double(), moved[name],
                                   rtol=1e-9, atol=1e-14, msg=name)


def test_the_loop_keys_each_chunk_s_dropout_by_its_step_micro_batch_and_chunk(
        loop_inputs, tmp_path, monkeypatch):
    """The loop seeds dropout before each chunk's two passes by (seed, step, micro-batch, chunk):
    within a step each micro-batch's chunks draw their own masks, the same in both passes (the
    cached gradient is the one of the vectors it was computed from), and no key repeats across
    steps. Keyed without the micro-batch, the step's micro-batches reused one another's masks."""
    from collections import Counter

    data, encoder = loop_inputs
    keys = []
    seed_torch = training.seed_torch
    monkeypatch.setattr(training, "seed_torch", lambda *key: keys.append(key) or seed_torch(*key))
    cfg = {"q_len": 16, "p_len": 16, "group_size": 2, "batch_size": 8, "sub_batches": 2,
           "cache_chunk": 2, "epochs": 1, "log_every_steps": 1}
    assert fine_tune(cfg, encoder, data, [data["bm25"]], seed=5, out=tmp_path / "out",
                     state_dir=tmp_path / "state", metrics_path=tmp_path / "m.jsonl") == 0
    records = (tmp_path / "m.jsonl").read_text().splitlines()
    steps = sum("loss" in json.loads(line) for line in records)
    per_step = 2 * 2  # 2 micro-batches (contrast sets of 4) x 2 chunks of 2 queries
    assert len(keys) == steps * per_step * 2  # each chunk seeded before both of its passes
    for step in range(steps):
        drawn = Counter(keys[step * per_step * 2:(step + 1) * per_step * 2])
        assert len(drawn) == per_step and set(drawn.values()) == {2}, (step, drawn)
    assert len(set(keys)) == steps * per_step
