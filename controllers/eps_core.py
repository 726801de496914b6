"""Packet-switch core: proactive shortest-path ECMP from the fabric graph.

Every (switch, destination host) pair gets one OpenFlow select group whose
buckets are the ECMP output ports, and one flow ``ipv4_dst -> group``.  A
route change is then a single atomic group MODIFY, so rerouting never opens
a window with no flow.  Hosts get static ARP from the testbed, and there is no
flooding anywhere, because the fabrics have loops.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from controllers import ofmsg
from topologies import routing
from topologies.fabric import Circuit, Fabric


class EpsCore:
    """Pure logic for all packet switches of one fabric; returns messages."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.down_links: Set[frozenset] = set()
        self.table: routing.NextHops = routing.next_hops(
            routing.base_graph(fabric), transit_hosts=self.transit_hosts)

    @property
    def transit_hosts(self) -> bool:
        return bool(self.fabric.params.get("transit_hosts", False))

    def group_id(self, host: str) -> int:
        return self.fabric.graph.nodes[host]["index"]

    def switch_start(self, switch: str) -> List:
        """Messages that bring a freshly connected switch to the current table."""
        msgs = [ofmsg.delete_all_flows(), ofmsg.delete_all_groups(), ofmsg.drop_on_miss()]
        routes = self.table.get(switch, {})
        for host in self.fabric.hosts:
            msgs.append(ofmsg.route_group(self.group_id(host), routes.get(host, ())))
            msgs.append(ofmsg.route_to_group(self.fabric.graph.nodes[host]["ip"],
                                             self.group_id(host)))
        return msgs

    def routes_for(self, circuits: Optional[Dict[str, Set[Circuit]]] = None) -> routing.NextHops:
        """The route table over the base graph (`routing.base_graph`: no
        fast lanes), without the failed links."""
        logical = routing.base_graph(self.fabric, circuits)
        for u, v in (tuple(link) for link in self.down_links):
            while logical.has_edge(u, v):
                logical.remove_edge(u, v)
        return routing.next_hops(logical, transit_hosts=self.transit_hosts)

    def reroute(self, circuits: Optional[Dict[str, Set[Circuit]]] = None,
                fill_missing_from: Optional[routing.NextHops] = None) -> Dict[str, List]:
        """Move to the routes over ``circuits``; messages per changed switch.

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
        return {switch: [ofmsg.route_group(self.group_id(host), ports or (), modify=True)
                         for host, ports in sorted(entries.items())]
                for switch, entries in changes.items()}
