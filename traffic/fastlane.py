"""Rail-Fabric KV fast lanes: large KV flows reserve a fast-lane path before they start.

Section 10 of the 002 text: "large KV takes reserved KV fast lanes, small
KV uses base expander"; the scheduler "knows approximate KV size before
prefill begins and pre-reserves ... link bandwidth quotas"; a short prompt
"uses base expander fabric, don't occupy KV fast lane".  Here:

* **large or short.**  A request's transfer is large when its real KV bytes
  (``request.transfer_bytes``: the delta on D_home, else the whole prompt)
  reach ``threshold_bytes`` (`LARGE_KV_BYTES`, 1 GB: "GB-scale KV").  Short
  transfers take `traffic.kvflows.rank_paths` (the base fabric's
  destination routes).
* **routes** (`rank_routes`, at plan time).  TP rank k of P sends to rank k
  of D.  A large rank picks, among its GPUs' NIC-port hosts, a pair whose
  switches a fast lane joins: ``P host -> P's switch -> lane -> D's switch
  -> D host``, on a lane no other rank of the request takes and planned
  least so far; else a switch both GPUs share (``local``, one hop, nothing
  to reserve); else a lane another rank takes; else the base path
  (``expander``).  The hosts are fixed here because the replayer arms a flow
  (its iperf3 ends) before it is due.
* **reservation** (`LaneTable`, `FastLaneGate`, when the flow is due).  A
  lane carries at most ``lane_capacity`` flows at once, per direction
  (``duplex``; links are full duplex); waiting flows are served in the order
  they asked.  A busy lane makes the flow wait (``when_busy="wait"``) or go
  unreserved over the base fabric from the same hosts (``"expander"``).  The
  gate's ``pin``/``unpin`` hooks install and remove the path in the
  controller (`controllers.pins`, control ops ``pin``/``unpin``), so the
  order is reserve -> pin -> start ... end -> unpin -> release.

`FastLaneGate` has CreditGate's shape (``gate(flow) -> bool``,
``done(result)``); `GateChain` runs D-ingress credits first, then lanes.
Everything is pure except the clock and the hooks it is given.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import (Callable, Dict, Iterable, List, Mapping, MutableMapping, Optional, Sequence,
                    Tuple)

from topologies import rail_fabric, registry
from topologies.fabric import Fabric
from traffic import kvcache
from traffic.kvflows import KvTransfer, kv_transfer as base_kv_transfer, link_id, rank_paths
from traffic.placement import PlacementError, Topology
from traffic.requests import Request

LARGE_KV_BYTES = 1_000_000_000
LANE, LOCAL, EXPANDER = "lane", "local", "expander"
KINDS = (LANE, LOCAL, EXPANDER)
WAIT = "wait"
WHEN_BUSY = (WAIT, EXPANDER)
FALLBACK = "fallback"       # a lane route that went over the base fabric (lane busy)
UNPLANNED = "unplanned"     # a flow the gate has no route for (admitted, not reserved)


def rail_fabric_spec(gpus: int, gpus_per_server: int) -> str:
    """A Rail-Fabric spec string with ``gpus`` GPUs, small enough to emulate.

    The registry's small build (`topologies.rail_fabric.small_params`): 16
    GPUs give ``rail-fabric,switches=8,downlinks=4,degree=2,d_degree=3,
    d_switches=4,fast_lanes=3,seed=19,gpus_per_server=2`` (for
    gpus_per_server=2): 8 switches, 32 NIC-port hosts, 10 expander links and
    12 fast lanes.
    """
    return registry.spec_at("rail-fabric", gpus, gpus_per_server=gpus_per_server, small=True)


# ---------------------------------------------------------------- lanes and routes
@dataclass(frozen=True)
class Lane:
    """The fast-lane link(s) between two switches; ``id`` as `kvflows.link_id` names links."""

    id: str
    a: str
    b: str
    ports: Tuple[Tuple[int, int], ...]      # (port on a, port on b) per fast link, sorted


def fast_lanes(fabric: Fabric) -> Dict[str, Lane]:
    """Lane id -> Lane.  Parallel fast links between one switch pair are one lane
    (a node path cannot tell them apart; a pin takes the first)."""
    ports: Dict[Tuple[str, str], List[Tuple[int, int]]] = defaultdict(list)
    for a, pa, b, pb in rail_fabric.fast_lane_ports(fabric):
        ports[(a, b)].append((pa, pb))
    return {link_id(a, b): Lane(link_id(a, b), a, b, tuple(sorted(p)))
            for (a, b), p in sorted(ports.items())}


@dataclass(frozen=True)
class RankRoute:
    """One rank flow's path and how it goes: over a lane, within a switch, or the base."""

    kind: str
    path: Tuple[str, ...]
    lane: Optional[str] = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"route kind {self.kind!r} not one of {KINDS}")
        if (self.kind == LANE) != (self.lane is not None):
            raise ValueError(f"a {self.kind} route {'needs' if self.kind == LANE else 'has no'} "
                             "lane")

    @property
    def src(self) -> str:
        return self.path[0]

    @property
    def dst(self) -> str:
        return self.path[-1]

    @property
    def direction(self) -> Optional[str]:
        """The lane crossed as "from>to" switches (lane routes only)."""
        return f"{self.path[1]}>{self.path[2]}" if self.kind == LANE else None


def gpu_routes(topo: Topology, src_gpu: int, dst_gpu: int,
               lanes: Optional[Mapping[str, Lane]] = None) -> Tuple[List[RankRoute],
                                                                    List[RankRoute]]:
    """(lane routes, local routes) between two GPUs over every pair of their NIC hosts."""
    lanes = fast_lanes(topo.fabric) if lanes is None else lanes
    over_lanes, local = [], []
    for src in topo.gpu_hosts[src_gpu]:
        for dst in topo.gpu_hosts[dst_gpu]:
            a, b = topo.switch_of[src], topo.switch_of[dst]
            if a == b:
                local.append(RankRoute(LOCAL, (src, a, dst)))
            elif link_id(a, b) in lanes:
                over_lanes.append(RankRoute(LANE, (src, a, b, dst), link_id(a, b)))
    return over_lanes, local


def rank_routes(topo: Topology, p: int, d: int, large: bool = True,
                planned: Optional[MutableMapping[str, int]] = None,
                lanes: Optional[Mapping[str, Lane]] = None, prefer_local: bool = False,
                strategy: str = "tp-rank", request_id: Optional[str] = None
                ) -> List[RankRoute]:
    """The route of every TP rank of a P node -> D node transfer (rank k -> rank k).

    Short (``large=False``): `kvflows.rank_paths`, all ``expander``.  Large,
    per rank, the first of: a lane no earlier rank of this request took
    (the one least used in ``planned``, a lane id -> count that this
    function adds its choices to, so that a planner spreads requests over
    the lanes); a switch both GPUs share (``local``); a lane another rank
    took (the two would queue for it); the base path (``expander``).
    ``prefer_local`` puts a shared switch first.
    """
    src, dst = topo.node(p), topo.node(d)
    if src.tp != dst.tp:
        raise PlacementError(f"P node {p} has TP {src.tp} and D node {d} TP {dst.tp}: "
                             "rank i -> rank i needs equal TP sizes")
    base = rank_paths(topo, p, d, strategy, request_id)
    if not large:
        return [RankRoute(EXPANDER, tuple(path)) for path in base]
    lanes = fast_lanes(topo.fabric) if lanes is None else lanes
    planned = Counter() if planned is None else planned
    taken: Counter = Counter()
    routes = []
    for rank, (a, b) in enumerate(zip(src.gpus, dst.gpus)):
        over_lanes, local = gpu_routes(topo, a, b, lanes)

        def order(route: RankRoute) -> tuple:
            if route.kind == LOCAL:
                return (-1 if prefer_local else 1,)
            if taken[route.lane]:           # another rank of this request is on it
                return (2, taken[route.lane], planned.get(route.lane, 0))
            return (0, planned.get(route.lane, 0))

        candidates = over_lanes + local[:1]
        choice = min(candidates, key=order) if candidates else \
            RankRoute(EXPANDER, tuple(base[rank]))
        if choice.kind == LANE:
            taken[choice.lane] += 1
            planned[choice.lane] = planned.get(choice.lane, 0) + 1
        routes.append(choice)
    return routes


def is_large(request: Request, threshold_bytes: int = LARGE_KV_BYTES,
             config: kvcache.ModelConfig = kvcache.GLM_5_1, on_home: bool = True) -> bool:
    """Real KV bytes of the transfer (not the emulated ones) against the threshold."""
    return request.transfer_bytes(config, on_home) >= threshold_bytes


@dataclass(frozen=True)
class LaneTransfer:
    """A request's KV transfer with the route of each rank flow."""

    transfer: KvTransfer
    routes: Tuple[RankRoute, ...]
    large: bool

    def flow_routes(self) -> Dict[str, RankRoute]:
        return {flow.id: route for flow, route in zip(self.transfer.dag.flows, self.routes)}


def kv_transfer(topo: Topology, request: Request, p: int, d: int,
                threshold_bytes: int = LARGE_KV_BYTES,
                config: kvcache.ModelConfig = kvcache.GLM_5_1, on_home: bool = True,
                planned: Optional[MutableMapping[str, int]] = None,
                lanes: Optional[Mapping[str, Lane]] = None, prefer_local: bool = False,
                strategy: str = "tp-rank", at_s: float = 0.0, after: Sequence[str] = (),
                bytes_scale: float = 1.0, group: str = "kv") -> LaneTransfer:
    """`traffic.kvflows.kv_transfer` with each rank flow between the hosts of its route."""
    large = is_large(request, threshold_bytes, config, on_home)
    routes = rank_routes(topo, p, d, large, planned, lanes, prefer_local, strategy, request.id)
    transfer = base_kv_transfer(topo, request, p, d, config=config, on_home=on_home,
                                at_s=at_s, after=after, bytes_scale=bytes_scale, group=group,
                                paths=[route.path for route in routes])
    return LaneTransfer(transfer, tuple(routes), large)


# ---------------------------------------------------------------- reservation (pure)
class LaneError(ValueError):
    """A reservation call does not fit the table's state."""


class LaneTable:
    """Flows on each lane, at most ``capacity`` at once, a FIFO of waiting flows.

    The key of a reservation is the lane, or the lane and its direction
    when ``duplex`` (each direction of a full-duplex link has its own
    ``capacity``).  Times are passed in.
    """

    def __init__(self, capacity: int = 1, duplex: bool = True):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise LaneError(f"lane_capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self.duplex = duplex
        self.holders: Dict[str, List[str]] = defaultdict(list)   # key -> flow ids
        self.waiting: Dict[str, List[str]] = defaultdict(list)   # key -> flow ids, FIFO
        self.held: Dict[str, str] = {}                            # flow id -> key
        self.peak: Dict[str, int] = defaultdict(int)
        self.series: List[Tuple[float, str, int]] = []           # (time, key, flows on it)

    def key(self, route: RankRoute) -> str:
        if route.kind != LANE:
            raise LaneError(f"only lane routes are reserved, not {route.kind} {route.path}")
        return f"{route.lane}:{route.direction}" if self.duplex else route.lane

    def free(self, key: str) -> int:
        return self.capacity - len(self.holders[key])

    def reserve(self, flow_id: str, route: RankRoute, now: float, wait: bool = True) -> bool:
        """Take a place on the route's lane now (True), or queue for one (``wait``)."""
        key = self.key(route)
        if self.held.get(flow_id) == key:
            return True
        if flow_id in self.held:
            raise LaneError(f"flow {flow_id} already holds {self.held[flow_id]}")
        queue = self.waiting[key]
        if flow_id not in queue:
            if not wait:
                if queue or self.free(key) < 1:
                    return False
            else:
                queue.append(flow_id)
        if flow_id in queue and queue.index(flow_id) >= self.free(key):
            return False
        if flow_id in queue:
            queue.remove(flow_id)
        self.holders[key].append(flow_id)
        self.held[flow_id] = key
        self.peak[key] = max(self.peak[key], len(self.holders[key]))
        self.series.append((now, key, len(self.holders[key])))
        return True

    def withdraw(self, flow_id: str) -> None:
        """Leave every wait queue (a flow that gave up waiting)."""
        for queue in self.waiting.values():
            if flow_id in queue:
                queue.remove(flow_id)

    def release(self, flow_id: str, now: float) -> Optional[str]:
        """Give the flow's place back; its key, or None if it held none."""
        self.withdraw(flow_id)
        key = self.held.pop(flow_id, None)
        if key is not None:
            self.holders[key].remove(flow_id)
            self.series.append((now, key, len(self.holders[key])))
        return key

    def check(self) -> None:
        for key, flows in self.holders.items():
            if len(flows) > self.capacity:
                raise LaneError(f"{key} carries {len(flows)} flows, capacity {self.capacity}")


class FastLaneGate:
    """Fast-lane reservations as the replayer's gate (the shape of CreditGate).

    ``gate(flow)``: a lane route reserves its lane (FIFO), then calls
    ``pin(flow_id, path)`` and admits the flow; a busy lane keeps it
    waiting, or with ``when_busy="expander"`` admits it unreserved and
    unpinned.  Local, base and unknown flows pass at once.  ``done(result)``
    calls ``unpin(flow_id)`` for a pinned flow, then releases its lane.
    """

    def __init__(self, routes: Mapping[str, RankRoute], lane_capacity: int = 1,
                 when_busy: str = WAIT, duplex: bool = True,
                 clock: Callable[[], float] = time.time,
                 pin: Optional[Callable[[str, List[str]], object]] = None,
                 unpin: Optional[Callable[[str], object]] = None):
        if when_busy not in WHEN_BUSY:
            raise LaneError(f"when_busy must be one of {WHEN_BUSY}, got {when_busy!r}")
        self.routes = dict(routes)
        self.table = LaneTable(lane_capacity, duplex)
        self.when_busy = when_busy
        self.clock = clock
        self.pin = pin
        self.unpin = unpin
        self.asked_s: Dict[str, float] = {}
        self.waits_s: Dict[str, float] = {}       # lane flows: reserved - first asked
        self.went: Dict[str, str] = {}            # flow id -> lane, local, expander, fallback...
        self.pinned: set = set()

    @classmethod
    def from_transfers(cls, transfers: Iterable[LaneTransfer], **options) -> "FastLaneGate":
        routes: Dict[str, RankRoute] = {}
        for transfer in transfers:
            routes.update(transfer.flow_routes())
        return cls(routes, **options)

    def gate(self, flow) -> bool:
        route = self.routes.get(flow.id)
        if route is None or route.kind != LANE or (route.src, route.dst) != (flow.src, flow.dst):
            # Not planned here, not a lane, or moved to other hosts since: no reservation.
            self.went.setdefault(flow.id, UNPLANNED if route is None or route.kind == LANE
                                 else route.kind)
            return True
        if flow.id in self.table.held:
            return True
        now = self.clock()
        self.asked_s.setdefault(flow.id, now)
        if not self.table.reserve(flow.id, route, now, wait=self.when_busy == WAIT):
            if self.when_busy == EXPANDER:
                self.went[flow.id] = FALLBACK
                return True
            return False
        if self.pin is not None:
            try:
                self.pin(flow.id, list(route.path))
            except BaseException:
                self.table.release(flow.id, self.clock())
                raise
            self.pinned.add(flow.id)
        self.waits_s[flow.id] = now - self.asked_s[flow.id]
        self.went[flow.id] = LANE
        self.table.check()
        return True

    def done(self, result) -> None:
        self.release(result.id)

    def release(self, flow_id: str) -> None:
        """Unpin and free a flow's lane (``done`` does it; also for a flow
        cancelled without a result, e.g. moved to other hosts)."""
        if flow_id in self.pinned:
            self.pinned.discard(flow_id)
            if self.unpin is not None:
                self.unpin(flow_id)
        self.table.release(flow_id, self.clock())

    def summary(self) -> dict:
        counts = Counter(self.went.values())
        waits = list(self.waits_s.values())
        return {"lane_flows_count": counts.get(LANE, 0),
                "local_flows_count": counts.get(LOCAL, 0),
                "expander_flows_count": counts.get(EXPANDER, 0),
                "fallback_flows_count": counts.get(FALLBACK, 0),
                "lane_wait_mean_s": sum(waits) / len(waits) if waits else 0.0,
                "lane_wait_max_s": max(waits, default=0.0),
                "lane_peak_count": max(self.table.peak.values(), default=0),
                "lane_capacity_count": self.table.capacity}


class GateChain:
    """Several gates as one: a flow passes when every gate, asked in order, admits it
    (a later gate is not asked while an earlier one refuses); ``done`` tells all."""

    def __init__(self, *gates):
        self.gates = gates

    def gate(self, flow) -> bool:
        return all(gate.gate(flow) for gate in self.gates)

    def done(self, result) -> None:
        for gate in self.gates:
            gate.done(result)
