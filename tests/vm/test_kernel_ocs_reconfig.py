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


def _circuit_flows(dump: str) -> dict:
    """The OCS's port-to-port flows (``in_port=a actions=output:b``) in its
    ovs-ofctl dump, as {(a, b): packets}, whether ports show as numbers or names."""
    port = r'"?(?:[\w-]*-eth)?(\d+)"?'
    return {(int(a), int(b)): int(packets) for packets, a, b in
            re.findall(rf"n_packets=(\d+),.*\bin_port={port}\s+actions=output:{port}\s*$",
                       dump, re.MULTILINE)}


def test_ocs_reconfig_on_the_kernel_datapath(tmp_path):
    from emu.experiments.ocs_reconfig import CIRCUIT_SETS
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
        # The ports stayed dark at least the injected delay.  Whether the probe
        # saw the blackout is timing: under emulation its sender and the TCP
        # stream started seconds late, after both changes (2026-12-07).
        assert row["controller_dark_ms"] >= row["injected_ms"], row
    # Each change lit the circuits asked for: the sets alternate, starting
    # from "ring" (emu.experiments.ocs_reconfig), as the run's feed recorded.
    fabric = registry.build(result["config"]["fabric"]["spec"])
    asked = [sorted(hybrid.circuit_set(fabric, CIRCUIT_SETS[(i + 1) % 2]))
             for i in range(len(presets))]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["kind"] == "circuit" and e["step"] == "start"]
    lit = [sorted(tuple(c) for c in e["light"] + e["keep"]) for e in starts]
    assert lit == asked, starts
    # And the OCS's flow table held, at teardown, the last of them, over which
    # the kernel datapath carried the traffic.
    flows = _circuit_flows((run / "dumps" / f"{machine_name(fabric, 'o1')}.txt").read_text())
    assert set(flows) == {pair for a, b in asked[-1] for pair in ((a, b), (b, a))}, flows
    assert sum(flows.values()) > 0, f"no packet crossed the circuits: {flows}"
    assert "Traceback" not in (run / "controller.log").read_text()
    assert_no_leftovers()
