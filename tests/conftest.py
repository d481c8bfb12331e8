"""Fixtures every test shares. Test groups: unit/ (one component, seconds), integration/ (the command line,
run directories, processes), learning/ (an agent learns a memory task at a fixed seed, CPU minutes)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models: extra torch threads only add contention on a shared CPU (module- and session-scoped
    fixtures that build agents run under it too)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
