"""`audit` fails an artifact corrupted in ways its writer never leaves (exit 1, naming the check),
and passes the intact one: checks that read every row, not a sample."""

import json
import shutil
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from retrieval_pretraining import artifacts, audit
from retrieval_pretraining.contracts import chunks, datasets, negatives, spans

from audit_fixtures import build_results, shard_stats


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return build_results(tmp_path_factory.mktemp("project") / "results")


def audited(path, capsys):
    status = audit.main([str(path)])
    return status, capsys.readouterr().out


def passes(path, check, capsys):
    status, out = audited(path, capsys)
    assert status == 0 and f"PASS  {check}" in out, out


def fails(path, check, capsys):
    status, out = audited(path, capsys)
    assert status == 1 and f"FAIL  {check}" in out, out
    return out


@pytest.mark.parametrize("scores", [["nan"], ["inf", "-inf"]])
def test_a_run_with_a_score_that_is_not_finite_fails(results, scores, capsys):
    run = results / f"runs/toy/{scores[0]}/test.trec"
    run.parent.mkdir(parents=True)
    run.write_text("".join(f"q1 Q0 d{i} {i} {s} t\n" for i, s in enumerate(scores, 1)))
    fails(run, "scores finite", capsys)
    passes(results / "runs/toy/bm25/test.trec", "scores finite", capsys)


def scored(results, name):
    """A run of the toy dataset scored by evaluate.py (its metrics as the workflow writes them)."""
    from retrieval_pretraining.evaluate import evaluate

    run = results / f"runs/toy/{name}/test.trec"
    run.parent.mkdir(parents=True)
    run.write_text("q1 Q0 d1 1 9.5 x\nq1 Q0 d3 2 7.0 x\nq2 Q0 d2 1 3.0 x\n")
    qrels = results / f"datasets/{name}/qrels-test.parquet"
    rows = {"query_id": ["q1", "q2"], "doc_id": ["d2", "d2"], "relevance": [1, 1]}
    artifacts.write_parquet(qrels, pa.table(rows), datasets.QRELS_SCHEMA)
    metrics = results / f"metrics/toy/{name}/test.json"
    evaluate(run, qrels, metrics, {"measures": ["nDCG@10", "R@100"]})
    return run, metrics


def edit_metrics(metrics, change):
    data = json.loads(metrics.read_text())
    change(data)
    metrics.write_text(json.dumps(data))


def test_metrics_unlike_their_run_or_queries_fail(results, capsys):
    """evaluate.py scores each qrels query once, every score of these measures a fraction, and
    records the sha256 of the run it scored."""
    run, metrics = scored(results, "scored")
    for check in ("nDCG@10: one per-query score per query (2)", "R@100: every per-query score in "
                  "[0, 1]", "the run still has the recorded sha256 (run_sha256)"):
        passes(metrics, check, capsys)
    edit_metrics(metrics, lambda d: d["per_query"]["nDCG@10"].pop("q2"))
    assert "1 scores" in fails(metrics, "nDCG@10: one per-query score per query (2)", capsys)
    edit_metrics(metrics, lambda d: d["per_query"]["R@100"].update(q1=1.5))
    assert "('q1', 1.5)" in fails(metrics, "R@100: every per-query score in [0, 1]", capsys)
    run.write_text(run.read_text().replace("9.5", "1.5"))  # searched again, not scored again
    fails(metrics, "the run still has the recorded sha256 (run_sha256)", capsys)


def test_embeddings_with_a_nan_past_the_first_rows_fail(results, capsys):
    vectors = np.ones((70_001, 4), np.float16)  # past a first-rows sample and one read's rows
    vectors[70_000, 2] = np.nan
    shard = results / "index/bert/toy/nan/shard-0000.npy"
    shard.parent.mkdir(parents=True)
    np.save(shard, vectors)
    out = fails(shard, "finite values (every row)", capsys)
    assert "1 rows, first 70000" in out
    passes(results / "index/bert/toy/stage1/shard-0000.npy", "finite values (every row)", capsys)


def write_shard(results, name, vectors, ids, stats):
    """An encoded shard of the toy corpus as encode.py leaves it: vectors, ids, manifest."""
    shard = results / f"index/bert/toy/{name}/shard-0000.npy"
    shard.parent.mkdir(parents=True)
    np.save(shard, vectors)
    pq.write_table(pa.table({"doc_id": ids}), shard.with_name("shard-0000.ids.parquet"))
    artifacts.write_manifest(artifacts.manifest_path(shard), stage="encode_corpus", params={},
                             inputs={"corpus": results / "datasets/toy/corpus.parquet"},
                             stats=stats)
    return shard


def test_embeddings_unlike_their_manifest_or_corpus_fail(results, capsys):
    """Vector i is corpus row lo + i: the index maps hits through the ids, so ids out of order
    return the wrong documents, and an array unlike its manifest is not what was recorded."""
    vectors = np.ones((3, 4), np.float16)
    corpus_order = ["d2", "d3"]  # toy corpus rows 1..3
    recorded = {"rows": 2, "row_range": [1, 3], "dim": 4, "dtype": "float16"}
    intact = write_shard(results, "intact", vectors[:2], corpus_order, recorded)
    passes(intact, "shape and dtype are the manifest's (rows, dim, dtype)", capsys)
    passes(intact, "ids are corpus.parquet's doc_id rows 1..3, in order", capsys)
    wrong = write_shard(results, "shape", vectors, ["d1", "d2", "d3"],
                        {"rows": 3, "row_range": [0, 3], "dim": 768, "dtype": "float32"})
    out = fails(wrong, "shape and dtype are the manifest's (rows, dim, dtype)", capsys)
    assert "(3, 4) float16 vs (3, 768) float32" in out, out
    swapped = write_shard(results, "order", vectors[:2], corpus_order[::-1], recorded)
    out = fails(swapped, "ids are corpus.parquet's doc_id rows 1..3, in order", capsys)
    assert "first difference at row 0: 'd3' vs 'd2'" in out, out


def test_embeddings_with_a_nan_in_a_read_s_last_row_fail(results, capsys, monkeypatch):
    """The rows are read a slice at a time: a nan in the last row of a slice fails too."""
    from retrieval_pretraining.contracts.embeddings import audit as embeddings_audit

    monkeypatch.setattr(embeddings_audit, "ROWS_PER_READ", 2)
    vectors = np.ones((3, 4), np.float16)
    vectors[1, 0] = np.nan
    shard = results / "index/bert/toy/nan-slice-end/shard-0000.npy"
    shard.parent.mkdir(parents=True)
    np.save(shard, vectors)
    assert "1 rows, first 1" in fails(shard, "finite values (every row)", capsys)


def test_embeddings_of_another_dimension_in_the_recorded_dtype_fail(results, capsys):
    """Shape and dtype are compared together: a shape unlike the manifest's fails even where
    the dtype is the recorded one."""
    recorded = {"rows": 3, "dim": 8, "dtype": "float16"}
    wrong = write_shard(results, "narrower", np.ones((3, 4), np.float16), ["d1", "d2", "d3"],
                        recorded)
    out = fails(wrong, "shape and dtype are the manifest's (rows, dim, dtype)", capsys)
    assert "(3, 4) float16 vs (3, 8) float16" in out, out


def test_embeddings_replaced_by_another_shard_s_array_fail(results, capsys):
    """An array of the same shape and dtype (another shard's, its ids file untouched) passed
    every check: encode.py records the .npy file's sha256, and audit compares it. A manifest
    written before it recorded one is not compared."""
    recorded = {"rows": 2, "row_range": [1, 3], "dim": 4, "dtype": "float16"}
    old = write_shard(results, "unhashed", np.ones((2, 4), np.float16), ["d2", "d3"], recorded)
    status, out = audited(old, capsys)
    assert status == 0 and "sha256 not recorded" in out and "sha256 equals" not in out, out
    shard = write_shard(results, "hashed", np.ones((2, 4), np.float16), ["d2", "d3"], recorded)
    manifest = artifacts.read_json(artifacts.manifest_path(shard))
    manifest["stats"]["sha256"] = artifacts.sha256_file(shard)
    artifacts.write_json(artifacts.manifest_path(shard), manifest)
    passes(shard, "sha256 equals the manifest's", capsys)
    np.save(shard, np.full((2, 4), 2, np.float16))  # same shape and dtype, other vectors
    out = fails(shard, "sha256 equals the manifest's: not the array encoded", capsys)
    assert "PASS  shape and dtype are the manifest's" in out, out


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_the_corpus_ids_of_a_row_range_are_read_across_batches(tmp_path, monkeypatch, batch):
    from retrieval_pretraining.contracts.embeddings import audit as embeddings_audit

    monkeypatch.setattr(embeddings_audit, "ROWS_PER_READ", batch)
    ids = [f"d{i}" for i in range(10)]
    pq.write_table(pa.table({"doc_id": ids, "text": ["t"] * 10}), tmp_path / "corpus.parquet")
    for lo, hi in [(0, 10), (3, 8), (9, 10), (4, 4)]:
        assert embeddings_audit.corpus_ids(tmp_path / "corpus.parquet", lo, hi) == ids[lo:hi]


def test_safetensors_with_a_nan_fail_whatever_the_float_type(results, capsys):
    heads = results / "pretrain/nan/heads.safetensors"
    heads.parent.mkdir(parents=True)
    save_file({"ok": np.zeros(3, np.float32), "bad": np.array([0.0, np.inf], np.float32)},
              str(heads))
    assert "e.g. ['bad']" in fails(heads, "every value finite", capsys)
    # bfloat16 (numpy has no such type): 1.0 then a nan, written as safetensors lays it out.
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    bf16 = results / "pretrain/bf16/heads.safetensors"
    bf16.parent.mkdir(parents=True)
    bf16.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2H", 0x3F80, 0x7FC0))
    assert "e.g. ['w']" in fails(bf16, "every value finite", capsys)
    passes(results / "pretrain/costa/heads.safetensors", "every value finite", capsys)


def test_a_model_folder_with_a_nan_weight_fails(results, capsys):
    """An encoder exported by a run that diverged loads without complaint: audit reads every
    weight of every safetensors file in the folder."""
    good = results / "pretrain/costa/encoder"
    folder = results / "pretrain/diverged/encoder"
    shutil.copytree(good, folder)
    weights = np.zeros((10, 4), np.float32)
    weights[9, 3] = np.nan
    save_file({"embeddings.word_embeddings.weight": weights}, str(folder / "model.safetensors"))
    out = fails(folder, "every weight finite", capsys)
    assert "model.safetensors: embeddings.word_embeddings.weight" in out
    # (the fixture's encoder lacks the sentence-transformers files: it fails other checks)
    assert "PASS  every weight finite" in audited(good, capsys)[1]


def test_a_model_folder_whose_weights_are_not_the_recorded_ones_fails(results, capsys):
    """manifest.json records the sha256 of each weight file (artifacts.weights_checksums): a
    model.safetensors swapped after the export is not the model its records describe."""
    folder = results / "pretrain/swapped/encoder"
    shutil.copytree(results / "pretrain/costa/encoder", folder)
    artifacts.write_manifest(folder / "manifest.json", stage="pretrain", params={},
                             stats={"weights": artifacts.weights_checksums(folder)})
    assert "PASS  weights match the sha256 manifest.json records" in audited(folder, capsys)[1]
    recorded = artifacts.sha256_file(folder / "model.safetensors")
    save_file({"embeddings.word_embeddings.weight": np.ones((10, 4), np.float32)},
              str(folder / "model.safetensors"))
    out = fails(folder, "weights match the sha256 manifest.json records", capsys)
    assert f"model.safetensors: sha256 {artifacts.sha256_file(folder / 'model.safetensors')}, " \
           f"manifest.json records {recorded}" in out, out


def test_a_model_folder_with_a_weight_file_unrecorded_or_missing_fails(results, capsys):
    """manifest.json names every weight file: one added since, or one recorded and gone, is not
    the model its records describe."""
    check = "weights match the sha256 manifest.json records"
    folder = results / "pretrain/unrecorded/encoder"
    shutil.copytree(results / "pretrain/costa/encoder", folder)
    artifacts.write_manifest(folder / "manifest.json", stage="pretrain", params={},
                             stats={"weights": artifacts.weights_checksums(folder)})
    save_file({"w": np.zeros((4, 4), np.float32)}, str(folder / "projector.safetensors"))
    assert "projector.safetensors: not recorded in manifest.json" in fails(folder, check, capsys)
    artifacts.write_manifest(folder / "manifest.json", stage="pretrain", params={},
                             stats={"weights": artifacts.weights_checksums(folder)})
    (folder / "projector.safetensors").unlink()
    assert ("projector.safetensors: recorded in manifest.json, missing from the folder"
            in fails(folder, check, capsys))


def test_heads_with_a_second_dimension_unlike_the_encoder_s_fail(results, capsys):
    bad = results / "pretrain/narrow/heads.safetensors"
    (bad.parent / "encoder").mkdir(parents=True)
    shutil.copy(results / "pretrain/costa/encoder/config.json", bad.parent / "encoder")
    save_file({"projector.0.weight": np.zeros((4, 7), np.float32)}, str(bad))
    assert "projector.0.weight" in fails(bad, "every dimension is the encoder's hidden or "
                                         "vocabulary size", capsys)


def test_a_tokenizer_without_mask_fails(results, capsys):
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "snow", "##s"])}
    path = results / "checkpoints/nomask/tokenizer.json"
    path.parent.mkdir(parents=True)
    Tokenizer(WordPiece(vocab, unk_token="[UNK]")).save(str(path))
    assert "missing ['[MASK]']" in fails(path, "has BERT's special tokens", capsys)
    passes(results / "checkpoints/minilm/tokenizer.json", "has BERT's special tokens", capsys)


def test_an_encoder_whose_training_data_changed_since_fails(results, capsys):
    """training.json records the sha256 of the shards the encoder trained on (`data`, paths as
    the stage was given them: relative to the project); the audit checked only the checkpoint's
    manifest, so a shard swapped after training passed. A shard deleted since is said, not
    failed."""
    shards = sharded_corpus(results, "trained")
    folder = results / "pretrain/trained/encoder"
    shutil.copytree(results / "pretrain/costa/encoder", folder)
    relative = [str(p.relative_to(results.parent)) for pair in shards for p in pair]
    gone = "results/corpus/trained/chunks/shard-0002.parquet"
    data = {path: {"sha256": artifacts.sha256_file(results.parent / path),
                   "manifest_sha256": "0" * 64} for path in relative}
    data[gone] = {"sha256": "0" * 64}
    (folder / "training.json").write_text(json.dumps({"objective": "costa", "data": data}))
    check = "the files it trained on unchanged since training (sha256 in training.json data)"
    out = audited(folder, capsys)[1]
    assert f"PASS  {check}" in out, out
    assert ("-- trained on 5 files (training.json data): 4 hashed now, 0 changed since training, "
            "1 not found now") in out and f"not found now: {results.parent / gone}" in out
    (chunks0, _), (chunks1, _) = shards
    shutil.copy(chunks1, chunks0)
    status, out = audited(folder, capsys)
    assert status == 1 and (f"FAIL  {check}: 1 changed since training, e.g. ['{chunks0}']"
                            in out), out


def test_a_run_whose_encoder_was_retrained_since_fails(results, capsys):
    """Runs, vectors and mined negatives record their encoder's weights as its manifest has them
    (encode.record_encoder_weights); audit compares them with the encoder's manifest now. Without
    the field (manifests written before it) or without the encoder, it says so and passes."""
    folder = results / "pretrain/retrained/encoder"
    shutil.copytree(results / "pretrain/costa/encoder", folder)
    artifacts.write_manifest(folder / "manifest.json", stage="pretrain", params={},
                             stats={"weights": artifacts.weights_checksums(folder)})
    run = results / "runs/toy/retrained/test.trec"
    run.parent.mkdir(parents=True)
    shutil.copy(results / "runs/toy/bm25/test.trec", run)
    manifest = artifacts.write_manifest(
        artifacts.manifest_path(run), stage="dense_run", params={}, inputs={"encoder": folder})
    recorded = dict(manifest, inputs={"encoder": manifest["inputs"]["encoder"] | {
        "weights": artifacts.weights_checksums(folder)}})
    artifacts.write_json(artifacts.manifest_path(run), recorded)
    check = "input 'encoder' still has the recorded weights (sha256 in its manifest.json)"
    passes(run, check, capsys)
    # Retrained: other weights (another size, so that no cached sha256 of the old file is used).
    save_file({"embeddings.word_embeddings.weight": np.ones((12, 4), np.float32)},
              str(folder / "model.safetensors"))
    artifacts.write_manifest(folder / "manifest.json", stage="pretrain", params={},
                             stats={"weights": artifacts.weights_checksums(folder)})
    assert f"{folder}: changed since" in fails(run, check, capsys)
    artifacts.write_json(artifacts.manifest_path(run), manifest)  # no weights recorded
    status, out = audited(run, capsys)
    assert status == 0 and check not in out, out
    assert f"input encoder: {folder} (a folder; its weights' sha256 not recorded" in out
    artifacts.write_json(artifacts.manifest_path(run), recorded)
    # Exported again by code that records no weights: not the recorded ones either.
    artifacts.write_manifest(folder / "manifest.json", stage="pretrain", params={})
    assert "records no weights" in fails(run, check, capsys)
    shutil.rmtree(folder)
    status, out = audited(run, capsys)
    assert status == 0 and check not in out and f"input encoder: {folder} not found now" in out


def write_negatives(results, monkeypatch, name, rows, params=None):
    """Negatives with the manifest bm25.py writes: its inputs relative to the project."""
    path = results / f"bm25/toy/{name}.parquet"
    artifacts.write_parquet(path, pa.Table.from_pylist(rows, negatives.SCHEMA), negatives.SCHEMA)
    monkeypatch.chdir(results.parent)
    artifacts.write_manifest(
        artifacts.manifest_path(path), stage="bm25.negatives", params=params or {},
        inputs={"queries": "results/datasets/toy/queries-train.parquet",
                "qrels": "results/datasets/toy/qrels-train.parquet"},
    )
    return path


def row(positives, negative_ids):
    ranks = list(range(1, len(negative_ids) + 1))
    return {"query_id": "q1", "positive_ids": positives, "negative_ids": negative_ids,
            "negative_ranks": ranks}


@pytest.mark.parametrize(
    "positives, negative_ids, check",
    [
        (["d1"], ["d2", "d2"], "no negative twice for a query"),
        ([], ["d2", "d3"], "every query has a positive"),
        (["d1"], ["d2", "d9"], "every negative is a document of the corpus"),
    ],
)
def test_negatives_a_writer_never_leaves_fail(
    results, monkeypatch, positives, negative_ids, check, capsys
):
    bad = write_negatives(results, monkeypatch, "bad", [row(positives, negative_ids)])
    assert "e.g. ['q1']" in fails(bad, check, capsys)
    intact = write_negatives(results, monkeypatch, "intact", [row(["d1"], ["d2", "d3"])])
    passes(intact, check, capsys)


@pytest.mark.parametrize("ranks", [[5, 0], [3, 2], [2, 2], [-1, -1], [0, 1]])
def test_negatives_out_of_rank_order_fail(results, monkeypatch, ranks, capsys):
    """bm25.py and mine.py keep the sampled negatives in rank order, ranks counted from 1."""
    misranked = row(["d1"], ["d2", "d3"]) | {"negative_ranks": ranks}
    bad = write_negatives(results, monkeypatch, "misranked", [misranked])
    assert "e.g. ['q1']" in fails(bad, "ranks increasing, each >= 1", capsys)
    intact = write_negatives(results, monkeypatch, "ranked", [row(["d1"], ["d2", "d3"])])
    passes(intact, "ranks increasing, each >= 1", capsys)


def test_negatives_of_the_unranked_triples_source_have_ranks_minus_one(
    results, monkeypatch, capsys
):
    triples = {"source": "triples"}
    unranked = row(["d1"], ["d2", "d3"]) | {"negative_ranks": [-1, -1]}
    passes(write_negatives(results, monkeypatch, "triples", [unranked], triples),
           "ranks all -1 (triples: unranked)", capsys)
    bad = write_negatives(results, monkeypatch, "triples-ranked", [row(["d1"], ["d2"])], triples)
    fails(bad, "ranks all -1 (triples: unranked)", capsys)


def test_negatives_past_the_first_batch_are_checked_against_the_corpus(
    results, monkeypatch, capsys
):
    """The rows are checked a batch at a time: a document the corpus lacks in a later batch
    fails as one in the first does."""
    from retrieval_pretraining.contracts.negatives import audit as negatives_audit

    monkeypatch.setattr(negatives_audit, "ROWS_PER_BATCH", 1)
    rows = [row(["d1"], ["d2", "d3"]), row(["d1"], ["d2", "d9"]) | {"query_id": "q2"}]
    bad = write_negatives(results, monkeypatch, "later-batch", rows)
    out = fails(bad, "every negative is a document of the corpus", capsys)
    assert "1 queries, e.g. ['q2']" in out, out


def write_mined(results, name, negative_ids, scores, policy):
    """Mined negatives of one query, with mine.py's policy in their manifest."""
    path = results / f"finetune/bert/toy/{name}/hard-negatives.parquet"
    rows = [row(["d1"], negative_ids) | {"negative_scores": scores}]
    artifacts.write_parquet(path, pa.Table.from_pylist(rows, negatives.MINED_SCHEMA),
                            negatives.MINED_SCHEMA)
    artifacts.write_manifest(artifacts.manifest_path(path), stage="mine", params={"policy": policy},
                             stats={"queries_mined": 1})
    return path


def test_mined_negatives_a_miner_never_leaves_fail(results, capsys):
    """mine.py empties a query left with fewer than min_negatives (so none keeps 1 to
    min_negatives - 1, the bound included) and scores each negative it keeps."""
    check = "no query with 1 to 2 negatives (min_negatives 3)"
    short_row = write_mined(results, "two-of-three", ["d2", "d3"], [0.5, 0.4],
                            {"min_negatives": 3})
    assert "e.g. ['q1']" in fails(short_row, check, capsys)
    passes(write_mined(results, "two-of-two", ["d2", "d3"], [0.5, 0.4], {"min_negatives": 2}),
           "no query with 1 to 1 negatives (min_negatives 2)", capsys)
    unscored = write_mined(results, "unscored", ["d2", "d3"], [0.5], {})
    assert "e.g. ['q1']" in fails(unscored, "one score per negative", capsys)


@pytest.mark.parametrize(
    "lines, check",
    [
        ("q1 Q0 d1 1 2.0 x\nq1 Q0 d9 2 1.0 x\n", "every doc_id is in corpus.parquet"),
        ("q1 Q0 d1 1 2.0 x\nq7 Q0 d2 1 1.0 x\n", "every query_id is in queries-train.parquet"),
    ],
)
def test_a_run_naming_an_id_the_dataset_lacks_fails(results, lines, check, capsys):
    """Every writer searches the split's queries in an index of the dataset's corpus."""
    unknown = "d9" if "doc_id" in check else "q7"
    bad = results / f"runs/toy/unknown-{unknown}/train.trec"
    bad.parent.mkdir(parents=True)
    bad.write_text(lines)
    assert f"1 unknown, e.g. ['{unknown}']" in fails(bad, check, capsys)
    intact = results / f"runs/toy/known-{unknown}/train.trec"
    intact.parent.mkdir(parents=True)
    intact.write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d2 2 1.0 x\n")
    passes(intact, check, capsys)


@pytest.mark.parametrize(
    "last, check",
    [
        ("q1 Q0 d1 3 0.5 x", "no document twice for a query"),
        ("q1 Q0 d3 4 0.5 x", "ranks 1..k in order per query"),
        ("q1 Q0 d3 3 3.0 x", "scores non-increasing by rank"),
    ],
)
def test_a_run_breaking_its_order_fails_naming_the_line(results, last, check, capsys):
    """A failing run check names the file's line that breaks it, not only that some query
    does: a run has millions of lines. The query's lines are interleaved with another's."""
    bad = results / f"runs/toy/order-{check.split()[0]}/train.trec"
    bad.parent.mkdir(parents=True)
    bad.write_text(f"q2 Q0 d2 1 1.0 x\nq1 Q0 d1 1 2.0 x\nq2 Q0 d3 2 0.9 x\n"
                   f"q1 Q0 d2 2 1.0 x\n{last}\n")
    out = fails(bad, check, capsys)
    assert f"FAIL  {check}: 1 queries, first query q1 at line 5: '{last}'" in out
    others = {"no document twice for a query", "ranks 1..k in order per query",
              "scores non-increasing by rank"} - {check}
    assert all(f"PASS  {other}" in out for other in others), out


def test_a_run_with_several_unknown_ids_names_the_first_queries_in_file_order(results, capsys):
    """The message of the id checks, pinned: the count, the first three unknown queries as the run
    lists them and the first three unknown documents in sorted order (as when every document id
    was sorted for the check; now only the unknown ones are)."""
    bad = results / "runs/toy/unknown-several/train.trec"
    bad.parent.mkdir(parents=True)
    bad.write_text("q9 Q0 d9 1 1.0 x\nq1 Q0 d1 1 1.0 x\nq1 Q0 d10 2 0.5 x\nq7 Q0 d2 1 1.0 x\n"
                   "q8 Q0 d8 1 1.0 x\nq5 Q0 d11 1 1.0 x\nq5 Q0 d3 2 0.5 x\n")
    out = fails(bad, "every query_id is in queries-train.parquet", capsys)
    assert "every query_id is in queries-train.parquet: 4 unknown, e.g. ['q9', 'q7', 'q8']" in out
    assert "every doc_id is in corpus.parquet: 4 unknown, e.g. ['d10', 'd11', 'd8']" in out
    assert "PASS  ranks 1..k in order per query" in out


def test_qrels_with_a_pair_judged_twice_fail(results, capsys):
    rows = {"query_id": ["q1", "q1", "q1"], "doc_id": ["d1", "d2", "d1"], "relevance": [1, 1, 2]}
    path = results / "datasets/twice/qrels-train.parquet"
    artifacts.write_parquet(path, pa.table(rows), datasets.QRELS_SCHEMA)
    assert "1 repeated rows" in fails(path, "each (query_id, doc_id) pair judged once", capsys)
    passes(results / "datasets/toy/qrels-train.parquet", "each (query_id, doc_id) pair", capsys)


def write_split(results, name, queries, qrels, stats):
    """queries-test and qrels-test beside the toy corpus, with the manifests datasets.py writes
    (`stats` as its checks counted them)."""
    folder = results / f"datasets/{name}"
    folder.mkdir(parents=True)
    shutil.copy(results / "datasets/toy/corpus.parquet", folder)
    for kind, rows, schema in (("queries", queries, datasets.QUERIES_SCHEMA),
                               ("qrels", qrels, datasets.QRELS_SCHEMA)):
        path = folder / f"{kind}-test.parquet"
        artifacts.write_parquet(path, pa.Table.from_pylist(rows, schema), schema)
        artifacts.write_manifest(artifacts.manifest_path(path), stage="datasets.split", params={},
                                 inputs={"corpus": folder / "corpus.parquet"}, stats=stats)
    return folder


def test_a_split_unlike_its_queries_corpus_or_manifest_fails(results, capsys):
    """The writer keeps only judgements of the split's queries, counts the judged documents the
    corpus lacks (refusing more than allowed) and records the counts: qrels or queries edited
    after it fail."""
    import polars as pl

    from retrieval_pretraining.contracts.datasets.checks import check_split

    queries = [{"query_id": "q1", "text": "snow"}, {"query_id": "q2", "text": "ice"}]
    qrels = [{"query_id": "q1", "doc_id": "d1", "relevance": 1},
             {"query_id": "q2", "doc_id": "d9", "relevance": 2}]  # d9: not in the corpus
    corpus_ids = pl.read_parquet(results / "datasets/toy/corpus.parquet", columns=["doc_id"])
    _, _, stats = check_split(pl.DataFrame(queries), pl.DataFrame(qrels), corpus_ids, "toy")
    checks = ["every judged query is in queries-test.parquet",
              "judged documents missing from corpus.parquet: 1, as the manifest counts",
              "relevance levels and their counts are the manifest's",
              "rows equal the manifest's qrels count"]
    intact = write_split(results, "split-intact", queries, qrels, stats)
    for check in checks:
        passes(intact / "qrels-test.parquet", check, capsys)
    passes(intact / "queries-test.parquet", "rows equal the manifest's queries count", capsys)
    # An unknown query and another unknown document, under the same manifest.
    edited = qrels + [{"query_id": "q7", "doc_id": "d8", "relevance": -1}]
    bad = write_split(results, "split-edited", queries[:1], edited, stats)
    for check in checks:
        fails(bad / "qrels-test.parquet", check, capsys)
    assert "2 unknown, e.g. ['q2', 'q7']" in audited(bad / "qrels-test.parquet", capsys)[1]
    fails(bad / "queries-test.parquet", "rows equal the manifest's queries count", capsys)


def test_qrels_with_fewer_missing_documents_or_other_level_counts_fail(results, capsys):
    """The manifest's counts are compared for equality: judgements of documents the corpus
    lacks replaced by ones it holds, or the same relevance levels counted otherwise, fail."""
    import polars as pl

    from retrieval_pretraining.contracts.datasets.checks import check_split

    queries = [{"query_id": "q1", "text": "snow"}, {"query_id": "q2", "text": "ice"}]
    qrels = [{"query_id": "q1", "doc_id": "d1", "relevance": 1},
             {"query_id": "q2", "doc_id": "d9", "relevance": 2}]  # d9: not in the corpus
    corpus_ids = pl.read_parquet(results / "datasets/toy/corpus.parquet", columns=["doc_id"])
    _, _, stats = check_split(pl.DataFrame(queries), pl.DataFrame(qrels), corpus_ids, "toy")
    edited = [qrels[0], {"query_id": "q1", "doc_id": "d2", "relevance": 1},
              {"query_id": "q2", "doc_id": "d3", "relevance": 2}]  # levels {1: 2, 2: 1}
    bad = write_split(results, "split-recounted", queries, edited, stats) / "qrels-test.parquet"
    out = fails(bad, "judged documents missing from corpus.parquet: 1, as the manifest counts",
                capsys)
    assert "found 0" in out, out
    fails(bad, "relevance levels and their counts are the manifest's", capsys)


TREC_FIELD = "one TREC field (not empty, no space, tab, \\n, \\v, \\f or \\r)"


@pytest.mark.parametrize("name, bad", [("space", "d 2"), ("vtab", "d\x0b2"), ("empty", "")])
def test_a_published_id_no_trec_line_can_hold_fails(results, capsys, name, bad):
    """datasets.py refuses such an id at preparation (checks.check_trec_ids); a dataset prepared
    before it did is flagged by `audit`: every run naming the id would fail evaluation, after the
    corpus was encoded and searched. Its corpus, queries and qrels are each checked; Unicode
    spaces are one field to trec_eval and pass."""
    passes(results / "datasets/toy/corpus.parquet", f"every doc_id {TREC_FIELD}", capsys)
    corpus = results / f"datasets/untrec-{name}/corpus.parquet"
    rows = {"doc_id": ["d1", bad, "d\u00a03"], "title": ["a", "b", "c"], "text": ["x", "y", "z"]}
    artifacts.write_parquet(corpus, pa.table(rows), datasets.CORPUS_SCHEMA)
    out = fails(corpus, f"every doc_id {TREC_FIELD}", capsys)
    assert f": 1 rows, e.g. row 1: {bad!r} " in out, out
    queries = [{"query_id": "q1", "text": "snow"}, {"query_id": bad, "text": "ice"}]
    qrels = [{"query_id": "q1", "doc_id": "d1", "relevance": 1},
             {"query_id": bad, "doc_id": "d2", "relevance": 1}]
    split = write_split(results, f"untrec-split-{name}", queries, qrels, {})
    fails(split / "queries-test.parquet", f"every query_id {TREC_FIELD}", capsys)
    out = fails(split / "qrels-test.parquet", f"every query_id {TREC_FIELD}", capsys)
    assert f"PASS  every doc_id {TREC_FIELD}" in out, out


def write_answers(results, name, answers, without_answers, without_tokens=0):
    """An answers file with the manifest datasets.py writes (which counts the questions with no
    answer and the answers with no token)."""
    path = results / f"datasets/qa/answers-{name}.parquet"
    ids = [f"q{i}" for i in range(len(answers))]
    table = pa.table({"query_id": ids, "answers": answers}, datasets.ANSWERS_SCHEMA)
    artifacts.write_parquet(path, table, datasets.ANSWERS_SCHEMA)
    artifacts.write_manifest(
        artifacts.manifest_path(path), stage="datasets.answers", params={},
        stats={"questions_without_answers": without_answers, "questions": len(answers),
               "answers_without_tokens": without_tokens},
    )
    return path


@pytest.mark.parametrize(
    "answers, counted, check",
    [
        ([["Paris"], ["  "]], 0, "answers without a token: 0, as the manifest counts"),
        ([["Paris"], ["Rome", ""]], 0, "answers without a token: 0, as the manifest counts"),
        ([["Paris"], ["Rome", None]], 0, "no answer null"),
        ([["Paris"], []], 0, "questions without an answer: 0, as the manifest counts"),
    ],
)
def test_answers_a_writer_never_leaves_fail(results, answers, counted, check, capsys):
    fails(write_answers(results, "bad", answers, counted), check, capsys)
    # A question left with no answer is kept and counted (Acc@k scores it 0); an answer with no
    # token is kept and counted (DPR's rule finds it in every passage).
    kept = write_answers(results, "intact", [["Paris"], ["Rome", "Roma", " "], []], 1, 1)
    passes(kept, "no answer null", capsys)
    passes(kept, "answers without a token: 1, as the manifest counts", capsys)
    passes(kept, "questions without an answer: 1, as the manifest counts", capsys)
    passes(kept, "row count equals the manifest's: 3 vs 3 (stats.questions)", capsys)
    pq.write_table(pq.read_table(kept).slice(0, 2), kept)  # a question lost, manifest unchanged
    fails(kept, "row count equals the manifest's: 2 vs 3 (stats.questions)", capsys)


def with_null(results, rel, column, name):
    """A copy of the fixture's Parquet file at `rel` with its first `column` value null."""
    table = pq.read_table(results / rel)
    values = table[column].to_pylist()
    values[0] = None
    path = (results / rel).with_name(name)
    pq.write_table(table.set_column(table.schema.get_field_index(column), column,
                                    pa.array(values, table.schema.field(column).type)), path)
    return path


def test_metrics_a_little_off_or_below_zero_fail(results, capsys):
    """An aggregate 0.01 from the mean of its per-query scores, and a per-query score below 0,
    fail: the tolerance is rounding's (1e-4), and the bound is [0, 1] on both sides."""
    _, metrics = scored(results, "off")
    check = "nDCG@10 aggregate = mean of per-query scores"
    passes(metrics, check, capsys)
    edit_metrics(metrics, lambda d: d["aggregate"].update({"nDCG@10": d["aggregate"]["nDCG@10"]
                                                           + 0.01}))
    fails(metrics, check, capsys)
    edit_metrics(metrics, lambda d: d["per_query"]["R@100"].update(q1=-0.5))
    assert "('q1', -0.5)" in fails(metrics, "R@100: every per-query score in [0, 1]", capsys)


def test_a_model_folder_with_a_pickled_bin_fails(results, capsys):
    """pytorch_model.bin is a pickle: loading it runs code."""
    folder = results / "pretrain/pickled/encoder"
    shutil.copytree(results / "pretrain/costa/encoder", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    assert "pytorch_model.bin" in fails(folder, "no pickled files", capsys)


@pytest.mark.parametrize("lost", [["config.json"], ["model.safetensors", "mlm_head.safetensors"]])
def test_a_model_folder_missing_its_config_or_weights_fails_rather_than_is_refused(
    results, lost, capsys
):
    """A staged checkpoint whose config.json or weights are gone still holds the manifest.json
    stage_checkpoint wrote in it: audited as a model folder, it fails the check on what is
    missing (exit 1), not refused as no artifact (exit 2; config.json and safetensors were its
    only mark). The same folder without that manifest is still refused."""
    folder = results / f"checkpoints/lost-{lost[0]}"
    shutil.copytree(results / "checkpoints/minilm", folder)
    for name in lost:
        (folder / name).unlink()
    assert audit.main([str(folder)]) == 2
    capsys.readouterr()
    artifacts.write_manifest(folder / "manifest.json", stage="stage_checkpoint", params={})
    check = "config.json readable" if lost == ["config.json"] else "weights stored as safetensors"
    assert "[model folder (Hugging Face)]" in fails(folder, check, capsys)


def test_a_model_folder_without_the_model_s_own_weights_fails_whatever_else_it_holds(
    results, capsys
):
    """A staged checkpoint that lost model.safetensors but kept mlm_head.safetensors passed
    "weights stored as safetensors" (any *.safetensors would do), and stage_checkpoint's manifest
    records no sha256 to catch it (exit 0). The model's weights are model.safetensors, or every
    shard model.safetensors.index.json names (the files bert.weight_files loads); a pre-trained
    or fine-tuned folder, with projector.safetensors beside them, still passes."""
    from retrieval_pretraining.bert import weight_files

    check = "weights stored as safetensors"
    staged = results / "checkpoints/minilm"
    passes(staged, check, capsys)
    head_only = shutil.copytree(staged, results / "checkpoints/head-only")
    artifacts.write_manifest(head_only / "manifest.json", stage="stage_checkpoint", params={})
    (head_only / "model.safetensors").unlink()
    assert "(only mlm_head.safetensors" in fails(head_only, check, capsys)

    sharded = shutil.copytree(staged, results / "checkpoints/sharded")
    artifacts.write_manifest(sharded / "manifest.json", stage="stage_checkpoint", params={})
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (sharded / "model.safetensors").rename(sharded / shards[0])
    save_file({"pooler.dense.bias": np.zeros(4, np.float32)}, str(sharded / shards[1]))
    weight_map = {"embeddings.word_embeddings.weight": shards[0], "pooler.dense.bias": shards[1]}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": weight_map}))
    assert weight_files(sharded) == [sharded / name for name in shards]
    status, out = audited(sharded, capsys)
    assert status == 0 and f"PASS  {check}" in out, out
    (sharded / shards[1]).unlink()
    assert f"missing: {shards[1]}" in fails(sharded, check, capsys)

    for stage, rel in (("pretrain", "pretrain/own/encoder"),
                       ("finetune", "finetune/own/toy/stage1/encoder")):
        folder = shutil.copytree(results / "pretrain/costa/encoder", results / rel)
        save_file({"weight": np.zeros((4, 4), np.float32)}, str(folder / "projector.safetensors"))
        artifacts.write_manifest(folder / "manifest.json", stage=stage, params={},
                                 stats={"weights": artifacts.weights_checksums(folder)})
        _, out = audited(folder, capsys)  # no exit 0: no sentence-transformers files
        assert f"PASS  {check}" in out and "PASS  weights match the sha256" in out, out
        (folder / "model.safetensors").unlink()
        assert "(only projector.safetensors" in fails(folder, check, capsys)


def test_a_tokenizer_folder_missing_its_tokenizer_json_fails_rather_than_is_refused(
    results, capsys
):
    """A staged tokenizer folder whose tokenizer.json is gone still holds stage_tokenizer's
    manifest.json: audited, it fails "tokenizer.json loads" (exit 1), not refused (exit 2)."""
    folder = results / "tokenizers/lost"
    shutil.copytree(results / "tokenizers/minilm", folder)
    (folder / "tokenizer.json").unlink()
    out = fails(folder, "tokenizer.json loads", capsys)
    assert "[tokenizer folder (staged tokenizer)]" in out, out
    (folder / "manifest.json").unlink()
    assert audit.main([str(folder)]) == 2


def test_heads_of_another_objective_than_their_encoder_fail(results, capsys):
    folder = results / "pretrain/other-objective"
    shutil.copytree(results / "pretrain/costa/encoder", folder / "encoder")
    heads = {"projector.0.weight": np.zeros((4, 4), np.float32)}
    save_file(heads, str(folder / "heads.safetensors"), metadata={"objective": "cpdae"})
    assert "cpdae vs costa" in fails(folder / "heads.safetensors",
                                     "objective equals the encoder's training.json", capsys)


def test_articles_with_one_empty_text_fail(results, capsys):
    good = results / "wikipedia/articles/p1.parquet"
    table = pq.read_table(good)
    texts = table["text"].to_pylist()
    texts[-1] = ""
    path = good.with_name("one-empty.parquet")
    index = table.schema.get_field_index("text")
    pq.write_table(table.set_column(index, table.schema.field(index), pa.array(
        texts, table.schema.field(index).type)), path)
    assert "1 empty" in fails(path, "no empty text", capsys)
    passes(good, "no empty text", capsys)


def test_a_training_log_with_a_step_logged_twice_fails(results, capsys):
    log = results / "pretrain/twice/metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 2, 3)))
    fails(log, "steps increase", capsys)
    passes(results / "pretrain/costa/metrics.jsonl", "steps increase", capsys)


@pytest.mark.parametrize(
    "rel", ["wikipedia/articles/p1.parquet", "corpus/wikipedia/chunks/shard-0000.parquet"]
)
def test_a_null_in_a_column_the_contract_declares_not_null_fails(results, rel, capsys):
    """Types alone passed a null page_id: to_numpy made it a NaN, which np.unique counts as one
    more distinct id (articles), or the renderer's arithmetic raised (chunks)."""
    bad = with_null(results, rel, "page_id", "null-page.parquet")
    status = audit.main([str(bad), str(results / rel)])
    out, err = capsys.readouterr()
    assert status == 1 and "FAIL  column page_id has no null: 1 nulls" in out, out + err
    assert "rows not shown" in out and not err
    assert out.count("PASS  column page_id has no null") == 1  # the intact file, audited after


def test_spans_longer_than_their_chunks_shard_fail(results, capsys):
    good = results / "corpus/wikipedia/spans/costa/shard-0000.parquet"
    table = pq.read_table(good)
    longer = results / "corpus/wikipedia/spans/longer/shard-0000.parquet"
    longer.parent.mkdir(parents=True)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), longer)
    out = fails(longer, "row i describes chunk i", capsys)
    assert "3 rows, the chunks shard 2" in out


def test_an_audit_that_raises_names_its_path_and_the_others_are_audited(
    results, monkeypatch, capsys
):
    """An error no check foresaw: one line naming the path, exit 3 (not 1, 'a check failed'),
    and the other paths still audited; --debug shows the traceback."""
    from retrieval_pretraining.contracts.runs import audit as run_audit

    def broken(path):
        raise RuntimeError("boom")

    monkeypatch.setattr(run_audit, "dataset_folder", broken)
    run = results / "runs/toy/bm25/test.trec"
    corpus = results / "datasets/toy/corpus.parquet"
    status = audit.main([str(run), str(corpus)])
    out, err = capsys.readouterr()
    assert status == 3, out + err
    assert err == f"audit: {run}: could not be audited (RuntimeError: boom); --debug shows the " \
        "traceback\n"
    assert f"== {corpus}  [corpus]" in out and "PASS  doc_id unique" in out
    with pytest.raises(RuntimeError, match="boom"):
        audit.main(["--debug", str(run)])


def chunks_with(results, name, column, row, values):
    """The fixture's chunks shard with `column` of `row` replaced, beside its manifest."""
    good = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    table = pq.read_table(good)
    lists = table[column].to_pylist()
    lists[row] = values
    path = results / f"corpus/wikipedia/{name}/shard-0000.parquet"
    path.parent.mkdir(parents=True)
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, pa.array(lists, pa.list_(pa.int32()))), path)
    shutil.copy(artifacts.manifest_path(good), artifacts.manifest_path(path))
    return path


def sharded_corpus(results, name):
    """The fixture's chunks as two shards of `page_id % 2` (pages 12 and 14; page 39) and a span
    shard of each, with the manifests chunk.py and spans.py write: [(chunks, spans)] by shard."""
    fixture = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    page12, page39 = pq.read_table(fixture).to_pylist()
    page14 = page12 | {"chunk_id": 14 << 16, "page_id": 14}
    shards = []
    for i, pages in enumerate(([page12, page14], [page39])):
        rows = pa.Table.from_pylist(pages, schema=chunks.SCHEMA)
        path = results / f"corpus/{name}/chunks/shard-{i:04d}.parquet"
        artifacts.write_parquet(path, rows, chunks.SCHEMA)
        artifacts.write_manifest(
            artifacts.manifest_path(path), stage="chunk_articles",
            params={"checkpoint": "minilm", "max_len": 128, "shards": 2},
            stats=shard_stats(i, rows, shards=2),
        )
        span_rows = pa.table({"chunk_id": rows["chunk_id"], "span_start": [[1]] * len(rows),
                              "span_end": [[2]] * len(rows), "granularity": [[0]] * len(rows)})
        span_path = results / f"corpus/{name}/spans/costa/shard-{i:04d}.parquet"
        artifacts.write_parquet(span_path, span_rows, spans.SCHEMA)
        artifacts.write_manifest(
            artifacts.manifest_path(span_path), stage="sample_spans", params={},
            inputs={"chunks": path}, stats={"chunks": len(span_rows)},
        )
        shards.append((path, span_path))
    return shards


@pytest.mark.parametrize(
    "rel, key",
    [
        ("wikipedia/articles/p1.parquet", "articles"),  # extract.py
        ("datasets/toy/corpus.parquet", "documents"),  # datasets.py
        ("bm25/toy/negatives.parquet", "queries"),  # bm25.py
        ("finetune/bert/toy/stage1/hard-negatives.parquet", "queries_mined"),  # mine.py
    ],
)
def test_a_file_with_a_row_removed_fails_against_its_writers_count(results, rel, key, capsys):
    """The row count was read from stats.rows alone, which these writers do not record: a file
    with rows lost (its manifest unchanged) passed."""
    table = pq.read_table(results / rel)
    path = (results / rel).with_name(f"counted-{key}.parquet")
    pq.write_table(table, path)
    artifacts.write_manifest(artifacts.manifest_path(path), stage="test", params={},
                             stats={key: len(table)})
    passes(path, f"row count equals the manifest's: {len(table)} vs {len(table)} (stats.{key})",
           capsys)
    pq.write_table(table.slice(0, len(table) - 1), path)
    fails(path, f"row count equals the manifest's: {len(table) - 1} vs {len(table)} "
          f"(stats.{key})", capsys)


def test_a_shard_copied_over_another_fails_against_its_manifest(results, capsys):
    """chunks/shard-0001.parquet copied over shard-0000.parquet passed all 18 checks: every row is
    a sound chunk, but not of this shard's pages (page_id % 2 == 0) nor as many as recorded."""
    (chunks0, spans0), (chunks1, spans1) = sharded_corpus(results, "swapped")
    for number, (path, span_path) in enumerate(((chunks0, spans0), (chunks1, spans1))):
        passes(path, f"every page_id % 2 == {number} (the manifest's sharding and shard number)",
               capsys)
        passes(path, "row count equals the manifest's", capsys)
        passes(span_path, "row count equals the manifest's", capsys)
    shutil.copy(chunks1, chunks0)
    out = fails(chunks0, "row count equals the manifest's: 1 vs 2 (stats.shard.chunks)", capsys)
    assert ("FAIL  every page_id % 2 == 0 (the manifest's sharding and shard number): 1 chunks of "
            "other shards' pages, first page_id 39") in out
    assert "FAIL  pages equal the manifest's (stats.shard.pages): 1 vs 2" in out
    assert "FAIL  tokens equal the manifest's (stats.shard.tokens)" in out
    shutil.copy(spans1, spans0)
    fails(spans0, "row count equals the manifest's: 1 vs 2 (stats.chunks)", capsys)


def test_chunks_the_writer_would_refuse_fail(results, capsys):
    """[SEP] inside a chunk's text, and word_starts naming a continuation piece ('##bedo' of
    'albedo'): the sortedness and range checks passed both; chunk.py's validate_chunks does not."""
    good = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    ids = pq.read_table(good)["input_ids"][0].as_py()
    sep = chunks_with(results, "sep-inside", "input_ids", 0, ids[:3] + [102] + ids[3:])
    check = "every chunk as chunk.py checks it"
    assert "holds [CLS]/[SEP] inside its text" in fails(sep, check, capsys)
    starts = pq.read_table(good)["word_starts"][1].as_py()  # the, al, of, ...: not ##bedo (3)
    every = chunks_with(results, "every-token", "word_starts", 1, sorted(starts + [3]))
    out = fails(every, check, capsys)
    assert "not exactly its word-starting tokens" in out and "PASS  word_starts sorted" in out
    passes(good, check, capsys)


def test_a_chunk_without_text_fails_without_the_tokenizer(results, capsys, monkeypatch):
    """`[CLS][SEP]` (length 2, no text token): chunk.py never writes it, and the check of its
    length needs no tokenizer (here none is found)."""
    from retrieval_pretraining.contracts.chunks import audit as chunks_audit

    monkeypatch.setattr(chunks_audit, "manifest_tokenizer", lambda *_: (None, None))
    check = "every chunk >= 3 tokens ([CLS], a text token, [SEP])"
    empty = chunks_with(results, "no-text", "input_ids", 0, [101, 102])
    assert "shortest 2" in fails(empty, check, capsys)
    good = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    passes(good, check, capsys)
    # The figure it states is the shard's own, not the bound.
    shortest = min(map(len, pq.read_table(good, columns=["input_ids"])["input_ids"].to_pylist()))
    assert shortest > 3 and f"{check}: shortest {shortest}" in audited(good, capsys)[1]


def test_a_chunk_twice_in_a_row_fails(results, capsys):
    """A chunk repeated right after itself: sorted, yet not unique (the row count and the
    per-row checks pass it where no manifest counts the shard)."""
    table = pq.read_table(results / "corpus/wikipedia/chunks/shard-0000.parquet")
    last = len(table) - 1
    path = results / "corpus/wikipedia/adjacent/shard-0000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.concat_tables([table, table.slice(last)]), path)
    chunk_id = table["chunk_id"][last].as_py()
    out = fails(path, "chunk_id sorted and unique", capsys)
    assert f"1 rows, first row {last + 1}: chunk_id {chunk_id} after {chunk_id}" in out, out


@pytest.mark.parametrize("where", ["again", "at [SEP]"])
def test_word_starts_repeated_or_at_sep_fail_without_the_tokenizer(
    results, capsys, monkeypatch, where
):
    """Without the tokenizer chunk.py's check is not run: the range and order check of
    word_starts is all that sees a start named twice or one on the closing [SEP]."""
    from retrieval_pretraining.contracts.chunks import audit as chunks_audit

    monkeypatch.setattr(chunks_audit, "manifest_tokenizer", lambda *_: (None, None))
    good = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    table = pq.read_table(good)
    starts = table["word_starts"][1].as_py()
    extra = starts[-1] if where == "again" else len(table["input_ids"][1]) - 1
    bad = chunks_with(results, f"starts-{where.replace(' ', '-')}", "word_starts", 1,
                      starts + [extra])
    check = "word_starts sorted, inside the text tokens"
    assert "first bad row [1]" in fails(bad, check, capsys)
    passes(good, check, capsys)


def test_a_chunk_one_token_over_max_len_fails(results, capsys):
    good = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    ids = pq.read_table(good)["input_ids"][0].as_py()
    longer = ids[:-1] + [ids[1]] * (129 - len(ids)) + [ids[-1]]  # the manifest's max_len: 128
    bad = chunks_with(results, "over-max-len", "input_ids", 0, longer)
    assert "longest 129" in fails(bad, "every chunk <= max_len 128", capsys)
    passes(good, "every chunk <= max_len 128", capsys)


def test_spans_of_other_chunks_in_as_many_rows_fail(results, capsys):
    """Row i's spans are read against chunk i: a spans shard with its rows in another order
    (as many as the chunks) reads each chunk's spans against another chunk."""
    good = results / "corpus/wikipedia/spans/costa/shard-0000.parquet"
    table = pq.read_table(good)
    path = results / "corpus/wikipedia/spans/reordered/shard-0000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(table.take(pa.array(range(len(table) - 1, -1, -1))), path)
    fails(path, "row i describes chunk i (chunk_id equal row by row)", capsys)
    passes(good, "row i describes chunk i (chunk_id equal row by row)", capsys)


def snakemake_output(project, rel, rule):
    """Snakemake's record of `rel` as an output of a job of `rule` (.snakemake/metadata)."""
    import base64

    meta = project / ".snakemake/metadata"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / base64.urlsafe_b64encode(rel.encode()).decode()).write_text(json.dumps({"rule": rule}))


def test_a_damaged_file_the_workflow_wrote_fails_rather_than_is_refused(
    results, tmp_path, capsys
):
    """Cut short (a full disk, a copy interrupted), an artifact no longer reads as its kind; its
    manifest or Snakemake's record says the workflow wrote it, so it is a failed check (exit 1),
    not 'not an artifact' (exit 2), which a tree's audit then reported over every failure."""
    source = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    shard = results / "corpus/cut/chunks/shard-0000.parquet"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(source.read_bytes()[:-100])
    shutil.copy(artifacts.manifest_path(source), artifacts.manifest_path(shard))
    run = tmp_path / "results/runs/toy/bm25/test.trec"
    run.parent.mkdir(parents=True)
    run.write_text("q1 Q0 d1 1 9.5 bm25\nq1 Q0 d3")
    snakemake_output(tmp_path, "results/runs/toy/bm25/test.trec", "publish_bm25_run")
    status, out = audited(shard, capsys)
    assert status == 1, out
    assert (f"FAIL  reads as the artifact this workflow wrote: {shard} is not a readable Parquet "
            "file") in out and "stage: chunk_artic" in out
    assert "rerun the rule that wrote it" in out
    status = audit.main([str(run), str(results / "runs/toy/bm25/test.trec")])
    out = capsys.readouterr().out
    assert status == 1, out
    assert (f"FAIL  reads as the artifact this workflow wrote: {run}:2: expected 6 fields") in out
    assert "rule publish_bm25_run" in out
    # The same bytes that nothing says the workflow wrote are still refused as what they are.
    stray = tmp_path / "stray/test.trec"
    stray.parent.mkdir()
    shutil.copy(run, stray)
    status, out = audited(stray, capsys)
    assert status == 2, out
    # Nor is a file inside a folder output (Snakemake records the folder), nor a job log.
    marker = tmp_path / "results/bm25/toy/index/.snakemake_timestamp"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    snakemake_output(tmp_path, "results/bm25/toy/index", "build_bm25_index")
    log = tmp_path / "results/logs/publish_bm25_run/toy/test.log"
    log.parent.mkdir(parents=True)
    log.write_text("done\n")
    for path in (marker, log):
        assert audit.main([str(path)]) == 2
        assert "not an artifact" in capsys.readouterr().err


def test_a_lucene_index_without_its_segments_fails_rather_than_is_refused(results, capsys):
    """A BM25 index folder whose segments_N is gone (a copy cut short, a file deleted) still
    holds the manifest.json build_bm25_index wrote in it: it is audited as a Lucene index and
    fails "has a segments file" (exit 1), and so does a file in it, not refused as no artifact
    (exit 2; segments were its only mark, so that check could never fail). A folder holding
    another stage's manifest is not claimed."""
    index = results / "bm25/no-segments/index"
    shutil.copytree(results / "bm25/toy/index", index)
    artifacts.write_manifest(index / "manifest.json", stage="bm25.index", params={},
                             inputs={"corpus": "results/datasets/no-segments/corpus.parquet"})
    (index / "_0.cfs").write_bytes(b"\x00" * 10)
    passes(index, "has a segments file", capsys)
    (index / "segments_1").unlink()
    out = fails(index, "has a segments file", capsys)
    assert "[Lucene index folder]" in out, out
    assert "[file of a Lucene index folder]" in fails(index / "_0.cfs", "has a segments file",
                                                      capsys)
    other = results / "bm25/other-stage/index"
    other.mkdir(parents=True)
    artifacts.write_manifest(other / "manifest.json", stage="bm25.search", params={})
    (other / "_0.cfs").write_bytes(b"\x00" * 10)
    for path in (other, other / "_0.cfs"):
        assert audit.main([str(path)]) == 2, path
        assert f"audit: {path}" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["no index", "no docid", "index cut short"])
def test_a_faiss_folder_missing_or_with_a_damaged_index_fails_rather_than_is_refused(
    results, damage, capsys
):
    """A dense index folder holding the manifest.json build_dense_index wrote in it, whose
    `index` or `docid` is gone or whose `index` no longer reads: a failed check (exit 1), not
    'not an artifact' (exit 2), for the folder and for the file. The same bytes with no manifest
    are still refused as what they are."""
    good = results / "index/bert/toy/stage1"
    folder = results / f"index/bert/{damage.replace(' ', '-')}/faiss"
    folder.mkdir(parents=True)
    for file in ("index", "docid"):
        shutil.copy(good / file, folder)
    passes(folder, "one docid line per vector (Pyserini FaissSearcher layout)", capsys)
    if damage == "index cut short":
        (folder / "index").write_bytes((good / "index").read_bytes()[:20])
        assert audit.main([str(folder)]) == 2 and audit.main([str(folder / "index")]) == 2
        capsys.readouterr()
    else:
        (folder / damage.split()[1]).unlink()
    artifacts.write_manifest(folder / "manifest.json", stage="build_dense_index", params={},
                             stats={"documents": 3, "dim": 4})
    check = ("index reads as a FAISS index" if damage == "index cut short"
             else "has index and docid (Pyserini layout)")
    out = fails(folder, check, capsys)
    assert "[FAISS folder (Pyserini layout: index + docid)]" in out and "build_dense_index" in out
    left = folder / ("docid" if damage == "no index" else "index")
    fails(left, check, capsys)


@pytest.mark.parametrize(
    "rel, column",
    [
        ("wikipedia/articles/p1.parquet", "page_id"),
        ("bm25/toy/negatives.parquet", "query_id"),
        ("index/bert/toy/stage1/shard-0000.ids.parquet", "doc_id"),
        ("corpus/wikipedia/chunks/shard-0000.parquet", "chunk_id"),
    ],
)
def test_an_id_twice_fails_naming_the_id_and_its_rows(results, rel, column, capsys):
    """An id check that fails names the id and the rows holding it (the file has millions)."""
    table = pq.read_table(results / rel)
    rows = pa.concat_tables([table, table.slice(0, 1)])
    path = (results / rel).with_name(f"twice-{column}.parquet")
    pq.write_table(rows, path)
    first = table[column][0].as_py()
    if column == "chunk_id":
        out = fails(path, "chunk_id sorted and unique", capsys)
        last = len(table)
        assert (f"FAIL  chunk_id sorted and unique: 1 rows, first row {last}: chunk_id {first} "
                f"after {table[column][last - 1].as_py()}") in out
    else:
        out = fails(path, f"{column} unique", capsys)
        assert (f"FAIL  {column} unique: 1 values repeated; first {first!r} at rows "
                f"[0, {len(table)}]") in out


def test_a_repeated_null_id_is_named_as_null_with_its_rows(tmp_path):
    """A null repeated in an id column read "first None at rows []": equal() to null is null,
    never true, so its rows were not found."""
    from retrieval_pretraining.contracts.base import Audit, check_unique

    a = Audit(tmp_path / "t.parquet")
    ids = pa.chunked_array([["b", None], ["a", None, "a", None]])
    assert not check_unique(a, "query_id", ids)
    assert a.checks[-1][2] == "2 values repeated; first null at rows [1, 3, 5]"
    assert not check_unique(a, "query_id", pa.array(["a", "b", "a"]))
    assert a.checks[-1][2] == "1 values repeated; first 'a' at rows [0, 2]"


def test_a_chunk_id_unlike_its_page_and_index_fails_naming_the_row(results, capsys):
    table = pq.read_table(results / "corpus/wikipedia/chunks/shard-0000.parquet")
    ids = table["chunk_id"].to_pylist()
    path = results / "corpus/wikipedia/chunks/off-by-one.parquet"
    pq.write_table(table.set_column(0, "chunk_id", pa.array([ids[0], ids[1] + 1], pa.int64())),
                   path)
    page, index = table["page_id"][1].as_py(), table["chunk_index"][1].as_py()
    assert table.schema.names[0] == "chunk_id"
    out = fails(path, "chunk_id == (page_id << 16) + chunk_index", capsys)
    assert (f"chunk_index: 1 rows, first row 1: chunk_id {ids[1] + 1}, page_id {page}, "
            f"chunk_index {index}") in out


@pytest.mark.parametrize("name, row_range", [("text", "1..3"), ("short", [1]), ("word", [1, "3"]),
                                             ("reversed", [3, 1]), ("null", None)])
def test_embeddings_whose_manifest_row_range_is_no_range_fail(results, capsys, name, row_range):
    """stats.row_range was unpacked and sliced as it stood: a string, a short list or a word in
    it ended the audit as "could not be audited" (ValueError / TypeError, exit 3)."""
    recorded = {"rows": 2, "row_range": row_range, "dim": 4, "dtype": "float16"}
    shard = write_shard(results, f"range-{name}", np.ones((2, 4), np.float16),
                        ["d2", "d3"], recorded)
    out = fails(shard, "the manifest's stats.row_range is [first, end] corpus rows", capsys)
    assert json.dumps(row_range) in out, out
