"""What a fabric is made of: `FabricCounts`, and how to measure it on a graph.

Every builder module has an analytic ``counts(**params)`` returning a
`FabricCounts`; `measure(fabric)` returns the same record from a built graph,
and the unit tests check that the two agree at small scale.  Definitions:

* ``gpus``: distinct ``gpu`` attributes of the hosts (a host is one NIC port;
  a GPU with two NIC ports is two hosts sharing a ``gpu``).
* ``switches``: packet switches per role (tier).  In-server switches
  (``nvswitch``) are not network equipment and are listed in ``in_server``.
* ``switch_ports``: role -> (radix, port Gb/s) of the switches of that role,
  the physical port count a buyer pays for, used or not.
* ``cables``: Gb/s -> number of physical links between boxes (GPU NIC to
  switch, switch to switch, anything to an OCS).  NVLink inside a server is
  not a cable.
* ``optical_modules``: Gb/s -> pluggable transceivers: two per cable between
  electrical ends, one per cable that lands on an OCS (the OCS is passive).
* ``ocs`` / ``ocs_ports``: OCS blocks and their wired ports.
* ``diameter``: the worst GPU pair's fewest forwarding elements on a path:
  packet switches and transit GPUs count one each; OCS circuits and in-server
  NVLink switches count zero (so ROFT is 5, ZCube(n, 2) 2 and ZCube(n, k) k,
  as the texts count hops).
  OCS fabrics are measured over their default circuits.
* ``bisection_gbps``: max-flow across the builder's worst balanced GPU cut
  (``bisection_half``), OCS treated as non-blocking nodes: the best any
  circuit configuration can give that cut.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

import networkx as nx

from topologies.fabric import EPS, HOST, OCS, Fabric

IN_SERVER_ROLES = frozenset({"nvswitch"})


@dataclass
class FabricCounts:
    fabric: str
    gpus: int
    nic_ports: int
    switches: Dict[str, int]
    switch_ports: Dict[str, Tuple[int, float]]
    cables: Dict[float, int]
    optical_modules: Dict[float, int]
    ocs: int = 0
    ocs_ports: int = 0
    in_server: int = 0
    diameter: Optional[int] = None
    bisection_gbps: Optional[float] = None
    notes: List[str] = field(default_factory=list, compare=False)

    @property
    def total_switches(self) -> int:
        return sum(self.switches.values())

    @property
    def total_cables(self) -> int:
        return sum(self.cables.values())

    def summary(self, label: Optional[str] = None) -> str:
        tiers = "+".join(f"{n} {role}" for role, n in self.switches.items())
        cables = " + ".join(f"{n:,} x {g:g}G" for g, n in sorted(self.cables.items(), reverse=True))
        ocs = f", {self.ocs} OCS / {self.ocs_ports:,} ports" if self.ocs else ""
        bisection = ("" if self.bisection_gbps is None
                     else f", bisection {self.bisection_gbps / 1000:,.1f} Tb/s")
        diameter = "" if self.diameter is None else f", diameter {self.diameter}"
        return (f"{label or self.fabric}: {self.gpus:,} GPUs, {self.total_switches:,} switches "
                f"({tiers}), cables {cables}{ocs}{diameter}{bisection}")


def cable_modules(cables_to_eps: Dict[float, int], cables_to_ocs: Dict[float, int]):
    """(cables, modules) by speed for cables between electrical ends and to an OCS."""
    cables, modules = Counter(), Counter()
    for gbps, n in cables_to_eps.items():
        cables[float(gbps)] += n
        modules[float(gbps)] += 2 * n
    for gbps, n in cables_to_ocs.items():
        cables[float(gbps)] += n
        modules[float(gbps)] += n
    return dict(cables), dict(modules)


# ---------------------------------------------------------------- measuring a graph
def gpu_of(fabric: Fabric, host: str) -> int:
    """A host's GPU id; hosts of older builders (no ``gpu``) are one GPU each."""
    data = fabric.graph.nodes[host]
    return data["gpu"] if "gpu" in data else data["index"] - 1


def gpu_hosts(fabric: Fabric) -> Dict[int, List[str]]:
    groups: Dict[int, List[str]] = defaultdict(list)
    for host in fabric.hosts:
        groups[gpu_of(fabric, host)].append(host)
    return dict(groups)


def _is_in_server(fabric: Fabric, node: str) -> bool:
    data = fabric.graph.nodes[node]
    return data["kind"] == EPS and data["role"] in IN_SERVER_ROLES


def measure(fabric: Fabric, half: Optional[Iterable] = None, transit_hosts: bool = False,
            with_diameter: bool = True, with_bisection: bool = True) -> FabricCounts:
    """Count a built fabric; `half` is the set of GPU ids on one side of the cut."""
    graph = fabric.graph
    switches: Counter = Counter()
    ports: Dict[str, Tuple[int, float]] = {}
    in_server = 0
    for node in fabric.eps_switches:
        data = graph.nodes[node]
        if _is_in_server(fabric, node):
            in_server += 1
            continue
        switches[data["role"]] += 1
        radix = data.get("radix", graph.degree(node))
        shape = (radix, data.get("port_gbps", 0.0))
        ports[data["role"]] = max(ports.get(data["role"], shape), shape)
    to_eps, to_ocs = Counter(), Counter()
    nic_ports = 0
    for u, v, data in graph.edges(data=True):
        server_side = [fabric.kind(n) == HOST or _is_in_server(fabric, n) for n in (u, v)]
        if all(server_side):
            continue                                    # NVLink inside a server
        nic_ports += any(server_side)
        (to_ocs if OCS in (fabric.kind(u), fabric.kind(v)) else to_eps)[data["gbps"]] += 1
    cables, modules = cable_modules(to_eps, to_ocs)
    ocs = fabric.ocs_switches
    counts = FabricCounts(
        fabric=fabric.name, gpus=len(gpu_hosts(fabric)),
        nic_ports=nic_ports,
        switches=dict(switches), switch_ports=ports, cables=cables, optical_modules=modules,
        ocs=len(ocs), ocs_ports=sum(graph.degree(o) for o in ocs), in_server=in_server)
    if with_diameter:
        counts.diameter = diameter(fabric, transit_hosts)
    if with_bisection:
        counts.bisection_gbps = bisection(fabric, half)
    return counts


def _weight(data: dict, transit_hosts: bool) -> int:
    if data["kind"] == EPS:
        return 0 if data["role"] in IN_SERVER_ROLES else 1
    return 1 if transit_hosts else 0


def _forwarding_distances(logical: nx.MultiGraph, sources: Set[str],
                          transit_hosts: bool) -> Dict[str, int]:
    """0-1 BFS: entering a node costs its forwarding weight; hosts end paths
    unless they transit.  Distances are to the node *before* its own weight."""
    dist = {s: 0 for s in sources}
    queue = deque(sources)
    while queue:
        node = queue.popleft()
        data = logical.nodes[node]
        if node not in sources and data["kind"] == HOST and not transit_hosts:
            continue
        base = dist[node] + (_weight(data, transit_hosts) if node not in sources else 0)
        for peer in logical.neighbors(node):
            if base < dist.get(peer, 1 << 30):
                dist[peer] = base
                if base == dist[node]:
                    queue.appendleft(peer)
                else:
                    queue.append(peer)
    return dist


def diameter(fabric: Fabric, transit_hosts: bool = False) -> Optional[int]:
    """Worst GPU pair's fewest forwarding elements (None if some pair is cut off)."""
    logical = fabric.logical_graph()
    groups = gpu_hosts(fabric)
    worst = 0
    for gpu, hosts in groups.items():
        dist = _forwarding_distances(logical, set(hosts), transit_hosts)
        for other, other_hosts in groups.items():
            if other == gpu:
                continue
            best = min((dist[h] for h in other_hosts if h in dist), default=None)
            if best is None:
                return None
            worst = max(worst, best)
    return worst


def bisection(fabric: Fabric, half: Optional[Iterable] = None) -> float:
    """Max-flow in Gb/s from the GPUs in `half` (default: first half by id) to the rest."""
    groups = gpu_hosts(fabric)
    gpus = sorted(groups)
    side = set(half) if half is not None else set(gpus[:len(gpus) // 2])
    flow = nx.DiGraph()
    for u, v, data in fabric.graph.edges(data=True):
        for a, b in ((u, v), (v, u)):
            capacity = flow.get_edge_data(a, b, {"capacity": 0.0})["capacity"]
            flow.add_edge(a, b, capacity=capacity + data["gbps"])
    for gpu, hosts in groups.items():
        for host in hosts:
            if gpu in side:
                flow.add_edge("_source", host)     # no capacity attribute: unbounded
            else:
                flow.add_edge(host, "_sink")
    return float(nx.maximum_flow_value(flow, "_source", "_sink"))


def graph_diameter(count: int, edges) -> Optional[int]:
    """Largest hop count between two of the nodes 0..count-1 joined by ``edges``
    (pairs); None when some node cannot reach another."""
    neighbours: Dict[int, Set[int]] = {n: set() for n in range(count)}
    for a, b in edges:
        neighbours[a].add(b)
        neighbours[b].add(a)
    worst = 0
    for start in range(count):
        dist = hop_distances(neighbours, start)
        if len(dist) < count:
            return None
        worst = max(worst, max(dist.values()))
    return worst


def hop_distances(neighbours, start) -> Dict[object, int]:
    """BFS hop counts from ``start`` over an adjacency mapping (no graph needed,
    so full-scale fabrics are measured without building a networkx graph)."""
    dist = {start: 0}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for peer in neighbours[node]:
            if peer not in dist:
                dist[peer] = dist[node] + 1
                queue.append(peer)
    return dist
