"""Stage a base checkpoint (weights + tokenizer) or its tokenizer alone as a Hugging Face folder.

The tokenizer alone (`--tokenizer-only`, rule stage_tokenizer) is what the corpus stages read.

Every later stage reads `results/checkpoints/<name>/` (or `results/tokenizers/<name>/`) and nothing
else, so where the weights came
from (a folder inside an installed package for the offline demo, the Hugging Face Hub at paper
scale, or a local folder) is decided once, here. Hub downloads happen in this stage only, which the
workflow runs as a local rule before any GPU job: compute nodes may be offline.

Weights are re-saved as safetensors (never pickles), and `num_layers` can truncate the encoder to
its first N layers so that the CPU demo trains in minutes with the same code as paper scale.
A source that is a sentence-transformers model keeps no sentence-transformers files here; how it
embeds (pooling, normalisation, length) is recorded in the manifest's stats, where the `none`
export reads it (st_export.pretrained_use). A source whose embedding the staged folder cannot
reproduce (a Dense module, a pooling other than cls or mean) is refused. A Hub source's manifest
(checkpoint and tokenizer alike) records the commit it was staged from as stats.resolved_revision,
whatever `revision` said.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

from . import artifacts
from .config import ConfigError, refuse_unknown, resolve_path, section_schema, stage_parser
from .errors import REBUILD, InputFileError, command, expect_positive_int, fixed_by
from .model_folder import check_folder_vocabulary, load_model
from .tokenizer_files import auto_tokenizer
from .wordpiece import position_limit

log = logging.getLogger(__name__)

# Files that make up a tokenizer folder; copied verbatim when present.
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
)


def package_folder(location: str) -> Path:
    """`pkg/sub/dir` -> the folder `sub/dir` inside the installed package `pkg` (imports nothing)."""
    package, _, inner = location.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"checkpoint package '{package}' is not installed; install it (see requirements-nodeps.txt)"
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / inner
    if not folder.is_dir():
        raise FileNotFoundError(f"package '{package}' has no folder '{inner}' ({folder})")
    return folder


# The entry keys that decide the tokenizer. The corpus stages depend on the tokenizer alone
# (`stage_tokenizer`), so that truncating the encoder (`num_layers`) does not re-chunk the corpus.
TOKENIZER_KEYS = ("name", "source", "location", "revision")


def source_folder(
    entry: dict[str, Any],
    data_root: str | None = None,
    patterns: tuple[str, ...] = ("*.json", "*.txt", "*.safetensors"),
) -> Path:
    """The folder holding the checkpoint's files, fetching `patterns` from the Hub (source=hub).

    Hub files go to the Hugging Face cache (HF_HOME / HF_HUB_CACHE), not a folder of this run: a
    restage of the same revision (any edit of the code the rule depends on reruns it) then works
    offline, with HF_HUB_OFFLINE=1 as the README exports it. Offline (or with the Hub unreachable),
    a cached snapshot without the weights asked for (stage_tokenizer's) is refused saying so, with
    the command that fetches them.
    """
    source, location = entry["source"], entry["location"]
    if source == "package":
        return package_folder(location)
    if source == "local":
        # Config paths stay inside the project or the configured data root, like every other path.
        folder = resolve_path(location, data_root)
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
        return folder
    # Lazy import: only the download path needs huggingface_hub's network client.
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(location, revision=entry.get("revision"),
                                        allow_patterns=list(patterns)))
    except LocalEntryNotFoundError as error:  # offline or unreachable, and not in the cache
        # An IncompleteSnapshotError names the snapshot it found (its cached file listing says
        # files are missing): stage_tokenizer's, without the weights, is the usual one.
        snapshot = getattr(error, "snapshot_path", None)
        if snapshot is not None and _weights_missing(Path(snapshot), patterns):
            raise _weights_not_cached(entry, Path(snapshot), patterns) from error
        raise FileNotFoundError(
            f"Hub checkpoint {location} (revision {entry.get('revision') or 'main'}) is not in "
            f"the Hugging Face cache ({_hub_cache()}) and {_not_downloaded('it')}: run "
            "stage_checkpoint / stage_tokenizer once online (README, Slurm step 2), or point "
            "HF_HOME at the cache that holds it"
        ) from error
    # Offline or with the Hub unreachable, a snapshot is returned as cached whatever it lacks when
    # no file listing of it was cached: without this, the tokenizer's snapshot was refused as a
    # model folder with "no *.safetensors weights", which reads as if the Hub revision had none.
    if _weights_missing(folder, patterns) and (
        constants.is_offline_mode() or not _listing_cached(location, folder)
    ):
        raise _weights_not_cached(entry, folder, patterns)
    return folder


def _listing_cached(location: str, snapshot: Path) -> bool:
    """Whether the cache holds the Hub's file listing of the snapshot's commit. snapshot_download
    caches it whenever it reads the Hub, and refuses a snapshot that lacks a listed file when it
    cannot: without a listing, the snapshot came from the cache alone, the Hub unread; with one, a
    file the snapshot lacks is one the Hub revision lacks."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        get_cached_repo_tree(location, revision=snapshot.name)
    except CachedRepoTreeNotFoundError:
        return False
    return True


def _not_downloaded(what: str) -> str:
    """Why snapshot_download kept to the cache: HF_HUB_OFFLINE, or else a Hub it could not reach."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return f"HF_HUB_OFFLINE forbids downloading {what}"
    return f"the Hub could not be reached to download {what} (HF_HUB_OFFLINE is not set)"


def _weights_missing(snapshot: Path, patterns: tuple[str, ...]) -> bool:
    """The weights were asked for and the cached snapshot has none."""
    return "*.safetensors" in patterns and not any(snapshot.glob("*.safetensors"))


def _weights_not_cached(
    entry: dict[str, Any], snapshot: Path, patterns: tuple[str, ...]
) -> FileNotFoundError:
    """Offline or with the Hub unreachable, the cache holds the repository's tokenizer
    (stage_tokenizer fetches only that) but not its weights: say so, and how to fetch them at the
    snapshot's commit, so that the weights match the tokenizer the corpus was chunked with."""
    location = entry["location"]
    held = sorted(p.name for p in snapshot.iterdir()) if snapshot.is_dir() else []
    what = "tokenizer" if set(held) & set(_TOKENIZER_FILES) else "files"
    commit = snapshot.name if _COMMIT.fullmatch(snapshot.name) else None
    revision = commit or entry.get("revision") or "main"
    include = " ".join(f"--include '{pattern}'" for pattern in patterns)
    return FileNotFoundError(
        f"Hub checkpoint {location} (revision {entry.get('revision') or 'main'}): the Hugging "
        f"Face cache ({_hub_cache()}) has its {what} but not its weights (*.safetensors; the "
        f"snapshot holds {', '.join(held) or 'nothing'}), and {_not_downloaded('them')}: "
        "stage_tokenizer fetches the tokenizer alone. Fetch the weights once online: run "
        "stage_checkpoint there (README, Slurm step 2), or on a machine with network and this "
        "cache (HF_HOME / HF_HUB_CACHE pointing at it) "
        f"`hf download {location} --revision {revision} {include}`"
    )


def _hub_cache() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or str(constants.HF_HUB_CACHE)


def _source_fix(entry: dict[str, Any]) -> contextlib.AbstractContextManager:
    """The fix a source's file this stage cannot read gets (errors.fixed_by): no stage of ours
    writes a Hub checkpoint's files, the user's own folder (source: local) or an installed
    package's (staging writes our copy), so "rebuild it with the stage that writes it" named
    none that could."""
    source, location = entry["source"], entry["location"]
    if source == "local":
        return fixed_by(
            f"it is the local checkpoint folder {location}, which no stage writes: copy the "
            "checkpoint's files there again from where it was saved (tokenizer files and "
            "config.json included), or point `location` at another folder")
    if source == "package":
        package = location.partition("/")[0]
        return fixed_by(
            f"it ships in the installed package '{package}', which no stage writes: reinstall "
            f"it ({_reinstall(package)}), or use another checkpoint")
    return fixed_by(
        f"the Hub checkpoint {entry['location']} (revision {entry.get('revision') or 'main'}) "
        "holds it so: pin another revision, or use another checkpoint (a download damaged in "
        f"the Hugging Face cache, {_hub_cache()}: delete its snapshot there and stage again)")


def _reinstall(package: str) -> str:
    """The pip command that puts back the files of the installed import package `package`: its
    distribution at the version installed, without dependencies (requirements-nodeps.txt's
    declare far more than we use). The fix said "as requirements-nodeps.txt pins it", true of
    the demo's package alone. The distribution is looked up by the package's name, else among
    every installed one's (~0.3 s: a distribution named otherwise, PyYAML for yaml)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        names = metadata.packages_distributions().get(package)
        if not names:
            return ("pip install --force-reinstall --no-deps, at the version installed, the "
                    "distribution that ships it")
        dist = metadata.distribution(names[0])
    return f"pip install --force-reinstall --no-deps {dist.metadata['Name']}=={dist.version}"


_COMMIT = re.compile(r"[0-9a-f]{40}")


def resolved_revision(entry: dict[str, Any], folder: Path) -> dict[str, str]:
    """`{"resolved_revision": <commit>}` for a Hub source, else {}: the commit it was staged from.

    An entry's `revision` may be null (the Hub's `main`), which names no fixed files;
    snapshot_download returns `<cache>/snapshots/<commit>`, so the commit is kept from its name.
    stage_tokenizer and stage_checkpoint download separately: this is what shows both staged the
    same commit (pretrain.data.check_tokenizer refuses chunks of another one).
    """
    if entry["source"] != "hub":
        return {}
    if not _COMMIT.fullmatch(folder.name):
        raise RuntimeError(
            f"{entry['location']}: the Hub download {folder} is not a snapshots/<commit> folder, "
            "so the commit it was staged from cannot be recorded; pin `revision` to a commit"
        )
    return {"resolved_revision": folder.name}


MLM_HEAD_FILE = "mlm_head.safetensors"
_MLM_HEAD_PREFIX = "cls.predictions."


def save_mlm_head(source: Path, out_file: Path) -> int:
    """Keep the source's pre-trained MLM head (`cls.predictions.*`) beside the encoder.

    AutoModel drops it, but MLM-based objectives must continue from the trained head, not a fresh
    one (bert-base-uncased has it; the demo MiniLM has none, and the trainer then initialises one).
    Tensors are saved under transformers' current names: bert-base-uncased's Hub file still uses
    the legacy `LayerNorm.gamma`/`.beta`, which the trainer's strict head load would refuse.
    Returns the number of tensors saved (0: no head, no file written).
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .bert import legacy_layernorm_name

    tensors = {}
    for weights in sorted(Path(source).glob("*.safetensors")):
        with safe_open(weights, framework="pt") as handle:
            for key in handle.keys():
                if key.startswith(_MLM_HEAD_PREFIX):
                    tensors[legacy_layernorm_name(key)] = handle.get_tensor(key).contiguous()
    if tensors:
        save_file(tensors, out_file)
    return len(tensors)


def sentence_transformers_files(folder: Path) -> dict[str, Any] | None:
    """What a sentence-transformers source's files say about how it embeds: its module types,
    its Pooling module's config and its max_seq_length (None: not a sentence-transformers model).

    Recorded as the files state it (a max_seq_length that is no positive integer is refused);
    st_export.pretrained_use interprets it. Importing st_export here would make every edit of
    the model card rerun stage_tokenizer, and the corpus after it.
    """
    listing = Path(folder) / "modules.json"
    if not listing.is_file():
        return None
    modules = artifacts.read_json(listing, "a sentence-transformers modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        # REBUILD: staging's _source_fix says the source's own fix in its place (errors.fixed_by).
        raise InputFileError(f"{listing}: not a JSON array of objects, as a sentence-transformers "
                             f"modules.json is; {REBUILD}")
    pooling = [Path(folder) / m.get("path", "") / "config.json" for m in modules
               if str(m.get("type", "")).endswith(".Pooling")]
    if not pooling or not pooling[0].is_file():
        return None
    settings, what = Path(folder) / "sentence_bert_config.json", "a sentence_bert_config.json"
    # Checked here, where the file is read: recorded as it was, it failed later (int() of it).
    length = (expect_positive_int(artifacts.read_json_object(settings, what).get(
        "max_seq_length"), "max_seq_length", settings, what) if settings.is_file() else None)
    return {"modules": [m.get("type") for m in modules], "max_seq_length": length,
            "pooling": artifacts.read_json_object(pooling[0], "a Pooling module's config.json")}


# sentence-transformers' Pooling flags our encoder reproduces (contracts.models.POOLING_FLAGS: not
# imported, so that a contract edit does not rerun stage_tokenizer and the corpus after it).
_POOLINGS_WE_ENCODE = ({"pooling_mode_cls_token"}, {"pooling_mode_mean_tokens"})


def refuse_unencodable(folder: Path, record: dict[str, Any] | None) -> None:
    """Refuse a sentence-transformers source whose embedding the staged folder cannot reproduce:
    a Dense module (its projection is not staged, so the vectors would come from another model's
    layer) or a pooling other than cls or mean (max, weighted mean, several at once)."""
    if record is None:
        return
    if any(str(m).endswith(".Dense") for m in record["modules"]):
        raise ConfigError(f"{folder}: the sentence-transformers model has a Dense module after its "
                         "pooling, which staging does not keep; its embeddings cannot be "
                         "reproduced from the staged folder. Use a model without one")
    flags = {k for k, v in (record["pooling"] or {}).items() if k.startswith("pooling_mode_") and v
             is True}
    if flags not in _POOLINGS_WE_ENCODE:
        raise ConfigError(f"{folder}: the sentence-transformers model pools with "
                         f"{', '.join(sorted(flags)) or 'no mode'}; the encoder does cls or mean "
                         "pooling only, so it would embed as another model")


@contextlib.contextmanager
def _staging(out_dir: Path) -> Iterator[Path]:
    """The staged folder, in a temp folder beside `out_dir`; on success it replaces `out_dir`, so
    a failed run never leaves a half folder there."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with artifacts.temp_dir(out_dir) as tmp:  # a killed staging's folder removed first
        staged = tmp / "staged"
        yield staged
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staged.rename(out_dir)


def check_entry(entry: dict[str, Any]) -> None:
    """Refuse a key a `checkpoints` entry does not have (a typo would be silently ignored)."""
    refuse_unknown(entry, section_schema("checkpoints")["items"], "checkpoints")


def stage(entry: dict[str, Any], out_dir: Path, data_root: str | None = None) -> dict[str, Any]:
    """Write the checkpoint named by `entry` to `out_dir` (atomically: a temp folder, then rename)."""
    check_entry(entry)
    with _staging(out_dir) as staged, _source_fix(entry):
        folder = source_folder(entry, data_root)
        # Safetensors only: a folder holding only pytorch_model.bin (a pickle) is refused. Read by
        # transformers itself (native=False): whatever the source's layout (a task model's prefix,
        # old tensor names), the staged folder is transformers' own BertModel files.
        embedding = sentence_transformers_files(folder)
        refuse_unencodable(folder, embedding)
        tokenizer = auto_tokenizer(folder, use_fast=True)
        # Before anything is written: ids past the embeddings would fail every stage after this.
        check_folder_vocabulary(folder, tokenizer)
        model = load_model(folder, native=False)
        original_layers = model.config.num_hidden_layers
        num_layers = entry.get("num_layers")
        if num_layers is not None and num_layers < original_layers:
            # Keep the first N layers: a shallower copy of the same model, not a new architecture.
            model.encoder.layer = model.encoder.layer[:num_layers]
            model.config.num_hidden_layers = num_layers
        model.save_pretrained(staged, safe_serialization=True)
        tokenizer.save_pretrained(staged)
        head_tensors = save_mlm_head(folder, staged / MLM_HEAD_FILE)
        stats = {
            "architecture": model.config.model_type,
            "hidden_size": model.config.hidden_size,
            "num_layers": model.config.num_hidden_layers,
            "original_num_layers": original_layers,
            "vocab_size": tokenizer.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "mlm_head_tensors": head_tensors,
            # Only recorded: the staged folder is a plain checkpoint (audit would take
            # modules.json for an encoder's), but the `none` export keeps the source's embedding.
            "sentence_transformers": embedding,
        } | resolved_revision(entry, folder)
        artifacts.write_manifest(
            staged / "manifest.json", stage="stage_checkpoint", params=entry, stats=stats
        )
    log.info("staged checkpoint %s -> %s (%s)", entry["name"], out_dir, stats)
    return stats


def stage_tokenizer(
    entry: dict[str, Any], out_dir: Path, data_root: str | None = None
) -> dict[str, Any]:
    """Write only the tokenizer of the checkpoint named by `entry` to `out_dir` (atomically)."""
    check_entry(entry)
    entry = {key: entry[key] for key in TOKENIZER_KEYS if key in entry}
    with _staging(out_dir) as staged, _source_fix(entry):
        folder = source_folder(entry, data_root, patterns=("*.json", "*.txt"))
        tokenizer = auto_tokenizer(folder, use_fast=True)
        if (folder / "config.json").is_file():  # the earliest check: the corpus is chunked with it
            check_folder_vocabulary(folder, tokenizer)
        tokenizer.save_pretrained(staged)
        stats = {"tokenizer_class": type(tokenizer).__name__, "vocab_size": tokenizer.vocab_size,
                 # What the corpus stages check max_len against (no config.json is staged here).
                 "max_position_embeddings": position_limit(folder)}
        stats |= resolved_revision(entry, folder)
        artifacts.write_manifest(
            staged / "manifest.json", stage="stage_tokenizer", params=entry, stats=stats
        )
    log.info("staged the tokenizer of %s -> %s (%s)", entry["name"], out_dir, stats)
    return stats


@command
def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    parser.add_argument(
        "--data-root", default=None, help="the config's data_root (local checkpoints may lie there)"
    )
    parser.add_argument(
        "--tokenizer-only", action="store_true", help="stage the tokenizer alone (corpus stages)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    (stage_tokenizer if args.tokenizer_only else stage)(args.config, args.out, args.data_root)


if __name__ == "__main__":
    main()
