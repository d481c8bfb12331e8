"""Fixtures of the integration tests."""

import pytest

from icrl.config.errors import speak_cli


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The working directory is a fresh folder (default run dirs go to ./runs); errors in Python words."""
    monkeypatch.chdir(tmp_path)
    speak_cli(False)
    yield tmp_path
    speak_cli(False)


@pytest.fixture
def minari_home(tmp_path, monkeypatch):
    """Minari, with its dataset folder inside the test's tmp_path (nothing is read from or written to ~)."""
    minari = pytest.importorskip("minari", reason="Minari tests need the offline extra: pip install 'icrl[offline]'")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    return minari
