import agent_programs as programs
import pytest


@pytest.fixture
def out(tmp_path, monkeypatch):
    """The folder the agent programs' episodes report to (workers inherit the variable when they
    start); the endpoint's test modules use it for every test."""
    folder = tmp_path / "out"
    folder.mkdir()
    monkeypatch.setenv(programs.OUT, str(folder))
    return folder
