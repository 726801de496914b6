"""ZCube(n, k) for any k: counts against the recursion's formulas, routing, paths, cell table."""

import pytest

from topologies import catalog, registry, routing, zcube
from topologies.counts import measure
from topologies.fabric import FabricError

SHAPES = [(4, 2), (4, 3), (3, 4), (8, 3), (2, 5), (3, 3), (5, 1)]


def formula(n, k):
    """The recursion ZCube(n, 1) = 1 switch + n GPUs, ZCube(n, k+1) = n x ZCube(n, k) + n^k."""
    return {"gpus": n ** k, "per_layer": n ** (k - 1), "layers": k, "nic_ports": k * n ** k,
            "ports": [n * (1 + (layer > 0) + (layer < k - 1)) for layer in range(k)],
            "gpu_links": k * n ** k, "switch_links": (k - 1) * n ** k, "diameter": k}


def recursion(n, k):
    """(GPUs, switches) by the recursion itself, not by the closed form."""
    gpus, switches = n, 1
    for level in range(1, k):
        gpus, switches = n * gpus, n * switches + n ** level
    return gpus, switches


@pytest.mark.parametrize("n,k", SHAPES)
def test_analytic_counts_follow_the_formulas(n, k):
    want = formula(n, k)
    counts = zcube.counts(n=n, k=k)
    assert (counts.gpus, counts.total_switches) == recursion(n, k)
    assert counts.gpus == want["gpus"] and counts.nic_ports == want["nic_ports"]
    assert list(counts.switches.values()) == [want["per_layer"]] * want["layers"]
    assert [ports for ports, _ in counts.switch_ports.values()] == want["ports"]
    assert counts.total_cables == want["gpu_links"] + want["switch_links"]
    assert counts.diameter == want["diameter"]
    if k > 2:       # the text's asymmetry: end layers 2n ports, middle layers 3n
        assert want["ports"][0] == want["ports"][-1] == 2 * n
        assert set(want["ports"][1:-1]) == {3 * n}


@pytest.mark.parametrize("n,k", [s for s in SHAPES if s != (8, 3)])
def test_built_graph_measures_as_the_counts(n, k):
    fabric = registry.build(f"zcube,n={n},k={k}")
    measured = measure(fabric, half=zcube.bisection_half(fabric))
    counts = zcube.counts(n=n, k=k)
    for key in ("gpus", "nic_ports", "switches", "switch_ports", "cables", "optical_modules",
                "diameter"):
        assert getattr(measured, key) == getattr(counts, key), key
    if counts.bisection_gbps is not None:
        assert measured.bisection_gbps == counts.bisection_gbps
    else:
        assert n % 2 and k > 2 and "odd n" in counts.notes[0]
    want = formula(n, k)
    degrees = {}
    for switch in fabric.eps_switches:
        data = fabric.graph.nodes[switch]
        assert fabric.graph.degree(switch) == data["radix"]     # every port is wired
        degrees.setdefault(data["layer"], set()).add(data["radix"])
    assert [degrees[layer] for layer in sorted(degrees)] == [{p} for p in want["ports"]]


def test_large_shape_counts_without_building():
    counts = catalog.analytic_counts("zcube", n=8, k=3)
    assert counts.gpus == 512 and counts.switches == {"zcube-a": 64, "zcube-b": 64, "zcube-c": 64}
    assert counts.switch_ports["zcube-b"] == (24, 200.0)
    assert counts.cables == {200.0: 3 * 512 + 2 * 512}


def test_k2_is_the_deployed_zcube_128():
    counts = zcube.counts(n=128)
    assert counts == zcube.counts(n=128, k=2)
    assert counts.gpus == 16384 and counts.total_switches == 256
    assert counts.cables == {200.0: 49152}
    assert "k" not in registry.build("zcube,n=3").params         # same JSON as before k existed
    assert registry.build("zcube,n=3,k=3").params["k"] == 3


def test_spec_string_and_clear_errors():
    assert registry.parameters("zcube")["k"] == 2
    with pytest.raises(FabricError, match=r"zcube: k \(switch layers\) must be in 1\.\.26, got 0"):
        registry.build("zcube,n=4,k=0")
    with pytest.raises(FabricError, match="k='three' is not a int"):
        registry.build("zcube,n=4,k=three")
    with pytest.raises(FabricError, match="n must be >= 2"):
        zcube.counts(n=1, k=3)
    # A GPU count's rule stays ZCube(n, 2): its message says how to ask for k.
    assert registry.spec_at("zcube", 4096) == "zcube,n=64"
    with pytest.raises(FabricError, match="zcube,n=32,k=3"):
        registry.spec_at("zcube", 32768)


def gpu_hosts(fabric):
    hosts = {}
    for host in fabric.hosts:
        data = fabric.graph.nodes[host]
        hosts[data["gpu"], data["nic_port"]] = host
    return hosts


def digits(gpu, n, k):
    return [gpu // n ** layer % n for layer in range(k)]


@pytest.mark.parametrize("n,k,src,dst", [
    (4, 3, 0, 63),      # every digit differs: k switches
    (4, 3, 0, 1),       # digit 0 only: one switch (layer A)
    (4, 3, 0, 16),      # digit 2 only: one switch (layer C)
    (4, 3, 5, 9),       # digit 1 only: one switch (layer B)
    (4, 3, 1, 17),      # digit 2 only, source not at index 0
    (3, 4, 0, 80),      # 4 digits differ: 4 switches
    (3, 4, 1, 29),      # digits 0 and 3 differ: layers A..D, 4 switches
    (3, 4, 3, 15),      # digits 1 and 2: layers B, C
])
def test_shortest_paths_cross_one_switch_per_layer_between_differing_digits(n, k, src, dst):
    fabric = zcube.build(n=n, k=k)
    logical, hosts = fabric.logical_graph(), gpu_hosts(fabric)
    differ = [layer for layer, (a, b) in enumerate(zip(digits(src, n, k), digits(dst, n, k)))
              if a != b]
    best = min(len(path) - 2
               for p in range(k) for q in range(k)
               for path in routing.shortest_paths(logical, hosts[src, p], hosts[dst, q])[:1])
    assert best == differ[-1] - differ[0] + 1
    # Both of zcube.paths are the unique shortest path between their end hosts.
    for path in zcube.paths(fabric, src, dst):
        assert routing.shortest_paths(logical, path[0], path[-1]) == [path]
        layers = [fabric.graph.nodes[node]["layer"] for node in path[1:-1]]
        assert all(abs(ord(a) - ord(b)) == 1 for a, b in zip(layers, layers[1:]))


def test_k3_paths_climb_and_descend_and_select_path_splits_by_rank():
    fabric = zcube.build(n=4, k=3)
    up, down = zcube.paths(fabric, 0, 63)
    nodes = fabric.graph.nodes
    assert [nodes[x]["layer"] for x in up[1:-1]] == ["A", "B", "C"]
    assert [nodes[x]["layer"] for x in down[1:-1]] == ["C", "B", "A"]
    assert (nodes[up[0]]["nic_port"], nodes[up[-1]]["nic_port"]) == (0, 2)
    assert (nodes[down[0]]["nic_port"], nodes[down[-1]]["nic_port"]) == (2, 0)
    assert set(up[1:-1]).isdisjoint(down[1:-1])
    assert zcube.select_path(fabric, 0, 63, tp_rank=2) == up
    assert zcube.select_path(fabric, 0, 63, tp_rank=3) == down
    with pytest.raises(FabricError, match=r"no GPU 64 in ZCube\(4, 3\) \(GPUs 0\.\.63\)"):
        zcube.paths(fabric, 0, 64)
    same = zcube.paths(fabric, 5, 5)            # one switch each, as for k = 2
    assert [len(path) for path in same] == [3, 3] and same[0][0] == same[0][-1]


def test_port_plan_for_k3():
    n = 3
    fabric = zcube.build(n=n, k=3)
    middle = next(s for s in fabric.eps_switches if fabric.graph.nodes[s]["layer"] == "B")
    ports = fabric.ports_of(middle)
    kinds = [fabric.graph.nodes[ports[p][0]].get("layer", "gpu") for p in range(1, 3 * n + 1)]
    assert kinds == ["gpu"] * n + ["A"] * n + ["C"] * n


# ------------------------------------------------------------------ cell table
@pytest.mark.parametrize("gpus", [1024, 4096, 16384])
def test_cell_table_reproduces_the_text(gpus):
    row = next(r for r in zcube.cell_table() if r["gpus"] == gpus)
    n = int(gpus ** 0.5)
    assert (row["nodes"], row["balanced_k"], row["ports_per_switch"], row["switches"]) == \
        (gpus // 8, n, 2 * n, 2 * n)
    assert (row["p_nodes"], row["d_nodes"]) == (row["text_p_nodes"], row["text_d_nodes"])
    assert row["p_nodes"] * 3 == row["d_nodes"] * 5             # 3:2 in eighths is 5:3
    assert round(row["roft_gpus"]) == row["text_roft_gpus"]
    assert row["zcube_gpus_for_roft"] == pytest.approx(gpus / 1.15)


def test_cell_table_other_ratio_and_errors():
    (row,) = zcube.cell_table([1024], pd_ratio=1.0)
    assert (row["p_nodes"], row["d_nodes"]) == (64, 64)
    assert "text_p_nodes" not in zcube.cell_row(256)
    with pytest.raises(FabricError, match="blocks=5 must divide"):
        zcube.cell_row(1024, blocks=5)
