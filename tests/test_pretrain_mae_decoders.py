"""The BoW paper's auto-encoding (AE) and auto-regressive (AR) decoder baselines against
plain-loop statements: each example alone, no padding and no attention mask (the AR decoder's
position t computed from the prefix 0..t only, its GPT-2 block written out by hand), then the
batched code; and the masked copy the AE decoder reads."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pretrain_fixtures as fx
from retrieval_pretraining.pretrain import data as pdata
from retrieval_pretraining.pretrain import store as pstore
from retrieval_pretraining.pretrain import mae_decoders, probes
from retrieval_pretraining.pretrain.model import Pretrainer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return fx.tiny_checkpoint(tmp_path_factory.mktemp("mae") / "checkpoint", initializer_range=0.5)


def _batch() -> dict:
    """Two chunks (the second padded), the encoder's and the AE copy's masks set by hand."""
    original = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102],
                             [101, 2019, 3231, 2003, 2986, 102, 0, 0]])
    attention = (original != 0).long()

    def masked(where):
        ids, labels = original.clone(), torch.full_like(original, -100)
        for b, positions in enumerate(where):
            labels[b, positions], ids[b, positions] = original[b, positions], 103
        return ids, labels

    inputs, labels = masked([[2, 5], [3]])
    copy, copy_labels = masked([[1, 3, 4], [2, 4]])
    return {"input_ids": inputs, "attention_mask": attention, "labels": labels, "original_ids": original,
            "decoder_input_ids": copy, "decoder_labels": copy_labels}


def _ce(model, hidden, label):
    return F.cross_entropy(model.mlm_head(hidden).unsqueeze(0), torch.as_tensor(label).view(1))


def _encoder_terms(model, batch, b, n):
    """(last-layer states of example b alone, its MLM cross-entropy terms)."""
    last = model.encoder(input_ids=batch["input_ids"][b:b + 1, :n]).last_hidden_state[0]
    return last, [_ce(model, last[t], batch["labels"][b, t]) for t in range(n) if batch["labels"][b, t] != -100]


def _check(out, want):
    assert out.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(out[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_auto_encoding_decoder_matches_the_per_example_loop(checkpoint):
    """AE: the decoder reads [CLS; embedded tokens 1..n of the masked copy] of each example
    alone (bidirectional, no mask needed), predicts the copy's masked tokens; loss = encoder
    MLM mean + weight x decoder mean over the masked tokens of the batch."""
    settings = fx.model_settings("ae_decoder")
    settings["ae_decoder"]["weight"] = 0.7
    model = Pretrainer(checkpoint, settings).eval()
    batch = _batch()
    with torch.no_grad():
        out = model(batch)
        dec_terms, mlm_terms = [], []
        for b in range(2):
            n = int(batch["attention_mask"][b].sum())
            last, terms = _encoder_terms(model, batch, b, n)
            mlm_terms += terms
            embedded = model.encoder.embeddings(input_ids=batch["decoder_input_ids"][b:b + 1, :n])[0]
            hidden = torch.cat([last[:1], embedded[1:]]).unsqueeze(0)
            for layer in model.ae_decoder.layers:
                hidden = layer(hidden, hidden, torch.ones(1, 1, 1, n, dtype=torch.bool))
            dec_terms += [_ce(model, hidden[0, t], batch["decoder_labels"][b, t])
                          for t in range(n) if batch["decoder_labels"][b, t] != -100]
        assert len(dec_terms) == 5
        dec, mlm = torch.stack(dec_terms).mean(), torch.stack(mlm_terms).mean()
    _check(out, {"loss_mlm": mlm, "loss_dec": dec, "loss": mlm + 0.7 * dec})


def _gpt2_block(layer, x):
    """A GPT-2 block on x [T, D] with no mask: every position attends to all of x (the caller
    passes a prefix). ln_1 -> self-attention -> residual; ln_2 -> GELU MLP -> residual."""
    heads = layer.heads
    a = layer.attention_norm(x)
    split = lambda t: t.view(len(x), heads, -1).transpose(0, 1)  # noqa: E731
    q, k, v = split(layer.query(a)), split(layer.key(a)), split(layer.value(a))
    weights = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)
    h = x + layer.attention_out((weights @ v).transpose(0, 1).reshape(len(x), -1))
    return h + layer.output(F.gelu(layer.intermediate(layer.output_norm(h))))


def test_auto_regressive_decoder_matches_the_per_prefix_loop(checkpoint):
    """AR: position t of example b sees only [CLS; tokens 1..t] of the unmasked chunk and
    predicts token t + 1 ([SEP] last); loss = encoder MLM mean + weight x the mean next-token
    cross-entropy over the batch's n - 1 predictions per example."""
    settings = fx.model_settings("ar_decoder")
    settings["ar_decoder"]["weight"] = 0.6
    model = Pretrainer(checkpoint, settings).eval()
    batch = _batch()
    embeddings = model.encoder.embeddings
    with torch.no_grad():
        out = model(batch)
        dec_terms, mlm_terms = [], []
        for b in range(2):
            n = int(batch["attention_mask"][b].sum())
            ids = batch["original_ids"][b, :n]
            last, terms = _encoder_terms(model, batch, b, n)
            mlm_terms += terms
            inputs = torch.cat([last[:1], embeddings(input_ids=ids.unsqueeze(0))[0, 1:]])
            for t in range(n - 1):
                hidden = inputs[:t + 1]
                for layer in model.ar_decoder.layers:
                    hidden = _gpt2_block(layer, hidden)
                dec_terms.append(_ce(model, model.ar_decoder.norm(hidden[-1]), ids[t + 1]))
        assert len(dec_terms) == 7 + 5
        dec, mlm = torch.stack(dec_terms).mean(), torch.stack(mlm_terms).mean()
    _check(out, {"loss_mlm": mlm, "loss_dec": dec, "loss": mlm + 0.6 * dec})


def test_next_token_labels_shift_by_one_and_ignore_padding():
    ids = torch.tensor([[101, 5, 6, 102], [101, 7, 102, 0]])
    got = mae_decoders.next_token_labels(ids, (ids != 0).long())
    assert got.tolist() == [[5, 6, 102, -100], [7, 102, -100, -100]]


def test_the_auto_encoding_copy_is_masked_on_its_own_draw(tmp_path):
    chunks, _ = fx.build_corpus(tmp_path / "corpus", docs=12)
    store = pstore.prepare_store(chunks, None, tmp_path / "store")
    vocab = pdata.Vocab.from_tokenizer(fx.tokenizer())
    data = pdata.MicroBatches(store, vocab=vocab, seed=3, global_batch_size=4, micro_batch_size=4,
                              rank=0, world_size=1, mask_rate=0.3, whole_word=False, copy_mask_rate=0.5)
    rows = data.rows_for(0, 0)
    batch = data.collate(rows, epoch=0)
    copy, labels = batch["decoder_input_ids"], batch["decoder_labels"]
    assert copy.shape == batch["input_ids"].shape
    for b, row in enumerate(rows):
        chunk = data.store.get("input_ids", row)
        n = len(chunk)
        restored = torch.where(labels[b, :n] == -100, copy[b, :n], labels[b, :n])
        assert restored.tolist() == chunk.tolist()
        assert (labels[b, n:] == -100).all() and labels[b, 0] == -100 and labels[b, n - 1] == -100
        assert int((labels[b] != -100).sum()) == round(0.5 * n)  # [CLS], [SEP] counted as BERT
    assert not torch.equal(labels != -100, batch["labels"] != -100)  # not the encoder's mask
    assert torch.equal(data.collate(rows, epoch=0)["decoder_input_ids"], copy)  # deterministic
    assert np.isclose(data.copy_mask_rate, 0.5)
    # At the encoder's own rate too: another draw, not the encoder's mask at another rate.
    same_rate = pdata.MicroBatches(store, vocab=vocab, seed=3, global_batch_size=4,
                                   micro_batch_size=4, rank=0, world_size=1, mask_rate=0.3,
                                   whole_word=False, copy_mask_rate=0.3).collate(rows, epoch=0)
    assert not torch.equal(same_rate["decoder_labels"] != -100, same_rate["labels"] != -100)


@pytest.mark.parametrize("objective", mae_decoders.OBJECTIVES)
def test_probes_of_the_decoders(checkpoint, objective):
    """Accuracy in [0, 1], the held-out loss is the decoder's loss term, and [CLS] reliance is 0
    when every text is the same chunk (swapping [CLS] changes nothing)."""
    model = Pretrainer(checkpoint, fx.model_settings(objective))
    batch = _batch()
    got = probes.probe(model, batch)
    assert 0.0 <= got["probe_decoder_accuracy"] <= 1.0
    with torch.no_grad():
        want = model.eval()(batch)["loss_dec"]
    assert got["loss_dec_heldout"] == pytest.approx(float(want), rel=1e-4)
    same = {k: v[:1].repeat(len(v), 1) for k, v in batch.items()}
    assert probes.probe(model, same)["probe_cls_reliance"] == pytest.approx(0.0, abs=1e-6)
    assert abs(got["probe_cls_reliance"]) > 1e-6  # different texts: another [CLS] changes it
