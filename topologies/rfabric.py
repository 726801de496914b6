"""RFabric: EPS ToRs, an aggregation OCS per PoD, core OCS across PoDs; Train and Gen PoDs.

RFabric text (000), Figure 4 (architecture) and Figure 5 (a PoD of 32
servers x 8 NICs on 64-radix EPS ToRs; "multiple OCS devices are represented
as monolithic blocks at the aggregation and core layers")::

      core OCS plane 0 .. c-1    [======== one block per core uplink index ========]
                                    |          |                 |          |
      agg OCS (one per PoD)      [== PoD 0 ==]                [== PoD P-1 ==]
                                  |  |    |  |                 |  |    |  |
      ToRs (EPS, radix R)        tor0 ... torT-1              tor0 ... torT-1
      R/2 down: racks of servers  ||||     ||||                ||||     ||||
      R/2 up:  a to the PoD's agg OCS, c to the core planes
      PoDs 0..train_pods-1 are Train PoDs, the rest Gen PoDs (``pod_role``)

ToR t of PoD p: uplink u < a lands on its agg OCS at port t*a + u + 1; core
uplink u lands on core plane u at port p*T + t + 1 (`agg_port`, `core_port`).

Where the model departs from the text: RFabric cascades aggregation and core
OCS, so any ToR uplink could reach the core.  `Fabric.logical_graph` does
not model a circuit that lands on another OCS, so here each ToR splits its
uplinks: ``core_uplinks`` (c, default half) go to the core planes, the rest
to the PoD's agg OCS.  Cost is unchanged (one OCS port and one transceiver
per uplink either way); what is lost is moving uplinks between intra- and
inter-PoD use, so inter-PoD bandwidth is at most c/(R/2) of the ToR uplinks.

Named circuit sets (`circuit_set`): ``mesh`` (default; agg uplink u pairs the
PoD's ToRs by round u of a round-robin tournament, core plane u pairs PoDs by
round u, ToR t to ToR t: Figure 5(a,b), a high-bisection mesh),
``isolated`` (Figure 5(c): agg meshes as before; Train PoDs meshed on core
planes 0..c-2; plane c-1 gives each Gen PoD one circuit, 0.4 Tb/s at 400G, to
a Train ToR for response streaming), ``none``.

Parameters: ``pods``, ``train_pods``, ``servers_per_pod``, ``gpus_per_server``,
``radix`` (ToR ports; R/2 GPU downlinks), ``core_uplinks`` (0 = half the
uplinks), ``gbps``, ``technology`` (OCS preset), ``circuits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import networkx as nx

from topologies.counts import FabricCounts, cable_modules, graph_diameter
from topologies.fabric import (TEXT_GPUS_PER_SERVER, Circuit, Fabric, FabricError,
                               normalize_circuit)

CIRCUIT_SETS = ("mesh", "isolated", "none")


@dataclass(frozen=True)
class Shape:
    pods: int
    train_pods: int
    tors: int           # ToRs per PoD (T)
    per_tor: int        # GPUs per ToR (R/2)
    agg: int            # agg uplinks per ToR (a)
    core: int           # core uplinks per ToR (c)


def layout(pods: int, train_pods: int, servers_per_pod: int, gpus_per_server: int,
           radix: int, core_uplinks: int) -> Shape:
    per_tor = radix // 2
    if gpus_per_server < 1:     # 0 divided by zero below
        raise FabricError(f"rfabric: gpus_per_server must be >= 1, got {gpus_per_server}")
    if radix < 4 or radix % 2 or per_tor % gpus_per_server:
        raise FabricError(f"rfabric: radix/2 = {per_tor} GPU ports must hold whole servers of "
                          f"{gpus_per_server} GPUs (and radix >= 4 even)")
    if pods < 1 or not 0 <= train_pods <= pods:
        raise FabricError(f"rfabric: need pods >= 1 and 0 <= train_pods <= pods, "
                          f"got {pods}, {train_pods}")
    gpus_per_pod = servers_per_pod * gpus_per_server
    if gpus_per_pod < per_tor or gpus_per_pod % per_tor:
        raise FabricError(f"rfabric: a PoD's {gpus_per_pod} GPUs must fill whole ToRs of {per_tor}")
    core = core_uplinks or per_tor // 2
    if not 1 <= core < per_tor:
        raise FabricError(f"rfabric: core_uplinks must be in 1..{per_tor - 1}, got {core}")
    return Shape(pods, train_pods, gpus_per_pod // per_tor, per_tor, per_tor - core, core)


def agg_port(shape: Shape, tor: int, uplink: int) -> int:
    return tor * shape.agg + uplink + 1


def agg_tor(shape: Shape, port: int) -> int:
    """The ToR (index in its PoD) wired to an agg OCS's ``port`` (`agg_port` inverted)."""
    return (port - 1) // shape.agg


def core_port(shape: Shape, pod: int, tor: int) -> int:
    return pod * shape.tors + tor + 1


def core_tor(shape: Shape, port: int) -> Tuple[int, int]:
    """(PoD, ToR) wired to a core plane's ``port`` (`core_port` inverted)."""
    return divmod(port - 1, shape.tors)


def build(pods: int = 2, train_pods: int = 1, servers_per_pod: int = 4, gpus_per_server: int = 2,
          radix: int = 8, core_uplinks: int = 0, gbps: float = 400.0, technology: str = "mems",
          circuits: str = "mesh") -> Fabric:
    shape = layout(pods, train_pods, servers_per_pod, gpus_per_server, radix, core_uplinks)
    fabric = Fabric("rfabric", params={
        "pods": pods, "train_pods": train_pods, "servers_per_pod": servers_per_pod,
        "gpus_per_server": gpus_per_server, "radix": radix, "core_uplinks": shape.core,
        "gbps": gbps, "technology": technology})
    core = [fabric.add_ocs(radix=pods * shape.tors, technology=technology, role="core-ocs",
                           plane=u) for u in range(shape.core)]
    gpu = 0
    for pod in range(pods):
        role = "train" if pod < train_pods else "gen"
        agg = fabric.add_ocs(radix=shape.tors * shape.agg, technology=technology,
                             role="agg-ocs", pod=pod, pod_role=role)
        for t in range(shape.tors):
            tor = fabric.add_switch("tor", pod=pod, pod_role=role, index=t, radix=radix,
                                    port_gbps=gbps)
            for _ in range(shape.per_tor):
                host = fabric.add_host("gpu", gpu=gpu, pod=pod, pod_role=role,
                                       server=gpu // gpus_per_server, rail=gpu % gpus_per_server)
                fabric.add_link(host, tor, gbps)
                gpu += 1
            for _ in range(shape.agg):
                fabric.add_link(tor, agg, gbps, medium="ocs")
            for plane in core:
                fabric.add_link(tor, plane, gbps, medium="ocs")
    for ocs, lit in circuit_set(fabric, circuits).items():
        fabric.set_circuits(ocs, lit)
    return fabric


def shape_of(fabric: Fabric) -> Shape:
    p = fabric.params
    return layout(p["pods"], p["train_pods"], p["servers_per_pod"], p["gpus_per_server"],
                  p["radix"], p["core_uplinks"])


def round_robin(count: int, round_index: int) -> List[Tuple[int, int]]:
    """Round `round_index` of a round-robin tournament on `count` players
    (circle method; with an odd count one player sits out)."""
    if count < 2:
        return []
    players = count if count % 2 == 0 else count + 1
    r = round_index % (players - 1)
    ring = [(r + i) % (players - 1) for i in range(players - 1)] + [players - 1]
    pairs = [(ring[i], ring[-1 - i]) for i in range(players // 2)]
    return [(a, b) for a, b in pairs if a < count and b < count]


def _pairs(shape: Shape, name: str):
    """(agg pairs per uplink, core pairs per plane) as ToR-index / PoD-index pairs."""
    if name not in CIRCUIT_SETS:
        raise FabricError(f"rfabric: circuit set {name!r} not one of {CIRCUIT_SETS}")
    if name == "none":
        return [[] for _ in range(shape.agg)], [[] for _ in range(shape.core)]
    agg = [round_robin(shape.tors, u) for u in range(shape.agg)]
    if name == "mesh":
        core = [[((p, t), (q, t)) for p, q in round_robin(shape.pods, u) for t in range(shape.tors)]
                for u in range(shape.core)]
        return agg, core
    if shape.core < 2:
        raise FabricError("rfabric: 'isolated' needs core_uplinks >= 2 (one plane for Gen PoDs)")
    core = [[((p, t), (q, t)) for p, q in round_robin(shape.train_pods, u)
             for t in range(shape.tors)] for u in range(shape.core - 1)]
    train_tors = [(p, t) for p in range(shape.train_pods) for t in range(shape.tors)]
    gen_pods = range(shape.train_pods, shape.pods)
    if len(gen_pods) > len(train_tors):
        raise FabricError(f"rfabric: {len(gen_pods)} Gen PoDs but only {len(train_tors)} Train "
                          "ToRs to stream responses to")
    core.append([((g, k % shape.tors), train_tors[k]) for k, g in enumerate(gen_pods)])
    return agg, core


def circuit_set(fabric: Fabric, name: str) -> Dict[str, Set[Circuit]]:
    """OCS name -> circuits (OCS port pairs) of a named circuit set."""
    shape = shape_of(fabric)
    agg_pairs, core_pairs = _pairs(shape, name)
    result = {}
    for ocs in fabric.ocs_switches:
        data = fabric.graph.nodes[ocs]
        if data["role"] == "agg-ocs":
            result[ocs] = {normalize_circuit(agg_port(shape, x, u), agg_port(shape, y, u))
                           for u, pairs in enumerate(agg_pairs) for x, y in pairs}
        else:
            result[ocs] = {normalize_circuit(core_port(shape, *a), core_port(shape, *b))
                           for a, b in core_pairs[data["plane"]]}
    return result


def _tor_diameter(shape: Shape, name: str) -> int:
    """Largest ToR-to-ToR circuit distance over the named circuits (-1: cut off).
    ``mesh`` is a product of the PoD graph and the in-PoD graph, so distances add."""
    agg_pairs, core_pairs = _pairs(shape, name)
    if name == "mesh":
        pod_edges = [(a[0], b[0]) for plane in core_pairs for a, b in plane]
        in_pod = [pair for pairs in agg_pairs for pair in pairs]
        parts = [_graph_diameter(shape.pods, pod_edges), _graph_diameter(shape.tors, in_pod)]
        return -1 if -1 in parts else sum(parts)
    index = {(p, t): p * shape.tors + t for p in range(shape.pods) for t in range(shape.tors)}
    edges = [(index[p, x], index[p, y]) for pairs in agg_pairs for x, y in pairs
             for p in range(shape.pods)]
    edges += [(index[a], index[b]) for plane in core_pairs for a, b in plane]
    return _graph_diameter(shape.pods * shape.tors, edges)


def _graph_diameter(count: int, edges) -> int:
    found = graph_diameter(count, edges)
    return -1 if found is None else found


def counts(pods: int = 2, train_pods: int = 1, servers_per_pod: int = 4, gpus_per_server: int = 2,
           radix: int = 8, core_uplinks: int = 0, gbps: float = 400.0, technology: str = "mems",
           circuits: str = "mesh") -> FabricCounts:
    shape = layout(pods, train_pods, servers_per_pod, gpus_per_server, radix, core_uplinks)
    tors = pods * shape.tors
    gpus = tors * shape.per_tor
    uplinks = tors * (shape.agg + shape.core)
    cables, modules = cable_modules({gbps: gpus}, {gbps: uplinks})
    hops = _tor_diameter(shape, circuits)
    result = FabricCounts(
        fabric="rfabric", gpus=gpus, nic_ports=gpus, switches={"tor": tors},
        switch_ports={"tor": (radix, gbps)}, cables=cables, optical_modules=modules,
        ocs=pods + shape.core, ocs_ports=uplinks, diameter=hops + 1 if hops >= 0 else None)
    if pods % 2 == 0:
        # Whole PoDs on each side: only core uplinks cross (OCS set at best for the cut).
        result.bisection_gbps = min(gpus // 2, tors // 2 * shape.core) * gbps
    else:
        result.bisection_gbps = _split_pod_cut(shape, gbps)
    return result


def _split_pod_cut(shape: Shape, gbps: float) -> float:
    """Max-flow across the first half of the GPUs when a PoD is split: ToR-level
    network (hosts folded into their ToR, each OCS a non-blocking node)."""
    flow = nx.DiGraph()
    half = shape.pods * shape.tors * shape.per_tor // 2
    for pod in range(shape.pods):
        for t in range(shape.tors):
            tor = ("tor", pod, t)
            first = (pod * shape.tors + t) * shape.per_tor
            inside = max(0, min(half, first + shape.per_tor) - first)
            flow.add_edge("_source", tor, capacity=inside * gbps)
            flow.add_edge(tor, "_sink", capacity=(shape.per_tor - inside) * gbps)
            for ocs, links in [(("agg", pod), shape.agg)] + \
                    [(("core", u), 1) for u in range(shape.core)]:
                flow.add_edge(tor, ocs, capacity=links * gbps)
                flow.add_edge(ocs, tor, capacity=links * gbps)
    return float(nx.maximum_flow_value(flow, "_source", "_sink"))


def bisection_half(fabric: Fabric) -> List[int]:
    """First half of the PoDs: the cut through the core OCS layer."""
    shape = shape_of(fabric)
    return list(range(shape.pods * shape.tors * shape.per_tor // 2))


TEXT_SERVERS_PER_POD = 32      # Figure 5's PoD


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """Figure 5's PoDs of 32 servers (of ``gpus_per_server`` GPUs, the texts'
    eight by default) on radix-``radix`` switches, half of the PoDs for Train."""
    per_server = gpus_per_server or TEXT_GPUS_PER_SERVER
    pods = max(1, gpus // (TEXT_SERVERS_PER_POD * per_server))
    return {"pods": pods, "train_pods": pods // 2, "servers_per_pod": TEXT_SERVERS_PER_POD,
            "gpus_per_server": per_server, "radix": radix}
