"""Packet-switch core: proactive shortest-path ECMP from the fabric graph.

Every (switch, destination host) pair gets one `Route` intent: the output
ports on a shortest path over the current logical graph (static links that
are up, lit circuits).  A reroute returns only the routes that changed, each
one intent, so an applier can make every change atomic (OpenFlow: one group
MODIFY).  Hosts get static neighbours from the testbed, and nothing floods
anywhere, because the fabrics have loops.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from controllers.intents import Batch, Route
from topologies import routing
from topologies.fabric import Circuit, Fabric


#: Route tables kept by `EpsCore.routes_for`: a few templates' worth.
ROUTE_CACHE_SIZE = 32


class EpsCore:
    """Pure logic for all packet switches of one fabric; returns intents."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.down_links: Set[frozenset] = set()
        self._route_cache: Dict[tuple, routing.NextHops] = {}
        self.table: routing.NextHops = routing.next_hops(
            routing.base_graph(fabric), transit_hosts=self.transit_hosts)

    @property
    def transit_hosts(self) -> bool:
        return bool(self.fabric.params.get("transit_hosts", False))

    def route(self, switch: str, host: str, ports) -> Route:
        return Route(switch, host, self.fabric.graph.nodes[host]["ip"], tuple(ports or ()))

    def switch_start(self, switch: str) -> List[Route]:
        """One route per destination host (no port: unreachable from here), for a
        switch that starts empty."""
        routes = self.table.get(switch, {})
        return [self.route(switch, host, routes.get(host)) for host in self.fabric.hosts]

    def routes_for(self, circuits: Optional[Dict[str, Set[Circuit]]] = None) -> routing.NextHops:
        """The route table over the base graph (`routing.base_graph`: no
        fast lanes), without the failed links; a copy the caller may change.

        Tables are kept per circuit assignment and set of failed links (the
        only things that change the graph), the last `ROUTE_CACHE_SIZE` of
        them.  A reconfiguration asks for four (the kept circuits, the
        target, twice each), and a proxy that alternates templates, as
        layer-wise training does 15 times an iteration, asks for the same
        few again and again: computed afresh, they took 100 ms per change at
        48 GPUs on an idle core, and two to four times that under load,
        against a layer's 10-20 ms of compute.
        """
        circuits = self.fabric.circuits if circuits is None else circuits
        key = (frozenset((ocs, frozenset(lit)) for ocs, lit in circuits.items()),
               frozenset(self.down_links))
        table = self._route_cache.pop(key, None)
        if table is None:
            logical = routing.base_graph(self.fabric, circuits)
            for u, v in (tuple(link) for link in self.down_links):
                while logical.has_edge(u, v):
                    logical.remove_edge(u, v)
            table = routing.next_hops(logical, transit_hosts=self.transit_hosts)
            while len(self._route_cache) >= ROUTE_CACHE_SIZE:
                self._route_cache.pop(next(iter(self._route_cache)))
        self._route_cache[key] = table          # the most recent last
        return {switch: dict(entries) for switch, entries in table.items()}

    def reroute(self, circuits: Optional[Dict[str, Set[Circuit]]] = None,
                fill_missing_from: Optional[routing.NextHops] = None) -> Batch:
        """Move to the routes over ``circuits``; the changed routes, per switch.

        ``circuits`` defaults to the fabric's current ones; links in
        ``down_links`` (failed on purpose) are left out.  A destination the
        new graph cannot reach takes its ports from ``fill_missing_from``
        when given, instead of being dropped at the switch.
        """
        table = self.routes_for(circuits)
        for switch, entries in (fill_missing_from or {}).items():
            for host, ports in entries.items():
                table.setdefault(switch, {}).setdefault(host, ports)
        changes = routing.diff(self.table, table)
        self.table = table
        return {switch: [self.route(switch, host, ports)
                         for host, ports in sorted(entries.items())]
                for switch, entries in changes.items()}
