"""Checkpoints with exact resume: RUN_DIR/checkpoints/ckpt-<epoch:06d>/ holds

- `agent.safetensors`: every parameter and buffer of the agent (online and EMA target heads, PopArt
  statistics, observation-normalisation statistics), written with safetensors' `save_model`;
- `optimizer.pt`: the AdamW and learning-rate scheduler state dicts, plain tensors and numbers, read back
  with `torch.load(weights_only=True)` (a file that needs arbitrary unpickling is refused);
- `state.json`: the epoch, the counters (env steps, updates, the collector's state), the exploration state
  (per-env scales and its numpy generator state), the learner's REDQ generator state, the Python, numpy
  and torch RNG states and the run's config.

Nothing is ever unpickled. A checkpoint is written into a temporary folder whose files are fsynced, then
renamed into place (atomic on POSIX), then `checkpoints/latest` is replaced atomically; a process killed
at any moment leaves either the previous checkpoints or the new one, never a half-written `ckpt-*`
(stray `.tmp-*` folders are ignored and cleaned up). Only the last `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model

from icrl.fileio import atomic_path, check_inside, fsync_file, write_text_atomic
from icrl.guards import assert_finite_weights
from icrl.nets.transformer import refresh_acting_weights
from icrl.run.ckpt_checks import CheckpointMismatch, check_checkpoint, unmatched_names

FILES = ("agent.safetensors", "optimizer.pt", "state.json")
FORMAT_VERSION = 1
PREFIX = "ckpt-"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt or not made of the expected safe files."""


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    """RUN_DIR/checkpoints; OutsideRunDirError when it is a symlink leading out (saving and pruning would write
    and delete there)."""
    return check_inside(run_dir, Path(run_dir) / "checkpoints")


# ------------------------------------------------------------------------------------------ RNG states
def rng_state() -> dict[str, Any]:
    """Python, numpy (global) and torch RNG states as JSON-compatible values."""
    version, words, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": [version, list(words), gauss],
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])},
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": np.asarray(n["state"]["key"], dtype=np.uint32), "pos": n["state"]["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


# ---------------------------------------------------------------------------------------------- listing
def checkpoint_epoch(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX) :])
    except ValueError:
        return None


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Every `ckpt-*` folder of the run, oldest epoch first (valid or not)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(checkpoint_epoch(p), p) for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    return [p for e, p in sorted((e, p) for e, p in found if e is not None)]


def prune_checkpoints(run_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (and stray temp folders); returns what was deleted."""
    ckpts = list_checkpoints(run_dir)
    doomed = ckpts[: max(len(ckpts) - max(keep, 1), 0)]
    root = checkpoints_dir(run_dir)
    if root.is_dir():
        doomed += [p for p in root.iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


# ----------------------------------------------------------------------------------------- save / load
def save_checkpoint(
    run_dir: str | os.PathLike,
    *,
    agent: torch.nn.Module,
    learner,
    collector,
    exploration,
    epoch: int,
    extra: dict[str, Any] | None = None,
    keep: int = 3,
) -> Path:
    """Write RUN_DIR/checkpoints/ckpt-<epoch:06d>/ atomically, point `latest` at it, keep the last `keep`."""
    root = checkpoints_dir(run_dir)
    name = f"{PREFIX}{int(epoch):06d}"
    assert_finite_weights(agent, f"checkpoint {name}")  # no checkpoint ever holds a NaN (icrl.guards)
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.is_symlink():  # never listed as a checkpoint: replaced like any file, what it leads to is untouched
        final.unlink()
    lstate = learner.state_dict()
    state = {
        "format_version": FORMAT_VERSION,
        "epoch": int(epoch),
        "env_steps": int(collector.total_env_steps),
        "updates": int(learner.updates),
        "collector": collector.state_dict(),
        "exploration": exploration.state_dict(),
        "learner": {"updates": lstate["updates"], "generator": lstate["generator"]},
        "rng": rng_state(),
        "extra": extra or {},
    }
    try:
        with atomic_path(final, tmp_name=f".tmp-{name}-{os.getpid()}") as tmp:  # a folder, fsynced and renamed
            _write_files(tmp, agent, lstate, state)
            if final.exists():  # a checkpoint of this epoch from an earlier attempt (e.g. before a crash)
                shutil.rmtree(final)
        write_text_atomic(root / "latest", name + "\n")
    except (SafetensorError, OSError, RuntimeError) as e:  # a full disk, a quota: torch says RuntimeError
        raise CheckpointError(
            f"could not write checkpoint {final} ({_first_line(e)}); the previous checkpoints are kept: free "
            "some disk space and resume with --resume"
        ) from e
    prune_checkpoints(run_dir, keep)
    return final


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _write_files(tmp: Path, agent: torch.nn.Module, lstate: dict[str, Any], state: dict[str, Any]) -> None:
    """The three files of a checkpoint, fsynced, into the fresh folder `tmp`."""
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(agent, str(tmp / "agent.safetensors"))
    torch.save({"optimizer": lstate["optimizer"], "scheduler": lstate["scheduler"]}, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
    for f in FILES:
        fsync_file(tmp / f)


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """Read (agent tensors, optimizer payload, state) without touching any object; raises CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a folder)")
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            raise ValueError(f"expected a JSON object, found {type(state).__name__}")
        if state.get("format_version") != FORMAT_VERSION or "epoch" not in state:
            raise ValueError(f"unexpected format (format_version {state.get('format_version')!r})")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {path}: state.json is corrupt: {str(e) or 'nested too deeply'}") from e
    try:
        tensors = load_file(str(path / "agent.safetensors"), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path}: agent.safetensors is corrupt: {e}") from e
    try:
        optim = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError... all mean "refused"
        raise CheckpointError(
            f"checkpoint {path}: optimizer.pt could not be read as a weights-only tensor file (it is corrupt, "
            f"or it needs arbitrary unpickling, which is refused): {e}"
        ) from e
    if not isinstance(optim, dict) or not {"optimizer", "scheduler"} <= set(optim):
        raise CheckpointError(f"checkpoint {path}: optimizer.pt lacks the optimizer/scheduler state dicts")
    return tensors, optim, state


def load_checkpoint(
    path: str | os.PathLike,
    *,
    agent: torch.nn.Module,
    learner=None,
    collector=None,
    exploration=None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore everything `save_checkpoint` wrote into the given objects; returns state.json's content.

    Everything is read and checked before anything is modified, so a corrupt checkpoint raises
    CheckpointError (naming the path) and leaves the objects as they were.
    """
    tensors, optim, state = read_checkpoint(path)
    missing, unexpected = unmatched_names(agent, tensors)  # aliases safetensors dropped are not missing
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not fit this agent (was the model config changed?): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    try:  # every shape, dtype, key and RNG state, before anything is applied
        check_checkpoint(tensors, optim, state, agent=agent, learner=learner, collector=collector,
                         exploration=exploration, restore_rng=restore_rng)
    except CheckpointMismatch as e:
        raise CheckpointError(f"checkpoint {path} is inconsistent: {e}") from e
    try:
        agent.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise CheckpointError(f"checkpoint {path} does not fit this agent (was the model config changed?): {e}") from e
    refresh_acting_weights(agent)  # acting must see the restored weights
    if learner is not None:
        learner.load_state_dict(
            {
                "optimizer": optim["optimizer"],
                "scheduler": optim["scheduler"],
                "updates": state["learner"]["updates"],
                "generator": state["learner"]["generator"],
            }
        )
    if collector is not None:
        collector.load_state_dict(state["collector"])
    if exploration is not None:
        exploration.load_state_dict(state["exploration"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


def load_latest_checkpoint(run_dir: str | os.PathLike, *, agent: torch.nn.Module, log=None, **objects: Any
                           ) -> tuple[Path, dict[str, Any]] | None:
    """Load the newest checkpoint that is whole and consistent with these objects; (path, state) or None.

    A newer checkpoint that cannot be read or does not fit (another model's weights or optimiser state, a
    state.json with missing keys or a wrong-size RNG state) is skipped with one warning via `log`; nothing
    was applied from it, because `load_checkpoint` checks everything first (`set_aside` moves it out of
    the way afterwards). `objects`: learner, collector, exploration, restore_rng, as `load_checkpoint` takes.
    """
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return path, load_checkpoint(path, agent=agent, **objects)
        except CheckpointError as e:
            if log is not None:
                log(f"icrl: warning: skipping checkpoint {path.name}, falling back to the previous one: {e}")
    return None


def set_aside(path: Path) -> Path | None:
    """Rename a checkpoint that was skipped on resume to `rejected-<name>` beside it (kept for inspection,
    never listed again, so the resumed run can write its epoch anew); None when that fails (then deleted)."""
    target = path.with_name(f"rejected-{path.name}")
    try:
        if target.exists():
            shutil.rmtree(target)
        os.replace(path, target)
        return target
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return None
