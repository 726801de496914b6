"""Rail-optimized fat-tree (ROFT): same-rank GPUs of a server group share a leaf.

The "Rail-optimized (RO)" baseline of RFabric (section 5) and the ROFT row of
ZCube's Table 6 (002 text: 640 switches and 49,152 x 400G cables for 16,384
GPUs with 128-port switches: 256 leaves, 256 spines, 128 cores)::

              spines / cores: a non-blocking folded Clos (see topologies.clos)
             /      |       \\
      rail0 leaf  rail1 leaf ... rail7 leaf     one leaf per rail per server group
       |  |  |     |  |  |        |  |  |
      s0 s1 ..    s0 s1 ..       s0 s1 ..       rank r of each server -> rail-r leaf
      '--- group 0: radix/2 servers ---'        next group: next radix/2 servers

Parameters: ``gpus``, ``gpus_per_server`` (rails), ``radix`` (every switch),
``gbps``, ``tiers`` (0 = two tiers while leaves <= radix, else three).  A
group holds radix/2 servers, so a leaf has radix/2 GPU ports and radix/2
uplinks; same-rank GPUs of a group are one hop apart, everything else goes
through the spines (3 hops) or the cores (5 hops: the text's "ROFT's 5 hops").
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from topologies import clos
from topologies.counts import FabricCounts
from topologies.fabric import TEXT_GPUS_PER_SERVER, Fabric, FabricError


def layout(gpus: int, gpus_per_server: int, radix: int,
           tiers: int) -> Tuple[clos.ClosPlan, List[List[int]]]:
    """(tier plan, GPU ids per leaf) with leaves ordered group-major, rail-minor."""
    if radix < 4 or radix % 2 or gpus_per_server < 1 or gpus % gpus_per_server:
        raise FabricError(f"roft: need an even radix >= 4 and whole servers, got gpus={gpus}, "
                          f"gpus_per_server={gpus_per_server}, radix={radix}")
    group = radix // 2
    servers = gpus // gpus_per_server
    members = []
    for first in range(0, servers, group):
        group_servers = range(first, min(first + group, servers))
        for rail in range(gpus_per_server):
            members.append([s * gpus_per_server + rail for s in group_servers])
    return clos.plan(len(members), radix, radix // 2, tiers), members


def build(gpus: int = 32, gpus_per_server: int = 4, radix: int = 8, gbps: float = 400.0,
          tiers: int = 0) -> Fabric:
    shape, members = layout(gpus, gpus_per_server, radix, tiers)
    fabric = Fabric("roft", params={"gpus": gpus, "gpus_per_server": gpus_per_server,
                                    "radix": radix, "gbps": gbps, "tiers": shape.tiers})
    hosts = {}
    for gpu in range(gpus):
        hosts[gpu] = fabric.add_host("gpu", gpu=gpu, server=gpu // gpus_per_server,
                                     rail=gpu % gpus_per_server)
    leaves = []
    for index, group in enumerate(members):
        pod = index // shape.spine_down if shape.tiers == 3 else 0
        leaf = fabric.add_switch("leaf", pod=pod, rail=index % gpus_per_server,
                                 radix=radix, port_gbps=gbps)
        leaves.append(leaf)
        for gpu in group:
            fabric.graph.nodes[hosts[gpu]]["pod"] = pod
            fabric.add_link(hosts[gpu], leaf, gbps)
    clos.add_tiers(fabric, leaves, shape, gbps)
    return fabric


def counts(gpus: int = 32, gpus_per_server: int = 4, radix: int = 8, gbps: float = 400.0,
           tiers: int = 0) -> FabricCounts:
    shape, members = layout(gpus, gpus_per_server, radix, tiers)
    return clos.counts("roft", shape, members, gbps)


def bisection_half(fabric: Fabric) -> List[int]:
    """First half of the servers (whole rail groups): the cut through the top tier."""
    return list(range(fabric.params["gpus"] // 2))


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """``gpus`` GPUs on radix-``radix`` switches, servers of ``gpus_per_server``
    GPUs (the texts' eight by default), the same rule at every scale."""
    return {"gpus": gpus, "radix": radix,
            "gpus_per_server": gpus_per_server or TEXT_GPUS_PER_SERVER}
