"""The controller killed mid-run, on both data planes: a successor takes over.

Each test pauses the run at a named point (`controllers.pause`), kills the
controller there with SIGKILL, and lets the run go on.  The keeper
(`emu.live.keeper`) starts a successor, which takes over the state file and
resynchronises the switches; the run completes, every flow finishes, and the
circuits end as the last request asked.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from controllers.pause import PAUSE_AT, PAUSE_DIR
from emu.live.replay import Replayer
from emu.live.testbed import Testbed
from emu.live.waiting import wait_until
from tests.integration.utils import assert_no_leftovers, assert_ping
from topologies import hybrid, registry
from traffic.flows import ring_allreduce
from traffic.scale import Scale

pytestmark = pytest.mark.require_root

RATE_MBPS = 20.0


@pytest.fixture
def pauses(tmp_path, monkeypatch):
    """A pause directory; the test names its points with ``pause(points)``."""
    directory = tmp_path / "pauses"
    directory.mkdir()
    monkeypatch.setenv(PAUSE_DIR, str(directory))

    def name(*points):
        monkeypatch.setenv(PAUSE_AT, ",".join(points))
        return directory
    return name


def _kill_when_paused(directory: Path, point: str, pid_of) -> int:
    """Wait for the run to pause at ``point``, SIGKILL the controller, let the
    run go on; returns the pid killed."""
    reached = directory / f"{point}.reached"
    wait_until(reached.exists, 120, f"the run to pause at {point}")
    pid = pid_of()
    os.kill(pid, signal.SIGKILL)
    (directory / f"{point}.go").touch()
    return pid


def _allreduce(bed, hosts, run_dir):
    dag = ring_allreduce(hosts, 2_000_000)
    return Replayer(bed, dag, RATE_MBPS, run_dir / "flows")


def test_controller_killed_during_an_allreduce(tmp_path, dataplane, pauses):
    directory = pauses("replay-started")
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=2")
    run_dir = tmp_path / "run"
    with Testbed(fabric, Scale.from_rates(400, RATE_MBPS), run_dir, log=lambda m: None,
                 dataplane=dataplane) as bed:
        start_circuits = bed.control.call("state")["circuits"]
        replayer = _allreduce(bed, fabric.hosts, run_dir)
        results = []
        runner = threading.Thread(target=lambda: results.extend(replayer.run()))
        runner.start()
        killed = _kill_when_paused(directory, "replay-started", lambda: bed.controller.pid)
        runner.join(timeout=180)
        assert not runner.is_alive(), "the all-reduce never finished"
        assert [f.status for f in results] == ["ok"] * len(results), results
        outages = bed.describe()["controller_outages"]
        print("outages", dataplane, outages)
        assert len(outages) == 1 and outages[0]["pid"] == killed, outages
        assert outages[0]["exit_code"] == -signal.SIGKILL
        assert bed.controller.pid != killed
        assert bed.call("state")["circuits"] == start_circuits
        assert_ping(bed, "h1", "h3")        # across the OCS, after the resync
        if bed.panel_kind.get("o1") == "bpf":
            # The successor kept the circuits' map rather than reinstalling it.
            assert "took over BPF program" in bed.controller_log(), bed.controller_log(30)
    assert_no_leftovers()


def test_controller_killed_inside_a_dark_window(tmp_path, dataplane, pauses):
    directory = pauses("ocs-dark")
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=2")
    reverse = sorted(hybrid.circuit_set(fabric, "ring-reverse"))
    run_dir = tmp_path / "run"
    with Testbed(fabric, Scale.from_rates(400, RATE_MBPS), run_dir, log=lambda m: None,
                 dataplane=dataplane) as bed:
        replayer = _allreduce(bed, fabric.hosts, run_dir)
        flows = []
        runner = threading.Thread(target=lambda: flows.extend(replayer.run()))
        runner.start()
        replies = []
        # A 2 s dark window: the controller dies inside it, with the old
        # circuits torn and the new ones not yet lit.
        reconfig = threading.Thread(target=lambda: replies.append(bed.reconfigure(
            "o1", reverse, technology="custom", delay_ms=2000)))
        reconfig.start()
        killed = _kill_when_paused(directory, "ocs-dark",
                                   lambda: int((directory / "ocs-dark.reached").read_text()))
        reconfig.join(timeout=120)
        assert replies, "the reconfiguration was not carried out after the crash"
        runner.join(timeout=180)
        assert not runner.is_alive(), "the all-reduce never finished"
        assert [f.status for f in flows] == ["ok"] * len(flows), flows
        outages = bed.describe()["controller_outages"]
        print("outages", dataplane, outages, replies[0].get("replayed"))
        assert [o["pid"] for o in outages] == [killed], outages
        # Circuits end as requested, on the controller and in the data plane.
        assert bed.call("state")["circuits"]["o1"] == [list(c) for c in reverse]
        assert_ping(bed, "h1", "h3")
        saved = json.loads(Path("/run/fabric-emu/controller-state.json").read_text())
        assert saved["circuits"]["o1"] == [list(c) for c in reverse]
        assert "Traceback" not in bed.controller_log()
    assert_no_leftovers()


def test_a_whole_run_goes_on_and_records_the_outage(tmp_path, pauses):
    """``emu.run`` with its controller killed inside a dark window: the run
    ends as usual and its result.json records the outage."""
    import subprocess
    import sys

    from tests.integration.utils import REPO, only_run

    directory = pauses("ocs-dark")
    proc = subprocess.Popen([sys.executable, "-m", "emu.run", "ocs-reconfig", "--out",
                             str(tmp_path / "results"), "--set", "ocs_reconfig.presets=mems",
                             "--set", "ocs_reconfig.settle_s=0.5", "--set", "dataplane=ovs"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    killed = _kill_when_paused(directory, "ocs-dark",
                               lambda: int((directory / "ocs-dark.reached").read_text()))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    result = json.loads((only_run(tmp_path / "results") / "result.json").read_text())
    assert result["status"] == "ok"
    assert [o["pid"] for o in result["controller_outages"]] == [killed]
    assert any("controller died 1 time" in w for w in result["warnings"]), result["warnings"]
    assert_no_leftovers()
