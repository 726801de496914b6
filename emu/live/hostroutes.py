"""Host-side forwarding for fabrics whose GPUs forward (SiP-OCS).

In such fabrics a GPU has one port per OCS plane and no packet switch
between them: a circuit is a wire between two GPU ports, and traffic
between GPUs without a circuit crosses intermediate GPUs.  The controller
programs switches only, so the testbed turns every host into a router:
IP forwarding on, reverse-path filtering off, and one /32 route per
destination with an ECMP next hop per port on a shortest circuit path, each
next hop a static neighbour entry with the MAC of the far GPU's port.
Routes follow the current circuits: call again after a reconfiguration.
"""

from __future__ import annotations

from typing import Dict, List

from topologies import sip_ocs
from topologies.fabric import Fabric


def needs_host_routes(fabric: Fabric) -> bool:
    return bool(fabric.params.get("transit_hosts"))


def host_route_commands(fabric: Fabric, mac_of) -> Dict[str, List[str]]:
    """host -> shell commands; ``mac_of(host, port)`` is the MAC of that host port."""
    logical = fabric.logical_graph()
    table = sip_ocs.transit_next_hops(logical)
    commands: Dict[str, List[str]] = {}
    for host in fabric.hosts:
        ip_of = fabric.graph.nodes
        cmds = ["sysctl -qw net.ipv4.ip_forward=1", "sysctl -qw net.ipv4.conf.all.rp_filter=0",
                "sysctl -qw net.ipv4.conf.default.rp_filter=0"]
        ports = sorted({d["ports"][host] for _, _, d in fabric.graph.edges(host, data=True)})
        cmds += [f"sysctl -qw net.ipv4.conf.{host}-eth{p}.rp_filter=0" for p in ports]
        peers = {}
        for _, peer, data in logical.edges(host, data=True):
            if peer == host:
                continue
            port, peer_port = data["ports"][host], data["ports"][peer]
            peers[port] = peer
            cmds.append(f"ip neigh replace {ip_of[peer]['ip']} lladdr {mac_of(peer, peer_port)} "
                        f"dev {host}-eth{port} nud permanent")
        for dst, out_ports in sorted(table.get(host, {}).items()):
            hops = " ".join(f"nexthop via {ip_of[peers[p]]['ip']} dev {host}-eth{p} onlink"
                            for p in out_ports if p in peers)
            if hops:
                cmds.append(f"ip route replace {ip_of[dst]['ip']}/32 {hops}")
        commands[host] = cmds
    return commands
