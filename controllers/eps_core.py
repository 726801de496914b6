"""Packet-switch core: proactive shortest-path ECMP from the fabric graph.

Every (switch, destination host) pair gets one `Route` intent: the output
ports on a shortest path over the current logical graph (static links that
are up, lit circuits).  A reroute returns only the routes that changed, each
one intent, so an applier can make every change atomic (OpenFlow: one group
MODIFY).  Hosts get static neighbours from the testbed, and nothing floods
anywhere, because the fabrics have loops.

Switches take a reroute one after another, so between the first and the
last a packet may meet old routes and new ones.  Written in any order, that
mix loops: a SYN caught in it comes back as ICMP time-exceeded, which
aborts the connection attempt ("No route to host"); at 48 GPUs with the
Train circuits changing per layer, one flow in a few hundred died so.
`reroute_rounds` orders the changes loop-free, per destination from the
switches nearest it outwards::

    round 0   routes that drop (no port left): a drop never loops
    round k   (switch, dst) whose new route is k hops from dst: its next
              hops, k-1 hops away, took their new routes in round k-1
    last      routes filled in from another table (a stranded destination
              keeps its old ports or takes the coming circuits')

A packet then follows old routes (loop-free among themselves) until it
meets a switch already moved, and new routes from there, each one hop
nearer: it never comes back.  Each round is applied, and confirmed, before
the next.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from controllers.intents import Batch, Route, merge
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
        table, _ = self._routes_and_distances(circuits)
        return {switch: dict(entries) for switch, entries in table.items()}

    def _routes_and_distances(self, circuits: Optional[Dict[str, Set[Circuit]]] = None
                              ) -> Tuple[routing.NextHops, Dict[str, Dict[str, int]]]:
        """The cached table and its hop distances (not to be changed)."""
        circuits = self.fabric.circuits if circuits is None else circuits
        key = (frozenset((ocs, frozenset(lit)) for ocs, lit in circuits.items()),
               frozenset(self.down_links))
        cached = self._route_cache.pop(key, None)
        if cached is None:
            logical = routing.base_graph(self.fabric, circuits)
            for u, v in (tuple(link) for link in self.down_links):
                while logical.has_edge(u, v):
                    logical.remove_edge(u, v)
            distances: Dict[str, Dict[str, int]] = {}
            cached = (routing.next_hops(logical, transit_hosts=self.transit_hosts,
                                        distances=distances), distances)
            while len(self._route_cache) >= ROUTE_CACHE_SIZE:
                self._route_cache.pop(next(iter(self._route_cache)))
        self._route_cache[key] = cached         # the most recent last
        return cached

    def reroute(self, circuits: Optional[Dict[str, Set[Circuit]]] = None,
                fill_missing_from: Optional[routing.NextHops] = None) -> Batch:
        """Move to the routes over ``circuits``; the changed routes, per switch,
        as one batch (`reroute_rounds` in the order that never loops).

        ``circuits`` defaults to the fabric's current ones; links in
        ``down_links`` (failed on purpose) are left out.  A destination the
        new graph cannot reach takes its ports from ``fill_missing_from``
        when given, instead of being dropped at the switch.
        """
        return merge(*self.reroute_rounds(circuits, fill_missing_from))

    def reroute_rounds(self, circuits: Optional[Dict[str, Set[Circuit]]] = None,
                       fill_missing_from: Optional[routing.NextHops] = None) -> List[Batch]:
        """`reroute`'s changes in rounds to apply one after another, each
        confirmed before the next: the order in the module's docstring, which
        never lets a packet loop however the switches of a round interleave.
        No change: no round."""
        new, distances = self._routes_and_distances(circuits)
        table = {switch: dict(entries) for switch, entries in new.items()}
        for switch, entries in (fill_missing_from or {}).items():
            for host, ports in entries.items():
                table.setdefault(switch, {}).setdefault(host, ports)
        changes = routing.diff(self.table, table)
        self.table = table
        last = 1 + max((hops for entries in distances.values() for hops in entries.values()),
                       default=0)
        rounds: Dict[int, Batch] = {}
        for switch, entries in sorted(changes.items()):
            for host, ports in sorted(entries.items()):
                if not ports:
                    index = 0
                elif host in new.get(switch, {}):
                    index = distances[switch][host]
                else:
                    index = last
                rounds.setdefault(index, {}).setdefault(switch, []).append(
                    self.route(switch, host, ports))
        return [rounds[index] for index in sorted(rounds)]
