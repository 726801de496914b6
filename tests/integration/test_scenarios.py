"""Both scenarios end to end through the command line, and the lifecycle guarantees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from traffic.scale import Scale
from emu.live.testbed import Testbed
from emu.live.waiting import wait_until
from tests.integration.utils import REPO, assert_no_leftovers, leftovers, only_run, run_cli
from topologies import registry

pytestmark = pytest.mark.require_root


def _assert_results_folder(run, dataplane):
    for name in ("result.json", "flows.csv", "report.md", "timeline.png", "controller.log"):
        assert (run / name).is_file(), f"{name} missing from {run}: {sorted(os.listdir(run))}"
    assert list((run / "dumps").glob("*.txt")), "no flow/group dumps taken at teardown"
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result["status"]
    assert result["dataplane"] == dataplane, result.get("dataplane")
    assert result["datapath"] in (("netdev", "system") if dataplane == "ovs" else (None,))
    assert result["congestion_control"] == "cubic"
    assert "cpu" in result["fidelity"] and "warnings" in result["fidelity"]
    assert "Traceback" not in (run / "controller.log").read_text()
    return result


OVERSHOOT_MS = {"linux": 30.0, "ovs": 80.0}


def _ocs_reconfig_rows(out, dataplane):
    done = run_cli("ocs-reconfig", "--out", str(out), "--set", "presets=mems,lc",
                   "--set", "settle_s=1.5", "--set", f"dataplane={dataplane}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"data plane {dataplane}" in done.stdout, done.stdout
    run = only_run(out)
    result = _assert_results_folder(run, dataplane)
    rows = result["metrics"]["reconfig"]
    assert [r["preset"] for r in rows] == ["mems", "lc"]
    for row in rows:
        assert row["measured_blackout_ms"] is not None, row
    assert list((run / "captures").glob("*.pcap")), "no capture in the results"
    assert_no_leftovers()
    return rows


def test_ocs_reconfig_end_to_end(tmp_path, dataplane):
    # Measured from the capture: it must be there and of the injected order.  The
    # kernel applies a circuit change inside its netlink write; OVS's userspace
    # datapath, one busy thread, once took 40 ms longer to light a 10 ms change
    # during a full suite run (its stalls are what the linux data plane is for).
    # A blackout past the bound is measured once more: the VM itself once
    # stalled the kernel data plane's 10 ms change to 48.5 ms in a CI run
    # (2026-11-27; 10.3-10.4 ms in four runs after it).  So is a run whose
    # capture saw no TCP in the second before the first change: once on OVS's
    # saturated userspace datapath in a CI run (the stream had started 0.8 s
    # after the clock; the same commit passed the run before).  A data plane
    # that is late, or carries nothing, every time still fails.
    slack_ms = OVERSHOOT_MS[dataplane]

    def within(row):
        return (row["injected_ms"] * 0.5 <= row["measured_blackout_ms"]
                <= row["injected_ms"] + slack_ms
                and row["goodput_before_mbps"] > 0 and row["goodput_after_mbps"] > 0)

    rows = _ocs_reconfig_rows(tmp_path / "first", dataplane)
    if not all(map(within, rows)):
        rows = _ocs_reconfig_rows(tmp_path / "again", dataplane)
    for row in rows:
        assert within(row), row
        if dataplane == "linux":
            # The BPF panel's window, timed on the OCS's own ports in the quiet
            # pass: within 50 us of the kernel's, or of the probe's own gap
            # where its sender stalled.
            assert row["kernel_timed"] and row["ocs_dark_us"] is not None, row
            assert abs(row["ocs_error_us"]) <= max(50.0, row["ocs_resolution_us"]), row


def test_allreduce_end_to_end(tmp_path, dataplane):
    done = run_cli("allreduce", "--out", str(tmp_path), "--set", "bytes_real=2e8",
                   "--set", "hosts=4", "--set", f"dataplane={dataplane}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "persistent transport" in done.stdout, done.stdout
    result = _assert_results_folder(only_run(tmp_path), dataplane)
    metrics = result["metrics"]
    assert metrics["hosts_count"] == 4
    assert len(result["steps"]) == 2 * (4 - 1)
    assert metrics["completion_s"] >= metrics["ideal_s"] * 0.95, metrics
    assert metrics["completion_over_ideal_ratio"] == pytest.approx(
        metrics["completion_s"] / metrics["ideal_s"])
    fidelity = result["fidelity"]
    if dataplane == "linux":
        # The kernel tells each flow's path by its own multipath hash of the ports.
        assert fidelity["paths_known_count"] == 2 * (4 - 1) * 4, fidelity
        assert "path of 24 flows" in (only_run(tmp_path) / "report.md").read_text()
    else:
        assert fidelity["paths_known_count"] == 0
    assert_no_leftovers()


def test_ovs_where_open_vswitch_is_missing_is_refused_before_anything_exists(tmp_path):
    """A PATH without Open vSwitch's programs stands for a machine without it."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("ip", "tc", "mnexec", "modprobe", "sysctl"):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if found:
            (bare / tool).symlink_to(found)
    done = subprocess.run([sys.executable, "-m", "emu.run", "allreduce", "--out",
                           str(tmp_path / "out"), "--set", "dataplane=ovs"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PATH=str(bare)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "dataplane 'ovs': Open vSwitch is not installed" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert not leftovers()


def test_bad_scenario_fails_before_anything_exists(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[scenario]\nkind = "allreduce"\n[fabric]\nspec = "fattree,k=3"\n')
    done = run_cli(str(bad), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert str(bad) in done.stderr and "k must be an even number" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert not leftovers()


def test_second_run_is_refused_while_one_is_active(tmp_path):
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1")
    with Testbed(fabric, Scale.from_rates(400, 20), tmp_path / "first", log=lambda m: None,
                 dataplane="linux"):
        done = run_cli("ocs-reconfig", "--out", str(tmp_path / "second"))
        assert done.returncode == 3, done.stdout + done.stderr
        assert "another emulation is running" in done.stderr, done.stderr
    assert_no_leftovers()


def _start_run(tmp_path, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "emu.run", "allreduce", "--out",
                             str(tmp_path), *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    wait_until(lambda: any("all-reduce of" in line for line in lines) or proc.poll() is not None,
               120, "the run to start its traffic")
    assert proc.poll() is None, "".join(lines)
    return proc, lines


# SIGINT and SIGTERM at every stage of a run: tests/integration/test_interrupts_anywhere.py.


def test_killed_run_is_cleaned_by_the_next_one(tmp_path, dataplane):
    proc, lines = _start_run(tmp_path / "killed", "--set", f"dataplane={dataplane}")
    os.killpg(proc.pid, signal.SIGKILL)  # no finally block runs
    proc.wait(timeout=30)
    if dataplane == "ovs":
        # Open vSwitch keeps its bridges; on the kernel data plane every
        # namespace dies with the shell that held it, and the controller with it.
        assert leftovers(), "a SIGKILLed run should have left its bridges to clean"
    done = subprocess.run([sys.executable, "-m", "emu.clean"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if dataplane == "ovs":
        assert "removed" in done.stdout, done.stdout
    assert_no_leftovers()
