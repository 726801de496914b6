"""Rail-only: one Clos per rail, no spine across rails; cross-rail goes over NVLink.

The Rail-only row of ZCube's Table 6 (002 text: 384 switches and 32,768 x
400G cables for 16,384 GPUs with 128-port switches: per rail 32 leaves and
16 spines) and the design of Wang et al. that section 8 starts from::

       rail 0 Clos          rail 1 Clos     ...   rail 7 Clos      no links between rails
        sp   sp              sp   sp               sp   sp
        | \\ / |              | \\ / |               | \\ / |
       leaf  leaf           leaf  leaf            leaf  leaf       radix/2 servers per leaf
        |     |              |     |               |     |
     nv0 ... nvS          nv0 ... nvS          nv0 ... nvS      nvswitch s port r = GPU r's NIC
       \\|/                  (one nvswitch per server, shared by all rails)
      GPUs 0..7 of a server hang off its nvswitch over NVLink (``nvlink_gbps``)

How it is modelled: each server has an in-server packet switch (role
``nvswitch``) that stands for NVLink plus the server's NICs: GPU -> nvswitch
at NVLink speed, nvswitch port r -> the rail-r leaf at NIC speed.  A
cross-rail transfer therefore crosses NVLink to the NIC of the destination's
rank and then stays on that rail, which is what NCCL's PXN does on rail-only
clusters; no GPU has to forward, so hosts stay single-homed.  ECMP alone
would spread a server's traffic over all of its NICs; `rail_aligned` keeps
only the destination's rail.  The nvswitch is not network equipment: it is
not counted as a switch, and GPU-nvswitch links are not cables.

Parameters: ``gpus``, ``gpus_per_server`` (rails), ``radix`` (rail switches),
``gbps`` (NIC), ``nvlink_gbps`` (3,200: H800's 400 GB/s, an assumption for the
emulator's bandwidth ratio), ``tiers`` (per rail; 0 = fewest).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from topologies import clos
from topologies.counts import FabricCounts
from topologies.fabric import TEXT_GPUS_PER_SERVER, Fabric, FabricError
from topologies.routing import NextHops


def layout(gpus: int, gpus_per_server: int, radix: int,
           tiers: int) -> Tuple[clos.ClosPlan, List[List[int]]]:
    """(per-rail tier plan, server ids per leaf of a rail)."""
    if radix < 4 or radix % 2 or gpus_per_server < 1 or gpus % gpus_per_server:
        raise FabricError(f"rail-only: need an even radix >= 4 and whole servers, got "
                          f"gpus={gpus}, gpus_per_server={gpus_per_server}, radix={radix}")
    members = clos.fill(gpus // gpus_per_server, radix // 2)
    return clos.plan(len(members), radix, radix // 2, tiers), members


def build(gpus: int = 16, gpus_per_server: int = 4, radix: int = 4, gbps: float = 400.0,
          nvlink_gbps: float = 3200.0, tiers: int = 0) -> Fabric:
    shape, members = layout(gpus, gpus_per_server, radix, tiers)
    fabric = Fabric("rail-only", params={"gpus": gpus, "gpus_per_server": gpus_per_server,
                                         "radix": radix, "gbps": gbps,
                                         "nvlink_gbps": nvlink_gbps, "tiers": shape.tiers})
    nvswitches = []
    for server in range(gpus // gpus_per_server):
        nvswitch = fabric.add_switch("nvswitch", server=server, radix=2 * gpus_per_server,
                                     port_gbps=nvlink_gbps)
        nvswitches.append(nvswitch)
        for rank in range(gpus_per_server):
            host = fabric.add_host("gpu", gpu=server * gpus_per_server + rank, server=server,
                                   rail=rank)
            fabric.add_link(host, nvswitch, nvlink_gbps)
    for rail in range(gpus_per_server):
        leaves = []
        for group in members:
            leaf = fabric.add_switch("leaf", rail=rail, radix=radix, port_gbps=gbps)
            leaves.append(leaf)
            for server in group:
                fabric.add_link(nvswitches[server], leaf, gbps, medium="fiber")
        clos.add_tiers(fabric, leaves, shape, gbps, rail=rail)
    return fabric


def counts(gpus: int = 16, gpus_per_server: int = 4, radix: int = 4, gbps: float = 400.0,
           nvlink_gbps: float = 3200.0, tiers: int = 0) -> FabricCounts:
    shape, members = layout(gpus, gpus_per_server, radix, tiers)
    result = clos.counts("rail-only", shape, members, gbps, copies=gpus_per_server)
    result.in_server = gpus // gpus_per_server
    return result


def bisection_half(fabric: Fabric) -> List[int]:
    """First half of the servers: every rail's Clos is cut through its spines."""
    return list(range(fabric.params["gpus"] // 2))


def rail_aligned(fabric: Fabric, table: NextHops) -> NextHops:
    """Keep, on each nvswitch, only the NIC toward the destination's rail (PXN)."""
    graph = fabric.graph
    result = {switch: dict(entries) for switch, entries in table.items()}
    for nvswitch in fabric.nodes_of("eps", "nvswitch"):
        by_rail = {graph.nodes[peer].get("rail"): port
                   for port, (peer, _) in fabric.ports_of(nvswitch).items()
                   if graph.nodes[peer]["kind"] == "eps"}
        for dst, ports in result.get(nvswitch, {}).items():
            port = by_rail.get(graph.nodes[dst]["rail"])
            if port in ports and graph.nodes[dst]["server"] != graph.nodes[nvswitch]["server"]:
                result[nvswitch][dst] = (port,)
    return result


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """``gpus`` GPUs in servers of ``gpus_per_server`` (the texts' eight by
    default) on radix-``radix`` switches, the same rule at every scale."""
    return {"gpus": gpus, "gpus_per_server": gpus_per_server or TEXT_GPUS_PER_SERVER,
            "radix": radix}
