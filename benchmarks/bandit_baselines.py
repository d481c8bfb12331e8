"""Reference returns of the Bernoulli bandit (`icrl.envs.tasks.bandit`, p_i ~ U(0, 1) per arm, redrawn per rollout):
the scale a learning curve on it is read against (benchmarks/parity.py's bandit rows, docs/tasks.md).

With a uniform prior the Bayes-optimal strategy is known exactly: dynamic programming over the posterior counts
(`bayes_optimal_return`). Together with the oracle that always pulls the best arm (`oracle_return`, E[max_i p_i]
per pull), random pulls (0.5 per pull), Thompson sampling (`thompson_return`) and win-stay, lose-shift
(`win_stay_lose_shift_return`, the best use of the last step alone) it places any learning curve on an absolute
scale, whose top, Bayes-optimal, no agent can exceed on average.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


def oracle_return(arms: int, horizon: int) -> float:
    """Expected return of always pulling the best arm: horizon * E[max of `arms` U(0, 1)] = horizon * k / (k + 1)."""
    return horizon * arms / (arms + 1)


def bayes_optimal_return(arms: int, horizon: int) -> float:
    """Expected return of the Bayes-optimal policy under the U(0, 1) prior, exactly (dynamic programming).

    The posterior of arm i after s successes and f failures is Beta(s + 1, f + 1); the value of a posterior
    state with n pulls left is max_i [m_i (1 + V(success of i)) + (1 - m_i) V(failure of i)], m_i = (s + 1) /
    (s + f + 2). Arms are exchangeable, so a state is the sorted tuple of (s, f) pairs; the number of states
    grows as horizon^(2 * arms), so this is meant for small problems (2 arms up to a few hundred pulls,
    3 arms up to ~30)."""
    if arms < 1 or horizon < 0:
        raise ValueError(f"bayes_optimal_return needs arms >= 1 and horizon >= 0, got {arms}, {horizon}")
    if math.comb(horizon + 2 * arms, 2 * arms) // math.factorial(arms) > 5_000_000:
        raise ValueError(f"bayes_optimal_return: {arms} arms x {horizon} pulls has too many posterior states")

    @lru_cache(maxsize=None)
    def value(state: tuple[tuple[int, int], ...], left: int) -> float:
        if left == 0:
            return 0.0
        best = 0.0
        for i, (s, f) in enumerate(state):
            if i and state[i - 1] == (s, f):
                continue  # an identical posterior: the same value
            m = (s + 1) / (s + f + 2)
            win = tuple(sorted(state[:i] + ((s + 1, f),) + state[i + 1:]))
            lose = tuple(sorted(state[:i] + ((s, f + 1),) + state[i + 1:]))
            best = max(best, m * (1.0 + value(win, left - 1)) + (1.0 - m) * value(lose, left - 1))
        return best

    return value(tuple([(0, 0)] * arms), horizon)


def thompson_return(arms: int, horizon: int, rollouts: int = 20_000, seed: int = 0) -> float:
    """Monte-Carlo mean return of Thompson sampling (Beta(1, 1) priors): a classical in-context strategy that
    needs no training, close to but below Bayes-optimal."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.0, 1.0, (rollouts, arms))  # [N, K] hidden tasks
    succ, fail = np.zeros((rollouts, arms)), np.zeros((rollouts, arms))
    total = np.zeros(rollouts)
    rows = np.arange(rollouts)
    for _ in range(horizon):
        arm = rng.beta(succ + 1, fail + 1).argmax(axis=1)  # [N]
        r = (rng.random(rollouts) < p[rows, arm]).astype(float)
        succ[rows, arm] += r
        fail[rows, arm] += 1.0 - r
        total += r
    return float(total.mean())


def win_stay_lose_shift_return(arms: int, horizon: int, rollouts: int = 100_000, seed: int = 0) -> float:
    """Monte-Carlo mean return of win-stay, lose-shift (keep a paying arm, else switch to another at random):
    the best a policy can do that remembers only its previous action and reward (2 arms, 50 pulls: 29.4). A
    score above it shows the agent uses more of its history than the last step."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.0, 1.0, (rollouts, arms))  # [N, K] hidden tasks
    rows = np.arange(rollouts)
    arm = rng.integers(arms, size=rollouts)
    total = np.zeros(rollouts)
    for _ in range(horizon):
        r = rng.random(rollouts) < p[rows, arm]
        total += r
        arm = np.where(r, arm, (arm + rng.integers(1, arms, size=rollouts)) % arms)
    return float(total.mean())
