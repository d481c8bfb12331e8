"""Consistency checks of a checkpoint against the objects it is about to be loaded into.

Why: a checkpoint whose files read back fine can still belong to another model, or be edited by hand. The
optimiser state of another model loads without complaint and then crashes fused AdamW with a segfault at the
first step; a `state.json` with a missing key or a wrong-size RNG state raises a KeyError halfway through
restoring, after the weights were already replaced. `check_checkpoint` inspects every tensor's shape, dtype
and finiteness and every key the loader will read, and tries each RNG state on a throwaway generator, so
`icrl.run.checkpoint.load_checkpoint` either applies a whole, consistent checkpoint or nothing at all, and the
caller can fall back to an older one.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch


class CheckpointMismatch(ValueError):
    """What makes a checkpoint inconsistent (icrl.run.checkpoint turns it into a CheckpointError)."""


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
            _need(isinstance(g.get(key), (int, float)) and np.isfinite(g[key]), f"optimizer.pt: group {key} is not a number")
    for index, entry in saved["state"].items():
        _need(isinstance(index, int) and 0 <= index < len(params), f"optimizer.pt: state for unknown parameter {index!r}")
        _need(isinstance(entry, dict), f"optimizer.pt: state of parameter {index} is not a dict")
        shape = tuple(params[index].shape)
        for key, value in entry.items():
            if key == "step":
                step = value if isinstance(value, (int, float)) else None
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    step = float(value)
                _need(step is not None and np.isfinite(step) and step >= 0, f"optimizer.pt: bad step of parameter {index}")
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
    _need(isinstance(rng, dict) and {"python", "numpy", "torch"} <= set(rng), "state.json: rng lacks python/numpy/torch")
    try:
        version, words, gauss = rng["python"]
        random.Random().setstate((version, tuple(words), gauss))
        n = rng["numpy"]
        np.random.RandomState().set_state({
            "bit_generator": n["bit_generator"],
            "state": {"key": np.asarray(n["state"]["key"], dtype=np.uint32), "pos": n["state"]["pos"]},
            "has_gauss": n["has_gauss"], "gauss": n["gauss"],
        })
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
