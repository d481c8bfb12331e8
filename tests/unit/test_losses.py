"""TD targets, REDQ, critic and actor losses: hand-computed values, masking, gradient routing."""

from __future__ import annotations

import copy
import inspect
import itertools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from icrl.agent.critic_kind import CriticReader
from icrl.agent.losses import (
    ValueBins,
    actor_loss,
    advantage_filter,
    align_next,
    conservative_term,
    critic_loss,
    frozen_critic,
    redq_members,
    td_targets,
)
from icrl.agent.model import Agent
from icrl.config import LossConfig, ModelConfig
from icrl.data.collate import collate_windows
from icrl.nets.dists import Categorical
from icrl.nets.heads import Actor, Critic
from icrl.nets.popart import PopArt
from icrl.types import ActionSpec, Rollout

NAN = float("nan")


# ---------------------------------------------------------------- TD targets


def _td_case():
    """Three windows of L=5, padding marked NaN where it must never be read.

    row 0: terminal after step 2 (no bootstrap there); row 1: time-limit truncation after step 2
    (bootstraps; the window's transitions end there); row 2: four transitions, no terminal.
    """
    reward = torch.tensor([[1.0, 2.0, 3.0, NAN, NAN], [1.0, 1.0, 1.0, NAN, NAN], [0.0, 0.0, 0.0, 0.0, NAN]])
    terminated = torch.tensor([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    nv = torch.tensor([[10.0, 20.0, 30.0, NAN, NAN], [5.0, 6.0, 7.0, NAN, NAN], [1.0, 2.0, 3.0, 4.0, NAN]])
    gammas = torch.tensor([0.5, 0.9])
    next_value = nv.unsqueeze(-1).expand(3, 5, 2).clone()
    next_value[..., 1] *= 2  # the second discount's critic predicts twice as much
    return reward, terminated, valid, next_value, gammas


def test_td_targets_one_step_table():
    reward, terminated, valid, next_value, gammas = _td_case()
    y = td_targets(reward, terminated, valid, next_value, gammas, reward_scale=2.0)
    assert y.shape == (3, 5, 2) and torch.isfinite(y).all()
    for gi, g in enumerate([0.5, 0.9]):
        k = 2.0 if gi == 1 else 1.0  # value multiplier of this discount
        expected = torch.tensor(
            [
                [2 * 1 + g * 10 * k, 2 * 2 + g * 20 * k, 2 * 3, 0, 0],  # terminal: no bootstrap
                [2 + g * 5 * k, 2 + g * 6 * k, 2 + g * 7 * k, 0, 0],  # truncation bootstraps
                [g * 1 * k, g * 2 * k, g * 3 * k, g * 4 * k, 0],
            ]
        )
        torch.testing.assert_close(y[..., gi], expected)


def test_td_targets_n_step_table():
    reward, terminated, valid, next_value, gammas = _td_case()
    y = td_targets(reward, terminated, valid, next_value, gammas, reward_scale=2.0, n_step=3)
    assert torch.isfinite(y).all()
    for gi, g in enumerate([0.5, 0.9]):
        k = 2.0 if gi == 1 else 1.0
        expected = torch.tensor(
            [
                # stops at the terminal after step 2, without bootstrapping
                [2 + g * 4 + g**2 * 6, 4 + g * 6, 6, 0, 0],
                # three steps, then two, then one as the window's transitions run out
                [2 + 2 * g + 2 * g**2 + g**3 * 7 * k, 2 + 2 * g + g**2 * 7 * k, 2 + g * 7 * k, 0, 0],
                [g**3 * 3 * k, g**3 * 4 * k, g**2 * 4 * k, g * 4 * k, 0],
            ]
        )
        torch.testing.assert_close(y[..., gi], expected)


def test_td_targets_n_step_one_equals_default():
    reward, terminated, valid, next_value, gammas = _td_case()
    y1 = td_targets(reward, terminated, valid, next_value, gammas, n_step=1)
    y = td_targets(reward, terminated, valid, next_value, gammas)
    assert torch.equal(y1, y) and y.shape == (3, 5, 2)


# AMAGO's discounts (Grigsby et al. 2024): the default a run trains with. Written out here on purpose, so
# the test fails when the running default changes and nobody updated this expectation.
AMAGO_GAMMAS = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999)

