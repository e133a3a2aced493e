"""`python -m retrieval_pretraining.publish`: the folder is checked, a dry run lists what would be
uploaded and never touches the network, and the upload goes through HfApi (mocked here: tests
never touch the network)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import pretrain_fixtures as fx
from retrieval_pretraining import publish
from retrieval_pretraining.pretrain.train import export_base
from retrieval_pretraining.retrieval_settings import RetrievalSettings


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    """A `none` export of a tiny checkpoint: what the workflow writes for an encoder."""
    tmp = tmp_path_factory.mktemp("publish")
    fx.tiny_checkpoint(tmp / "checkpoint")
    # As Snakemake runs it: from the project, with relative paths (records name no local path).
    here = os.getcwd()
    os.chdir(tmp)
    try:
        export_base({"name": "base", "objective": "none", "seed": 1, "checkpoint": "x"},
                    Path("checkpoint"), Path("encoder"), Path("m.jsonl"), Path("l.png"),
                    RetrievalSettings(pooling="mean", similarity="cosine"))
    finally:
        os.chdir(here)
    return tmp / "encoder"


class NoNetwork:
    def __init__(self, *args, **kwargs):
        raise AssertionError("HfApi was created: the command reached for the network")


class FakeHub:
    """Records what the command asks of the Hub; `existing`: repositories there already, with
    whether each is private (create_repo leaves an existing one's visibility, as the Hub does)."""

    calls: list = []
    existing: dict = {}

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        self.existing.setdefault(repo_id, kwargs.get("private", False))

    def repo_info(self, repo_id, **kwargs):
        return type("ModelInfo", (), {"private": self.existing[repo_id]})()

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        return type("Commit", (), {"commit_url": "https://huggingface.co/me/enc/commit/1"})()


def test_a_dry_run_lists_the_files_and_never_touches_the_network(encoder, monkeypatch, capsys):
    monkeypatch.setattr(publish, "HfApi", NoNetwork)
    assert publish.main(["--folder", str(encoder), "--repo-id", "me/enc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would upload" in out and "https://huggingface.co/me/enc (public)" in out
    for name in ("model.safetensors", "modules.json", "1_Pooling/config.json",
                 "2_Normalize/config.json", "sentence_bert_config.json", "README.md"):
        assert f"  {name}  (" in out, name


def test_the_upload_creates_the_repository_and_sends_the_checked_files(encoder, monkeypatch,
                                                                         capsys):
    monkeypatch.setattr(publish, "HfApi", FakeHub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    FakeHub.calls, FakeHub.existing = [], {}
    assert publish.main(["--folder", str(encoder), "--repo-id", "me/enc", "--private"]) == 0
    (create, repo, options), (upload, sent) = FakeHub.calls
    assert (create, repo, options["private"]) == ("create_repo", "me/enc", True)
    assert upload == "upload_folder" and sent["repo_id"] == "me/enc"
    assert sent["allow_patterns"] == publish.folder_files(encoder)
    # A re-upload replaces the repository's files: none of an earlier upload is left behind.
    assert sent["delete_patterns"] == ["*"]
    assert "uploaded: https://huggingface.co/me/enc/commit/1" in capsys.readouterr().out


@pytest.mark.parametrize("existing, flag", [(False, ["--private"]), (True, [])],
                         ids=["public repo, --private", "private repo, public upload"])
def test_an_existing_repository_of_the_other_visibility_is_refused(encoder, monkeypatch, capsys,
                                                                  existing, flag):
    """create_repo(exist_ok=True) keeps an existing repository's visibility: `--private` must
    never upload to a public one while saying "(private)"."""
    monkeypatch.setattr(publish, "HfApi", FakeHub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    FakeHub.calls, FakeHub.existing = [], {"me/enc": existing}
    line = _refused(["--folder", encoder, "--repo-id", "me/enc", *flag], capsys)
    assert f"me/enc exists and is {'private' if existing else 'public'}" in line, line
    assert [call[0] for call in FakeHub.calls] == ["create_repo"]  # nothing uploaded


def _rewrite(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def _rewrite_weights(folder: Path, change) -> None:
    """model.safetensors with `change` applied to its first tensor, saved as the export saves it."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = change(weights[name].copy())
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _nan_first(values):
    values.flat[0] = float("nan")
    return values


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        publish.main([str(a) for a in argv])
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_offline_mode_is_named_before_any_request(encoder, monkeypatch, capsys):
    """Refused before the plan is printed: "uploading 12 files ..." came first, then the refusal,
    a list of files said to be uploading that were never sent."""
    monkeypatch.setattr(publish, "HfApi", NoNetwork)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as stop:
        publish.main(["--folder", str(encoder), "--repo-id", "me/enc"])
    captured = capsys.readouterr()
    assert stop.value.code == 1 and "HF_HUB_OFFLINE is set" in captured.err, captured.err
    assert captured.out == "", captured.out
    # A dry run never touches the network, so offline mode does not stop it.
    assert publish.main(["--folder", str(encoder), "--repo-id", "me/enc", "--dry-run"]) == 0
    assert "would upload" in capsys.readouterr().out


def test_a_stage_folder_is_told_to_give_its_encoder_folder(encoder, tmp_path, capsys):
    """A stage's folder (results/finetune/<model>/<dataset>/stage2) given for its encoder/ was
    told "has no config.json; rebuild it with the stage that writes it": rerun a stage whose
    output is fine. It is told the folder to give."""
    stage = tmp_path / "stage2"
    shutil.copytree(encoder, stage / "encoder")
    line = _refused(["--folder", stage, "--repo-id", "me/enc", "--dry-run"], capsys)
    assert line.endswith(f"holds one: give --folder {stage / 'encoder'}"), line
    assert "rebuild" not in line, line


@pytest.mark.parametrize("files", [
    {"notes.txt": "x"},  # any folder
    {"corpus.parquet": "x", "manifest.json": '{"stage": "prepare_dataset"}'},  # a dataset's
    {"manifest.json": "not json"},
])
def test_a_folder_that_is_no_encoder_is_told_what_to_give(files, tmp_path, capsys):
    """A folder that is no model folder at all (results/datasets/scifact) was told "has no
    config.json; rebuild it with the stage that writes it": rerunning that stage would not make
    it an encoder. It is told it is none, and which folder to give."""
    folder = tmp_path / "scifact"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    line = _refused(["--folder", folder, "--repo-id", "me/enc", "--dry-run"], capsys)
    assert line.endswith(f"{folder} is not an encoder folder (no config.json); give an encoder "
                         "folder, such as results/finetune/<model>/<dataset>/stage<k>/encoder"
                         ), line
    assert "rebuild" not in line and "rerun" not in line, line


@pytest.mark.parametrize("keep, sign", [
    ("manifest.json", "its manifest.json is stage pretrain's"),
    ("model.safetensors", "it holds model.safetensors"),
])
def test_an_encoder_that_lost_its_config_is_told_to_rebuild(encoder, tmp_path, capsys, keep,
                                                              sign):
    """A folder the workflow wrote (its manifest.json's stage, or safetensors weights) that lost
    config.json is still told to rebuild it, saying why the folder is taken for a model."""
    folder = tmp_path / "encoder"
    folder.mkdir()
    shutil.copy(encoder / keep, folder / keep)
    line = _refused(["--folder", folder, "--repo-id", "me/enc", "--dry-run"], capsys)
    assert line.endswith(f"{folder} is a model folder ({sign}) that lost its config.json; delete "
                         "it and rerun the rule that wrote it"), line


@pytest.mark.parametrize("damage, named", [
    (lambda f: (f / "modules.json").unlink(), "missing modules.json"),
    (lambda f: shutil.rmtree(f / "2_Normalize"), "missing 2_Normalize"),
    (lambda f: (f / "pytorch_model.bin").write_bytes(b"x"), "pickled files (pytorch_model.bin)"),
    (lambda f: (f / "README.md").write_text("# no front matter\n"), "no model card front matter"),
    (lambda f: (f / "model.safetensors").unlink(), "no *.safetensors weights"),
    (lambda f: (f / "training.json").unlink(), "missing training.json"),
    (lambda f: (f / "manifest.json").unlink(), "missing manifest.json"),
    (lambda f: (f / "modules.json").write_text("[{"), "modules.json is not valid JSON"),
    (lambda f: (f / "modules.json").write_text('{"path": ""}'), "modules.json is not a list"),
    (lambda f: (f / "sentence_bert_config.json").write_text("{"),
     "sentence_bert_config.json is not valid JSON"),
    (lambda f: (f / "README.md").write_text("---\nlibrary_name: [x\n---\n"),
     "README.md: its front matter is not YAML"),
    (lambda f: _rewrite(f / "1_Pooling/config.json", pooling_mode_cls_token=True),
     "fails audit's sentence-transformers check: pooling modes"),
    (lambda f: _rewrite(f / "sentence_bert_config.json", max_seq_length=100000),
     "fails audit's sentence-transformers check: max_seq_length 100000"),
    (lambda f: (f / "modules.json").write_text(
        json.dumps(json.loads((f / "modules.json").read_text())[:2])),
     "fails audit's sentence-transformers check: modules"),
    # A run that diverged exports nan weights, which load without complaint.
    (lambda f: _rewrite_weights(f, _nan_first), "weights that are not finite (nan or inf: "
     "model.safetensors: "),
    # Weights swapped after the export: the card and records describe other ones.
    (lambda f: _rewrite_weights(f, lambda v: v + 1), "weights are not the ones manifest.json "
     "records (model.safetensors: sha256 "),
    (lambda f: _rewrite(f / "manifest.json", stats={}), "records no weight checksums"),
])
@pytest.mark.parametrize("mode", [["--dry-run"], []], ids=["dry run", "upload"])
def test_an_incomplete_folder_is_refused_naming_what_is_wrong(encoder, tmp_path, monkeypatch,
                                                              capsys, damage, named, mode):
    """Refused before any request, for a real upload as for a dry run (NoNetwork: nothing sent)."""
    monkeypatch.setattr(publish, "HfApi", NoNetwork)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    folder = shutil.copytree(encoder, tmp_path / "encoder")
    damage(folder)
    line = _refused(["--folder", folder, "--repo-id", "me/enc", *mode], capsys)
    assert str(folder) in line and named in line, line


def test_a_folder_without_weight_checksums_is_told_to_export_again(encoder, tmp_path, capsys):
    """A folder exported before stats.weights was recorded: the message says what is missing and
    that the folder must be exported again, not that it lacks sentence-transformers files."""
    folder = shutil.copytree(encoder, tmp_path / "encoder")
    _rewrite(folder / "manifest.json", stats={"steps": 3})
    line = _refused(["--folder", folder, "--repo-id", "me/enc", "--dry-run"], capsys)
    assert f"{folder}/manifest.json records no weight checksums (stats.weights" in line
    assert "exported before the checksums were recorded" in line and "Delete it and rerun" in line
    assert "sentence-transformers" not in line, line


def test_weights_changed_after_the_export_are_told_so(encoder, tmp_path, capsys):
    """The cause is a weight file replaced after the export, not a missing sentence-transformers
    file: the message says so, and what to do."""
    folder = shutil.copytree(encoder, tmp_path / "encoder")
    _rewrite_weights(folder, lambda v: v + 1)
    line = _refused(["--folder", folder, "--repo-id", "me/enc", "--dry-run"], capsys)
    assert "replaced or changed after the export" in line and "rerun the rule" in line, line
    assert "sentence-transformers" not in line, line


@pytest.mark.parametrize("repo_id", ["enc", "me/enc with space", "me/../enc"])
def test_a_repository_id_that_is_not_one_is_refused(encoder, monkeypatch, capsys, repo_id):
    monkeypatch.setattr(publish, "HfApi", NoNetwork)
    line = _refused(["--folder", encoder, "--repo-id", repo_id, "--dry-run"], capsys)
    assert repr(repo_id) in line and "owner/name" in line


def test_records_that_name_local_paths_are_published_only_when_allowed(encoder, tmp_path,
                                                                       monkeypatch, capsys):
    """A `source: local` corpus or an `init` folder given as an absolute path names where this
    machine keeps files (user names included); URLs and relative paths are no such thing."""
    monkeypatch.setattr(publish, "HfApi", FakeHub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    folder = shutil.copytree(encoder, tmp_path / "encoder")
    info = json.loads((folder / "training.json").read_text())
    info["settings"]["corpora"] = [{"source": "local", "path": "/home/alice/corpus/texts.jsonl"},
                                   {"url": "https://huggingface.co/datasets/x/y/a.b"},
                                   {"path": "results/corpus/wiki"}]
    (folder / "training.json").write_text(json.dumps(info))
    FakeHub.calls, FakeHub.existing = [], {}
    line = _refused(["--folder", folder, "--repo-id", "me/enc"], capsys)
    assert "training.json: /home/alice/corpus/texts.jsonl" in line and "--allow-local-paths" in line
    assert "huggingface" not in line and "results/corpus" not in line and FakeHub.calls == []
    assert publish.main(["--folder", str(folder), "--repo-id", "me/enc",
                         "--allow-local-paths"]) == 0
    assert [call[0] for call in FakeHub.calls] == ["create_repo", "upload_folder"]
