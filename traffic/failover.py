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
"""

from __future__ import annotations

from collections import defaultdict
from typing import Collection, Dict, List, Optional, Sequence, Tuple

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
    nodes = fabric.graph.nodes
    gpu, server = nodes[host].get("gpu"), nodes[host].get("server")

    def alive(candidate: str) -> bool:
        return candidate != host and host_switch(fabric, candidate) not in failed

    same_gpu = sorted((h for h in fabric.hosts if gpu is not None and nodes[h].get("gpu") == gpu
                       and alive(h)), key=lambda h: nodes[h].get("nic_port", 0))
    if same_gpu:
        return same_gpu[0]
    same_server = sorted((h for h in fabric.hosts if server is not None and
                          nodes[h].get("server") == server and alive(h)),
                         key=lambda h: (nodes[h].get("gpu", 0), nodes[h].get("nic_port", 0)))
    return same_server[0] if same_server else None


def failover_map(fabric: Fabric, failed: Collection[str]) -> Dict[str, Optional[str]]:
    """`failover_host` of every host behind a failed switch."""
    unknown = sorted(set(failed) - set(fabric.switches))
    if unknown:
        raise FabricError(f"{unknown} are not switches of {fabric.name}")
    return {host: failover_host(fabric, host, failed) for host in fabric.hosts
            if host_switch(fabric, host) in failed}


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
