"""Rail-Fabric: a sparse expander of switches plus KV fast-lane links; D-heavy switches.

Section 10 of the 002 text ("Three-Layer Capability" and the 1024-GPU cell:
64 switches, each with 32 GPU/NIC downlinks, 8 expander links and 8-12 KV
fast-lane links, against ZCube's 32 + 32; the D-centric variant gives
D-heavy switches 24-28 downlinks and 12-16 expander links)::

      P switches (expander degree d)          D-heavy switches (degree d_D)
      sw0 ------ sw1 ------ sw2 ...  ------   swS-2 ------ swS-1
       |  \\       |        /  |                 ||            ||     ---- expander link
       |   `------+-------'   |                 ||            ||     ==== KV fast lane
       |==========|===========|=================##============##     (q per P switch,
      GPUs       GPUs        GPUs              GPUs          GPUs     all ending on D)
      GPU g: NIC port 0 on an even switch (filled in order), port 1 on an odd
      switch (round-robin), as ZCube's A and B layers: a sparse ZCube

Expander: a random simple graph with degree d on P switches and d_D on
D-heavy switches (`networkx.random_degree_sequence_graph`, seeded, retried
until expander plus fast lanes are connected).  Fast lanes: P switch i's lane
t goes to D switch (i*q + t) mod |D|; with no D-heavy switches they form a
random q-regular graph instead.  QoS isolation is the emulator's business:
each switch-switch edge carries ``lane`` ("expander" or "fast") and each GPU
edge ``lane="access"``.  Ports of one switch: its downlinks + expander +
fast-lane links (48-52 in the text's cell; see "The text's two
constructions" below).

The text's two constructions, and which one `params_at` builds:

* The 1024-GPU cell (section 10, "1024 GPU Cell Deployment"): 64 switches,
  *each* with 32 GPU/NIC downlinks, 8 expander links and 8-12 KV fast-lane
  links, 48-52 ports.  Lanes run P -> D, so a D-bearing switch ends more of
  them: at P:D = 3:2 the 38 P switches' q = 8 lanes (304) land on 26
  D-heavy switches, 11-12 each.  `params_at` builds this: d_degree = d = 8,
  d_downlinks = k = 32, so P switches have 32 + 8 + 8 = 48 ports and D-heavy
  switches 32 + 8 + 11..12 = 51..52 (`port_range`).
* The "Simplified Variant: D-centric Asymmetric Expander", which the text
  offers *instead of* fast lanes: P switches 32 downlinks + 8 expander (40),
  D-heavy switches 24-28 downlinks + 12-16 expander (40).  Spec:
  ``rail-fabric,switches=64,downlinks=32,degree=8,fast_lanes=0,d_switches=26,
  d_downlinks=28,d_degree=12`` (`D_CENTRIC`).

Before this was written down `params_at` mixed the two: D-heavy switches got
the variant's extra expander links (the builder's default d_degree = d +
d/2 = 12) on top of the cell's 32 downlinks and 11-12 lanes, 55-56 ports,
outside the text's 48-52.  The builder's default d_degree is unchanged (the
small emulated builds use 3 against 2).

How it is modelled: one host per NIC port, as in ``zcube``; D-heavy switches
are the last ``d_switches`` (alternating even/odd, so both NIC layers get
them).  Unlike the other builders the bisection here is the max-flow across
the first half of the GPUs, not a proven worst cut: the min bisection of a
random expander is not computed.

Parameters: ``switches`` (S, even), ``downlinks`` (k), ``degree`` (d),
``fast_lanes`` (q), ``d_switches``, ``d_downlinks`` (0 = k), ``d_degree``
(0 = d + d/2), ``gbps``, ``seed``, ``gpus_per_server`` (GPU g is rank
g % gpus_per_server of server g // gpus_per_server; wiring does not change).

Emulation at a small GPU count: `small_params` (8 switches of 4 downlinks
at 16 GPUs, q = 3 fast lanes, a seed whose expander is connected on its own
and never parallels a fast lane, so a switch pair has at most one link).
`fast_lane_ports` finds the lanes again in a fabric read back from JSON,
which keeps no ``lane`` tags (the controller's copy), and
`without_fast_lanes` is the base fabric that destination routes should use,
leaving the lanes to pinned KV flows (`traffic.fastlane`, `controllers.pins`).
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

import networkx as nx
import numpy as np

from topologies.counts import FabricCounts, cable_modules
from topologies.fabric import EPS, TEXT_GPUS_PER_SERVER, Fabric, FabricError

ATTEMPTS = 50


def _degrees(switches, downlinks, degree, d_switches, d_downlinks, d_degree):
    if switches < 2 or switches % 2 or not 0 <= d_switches <= switches:
        raise FabricError(f"rail-fabric: need an even switches >= 2 and 0 <= d_switches <= "
                          f"switches, got {switches}, {d_switches}")
    d_downlinks = d_downlinks or downlinks
    d_degree = d_degree or degree + degree // 2
    heavy = set(range(switches - d_switches, switches))
    down = [d_downlinks if s in heavy else downlinks for s in range(switches)]
    expander = [d_degree if s in heavy else degree for s in range(switches)]
    if sum(expander) % 2:
        raise FabricError(f"rail-fabric: expander degrees sum to {sum(expander)}, odd; change "
                          "degree, d_degree or d_switches")
    return heavy, down, expander


def switch_links(switches: int = 8, degree: int = 2, fast_lanes: int = 1, d_switches: int = 2,
                 d_degree: int = 0, seed: int = 1, downlinks: int = 4,
                 d_downlinks: int = 0) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """(expander edges, fast-lane edges) between switch indices; deterministic in `seed`."""
    heavy, _, expander = _degrees(switches, downlinks, degree, d_switches, d_downlinks, d_degree)
    light = [s for s in range(switches) if s not in heavy]
    heavy = sorted(heavy)
    for attempt in range(ATTEMPTS):
        try:
            graph = nx.random_degree_sequence_graph(expander, seed=seed + attempt, tries=20)
        except (nx.NetworkXError, nx.NetworkXUnfeasible):
            continue
        if heavy:
            lanes = [(p, heavy[(i * fast_lanes + t) % len(heavy)])
                     for i, p in enumerate(light) for t in range(fast_lanes)]
        elif fast_lanes:
            try:
                lanes = list(nx.random_regular_graph(fast_lanes, switches,
                                                     seed=seed + attempt).edges())
            except nx.NetworkXError as exc:     # no such graph: no other seed makes one
                raise FabricError(f"rail-fabric: {fast_lanes} fast lanes on each of {switches} "
                                  f"switches: {exc}") from None
        else:
            lanes = []
        union = nx.MultiGraph(list(graph.edges()) + lanes)
        union.add_nodes_from(range(switches))
        if nx.is_connected(union):
            return sorted(graph.edges()), lanes
    raise FabricError(f"rail-fabric: no connected expander with degrees {expander} after "
                      f"{ATTEMPTS} seeds")


def placement(down: List[int]) -> List[Tuple[int, int]]:
    """(port-0 switch, port-1 switch) per GPU: even switches filled in order,
    odd switches round-robin, so a switch's GPUs spread over the other layer."""
    layer_a = [s for s in range(0, len(down), 2) for _ in range(down[s])]
    odd = list(range(1, len(down), 2))
    layer_b = [s for t in range(max(down)) for s in odd if t < down[s]]
    return list(zip(layer_a, layer_b))


def _tag(fabric: Fabric, u: str, v: str, port_u: int, lane: str) -> None:
    for data in fabric.graph[u][v].values():
        if data["ports"][u] == port_u:
            data["lane"] = lane


def build(switches: int = 8, downlinks: int = 4, degree: int = 2, fast_lanes: int = 1,
          d_switches: int = 2, d_downlinks: int = 0, d_degree: int = 0, gbps: float = 200.0,
          seed: int = 1, gpus_per_server: int = 8) -> Fabric:
    if gpus_per_server < 1:
        raise FabricError(f"rail-fabric: gpus_per_server must be >= 1, got {gpus_per_server}")
    if downlinks < 1:           # built a fabric of switches without one host
        raise FabricError(f"rail-fabric: downlinks must be >= 1, got {downlinks}")
    if fast_lanes < 0:          # was taken as none
        raise FabricError(f"rail-fabric: fast_lanes must be >= 0, got {fast_lanes}")
    heavy, down, _ = _degrees(switches, downlinks, degree, d_switches, d_downlinks, d_degree)
    expander, lanes = switch_links(switches, degree, fast_lanes, d_switches, d_degree, seed,
                                   downlinks, d_downlinks)
    radix = _radix(switches, down, expander, lanes)
    fabric = Fabric("rail-fabric", params={
        "switches": switches, "downlinks": downlinks, "degree": degree, "fast_lanes": fast_lanes,
        "d_switches": d_switches, "d_downlinks": d_downlinks, "d_degree": d_degree,
        "gbps": gbps, "seed": seed, "gpus_per_server": gpus_per_server})
    nodes = [fabric.add_switch("d-switch" if s in heavy else "p-switch", index=s,
                               layer="AB"[s % 2], radix=radix[s], port_gbps=gbps)
             for s in range(switches)]
    for gpu, pair in enumerate(placement(down)):
        for port, s in enumerate(pair):
            host = fabric.add_host("gpu", gpu=gpu, nic_port=port, server=gpu // gpus_per_server,
                                   rail=gpu % gpus_per_server)
            _tag(fabric, host, nodes[s], fabric.add_link(host, nodes[s], gbps)[0], "access")
    for lane, edges in (("expander", expander), ("fast", lanes)):
        for a, b in edges:
            _tag(fabric, nodes[a], nodes[b], fabric.add_link(nodes[a], nodes[b], gbps)[0], lane)
    return fabric


def _radix(switches, down, expander, lanes) -> List[int]:
    degree = Counter(s for edge in expander + lanes for s in edge)
    return [down[s] + degree[s] for s in range(switches)]


def counts(switches: int = 8, downlinks: int = 4, degree: int = 2, fast_lanes: int = 1,
           d_switches: int = 2, d_downlinks: int = 0, d_degree: int = 0, gbps: float = 200.0,
           seed: int = 1, gpus_per_server: int = 8) -> FabricCounts:
    heavy, down, _ = _degrees(switches, downlinks, degree, d_switches, d_downlinks, d_degree)
    expander, lanes = switch_links(switches, degree, fast_lanes, d_switches, d_degree, seed,
                                   downlinks, d_downlinks)
    pairs = placement(down)
    radix = _radix(switches, down, expander, lanes)
    roles: Dict[str, Tuple[int, float]] = {}
    for s in range(switches):
        role = "d-switch" if s in heavy else "p-switch"
        roles[role] = max(roles.get(role, (0, gbps)), (radix[s], gbps))
    cables, modules = cable_modules({gbps: 2 * len(pairs) + len(expander) + len(lanes)}, {})
    return FabricCounts(
        fabric="rail-fabric", gpus=len(pairs), nic_ports=2 * len(pairs),
        switches=dict(Counter("d-switch" if s in heavy else "p-switch" for s in range(switches))),
        switch_ports=roles, cables=cables, optical_modules=modules,
        diameter=_diameter(switches, expander + lanes, pairs),
        bisection_gbps=_half_flow(switches, expander + lanes, pairs, gbps),
        notes=["bisection: max-flow across the first half of the GPUs, an upper bound"])


def _diameter(switches: int, edges, pairs) -> int:
    graph = nx.Graph(edges)
    graph.add_nodes_from(range(switches))
    dist = np.full((switches, switches), 127, dtype=np.int8)    # 127: unreachable
    for source, lengths in nx.all_pairs_shortest_path_length(graph):
        for target, hops in lengths.items():
            dist[source, target] = hops
    sig = np.array(sorted(set(pairs)))
    a, b = sig[:, 0], sig[:, 1]
    worst = 0
    for start in range(0, len(sig), 512):
        # Distance from a block of GPUs to every switch, then to every GPU's nearer port.
        near = np.minimum(dist[a[start:start + 512]], dist[b[start:start + 512]])
        worst = max(worst, int(np.minimum(near[:, a], near[:, b]).max()))
    return worst + 1


def _half_flow(switches: int, edges, pairs, gbps: float) -> float:
    flow = nx.DiGraph()

    def add(x, y):
        capacity = flow.get_edge_data(x, y, {"capacity": 0.0})["capacity"]
        flow.add_edge(x, y, capacity=capacity + gbps)

    for a, b in edges:
        add(a, b)
        add(b, a)
    side = len(pairs) // 2
    for gpu, ports in enumerate(pairs):
        for s in ports:
            add(*(("_source", s) if gpu < side else (s, "_sink")))
    return float(nx.maximum_flow_value(flow, "_source", "_sink"))


def bisection_half(fabric: Fabric) -> List[int]:
    return list(range(len({d["gpu"] for _, d in fabric.graph.nodes(data=True) if "gpu" in d}) // 2))


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """A Rail-Fabric with ``gpus`` GPUs.  Small (emulated): `small_params`, with
    servers of ``gpus_per_server`` GPUs (eight by default).  Full scale: the
    text's cell, 32 downlinks per switch, two NIC ports per GPU, d = q = 8,
    two fifths of the switches D-heavy (P:D = 3:2); its ports are fixed by
    the cell, so ``radix`` does not apply."""
    if small:
        return small_params(gpus, gpus_per_server or TEXT_GPUS_PER_SERVER)
    switches = max(2, gpus * 2 // 32)
    d_switches = int(round(switches * 0.4 / 2)) * 2
    return {"switches": switches, "downlinks": 32, "degree": 8, "fast_lanes": 8,
            "d_switches": d_switches, "d_degree": 8}


#: The text's simplified D-centric variant of the 1024-GPU cell: no fast lanes,
#: D-heavy switches trade 4 downlinks for 4 more expander links (40 ports each).
D_CENTRIC = {"switches": 64, "downlinks": 32, "degree": 8, "fast_lanes": 0, "d_switches": 26,
             "d_downlinks": 28, "d_degree": 12}


def port_range(switches: int = 8, downlinks: int = 4, degree: int = 2, fast_lanes: int = 1,
               d_switches: int = 2, d_downlinks: int = 0, d_degree: int = 0, seed: int = 1,
               **_ignored) -> Dict[str, Tuple[int, int]]:
    """Role -> (fewest, most) ports of its switches (`counts` keeps the most):
    the text's cell gives {"p-switch": (48, 48), "d-switch": (51, 52)}."""
    heavy, down, _ = _degrees(switches, downlinks, degree, d_switches, d_downlinks, d_degree)
    expander, lanes = switch_links(switches, degree, fast_lanes, d_switches, d_degree, seed,
                                   downlinks, d_downlinks)
    result: Dict[str, Tuple[int, int]] = {}
    for s, ports in enumerate(_radix(switches, down, expander, lanes)):
        role = "d-switch" if s in heavy else "p-switch"
        low, high = result.get(role, (ports, ports))
        result[role] = (min(low, ports), max(high, ports))
    return result


# ------------------------------------------------------------------ lanes, small builds
def _fast_lane_ports_from_params(fabric: Fabric) -> List[Tuple[str, int, str, int]]:
    """The lanes of a fabric that lost its ``lane`` tags (read back from JSON).

    `build` wires host links, then the expander, then the lanes, so between
    two switches the expander links hold the lower port numbers.
    """
    names = [fabric.params[k] for k in ("switches", "degree", "fast_lanes", "d_switches",
                                        "d_degree", "seed", "downlinks", "d_downlinks")]
    expander, lanes = switch_links(*names)
    by_index = {data["index"]: node for node, data in fabric.graph.nodes(data=True)
                if data.get("kind") == EPS and "index" in data}
    result = []
    for pair in sorted({tuple(sorted(edge)) for edge in lanes}):
        a, b = by_index[pair[0]], by_index[pair[1]]
        wired = sorted((d["ports"][a], d["ports"][b]) for d in fabric.graph[a][b].values())
        skip = sum(1 for edge in expander if tuple(sorted(edge)) == pair)
        for pa, pb in wired[skip:]:
            result.append((a, pa, b, pb) if a < b else (b, pb, a, pa))
    return sorted(result)


def fast_lane_ports(fabric: Fabric) -> List[Tuple[str, int, str, int]]:
    """(switch, port, switch, port) of every KV fast-lane link, switch names in
    order (``s10`` before ``s8``), sorted.

    From the ``lane="fast"`` edge tags when the fabric has them, else (a
    fabric read back from JSON, as the controller gets it) from its
    parameters.  Empty for any other fabric.
    """
    if fabric.name != "rail-fabric":
        return []
    tagged = [(u, v, d) for u, v, d in fabric.graph.edges(data=True) if "lane" in d]
    if not tagged:
        return _fast_lane_ports_from_params(fabric)
    result = []
    for u, v, data in tagged:
        if data["lane"] == "fast":
            a, b = sorted((u, v))
            result.append((a, data["ports"][a], b, data["ports"][b]))
    return sorted(result)


SMALL_DOWNLINKS = 4
SMALL_FAST_LANES = (3, 2, 1)
SMALL_SEEDS = 200


def small_params(gpus: int, gpus_per_server: int = 8) -> dict:
    """Builder parameters of a small Rail-Fabric with ``gpus`` GPUs, for emulation.

    Switches of 4 GPU downlinks (two NIC ports per GPU: gpus / 2 switches),
    half of them D-heavy (expander degree 3 against 2), q fast lanes per P
    switch (3 when the D-heavy switches allow it without parallel lanes),
    and the first seed whose expander is connected on its own (the base
    fabric does not need the lanes) and shares no switch pair with a lane
    (a path of switch names then names its links).  16 GPUs give 8
    switches, 10 expander links and 12 fast lanes.
    """
    if gpus < 16 or gpus % 8:
        raise FabricError(f"rail-fabric: a small build needs a multiple of 8 GPUs, at least 16, "
                          f"got {gpus}")
    switches = gpus * 2 // SMALL_DOWNLINKS
    d_switches = switches // 2
    base = {"switches": switches, "downlinks": SMALL_DOWNLINKS, "degree": 2, "d_degree": 3,
            "d_switches": d_switches}
    for lanes in SMALL_FAST_LANES:
        if lanes > d_switches:
            continue
        for seed in range(1, SMALL_SEEDS + 1):
            try:
                expander, fast = switch_links(switches, 2, lanes, d_switches, 3, seed,
                                              SMALL_DOWNLINKS)
            except FabricError:
                continue
            pairs = [frozenset(edge) for edge in expander + fast]
            alone = nx.Graph(expander)
            alone.add_nodes_from(range(switches))
            if len(set(pairs)) == len(pairs) and nx.is_connected(alone):
                return dict(base, fast_lanes=lanes, seed=seed, gpus_per_server=gpus_per_server)
    raise FabricError(f"rail-fabric: no small build at {gpus} GPUs with a connected expander "
                      "and no parallel switch links")


def without_fast_lanes(fabric: Fabric, logical: nx.MultiGraph) -> nx.MultiGraph:
    """A copy of ``logical`` without the fast-lane links: the base (expander) fabric.

    Routing over it keeps destination routes off the lanes, which then carry
    only what is pinned onto them (`controllers.pins`).  Lanes are found by
    `fast_lane_ports`, so a fabric read back from JSON works too.
    """
    lanes = {(a, pa) for a, pa, _, _ in fast_lane_ports(fabric)}
    base = logical.copy()
    for u, v, key, data in list(base.edges(keys=True, data=True)):
        if any((node, data["ports"].get(node)) in lanes for node in (u, v)):
            base.remove_edge(u, v, key)
    return base
