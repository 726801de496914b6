"""The one adapter from a `Fabric` to a Mininet `Topo`.

Hosts keep their fabric names, addresses and MACs; switches get the testbed
prefix and their fabric dpid (`topologies.naming`); every link keeps the port
numbers of the fabric, so the controller's port numbers are the OVS OpenFlow
port numbers.  Link rates are real Gbit/s times ``bw_factor``, in Mbit/s,
for Mininet's TCLink.

Mininet is imported here only, never by the pure builders.
"""

from __future__ import annotations

from typing import Dict, Optional

from mininet.topo import Topo

from topologies.fabric import HOST, Fabric
from topologies.naming import SWITCH_PREFIX, link_mbps, machine_name


class FabricTopo(Topo):
    """Mininet topology materialising a fabric at emulated scale."""

    def __init__(self, fabric: Fabric, bw_factor: Optional[float] = None,
                 link_opts: Optional[Dict] = None, switch_opts: Optional[Dict] = None):
        self.fabric = fabric
        self.bw_factor = bw_factor
        self.link_opts = dict(link_opts or {})
        self.switch_opts = dict(switch_opts or {})
        super().__init__()

    def build(self, *args, **params):  # Mininet's hook name
        fabric = self.fabric
        for node, data in fabric.graph.nodes(data=True):
            if data["kind"] == HOST:
                self.addHost(node, ip=data["ip"] + "/8", mac=data["mac"])
            else:
                self.addSwitch(SWITCH_PREFIX + node, dpid=f"{data['dpid']:016x}",
                               **self.switch_opts)
        for u, v, data in fabric.graph.edges(data=True):
            opts = dict(self.link_opts)
            if self.bw_factor is not None:
                opts["bw"] = link_mbps(data["gbps"], self.bw_factor)
            self.addLink(machine_name(fabric, u), machine_name(fabric, v),
                         port1=data["ports"][u], port2=data["ports"][v], **opts)
