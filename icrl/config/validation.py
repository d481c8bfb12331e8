"""The checks `ExperimentConfig.validate` runs before anything is built: types, ranges, combinations and devices
(of `ConfigGroups`, the config's data, so this module needs nothing of experiment.py).

Every field is checked on its own first (`field_errors`), so a value that cannot work (`--heads 0`, `--grad-clip -1`,
`--device banana`, a string where config.json should hold an int) fails at parse time with one line naming the flag
and what it must be, instead of a traceback minutes later (or a run that silently does something else, like reversed
gradients).

Types are checked generically from the dataclass annotations, so a field added later is type-checked (and
its floats required finite) without an entry here; a field with a range declares it where it is defined
(`icrl.config.bounds.bounded`). `combination_error` then checks the values that only fail together (one small
function per concern).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from icrl.config.bounds import field_range
from icrl.config.errors import flag, setting
from icrl.config.groups import ConfigGroups
from icrl.config.loss import TWOHOT_FIELDS, LossConfig
from icrl.config.model import ModelConfig


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is tuple:
        return f"a list of ({_type_name(typing.get_args(hint)[0])})"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "unset"}.get(
        hint, str(hint)
    )


def matches(value: Any, hint: Any) -> bool:
    """True when `value` (from the command line or config.json) is a valid value of annotation `hint`."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return len(args) == len(value) and all(matches(v, a) for v, a in zip(value, args))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True  # an annotation this checker does not know: trust the dataclass


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, tuple):
        return [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return []


def field_errors(cfg: ConfigGroups, only: set[str] | None = None) -> list[str]:
    """One message per field of `cfg` whose value has the wrong type, is not finite
    or is out of its range; empty when every field is fine. Devices are checked by `device_error`. `only`: the
    field names to check (default: all)."""
    errors: list[str] = []
    for group_field in dataclasses.fields(cfg):  # the config's groups: env, model, loss, ...
        sub = getattr(cfg, group_field.name)
        hints = typing.get_type_hints(type(sub))
        for f in dataclasses.fields(sub):
            if only is not None and f.name not in only:
                continue
            value, hint = getattr(sub, f.name), hints.get(f.name, Any)
            default = f.default if f.default is not dataclasses.MISSING else None
            if value == default and type(value) is type(default):  # the author's choice (even an inf)
                pass
            elif not matches(value, hint):
                errors.append(f"{flag(f.name)} must be {_type_name(hint)}, got {value!r}")
                continue
            elif any(isinstance(v, float) and not math.isfinite(v) for v in _numbers(value)):
                errors.append(f"{flag(f.name)} must be a finite number, got {value!r}")
                continue
            span = field_range(f)
            if span is not None and value is not None and not span.holds(value):
                errors.append(f"{flag(f.name)} must be {span}, got {value!r}")
    if not isinstance(cfg.env.env, str) or not cfg.env.env.strip():
        errors.append(f"{flag('env')} must name a task (see `icrl envs`), got an empty string")
    if isinstance(cfg.run.run_dir, str) and not cfg.run.run_dir.strip():
        errors.append(f"{flag('run_dir')} must name a folder, got an empty string")
    return errors


Check = tuple[bool, str]  # (the combination is fine, the message naming its flags when it is not)


def _env_checks(cfg: ConfigGroups) -> list[Check]:
    e = cfg.env
    return [
        (
            not (e.episodes_per_rollout > 1 and e.rollout_horizon is not None),
            f"{flag('episodes_per_rollout')} and {flag('rollout_horizon')} both set: choose one way to end a rollout",
        ),
    ]


def _explore_checks(cfg: ConfigGroups) -> list[Check]:
    x = cfg.explore  # unset: flat (no horizon needed), or what the task recommends with its horizon
    return [
        (
            x.eps_shape in (None, "flat") or x.shape_horizon is not None,
            f"{setting('eps_shape', x.eps_shape)} needs {setting('shape_horizon', 'N')} "
            "(the rollout length the shape is laid over)",
        ),
    ]


def _model_loss_checks(cfg: ConfigGroups) -> list[Check]:
    m, lo = cfg.model, cfg.loss
    return [
        (m.d_model % m.heads == 0, f"{flag('d_model')} {m.d_model} is not divisible by {flag('heads')} {m.heads}"),
        (m.pos_emb != "rope" or m.d_model % (2 * m.heads) == 0,
         f"{setting('pos_emb', 'rope')} rotates pairs of a head's dims: "
         f"{flag('d_model')} {m.d_model} / {flag('heads')} {m.heads} must be even"),
        (m.continuous_dist == "gmm" or m.gmm_components == ModelConfig.gmm_components,
         f"{flag('gmm_components')} applies to {setting('continuous_dist', 'gmm')}"),
        (m.context >= 2, f"{flag('max_seq_len')} must be >= 2 (a TD transition needs two timesteps)"),
        (len(m.discrete_prob_clip) == 2 and 0 <= m.discrete_prob_clip[0] < m.discrete_prob_clip[1] <= 1,
         f"{flag('discrete_prob_clip')} must be two probabilities LOW HIGH with 0 <= LOW < HIGH <= 1"),
        (len(lo.gammas) >= 1 and all(0 <= g < 1 for g in lo.gammas), f"{flag('gammas')} must lie in [0, 1)"),
        (
            1 <= lo.redq_subset <= lo.num_critics,
            f"{flag('redq_subset')} {lo.redq_subset} must be between 1 and {flag('num_critics')} {lo.num_critics}",
        ),
        (
            m.max_seq_len is None or lo.td_steps < m.max_seq_len,  # unset: checked once the task's context is known
            f"{flag('n_step')} {lo.td_steps} must be below {flag('max_seq_len')} {m.max_seq_len} "
            "(an n-step return needs n + 1 timesteps of the training window)",
        ),
    ]


def _critic_checks(cfg: ConfigGroups) -> list[Check]:
    lo, default = cfg.loss, LossConfig()
    stray = [flag(n) for n in TWOHOT_FIELDS if getattr(lo, n) != getattr(default, n)]
    return [
        (lo.critic_kind == "twohot" or not stray,
         f"{', '.join(stray)} only apply to {setting('critic_kind', 'twohot')}"),
        (lo.critic_min_value < lo.critic_max_value,
         f"{flag('critic_min_value')} {lo.critic_min_value} must be below "
         f"{flag('critic_max_value')} {lo.critic_max_value}"),
    ]


def _schedule_checks(cfg: ConfigGroups) -> list[Check]:
    e, r, sc = cfg.env, cfg.replay, cfg.schedule
    return [
        (
            sc.steps_per_epoch >= e.parallel_envs,
            f"{flag('steps_per_epoch')} {sc.steps_per_epoch} is below {flag('parallel_envs')} {e.parallel_envs}: "
            "each epoch steps every env at least once",
        ),
        (
            sc.env_steps >= e.parallel_envs or (sc.env_steps == 0 and r.offline_updates > 0),
            f"{flag('total_env_steps')} {sc.env_steps} is below {flag('parallel_envs')} {e.parallel_envs}: "
            f"a run steps every env at least once (or 0 with {flag('offline_updates')}: offline training)",
        ),
    ]


def _replay_checks(cfg: ConfigGroups) -> list[Check]:
    e, r, sc = cfg.env, cfg.replay, cfg.schedule
    return [
        (
            r.offline_data is not None or (r.offline_updates == 0 and r.offline_fraction is None),
            f"{flag('offline_updates')} and {flag('offline_fraction')} need {flag('offline_data')} PATH_OR_MINARI_ID",
        ),
        (
            r.offline_updates == 0 or (cfg.epoch_updates >= 1 and sc.start_updates_after == 0),
            f"{flag('offline_updates')} trains before any env step: it needs {flag('updates_per_epoch')} >= 1 and "
            f"{setting('start_updates_after', 0)}",
        ),
        (
            r.relabel == "none" or (e.chunk_len is None and e.episodes_per_rollout == 1 and e.rollout_horizon is None),
            f"{flag('relabel')} {r.relabel} needs whole single-episode rollouts: unset {flag('chunk_len')}, "
            f"{flag('episodes_per_rollout')} and {flag('rollout_horizon')}",
        ),
    ]


def combination_error(cfg: ConfigGroups) -> str | None:
    """The message of the first impossible combination of (individually valid) fields, or None. Assumes
    `field_errors(cfg)` is empty."""
    groups = (_env_checks, _explore_checks, _model_loss_checks, _critic_checks, _schedule_checks, _replay_checks)
    for checks in groups:
        for ok, message in checks(cfg):
            if not ok:
                return message
    return None


GIB = 2**30


_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> int | None:
    """The memory this process may use, in bytes: the machine's physical memory, or a container's (cgroup)
    limit when that is lower; None where the OS does not say (no check then)."""
    import os

    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as f:
                limit = int(f.read().strip())  # "max" (no limit) is not a number
        except (OSError, ValueError):
            continue
        if 0 < limit < total:
            return limit
    return total


def _parameter_count(cfg: ConfigGroups) -> int:
    """A lower bound on the agent's parameters (the env's input and output widths taken as 1), from the config
    alone. The one place they are estimated: a config is checked at parse time, before the env's spaces are
    known, and the config layer cannot build the networks to count them (icrl.nets sits above it)."""
    m, lo = cfg.model, cfg.loss
    d, hh, g = m.d_model, m.head_hidden, len(lo.gammas)
    d_ff = m.d_ff if m.d_ff is not None else 4 * d
    traj = {"transformer": m.layers * (4 * d * d + 2 * d * d_ff), "gru": m.layers * 6 * d * d,
            "lstm": m.layers * 8 * d * d, "ff": m.layers * d * d}.get(m.traj_encoder, 0)
    head = d * hh + max(m.head_layers - 1, 0) * hh * hh + hh * g
    return (m.tstep_hidden * (d + 1) + traj + (m.max_time * d if m.pos_emb == "learned" else 0)
            + (1 + lo.num_critics) * head)


def memory_estimate(cfg: ConfigGroups, update: bool = True, obs_numbers: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """Lower bounds in bytes (float32) of what `cfg` allocates: "parameters" (weights, gradients, AdamW's two
    moments and the EMA targets), "acting" (the Transformer's KV cache of --parallel-envs envs) and, with
    `update`, "activations" (what autograd keeps of one update of --batch-size x --max-seq-len timesteps).

    Why: a size typed with a few zeros too many (`--d-model 1000000000000`) otherwise ends in an allocator
    traceback, or in swapping for hours; the estimate refuses it at parse time, saying how much it needs.
    `obs_numbers` (known once the env's spaces are: `icrl.run.build.build_agent`): (numbers of a vector
    observation, which the timestep encoder's first layer reads each with `tstep_hidden` weights; numbers of an
    observation in all, images included, which every batch holds per timestep)."""
    m, lo = cfg.model, cfg.loss
    d, hh = m.d_model, m.head_hidden
    d_ff = m.d_ff if m.d_ff is not None else 4 * d
    window = m.context if m.traj_encoder == "transformer" else 1
    vector, every = obs_numbers
    out = {
        "parameters": 4 * 4 * (_parameter_count(cfg) + vector * m.tstep_hidden),
        "acting": 4 * cfg.env.parallel_envs * window * max(m.layers, 1) * 2 * d,
    }
    if update:
        per_layer = 8 * d + 2 * d_ff if m.traj_encoder == "transformer" else 4 * d
        per_token = 3 * m.tstep_hidden + m.layers * per_layer + 3 * (1 + lo.num_critics) * max(m.head_layers, 1) * hh
        out["activations"] = 4 * cfg.optim.batch_size * m.context * (per_token + every)
    return out


def _advice(part: str) -> str:
    """What to lower when `part` of the memory estimate is the largest, worded for the reader (at call time)."""
    fields = {"parameters": ("d_model", "d_ff", "layers", "head_hidden", "head_layers", "num_critics", "max_time"),
              "acting": ("parallel_envs", "max_seq_len", "layers", "d_model"),
              "activations": ("batch_size", "max_seq_len")}[part]
    names = [flag(f) for f in fields]
    extra = {"parameters": f" (or {flag('tstep_hidden')}, or the observation's size, e.g. "
                           "gymnasium.wrappers.ResizeObservation)",
             "acting": "",
             "activations": f" (or the widths: {flag('d_model')}, {flag('d_ff')}, {flag('head_hidden')})"}[part]
    return f"lower {', '.join(names[:-1])} or {names[-1]}{extra}"


def memory_error(cfg: ConfigGroups, update: bool = True, available: int | None = None,
                 obs_numbers: tuple[int, int] = (0, 0)) -> str | None:
    """Why `cfg` cannot fit in this machine's memory (`available` bytes, default its physical memory), with
    the estimate and the flags to lower, or None. `update=False`: acting only (a run loaded to evaluate)."""
    available = machine_memory() if available is None else available
    if available is None:
        return None
    parts = memory_estimate(cfg, update, obs_numbers)
    total = sum(parts.values())
    if total <= available:
        return None
    worst = max(parts, key=parts.__getitem__)
    detail = ", ".join(f"{k} {v / GIB:.3g}" for k, v in parts.items())
    return (f"this config needs at least {total / GIB:.3g} GiB of memory ({detail} GiB), more than this machine's "
            f"{available / GIB:.3g} GiB: {_advice(worst)}")


def device_error(name: str) -> str | None:
    """Why `name` cannot be used as the run's device (unknown, or CUDA / that GPU absent), or None.

    `auto` and `cpu` need no torch import; anything else is parsed by torch and checked against the devices
    this machine has, so `--device cuda` on a CPU-only machine fails at parse time, not after building envs.
    """
    if name in ("auto", "cpu"):
        return None
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return f"{flag('device')} {name!r} is not a torch device; use auto, cpu, cuda or cuda:N"
    if dev.type == "cpu":
        return None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return (f"{flag('device')} {name}: this machine (or torch build) has no usable CUDA device; "
                    f"use {setting('device', 'cpu')} or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return (f"{flag('device')} {name}: only {torch.cuda.device_count()} CUDA device(s) here (cuda:0 ..); "
                    "pick one of them")
        return None
    if dev.type == "mps":
        ok = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
        return (None if ok
                else f"{flag('device')} {name}: MPS is not available here; use {setting('device', 'cpu')} or auto")
    return f"{flag('device')} {name!r}: icrl runs on cpu, cuda or mps devices; use {setting('device', 'auto')}"
