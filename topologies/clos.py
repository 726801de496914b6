"""Folded-Clos tiers above a row of leaf switches, shared by FT, FT-OS, ROFT and rail-only.

The caller creates the leaves and wires the hosts to them; this module adds
the tiers above and mirrors the same arithmetic analytically (`plan`), so
full-scale counts need no graph.

Two tiers (leaf count L <= radix R)::

        sp0   sp1  ...  sp(S-1)       S = ceil(L*u1 / R) spines
         | \\  / |   ...              leaf l uplink j -> spine (l*u1 + j) mod S
        l0   l1   ...   l(L-1)        u1 uplinks per leaf (parallel links when S < u1)

Three tiers (pods of d2 leaves, u1 spines per pod, cores in u1 planes)::

                c . c      c . c        plane i: ceil(P*u2 / R) cores
               /     \\   /     \\       spine i of every pod -> plane-i cores
        pod 0: sp0 .. sp(u1-1)   pod 1: sp0 ...    u2 uplinks per spine
               |  \\  /  |              every leaf of a pod -> every spine of it once
               l0 .. l(d2-1)            d2 leaves per pod

A full k-ary fat-tree is the special case L = k^2/2, u1 = d2 = u2 = k/2;
truncated trees (fewer pods) keep the same switch fan-outs, which is how the
ZCube text's ROFT reaches 640 switches for 16,384 GPUs with R = 128
(256 leaves, 256 spines, 128 cores).  Every leaf keeps its u1 uplinks and
every spine its u2 uplinks even when its pod is only partly filled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

from topologies.fabric import Fabric, FabricError


def split_ports(radix: int, ratio: float) -> tuple:
    """(downlinks, uplinks) of a switch that oversubscribes its uplinks ratio:1."""
    down = int(round(radix * ratio / (ratio + 1.0)))
    if not 1 <= down < radix:
        raise FabricError(f"radix {radix} cannot be split {ratio}:1 into downlinks and uplinks")
    return down, radix - down


@dataclass(frozen=True)
class ClosPlan:
    """The shape of the tiers above L leaves; the builder and `counts` share it."""

    leaves: int
    radix: int
    leaf_up: int
    tiers: int
    spine_down: int = 0     # leaves per pod (three tiers only)
    spine_up: int = 0       # spine -> core uplinks (three tiers only)

    @property
    def pods(self) -> int:
        return math.ceil(self.leaves / self.spine_down) if self.tiers == 3 else 1

    @property
    def spines(self) -> int:
        if self.tiers == 2:
            return math.ceil(self.leaves * self.leaf_up / self.radix)
        return self.pods * self.leaf_up

    @property
    def cores_per_plane(self) -> int:
        return math.ceil(self.pods * self.spine_up / self.radix) if self.tiers == 3 else 0

    @property
    def cores(self) -> int:
        return self.leaf_up * self.cores_per_plane

    @property
    def switch_counts(self) -> Dict[str, int]:
        counts = {"leaf": self.leaves, "spine": self.spines}
        if self.tiers == 3:
            counts["core"] = self.cores
        return counts

    @property
    def inter_switch_links(self) -> int:
        links = self.leaves * self.leaf_up
        if self.tiers == 3:
            links += self.spines * self.spine_up
        return links


def plan(leaves: int, radix: int, leaf_up: int, tiers: int = 0,
         spine_down: Optional[int] = None, spine_up: Optional[int] = None) -> ClosPlan:
    """Choose two tiers when every spine can reach every leaf (L <= R), else three."""
    if leaves < 1 or leaf_up < 1:
        raise FabricError(f"clos: need at least one leaf and one uplink, got {leaves}, {leaf_up}")
    spine_down = radix // 2 if spine_down is None else spine_down
    spine_up = radix - spine_down if spine_up is None else spine_up
    if tiers == 0:
        tiers = 2 if leaves <= radix else 3
    if tiers == 2:
        if leaves > radix:
            raise FabricError(f"clos: {leaves} leaves exceed radix {radix}: two tiers cannot "
                              "connect every leaf to every spine")
        return ClosPlan(leaves, radix, leaf_up, 2)
    if tiers != 3:
        raise FabricError(f"clos: tiers must be 0 (auto), 2 or 3, got {tiers}")
    result = ClosPlan(leaves, radix, leaf_up, 3, spine_down, spine_up)
    if result.pods > radix or leaf_up > radix:
        raise FabricError(f"clos: {leaves} leaves need {result.pods} pods, more than radix "
                          f"{radix} allows in three tiers")
    return result


def add_tiers(fabric: Fabric, leaves: List[str], shape: ClosPlan, gbps: float,
              **coords) -> Dict[str, List[str]]:
    """Create the spines (and cores) of `shape` above `leaves`; returns role -> names."""
    if len(leaves) != shape.leaves:
        raise FabricError(f"clos: plan is for {shape.leaves} leaves, got {len(leaves)}")
    switch = dict(radix=shape.radix, port_gbps=gbps, **coords)
    if shape.tiers == 2:
        spines = [fabric.add_switch("spine", **switch) for _ in range(shape.spines)]
        for index, leaf in enumerate(leaves):
            for uplink in range(shape.leaf_up):
                fabric.add_link(leaf, spines[(index * shape.leaf_up + uplink) % len(spines)], gbps)
        return {"leaf": list(leaves), "spine": spines}
    planes = [[fabric.add_switch("core", plane=i, **switch) for _ in range(shape.cores_per_plane)]
              for i in range(shape.leaf_up)]
    spines = []
    for pod in range(shape.pods):
        pod_spines = [fabric.add_switch("spine", pod=pod, plane=i, **switch)
                      for i in range(shape.leaf_up)]
        spines += pod_spines
        for leaf in leaves[pod * shape.spine_down:(pod + 1) * shape.spine_down]:
            fabric.graph.nodes[leaf]["pod"] = pod
            for spine in pod_spines:
                fabric.add_link(leaf, spine, gbps)
        for i, spine in enumerate(pod_spines):
            cores = planes[i]
            for uplink in range(shape.spine_up):
                fabric.add_link(spine, cores[(pod * shape.spine_up + uplink) % len(cores)], gbps)
    return {"leaf": list(leaves), "spine": spines, "core": [c for p in planes for c in p]}


def diameter(shape: ClosPlan) -> int:
    """Forwarding hops between the farthest hosts: leaf, leaf-spine-leaf or five."""
    if shape.leaves == 1:
        return 1
    return 3 if shape.tiers == 2 or shape.pods == 1 else 5


def cut_capacity(shape: ClosPlan, leaf_members: List[List[int]], side) -> int:
    """Max-flow, in links, from the hosts in `side` to the other hosts.

    Leaves spread their uplinks evenly over spines and planes, so the tiers act
    as a tree (leaf -> pod -> top) whose edges carry u1 and u1*u2 links; on a
    tree, meeting supply and demand at the lowest common switch is optimal.
    """
    def meet(children, up_capacity):
        supply = sum(c[0] for c in children)
        demand = sum(c[1] for c in children)
        local = min(supply, demand)
        matched = local + sum(c[2] for c in children)
        return (min(supply - local, up_capacity), min(demand - local, up_capacity), matched)

    leaves = []
    for members in leaf_members:
        inside = sum(1 for m in members if m in side)
        leaves.append(meet([(inside, len(members) - inside, 0)], shape.leaf_up))
    if shape.tiers == 3:
        pods = [meet(leaves[p * shape.spine_down:(p + 1) * shape.spine_down],
                     shape.leaf_up * shape.spine_up) for p in range(shape.pods)]
        return meet(pods, 0)[2]
    return meet(leaves, 0)[2]


def counts(name: str, shape: ClosPlan, leaf_members: List[List[int]], gbps: float,
           copies: int = 1):
    """`FabricCounts` of `copies` identical Clos fabrics (rail-only has one per rail).

    Hosts are the ids in `leaf_members`; the bisection cut puts the first half
    of the ids on one side.
    """
    from topologies.counts import FabricCounts, cable_modules

    hosts = sum(len(m) for m in leaf_members)
    side = set(range(hosts // 2))
    cables, modules = cable_modules({gbps: copies * (hosts + shape.inter_switch_links)}, {})
    switches = {role: copies * n for role, n in shape.switch_counts.items()}
    return FabricCounts(
        fabric=name, gpus=copies * hosts, nic_ports=copies * hosts, switches=switches,
        switch_ports={role: (shape.radix, gbps) for role in switches},
        cables=cables, optical_modules=modules, diameter=diameter(shape),
        bisection_gbps=copies * cut_capacity(shape, leaf_members, side) * gbps)


def fill(items: int, per_leaf: int) -> List[List[int]]:
    """Ids 0..items-1 in consecutive groups of `per_leaf` (the last may be short)."""
    return [list(range(start, min(start + per_leaf, items))) for start in range(0, items, per_leaf)]
