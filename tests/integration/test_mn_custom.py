"""Fabrics load in plain Mininet, as Mininet users expect (``mn --custom``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emu.live import state
from tests.integration.utils import REPO, assert_no_leftovers

pytestmark = pytest.mark.require_root


@pytest.mark.parametrize("topo,switch", [
    ("zcube,n=2", "ovs,datapath=user,failMode=secure"),
    ("zcube,n=2,dataplane=linux", "default"),
], ids=["ovs", "linux"])
def test_mn_custom_builds_zcube(tmp_path, topo, switch):
    mn = Path(sys.executable).parent / "mn"
    # Plain mn knows nothing of our lock: take it, so no run of ours is disturbed.
    with state.RunLock().acquire("test: mn --custom"):
        done = subprocess.run(
            [str(mn), "--custom", "topologies/mn_custom.py", "--topo", topo,
             "--switch", switch, "--controller", "none", "--test", "build"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PATH=f"{mn.parent}:{os.environ['PATH']}"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "*** Adding hosts:" in out and "h8" in out, out
    assert "fes1" in out and "fes4" in out, f"switches should carry the fe prefix:\n{out}"
    assert_no_leftovers()
