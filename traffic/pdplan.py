"""A P/D request stream planned before it is replayed: pairing, P queue, KV flows.

Prefill is not emulated, so the P side is planned ahead: every request is
paired with a P and a D (`traffic.pairing`), queued on its P (FIFO, one
prefill at a time, ``ms_per_ktoken`` real ms per 1K new prompt tokens x
tdf) and given its KV flows (`traffic.kvflows`: TP rank i of P -> rank i of
D, KV bytes x bw_factor x tdf), due when its prefill ends.  On Rail-Fabric a
large request's ranks are routed onto KV fast lanes (`traffic.fastlane`).
All times are emulated seconds from the replay start; a flow id is
``<request id>-r<rank>`` (`request_of`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from traffic import fastlane, kvcache
from traffic import requests as rq
from traffic.kvflows import KvTransfer, kv_transfer
from traffic.pairing import ClusterState, pairing
from traffic.placement import Placement, Topology


@dataclass
class Planned:
    """One request as planned before the replay (emulated seconds from the replay start)."""

    request: rq.Request
    p: int
    d: int
    on_home: bool
    arrival_s: float
    prefill_start_s: float
    prefill_end_s: float
    transfer: KvTransfer
    lanes: Optional[fastlane.LaneTransfer] = None      # Rail-Fabric: the route of each rank

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def flow_ids(self) -> List[str]:
        return [flow.id for flow in self.transfer.dag.flows]

    @property
    def kv_bytes(self) -> int:
        return sum(flow.bytes for flow in self.transfer.dag.flows)


def request_of(flow_id: str) -> str:
    """The request a KV flow belongs to (flow ids are ``<request id>-r<rank>``)."""
    return flow_id.rsplit("-r", 1)[0]


def prefill_seconds(request: rq.Request, ms_per_ktoken: float) -> float:
    """Real prefill compute, in seconds: the new (uncached) tokens."""
    return ms_per_ktoken / 1000.0 * request.new_tokens / 1000.0


def plan(topo: Topology, place: Placement, stream: Sequence[rq.Request], scale,
         pairing_name: str = "fixed", ms_per_ktoken: float = 10.0, seed: int = 0,
         strategy: str = "tp-rank", config: kvcache.ModelConfig = kvcache.GLM_5_1,
         lane_threshold_bytes: float = fastlane.LARGE_KV_BYTES) -> List[Planned]:
    """Pair every request, queue its prefill on P (FIFO, one at a time) and build
    its KV flows, due when the prefill ends; times in emulated seconds
    (``scale``: `traffic.scale.Scale`).  On Rail-Fabric a large request's ranks
    are routed onto fast lanes (`traffic.fastlane`, spread over the lanes as
    planned so far)."""
    chooser = pairing(pairing_name, topo, place, config, seed=seed, strategy=strategy)
    lanes = fastlane.fast_lanes(topo.fabric) if topo.fabric.name == "rail-fabric" else None
    lane_use: Dict[str, int] = defaultdict(int)
    state = ClusterState()
    p_free: Dict[int, float] = defaultdict(float)
    planned: List[Planned] = []
    queues = _Queues(place.prefill, place.decode)
    for request in stream:
        arrival = scale.emu_seconds(request.arrival_s)
        state.p_queue, state.d_queue = queues.at(arrival, planned)
        choice = chooser.choose(request, state)
        state.record(request, choice)
        start = max(arrival, p_free[choice.p])
        end = start + scale.emu_seconds(prefill_seconds(request, ms_per_ktoken))
        p_free[choice.p] = end
        routed = None
        if lanes is not None:
            routed = fastlane.kv_transfer(topo, request, choice.p, choice.d,
                                          threshold_bytes=lane_threshold_bytes, config=config,
                                          on_home=choice.on_home, planned=lane_use, lanes=lanes,
                                          strategy=strategy, at_s=end,
                                          bytes_scale=scale.bw_factor * scale.tdf)
            transfer = routed.transfer
        else:
            transfer = kv_transfer(topo, request, choice.p, choice.d, config=config,
                                   on_home=choice.on_home, strategy=strategy, at_s=end,
                                   bytes_scale=scale.bw_factor * scale.tdf)
        planned.append(Planned(request, choice.p, choice.d, choice.on_home, arrival, start,
                               end, transfer, routed))
        queues.add(choice.p, choice.d, end)
    return planned


class _Queues:
    """Requests planned so far whose prefill has not ended at a given arrival, per
    P and per D: ``p_queue[p]`` = #{planned x: x.p == p, x.prefill_end_s > arrival}
    (likewise for D), for every P and D of the placement, in its order.

    Kept incrementally: a heap of the prefill ends still counted, popped as the
    arrivals pass them (each request enters and leaves once).  An arrival earlier
    than the previous one (a stream not in arrival order) recounts from the plan,
    so the counts are always exactly those of the definition.
    """

    def __init__(self, prefill: Sequence[int], decode: Sequence[int]):
        self.prefill, self.decode = list(prefill), list(decode)
        self.p_count = dict.fromkeys(self.prefill, 0)
        self.d_count = dict.fromkeys(self.decode, 0)
        self.ends: List[tuple] = []           # heap of (prefill end, seq, p, d) still counted
        self.last: Optional[float] = None
        self.seq = 0

    def _count(self, p: int, d: int, step: int) -> None:
        if p in self.p_count:
            self.p_count[p] += step
        if d in self.d_count:
            self.d_count[d] += step

    def add(self, p: int, d: int, end: float) -> None:
        if self.last is not None and not end > self.last:
            return                            # already over at the latest arrival asked
        heapq.heappush(self.ends, (end, self.seq, p, d))
        self.seq += 1
        self._count(p, d, +1)

    def at(self, arrival: float, planned: Sequence[Planned]):
        """(p_queue, d_queue) at ``arrival``: new dicts, as the planner always gave."""
        if self.last is not None and arrival < self.last:
            self._recount(arrival, planned)
        self.last = arrival
        while self.ends and not self.ends[0][0] > arrival:
            _, _, p, d = heapq.heappop(self.ends)
            self._count(p, d, -1)
        return dict(self.p_count), dict(self.d_count)

    def _recount(self, arrival: float, planned: Sequence[Planned]) -> None:
        self.p_count = dict.fromkeys(self.prefill, 0)
        self.d_count = dict.fromkeys(self.decode, 0)
        self.ends = []
        for x in planned:
            if x.prefill_end_s > arrival:
                self.ends.append((x.prefill_end_s, self.seq, x.p, x.d))
                self.seq += 1
                self._count(x.p, x.d, +1)
        heapq.heapify(self.ends)
