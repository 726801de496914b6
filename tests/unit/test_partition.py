"""Placing a fabric on N servers: whole pods (or ToRs) per server, tunnels only up top."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from topologies import registry
from topologies.fabric import HOST, Fabric, FabricError
from topologies.partition import POD, TOR, WHOLE, PlacementError, place_fabric


def roles(fabric, link):
    return {fabric.graph.nodes[end]["role"] for end in link}


def check_consistent(fabric, placement, servers):
    """Every node on a server in range; tunnels, GPU counts recomputed from scratch."""
    graph = fabric.graph
    assert set(placement.server_of) == set(graph)
    assert set(placement.server_of.values()) == set(range(servers))
    crossing = sorted(tuple(sorted(link)) for link in graph.edges()
                      if placement.server_of[link[0]] != placement.server_of[link[1]])
    assert list(placement.tunnels) == crossing
    assert all(u < v for u, v in placement.tunnels)
    per_server = Counter(placement.server_of[h] for h in fabric.hosts)
    assert placement.hosts_per_server == tuple(per_server[s] for s in range(servers))


def check_whole(fabric, placement, attribute):
    """Every value of a node attribute (pod, server, plane) lives on one server."""
    servers_of = {}
    for node, data in fabric.graph.nodes(data=True):
        if data.get(attribute) is not None:
            servers_of.setdefault(data[attribute], set()).add(placement.server_of[node])
    assert servers_of and all(len(found) == 1 for found in servers_of.values()), servers_of


def check_by_majority(fabric, placement, nodes):
    """Each of ``nodes`` sits on the server holding most of its links."""
    for node in nodes:
        links = Counter(placement.server_of[peer] for _, peer in fabric.graph.edges(node))
        assert links[placement.server_of[node]] == max(links.values()), node


def check_rule(placement, servers):
    """At least a quarter of the GPUs per server for N <= 4, hosts/(2N) beyond."""
    hosts = sum(placement.hosts_per_server)
    for count in placement.hosts_per_server:
        assert (4 * count >= hosts) if servers <= 4 else (2 * servers * count >= hosts)


def uneven_leaves(*sizes):
    """One spine over leaves of ``sizes`` GPUs: no pods, ToR groups of those sizes."""
    fabric = Fabric("uneven")
    spine = fabric.add_switch("spine")
    for size in sizes:
        leaf = fabric.add_switch("leaf")
        for _ in range(size):
            fabric.add_link(fabric.add_host("gpu"), leaf, 100.0)
        fabric.add_link(leaf, spine, 100.0)
    return fabric


# ---------------------------------------------------------------- fat-trees by pods
def test_k4_fattree_on_two_servers_keeps_pods_whole_and_tunnels_only_agg_core_links():
    k, servers = 4, 2
    fabric = registry.build(f"fattree,k={k}")
    placement = place_fabric(fabric, servers)

    check_consistent(fabric, placement, servers)
    assert placement.groups == POD
    assert placement.hosts_per_server == (8, 8)
    check_whole(fabric, placement, "pod")
    cores = fabric.nodes_of("eps", "core")
    check_by_majority(fabric, placement, cores)
    # Every core has as many links to either side: the one with fewer
    # switches so far takes it, so c1, c3 join server 0 and c2, c4 server 1.
    assert [placement.server_of[core] for core in cores] == [0, 1, 0, 1]
    # Brute force: no GPU, edge or edge-agg link crosses, only agg-core ones.
    assert all(roles(fabric, link) == {"agg", "core"} for link in placement.tunnels)
    # Each of the (k/2)^2 cores has one link per pod and k/2 pods on the other
    # server: (k/2)^3 = k^3/8 tunnels.
    assert len(placement.tunnels) == (k // 2) ** 3 == k ** 3 // 8 == 8
    assert placement.describe() == ("fattree on 2 servers, whole pods together: GPUs 8 + 8, "
                                    "8 tunnels (agg-core 8)")


@pytest.mark.parametrize("servers", [2, 3, 4])
def test_k8_fattree_pods_spread_evenly_and_each_core_sits_with_most_of_its_pods(servers):
    k = 8
    fabric = registry.build(f"fattree,k={k}")
    placement = place_fabric(fabric, servers)

    check_consistent(fabric, placement, servers)
    assert placement.groups == POD
    check_rule(placement, servers)
    check_whole(fabric, placement, "pod")
    pods_per_server = [count // (k * k // 4) for count in placement.hosts_per_server]
    assert sorted(pods_per_server) == sorted(k // servers + (s < k % servers)
                                             for s in range(servers))
    check_by_majority(fabric, placement, fabric.nodes_of("eps", "core"))
    assert all(roles(fabric, link) == {"agg", "core"} for link in placement.tunnels)
    # A core with one link per pod, on a server holding ceil(k/N) of the pods,
    # tunnels the other k - ceil(k/N): 64, 80 and 96 tunnels for N = 2, 3, 4.
    assert len(placement.tunnels) == (k // 2) ** 2 * (k - math.ceil(k / servers))


def test_more_than_four_servers_need_only_half_an_equal_share():
    fabric = registry.build("fattree,k=8")        # 8 pods of 16 GPUs on 6 servers
    placement = place_fabric(fabric, 6)
    check_consistent(fabric, placement, 6)
    assert placement.groups == POD
    assert placement.hosts_per_server == (32, 32, 16, 16, 16, 16)
    check_rule(placement, 6)                      # at least 128 / 12 GPUs each


def test_oversubscribed_fattree_cuts_only_spine_core_links():
    # Three tiers, leaves of 4 GPUs, spines split 6 down : 2 up, so pods of
    # six leaves: five of 24 GPUs and one of 8.
    fabric = registry.build("fattree-os,gpus=128,radix=8")
    placement = place_fabric(fabric, 2)

    check_consistent(fabric, placement, 2)
    assert placement.groups == POD
    check_rule(placement, 2)
    check_whole(fabric, placement, "pod")
    cores = fabric.nodes_of("eps", "core")
    check_by_majority(fabric, placement, cores)
    assert all(roles(fabric, link) == {"spine", "core"} for link in placement.tunnels)
    # Brute force: every tunnel is a core's link away from its server's side.
    away = sum(sum(1 for _, peer in fabric.graph.edges(core)
                   if placement.server_of[peer] != placement.server_of[core])
               for core in cores)
    assert len(placement.tunnels) == away > 0


def test_weights_give_a_server_its_weighted_share():
    fabric = registry.build("fattree,k=4")
    assert place_fabric(fabric, 2, weights=[3, 1]).hosts_per_server == (12, 4)
    assert place_fabric(fabric, 2, weights=[1.0, 3.0]).hosts_per_server == (4, 12)


# ---------------------------------------------------------------- fallback: ToR groups
def test_a_fabric_with_one_pod_falls_back_to_each_leaf_with_its_gpus():
    fabric = registry.build("clos,gpus=16,radix=8,gpus_per_server=2")   # all in pod 0
    placement = place_fabric(fabric, 2)

    check_consistent(fabric, placement, 2)
    assert placement.groups == TOR
    assert placement.hosts_per_server == (8, 8)
    for host in fabric.hosts:
        leaf, _ = fabric.host_port(host)
        assert placement.server_of[leaf] == placement.server_of[host]
    assert all(roles(fabric, link) == {"leaf", "spine"} for link in placement.tunnels)
    # Each spine has as many links to either server's leaves: half of the
    # leaf-spine links cross.
    uplinks = sum(1 for link in fabric.graph.edges() if roles(fabric, link) == {"leaf", "spine"})
    assert len(placement.tunnels) == uplinks // 2 == 8


def test_a_fabric_without_pods_keeps_each_server_nvswitch_with_its_gpus():
    fabric = registry.build("rail-only,gpus=16,gpus_per_server=2,radix=8")
    placement = place_fabric(fabric, 2)

    check_consistent(fabric, placement, 2)
    assert placement.groups == TOR
    assert placement.hosts_per_server == (8, 8)
    check_whole(fabric, placement, "server")      # an nvswitch and its two GPUs
    # Consecutive servers share a leaf, so only the rails' spines are cut.
    assert all(roles(fabric, link) == {"leaf", "spine"} for link in placement.tunnels)
    assert len(placement.tunnels) == 8


def test_a_gpu_on_a_rail_leaf_and_an_nvswitch_groups_by_the_leaf():
    # Four servers of two GPUs; GPU rank r on its server's nvswitch and on
    # rail leaf r.  Grouping by every switch would chain all into one group.
    fabric = Fabric("rail-nvlink")
    spine = fabric.add_switch("spine")
    leaves = [fabric.add_switch("leaf", rail=rank) for rank in range(2)]
    for leaf in leaves:
        fabric.add_link(leaf, spine, 400.0)
    for server in range(4):
        nvswitch = fabric.add_switch("nvswitch", server=server)
        for rank, leaf in enumerate(leaves):
            gpu = fabric.add_host("gpu", server=server, rail=rank)
            fabric.add_link(gpu, nvswitch, 3200.0)
            fabric.add_link(gpu, leaf, 400.0)
    placement = place_fabric(fabric, 2)

    check_consistent(fabric, placement, 2)
    assert placement.groups == TOR
    assert placement.hosts_per_server == (4, 4)
    check_whole(fabric, placement, "rail")           # each leaf with its rail's GPUs
    # An nvswitch has a GPU on either side: half of the NVLinks cross.
    assert Counter(frozenset(roles(fabric, link)) for link in placement.tunnels) == {
        frozenset({"gpu", "nvswitch"}): 4, frozenset({"leaf", "spine"}): 1}


def test_pods_too_few_for_the_servers_fall_back_to_tor_groups():
    fabric = registry.build("fattree,k=4")        # 4 pods cannot fill 5 servers
    placement = place_fabric(fabric, 5)
    check_consistent(fabric, placement, 5)
    assert placement.groups == TOR
    check_rule(placement, 5)
    assert placement.hosts_per_server == (4, 2, 4, 2, 4)
    assert not any(HOST in {fabric.kind(end) for end in link} for link in placement.tunnels)
    # Consecutive runs keep pods 0 and 3 whole and split pods 1 and 2 edge by
    # edge; each of their two aggs joins one edge and is cut from the other.
    assert dict(placement.tunnel_roles)["edge-agg"] == 2 * 2


def test_spines_are_placed_before_the_cores_above_them():
    # Pods (6 leaves of 4 GPUs: 24, 24, 16) cannot give 4 servers 16 each, so
    # leaves go 4 per server in order: pod 0's leaves split 4 + 2, pod 1's
    # 2 + 4, pod 2's stay whole.  Each of a pod's 4 spines joins the side with
    # 4 of its leaves and tunnels 2: 16 leaf-spine tunnels.  Each of the 4
    # cores then has 2 links to each of 3 servers and tunnels 4: 16.
    fabric = registry.build("fattree-os,gpus=64,radix=8")
    placement = place_fabric(fabric, 4)
    check_consistent(fabric, placement, 4)
    assert placement.groups == TOR
    assert placement.hosts_per_server == (16, 16, 16, 16)
    assert dict(placement.tunnel_roles) == {"leaf-spine": 16, "spine-core": 16}


def test_zcube_keeps_linked_switch_layers_together():
    # ZCube(n, 2): A_i -- B_j for every i, j.  Half of each layer per server
    # cuts 2 * (n/2)^2 = n^2/2 of the n^2 links; one layer per server would cut all.
    n = 4
    fabric = registry.build(f"zcube,n={n}")
    placement = place_fabric(fabric, 2)
    check_consistent(fabric, placement, 2)
    assert placement.groups == TOR
    assert len(placement.tunnels) == n * n // 2
    assert all(roles(fabric, link) == {"zcube-a", "zcube-b"} for link in placement.tunnels)


def test_hpn_planes_never_meet_so_two_servers_need_no_tunnel():
    # One segment (pod 0), so ToR groups; each plane's ToRs and aggs are a
    # component of their own, and the two NIC-port hosts of a GPU split up.
    fabric = registry.build("hpn,gpus=16,gpus_per_server=2,radix=8")
    placement = place_fabric(fabric, 2)
    check_consistent(fabric, placement, 2)
    assert placement.tunnels == ()
    check_whole(fabric, placement, "plane")


# ---------------------------------------------------------------- edge cases
def test_the_same_fabric_places_the_same_way_every_time():
    first = place_fabric(registry.build("fattree,k=8"), 3)
    assert place_fabric(registry.build("fattree,k=8"), 3) == first
    fabric = registry.build("rail-fabric")
    assert place_fabric(fabric, 3) == place_fabric(fabric, 3)


def test_one_server_holds_everything_without_tunnels():
    fabric = registry.build("fattree,k=4")
    placement = place_fabric(fabric, 1)
    assert set(placement.server_of.values()) == {0}
    assert len(placement.server_of) == len(fabric.graph)
    assert placement.tunnels == ()
    assert placement.hosts_per_server == (16,)
    assert placement.groups == WHOLE
    assert placement.describe() == "fattree on 1 server, all on one server: GPUs 16, 0 tunnels"


def test_an_infeasible_placement_names_the_fabric_the_servers_and_the_best_split():
    fabric = registry.build("fattree-os,gpus=16,radix=8,gpus_per_server=2")   # leaves 6, 6, 4
    with pytest.raises(PlacementError, match=r"^fattree-os: cannot place on 4 servers: the rule "
                                             r"wants at least a quarter of the 16 GPUs each.*"
                                             r"best GPUs per server 4 \+ 6 \+ 6 \+ 0 \(by tor\)"):
        place_fabric(fabric, 4)


def test_three_servers_need_a_quarter_each_not_half_a_share():
    # Leaves of 8, 8 and 4 GPUs: the 4 are a fifth of 20, more than half an
    # equal share (20/6) but less than the quarter N <= 4 asks for.
    fabric = uneven_leaves(8, 8, 4)
    with pytest.raises(PlacementError, match=r"^uneven: cannot place on 3 servers: .* quarter "
                                             r"of the 20 GPUs each .*tried tor groups, best GPUs "
                                             r"per server 4 \+ 8 \+ 8 \(by tor\)"):
        place_fabric(fabric, 3)
    assert place_fabric(fabric, 2).hosts_per_server == (12, 8)
    # Weighted, the rule asks 3/4 of each server's share.  2:2:1 is an exact
    # fit; at 2:2:1.0001 no 8 fits a share of 7.9998, filling in turn gives
    # 12 + 8 + 0 and dealing largest first rescues 8 + 8 + 4.
    assert place_fabric(fabric, 3, weights=[2, 2, 1]).hosts_per_server == (8, 8, 4)
    assert place_fabric(fabric, 3, weights=[2, 2, 1.0001]).hosts_per_server == (8, 8, 4)
    assert place_fabric(fabric, 3, weights=[1, 1, 2]).hosts_per_server == (4, 8, 8)
    with pytest.raises(PlacementError, match=r"at least 3/4 of each server's weighted share: "
                                             r"3, 3, 9 GPUs"):
        place_fabric(fabric, 3, weights=[1, 1, 3])
    # Six single GPUs, then six on one leaf: filling in turn and consecutive
    # runs both leave 2 GPUs on a server; only dealing largest first fits.
    assert place_fabric(uneven_leaves(1, 1, 1, 1, 1, 1, 6), 3).hosts_per_server == (6, 3, 3)


@pytest.mark.parametrize("servers, weights, message", [
    (0, None, "servers must be an integer >= 1, got 0"),
    (17, None, "17 servers but only 16 GPUs"),
    (2, [1, 1, 1], "3 weights for 2 servers"),
    (2, [1, 0], r"weights must be finite and > 0, got \[1, 0\]"),
])
def test_bad_arguments_say_what_is_wrong(servers, weights, message):
    with pytest.raises(PlacementError, match=f"^fattree: {message}"):
        place_fabric(registry.build("fattree,k=4"), servers, weights)


# ---------------------------------------------------------------- every registered fabric
#: Fabrics without a rule for their parameters at a GPU count, at 16 GPUs.
SIXTEEN_GPUS = {"leafspine": "leafspine,leaves=8,hosts_per_leaf=2",
                "hybrid": "hybrid,tors=8,hosts_per_tor=2"}


def spec_at_16(name):
    if name in SIXTEEN_GPUS:
        return SIXTEEN_GPUS[name]
    try:
        return registry.spec_at(name, 16, small=True, radix=8, gpus_per_server=2)
    except FabricError as exc:
        pytest.fail(f"{name} does not build at 16 GPUs ({exc}); add it to SIXTEEN_GPUS")


@pytest.mark.parametrize("spec", [spec_at_16(name) for name in registry.names()] + ["rfabric"])
def test_every_registered_fabric_at_16_gpus_places_on_two_servers(spec):
    fabric = registry.build(spec)
    placement = place_fabric(fabric, 2)
    check_consistent(fabric, placement, 2)
    check_rule(placement, 2)
    # A GPU's own link never becomes a tunnel, except on SiP-OCS, whose GPUs
    # hang off OCSes only (each a group of its own) and forward for each other.
    on_gpus = [link for link in placement.tunnels
               if HOST in {fabric.kind(end) for end in link}]
    assert bool(on_gpus) == (fabric.name == "sip-ocs"), on_gpus
