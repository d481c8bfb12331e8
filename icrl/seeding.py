"""One seed for everything: Python, numpy, torch, every env copy and every loader worker; and the process's RNG
states as JSON values, which a checkpoint saves and restores (icrl.run.checkpoint)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed the global generators. `rank` offsets the seed so data-parallel processes differ."""
    s = int(seed) + 10_000 * int(rank)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def seed_process(seed: int, rank: int = 0, threads: int = 0) -> None:
    """The one place a training process is seeded: every global generator from `seed` (offset by a data-parallel
    `rank`), before its first draw, and torch's threads capped (`--threads`, 0: torch's choice). A run's
    processes (icrl.run.build.build_run) and each asynchronous collector (icrl.asynchronous.collect) call it."""
    seed_everything(seed, rank)
    if threads > 0:
        torch.set_num_threads(threads)


def derive_seed(seed: int, *names: str | int) -> int:
    """A stable sub-seed for one consumer (train envs, eval envs, loader, exploration...).

    numpy's SeedSequence mixes the words so sub-seeds of nearby seeds do not overlap, unlike `seed + k`.
    """
    words = [int(seed)] + [sum(ord(c) * 131**i for i, c in enumerate(str(n))) % 2**31 for n in names]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


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
    """Set this process's generators to the states `rng_state` returned."""
    random.setstate(python_state(state["python"]))
    np.random.set_state(numpy_state(state["numpy"]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def python_state(saved: Any) -> tuple:
    """`random.setstate`'s argument from the JSON value `rng_state` records."""
    version, words, gauss = saved
    return version, tuple(words), gauss


def numpy_state(saved: Any) -> dict[str, Any]:
    """`np.random.set_state`'s argument (the global generator's) from the JSON value `rng_state` records."""
    return {"bit_generator": saved["bit_generator"],
            "state": {"key": np.asarray(saved["state"]["key"], dtype=np.uint32), "pos": saved["state"]["pos"]},
            "has_gauss": saved["has_gauss"], "gauss": saved["gauss"]}
