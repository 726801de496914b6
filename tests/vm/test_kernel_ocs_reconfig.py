"""The ``ocs-reconfig`` scenario on Open vSwitch's kernel datapath, run for real.

Like tests/vm/test_kernel_fattree.py, for `make vm-test` (a qemu VM whose
kernel has the openvswitch module); it skips elsewhere without the module.
A module of its own: the fat-tree's testbed, shared by that module's tests,
holds the run lock until its last test ends, and a scenario run is refused
while another testbed is up.  Logic only: under software emulation the
blackouts' lengths mean nothing, only that there was one.
"""

from __future__ import annotations

import json
import re

import pytest

# The testbed's modules are imported by the test: where it skips
# (tests/conftest.py), collecting it must cost next to nothing.

pytestmark = [pytest.mark.vm, pytest.mark.require_root]

RUN_TIMEOUT_S = 1800   # software emulation: tens of times slower than a core


def _circuit_flows(dump: str) -> set:
    """The OCS's port-to-port flows (``in_port=a actions=output:b``) in its
    ovs-ofctl dump, as port pairs, whether ports are shown by number or name."""
    port = r'"?(?:[\w-]*-eth)?(\d+)"?'
    return {(int(a), int(b)) for a, b in
            re.findall(rf"in_port={port}\s+actions=output:{port}\s*$", dump, re.MULTILINE)}


def test_ocs_reconfig_on_the_kernel_datapath(tmp_path):
    from tests.integration.utils import assert_no_leftovers, only_run, run_cli
    from topologies import hybrid, registry
    from topologies.naming import machine_name

    presets = ["mems", "lc"]
    done = run_cli("ocs-reconfig", "--out", str(tmp_path), "--set", "dataplane=ovs",
                   "--set", f"presets={','.join(presets)}", "--set", "settle_s=1.5",
                   "--set", "probe_pps=1000", "--set", "scale.link_mbps=5",
                   timeout_s=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "data plane ovs" in done.stdout and "system datapath" in done.stdout, done.stdout
    run = only_run(tmp_path)
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result["status"]
    assert (result["dataplane"], result["datapath"]) == ("ovs", "system")
    rows = result["metrics"]["reconfig"]
    assert [r["preset"] for r in rows] == presets
    for row in rows:
        # The probe went dark and came back: the circuit was torn and lit.
        assert row["measured_blackout_ms"] is not None, row
    # The OCS holds, at teardown, the circuits of the last change: the sets
    # alternate, starting from "ring" (emu.experiments.ocs_reconfig).
    fabric = registry.build(result["config"]["fabric"]["spec"])
    last = ("ring", "ring-reverse")[len(presets) % 2]
    wanted = {pair for a, b in hybrid.circuit_set(fabric, last) for pair in ((a, b), (b, a))}
    dump = (run / "dumps" / f"{machine_name(fabric, 'o1')}.txt").read_text()
    assert _circuit_flows(dump) == wanted, dump
    assert "Traceback" not in (run / "controller.log").read_text()
    assert_no_leftovers()
