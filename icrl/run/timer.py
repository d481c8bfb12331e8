"""Wall-clock seconds per phase of an epoch, for the `time/*` columns of the metrics rows."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Timer:
    """Seconds spent in named phases, summed over every `with timer("name"):` block; a phase never entered
    reads 0.0. One object per epoch keeps the loop free of hand-paired `perf_counter` calls. `clock` is
    replaceable so a test can check the sums exactly rather than against the machine's timing."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._seconds: dict[str, float] = defaultdict(float)
        self._clock = clock

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = self._clock()
        try:
            yield
        finally:
            self._seconds[phase] += self._clock() - t0

    def __getitem__(self, phase: str) -> float:
        return self._seconds.get(phase, 0.0)
