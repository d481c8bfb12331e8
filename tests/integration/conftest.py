"""Fixtures of the integration tests."""

import pytest


@pytest.fixture
def minari_home(tmp_path, monkeypatch):
    """Minari, with its dataset folder inside the test's tmp_path (nothing is read from or written to ~)."""
    minari = pytest.importorskip("minari", reason="Minari tests need the offline extra: pip install 'icrl[offline]'")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    return minari
