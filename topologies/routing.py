"""Shortest-path ECMP routing over a fabric's logical graph.

Pure functions: they take the logical graph (static links plus lit circuits,
see ``Fabric.logical_graph``) and return, for every packet switch and every
destination host, the set of output ports that lie on a shortest path.  Hosts
never forward (except in fabrics that make a host a transit node on purpose,
which pass ``transit_hosts``).  The controller turns each entry into one
OpenFlow select group.
"""

from __future__ import annotations

from collections import deque
from typing import Dict, Iterable, List, Optional, Tuple

import networkx as nx

from topologies.fabric import EPS, HOST

NextHops = Dict[str, Dict[str, Tuple[int, ...]]]


#: The multipath hash of a forwarded packet on kernel routers: addresses,
#: protocol and ports (fib_multipath_hash_fields 0x37 with policy 3), what a
#: switch's ECMP hashes.  Not policy 1: that one takes the hash a packet
#: already carries, and a packet sent from a socket carries the socket's
#: random one (re-drawn at a retransmission timeout) across veths, so a
#: flow's path was a coin flip per connection, could change mid-flow, and
#: differed from the path asked of the kernel.  `traffic.model.kernel_ecmp`
#: computes the same hash.
MULTIPATH_HASH_FIELDS = 0x37

def _hop_distances(logical: nx.MultiGraph, dst: str, transit_hosts: bool) -> Dict[str, int]:
    """BFS distances to dst, never passing through another host."""
    dist = {dst: 0}
    queue = deque([dst])
    while queue:
        node = queue.popleft()
        if node != dst and logical.nodes[node]["kind"] == HOST and not transit_hosts:
            continue
        for peer in logical.neighbors(node):
            if peer not in dist:
                dist[peer] = dist[node] + 1
                queue.append(peer)
    return dist


def next_hops(logical: nx.MultiGraph, transit_hosts: bool = False,
              destinations: Optional[Iterable[str]] = None,
              distances: Optional[Dict[str, Dict[str, int]]] = None) -> NextHops:
    """switch -> destination host -> sorted output ports on shortest paths.

    A switch that cannot reach a destination has no entry for it.  Given a
    dict, ``distances`` gets switch -> destination host -> hops, for every
    entry of the table (each of its ports leads one hop nearer).
    """
    hosts = [n for n, d in logical.nodes(data=True) if d["kind"] == HOST]
    switches = [n for n, d in logical.nodes(data=True) if d["kind"] == EPS]
    table: NextHops = {s: {} for s in switches}
    for dst in (destinations if destinations is not None else hosts):
        dist = _hop_distances(logical, dst, transit_hosts)
        for switch in switches:
            if switch not in dist:
                continue
            if distances is not None:
                distances.setdefault(switch, {})[dst] = dist[switch]
            ports = set()
            for _, peer, data in logical.edges(switch, data=True):
                if dist.get(peer) == dist[switch] - 1:
                    ports.add(data["ports"][switch])
            if ports:
                table[switch][dst] = tuple(sorted(ports))
    return table


def base_graph(fabric, circuits=None) -> nx.MultiGraph:
    """The graph destination routes run over: the logical graph, less the links
    that only carry pinned flows (Rail-Fabric's KV fast lanes, kept for large
    KV transfers reserved onto them, `controllers.pins`)."""
    logical = fabric.logical_graph(circuits)
    if fabric.name == "rail-fabric":
        from topologies.rail_fabric import without_fast_lanes
        return without_fast_lanes(fabric, logical)
    return logical


def shortest_paths(logical: nx.MultiGraph, src: str, dst: str) -> List[List[str]]:
    """Every shortest node path src -> dst that does not transit a host."""
    allowed = logical.subgraph(
        n for n, d in logical.nodes(data=True) if d["kind"] != HOST or n in (src, dst))
    try:
        return sorted(nx.all_shortest_paths(allowed, src, dst))
    except nx.NetworkXNoPath:
        return []


def diff(old: NextHops, new: NextHops) -> Dict[str, Dict[str, Optional[Tuple[int, ...]]]]:
    """Entries that changed: switch -> dst -> new ports (None = removed)."""
    changes: Dict[str, Dict[str, Optional[Tuple[int, ...]]]] = {}
    for switch in set(old) | set(new):
        before, after = old.get(switch, {}), new.get(switch, {})
        for dst in set(before) | set(after):
            if before.get(dst) != after.get(dst):
                changes.setdefault(switch, {})[dst] = after.get(dst)
    return changes
