"""The netlink applier against a recorded fake kernel, and the same core scenarios on both
appliers: the routes, filters, neighbours and rules it writes must carry out the intents."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from fake_kernel import (FakeKernel, FakeLinkStats, FakeLookup, FakeNetlinkError,
                         FakeRouteWriter, trace)
from fakes import FakeNetwork, RecordingApplier, assert_delivered

from controllers.netlink import applier as netlink
from controllers.netlink.applier import (GATEWAY, PROTO_FABRIC, RTNH_F_ONLINK,
                                         NetlinkApplier, NetlinkError)
from controllers.netlink.daemon import KernelPlane
from controllers.netlink import events
from controllers.netlink.events import IFF_LOWER_UP, IFF_UP, LinkWatcher, link_messages
from controllers.netlink.namespaces import ThreadBoundSocket
from controllers.openflow.applier import OpenFlowApplier
from controllers.service import FabricService
from topologies import hybrid, rail_fabric, registry
from topologies.fabric import OCS
from topologies.naming import ROUTER_MAC
from traffic import fastlane


def kernel_plane(spec: str, writers: bool = True):
    """A FabricService over the netlink applier, every switch attached and started;
    routers write routes in batches (their `RouteWriter`) unless ``writers`` is
    False, which leaves them the one-route-at-a-time way."""
    fabric = registry.build(spec)
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    service = FabricService(fabric, applier)
    for switch in fabric.switches:
        router = writers and fabric.kind(switch) != OCS
        applier.attach(switch, kernel.sockets[switch],
                       writer=FakeRouteWriter(kernel.sockets[switch]) if router else None)
    for switch in fabric.switches:
        applier.start(switch, service.start(switch))
    return fabric, kernel, applier, service


# ---------------------------------------------------------------- what it writes
def test_a_router_starts_with_static_neighbours_and_one_route_per_host():
    fabric, kernel, applier, service = kernel_plane("fattree,k=4")
    edge = fabric.host_port("h1")[0]
    sock = kernel.sockets[edge]
    for port in fabric.ports_of(edge):
        peer, _ = fabric.peer(edge, port)
        if peer in fabric.hosts:
            data = fabric.graph.nodes[peer]
            assert sock.neighbours[(100 + port, data["ip"])] == data["mac"], \
                "a host port knows its host"
        else:
            assert sock.neighbours[(100 + port, GATEWAY)] == ROUTER_MAC, \
                "a fabric port sends to the one router MAC"
    table = service.eps.table[edge]
    for host in fabric.hosts:
        spec = sock.routes[(254, fabric.graph.nodes[host]["ip"])]
        assert spec["proto"] == PROTO_FABRIC
        hops = spec.get("multipath") or [spec]
        assert sorted(h["oif"] - 100 for h in hops) == list(table[host]), \
            f"{edge} -> {host}: the kernel's next hops are the EPS core's ports"
        for hop in hops:
            to_host = fabric.peer(edge, hop["oif"] - 100)[0] == host
            assert ("gateway" not in hop) == to_host, hop
            if not to_host:
                assert hop["gateway"] == GATEWAY and hop["flags"] == RTNH_F_ONLINK
    assert ("multipath" in sock.routes[(254, fabric.graph.nodes["h16"]["ip"])]), \
        "a remote host is reached over every uplink (ECMP)"
    assert applier.status()["ready_switches"] == sorted(fabric.switches)


def test_every_host_reaches_every_host_through_the_kernel_tables():
    fabric, kernel, _, _ = kernel_plane("fattree,k=4")
    for src in fabric.hosts:
        for dst in fabric.hosts:
            if src != dst:
                delivered, failures = trace(kernel, src, dst)
                assert delivered and not failures, f"{src} -> {dst}: {failures}"
    delivered, _ = trace(kernel, "h1", "h16")
    assert len(delivered) == 4, "(k/2)^2 shortest paths between pods"


def test_a_patch_panel_lights_its_circuits_and_leaves_the_rest_dark():
    fabric, kernel, _, _ = kernel_plane("hybrid,tors=3")
    sock = kernel.sockets["o1"]
    radix = fabric.graph.nodes["o1"]["radix"]
    assert sock.ingress == {100 + p for p in range(1, radix + 1)}, "every port has ingress"
    expected = {}
    for a, b in fabric.circuits["o1"]:
        expected[100 + a], expected[100 + b] = 100 + b, 100 + a
    assert sock.filters == expected, "a circuit is two redirects, one per direction"
    for src in fabric.hosts:
        for dst in fabric.hosts:
            if src != dst:
                assert trace(kernel, src, dst)[0], f"{src} -> {dst} over the circuits"


def test_a_reconfiguration_tears_and_lights_filters_and_moves_routes():
    fabric, kernel, _, service = kernel_plane("hybrid,tors=4,hosts_per_tor=1")
    partial = [(2, 3), (4, 5), (1, 7), (6, 8)]
    service.do_reconfigure("o1", partial, technology="custom", delay_ms=0.0)
    sock = kernel.sockets["o1"]
    assert sock.filters == {100 + a: 100 + b for x, y in partial
                            for a, b in ((x, y), (y, x))}
    torn = [c for c in sock.calls if c[0] == "tc" and c[1] == "del-filter"]
    assert sorted(c[3] - 100 for c in torn) == [1, 6, 7, 8], "only the torn circuits' ports"
    for src in fabric.hosts:
        for dst in fabric.hosts:
            if src != dst:
                delivered, failures = trace(kernel, src, dst)
                assert delivered and not failures, f"{src} -> {dst}: {failures}"


class TimedPatch:
    """A patch panel's fast path whose every change reports a later window."""

    def __init__(self, start: float):
        self.clock, self.changes = start, []

    def _taken(self, *change):
        self.changes.append(change)
        self.clock += 1.0
        return self.clock, self.clock + 0.5

    def light(self, index, peer, prio):
        return self._taken("light", index, peer)

    def dark(self, index, prio):
        return self._taken("dark", index)


def test_a_circuit_batch_returns_when_the_kernel_took_its_first_and_last_change():
    fabric, kernel, applier, service = kernel_plane("hybrid,tors=4,hosts_per_tor=1")
    panel = TimedPatch(start=100.0)
    applier.patches["o1"] = panel
    core = service.ocs["o1"]
    plan = core.plan([(2, 3), (4, 5), (1, 7), (6, 8)])
    assert len(plan.tear) == 2
    assert applier.apply({"o1": core.tear(plan)}) == (101.0, 104.5), \
        "two circuits, four ports: from the first write's start to the last one's end"
    assert [c[0] for c in panel.changes] == ["dark"] * 4
    assert applier.apply(service.eps.reroute()) is None, "routes are not timed that way"


def test_pins_become_a_rule_and_a_table_route_per_switch():
    fabric, kernel, _, service = kernel_plane(fastlane.rail_fabric_spec(16, 2))
    src, dst = fabric.hosts[0], fabric.hosts[-1]
    lanes = {frozenset((a, b)) for a, _, b, _ in rail_fabric.fast_lane_ports(fabric)}
    first, last = fabric.host_port(src)[0], fabric.host_port(dst)[0]
    middle = next(s for s in fabric.eps_switches if s not in (first, last)
                  and frozenset((first, s)) in lanes)
    if not fabric.graph.has_edge(middle, last):
        pytest.skip("no two-lane detour in this build")
    path = [src, first, middle, last, dst]
    service.do_pin("kv", path)
    assert trace(kernel, src, dst)[0] == [path], "the pinned pair follows its path"
    for switch in path[1:-1]:
        assert len(kernel.sockets[switch].rules) == 1
    service.do_unpin("kv")
    assert all(not kernel.sockets[s].rules for s in path[1:-1]), "unpin removes the rules"
    assert all((t, d) not in kernel.sockets[s].routes for s in path[1:-1]
               for (t, d) in [(netlink.pin_table(1), fabric.graph.nodes[dst]["ip"])])
    service.do_pin("kv2", path)
    lane_port = fabric.graph.edges[first, middle, 0]["ports"][first]
    kernel.set_down(first, lane_port)        # the kernel drops the pin's route with it
    service.port_changed(first, lane_port, up=False)
    assert not kernel.sockets[first].rules, "the dropped pin's rule is gone too"
    assert trace(kernel, src, dst)[0] and not trace(kernel, src, dst)[1], \
        "the pair falls back to its destination route"


def test_no_port_is_a_blackhole_and_a_reset_keeps_foreign_routes():
    fabric = registry.build("hybrid,tors=3")
    kernel = FakeKernel(fabric)
    sock = kernel.sockets["s1"]
    sock.routes[(254, "192.0.2.0")] = {"dst": "192.0.2.0/24", "proto": 2}   # not ours
    applier = NetlinkApplier(fabric)
    service = FabricService(fabric, applier)
    applier.attach("s1", sock)
    applier.start("s1", service.start("s1"))
    applier.apply({"s1": [service.eps.route("s1", "h3", ())]})
    assert sock.routes[(254, fabric.graph.nodes["h3"]["ip"])]["type"] == "blackhole"
    applier.apply({"s1": [service.start("s1")[0]]})                        # a Reset
    assert list(sock.routes) == [(254, "192.0.2.0")], "a reset removes our routes only"


def test_a_port_down_in_the_kernel_is_left_out_until_its_event_arrives():
    fabric, kernel, applier, service = kernel_plane("fattree,k=4")
    edge = fabric.host_port("h1")[0]
    far = fabric.graph.nodes["h16"]["ip"]
    ports = service.eps.table[edge]["h16"]
    assert len(ports) == 2, ports
    kernel.set_down(edge, ports[0])
    applier.apply({edge: [service.eps.route(edge, "h16", ports)]})
    spec = kernel.sockets[edge].routes[(254, far)]
    hops = spec.get("multipath") or [spec]
    assert [h["oif"] - 100 for h in hops] == list(ports[1:]), "the down port is left out"
    for port in ports[1:]:
        kernel.set_down(edge, port)
    applier.apply({edge: [service.eps.route(edge, "h16", ports)]})
    assert kernel.sockets[edge].routes[(254, far)]["type"] == "blackhole"


def test_ports_going_down_one_after_another_while_a_route_is_written():
    fabric, kernel, applier, service = kernel_plane("fattree,k=4")
    edge = fabric.host_port("h1")[0]
    far = fabric.graph.nodes["h16"]["ip"]
    first, second = service.eps.table[edge]["h16"]
    sock = kernel.sockets[edge]
    kernel.set_down(edge, first)
    looked = sock.get_links

    def second_goes_down_after_the_look():   # as Mininet takes a switch's links down
        links = looked()
        kernel.set_down(edge, second)
        return links

    sock.get_links = second_goes_down_after_the_look
    applier.apply({edge: [service.eps.route(edge, "h16", (first, second))]})
    assert sock.routes[(254, far)]["type"] == "blackhole", "no port left: a blackhole"


@pytest.mark.parametrize("writers", [False, True], ids=["one at a time", "batched"])
def test_a_batch_learns_a_down_port_once_not_once_per_route(writers):
    fabric, kernel, applier, service = kernel_plane("fattree,k=4", writers=writers)
    edge = fabric.host_port("h1")[0]
    sock = kernel.sockets[edge]
    far_hosts = [h for h in fabric.hosts if len(service.eps.table[edge][h]) == 2]
    assert len(far_hosts) >= 8, far_hosts
    first = service.eps.table[edge][far_hosts[0]][0]
    kernel.set_down(edge, first)
    looks = []
    dump = sock.get_links
    sock.get_links = lambda *indexes: looks.append(1) or dump(*indexes)
    del sock.calls[:]
    if writers:
        applier.writers[edge].writes.clear()
    applier.apply({edge: [service.eps.route(edge, h, service.eps.table[edge][h])
                          for h in far_hosts]})
    assert len(looks) == 1, "the port's state is looked up once per batch"
    writes = [call for call in sock.calls if call[:2] == ("route", "replace")]
    refused = [h for h in far_hosts if first in service.eps.table[edge][h]]
    if writers:
        assert applier.writers[edge].writes == [len(far_hosts), len(refused)], \
            "one write of the batch, then one of the routes refused, without the port"
    else:
        assert len(writes) == len(far_hosts) + 1, "one refusal, then one write per route"
    for host in far_hosts:
        spec = sock.routes[(254, fabric.graph.nodes[host]["ip"])]
        hops = spec.get("multipath") or [spec]
        assert first not in [h["oif"] - 100 for h in hops], f"{host}: the down port is out"
    for host in far_hosts:
        spec = sock.routes[(254, fabric.graph.nodes[host]["ip"])]
        assert [h["oif"] for h in spec.get("multipath") or [spec]] == \
            [applier.indexes[edge][p] for p in service.eps.table[edge][host] if p != first]


def test_a_kernel_refusal_is_an_error_naming_the_switch_and_intent():
    fabric, kernel, applier, service = kernel_plane("hybrid,tors=3")
    with pytest.raises(NetlinkError, match=r"o1: Lightpath.*File exists"):
        applier.apply({"o1": service.ocs["o1"].switch_start()})     # lit twice
    assert applier.status()["errors"], "the error is kept for the status"
    with pytest.raises(NetlinkError, match="s9 has no namespace attached"):
        applier.apply({"s9": []})


def test_counters_come_from_the_links_statistics():
    fabric, kernel, applier, _ = kernel_plane("hybrid,tors=3")
    kernel.sockets["s1"].stats[101] = {"tx_bytes": 1500, "rx_bytes": 60, "tx_packets": 1}
    counters = applier.counters()
    assert sorted(counters) == sorted(fabric.switches)
    assert counters["s1"][1]["tx_bytes"] == 1500 and counters["s1"][1]["rx_bytes"] == 60
    assert counters["s1"][2]["tx_bytes"] == 0
    assert set(counters["o1"]) == set(fabric.ports_of("o1"))


def stats_attached(spec: str, gate=None):
    """`kernel_plane` with every switch's counters read through its own stats
    socket (a `FakeLinkStats`, held at ``gate`` if given)."""
    fabric, kernel, applier, service = kernel_plane(spec)
    for switch in fabric.switches:
        applier.stats[switch] = FakeLinkStats(kernel.sockets[switch], gate)
    return fabric, kernel, applier, service


def test_counters_are_read_through_the_stats_sockets_never_the_route_sockets():
    fabric, kernel, applier, _ = stats_attached("hybrid,tors=3")
    kernel.sockets["s1"].stats[101] = {"tx_bytes": 1500, "rx_bytes": 60}

    def route_socket_used():
        raise AssertionError("counters went through a route socket")

    for sock in kernel.sockets.values():
        sock.get_links = route_socket_used
    counters = applier.counters()
    assert counters["s1"][1]["tx_bytes"] == 1500 and counters["s1"][1]["rx_bytes"] == 60
    assert all(applier.stats[switch].reads == 1 for switch in fabric.switches)
    applier.close()
    assert all(kernel.sockets[switch].closed for switch in fabric.switches)
    assert applier.counters() == {}, "nothing attached any more"


def test_an_apply_goes_through_while_counters_wait_on_a_slow_dump():
    gate = threading.Event()
    fabric, kernel, applier, service = stats_attached("hybrid,tors=3", gate)
    sampled = threading.Event()
    sampler = threading.Thread(target=lambda: (applier.counters(), sampled.set()))
    sampler.start()
    try:
        assert not sampled.wait(0.05), "the gate holds the sampler in its first dump"
        reply = service.do_reconfigure("o1", sorted(hybrid.circuit_set(fabric, "ring-reverse")),
                                       delay_ms=0.0, technology="custom")
        assert reply["plan"]["light"], "the reconfiguration was applied meanwhile"
        assert kernel.sockets["o1"].filters, "its circuits are lit"
        assert sampler.is_alive() and not sampled.is_set(), \
            "the reconfiguration finished while the sampler was still held in its dump"
    finally:
        gate.set()
        sampler.join(5)
    assert sampled.is_set()


def test_counters_do_not_wait_for_a_switch_being_changed():
    fabric, kernel, applier, _ = stats_attached("hybrid,tors=3")
    sampled = threading.Event()
    with applier._locks["s1"]:             # as `apply` holds it while it writes s1
        threading.Thread(target=lambda: (applier.counters(), sampled.set()),
                         daemon=True).start()
        assert sampled.wait(5), "counters waited for the switch's apply lock"


def test_the_daemon_gives_every_switch_a_stats_socket():
    fabric = registry.build("hybrid,tors=3")
    kernel = FakeKernel(fabric)
    pids = {switch: number for number, switch in enumerate(fabric.switches, start=1)}
    by_pid = {pid: kernel.sockets[switch] for switch, pid in pids.items()}
    opened = {}

    def stats_socket(pid):
        opened[pid] = FakeLinkStats(by_pid[pid])
        return opened[pid]

    plane = KernelPlane(fabric, route_socket=lambda pid: by_pid[pid],
                        event_socket=lambda pid: None,
                        patch_socket=lambda pid: None,
                        lookup_socket=lambda pid: FakeLookup(by_pid[pid]),
                        writer_socket=lambda pid: FakeRouteWriter(by_pid[pid]),
                        stats_socket=stats_socket)
    plane.watcher.watch = lambda switch, sock, ports_up: None
    plane.watcher.start = lambda: plane.watcher
    plane.handle({"op": "attach", "namespaces": pids})
    assert sorted(opened) == sorted(pids.values())
    assert {switch: plane.applier.stats[switch] for switch in fabric.switches} == \
        {switch: opened[pid] for switch, pid in pids.items()}


# ---------------------------------------------------------------- the same scenarios on both
class OpenFlowPlane:
    def __init__(self, spec):
        self.fabric = registry.build(spec)
        self.applier = OpenFlowApplier(self.fabric)
        self.service = FabricService(self.fabric, self.applier)
        self.network = FakeNetwork(self.fabric, on_barrier=self.applier.barrier_replied)
        self.network.connect(self.applier, self.service)

    def paths(self, src, dst):
        return sorted([src] + hops + [dst]
                      for hops in assert_delivered(self.network, src, dst).nodes())


class KernelPlaneFake:
    def __init__(self, spec):
        self.fabric, self.kernel, self.applier, self.service = kernel_plane(spec)

    def paths(self, src, dst):
        delivered, failures = trace(self.kernel, src, dst)
        assert delivered and not failures, f"{src} -> {dst}: {failures}"
        return delivered


PLANES = {"openflow": OpenFlowPlane, "netlink": KernelPlaneFake}


@pytest.mark.parametrize("plane", PLANES)
def test_both_appliers_forward_a_fat_tree_the_same_way(plane):
    net = PLANES[plane]("fattree,k=4")
    assert len(net.paths("h1", "h16")) == 4
    edge = net.fabric.host_port("h1")[0]
    assert net.paths("h1", "h2") == [["h1", edge, "h2"]]


@pytest.mark.parametrize("plane", PLANES)
def test_both_appliers_carry_a_reconfiguration(plane):
    net = PLANES[plane]("hybrid,tors=4,hosts_per_tor=1")
    before = net.paths("h1", "h3")
    net.service.do_reconfigure("o1", sorted(hybrid.circuit_set(net.fabric, "ring-reverse")),
                               technology="custom", delay_ms=0.0)
    after = net.paths("h1", "h3")
    assert before and after and all("o1" in p for p in after)


@pytest.mark.parametrize("plane", PLANES)
def test_both_appliers_reroute_around_a_failed_link(plane):
    net = PLANES[plane]("fattree,k=4")
    edge = net.fabric.host_port("h1")[0]
    agg = next(p for p in net.fabric.graph.neighbors(edge) if p not in net.fabric.hosts)
    net.service.do_link(edge, agg, up=False)        # one of the edge's two uplinks
    for path in net.paths("h1", "h16"):
        assert (edge, agg) not in zip(path, path[1:]), path
    assert len(net.paths("h1", "h16")) == 2


# ---------------------------------------------------------------- link events
def newlink(name: str, flags: int) -> bytes:
    name_attr = name.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(name_attr), 3) + name_attr
    attr += b"\0" * ((4 - len(attr) % 4) % 4)
    body = struct.pack("=BxHiII", 0, 1, 7, flags, 0) + attr
    return struct.pack("=IHHII", 16 + len(body), 16, 0, 0, 0) + body


def test_link_messages_give_the_interface_and_its_flags():
    data = newlink("fes1-eth2", IFF_UP | IFF_LOWER_UP) + newlink("fes1-eth3", IFF_UP)
    assert list(link_messages(data)) == [("fes1-eth2", IFF_UP | IFF_LOWER_UP),
                                         ("fes1-eth3", IFF_UP)]
    assert list(link_messages(b"\x00" * 8)) == [], "a short datagram is ignored"


def test_the_watcher_reports_each_change_of_a_fabric_port_once():
    seen = []
    watcher = LinkWatcher(lambda switch, name: {"fes1-eth2": 2}.get(name), seen.append)
    watcher._state[("s1", 2)] = True
    assert watcher.handle("s1", newlink("fes1-eth2", IFF_UP | IFF_LOWER_UP)) == []
    assert watcher.handle("s1", newlink("fes1-eth2", IFF_UP)) == [("s1", 2, False)]
    assert watcher.handle("s1", newlink("fes1-eth2", 0)) == [], "still down"
    assert watcher.handle("s1", newlink("lo", 0)) == [], "not a port"
    assert watcher.handle("s1", newlink("fes1-eth2", IFF_UP | IFF_LOWER_UP)) == \
        [("s1", 2, True)]
    assert seen == [], "handle() reports nothing itself: the reading thread does"


def test_the_watcher_reports_what_queued_in_every_namespace_together():
    batches = []
    ports = {"fes1-eth2": 2, "fes1-eth3": 3, "fes2-eth1": 1}
    watcher = LinkWatcher(lambda switch, name: ports.get(name), batches.append)
    ends = {}
    for switch, names in (("s1", ["fes1-eth2", "fes1-eth3"]), ("s2", ["fes2-eth1"])):
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        ends[switch] = writer
        watcher.watch(switch, reader, {ports[name]: True for name in names})
    # Three datagrams wait in two namespaces' sockets before the thread looks.
    ends["s1"].send(newlink("fes1-eth2", 0))
    ends["s1"].send(newlink("fes1-eth3", IFF_UP))
    ends["s2"].send(newlink("fes2-eth1", 0))
    watcher.start()
    try:
        deadline = time.time() + 5
        while not batches and time.time() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
        for writer in ends.values():
            writer.close()
    assert len(batches) == 1, batches
    assert sorted(batches[0]) == [("s1", 2, False), ("s1", 3, False), ("s2", 1, False)]


def test_the_watcher_waits_for_the_rest_of_a_failure_before_it_reports():
    batches = []
    ports = {"fes1-eth2": 2, "fes2-eth1": 1}
    watcher = LinkWatcher(lambda switch, name: ports.get(name), batches.append)
    ends = {}
    for switch, name in (("s1", "fes1-eth2"), ("s2", "fes2-eth1")):
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        ends[switch] = writer
        watcher.watch(switch, reader, {ports[name]: True})
    watcher.start()
    try:
        # A switch failing: its first link, then another namespace's end a
        # moment later (under SETTLE_S), then a change long after.
        ends["s1"].send(newlink("fes1-eth2", 0))
        time.sleep(events.SETTLE_S / 3)
        ends["s2"].send(newlink("fes2-eth1", 0))
        time.sleep(events.SETTLE_S * 20)
        ends["s2"].send(newlink("fes2-eth1", IFF_UP | IFF_LOWER_UP))
        deadline = time.time() + 5
        while len(batches) < 2 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
        for writer in ends.values():
            writer.close()
    assert batches == [[("s1", 2, False), ("s2", 1, False)], [("s2", 1, True)]], batches


def test_port_reports_handled_together_reroute_once():
    fabric = registry.build("fattree,k=4")
    applier = RecordingApplier(fabric)
    service = FabricService(fabric, applier)
    for switch in fabric.switches:
        service.start(switch)
    edge = fabric.host_port("h1")[0]
    uplinks = [p for p in fabric.ports_of(edge) if fabric.peer(edge, p)[0] not in fabric.hosts]
    reports = [(edge, p, False) for p in uplinks]
    reports += [(fabric.peer(edge, p)[0], fabric.peer(edge, p)[1], False) for p in uplinks]
    reply = service.ports_changed(reports)
    assert len(applier.batches) == 1, "one reroute for every link the reports took down"
    assert service.state()["down_links"] == sorted(
        sorted([edge, fabric.peer(edge, p)[0]]) for p in uplinks)
    assert reply["changed_switches"]
    assert service.ports_changed(reports) is None, "nothing changed: no reroute"
    assert len(applier.batches) == 1


def fake_kernel_plane(fabric, kernel) -> KernelPlane:
    """The controller's KernelPlane over the fake kernel, switch sN in "namespace" N;
    link events are handed to it by the test (`KernelPlane._ports_changed`)."""
    class FakeEvents:
        def fileno(self):
            return -1

    plane = KernelPlane(fabric, route_socket=lambda pid: kernel.sockets[f"s{pid}"],
                        event_socket=lambda pid: FakeEvents(),
                        lookup_socket=lambda pid: FakeLookup(kernel.sockets[f"s{pid}"]),
                        writer_socket=lambda pid: FakeRouteWriter(kernel.sockets[f"s{pid}"]),
                        stats_socket=lambda pid: FakeLinkStats(kernel.sockets[f"s{pid}"]))
    plane.watcher.watch = lambda switch, sock, ports_up: None
    plane.watcher.start = lambda: plane.watcher
    return plane


def test_attach_programs_every_namespace_and_reroutes_a_port_found_down():
    fabric = registry.build("fattree,k=4")
    kernel = FakeKernel(fabric)
    edge = fabric.host_port("h1")[0]
    uplink = max(fabric.ports_of(edge))
    kernel.set_down(edge, uplink)

    plane = fake_kernel_plane(fabric, kernel)
    pids = {switch: int(switch[1:]) for switch in fabric.switches}
    with pytest.raises(ValueError, match=r"no namespace for \['s20'\]"):
        plane.handle({"op": "attach", "namespaces": {k: v for k, v in pids.items()
                                                     if k != "s20"}})
    reply = plane.handle({"op": "attach", "namespaces": pids})
    assert reply["attached"] == sorted(fabric.switches)
    assert plane.handle({"op": "status"})["ready"]
    peer = fabric.peer(edge, uplink)[0]
    assert plane.handle({"op": "state"})["down_links"] == [sorted([edge, peer])], \
        "a port already down when attached is a link down"
    with pytest.raises(ValueError, match="attached already"):
        plane.handle({"op": "attach", "namespaces": pids})


def test_a_restored_link_gets_its_flushed_neighbours_back_before_routes_use_it():
    fabric = registry.build("fattree,k=4")
    kernel = FakeKernel(fabric)

    plane = fake_kernel_plane(fabric, kernel)
    plane.handle({"op": "attach", "namespaces": {s: int(s[1:]) for s in fabric.switches}})
    edge, port = fabric.host_port("h1")
    agg = next(p for p in fabric.ports_of(edge) if fabric.peer(edge, p)[0] not in fabric.hosts)
    peer, peer_port = fabric.peer(edge, agg)
    for switch, p in ((edge, port), (edge, agg), (peer, peer_port)):
        kernel.set_down(switch, p)                   # down from Mininet: entries flushed
        plane._ports_changed([(switch, p, False)])
    assert trace(kernel, "h16", "h1")[0] == []
    for switch, p in ((edge, port), (edge, agg), (peer, peer_port)):
        kernel.set_down(switch, p, down=False)
        plane._ports_changed([(switch, p, True)])
    assert kernel.sockets[edge].neighbours[(100 + port, fabric.graph.nodes["h1"]["ip"])] == \
        fabric.graph.nodes["h1"]["mac"], "the host behind a restored port is known again"
    delivered, failures = trace(kernel, "h16", "h1")
    assert not failures and any(edge in path and peer in path for path in delivered), \
        (delivered, failures)


def test_a_flow_path_follows_the_kernels_choice_of_next_hop_at_every_router():
    fabric = registry.build("fattree,k=4")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    service = FabricService(fabric, applier)
    for switch in fabric.switches:
        applier.attach(switch, kernel.sockets[switch], lookup=FakeLookup(kernel.sockets[switch]))
    for switch in fabric.switches:
        applier.start(switch, service.start(switch))
    shortest, _ = trace(kernel, "h1", "h16")
    seen = set()
    for sport in range(5201, 5209):
        path = applier.path("h1", "h16", sport, 40000)
        assert path in shortest, f"{path} is not one of the kernel's paths"
        seen.add(tuple(path))
    assert len(seen) > 1, "flows of one host pair may take different equal-cost paths"
    reply = service.handle({"op": "paths", "flows": [["h1", "h16", 5201, 40000],
                                                    ["h1", "h2", 5201, 40000]]})
    assert reply["paths"][0] == applier.path("h1", "h16", 5201, 40000)
    assert reply["paths"][1] == ["h1", fabric.host_port("h1")[0], "h2"]
    edge, toward_h1 = fabric.host_port("h1")
    hops = applier.hops("h1", "h2", 5201, 40000)
    assert hops[-1] == ("h2", None) and hops[1][0] == edge
    assert fabric.peer(edge, hops[1][1])[0] == "h2", "the port the edge switch sends it out of"
    for path, ports in zip(reply["paths"], reply["ports"]):
        assert len(ports) == len(path) - 1
        assert all(fabric.peer(node, port)[0] == nxt
                   for node, port, nxt in zip(path, ports, path[1:])), (path, ports)
    del applier.lookups[fabric.host_port("h1")[0]]
    assert applier.path("h1", "h16", 5201, 40000) is None, "a router without a lookup"


def test_a_host_with_several_nics_has_no_path_the_routers_can_tell():
    fabric = registry.build("sip-ocs,gpus=16,technology=mems")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    for switch in fabric.switches:
        applier.attach(switch, kernel.sockets[switch], lookup=FakeLookup(kernel.sockets[switch]))
    assert len(fabric.graph.edges("h1")) > 1
    assert applier.path("h1", "h2", 5201, 40000) is None, "the GPU's own kernel picks its NIC"


def test_the_openflow_plane_cannot_tell_a_flows_path():
    net = PLANES["openflow"]("fattree,k=4")
    assert net.service.handle({"op": "paths", "flows": [["h1", "h16", 1, 2]]}) == \
        {"paths": [None], "ports": [None]}


def test_pin_table_numbers_wrap_inside_their_range():
    assert netlink.pin_table(1) == netlink.PIN_TABLE_BASE + 1
    assert netlink.pin_table(netlink.PIN_TABLES + 1) == netlink.PIN_TABLE_BASE + 1
    error = FakeNetlinkError(100, "Network is down")
    assert error.code == 100


class _ThreadRecorder:
    """A stand-in for pyroute2's IPRoute that notes the thread of every call."""

    def __init__(self):
        self.threads = {threading.get_ident()}
        self.closed = False

    def get_links(self):
        self.threads.add(threading.get_ident())
        return ["lo"]

    def refuse(self):
        raise FakeNetlinkError(101, "Network is unreachable")

    def through(self, other):
        return other.get_links()       # a call made on the netlink thread itself


def test_a_route_socket_is_made_and_used_on_one_thread_whoever_calls():
    sock = ThreadBoundSocket(_ThreadRecorder)
    other = ThreadBoundSocket(_ThreadRecorder)
    answers = []
    callers = [threading.Thread(target=lambda: answers.append(sock.get_links()))
               for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert answers == [["lo"]] * 3 and sock.get_links() == ["lo"]
    assert len(sock._sock.threads) == 1 and sock._sock.threads == other._sock.threads
    assert threading.get_ident() not in sock._sock.threads
    assert sock.through(other) == ["lo"], "a call from the netlink thread runs in place"
    assert sock.closed is False, "plain attributes are read as they are"
    with pytest.raises(FakeNetlinkError) as refused:
        sock.refuse()
    assert refused.value.code == 101
