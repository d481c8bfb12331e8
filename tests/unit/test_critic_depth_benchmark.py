"""benchmarks/critic_depth.py's pure helpers: the depth of a value in reward steps and the per-bin table."""

import math

import numpy as np
import pytest

from benchmarks import critic_depth


@pytest.mark.parametrize("h", [1, 3, 10, 57])
def test_depth_inverts_the_discounted_sum_of_a_constant_reward(h):
    for gamma in (0.9, 0.99, 0.999):
        q = 10.0 * (1 - gamma**h) / (1 - gamma)
        assert critic_depth.depth(q, gamma, 10.0) == pytest.approx(h, rel=1e-9)


def test_depth_at_and_beyond_the_horizon_and_below_zero():
    assert critic_depth.depth(100.0, 0.9, 10.0) == math.inf  # the whole infinite sum
    assert critic_depth.depth(-1.0, 0.99, 10.0) == 0.0
    assert critic_depth.depth(5.0, 0.99, 0.0) is None  # no constant reward to count in


def test_summary_bins_steps_left_and_reads_the_policys_discount():
    gammas = [0.1, 0.9, 0.99, 0.999]
    rows = []
    for k in (1, 2, 7, 8, 60):
        q = np.zeros((4, 2))
        q[:, 0] = [10.0 * (1 - g ** min(k, 3)) / (1 - g) for g in gammas]  # value carried 3 steps back at most
        q[:, 1] = q[:, 0] - 1.0
        rows.append((k, q, np.array([0.9, 0.1])))
    table = critic_depth.summarise(rows, gammas, 10.0)
    assert [r["k"] for r in table] == ["1", "2", "6-10", "51-100"]
    assert [r["n"] for r in table] == [1, 1, 2, 1]
    assert table[0]["depth_g0.99"] == pytest.approx(1.0) and table[-1]["depth_g0.999"] == pytest.approx(3.0)
    assert all(r["abs_adv"] == pytest.approx(1.0) and r["pi_max"] == pytest.approx(0.9) for r in table)
    assert "q_g0.1" not in table[0]  # the three discounts a reader compares
