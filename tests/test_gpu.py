"""The CUDA paths of pre-training (fused AdamW, its resumable state saved and resumed across
devices, bf16 autocast, the trainer on a GPU, unpadded layers with flash attention) and of
fine-tuning's steps against the CPU fp32 path that the rest of the suite checks, and encoding's
fallback from a real out-of-memory error.

CI has no GPU, so these skip there. `benchmarks/gpu_checks.sh` runs them, and the step-time
benchmark, on a lent GPU in one command.
"""

import contextlib
import copy
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

import pretrain_fixtures as fx
from host_reads import CudaHostWaits
from pretrain_fixtures import restore_stop_handlers  # noqa: F401 (a fixture)
from retrieval_pretraining import training
from retrieval_pretraining.pretrain.model import Pretrainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
OBJECTIVES = ["mlm", "costa", "cpdae", "cpdae_r", "bow"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return fx.tiny_setup(tmp_path_factory.mktemp("gpu"))


def test_fused_adamw_on_cuda_makes_the_cpu_update(setup):
    """The same gradients, three steps: CUDA's fused AdamW and the CPU's agree."""
    torch.manual_seed(0)
    cpu_model = Pretrainer(setup[0], fx.model_settings("mlm"))
    gpu_model = copy.deepcopy(cpu_model).to("cuda")
    kwargs = {"lr": 1e-3, "weight_decay": 0.01}
    cpu_opt = training.build_optimizer(cpu_model, **kwargs)
    gpu_opt = training.build_optimizer(gpu_model, **kwargs)
    assert gpu_opt.defaults["fused"] and cpu_opt.defaults["fused"]
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for a, b in zip(cpu_model.parameters(), gpu_model.parameters()):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.to("cuda")
        cpu_opt.step()
        gpu_opt.step()
    for (name, a), b in zip(cpu_model.named_parameters(), gpu_model.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("saved_on, resumed_on", [("cuda", "cuda"), ("cuda", "cpu"),
                                                  ("cpu", "cuda")])
def test_a_state_saved_on_one_device_resumes_on_another(saved_on, resumed_on, tmp_path):
    """training.save_state / load_state with the weights and fused AdamW's moments and step
    counts on a GPU (the trainer saves them at checkpoint_every and on a stop signal): the resume,
    on the GPU or on the CPU (a rerun that sees no GPU), or from a CPU's state onto the GPU, puts
    every optimiser tensor on its parameter's device (fused AdamW's step count in float32), and
    its steps continue the saved run's, to its weights. The GPU's generator is restored too."""
    def fresh(device, seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4)).to(device)
        optimizer = training.build_optimizer(model, lr=1e-2, weight_decay=0.01)
        return model, optimizer, training.lr_scheduler(optimizer, warmup_steps=2, total_steps=20)

    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(8, 6, generator=generator) for _ in range(6)]

    def train_on(model, optimizer, scheduler, batches):
        device = next(model.parameters()).device
        for x in batches:
            loss = (model(x.to(device)) - 1).square().mean()
            loss.backward()
            training.step_if_finite(optimizer, loss.detach().reshape(1, 1))  # as the trainer steps
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

    model, optimizer, scheduler = fresh(saved_on, seed=0)
    train_on(model, optimizer, scheduler, inputs[:3])
    training.save_state(tmp_path, step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                        data_position={})
    drawn = torch.rand(5, device="cuda")  # what the GPU's generator gives next
    train_on(model, optimizer, scheduler, inputs[3:])  # the uninterrupted run

    resumed = fresh(resumed_on, seed=99)  # other weights; the generators moved on
    assert training.load_state(tmp_path, model=resumed[0], optimizer=resumed[1],
                               scheduler=resumed[2])["step"] == 3
    assert torch.equal(torch.rand(5, device="cuda"), drawn)
    for parameter in resumed[0].parameters():
        state = resumed[1].state[parameter]
        assert {t.device for t in state.values()} == {parameter.device}
        assert state["step"].dtype == torch.float32 and int(state["step"]) == 3
    train_on(*resumed, inputs[3:])
    for (name, a), b in zip(model.named_parameters(), resumed[0].parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach().cpu(), atol=1e-6, rtol=1e-5,
                                   msg=name)


def test_cpdae_js_term_on_cuda_under_bf16_autocast_matches_float64():
    """CPDAE's JS term (its own backward, blocks, fp32 under autocast) on CUDA at BERT's
    vocabulary, against the same function in float64 on the CPU (which the CPU tests hold to
    the formula): values and both sets' gradients."""
    from retrieval_pretraining.pretrain import objectives as obj

    generator = torch.Generator().manual_seed(5)
    q = torch.sigmoid(torch.randn(16, 30522, generator=generator) * 3 - 4)
    k = torch.sigmoid(torch.randn(48, 30522, generator=generator) * 3 - 4)
    q, k = q / q.sum(1, keepdim=True), k / k.sum(1, keepdim=True)
    weights = torch.randn(16, 48, generator=generator)
    wanted = [t.double().requires_grad_(True) for t in (q, k)]
    want = obj.pairwise_js(*wanted)
    (want * weights.double()).sum().backward()
    got_leaves = [t.cuda().requires_grad_(True) for t in (q, k)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = obj.pairwise_js(*got_leaves, rows=3)  # several blocks, the last one short
        (got * weights.cuda()).sum().backward()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double().cpu(), want.detach(), atol=1e-5, rtol=0)
    for leaf, wanted_leaf in zip(got_leaves, wanted):
        torch.testing.assert_close(leaf.grad.double().cpu(), wanted_leaf.grad, atol=1e-4, rtol=1e-5)


def _losses(setup, out: Path, objective: str, *, cpu: bool, precision: str = "auto",
            options: dict | None = None, **trainer):
    checkpoint, chunks, spans = setup
    settings = fx.model_settings(objective, max_steps=8, precision=precision, **trainer)
    for block, values in (options or {}).items():  # the objective's own keys
        settings[block] |= values
    env = {"CUDA_VISIBLE_DEVICES": ""} if cpu else {}
    result = fx.run_module(settings, checkpoint, chunks, spans if objective == "costa" else None,
                           out, extra_env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]  # not step 0's probe record
    return [r["loss"] for r in steps], steps[-1]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_trainer_on_cuda_tracks_the_cpu_run(objective, setup, tmp_path):
    """Same data, masks and initial weights: fp32 on CUDA follows the CPU run closely, bf16
    autocast within bf16's precision, step by step; the held-out probes run on the GPU."""
    probes = {"probe_chunks": 4, "probe_every": 4}
    cpu, _ = _losses(setup, tmp_path / "cpu", objective, cpu=True, **probes)
    fp32, _ = _losses(setup, tmp_path / "fp32", objective, cpu=False, precision="fp32", **probes)
    bf16, last = _losses(setup, tmp_path / "bf16", objective, cpu=False, **probes)
    assert len(cpu) == len(fp32) == len(bf16) == 8
    scores = {k: v for k, v in last.items() if k.startswith("probe_")}
    assert scores and all(math.isfinite(v) for v in scores.values()), scores
    # TF32 matmuls (if enabled) and different kernels: small differences, growing a little.
    torch.testing.assert_close(torch.tensor(fp32), torch.tensor(cpu), rtol=1e-3, atol=1e-3)
    # bf16 keeps 8 bits of mantissa: about 0.4% per operation, a few percent after 8 updates.
    torch.testing.assert_close(torch.tensor(bf16), torch.tensor(cpu), rtol=5e-2, atol=5e-2)
    assert last["memory_mb"] > 0  # GPU memory is reported



@pytest.mark.parametrize("objective", ["cpdae", "cocondenser"])
def test_a_gathering_row_that_accumulates_caches_its_contrast_on_cuda_as_on_the_cpu(
        objective, setup, tmp_path):
    """Global batch 8 in 2 micro-batches of 4 with gathering on: the contrastive gradient is cached
    (a pass without gradients, the loss over both micro-batches, each again with that gradient;
    pretrain/contrast_cache.py). On the GPU under bf16 autocast, the CPU run's losses, and the pool
    is the global batch's (15 other views of 8 texts), not a micro-batch's (7)."""
    options = {objective: {"gather_negatives": True}}
    cpu, _ = _losses(setup, tmp_path / "cpu", objective, cpu=True, options=options)
    bf16, last = _losses(setup, tmp_path / "bf16", objective, cpu=False, options=options)
    assert last["contrast_pool"] == 15
    torch.testing.assert_close(torch.tensor(bf16), torch.tensor(cpu), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("objective", ["mlm", "costa", "cpdae"])
def test_the_unpadded_trainer_on_cuda_tracks_the_padded_cpu_run(objective, setup, tmp_path):
    """trainer.unpad on the GPU (index_select / index_copy around every layer, attention over the
    real tokens alone; in fp32 and bf16) against the padded CPU run: the same losses as the
    padded CUDA runs above reach."""
    cpu, _ = _losses(setup, tmp_path / "cpu", objective, cpu=True)
    fp32, _ = _losses(setup, tmp_path / "fp32", objective, cpu=False, precision="fp32", unpad=True)
    bf16, _ = _losses(setup, tmp_path / "bf16", objective, cpu=False, unpad=True)
    torch.testing.assert_close(torch.tensor(fp32), torch.tensor(cpu), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(torch.tensor(bf16), torch.tensor(cpu), rtol=5e-2, atol=5e-2)


def test_unpadded_attention_runs_flash_attention_on_cuda(setup):
    """trainer.unpad on CUDA in bf16: attention over the real tokens alone (bert.VARLEN_DEVICES)
    runs flash attention's variable-length kernel, forward and backward (the padded path's mask
    leaves it the memory-efficient kernel), and gives the padded computation's states."""
    from torch.profiler import ProfilerActivity, profile

    from retrieval_pretraining import bert
    from retrieval_pretraining.pretrain.masking import with_positions

    model = bert.load(setup[0]).cuda().train()
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([64, 40, 7, 64, 33])
    mask = (torch.arange(64)[None, :] < lengths[:, None]).long()
    batch = with_positions({"input_ids": torch.randint(1000, 30000, (5, 64), generator=generator),
                            "attention_mask": mask})
    batch = {k: v.cuda() for k, v in batch.items()}
    real = mask.bool().cuda()
    states, kernels = [], []
    for extra in ({}, {"token_positions": batch["token_positions"]}):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(batch["input_ids"], batch["attention_mask"], **extra)
            out.last_hidden_state.float().square().mean().backward()
        states.append(out.last_hidden_state.float())
        kernels.append({e.key for e in prof.key_averages() if "attention" in e.key.lower()
                        or "fmha" in e.key.lower() or "flash" in e.key.lower()})
    padded, unpadded = states
    torch.testing.assert_close(unpadded[real], padded[real], rtol=2e-2, atol=2e-2)
    flash = [name for name in kernels[1] if "flash" in name.lower()]
    assert len(flash) >= 2, kernels  # forward and backward (aten::_flash_attention_*, kernels)


def _attention_ops(prof) -> set[str]:
    return {e.key for e in prof.key_averages() if e.key.startswith("aten::_") and "attention" in e.key}


def test_cudnn_first_attention_runs_cudnn_s_kernel_on_cuda_with_a_padding_mask(setup):
    """attn_implementation sdpa_cudnn on CUDA in bf16, in training (dropout on) with padding:
    attention runs cuDNN's op, forward and backward; "sdpa" runs the ops torch itself picks for
    the same call (q, k, v laid out as the layers make them). On an H200 with torch 2.11 those are
    cuDNN's too: torch puts cuDNN first on sm90/sm100 with a recent cuDNN
    (check_prefer_cudnn_attention), which the priority order torch reports does not show; on
    other cards the memory-efficient kernel. With dropout off the states at the real tokens are
    sdpa's within bf16 rounding."""
    from torch.profiler import ProfilerActivity, profile

    from retrieval_pretraining import bert

    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([64, 40, 7, 64, 33])
    mask = (torch.arange(64)[None, :] < lengths[:, None]).long().cuda()
    ids = torch.randint(1000, 30000, (5, 64), generator=generator).cuda()
    real = mask.bool()
    ops, states = {}, {}
    for attention in ("sdpa", "sdpa_cudnn"):
        model = bert.load(setup[0], attn_implementation=attention).cuda().train()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(ids, mask)
            out.last_hidden_state.float().square().mean().backward()
        ops[attention] = _attention_ops(prof)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            states[attention] = model.eval()(ids, mask).last_hidden_state.float()
    layer = model.encoder.layer[0].attention.self
    width = layer.query.out_features
    projected = torch.randn(5, 64, 3 * width, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True)
    q, k, v = (t.view(5, 64, layer.heads, -1).transpose(1, 2) for t in projected.chunk(3, dim=-1))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=real[:, None, None, :], dropout_p=layer.dropout.p
        ).float().square().mean().backward()
    assert any("cudnn_attention" in op for op in ops["sdpa_cudnn"]), ops
    assert any("cudnn_attention_backward" in op for op in ops["sdpa_cudnn"]), ops
    assert ops["sdpa"] == _attention_ops(prof), ops
    torch.testing.assert_close(states["sdpa_cudnn"][real], states["sdpa"][real], rtol=2e-2,
                               atol=2e-2)


def test_unpadded_attention_traces_to_one_graph_on_cuda(setup):
    """compile with unpad: the variable-length attention's CUDA path (flash's op, called
    directly) takes its row lengths from the offsets and the given longest row, so dynamo
    captures the encoder whole."""
    import torch._dynamo

    from retrieval_pretraining import bert
    from retrieval_pretraining.pretrain.masking import with_positions

    model = bert.load(setup[0]).cuda().train()
    mask = (torch.arange(16)[None, :] < torch.tensor([16, 9, 4])[:, None]).long()
    ids = torch.randint(1000, 30000, (3, 16))
    batch = with_positions({"input_ids": ids, "attention_mask": mask})
    batch = {k: v.cuda() for k, v in batch.items()}

    def forward(ids, mask, positions):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(ids, mask, token_positions=positions).last_hidden_state

    torch._dynamo.reset()
    found = torch._dynamo.explain(forward)(batch["input_ids"], batch["attention_mask"],
                                           batch["token_positions"])
    torch._dynamo.reset()
    assert [r.reason for r in found.break_reasons] == [] and found.graph_count == 1


def _step_read_line() -> str:
    """Where a training step's one wait is asked for: QueuedRead.take's wait for the copy."""
    import inspect

    from retrieval_pretraining.training import distributed

    lines, first = inspect.getsourcelines(distributed.QueuedRead.take)
    (offset,) = [i for i, line in enumerate(lines) if ".synchronize()" in line]
    return f"{inspect.getsourcefile(distributed)}:{first + offset}"


def test_the_wait_recorder_sees_a_read_and_an_event():
    """CudaHostWaits' control: it catches both kinds of wait it claims to."""
    with CudaHostWaits() as waits:
        torch.ones(1, device="cuda").item()
        torch.cuda.Event().synchronize()
    sites = waits.sites
    assert len(sites) == 2 and all(Path(site.rsplit(":", 1)[0]) == Path(__file__) for site in sites)


def test_a_queued_read_waits_for_its_step_not_for_work_queued_after_it():
    """The trainer takes step s's values after queueing step s+1 (pretrain/train.py): the take
    must wait for step s's kernels only. Seconds of matmuls queued after the read must still be
    running when it returns, and the values must be the step's."""
    env = training.DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cuda"))
    terms = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    queued = training.queue_read(terms, torch.tensor(2.5, device="cuda"), tokens=7, stop=True,
                                 env=env)
    big = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):  # 55 TFLOP in fp32: most of a second on any current GPU
        big = big @ big / 8192 ** 0.5
    later = torch.cuda.Event()
    later.record()
    read = queued.take()
    still_running = not later.query()
    torch.cuda.synchronize()
    assert still_running
    assert read.terms == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and read.grad_norm == 2.5
    assert read.means == [1.5, 2.5, 3.5] and read.tokens == 7 and read.stop is True


@pytest.mark.parametrize("objective, unpad", [(o, False) for o in OBJECTIVES]
                         + [("mlm", True), ("costa", True), ("cpdae-gathered", False)])
def test_the_trainer_waits_for_the_gpu_once_a_step(objective, unpad, setup, tmp_path,
                                                   restore_stop_handlers):
    """Runs of 2 and 4 steps differ by 2 steps: that difference must hold 2 waits (CudaHostWaits),
    the step's one read of its values (QueuedRead.take); one-off waits (set-up, export) are the
    same in both runs. A 1-step run first takes the process's own one-offs (CUDA's lazy set-up:
    on the first lent GPU, under xdist, they fell in the 2-step run alone). With unpad, the
    variable-length attention must not add one (its longest row is given, not measured); nor
    may a gathering row's cached contrast (2 micro-batches a step: contrast_cache.py)."""
    from retrieval_pretraining.pretrain.train import train

    checkpoint, chunks, spans = setup
    objective, _, gathered = objective.partition("-")
    waits = {}
    for steps in (1, 2, 4):
        out = tmp_path / str(steps)
        settings = fx.model_settings(objective, max_steps=steps, unpad=unpad)
        if gathered:
            settings[objective]["gather_negatives"] = True
        with CudaHostWaits() as recorded:
            code = train(settings, chunks=chunks,
                         spans=spans if objective == "costa" else None, checkpoint=checkpoint,
                         encoder_out=out / "encoder", metrics_out=out / "metrics.jsonl",
                         plot_out=out / "loss.png", state_dir=out / "state")
        waits[steps] = recorded.sites
        assert code == 0
    extra = Counter(waits[4])
    extra.subtract(waits[2])
    assert +extra == Counter({_step_read_line(): 2}), (waits[2], waits[4])


QUERIES = ["what lowers blood pressure", "how do bacteria resist antibiotics",
           "which genes control cell division"]
PASSAGES = ["Salt reduction lowers blood pressure in adults.", "The moon orbits the earth.",
            "Efflux pumps let bacteria resist many antibiotics.", "Rivers flow to the sea.",
            "Cyclins and kinases control the cell division cycle.", "Paint dries slowly in winter."]


def _fine_tuning_steps(checkpoint: Path, device: torch.device, precision: str, steps: int = 6,
                       waits: list | None = None) -> list[float]:
    """`steps` fine-tuning steps on one micro-batch, made as the loop makes them (finetune/train.py:
    pinned inputs on CUDA, dropout seeded per micro-batch, micro_batch_loss, step_if_finite, the
    step's one host_read); with
    `waits`, the host's waits for the GPU of each step after the first."""
    from retrieval_pretraining.encode import tokenize
    from retrieval_pretraining.finetune.model import load_bi_encoder, micro_batch_loss
    from retrieval_pretraining.finetune.settings import FinetuneSettings
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    settings = FinetuneSettings(retrieval=RetrievalSettings(q_len=16, p_len=24), group_size=2,
                                lr=1e-3, precision=precision)
    torch.manual_seed(0)
    model, tokenizer = load_bi_encoder(checkpoint, settings.retrieval, device)
    model.train()
    optimizer = training.build_optimizer(model, lr=settings.lr, weight_decay=0.0)
    env = training.DistEnv(rank=0, local_rank=0, world_size=1, device=device)
    inputs = (tokenize(tokenizer, QUERIES, 16), tokenize(tokenizer, PASSAGES, 24))
    losses = []
    for step in range(steps):
        queries, passages = ({k: v.pin_memory() if device.type == "cuda" else v
                              for k, v in part.items()} for part in inputs)
        counting = waits is not None and step > 0
        with CudaHostWaits() if counting else contextlib.nullcontext() as recorded:
            training.seed_torch(0, step, 0)
            loss = micro_batch_loss(model, queries, passages, settings, device)
            loss.backward()
            values = loss.detach().float().reshape(1, 1)
            training.step_if_finite(optimizer, values)
            optimizer.zero_grad(set_to_none=True)
            read = training.host_read(values, None, tokens=0, stop=False, env=env)
        if counting:
            waits.append(recorded.sites)
        losses.append(read.means[0])
    return losses


def test_fine_tuning_steps_on_cuda_track_the_cpu_steps_and_wait_once(setup):
    """Fine-tuning's device path (its loop's data needs polars, which a lent GPU machine lacks, so
    the steps are made here from the same functions): fp32 on CUDA follows the CPU, bf16 within
    bf16's precision, and a step makes the host wait for the GPU once (its read)."""
    checkpoint = setup[0]
    cpu = _fine_tuning_steps(checkpoint, torch.device("cpu"), "auto")
    fp32 = _fine_tuning_steps(checkpoint, torch.device("cuda"), "fp32")
    waits: list = []
    bf16 = _fine_tuning_steps(checkpoint, torch.device("cuda"), "auto", waits=waits)
    assert cpu[-1] < cpu[0]  # it learns: the positives are the on-topic passages
    torch.testing.assert_close(torch.tensor(fp32), torch.tensor(cpu), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(torch.tensor(bf16), torch.tensor(cpu), rtol=5e-2, atol=5e-2)
    assert [len(w) for w in waits] == [1] * 5, waits


def test_ddp_hands_the_bi_encoder_the_pinned_host_inputs_on_cuda(setup, tmp_path):
    """Several GPUs fine-tune through DDP (training.data_parallel). Given device_ids, DDP
    copied each micro-batch's inputs to the GPU itself, a blocking copy: the host waited for the
    GPU's queued work every micro-batch, what pinning and encode_batch's non_blocking copy are
    for. The bi-encoder must get the pinned host tensors, and the loss be the one without DDP.
    A one-process NCCL group: DDP treats the inputs alike at any number of processes."""
    import torch.distributed as dist

    from retrieval_pretraining.encode import tokenize
    from retrieval_pretraining.finetune.model import load_bi_encoder, micro_batch_loss
    from retrieval_pretraining.finetune.settings import FinetuneSettings
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    device = torch.device("cuda", 0)
    settings = FinetuneSettings(retrieval=RetrievalSettings(q_len=16, p_len=24), group_size=2)
    model, tokenizer = load_bi_encoder(setup[0], settings.retrieval, device)
    model.eval()  # no dropout: the two losses below are one
    queries, passages = ({k: v.pin_memory() for k, v in part.items()}
                         for part in (tokenize(tokenizer, QUERIES, 16),
                                      tokenize(tokenizer, PASSAGES, 24)))
    plain = micro_batch_loss(model, queries, passages, settings, device)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.extend(
        (t.device.type, t.is_pinned()) for part in args for t in part.values()))
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'group'}", rank=0,
                            world_size=1, device_id=device)
    try:
        # The loop's env says several processes; the group holds this one.
        ddp = training.data_parallel(model, training.DistEnv(rank=0, local_rank=0, world_size=2,
                                                             device=device))
        assert ddp is not model
        loss = micro_batch_loss(ddp, queries, passages, settings, device)
        loss.backward()
    finally:
        dist.destroy_process_group()
    assert seen and set(seen) == {("cpu", True)}, seen
    torch.testing.assert_close(loss.detach(), plain.detach())


def test_encoding_that_runs_out_of_gpu_memory_halves_its_batches_on_cuda(setup, caplog):
    """A real CUDA out-of-memory error (the process held to ~0.3 GB) halves the batch until it
    fits; the vectors are those of batches that fit from the start (bf16: within its precision)."""
    from retrieval_pretraining import encode

    model, tokenizer = encode.load_encoder(setup[0], torch.device("cuda"))
    texts = [f"passage {i} about " + "cells and proteins " * 40 for i in range(32_768)]
    options = dict(max_len=64, pooling="mean", similarity="cosine")
    fitting = encode.embed(model, tokenizer, texts, batch_size=512, **options)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(
        (torch.cuda.memory_allocated() + 300 * 2**20) / total)
    try:
        with caplog.at_level("WARNING", logger="retrieval_pretraining.encode"):
            halved = encode.embed(model, tokenizer, texts, batch_size=32_768, **options)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert any("out of GPU memory" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(torch.from_numpy(halved), torch.from_numpy(fitting),
                               rtol=2e-2, atol=2e-2)
