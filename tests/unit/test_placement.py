"""Affinity tiles vs zones on ZCube, and the pairing strategies."""

import statistics
from collections import Counter

import pytest

from topologies import railfly, zcube
from traffic.pairing import (ClusterState, Choice, FixedPairs, RandomPairs, ScorePairs, Weights,
                             pairing)
from traffic.placement import (D, FLEX, P, TILES, PlacementError, Topology, placement,
                               tile_placement, zone_placement)
from traffic.requests import Request


@pytest.fixture(scope="module")
def cell():
    """The text's 1,024-GPU cell: ZCube(32, 2), 128 nodes of 8 GPUs."""
    return Topology(zcube.build(n=32))


@pytest.fixture(scope="module")
def small():
    """An emulation-sized cube: 16 GPUs, 8 nodes of TP=2."""
    return Topology(zcube.build(n=4, gpus_per_server=2))


def request(rid="r1", session="s1", prompt=1000, cached=0):
    return Request(rid, session, 1 if cached else 0, 0.0, prompt, cached, 100)


# ---------------------------------------------------------------- topology
def test_a_node_is_a_tp_group_on_one_a_switch_and_eight_b_switches(cell):
    assert len(cell.nodes) == 128
    node = cell.node(5)
    assert node.gpus == tuple(range(40, 48)) and node.tp == 8
    a_switches = {s for s in node.switches if cell.fabric.graph.nodes[s]["layer"] == "A"}
    assert len(a_switches) == 1 and len(node.switches) == 9
    assert dict(node.ports)[next(iter(a_switches))] == 8


def test_same_row_or_same_column_block_is_one_switch_rank_to_rank(cell):
    assert cell.node_hops(0, 1) == 1.0      # servers 0 and 1 share A_0
    assert cell.node_hops(0, 4) == 1.0      # same columns, rows 0 and 1: share B_0..B_7
    assert cell.node_hops(0, 5) == 2.0      # neither
    assert cell.gpu_hops(0, 0 + 33) == 2


def test_other_fabrics_work_too():
    topo = Topology(railfly.build(rails=4, servers=4))
    assert len(topo.nodes) == 4 and all(node.tp == 4 for node in topo.nodes)
    assert topo.node_hops(0, 1) == 1.0      # rank i -> rank i stays on rail i
    result = tile_placement(topo, (2, 2))
    assert len(result.prefill) == 2 and len(result.decode) == 2


# ---------------------------------------------------------------- tiles vs zones
@pytest.mark.parametrize("name, tiles, flex", [("3p2d", 25, 3), ("5p3d", 16, 0),
                                               ("4p4d", 16, 0)])
def test_tile_counts_match_the_texts_table(cell, name, tiles, flex):
    result = placement(cell, "tiles", name)
    p, d = TILES[name]
    assert len(result.tiles) == tiles and len(result.flex) == flex
    assert len(result.prefill) == tiles * p and len(result.decode) == tiles * d
    assert all(len(t.prefill) == p and len(t.decode) == d for t in result.tiles)
    members = [n for t in result.tiles for n in t.nodes]
    assert len(members) == len(set(members)) == tiles * (p + d)


@pytest.mark.parametrize("name, bound", [("3p2d", 0.15), ("5p3d", 0.125), ("4p4d", 0.0)])
def test_tiles_keep_every_switch_near_the_global_ratio_and_zones_do_not(cell, name, bound):
    """With 4 nodes per A switch, 0.15 and 0.125 are the best a row can do."""
    tiles, zone = placement(cell, "tiles", name), placement(cell, "zone", name)
    assert tiles.max_deviation(cell) <= bound + 1e-9
    assert zone.max_deviation(cell) >= 0.5
    for ports in tiles.switch_ports(cell).values():
        assert ports[P] and ports[D]
    assert any(not ports[D] for ports in zone.switch_ports(cell).values())


def test_zone_puts_all_p_first(cell):
    zone = zone_placement(cell)
    assert zone.prefill == list(range(75)) and zone.decode == list(range(75, 125))
    assert zone.flex == [125, 126, 127] and zone.tiles == ()


def test_tiles_are_topologically_tight(cell):
    result = tile_placement(cell)
    inside = statistics.mean(cell.node_hops(p, d) for t in result.tiles
                             for p in t.prefill for d in t.decode)
    everyone = statistics.mean(cell.node_hops(p, d) for p in result.prefill
                               for d in result.decode)
    assert inside < 1.2 < everyone


def test_flex_nodes_are_spread_over_distinct_switches(cell):
    flex = [cell.node(n) for n in tile_placement(cell).flex]
    assert len(flex) == 3
    for index, a in enumerate(flex):
        for b in flex[index + 1:]:
            assert not a.switches & b.switches


def test_the_hash_is_deterministic_and_seeded(cell):
    assert tile_placement(cell, seed=1) == tile_placement(cell, seed=1)
    assert tile_placement(cell, seed=1).roles != tile_placement(cell, seed=2).roles


def test_a_flex_node_assumes_a_role(small):
    result = tile_placement(small)
    assert len(result.tiles) == 1 and len(result.flex) == 3
    node = result.flex[0]
    changed = result.assume(node, D)
    assert changed.roles[node] == D and len(changed.decode) == len(result.decode) + 1
    with pytest.raises(PlacementError, match="not flex"):
        changed.assume(node, P)
    with pytest.raises(PlacementError, match="P or D"):
        result.assume(result.flex[1], FLEX)


def test_impossible_placements_say_why(small):
    with pytest.raises(PlacementError, match="need 10 nodes; the fabric has 8"):
        tile_placement(small, (3, 2), tiles=2)
    with pytest.raises(PlacementError, match="unknown tile"):
        placement(small, tile="9p1d")


# ---------------------------------------------------------------- pairing
def test_fixed_pairs_bind_each_p_to_a_d_of_its_tile(cell):
    result = tile_placement(cell)
    fixed = FixedPairs(result)
    state = ClusterState()
    seen = Counter()
    for index in range(2 * len(result.prefill)):
        choice = fixed.choose(request(f"r{index}"), state)
        assert result.tile_of(choice.p) == result.tile_of(choice.d)
        assert choice.d == fixed.bound[choice.p]
        seen[choice.p] += 1
    assert set(seen.values()) == {2}


def test_random_pairs_are_seeded_and_cover_the_pools(small):
    result = tile_placement(small)
    picks = [RandomPairs(result, seed=3).choose(request(), ClusterState()) for _ in range(3)]
    assert len(set(picks)) == 1                  # a fresh generator: same first pick
    many = RandomPairs(result, seed=3)
    choices = [many.choose(request(), ClusterState()) for _ in range(200)]
    assert {c.p for c in choices} == set(result.prefill)
    assert {c.d for c in choices} == set(result.decode)


def test_the_score_is_the_texts_weighted_sum(small):
    result = tile_placement(small)
    weights = Weights(qp=2, qd=3, tkv=5, hpath=7, md=11, acache=13)
    scorer = ScorePairs(small, result, weights=weights)
    p, d = result.prefill[0], result.decode[0]
    state = ClusterState(p_queue={p: 1}, d_queue={d: 2}, d_memory={d: 0.5},
                         d_streams={d: 1}, home={"s1": d})
    warm = request(prompt=1000, cached=600)
    terms = scorer.terms(warm, state, p, d)
    seconds = 400 * 89_856 * 8 / (2 * 200e9)
    assert terms == pytest.approx({"qp": 1, "qd": 2, "tkv": 2 * seconds,
                                   "hpath": small.node_hops(p, d), "md": 0.5, "acache": 0.6})
    assert scorer.score(warm, state, p, d) == pytest.approx(
        2 * 1 + 3 * 2 + 5 * terms["tkv"] + 7 * terms["hpath"] + 11 * 0.5 - 13 * 0.6)


def test_the_score_avoids_busy_nodes_and_hot_links(small):
    result = tile_placement(small)
    scorer = ScorePairs(small, result)
    idle = scorer.choose(request(), ClusterState())
    busy = ClusterState(p_queue={idle.p: 5}, d_queue={idle.d: 5})
    moved = scorer.choose(request(), busy)
    assert moved.p != idle.p and moved.d != idle.d
    paths_state = ClusterState(link_streams={"x-y": 0})
    before = scorer.terms(request(), paths_state, idle.p, idle.d)["hpath"]
    from traffic.kvflows import path_links, rank_paths
    link = path_links(rank_paths(small, idle.p, idle.d, "tp-rank", "r1")[0])[1]
    after = scorer.terms(request(), ClusterState(link_streams={link: 3}), idle.p, idle.d)
    assert after["hpath"] == before + 3


def test_cache_affinity_pulls_a_warm_turn_home(small):
    result = tile_placement(small)
    scorer = pairing("score", small, result, weights=Weights(acache=10))
    home = result.decode[-1]
    state = ClusterState(home={"s1": home})
    choice = scorer.choose(request(cached=900), state)
    assert choice.d == home and choice.on_home


def test_sticky_keeps_d_home_and_picks_the_nearest_p(cell):
    result = tile_placement(cell)
    sticky = pairing("sticky", cell, result, weights=Weights(hpath=10))
    home = result.decode[7]
    state = ClusterState(home={"s1": home}, d_queue={home: 50})
    choice = sticky.choose(request(cached=500), state)
    assert choice == Choice(choice.p, home, True)
    assert cell.node_hops(choice.p, home) == min(cell.node_hops(p, home) for p in result.prefill)
    joint = pairing("score", cell, result).choose(request(cached=500), state)
    assert joint.d != home                        # the plain score flees D_home's queue


def test_sticky_falls_back_when_d_home_is_full(small):
    result = tile_placement(small)
    sticky = pairing("sticky", small, result)
    home = result.decode[0]
    state = ClusterState(home={"s1": home}, d_memory={home: 1.0})
    choice = sticky.choose(request(cached=500), state)
    assert choice.d != home and not choice.on_home
    state.record(request(cached=500), choice)
    assert state.home["s1"] == choice.d


def test_a_cold_request_is_never_on_home(small):
    result = tile_placement(small)
    state = ClusterState(home={"s1": result.decode[0]})
    assert not FixedPairs(result).choose(request(), state).on_home


def test_pairing_by_name(small):
    result = tile_placement(small)
    assert [pairing(n, small, result).name for n in ("fixed", "random", "score", "sticky")] \
        == ["fixed", "random", "score", "sticky"]
    with pytest.raises(PlacementError, match="unknown pairing"):
        pairing("greedy", small, result)
