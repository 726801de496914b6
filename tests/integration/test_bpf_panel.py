"""The BPF patch panel for real: its program on every OCS port, dark windows
the kernel times and the OCS's own ports show, a rotor under TCP, and
nothing of it left behind.  The ``linux`` data plane only (OVS has no
namespace per OCS)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from emu.live.panelprobe import PREQUEUE, PanelProbe
from emu.live.testbed import Testbed
from topologies import registry
from topologies.naming import interface, machine_name
from traffic.measure import darkwindow
from traffic.scale import Scale

from tests.integration.utils import assert_no_leftovers, run_ok

OUR_PROGRAMS = {"ocs_panel", "tor_timeflow", "tor_uplink", "arm"}
BOUND_US = 50.0                 # the worst error for a dark window
PROBE_ATTEMPTS = 3              # the instrument, not the panel, may stall: try again
GOOD_RESOLUTION_US = 30.0


def our_programs() -> set:
    """Names of our BPF programs loaded in the kernel (bpftool's list)."""
    if not shutil.which("bpftool"):
        pytest.skip("bpftool is not installed (bootstrap.sh installs it)")
    done = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True,
                          timeout=30, check=True)
    return {p.get("name") for p in json.loads(done.stdout or "[]")} & OUR_PROGRAMS


def ingress_filters(pid: int, dev: str) -> list:
    done = subprocess.run(["mnexec", "-a", str(pid), "tc", "-j", "filter", "show", "dev", dev,
                           "ingress"], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout or "[]")


def timed_window(bed, directory, label, circuits, delay_ms):
    """One reconfiguration of port 1, timed on the OCS's ports: (window, written)."""
    best, seen = None, []
    for attempt in range(PROBE_ATTEMPTS):
        probe = PanelProbe(bed, "o1", [1], 0.5 + delay_ms / 1000, 100_000,
                           name=f"{label}-{attempt}").start(directory)
        time.sleep(0.1)
        result = bed.reconfigure("o1", circuits[attempt % 2], technology="custom",
                                 delay_ms=delay_ms)
        edges = probe.finish()
        dark_ns = int(round(result["dark_from"] * 1e9))
        lit_ns = dark_ns + int(round(result["dark_s"] * 1e9))
        window = darkwindow.window_between(edges, dark_ns, lit_ns, 5_000_000)
        arrived = [s.ts_ns for s in darkwindow.read_sightings(probe.capture.path)
                   if not s.outgoing]
        seen.append({"pcap": probe.capture.path.name, "edges": len(edges), "window": window,
                     "dark_from_after_first_frame_ms":
                     (dark_ns - min(arrived)) / 1e6 if arrived else None,
                     "probe_ms": (max(arrived) - min(arrived)) / 1e6 if arrived else None})
        if window is not None and (best is None or window.resolution_ns < best.resolution_ns):
            best = window
        if best is not None and best.resolution_ns <= GOOD_RESOLUTION_US * 1000:
            break
    assert best is not None, f"no dark window of port 1 in any attempt: {seen}"
    return best, result


def test_the_panel_runs_on_every_ocs_port_and_times_a_5_ms_window_and_a_schedule(tmp_path):
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1,uplinks=2")
    fabric.set_circuits("o1", [[1, 3]])
    prequeue = PREQUEUE.read_text()
    with Testbed(fabric, Scale.from_rates(100, 20), tmp_path / "run", log=lambda m: None,
                 dataplane="linux", panel="bpf") as bed:
        assert bed.panel_kind == {"o1": "bpf"}, bed.panel_kind
        pid = bed.host(machine_name(fabric, "o1")).pid
        for port in fabric.ports_of("o1"):
            names = [f.get("options", {}).get("bpf_name", "") for f in
                     ingress_filters(pid, interface(fabric, "o1", port))]
            assert any(name.startswith("ocs_panel") for name in names), (port, names)
        assert our_programs() >= {"ocs_panel", "arm"}

        # A reconfiguration with a 5 ms dark window: the kernel opens and closes it.
        window, result = timed_window(bed, tmp_path / "captures", "window",
                                      ([[1, 4]], [[1, 3]]), 5.0)
        assert result["kernel_timed"] and result["dark_s"] == pytest.approx(0.005, abs=1e-6)
        assert abs(window.duration_ns / 1e3 - 5000.0) <= BOUND_US, window

        # A cyclic schedule, 20 ms slots with a 5 ms guard: its guards in the capture.
        reply = bed.schedule({"slot_us": 20_000, "guard_us": 5_000,
                              "matchings": {"o1": [[[1, 3]], [[1, 4]]]}}, start_in_s=0.05)
        time.sleep(0.1)
        probe = PanelProbe(bed, "o1", [1], 0.3, 100_000, name="slots").start(
            tmp_path / "captures")
        guards = darkwindow.windows(probe.finish())
        bed.stop_schedule()
        fit = darkwindow.fit_schedule(guards, int(round(reply["epoch"] * 1e9)),
                                      int(round(reply["slot_emulated_s"] * 1e9)),
                                      int(round(reply["guard_emulated_s"] * 1e9)))
        assert fit.guards >= 10, fit
        assert abs(fit.mean_guard_error_ns) <= BOUND_US * 1000, fit
        assert fit.mean_boundary_ns <= BOUND_US * 1000, fit
        assert bed.control.call("state")["schedule"] is None
    assert PREQUEUE.read_text() == prequeue, "the probe left the timestamp sysctl changed"
    assert_no_leftovers()
    assert not our_programs(), "a BPF program of the panel outlived the run"


def test_tcp_over_a_rotor_gets_some_but_not_all_of_the_duty_cycle(tmp_path):
    run, result = run_ok("rotor", tmp_path, "rotor.duty_cycles=[0.9]",
                         'rotor.congestion=["cubic"]', "rotor.duration_s=3",
                         files=("report.md", "timeline.png", "rotor_duty.png",
                                "rotor_fold.png"))
    (row,) = result["metrics"]["rotor"]
    assert 0 < row["goodput_mbps"] < row["bound_mbps"], row
    assert row["flows_count"] == 4 and row["retransmits_count"] > 0, row
    assert result["ocs_panel"] == ["bpf"], result["ocs_panel"]
    assert_no_leftovers()
    assert not our_programs(), "a BPF program of the panel outlived the run"
