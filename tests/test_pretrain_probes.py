"""The pre-training probes (pretrain/probes.py) against plain-loop statements of their definitions."""

import math

import pytest
import torch
import torch.nn.functional as F

import pretrain_fixtures as fx
from retrieval_pretraining.pretrain import probes
from retrieval_pretraining.pretrain.model import Pretrainer

torch.set_num_threads(1)


def test_top_set_precision_hand_example():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    bag_ids = torch.tensor([[0, 2, 0], [4, 0, 1]])
    bag_mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    # text 0: T = {0, 2}, top 2 = {0, 1} -> 1/2; text 1: T = {4, 0, 1}, top 3 = {4, 3, 2} -> 1/3
    assert probes.top_set_precision(logits, bag_ids, bag_mask) == pytest.approx((1 / 2 + 1 / 3) / 2)


def test_nearest_is_partner_hand_example():
    similarity = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.2, 0.1], [0.0, 0.1, 0.5]])
    assert probes.nearest_is_partner(similarity) == pytest.approx(2 / 3)  # row 1 picks text 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # Initialised wide (0.5): at BERT's 0.02 every text's [CLS] is nearly the same, so the views'
    # similarities tie to float noise and which one ranks first depends on the summation order.
    return fx.tiny_checkpoint(tmp_path_factory.mktemp("probes") / "checkpoint", initializer_range=0.5)


def _batch(views: int, seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    n, length = 4, 12
    original = torch.randint(1000, 3000, (n, length), generator=g)
    original[:, 0], original[:, -1] = 101, 102
    inputs, labels = [], []
    for view in range(views):
        masked = torch.rand(n, length, generator=g) < 0.3
        masked[:, 0] = masked[:, -1] = False
        inputs.append(original.masked_fill(masked, 103))
        labels.append(original.masked_fill(~masked, -100))
    bag = [sorted(set(row[1:-1].tolist())) for row in original]
    width = max(map(len, bag))
    return {
        "input_ids": torch.cat(inputs), "attention_mask": torch.ones(views * n, length, dtype=torch.long),
        "labels": torch.cat(labels), "original_ids": original,
        "span_start": torch.tensor([[1, 3], [2, 5], [1, 1], [4, 6]]),
        "span_end": torch.tensor([[3, 9], [4, 11], [2, 2], [6, 10]]),
        "span_mask": torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]], dtype=torch.bool),
        "bag_ids": torch.tensor([b + [0] * (width - len(b)) for b in bag]),
        "bag_mask": torch.tensor([[1] * len(b) + [0] * (width - len(b)) for b in bag], dtype=torch.bool),
    }


def _precision(logits, batch):
    total = 0.0
    for i in range(len(batch["bag_ids"])):
        bag = set(batch["bag_ids"][i][batch["bag_mask"][i]].tolist())
        ranked = sorted(range(logits.shape[1]), key=lambda v: -logits[i, v].item())[:len(bag)]
        total += len(bag & set(ranked)) / len(bag)
    return total / len(batch["bag_ids"])


@pytest.mark.parametrize("objective", ["mlm", "costa", "cpdae", "cpdae_r", "bow"])
def test_probes_equal_their_definitions(checkpoint, objective):
    settings = fx.model_settings(objective)
    model = Pretrainer(checkpoint, settings)
    views = 2 if objective.startswith("cpdae") else 1
    batch = _batch(views)
    got = probes.probe(model, batch)
    assert model.training  # the probe restores training mode
    with torch.no_grad():
        model.eval()
        hidden = model.hidden(batch)
        hits = total = 0
        for b in range(hidden.shape[0]):
            for t in range(hidden.shape[1]):
                if batch["labels"][b, t] != -100:
                    total += 1
                    hits += int(model.mlm_head(hidden[b, t]).argmax() == batch["labels"][b, t])
        selected = batch["labels"] != -100
        nll = torch.nn.functional.cross_entropy(model.mlm_head(hidden[selected]),
                                                batch["labels"][selected])
        want = {"probe_mlm_accuracy": hits / total, "loss_mlm_heldout": nll.item()}
        cls = hidden[:, 0]
        if objective == "costa":
            text = model.projector(cls)
            right = count = 0
            for i in range(4):
                for s, e, real in zip(batch["span_start"][i], batch["span_end"][i], batch["span_mask"][i]):
                    if real:
                        span = hidden[i, s:e].mean(0)
                        right += int(max(range(4), key=lambda j: (span @ text[j]).item()) == i)
                        count += 1
            want["probe_span_retrieval"] = right / count
        elif objective.startswith("cpdae"):
            logits = model.decoder(cls)
            want["probe_bag_precision"] = _precision(logits[:4], batch)

            def similarity(a, b):
                if objective == "cpdae_r":
                    return F.cosine_similarity(cls[a], cls[4 + b], dim=0).item()
                p, q = torch.sigmoid(logits[a]), torch.sigmoid(logits[4 + b])
                p, q = p / p.sum(), q / q.sum()
                mix = (p + q) / 2
                return -(0.5 * (p * (p / mix).log()).sum() + 0.5 * (q * (q / mix).log()).sum()).item()

            want["probe_view_agreement"] = sum(
                max(range(4), key=lambda b: similarity(a, b)) == a for a in range(4)) / 4
        elif objective == "bow":
            want["probe_coverage"] = _precision(model.mlm_head(cls), batch)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert key.startswith("loss") or 0.0 <= got[key] <= 1.0 and not math.isnan(got[key])
        assert got[key] == pytest.approx(value, rel=1e-5), key


def _item_sums(model, batch) -> dict:
    """(sum, count) over one batch's items by plain loops: masked tokens for MLM accuracy and
    loss, real spans for COSTA's span retrieval (among the batch's texts)."""
    with torch.no_grad():
        model.eval()
        hidden = model.hidden(batch)
        text = model.projector(hidden[:, 0])
        sums = {"probe_mlm_accuracy": [0.0, 0], "loss_mlm_heldout": [0.0, 0],
                "probe_span_retrieval": [0.0, 0]}
        for b in range(hidden.shape[0]):
            for t in range(hidden.shape[1]):
                label = batch["labels"][b, t]
                if label != -100:
                    logits = model.mlm_head(hidden[b, t])
                    sums["probe_mlm_accuracy"][0] += int(logits.argmax() == label)
                    sums["loss_mlm_heldout"][0] += -logits.log_softmax(-1)[label].item()
                    sums["probe_mlm_accuracy"][1] += 1
                    sums["loss_mlm_heldout"][1] += 1
            for s, e, real in zip(batch["span_start"][b], batch["span_end"][b], batch["span_mask"][b]):
                if real:
                    span = hidden[b, s:e].mean(0)
                    best = max(range(len(text)), key=lambda j: (span @ text[j]).item())
                    sums["probe_span_retrieval"][0] += int(best == b)
                    sums["probe_span_retrieval"][1] += 1
    model.train()
    return sums


def test_probe_batches_pool_over_all_tokens_and_spans(checkpoint):
    """Two batches of different sizes: each figure is the share (mean) over all masked tokens or
    all spans of both, not a mean of the batches' figures weighted by their chunks."""
    model = Pretrainer(checkpoint, fx.model_settings("costa"))
    first = _batch(1)
    second = {k: v[:2] for k, v in _batch(1, seed=11).items()}  # 2 texts: 3 spans
    # The second batch's masked tokens made the ones its head predicts (an untrained head names
    # none of the real ones): the two batches' accuracies differ, 0 and 1.
    with torch.no_grad():
        model.eval()
        predicted = model.mlm_head(model.hidden(second)).argmax(dim=-1)
        model.train()
    second["labels"] = torch.where(second["labels"] != -100, predicted, second["labels"])
    got = probes.probe_batches(model, [first, second])
    sums = [_item_sums(model, first), _item_sums(model, second)]
    for key in sums[0]:
        pooled = (sums[0][key][0] + sums[1][key][0]) / (sums[0][key][1] + sums[1][key][1])
        by_chunks = (4 * sums[0][key][0] / sums[0][key][1] + 2 * sums[1][key][0] / sums[1][key][1]) / 6
        assert got[key] == pytest.approx(pooled, rel=1e-5), key
        assert abs(pooled - by_chunks) > 1e-3, key  # the batches tell the two averages apart
