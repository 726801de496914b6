"""Folded-Clos fat-tree for any GPU count, non-blocking (FT) or oversubscribed (FT-OS).

The FT and FT-OS baselines of the RFabric text (section 5, Figures 6-7:
"non-blocking fat-tree" and "a cost-effective 3:1 oversubscribed fat-tree")::

       core        c   c   c            (three tiers only)
                  / \\ / \\ / \\           fewer spine->core uplinks when at="core"
       spine    s   s   s   s   ...
                |\\ /|   |\\ /|
       leaf     l   l   l   l   ...     fewer leaf->spine uplinks when at="edge"
               /|\\ /|\\ /|\\ /|\\           (or in a two-tier tree with either setting)
       GPUs    0 1 2 3 4 5 6 7 ...      server-major: GPU g is rank g % 8 of server g // 8

Parameters: ``gpus``; ``radix`` (ports of every switch); ``ratio`` (down:up
bandwidth at the oversubscribed tier, 1.0 = non-blocking FT, 3.0 default);
``at`` (``core`` or ``edge``); ``gbps`` (every link); ``gpus_per_server``;
``tiers`` (0 = fewest that fit: two while the leaves fit under one spine row,
L <= radix, else three).

Where the oversubscription sits (the text only says "3:1").  ``at="core"``
(default) oversubscribes the top boundary: the switch below the top tier
splits its ports ratio:1 (48 down / 16 up at radix 64, 96/32 at 128), so there
are fewer uplinks into the top tier and fewer top switches; everything below
stays non-blocking, and pods keep full bisection inside.  ``at="edge"`` puts
the split on the leaves (the usual ToR oversubscription) and keeps the spine
and core tiers non-blocking: cheaper, since every tier above carries a third
of the traffic.  In a two-tier tree both settings oversubscribe the leaves.
Switch ports are rebalanced rather than left empty: an aggregation switch
with 32 of 64 ports down and 11 up would buy a third of its ports for nothing.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from topologies import clos
from topologies.counts import FabricCounts
from topologies.fabric import Fabric, FabricError

PLACEMENTS = ("core", "edge")


def layout(gpus: int, radix: int, ratio: float, at: str, tiers: int) -> Tuple[clos.ClosPlan, int]:
    """(tier plan, hosts per leaf) for the parameters."""
    name = "fattree-os" if ratio != 1.0 else "clos"     # the name `build` gives it
    if gpus < 2 or radix < 4 or radix % 2:
        raise FabricError(f"{name}: need gpus >= 2 and an even radix >= 4, got {gpus}, {radix}")
    if ratio < 1.0:
        raise FabricError(f"{name}: ratio must be >= 1 (1 = non-blocking), got {ratio}")
    if at not in PLACEMENTS:
        raise FabricError(f"{name}: at={at!r} not one of {PLACEMENTS}")
    half = radix // 2
    oversubscribed = clos.split_ports(radix, ratio)
    two_tier_down = oversubscribed[0]
    if tiers == 0:
        tiers = 2 if -(-gpus // two_tier_down) <= radix else 3
    if tiers == 2:
        leaf_down, leaf_up = oversubscribed
        spine = (half, half)
    else:
        leaf_down, leaf_up = oversubscribed if at == "edge" else (half, half)
        spine = (half, half) if at == "edge" else oversubscribed
    leaves = -(-gpus // leaf_down)
    shape = clos.plan(leaves, radix, leaf_up, tiers, spine_down=spine[0], spine_up=spine[1])
    return shape, leaf_down


def build(gpus: int = 24, radix: int = 8, ratio: float = 3.0, at: str = "core",
          gbps: float = 400.0, gpus_per_server: int = 8, tiers: int = 0) -> Fabric:
    shape, leaf_down = layout(gpus, radix, ratio, at, tiers)
    name = "fattree-os" if ratio != 1.0 else "clos"
    if gpus_per_server < 1:     # it numbers the servers: 0 divided by zero, < 0 made them negative
        raise FabricError(f"{name}: gpus_per_server must be >= 1, got {gpus_per_server}")
    fabric = Fabric(name, params={"gpus": gpus, "radix": radix, "ratio": ratio, "at": at,
                                  "gbps": gbps, "gpus_per_server": gpus_per_server,
                                  "tiers": shape.tiers})
    leaves = []
    for index, members in enumerate(clos.fill(gpus, leaf_down)):
        pod = index // shape.spine_down if shape.tiers == 3 else 0
        leaf = fabric.add_switch("leaf", pod=pod, radix=radix, port_gbps=gbps)
        leaves.append(leaf)
        for gpu in members:
            host = fabric.add_host("gpu", gpu=gpu, pod=pod, server=gpu // gpus_per_server,
                                   rail=gpu % gpus_per_server)
            fabric.add_link(host, leaf, gbps)
    clos.add_tiers(fabric, leaves, shape, gbps)
    return fabric


def build_nonblocking(gpus: int = 16, radix: int = 8, gbps: float = 400.0,
                      gpus_per_server: int = 8, tiers: int = 0) -> Fabric:
    """The FT baseline for any GPU count: `build` with ratio 1."""
    return build(gpus, radix, 1.0, "core", gbps, gpus_per_server, tiers)


def build_edge(gpus: int = 24, radix: int = 8, ratio: float = 3.0, gbps: float = 400.0,
               gpus_per_server: int = 8, tiers: int = 0) -> Fabric:
    """FT-OS with the oversubscription on the leaves (ToRs)."""
    return build(gpus, radix, ratio, "edge", gbps, gpus_per_server, tiers)


def counts(gpus: int = 24, radix: int = 8, ratio: float = 3.0, at: str = "core",
           gbps: float = 400.0, gpus_per_server: int = 8, tiers: int = 0) -> FabricCounts:
    shape, leaf_down = layout(gpus, radix, ratio, at, tiers)
    return clos.counts("fattree-os" if ratio != 1.0 else "clos", shape,
                       clos.fill(gpus, leaf_down), gbps)


def counts_nonblocking(gpus: int = 16, radix: int = 8, gbps: float = 400.0,
                       gpus_per_server: int = 8, tiers: int = 0) -> FabricCounts:
    return counts(gpus, radix, 1.0, "core", gbps, gpus_per_server, tiers)


def counts_edge(gpus: int = 24, radix: int = 8, ratio: float = 3.0, gbps: float = 400.0,
                gpus_per_server: int = 8, tiers: int = 0) -> FabricCounts:
    return counts(gpus, radix, ratio, "edge", gbps, gpus_per_server, tiers)


def bisection_half(fabric: Fabric) -> List[int]:
    """First half of the GPUs: whole leaves and pods, the cut through the top tier."""
    return list(range(fabric.params["gpus"] // 2))


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """``gpus`` GPUs on radix-``radix`` switches, the same rule at every scale;
    servers only label the hosts, so ``gpus_per_server`` is passed on when given."""
    return {"gpus": gpus, "radix": radix, "gpus_per_server": gpus_per_server}
