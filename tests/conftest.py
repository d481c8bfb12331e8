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


def pytest_collection_modifyitems(items: list) -> None:
    """The learning tests (CPU minutes each) first, so that with `-n 2 --maxschedchunk 1` (README, .ci/run) both
    test workers start on them, one at a time each, and the seconds-long tests fill in after: measured, the
    test order of collection left the 7-minute relabeling test running alone at the end. The order within each
    group is unchanged."""
    items.sort(key=lambda item: item.get_closest_marker("learning") is None)  # stable sort: False (learning) first
