"""SiP-OCS: every GPU's optical ports land on a flat OCS patch panel; GPUs forward.

The SiP-OCS baseline of RFabric (section 5: "a direct-connect optical
architecture where NICs connect through a flat optical patch panel",
after SiP-ML [11])::

        OCS plane 0      OCS plane 1    ...   OCS plane d-1     one flat panel per port
        |  |  |  |       |  |  |  |           |  |  |  |        index, N ports each
        g0 g1 g2 g3 ...  g0 g1 g2 g3 ...      g0 g1 g2 g3 ...
        GPU g: port p -> plane p, OCS port g+1 (``ports_per_gpu`` = d optical ports)

There are no packet switches: a circuit joins two GPUs, and traffic between
GPUs without a circuit is forwarded by intermediate GPUs (route with
``routing`` distances over ``transit_hosts``; `transit_next_hops` gives the
per-GPU output ports).  GPU hosts are therefore multi-homed, one link per
port; `Fabric.host_port` does not apply to them.

Default circuits (``circuits="ring-chords"``): plane 0 pairs GPUs (2i, 2i+1),
plane 1 pairs (2i+1, 2i+2), which together make a ring; each further plane
p pairs every even GPU g with g + s (mod N) for an odd stride s close to
N^((p-1)/(d-1)), chords that cut the diameter (35 circuits at 16,384 GPUs
with d = 4, instead of 8,192 on the ring).  Every GPU keeps one circuit per plane, so
the logical graph is d-regular.  ``circuits="none"`` leaves every port dark.

Each panel is drawn as one OCS of radix N: a real panel of more GPUs than a
device's radix spans several devices, as RFabric's Figure 5 draws "multiple
OCS devices as monolithic blocks"; cost is per OCS port, so the count of
devices does not change it.  Parameters: ``gpus`` (even), ``ports_per_gpu``
(4), ``port_gbps`` (100: 4 x 100G keeps the 400 Gb/s per GPU of the other
fabrics; an assumption, SiP-ML's own GPUs had more), ``technology``.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import networkx as nx

from topologies.counts import FabricCounts, cable_modules, hop_distances
from topologies.fabric import HOST, Circuit, Fabric, FabricError, normalize_circuit

CIRCUIT_SETS = ("ring-chords", "none")


def _check(gpus: int, ports_per_gpu: int) -> None:
    if gpus < 2 or gpus % 2 or ports_per_gpu < 2:
        raise FabricError(f"sip-ocs: need an even gpus >= 2 and ports_per_gpu >= 2, "
                          f"got {gpus}, {ports_per_gpu}")


def plane_pairs(gpus: int, plane: int, planes: int) -> List[Tuple[int, int]]:
    """GPU pairs joined by the default circuits of one plane."""
    if plane == 0:
        return [(g, g + 1) for g in range(0, gpus, 2)]
    if plane == 1:
        return [(g, (g + 1) % gpus) for g in range(1, gpus, 2)]
    stride = int(round(gpus ** ((plane - 1) / (planes - 1)))) | 1
    return [(g, (g + stride) % gpus) for g in range(0, gpus, 2)]


def build(gpus: int = 8, ports_per_gpu: int = 4, port_gbps: float = 100.0,
          technology: str = "mems", circuits: str = "ring-chords") -> Fabric:
    _check(gpus, ports_per_gpu)
    fabric = Fabric("sip-ocs", params={"gpus": gpus, "ports_per_gpu": ports_per_gpu,
                                       "port_gbps": port_gbps, "technology": technology,
                                       "transit_hosts": True})
    planes = [fabric.add_ocs(radix=gpus, technology=technology, plane=p)
              for p in range(ports_per_gpu)]
    for gpu in range(gpus):
        host = fabric.add_host("gpu", gpu=gpu, server=gpu)
        for ocs in planes:
            fabric.add_link(host, ocs, port_gbps, medium="ocs")
    for plane, ocs in enumerate(planes):
        fabric.set_circuits(ocs, circuit_set(fabric, plane, circuits))
    return fabric


def circuit_set(fabric: Fabric, plane: int, name: str) -> Set[Circuit]:
    """OCS port pairs of a named circuit set on one plane (GPU g is port g + 1)."""
    if name not in CIRCUIT_SETS:
        raise FabricError(f"sip-ocs: circuit set {name!r} not one of {CIRCUIT_SETS}")
    if name == "none":
        return set()
    gpus, planes = fabric.params["gpus"], fabric.params["ports_per_gpu"]
    return {normalize_circuit(a + 1, b + 1) for a, b in plane_pairs(gpus, plane, planes)
            if a != b}


def _eccentricity(gpus: int, ports_per_gpu: int) -> int:
    """Circuit hops from GPU 0 to the farthest GPU over the default circuits.

    Shifting by two and the map g -> -1-g preserve every plane's pairs, so all
    GPUs see the same distances and one BFS gives the diameter."""
    neighbours: Dict[int, List[int]] = {g: [] for g in range(gpus)}
    for plane in range(ports_per_gpu):
        for a, b in plane_pairs(gpus, plane, ports_per_gpu):
            neighbours[a].append(b)
            neighbours[b].append(a)
    dist = hop_distances(neighbours, 0)
    return max(dist.values()) if len(dist) == gpus else -1


def counts(gpus: int = 8, ports_per_gpu: int = 4, port_gbps: float = 100.0,
           technology: str = "mems", circuits: str = "ring-chords") -> FabricCounts:
    _check(gpus, ports_per_gpu)
    ports = gpus * ports_per_gpu
    cables, modules = cable_modules({}, {port_gbps: ports})
    hops = _eccentricity(gpus, ports_per_gpu) if circuits == "ring-chords" else -1
    return FabricCounts(
        fabric="sip-ocs", gpus=gpus, nic_ports=ports, switches={}, switch_ports={},
        cables=cables, optical_modules=modules, ocs=ports_per_gpu, ocs_ports=ports,
        diameter=hops - 1 if hops > 0 else None,
        bisection_gbps=gpus // 2 * ports_per_gpu * port_gbps)


def transit_next_hops(logical: nx.MultiGraph) -> Dict[str, Dict[str, Tuple[int, ...]]]:
    """GPU -> destination GPU -> its ports on shortest circuit paths (GPUs forward)."""
    hosts = [n for n, d in logical.nodes(data=True) if d["kind"] == HOST]
    table: Dict[str, Dict[str, Tuple[int, ...]]] = {h: {} for h in hosts}
    for dst in hosts:
        dist = nx.single_source_shortest_path_length(logical, dst)
        for node in hosts:
            if node == dst or node not in dist:
                continue
            ports = {data["ports"][node] for _, peer, data in logical.edges(node, data=True)
                     if dist.get(peer) == dist[node] - 1}
            table[node][dst] = tuple(sorted(ports))
    return table


def bisection_half(fabric: Fabric) -> List[int]:
    return list(range(fabric.params["gpus"] // 2))


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """``gpus`` GPUs on the flat panel: there are no packet switches or servers."""
    return {"gpus": gpus}
