"""Real networks on both data planes: the controller process, Mininet hosts, real packets."""

from __future__ import annotations

import time

import pytest

from traffic.scale import Scale
from emu.live.testbed import Testbed
from tests.integration.utils import assert_no_leftovers, assert_ping
from topologies import hybrid, registry
from traffic.measure import pcap
from emu.live.capture import Capture
from emu.live.replay import Stream
from emu.live import shaping
from emu.live.waiting import wait_until

pytestmark = pytest.mark.require_root


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"


def test_pingall_over_fattree(run_dir, dataplane):
    fabric = registry.build("fattree,k=4")
    with Testbed(fabric, Scale.from_rates(400, 50), run_dir, log=lambda m: None,
                 dataplane=dataplane) as bed:
        assert bed.status()["ready"]
        loss = bed.net.pingAll(timeout=2)
        assert loss == 0, f"pingall over the k=4 fat-tree lost {loss}% of pings"
        log = bed.controller_log()
    assert "Traceback" not in log, f"controller log holds a traceback:\n{log}"
    assert_no_leftovers()


def test_pingall_over_hybrid_rides_the_circuits(run_dir, dataplane):
    fabric = registry.build("hybrid,tors=3,hosts_per_tor=2")
    with Testbed(fabric, Scale.from_rates(400, 50), run_dir, log=lambda m: None,
                 dataplane=dataplane) as bed:
        loss = bed.net.pingAll(timeout=2)
        assert loss == 0, f"pingall over the hybrid fabric lost {loss}% of pings"
        # With every circuit dark, no ToR reaches another: the OCS really carries the traffic.
        bed.control.call("reconfigure", ocs="o1", circuits=[], technology="custom", delay_ms=0)
        out = bed.host("h1").cmd("ping -c 2 -i 0.2 -W 1 " + fabric.graph.nodes["h3"]["ip"])
        assert "100% packet loss" in out, f"h1 reached h3 with no circuit lit:\n{out}"
        assert_ping(bed, "h1", "h2")  # same ToR: no circuit needed
    assert_no_leftovers()


def _ocs_port_packets(bed, port: int) -> int:
    """Packets the OCS received on a port, from the switches' counters (either data plane)."""
    return bed.counters()["o1"][port]["rx_packets"]


def test_reconfiguration_moves_traffic_with_a_blackout_in_the_capture(run_dir, dataplane):
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1")
    ring, reverse = (sorted(hybrid.circuit_set(fabric, name)) for name in ("ring", "ring-reverse"))
    delay_ms = 40.0
    with Testbed(fabric, Scale.from_rates(400, 20), run_dir, log=lambda m: None,
                 dataplane=dataplane) as bed:
        capture = Capture(bed, "h2-rx", bed.host("h2").defaultIntf().name, host="h2",
                          bpf="udp").start(run_dir / "captures")
        probe = Stream(bed, "h1", "h2", duration_s=3, port=5301, udp=True, rate_mbps=1.0,
                       blksize=64, pacing_us=100, name="probe")
        try:
            time.sleep(1.0)  # traffic on the old circuit before the change
            old_ports = [p for c in ring for p in c]
            before = {p: _ocs_port_packets(bed, p) for p in old_ports}
            result = bed.control.call("reconfigure", ocs="o1", circuits=reverse,
                                      technology="custom", delay_ms=delay_ms)
            new_ports = [p for c in reverse for p in c]
            lit = {p: _ocs_port_packets(bed, p) for p in new_ports}
            time.sleep(1.0)
            after_old = {p: _ocs_port_packets(bed, p) for p in old_ports}
            after_new = {p: _ocs_port_packets(bed, p) for p in new_ports}
            probe.finish(timeout_s=30)
        finally:
            probe.stop()
            capture.stop()
        assert bed.control.call("state")["circuits"]["o1"] == [list(c) for c in reverse]
    assert any(after_new[p] > lit[p] for p in new_ports), \
        f"no traffic on the new circuit ports {new_ports}: {lit} -> {after_new}"
    moved_on_old = sum(after_old[p] - before[p] for p in old_ports)
    stamps = result["timestamps"]
    assert moved_on_old < 1000, f"old circuit ports kept carrying {moved_on_old} packets"
    arrivals = [r.ts for r in pcap.packet_records(capture.path, proto="udp", dport=5301)]
    assert arrivals, "the capture holds no probe packets"
    gap = pcap.blackout_near(arrivals, stamps["routes_moved"], window_s=1.0,
                             nominal_interval_s=64 * 8 / 1e6)
    assert gap is not None and gap.duration_s * 1000 >= delay_ms * 0.8, \
        f"expected a blackout of about {delay_ms} ms in the capture, found {gap}"
    assert gap.duration_s * 1000 < delay_ms + 50, f"blackout {gap} far longer than {delay_ms} ms"
    assert_no_leftovers()


def _tcp_counter(bed, host: str, name: str) -> int:
    out = bed.host(host).cmd(f"nstat -az {name}")
    fields = next((line.split() for line in out.splitlines() if line.startswith(name)), None)
    return int(fields[1]) if fields else 0


def test_a_window_bounded_flow_arrives_in_order_across_shaped_hops(run_dir, dataplane):
    """A KV flow's window is bounded (``traffic.kvwindow``), so its sender
    often fills the window with a short segment.  That segment must queue
    behind the full ones sent before it; taken for signalling, it overtook
    them, and the receiver saw the flow out of order (every flow here on
    ``linux``, some on ``ovs``)."""
    fabric = registry.build("fattree,k=4")
    src, dst = fabric.hosts[0], fabric.hosts[-1]        # different pods: five shaped hops
    with Testbed(fabric, Scale.from_rates(400, 10), run_dir, log=lambda m: None,
                 dataplane=dataplane) as bed:
        target = bed.fabric.graph.nodes[dst]["ip"]
        ports = range(5201, 5205)
        for port in ports:
            bed.host(dst).cmd(f"iperf3 -s -1 -D -p {port}")
        wait_until(lambda: all(f":{port} " in bed.host(dst).cmd("ss -Hltn") for port in ports),
                   10.0, f"iperf3 servers on {dst} to listen")
        for port in ports:
            # Each flow starts afresh: with the last one's RTT cached, the
            # first window goes out differently.
            for host in (src, dst):
                bed.host(host).cmd("ip tcp_metrics flush all")
            out = bed.host(src).cmd(f"iperf3 -c {target} -p {port} -n 200000 -w 15000 "
                                    f"-S {shaping.DATA_TOS} --connect-timeout 5000")
            assert "iperf Done" in out, f"the flow on port {port} failed:\n{out}"
        out_of_order = _tcp_counter(bed, dst, "TcpExtTCPOFOQueue")
        reordered = _tcp_counter(bed, src, "TcpExtTCPSACKReorder")
    assert (out_of_order, reordered) == (0, 0), \
        f"{dst} queued {out_of_order} segments out of order, {src} saw reordering {reordered} times"
    assert_no_leftovers()
