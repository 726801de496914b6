"""ModelNetwork: the flow-level model's routing agrees with the testbed's rule
(`topologies.routing`), spreads flows by ECMP, and follows failures and circuits."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from topologies import registry, routing
from topologies.fabric import HOST, OCS
from traffic.model.network import ModelNetwork, key_of

FABRICS = ["fattree,k=4", "zcube,n=4", "rfabric", "sip-ocs,gpus=8", "hpn", "rail-fabric",
           "roft", "fattree-os"]


# ---------------------------------------------------------------- helpers
def _path(net, src, dst, key):
    indptr, links = net.paths([src], [dst], [key])
    return links[indptr[0]:indptr[1]].tolist()


def _all_paths(net, srcs, dsts, keys):
    indptr, links = net.paths(srcs, dsts, keys)
    return [links[indptr[i]:indptr[i + 1]].tolist() for i in range(len(srcs))]


def _nodes(net, links):
    """The node path of a list of link ids, OCS nodes dropped."""
    nodes = [net.names[net.link_src[links[0]]]] + [net.names[net.link_dst[l]] for l in links]
    return [n for n in nodes if net.fabric.kind(n) != OCS]


def _pairs(fabric, limit=120):
    """Ordered host pairs, spread over the fabric (deterministic)."""
    pairs = list(itertools.permutations(fabric.hosts, 2))
    step = max(1, len(pairs) // limit)
    return pairs[::step]


def _consistent(net, links, src, dst):
    assert links, f"{src}->{dst}: empty path"
    assert net.blackhole not in links, f"{src}->{dst}: blackholed"
    assert net.names[net.link_src[links[0]]] == src
    assert net.names[net.link_dst[links[-1]]] == dst
    for a, b in zip(links, links[1:]):
        assert net.link_dst[a] == net.link_src[b], \
            f"{src}->{dst}: {net.describe(a)} then {net.describe(b)}"


def _bfs_distance(graph, src, dst):
    return nx.shortest_path_length(graph, src, dst)


def _edge_host(fabric, host):
    (switch,) = set(fabric.graph.neighbors(host))
    return switch


# ---------------------------------------------------------------- shortest paths
@pytest.mark.parametrize("spec", FABRICS)
def test_routed_paths_are_shortest_paths_of_the_testbed(spec):
    fabric = registry.build(spec)
    net = ModelNetwork(fabric)
    base = routing.base_graph(fabric)
    pairs = _pairs(fabric)
    keys = [key_of(f"{s}>{d}") for s, d in pairs]
    paths = _all_paths(net, [s for s, _ in pairs], [d for _, d in pairs], keys)
    routed = 0
    for (src, dst), links in zip(pairs, paths):
        if not net.transit_hosts and not routing.shortest_paths(base, src, dst):
            # the testbed has no route either (HPN: GPUs of one server on other rails)
            assert links[-1] == net.blackhole, (spec, src, dst, links)
            continue
        routed += 1
        _consistent(net, links, src, dst)
        nodes = _nodes(net, links)
        if net.transit_hosts:
            # SiP-OCS: hosts forward, so the path is a BFS-shortest path of the logical graph
            assert len(nodes) - 1 == _bfs_distance(base, src, dst), (src, dst, nodes)
            for a, b in zip(nodes, nodes[1:]):
                assert base.has_edge(a, b), (a, b)
        else:
            assert nodes in routing.shortest_paths(base, src, dst), (spec, src, dst, nodes)
    assert routed >= 20     # HPN is rail-only: a third of its pairs have no route


def test_sip_ocs_forwards_through_hosts():
    fabric = registry.build("sip-ocs,gpus=8")
    net = ModelNetwork(fabric)
    base = routing.base_graph(fabric)
    far = [(s, d) for s, d in itertools.permutations(fabric.hosts, 2)
           if _bfs_distance(base, s, d) > 1]
    assert far, "sip-ocs,gpus=8 has no pair more than one circuit apart"
    src, dst = far[0]
    nodes = _nodes(net, _path(net, src, dst, 7))
    assert len(nodes) > 2 and all(fabric.kind(n) == HOST for n in nodes)


@pytest.mark.parametrize("spec", ["fattree,k=4", "rfabric", "sip-ocs,gpus=8", "rail-fabric"])
def test_paths_and_paths_indexed_agree(spec):
    fabric = registry.build(spec)
    net = ModelNetwork(fabric)
    pairs = _pairs(fabric, 200)
    keys = np.array([key_of(f"k{i}") for i in range(len(pairs))], dtype=np.uint64)
    a_ptr, a_links = net.paths([s for s, _ in pairs], [d for _, d in pairs], keys)
    src = np.array([net.index[s] for s, _ in pairs])
    dst = np.array([net.index[d] for _, d in pairs])
    b_ptr, b_links = net.paths_indexed(src, dst, keys)
    assert a_ptr.tolist() == b_ptr.tolist()
    assert a_links.tolist() == b_links.tolist()
    # and again after the routing state changed (the index tables are rebuilt)
    switch = _edge_host(fabric, fabric.hosts[0]) if spec != "sip-ocs,gpus=8" else None
    if switch:
        net.fail_node(switch)
        a_ptr, a_links = net.paths([s for s, _ in pairs], [d for _, d in pairs], keys)
        b_ptr, b_links = net.paths_indexed(src, dst, keys)
        assert a_ptr.tolist() == b_ptr.tolist()
        assert a_links.tolist() == b_links.tolist()


# ---------------------------------------------------------------- ECMP
def _cross_pod_pair(fabric):
    src = fabric.hosts[0]
    dst = fabric.hosts[-1]
    assert _edge_host(fabric, src) != _edge_host(fabric, dst)
    return src, dst


def test_ecmp_spreads_keys_over_paths_and_repeats_per_key():
    fabric = registry.build("fattree,k=4")
    net = ModelNetwork(fabric)
    src, dst = _cross_pod_pair(fabric)
    base = routing.base_graph(fabric)
    assert len(routing.shortest_paths(base, src, dst)) == 4          # k=4: (k/2)^2
    keys = [key_of(f"flow-{i}") for i in range(200)]
    paths = _all_paths(net, [src] * 200, [dst] * 200, keys)
    distinct = {tuple(p) for p in paths}
    assert len(distinct) > 1
    assert len(distinct) == 4          # 200 draws cover the 4 equal-cost paths
    again = _all_paths(net, [src] * 200, [dst] * 200, keys)
    assert again == paths
    one = _path(net, src, dst, keys[17])
    assert one == paths[17]


def test_ecmp_seed_changes_some_draws():
    fabric = registry.build("fattree,k=4")
    src, dst = _cross_pod_pair(fabric)
    keys = [key_of(f"flow-{i}") for i in range(100)]
    first = _all_paths(ModelNetwork(fabric, ecmp_seed=1), [src] * 100, [dst] * 100, keys)
    same = _all_paths(ModelNetwork(fabric, ecmp_seed=1), [src] * 100, [dst] * 100, keys)
    other = _all_paths(ModelNetwork(fabric, ecmp_seed=2), [src] * 100, [dst] * 100, keys)
    assert first == same
    assert sum(a != b for a, b in zip(first, other)) > 0
    base = routing.base_graph(fabric)
    for links in other:
        assert _nodes(ModelNetwork(fabric), links) in routing.shortest_paths(base, src, dst)


# ---------------------------------------------------------------- Rail-Fabric lanes
def _lane_links_exact(net):
    """The directed links of the fast lanes only (not the expander wires beside
    them): ModelNetwork makes two links per graph edge (u->v, v->u), in the
    graph's edge order, before the blackhole."""
    edges = list(net.fabric.graph.edges(data=True))
    assert net.blackhole == 2 * len(edges)
    lanes = set()
    for i, (u, v, data) in enumerate(edges):
        assert (net.names[net.link_src[2 * i]], net.names[net.link_dst[2 * i]]) == (u, v)
        assert (net.names[net.link_src[2 * i + 1]], net.names[net.link_dst[2 * i + 1]]) == (v, u)
        if data.get("lane") == "fast":
            lanes |= {2 * i, 2 * i + 1}
    return lanes


def test_rail_fabric_routes_never_use_fast_lanes():
    from topologies.rail_fabric import fast_lane_ports
    fabric = registry.build("rail-fabric")
    net = ModelNetwork(fabric)
    assert fast_lane_ports(fabric)
    lane_links = _lane_links_exact(net)
    assert lane_links
    pairs = list(itertools.permutations(fabric.hosts, 2))
    keys = [key_of(f"{s}>{d}") for s, d in pairs]
    indptr, links = net.paths([s for s, _ in pairs], [d for _, d in pairs], keys)
    assert net.blackhole not in links.tolist()
    assert not set(links.tolist()) & lane_links
    # ... though the lanes are among the model's links, with their capacity
    assert all(net.capacity_bps[l] > 0 for l in lane_links)


def test_rail_fabric_node_path_on_a_lone_lane_uses_it():
    """A lane between switches that no other wire joins: node_path can only take it."""
    from topologies.rail_fabric import fast_lane_ports
    fabric = registry.build("rail-fabric")
    net = ModelNetwork(fabric)
    lane_links = _lane_links_exact(net)
    lone = [(a, b) for a, _, b, _ in fast_lane_ports(fabric) if len(fabric.graph[a][b]) == 1]
    if not lone:
        pytest.skip("every lane of this build runs beside an expander wire")
    a, b = lone[0]
    path = net.node_path([a, b]).tolist()
    assert len(path) == 1 and path[0] in lane_links


def test_rail_fabric_node_path_along_a_lane_uses_the_lane():
    from topologies.rail_fabric import fast_lane_ports
    fabric = registry.build("rail-fabric")
    net = ModelNetwork(fabric)
    lane_links = _lane_links_exact(net)
    lanes = fast_lane_ports(fabric)
    assert lanes
    for a, pa, b, pb in lanes:
        forward = net.node_path([a, b]).tolist()
        back = net.node_path([b, a]).tolist()
        assert len(forward) == 1 and forward[0] in lane_links, (a, b, net.describe(forward[0]))
        assert len(back) == 1 and back[0] in lane_links, (b, a, net.describe(back[0]))


# ---------------------------------------------------------------- failures
def _snapshot(net, pairs):
    keys = [key_of(f"{s}>{d}") for s, d in pairs]
    return _all_paths(net, [s for s, _ in pairs], [d for _, d in pairs], keys)


def test_fail_edge_switch_blackholes_its_hosts_and_restore_gives_paths_back():
    fabric = registry.build("fattree,k=4")
    net = ModelNetwork(fabric)
    pairs = list(itertools.permutations(fabric.hosts, 2))
    before = _snapshot(net, pairs)
    switch = _edge_host(fabric, fabric.hosts[0])
    behind = {h for h in fabric.hosts if _edge_host(fabric, h) == switch}
    assert len(behind) == 2
    net.fail_node(switch)
    assert switch in net.down_nodes
    failed = _snapshot(net, pairs)
    base = routing.base_graph(fabric).copy()
    base.remove_node(switch)
    for (src, dst), links in zip(pairs, failed):
        if src in behind or dst in behind:
            assert links[-1] == net.blackhole, (src, dst, links)
        else:
            _consistent(net, links, src, dst)
            nodes = _nodes(net, links)
            assert switch not in nodes
            assert nodes in routing.shortest_paths(base, src, dst)
    net.restore_node(switch)
    assert _snapshot(net, pairs) == before


def test_fail_core_switch_routes_around_it():
    fabric = registry.build("fattree,k=4")
    net = ModelNetwork(fabric)
    pairs = _pairs(fabric, 240)
    keys = [key_of(f"{s}>{d}-{i}") for i, (s, d) in enumerate(pairs)]
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    before = _all_paths(net, srcs, dsts, keys)
    used = {n for links in before for n in _nodes(net, links)}
    hosts, edges = set(fabric.hosts), {_edge_host(fabric, h) for h in fabric.hosts}
    core = next(n for n in fabric.eps_switches if n in used and n not in edges
                and all(p not in edges for p in fabric.graph.neighbors(n)))
    net.fail_node(core)
    base = routing.base_graph(fabric).copy()
    base.remove_node(core)
    after = _all_paths(net, srcs, dsts, keys)
    for (src, dst), links in zip(pairs, after):
        _consistent(net, links, src, dst)
        assert core not in _nodes(net, links)
        assert _nodes(net, links) in routing.shortest_paths(base, src, dst)
    assert hosts
    net.restore_node(core)
    assert _all_paths(net, srcs, dsts, keys) == before


def test_fail_link_routes_around_it_and_restore_gives_paths_back():
    fabric = registry.build("fattree,k=4")
    net = ModelNetwork(fabric)
    pairs = list(itertools.permutations(fabric.hosts, 2))
    before = _snapshot(net, pairs)
    # a switch-to-switch link that some path uses
    counts = {}
    for links in before:
        for l in links:
            u, v = net.names[net.link_src[l]], net.names[net.link_dst[l]]
            if fabric.kind(u) != HOST and fabric.kind(v) != HOST:
                counts[frozenset((u, v))] = counts.get(frozenset((u, v)), 0) + 1
    u, v = sorted(max(counts, key=counts.get))
    down = net.fail_link(u, v)
    assert len(down) == 2 and all(net.capacity_bps[l] == 0 for l in down)
    base = routing.base_graph(fabric).copy()
    base.remove_edge(u, v)
    after = _snapshot(net, pairs)
    for (src, dst), links in zip(pairs, after):
        _consistent(net, links, src, dst)
        assert not set(links) & set(down)
        assert _nodes(net, links) in routing.shortest_paths(base, src, dst)
    net.restore_link(u, v)
    assert all(net.capacity_bps[l] > 0 for l in down)
    assert _snapshot(net, pairs) == before


def test_fail_host_link_blackholes_the_host():
    fabric = registry.build("fattree,k=4")
    net = ModelNetwork(fabric)
    host = fabric.hosts[0]
    other = fabric.hosts[-1]
    net.fail_link(host, _edge_host(fabric, host))
    assert _path(net, host, other, 1)[-1] == net.blackhole
    assert _path(net, other, host, 1)[-1] == net.blackhole
    net.restore_link(host, _edge_host(fabric, host))
    _consistent(net, _path(net, host, other, 1), host, other)


# ---------------------------------------------------------------- circuits
def _circuit_only_pairs(fabric):
    """Host pairs that a path joins now but not without any circuit."""
    lit = routing.base_graph(fabric)
    dark = routing.base_graph(fabric, {o: set() for o in fabric.ocs_switches})
    return [(s, d) for s, d in itertools.permutations(fabric.hosts, 2)
            if routing.shortest_paths(lit, s, d) and not routing.shortest_paths(dark, s, d)]


@pytest.mark.parametrize("spec", ["rfabric", "hybrid"])
def test_dark_circuits_blackhole_and_relit_circuits_restore_paths(spec):
    fabric = registry.build(spec)
    net = ModelNetwork(fabric)
    only = _circuit_only_pairs(fabric)
    assert only, f"{spec}: no pair depends on circuits"
    others = [(s, d) for s, d in itertools.permutations(fabric.hosts, 2) if (s, d) not in only]
    before_only, before_others = _snapshot(net, only), _snapshot(net, others)
    saved = {o: set(c) for o, c in fabric.circuits.items()}
    for ocs in fabric.ocs_switches:
        net.set_circuits(ocs, set())
    for (src, dst), links in zip(only, _snapshot(net, only)):
        assert links[-1] == net.blackhole, (src, dst)
    for (src, dst), links in zip(others, _snapshot(net, others)):
        _consistent(net, links, src, dst)
        assert not any(net.fabric.kind(net.names[net.link_dst[l]]) == OCS for l in links)
    for ocs, circuits in saved.items():
        net.set_circuits(ocs, circuits)
    assert _snapshot(net, only) == before_only
    assert _snapshot(net, others) == before_others


def _ocs_ports(fabric, node, ocs):
    return {d["ports"][ocs] for d in fabric.graph[node][ocs].values()}


@pytest.mark.parametrize("spec", ["rfabric", "hybrid"])
def test_path_through_ocs_crosses_both_fibres_of_a_lit_circuit(spec):
    fabric = registry.build(spec)
    net = ModelNetwork(fabric)
    only = _circuit_only_pairs(fabric)
    crossings = 0
    for (src, dst), links in zip(only, _snapshot(net, only)):
        _consistent(net, links, src, dst)
        for i, link in enumerate(links):
            ocs = net.names[net.link_dst[link]]
            if fabric.kind(ocs) != OCS:
                continue
            nxt = links[i + 1]
            assert net.names[net.link_src[nxt]] == ocs
            a, b = net.names[net.link_src[link]], net.names[net.link_dst[nxt]]
            assert fabric.kind(a) != OCS and fabric.kind(b) != OCS
            lit = [(pa, pb) for pa, pb in fabric.circuits[ocs]
                   if (pa in _ocs_ports(fabric, a, ocs) and pb in _ocs_ports(fabric, b, ocs))
                   or (pb in _ocs_ports(fabric, a, ocs) and pa in _ocs_ports(fabric, b, ocs))]
            assert lit, f"{a}->{ocs}->{b}: no lit circuit joins them"
            crossings += 1
    assert crossings > 0


def test_node_path_through_a_dark_circuit_is_blackholed():
    fabric = registry.build("rfabric")
    net = ModelNetwork(fabric)
    only = _circuit_only_pairs(fabric)
    src, dst = only[0]
    nodes = _nodes(net, _path(net, src, dst, 3))
    lit = net.node_path(nodes).tolist()
    assert net.blackhole not in lit
    for ocs in fabric.ocs_switches:
        net.set_circuits(ocs, set())
    assert net.node_path(nodes).tolist()[-1] == net.blackhole


def _edge_and_agg(fabric):
    edge = _edge_host(fabric, fabric.hosts[0])
    agg = next(n for n in fabric.graph.neighbors(edge) if fabric.kind(n) != HOST)
    return edge, agg


def _edge_restored_with_a_failed_link():
    """A k=4 fat-tree whose edge switch failed and came back while one of its
    links stayed down: (fabric, net, edge, agg, the down link's ids)."""
    fabric = registry.build("fattree,k=4")
    net = ModelNetwork(fabric)
    edge, agg = _edge_and_agg(fabric)
    down = net.fail_link(edge, agg)
    net.fail_node(edge)
    net.restore_node(edge)
    return fabric, net, edge, agg, down


def test_restore_node_keeps_its_failed_links_out_of_routes():
    fabric, net, _, _, down = _edge_restored_with_a_failed_link()
    pairs = list(itertools.permutations(fabric.hosts, 2))
    for links in _snapshot(net, pairs):
        assert not set(links) & set(down)


def test_restore_node_keeps_a_failed_link_down():
    _, net, edge, agg, down = _edge_restored_with_a_failed_link()
    assert all(net.capacity_bps[l] == 0 for l in down)
    assert net.node_path([edge, agg]).tolist() == [net.blackhole]


def test_keys_of_is_key_of_for_every_name():
    from traffic.model.network import keys_of

    names = ["", "a", "train-dp-c0-o1-s3-r7", "x" * 300, "dé", "line\nbreak"]
    for prefix in ("", "i2/weight-sync/", "é/"):
        assert keys_of(prefix, names).tolist() == [key_of(prefix + n) for n in names]
    assert keys_of("i1/", []).tolist() == []


@pytest.mark.parametrize("spec", ["rfabric", "sip-ocs,gpus=8", "hybrid",
                                  "rfabric,pods=2,train_pods=1,servers_per_pod=4,"
                                  "gpus_per_server=8,radix=16"])
def test_reconfigured_network_routes_as_one_built_on_its_circuits(spec):
    """A reconfiguration adds its circuits to the packet hops kept since the
    start (`ModelNetwork._packet_state`): its tables, hop order included (the
    ECMP pick depends on it), are those of a network built anew."""
    import random
    fabric = registry.build(spec)
    net = ModelNetwork(fabric)
    rng = random.Random(3)
    for ocs in list(fabric.ocs_switches) * 2:
        circuits = sorted(fabric.circuits.get(ocs, ()))
        rng.shuffle(circuits)
        net.set_circuits(ocs, set(circuits[:rng.randint(0, len(circuits))]))
    fresh = registry.build(spec)
    for ocs, circuits in fabric.circuits.items():
        fresh.set_circuits(ocs, circuits)
    anew = ModelNetwork(fresh)
    for name in ("adj_ptr", "adj_nbr", "adj_link1", "adj_link2", "dist", "nh_ptr", "nh_hop"):
        assert np.array_equal(getattr(net, name), getattr(anew, name)), name
    assert net._attach == anew._attach


@pytest.mark.parametrize("seed", range(4))
def test_hop_distances_and_closer_hops_match_scipy_and_the_definition(seed):
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    from traffic.model.network import _closer_hops, _hop_distances
    from traffic.model.paths import UNREACHABLE

    rng = np.random.default_rng(seed)
    count = 40
    src = rng.integers(0, count, 120)
    dst = rng.integers(0, count, 120)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    order = np.argsort(src, kind="stable")          # grouped by router, parallel hops kept
    src, dst = src[order], dst[order]
    ptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=count), out=ptr[1:])
    want = shortest_path(csr_matrix((np.ones(len(src)), (src, dst)), shape=(count, count)),
                         method="D", unweighted=True, directed=True)
    want[np.isinf(want)] = UNREACHABLE
    dist = _hop_distances(ptr, dst, UNREACHABLE)
    assert dist.dtype == np.int32 and np.array_equal(dist, want.astype(np.int32))
    assert (dist == UNREACHABLE).any() and (dist > 1).any()     # a graph worth testing
    ports = rng.integers(0, 5, len(src))
    for given in (np.zeros(0, dtype=np.int64), ports):
        nh_ptr, nh_hop = _closer_hops(ptr, dst, dist, UNREACHABLE, given)
        for u in range(count):
            for g in range(count):
                key = u * count + g
                hops = [e for e in range(ptr[u], ptr[u + 1])
                        if dist[u, g] < UNREACHABLE and dist[dst[e], g] == dist[u, g] - 1]
                if len(given):
                    hops.sort(key=lambda e: given[e])    # stable: adjacency order in a tie
                assert list(nh_hop[nh_ptr[key]:nh_ptr[key + 1]]) == hops
