"""Routing over the new fabrics: ECMP where paths tie, ZCube's two paths, transit GPUs."""

import pytest

from topologies import rail_only, registry, routing, sip_ocs, zcube
from topologies.fabric import FabricError


def ports_toward(fabric, switch, dst):
    return routing.next_hops(fabric.logical_graph(), destinations=[dst])[switch][dst]


def test_two_tier_clos_spreads_over_every_spine_link():
    fabric = registry.build("clos,gpus=16,radix=8")     # 4 leaves, 2 spines, 2 links each
    leaf = fabric.host_port("h1")[0]
    assert len(ports_toward(fabric, leaf, "h16")) == 4
    assert ports_toward(fabric, leaf, "h2") == (fabric.host_port("h2")[1],)


def test_three_tier_fat_tree_has_k_squared_over_four_paths():
    fabric = registry.build("clos,gpus=16,radix=4")     # the k=4 fat-tree
    paths = routing.shortest_paths(fabric.logical_graph(), "h1", "h16")
    assert len(paths) == 4 and all(len(p) == 7 for p in paths)


def test_roft_same_rank_is_one_hop_and_other_ranks_cross_the_spines():
    fabric = registry.build("roft")                     # 4 GPUs per server, 8 servers
    logical = fabric.logical_graph()
    same_rail = routing.shortest_paths(logical, "h1", "h5")     # rank 0 of servers 0, 1
    other_rail = routing.shortest_paths(logical, "h1", "h2")    # ranks 0 and 1 of server 0
    assert {len(p) for p in same_rail} == {3}
    assert {len(p) for p in other_rail} == {5} and len(other_rail) == 4


def test_rail_only_crosses_rails_over_nvlink_to_the_destination_rail():
    fabric = registry.build("rail-only")                # 4 servers x 4 GPUs, radix 4
    table = routing.next_hops(fabric.logical_graph())
    nvswitch = fabric.host_port("h1")[0]
    dst = "h16"                                         # server 3, rank 3
    assert len(table[nvswitch][dst]) == 4               # plain ECMP: any of the 4 NICs
    aligned = rail_only.rail_aligned(fabric, table)
    (port,) = aligned[nvswitch][dst]
    leaf, _ = fabric.peer(nvswitch, port)
    assert fabric.graph.nodes[leaf]["rail"] == 3
    assert aligned[nvswitch]["h2"] == table[nvswitch]["h2"]      # same server: NVLink


@pytest.mark.parametrize("tp_rank,first_layer", [(0, "A"), (2, "A"), (1, "B"), (7, "B")])
def test_zcube_tp_rank_picks_one_of_two_disjoint_two_hop_paths(tp_rank, first_layer):
    n = 4
    fabric = registry.build(f"zcube,n={n}")
    src, dst = 0 * n + 0, 1 * n + 2                     # GPU (0,0) -> GPU (1,2)
    path = zcube.select_path(fabric, src, dst, tp_rank=tp_rank)
    a_p, b_d = fabric.graph.nodes[path[1]], fabric.graph.nodes[path[2]]
    assert len(path) == 4
    assert a_p["layer"] == first_layer and b_d["layer"] != first_layer
    # Shortest-path routing between the chosen ports realises exactly this path.
    assert routing.shortest_paths(fabric.logical_graph(), path[0], path[-1]) == [path]
    one, two = zcube.paths(fabric, src, dst)
    assert set(one[1:3]).isdisjoint(two[1:3])


def test_zcube_port_plan_and_next_hop():
    n = 4
    fabric = registry.build(f"zcube,n={n}")
    path = zcube.select_path(fabric, 0, 1 * n + 2, tp_rank=0)      # A_0 -> B_2
    assert ports_toward(fabric, path[1], path[-1]) == (n + 2 + 1,)  # A_i port n+1+j -> B_j


def test_zcube_request_split_is_stable_and_uses_both_paths():
    fabric = registry.build("zcube,n=4")
    choices = {tuple(zcube.select_path(fabric, 0, 5, request_id=f"req-{i}")) for i in range(20)}
    assert len(choices) == 2
    assert zcube.select_path(fabric, 0, 5, request_id="abc") == \
        zcube.select_path(fabric, 0, 5, request_id="abc")
    with pytest.raises(FabricError):
        zcube.select_path(fabric, 0, 5)


def test_sip_ocs_gpus_forward_over_default_circuits():
    fabric = registry.build("sip-ocs,gpus=16")
    logical = fabric.logical_graph()
    table = sip_ocs.transit_next_hops(logical)
    hosts = fabric.hosts
    assert all(len(table[h]) == len(hosts) - 1 for h in hosts)
    # Without transit hosts no packet switch exists to route anything.
    assert routing.next_hops(logical, transit_hosts=True) == {}
    assert fabric.params["transit_hosts"] is True


def test_rfabric_mesh_connects_every_tor_to_every_host():
    fabric = registry.build("rfabric,pods=4,train_pods=2")
    table = routing.next_hops(fabric.logical_graph())
    hosts = fabric.hosts
    assert all(len(entries) == len(hosts) for entries in table.values())


def test_rfabric_isolated_gen_pods_keep_one_core_circuit():
    fabric = registry.build("rfabric,pods=4,train_pods=2,circuits=isolated")
    logical = fabric.logical_graph()
    pod_of = {n: d.get("pod") for n, d in logical.nodes(data=True)}
    crossing = [(u, v) for u, v, d in logical.edges(data=True)
                if d.get("medium") == "circuit" and pod_of[u] != pod_of[v]]
    gen = {n for n, d in logical.nodes(data=True) if d.get("pod_role") == "gen"}
    for pod in (2, 3):                                   # the two Gen PoDs
        assert sum(1 for u, v in crossing if pod in (pod_of[u], pod_of[v])) == 1
    assert not [e for e in crossing if set(e) <= gen]    # Gen PoDs do not talk to each other


def test_rfabric_none_leaves_pods_isolated():
    fabric = registry.build("rfabric,circuits=none")
    table = routing.next_hops(fabric.logical_graph())
    tor = fabric.host_port("h1")[0]
    assert set(table[tor]) == {h for h in fabric.hosts if fabric.host_port(h)[0] == tor}
