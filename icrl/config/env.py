"""The task: which env, its kwargs, how many copies, and how rollouts are cut (group `env`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from icrl.config.bounds import MAX_PARALLEL_ENVS, bounded
from icrl.config.errors import ConfigError, flag


@dataclass(frozen=True)
class EnvConfig:
    env: str = "tmaze"
    """A built-in task name (see `icrl envs`), a registered Gymnasium id, or `package.module:factory`."""
    env_kwargs: str = "{}"
    """JSON object passed to the env constructor, e.g. '{"length": 20}'."""
    parallel_envs: int = bounded(8, ge=1, le=MAX_PARALLEL_ENVS)
    """Env copies stepped as one batch during collection."""
    async_envs: bool = False
    """Step the env copies in subprocesses (worth it for slow simulators, not for tiny tasks)."""
    episodes_per_rollout: int = bounded(1, ge=1)
    """Meta-RL: episodes of the same task per rollout (the agent keeps its memory across them)."""
    rollout_horizon: int | None = bounded(None, ge=1)
    """Meta-RL: instead of a fixed episode count, repeat episodes of one task for this many steps."""
    chunk_len: int | None = bounded(None, ge=2)
    """Store very long rollouts as chunks of this many steps (None: whole rollouts)."""

    @property
    def kwargs(self) -> dict[str, Any]:
        try:
            value = json.loads(self.env_kwargs)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{flag('env_kwargs')} is not valid JSON ({e.msg} at char {e.pos}): "
                              f"{self.env_kwargs!r}") from e
        except RecursionError as e:  # json's parser recurses once per level of nesting
            raise ConfigError(f"{flag('env_kwargs')} is nested too deeply to parse "
                              f"({len(self.env_kwargs):,} characters); "
                              "pass a flat JSON object of the env's keyword arguments") from e
        if not isinstance(value, dict):
            raise ConfigError(f"{flag('env_kwargs')} must be a JSON object like '{{\"length\": 20}}', "
                              f"got {self.env_kwargs!r}")
        return value
