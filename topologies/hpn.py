"""Alibaba HPN-style fabric: dual-ToR, dual-plane, rail-optimized segments.

The HPN row of ZCube's Table 6 (002 text: 384 switches, 16,384 x 400G +
32,768 x 200G cables for 16,384 GPUs with 51.2T switches: 256 ToRs of
128 x 200G down + 64 x 400G up, and 64 aggregation switches per plane)::

      plane 0:  agg agg ... agg            plane 1:  agg agg ... agg
                 |  \\  /  |                          |  \\  /  |     every ToR of a plane
      ToR(seg, rail, 0) ...                ToR(seg, rail, 1) ...        to every agg of it
           |      |                             |      |
        NIC port 0 (200G)                    NIC port 1 (200G)
                 \\_____________ GPU _____________/                  a 2 x 200G NIC per GPU

Segment: ``radix`` servers (a ToR has radix x 200G downlinks, one per server
of its rail, and radix/2 x 400G uplinks).  Both ports of a GPU's NIC go to
the two ToRs of its rail and segment, one in each plane, and the planes
never meet: a single ToR failure leaves every GPU its other port.

How it is modelled: one host per NIC port (hosts stay single-homed, so the
emulator and routing need nothing new); the two hosts of a GPU share its
``gpu`` id and carry ``nic_port`` 0 or 1.  Only HPN's two tiers are built,
which caps the fabric at ``radix`` segments (16,384 GPUs at radix 128); HPN's
third, oversubscribed core tier is not modelled.

Parameters: ``gpus``, ``gpus_per_server`` (rails), ``radix`` (400G-port
count of every switch), ``nic_gbps`` (200), ``uplink_gbps`` (400).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from topologies.counts import FabricCounts, cable_modules
from topologies.fabric import TEXT_GPUS_PER_SERVER, Fabric, FabricError

PLANES = 2


def layout(gpus: int, gpus_per_server: int, radix: int) -> Tuple[int, int, int]:
    """(segments, ToRs per plane, aggs per plane)."""
    # gpus < 1 passed as zero whole servers, and built a fabric without hosts.
    if radix < 2 or radix % 2 or gpus_per_server < 1 or gpus < 1 or gpus % gpus_per_server:
        raise FabricError(f"hpn: need an even radix and whole servers, got gpus={gpus}, "
                          f"gpus_per_server={gpus_per_server}, radix={radix}")
    segments = math.ceil(gpus // gpus_per_server / radix)
    tors = segments * gpus_per_server
    if tors > radix:
        raise FabricError(f"hpn: {tors} ToRs per plane exceed radix {radix}; the third tier "
                          f"is not modelled (two tiers hold at most {radix * radix} GPUs)")
    return segments, tors, math.ceil(tors * (radix // 2) / radix)


def build(gpus: int = 16, gpus_per_server: int = 2, radix: int = 4, nic_gbps: float = 200.0,
          uplink_gbps: float = 400.0) -> Fabric:
    segments, tors, aggs = layout(gpus, gpus_per_server, radix)
    fabric = Fabric("hpn", params={"gpus": gpus, "gpus_per_server": gpus_per_server,
                                   "radix": radix, "nic_gbps": nic_gbps,
                                   "uplink_gbps": uplink_gbps})
    up = radix // 2
    tor_of = {}
    for plane in range(PLANES):
        agg_nodes = [fabric.add_switch("agg", plane=plane, radix=radix, port_gbps=uplink_gbps)
                     for _ in range(aggs)]
        for index in range(tors):
            segment, rail = divmod(index, gpus_per_server)
            tor = fabric.add_switch("tor", plane=plane, pod=segment, rail=rail, radix=radix,
                                    port_gbps=uplink_gbps)
            tor_of[plane, segment, rail] = tor
            for uplink in range(up):
                fabric.add_link(tor, agg_nodes[(index * up + uplink) % aggs], uplink_gbps)
    for gpu in range(gpus):
        server, rail = divmod(gpu, gpus_per_server)
        for plane in range(PLANES):
            host = fabric.add_host("gpu", gpu=gpu, nic_port=plane, server=server, rail=rail,
                                   pod=server // radix)
            fabric.add_link(host, tor_of[plane, server // radix, rail], nic_gbps)
    return fabric


def counts(gpus: int = 16, gpus_per_server: int = 2, radix: int = 4, nic_gbps: float = 200.0,
           uplink_gbps: float = 400.0) -> FabricCounts:
    segments, tors, aggs = layout(gpus, gpus_per_server, radix)
    up = radix // 2
    cables, modules = cable_modules({nic_gbps: PLANES * gpus,
                                     uplink_gbps: PLANES * tors * up}, {})
    servers = gpus // gpus_per_server
    return FabricCounts(
        fabric="hpn", gpus=gpus, nic_ports=PLANES * gpus,
        switches={"agg": PLANES * aggs, "tor": PLANES * tors},
        switch_ports={"agg": (radix, uplink_gbps), "tor": (radix, uplink_gbps)},
        cables=cables, optical_modules=modules, diameter=3 if tors > 1 else 1,
        bisection_gbps=PLANES * _plane_cut(servers, gpus_per_server, radix, nic_gbps,
                                           up * uplink_gbps))


def _plane_cut(servers: int, rails: int, radix: int, nic_gbps: float, up_gbps: float) -> float:
    """Max-flow in one plane from the first half of the servers to the rest."""
    half = servers // 2
    local = supply = demand = 0.0
    for first in range(0, servers, radix):
        inside = max(0, min(half, first + radix) - first)
        outside = min(radix, servers - first) - inside
        for _ in range(rails):
            meet = min(inside, outside) * nic_gbps
            local += meet
            supply += min(inside * nic_gbps - meet, up_gbps)
            demand += min(outside * nic_gbps - meet, up_gbps)
    return local + min(supply, demand)


def bisection_half(fabric: Fabric) -> List[int]:
    """First half of the servers: whole segments, cut through the aggregation tier."""
    return list(range(fabric.params["gpus"] // 2))


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """``gpus`` GPUs in servers of ``gpus_per_server`` (the texts' eight by
    default) on radix-``radix`` switches, the same rule at every scale."""
    return {"gpus": gpus, "gpus_per_server": gpus_per_server or TEXT_GPUS_PER_SERVER,
            "radix": radix}
