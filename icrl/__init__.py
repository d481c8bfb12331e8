"""icrl: in-context reinforcement learning with long-context Transformers (AMAGO).

    import icrl
    result = icrl.train(cfg, env=MyEnv)        # any Gymnasium env: id, class, factory, instance or vector env
    policy = icrl.load(result["run_dir"])      # a run directory, a checkpoint or an exported .zip: no env needed
    action, state = policy.predict(obs, state, episode_start, reward=reward)
    icrl.evaluate(policy, env, n_episodes=10)  # mean / std / per-episode returns and success

The names are resolved on first use, so `import icrl` (and the `icrl` command line) stays light; `dir(icrl)`
and tab completion still list them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"  # the same as pyproject.toml (a test checks)

# public name -> the module that defines it (imported on first use)
_LAZY = {
    "train": "icrl.run.loop",
    "load": "icrl.policy",
    "InContextPolicy": "icrl.policy",
    "evaluate": "icrl.policy",
    "Callback": "icrl.run.callbacks",
    "EvalCallback": "icrl.run.callbacks",
    "CheckpointCallback": "icrl.run.callbacks",
    "StopTrainingOnRewardThreshold": "icrl.run.callbacks",
    "export": "icrl.run.load",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'icrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
