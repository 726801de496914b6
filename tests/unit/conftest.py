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
