"""P -> D KV transfers as flows: TP rank i of P to TP rank i of D, one path per flow.

Section 7 of the 002 text ("Leveraging ZCube's Dual Paths" and "TP Rank
Consistency"): within a ZCube cell P = (A_p, B_p) reaches D = (A_d, B_d)
over two two-hop paths::

    path 1: P -> A_p -> B_d -> D          path 2: P -> B_p -> A_d -> D

KV is split by TP rank or routed per request, never per packet (large
transfers reordered hurt RDMA/TCP), and P's rank i always sends to D's
rank i ("don't do P rank i -> D rank j").  Strategies:

* ``tp-rank``: ranks 0, 2, 4, 6 take path 1 and 1, 3, 5, 7 path 2 (the
  text's example; `topologies.zcube.select_path` with ``tp_rank``).
* ``request``: every rank of a request takes the same path, picked by a
  stable hash of the request id (``select_path`` with ``request_id``).
* ``least-loaded``: every rank of a request takes the path whose busiest
  link carries the fewest KV streams now ("the scheduler also checks which
  path is less loaded"); path 1 on a tie.

On other fabrics TP rank k takes the k-th (mod their number) shortest
path of `placement.Topology.paths`, one per NIC port of a multi-port NIC,
routing there being the controller's business; on HPN, whose dual-ToR NIC
bonds its two ports, each rank's KV is split over both planes (one flow
per port).
The flow's endpoints are the path's first and last hosts: on ZCube they
choose the NIC ports, hence the path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from topologies import zcube
from traffic import kvcache
from traffic.flows import Flow, FlowDag
from traffic.placement import PlacementError, Topology
from traffic.requests import Request

STRATEGIES = ("tp-rank", "request", "least-loaded")
#: Fabrics whose GPUs bond their NIC ports: a rank's KV goes over all of them.
BONDED_NICS = ("hpn",)


def link_id(u: str, v: str) -> str:
    """A link's name, as `emu.experiments.base.path_links` writes it."""
    return "-".join(sorted((u, v)))


def path_links(path: Sequence[str]) -> List[str]:
    return [link_id(u, v) for u, v in zip(path, path[1:])]


def _busiest(path: Sequence[str], link_streams: Mapping[str, int]) -> int:
    return max((link_streams.get(link, 0) for link in path_links(path)), default=0)


def rank_paths(topo: Topology, p: int, d: int, strategy: str = "tp-rank",
               request_id: Optional[str] = None,
               link_streams: Optional[Mapping[str, int]] = None) -> List[List[str]]:
    """One node path per TP rank k, from P's rank-k GPU to D's rank-k GPU."""
    if strategy not in STRATEGIES:
        raise PlacementError(f"unknown path strategy {strategy!r}; known: "
                             f"{', '.join(STRATEGIES)}")
    src, dst = topo.node(p), topo.node(d)
    if src.tp != dst.tp:
        raise PlacementError(f"P node {p} has TP {src.tp} and D node {d} TP {dst.tp}: "
                             "rank i -> rank i needs equal TP sizes")
    pairs = list(zip(src.gpus, dst.gpus))
    if topo.fabric.name != "zcube":
        # Multi-port NICs elsewhere (HPN's planes): TP rank k on port k mod ports.
        return [topo.paths(a, b)[k % len(topo.paths(a, b))] for k, (a, b) in enumerate(pairs)]
    # ZCube: `zcube.select_path`'s choice (path k mod 2 for rank k, or the request
    # id's crc32 mod 2) among `zcube.paths`, read from the topology's cache of it:
    # the same paths, without recomputing them for every rank of every request.
    if strategy == "tp-rank":
        return [list(topo.paths(a, b)[k % 2]) for k, (a, b) in enumerate(pairs)]
    if request_id is None:
        raise PlacementError(f"path strategy {strategy!r} needs the request id")
    if strategy == "request":
        index = zcube.request_path_index(request_id)
        return [list(topo.paths(a, b)[index]) for a, b in pairs]
    loads = link_streams or {}
    candidates = [[topo.paths(a, b)[index] for a, b in pairs] for index in (0, 1)]
    return min(candidates, key=lambda paths: max(_busiest(path, loads) for path in paths))


def _check_rank_paths(topo: Topology, p: int, d: int, paths: Sequence[Sequence[str]]) -> None:
    src, dst = topo.node(p), topo.node(d)
    if len(paths) != src.tp:
        raise PlacementError(f"{len(paths)} paths for P node {p} of TP {src.tp}: one per rank")
    for rank, path in enumerate(paths):
        if len(path) < 2 or path[0] not in src.hosts[rank] or path[-1] not in dst.hosts[rank]:
            raise PlacementError(f"rank {rank} path {list(path)} does not run from a host of P "
                                 f"node {p}'s rank {rank} {list(src.hosts[rank])} to one of D "
                                 f"node {d}'s {list(dst.hosts[rank])}")


def rank_bytes(total_bytes: int, tp: int, bytes_scale: float = 1.0) -> int:
    """One rank's share of a request's KV (1/tp, per section 3), scaled, >= 1 byte."""
    return max(1, math.ceil(total_bytes * bytes_scale / tp))


@dataclass(frozen=True)
class KvTransfer:
    """One request's KV transfer: its rank paths and the flows that run them."""

    request_id: str
    p: int
    d: int
    paths: Tuple[Tuple[str, ...], ...]
    dag: FlowDag

    @property
    def links(self) -> List[str]:
        """Every link any rank's flow crosses (for path credits)."""
        return sorted({link for path in self.paths for link in path_links(path)})

    def flow_links(self) -> Dict[str, List[str]]:
        return {flow.id: path_links(path) for flow, path in zip(self.dag.flows, self.paths)}


def kv_transfer(topo: Topology, request: Request, p: int, d: int,
                config: kvcache.ModelConfig = kvcache.GLM_5_1, on_home: bool = True,
                strategy: str = "tp-rank", link_streams: Optional[Mapping[str, int]] = None,
                at_s: float = 0.0, after: Sequence[str] = (), bytes_scale: float = 1.0,
                group: str = "kv", paths: Optional[Sequence[Sequence[str]]] = None
                ) -> KvTransfer:
    """The request's KV transfer from P node ``p`` to D node ``d``: one flow per TP rank.

    Bytes: ``request.transfer_bytes(config, on_home)`` (the delta KV when D is
    the session's home, else the whole prompt's), split evenly over the
    ranks and multiplied by ``bytes_scale`` (emulations shrink GB to what
    their links move in seconds).  Flow ids are ``<request id>-r<rank>``.
    ``paths`` (one per TP rank, e.g. `traffic.fastlane`'s fast-lane routes)
    replaces `rank_paths`; they must run from P's rank-k GPU to D's.
    """
    given = paths
    if paths is None:
        paths = rank_paths(topo, p, d, strategy, request.id, link_streams)
    else:
        paths = [list(path) for path in paths]
        _check_rank_paths(topo, p, d, paths)
    size = rank_bytes(request.transfer_bytes(config, on_home), len(paths), bytes_scale)
    if topo.fabric.name in BONDED_NICS and given is None:
        return _bonded_transfer(topo, request, p, d, size, at_s, after, group)
    flows = [Flow(id=f"{request.id}-r{rank}", src=path[0], dst=path[-1], bytes=size,
                  at_s=at_s, after=tuple(after), group=group)
             for rank, path in enumerate(paths)]
    return KvTransfer(request.id, p, d, tuple(tuple(path) for path in paths),
                      FlowDag(flows, external=tuple(after)))


def _bonded_transfer(topo: Topology, request: Request, p: int, d: int, rank_size: int,
                     at_s: float, after: Sequence[str], group: str) -> KvTransfer:
    """Each rank's share spread over every port of its bonded NIC (one flow per
    port, ids ``<request id>-r<rank>p<port>``): HPN's dual-ToR NIC sends on
    both planes at once."""
    flows, paths = [], []
    for rank, (a, b) in enumerate(zip(topo.node(p).gpus, topo.node(d).gpus)):
        ports = topo.paths(a, b)
        for port, path in enumerate(ports):
            paths.append(tuple(path))
            flows.append(Flow(id=f"{request.id}-r{rank}p{port}", src=path[0], dst=path[-1],
                              bytes=max(1, math.ceil(rank_size / len(ports))), at_s=at_s,
                              after=tuple(after), group=group))
    return KvTransfer(request.id, p, d, tuple(paths), FlowDag(flows, external=tuple(after)))


def kv_flows(topo: Topology, request: Request, p: int, d: int, **options) -> FlowDag:
    """`kv_transfer`'s flows only."""
    return kv_transfer(topo, request, p, d, **options).dag


def kv_flow_dag(topo: Topology, transfers: Sequence[Tuple[Request, int, int, bool]],
                start_s: Callable[[Request], float] = lambda request: request.arrival_s,
                **options) -> FlowDag:
    """Several requests' KV flows in one DAG, (request, p, d, on_home) each; a
    request's flows start at ``start_s(request)`` (its arrival by default;
    an emulation adds its prefill time)."""
    return FlowDag.merge(*(kv_flows(topo, request, p, d, on_home=on_home,
                                    at_s=start_s(request), **options)
                           for request, p, d, on_home in transfers))
