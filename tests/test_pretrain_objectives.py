"""Each pre-training loss against a plain-loop statement of its formula (values and gradients)."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from retrieval_pretraining import training
from retrieval_pretraining.pretrain import data as pdata
from retrieval_pretraining.pretrain import objectives as obj

torch.set_num_threads(1)


def _grads(fn, *tensors):
    leaves = [t.detach().clone().double().requires_grad_(True) for t in tensors]
    value = fn(*leaves)
    value.backward()
    return value.detach(), [leaf.grad for leaf in leaves]


def test_the_mlm_loss_is_the_mean_cross_entropy_over_the_predicted_positions():
    """-log softmax(logits)[label] averaged over the labels that are not -100 (a loop), equal to
    cross-entropy's own mean (the formula before its empty case was handled) within 1e-6, values
    and gradients, with every row given or only the predicted ones (masking.with_positions)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 30, generator=g, dtype=torch.float64)
    labels = torch.tensor([3, -100, 7, 7, -100, -100, 29, 0, -100])

    def loop(x):
        rows = [-x[i].log_softmax(-1)[labels[i]] for i in range(len(labels)) if labels[i] != -100]
        return torch.stack(rows).mean()

    def before(x):
        return torch.nn.functional.cross_entropy(x, labels, ignore_index=-100)

    got = _grads(lambda x: obj.mlm_loss(x, labels), logits)
    _assert_same(got, _grads(loop, logits))
    for want in (_grads(before, logits), _grads(before, logits.float())):
        torch.testing.assert_close(got[0], want[0].double(), rtol=0, atol=1e-6)
        torch.testing.assert_close(got[1][0], want[1][0].double(), rtol=0, atol=1e-6)
    positions = torch.nonzero(labels != -100).squeeze(1)
    selected = _grads(lambda x: obj.mlm_loss(x[positions], labels[positions]), logits)
    _assert_same(selected, got)


@pytest.mark.parametrize("rows", [0, 4])
def test_the_mlm_loss_of_nothing_to_predict_is_zero_with_zero_gradient(rows):
    """A micro-batch whose chunks predict nothing (whole words wider than the budget:
    ARCHITECTURE.md) gives no rows once the predicted ones are selected (0), or rows all labelled
    -100 (4). Both add 0 and no gradient; cross-entropy's own mean is 0 / 0, a NaN that stops
    training."""
    logits = torch.randn(rows, 30, dtype=torch.float64, requires_grad=True)
    labels = torch.full((rows,), -100)
    loss = obj.mlm_loss(logits, labels)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_span_means_equal_slice_means():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 12, 5, generator=g, dtype=torch.float64)
    start = torch.tensor([[1, 4, 2], [3, 1, 1], [5, 9, 2]])
    end = torch.tensor([[2, 10, 3], [11, 11, 4], [6, 11, 7]])
    got = obj.span_means(hidden, start, end)
    for b in range(3):
        for s in range(3):
            expected = hidden[b, start[b, s]:end[b, s]].mean(dim=0)
            torch.testing.assert_close(got[b, s], expected)


def naive_costa(text, spans, mask, tau):
    """COSTA Eq. 8 written out: for text i, -1/|S(i)| sum_p log(e^{z_i.z_p/tau} / sum_{j != i} e^{z_i.z_j/tau}),
    j over every text and every real span of the batch; averaged over texts."""
    n, s, _ = spans.shape
    reps = [text[i] for i in range(n)]
    owners = [("text", i) for i in range(n)]
    for i in range(n):
        for p in range(s):
            if mask[i, p]:
                reps.append(spans[i, p])
                owners.append(("span", i))
    total, texts = 0.0, 0
    for i in range(n):
        denominator = sum(torch.exp(text[i] @ r / tau) for r, o in zip(reps, owners) if o != ("text", i))
        positives = [r for r, o in zip(reps, owners) if o == ("span", i)]
        if positives:  # a text without spans has no term (Eq. 8 averages over the others)
            total = total - sum(torch.log(torch.exp(text[i] @ r / tau) / denominator) for r in positives) / len(positives)
            texts += 1
    return total / texts


@pytest.mark.parametrize("tau, mask", [
    (0.1, [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]),
    (1.0, [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]),
    (0.1, [[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]),  # the middle text has no span
])  # fmt: skip
def test_costa_loss_matches_eq8_loop(tau, mask):
    g = torch.Generator().manual_seed(1)
    text = torch.randn(3, 4, generator=g) * 0.5
    spans = torch.randn(3, 4, 4, generator=g) * 0.5
    mask = torch.tensor(mask, dtype=torch.bool)
    got, got_grads = _grads(lambda t, s: obj.costa_loss(t, s, mask, temperature=tau), text, spans)
    want, want_grads = _grads(lambda t, s: naive_costa(t, s, mask, tau), text, spans)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # Padded span slots receive no gradient: they are not representations.
    assert got_grads[1][~mask].abs().sum() == 0


def test_costa_loss_without_any_span_is_zero_with_finite_gradients():
    # A lone text without spans has no candidate at all (a row of NaN): weighted out, it must
    # leave the loss 0 and every gradient 0, not NaN.
    for n in (1, 3):
        text = torch.randn(n, 4, requires_grad=True)
        spans = torch.randn(n, 2, 4, requires_grad=True)
        loss = obj.costa_loss(text, spans, torch.zeros(n, 2, dtype=torch.bool), temperature=0.1)
        loss.backward()
        assert loss.item() == 0.0
        assert text.grad.abs().sum() == 0 and spans.grad.abs().sum() == 0


def test_pairwise_js_matches_scipy():
    rng = np.random.default_rng(0)
    q = rng.random((5, 7))
    q /= q.sum(axis=1, keepdims=True)
    got = obj.pairwise_js(torch.tensor(q)).numpy()
    # Computed two rows at a time (the blocks bound its memory) it gives the same values.
    blocked = obj.pairwise_js(torch.tensor(q, requires_grad=True), rows=2)
    np.testing.assert_allclose(blocked.detach().numpy(), got, atol=1e-14)
    for a in range(5):
        for b in range(5):
            # scipy returns the JS *distance* (square root of the divergence), natural log by default.
            assert got[a, b] == pytest.approx(jensenshannon(q[a], q[b]) ** 2, abs=1e-12)


@pytest.mark.parametrize("rows", [1, 2, None])
def test_pairwise_js_gradients_match_the_formula_through_autograd(rows):
    # The JS term's hand-written backward (blocks of `rows`, log M made again) against autograd
    # through the plain formula, per pair, for both sets; weights make every pair's gradient count.
    g = torch.Generator().manual_seed(21)
    q = torch.rand(5, 7, generator=g, dtype=torch.float64)
    k = torch.rand(3, 7, generator=g, dtype=torch.float64)
    q, k = q / q.sum(1, keepdim=True), k / k.sum(1, keepdim=True)
    weights = torch.randn(5, 3, generator=g, dtype=torch.float64)

    def formula(q, k):
        return sum(weights[a, b] * ((q[a] * (q[a] / ((q[a] + k[b]) / 2)).log()).sum()
                                    + (k[b] * (k[b] / ((q[a] + k[b]) / 2)).log()).sum()) / 2
                   for a in range(5) for b in range(3))

    want, want_grads = _grads(formula, q, k)
    got, got_grads = _grads(lambda q, k: (obj.pairwise_js(q, k, rows=rows) * weights).sum(), q, k)
    torch.testing.assert_close(got, want)
    for got_grad, want_grad in zip(got_grads, want_grads):
        torch.testing.assert_close(got_grad, want_grad)
    # One set against itself: both uses of q get their gradient.
    got, (got_grad,) = _grads(lambda q: obj.pairwise_js(q, rows=rows).sum(), q)
    want, (want_grad,) = _grads(lambda q: obj.pairwise_js(q, q.clone(), rows=rows).sum(), q)
    torch.testing.assert_close(got_grad, want_grad)


def test_pairwise_js_fp32_gradients_keep_their_digits_at_bert_s_vocabulary():
    # Over 30,522 words near-uniform distributions have JS ~0.02, and d JS / d q is a sum of
    # log-ratios ~0.3; formed as the difference of B x 5-sized sums (autograd through the
    # formula) fp32 lost ~2e-5 of it here, 30x what summing the log-ratios loses.
    g = torch.Generator().manual_seed(23)
    q = torch.rand(8, 30522, generator=g).softmax(1)
    k = torch.rand(16, 30522, generator=g).softmax(1)
    _, want = _grads(lambda q, k: obj.pairwise_js(q, k).sum(), q, k)  # in float64
    leaves = [q.clone().requires_grad_(True), k.clone().requires_grad_(True)]
    obj.pairwise_js(*leaves).sum().backward()
    for leaf, want_grad in zip(leaves, want):
        assert (leaf.grad.double() - want_grad).abs().max() < 3e-6


def test_pairwise_js_runs_in_fp32_under_bf16_autocast():
    g = torch.Generator().manual_seed(22)
    q = torch.softmax(torch.randn(6, 50, generator=g), dim=1).requires_grad_(True)
    want = obj.pairwise_js(q)
    (want_grad,) = torch.autograd.grad(want.sum(), q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = obj.pairwise_js(q)
        (got_grad,) = torch.autograd.grad(got.sum(), q)
    assert got.dtype == got_grad.dtype == torch.float32
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_views_info_nce_matches_loop():
    g = torch.Generator().manual_seed(2)
    sim = torch.randn(6, 6, generator=g)
    sim = (sim + sim.T) / 2
    tau, m = 0.5, 3
    want = 0.0
    for a in range(6):
        pos = (a + m) % 6
        denom = sum(math.exp(sim[a, b] / tau) for b in range(6) if b != a)
        want -= math.log(math.exp(sim[a, pos] / tau) / denom)
    assert obj.views_info_nce(sim, tau).item() == pytest.approx(want / 6, rel=1e-5)


def test_cpdae_contrastive_gradients_match_loop():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 9, generator=g)

    def loop(lg):
        p = torch.sigmoid(lg)
        q = p / p.sum(dim=1, keepdim=True)
        n = q.shape[0]
        sims = [[None] * n for _ in range(n)]
        for a in range(n):
            for b in range(n):
                mix = (q[a] + q[b]) / 2
                js = 0.5 * (q[a] * torch.log(q[a] / mix)).sum() + 0.5 * (q[b] * torch.log(q[b] / mix)).sum()
                sims[a][b] = -js
        total = 0.0
        for a in range(n):
            pos = (a + n // 2) % n
            denom = sum(torch.exp(sims[a][b]) for b in range(n) if b != a)
            total = total - torch.log(torch.exp(sims[a][pos]) / denom)
        return total / n

    got, (got_grad,) = _grads(lambda x: obj.cpdae_contrastive(x, 1.0), logits)
    want, (want_grad,) = _grads(loop, logits)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_reconstruction_is_multilabel_bce():
    logits = torch.tensor([[0.5, -1.0, 2.0], [0.0, 1.0, -3.0]])
    target = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    rows = [sum(-(y * math.log(sig(x)) + (1 - y) * math.log(1 - sig(x))) for x, y in zip(lr, tr))
            for lr, tr in zip(logits.tolist(), target.tolist())]
    assert obj.reconstruction_loss(logits, target, "sum").item() == pytest.approx(sum(rows) / 2, rel=1e-6)
    assert obj.reconstruction_loss(logits, target, "mean").item() == pytest.approx(sum(rows) / 6, rel=1e-6)


def test_bow_loss_is_uniform_cross_entropy_over_the_bag():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 10, generator=g)
    bags = [[1, 4, 7], [0, 9]]
    want = 0.0
    for row, bag in zip(logits, bags):
        z = sum(math.exp(v) for v in row.tolist())
        want += sum(-math.log(math.exp(row[t].item()) / z) for t in bag) / len(bag)
    ids = torch.tensor([[1, 4, 7], [0, 9, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    assert obj.bow_loss(logits, ids, mask).item() == pytest.approx(want / 2, rel=1e-6)


def test_bow_targets_are_the_input_ids_without_special_and_unused(tmp_path):
    from pretrain_fixtures import tokenizer

    tok = tokenizer()
    vocab = pdata.Vocab.from_tokenizer(tok)
    ids = tok("the cat sat on the the mat")["input_ids"]
    ids = ids[:-1] + [tok.convert_tokens_to_ids("[unused5]"), tok.mask_token_id, tok.unk_token_id] + ids[-1:]
    want = {i for i in ids if tok.convert_ids_to_tokens(i) not in
            {"[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"} and not tok.convert_ids_to_tokens(i).startswith("[unused")}
    assert set(pdata.bag_of_ids(np.array(ids), vocab).tolist()) == want
    assert len(want) == 5  # the, cat, sat, on, mat
    target = obj.multi_hot(torch.tensor([sorted(want)]), torch.ones(1, 5, dtype=torch.bool), vocab.size)
    assert target.sum() == 5 and all(target[0, i] == 1 for i in want)


def test_random_replacements_are_the_tokenizers_own_ids(tmp_path):
    """Masking's random ids are the ids the tokenizer has, less the excluded ones: in a
    vocabulary with a gap (an id below the highest that names no token) the gap is none, and
    the highest id is one (not range(len(vocabulary)), which would hold the gap and miss it)."""
    from pretrain_fixtures import tokenizer
    from transformers import AutoTokenizer

    tokenizer().save_pretrained(tmp_path)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    words = spec["model"]["vocab"]
    gap = next(token for token, i in words.items() if i == 2000)
    del words[gap]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    ids = set(tok.get_vocab().values())
    assert 2000 not in ids and max(ids) == 30521 and len(ids) == 30521
    vocab = pdata.Vocab.from_tokenizer(tok)
    assert 2000 not in vocab.replacements and 30521 in vocab.replacements
    assert set(vocab.replacements.tolist()) == ids - set(vocab.excluded.tolist())
    assert vocab.size == 30522  # every id is below it


@pytest.mark.parametrize("as_tensor", [False, True])
def test_cosine_weight_endpoints_and_midpoint(as_tensor):
    """Float progress, and the float64 tensor the trainer passes (its own arithmetic path)."""
    def weight(progress):
        if as_tensor:
            progress = torch.tensor(progress, dtype=torch.float64)
        return float(obj.cosine_weight(progress, 1.0, 0.1))

    assert weight(0.0) == pytest.approx(1.0)
    assert weight(0.25) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert weight(0.5) == pytest.approx(0.55)
    assert weight(1.0) == pytest.approx(0.1)
    assert weight(1.5) == pytest.approx(0.1)  # past the end: held at the end value


VOCAB = pdata.Vocab(size=1000, mask_id=103, pad_id=0, excluded=np.array([0, 100, 101, 102, 103]))


def test_token_masking_rate_and_80_10_10():
    ids = np.arange(200, 330)  # [CLS] + 128 tokens + [SEP] stand-ins
    ids[0], ids[-1] = 101, 102
    counts = {"mask": 0, "random": 0, "kept": 0}
    for seed in range(300):
        masked, labels = pdata.mask_tokens(ids, np.arange(1, 129), np.random.default_rng(seed), VOCAB, 0.15, False)
        chosen = np.flatnonzero(labels != -100)
        assert len(chosen) == round(0.15 * 130)  # of all 130 tokens, as BERT counts them
        assert labels[0] == -100 and labels[-1] == -100
        assert (labels[chosen] == ids[chosen]).all()
        untouched = np.setdiff1d(np.arange(len(ids)), chosen)
        assert (masked[untouched] == ids[untouched]).all()
        _tally_replacements(counts, masked, ids, chosen)
    _assert_80_10_10(counts)


def _tally_replacements(counts, masked, ids, chosen):
    """What the selected tokens became: [MASK] (id 103), a random id, or themselves."""
    counts["mask"] += (masked[chosen] == 103).sum()
    counts["kept"] += (masked[chosen] == ids[chosen]).sum()
    counts["random"] += ((masked[chosen] != 103) & (masked[chosen] != ids[chosen])).sum()


def _assert_80_10_10(counts):
    total = sum(counts.values())
    assert counts["mask"] / total == pytest.approx(0.8, abs=0.02)
    assert counts["random"] / total == pytest.approx(0.1, abs=0.02)
    assert counts["kept"] / total == pytest.approx(0.1, abs=0.02)


def test_whole_word_masking_masks_whole_words():
    ids = np.arange(500, 542)
    ids[0], ids[-1] = 101, 102
    word_starts = np.array([1, 2, 5, 6, 9, 13, 14, 20, 22, 25, 30, 31, 35, 38])
    ends = list(word_starts[1:]) + [len(ids) - 1]
    for seed in range(50):
        _, labels = pdata.mask_tokens(ids, word_starts, np.random.default_rng(seed), VOCAB, 0.3, True)
        selected = labels != -100
        assert 0 < selected.sum() <= round(0.3 * 42)
        for s, e in zip(word_starts, ends):
            assert selected[s:e].all() or not selected[s:e].any(), f"word [{s},{e}) partly masked"


def test_token_masking_selects_pieces_not_words():
    """whole_word=False selects single pieces whatever the word starts say: exactly the budget
    (20 of 130 tokens) though every word has 3 pieces (whole words would stop at 18), and words
    end up partly masked. (Every test above gives one-piece words, or whole_word=True, where the
    two paths agree.)"""
    ids = np.arange(200, 330)
    ids[0], ids[-1] = 101, 102
    starts = np.arange(1, 129, 3)
    ends = np.append(starts[1:], len(ids) - 1)
    partly = 0
    for seed in range(50):
        _, labels = pdata.mask_tokens(ids, starts, np.random.default_rng(seed), VOCAB, 0.15, False)
        selected = labels != -100
        assert selected.sum() == 20, seed
        partly += sum(0 < selected[s:e].sum() < e - s for s, e in zip(starts, ends))
    assert partly > 100


def _actions(masked, ids, positions):
    """What each selected position became: 0 [MASK] (id 103), 1 a random id, 2 itself."""
    kept = masked[positions] == ids[positions]
    return np.where(masked[positions] == 103, 0, np.where(kept, 2, 1))


def test_token_masking_restated_over_100k_positions():
    """BERT's masking (Google's create_pretraining_data.py) restated over ~115,000 selected
    positions with fixed seeds: every inner position equally likely to be selected and [CLS] /
    [SEP] never; [MASK] 80%, a random id 10%, kept 10%, each share within 0.004 (~4.5 standard
    deviations); the random ids spread over every allowed id alike and never an excluded one. A
    random id equal to the original (1 in 995 here) counts as kept, so the random share is
    0.1 x 994/995."""
    ids = np.arange(200, 712)  # [CLS] + 510 tokens + [SEP] stand-ins
    ids[0], ids[-1] = 101, 102
    draws = 1500
    selected = np.zeros(len(ids))
    actions = np.zeros(3)
    replaced = np.zeros(VOCAB.size)
    for seed in range(draws):
        masked, labels = pdata.mask_tokens(ids, np.arange(1, 511), np.random.default_rng(seed),
                                           VOCAB, 0.15, False)
        chosen = np.flatnonzero(labels != -100)
        assert len(chosen) == 77 and (labels[chosen] == ids[chosen]).all()
        selected[chosen] += 1
        act = _actions(masked, ids, chosen)
        actions += np.bincount(act, minlength=3)
        np.add.at(replaced, masked[chosen[act == 1]], 1)
    total = actions.sum()
    assert total == draws * 77
    assert abs(actions[0] / total - 0.8) < 0.004
    assert abs(actions[1] / total - 0.1 * 994 / 995) < 0.004
    assert abs(actions[2] / total - (0.1 + 0.1 / 995)) < 0.004
    # Each inner position: Binomial(1500, 77/510), mean 226.5, sd 13.9; within 5 sd.
    assert selected[0] == selected[-1] == 0
    expected = draws * 77 / 510
    assert np.abs(selected[1:-1] - expected).max() < 5 * math.sqrt(expected * (1 - 77 / 510))
    # ~11,500 random ids over the 995 allowed: ~11.6 each; none excluded, (almost) all drawn.
    assert replaced[VOCAB.excluded].sum() == 0
    allowed = replaced[np.setdiff1d(np.arange(1000), [0, 100, 101, 102, 103])]  # not .replacements
    assert (allowed > 0).mean() > 0.99 and allowed.max() < 40


def test_whole_word_masking_draws_80_10_10_per_piece_and_every_word_alike():
    """As Google's BERT and transformers' DataCollatorForWholeWordMask: whole words are selected,
    each word of a chunk alike (the first and the last too), and what a selected piece becomes is
    drawn per piece, not per word: the three pieces of a word all took the same action with
    probability 0.8^3 + 0.1^3 + 0.1^3 = 0.514 (per word it would be 1)."""
    ids = np.arange(200, 712)
    ids[0], ids[-1] = 101, 102
    starts = np.arange(1, 511, 3)  # 170 words of 3 pieces; budget 77 -> 25 words
    draws = 2000
    picked = np.zeros(len(starts))
    alike = words = 0
    actions = np.zeros(3)
    for seed in range(draws):
        masked, labels = pdata.mask_tokens(ids, starts, np.random.default_rng(seed), VOCAB,
                                           0.15, True)
        chosen = np.flatnonzero(labels != -100)
        assert len(chosen) == 75  # 25 whole words: a 26th would pass 77
        act = _actions(masked, ids, chosen).reshape(-1, 3)  # chosen is sorted: a word a row
        assert ((chosen.reshape(-1, 3) - chosen.reshape(-1, 3)[:, :1]) == [0, 1, 2]).all()
        picked[np.searchsorted(starts, chosen[::3])] += 1
        alike += int((act == act[:, :1]).all(axis=1).sum())
        words += len(act)
        actions += np.bincount(act.ravel(), minlength=3)
    assert abs(alike / words - 0.514) < 0.015
    total = actions.sum()
    assert abs(actions[0] / total - 0.8) < 0.004 and abs(actions[1] / total - 0.1) < 0.004
    # Each word: Binomial(2000, 25/170), mean 294, sd 15.8; within 5 sd.
    expected = draws * 25 / 170
    assert np.abs(picked - expected).max() < 5 * math.sqrt(expected * (1 - 25 / 170))


def test_random_replacements_are_never_excluded_ids():
    # 40 of the 50 ids are excluded: drawing from the whole vocabulary would hit them ~80% of the time.
    vocab = pdata.Vocab(size=50, mask_id=3, pad_id=0, excluded=np.arange(40))
    ids = np.array([1, *np.random.default_rng(0).integers(40, 50, size=60), 2])
    replaced = 0
    for seed in range(100):
        masked, labels = pdata.mask_tokens(ids, np.arange(1, 61), np.random.default_rng(seed), vocab, 0.15, False)
        chosen = masked[labels != -100]
        assert np.isin(chosen[chosen != vocab.mask_id], np.arange(40, 50)).all()
        replaced += int((chosen != vocab.mask_id).sum())
    assert replaced > 0


def test_multi_hot_sets_only_the_real_ids_whatever_the_pad_id():
    # Padded with id 5, which is also a real member of row 0 and absent from row 1.
    ids = torch.tensor([[5, 7, 5, 5], [1, 2, 5, 5]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    target = obj.multi_hot(ids, mask, 9)
    assert target[0].nonzero().flatten().tolist() == [5, 7]
    assert target[1].nonzero().flatten().tolist() == [1, 2]


# ---------------------------------------------------------------- gradients vs naive references ---
def _assert_same(got, want):
    (got_value, got_grads), (want_value, want_grads) = got, want
    torch.testing.assert_close(got_value, want_value)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


def _naive_info_nce(sim, n, tau):
    """-log(e^{sim(a, a+m)/tau} / sum_{b != a} e^{sim(a, b)/tau}) averaged over the n = 2m views a."""
    total = 0.0
    for a in range(n):
        denominator = sum(torch.exp(sim(a, b) / tau) for b in range(n) if b != a)
        total = total - torch.log(torch.exp(sim(a, (a + n // 2) % n) / tau) / denominator)
    return total / n


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_reconstruction_gradients_match_loop(reduction):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 7, generator=g) * 2
    target = (torch.rand(3, 7, generator=g) < 0.4).double()

    def loop(x):
        total = 0.0
        for b in range(x.shape[0]):
            for v in range(x.shape[1]):
                p = 1 / (1 + torch.exp(-x[b, v]))
                total = total - (target[b, v] * torch.log(p) + (1 - target[b, v]) * torch.log(1 - p)) / (
                    x.shape[1] if reduction == "mean" else 1)
        return total / x.shape[0]

    _assert_same(_grads(lambda x: obj.reconstruction_loss(x, target, reduction), logits), _grads(loop, logits))


def test_views_info_nce_gradients_match_loop():
    g = torch.Generator().manual_seed(6)
    sim = torch.randn(6, 6, generator=g)
    want = _grads(lambda s: _naive_info_nce(lambda a, b: s[a, b], 6, 0.5), sim)
    _assert_same(_grads(lambda s: obj.views_info_nce(s, 0.5), sim), want)


def test_dense_contrastive_matches_cosine_loop():
    g = torch.Generator().manual_seed(7)
    cls = torch.randn(6, 5, generator=g)  # 2 views x 3 texts

    def loop(x):
        cosine = lambda a, b: (x[a] @ x[b]) / (x[a].norm() * x[b].norm())  # noqa: E731
        return _naive_info_nce(cosine, 6, 0.1)

    _assert_same(_grads(lambda x: obj.dense_contrastive(x, 0.1), cls), _grads(loop, cls))


def _naive_bow(logits_of, bags, n_vocab):
    """mean over texts of mean over the bag of -log softmax(logits)[id], logits_of(b, v) a scalar."""
    total = 0.0
    for b, bag in enumerate(bags):
        logits = [logits_of(b, v) for v in range(n_vocab)]
        log_z = torch.log(sum(torch.exp(x) for x in logits))
        total = total + sum(log_z - logits[t] for t in bag) / len(bag)
    return total / len(bags)


BAGS = [[1, 4, 7], [0, 9]]
BAG_IDS = torch.tensor([[1, 4, 7], [0, 9, 0]])
BAG_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_bow_summed_over_the_bag_matches_a_loop():
    """The paper recipe's literal reading: -sum over the input's unique ids of log softmax(h_CLS .
    E^T)[id], averaged over texts; gradients reach [CLS] and the word embeddings."""
    g = torch.Generator().manual_seed(9)
    cls, emb = torch.randn(2, 4, generator=g), torch.randn(10, 4, generator=g)

    def loop(c, e):
        total = 0.0
        for b, bag in enumerate(BAGS):
            logits = [sum(c[b, d] * e[v, d] for d in range(4)) for v in range(10)]
            log_z = torch.log(sum(torch.exp(x) for x in logits))
            total = total + sum(log_z - logits[t] for t in bag)  # no 1/|bag|
        return total / len(BAGS)

    got = _grads(lambda c, e: obj.bow_loss(c @ e.T, BAG_IDS, BAG_MASK, "sum"), cls, emb)
    _assert_same(got, _grads(loop, cls, emb))
    with pytest.raises(ValueError, match="reduction"):
        obj.bow_loss(cls @ emb.T, BAG_IDS, BAG_MASK, "max")


def test_bow_recipes_expand_and_a_model_entry_still_overrides():
    from retrieval_pretraining.pretrain.settings import resolve_model

    section = {"checkpoint": "c", "corpus": "wikipedia", "trainer": {}, "mlm": {"mask_rate": 0.15, "whole_word": False},
               "bow": {"recipe": "code", "weight": 1.0, "weight_end": 0.1}, "models": [
                   {"name": "code", "objective": "bow"},
                   {"name": "paper", "objective": "bow", "bow": {"recipe": "paper"}},
                   {"name": "paper-30", "objective": "bow", "bow": {"recipe": "paper"},
                    "mlm": {"mask_rate": 0.3}},
                   {"name": "mlm", "objective": "mlm"}]}

    def knobs(name):
        s = resolve_model(section, name, seed=0)
        return (s["bow"]["form"], s["bow"]["reduction"], s["bow"]["weight_schedule"],
                s["mlm"]["mask_rate"], s["mlm"]["whole_word"]) if "bow" in s else s["mlm"]

    assert knobs("code") == ("code", "mean", "cosine", 0.3, True)
    assert knobs("paper") == ("paper", "sum", "constant", 0.15, False)
    assert knobs("paper-30") == ("paper", "sum", "constant", 0.3, False)
    assert knobs("mlm") == {"mask_rate": 0.15, "whole_word": False}  # other objectives: untouched


def test_bow_paper_form_gradients_match_loop():
    """Paper form: logits = h_CLS . E^T; gradients reach both [CLS] and the word embeddings."""
    g = torch.Generator().manual_seed(8)
    cls, emb = torch.randn(2, 4, generator=g), torch.randn(10, 4, generator=g)
    got = _grads(lambda c, e: obj.bow_loss(c @ e.T, BAG_IDS, BAG_MASK), cls, emb)
    want = _grads(lambda c, e: _naive_bow(lambda b, v: sum(c[b, d] * e[v, d] for d in range(4)), BAGS, 10),
                  cls, emb)
    _assert_same(got, want)


def test_bow_code_form_gradients_match_loop():
    """Code form: the whole MLM head (dense, GELU, LayerNorm, tied decoder + bias) on [CLS]."""
    from transformers import BertConfig

    from retrieval_pretraining.pretrain.model import MLMHead

    config = BertConfig(vocab_size=10, hidden_size=4, layer_norm_eps=1e-12)
    g = torch.Generator().manual_seed(9)
    embedding = torch.nn.Embedding(10, 4).double()
    head = MLMHead(config, embedding).double()
    with torch.no_grad():
        embedding.weight.normal_(generator=g)
        head.bias.normal_(generator=g)
        head.transform.LayerNorm.weight.normal_(generator=g)
    cls = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    loss = obj.bow_loss(head(cls), BAG_IDS, BAG_MASK)
    loss.backward()
    got = (loss.detach(), [cls.grad, embedding.weight.grad])  # the tied decoder gets its gradient
    w, bw = head.transform.dense.weight.detach(), head.transform.dense.bias.detach()
    gamma, beta = head.transform.LayerNorm.weight.detach(), head.transform.LayerNorm.bias.detach()
    bias = head.bias.detach()

    def loop(c, e):
        def hidden(b):
            x = [sum(w[i, d] * c[b, d] for d in range(4)) + bw[i] for i in range(4)]
            x = [v * 0.5 * (1 + torch.erf(v / math.sqrt(2))) for v in x]  # exact GELU
            mean = sum(x) / 4
            var = sum((v - mean) ** 2 for v in x) / 4
            return [(v - mean) / torch.sqrt(var + 1e-12) * gamma[i] + beta[i] for i, v in enumerate(x)]

        rows = [hidden(b) for b in range(2)]
        return _naive_bow(lambda b, v: sum(rows[b][d] * e[v, d] for d in range(4)) + bias[v], BAGS, 10)

    _assert_same(got, _grads(loop, cls, embedding.weight))


# ---------------------------------------------------------------- fp32 logits, gathered pools ----
def test_similarity_logits_stay_fp32_under_bf16_autocast():
    """Under CPU bf16 autocast the COSTA and CPDAE_R losses equal their fp32 values: the similarity
    products run in fp32 (a bf16 product moves logits at tau = 0.1 by tenths)."""
    g = torch.Generator().manual_seed(11)
    text, spans = torch.randn(4, 32, generator=g), torch.randn(4, 5, 32, generator=g)
    mask = torch.ones(4, 5, dtype=torch.bool)
    cls = torch.randn(8, 32, generator=g)
    want = (obj.costa_loss(text, spans, mask, temperature=0.1), obj.dense_contrastive(cls, 0.1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = (obj.costa_loss(text, spans, mask, temperature=0.1), obj.dense_contrastive(cls, 0.1))
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        assert a.item() == pytest.approx(b.item(), rel=1e-5)
    assert obj.fp32_scores(text.bfloat16(), text.bfloat16()).dtype == torch.float32


def test_views_info_nce_over_a_larger_pool_matches_loop():
    """Anchors = one process's views inside a gathered pool of 2M: the positive of pool row c is
    row (c + M) mod 2M, and the candidates are the 2M - 1 other rows."""
    g = torch.Generator().manual_seed(12)
    pool = torch.randn(8, 8, generator=g)  # 2M = 8 views: M = 4 texts
    rows = torch.tensor([2, 3, 6, 7])      # this process holds texts 2, 3 (both views)
    tau, want = 0.5, 0.0
    for a, c in enumerate(rows.tolist()):
        denominator = sum(math.exp(pool[c, b] / tau) for b in range(8) if b != c)
        want -= math.log(math.exp(pool[c, (c + 4) % 8] / tau) / denominator)
    got = obj.views_info_nce(pool[rows], tau, rows)
    assert got.item() == pytest.approx(want / 4, rel=1e-6)


def test_pairwise_js_between_two_sets_matches_scipy():
    rng = np.random.default_rng(13)
    q, k = rng.random((3, 6)), rng.random((5, 6))
    q /= q.sum(axis=1, keepdims=True)
    k /= k.sum(axis=1, keepdims=True)
    got = obj.pairwise_js(torch.tensor(q), torch.tensor(k)).numpy()
    for a in range(3):
        for b in range(5):
            assert got[a, b] == pytest.approx(jensenshannon(q[a], k[b]) ** 2, abs=1e-12)


def test_contrast_pool_sizes_are_reported():
    stats = {}
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    obj.costa_loss(torch.randn(2, 4), torch.randn(2, 3, 4), mask, temperature=0.1, stats=stats)
    assert stats["contrast_pool"] == 2 + 3 - 1  # the other text and the 3 real spans
    obj.cpdae_contrastive(torch.randn(6, 9), 1.0, stats=stats)
    assert stats["contrast_pool"] == 5
    obj.dense_contrastive(torch.randn(10, 4), 0.1, stats=stats)
    assert stats["contrast_pool"] == 9


def _views_gather_worker(rank, world, init_file, inputs, out_dir, route):
    import contextlib

    import torch.distributed as dist
    from safetensors.torch import save_file

    from pretrain_fixtures import gather_backward_as_on_nccl

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    m = inputs["logits"].shape[0] // 2 // world  # texts per rank
    outputs = {}
    for name, fn in (("cpdae", lambda x: obj.cpdae_contrastive(x, 1.0, gather=True)),
                     ("cpdae_r", lambda x: obj.dense_contrastive(x, 0.1, gather=True))):
        full = inputs["logits"] if name == "cpdae" else inputs["cls"]
        half = full.shape[0] // 2
        # This rank's texts, both views, stacked [view 0; view 1] as the trainer lays them out.
        local = torch.cat([full[rank * m:(rank + 1) * m], full[half + rank * m:half + (rank + 1) * m]])
        local = local.clone().requires_grad_(True)
        with (gather_backward_as_on_nccl() if route == "nccl" else contextlib.nullcontext([])) \
                as calls:
            loss = fn(local)
            loss.backward()
        outputs[f"{name}.loss"] = loss.detach().reshape(1)
        outputs[f"{name}.grad"] = local.grad
        outputs[f"{name}.reduce_scatters"] = torch.tensor([len(calls)])
    save_file(outputs, f"{out_dir}/rank{rank}.safetensors")
    # Leave gloo together and end as the trainer does (no interpreter clean-up: after gloo it
    # aborts now and then, "terminate called without an active exception").
    training.teardown_distributed()
    training.exit_process(0)


@pytest.mark.parametrize("route", ["gloo", "nccl"])
def test_gathered_cpdae_views_equal_the_full_batch(route, tmp_path):
    """2 processes with 2 texts each and gathering on reproduce the 4-text batch's loss and (after
    DDP's averaging) its gradient, for CPDAE (-JS) and CPDAE_R (cosine); the gradient taken back
    through the gather by gloo's route and by the one it takes on GPUs (NCCL's reduce_scatter,
    run here under gloo)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(14)
    inputs = {"logits": torch.randn(8, 9, generator=g, dtype=torch.float64),
              "cls": torch.randn(8, 5, generator=g, dtype=torch.float64)}
    torch.multiprocessing.spawn(_views_gather_worker,
                                args=(2, tmp_path / "init", inputs, tmp_path, route), nprocs=2)
    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    for name in ("cpdae", "cpdae_r"):  # each view half gathered once: 2 reduce-scatters a rank
        assert [int(r[f"{name}.reduce_scatters"]) for r in ranks] == [2 * (route == "nccl")] * 2
    for name, fn in (("cpdae", lambda x: obj.cpdae_contrastive(x, 1.0)),
                     ("cpdae_r", lambda x: obj.dense_contrastive(x, 0.1))):
        full = (inputs["logits"] if name == "cpdae" else inputs["cls"]).clone().requires_grad_(True)
        loss = fn(full)
        loss.backward()
        mean = sum(r[f"{name}.loss"].item() for r in ranks) / 2
        assert mean == pytest.approx(loss.item(), rel=1e-12)
        # Rank r holds rows [2r, 2r + 2) of view 0 and [4 + 2r, 4 + 2r + 2) of view 1.
        grads = [r[f"{name}.grad"] / 2 for r in ranks]  # DDP averages over the 2 ranks
        torch.testing.assert_close(torch.cat([grads[0][:2], grads[1][:2]]), full.grad[:4])
        torch.testing.assert_close(torch.cat([grads[0][2:], grads[1][2:]]), full.grad[4:])


def _words(seed: int, n_inner: int) -> np.ndarray:
    """Word starts of a chunk of `n_inner` tokens, most words one token long (as in text)."""
    widths = np.random.default_rng(seed).choice([1, 1, 1, 2, 3], size=n_inner)
    starts = 1 + np.concatenate([[0], np.cumsum(widths)[:-1]])
    return starts[starts <= n_inner]


def test_whole_word_masking_selects_the_budget_never_specials_and_80_10_10():
    """Per sequence exactly round(rate * tokens) selected, in whole words; [CLS] and the final
    [SEP] never predicted (though counted in the tokens, as BERT counts them); [MASK] / random /
    kept 80/10/10 as in the token path."""
    ids = np.arange(200, 330)  # [CLS] + 128 tokens + [SEP] stand-ins
    ids[0], ids[-1] = 101, 102
    counts = {"mask": 0, "random": 0, "kept": 0}
    for seed in range(300):
        word_starts = _words(seed, 128)
        masked, labels = pdata.mask_tokens(ids, word_starts, np.random.default_rng(seed), VOCAB,
                                           0.15, True)
        chosen = np.flatnonzero(labels != -100)
        assert len(chosen) == round(0.15 * 130), seed
        assert labels[0] == -100 and labels[-1] == -100 and masked[-1] == 102 and masked[0] == 101
        ends = np.append(word_starts[1:], len(ids) - 1)
        selected = labels != -100
        assert all(selected[s:e].all() or not selected[s:e].any()
                   for s, e in zip(word_starts, ends))
        _tally_replacements(counts, masked, ids, chosen)
    _assert_80_10_10(counts)


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize(("n_inner", "rate", "budget"), [(10, 0.15, 2), (20, 0.13, 3)])
def test_the_masking_budget_rounds_to_nearest_not_down(whole_word, n_inner, rate, budget):
    """round(rate * tokens), [CLS] and [SEP] counted: 0.15 * 12 = 1.8 -> 2 and 0.13 * 22 = 2.86
    -> 3 (truncating would give 1 and 2). Every word one token: whole words fill it exactly."""
    ids = np.arange(200, 202 + n_inner)
    ids[0], ids[-1] = 101, 102
    for seed in range(20):
        _, labels = pdata.mask_tokens(ids, np.arange(1, n_inner + 1),
                                      np.random.default_rng(seed), VOCAB, rate, whole_word)
        assert (labels != -100).sum() == budget, seed


@pytest.mark.parametrize("whole_word", [False, True])
def test_a_short_text_still_masks_one_token(whole_word):
    """The budget is floored at 1, as the docstring says: 5 tokens at 0.05 round to 0 (0.25),
    and a chunk that predicts nothing would add no MLM signal."""
    ids = np.array([101, 200, 201, 202, 102])
    for seed in range(20):
        _, labels = pdata.mask_tokens(ids, np.arange(1, 4), np.random.default_rng(seed), VOCAB,
                                      0.05, whole_word)
        assert (labels != -100).sum() == 1, seed


@pytest.mark.parametrize(("rate", "budget"), [(0.15, 77), (0.3, 154)])
def test_a_512_token_chunk_masks_what_bert_masks(rate, budget):
    """The budget counts [CLS] and [SEP], as Google's BERT (create_pretraining_data.py:
    round(len(tokens) x masked_lm_prob)) and transformers' DataCollatorForWholeWordMask
    (round(len(input_tokens) x mlm_probability)) do: 512 tokens at 15% predict 77 pieces (76.8),
    at 30% 154 (153.6), not the 76 and 153 of the 510 inner tokens. Whole words never exceed it."""
    ids = np.arange(200, 712)
    ids[0], ids[-1] = 101, 102
    for seed in range(10):
        _, labels = pdata.mask_tokens(ids, np.arange(1, 511), np.random.default_rng(seed), VOCAB,
                                      rate, False)
        assert (labels != -100).sum() == budget, seed
        _, labels = pdata.mask_tokens(ids, _words(seed, 510), np.random.default_rng(seed), VOCAB,
                                      rate, True)
        assert 0 < (labels != -100).sum() <= budget, seed


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("rate", [0.9, 1.0])
def test_a_high_rate_on_a_tiny_chunk_masks_at_most_its_inner_tokens(whole_word, rate):
    """7 tokens at 0.9 round to 6 (6.3), at 1.0 to 7: more than the 5 inner tokens there are to
    select. The budget stops at them (the references stop when their candidates run out), so
    sampling without replacement is never asked for more than it has."""
    ids = np.array([101, 200, 201, 202, 203, 204, 102])
    for seed in range(20):
        _, labels = pdata.mask_tokens(ids, np.array([1, 2, 4]), np.random.default_rng(seed),
                                      VOCAB, rate, whole_word)
        selected = np.flatnonzero(labels != -100)
        assert selected.tolist() == [1, 2, 3, 4, 5], seed


def test_a_word_wider_than_the_whole_word_budget_is_skipped_as_in_bert():
    """As Google's BERT (create_pretraining_data.py, do_whole_word_mask) and transformers'
    DataCollatorForWholeWordMask: a word whose pieces would overflow the budget is skipped, neither
    cut nor forced in (ARCHITECTURE.md). One 3-piece word at budget 1 (5 tokens: round(0.75))
    masks nothing; beside a 1-piece word (budget round(0.9) = 1), that word is masked whichever
    of the two the random order tries first."""
    ids = np.array([101, 200, 201, 202, 102])
    for seed in range(20):
        masked, labels = pdata.mask_tokens(ids, np.array([1]), np.random.default_rng(seed), VOCAB,
                                           0.15, True)
        assert (labels == -100).all() and (masked == ids).all(), seed
    ids = np.array([101, 200, 201, 202, 203, 102])  # words [1, 4) and [4, 5)
    for seed in range(20):
        _, labels = pdata.mask_tokens(ids, np.array([1, 4]), np.random.default_rng(seed), VOCAB,
                                      0.15, True)
        assert np.flatnonzero(labels != -100).tolist() == [4], seed


def test_an_inner_unk_can_be_masked_but_is_never_a_bag_target_or_replacement():
    """As Google's BERT: [UNK] inside a text is a token like any other to mask and predict; it is
    excluded (with the other special ids) from the bag and from random replacements."""
    from pretrain_fixtures import tokenizer

    tok = tokenizer()
    vocab = pdata.Vocab.from_tokenizer(tok)
    ids = np.array([tok.cls_token_id] + [tok.unk_token_id] * 20 + [tok.sep_token_id])
    _, labels = pdata.mask_tokens(ids, np.arange(1, 21), np.random.default_rng(0), vocab, 0.15,
                                  False)
    assert (labels == tok.unk_token_id).sum() == 3
    assert tok.unk_token_id not in pdata.bag_of_ids(ids, vocab)
    assert tok.unk_token_id not in vocab.replacements
