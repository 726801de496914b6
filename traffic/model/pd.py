"""A planned P/D request stream served on the flow-level model, event for event.

The emulator serves a plan (`traffic.pdplan`) with `emu.experiments.pd_serve.serve`:
the replayer (`emu.live.replay.Replayer`) makes each KV flow *due* at its
request's prefill end, asks the gate (`traffic.pdgate.CreditGate`, chained on
Rail-Fabric with `traffic.fastlane.FastLaneGate`) for every due flow not yet
admitted, in due order (plan order among ties), again after every flow that
ends, starts the admitted ones, and tells the gate of every flow that ends.
`serve_model` does the same on `traffic.model.engine.FlowSim` over a
`traffic.model.network.ModelNetwork`, with the *same* gate objects (the
clock injected is the model's), so credits, their FIFO order and the lane
reservations are the emulator's own code:

=====================================  ==========================================
replayer (live)                        model (here)
=====================================  ==========================================
flow due at ``at_s`` (prefill end)     a due heap, one ``sim.at`` at the next due
each pass: every due, unadmitted flow  the flows whose answer may have changed:
asked in due order                     new due ones, those of requests just
                                       granted credit (`Credits.events`), those
                                       queued on a lane just freed; in due order
                                       (a flow whose gate state did not change
                                       would get the same "no", with no effect)
admitted + server listening: go        ``sim.add_flows`` (``go_s`` later)
flow path: ECMP on the five-tuple      ``net`` routes ``("route", src, dst,
                                       key_of(flow id))``; a pinned lane flow
                                       (the gate's ``pin`` hook) its node path
client reports the end: ``on_done``    the engine's ``on_done``: record, gate.done
``events`` at their time; ToRFailure   `NodeFailure`: links down at ``at_s``,
moves flows once the controller saw    flows moved ``notice_s`` later, as
                                       `emu.experiments.pd_failure.ToRFailure`
=====================================  ==========================================

What the model leaves out (see `ReplayConstants`): process start-up and the
replay loop's passes (``go_s``: admission to first byte, 0 by default),
TCP's ramp and loss (``efficiency``, ``startup_s`` of the engine), and
during a failure's notice delay the stale routes of flows that only *cross*
the failed switch (the model's routing changes at once; flows with an end
behind it wait on a dead link in both).  Times are emulated seconds from the
replay start (``t0`` = 0), so the same plan gives comparable numbers.

The per-flow records are the replayer's own `traffic.results.FlowResult` s
(model seconds; ``status`` ok, moved or timeout), and what `traffic.pdstats`
makes of them comes back in `ModelServed`, shaped like
`emu.experiments.pd_serve.Served`.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from traffic import failover, fastlane
from traffic.flows import Flow
from traffic.model.engine import FlowSim
from traffic.model.network import ModelNetwork, key_of
from traffic.pdgate import CreditGate
from traffic.pdplan import Planned, request_of
from traffic.pdstats import ingress_series, request_rows, summarize_fabric
from traffic.results import FlowResult

#: Control-plane notice after a switch fails, emulated seconds, where the
#: calibration has none (`Calibration.notice_s`, measured by failing ToRs of an
#: idle emulator: the controller saw all their links down and rerouted 16-29 ms
#: later); flows behind the switch move only then.
DEFAULT_NOTICE_S = 0.022
#: The replayer arms a flow (starts its processes) this long before it is due
#: (`emu.live.replay.ARM_AHEAD_S`); a failure moves an armed flow under a new id.
ARM_AHEAD_S = 2.0
#: A flow that can never end (a GPU cut off by a failure) times out this long
#: after it started (`emu.live.replay.MIN_FLOW_TIMEOUT_S`), releasing its credit.
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReplayConstants:
    """What the model cannot know from the plan and the fabric.

    ``efficiency`` (share of a link's rate a flow's goodput reaches),
    ``hop_latency_s`` and ``startup_s`` go to `FlowSim` as they are; ``go_s``
    is the time from a flow's admission to its release in the model (the
    replayer's go message and the client's start); ``notice_s`` the control
    plane's notice of a failure (`Calibration.notice_s`); ``resend_s`` how long
    after a running flow is cancelled its resend goes, beyond ``go_s``
    (`Calibration.resend_s`); ``arm_ahead_s`` and
    ``timeout_s`` the replayer's constants.
    """

    efficiency: float = 1.0
    hop_latency_s: float = 0.0
    startup_s: float = 0.0
    go_s: float = 0.0
    notice_s: float = DEFAULT_NOTICE_S
    resend_s: float = 0.0
    arm_ahead_s: float = ARM_AHEAD_S
    timeout_s: float = TIMEOUT_S


@dataclass(frozen=True)
class ModelSettings:
    """The replay settings the model uses, with the names of
    `emu.experiments.pd_serve.ServeSettings` (which can be passed instead)."""

    scale: object                           # traffic.scale.Scale
    path_credits: Optional[int] = None
    lane_capacity: int = 1
    lane_when_busy: str = fastlane.WAIT


#: The model's flow records are the replayer's own (`traffic.results.FlowResult`).
ModelFlowResult = FlowResult


@dataclass
class NodeFailure:
    """A switch fails at ``at_s`` (all its links down at once); ``notice_s``
    later (None: the calibration's) the flows with an end behind it move as
    ``moves`` says (`traffic.failover.failover_map`), both ends together
    (`traffic.failover.FlowEnds`, as the testbed's event): a started one is
    cancelled and resent in full from the new port, due at once; an armed one
    (due within ``arm_ahead_s``, or waiting at the gate) gets a new id and
    keeps its due time; any other simply changes hosts.  With ``restore`` the
    switch comes back after the run (the next run starts healthy).

    After the run it holds what `emu.experiments.pd_failure.ToRFailure`
    reports: ``moved`` (resent), ``rehosted`` (not started), ``stranded``
    (an end cut off), ``noticed_s`` (the notice delay, seconds) and
    ``moved_after_s`` (from the failure to the flows' move: the same here).
    """

    switch: str
    at_s: float
    moves: Dict[str, Optional[str]]
    notice_s: Optional[float] = None
    restore: bool = True
    noticed_s: Optional[float] = None
    moved_after_s: Optional[float] = None
    moved: List[str] = field(default_factory=list)
    rehosted: List[str] = field(default_factory=list)
    stranded: List[str] = field(default_factory=list)

    @classmethod
    def tor(cls, fabric, planned: Sequence[Planned], index: int, switch: str = "auto",
            notice_s: Optional[float] = None) -> "NodeFailure":
        """pd-failure's event: ``switch`` ("auto": the busiest ToR of the plan,
        `failover.busiest_tor`) fails when request ``index`` arrives."""
        if switch == "auto":
            switch = failover.busiest_tor(fabric, [(f.src, f.dst, f.bytes) for x in planned
                                                   for f in x.transfer.dag.flows])
        return cls(switch, planned[index].arrival_s, failover.failover_map(fabric, [switch]),
                   notice_s)

    def finish(self, timeout_s: float = 0.0) -> None:
        """ToRFailure's shape: nothing to wait for in the model."""


@dataclass
class ModelServed:
    """`emu.experiments.pd_serve.Served`'s fields, from the model, plus its own figures."""

    results: List[FlowResult]
    rows: List[dict]
    summary: dict
    streams: List[dict]
    ingress: List[dict]
    t0: float = 0.0
    hottest: List[dict] = field(default_factory=list)
    link_warnings: List[str] = field(default_factory=list)
    credit_gate: Optional[CreditGate] = None
    lane_gate: Optional[fastlane.FastLaneGate] = None
    wall_s: float = 0.0


def emulated_network(fabric, scale, ecmp_seed: int = 1) -> ModelNetwork:
    """The fabric at the emulator's rates (`traffic.scale.Scale`: real Gbit/s ->
    emulated bit/s), so that the plan's emulated bytes and seconds fit."""
    return ModelNetwork(fabric, bps_of=lambda gbps: scale.emu_mbps(gbps) * 1e6,
                        ecmp_seed=ecmp_seed)


# ---------------------------------------------------------------- the run
_EPS = 1e-12


class _Run:
    """One replay of a plan on the model: the replayer's state, keyed for speed."""

    def __init__(self, planned: Sequence[Planned], net: ModelNetwork, d_credits: Optional[int],
                 settings, failure: Optional[NodeFailure], calibration: ReplayConstants,
                 progress: Optional[Callable[[int, int], None]]):
        self.planned = planned
        self.net = net
        self.cal = calibration
        self.failure = failure
        self.progress = progress
        self.flows: Dict[str, Flow] = {}
        self.order: Dict[str, tuple] = {}
        self.results: Dict[str, FlowResult] = {}
        index = 0                             # plan order: the replayer's _order
        for x in planned:
            for flow in x.transfer.dag.flows:
                self.flows[flow.id] = flow
                self.order[flow.id] = (index,)
                self.results[flow.id] = FlowResult(flow.id, flow.src, flow.dst, flow.bytes,
                                                        flow.step, flow.group)
                index += 1
        self.sim = FlowSim(net.capacity_bps, net.router(self._spec),
                           efficiency=calibration.efficiency,
                           hop_latency_s=calibration.hop_latency_s,
                           startup_s=calibration.startup_s, on_done=self._on_done)
        clock = lambda: self.sim.now       # noqa: E731 - the gates' clock is the model's
        self.credit_gate = CreditGate(planned, d_credits or max(1, len(planned)), clock=clock,
                                      path_limit=settings.path_credits)
        self.lane_gate = None
        self.gate = self.credit_gate
        routed = [x.lanes for x in planned if x.lanes is not None]
        if routed:
            self.lane_gate = fastlane.FastLaneGate.from_transfers(
                routed, lane_capacity=settings.lane_capacity, when_busy=settings.lane_when_busy,
                clock=clock, pin=self._pin, unpin=self._unpin)
            self.gate = fastlane.GateChain(self.credit_gate, self.lane_gate)
        self.pins: Dict[str, List[str]] = {}
        self.fid_of_sim: List[str] = []
        self.sim_of: Dict[str, int] = {}
        self.fired: Dict[str, float] = {}
        self.admitted: set = set()
        self.done: set = set()
        self.doomed: set = set()              # an end cut off: times out once started
        self.resent: set = set()              # resends of flows cancelled while running
        self.wait_credit: Dict[str, List[str]] = defaultdict(list)   # request -> due flows
        self.wait_lane: Dict[str, List[str]] = defaultdict(list)     # lane key -> due flows
        self._events_seen = 0                 # cursor into credit_gate.credits.events
        self.due: List[Tuple[float, tuple, str]] = [(f.at_s, self.order[fid], fid)
                                                    for fid, f in self.flows.items()]
        heapq.heapify(self.due)
        self._wake: Optional[float] = None    # time of the next due callback asked for
        self._freed: List[str] = []           # lane waiters behind a moved flow's lane

    # ------------------------------------------------------------ hooks
    def _pin(self, fid: str, path: List[str]) -> None:
        self.pins[fid] = list(path)

    def _unpin(self, fid: str) -> None:
        self.pins.pop(fid, None)

    def _spec(self, sim_id: int) -> tuple:
        fid = self.fid_of_sim[sim_id]
        if fid in self.pins:
            return ("nodes", self.pins[fid])
        flow = self.flows[fid]
        return ("route", flow.src, flow.dst, key_of(fid))

    # ------------------------------------------------------------ due flows
    def _schedule(self) -> None:
        while self.due and self.due[0][2] in self.done:
            heapq.heappop(self.due)
        if not self.due:
            return
        t = max(self.due[0][0], self.sim.now)
        if self._wake is None or t < self._wake - _EPS or self._wake < self.sim.now - _EPS:
            self._wake = t
            self.sim.at(t, self._on_due)

    def _on_due(self, sim) -> None:
        self._wake = None
        now = sim.now
        ready = []
        while self.due and self.due[0][0] <= now + _EPS:
            _, _, fid = heapq.heappop(self.due)
            if fid not in self.done and fid not in self.admitted:
                ready.append(fid)
        self._pass(ready)
        self._schedule()

    def _due_s(self, fid: str) -> float:
        return self.flows[fid].at_s

    # ------------------------------------------------------------ the gate
    def _granted_since(self) -> List[str]:
        events = self.credit_gate.credits.events
        new = [rid for _, kind, rid, _ in events[self._events_seen:] if kind == "grant"]
        self._events_seen = len(events)
        return new

    def _granted_waiters(self) -> List[str]:
        """Due flows of the requests granted credit since the last look (a
        release grants the next waiting requests of its D)."""
        return [f for rid in self._granted_since() for f in self.wait_credit.pop(rid, [])]

    def _pass(self, candidates: List[str]) -> None:
        """Ask the gate for ``candidates`` in due order (plan order among ties),
        as the replay loop does in one pass, and start what it admits."""
        start: List[str] = []
        candidates = list(candidates) + self._granted_waiters()
        while candidates:
            candidates = sorted(set(candidates), key=lambda f: (self._due_s(f), self.order[f]))
            for fid in candidates:
                if fid in self.admitted or fid in self.done:
                    continue
                if self.gate.gate(self.flows[fid]):
                    self.admitted.add(fid)
                    start.append(fid)
                    continue
                rid = request_of(fid)
                if rid not in self.credit_gate.granted:
                    self.wait_credit[rid].append(fid)
                else:
                    route = self.lane_gate.routes[fid]
                    self.wait_lane[self.lane_gate.table.key(route)].append(fid)
            candidates = self._granted_waiters()
        if start:
            self._start(start)

    def _start(self, fids: List[str]) -> None:
        now = self.sim.now
        first = self.sim.n_flows
        for k, fid in enumerate(fids):
            self.fired[fid] = now
            self.sim_of[fid] = first + k
            self.fid_of_sim.append(fid)
        # A resend is due (and asks the gate) at once, as the replayer's, and
        # goes once its new processes run: `ReplayConstants.resend_s` later.
        delay = self.cal.go_s if not self.resent.intersection(fids) else np.array(
            [self.cal.go_s + (self.cal.resend_s if f in self.resent else 0.0) for f in fids])
        ids = self.sim.add_flows(np.array([self.flows[f].bytes for f in fids], dtype=float),
                                 delay_s=delay, base_s=now)
        if int(np.asarray(ids)[0]) != first or len(ids) != len(fids):
            raise RuntimeError("FlowSim.add_flows gave ids out of sequence")
        for fid in fids:
            if fid in self.doomed:
                self._time_out_later(fid)

    # ------------------------------------------------------------ ends
    def _on_done(self, sim_ids: np.ndarray, t: float) -> None:
        fids = sorted((self.fid_of_sim[int(i)] for i in sim_ids), key=self.order.__getitem__)
        again: List[str] = []
        for fid in fids:
            if fid in self.done:
                continue
            result = self.results[fid]
            result.start = float(self.sim.released_s[self.sim_of[fid]])
            result.end = float(t)
            result.bytes_received = result.bytes
            if result.end > result.start:
                result.goodput_mbps = result.bytes * 8 / (result.end - result.start) / 1e6
            result.status = "ok"
            again += self._finish(fid, result)
        self._pass(again)
        if self.progress:
            self.progress(len(self.done), len(self.flows))

    def _finish(self, fid: str, result: FlowResult) -> List[str]:
        """The flow ended (ok or timeout): tell the gate, as the replayer's
        ``on_done``; returns the lane waiters whose answer may have changed."""
        self.done.add(fid)
        key = self.lane_gate.table.held.get(fid) if self.lane_gate is not None else None
        self.gate.done(result)
        return self.wait_lane.pop(key, []) if key is not None else []

    def _time_out_later(self, fid: str) -> None:
        at = self.fired[fid] + self.cal.timeout_s

        def expire(sim, fid=fid):
            if fid in self.done:
                return
            sid = self.sim_of[fid]
            delivered = self.sim.cancel(np.array([sid]))
            result = self.results[fid]
            result.start, result.end = self.fired[fid], sim.now
            result.bytes_received = int(np.asarray(delivered).sum()) if delivered is not None \
                else 0
            result.status, result.error = "timeout", f"no result after {self.cal.timeout_s:.0f} s"
            self._pass(self._finish(fid, result))
        self.sim.at(max(at, self.sim.now), expire)

    # ------------------------------------------------------------ failure
    def _fail(self, sim) -> None:
        changed = self.net.fail_node(self.failure.switch)
        self.sim.set_capacity(np.asarray(changed, dtype=np.int64),
                              self.net.capacity_bps[np.asarray(changed, dtype=np.int64)])
        notice = self.cal.notice_s if self.failure.notice_s is None else self.failure.notice_s
        self.failure.noticed_s = notice
        self.sim.at(sim.now + notice, self._move_flows)

    def _move_flows(self, sim) -> None:
        """`ToRFailure.move_flows`: started flows first, then the others, each
        flow with an end behind the failed switch to the port taking over."""
        moves, failure, now = self.failure.moves, self.failure, sim.now
        failure.moved_after_s = now - failure.at_s
        # Both ends move together: an end alone on the other plane of HPN
        # would leave the flow no path (the blackhole) until it timed out.
        ends = failover.FlowEnds(self.net.fabric, moves)
        affected = [fid for fid, f in self.flows.items()
                    if fid not in self.done and ends.touches(f.src, f.dst)]
        affected.sort(key=lambda fid: fid not in self.fired)          # stable
        again: List[str] = []
        for fid in affected:
            flow = self.flows[fid]
            new_ends = ends.resend(flow.src, flow.dst)
            if new_ends is None:
                if ends.cut_off(flow.src, flow.dst):
                    failure.stranded.append(fid)
                self.doomed.add(fid)       # it stays behind the dead switch: it times out
                if fid in self.fired:
                    self._time_out_later(fid)
                continue
            started = fid in self.fired
            new_id = self._move(fid, *new_ends, now)
            if started:
                failure.moved.append(fid)
            else:
                failure.rehosted.append(fid)
            if new_id in self.flows and self.flows[new_id].at_s <= now + _EPS:
                again.append(new_id)
            elif new_id != fid:
                heapq.heappush(self.due, (self.flows[new_id].at_s, self.order[new_id], new_id))
        # The controller rerouted: flows still running take the new routes.
        self.sim.reroute()
        again += self._freed
        self._freed = []
        self._pass(again)
        self._schedule()

    def _move(self, fid: str, src: str, dst: str, now: float) -> str:
        """`Replayer.move`: the id that carries the flow now."""
        flow = self.flows[fid]
        armed = fid in self.fired or flow.at_s <= now + self.cal.arm_ahead_s
        if not armed:
            self.flows[fid] = dataclasses.replace(flow, src=src, dst=dst)
            self.results[fid].src, self.results[fid].dst = src, dst
            return fid
        started = fid in self.fired
        count = sum(1 for other in self.flows if other.startswith(fid + "~m")) + 1
        new_id = f"{fid}~m{count}"
        result = self.results[fid]
        result.status, result.error = "moved", f"moved to {src}->{dst} as {new_id}"
        result.start, result.end = self.fired.get(fid, now), now
        if started:
            delivered = self.sim.cancel(np.array([self.sim_of[fid]]))
            result.bytes_received = int(np.asarray(delivered).sum()) if delivered is not None \
                else 0
            flow = dataclasses.replace(flow, after=(), at_s=now)
            self.resent.add(new_id)
        self.done.add(fid)
        self.flows[new_id] = dataclasses.replace(flow, id=new_id, src=src, dst=dst)
        self.order[new_id] = self.order[fid] + (count,)
        self.results[new_id] = FlowResult(new_id, src, dst, flow.bytes, flow.step, flow.group)
        if self.lane_gate is not None:           # serve's on_moved: free the old one's lane
            key = self.lane_gate.table.held.get(fid)
            self.lane_gate.release(fid)
            if key is not None:
                self._freed += self.wait_lane.pop(key, [])
        return new_id

    # ------------------------------------------------------------ run
    def run(self) -> List[FlowResult]:
        if self.failure is not None:
            self.sim.at(self.failure.at_s, self._fail)
        self._schedule()
        try:
            self.sim.run()
        finally:
            if self.failure is not None and self.failure.restore and \
                    self.failure.switch in self.net.down_nodes:
                self.net.restore_node(self.failure.switch)
        for fid, result in self.results.items():
            if fid not in self.done and result.status == "pending" and fid in self.fired:
                result.status, result.error = "timeout", "never ended in the model"
                result.start, result.end = self.fired[fid], self.fired[fid] + self.cal.timeout_s
        ordered = sorted(self.results, key=self.order.__getitem__)
        return [self.results[fid] for fid in ordered]


def serve_model(planned: Sequence[Planned], net: ModelNetwork, settings,
                d_credits: Optional[int], *, failure: Optional[NodeFailure] = None,
                calibration: ReplayConstants = ReplayConstants(),
                progress: Optional[Callable[[int, int], None]] = None) -> ModelServed:
    """Serve the plan's KV flows on the model behind the D credit gate (and the
    fast-lane gate on Rail-Fabric), as `emu.experiments.pd_serve.serve` does
    on a testbed; ``d_credits`` None: no credits.  ``settings``: `ModelSettings`
    or `ServeSettings` (``scale``, ``path_credits``, ``lane_capacity``,
    ``lane_when_busy``).  ``failure``: a `NodeFailure` during the run, filled
    in with what moved.  Returns serve's figures (`traffic.pdstats`) from the
    model's flow records."""
    wall = time.perf_counter()
    run = _Run(planned, net, d_credits, settings, failure, calibration, progress)
    results = run.run()
    rows = request_rows(planned, results, 0.0)
    summary, streams = summarize_fabric(rows, settings.scale, d_credits)
    credits = run.credit_gate.credits
    summary["credit_peak_per_d_count"] = max(credits.peak_d.values(), default=0)
    if credits.link_credits:
        summary["path_credits_count"] = credits.link_credits
        summary["path_credit_peak_per_link_count"] = max(credits.peak_link.values(), default=0)
    if run.lane_gate is not None:
        summary.update(run.lane_gate.summary())
        summary["large_requests_count"] = sum(1 for x in planned
                                              if x.lanes is not None and x.lanes.large)
    summary["d_credits_count"] = d_credits
    summary["kv_window_bytes"] = None
    summary["model_flows_count"] = run.sim.n_flows
    wall = time.perf_counter() - wall
    summary["model_wall_s"] = wall
    return ModelServed(results, rows, summary, streams, ingress_series(rows), 0.0,
                       credit_gate=run.credit_gate, lane_gate=run.lane_gate, wall_s=wall)
