"""KV flows on ZCube's dual paths: rank i -> rank i, split by rank or request."""

import pytest

from topologies import railfly, zcube
from traffic import kvcache
from traffic.flows import FlowDag
from traffic.kvflows import (kv_flow_dag, kv_flows, kv_transfer, path_links, rank_bytes,
                             rank_paths)
from traffic.placement import PlacementError, Topology
from traffic.requests import Request


@pytest.fixture(scope="module")
def topo():
    return Topology(zcube.build(n=8))        # 64 GPUs, 8 nodes of TP=8


def request(rid="r7", prompt=32_768, cached=0, arrival=0.0):
    return Request(rid, "s1", 1 if cached else 0, arrival, prompt, cached, 100)


def gpu_of(topo, host):
    return topo.fabric.graph.nodes[host]["gpu"]


def test_rank_i_of_p_sends_to_rank_i_of_d(topo):
    p, d = topo.node(0), topo.node(5)
    dag = kv_flows(topo, request(), 0, 5)
    assert len(dag.flows) == 8
    for rank, flow in enumerate(dag.flows):
        assert flow.id == f"r7-r{rank}"
        assert gpu_of(topo, flow.src) == p.gpus[rank]
        assert gpu_of(topo, flow.dst) == d.gpus[rank]


def test_tp_rank_split_takes_path_1_on_even_ranks_and_path_2_on_odd(topo):
    p, d = topo.node(0), topo.node(5)
    paths = rank_paths(topo, 0, 5, "tp-rank")
    for rank, path in enumerate(paths):
        assert path == zcube.paths(topo.fabric, p.gpus[rank], d.gpus[rank])[rank % 2]
        first_switch = topo.fabric.graph.nodes[path[1]]["layer"]
        assert first_switch == ("A" if rank % 2 == 0 else "B")


def test_per_request_routing_puts_every_rank_on_one_path(topo):
    for rid in ("r1", "r2", "r3", "r4"):
        paths = rank_paths(topo, 0, 5, "request", rid)
        layers = {topo.fabric.graph.nodes[path[1]]["layer"] for path in paths}
        assert len(layers) == 1
        p, d = topo.node(0), topo.node(5)
        assert paths[0] == zcube.select_path(topo.fabric, p.gpus[0], d.gpus[0], request_id=rid)


def test_least_loaded_takes_the_path_with_the_cooler_busiest_link(topo):
    path_1 = rank_paths(topo, 0, 5, "tp-rank")[0]
    hot = {path_links(path_1)[1]: 4}                  # an A -> B link of path 1
    chosen = rank_paths(topo, 0, 5, "least-loaded", "r1", hot)
    assert all(topo.fabric.graph.nodes[path[1]]["layer"] == "B" for path in chosen)
    cool = rank_paths(topo, 0, 5, "least-loaded", "r1", {})
    assert all(topo.fabric.graph.nodes[path[1]]["layer"] == "A" for path in cool)


def test_bytes_are_one_tp_share_and_only_the_delta_on_home(topo):
    config = kvcache.GLM_5_1
    cold = kv_flows(topo, request(), 0, 5)
    assert {f.bytes for f in cold.flows} == {89_856 * 32_768 // 8}
    warm = request(cached=30_000)
    delta = kv_flows(topo, warm, 0, 5, on_home=True)
    moved = kv_flows(topo, warm, 0, 5, on_home=False)
    assert {f.bytes for f in delta.flows} == {rank_bytes(89_856 * 2_768, 8)}
    assert moved.total_bytes() == cold.total_bytes()
    scaled = kv_flows(topo, request(), 0, 5, bytes_scale=1e-6, config=config)
    assert {f.bytes for f in scaled.flows} == {rank_bytes(89_856 * 32_768, 8, 1e-6)}


def test_a_transfer_lists_its_links_and_flows_can_wait_for_prefill(topo):
    transfer = kv_transfer(topo, request(), 0, 5, at_s=1.5, after=("prefill-r7",))
    assert transfer.dag.external == ("prefill-r7",)
    assert all(f.at_s == 1.5 and f.after == ("prefill-r7",) for f in transfer.dag.flows)
    per_flow = transfer.flow_links()
    assert set(per_flow) == {f.id for f in transfer.dag.flows}
    assert set(transfer.links) == {link for links in per_flow.values() for link in links}


def test_many_requests_make_one_dag(topo):
    first, second = request("a", arrival=0.5), request("b", cached=100, arrival=2.0)
    dag = kv_flow_dag(topo, [(first, 0, 5, False), (second, 1, 6, True)],
                      start_s=lambda r: r.arrival_s + 0.25, strategy="request")
    assert isinstance(dag, FlowDag) and len(dag.flows) == 16
    assert {f.at_s for f in dag.flows if f.id.startswith("a-")} == {0.75}
    assert {f.at_s for f in dag.flows if f.id.startswith("b-")} == {2.25}


def test_tp_sizes_must_match_and_strategies_are_named(topo):
    mixed = Topology(zcube.build(n=4, gpus_per_server=8), gpus_per_node=None)
    assert mixed.node(0).tp == 8
    with pytest.raises(PlacementError, match="unknown path strategy"):
        rank_paths(topo, 0, 5, "per-packet")
    with pytest.raises(PlacementError, match="needs the request id"):
        rank_paths(topo, 0, 5, "least-loaded")
    uneven = Topology(zcube.build(n=4), gpus_per_node=6)      # 16 GPUs: 6, 6, 4
    with pytest.raises(PlacementError, match="equal TP sizes"):
        rank_paths(uneven, 0, 2)


def test_other_fabrics_use_one_shortest_path_per_rank():
    topo = Topology(railfly.build(rails=4, servers=4))
    paths = rank_paths(topo, 0, 1, "tp-rank")
    assert [len(path) for path in paths] == [3, 3, 3, 3]      # host, rail switch, host
    dag = kv_flows(topo, request(), 0, 1)
    assert len(dag.flows) == 4


def test_hpn_rank_kv_is_split_over_both_planes_of_the_bonded_nic():
    from topologies import registry as _registry
    from traffic import kvflows as _kvflows
    from traffic.placement import Topology as _Topology
    from traffic.requests import Request as _Request

    fabric = _registry.build("hpn,gpus=16,gpus_per_server=2,radix=8")
    topo = _Topology(fabric, gpus_per_node=2)
    request = _Request("q1", "s1", 0, 0.0, 4096, 0, 16)
    transfer = _kvflows.kv_transfer(topo, request, 0, 3, bytes_scale=1e-3)
    flows = transfer.dag.flows
    assert [f.id for f in flows] == ["q1-r0p0", "q1-r0p1", "q1-r1p0", "q1-r1p1"]
    for flow in flows:
        port = int(flow.id[-1])
        assert fabric.graph.nodes[flow.src]["nic_port"] == port
        assert fabric.graph.nodes[flow.dst]["nic_port"] == port
    ranks = [topo.node(0).gpus, topo.node(3).gpus]
    assert {fabric.graph.nodes[f.src]["gpu"] for f in flows} == set(ranks[0])
    assert len({f.bytes for f in flows}) == 1
    assert len(transfer.paths) == len(flows)
