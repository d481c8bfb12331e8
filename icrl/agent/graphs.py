"""Replaying a fixed-shape step as a CUDA graph: the learner's update and the acting step (docs/design.md §4, §5).

Why: on a GPU both steps are launch-bound, not arithmetic-bound. An update of the d128 x 256 model is ~0.1 ms
of arithmetic on an H200 but hundreds of small kernels, each paying launch latency and Python; an acting step
for 8 envs is the same story at a smaller scale (docs/results.md, "The GPU"). A CUDA graph records every
kernel of one call once and replays the whole record with one launch.

What a captured step must be, and how the learner and the policy meet it:
  * fixed shapes and fixed memory: it reads its inputs from static buffers the caller fills before each
    call, and writes its outputs to the same tensors every time (`Learner`: windows padded to the training
    window; `AgentPolicy`: one row per env, the KV ring attended over all W slots);
  * no host read: nothing in it may wait for the device (`.item()`, `bool(t)`, data-dependent shapes such
    as boolean indexing, copies to the host). The non-finite guard is a device flag that turns the
    optimiser step into a no-op (AdamW's `found_inf`, as AMP's grad scaler does), REDQ's members are drawn on
    the device, statistics are masked sums, and metrics accumulate on the device until the epoch reads them.
    `tests/unit/test_graphs.py` runs both steps under `FakeTensorMode`, where any such read raises, on CPU;
  * no Python state that changes between calls: counters the host needs live outside the step.

The same step function runs eagerly wherever graphs are off (CPU, several processes, `--cuda-graphs False`),
so the CPU tests exercise exactly the code a GPU replays.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

T = TypeVar("T")

WARMUP_CALLS = 2
"""Eager calls before the capture: they initialise what a capture cannot (optimiser state, cuBLAS workspaces,
autograd's lazily built structures) and are real steps, not wasted ones."""


def graphs_available(device: torch.device, wanted: bool) -> bool:
    """Whether a step on `device` is captured: CUDA, asked for, and not turned off by the environment."""
    return wanted and device.type == "cuda" and torch.cuda.is_available()


class CapturedStep(Generic[T]):
    """Calls `fn()` eagerly `WARMUP_CALLS` times (on a side stream), captures its next call as a CUDA graph
    and from then on replays it. `fn` reads static inputs and returns its outputs (a tensor or a structure of
    tensors, the same objects at every replay). Each call is one real step: the capture's own call replays at
    once. A capture that fails (an op that cannot be captured on this torch, device or model) warns once and
    leaves the step eager: the same numbers, only slower.

    `enabled=False` (a CPU device, graphs turned off): every call is eager. `fn` may be a bound method (with
    `args`): it is held by a weak reference, so an owner that keeps its own CapturedStep is still freed by
    reference counting (a learner's data-parallel wrapper must not wait for the garbage collector)."""

    def __init__(self, fn: Callable[..., T], enabled: bool, what: str, args: tuple = ()) -> None:
        self._method = weakref.WeakMethod(fn) if inspect.ismethod(fn) else None
        self._fn = None if self._method is not None else fn
        self.args, self.enabled, self.what = args, enabled, what
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: T | None = None

    def fn(self) -> T:
        """One eager call of the step."""
        fn = self._method() if self._method is not None else self._fn
        if fn is None:
            raise ReferenceError(f"the {self.what}'s owner is gone")
        return fn(*self.args)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> T:
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return self.out  # type: ignore[return-value]
        if not self.enabled:
            return self.fn()
        if self.calls <= WARMUP_CALLS:
            return self._side_stream()
        return self._capture()

    def _side_stream(self) -> T:
        """An eager call on a side stream, as torch asks of the calls before a capture."""
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = self.fn()
        main.wait_stream(side)
        return out

    def _capture(self) -> T:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = self.fn()
        except Exception as e:  # noqa: BLE001 - any capture failure; the eager call below re-raises a real error
            first = (str(e).strip().splitlines() or [""])[0][:200]
            warnings.warn(f"icrl: capturing the {self.what} as a CUDA graph failed ({type(e).__name__}: {first}); "
                          "it runs eagerly (pass --cuda-graphs False to skip the attempt)", RuntimeWarning,
                          stacklevel=3)
            self.enabled = False
            torch.cuda.synchronize()
            return self.fn()
        self.graph, self.out = graph, out
        graph.replay()
        return out
