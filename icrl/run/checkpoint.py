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

Before anything is applied, `load_checkpoint` checks the checkpoint against the objects it is loaded into
(`check_checkpoint`). Why: a checkpoint whose files read back fine can still belong to another model, or be edited
by hand. The optimiser state of another model loads without complaint and then crashes fused AdamW with a segfault
at the first step; a `state.json` with a missing key or a wrong-size RNG state raises a KeyError halfway through
restoring, after the weights were already replaced. The checks inspect every tensor's shape, dtype and finiteness
and every key the loader will read, and try each RNG state on a throwaway generator, so a whole, consistent
checkpoint is applied or nothing at all, and the caller can fall back to an older one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model

from icrl.config.errors import first_line, flag
from icrl.fileio import atomic_path, check_inside, fsync_file, write_text_atomic
from icrl.guards import assert_finite_weights
from icrl.nets.transformer import refresh_acting_weights
from icrl.seeding import numpy_state, python_state, rng_state, set_rng_state

FILES = ("agent.safetensors", "optimizer.pt", "state.json")
FORMAT_VERSION = 1
PREFIX = "ckpt-"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt or not made of the expected safe files."""


class CheckpointMismatch(ValueError):
    """What makes a checkpoint inconsistent (`load_checkpoint` turns it into a CheckpointError)."""


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    """RUN_DIR/checkpoints; OutsideRunDirError when it is a symlink leading out (saving and pruning would write
    and delete there)."""
    return check_inside(run_dir, Path(run_dir) / "checkpoints")


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


# ------------------------------------------------------------------------------------------ save / load
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
            f"could not write checkpoint {final} ({first_line(e)}); the previous checkpoints are kept: free "
            f"some disk space and resume with {flag('resume')}"
        ) from e
    prune_checkpoints(run_dir, keep)
    return final


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


# ----------------------------------------------------------------------------------- consistency checks
def _need(cond: bool, message: str) -> None:
    if not cond:
        raise CheckpointMismatch(message)


def _dict(value: Any, message: str) -> dict[str, Any]:
    """`value` (read from a file, so of any type) when it is a dict; CheckpointMismatch(message) otherwise."""
    if not isinstance(value, dict):
        raise CheckpointMismatch(message)
    return value


def _int(value: Any, what: str, lo: int = 0) -> int:
    _need(isinstance(value, int) and not isinstance(value, bool) and value >= lo, f"{what} must be an integer >= {lo}")
    return value


def unmatched_names(agent: torch.nn.Module, names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(missing, unexpected): the agent's state-dict names a weights file's `names` lack, and the file's names
    the agent does not have, each sorted. A name safetensors dropped because it aliases a stored tensor (shared
    weights are saved once) is not missing. Checkpoints and the asynchronous run's published weights use it."""
    own = agent.state_dict()
    names = set(names)
    stored = {own[k].data_ptr() for k in names if k in own}
    missing = sorted(k for k in set(own) - names if own[k].data_ptr() not in stored)
    return missing, sorted(names - set(own))


def check_agent_tensors(tensors: dict[str, torch.Tensor], agent: torch.nn.Module) -> None:
    """Every saved tensor names a tensor of `agent`, with its shape and dtype, and is finite."""
    expected = agent.state_dict()
    for key, t in tensors.items():
        _need(key in expected, f"agent.safetensors holds {key!r}, which this agent does not have")
        want = expected[key]
        _need(tuple(t.shape) == tuple(want.shape),
              f"agent.safetensors: {key} has shape {tuple(t.shape)}, this agent's is {tuple(want.shape)}")
        _need(t.dtype == want.dtype, f"agent.safetensors: {key} is {t.dtype}, this agent's is {want.dtype}")
        _need(not t.is_floating_point() or bool(torch.isfinite(t).all()), f"agent.safetensors: {key} is not finite")


def check_optimizer(payload: dict[str, Any], optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """The saved optimiser state has this optimiser's groups and, per parameter, moments of its shape."""
    not_optimizer = "optimizer.pt: not an optimizer state dict"
    saved = _dict(payload.get("optimizer"), not_optimizer)
    _need(isinstance(saved.get("state"), dict) and isinstance(saved.get("param_groups"), list), not_optimizer)
    current = optimizer.state_dict()
    groups = saved["param_groups"]
    _need(len(groups) == len(current["param_groups"]),
          f"optimizer.pt has {len(groups)} parameter groups, this learner has {len(current['param_groups'])}")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for g, c in zip(groups, current["param_groups"]):
        _need(isinstance(g, dict) and g.get("params") == c["params"],
              "optimizer.pt was written for another model (its parameter lists differ from this learner's)")
        for key in ("lr", "weight_decay", "eps"):
            _need(isinstance(g.get(key), (int, float)) and np.isfinite(g[key]),
                  f"optimizer.pt: group {key} is not a number")
    for index, entry in saved["state"].items():
        _need(isinstance(index, int) and 0 <= index < len(params),
              f"optimizer.pt: state for unknown parameter {index!r}")
        _need(isinstance(entry, dict), f"optimizer.pt: state of parameter {index} is not a dict")
        shape = tuple(params[index].shape)
        for key, value in entry.items():
            if key == "step":
                step = value if isinstance(value, (int, float)) else None
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    step = float(value)
                _need(step is not None and np.isfinite(step) and step >= 0,
                      f"optimizer.pt: bad step of parameter {index}")
                continue
            _need(isinstance(value, torch.Tensor), f"optimizer.pt: {key} of parameter {index} is not a tensor")
            _need(tuple(value.shape) == shape, f"optimizer.pt: {key} of parameter {index} has shape "
                  f"{tuple(value.shape)}, the parameter's is {shape} (written for another model)")
            _need(bool(torch.isfinite(value).all()), f"optimizer.pt: {key} of parameter {index} is not finite")
    sched = _dict(payload.get("scheduler"), "optimizer.pt: the scheduler state is not a dict")
    missing = sorted(set(scheduler.state_dict()) - set(sched))
    _need(not missing, f"optimizer.pt: the scheduler state lacks {missing}")
    _int(sched.get("last_epoch"), "optimizer.pt: scheduler last_epoch", lo=-1)
    _need(isinstance(sched.get("base_lrs"), list) and len(sched["base_lrs"]) == len(groups),
          "optimizer.pt: the scheduler's base_lrs do not match the parameter groups")


def _check_byte_state(value: Any, length: int, what: str) -> None:
    _need(isinstance(value, list) and len(value) == length
          and all(isinstance(b, int) and 0 <= b < 256 for b in value), f"{what} must be a list of {length} bytes")


def check_rng(rng: Any) -> None:
    """Each RNG state loads into a throwaway generator of its kind (so the real ones are set only if all do)."""
    _need(isinstance(rng, dict) and {"python", "numpy", "torch"} <= set(rng),
          "state.json: rng lacks python/numpy/torch")
    try:
        random.Random().setstate(python_state(rng["python"]))
        np.random.RandomState().set_state(numpy_state(rng["numpy"]))
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise CheckpointMismatch(f"state.json: the python/numpy RNG state is malformed ({e})") from e
    _check_byte_state(rng["torch"], len(torch.get_rng_state()), "state.json: rng.torch")
    if "cuda" in rng:
        _need(isinstance(rng["cuda"], list), "state.json: rng.cuda must be a list")


def check_state(state: dict[str, Any], *, learner: Any = None, collector: Any = None, exploration: Any = None,
                restore_rng: bool = True) -> None:
    """Every key of state.json the loader will read is there, with a value of the right kind and size."""
    _int(state.get("epoch"), "state.json: epoch")
    extra = _dict(state.get("extra", {}), "state.json: extra must be an object")
    _need(isinstance(extra.get("wall_time", 0.0), (int, float)), "state.json: extra.wall_time must be a number")
    _int(extra.get("world_size", 1), "state.json: extra.world_size", lo=1)
    if learner is not None:
        lst = _dict(state.get("learner"), "state.json: learner state missing")
        _int(lst.get("updates"), "state.json: learner.updates")
        _check_byte_state(lst.get("generator"), len(torch.Generator().get_state()), "state.json: learner.generator")
    if collector is not None:
        c = _dict(state.get("collector"), "state.json: collector state missing")
        for key in ("total_env_steps", "total_rollouts"):
            _int(c.get(key), f"state.json: collector.{key}")
        for key in ("eval_env_steps", "next_rollout_id"):
            if key in c:
                _int(c[key], f"state.json: collector.{key}")
    if exploration is not None and hasattr(exploration, "scale"):
        x = _dict(state.get("exploration"), "state.json: exploration state missing")
        _need(isinstance(x.get("scale"), list), "state.json: exploration state missing")
        scale = x["scale"]
        _need(len(scale) == len(exploration.scale), f"state.json: exploration has {len(scale)} env scales, this "
              f"run has {len(exploration.scale)} (was --parallel-envs changed?)")
        _need(all(isinstance(v, (int, float)) and 0.0 <= v <= 1.0 for v in scale), "state.json: exploration scales "
              "must lie in [0, 1]")
        rng: Any = x.get("rng")  # whatever the file holds: setting it on a throwaway generator is the check
        try:
            np.random.default_rng().bit_generator.state = rng
        except (TypeError, ValueError, KeyError) as e:
            raise CheckpointMismatch(f"state.json: the exploration generator state is malformed ({e})") from e
    if restore_rng:
        check_rng(state.get("rng"))


def check_checkpoint(tensors: dict[str, torch.Tensor], optim: dict[str, Any], state: dict[str, Any], *,
                     agent: torch.nn.Module, learner: Any = None, collector: Any = None, exploration: Any = None,
                     restore_rng: bool = True) -> None:
    """Raise CheckpointMismatch naming the first inconsistency between a checkpoint and these objects."""
    check_agent_tensors(tensors, agent)
    if learner is not None:
        check_optimizer(optim, learner.optimizer, learner.scheduler)
    check_state(state, learner=learner, collector=collector, exploration=exploration, restore_rng=restore_rng)
