"""negative_files: separate, the Tevatron / BoW authors' NQ and TriviaQA stage 2 (bowdpr
examples/finetune/qa/train_dpr_nq.sh puts the mined file and a copy of the BM25 one in stage 2's
training folder, a line per query in each): every negatives file is its own set of examples. Checked
against a naive restatement, across a stop and resume mid-epoch, and the union's batches pinned to
what the trainer drew before the mode existed."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import torch
from retrieval_pretraining import training
from retrieval_pretraining.config import ConfigError
from retrieval_pretraining.finetune import data as fdata
from retrieval_pretraining.finetune.passages import PassageStore, write_passages
from retrieval_pretraining.finetune.settings import FinetuneSettings
from retrieval_pretraining.finetune.train import resume_settings
from test_finetune import fine_tune, stop_flag_after, tiny_dataset, tiny_encoder

torch.set_num_threads(1)


def _two_files(folder: Path, n_queries: int = 24) -> tuple[dict[str, Path], list[Path]]:
    """A "mined" and a "BM25" file over tiny_dataset's queries: overlapping lists, a repeat inside
    one list, a query only the first names, one only the second names, and one (q2) with a null
    list in the first and an empty one in the second: no negatives anywhere."""
    data = tiny_dataset(folder, n_queries=n_queries)
    bm25 = pl.read_parquet(data["bm25"])
    qids, negs = bm25["query_id"].to_list(), bm25["negative_ids"].to_list()
    mined = [n[::-1][:6] + n[:2] for n in negs]
    mined[0] = mined[0] + mined[0][:3]
    mined[2] = None
    listed = list(negs)
    listed[2] = []
    first = bm25.with_columns(pl.Series("negative_ids", mined, dtype=pl.List(pl.String)))
    second = bm25.with_columns(pl.Series("negative_ids", listed, dtype=pl.List(pl.String)))
    files = [folder / "mined.parquet", folder / "bm25-copy.parquet"]
    first.filter(pl.col("query_id") != qids[3]).write_parquet(files[0])
    second.filter(pl.col("query_id") != qids[5]).write_parquet(files[1])
    return data, files


def _naive_examples(data: dict[str, Path], files: list[Path]) -> dict[tuple[str, str], dict]:
    """{(query, file index or "pad"): {text, positives, negatives}}, restated row by row: a query
    with negatives in a file is an example of that file, drawing from that file's list (each doc
    once, first place kept); a query with none in any file is one example with none."""
    texts = dict(pl.read_parquet(data["queries"]).select("query_id", "text").iter_rows())
    positives: dict[str, set[str]] = {}
    for qid, doc, relevance in pl.read_parquet(data["qrels"]).select(
            "query_id", "doc_id", "relevance").iter_rows():
        if relevance > 0:
            positives.setdefault(qid, set()).add(doc)
    examples = {}
    for i, path in enumerate(files):
        lists: dict[str, list[str]] = {}
        for qid, negs in pl.read_parquet(path).select("query_id", "negative_ids").iter_rows():
            merged = lists.setdefault(qid, [])
            merged.extend(d for d in negs or [] if d not in merged)
        for qid, negs in lists.items():
            if negs and qid in positives:
                examples[qid, str(i)] = {"text": texts[qid], "positives": sorted(positives[qid]),
                                         "negatives": negs}
    for qid in positives:
        if not any((qid, str(i)) in examples for i in range(len(files))):
            examples[qid, "pad"] = {"text": texts[qid], "positives": sorted(positives[qid]),
                                    "negatives": []}
    return examples


def _load(data, files, tmp_path, **config):
    settings = FinetuneSettings.from_config({"group_size": 4, **config})
    loaded = fdata.load_training_set(data["queries"], data["qrels"], data["corpus"], files,
                                     settings, seed=9)
    passages = tmp_path / f"passages-{len(list(tmp_path.iterdir()))}.arrow"
    write_passages(data["corpus"], loaded.needed_passages(), passages)
    return loaded.with_passages(PassageStore(passages))


def test_each_negatives_file_is_its_own_examples_as_a_naive_restatement(tmp_path):
    """A query with negatives in both files is two examples an epoch, each group drawn from one
    file's list alone; one named by one file is one example of it; one with negatives in neither
    is one padded example. Texts and positives are the query's in each; the counts say so."""
    data, files = _two_files(tmp_path)
    loaded = _load(data, files, tmp_path, negative_files="separate")
    naive = _naive_examples(data, files)
    ids = loaded.query_ids.to_list()
    assert ids == sorted(f"{q}@{source}" for q, source in naive)
    frame = loaded.queries
    for eid, text, positives, negatives in frame.iter_rows():
        example = naive[tuple(eid.rsplit("@", 1))]
        assert (text, positives, negatives or []) == (example["text"], example["positives"],
                                                      example["negatives"])
    qids = pl.read_parquet(data["bm25"])["query_id"].to_list()
    per_query = Counter(eid.rsplit("@", 1)[0] for eid in ids)
    assert per_query[qids[3]] == per_query[qids[5]] == per_query[qids[2]] == 1
    assert sum(per_query.values()) == 2 * 24 - 3 and set(per_query) == set(qids)
    assert loaded.num_queries == 24
    assert {k: loaded.counts[k] for k in ("examples_of_negatives0", "examples_of_negatives1",
                                          "train_examples", "queries_without_negatives_padded")
            } == {"examples_of_negatives0": 22, "examples_of_negatives1": 22,
                  "train_examples": 45, "queries_without_negatives_padded": 1}

    # An epoch: each example once, so a query of both files trains twice, on each file's list.
    pool = loaded.padding
    corpus = {d: (t or "", x) for d, t, x in pl.read_parquet(data["corpus"]).iter_rows()}
    seen = Counter()
    for step in range(len(ids) // 5):
        epoch, batch = fdata.step_queries(loaded.query_ids, 9, step, 5)
        assert epoch == 0
        _, titles, texts = loaded.micro_batch(batch, 4, seed=9, epoch=epoch)
        groups = [fdata.sample_group(e, naive[tuple(e.rsplit("@", 1))]["positives"],
                                     naive[tuple(e.rsplit("@", 1))]["negatives"], pool, 4, 9, 0)
                  for e in batch]
        assert list(zip(titles, texts)) == [corpus[d] for g in groups for d in g]
        for e, group in zip(batch, groups):
            example = naive[tuple(e.rsplit("@", 1))]
            assert group[0] in example["positives"]
            if example["negatives"]:
                assert set(group[1:]) <= set(example["negatives"])
        seen.update(batch)
    assert sorted(seen) == ids and set(seen.values()) == {1}


def test_a_separate_example_adds_the_positives_its_file_lists_on_request(tmp_path):
    """example_positives file (bow.yaml's NQ / TriviaQA): the BoW authors' mined QA file lists
    every top-100 passage holding an answer as a positive (annotate.py --build_hn;
    mining.answer_positives), so each of that file's examples trains on its query's positives,
    then those its row adds that the corpus holds, in the row's order; the other file's examples,
    and every example by default, on the query's alone."""
    data, files = _two_files(tmp_path)
    mined = pl.read_parquet(files[0])
    corpus = sorted(pl.read_parquet(data["corpus"])["doc_id"].to_list())
    qids = mined["query_id"].to_list()
    extra = {qids[0]: [corpus[-1], "absent", corpus[-2]], qids[1]: [corpus[-3]]}
    mined.with_columns(pl.Series("positive_ids", [p + extra.get(q, []) for q, p in zip(
        qids, mined["positive_ids"].to_list())], dtype=pl.List(pl.String))).write_parquet(files[0])
    before = _load(data, files, tmp_path, negative_files="separate")
    after = _load(data, files, tmp_path, negative_files="separate", example_positives="file")
    old = dict(before.queries.select("query_id", "positives").iter_rows())
    new = dict(after.queries.select("query_id", "positives").iter_rows())
    assert set(old) == set(new) and before.query_ids.to_list() == after.query_ids.to_list()
    assert new[f"{qids[0]}@0"] == old[f"{qids[0]}@0"] + [corpus[-1], corpus[-2]]
    assert new[f"{qids[1]}@0"] == old[f"{qids[1]}@0"] + [corpus[-3]]
    assert {e: p for e, p in new.items() if e not in (f"{qids[0]}@0", f"{qids[1]}@0")} == {
        e: p for e, p in old.items() if e not in (f"{qids[0]}@0", f"{qids[1]}@0")}
    assert {corpus[-1], corpus[-2], corpus[-3]} <= set(after.needed_passages().to_list())
    firsts = {after.micro_batch([f"{qids[0]}@0"], 4, seed=9, epoch=e)[2][0] for e in range(40)}
    texts = dict(pl.read_parquet(data["corpus"]).select("doc_id", "text").iter_rows())
    assert texts[corpus[-1]] in firsts and texts[corpus[-2]] in firsts
    with pytest.raises(ConfigError, match="example_positives"):
        FinetuneSettings.from_config({"example_positives": "mined"})


def test_separate_files_drop_a_query_without_negatives_per_example(tmp_path):
    """queries_without_negatives: drop removes the query no file gives negatives, counted; a
    query missing from one file stays one example of the other."""
    data, files = _two_files(tmp_path)
    loaded = _load(data, files, tmp_path, negative_files="separate",
                   queries_without_negatives="drop")
    qids = pl.read_parquet(data["bm25"])["query_id"].to_list()
    ids = loaded.query_ids.to_list()
    assert not [e for e in ids if e.startswith(f"{qids[2]}@")]
    assert f"{qids[3]}@1" in ids and f"{qids[3]}@0" not in ids
    assert loaded.counts["queries_without_negatives_dropped"] == 1
    assert loaded.counts["queries_without_negatives_padded"] == 0
    assert loaded.num_queries == 23 and len(ids) == 44 and loaded.padding == []


# sha256 of every micro-batch of two epochs (batch 5: query texts, titles, passages), drawn by
# the trainer before negative_files existed (commit 65631d3): mined (one file) and union (two);
# since padding keeps each draw once, with the one group that changed: padded q2's in epoch 1.
BEFORE = {"mined": "5a66961288a6ab60cfbf5bc12a5b04913c2f6d7fe1d09e8f1c99df1fec02adfe",
          "union": "757b8f98381db1b47224517d399d30e22c1e47263c866762def190b20ac523d1"}


def _batches_digest(loaded, epochs: int = 2, batch: int = 5) -> str:
    digest = hashlib.sha256()
    steps = len(loaded.query_ids) // batch
    for step in range(epochs * steps):
        epoch, ids = fdata.step_queries(loaded.query_ids, 9, step, batch)
        digest.update(json.dumps([ids, *loaded.micro_batch(ids, 4, seed=9, epoch=epoch)]).encode())
    return digest.hexdigest()


@pytest.mark.parametrize("mode", ["mined", "union"])
def test_the_default_and_union_batches_are_the_ones_drawn_before_separate_existed(tmp_path, mode):
    """stage2_negatives mined / union hand the trainer one or two files and no negative_files key:
    every batch is bit for bit the one the trainer drew before (so their runs train the same
    weights); union stated explicitly is the default."""
    data, files = _two_files(tmp_path)
    files = files[:1] if mode == "mined" else files
    assert _batches_digest(_load(data, files, tmp_path)) == BEFORE[mode]
    if "negative_files" in FinetuneSettings.__dataclass_fields__:
        assert _batches_digest(_load(data, files, tmp_path, negative_files="union")) == BEFORE[mode]


def test_the_negative_files_knob_is_checked_and_a_separate_state_is_another_job():
    """A union state (or one from before the knob) resumes as before; separate is another job:
    claim_state sets a union run's state aside instead of resuming it with other examples."""
    with pytest.raises(ConfigError, match="negative_files 'both' is unknown"):
        FinetuneSettings.from_config({"negative_files": "both"})
    union = resume_settings(FinetuneSettings.from_config({}))
    assert "negative_files" not in union
    assert resume_settings(FinetuneSettings.from_config({"negative_files": "union"})) == union
    assert resume_settings(FinetuneSettings.from_config({"negative_files": "separate"})) == (
        union | {"negative_files": "separate"})


def test_separate_files_resume_mid_epoch_to_the_same_weights(tmp_path, monkeypatch):
    """Stopped after step 2 of an epoch of 5 steps over the examples of two files, the rerun ends
    where an uninterrupted run ends, and the metrics' start event counts examples and queries."""
    from safetensors.torch import load_file

    data, files = _two_files(tmp_path / "data")
    base = tiny_encoder(tmp_path / "base")
    cfg = {"q_len": 16, "p_len": 32, "group_size": 2, "batch_size": 8, "epochs": 1, "lr": 1e-4,
           "log_every_steps": 1, "negative_files": "separate"}

    def run(name: str) -> int:
        return fine_tune(cfg, base, data, files, seed=5, out=tmp_path / name / "encoder",
                         state_dir=tmp_path / name / "state",
                         metrics_path=tmp_path / name / "metrics.jsonl")

    assert run("straight") == 0

    with monkeypatch.context() as patch:
        patch.setattr(training, "StopFlag", stop_flag_after(2))
        assert run("resumed") == training.RESUME_EXIT_CODE
    assert run("resumed") == 0
    records = [json.loads(l) for l in (tmp_path / "resumed" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5]
    start = next(r for r in records if r.get("event") == "start")
    assert (start["train_queries"], start["train_examples"], start["queries_per_epoch"]) == (
        24, 45, 40)
    a = load_file(tmp_path / "straight" / "encoder" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "encoder" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7)
