"""icrl: in-context reinforcement learning with long-context Transformers (AMAGO).

    import icrl
    icrl.train(cfg, env=MyEnv)                  # any Gymnasium env: id, class, factory or vector env
    policy = icrl.load("runs/icrl")            # from the run directory alone: no env needed
    action, state = policy.predict(obs, state, episode_start, reward)

Both names are resolved on first use, so `import icrl` (and the `icrl` command line) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["InContextPolicy", "load", "train"]


def __getattr__(name: str) -> Any:
    if name in ("load", "InContextPolicy"):
        return getattr(importlib.import_module("icrl.policy"), name)
    if name == "train":
        return importlib.import_module("icrl.run.loop").train
    raise AttributeError(f"module 'icrl' has no attribute {name!r}")
