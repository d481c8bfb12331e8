"""Unit tests start from the same torch RNG state, so each one's random tensors are the same on every run."""

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
