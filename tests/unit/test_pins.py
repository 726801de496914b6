"""Pinned paths through fake datapaths: the pinned pair leaves its destination route."""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional

import networkx as nx
import pytest
from fakes import (ETH_TYPE_IPV4, FakeDatapath, FakeFlowTable, FakeNetwork, FakeSwitchError,
                   decode, trace)

from controllers.intents import PinHop, UnpinHop
from controllers.openflow import messages as ofmsg
from controllers.openflow.applier import OpenFlowApplier
from controllers.openflow.compat import ofp, parser
from controllers.eps_core import EpsCore
from controllers.pins import PinTable
from controllers.service import FabricService
from topologies import rail_fabric, registry, routing
from topologies.fabric import Fabric, FabricError
from traffic import fastlane

SPEC_16 = fastlane.rail_fabric_spec(16, 2)


# ---------------------------------------------------------------- helpers
class FromSource:
    """A fake switch table as packets from one source address see it.

    `fakes.trace` asks a table by in_port and destination only; pins also
    match the source, so this view adds ``ipv4_src`` to the packet and looks
    up as `FakeFlowTable.output_ports` does (highest priority wins).
    """

    def __init__(self, table: FakeFlowTable, ipv4_src: str):
        self.table = table
        self.ipv4_src = ipv4_src

    def output_ports(self, in_port: int, ipv4_dst: Optional[str] = None,
                     eth_type: int = ETH_TYPE_IPV4) -> FrozenSet[int]:
        packet = {"in_port": in_port, "eth_type": eth_type, "ipv4_dst": ipv4_dst,
                  "ipv4_src": self.ipv4_src}
        hits = [f for f in self.table.flows if f.table_id == 0 and f.matches(packet)]
        if not hits:
            return frozenset()
        top = max(f.priority for f in hits)
        best = [f for f in hits if f.priority == top]
        if len({f.actions for f in best}) > 1:
            raise FakeSwitchError(f"{self.table.name}: overlapping flows for {packet}: {best}")
        ports = set()
        for kind, value in best[0].actions:
            ports |= {value} if kind == "output" else self.table.group_ports(value)
        return frozenset(ports)


def paths(network: FakeNetwork, src: str, dst: str):
    """Every node path (host, switches, host) src -> dst may take, all ECMP branches."""
    ip = network.fabric.graph.nodes[src]["ip"]
    views = {name: FromSource(table, ip) for name, table in network.tables.items()}
    result = trace(network.fabric, views, src, dst)
    assert not result.failures, f"{src} -> {dst}: {result.failures}"
    return sorted([src] + hops + [dst] for hops in result.nodes())


def programmed(fabric: Fabric) -> FakeNetwork:
    core = EpsCore(fabric)
    network = FakeNetwork(fabric)
    for name in fabric.eps_switches:
        network.start(name, core.switch_start(name))
    return network


def send(network: FakeNetwork, batch: Dict[str, list]) -> None:
    """A batch of intents, as the OpenFlow applier sends it."""
    network.send_intents(batch)


def openflow_service(fabric: Fabric):
    applier = OpenFlowApplier(fabric)
    service = FabricService(fabric, applier)
    network = FakeNetwork(fabric, on_barrier=applier.barrier_replied)
    network.connect(applier, service)
    return service, network


def flows_of(network: FakeNetwork):
    return {name: sorted((f.priority, sorted(f.match.items()), f.actions, f.cookie)
                         for f in table.flows) for name, table in network.tables.items()}


def detour(fabric: Fabric, src: str, dst: str):
    """A path src -> dst one switch longer than the shortest, over a fast lane."""
    lanes = {frozenset((a, b)) for a, _, b, _ in rail_fabric.fast_lane_ports(fabric)}
    first, last = fabric.host_port(src)[0], fabric.host_port(dst)[0]
    switches = fabric.graph.subgraph(fabric.eps_switches)
    shortest = nx.shortest_path_length(switches, first, last)
    for middle in nx.all_simple_paths(switches, first, last, cutoff=shortest + 1):
        if len(middle) == shortest + 2 and \
                any(frozenset(hop) in lanes for hop in zip(middle, middle[1:])):
            return [src] + middle + [dst]
    return None


@pytest.fixture
def rail():
    fabric = registry.build(SPEC_16)
    network = programmed(fabric)
    src = "h1"
    for dst in fabric.hosts:
        path = detour(fabric, src, dst) if dst != src else None
        if path:
            return fabric, network, path
    raise AssertionError("no host pair with a one-switch-longer path over a fast lane")


# ---------------------------------------------------------------- messages
def test_pin_messages_outrank_routes_and_round_trip_as_openflow():
    flow = ofmsg.pin_flow("10.0.0.1", "10.0.0.9", 7, ofmsg.COOKIE_PIN | 5)
    assert ofmsg.PRIORITY_PIN > ofmsg.PRIORITY_ROUTE
    assert flow.command == ofp.OFPFC_ADD and flow.priority == ofmsg.PRIORITY_PIN
    assert dict(flow.match.items()) == {"eth_type": 0x0800, "ipv4_src": "10.0.0.1",
                                        "ipv4_dst": "10.0.0.9"}
    assert flow.instructions[0].actions[0].port == 7
    delete = ofmsg.pin_delete("10.0.0.1", "10.0.0.9", ofmsg.COOKIE_PIN | 5)
    assert delete.command == ofp.OFPFC_DELETE_STRICT and delete.priority == ofmsg.PRIORITY_PIN
    assert (delete.cookie, delete.cookie_mask) == (ofmsg.COOKIE_PIN | 5, 2 ** 64 - 1)
    datapath = FakeDatapath(1, "s1")
    for msg in (flow, delete):
        msg.datapath = datapath
        msg.serialize()
        again = decode(datapath, bytes(msg.buf))
        assert again.cookie == msg.cookie and again.priority == msg.priority
        assert dict(again.match.items()) == dict(msg.match.items())


def test_pin_returns_one_hop_per_switch_last_switch_first(rail):
    fabric, network, path = rail
    table = PinTable(fabric)
    batch = table.pin("kv-1", path)
    assert list(batch) == list(reversed(path[1:-1]))
    src_ip, dst_ip = (fabric.graph.nodes[h]["ip"] for h in (path[0], path[-1]))
    serial = table.pins["kv-1"].serial
    for switch, peer in zip(path[1:-1], path[2:]):
        (hop,) = batch[switch]
        assert isinstance(hop, PinHop) and (hop.switch, hop.pin, hop.serial) == \
            (switch, "kv-1", serial)
        assert (hop.src_ip, hop.dst_ip) == (src_ip, dst_ip)
        assert fabric.peer(switch, hop.port)[0] == peer, f"{switch} should send toward {peer}"
        (msg,) = network.messages(switch, [hop])
        assert msg.instructions[0].actions[0].port == hop.port
        assert msg.cookie & ofmsg.COOKIE_PIN_MASK == ofmsg.COOKIE_PIN
        assert msg.cookie & ~ofmsg.COOKIE_PIN_MASK == serial, "the cookie carries the serial"
    pin = table.pins["kv-1"]
    assert (pin.src_ip, pin.dst_ip) == (src_ip, dst_ip)
    removed = table.unpin("kv-1")
    assert list(removed) == path[1:-1]
    assert all(hops == [UnpinHop(switch, "kv-1", serial, src_ip, dst_ip)]
               for switch, hops in removed.items())
    assert table.pins == {}


# ---------------------------------------------------------------- forwarding
def test_pinned_pair_follows_its_path_and_every_other_pair_its_routes(rail):
    fabric, network, path = rail
    src, dst = path[0], path[-1]
    others = [(src, h) for h in fabric.hosts[:12] if h not in (src, dst)] + \
        [(h, dst) for h in fabric.hosts[:12] if h not in (src, dst)] + [(dst, src)]
    before = {pair: paths(network, *pair) for pair in others + [(src, dst)]}
    assert path not in before[(src, dst)], "the detour must not be a destination route"
    assert before[(src, dst)] == routing.shortest_paths(routing.base_graph(fabric), src, dst)
    tables_before = flows_of(network)

    pins = PinTable(fabric)
    send(network, pins.pin("kv-1", path))
    assert paths(network, src, dst) == [path], "the pinned pair takes exactly its path"
    for pair in others:
        assert paths(network, *pair) == before[pair], f"{pair} should keep its routes"

    send(network, pins.unpin("kv-1"))
    assert flows_of(network) == tables_before, "unpin leaves the tables as they were"
    assert paths(network, src, dst) == before[(src, dst)]


def test_a_reconnecting_switch_gets_its_pins_back(rail):
    fabric, network, path = rail
    pins = PinTable(fabric)
    send(network, pins.pin("kv-1", path))
    core = EpsCore(fabric)
    middle = path[2]
    network.start(middle, core.switch_start(middle))
    assert paths(network, path[0], path[-1]) != [path], "switch_start clears the pin"
    network.send_intents({middle: pins.switch_start(middle)})
    assert paths(network, path[0], path[-1]) == [path]
    assert pins.switch_start("s999") == []


def test_pin_one_of_the_fat_tree_core_paths():
    fabric = registry.build("fattree,k=4")
    network = programmed(fabric)
    src, dst = fabric.hosts[0], fabric.hosts[-1]
    spread = paths(network, src, dst)
    assert len(spread) == 4, "k=4: four core paths between pods"
    pins = PinTable(fabric)
    send(network, pins.pin("x", spread[2]))
    assert paths(network, src, dst) == [spread[2]]
    assert len(paths(network, fabric.hosts[1], dst)) == 4, "another source keeps its ECMP"
    assert len(paths(network, dst, src)) == 4, "the reverse direction is not pinned"
    send(network, pins.unpin("x"))
    assert paths(network, src, dst) == spread


def test_parallel_links_pin_the_fast_lane_also_from_json():
    fabric = registry.build("rail-fabric")              # expander links parallel to lanes
    (a, pa, b, pb) = next(lane for lane in rail_fabric.fast_lane_ports(fabric)
                          if fabric.graph.number_of_edges(lane[0], lane[2]) > 1)
    src = next(h for h in fabric.hosts if fabric.host_port(h)[0] == a)
    dst = next(h for h in fabric.hosts if fabric.host_port(h)[0] == b)
    for version in (fabric, Fabric.from_json(fabric.to_json())):
        batch = PinTable(version).pin("p", [src, a, b, dst])
        assert batch[a][0].port == pa
        expander = min(d["ports"][a] for d in fabric.graph[a][b].values()
                       if d["lane"] == "expander")
        assert expander != pa


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("path,message", [
    ("h1,s1,h2", "list of node names"),
    (["h1", "s1"], "needs a host, at least one switch and a host"),
    (["h1", "s99", "h2"], r"unknown nodes \['s99'\]"),
    (["s1", "h1", "s1"], "start and end at a host"),
    (["h1", "s1", "h1"], "both h1"),
    (["h1", "s1", "h2", "s1", "h3"], "twice"),
])
def test_malformed_paths_are_refused(path, message):
    with pytest.raises(FabricError, match=message):
        PinTable(registry.build(SPEC_16)).pin("x", path)


def test_paths_must_be_wired_switches_only_and_up(rail):
    fabric, _, path = rail
    table = PinTable(fabric)
    hosts_on = {s: [h for h in fabric.hosts if fabric.host_port(h)[0] == s]
                for s in fabric.eps_switches}
    far = next(s for s in fabric.eps_switches if not fabric.graph.has_edge(path[1], s)
               and s != path[1])
    with pytest.raises(FabricError, match=f"no link {path[1]}-{far} \\(hop 2\\)"):
        table.pin("x", [path[0], path[1], far, hosts_on[far][0]])
    host = hosts_on[path[1]][1]
    with pytest.raises(FabricError, match=f"{host} \\(position 2\\) is a host"):
        table.pin("x", [path[0], path[1], host, path[-2], path[-1]])
    with pytest.raises(FabricError, match=f"link {path[1]}-{path[2]} \\(hop 2\\) is down"):
        table.pin("x", path, down_links={frozenset((path[1], path[2]))})
    assert table.pins == {}


def test_an_ocs_cannot_hold_a_pin():
    fabric = registry.build("hybrid")
    ocs = fabric.ocs_switches[0]
    s1, s2 = fabric.eps_switches[:2]
    h1 = next(h for h in fabric.hosts if fabric.host_port(h)[0] == s1)
    h3 = next(h for h in fabric.hosts if fabric.host_port(h)[0] == s2)
    with pytest.raises(FabricError, match=f"{ocs} \\(position 2\\) is an OCS"):
        PinTable(fabric).pin("x", [h1, s1, ocs, s2, h3])


def test_one_pin_per_id_and_per_host_pair(rail):
    fabric, _, path = rail
    table = PinTable(fabric)
    table.pin("a", path)
    assert table.pin("a", path) == {}, "the same pin again changes nothing"
    shortest = routing.shortest_paths(fabric.logical_graph(), path[0], path[-1])[0]
    with pytest.raises(FabricError, match="'a' is active"):
        table.pin("a", shortest)
    with pytest.raises(FabricError, match="already pinned by 'a'"):
        table.pin("b", shortest)
    with pytest.raises(FabricError, match="non-empty string"):
        table.pin("", path)
    with pytest.raises(FabricError, match="no active pin 'b'"):
        table.unpin("b")
    assert table.crossing([frozenset(path[1:3])]) == ["a"]
    assert table.crossing([frozenset(("h2", "s9"))]) == []
    assert table.state() == {"a": path}
    table.unpin("a")
    table.pin("b", shortest)
    assert set(table.unpin_all()) == set(shortest[1:-1]) and table.pins == {}


# ---------------------------------------------------------------- through the service
def test_pin_and_unpin_as_control_ops_of_the_service(rail):
    fabric, _, path = rail
    service, network = openflow_service(fabric)
    assert service.status()["ready"]
    before = paths(network, path[0], path[-1])
    reply = service.handle({"op": "pin", "id": "r1-r0", "path": path})
    assert reply == {"pin": "r1-r0", "switches": sorted(path[1:-1])}
    assert paths(network, path[0], path[-1]) == [path]
    with pytest.raises(FabricError, match="already pinned"):
        service.handle({"op": "pin", "id": "r2-r0", "path": before[0]})
    with pytest.raises(ValueError, match="op 'unpin': unknown argument 'pin'; allowed: id"):
        service.handle({"op": "unpin", "pin": "r1-r0"})
    assert service.handle({"op": "unpin", "id": "r1-r0"})["switches"] == sorted(path[1:-1])
    assert paths(network, path[0], path[-1]) == before
    assert not service.status()["errors"]
    sent = [msg for _, msg in network.journal if isinstance(msg, parser.OFPFlowMod)
            and msg.priority == ofmsg.PRIORITY_PIN]
    assert len(sent) == 2 * len(path[1:-1])


def test_rail_fabric_destination_routes_keep_off_the_fast_lanes():
    fabric = registry.build(SPEC_16)
    lane_ports = set()
    for a, port_a, b, port_b in rail_fabric.fast_lane_ports(fabric):
        lane_ports |= {(a, port_a), (b, port_b)}
    assert lane_ports, "the 16-GPU Rail-Fabric has fast lanes"
    table = EpsCore(fabric).table
    for switch in fabric.eps_switches:
        for host in fabric.hosts:
            ports = table[switch].get(host, ())
            assert ports, f"{switch} must still reach {host} over the expander"
            assert not {(switch, p) for p in ports} & lane_ports, \
                f"{switch} -> {host} routes over a fast lane: {ports}"


def test_a_link_failure_drops_the_pins_across_it_and_their_owner_may_still_unpin(rail):
    fabric, _, path = rail
    service, network = openflow_service(fabric)
    service.handle({"op": "pin", "id": "kv-1", "path": path})
    assert paths(network, path[0], path[-1]) == [path]
    reply = service.do_link(path[1], path[2], up=False)
    assert reply["dropped_pins"] == ["kv-1"]
    assert service.state()["pins"] == {}
    after = paths(network, path[0], path[-1])
    assert after and all(frozenset(hop) != frozenset(path[1:3])
                         for p in after for hop in zip(p, p[1:])), \
        "the pair falls back to destination routes that avoid the dead link"
    assert service.handle({"op": "unpin", "id": "kv-1"})["dropped_by_failure"] is True
    with pytest.raises(FabricError, match="no active pin"):
        service.handle({"op": "unpin", "id": "kv-1"})
