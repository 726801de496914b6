"""The rotor fabric (RotorNet): its matchings, its wiring, its counts by formula."""

from collections import Counter
from itertools import combinations

import pytest

from topologies import catalog, registry, rotor
from topologies.fabric import HOST, OCS, FabricError, ScaleError


# ------------------------------------------------------------------ matchings
@pytest.mark.parametrize("n", range(2, 19, 2))
def test_matchings_are_a_one_factorisation_of_the_complete_graph(n):
    result = rotor.matchings(n)
    assert len(result) == n - 1
    for matching in result:
        ports = [t for pair in matching for t in pair]
        assert sorted(ports) == list(range(n)), f"not perfect: {matching}"
        assert all(a < b for a, b in matching) and matching == sorted(matching)
    pairs = Counter(pair for matching in result for pair in matching)
    assert set(pairs) == set(combinations(range(n), 2))
    assert set(pairs.values()) == {1}


def test_matchings_of_four_are_the_docstrings():
    assert rotor.matchings(4) == [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]


@pytest.mark.parametrize("n", [0, 3, 7, -2])
def test_matchings_need_an_even_count(n):
    with pytest.raises(FabricError, match=f"even n >= 2, got {n}"):
        rotor.matchings(n)


# ------------------------------------------------------------------ wiring
def test_build_follows_hybrids_order_and_names():
    fabric = registry.build("rotor")
    assert fabric.params == {"tors": 4, "hosts_per_tor": 1, "rotors": 3, "gbps": 400.0,
                             "technology": "rotornet"}
    assert fabric.ocs_switches == ["o1", "o2", "o3"]
    assert fabric.eps_switches == ["s1", "s2", "s3", "s4"]
    assert fabric.hosts == ["h1", "h2", "h3", "h4"]
    graph = fabric.graph
    assert [graph.nodes[n]["dpid"] for n in ("o1", "o2", "o3", "s1", "s4")] == [1, 2, 3, 4, 7]
    for t, tor in enumerate(fabric.eps_switches):
        assert (graph.nodes[tor]["role"], graph.nodes[tor]["server"]) == ("tor", t)
    assert {o: graph.nodes[o]["technology"] for o in fabric.ocs_switches} == \
        dict.fromkeys(fabric.ocs_switches, "rotornet")


@pytest.mark.parametrize("spec", ["rotor", "rotor,tors=6,hosts_per_tor=2",
                                  "rotor,tors=8,rotors=3,hosts_per_tor=3", "rotor,tors=16"])
def test_tor_t_lands_on_port_t_plus_1_of_every_rotor(spec):
    fabric = registry.build(spec)
    tors, per_tor = fabric.params["tors"], fabric.params["hosts_per_tor"]
    graph = fabric.graph
    for r, ocs in enumerate(fabric.ocs_switches):
        assert graph.nodes[ocs]["radix"] == tors and graph.nodes[ocs]["rotor"] == r
        wired = fabric.ports_of(ocs)
        assert sorted(wired) == list(range(1, tors + 1))
        for port, (tor, _) in wired.items():
            assert graph.nodes[tor]["server"] == port - 1 == rotor.tor_port(port - 1) - 1
        for edge in graph.edges(ocs, data=True):
            assert edge[2]["medium"] == "ocs"
    for tor in fabric.eps_switches:
        server = graph.nodes[tor]["server"]
        hosts = [peer for peer, _ in fabric.ports_of(tor).values() if fabric.kind(peer) == HOST]
        assert [graph.nodes[h]["rail"] for h in hosts] == list(range(per_tor))
        assert [graph.nodes[h]["gpu"] for h in hosts] == \
            list(range(server * per_tor, (server + 1) * per_tor))
        assert [p for p, (peer, _) in sorted(fabric.ports_of(tor).items())
                if fabric.kind(peer) == OCS] == list(range(per_tor + 1,
                                                           per_tor + fabric.params["rotors"] + 1))


@pytest.mark.parametrize("tors", [4, 6, 8, 16])
def test_initial_circuits_are_matching_r_on_rotor_r_and_join_every_pair(tors):
    fabric = registry.build(f"rotor,tors={tors}")
    for r, ocs in enumerate(fabric.ocs_switches):
        assert fabric.circuits[ocs] == {(a + 1, b + 1) for a, b in rotor.matchings(tors)[r]}
        assert fabric.circuits[ocs] == rotor.matching_circuits(tors, r)
    logical = fabric.logical_graph()
    tor_pairs = Counter(frozenset((u, v)) for u, v, d in logical.edges(data=True)
                        if d["medium"] == "circuit")
    assert len(tor_pairs) == tors * (tors - 1) // 2 and set(tor_pairs.values()) == {1}


@pytest.mark.parametrize("args, message", [
    ({"tors": 5}, "tors must be even and in 4..16, got 5"),
    ({"tors": 2}, "tors must be even and in 4..16, got 2"),
    ({"tors": 18}, "tors must be even and in 4..16, got 18"),
    ({"hosts_per_tor": 0}, "hosts_per_tor must be >= 1, got 0"),
    ({"rotors": 4}, r"rotors must be in 1..3 \(tors - 1: one per matching; 0 = 3\), got 4"),
    ({"rotors": -1}, "rotors must be in 1..3"),
])
def test_build_rejects_what_the_rotor_fabric_does_not_have(args, message):
    with pytest.raises(FabricError, match=f"^rotor: {message}"):
        rotor.build(**args)
    with pytest.raises(FabricError, match=f"^rotor: {message}"):
        rotor.counts(**args)


# ------------------------------------------------------------------ counts
# The graph against these formulas, and its wiring, for several shapes:
# tests/unit/test_fabrics_counts.py (SMALL).


@pytest.mark.parametrize("tors, per_tor, rotors", [(4, 1, 3), (6, 2, 0), (8, 9, 0), (6, 4, 2),
                                                   (16, 1, 15)])
def test_counts_formulas(tors, per_tor, rotors):
    counts = rotor.counts(tors=tors, hosts_per_tor=per_tor, rotors=rotors, gbps=400.0)
    rotors = rotors or tors - 1
    assert counts.gpus == counts.nic_ports == tors * per_tor
    assert counts.switches == {"tor": tors}
    assert counts.switch_ports == {"tor": (per_tor + rotors, 400.0)}
    assert counts.cables == {400.0: tors * per_tor + tors * rotors}
    assert counts.optical_modules == {400.0: 2 * tors * per_tor + tors * rotors}
    assert (counts.ocs, counts.ocs_ports) == (rotors, tors * rotors)
    assert counts.bisection_gbps == tors // 2 * min(per_tor, rotors) * 400.0
    if rotors == tors - 1:
        assert counts.diameter == 2                  # one circuit between any two ToRs


def test_diameter_over_fewer_rotors():
    assert rotor.counts(tors=4, rotors=1).diameter is None      # islands of two ToRs
    assert rotor.counts(tors=6, rotors=2).diameter == 4          # a ring of six: 3 hops
    assert rotor.counts(tors=4, rotors=2).diameter == 3          # a ring of four: 2 hops


# ------------------------------------------------------------------ registry
def test_registered_with_counts_cut_and_rule_but_not_a_fabric_of_the_texts():
    from topologies import report

    entry = registry.FABRICS["rotor"]
    assert entry.counts is rotor.counts and entry.params_at is rotor.params_at
    assert entry.bisection_half is rotor.bisection_half and not entry.transit_hosts
    assert "rotor" in catalog.names() and "rotor" not in report.SUMMARY_FABRICS
    assert registry.parameters("rotor") == {"tors": 4, "hosts_per_tor": 1, "rotors": 0,
                                            "gbps": 400.0, "technology": "rotornet"}
    assert rotor.bisection_half(registry.build("rotor,tors=6,hosts_per_tor=2")) == \
        list(range(6))


@pytest.mark.parametrize("gpus, options, spec", [
    (16, dict(small=True), "rotor,tors=16,hosts_per_tor=1"),
    (24, dict(small=True), "rotor,tors=12,hosts_per_tor=2"),
    (6, dict(small=True), "rotor,tors=6,hosts_per_tor=1"),
    (16, dict(small=True, gpus_per_server=2), "rotor,tors=8,hosts_per_tor=2"),
    (64, dict(radix=64), "rotor,tors=8,hosts_per_tor=8"),
    (128, dict(radix=128), "rotor,tors=16,hosts_per_tor=8"),
])
def test_spec_at(gpus, options, spec):
    assert registry.spec_at("rotor", gpus, **options) == spec
    assert len(registry.build_at("rotor", gpus, **options).hosts) == gpus


def test_a_gpu_count_without_a_rotor_build_says_why():
    with pytest.raises(ScaleError, match="^rotor: has no build with 1,024 GPUs in ToRs of 8: "
                                         "that is 128 ToRs, it takes an even 4..16"):
        registry.spec_at("rotor", 1024, radix=64)
    with pytest.raises(ScaleError, match="no even ToR count in 4..16 that divides 7 GPUs"):
        registry.spec_at("rotor", 7, small=True)
    with pytest.raises(ScaleError, match="that is 3 ToRs"):          # an odd ToR count
        registry.spec_at("rotor", 6, gpus_per_server=2)
