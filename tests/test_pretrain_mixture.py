"""Pre-training on two corpora with proportions: each global batch draws from both in the given
shares, deterministically from the seed, and a resumed loader continues exactly where a run
that never stopped would be."""

import numpy as np
import pytest
import torch

from pretrain_fixtures import build_corpus, tokenizer
from retrieval_pretraining.pretrain import data as pdata
from retrieval_pretraining.pretrain import store as pstore
from retrieval_pretraining.pretrain import mixture


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """Corpus a: 40 abstracts cut at 48 tokens; corpus b: 8 cut at 40 (its chunk ids overlap a's)."""
    root = tmp_path_factory.mktemp("mixture")
    a, _ = build_corpus(root / "a", docs=40, max_len=48)
    b, _ = build_corpus(root / "b", docs=8, max_len=40)
    cache = root / "cache"
    return pstore.prepare_store(a, None, cache), pstore.prepare_store(b, None, cache)


def loader(two_corpora, proportions=(0.75, 0.25), seed=3, **changes):
    a, b = two_corpora
    options = dict(vocab=pdata.Vocab.from_tokenizer(tokenizer()), seed=seed, global_batch_size=8,
                   micro_batch_size=4, rank=0, world_size=1, mask_rate=0.15, whole_word=False,
                   holdout=4, corpus_files=[len(a), len(b)], proportions=list(proportions))
    dataset = pdata.MicroBatches([*a, *b], **options | changes)
    dataset.total_steps = 60
    return dataset


def test_each_batch_holds_both_corpora_in_the_given_proportions(two_corpora):
    dataset = loader(two_corpora)
    assert dataset.quotas.tolist() == [6, 2]
    a_rows = dataset.bounds[1]
    drawn = np.concatenate([dataset.global_batch(step)[0] for step in range(60)])
    assert abs(np.mean(drawn < a_rows) - 0.75) < 1e-9
    # Both micro-batches of a step mix the corpora (the batch is shuffled), not a then b.
    assert any(0 < np.mean(dataset.rows_for(s, 1) < a_rows) < 1 for s in range(10))
    # ... and shuffled anew each step (from (seed, step)): no micro-batch keeps a fixed mix.
    assert len({int(np.sum(dataset.rows_for(s, 0) < a_rows)) for s in range(20)}) > 1
    # No held-out chunk is trained on; each corpus passes over its own chunks in turn.
    assert not np.isin(drawn, dataset.holdout_rows).any()
    steps_b = dataset.corpus_steps[1]
    first_pass_b = np.concatenate([dataset.global_batch(s)[0] for s in range(steps_b)])
    first_pass_b = first_pass_b[first_pass_b >= a_rows]
    assert len(set(first_pass_b.tolist())) == len(first_pass_b)  # no repeat within a pass


def test_proportions_other_than_the_batch_allows_are_rounded_and_zero_shares_refused():
    assert mixture.quotas([0.5, 0.3, 0.2], 8).tolist() == [4, 2, 2]
    assert mixture.quotas([2, 1], 256).sum() == 256
    with pytest.raises(pdata.DataError, match="no chunk of a global batch of 8"):
        mixture.quotas([0.99, 0.01], 8)
    with pytest.raises(pdata.DataError, match="positive"):
        mixture.quotas([1.0, 0.0], 8)


def test_the_mixture_is_a_function_of_the_seed(two_corpora):
    one, two, other = loader(two_corpora), loader(two_corpora), loader(two_corpora, seed=4)
    for k in (0, 5, 33):
        assert torch.equal(one[k]["input_ids"], two[k]["input_ids"])
    assert not all(np.array_equal(one.global_batch(s)[0], other.global_batch(s)[0])
                   for s in range(3))


def test_a_resumed_loader_gives_the_batches_of_an_uninterrupted_one(two_corpora):
    """The trainer resumes at step s by starting the micro-batch index at s x accumulation on a
    fresh dataset (pretrain/train.py): every later item must equal the uninterrupted run's, across
    corpus epochs (corpus b's pass is shorter, so it wraps first)."""
    run = loader(two_corpora)
    items = [run[k] for k in range(len(run))]
    resumed = loader(two_corpora)
    start = 23 * resumed.accumulation
    assert max(resumed.corpus_steps) < 60  # both corpora start a second pass within the run
    for k in range(start, len(resumed)):
        later = resumed[k]
        for key in ("input_ids", "labels", "chunk_ids", "step"):
            assert torch.equal(later[key], items[k][key]), (k, key)


def test_each_row_is_masked_in_its_own_corpus_s_epoch(two_corpora):
    """Corpus b wraps before corpus a, so a step's rows are in two epochs: each row carries its own
    corpus's epoch through the batch's shuffle, and its masks are drawn in that epoch."""
    dataset = loader(two_corpora)
    wraps = [s for s in range(60) if len({s // n for n in dataset.corpus_steps}) > 1]
    assert wraps  # steps where the corpora are in different epochs
    for step in wraps[:5] + wraps[-5:]:
        rows, epochs = dataset.global_batch(step)
        expected = np.array([step // dataset.corpus_steps[c] for c in dataset.corpus_of(rows)])
        assert epochs.tolist() == expected.tolist(), step
        for micro in range(dataset.accumulation):
            mine = dataset._micro(rows, micro)
            want = dataset.collate(mine, epoch=dataset._micro(expected, micro))
            item = dataset[step * dataset.accumulation + micro]
            assert torch.equal(item["input_ids"], want["input_ids"]), (step, micro)


def test_one_corpus_loads_as_before(two_corpora):
    """Without a mixture the order and masks are those of a single store (seed, epoch) alone."""
    a, _ = two_corpora
    options = dict(vocab=pdata.Vocab.from_tokenizer(tokenizer()), seed=3, global_batch_size=8,
                   micro_batch_size=4, rank=0, world_size=1, mask_rate=0.15, whole_word=False)
    single = pdata.MicroBatches(a, **options)
    order = pdata.epoch_order(len(single.store), 3, 1)
    step = single.steps_per_epoch + 2
    assert np.array_equal(single.rows_for(step, 0), order[16:20])
    # Masks: a row's generator is keyed by (seed, epoch, chunk_id's low and high 32 bits, stream,
    # corpus), 6 words whatever the values (corpus 0 without a mixture).
    for stream in (0, 1):
        ours = single._rng((2, 41, 0), stream).integers(0, 2**31, 8)
        assert np.array_equal(ours, np.random.default_rng([3, 2, 41, 0, stream, 0]).integers(
            0, 2**31, 8))
    assert not np.array_equal(single._rng((2, 41, 1), 0).integers(0, 2**31, 8),
                              np.random.default_rng([3, 2, 41, 0, 0, 0]).integers(0, 2**31, 8))


def test_mask_keys_of_two_corpora_never_collide(two_corpora):
    """NumPy splits a seed word >= 2**32 in two: with a key of variable length, page p of corpus
    1 (view 1) and chunk (1 << 32) | p of corpus 0 (view 1) drew the same masks."""
    a, _ = two_corpora
    single = pdata.MicroBatches(a, vocab=pdata.Vocab.from_tokenizer(tokenizer()), seed=3,
                                global_batch_size=8, micro_batch_size=4, rank=0, world_size=1,
                                mask_rate=0.15, whole_word=False)
    p = 41
    draws = {key: single._rng(key, 1).integers(0, 2**31, 8).tolist()
             for key in [(2, p, 1), (2, (1 << 32) | p, 0), (2, p, 0), (2, 1 << 32, 0),
                         (2, 0, 1), (2, p << 32, 0)]}
    assert len({tuple(v) for v in draws.values()}) == len(draws), draws


def test_shard_groups_must_match_the_corpora():
    settings = {"corpora": [{"name": "a", "proportion": 1.0}, {"name": "b", "proportion": 3.0}]}
    assert mixture.proportions(settings, [["x"], ["y"]], None) == [1.0, 3.0]
    with pytest.raises(pdata.DataError, match="one group per corpus"):
        mixture.proportions(settings, [["x", "y"]], None)
    assert mixture.proportions({"corpora": settings["corpora"][:1]}, [["x"]], [["s"]]) is None


def test_a_model_continues_from_another_on_a_mixture_of_two_corpora(tmp_path):
    """The command as the rule runs it: one --chunks group per corpus; then a model with `init`
    starts from the first one's exported encoder and its trained MLM head (no head warm-up)."""
    import json

    from pretrain_fixtures import model_settings, tiny_checkpoint
    from retrieval_pretraining import artifacts
    from retrieval_pretraining.pretrain.__main__ import main

    checkpoint = tiny_checkpoint(tmp_path / "checkpoint")
    a, _ = build_corpus(tmp_path / "a", docs=8, max_len=48)
    b, _ = build_corpus(tmp_path / "b", docs=4, max_len=32)

    def run(name, settings, start, *extra):
        out = tmp_path / name
        argv = ["--config", json.dumps(settings), "--checkpoint", start,
                "--chunks", *a, "--chunks", *b, *extra, "--encoder", out / "encoder",
                "--metrics", out / "metrics.jsonl", "--plot", out / "loss.png",
                "--state", out / "state"]
        assert main([str(x) for x in argv]) == 0
        return out

    first = model_settings("bow", max_steps=1, head_warmup_steps="auto")
    first["corpora"] = [{"name": "a", "proportion": 3.0}, {"name": "b", "proportion": 1.0}]
    base = run("first", first, checkpoint)
    info = artifacts.read_json(base / "encoder" / "training.json")
    assert info["corpus_quotas"] == [6, 2] and info["head_warmup_steps"] >= 1  # fresh head
    later = first | {"name": "later", "init": "first"}
    out = run("later", later, base / "encoder", "--init-heads", base / "heads.safetensors")
    info = artifacts.read_json(out / "encoder" / "training.json")
    assert info["fresh_mlm_head"] is False and info["head_warmup_steps"] == 0
    assert info["settings"]["init"] == "first"
