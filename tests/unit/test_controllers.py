"""EPS and OCS cores: their intents, the same intents traced through fake OpenFlow
datapaths, the OpenFlow applier's translation, and a smoke test of the os-ken shim."""

import json
import os
import queue
import subprocess
import sys

import networkx as nx
import pytest
from fakes import (FakeDatapath, FakeNetwork, FakeSwitchError, assert_delivered, decode,
                   features_reply)

from controllers import launcher
from controllers.openflow import app, messages as ofmsg
from controllers.openflow.compat import (CONFIG_DISPATCHER, MAIN_DISPATCHER, ofp, ofp_event,
                                parser)
from controllers.eps_core import EpsCore
from controllers.intents import Lightpath, Reset, Route, merge
from controllers.ocs_core import CUSTOM, TECHNOLOGIES, OcsCore, delay_ms_for
from controllers.openflow.applier import OpenFlowApplier
from controllers.service import FabricService
from topologies import hybrid, registry, routing
from topologies.fabric import EPS, HOST, FabricError

K = 4


# ---------------------------------------------------------------- helpers
def eps_network(fabric):
    """Program every packet switch of a fabric with EpsCore.switch_start."""
    core = EpsCore(fabric)
    network = FakeNetwork(fabric)
    for name in fabric.eps_switches:
        network.start(name, core.switch_start(name))
    return core, network


def ocs_network(fabric, tdf=1.0):
    cores = {name: OcsCore(fabric, name, tdf) for name in fabric.ocs_switches}
    eps, network = eps_network(fabric)
    for name, core in cores.items():
        network.start(name, core.switch_start())
    return eps, cores, network


def group_id(fabric, host):
    return fabric.graph.nodes[host]["index"]


def role(fabric, node):
    return fabric.graph.nodes[node]["role"]


def pod(fabric, node):
    return fabric.graph.nodes[node].get("pod")


@pytest.fixture(scope="module")
def fat_tree():
    fabric = registry.build(f"fattree,k={K}")
    core, network = eps_network(fabric)
    return fabric, core, network


# ---------------------------------------------------------------- EPS core
def test_switch_start_gives_one_route_per_host_with_its_ecmp_ports(fat_tree):
    fabric, core, _ = fat_tree
    routes = core.switch_start("s1")
    assert all(isinstance(r, Route) and r.switch == "s1" for r in routes)
    assert [r.dst for r in routes] == fabric.hosts, "one route per destination host, in order"
    for route in routes:
        assert route.dst_ip == fabric.graph.nodes[route.dst]["ip"]
        assert route.ports == core.table["s1"][route.dst], \
            f"s1 -> {route.dst}: the route's ports are the routing table's"
        assert list(route.ports) == sorted(route.ports) and route.ports


def test_a_reset_and_routes_clear_then_install_one_group_and_route_per_host(fat_tree):
    fabric, core, network = fat_tree
    msgs = network.messages("s1", [Reset("s1")] + core.switch_start("s1"))
    first = msgs[:3]
    assert first[0].command == ofp.OFPFC_DELETE and first[0].table_id == ofp.OFPTT_ALL, \
        "a connecting switch must first lose every flow of a previous controller"
    assert isinstance(first[1], parser.OFPGroupMod) and first[1].group_id == ofp.OFPG_ALL, \
        "and every group"
    assert first[2].priority == 0 and not first[2].instructions, \
        "the table miss must drop explicitly: fabrics have loops, nothing may flood"
    groups = [m for m in msgs if isinstance(m, parser.OFPGroupMod) and m.command == ofp.OFPGC_ADD]
    routes = [m for m in msgs[3:] if isinstance(m, parser.OFPFlowMod)]
    assert len(groups) == len(routes) == len(fabric.hosts), \
        f"expected one group and one route per host ({len(fabric.hosts)}), " \
        f"got {len(groups)} groups and {len(routes)} routes"


def test_every_host_reaches_every_host_from_every_edge_switch(fat_tree):
    fabric, _, network = fat_tree
    edges = fabric.nodes_of(EPS, "edge")
    assert len(edges) == K * K // 2
    for edge in edges:
        # Inject at the edge switch from each of its hosts' ports.
        sources = [h for h in fabric.hosts if fabric.host_port(h)[0] == edge]
        assert sources, f"{edge} has no host"
        for src in sources:
            for dst in fabric.hosts:
                if dst == src:
                    continue
                result = assert_delivered(network, src, dst)
                for path in result.delivered:
                    nodes = [hop.node for hop in path]
                    assert len(nodes) == len(set(nodes)), f"{src}->{dst} revisits: {nodes}"
                    assert len(nodes) <= 5, f"{src}->{dst} longer than the fat-tree's " \
                                            f"diameter: {nodes}"


def test_remote_pod_traffic_spreads_over_every_core_path(fat_tree):
    _, _, network = fat_tree
    result = assert_delivered(network, "h1", f"h{K ** 3 // 4}")
    assert len(result.delivered) == (K // 2) ** 2, \
        f"a k={K} fat-tree has (k/2)^2 shortest paths between pods, walk found " \
        f"{result.nodes()}"
    assert len({path[2].node for path in result.delivered}) == (K // 2) ** 2, \
        "every core switch should carry one of the paths"


def test_unknown_destination_is_dropped_not_flooded(fat_tree):
    fabric, _, network = fat_tree
    edge, port = fabric.host_port("h1")
    ports = network.tables[edge].output_ports(port, "10.99.0.1")
    assert ports == frozenset(), f"{edge} forwards an unknown address to {sorted(ports)}"


def test_ecmp_group_sizes_follow_the_fat_tree_formulas(fat_tree):
    fabric, core, network = fat_tree
    half = K // 2
    for switch in fabric.eps_switches:
        table = network.tables[switch]
        for host in fabric.hosts:
            ports = table.group_ports(group_id(fabric, host))
            edge = fabric.host_port(host)[0]
            kind = role(fabric, switch)
            if kind == "core":
                expected = 1                        # one aggregation switch per pod
            elif kind == "agg":
                expected = 1 if pod(fabric, switch) == pod(fabric, host) else half
            elif switch == edge:
                expected = 1                        # the host's own port
            else:                                   # up through every aggregation switch
                expected = half
            assert len(ports) == expected, \
                f"{kind} switch {switch} towards {host} (pod {pod(fabric, host)}): expected " \
                f"{expected} ECMP ports, group has {sorted(ports)}"


def test_reroute_sends_group_modifies_only_for_changed_entries():
    fabric = registry.build(f"fattree,k={K}")
    core, network = eps_network(fabric)
    assert core.reroute() == {}, "nothing changed, so nothing should be sent"
    edge, agg = "s7", "s5"
    assert fabric.graph.has_edge(edge, agg)
    core.down_links.add(frozenset((edge, agg)))
    batch = core.reroute()
    assert edge in batch and agg in batch, \
        f"both ends of {edge}-{agg} must change: {sorted(batch)}"
    for switch, routes in batch.items():
        assert all(isinstance(r, Route) and r.switch == switch for r in routes)
        msgs = network.messages(switch, routes)
        assert all(isinstance(m, parser.OFPGroupMod) and m.command == ofp.OFPGC_MODIFY
                   for m in msgs), f"{switch}: a route change must be an atomic group MODIFY"
    network.send_intents(batch)
    port = fabric.graph.edges[edge, agg, 0]["ports"][edge]
    for dst in fabric.hosts[4:]:
        result = assert_delivered(network, "h1", dst)
        assert all(hop.out_port != port for path in result.delivered for hop in path
                   if hop.node == edge), f"h1->{dst} still uses the failed link {edge}-{agg}"


def test_reroute_drops_unreachable_destinations_unless_filled():
    fabric = registry.build("hybrid,tors=3")
    dark = {"o1": set()}
    plain = EpsCore(fabric)
    batch = plain.reroute(dark)
    remote = [h for h in fabric.hosts if fabric.host_port(h)[0] != "s1"]
    emptied = {r.dst for r in batch["s1"] if not r.ports}
    assert emptied == set(remote), \
        "without circuits, s1's routes towards other ToRs' hosts lose every port (drop)"
    network = FakeNetwork(fabric)
    msgs = network.messages("s1", batch["s1"])
    assert {m.group_id for m in msgs if not m.buckets} == {group_id(fabric, h) for h in remote}, \
        "an empty route becomes an empty group, which drops"
    filled = EpsCore(fabric)
    before = dict(filled.table)
    assert filled.reroute(dark, fill_missing_from=filled.table) == {}, \
        "filled from the current table, stranded destinations keep their routes"
    assert filled.table == before
    assert filled.routes_for(dark)["s1"].keys() == {"h1", "h2"}, \
        "routes_for reports reachability only"



def test_route_tables_are_kept_per_circuit_set_and_failed_links():
    """A reconfiguration's tables come from a cache keyed by what changes the
    graph: the same answer as computed afresh, never shared with a caller
    that changes its copy, and a failed link or another circuit set is a
    different table."""
    fabric = registry.build("hybrid,tors=3")
    core = EpsCore(fabric)
    lit, dark = dict(fabric.circuits), {"o1": set()}
    first = core.routes_for(dark)
    first["s1"].clear()                                  # the caller's own copy
    assert core.routes_for(dark) == EpsCore(fabric).routes_for(dark)
    assert core.routes_for(dark)["s1"], "a caller's change must not reach the cache"
    assert core.routes_for(lit) != core.routes_for(dark)
    edge = next((u, v) for u, v in fabric.graph.edges("s1") if fabric.kind(v) == HOST)
    before = core.routes_for(lit)
    core.down_links.add(frozenset(edge))
    after = core.routes_for(lit)
    assert after != before, f"with {edge} failed the table must change"
    fresh = EpsCore(fabric)
    fresh.down_links.add(frozenset(edge))
    assert after == fresh.routes_for(lit)



def _looping_destination(fabric, circuits, table):
    """A destination whose next hops form a cycle over ``circuits``, or None."""
    logical = routing.base_graph(fabric, circuits)
    for dst in fabric.hosts:
        hops = nx.DiGraph()
        for switch, entries in table.items():
            ports = entries.get(dst) or ()
            for _, peer, data in logical.edges(switch, data=True):
                if data["ports"].get(switch) in ports and fabric.kind(peer) != HOST:
                    hops.add_edge(switch, peer)
        if not nx.is_directed_acyclic_graph(hops):
            return dst
    return None


def _loops_while_applied(fabric, circuits, table, rounds, order):
    """Apply ``rounds`` a switch at a time in ``order``; the (switch, dst) loops met."""
    table = {switch: dict(entries) for switch, entries in table.items()}
    loops = []
    for batch in rounds:
        for switch in order(batch):
            for route in batch[switch]:
                table.setdefault(switch, {})[route.dst] = route.ports
            dst = _looping_destination(fabric, circuits, table)
            if dst:
                loops.append((switch, dst))
    return loops


@pytest.mark.parametrize("order", [sorted, lambda batch: sorted(batch, reverse=True)],
                         ids=["switches-in-order", "switches-reversed"])
def test_reroute_rounds_never_loop_however_the_switches_interleave(order):
    """The reconfiguration that failed SYNs with ICMP time-exceeded at 48 GPUs
    (o2 swapping two layer templates): its route moves and restores, applied
    a switch at a time, loop in one batch but never in `reroute_rounds`."""
    fabric = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=12,gpus_per_server=2,"
                            "radix=8,core_uplinks=1")
    before = {(2, 11), (3, 15), (5, 7), (6, 12), (14, 16)}
    after = {(2, 7), (3, 12), (5, 8), (11, 16), (14, 17)}
    fabric.circuits["o2"] = set(before)
    outcomes = {}
    for name, ordered in (("one batch", lambda rounds: [merge(*rounds)]),
                          ("rounds", lambda rounds: rounds)):
        fabric.circuits["o2"] = set(before)
        core = EpsCore(fabric)
        lit = dict(fabric.circuits)
        interim, target = dict(lit, o2=before & after), dict(lit, o2=after)
        start = core.table
        moved = core.reroute_rounds(interim, fill_missing_from=core.table)
        loops = _loops_while_applied(fabric, lit, start, ordered(moved), order)
        core.reroute(interim, fill_missing_from=core.routes_for(target))    # repoint
        stranded = core.table
        fabric.circuits["o2"] = set(after)
        restored = core.reroute_rounds()
        loops += _loops_while_applied(fabric, fabric.circuits, stranded, ordered(restored), order)
        outcomes[name] = loops
    assert outcomes["one batch"], "the case must loop when written in one batch"
    assert outcomes["rounds"] == [], f"loops met between rounds' switches: {outcomes['rounds']}"


# ---------------------------------------------------------------- OCS core
@pytest.fixture
def ring3():
    return registry.build("hybrid,tors=3")


def test_circuits_become_port_to_port_flows_both_ways(ring3):
    _, cores, network = ocs_network(ring3)
    table = network.tables["o1"]
    lit = ring3.circuits["o1"]
    assert lit == {(2, 3), (4, 5), (1, 6)}
    for a, b in lit:
        assert table.output_ports(a) == {b}, f"circuit {a}-{b}: in_port {a} must leave by {b}"
        assert table.output_ports(b) == {a}, f"circuit {a}-{b}: in_port {b} must leave by {a}"
    radix = ring3.graph.nodes["o1"]["radix"]
    dark = set(range(1, radix + 1)) - {p for c in lit for p in c}
    for port in dark:
        assert table.output_ports(port) == frozenset(), f"dark port {port} forwards"


def test_hosts_talk_across_the_ring_of_circuits(ring3):
    _, _, network = ocs_network(ring3)
    for src in ring3.hosts:
        for dst in ring3.hosts:
            if src != dst:
                result = assert_delivered(network, src, dst)
                assert network.ocs_hops(result.delivered) <= ring3.circuits["o1"]


def test_plan_refuses_a_port_used_twice(ring3):
    core = OcsCore(ring3, "o1")
    with pytest.raises(FabricError, match=r"port 2 is already used by another circuit"):
        core.plan([(1, 2), (2, 3)])


def test_plan_refuses_a_port_beyond_the_radix(ring3):
    core = OcsCore(ring3, "o1")
    with pytest.raises(FabricError, match=r"port 7 beyond radix 6 \(allowed 1\.\.6\)"):
        core.plan([(1, 7)])


@pytest.mark.parametrize("circuits,message", [
    ([(3, 3)], "connects a port to itself"),
    ([(1, 2, 3)], "is not a port pair"),
])
def test_plan_refuses_malformed_circuits(ring3, circuits, message):
    with pytest.raises(FabricError, match=message):
        OcsCore(ring3, "o1").plan(circuits)


def test_plan_splits_keep_tear_and_light_without_touching_the_fabric(ring3):
    core = OcsCore(ring3, "o1")
    before = set(ring3.circuits["o1"])
    plan = core.plan([(3, 2), (1, 4), (5, 6)])
    assert plan.keep == {(2, 3)}, f"keep: {plan.keep}"
    assert plan.tear == {(4, 5), (1, 6)}, f"tear: {plan.tear}"
    assert plan.light == {(1, 4), (5, 6)}, f"light: {plan.light}"
    assert plan.dark_ports == [1, 4, 5, 6], f"dark ports: {plan.dark_ports}"
    assert ring3.circuits["o1"] == before, "planning must not change the circuits"
    assert core.tear(plan) == [Lightpath("o1", 1, 6, False), Lightpath("o1", 4, 5, False)]
    assert core.light(plan) == [Lightpath("o1", 1, 4, True), Lightpath("o1", 5, 6, True)]
    network = FakeNetwork(ring3)
    torn = [(m.command, dict(m.match.items())["in_port"])
            for m in network.messages("o1", core.tear(plan))]
    assert sorted(torn) == [(ofp.OFPFC_DELETE_STRICT, p) for p in (1, 4, 5, 6)]
    lit = sorted(dict(m.match.items())["in_port"] for m in network.messages("o1", core.light(plan)))
    assert lit == [1, 4, 5, 6]
    core.commit(plan)
    assert ring3.circuits["o1"] == {(2, 3), (1, 4), (5, 6)}


def test_technology_presets_are_table_2():
    assert {name: tech.delay_ms for name, tech in TECHNOLOGIES.items()} == {
        "rotornet": 0.01, "mems": 10.0, "piezo": 25.0, "lc": 100.0, "robotic": 120000.0}


@pytest.mark.parametrize("technology", sorted(TECHNOLOGIES))
@pytest.mark.parametrize("tdf", [1.0, 400.0])
def test_plan_delay_is_the_preset_times_the_dilation(technology, tdf):
    fabric = registry.build("hybrid")
    core = OcsCore(fabric, "o1", tdf=tdf)
    assert core.set_technology(technology) == TECHNOLOGIES[technology].delay_ms
    plan = core.plan(hybrid.circuit_set(fabric, "ring-reverse"))
    real = TECHNOLOGIES[technology].delay_ms
    assert plan.delay_real_ms == real
    assert plan.delay_emulated_s == pytest.approx(real * tdf / 1000.0), \
        f"{technology} at tdf {tdf}: expected {real * tdf / 1000.0} s dark"
    assert plan.to_dict()["delay_emulated_ms"] == pytest.approx(real * tdf)


def test_custom_technology_needs_a_delay():
    with pytest.raises(FabricError, match="custom' needs a delay_ms >= 0"):
        delay_ms_for(CUSTOM)
    with pytest.raises(FabricError, match="delay_ms must be >= 0"):
        delay_ms_for(CUSTOM, -1.0)
    with pytest.raises(FabricError, match="delay_ms must be >= 0"):
        delay_ms_for("mems", -5.0)
    assert delay_ms_for(CUSTOM, 7) == 7.0
    with pytest.raises(FabricError, match="allowed: rotornet, mems, piezo, lc, robotic, custom"):
        delay_ms_for("warp")


def test_custom_delay_is_stored_on_the_ocs_and_used_by_the_next_plan():
    fabric = registry.build("hybrid")
    core = OcsCore(fabric, "o1", tdf=2.0)
    core.set_technology(CUSTOM, 7.0)
    assert core.technology == CUSTOM
    plan = core.plan([])
    assert plan.delay_real_ms == 7.0 and plan.delay_emulated_s == pytest.approx(0.014)
    core.set_technology("mems")
    assert fabric.graph.nodes["o1"]["delay_ms"] is None, "a preset must drop the custom delay"
    assert core.plan([]).delay_real_ms == 10.0


def test_an_ocs_remembers_its_last_reconfigurations_only():
    from controllers import ocs_core
    core = OcsCore(registry.build("hybrid"), "o1")
    for index in range(ocs_core.HISTORY_KEPT + 10):
        core.history.append({"index": index})
    assert len(core.history) == ocs_core.HISTORY_KEPT, "a long run must not keep every result"
    assert core.history[-1] == {"index": ocs_core.HISTORY_KEPT + 9}
    assert [r["index"] for r in core.history[-2:]] == [ocs_core.HISTORY_KEPT + 8,
                                                         ocs_core.HISTORY_KEPT + 9]
    assert OcsCore(registry.build("hybrid"), "o1").history == []


# ---------------------------------------------------------------- os-ken shim
HANDLERS = {
    "switch_features": (ofp_event.EventOFPSwitchFeatures, [CONFIG_DISPATCHER]),
    "barrier_reply": (ofp_event.EventOFPBarrierReply, [MAIN_DISPATCHER]),
    "error_msg": (ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER]),
    "state_change": (ofp_event.EventOFPStateChange, ["dead"]),
    "port_status": (ofp_event.EventOFPPortStatus, [MAIN_DISPATCHER]),
    "port_stats_reply": (ofp_event.EventOFPPortStatsReply, [MAIN_DISPATCHER]),
}


def bare_controller(fabric):
    """The app object without os-ken's app manager: only the applier and service are set."""
    controller = app.FabricController.__new__(app.FabricController)
    controller.applier = OpenFlowApplier(fabric)
    controller.service = FabricService(fabric, controller.applier)
    controller.port_events = queue.Queue()
    return controller


def test_every_handler_is_registered_and_covered_by_the_smoke_test():
    found = {}
    for name in dir(app.FabricController):
        callers = getattr(getattr(app.FabricController, name), "callers", None)
        if callers:
            found[name] = {ev: caller.dispatchers for ev, caller in callers.items()}
    expected = {name: {ev: dispatchers} for name, (ev, dispatchers) in HANDLERS.items()}
    assert found == expected, f"handlers changed: {found}; update HANDLERS and the smoke test"


def test_smoke_every_handler_with_real_event_objects():
    fabric = registry.build("hybrid")
    controller = bare_controller(fabric)
    service, applier = controller.service, controller.applier
    datapaths = {name: FakeDatapath(fabric.graph.nodes[name]["dpid"], name)
                 for name in fabric.switches}

    for datapath in datapaths.values():
        controller.switch_features(
            ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(datapath)))
    assert sorted(service.status()["connected"]) == sorted(fabric.switches)
    assert not service.status()["ready"], "no barrier answered yet, so nothing is ready"

    for datapath in datapaths.values():
        reply = parser.OFPBarrierReply(datapath)
        reply.xid = datapath.sent[-1].xid
        assert isinstance(datapath.sent[-1], parser.OFPBarrierRequest)
        controller.barrier_reply(ofp_event.EventOFPBarrierReply(reply))
    status = service.status()
    assert status["ready"], f"every switch answered its barrier: {status}"

    switch = fabric.eps_switches[0]
    port_no, (peer, _) = sorted(fabric.ports_of(switch).items())[0]
    for state, up in ((ofp.OFPPS_LINK_DOWN, False), (0, True)):
        desc = parser.OFPPort(port_no, "02:00:00:00:00:01", f"fe{switch}-eth{port_no}", 0, state,
                              0, 0, 0, 0, 0, 0)
        controller.port_status(ofp_event.EventOFPPortStatus(parser.OFPPortStatus(
            datapaths[switch], ofp.OFPPR_MODIFY, desc)))
        queued = controller.port_events.get_nowait()
        assert queued == (switch, port_no, up), \
            "the handler must only queue the report; rerouting waits for barriers"
        for datapath in datapaths.values():  # answer the reroute's barriers as they come
            datapath.on_barrier = lambda dp, xid: applier.barrier_replied(dp, xid)
        service.port_changed(*queued)
        assert (sorted((switch, peer)) in service.state()["down_links"]) != up

    error = parser.OFPErrorMsg(datapaths["s1"], type_=ofp.OFPET_BAD_ACTION,
                               code=ofp.OFPBAC_BAD_OUT_GROUP)
    error.xid = 42
    controller.error_msg(ofp_event.EventOFPErrorMsg(error))
    assert applier.errors == [f"dpid {datapaths['s1'].id}: OFPErrorMsg type=2 code=9 xid=42"]
    assert not service.status()["ready"], "a switch error must make the fabric not ready"

    for datapath in datapaths.values():     # switches answer port stats through the handler
        datapath.tx_bytes = {port: 1000 * port for port in fabric.ports_of(datapath.name)}
        datapath.on_port_stats = lambda dp, reply: controller.port_stats_reply(
            ofp_event.EventOFPPortStatsReply(reply))
    counters = service.counters()["switches"]
    assert counters["s1"]["1"]["tx_bytes"] == 1000

    controller.state_change(ofp_event.EventOFPStateChange(datapaths["o1"]))
    assert "o1" not in service.status()["connected"]
    assert "o1" in service.status()["missing"]


def test_counters_come_from_port_stats_of_every_connected_switch():
    fabric = registry.build("fattree,k=4")
    applier = OpenFlowApplier(fabric)
    service = FabricService(fabric, applier)
    network = FakeNetwork(fabric, on_barrier=applier.barrier_replied)
    network.connect(applier, service)
    for datapath in network.datapaths.values():
        datapath.tx_bytes = {port: 100 + port for port in fabric.ports_of(datapath.name)}
        datapath.tx_bytes[ofp.OFPP_LOCAL] = 7          # OVS's own port: not a fabric link
        datapath.on_port_stats = lambda dp, reply: applier.port_stats_replied(
            dp, reply.xid, reply.body, False)
    counters = applier.counters()
    assert sorted(counters) == sorted(fabric.switches)
    for switch, ports in counters.items():
        assert sorted(ports) == sorted(fabric.ports_of(switch)), \
            f"{switch}: every wired port and only those, got {sorted(ports)}"
        assert all(values["tx_bytes"] == 100 + port for port, values in ports.items())
    reply = service.handle({"op": "counters"})["switches"]
    assert reply["s1"]["1"]["tx_bytes"] == 101, "JSON keys are strings"


def test_counters_refuse_a_switch_that_does_not_answer(monkeypatch):
    from controllers.openflow import applier as applier_module
    fabric = registry.build("hybrid")
    applier = OpenFlowApplier(fabric)
    network = FakeNetwork(fabric, on_barrier=applier.barrier_replied)
    network.connect(applier, FabricService(fabric, applier))
    monkeypatch.setattr(applier_module, "STATS_TIMEOUT_S", 0.05)
    with pytest.raises(applier_module.SwitchError, match="did not answer a port-stats request"):
        applier.counters()


def test_fail_loudly_ends_the_process_with_code_70(monkeypatch, capsys):
    exits = []

    class Exited(Exception):
        pass

    def fake_exit(code):
        exits.append(code)
        raise Exited

    monkeypatch.setattr(os, "_exit", fake_exit)
    fabric = registry.build("hybrid")
    controller = bare_controller(fabric)

    def broken_start(switch):
        raise RuntimeError(f"no start intents for {switch}")

    monkeypatch.setattr(controller.service, "start", broken_start)
    datapath = FakeDatapath(fabric.graph.nodes["s1"]["dpid"], "s1")
    with pytest.raises(Exited):
        controller.switch_features(
            ofp_event.EventOFPSwitchFeatures(parser.OFPSwitchFeatures(datapath)))
    assert exits == [app.EXIT_HANDLER_FAILED] == [70]
    err = capsys.readouterr().err
    assert "Traceback" in err and "no start intents for s1" in err, \
        f"the traceback must reach the controller log, got: {err!r}"


# ---------------------------------------------------------------- who may connect
def connect(controller, datapath, dpid):
    """A switch's features reply through the os-ken handler, from its bytes."""
    controller.switch_features(ofp_event.EventOFPSwitchFeatures(features_reply(datapath, dpid)))


def port_down_event(datapath, port_no):
    desc = parser.OFPPort(port_no, "02:00:00:00:00:01", f"port{port_no}", 0,
                          ofp.OFPPS_LINK_DOWN, 0, 0, 0, 0, 0, 0)
    return ofp_event.EventOFPPortStatus(parser.OFPPortStatus(datapath, ofp.OFPPR_MODIFY, desc))


@pytest.fixture
def live_controller(monkeypatch):
    """A bare controller whose every switch connected (through the handler) and
    answers barriers; a handler that ended the process fails the test."""
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail(f"the controller exited ({code})"))
    fabric = registry.build("hybrid")
    controller = bare_controller(fabric)
    datapaths = {}
    for port, name in enumerate(fabric.switches, start=50000):
        datapath = FakeDatapath(None, name, on_barrier=controller.applier.barrier_replied,
                                address=("127.0.0.1", port))
        connect(controller, datapath, fabric.graph.nodes[name]["dpid"])
        datapaths[name] = datapath
    assert controller.service.status()["ready"]
    return controller, datapaths


def test_a_datapath_the_fabric_does_not_have_is_refused_and_the_controller_goes_on(
        live_controller, caplog):
    controller, datapaths = live_controller
    caplog.set_level("ERROR", logger="fabric.openflow")
    stranger = FakeDatapath(None, "stranger", address=("127.0.0.1", 41234))
    connect(controller, stranger, 0xBAD)

    assert stranger.closed, "a refused datapath's connection must be closed"
    assert stranger.sent == [], "a refused datapath must get no flow, group or barrier"
    assert "dpid 2989 from 127.0.0.1:41234" in caplog.text, \
        f"the log must name the dpid and the peer, got {caplog.text!r}"
    status = controller.service.status()
    assert status["ready"], "the fabric's own switches are untouched"
    assert [(r["dpid"], r["host"], r["peer"], r["times"]) for r in status["refused"]] == \
        [(0xBAD, "127.0.0.1", "127.0.0.1:41234", 1)]

    # OVS retries a refused bridge every few seconds: still one record, counted.
    again = FakeDatapath(None, "stranger", address=("127.0.0.1", 41235))
    connect(controller, again, 0xBAD)
    refused = controller.service.status()["refused"]
    assert again.closed and len(refused) == 1
    assert refused[0]["times"] == 2 and refused[0]["peer"] == "127.0.0.1:41235"
    assert "stranger" not in controller.service.status()["connected"]

    # A port status the stranger sent before it was closed is not a fabric event.
    controller.port_status(port_down_event(stranger, 1))
    assert controller.port_events.empty()
    controller.state_change(ofp_event.EventOFPStateChange(stranger))
    assert sorted(controller.service.status()["connected"]) == sorted(datapaths)


def test_refused_datapaths_are_bounded_records(monkeypatch):
    from controllers.openflow import applier as applier_module
    monkeypatch.setattr(applier_module, "RECORDS_KEPT", 3)
    applier = OpenFlowApplier(registry.build("hybrid"))
    for dpid in range(1000, 1010):
        assert applier.admit(FakeDatapath(dpid, address=("10.0.0.9", 7000 + dpid))) is None
    assert [r["dpid"] for r in applier.status()["refused"]] == [1007, 1008, 1009], \
        "the newest strangers are kept, the list does not grow with them"


def test_a_second_connection_takes_over_and_the_old_one_is_closed(live_controller, caplog):
    controller, datapaths = live_controller
    applier, service = controller.applier, controller.service
    caplog.set_level("WARNING", logger="fabric.openflow")
    fabric = service.fabric
    old = datapaths["s1"]
    dpid = fabric.graph.nodes["s1"]["dpid"]
    new = FakeDatapath(None, "s1", on_barrier=applier.barrier_replied,
                       address=("127.0.0.1", 60001))
    connect(controller, new, dpid)

    assert old.closed, "the connection taken over must be closed"
    assert applier.datapaths["s1"] is new
    assert "127.0.0.1:60001" in caplog.text and f"127.0.0.1:{old.address[1]}" in caplog.text, \
        f"the warning must name both peers, got {caplog.text!r}"
    takeovers = service.status()["takeovers"]
    assert [(t["switch"], t["dpid"], t["old_peer"], t["new_peer"], t["times"])
            for t in takeovers] == \
        [("s1", dpid, f"127.0.0.1:{old.address[1]}", "127.0.0.1:60001", 1)]
    assert isinstance(new.sent[0], parser.OFPFlowMod) and \
        new.sent[0].command == ofp.OFPFC_DELETE, "the newcomer starts from a Reset"
    assert new.table.flows and new.table.groups.keys() == old.table.groups.keys(), \
        "the newcomer holds the whole state the old connection held"
    assert service.status()["ready"]

    # The old connection's end (os-ken's dead state after close()) comes later:
    # it must not take the switch's new connection with it.
    controller.state_change(ofp_event.EventOFPStateChange(old))
    status = service.status()
    assert "s1" in status["connected"] and status["ready"], status
    assert applier.datapaths["s1"] is new

    # What the old connection still delivers is stale; the new one speaks for s1.
    controller.port_status(port_down_event(old, 1))
    assert controller.port_events.empty(), "a stale connection's port status is ignored"
    controller.port_status(port_down_event(new, 1))
    assert controller.port_events.get_nowait() == ("s1", 1, False)

    # Batches go to the new connection only (the fake refuses a send on a closed one).
    sent_before = len(new.sent)
    applier.apply({"s1": [Reset("s1")]})
    assert len(new.sent) > sent_before

    # The new connection's own end forgets s1.
    controller.state_change(ofp_event.EventOFPStateChange(new))
    assert "s1" in service.status()["missing"]


def test_a_barrier_waiting_on_a_connection_that_ends_fails_at_once():
    import threading
    import time
    from controllers.openflow.applier import SwitchError
    fabric = registry.build("hybrid")
    applier = OpenFlowApplier(fabric)
    silent = FakeDatapath(fabric.graph.nodes["s1"]["dpid"], "s1")    # answers no barrier
    applier.switch_connected(silent, [Reset("s1")])
    assert applier._pending and applier._initial
    failure = []

    def apply():
        try:
            applier.apply({"s1": [Reset("s1")]})
        except SwitchError as exc:
            failure.append(str(exc))

    def counters():
        try:
            applier.counters()
        except SwitchError as exc:
            failure.append(str(exc))

    waiters = [threading.Thread(target=apply), threading.Thread(target=counters)]
    started = time.monotonic()
    for waiter in waiters:
        waiter.start()
    while len(applier._pending) < 2 or not applier._stats:   # both requests are out
        time.sleep(0.001)
    applier.switch_disconnected(silent)
    for waiter in waiters:
        waiter.join(5)
    assert len(failure) == 2 and all("disconnected" in f for f in failure), failure
    assert time.monotonic() - started < 2, "it must not wait for the barrier timeout"
    assert not applier._pending and not applier._initial and not applier._stats, \
        "nothing of a closed connection stays in the applier's maps"


def test_a_takeover_fails_what_waited_on_the_old_connection():
    fabric = registry.build("hybrid")
    applier = OpenFlowApplier(fabric)
    dpid = fabric.graph.nodes["o1"]["dpid"]
    old = FakeDatapath(dpid, "o1")                  # answers nothing
    applier.switch_connected(old, [Reset("o1")])
    answer = applier._send(old, [])                 # a batch's barrier, unanswered
    new = FakeDatapath(dpid, "o1", on_barrier=applier.barrier_replied)
    applier.switch_connected(new, [Reset("o1")])
    assert answer.is_set() and "taken over" in answer.lost, \
        "a batch waiting on the old connection must fail now, not at its timeout"
    assert applier.status()["ready_switches"] == ["o1"], "ready through the new connection"
    assert all(key[0] is not old for key in list(applier._pending) + list(applier._initial))
    applier.barrier_replied(old, 1)                 # a late reply of the old one: ignored
    assert applier.status()["ready_switches"] == ["o1"]


def test_fail_loudly_passes_results_through_when_nothing_fails(monkeypatch):
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail(f"exited with {code}"))

    @app.fail_loudly
    def handler(self, ev):
        return ev * 2

    assert handler(None, 21) == 42
    assert handler.__name__ == "handler"


def test_app_builds_its_service_from_the_launch_settings(tmp_path, monkeypatch):
    fabric = registry.build("hybrid")
    fabric_path = tmp_path / "fabric.json"
    fabric_path.write_text(fabric.to_json())
    socket_path = tmp_path / "run" / "control.sock"
    monkeypatch.setattr(app.LaunchSettings, "fabric_path", str(fabric_path))
    monkeypatch.setattr(app.LaunchSettings, "socket_path", str(socket_path))
    monkeypatch.setattr(app.LaunchSettings, "tdf", 3.0)
    controller = app.FabricController()
    try:
        assert controller.service.tdf == 3.0
        assert sorted(controller.service.fabric.switches) == sorted(fabric.switches)
        assert socket_path.exists(), "the control channel must be listening"
    finally:
        controller.close()
    assert not socket_path.exists(), "close() must remove the control socket"


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOP_SIGNALS_SCRIPT = """
import os, signal, sys, time
from controllers import launcher
launcher.on_stop_signals(lambda signum, frame: print("stop", os.getpid(), signum, flush=True))
child = os.fork()
if child == 0:
    for _ in range(500):        # a helper that lives until it is stopped
        time.sleep(0.01)
    os._exit(0)
time.sleep(0.2)
os.kill(child, signal.SIGTERM)
_, status = os.waitpid(child, 0)
print("child", os.WIFSIGNALED(status) and os.WTERMSIG(status), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("parent", os.getpid(), flush=True)
"""


def test_a_forked_helper_dies_of_sigterm_and_only_the_controller_stops():
    done = subprocess.run([sys.executable, "-c", STOP_SIGNALS_SCRIPT], capture_output=True,
                          text=True, timeout=30,
                          cwd=REPO_ROOT)
    lines = done.stdout.split()
    assert done.returncode == 0, done.stderr
    parent = lines[-1]
    assert lines == ["child", "15", "stop", parent, "15", "parent", parent], \
        "the helper died of the signal without calling stop; the controller called it once"


def test_launcher_arguments():
    args = launcher.parse_args(["--fabric", "f.json", "--socket", "s", "--ofp-port", "6653"])
    assert (args.fabric, args.socket, args.ofp_port, args.tdf) == ("f.json", "s", 6653, 1.0)
    with pytest.raises(SystemExit):
        launcher.parse_args(["--fabric", "f.json"])


def test_fabric_json_round_trip_keeps_what_the_controller_needs():
    fabric = registry.build("hybrid,tors=3")
    again = type(fabric).from_json(fabric.to_json())
    assert json.loads(again.to_json()) == json.loads(fabric.to_json())
    assert again.circuits == fabric.circuits
    assert EpsCore(again).table == EpsCore(fabric).table
    assert ofmsg.COOKIE_EPS != ofmsg.COOKIE_OCS


# ---------------------------------------------------------------- the fakes themselves
def test_fake_datapath_refuses_bytes_that_do_not_parse_back():
    datapath = FakeDatapath(1, "s1")
    msg = ofmsg.route_to_group("10.0.0.1", 1)
    msg.datapath = datapath
    datapath.set_xid(msg)
    msg.serialize()
    good = bytes(msg.buf)
    assert isinstance(decode(datapath, good), parser.OFPFlowMod)
    with pytest.raises(FakeSwitchError, match="header length"):
        decode(datapath, good[:-8])
    with pytest.raises(FakeSwitchError, match="version"):
        decode(datapath, b"\x01" + good[1:])


def test_fake_table_models_openflow_errors_and_group_deletion():
    fabric = registry.build("hybrid")
    core = EpsCore(fabric)
    datapath = FakeDatapath(2, "s1")
    with pytest.raises(FakeSwitchError, match="OFPBAC_BAD_OUT_GROUP"):
        datapath.send_all([ofmsg.route_to_group("10.0.0.1", 1)])
    datapath.send_all(FakeNetwork(fabric).messages("s1", [Reset("s1")] + core.switch_start("s1")))
    assert datapath.table.output_ports(3, "10.0.0.1") == {1}
    with pytest.raises(FakeSwitchError, match="OFPGMFC_GROUP_EXISTS"):
        datapath.send_all([ofmsg.route_group(1, [2])])
    with pytest.raises(FakeSwitchError, match="OFPGMFC_UNKNOWN_GROUP"):
        datapath.send_all([ofmsg.route_group(99, [2], modify=True)])
    delete = parser.OFPGroupMod(None, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_SELECT,
                                group_id=1)
    datapath.send_all([delete])
    assert datapath.table.output_ports(3, "10.0.0.1") == frozenset(), \
        "deleting a group removes the flows that use it"
    assert datapath.table.output_ports(3, "10.0.0.2") == {2}


def test_fake_table_strict_delete_removes_only_the_exact_flow():
    datapath = FakeDatapath(1, "o1")
    datapath.send_all(ofmsg.circuit(1, 2) + ofmsg.circuit(3, 4))
    datapath.send_all([ofmsg.circuit_half_delete(1)])
    assert datapath.table.output_ports(1) == frozenset()
    assert datapath.table.output_ports(2) == {1}
    datapath.send_all([ofmsg.flow_delete_strict(parser.OFPMatch(in_port=3), priority=7)])
    assert datapath.table.output_ports(3) == {4}, "another priority is another flow"
    datapath.send_all([ofmsg.delete_all_flows()])
    assert datapath.table.flows == []
