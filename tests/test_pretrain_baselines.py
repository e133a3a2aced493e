"""The baselines the BoW paper compares with (Condenser, coCondenser, enhanced decoding) against
plain-loop statements of their equations: each example (each decoder row) computed alone, without
padding or attention masks, then the batched code; and the inputs they cut from a chunk."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pretrain_fixtures as fx
from retrieval_pretraining.pretrain import baselines, probes, views
from retrieval_pretraining.pretrain import data as pdata
from retrieval_pretraining.pretrain import store as pstore
from retrieval_pretraining.pretrain.model import Pretrainer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return fx.tiny_checkpoint(tmp_path_factory.mktemp("baselines") / "checkpoint", initializer_range=0.5)


def _grads(fn, x):
    leaf = x.detach().clone().double().requires_grad_(True)
    value = fn(leaf)
    value.backward()
    return value.detach(), leaf.grad


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_span_pair_contrastive_matches_the_loop(tau):
    """coCondenser: for segment a, -log(exp(h_a.h_a'/tau) / sum_{b != a} exp(h_a.h_b/tau)), a' the
    other segment of its chunk, b over every segment of the batch; mean over segments."""
    g = torch.Generator().manual_seed(0)
    cls = torch.randn(6, 5, generator=g)  # [segment 0 of 3 chunks; segment 1 of them]

    def loop(h):
        total = 0.0
        for a in range(6):
            partner = (a + 3) % 6
            denominator = sum(torch.exp(h[a] @ h[b] / tau) for b in range(6) if b != a)
            total = total - torch.log(torch.exp(h[a] @ h[partner] / tau) / denominator)
        return total / 6

    stats = {}
    got, got_grad = _grads(lambda h: baselines.span_pair_contrastive(h, tau, stats=stats), cls)
    want, want_grad = _grads(loop, cls)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)
    assert stats == {"contrast_pool": 5.0}


def _batch(views_: int = 1) -> dict:
    """Two chunks (the second padded), masked by hand; with views_=2, two 'segments' each."""
    original = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102],
                             [101, 2019, 3231, 2003, 2986, 102, 0, 0]])
    attention = (original != 0).long()
    inputs, labels = [], []
    masked_at = [[[2, 5], [1, 4]], [[3], [2]]]  # per view, per text
    for view in range(views_):
        for text, where in enumerate(masked_at[view]):
            ids, label = original[text].clone(), torch.full_like(original[text], -100)
            label[where], ids[where] = original[text, where], 103
            inputs.append(ids)
            labels.append(label)
    batch = {"input_ids": torch.stack(inputs), "attention_mask": attention.repeat(views_, 1),
             "labels": torch.stack(labels), "original_ids": original}
    rng = np.random.default_rng(0)
    visible = torch.zeros(2, 8, 8, dtype=torch.bool)
    visible[:, :, 0] = True
    targets = original.masked_fill(attention == 0, -100)
    for b, n in enumerate(attention.sum(1).tolist()):
        visible[b, :n, :n] = torch.from_numpy(views.decoder_visibility(n, np.array([1, 2, 3]), rng, 0.5, False))
        targets[b, [0, n - 1]] = -100
    return batch | {"decoder_visible": visible, "decoder_labels": targets}


def _ce(model, hidden, label):
    return F.cross_entropy(model.mlm_head(hidden).unsqueeze(0), label.view(1))


@pytest.mark.parametrize("objective", ["condenser", "cocondenser"])
def test_condenser_losses_match_the_per_example_loop(checkpoint, objective):
    """Condenser: head input = [last-layer CLS; early-layer tokens 1..n] of each example alone (no
    padding); the head's and the backbone's MLM cross-entropies, each a mean over the batch's
    masked tokens, summed; coCondenser adds lambda x the span-pair loss on last-layer [CLS]
    (lambda and temperature off their defaults of 1: a forward that dropped either would pass)."""
    settings = fx.model_settings(objective)
    if objective == "cocondenser":
        settings["cocondenser"] |= {"lambda": 0.3, "temperature": 0.5}
    model = Pretrainer(checkpoint, settings).eval()
    assert model.early_layer == 1  # half of the tiny checkpoint's 2 layers
    batch = _batch(2 if objective == "cocondenser" else 1)
    with torch.no_grad():
        out = model(batch)
        head_terms, mlm_terms, cls = [], [], []
        for b in range(len(batch["input_ids"])):
            n = int(batch["attention_mask"][b].sum())
            states = model.encoder(input_ids=batch["input_ids"][b:b + 1, :n],
                                   output_hidden_states=True).hidden_states
            last, early = states[-1][0], states[1][0]
            cls.append(last[0])
            head = torch.cat([last[:1], early[1:]]).unsqueeze(0)
            for layer in model.condenser.layers:
                head = layer(head, head, torch.ones(1, 1, 1, n, dtype=torch.bool))
            for t in range(n):
                label = batch["labels"][b, t]
                if label != -100:
                    head_terms.append(_ce(model, head[0, t], label))
                    mlm_terms.append(_ce(model, last[t], label))
        head_mlm, mlm = torch.stack(head_terms).mean(), torch.stack(mlm_terms).mean()
        want = {"loss_head_mlm": head_mlm, "loss_mlm": mlm, "loss": head_mlm + mlm}
        if objective == "cocondenser":
            opts = settings["cocondenser"]
            co = baselines.span_pair_contrastive(torch.stack(cls), opts["temperature"])
            want |= {"loss_co": co, "loss": head_mlm + mlm + opts["lambda"] * co,
                     "contrast_pool": torch.tensor(3.0)}
    assert out.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(out[key].float(), value.float(), rtol=1e-4, atol=1e-5, msg=key)


def test_enhanced_decoding_matches_the_per_row_loop(checkpoint):
    """RetroMAE's enhanced decoding: row i's query is [CLS] + p_i; it attends to the sentence
    embedding and to the embedded tokens j its row may see (never i itself); it predicts token i;
    the decoder loss is the mean over every inner token, added to the encoder's MLM loss."""
    model = Pretrainer(checkpoint, fx.model_settings("retromae")).eval()
    batch = _batch()
    embeddings = model.encoder.embeddings
    with torch.no_grad():
        out = model(batch)
        terms, mlm_terms = [], []
        for b in range(2):
            n = int(batch["attention_mask"][b].sum())
            last = model.encoder(input_ids=batch["input_ids"][b:b + 1, :n]).last_hidden_state[0]
            cls = last[0]
            embedded = embeddings(input_ids=batch["original_ids"][b:b + 1, :n])[0]
            for t in range(n):
                if batch["labels"][b, t] != -100:
                    mlm_terms.append(_ce(model, last[t], batch["labels"][b, t]))
            for i in range(1, n - 1):
                seen = [j for j in range(n) if batch["decoder_visible"][b, i, j]]
                assert 0 in seen and i not in seen
                context = torch.stack([cls if j == 0 else embedded[j] for j in seen]).unsqueeze(0)
                query = (cls + embeddings.position_embeddings.weight[i]).view(1, 1, -1)
                row = model.enhanced_decoder.layer(query, context, torch.ones(1, 1, 1, len(seen), dtype=torch.bool))
                terms.append(_ce(model, row[0, 0], batch["original_ids"][b, i]))
        dec, mlm = torch.stack(terms).mean(), torch.stack(mlm_terms).mean()
    want = {"loss_mlm": mlm, "loss_dec": dec, "loss": mlm + dec}
    assert out.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(out[key], value, rtol=1e-4, atol=1e-5, msg=key)


def _layer_norm(x, norm):
    centred = x - x.mean()
    return centred / torch.sqrt((centred ** 2).mean() + norm.eps) * norm.weight + norm.bias


def _bert_layer_row(layer, x, context):
    """One BERT layer's output for the query row x [D] attending to the rows of `context` [K, D]
    (the ones it may see): per head softmax(q . k / sqrt(d_head)) over them, the heads' values
    joined and projected, then LayerNorm(x + that); LayerNorm(h + W2 GELU(W1 h)) on top. The
    residual is the query stream's (RetroMAE: [CLS] + position), never the context's."""
    heads = layer.heads
    q = layer.query(x).view(heads, -1)
    k = layer.key(context).view(len(context), heads, -1)
    v = layer.value(context).view(len(context), heads, -1)
    joined = torch.cat([torch.softmax(k[:, h] @ q[h] / q.shape[1] ** 0.5, dim=0) @ v[:, h]
                        for h in range(heads)])
    h = _layer_norm(x + layer.attention_out(joined), layer.attention_norm)
    return _layer_norm(h + layer.output(F.gelu(layer.intermediate(h))), layer.output_norm)


def test_a_head_layer_is_the_bert_layer_written_out_row_by_row():
    """The layer of Condenser's head, the enhanced decoder and the AE decoder (heads.Layer, BERT's
    post-LayerNorm layer with the query and key/value streams apart) against a per-row statement,
    every weight random (LayerNorms too, so the two norms cannot stand in for each other); the
    loops of the objectives' tests call the layer itself, so only this one checks its inside."""
    from types import SimpleNamespace

    from retrieval_pretraining.pretrain.heads import Layer

    config = SimpleNamespace(hidden_size=8, num_attention_heads=2, intermediate_size=12,
                             layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, initializer_range=0.5)
    torch.manual_seed(0)
    layer = Layer(config).double().eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5 + (parameter == 1) * 1.0)
    query, context = torch.randn(2, 4, 8).double(), torch.randn(2, 5, 8).double()
    visible = torch.rand(2, 4, 5) < 0.5
    visible[:, :, 0] = True  # every row sees something
    with torch.no_grad():
        got = layer(query, context, visible.unsqueeze(1))
        for b in range(2):
            for i in range(4):
                want = _bert_layer_row(layer, query[b, i], context[b, visible[b, i]])
                torch.testing.assert_close(got[b, i], want, msg=f"row {b}, {i}")


def test_heads_start_as_their_authors_initialise_them(checkpoint):
    """BERT's init (the backbone's `_init_weights`, which Condenser's, RetroMAE's and the AE
    decoder's code apply): weights normal(0, initializer_range), zero biases, unit LayerNorms;
    the AR decoder's GPT-2 blocks draw each sublayer's output projection with std
    initializer_range / sqrt(2 x layers) (GPT-2's scheme, as the BoW authors' code)."""
    std = 0.5  # the fixture's initializer_range
    for objective, attribute in [("condenser", "condenser"), ("retromae", "enhanced_decoder"),
                                 ("ae_decoder", "ae_decoder"), ("ar_decoder", "ar_decoder")]:
        settings = fx.model_settings(objective)
        if objective == "ar_decoder":
            settings["ar_decoder"]["layers"] = 2
        head = getattr(Pretrainer(checkpoint, settings), attribute)
        for name, module in head.named_modules():
            if isinstance(module, torch.nn.Linear):
                scaled = (objective == "ar_decoder"
                          and name.split(".")[-1] in ("attention_out", "output"))
                want = std / 2 if scaled else std  # sqrt(2 x 2 layers) = 2
                got = float(module.weight.detach().std())
                assert abs(got - want) < 0.15 * want, (objective, name, got, want)
                assert not module.bias.any(), (objective, name)
            elif isinstance(module, torch.nn.LayerNorm):
                assert (module.weight == 1).all() and not module.bias.any(), (objective, name)


@pytest.mark.parametrize("objective", ["mlm", "bow", "condenser", "cocondenser", "retromae",
                                       "ae_decoder"])
def test_a_micro_batch_that_predicts_nothing_adds_a_zero_mlm_term(checkpoint, objective):
    """Whole-word masking can leave every chunk of a micro-batch unmasked (ARCHITECTURE.md: a word
    wider than the budget). Its MLM terms (the encoder's, Condenser's head's, the AE decoder's
    copy masked the same way) are then 0 with no gradient, the rest of the step as it was, as the
    trainer gets it (masking.with_positions: no predicted row to select)."""
    batch = _batch(2 if objective == "cocondenser" else 1)
    batch["labels"] = torch.full_like(batch["labels"], -100)
    if objective == "ae_decoder":
        batch |= {"decoder_input_ids": batch["input_ids"], "decoder_labels": batch["labels"]}
    if objective == "bow":  # the real ids as the bag: only that the step stays finite matters
        batch |= {"bag_ids": batch["original_ids"], "bag_mask": batch["attention_mask"].bool()}
    batch = pdata.with_positions(batch)
    assert len(batch["label_positions"]) == 0
    model = Pretrainer(checkpoint, fx.model_settings(objective))
    out = model(batch)
    zero = {"loss_mlm", "loss_head_mlm"} | ({"loss_dec"} if objective == "ae_decoder" else set())
    for key in zero & out.keys():
        assert out[key].item() == 0.0, key
    assert all(torch.isfinite(value).all() for value in out.values())
    out["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    if objective in ("mlm", "condenser"):  # nothing else in the loss: no gradient anywhere
        assert all(not g.any() for g in grads)


def test_early_layer_is_half_the_depth_unless_set_and_must_exist():
    assert baselines.early_layer(None, 12) == 6 and baselines.early_layer(None, 1) == 0
    assert baselines.early_layer(3, 12) == 3
    with pytest.raises(baselines.HeadError, match="condenser.early_layer 12: the checkpoint has 12 layers"):
        baselines.early_layer(12, 12)


def test_enhanced_decoding_refuses_a_position_table_not_indexed_from_zero(tmp_path, checkpoint):
    """The decoder's query for token i adds row i of the position table: right for BERT (accepted),
    wrong for RoBERTa (positions from padding_idx + 1, row 1 the zero padding row) and impossible
    for an encoder without a table; both refused when the heads are added, naming why."""
    from types import SimpleNamespace

    from transformers import RobertaConfig, RobertaModel

    accepted = Pretrainer(checkpoint, fx.model_settings("retromae"))
    assert accepted.encoder.embeddings.position_embeddings.padding_idx is None
    torch.manual_seed(0)
    roberta = tmp_path / "roberta"
    RobertaModel(RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64, pad_token_id=1,
                               max_position_embeddings=34)).save_pretrained(roberta)
    with pytest.raises(baselines.HeadError) as refused:
        Pretrainer(roberta, fx.model_settings("retromae"))
    message = str(refused.value)
    for part in (f"checkpoint {roberta}", "objective retromae", "padding_idx + 1 = 2",
                 "row 1 is the padding row"):
        assert part in message
    Pretrainer(roberta, fx.model_settings("mlm"))  # the other objectives read no position rows
    tableless = SimpleNamespace(embeddings=SimpleNamespace(), config=SimpleNamespace())
    assert "no absolute position embedding table" in baselines.position_table_problem(tableless)


def test_segment_pairs_are_disjoint_random_halves_of_the_chunk():
    ids = np.arange(100, 141)  # [CLS]=100 ... [SEP]=140: 39 inner tokens
    starts = np.arange(1, 40, 2)
    seen = set()
    for seed in range(40):
        pair = views.segment_pair(ids, starts, np.random.default_rng(seed), span_tokens=12)
        spans = []
        for segment, ws in pair:
            assert len(segment) == 14 and segment[0] == 100 and segment[-1] == 140
            body = segment[1:-1]
            assert np.array_equal(body, np.arange(body[0], body[0] + 12))  # contiguous
            assert ws[0] == 1 and set(ws[1:] + body[0] - 1) <= set(starts + 100)
            # Exactly: [1] (the edge), then the chunk's word starts inside it, once each, in order.
            s0 = body[0] - 100
            assert ws.tolist() == [1] + [s - s0 + 1 for s in starts if s0 < s < s0 + 12]
            spans.append(set(body.tolist()))
        assert not spans[0] & spans[1]
        seen.add(min(pair[0][0][1], pair[1][0][1]) < pair[0][0][1])  # which comes first varies
    assert seen == {True, False}
    halves = views.segment_pair(ids, starts, np.random.default_rng(0), span_tokens=None)
    assert [len(s) - 2 for s, _ in halves] == [19, 19]
    assert views.segment_length(39, 100) == 19


def test_segment_pairs_split_the_free_tokens_into_any_three_gaps():
    """10 inner tokens, segments of 4: 2 free tokens go before, between and after the segments,
    every split alike ((a, b) sorted from two uniform draws of 0..2: 6 splits), so either segment
    may start right after [CLS] or end right before [SEP]."""
    ids = np.arange(100, 112)  # [CLS]=100, inner 101..110, [SEP]=111
    starts = np.arange(1, 11)
    seen = set()
    for seed in range(300):
        pair = views.segment_pair(ids, starts, np.random.default_rng(seed), span_tokens=4)
        first, second = sorted(int(segment[1]) - 100 for segment, _ in pair)
        seen.add((first - 1, second - first - 4, 10 - (second + 3)))  # before, between, after
    assert seen == {(0, 0, 2), (0, 1, 1), (0, 2, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0)}


def test_a_chunk_of_one_inner_token_gives_itself_twice():
    """Fewer than 2 inner tokens make no two disjoint segments: both views are the chunk."""
    ids, starts = np.array([100, 7, 101]), np.array([1])
    pair = views.segment_pair(ids, starts, np.random.default_rng(0), span_tokens=None)
    assert [s.tolist() for s, _ in pair] == [[100, 7, 101]] * 2
    assert [w.tolist() for _, w in pair] == [[1], [1]]


def test_each_decoder_row_draws_its_own_hidden_tokens_without_whole_words():
    """Per row, not once for all rows: two rows' hidden sets (their own tokens aside) differ."""
    length = 102
    visible = views.decoder_visibility(length, np.arange(1, 101), np.random.default_rng(1), 0.3,
                                       whole_word=False)
    hidden = ~visible[1:-1, 1:-1]
    hidden[np.eye(len(hidden), dtype=bool)] = False
    assert len({row.tobytes() for row in hidden}) == len(hidden)


def test_decoder_rows_never_see_themselves_always_see_cls_and_hide_the_rate():
    length = 202
    starts = np.concatenate([[1], np.arange(3, 201, 3)])
    visible = views.decoder_visibility(length, starts, np.random.default_rng(1), 0.5, whole_word=True)
    inner = np.arange(1, length - 1)
    assert visible[:, 0].all() and visible[:, -1].all()
    assert not visible[inner, inner].any()
    hidden = ~visible[1:-1, 1:-1]
    assert 0.47 < hidden.mean() < 0.53
    # Whole words: the tokens of one word are hidden alike (apart from the row's own token).
    rows = np.arange(len(hidden))
    word = hidden[:, 2:4].copy()  # tokens 3, 4 (one word: starts at 3, next at 6)
    word[rows == 2, 0] = word[rows == 2, 1]
    word[rows == 3, 1] = word[rows == 3, 0]
    assert (word[:, 0] == word[:, 1]).all()
    again = views.decoder_visibility(length, starts, np.random.default_rng(1), 0.5, whole_word=True)
    assert np.array_equal(visible, again)


@pytest.mark.parametrize("whole_word", [False, True])
def test_decoder_rows_hide_the_rate_of_inner_tokens_whole_words_or_not(whole_word):
    """A rate other than 0.5: hiding with probability 1 - rate would pass a 0.5 check."""
    length = 202
    starts = np.concatenate([[1], np.arange(3, 201, 3)])
    visible = views.decoder_visibility(length, starts, np.random.default_rng(1), 0.3,
                                       whole_word=whole_word)
    hidden = ~visible[1:-1, 1:-1]
    off_diagonal = ~np.eye(len(hidden), dtype=bool)  # a row's own token is hidden whatever
    assert 0.27 <= hidden[off_diagonal].mean() <= 0.33


def test_collated_segments_and_decoder_inputs(tmp_path):
    chunks, _ = fx.build_corpus(tmp_path / "corpus", docs=12)
    store = pstore.prepare_store(chunks, None, tmp_path / "store")
    vocab = pdata.Vocab.from_tokenizer(fx.tokenizer())
    common = dict(vocab=vocab, seed=3, global_batch_size=4, micro_batch_size=4, rank=0, world_size=1,
                  mask_rate=0.3, whole_word=True)
    pairs = pdata.MicroBatches(store, segment_pairs=True, span_tokens=10, **common)
    rows = pairs.rows_for(0, 0)
    batch = pairs.collate(rows, epoch=0)
    assert batch["input_ids"].shape[0] == 8 and batch["attention_mask"][:, :12].all()
    restored = torch.where(batch["labels"] == -100, batch["input_ids"], batch["labels"])
    for v in range(2):
        for k, row in enumerate(rows):
            chunk = pairs.store.get("input_ids", row).tolist()
            body = restored[v * 4 + k, 1:11].tolist()
            assert any(chunk[s:s + 10] == body for s in range(1, len(chunk) - 10))
    for k in range(len(rows)):  # view 1 is the chunk's other segment, not view 0's again
        assert restored[k, 1:11].tolist() != restored[4 + k, 1:11].tolist(), k
    assert torch.equal(pairs.collate(rows, epoch=0)["input_ids"], batch["input_ids"])  # deterministic
    decoder = pdata.MicroBatches(store, need_original=True, decoder_mask_rate=0.5, **common)
    batch = decoder.collate(rows, epoch=0)
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < batch["attention_mask"].shape[1]  # some row has padding rows
    for b, n in enumerate(lengths.tolist()):
        labels = batch["decoder_labels"][b]
        assert labels[0] == -100 and labels[n - 1] == -100 and (labels[n:] == -100).all()
        assert torch.equal(labels[1:n - 1], batch["original_ids"][b, 1:n - 1])
        # Padding rows see [CLS] only (an empty softmax row would be NaN); real rows see it too.
        visible = batch["decoder_visible"][b]
        assert (visible[n:, 1:] == 0).all() and visible[:, 0].all()
        assert not batch["decoder_visible"][b, :, n:].any()


@pytest.mark.parametrize("objective", ["condenser", "cocondenser", "retromae"])
def test_probes_of_the_baselines(checkpoint, objective):
    """Scores in [0, 1]; [CLS] reliance is 0 when every text is the same chunk (swapping [CLS]
    changes nothing) and the held-out losses are the heads' cross-entropies."""
    model = Pretrainer(checkpoint, fx.model_settings(objective))
    batch = _batch(2 if objective == "cocondenser" else 1)
    got = probes.probe(model, batch)
    head = "probe_decoder_accuracy" if objective == "retromae" else "probe_head_mlm_accuracy"
    assert 0.0 <= got[head] <= 1.0 and got["probe_cls_reliance"] == got["probe_cls_reliance"]
    if objective == "cocondenser":
        assert 0.0 <= got["probe_view_agreement"] <= 1.0
    same = {k: (v[:1].repeat(len(v), *[1] * (v.dim() - 1)) if k != "attention_mask" else
                v[:1].repeat(len(v), 1)) for k, v in batch.items()}
    assert probes.probe(model, same)["probe_cls_reliance"] == pytest.approx(0.0, abs=1e-6)
    # Different texts: another text's [CLS] changes what the head predicts.
    assert abs(got["probe_cls_reliance"]) > 1e-6
    # The held-out loss is the training loss's head term on the same batch, dropout off.
    with torch.no_grad():
        trained = model.eval()(batch)
    term, heldout = (("loss_dec", "loss_dec_heldout") if objective == "retromae"
                     else ("loss_head_mlm", "loss_head_mlm_heldout"))
    assert got[heldout] == pytest.approx(float(trained[term]), rel=1e-4)


def test_the_workflow_plans_the_baselines_with_an_overlay(tmp_path):
    """`snakemake -n --configfile config.yaml tests/configs/baselines.yaml` plans a pre-training job
    per baseline with its resolved settings, and their fine-tuning and scoring downstream."""
    from test_finetune_rules import planned_jobs, stage_config
    from workflow_harness import ROOT, copy_project

    project = copy_project(tmp_path / "project")
    overlay = ROOT / "tests" / "configs" / "baselines.yaml"
    jobs = planned_jobs(project, "results/tables.md", "--configfile", "config.yaml", str(overlay))
    planned = {j["wildcards"]["model"]: stage_config(j["args"]) for j in jobs if j["rule"] == "pretrain_model"}
    assert {"condenser", "cocondenser", "retromae"} <= planned.keys()
    assert planned["cocondenser"]["objective"] == "cocondenser"
    assert {"condenser", "cocondenser"} <= planned["cocondenser"].keys()
    assert planned["retromae"]["mlm"] == {"mask_rate": 0.3, "whole_word": True}
    assert planned["retromae"]["retromae"]["decoder_mask_rate"] == 0.5
    scored = {j["wildcards"].get("system", "") for j in jobs if j["rule"] == "score_run"}
    for model in ("condenser", "cocondenser", "retromae"):
        assert any(system.startswith(f"{model}-") for system in scored), (model, sorted(scored))


def test_cocondenser_warm_starts_from_a_trained_condenser_through_init(tmp_path):
    """The coCondenser authors start from a trained Condenser (backbone and head): an entry
    `{objective: cocondenser, init: condenser}` does it, the two objectives' heads being the same
    modules. Its first step starts from the Condenser's exported encoder and its trained head."""
    from safetensors.torch import load_file

    from retrieval_pretraining.pretrain.model import Pretrainer
    from retrieval_pretraining.pretrain.settings import check_entries, resolve_model
    from retrieval_pretraining.pretrain.train import train

    checkpoint, chunks, _ = fx.tiny_setup(tmp_path / "setup")
    out = tmp_path / "condenser"
    assert train(fx.model_settings("condenser", max_steps=3), chunks=chunks, spans=None,
                 checkpoint=checkpoint, encoder_out=out / "encoder",
                 metrics_out=out / "metrics.jsonl", plot_out=out / "loss.png",
                 state_dir=out / "state") == 0
    import yaml

    demo = yaml.safe_load((fx.ROOT / "config.yaml").read_text())["pretrain"]
    section = demo | {"models": [{"name": "condenser", "objective": "condenser"},
                                 {"name": "cocondenser", "objective": "cocondenser",
                                  "init": "condenser"}]}
    check_entries(section, 0)  # a valid entry
    assert resolve_model(section, "cocondenser", 0)["init"] == "condenser"
    heads = load_file(out / "heads.safetensors")
    trained_head = {k: v for k, v in heads.items() if k.startswith("condenser.")}
    warm = Pretrainer(out / "encoder", fx.model_settings("cocondenser", max_steps=1),
                      init_heads=out / "heads.safetensors")
    cold = Pretrainer(checkpoint, fx.model_settings("cocondenser", max_steps=1))
    own = warm.state_dict()
    assert trained_head and all(torch.equal(own[k], v) for k, v in trained_head.items())
    assert any(not torch.equal(cold.state_dict()[k], v) for k, v in trained_head.items())
    exported = load_file(out / "encoder" / "model.safetensors")
    encoder = {k.removeprefix("encoder."): v for k, v in own.items() if k.startswith("encoder.")}
    assert all(torch.equal(encoder[k], v) for k, v in exported.items() if k in encoder)
    assert sum(k in encoder for k in exported) > 10
