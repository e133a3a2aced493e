"""Upload one encoder folder to the Hugging Face Hub, as the sentence-transformers model it is.

    python -m retrieval_pretraining.publish --folder results/finetune/costa/scifact/stage2/encoder \
        --repo-id you/costa-scifact [--private] [--dry-run]

The folder is checked first, and nothing is sent when a check fails (a stage's folder given for
the encoder folder in it is refused naming that one): Hugging Face weights as
safetensors and no pickle anywhere in it, its records (training.json, manifest.json), the
sentence-transformers files st_export.py writes (modules.json and every module folder it names,
1_Pooling, sentence_bert_config.json) agreeing with each other, config.json and the card as
`python -m retrieval_pretraining.audit` checks them, every weight finite and each weight file the
one manifest.json's stats.weights records (its sha256), and a model card whose YAML front matter
holds the workflow's block. Every file of the folder is uploaded
(training.json and manifest.json are its records); `--dry-run` prints that list, the repository and
its visibility, and never touches the network. An existing repository must already have the
visibility asked for (`--private` or not); its files are replaced by the folder's (a file the
folder lacks is deleted from it). Records or a card that name absolute local paths (a `source:
local` corpus location, an `init` folder: where this machine keeps files, user names included)
are refused unless `--allow-local-paths` says to publish them as they are. A real upload needs a
token (`hf auth login`, or HF_TOKEN) and HF_HUB_OFFLINE unset (the Makefile sets it for runs;
checked after the folder, before the list of files is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import yaml

from huggingface_hub import HfApi
from huggingface_hub.errors import HFValidationError, LocalTokenNotFoundError
from huggingface_hub.utils import validate_repo_id

from .contracts.base import Audit, folder_stage
from .contracts.models import CARD_BLOCK, ST_FILES
from .contracts.models.audit import MODEL_STAGES, sentence_transformers_view, weights_mismatches
from .contracts.tensors.audit import tensors_not_finite
from .errors import BadInput, add_debug_option, command
from .model_folder import PICKLE_PATTERNS, check_safetensors
from .st_export import read_card

REEXPORT = ("rerun the rule that wrote it (an encoder exported before the workflow wrote "
            "sentence-transformers files: delete the folder and rerun)")
# No stats.weights: the folder predates the checksums, not the sentence-transformers files; only
# a fresh export records them (checksums added by hand would vouch for weights nothing checked).
NO_CHECKSUMS = ("records no weight checksums (stats.weights, the sha256 of each weight file that "
                "the pretrain and finetune exports write), so its weights cannot be verified as "
                "the ones its records describe: a folder exported before the checksums were "
                "recorded must be exported again. Delete it and rerun the rule that wrote it "
                "(pretrain_model, export_base_encoder, reuse_pretraining, finetune_stage1/2): "
                "a trained encoder is trained again")


# The folder's own records: a published model without them cannot say how it was made.
RECORDS = ("training.json", "manifest.json")


# An absolute POSIX path in a record's text: a slash not preceded by a word character, a colon or
# a slash (so URLs and relative paths do not count), then at least one named folder.
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.@+-]+/)+[\w.@+-]*")


class PublishError(BadInput, ValueError):
    """A folder or repository id that is not uploaded, or an upload that cannot start."""


def folder_files(folder: Path) -> list[str]:
    """Every file of the folder (paths relative to it, sorted), hidden names left out."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not any(part.startswith(".")
                                             for part in p.relative_to(folder).parts))


def _read_json(folder: Path, name: str) -> object:
    """A JSON file of the folder, or a one-line PublishError naming it."""
    try:
        return json.loads((folder / name).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PublishError(f"{folder}/{name} is not valid JSON ({error}); {REEXPORT}") from None


def _module_paths(folder: Path) -> list[str]:
    """The module folders modules.json names; PublishError when it is not a list of modules."""
    modules = _read_json(folder, "modules.json")
    if not isinstance(modules, list) or not all(
            isinstance(m, dict) and isinstance(m.get("path"), str) for m in modules):
        raise PublishError(f"{folder}/modules.json is not a list of modules with a `path` each; "
                           f"{REEXPORT}")
    return [m["path"] for m in modules if m["path"]]


def _card(folder: Path) -> dict:
    try:
        return read_card(folder)
    except yaml.YAMLError as error:
        problem = " ".join(str(error).split())  # one line: yaml's message spans several
        raise PublishError(f"{folder}/README.md: its front matter is not YAML ({problem}); "
                           f"{REEXPORT}") from None


def check_folder(folder: str | Path) -> list[str]:
    """The files to upload, once the folder is a complete encoder export that `audit` would pass
    as a sentence-transformers model; else PublishError."""
    folder = Path(folder)
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise PublishError(_no_config(folder))
    folder = check_safetensors(folder)  # config.json + safetensors; a pickle-only folder refused
    pickles = sorted({p.relative_to(folder).as_posix() for pattern in PICKLE_PATTERNS
                      for p in folder.rglob(pattern)})
    if pickles:
        raise PublishError(f"{folder} holds pickled files ({', '.join(pickles)}) besides its "
                           "safetensors; only safetensors are uploaded: remove them")
    missing = [name for name in (*ST_FILES, *RECORDS) if not (folder / name).is_file()]
    if not missing:
        missing = [path for path in _module_paths(folder) if not (folder / path).is_dir()]
    if missing:
        raise PublishError(f"{folder} is not a complete sentence-transformers export (missing "
                           f"{', '.join(missing)}); {REEXPORT}")
    # Every JSON file parsed here first, so that a broken one is named, not a traceback below.
    for name in folder_files(folder):
        if name.endswith(".json"):
            _read_json(folder, name)
    check_weights(folder)
    config = _read_json(folder, "config.json")
    card = _card(folder)
    if not isinstance(card.get(CARD_BLOCK), dict) or card.get("library_name") is None:
        raise PublishError(f"{folder}/README.md has no model card front matter (YAML with "
                           f"library_name and {CARD_BLOCK}); {REEXPORT}")
    record = Audit(folder)  # a file the view cannot read fails its check `<file> readable`
    try:
        found = sentence_transformers_view(record, folder, config)
    except (AttributeError, KeyError, TypeError, ValueError) as error:  # a file of the wrong shape
        found = ("", [f"its sentence-transformers files cannot be read ({error!r})"])
    problems = [detail for _, ok, detail in record.checks if not ok] + (found or ("", []))[1]
    if problems:
        raise PublishError(f"{folder} fails audit's sentence-transformers check: "
                           f"{'; '.join(problems)}; {REEXPORT}")
    return folder_files(folder)


def _no_config(folder: Path) -> str:
    """What to say of a folder without config.json: "rebuild it" only for a model folder the
    workflow wrote that lost it; any other folder (a dataset's, a stage's) is no encoder at all,
    and rerunning the stage that wrote it would not make it one."""
    if (folder / "encoder").is_dir():  # a stage's folder (results/finetune/<m>/<d>/stage2)
        return (f"{folder} is not an encoder folder (no config.json) but holds one: "
                f"give --folder {folder / 'encoder'}")
    stage = folder_stage(folder)  # None: no manifest.json, or one that does not read
    weights = sorted(p.name for p in folder.glob("*.safetensors"))
    if stage in MODEL_STAGES or weights:
        sign = (f"its manifest.json is stage {stage}'s" if stage in MODEL_STAGES
                else f"it holds {', '.join(weights[:3])}")
        return (f"{folder} is a model folder ({sign}) that lost its config.json; delete it and "
                "rerun the rule that wrote it")
    return (f"{folder} is not an encoder folder (no config.json); give an encoder folder, such "
            "as results/finetune/<model>/<dataset>/stage<k>/encoder")


def check_weights(folder: Path) -> None:
    """PublishError when a weight is nan or inf (a run that diverged exports such weights, and
    they load without complaint) or a weight file is not the one manifest.json records (swapped
    or rewritten after the export: the card and records would describe other weights)."""
    bad = [f"{w.relative_to(folder).as_posix()}: {name}"
           for w in sorted(folder.rglob("*.safetensors")) for name in tensors_not_finite(w)]
    if bad:
        raise PublishError(f"{folder} holds weights that are not finite (nan or inf: "
                           f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); the run "
                           "that trained them diverged: retrain, do not publish")
    mismatches = weights_mismatches(folder)
    if mismatches is None:
        raise PublishError(f"{folder}/manifest.json {NO_CHECKSUMS}")
    if mismatches:
        raise PublishError(f"{folder}'s weights are not the ones manifest.json records "
                           f"({'; '.join(mismatches)}): a weight file was replaced or changed "
                           "after the export, so the card and records describe other weights; "
                           "delete the folder and rerun the rule that wrote it")


def local_paths(folder: Path) -> dict[str, list[str]]:
    """The absolute paths each record and the card name, by file (none: {})."""
    found = {}
    for name in (*RECORDS, "README.md"):
        paths = sorted(set(_ABSOLUTE_PATH.findall((folder / name).read_text(errors="replace"))))
        if paths:
            found[name] = paths
    return found


def check_local_paths(folder: Path, allow: bool) -> None:
    """PublishError when the records name absolute local paths and `allow` is not given."""
    found = local_paths(folder)
    if not found or allow:
        return
    listed = "; ".join(f"{name}: {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
                       for name, paths in found.items())
    raise PublishError(f"{folder}'s records name absolute local paths ({listed}): where this "
                       "machine keeps files, user names included. Rerun with --allow-local-paths "
                       "to publish them as they are; nothing was sent")


def plan(folder: Path, files: list[str], repo_id: str, private: bool) -> str:
    sizes = {name: (folder / name).stat().st_size for name in files}
    lines = [f"{len(files)} files, {sum(sizes.values()) / 1e6:.1f} MB, from {folder} to "
             f"https://huggingface.co/{repo_id} ({'private' if private else 'public'}):"]
    lines += [f"  {name}  ({size:,} bytes)" for name, size in sizes.items()]
    return "\n".join(lines)


def check_visibility(repo_id: str, is_private: bool, private: bool) -> None:
    """PublishError when the repository's visibility is not the one asked for."""
    if is_private == private:
        return
    state, asked = ("private", "public") if is_private else ("public", "private")
    raise PublishError(f"{repo_id} exists and is {state}, but the upload was asked to be {asked} "
                       f"(--private {'given' if private else 'absent'}); change its "
                       "visibility on the Hub (Settings) or the flag, then rerun; nothing was sent")


def check_online() -> None:
    """PublishError when HF_HUB_OFFLINE is set: huggingface_hub would refuse every request."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise PublishError("HF_HUB_OFFLINE is set (the Makefile sets it for runs); unset it for "
                           "the upload: `HF_HUB_OFFLINE=0 python -m "
                           "retrieval_pretraining.publish ...`")


def upload(folder: Path, files: list[str], repo_id: str, private: bool, message: str) -> str:
    """Create the repository if needed and upload the files in one commit; the commit's URL.

    An existing repository keeps its visibility (create_repo ignores `private` then), so it is
    compared with the request first. The commit replaces the repository's files: a file of an
    earlier upload that this folder no longer has (a projector.safetensors, which this project's
    loaders would attach) is deleted, not left beside the new ones."""
    check_online()
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        check_visibility(repo_id, bool(api.repo_info(repo_id, repo_type="model").private),
                         private)
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model",
                                   allow_patterns=files, delete_patterns=["*"],
                                   commit_message=message)
    except LocalTokenNotFoundError as error:
        raise PublishError(f"no Hugging Face token to upload to {repo_id}; run `hf auth login` "
                           "or set HF_TOKEN") from error
    return str(getattr(commit, "commit_url", commit))


@command
def main(argv: list[str] | None = None) -> int:
    parser = add_debug_option(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--folder", type=Path, required=True, help="an encoder folder")
    parser.add_argument("--repo-id", required=True, help="the Hub model repository: owner/name")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the folder and print what would be uploaded; no network")
    parser.add_argument("--commit-message", default=None)
    parser.add_argument("--allow-local-paths", action="store_true",
                        help="publish records that name absolute local paths as they are")
    args = parser.parse_args(argv)
    try:
        validate_repo_id(args.repo_id)
        if "/" not in args.repo_id:
            raise HFValidationError("it names no owner")
    except HFValidationError as error:
        raise PublishError(f"--repo-id {args.repo_id!r} is not a Hub repository id "
                           f"({error}); write owner/name") from error
    files = check_folder(args.folder)
    check_local_paths(args.folder, args.allow_local_paths)
    if not args.dry_run:
        check_online()  # before "uploading ...": a list of files that are then not sent misleads
    print(("would upload " if args.dry_run else "uploading ")
          + plan(args.folder, files, args.repo_id, args.private), flush=True)
    if args.dry_run:
        return 0
    message = args.commit_message or f"Upload {args.folder} (retrieval-pretraining)"
    print(f"uploaded: {upload(args.folder, files, args.repo_id, args.private, message)}")
    return 0


if __name__ == "__main__":
    main()
