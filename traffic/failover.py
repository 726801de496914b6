"""Where a GPU's traffic goes when the switch behind one of its NIC ports fails.

Section 2 of the 002 text ("structural fault tolerance"): on ZCube every
GPU has a NIC port on each of two switch layers, so "when a single switch
fails, affected GPUs simply switch to another port without rerouting
through NVLink"; HPN's dual-ToR gives each NIC a port in each plane; ROFT
has one NIC port per GPU, so a GPU whose rail switch fails has to send
through NVLink to a GPU of its server on another rail and share that GPU's
NIC.  `failover_host` picks the host (NIC port) that carries a flow
instead, in that order of preference:

1. the host itself, if its switch is alive;
2. another NIC port of the same GPU (ZCube, HPN, Rail-Fabric);
3. a NIC port of another GPU of the same server (NVLink, then that GPU's
   NIC: ROFT, RailFly), the lowest GPU id first;
4. None: the GPU is cut off.

The NVLink hop itself is not emulated (it is far faster than a NIC port);
what the emulation shows is the NIC the traffic now shares.

A flow has two ends, and `FlowEnds` moves the other end where the moved
one needs it: into the same network (HPN's planes never meet, so an end
moved alone would leave the flow no path), and to a port one link from the
moved end's switch where its own is farther (ZCube's other path).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import networkx as nx

from topologies.fabric import HOST, Fabric, FabricError


def host_switch(fabric: Fabric, host: str) -> str:
    return fabric.host_port(host)[0]


def tor_switches(fabric: Fabric) -> List[str]:
    """Switches with a GPU host on some port: the ones a "ToR failure" may hit."""
    with_hosts = {host_switch(fabric, host) for host in fabric.hosts}
    return [switch for switch in fabric.switches if switch in with_hosts]


def failover_host(fabric: Fabric, host: str, failed: Collection[str]) -> Optional[str]:
    """The host carrying ``host``'s traffic once the switches in ``failed`` are down."""
    if fabric.kind(host) != HOST:
        raise FabricError(f"{host!r} is not a host of {fabric.name}")
    if host_switch(fabric, host) not in failed:
        return host
    return next((h for h in stand_ins(fabric, host) if host_switch(fabric, h) not in failed),
                None)


def stand_ins(fabric: Fabric, host: str) -> List[str]:
    """The other NIC ports that may carry ``host``'s traffic, best first: its
    GPU's other ports (by port), then its server mates' (by GPU, port)."""
    nodes = fabric.graph.nodes
    gpu, server = nodes[host].get("gpu"), nodes[host].get("server")
    same_gpu = sorted((h for h in fabric.hosts if h != host and gpu is not None
                       and nodes[h].get("gpu") == gpu), key=lambda h: nodes[h].get("nic_port", 0))
    same_server = sorted((h for h in fabric.hosts if h != host and server is not None and
                          nodes[h].get("server") == server and nodes[h].get("gpu") != gpu),
                         key=lambda h: (nodes[h].get("gpu", 0), nodes[h].get("nic_port", 0)))
    return same_gpu + same_server


def failover_map(fabric: Fabric, failed: Collection[str]) -> Dict[str, Optional[str]]:
    """`failover_host` of every host behind a failed switch."""
    unknown = sorted(set(failed) - set(fabric.switches))
    if unknown:
        raise FabricError(f"{unknown} are not switches of {fabric.name}")
    return {host: failover_host(fabric, host, failed) for host in fabric.hosts
            if host_switch(fabric, host) in failed}


def networks(fabric: Fabric) -> Dict[str, int]:
    """Each host's network: the connected part of the switches its switch is
    in (hosts never forward here).  HPN's two planes are two networks; most
    fabrics are one."""
    part: Dict[str, int] = {}
    for index, switches in enumerate(nx.connected_components(
            fabric.graph.subgraph(fabric.switches))):
        part.update(dict.fromkeys(switches, index))
    return {host: part[host_switch(fabric, host)] for host in fabric.hosts}


class FlowEnds:
    """The hosts that carry a flow once the hosts in ``moves`` (`failover_map`)
    failed over: ``ends(src, dst)`` -> (src, dst), None for an end cut off.

    Each end behind a failed switch moves to its port taking over.  When one
    end moved, the other end keeps its port if that is alive, in the moved
    end's network and on the moved end's switch or a neighbour of it; else it
    takes the first of its GPU's ports that is:

    * HPN: the planes never meet, so the other end follows into the plane
      taking over (its GPU's port there), as a bonded NIC takes a flow on
      the plane it arrives on;
    * ZCube: a flow from port 0 to a peer's port 1 (one A-B link) whose port
      0 failed goes from port 1 to the peer's port 0, ZCube's other path,
      not port 1 to port 1 across three switches over hashed links;
    * one port per GPU (ROFT's server mate's NIC): the other end stays.

    Only if its GPU has no such port does it fall back to a server mate's
    port in that network (`stand_ins`), else it is cut off (None).  The
    testbed's failure event and the model's both move flows with it, so that
    both send a moved flow between the same two ports.
    """

    def __init__(self, fabric: Fabric, moves: Mapping[str, Optional[str]]):
        self.fabric = fabric
        self.moves = dict(moves)
        self.network = networks(fabric)
        self._stand_ins: Dict[str, List[str]] = {}

    def __call__(self, src: str, dst: str) -> Tuple[Optional[str], Optional[str]]:
        new_src, new_dst = self.moves.get(src, src), self.moves.get(dst, dst)
        if new_src is None or new_dst is None:
            return new_src, new_dst
        if new_src != src and new_dst == dst:
            return new_src, self._nearest(dst, new_src)       # the destination follows
        if new_dst != dst and new_src == src:
            return self._nearest(src, new_dst), new_dst       # the source does
        return new_src, new_dst

    def touches(self, src: str, dst: str) -> bool:
        """Whether an end of a flow from ``src`` to ``dst`` is behind the failed switch."""
        return src in self.moves or dst in self.moves

    def cut_off(self, src: str, dst: str) -> bool:
        """Whether an end of the flow is behind the failed switch with no port
        left to take it: the flow cannot move, and times out."""
        return self.touches(src, dst) and None in self(src, dst)

    def resend(self, src: str, dst: str) -> Optional[Tuple[str, str]]:
        """The two ports a flow is sent between once the switch failed, or None
        when it stays where it is: no end behind the switch, an end cut off,
        or both ends now on one NIC (no longer a network flow).  The
        testbed's failure event, the standby it arms ahead and the model's
        failure all ask this."""
        if not self.touches(src, dst):
            return None
        new_src, new_dst = self(src, dst)
        if new_src is None or new_dst is None or new_src == new_dst:
            return None
        return new_src, new_dst

    def _nearest(self, host: str, to: str) -> Optional[str]:
        """The port for ``host``'s end of a flow whose other end moved to ``to``."""
        if host not in self._stand_ins:
            self._stand_ins[host] = stand_ins(self.fabric, host)
        nodes = self.fabric.graph.nodes
        gpu = nodes[host].get("gpu")
        near = host_switch(self.fabric, to)
        best, best_key = None, None
        for order, candidate in enumerate([host] + self._stand_ins[host]):
            if candidate in self.moves or self.network[candidate] != self.network[to]:
                continue
            switch = host_switch(self.fabric, candidate)
            hops = 0 if switch == near else 1 if self.fabric.graph.has_edge(switch, near) else 2
            mate = gpu is None or nodes[candidate].get("gpu") != gpu
            # Its own port while that is at most one link from the moved end's
            # switch; a farther one only for a port that is.
            key = (mate, hops > 1, order)
            if best_key is None or key < best_key:
                best, best_key = candidate, key
        return best


def busiest_tor(fabric: Fabric, flows: Sequence[Tuple[str, str, int]]) -> str:
    """The ToR switch whose hosts send and receive the most bytes of ``flows``
    ((src, dst, bytes) each): the worst single ToR to lose.  Ties go to the
    switch listed first."""
    load: Dict[str, int] = defaultdict(int)
    for src, dst, size in flows:
        load[host_switch(fabric, src)] += size
        load[host_switch(fabric, dst)] += size
    tors = tor_switches(fabric)
    if not tors:
        raise FabricError(f"{fabric.name} has no switch with hosts")
    return max(tors, key=lambda s: (load.get(s, 0), -tors.index(s)))
