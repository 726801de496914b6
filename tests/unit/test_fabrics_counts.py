"""Fabric builders: graph counts equal analytic counts, and both equal the texts' figures."""

from collections import Counter

import pytest

from topologies import catalog, fattree, fattree_os, railfly, registry, zcube
from topologies.counts import measure
from topologies.fabric import EPS, OCS, FabricError

# (registry name, builder parameters): the emulation defaults plus other shapes,
# including three-tier trees, partial leaves and odd counts.
SMALL = [
    ("clos", {}), ("clos", {"gpus": 16, "radix": 4}), ("clos", {"gpus": 100, "radix": 8}),
    ("fattree-os", {}), ("fattree-os", {"gpus": 96, "radix": 8}),
    ("fattree-os", {"gpus": 12, "radix": 4}),
    ("fattree-os-edge", {"gpus": 64, "radix": 8, "tiers": 3}),
    ("roft", {}), ("roft", {"gpus": 16, "gpus_per_server": 2, "radix": 4}),
    ("roft", {"gpus": 64, "gpus_per_server": 4, "radix": 8, "tiers": 3}),
    ("rail-only", {}), ("rail-only", {"gpus": 32, "gpus_per_server": 2, "radix": 4}),
    ("rail-only", {"gpus": 12, "gpus_per_server": 2, "radix": 4}),
    ("hpn", {}), ("hpn", {"gpus": 48, "gpus_per_server": 4, "radix": 8}),
    ("hpn", {"gpus": 40, "gpus_per_server": 2, "radix": 8}),
    ("sip-ocs", {}), ("sip-ocs", {"gpus": 32, "ports_per_gpu": 3}),
    ("sip-ocs", {"gpus": 64, "ports_per_gpu": 6}),
    ("rfabric", {}), ("rfabric", {"pods": 4, "train_pods": 2}),
    ("rfabric", {"pods": 4, "train_pods": 2, "circuits": "isolated"}),
    ("rfabric", {"pods": 6, "train_pods": 3, "servers_per_pod": 6, "radix": 12, "core_uplinks": 2}),
    ("rfabric", {"pods": 3, "train_pods": 1, "servers_per_pod": 8}),       # a PoD is cut
    ("zcube", {}), ("zcube", {"n": 3}), ("zcube", {"n": 6}), ("zcube", {"n": 4, "k": 3}),
    ("zcube", {"n": 2, "k": 4}),
    ("railfly", {}), ("railfly", {"rails": 8, "servers": 3}),
    ("railfly", {"rails": 2, "servers": 5, "mesh_links": 2}),
    ("rail-fabric", {}), ("rail-fabric", {"switches": 10, "d_switches": 0, "fast_lanes": 2,
                                          "degree": 3}),
    ("rail-fabric", {"switches": 12, "downlinks": 4, "degree": 3, "fast_lanes": 2,
                     "d_switches": 4, "d_downlinks": 3, "d_degree": 4}),
    ("rotor", {}), ("rotor", {"tors": 6, "hosts_per_tor": 2}), ("rotor", {"tors": 6, "rotors": 2}),
    ("rotor", {"tors": 4, "rotors": 1, "hosts_per_tor": 3}), ("rotor", {"tors": 8, "hosts_per_tor": 9}),
    ("rotor", {"tors": 16, "hosts_per_tor": 4, "gbps": 200.0}), ("rotor", {"tors": 10, "rotors": 5}),
]


@pytest.mark.parametrize("name,params", SMALL)
def test_graph_counts_equal_analytic_counts(name, params):
    fabric = registry.build(name, **params)
    assert catalog.measure_fabric(fabric) == catalog.analytic_counts(name, **params)


@pytest.mark.parametrize("name,params", SMALL)
def test_fabric_is_well_formed(name, params):
    fabric = registry.build(name, **params)
    graph = fabric.graph
    dpids = [d["dpid"] for _, d in graph.nodes(data=True) if d["kind"] != "host"]
    assert all(dpids) and len(set(dpids)) == len(dpids)
    for node, data in graph.nodes(data=True):
        ports = sorted(fabric.ports_of(node))
        assert ports == list(range(1, len(ports) + 1)), f"{node}: ports {ports}"
        if data["kind"] == EPS:
            load = sum(d["gbps"] for _, _, d in graph.edges(node, data=True))
            assert load <= data["radix"] * data["port_gbps"], f"{node} wired beyond its capacity"
        if data["kind"] == OCS:
            assert len(ports) <= data["radix"]
    gpus = Counter(d["gpu"] for _, d in graph.nodes(data=True) if d["kind"] == "host")
    assert sorted(gpus) == list(range(len(gpus)))


# ------------------------------------------------------------- fat-tree formulas
@pytest.mark.parametrize("k", range(4, 65, 2))
def test_nonblocking_clos_is_the_k_ary_fat_tree(k):
    counts = catalog.analytic_counts("clos", gpus=k ** 3 // 4, radix=k)
    assert counts.gpus == k ** 3 // 4
    assert counts.switches == {"leaf": k * k // 2, "spine": k * k // 2, "core": k * k // 4}
    assert counts.total_switches == 5 * k * k // 4
    assert counts.cables == {400.0: 3 * k ** 3 // 4}
    assert counts.optical_modules == {400.0: 3 * k ** 3 // 2}
    assert counts.diameter == 5
    assert counts.bisection_gbps == k ** 3 / 8 * 400


@pytest.mark.parametrize("k", [4, 6, 8])
def test_k_ary_fattree_graph_matches_formulas_and_clos(k):
    counts = measure(fattree.build(k))
    assert counts.switches == {"core": k * k // 4, "agg": k * k // 2, "edge": k * k // 2}
    assert counts.total_cables == 3 * k ** 3 // 4
    assert counts.diameter == 5
    assert counts.bisection_gbps == k ** 3 / 8 * 400
    clos = catalog.analytic_counts("clos", gpus=k ** 3 // 4, radix=k)
    assert (clos.total_switches, clos.cables) == (counts.total_switches, counts.cables)


def test_fattree_os_is_three_to_one_at_the_top_tier():
    shape, leaf_down = fattree_os.layout(16384, 64, 3.0, "core", 0)
    assert (shape.tiers, leaf_down, shape.leaf_up) == (3, 32, 32)   # non-blocking leaves
    assert (shape.spine_down, shape.spine_up) == (48, 16)            # 3:1 spines
    # Core-facing bandwidth is a third of the GPUs' (a little more: the last pod is partial).
    assert shape.spines * shape.spine_up / 16384 == pytest.approx(1 / 3, abs=0.02)
    edge = fattree_os.layout(16384, 64, 3.0, "edge", 0)
    assert (edge[1], edge[0].leaf_up) == (48, 16)
    two_tier = fattree_os.counts(gpus=3072, radix=64)             # 64 leaves of 48 GPUs
    assert two_tier.switches == {"leaf": 64, "spine": 16}
    assert two_tier.bisection_gbps == 3072 / 2 * 400 / 3
    with pytest.raises(FabricError):
        fattree_os.counts(gpus=16, radix=8, at="middle")


# ------------------------------------------------------------- the texts' figures
@pytest.mark.parametrize("gpus,switches,ports", [(1024, 64, 64), (4096, 128, 128),
                                                 (16384, 256, 256)])
def test_zcube_cell_table(gpus, switches, ports):
    counts = catalog.counts_at_scale("zcube", gpus, 0)
    assert counts.gpus == gpus
    assert counts.total_switches == switches
    assert set(counts.switch_ports.values()) == {(ports, 200.0)}
    assert counts.diameter == 2
    assert zcube.cell(gpus)["switches"] == switches


def test_zcube_rejects_a_non_square_cell():
    with pytest.raises(FabricError):
        zcube.cell(32768)


def test_railfly_mesh_and_scale_table():
    assert railfly.counts(rails=8, servers=4).switches == {"rail": 8}
    assert railfly.mesh_links_between(8) == 28
    mesh = measure(railfly.build(rails=8, servers=2), with_bisection=False)
    assert mesh.total_cables - mesh.gpus == 28
    for servers, gpus, ports in [(121, 968, 128), (569, 4552, 576), (761, 6088, 768)]:
        counts = railfly.counts(rails=8, servers=servers)
        assert counts.gpus == gpus
        assert counts.switch_ports["rail"][0] == ports
        assert counts.total_cables == gpus + 28


# 16,384-GPU comparison, ZCube Table 6 (002 text).
TABLE6 = {"roft": (640, {400.0: 49152}), "rail-only": (384, {400.0: 32768}),
          "hpn": (384, {400.0: 16384, 200.0: 32768}), "zcube": (256, {200.0: 49152})}


@pytest.mark.parametrize("name", sorted(TABLE6))
def test_table6_switch_and_cable_counts(name):
    counts = catalog.counts_at_scale(name, 16384, 128)
    switches, cables = TABLE6[name]
    assert counts.gpus == 16384
    assert counts.total_switches == switches
    assert counts.cables == cables


def test_rfabric_figure5_pod_and_ocs_ports():
    counts = catalog.counts_at_scale("rfabric", 4096, 64)
    assert counts.gpus == 4096
    assert counts.switches == {"tor": 4096 // 32}                  # 64-radix ToRs, 32 GPUs each
    assert counts.ocs == 4096 // 256 + 16                          # one agg OCS per PoD, 16 planes
    assert counts.ocs_ports == 4096                                # one per ToR uplink
    assert counts.optical_modules == {400.0: 2 * 4096 + 4096}


def test_rail_fabric_cell_ports_per_switch():
    counts = catalog.counts_at_scale("rail-fabric", 1024, 64)
    assert counts.gpus == 1024
    assert counts.total_switches == 64
    assert counts.switch_ports["p-switch"] == (32 + 8 + 8, 200.0)   # the text's 48-52
    assert counts.switch_ports["d-switch"][0] > counts.switch_ports["p-switch"][0]
