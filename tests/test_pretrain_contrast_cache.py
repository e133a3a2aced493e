"""Gradient caching (pretrain/contrast_cache.py): a gathering row's contrast set is the global batch
whether a step is one micro-batch a process or several.

Checked three ways: the layout of joined micro-batches by hand; the cached step's gradient against
one autograd pass over the joined contrast set (same model, same micro-batches, dropout on); and
the trainer on one process (accumulating, cached) against two gloo processes (one micro-batch
each, gathered), which must train the same weights. Out of memory in what a caching step holds at
once names what shrinks it (not micro_batch_size)."""

import json

import pytest
import torch
from transformers import AutoTokenizer

import pretrain_fixtures as fx
from retrieval_pretraining.pretrain import contrast_cache
from retrieval_pretraining.pretrain import data as pdata
from retrieval_pretraining.pretrain import store as pstore
from retrieval_pretraining.pretrain.model import Pretrainer
from retrieval_pretraining.pretrain.settings import gather_block
from retrieval_pretraining.training import seed_torch

torch.set_num_threads(1)

# Objective -> the loss term its contrast set gives.
TERMS = {"costa": "loss_gwc", "cpdae": "loss_cl", "cpdae_r": "loss_cl", "cocondenser": "loss_co"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The trainer tests' corpus with a checkpoint that has BERT's dropout (0.1)."""
    root = tmp_path_factory.mktemp("cache")
    checkpoint, chunks, spans = fx.tiny_setup(root)
    return fx.tiny_checkpoint(root / "dropout", dropout=0.1), chunks, spans


def gathering(objective: str, **trainer) -> dict:
    settings = fx.model_settings(objective, **trainer)
    settings[gather_block(settings)]["gather_negatives"] = True
    return settings


def micro_batches(settings, setup, store_dir, count=2):
    """The first `count` micro-batches the trainer would draw (one process): step 0's."""
    checkpoint, chunks, spans = setup
    spans = spans if settings["objective"] == "costa" else None
    files = pstore.prepare_store(chunks, spans, store_dir, share=(0, 1))
    tr = settings["trainer"]
    dataset = pdata.MicroBatches(
        files, vocab=pdata.Vocab.from_tokenizer(AutoTokenizer.from_pretrained(checkpoint)),
        seed=settings["seed"], global_batch_size=tr["global_batch_size"],
        micro_batch_size=tr["micro_batch_size"], rank=0, world_size=1,
        **pdata.objective_inputs(settings))
    dataset.total_steps = 1
    return [dataset[i] for i in range(count)]


def test_join_stacks_every_view_0_before_every_view_1_and_split_undoes_it():
    a = {"views": torch.tensor([[1.0], [2.0], [10.0], [20.0]]), "text": torch.tensor([[1.0], [2.0]])}
    b = {"views": torch.tensor([[3.0], [30.0]]), "text": torch.tensor([[3.0]])}
    joined = contrast_cache.join([a, b])
    assert joined["views"].flatten().tolist() == [1, 2, 3, 10, 20, 30]  # view 0 of all; view 1 of all
    assert joined["text"].flatten().tolist() == [1, 2, 3]
    back = contrast_cache.split(joined, [2, 1])
    for part, want in zip(back, (a, b)):
        assert part.keys() == want.keys()
        for key in want:
            assert torch.equal(part[key], want[key]), key


def test_only_an_accumulating_gathering_row_caches():
    assert contrast_cache.caches(gathering("cpdae"), accumulation=2)
    assert not contrast_cache.caches(gathering("cpdae"), accumulation=1)  # the pool is held at once
    assert not contrast_cache.caches(fx.model_settings("cpdae"), accumulation=2)  # its own pool
    assert not contrast_cache.caches(fx.model_settings("mlm"), accumulation=2)


@pytest.mark.parametrize("objective", ["costa", "cpdae", "cpdae_r", "cocondenser"])
def test_the_cached_step_has_the_gradient_of_one_pass_over_the_global_contrast_set(
        objective, setup, tmp_path):
    """Two micro-batches of 4: each one's own terms accumulated (/2) plus lambda x the contrastive
    loss over all 8 texts, computed here in one autograd graph; the cached step must give the same
    gradient and log that loss's value as the term, with dropout on (seeded per micro-batch)."""
    settings = gathering(objective)
    checkpoint = setup[0]
    batches = micro_batches(settings, setup, tmp_path / "store")
    model = Pretrainer(checkpoint, settings)
    weight = settings[gather_block(settings)]["lambda"]  # the block holds the term's weight too
    term = TERMS[objective]

    def seed(micro):
        seed_torch(settings["seed"], 0, micro)

    def gradients():
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return grads

    # Reference: each micro-batch's own terms (its own contrastive term taken out) and the
    # contrastive loss over the joined inputs, in one graph.
    inputs, local = [], []
    for micro, batch in enumerate(batches):
        seed(micro)
        out = model(batch)
        local.append(out["loss"] - weight * out[term])
        seed(micro)
        inputs.append(model.contrast_inputs(batch))
    whole = model.contrast_loss(contrast_cache.join(inputs), {})
    (sum(local) / 2 + weight * whole).backward()
    want = gradients()

    cached = contrast_cache.cached_contrast(model, batches, seed)
    logged = []
    for micro, batch in enumerate(batches):
        seed(micro)
        out = model(batch, cached=cached[micro])
        (out["loss"] / 2 + out.pop("contrast_surrogate")).backward()
        logged.append(out)
    got = gradients()

    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
    for out, own in zip(logged, local):
        torch.testing.assert_close(out[term], whole.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out["loss"], own.detach() + weight * whole.detach(),
                                   rtol=1e-5, atol=1e-6)
    pool = 2 * 8 - 1 if objective != "costa" else None  # every other view of the 8 texts
    if pool is not None:
        assert all(float(out["contrast_pool"]) == pool for out in logged)


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "encoder" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("objective, micro", [("costa", 4), ("cpdae", 4), ("cocondenser", 4),
                                              ("cpdae", 2)])
def test_a_gathering_row_trains_the_same_on_one_process_as_on_two(objective, micro, setup,
                                                                  tmp_path):
    """Global batch 8 in micro-batches of 4: two gloo processes hold it at once and gather it; one
    process accumulates two and caches the contrastive gradient. Same micro-batches, same dropout
    (seeded per global micro-batch): the same weights. Without the cache, one process would
    contrast 4 texts where two contrast 8. In micro-batches of 2, the two processes accumulate
    too, as on fewer GPUs than a row's global batch needs (paper.yaml's CPDAE: 8 x 8): each caches
    its contrast over its 2 micro-batches and gathers the other's, and DDP averages the gradients
    only after the last (no_sync before it)."""
    checkpoint, chunks, spans = setup
    settings = gathering(objective, max_steps=3, micro_batch_size=micro, lr=1e-3)
    spans = spans if objective == "costa" else None
    two = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "two", nproc=2, wait=False)
    one = fx.run_module(settings, checkpoint, chunks, spans, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.wait(timeout=300) == 0, two.communicate()[0][-3000:]
    assert "its gradient is cached" in one.stderr
    info = {n: json.loads((tmp_path / n / "encoder" / "training.json").read_text())
            for n in ("one", "two")}
    accumulation = (8 // micro, 8 // (2 * micro))
    assert (info["one"]["accumulation"], info["two"]["accumulation"]) == accumulation
    assert (info["one"]["contrast_cache"], info["two"]["contrast_cache"]) == (True, micro == 2)
    records = {n: [json.loads(line)
                   for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
               for n in ("one", "two")}
    for a, b in zip(records["one"], records["two"], strict=True):
        assert a["contrast_pool"] == pytest.approx(b["contrast_pool"]), a["step"]
        assert a[TERMS[objective]] == pytest.approx(b[TERMS[objective]], rel=1e-4, abs=1e-5), a["step"]
    one_w, two_w = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    worst = max((one_w[k] - two_w[k]).abs().max().item() for k in one_w)
    assert worst <= 1e-5, f"largest weight difference {worst}"


class _OutOfMemoryInBackward(torch.autograd.Function):
    """The identity, whose backward runs out of memory (a stand-in for CUDA's on the CPU)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated, the cache's gradient)")


@pytest.mark.parametrize("where", ["fetch", "loss", "gradient"])
def test_out_of_memory_in_the_cached_pass_names_what_shrinks_it(where, setup, tmp_path,
                                                                 monkeypatch):
    """A caching step holds this process's whole share of the global batch at once: its
    micro-batches' inputs (fetched before the first), then the contrastive loss over all of them
    and its gradient. Out of memory there, lowering micro_batch_size (a micro-batch's advice)
    would shrink none of it: the error names the global batch and more GPUs instead."""
    from retrieval_pretraining.pretrain.train import train

    if where == "fetch":  # the trainer's one non-blocking copy: a micro-batch to the device
        to = torch.Tensor.to

        def to_then(self, *args, **kwargs):
            if kwargs.get("non_blocking"):
                raise torch.OutOfMemoryError("CUDA out of memory (simulated, fetch)")
            return to(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to_then)
    else:  # only the cache calls contrast_loss in a caching run
        contrast_loss = Pretrainer.contrast_loss

        def loss_then(self, inputs, stats):
            if where == "loss":
                raise torch.OutOfMemoryError("CUDA out of memory (simulated, joined loss)")
            return _OutOfMemoryInBackward.apply(contrast_loss(self, inputs, stats))

        monkeypatch.setattr(Pretrainer, "contrast_loss", loss_then)
    checkpoint, chunks, _ = setup
    with pytest.raises(RuntimeError) as raised:
        train(gathering("cpdae", max_steps=1), chunks=chunks, spans=None, checkpoint=checkpoint,
              encoder_out=tmp_path / "encoder", metrics_out=tmp_path / "metrics.jsonl",
              plot_out=tmp_path / "loss.png", state_dir=tmp_path / "state")
    message = str(raised.value)
    assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)
    assert message.startswith("out of memory with global_batch_size=8: ")
    assert "8 texts of this process" in message and "lower 'micro_batch_size'" not in message
    assert "more GPUs" in message and "lower 'global_batch_size'" in message
