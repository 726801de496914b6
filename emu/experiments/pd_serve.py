"""Serving a planned P/D request stream on an open testbed: the replay behind the gates.

`serve` replays the KV flows of a plan (`traffic.pdplan`) on a testbed that
is already open (`emu.live.testbed`), behind the D ingress credit gate
(`traffic.pdgate`) and, on Rail-Fabric, the fast-lane gate that pins and
unpins lane paths in the controller (`traffic.fastlane`); optionally one
tcpdump captures every switch port for the per-link load.  It starts
processes on the testbed's hosts, so it is live code; what it measured is
summarised by `traffic.pdstats`.  Everything it needs from a scenario comes
in `ServeSettings`.  As the replay goes, the run's feed (``bed.feed``,
`emu.live.feed`) hears each request's state and each D's credits
(`RequestFeed`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from emu.live.capture import FabricCapture
from emu.live.replay import Replayer
from traffic import fastlane, kvwindow
from traffic.credits import TEXT_D_CREDITS
from traffic.flows import FlowDag
from traffic.measure import linkload
from traffic.pdgate import CreditGate
from traffic.pdplan import Planned, request_of
from traffic.pdstats import ingress_series, request_rows, summarize_fabric
from traffic.scale import Scale

HOTTEST_LINKS = 5


@dataclass(frozen=True)
class ServeSettings:
    """What a replay takes from the scenario: the emulated scale and the gates' limits."""

    link_mbps: float                        # emulated rate of the reference link, Mbit/s
    scale: Scale
    path_credits: Optional[int] = None      # KV streams per switch-to-switch link; None: off
    lane_capacity: int = 1                  # Rail-Fabric: KV rank flows a lane carries at once
    lane_when_busy: str = fastlane.WAIT     # Rail-Fabric: wait for a busy lane, or go around
    kv_window: str = kvwindow.BOUNDED       # each KV flow's window: `traffic.kvwindow`

    @classmethod
    def from_context(cls, ctx) -> "ServeSettings":
        """The settings of a run (`emu.experiments.base.Context`); a scenario without
        the lane or path credit keys gets the defaults."""
        settings = ctx.settings
        return cls(link_mbps=ctx.scenario.config["scale"]["link_mbps"], scale=ctx.scale,
                   path_credits=settings.get("path_credits") or None,
                   lane_capacity=settings.get("lane_capacity", 1),
                   lane_when_busy=settings.get("lane_when_busy", fastlane.WAIT),
                   kv_window=settings.get("kv_window", kvwindow.BOUNDED))


@dataclass
class Served:
    """One replay of a planned stream and what it measured."""

    results: list
    rows: List[dict]
    summary: dict
    streams: List[dict]
    ingress: List[dict]
    t0: float
    hottest: List[dict] = dataclasses.field(default_factory=list)
    link_warnings: List[str] = dataclasses.field(default_factory=list)


def kv_window_bytes(bed, planned: Sequence[Planned], rule: str,
                    d_credits: Optional[int]) -> int:
    """Each KV flow's window on ``bed`` under ``rule`` (`traffic.kvwindow`): every
    flow of the streams one D admits fits in one of the testbed's egress queues.
    Without credits the rule counts the text's smallest D limit."""
    flows_per_request = max([1] + [len(x.transfer.dag.flows) for x in planned])
    return kvwindow.window_bytes(rule, bed.queue_packets, bed.mtu,
                                 d_credits or TEXT_D_CREDITS[0], flows_per_request)


# A request's states as the feed tells them (`RequestFeed`).
KV, DECODE, DONE, FAILED = "kv", "decode", "done", "failed"


def gpu_names(fabric) -> Dict[str, Tuple[int, str]]:
    """Each host's GPU: (its number, its name), as `traffic.placement.Topology`
    groups hosts.  A GPU whose NIC has several ports is several hosts; it is
    named by the host of its first port, so that every request to one D names
    it alike, whichever of its ports the KV arrives on."""
    ports: Dict[int, List[Tuple[int, str]]] = defaultdict(list)
    for index, host in enumerate(fabric.hosts):
        data = fabric.graph.nodes[host]
        ports[data.get("gpu", index)].append((data.get("nic_port", 0), host))
    names = {}
    for gpu, hosts in ports.items():
        first = min(hosts)[1]
        names.update({host: (gpu, first) for _, host in hosts})
    return names


@dataclass
class _Request:
    """What the feed says of one request, and what it needs to say it."""

    p: List[str]                # its P's GPUs, by TP rank
    d: str                      # its D, by the name of its rank-0 GPU
    d_gpus: List[str]
    left: int                   # KV flows not ended yet (a moved flow's resend counts)
    in_flight: Set[str] = dataclasses.field(default_factory=set)
    state: Optional[str] = None
    failed: bool = False


class RequestFeed:
    """Tells the run's feed what the requests of one replay do, from the replay
    loop, as it sees them: wraps the replay's gate and its start, done and
    moved hooks.

    ``request`` events (``id``, ``state``, ``p``, ``d``, ``streams``: its KV
    flows in flight now, ``d_gpus``): ``kv`` when its first KV flow starts,
    and again whenever the number of its flows in flight changes while it
    sends (one more started, one ended or moved); ``decode`` when its last
    flow ended well (its KV arrived); ``done`` right after, once its credit
    is back; ``failed`` instead of both when a flow of it failed or timed
    out, or when the replay broke off under it (`abandon`).  The emulation
    replays no decode or response stream (a request's time ends with its KV,
    `traffic.pdstats`), so ``done`` follows ``decode`` at once.

    ``credits`` events (``d``, ``used``, ``total``: the D's limit, None
    without credits) at every grant and release of a D's credit, read from
    the credit state's own log (`traffic.credits.Credits.events`), so that
    grants a release hands to waiting requests are told too.
    """

    def __init__(self, feed, planned: Sequence[Planned], fabric, gate, credits,
                 d_credits: Optional[int]):
        self.feed, self.inner, self.credits = feed, gate, credits
        self.d_credits = d_credits
        gpus = gpu_names(fabric)
        self.requests: Dict[str, _Request] = {}
        self.d_name: Dict[object, str] = {}     # the plan's D -> its name
        for x in planned:
            flows = x.transfer.dag.flows
            p = sorted({gpus[f.src] for f in flows})
            d = sorted({gpus[f.dst] for f in flows})
            self.requests[x.id] = _Request([name for _, name in p], d[0][1],
                                           [name for _, name in d], len(flows))
            self.d_name[x.d] = d[0][1]
        self._used: Dict[object, int] = defaultdict(int)
        self._logged = len(credits.events)

    # ------------------------------------------------------------ the replay's hooks
    def gate(self, flow) -> bool:
        admitted = self.inner.gate(flow)
        self._credits_changed()
        return admitted

    def started(self, flow) -> None:
        request = self.requests[request_of(flow.id)]
        request.in_flight.add(flow.id)
        self._tell(request_of(flow.id), KV)

    def moved(self, old_id: str, new_id: str) -> None:
        """A started flow was cancelled (its resend starts later): one stream
        fewer in flight; the request still waits for the resend's end."""
        rid = request_of(old_id)
        request = self.requests[rid]
        request.in_flight.discard(old_id)
        if request.state == KV:
            self._tell(rid, KV)

    def done(self, result) -> None:
        rid = request_of(result.id)
        request = self.requests[rid]
        request.in_flight.discard(result.id)
        request.left -= 1
        request.failed = request.failed or result.status != "ok"
        if request.left > 0:
            if request.state == KV:
                self._tell(rid, KV)
            self.inner.done(result)
            self._credits_changed()
            return
        if not request.failed:
            self._tell(rid, DECODE)     # its KV arrived: before its credit goes back
        self.inner.done(result)
        self._credits_changed()
        self._tell(rid, FAILED if request.failed else DONE)

    def abandon(self) -> None:
        """The replay broke off: every request it had started and not ended failed."""
        for rid, request in self.requests.items():
            if request.state in (KV, DECODE):
                request.in_flight.clear()
                self._tell(rid, FAILED)

    # ------------------------------------------------------------ telling
    def _tell(self, rid: str, state: str) -> None:
        request = self.requests[rid]
        request.state = state
        self.feed.emit("request", id=rid, state=state, p=request.p, d=request.d,
                       streams=len(request.in_flight), d_gpus=request.d_gpus)

    def _credits_changed(self) -> None:
        """One event per grant or release the credit state logged since the last look."""
        log = self.credits.events
        while self._logged < len(log):
            _, kind, _, d = log[self._logged]
            self._logged += 1
            self._used[d] += 1 if kind == "grant" else -1
            total = self.credits.d_limit(d) if self.d_credits else None
            self.feed.emit("credits", d=self.d_name[d], used=self._used[d], total=total)


def serve(bed, planned: Sequence[Planned], settings: ServeSettings, d_credits: Optional[int],
          work_dir, *, progress: Optional[Callable[[int, int], None]] = None,
          record_flows: Optional[Callable[[list], None]] = None, events=(),
          agent_hosts: Sequence[str] = (), links_dir: Optional[Path] = None,
          hottest: int = HOTTEST_LINKS, standby=None, replayer_class=Replayer) -> Served:
    """Replay the planned KV flows on the open testbed ``bed`` behind the D credit
    gate (``d_credits`` None: no credits, every stream starts when due).

    ``progress(done, total)`` follows the replay; ``record_flows(results)``
    gets the flow results as soon as the replay ends (the testbed series'
    record for the fidelity check); ``events``, ``agent_hosts`` and
    ``standby`` go to the `Replayer` (e.g. a switch failure at its time, and
    where the flows it moves would go).  With ``links_dir``, every
    switch port is captured during the replay (`emu.live.capture.FabricCapture`:
    one tcpdump in the root namespace on Open vSwitch, one per switch namespace
    on the kernel data plane) and the per-link load goes to
    ``links_dir/links.csv`` (`traffic.measure.linkload`); the ``hottest``
    busiest links are returned by name.  ``replayer_class`` makes the replay
    (`Replayer`; a test's fake stands in for it).  The run's feed hears of every
    request and every D's credits as they change (`RequestFeed`).
    """
    dag = FlowDag.merge(*(x.transfer.dag for x in planned))
    window = kv_window_bytes(bed, planned, settings.kv_window, d_credits)
    credit_gate = CreditGate(planned, d_credits or max(1, len(planned)),
                             path_limit=settings.path_credits)
    gate, lane_gate = credit_gate, None
    routed = [x.lanes for x in planned if x.lanes is not None]
    if routed:
        lane_gate = fastlane.FastLaneGate.from_transfers(
            routed, lane_capacity=settings.lane_capacity, when_busy=settings.lane_when_busy,
            pin=lambda fid, path: bed.call("pin", id=fid, path=path),
            unpin=lambda fid: bed.call("unpin", id=fid))
        gate = fastlane.GateChain(credit_gate, lane_gate)
    told = RequestFeed(bed.feed, planned, bed.fabric, gate, credit_gate.credits, d_credits)

    def moved(old_id: str, new_id: str) -> None:
        told.moved(old_id, new_id)
        if lane_gate is not None:
            lane_gate.release(old_id)

    replayer = replayer_class(bed, dag, settings.link_mbps, work_dir, progress=progress,
                              gate=told.gate, on_done=told.done, on_start=told.started,
                              events=events, agent_hosts=agent_hosts, standby=standby,
                              on_moved=moved, window_bytes=window)
    capture = None
    if links_dir is not None:
        capture = FabricCapture(bed.fabric, name="links", bed=bed).start(
            Path(links_dir) / "captures")
    try:
        results = replayer.run()
    except BaseException:
        told.abandon()
        raise
    finally:
        if capture is not None:
            capture.stop()
    if record_flows is not None:
        record_flows(results)
    rows = request_rows(planned, results, replayer.t0)
    summary, streams = summarize_fabric(rows, settings.scale, d_credits)
    summary["credit_peak_per_d_count"] = max(credit_gate.credits.peak_d.values(), default=0)
    if credit_gate.credits.link_credits:
        summary["path_credits_count"] = credit_gate.credits.link_credits
        summary["path_credit_peak_per_link_count"] = max(
            credit_gate.credits.peak_link.values(), default=0)
    if lane_gate is not None:
        summary.update(lane_gate.summary())
        summary["large_requests_count"] = sum(1 for x in routed if x.large)
    summary["d_credits_count"] = d_credits
    summary["kv_window_bytes"] = window or None
    served = Served(results, rows, summary, streams, ingress_series(rows), replayer.t0)
    if capture is not None:
        loads = linkload.analyse_parts(capture.parts, bed.fabric,
                                       bw_factor=settings.scale.bw_factor, start=replayer.t0)
        served.hottest = linkload.write_links_csv(loads, links_dir, top=hottest)
        served.link_warnings = loads.warnings()
        if served.hottest:
            summary["hottest_link"] = served.hottest[0]["src"] + "->" + served.hottest[0]["dst"]
            summary["hottest_link_utilisation"] = served.hottest[0]["utilisation"]
    return served


def serve_modelled(ctx, fabric, planned: Sequence[Planned], settings: ServeSettings,
                   d_credits: Optional[int], *, failure=None, label: str = "KV flows"):
    """The same stream on the flow-level model (``testbed.engine = "model"``):
    the same plan, gates and failure, rates from max-min fairness at the
    emulated scale, with the frozen calibration (`traffic.model.pd`)."""
    from emu.experiments.base import model_calibration
    from traffic.model import pd as pd_model

    cal = model_calibration(ctx)
    net = pd_model.emulated_network(fabric, settings.scale,
                                    ecmp_seed=ctx.scenario.config["testbed"]["ecmp_seed"])
    constants = pd_model.ReplayConstants(efficiency=cal.efficiency,
                                         hop_latency_s=cal.hop_latency_s,
                                         startup_s=cal.startup_s,
                                         resend_s=cal.resend_s,
                                         notice_s=cal.notice_s or pd_model.DEFAULT_NOTICE_S)
    return pd_model.serve_model(planned, net, settings, d_credits, failure=failure,
                                calibration=constants)
