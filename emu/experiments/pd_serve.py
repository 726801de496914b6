"""Serving a planned P/D request stream on an open testbed: the replay behind the gates.

`serve` replays the KV flows of a plan (`traffic.pdplan`) on a testbed that
is already open (`emu.live.testbed`), behind the D ingress credit gate
(`traffic.pdgate`) and, on Rail-Fabric, the fast-lane gate that pins and
unpins lane paths in the controller (`traffic.fastlane`); optionally one
tcpdump captures every switch port for the per-link load.  It starts
processes on the testbed's hosts, so it is live code; what it measured is
summarised by `traffic.pdstats`.  Everything it needs from a scenario comes
in `ServeSettings`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from emu.live.capture import FabricCapture
from emu.live.replay import Replayer
from traffic import fastlane, kvwindow
from traffic.credits import TEXT_D_CREDITS
from traffic.flows import FlowDag
from traffic.measure import linkload
from traffic.pdgate import CreditGate
from traffic.pdplan import Planned
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


def serve(bed, planned: Sequence[Planned], settings: ServeSettings, d_credits: Optional[int],
          work_dir, *, progress: Optional[Callable[[int, int], None]] = None,
          record_flows: Optional[Callable[[list], None]] = None, events=(),
          agent_hosts: Sequence[str] = (), links_dir: Optional[Path] = None,
          hottest: int = HOTTEST_LINKS, standby=None) -> Served:
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
    busiest links are returned by name.
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
            pin=lambda fid, path: bed.control.call("pin", id=fid, path=path),
            unpin=lambda fid: bed.control.call("unpin", id=fid))
        gate = fastlane.GateChain(credit_gate, lane_gate)
    replayer = Replayer(bed, dag, settings.link_mbps, work_dir, progress=progress,
                        gate=gate.gate, on_done=gate.done, events=events,
                        agent_hosts=agent_hosts, standby=standby,
                        on_moved=(lambda old, new: lane_gate.release(old)) if lane_gate else None,
                        window_bytes=window)
    capture = None
    if links_dir is not None:
        capture = FabricCapture(bed.fabric, name="links", bed=bed).start(
            Path(links_dir) / "captures")
    try:
        results = replayer.run()
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
