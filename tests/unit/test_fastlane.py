"""Rail-Fabric KV fast lanes: the small build, lane routes, reservations as a gate."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import networkx as nx
import pytest

from emu.experiments import pd_setup
from traffic.scale import Scale
from topologies import catalog, rail_fabric, registry, routing
from topologies.fabric import Fabric, FabricError
from traffic import fastlane as fl
from traffic import kvcache
from traffic.flows import FlowDag
from traffic.kvflows import kv_transfer, link_id, rank_paths
from traffic.pdgate import CreditGate
from traffic.pdplan import plan
from traffic.pdstats import peak_concurrency
from traffic.placement import PlacementError, Topology, placement
from traffic.requests import Request

SPEC_16 = ("rail-fabric,switches=8,downlinks=4,degree=2,d_degree=3,d_switches=4,fast_lanes=3,"
           "seed=19,gpus_per_server=2")


@pytest.fixture(scope="module")
def fabric():
    return registry.build(fl.rail_fabric_spec(16, 2))


@pytest.fixture(scope="module")
def topo(fabric):
    return Topology(fabric, gpus_per_node=2)


@pytest.fixture(scope="module")
def place(topo):
    return placement(topo, "tiles", "3p2d", seed=1)


def switch_edges(fabric, lane):
    return [(u, v) for u, v, d in fabric.graph.edges(data=True) if d.get("lane") == lane]


def request(rid="r1", prompt=32_768, cached=0):
    return Request(rid, "s1", 1 if cached else 0, 0.0, prompt, cached, 100)


# ---------------------------------------------------------------- the small build
def test_spec_at_the_reference_gpu_count(fabric, topo, place):
    assert fl.rail_fabric_spec(16, 2) == SPEC_16
    assert len(fabric.eps_switches) == 8 and len(fabric.hosts) == 32
    assert pd_setup.gpu_count(fabric) == 16
    assert len(topo.nodes) == 8 and all(node.tp == 2 for node in topo.nodes)
    assert all(len(hosts) == 2 for hosts in topo.gpu_hosts.values()), "two NIC ports per GPU"
    assert (len(place.prefill), len(place.decode), len(place.flex)) == (3, 2, 3)
    assert len(switch_edges(fabric, "fast")) == 12 and len(switch_edges(fabric, "expander")) == 10


def test_small_build_never_parallels_a_lane_and_its_expander_stands_alone(fabric):
    pairs = [frozenset(e) for e in switch_edges(fabric, "fast") + switch_edges(fabric, "expander")]
    assert len(pairs) == len(set(pairs)), "two links between one switch pair"
    expander = nx.Graph(switch_edges(fabric, "expander"))
    expander.add_nodes_from(fabric.eps_switches)
    assert nx.is_connected(expander), "the base fabric must not need the fast lanes"
    light = {n for n in fabric.eps_switches if fabric.graph.nodes[n]["role"] == "p-switch"}
    for u, v in switch_edges(fabric, "fast"):
        assert len({u, v} & light) == 1, f"lane {u}-{v} should join a P switch to a D switch"


@pytest.mark.parametrize("gpus", [32, 64])
def test_small_params_scale_with_the_gpu_count(gpus):
    fabric = registry.build(fl.rail_fabric_spec(gpus, 8))
    assert pd_setup.gpu_count(fabric) == gpus
    assert len(fabric.eps_switches) == gpus // 2
    counts = catalog.measure_fabric(fabric, with_diameter=False)
    params = rail_fabric.small_params(gpus, 8)
    assert counts.switches == catalog.analytic_counts("rail-fabric", **params).switches


@pytest.mark.parametrize("gpus", [0, 8, 12, 20])
def test_small_params_refuse_gpu_counts_they_cannot_build(gpus):
    with pytest.raises(FabricError, match="multiple of 8 GPUs, at least 16"):
        fl.rail_fabric_spec(gpus, 2)


def test_gpus_per_server_sets_server_and_rail_only():
    two = registry.build(SPEC_16)
    eight = registry.build(SPEC_16.replace("gpus_per_server=2", "gpus_per_server=8"))
    for host in two.hosts:
        gpu = two.graph.nodes[host]["gpu"]
        assert two.graph.nodes[host]["server"] == gpu // 2
        assert two.graph.nodes[host]["rail"] == gpu % 2
        assert eight.graph.nodes[host]["server"] == gpu // 8
    assert [(u, v, d["ports"]) for u, v, d in two.links()] == \
        [(u, v, d["ports"]) for u, v, d in eight.links()], "the wiring does not change"
    with pytest.raises(FabricError, match="gpus_per_server"):
        registry.build(SPEC_16.replace("gpus_per_server=2", "gpus_per_server=0"))
    servers = Counter(node.id for node in Topology(two).nodes)
    assert len(servers) == 8, "without gpus_per_node, a server (2 GPUs) is a node"


@pytest.mark.parametrize("spec", [SPEC_16, "rail-fabric",
                                  "rail-fabric,switches=10,d_switches=0,fast_lanes=2,degree=3"])
def test_fast_lane_ports_survive_the_json_the_controller_reads(spec):
    fabric = registry.build(spec)
    tagged = rail_fabric.fast_lane_ports(fabric)
    assert len(tagged) == len(switch_edges(fabric, "fast"))
    again = Fabric.from_json(fabric.to_json())
    assert not any("lane" in d for _, _, d in again.links()), "JSON drops the tags"
    assert rail_fabric.fast_lane_ports(again) == tagged


def test_fast_lane_ports_take_the_lane_of_a_parallel_pair():
    fabric = registry.build("rail-fabric")          # default build: expander parallels lanes
    lanes = set(rail_fabric.fast_lane_ports(fabric))
    parallel = [(u, v) for u, v in switch_edges(fabric, "fast")
                if fabric.graph.number_of_edges(u, v) > 1]
    assert parallel, "the default build should have a lane parallel to an expander link"
    for u, v in parallel:
        for data in fabric.graph[u][v].values():
            a, b = sorted((u, v))
            assert ((a, data["ports"][a], b, data["ports"][b]) in lanes) == \
                (data["lane"] == "fast")
    assert rail_fabric.fast_lane_ports(registry.build("zcube,n=2")) == []


def test_base_routes_without_lanes_reach_every_host_and_never_use_a_lane(fabric):
    again = Fabric.from_json(fabric.to_json())
    base = rail_fabric.without_fast_lanes(again, again.logical_graph())
    lane_ports = {(a, pa) for a, pa, b, pb in rail_fabric.fast_lane_ports(again)} | \
        {(b, pb) for a, pa, b, pb in rail_fabric.fast_lane_ports(again)}
    table = routing.next_hops(base)
    for switch, entries in table.items():
        assert len(entries) == len(again.hosts), f"{switch} cannot reach every host"
        for host, ports in entries.items():
            assert not {(switch, p) for p in ports} & lane_ports, \
                f"{switch} -> {host} routed over a fast lane: {ports}"
    full = routing.next_hops(again.logical_graph())
    assert any({(s, p) for p in ports} & lane_ports
               for s, entries in full.items() for ports in entries.values()), \
        "with the lanes, destination routes do use them"


# ---------------------------------------------------------------- routes
def test_lanes_are_named_like_links(fabric):
    lanes = fl.fast_lanes(fabric)
    assert len(lanes) == 12
    for lane_id, lane in lanes.items():
        assert lane_id == link_id(lane.a, lane.b) and len(lane.ports) == 1


def test_large_rank_routes_cross_a_lane_from_p_rank_k_to_d_rank_k(topo, place):
    kinds = Counter()
    for p in place.prefill:
        for d in place.decode:
            routes = fl.rank_routes(topo, p, d, large=True)
            assert len(routes) == 2
            for rank, route in enumerate(routes):
                assert route.src in topo.node(p).hosts[rank]
                assert route.dst in topo.node(d).hosts[rank]
                assert route.path[1] == topo.switch_of[route.src]
                assert route.path[-2] == topo.switch_of[route.dst]
                kinds[route.kind] += 1
                if route.kind == fl.LANE:
                    a, b = route.path[1], route.path[2]
                    assert any(d.get("lane") == "fast" for d in topo.fabric.graph[a][b].values())
                    assert route.lane == link_id(a, b) and len(route.path) == 4
                else:
                    assert route.kind == fl.LOCAL and len(route.path) == 3
    assert kinds[fl.LANE] >= 8, f"most P -> D ranks should find a lane: {kinds}"


def test_ranks_of_one_request_take_different_lanes_then_a_shared_switch(topo):
    # P node 0 -> D node 4: rank 1's only lane is rank 0's; it has a shared switch.
    routes = fl.rank_routes(topo, 0, 4, large=True)
    assert routes[0].kind == fl.LANE
    assert routes[1].kind == fl.LOCAL, routes
    routes = fl.rank_routes(topo, 0, 1, large=True)
    assert [r.kind for r in routes] == [fl.LANE, fl.LANE]
    assert routes[0].lane != routes[1].lane
    assert fl.rank_routes(topo, 0, 4, large=True, prefer_local=True)[0].kind in (fl.LANE,
                                                                                  fl.LOCAL)


def test_planned_lane_use_spreads_requests_over_lanes(topo):
    over_lanes, _ = fl.gpu_routes(topo, 0, 2)
    assert len({r.lane for r in over_lanes}) >= 2, "GPU 0 -> GPU 2 should have two lanes"
    planned = Counter()
    first = fl.rank_routes(topo, 0, 1, True, planned)[0]
    second = fl.rank_routes(topo, 0, 1, True, planned)[0]
    assert first.lane != second.lane
    assert planned[first.lane] >= 1 and planned[second.lane] >= 1


def test_short_transfers_take_the_base_paths(topo):
    routes = fl.rank_routes(topo, 0, 1, large=False)
    assert [r.kind for r in routes] == [fl.EXPANDER] * 2
    assert [list(r.path) for r in routes] == rank_paths(topo, 0, 1)


def test_no_lane_and_no_shared_switch_falls_back_to_the_base_path(topo):
    def switches(gpu):
        return {topo.switch_of[h] for h in topo.gpu_hosts[gpu]}

    apart = [(p.id, d.id) for p in topo.nodes for d in topo.nodes
             if all(not switches(a) & switches(b) for a, b in zip(p.gpus, d.gpus))]
    assert apart, "some node pairs share no switch rank to rank"
    p, d = apart[0]
    routes = fl.rank_routes(topo, p, d, large=True, lanes={})
    assert [r.kind for r in routes] == [fl.EXPANDER] * 2
    assert [list(r.path) for r in routes] == rank_paths(topo, p, d)
    near = fl.rank_routes(topo, 0, 1, large=True, lanes={})     # nodes 0 and 1 share s1
    assert [r.kind for r in near] == [fl.LOCAL] * 2


def test_kv_transfer_is_large_from_the_threshold_and_flows_follow_the_routes(topo):
    big = request(prompt=32_768)
    size = big.transfer_bytes(kvcache.GLM_5_1, True)
    at = fl.kv_transfer(topo, big, 0, 1, threshold_bytes=size, bytes_scale=1e-3, at_s=2.5)
    assert at.large and [r.kind for r in at.routes] == [fl.LANE, fl.LANE]
    above = fl.kv_transfer(topo, big, 0, 1, threshold_bytes=size + 1)
    assert not above.large and {r.kind for r in above.routes} == {fl.EXPANDER}
    for flow, route in zip(at.transfer.dag.flows, at.routes):
        assert (flow.src, flow.dst) == (route.src, route.dst)
        assert flow.at_s == 2.5
        assert flow.bytes == pytest.approx(size * 1e-3 / 2, rel=1e-6)
    assert at.flow_routes() == {"r1-r0": at.routes[0], "r1-r1": at.routes[1]}
    assert list(at.transfer.paths) == [r.path for r in at.routes]


def test_kvflows_refuses_paths_that_are_not_rank_to_rank(topo):
    good = [r.path for r in fl.rank_routes(topo, 0, 1)]
    with pytest.raises(PlacementError, match="one per rank"):
        kv_transfer(topo, request(), 0, 1, paths=good[:1])
    with pytest.raises(PlacementError, match="rank 1 path"):
        kv_transfer(topo, request(), 0, 1, paths=[good[0], good[0]])


# ---------------------------------------------------------------- reservations
@dataclass
class F:
    id: str
    src: str = ""
    dst: str = ""


def lane_route(a="s1", b="s5", src="h1", dst="h17"):
    return fl.RankRoute(fl.LANE, (src, a, b, dst), link_id(a, b))


def test_route_kinds_are_checked():
    with pytest.raises(ValueError, match="needs lane"):
        fl.RankRoute(fl.LANE, ("h1", "s1", "s5", "h2"))
    with pytest.raises(ValueError, match="not one of"):
        fl.RankRoute("ocs", ("h1", "s1", "h2"))


def test_lane_table_capacity_fifo_and_release():
    table = fl.LaneTable(capacity=1)
    forward, backward = lane_route(), lane_route("s5", "s1", "h17", "h1")
    assert table.reserve("a", forward, 0.0)
    assert not table.reserve("b", forward, 1.0)
    assert not table.reserve("c", forward, 1.0)
    assert table.reserve("d", backward, 1.0), "the other direction has its own capacity"
    assert table.release("a", 2.0) == "s1-s5:s1>s5"
    assert not table.reserve("c", forward, 2.0), "b asked first"
    assert table.reserve("b", forward, 2.0) and table.reserve("b", forward, 2.0)
    assert table.peak["s1-s5:s1>s5"] == 1
    table.check()
    shared = fl.LaneTable(capacity=2, duplex=False)
    assert shared.reserve("a", forward, 0) and shared.reserve("b", backward, 0)
    assert not shared.reserve("c", forward, 0)
    with pytest.raises(fl.LaneError, match="capacity must be"):
        fl.LaneTable(capacity=0)


def test_gate_waits_for_a_busy_lane_then_pins_in_order():
    calls = []
    now = [0.0]
    routes = {"a": lane_route(), "b": lane_route(src="h2", dst="h18"),
              "c": fl.RankRoute(fl.LOCAL, ("h3", "s2", "h4"))}
    gate = fl.FastLaneGate(routes, clock=lambda: now[0],
                           pin=lambda fid, path: calls.append(("pin", fid, path)),
                           unpin=lambda fid: calls.append(
                               ("unpin", fid, fid in gate.table.held)))
    flow = {fid: F(fid, r.src, r.dst) for fid, r in routes.items()}
    assert gate.gate(flow["a"]) and gate.gate(flow["a"])
    assert not gate.gate(flow["b"])
    assert gate.gate(flow["c"]), "a local route reserves nothing"
    now[0] = 3.0
    gate.done(F("a"))
    assert gate.gate(flow["b"])
    gate.done(F("b"))
    gate.done(F("c"))
    assert calls == [("pin", "a", ["h1", "s1", "s5", "h17"]), ("unpin", "a", True),
                     ("pin", "b", ["h2", "s1", "s5", "h18"]), ("unpin", "b", True)], \
        "pin after the reservation, unpin before the release, once each"
    assert gate.waits_s == {"a": 0.0, "b": 3.0}
    summary = gate.summary()
    assert summary["lane_flows_count"] == 2 and summary["local_flows_count"] == 1
    assert summary["lane_wait_max_s"] == 3.0 and summary["lane_peak_count"] == 1


def test_gate_falls_back_to_the_expander_when_asked():
    pins = []
    routes = {"a": lane_route(), "b": lane_route(src="h2", dst="h18")}
    gate = fl.FastLaneGate(routes, when_busy="expander", clock=lambda: 0.0,
                           pin=lambda fid, path: pins.append(fid), unpin=pins.remove)
    assert gate.gate(F("a", "h1", "h17"))
    assert gate.gate(F("b", "h2", "h18")), "busy lane: goes over the base fabric"
    assert pins == ["a"] and gate.went == {"a": fl.LANE, "b": fl.FALLBACK}
    gate.done(F("b"))
    gate.done(F("a"))
    assert pins == [] and not gate.table.held
    with pytest.raises(fl.LaneError, match="when_busy"):
        fl.FastLaneGate(routes, when_busy="drop")


def test_gate_releases_the_lane_when_pinning_fails():
    def refuse(fid, path):
        raise RuntimeError("controller refused 'pin'")

    gate = fl.FastLaneGate({"a": lane_route()}, clock=lambda: 0.0, pin=refuse)
    with pytest.raises(RuntimeError, match="refused"):
        gate.gate(F("a", "h1", "h17"))
    assert not gate.table.held and gate.table.free("s1-s5:s1>s5") == 1


def test_gate_admits_unknown_and_moved_flows_without_a_reservation():
    gate = fl.FastLaneGate({"a": lane_route()}, clock=lambda: 0.0)
    assert gate.gate(F("a~m1", "h2", "h17"))
    assert gate.gate(F("a", "h2", "h17")), "moved to another host: its lane route is void"
    assert not gate.table.held and gate.went == {"a~m1": fl.UNPLANNED, "a": fl.UNPLANNED}


# ---------------------------------------------------------------- with KV credits
SETTINGS = dict(workload="deep-thinking", requests=16, rate_per_s=30.0, seed=1,
                placement="tiles", tile="3p2d")
SCALE = Scale.from_rates(200, 10, tdf=10)


def lane_plan(topo, threshold_bytes=fl.LARGE_KV_BYTES):
    """pdplan.plan, then each request's transfer again over fast lanes (what the
    scenario would do inside plan)."""
    place = pd_setup.make_placement(topo, SETTINGS)
    planned = plan(topo, place, pd_setup.stream_of(SETTINGS), SCALE, "fixed", 5.0, 1)
    use = Counter()
    lanes = [fl.kv_transfer(topo, x.request, x.p, x.d, threshold_bytes, on_home=x.on_home,
                            planned=use, at_s=x.prefill_end_s,
                            bytes_scale=SCALE.bw_factor * SCALE.tdf) for x in planned]
    for x, lane in zip(planned, lanes):
        x.transfer = lane.transfer
    return planned, lanes


def simulate(dag, gate, seconds_per_byte=1e-6):
    """The replayer's loop without hosts: due flows ask the gate in order; a
    refused flow is asked again after the next flow ends."""
    flows = {f.id: f for f in dag.flows}
    order = [f.id for f in dag.topological_order()]
    now, running, started, ended = 0.0, {}, {}, {}
    while len(ended) < len(flows):
        for fid in order:
            if fid not in started and flows[fid].at_s <= now and gate.gate(flows[fid]):
                started[fid] = now
                running[fid] = now + flows[fid].bytes * seconds_per_byte
        due = [flows[f].at_s for f in order if f not in started and flows[f].at_s > now]
        ends = list(running.values())
        assert due or ends, f"deadlock at {now}: waiting {set(flows) - set(started)}"
        now = min(due + ends)
        for fid, end in sorted(running.items(), key=lambda item: item[1]):
            if end <= now:
                del running[fid]
                ended[fid] = end
                gate.done(F(fid))
    return started, ended


def test_credits_then_lanes_never_exceed_either_limit(topo):
    planned, lanes = lane_plan(topo)
    assert any(t.large for t in lanes) and not all(t.large for t in lanes), \
        "the default threshold should split this stream into large and short"
    pins = set()
    credit = CreditGate(planned, limit=2, clock=lambda: 0.0)

    def pin(fid, path):
        assert fid not in pins
        pins.add(fid)

    lane_gate = fl.FastLaneGate.from_transfers(lanes, clock=lambda: 0.0, pin=pin,
                                               unpin=pins.remove)
    chain = fl.GateChain(credit, lane_gate)
    dag = FlowDag.merge(*(x.transfer.dag for x in planned))
    started, ended = simulate(dag, chain)
    assert set(ended) == {f.id for f in dag.flows}
    assert not pins and not lane_gate.table.held, "every pin undone, every lane released"
    assert max(lane_gate.table.peak.values()) == 1
    assert max(credit.credits.peak_d.values()) <= 2
    large_flows = {fid for t in lanes if t.large for fid, r in t.flow_routes().items()
                   if r.kind == fl.LANE}
    assert set(lane_gate.waits_s) == large_flows
    # No two flows on one lane direction overlap.
    by_key = {}
    for fid in large_flows:
        key = lane_gate.table.key(lane_gate.routes[fid])
        by_key.setdefault(key, []).append((started[fid], ended[fid]))
    for key, spans in by_key.items():
        assert peak_concurrency(spans) == 1, f"{key} carried flows at once: {spans}"
    assert lane_gate.summary()["lane_flows_count"] == len(large_flows)
