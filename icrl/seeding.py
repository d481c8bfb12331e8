"""One seed for everything: Python, numpy, torch, every env copy and every loader worker."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed the global generators. `rank` offsets the seed so data-parallel processes differ."""
    s = int(seed) + 10_000 * int(rank)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def derive_seed(seed: int, *names: str | int) -> int:
    """A stable sub-seed for one consumer (train envs, eval envs, loader, exploration...).

    numpy's SeedSequence mixes the words so sub-seeds of nearby seeds do not overlap, unlike `seed + k`.
    """
    words = [int(seed)] + [sum(ord(c) * 131**i for i, c in enumerate(str(n))) % 2**31 for n in names]
    return int(np.random.SeedSequence(words).generate_state(1)[0])
