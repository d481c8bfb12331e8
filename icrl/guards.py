"""Non-finite guards: NaN and inf are stopped where they enter, never trained on, never saved.

Why: one NaN reward or observation reaches every weight within a few updates (through the shared encoder,
PopArt's moments and the EMA targets), after which the run trains on to exit 0 with garbage weights. So
values are checked at each door: env outputs as they arrive (`first_nonfinite`; the collector's error names
the env, the step and the key), replay files as they are read (the storage layer skips them like corrupt files),
each update's loss and gradient norm (`UpdateGuard`: skipped on the device, warned about once per epoch), and every
weights file before it is written (`assert_finite_weights`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch

from icrl.config.errors import flag

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Rewards and observations are stored in float32: a finite float64 beyond this (1e300) would become inf."""


class NonFiniteError(ValueError):
    """A NaN or inf where only finite numbers may be; the message says where it came from and what to do."""


def _unstorable(arr: np.ndarray) -> np.ndarray:
    """Where `arr` (floating point) holds NaN, inf, or a finite value that float32 storage turns into inf."""
    bad = ~np.isfinite(arr)
    if arr.dtype.itemsize > 4 or arr.dtype.kind == "c":  # float16 / float32 cannot exceed float32's range
        with np.errstate(invalid="ignore", over="ignore"):
            bad |= np.abs(arr) > FLOAT32_MAX
    return bad


def nonfinite_keys(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Keys of the floating-point arrays in `arrays` that hold a NaN or an inf (integer arrays are skipped)."""
    bad = []
    for key, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype.kind in "fc" and _unstorable(arr).any():
            bad.append(key)
    return bad


def nonfinite_env_error(env: str, step: int, key: str, value: object = None) -> NonFiniteError:
    """The error for a NaN / inf an env returned: which env, at which step of its rollout, in which key."""
    if key == "reward":
        return NonFiniteError(
            f"env {env} returned a non-finite reward ({value}) at step {step} of a rollout; icrl trains only on "
            "rewards finite in float32 (|r| <= 3.4e38): fix the env (or clip its reward) before training on it"
        )
    return NonFiniteError(
        f"env {env} returned a non-finite observation (NaN, inf or beyond float32 in key {key!r}) at step {step} "
        "of a rollout; icrl trains only on finite observations: fix the env before training on it"
    )


def first_nonfinite(obs: Mapping[str, np.ndarray], rewards: np.ndarray | None = None) -> tuple[int, str] | None:
    """(env index, key) of the first non-finite reward or observation in a batch of N envs ([N, ...] arrays,
    key "reward" for `rewards`), or None. One vectorised test per key, so checking every step is cheap."""
    if rewards is not None:
        bad = _unstorable(np.asarray(rewards, dtype=np.float64))
        if bad.any():
            return int(np.flatnonzero(bad)[0]), "reward"
    for key, value in obs.items():
        arr = np.asarray(value)
        if arr.dtype.kind in "fc" and _unstorable(arr).any():
            rows = _unstorable(arr.reshape(arr.shape[0], -1)).any(axis=1)
            return int(np.flatnonzero(rows)[0]), key
    return None


def nonfinite_tensors(module: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers of `module` that hold a NaN or an inf."""
    return [
        name for name, t in module.state_dict().items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def assert_finite_weights(module: torch.nn.Module, what: str) -> None:
    """Refuse to write `what` when any weight is not finite: a saved NaN would poison every later resume."""
    bad = nonfinite_tensors(module)
    if bad:
        raise NonFiniteError(
            f"{len(bad)} weight tensor(s) of the agent are not finite (first: {bad[0]}), so {what} was not "
            f"written; the run stopped. Resume with {flag('resume')} from the last checkpoint (all of them are finite)"
        )


class UpdateGuard:
    """Decides, on the device, whether an update's step may be applied: its loss and gradient norm must be
    finite. The host reads the verdicts once per epoch (`check`), never inside an update.

    A skipped update applies nothing (no optimiser step, no PopArt or EMA change: the learner passes the
    verdict to each); `check` warns on the first skip and every `warn_every`-th after it, and raises
    NonFiniteError once `max_consecutive` updates in a row were skipped, because then the data or weights are
    broken and skipping would only turn the rest of the run into a no-op.
    """

    def __init__(self, warn_every: int = 100, max_consecutive: int = 100) -> None:
        self.warn_every, self.max_consecutive = warn_every, max_consecutive
        self._counts: torch.Tensor | None = None  # [3] long on the device: skipped, in a row now, longest run
        self._warned = 0  # skips already warned about

    def observe(self, *values: torch.Tensor) -> torch.Tensor:
        """A 0-dim bool tensor, True when every value is finite; counts a skip otherwise. No host sync."""
        ok = torch.stack([v.detach().float().reshape(()) for v in values]).isfinite().all()
        if self._counts is None:
            self._counts = torch.zeros(3, dtype=torch.long, device=ok.device)
        bad = (~ok).long()
        c = self._counts
        c[0].add_(bad)
        c[1].add_(bad).mul_(bad)  # (run + 1) after a skip, 0 after an applied update
        torch.maximum(c[2], c[1], out=c[2])
        return ok

    @property
    def skipped(self) -> int:
        """Updates skipped so far (reads the device)."""
        return 0 if self._counts is None else int(self._counts[0])

    def check(self) -> None:
        """Read the verdicts since the last check (one host sync): warn about new skips, raise when too many
        came in a row."""
        if self._counts is None:
            return
        skipped, _, longest = (int(x) for x in self._counts.tolist())
        self._counts[2].copy_(self._counts[1])  # the longest run since this check starts with the current one
        if longest >= self.max_consecutive:
            raise NonFiniteError(
                f"{longest} updates in a row had a non-finite loss or gradient; the run stopped before "
                f"training on broken data. Check the env's rewards and observations, "
                f"lower {flag('lr')} or {flag('reward_scale')}, "
                f"and resume with {flag('resume')}"
            )
        new = skipped - self._warned
        if new > 0 and (self._warned == 0 or skipped // self.warn_every > self._warned // self.warn_every):
            warnings.warn(
                f"icrl: skipped {new} update(s) with a non-finite loss or gradient ({skipped} so far); "
                "nothing of them was applied", RuntimeWarning, stacklevel=3,
            )
        self._warned = skipped
