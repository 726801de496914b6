"""Two-tier leaf-spine with configurable oversubscription (the FT-OS baseline).

::

          sp1        sp2     ...   `spines` spine switches
          |  \\      /  |
          |    \\  /    |          every leaf has one uplink to every spine
          |    /  \\    |
         l1   ...    lL          `leaves` leaf switches
        / | \\       / | \\
      h1 h2 h3 ... hN-1 hN       `hosts_per_leaf` hosts on each leaf

Oversubscription = (hosts_per_leaf * gbps) / (spines * uplink_gbps).  The
uplink rate is derived from the requested ratio, so ``oversubscription=3``
gives each leaf a third of its host bandwidth towards the spines (3:1).
Counts: leaves*hosts_per_leaf hosts, leaves+spines switches,
leaves*(hosts_per_leaf+spines) links, diameter 4 host-to-host hops.
"""

from __future__ import annotations

from topologies.fabric import Fabric, FabricError


def build(leaves: int = 4, spines: int = 2, hosts_per_leaf: int = 2, gbps: float = 400.0,
          oversubscription: float = 1.0) -> Fabric:
    for name, value in (("leaves", leaves), ("spines", spines), ("hosts_per_leaf", hosts_per_leaf)):
        if value < 1:
            raise FabricError(f"leafspine: {name} must be >= 1, got {value}")
    if oversubscription <= 0:
        raise FabricError(f"leafspine: oversubscription must be > 0, got {oversubscription}")
    uplink_gbps = hosts_per_leaf * gbps / (spines * oversubscription)
    fabric = Fabric("leafspine", params={
        "leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf, "gbps": gbps,
        "oversubscription": oversubscription, "uplink_gbps": uplink_gbps})
    spine_nodes = [fabric.add_switch("spine") for _ in range(spines)]
    for leaf_index in range(leaves):
        leaf = fabric.add_switch("leaf", pod=leaf_index)
        for slot in range(hosts_per_leaf):
            host = fabric.add_host("gpu", pod=leaf_index, server=leaf_index, rail=slot)
            fabric.add_link(host, leaf, gbps)
        for spine in spine_nodes:
            fabric.add_link(leaf, spine, uplink_gbps)
    return fabric
