"""Resumable training state, written without pickle, and which job a state belongs to.

Checkpoints: tensors go to safetensors files, everything else (optimizer and scheduler structure,
RNG states, the data position) to JSON, inside a folder `step-XXXXXXXX/` that is renamed into place
(atomic); `latest.json` names the newest complete one. `claim_state` keeps a state only for the job
that wrote it, so a rerun of the same command resumes and a run with other settings or inputs
starts afresh (the old state set aside, not deleted).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .. import artifacts
from ..errors import InputFileError, one_line
from .distributed import DistEnv, barrier

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- which job --------------------
def claim_state(state_dir: str | os.PathLike, job: dict[str, Any], env: DistEnv,
                aside: str | os.PathLike | None = None) -> Path | None:
    """Resume only a run of the same job: a state left by other settings or inputs is set aside.

    `job` is what a resumable state must match (the trainer's settings, seed and inputs, without
    the knobs that cannot change the result); it is kept in `state_dir/job.json`. A folder whose
    job.json differs, or that has none or one that is not JSON (so nobody can tell what wrote
    it), is moved, never deleted, to `<aside>.superseded-<time>/` (`aside` defaults to
    `state_dir`): days of training are not lost to an edited setting, and the log names the
    folder and how to delete it. The main rank decides; every rank returns once it has (the
    folder moved to, on the main rank).
    Call before load_state and before anything writes there.
    """
    state_dir = Path(state_dir)
    marker = state_dir / "job.json"
    moved = None
    if env.is_main:
        wanted = json.loads(json.dumps(job, sort_keys=True, default=str))  # as read back from disk
        found, unreadable = _recorded_job(marker)
        if state_dir.exists() and found != wanted and any(state_dir.iterdir()):
            why = unreadable or ("it records no job" if found is None
                                 else "it differs in " + ", ".join(_differences(found, wanted)))
            moved = _set_aside(state_dir, Path(aside or state_dir))
            log.warning("the resume state in %s was left by another job (%s): starting afresh; "
                        "the old state was moved to %s (delete it with `rm -r %s` once it is "
                        "not needed, or move it back to resume it with its own settings)",
                        state_dir, why, moved, moved)
        artifacts.write_json(marker, wanted)
    barrier(env)
    return moved


def _recorded_job(marker: Path) -> tuple[Any, str | None]:
    """The job `marker` records (None without one), and why it cannot be read where it cannot.
    Raising there would fail the main rank while the others wait at claim_state's barrier, and
    every rerun the same way; a job.json cut short by the disk or edited into non-JSON tells no
    more than a missing one, so its state is set aside as one that records no job."""
    if not marker.exists():
        return None, None
    try:
        return _parsed(marker), None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        return None, f"its job.json cannot be read ({type(error).__name__}: {one_line(error)})"


def _set_aside(state_dir: Path, aside: Path) -> Path:
    """Rename `state_dir` to a new `<aside>.superseded-<UTC time>[-n]` (a rename: no copy)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = aside.with_name(f"{aside.name}.superseded-{stamp}")
    n = 1
    while target.exists():  # two jobs superseded within a second
        target = aside.with_name(f"{aside.name}.superseded-{stamp}-{n}")
        n += 1
    state_dir.rename(target)
    return target


def _differences(found: Any, wanted: Any, path: str = "") -> list[str]:
    """Dotted keys whose values differ (at most 5), so the log says what changed."""
    if not (isinstance(found, dict) and isinstance(wanted, dict)):
        return [path or "(the whole job)"]
    out: list[str] = []
    for key in sorted(set(found) | set(wanted)):
        if found.get(key) != wanted.get(key):
            out += _differences(found.get(key), wanted.get(key), f"{path}.{key}" if path else key)
    return out[:5]


# ---------------------------------------------------------------- pickle-free flattening -------
def _flatten(prefix: str, obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace every tensor inside a nested dict/list by a reference; collect the tensors."""
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"{prefix}"
        tensors[key] = torch.from_numpy(obj.copy())
        return {"__tensor__": key, "__numpy__": True}
    if isinstance(obj, dict):
        # JSON keys are strings: remember integer keys (optimizer state is keyed by param index).
        return {"__dict__": [[k, isinstance(k, int), _flatten(f"{prefix}.{k}", v, tensors)]
                             for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {
            "__seq__": [_flatten(f"{prefix}.{i}", v, tensors) for i, v in enumerate(obj)],
            "tuple": isinstance(obj, tuple),
        }
    if callable(obj):
        return None  # LambdaLR keeps its lambdas in state_dict as None-able entries: rebuilt
    return obj


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            if obj["__tensor__"] not in tensors:  # a hand edit, or the files of two saves
                raise ValueError(f"it names the tensor {obj['__tensor__']!r}, which "
                                 "state.safetensors lacks")
            tensor = tensors[obj["__tensor__"]]
            return tensor.numpy() if obj.get("__numpy__") else tensor
        if "__dict__" in obj:
            return {(int(k) if is_int else k): _unflatten(v, tensors)
                    for k, is_int, v in obj["__dict__"]}
        if "__seq__" in obj:
            items = [_unflatten(v, tensors) for v in obj["__seq__"]]
            return tuple(items) if obj["tuple"] else items
    return obj


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # One state per GPU the saving process saw; a run may resume with fewer visible (another
        # process count, claim_state): set_rng_state_all would index past them.
        for index, cuda_state in enumerate(list(state["cuda"])[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


# ---------------------------------------------------------------- save / load ------------------
def save_state(
    state_dir: str | os.PathLike,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    data_position: dict[str, Any],
    extra: dict[str, Any] | None = None,
    keep: int = 1,
) -> Path:
    """Write a resumable checkpoint `state_dir/step-XXXXXXXX/` atomically; keep the newest `keep`.

    Call on the main rank only (after the step: all ranks hold the same weights). RNG states are
    those of the calling process; every rank's data randomness is derived from (seed, item id),
    so other ranks need none saved.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final = state_dir / name
    latest = state_dir / "latest.json"
    if (final.is_dir() and latest.exists() and artifacts.read_json_object(
            latest, "a resumable state's latest.json").get("checkpoint") == name):
        # Saved already (the periodic save, then a stop signal in the same step). Replacing it
        # would delete the only complete state before its copy is in place: a kill in between
        # would leave latest.json naming nothing.
        return final
    # Temp folders of saves that never finished (killed, or the disk filled) are never read;
    # they would only hold space.
    for stale in state_dir.glob(".step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    model_sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    _refuse_nonfinite(model_sd, step)
    tmp = state_dir / f".{name}.tmp"
    tmp.mkdir()
    try:
        # Tied weights share storage; safetensors refuses shared tensors, so store clones.
        save_file({k: v.clone() for k, v in model_sd.items()}, tmp / "model.safetensors")
        tensors: dict[str, torch.Tensor] = {}
        meta = {
            "step": step,
            "data_position": data_position,
            "extra": extra or {},
            "optimizer": _flatten("optimizer", optimizer.state_dict(), tensors),
            "scheduler": _flatten("scheduler", scheduler.state_dict(), tensors),
            "rng": _flatten("rng", rng_state(), tensors),
            "saved": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        save_file(tensors, tmp / "state.safetensors")
        (tmp / "state.json").write_text(json.dumps(meta, indent=1))
        artifacts.sync(tmp)  # before latest.json may name it: a crashed node leaves it whole
        if final.exists():  # complete, but latest.json never named it (killed before that)
            shutil.rmtree(final)
        tmp.rename(final)
        artifacts.sync_folder(state_dir)
    finally:
        if tmp.exists():  # the save failed part-way (a full disk): keep only complete states
            shutil.rmtree(tmp, ignore_errors=True)
    artifacts.write_json(latest, {"checkpoint": name, "step": step})
    _prune(state_dir, name, keep)
    log.info("saved resumable state at step %d -> %s", step, final)
    return final


def _prune(state_dir: Path, current: str, keep: int) -> None:
    """Delete the states latest.json no longer needs: those after `current` (complete saves whose
    latest.json update failed, never resumed now) and all but the newest `keep` up to it. The
    state just named is never among them, even when such a stale later folder exists."""
    older = []
    for folder in state_dir.glob("step-*"):
        if folder.name > current:  # zero-padded step numbers: name order is step order
            shutil.rmtree(folder, ignore_errors=True)
        elif folder.name < current:
            older.append(folder)
    for folder in sorted(older)[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(folder, ignore_errors=True)


def _refuse_nonfinite(model_sd: dict[str, torch.Tensor], step: int) -> None:
    """Raise before writing weights that hold NaN/inf: every resume would start from them and
    fail again (a crash loop), while the last finite state is what a rerun needs."""
    bad = [k for k, v in model_sd.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise FloatingPointError(
            f"refusing to save the state of step {step}: non-finite weights in {bad[:5]}; the "
            "previous saved state is kept (lower the learning rate, or use precision fp32)")


def load_state(
    state_dir: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> dict[str, Any] | None:
    """Restore the newest checkpoint in `state_dir` into model/optimizer/scheduler and the RNGs.

    Returns {"step", "data_position", "extra"} or None when there is nothing to resume.
    """
    latest = Path(state_dir) / "latest.json"
    if not latest.exists():
        return None
    name = _read(latest, state_dir, lambda path: _state_name(
        _keys(_parsed(path), checkpoint=str)))
    folder = Path(state_dir) / name["checkpoint"]
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{latest} names the state {folder.name}, which is missing from {state_dir}; delete "
            f"{state_dir} to start afresh (its resumable progress is lost)")
    model.load_state_dict(_read(folder / "model.safetensors", state_dir, load_file))
    tensors = _read(folder / "state.safetensors", state_dir, load_file)
    meta = _read(folder / "state.json", state_dir, lambda path: _restored(_step_count(_keys(
        _parsed(path), "step", "data_position", "extra", "optimizer", "scheduler",
        "rng"), folder.name), tensors))
    optimizer.load_state_dict(meta["optimizer"])
    sched = meta["scheduler"]
    # The schedule function is rebuilt from config; LambdaLR stores None for plain functions.
    sched["lr_lambdas"] = [None] * len(sched.get("lr_lambdas") or [None])
    scheduler.load_state_dict(sched)
    set_rng_state(meta["rng"])
    log.info("resumed from %s (step %d)", folder, meta["step"])
    return {"step": meta["step"], "data_position": meta["data_position"], "extra": meta["extra"]}


def _parsed(path: Path) -> Any:
    """The JSON in `path`, its errors raw (not artifacts.read_json's InputFileError): the callers
    name the file as resume state themselves, with their own fix (_read, _recorded_job)."""
    return json.loads(path.read_text(encoding="utf-8"))


def _read(path: Path, state_dir: str | os.PathLike, read: Any) -> Any:
    """`read(path)`, or InputFileError naming the file, what is wrong and the fix. Saves are
    atomic, so a damaged file comes from the disk or a hand edit: the raw parse error named
    neither, and every requeue of the job failed the same way. The state is never set aside
    here: it may be restorable, and it holds the job's progress."""
    try:
        return read(path)
    except PermissionError:
        raise  # names the path; the fix is its permissions, not the state
    except Exception as error:  # json's, safetensors' (SafetensorError), an I/O error (EIO)
        what = error.strerror if isinstance(error, OSError) and error.strerror else one_line(error)
        raise InputFileError(
            f"{path}: the resumable state cannot be read ({type(error).__name__}: {what}); "
            f"restore the file, or move or delete {state_dir} to start afresh (its resumable "
            "progress is lost)") from error


def _keys(record: Any, *keys: str, **typed: type) -> dict[str, Any]:
    """`record` if it is an object holding `keys`, and `typed`'s keys with values of their types
    (a hand-edited file may not be)."""
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object but {type(record).__name__}")
    missing = [key for key in (*keys, *typed) if key not in record]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    for key, kind in typed.items():
        if not isinstance(record[key], kind):
            raise ValueError(f"{key} is not a {kind.__name__} but {type(record[key]).__name__}")
    return record


def _state_name(record: dict[str, Any]) -> dict[str, Any]:
    """`record` (latest.json) if its checkpoint is a state folder's name, as save_state writes
    it: "" named the state folder itself and a path another folder, so the resume failed on a
    model.safetensors missing there, naming neither latest.json nor the fix."""
    if not re.fullmatch(r"step-[0-9]{8,}", record["checkpoint"]):
        raise ValueError("checkpoint is not a state folder's name (step-NNNNNNNN) but "
                         f"{record['checkpoint']!r}")
    return record


def _step_count(meta: dict[str, Any], folder: str) -> dict[str, Any]:
    """`meta` (state.json) if its step is an integer >= 0 and the step its folder is named for:
    a hand-edited string failed later in the trainer's arithmetic, a negative step resumed into
    steps the run never had, and another step (a state.json copied from another save, a hand
    edit) resumed the schedule and data at one step with the weights of another."""
    step = meta["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step is not a step count (an integer >= 0) but {step!r}")
    if step != int(folder.removeprefix("step-")):
        raise ValueError(f"step is {step}, but the state's folder {folder} was saved at step "
                         f"{int(folder.removeprefix('step-'))}")
    return meta


def _restored(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """`meta` with the optimizer, scheduler and RNG states rebuilt from `tensors` (inside `_read`:
    a reference to a tensor the file lacks is the state's damage, named as such)."""
    return {**meta, **{key: _unflatten(meta[key], tensors)
                       for key in ("optimizer", "scheduler", "rng")}}
