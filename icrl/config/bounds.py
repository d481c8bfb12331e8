"""Ranges declared on the fields they bound: `layers: int = bounded(2, ge=1, le=1024)` is a dataclass field whose
default is 2 and whose values must lie in [1, 1024]; `icrl.config.validation.field_errors` reads the range from
the field (`field_range`), so a field and its range are written once, side by side.

Counts that cost time or processes rather than memory have an upper bound too (an `--eval-rollouts 1e12` would
evaluate for ever, silently); sizes that cost memory are bounded by `validation.memory_error`, against what the
machine has. None values of optional fields are not checked (unset: resolved later, `icrl.config.resolve`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

MAX_ROLLOUTS = 1_000_000
"""Rollouts an evaluation may ask for (`--eval-rollouts`, `icrl eval --rollouts`)."""
MAX_PARALLEL_ENVS = 65_536
"""Env copies a run or an evaluation may step at once."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class Range:
    """A lower bound `lo` (excluded with `open_lo`) and optionally an upper bound `hi` (excluded with `open_hi`)."""

    lo: float
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False

    def holds(self, value: Any) -> bool:
        above = self.lo < value if self.open_lo else self.lo <= value
        below = self.hi is None or (value < self.hi if self.open_hi else value <= self.hi)
        return above and below

    def __str__(self) -> str:
        """What a value must be, as the error messages say it: `>= 1`, `> 0.0`, `in [0.0, 1.0)`."""
        if self.hi is None:
            return f"{'>' if self.open_lo else '>='} {self.lo}"
        return f"in {'(' if self.open_lo else '['}{self.lo}, {self.hi}{')' if self.open_hi else ']'}"


def bounded(default: _T, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None) -> _T:
    """A dataclass field with this `default` whose values must be >= `ge` (or > `gt`) and, where given, <= `le`
    (or < `lt`). The bounds keep the type they are written in, which the error message shows (`>= 0` for a
    count, `>= 0.0` for a rate)."""
    lo = ge if ge is not None else gt
    if lo is None or (ge is not None and gt is not None) or (le is not None and lt is not None):
        raise TypeError("bounded() takes one lower bound (ge or gt) and at most one upper bound (le or lt)")
    span = Range(lo, le if le is not None else lt, open_lo=gt is not None, open_hi=lt is not None)
    return dataclasses.field(default=default, metadata={"range": span})


def field_range(f: dataclasses.Field[Any]) -> Range | None:
    """The range `bounded` declared on a dataclass field, or None."""
    span = f.metadata.get("range")
    return span if isinstance(span, Range) else None
