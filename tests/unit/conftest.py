"""Fixtures shared by the unit tests."""

import os

import pytest


@pytest.fixture(scope="session")
def object_file(tmp_path_factory):
    """The BPF patch panel compiled from its source into a temporary folder: the
    tests that load it need root and clang, and skip without them."""
    from controllers.bpf import build

    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root")
    try:
        return build.build(output=tmp_path_factory.mktemp("bpf") / "panel.bpf.o")
    except build.BuildError as exc:
        pytest.skip(f"the BPF object cannot be built here: {exc}")


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """The testbed's run directory (`emu.live.state`: lock, pid records) moved
    into a temporary folder, so a test never touches a real run's."""
    from emu.live import state

    directory = tmp_path / "run"
    monkeypatch.setattr(state, "RUN_DIR", str(directory))
    monkeypatch.setattr(state, "LOCK_PATH", str(directory / "lock"))
    monkeypatch.setattr(state, "OWNED_PATH", str(directory / "owned.jsonl"))
    return directory
