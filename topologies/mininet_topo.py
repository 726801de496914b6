"""The one adapter from a `Fabric` to a Mininet `Topo`.

Hosts keep their fabric names, addresses and MACs; switches get the testbed
prefix and their fabric dpid (`topologies.naming`); every link keeps the port
numbers of the fabric, so the controller's port numbers are the switches'
port numbers.  With ``bw_factor``, link rates are real Gbit/s times
``bw_factor``, in Mbit/s, for Mininet's TCLink (the testbed itself shapes in
batches instead and passes none).

Two kinds of switch node, one per data plane:

* Open vSwitch bridges (``switch_opts`` for Mininet's OVSSwitch);
* `NamespaceSwitch`: a network namespace whose ports are plain veths.  A
  packet switch forwards in the kernel (IPv4 forwarding on, flow-hashed
  multipath); an OCS does not forward at all: its ports are joined in pairs
  by tc filters (a patch panel).  The controller fills in the routes and
  filters; this class only makes the namespace.  Every router port carries
  `topologies.naming.ROUTER_MAC`.  ``mn --custom topologies/mn_custom.py
  --switch kernel`` builds such a fabric with plain Mininet.

Mininet is imported here only, never by the pure builders.
"""

from __future__ import annotations

from typing import Dict, Optional

from mininet.node import Switch
from mininet.topo import Topo

from topologies.fabric import HOST, OCS, Fabric
from topologies.naming import ROUTER_MAC, SWITCH_PREFIX, link_mbps, machine_name
from topologies.routing import MULTIPATH_HASH_FIELDS

OVS, LINUX = "ovs", "linux"

# Per namespace: what a kernel router or a patch panel needs, and nothing that
# talks on its own (no IPv6 router solicitations, no ICMP redirects).
_COMMON_SYSCTLS = ("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                   "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                   "net.ipv4.conf.all.send_redirects=0",
                   "net.ipv4.conf.default.send_redirects=0")
ROUTER_SYSCTLS = _COMMON_SYSCTLS + ("net.ipv4.ip_forward=1",
                                    # multipath by the flow's five-tuple, not per packet
                                    "net.ipv4.fib_multipath_hash_policy=3",
                                    f"net.ipv4.fib_multipath_hash_fields={MULTIPATH_HASH_FIELDS:#x}")
PATCH_PANEL_SYSCTLS = _COMMON_SYSCTLS + ("net.ipv4.ip_forward=0",)


class NamespaceSwitch(Switch):
    """A switch in its own network namespace: a kernel router, or (``forward``
    false) an OCS patch panel that forwards nothing by itself."""

    def __init__(self, name, forward: bool = True, **params):
        params["inNamespace"] = True
        super().__init__(name, **params)
        self.forward = forward

    def start(self, controllers) -> None:  # Mininet's hook; no controller connects
        sysctls = ROUTER_SYSCTLS if self.forward else PATCH_PANEL_SYSCTLS
        commands = ["ip link set dev lo up", "sysctl -q -w " + " ".join(sysctls)]
        for intf in self.intfList():
            if intf.name != "lo":
                commands += [f"sysctl -q -w net.ipv4.conf.{intf.name}.rp_filter=0",
                             f"ip link set dev {intf.name} up"]
        output = self.cmd(" ; ".join(commands))
        if output.strip():
            raise RuntimeError(f"{self.name}: could not set up its namespace: "
                               f"{output.strip()[:300]}")

    def stop(self, deleteIntfs: bool = True) -> None:  # Mininet's hook name
        if deleteIntfs:
            self.deleteIntfs()
        self.terminate()


class FabricTopo(Topo):
    """Mininet topology materialising a fabric at emulated scale."""

    def __init__(self, fabric: Fabric, bw_factor: Optional[float] = None,
                 link_opts: Optional[Dict] = None, switch_opts: Optional[Dict] = None,
                 dataplane: str = OVS):
        if dataplane not in (OVS, LINUX):
            raise ValueError(f"dataplane {dataplane!r}; allowed: {OVS}, {LINUX}")
        self.fabric = fabric
        self.bw_factor = bw_factor
        self.link_opts = dict(link_opts or {})
        self.switch_opts = dict(switch_opts or {})
        self.dataplane = dataplane
        super().__init__()

    def build(self, *args, **params):  # Mininet's hook name
        fabric = self.fabric
        for node, data in fabric.graph.nodes(data=True):
            if data["kind"] == HOST:
                self.addHost(node, ip=data["ip"] + "/8", mac=data["mac"])
            elif self.dataplane == LINUX:
                self.addSwitch(SWITCH_PREFIX + node, dpid=f"{data['dpid']:016x}",
                               cls=NamespaceSwitch, forward=data["kind"] != OCS)
            else:
                self.addSwitch(SWITCH_PREFIX + node, dpid=f"{data['dpid']:016x}",
                               **self.switch_opts)
        for u, v, data in fabric.graph.edges(data=True):
            opts = dict(self.link_opts)
            if self.bw_factor is not None:
                opts["bw"] = link_mbps(data["gbps"], self.bw_factor)
            if self.dataplane == LINUX:
                for end, node in (("addr1", u), ("addr2", v)):
                    if fabric.kind(node) not in (HOST, OCS):
                        opts[end] = ROUTER_MAC
            self.addLink(machine_name(fabric, u), machine_name(fabric, v),
                         port1=data["ports"][u], port2=data["ports"][v], **opts)
