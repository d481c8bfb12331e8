"""Gymnasium spaces as plain JSON, so a run directory describes its env without naming code to run.

`icrl.load` and `icrl export-minari` need the env's observation and action spaces (to build the agent and
to convert observations and actions), not the env. `icrl train` writes them to RUN_DIR/spaces.json (and into
every checkpoint's state.json) in this form: human-readable, no pickle, nothing to import. A space that has
no JSON form here (Text, Graph, Sequence, ...) is also one `TimestepWrapper` rejects, so every trainable env
has one.

    {"format": 1,
     "observation_space": {"type": "Box", "shape": [4], "dtype": "float32", "low": -1.0, "high": [..]},
     "action_space": {"type": "Discrete", "n": 2, "start": 0},
     "env": {"name": "CartPole-v1", "kwargs": {}, "rebuild": "gymnasium"}}

Box bounds are one number when uniform, else nested lists; infinities are the strings "inf" / "-inf" (strict
JSON has no Infinity). `env.rebuild` records how the env can be built again: "builtin" (an icrl task),
"gymnasium" (a registered id), "import" (`module:factory`, imported only when a user asks) or "none" (a class
or factory defined in a script, a lambda: pass the env yourself, e.g. `icrl eval RUN --env module:factory`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from icrl.fileio import write_text_atomic

FORMAT = 1
SPACES_FILE = "spaces.json"


# ------------------------------------------------------------------------------------------ space <-> JSON
def _number(x: float | int | bool) -> Any:
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def _bound_to_json(arr: np.ndarray) -> Any:
    """A Box bound: one number when every entry is equal (most spaces), else nested lists."""
    flat = arr.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return _number(flat[0].item())
    return np.vectorize(_number, otypes=[object])(arr).tolist() if arr.ndim else _number(arr.item())


def _bound_from_json(value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if not np.issubdtype(dtype, np.floating):  # integers stay exact (int64 bounds do not fit a float64)
        return np.broadcast_to(np.asarray(value, dtype=dtype), shape).copy()

    def num(v: Any) -> float:
        return float(v)  # numbers and the strings "inf", "-inf", "nan"

    raw = np.vectorize(num, otypes=[np.float64])(np.asarray(value, dtype=object)) if np.ndim(value) else num(value)
    return np.broadcast_to(np.asarray(raw), shape).astype(dtype)


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A JSON-able dict that `space_from_json` turns back into an equal space; ValueError for other spaces."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": space.dtype.name,
                "low": _bound_to_json(space.low), "high": _bound_to_json(space.high)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(),
                "start": np.asarray(space.start).tolist(), "dtype": space.dtype.name}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": [[str(k), space_to_json(v)] for k, v in space.spaces.items()]}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}
    raise ValueError(f"space {space!r} has no JSON form in icrl (Box, Discrete, MultiDiscrete, MultiBinary, "
                     "Dict, Tuple)")


MAX_SPACE_ELEMENTS = 1 << 24
"""The most numbers one stored space may describe (a Box's entries, a MultiBinary's or MultiDiscrete's, a Discrete's
n): 64 MiB per float32 bound, where a 1,024 x 1,024 RGB image is 3.1M. A description is read from a file someone
else may have written; a shape of [100000, 100000] would otherwise allocate its bounds (80 GB) before any check."""


def _sized(count: int, what: str, left: list[int]) -> int:
    """`count`, taken from what is `left` of the description's numbers; ValueError when it does not fit."""
    if count < 0 or count > left[0]:
        raise ValueError(f"{what} of {count:,} numbers takes the space description past {MAX_SPACE_ELEMENTS:,} "
                         "numbers (refused before allocating it)")
    left[0] -= count
    return count


def space_from_json(data: dict[str, Any], left: list[int] | None = None) -> gym.Space:
    """The space `space_to_json` described; ValueError naming what is malformed or too large: all its parts
    together hold at most `MAX_SPACE_ELEMENTS` numbers (`left`: what the parts read so far left of them)."""
    left = [MAX_SPACE_ELEMENTS] if left is None else left
    try:
        kind = data["type"]
        if kind == "Box":
            shape, dtype = tuple(int(s) for s in data["shape"]), np.dtype(data["dtype"])
            if any(s < 0 for s in shape) or len(shape) > 32:
                raise ValueError(f"Box shape {list(shape)[:8]} is not a shape")
            _sized(int(np.prod(shape, dtype=object)), "a Box", left)
            low = _bound_from_json(data["low"], shape, dtype)
            high = _bound_from_json(data["high"], shape, dtype)
            return gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
        if kind == "Discrete":
            return gym.spaces.Discrete(_sized(int(data["n"]), "a Discrete", left), start=int(data.get("start", 0)))
        if kind == "MultiDiscrete":
            _sized(int(np.size(data["nvec"])), "a MultiDiscrete", left)
            return gym.spaces.MultiDiscrete(np.asarray(data["nvec"]), dtype=np.dtype(data.get("dtype", "int64")),
                                            start=np.asarray(data.get("start", 0)))
        if kind == "MultiBinary":
            n = data["n"]
            _sized(int(np.prod(n, dtype=object)), "a MultiBinary", left)
            return gym.spaces.MultiBinary(n if isinstance(n, int) else list(n))
        if kind == "Dict":
            # OrderedDict: gym.spaces.Dict sorts the keys of a plain dict, and the stored order is the env's
            return gym.spaces.Dict(OrderedDict((k, space_from_json(v, left)) for k, v in data["spaces"]))
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_json(s, left) for s in data["spaces"]])
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"malformed space description {json.dumps(data)[:200]} ({e})") from e
    raise ValueError(f"unknown space type {data.get('type')!r} in a space description")


# ----------------------------------------------------------------------------------------- the run's record
def spaces_record(observation_space: gym.Space, action_space: gym.Space, env: dict[str, Any]) -> dict[str, Any]:
    """What RUN_DIR/spaces.json holds: the env's own spaces (before TimestepWrapper) and how it was named."""
    return {"format": FORMAT, "observation_space": space_to_json(observation_space),
            "action_space": space_to_json(action_space), "env": env}


def venv_spaces_record(venv: gym.vector.VectorEnv, name: str, kwargs: dict[str, Any],
                       rebuild: str | None = None) -> dict[str, Any]:
    """The record of a vector env of TimestepWrapper'd envs (its sub-envs' own spaces, read through get_attr
    so subprocess envs work too). `rebuild` defaults to what the name says (`icrl.envs.user.rebuild_kind`)."""
    from icrl.envs.user import rebuild_kind

    # get_attr: SyncVectorEnv and AsyncVectorEnv (what icrl builds) have it; the VectorEnv base class does not
    obs_space = venv.get_attr("env_observation_space")[0]  # type: ignore[attr-defined]
    act_space = venv.get_attr("env_action_space")[0]  # type: ignore[attr-defined]
    env = {"name": name, "kwargs": kwargs, "rebuild": rebuild or rebuild_kind(name)}
    return spaces_record(obs_space, act_space, env)


def write_spaces(run_dir: str | Path, record: dict[str, Any]) -> Path:
    return write_text_atomic(Path(run_dir) / SPACES_FILE, json.dumps(record, indent=2, allow_nan=False) + "\n")


def read_spaces_record(record: dict[str, Any], where: str) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of a record; ValueError naming `where` when it is unusable."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{where}: unknown spaces format "
                         f"{record.get('format') if isinstance(record, dict) else record!r}")
    try:
        return space_from_json(record["observation_space"]), space_from_json(record["action_space"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from e


def read_spaces(run_dir: str | Path) -> tuple[gym.Space, gym.Space] | None:
    """The spaces of RUN_DIR/spaces.json, or None when the run has none (runs from before the file existed)."""
    path = Path(run_dir) / SPACES_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return read_spaces_record(record, str(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from e
    except RecursionError as e:
        raise ValueError(f"{path} is nested too deeply to be a record of the env's spaces") from e


class SpacesOnlyEnv(gym.Env):
    """An env with spaces and no dynamics: wrapped in `TimestepWrapper`, it gives the observation converters,
    the agent-side spaces and the action mapping of the real env without building it."""

    metadata: dict[str, Any] = {}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # noqa: D102
        raise RuntimeError("SpacesOnlyEnv has spaces only; step a real env")

    def step(self, action: Any):  # noqa: D102
        raise RuntimeError("SpacesOnlyEnv has spaces only; step a real env")


def spaces_wrapper(observation_space: gym.Space, action_space: gym.Space):
    """`TimestepWrapper` around a `SpacesOnlyEnv`: the converters and agent-side spaces of an env that is not
    built. Its `observation_space["obs"]` and `action_spec` are what the agent is built with."""
    from icrl.envs.wrapper import TimestepWrapper

    return TimestepWrapper(SpacesOnlyEnv(observation_space, action_space))
