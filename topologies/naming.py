"""How the testbed names a fabric's nodes and ports on the machine.

A host keeps its fabric name (``h3``); a switch gets the testbed prefix
(``s3`` -> ``fes3``, ``o1`` -> ``feo1``), so everything the testbed creates
can be told apart from anything else on the machine and cleaned up by name;
port ``p`` of node ``n`` is the interface ``<machine name of n>-eth<p>``, so
the controller's port numbers are the data plane's; on the kernel data plane every
router port carries `ROUTER_MAC`.  A link of ``gbps`` real
Gbit/s runs at ``gbps x 1000 x bw_factor`` emulated Mbit/s.

Pure: the Mininet adapter (`topologies.mininet_topo`) and the capture
analysis (`traffic.measure.linkload`) both name things this way.
"""

from __future__ import annotations

from topologies.fabric import HOST, Fabric

SWITCH_PREFIX = "fe"


def machine_name(fabric: Fabric, node: str) -> str:
    return node if fabric.kind(node) == HOST else SWITCH_PREFIX + node


def interface(fabric: Fabric, node: str, port: int) -> str:
    return f"{machine_name(fabric, node)}-eth{port}"


def link_mbps(gbps: float, bw_factor: float) -> float:
    return gbps * 1000.0 * bw_factor


# On the kernel data plane every router port has this one MAC (a locally
# administered unicast address): a packet leaving a router or a host for the
# next router always carries it, whichever router is behind a circuit today,
# so a reconfiguration changes routes only, never neighbour entries.
ROUTER_MAC = "02:fe:00:00:00:01"
