"""Prefill/decode inference on several fabrics: TTFT measured on real KV flows.

The same seeded request stream (`traffic.requests`, one of section 4's
profiles, ``requests`` requests at ``rate_per_s`` real requests per second)
is served on each fabric of ``fabrics``, one testbed at a time
(``OWNS_TESTBEDS``: `emu.live.series`).  Every fabric has the same GPU count
(``[fabric] spec`` is the ZCube reference: ``zcube,n=4,gpus_per_server=2``
is 16 GPUs; ROFT, RailFly, HPN and Rail-Fabric are built at its GPU count,
`fabric_specs`) and
is cut into nodes of ``tp`` GPUs (`traffic.placement.Topology`).

Per fabric:

* **placement** (`traffic.placement`): affinity tiles (``tile``, hashed
  across the switches) or the zone baseline (``placement = "zone"``);
* **pairing** (`traffic.pairing`): fixed, random, score or sticky;
* **prefill** on P: ``prefill_ms_per_ktoken`` real ms per 1K new tokens
  (x tdf), one request at a time per P (FIFO): the P queue is planned
  before the replay (`plan`), since prefill is not emulated;
* **KV transfer** (`traffic.kvflows`): one flow per TP rank, rank i -> rank
  i (on ZCube over the dual paths, ``path_strategy``; on HPN one flow per
  plane of the bonded NIC), KV bytes x bw_factor x tdf, starting when the
  prefill ends;
* **KV ingress credits** (`traffic.credits`) as the replayer's gate: each D
  accepts ``d_credits`` requests' KV at once; one request is one stream,
  all its rank flows admitted together, released when its last flow ends;
  with ``path_credits``, also at most that many streams per switch-to-switch
  link of the request's paths;
* **Rail-Fabric fast lanes** (`traffic.fastlane`): a request with at least
  ``lane_threshold_gb`` of real KV routes each rank over a KV fast lane,
  reserved (``lane_capacity`` flows per lane) and pinned by the controller
  (`controllers.pins`) before the flow starts, unpinned when it ends;
  smaller ones use the expander, where destination routes live;
* **per-link load** (``link_capture``): one tcpdump on every switch port
  (`emu.live.capture.FabricCapture`), analysed by `traffic.measure.linkload` into
  ``<fabric>/links.csv`` and the hottest links.

TTFT per request = the end of its last KV flow - its arrival, i.e. the P
queue + prefill compute + credit wait (and flow start-up) + the measured KV
transfer; decode is not modelled (the first token follows the KV).  Reported
per fabric: TTFT P50/P95/P99 (emulated and real), throughput in requests
per emulated (and real) second (served / (last KV end - first arrival)), KV
transfer P99 (last end - first start of a request's flows), peak concurrent
KV streams per D measured from the flows' start and end next to the credit
limit, and the network cost at ``cost_gpus`` GPUs (`topologies.cost`; not
every fabric has a cost model at every scale, then a warning says so).

One scale for all fabrics (from fabric.spec: ZCube's 200 Gbit/s NIC ports at
``link_mbps``): ROFT's 400 Gbit/s host links are emulated at twice that, and
a ZCube rank flow uses one of its GPU's two 200G ports (the rank's path), so
a single KV rank moves faster on ROFT; ZCube's case is the cost and the dual
paths under contention.  Measured (defaults, 16 requests, 2 cores): ZCube
TTFT P50/P95/P99 1.46/2.56/2.94 emulated s, ROFT 1.24/2.27/2.59, 2.15 and
2.20 requests per emulated s, peak 2 KV streams into the busiest D
(credit limit 2); about 30 s per run.

Runs (as root)::

  .venv/bin/python -m emu.run pd-inference
  .venv/bin/python -m emu.run pd-inference --set pd-inference.pairing=score
  .venv/bin/python -m emu.run pd-inference --set fabrics=zcube,roft,railfly
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import catalog, cost, registry
from topologies.fabric import FabricError
from traffic import fastlane, kvcache
from traffic import requests as rq
from traffic.measure import linkload
from emu.live.capture import FabricCapture
from traffic.credits import Credits
from traffic.flows import FlowDag
from traffic.kvflows import STRATEGIES, KvTransfer, kv_transfer, link_id
from traffic.pairing import PAIRINGS, ClusterState, pairing
from traffic.placement import TILES, Placement, PlacementError, Topology, placement
from emu.live.replay import Replayer

SECTION = "pd-inference"
SUMMARY = "the same seeded P/D request stream on ZCube and ROFT (and RailFly): TTFT P50/P95/" \
          "P99, throughput, KV P99, peak KV streams per D, cost"
FABRICS = ("zcube", "roft", "railfly", "hpn", "rail-fabric")
HOTTEST_LINKS = 5


FIELDS = {
    "fabrics": Field(list, ["zcube", "roft"], "fabrics to compare, in order, all at the GPU "
                     "count of fabric.spec", item=str),
    "workload": Field(str, "deep-thinking", "request profile (section 4)",
                      choices=sorted(rq.WORKLOADS)),
    "requests": Field(int, 16, "requests in the stream", minimum=1, maximum=200),
    "rate_per_s": Field(float, 30.0, "arrival rate, real requests per second", minimum=0.01),
    "seed": Field(int, 1, "stream, placement and random pairing seed"),
    "tp": Field(int, 2, "GPUs per P or D node (TP size)", minimum=1),
    "placement": Field(str, "tiles", "affinity tiles or the zone baseline",
                       choices=["tiles", "zone"]),
    "tile": Field(str, "3p2d", "tile shape (P+D per tile)", choices=sorted(TILES)),
    "pairing": Field(str, "fixed", "P/D pairing strategy", choices=list(PAIRINGS)),
    "path_strategy": Field(str, "tp-rank", "ZCube dual-path choice", choices=list(STRATEGIES)),
    "d_credits": Field(int, 2, "KV streams (requests) a D accepts at once", minimum=1,
                       maximum=8),
    "path_credits": Field(int, 0, "KV streams a switch-to-switch link admits at once (path "
                          "credits); 0: no path credits", minimum=0, maximum=16),
    "prefill_ms_per_ktoken": Field(float, 5.0, "prefill compute, real ms per 1K new prompt "
                                   "tokens (x tdf)", minimum=0.0),
    "cost_gpus": Field(int, 16384, "GPU count of the network cost comparison", minimum=256),
    "cost_radix": Field(int, 64, "EPS radix of the cost comparison", choices=[64, 128]),
    "lane_threshold_gb": Field(float, fastlane.LARGE_KV_BYTES / 1e9, "Rail-Fabric: a "
                               "request whose real KV is at least this many GB takes the fast "
                               "lanes, reserved and pinned before it starts; smaller ones the "
                               "expander", minimum=0.0),
    "lane_capacity": Field(int, 1, "Rail-Fabric: KV rank flows a fast lane carries at once "
                           "(per direction)", minimum=1, maximum=8),
    "lane_when_busy": Field(str, "wait", "Rail-Fabric: a large flow whose lane is busy waits "
                            "for it, or goes over the expander", choices=list(fastlane.WHEN_BUSY)),
    "link_capture": Field(bool, True, "capture every switch port (one tcpdump) and report "
                          "per-link load and the hottest links"),
    "lock_wait_s": Field(float, 600.0, "how long a later fabric waits for the run lock if "
                         "another emulation took it between fabrics", minimum=0.0),
}


# ---------------------------------------------------------------- fabrics (pure)
def gpu_count(fabric) -> int:
    return len({fabric.graph.nodes[h].get("gpu", i) for i, h in enumerate(fabric.hosts)})


def fabric_specs(spec: str, names: Sequence[str]) -> Dict[str, str]:
    """Spec of each fabric at the GPU count and GPUs per server of ``spec`` (a ZCube);
    raises ValueError naming ``pd-inference.fabrics`` and the allowed values."""
    allowed = ", ".join(FABRICS)
    reference = registry.build(spec)
    if reference.name != "zcube":
        raise ValueError(f"fabric.spec must be a zcube spec (the reference GPU count), "
                         f"got {reference.name!r}")
    gpus = gpu_count(reference)
    per_server = reference.params["gpus_per_server"]
    specs = {}
    for name in names:
        if name == "zcube":
            specs[name] = spec
        elif name == "roft":
            specs[name] = f"roft,gpus={gpus},radix=8,gpus_per_server={per_server}"
        elif name == "railfly":
            if gpus % 4:
                raise ValueError(f"pd-inference.fabrics: 'railfly' needs a GPU count divisible "
                                 f"by 4 rails, have {gpus}; allowed: {allowed}")
            specs[name] = f"railfly,rails=4,servers={gpus // 4}"
        elif name == "hpn":
            # Two tiers, one segment: every ToR pair (one per plane) is a rail.
            specs[name] = f"hpn,gpus={gpus},gpus_per_server={per_server},radix=8"
        elif name == "rail-fabric":
            specs[name] = fastlane.rail_fabric_spec(gpus, per_server)
        else:
            raise ValueError(f"pd-inference.fabrics: unknown fabric {name!r}; allowed: "
                             f"{allowed}")
    return specs


def topology(fabric, tp: int) -> Topology:
    return Topology(fabric, gpus_per_node=tp)


def make_placement(topo: Topology, settings) -> Placement:
    return placement(topo, settings["placement"], settings["tile"], seed=settings["seed"])


def check(scenario) -> None:
    s = scenario.section
    names = s["fabrics"]
    if not names:
        raise ValueError(f"pd-inference.fabrics is empty; allowed: {', '.join(FABRICS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"pd-inference.fabrics repeats a fabric: {names}")
    specs = fabric_specs(scenario.config["fabric"]["spec"], names)
    gpus = None
    for name, spec in specs.items():
        fabric = registry.build(spec)
        check_fabric_fits(name, spec, fabric, s)
        if gpus is not None and gpu_count(fabric) != gpus:
            raise ValueError(f"pd-inference.fabrics: {name!r} has {gpu_count(fabric)} GPUs, "
                             f"not {gpus}")
        gpus = gpu_count(fabric)


def check_fabric_fits(name: str, spec: str, fabric, settings, section: str = SECTION,
                      key: str = "fabrics") -> None:
    """The fabric splits into TP nodes and takes the placement, or ValueError."""
    try:
        topo = topology(fabric, settings["tp"])
        make_placement(topo, settings)
    except (FabricError, PlacementError) as exc:
        raise ValueError(f"{section}.{key}: {name!r} ({spec}) does not work with "
                         f"{section}.tp={settings['tp']} and {section}.placement="
                         f"{settings['placement']!r}: {exc}; allowed fabrics: "
                         f"{', '.join(FABRICS)}") from None
    if any(node.tp != settings["tp"] for node in topo.nodes):
        raise ValueError(f"{section}.tp={settings['tp']} does not divide {name!r}'s "
                         f"{gpu_count(fabric)} GPUs into equal nodes")


# ---------------------------------------------------------------- planning (pure)
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
    """Real prefill compute: the new (uncached) tokens."""
    return ms_per_ktoken / 1000.0 * request.new_tokens / 1000.0


def plan(topo: Topology, place: Placement, stream: Sequence[rq.Request], scale,
         pairing_name: str = "fixed", ms_per_ktoken: float = 10.0, seed: int = 0,
         strategy: str = "tp-rank", config: kvcache.ModelConfig = kvcache.GLM_5_1,
         lane_threshold_bytes: float = fastlane.LARGE_KV_BYTES) -> List[Planned]:
    """Pair every request, queue its prefill on P (FIFO, one at a time) and build
    its KV flows, due when the prefill ends; times in emulated seconds.  On
    Rail-Fabric a large request's ranks are routed onto fast lanes
    (`traffic.fastlane`, spread over the lanes as planned so far)."""
    chooser = pairing(pairing_name, topo, place, config, seed=seed, strategy=strategy)
    lanes = fastlane.fast_lanes(topo.fabric) if topo.fabric.name == "rail-fabric" else None
    lane_use: Dict[str, int] = defaultdict(int)
    state = ClusterState()
    p_free: Dict[int, float] = defaultdict(float)
    planned: List[Planned] = []
    for request in stream:
        arrival = scale.emu_seconds(request.arrival_s)
        state.p_queue = {p: sum(1 for x in planned if x.p == p and x.prefill_end_s > arrival)
                         for p in place.prefill}
        state.d_queue = {d: sum(1 for x in planned if x.d == d and x.prefill_end_s > arrival)
                         for d in place.decode}
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
    return planned


# ---------------------------------------------------------------- credits as a gate
def fabric_links(transfer: KvTransfer) -> List[str]:
    """The switch-to-switch links a transfer crosses: what path credits meter
    (a D's own ports are its ingress credits' business)."""
    return sorted({link_id(u, v) for path in transfer.paths
                   for u, v in zip(path[1:-2], path[2:-1])})


class CreditGate:
    """KV ingress credits per D, and optionally path credits, for the replayer:
    one request = one stream.

    ``gate(flow)`` asks credit for the flow's request the first time one of its
    flows is due and admits all its flows once granted; ``done(result)``
    releases the credit when the request's last flow has finished.  With
    ``path_limit``, a request also needs a credit on every switch-to-switch
    link of its path (at most ``path_limit`` KV streams per link): "a P waits
    for both D credit and path credit".
    """

    def __init__(self, planned: Sequence[Planned], limit: int,
                 clock: Callable[[], float] = time.time, path_limit: Optional[int] = None):
        self.credits = Credits(d_credits=limit, link_credits=path_limit)
        self.limit = limit
        self.clock = clock
        self.d_of = {x.id: x.d for x in planned}
        self.links_of = {x.id: fabric_links(x.transfer) for x in planned}
        self.left = {x.id: len(x.flow_ids) for x in planned}
        self.granted: set = set()
        self.asked: set = set()

    def gate(self, flow) -> bool:
        rid = request_of(flow.id)
        if rid not in self.asked:
            self.asked.add(rid)
            grants = self.credits.ask(rid, self.d_of[rid], self.links_of[rid], now=self.clock())
            self.granted |= {g.request_id for g in grants}
            self.credits.check()
        return rid in self.granted

    def done(self, result) -> None:
        rid = request_of(result.id)
        self.left[rid] -= 1
        if self.left[rid] == 0 and rid in self.granted:
            grants = self.credits.release(rid, now=self.clock())
            self.granted |= {g.request_id for g in grants}
            self.credits.check()


# ---------------------------------------------------------------- results (pure)
def percentile(values: Iterable[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    data = sorted(values)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def peak_concurrency(intervals: Iterable[Tuple[float, float]]) -> int:
    """Most intervals open at once; one ending when another starts does not overlap."""
    events = []
    for start, end in intervals:
        events += [(start, 1), (end, -1)]
    events.sort(key=lambda e: (e[0], e[1]))      # ends (-1) before starts at a tie
    peak = count = 0
    for _, step in events:
        count += step
        peak = max(peak, count)
    return peak


def request_rows(planned: Sequence[Planned], flows, t0: float) -> List[dict]:
    """One row per request from the flows' measured start/end (epoch s; t0 = replay start)."""
    by_request: Dict[str, list] = defaultdict(list)
    moved: Dict[str, int] = defaultdict(int)
    for flow in flows:
        if flow.status == "moved":      # cancelled and resent: its replacement counts
            moved[request_of(flow.id)] += 1
        else:
            by_request[request_of(flow.id)].append(flow)
    rows = []
    for x in planned:
        mine = by_request.get(x.id, [])
        served = bool(mine) and len(mine) == len(x.flow_ids) and \
            all(f.status == "ok" for f in mine)
        row = {"id": x.id, "p": x.p, "d": x.d, "on_home": x.on_home, "served": served,
               "arrival_s": x.arrival_s, "p_queue_s": x.prefill_start_s - x.arrival_s,
               "prefill_s": x.prefill_end_s - x.prefill_start_s, "kv_bytes": x.kv_bytes,
               "moved_flows_count": moved.get(x.id, 0)}
        if mine:
            start = min(f.start for f in mine) - t0
            end = max(f.end for f in mine) - t0
            row.update(kv_start_s=start, kv_end_s=end,
                       credit_wait_s=max(0.0, start - x.prefill_end_s),
                       kv_s=end - start, ttft_s=end - x.arrival_s)
        rows.append(row)
    return rows


def summarize_fabric(rows: Sequence[dict], scale, limit: Optional[int]) -> Tuple[dict, List[dict]]:
    """The fabric's headline figures and its per-D peak streams."""
    served = [r for r in rows if r["served"]]
    ttft = [r["ttft_s"] for r in served]
    kv = [r["kv_s"] for r in served]
    summary = {"requests_count": len(rows), "served_count": len(served)}
    for q in (50, 95, 99):
        value = percentile(ttft, q)
        if value is not None:
            summary[f"ttft_p{q}_s"] = value
            summary[f"ttft_p{q}_real_ms"] = scale.real_seconds(value) * 1000
    if kv:
        summary["kv_p99_s"] = percentile(kv, 99)
        summary["kv_p99_real_ms"] = scale.real_seconds(summary["kv_p99_s"]) * 1000
        summary["credit_wait_mean_s"] = sum(r["credit_wait_s"] for r in served) / len(served)
        span = max(r["kv_end_s"] for r in served) - min(r["arrival_s"] for r in rows)
        if span > 0:
            summary["throughput_emu_rps"] = len(served) / span
            summary["throughput_real_rps"] = len(served) / scale.real_seconds(span)
    streams = []
    for d in sorted({r["d"] for r in rows}):
        spans = [(r["kv_start_s"], r["kv_end_s"]) for r in rows
                 if r["d"] == d and "kv_start_s" in r]
        streams.append({"d": d, "requests_count": len(spans),
                        "peak_streams_count": peak_concurrency(spans),
                        "credit_limit_count": limit})
    summary["peak_streams_per_d_count"] = max((s["peak_streams_count"] for s in streams),
                                              default=0)
    return summary, streams


def ingress_series(rows: Sequence[dict]) -> List[dict]:
    """KV streams into each D over time: one row per change, from the requests'
    measured KV start and end (a request is one stream, as for credits)."""
    series = []
    for d in sorted({r["d"] for r in rows}):
        events = []
        for r in rows:
            if r["d"] == d and "kv_start_s" in r:
                events += [(r["kv_start_s"], 1), (r["kv_end_s"], -1)]
        events.sort(key=lambda e: (e[0], e[1]))
        count = 0
        for t, step in events:
            count += step
            if series and series[-1]["d"] == d and series[-1]["t_s"] == t:
                series[-1]["streams_count"] = count
            else:
                series.append({"d": d, "t_s": t, "streams_count": count})
    return series


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


def serve(ctx: Context, bed, label: str, planned: Sequence[Planned], d_credits: Optional[int],
          work_dir, events=(), agent_hosts: Sequence[str] = (),
          links_dir: Optional[Path] = None, hottest: int = HOTTEST_LINKS) -> Served:
    """Replay the planned KV flows on an open testbed behind the D credit gate
    (``d_credits`` None: no credits, every stream starts when due).

    With ``links_dir``, one tcpdump in the root namespace captures every
    switch port during the replay (`emu.live.capture.FabricCapture`) and the
    per-link load goes to ``links_dir/links.csv`` (`traffic.measure.linkload`); the
    ``hottest`` busiest links are returned by name.
    """
    link_mbps = ctx.scenario.config["scale"]["link_mbps"]
    dag = FlowDag.merge(*(x.transfer.dag for x in planned))
    credit_gate = CreditGate(planned, d_credits or max(1, len(planned)),
                             path_limit=ctx.settings.get("path_credits") or None)
    gate, lane_gate = credit_gate, None
    routed = [x.lanes for x in planned if x.lanes is not None]
    if routed:
        settings = ctx.settings
        lane_gate = fastlane.FastLaneGate.from_transfers(
            routed, lane_capacity=settings.get("lane_capacity", 1),
            when_busy=settings.get("lane_when_busy", fastlane.WAIT),
            pin=lambda fid, path: bed.control.call("pin", id=fid, path=path),
            unpin=lambda fid: bed.control.call("unpin", id=fid))
        gate = fastlane.GateChain(credit_gate, lane_gate)
    replayer = Replayer(bed, dag, link_mbps, work_dir, progress=ctx.progress(f"{label} KV flows"),
                        gate=gate.gate, on_done=gate.done, events=events,
                        agent_hosts=agent_hosts,
                        on_moved=(lambda old, new: lane_gate.release(old)) if lane_gate else None)
    capture = None
    if links_dir is not None:
        capture = FabricCapture(bed.fabric, name="links").start(Path(links_dir) / "captures")
    try:
        results = replayer.run()
    finally:
        if capture is not None:
            capture.stop()
    ctx.testbeds.record_flows(results)
    rows = request_rows(planned, results, replayer.t0)
    summary, streams = summarize_fabric(rows, ctx.scale, d_credits)
    summary["credit_peak_per_d_count"] = max(credit_gate.credits.peak_d.values(), default=0)
    if credit_gate.credits.link_credits:
        summary["path_credits_count"] = credit_gate.credits.link_credits
        summary["path_credit_peak_per_link_count"] = max(
            credit_gate.credits.peak_link.values(), default=0)
    if lane_gate is not None:
        summary.update(lane_gate.summary())
        summary["large_requests_count"] = sum(1 for x in routed if x.large)
    summary["d_credits_count"] = d_credits
    served = Served(results, rows, summary, streams, ingress_series(rows), replayer.t0)
    if capture is not None:
        loads = linkload.analyse(capture.path, capture.map_path, bed.fabric,
                                 bw_factor=ctx.scale.bw_factor, start=replayer.t0)
        served.hottest = linkload.write_links_csv(loads, links_dir, top=hottest)
        served.link_warnings = loads.warnings()
        if served.hottest:
            summary["hottest_link"] = served.hottest[0]["src"] + "->" + served.hottest[0]["dst"]
            summary["hottest_link_utilisation"] = served.hottest[0]["utilisation"]
    return served


def cost_rows(names: Sequence[str], gpus: int, radix: int) -> Tuple[List[dict], List[str]]:
    """Network cost of each fabric at full scale; fabrics without a model there are noted."""
    prices = cost.load_prices()
    rows, notes = [], []
    for name in names:
        try:
            row = cost.cost_row(name, catalog.counts_at_scale(name, gpus, radix), prices, radix)
        except (FabricError, ValueError, KeyError) as exc:
            notes.append(f"no network cost for {name} at {gpus} GPUs, radix {radix}: {exc}")
            continue
        rows.append({"fabric": name, "gpus_count": gpus, "radix_count": radix,
                     "cost_total_usd": row["cost_total"], "cost_per_gpu_usd": row["cost_per_gpu"],
                     "share_of_gpu_cost_pct": row["share_of_gpu_cost"] * 100})
    return rows, notes


# ---------------------------------------------------------------- the run
def stream_of(settings) -> List[rq.Request]:
    return rq.generate(rq.workload(settings["workload"]), settings["rate_per_s"],
                       settings["seed"], count=settings["requests"])


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    scale = ctx.scale
    specs = fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"])
    stream = stream_of(s)
    ctx.log(f"  {len(stream)} {s['workload']} requests at {s['rate_per_s']:g}/s real "
            f"(seed {s['seed']}), {s['pairing']} pairing, {s['placement']} placement, "
            f"{s['d_credits']} KV credits per D")
    outcome = Outcome()
    metrics: Dict = {}
    fabric_rows, all_requests, all_streams, all_ingress, all_hottest = [], [], [], [], []
    for name in s["fabrics"]:
        fabric = registry.build(specs[name])
        topo = topology(fabric, s["tp"])
        place = make_placement(topo, s)
        planned = plan(topo, place, stream, scale, s["pairing"], s["prefill_ms_per_ktoken"],
                       s["seed"], s["path_strategy"],
                       lane_threshold_bytes=s["lane_threshold_gb"] * 1e9)
        dag = FlowDag.merge(*(x.transfer.dag for x in planned))
        ctx.log(f"  {name} ({specs[name]}): P {place.prefill}, D {place.decode}, "
                f"{len(dag.flows)} KV flows, {dag.total_bytes() / 1e6:.2f} MB emulated")
        with ctx.testbeds.open(name, fabric, scale, lock_wait_s=s["lock_wait_s"]) as bed:
            served = serve(ctx, bed, name, planned, s["d_credits"], ctx.run_dir / name / "flows",
                           links_dir=ctx.run_dir / name if s["link_capture"] else None)
        if not outcome.t0:
            outcome.t0 = served.t0
        outcome.flows += [dataclasses.replace(f, id=f"{name}:{f.id}", group=name)
                          for f in served.results]
        rows, summary, streams = served.rows, served.summary, served.streams
        metrics[name] = summary
        fabric_rows.append({"fabric": name, "spec": specs[name], **{
            k: summary.get(k) for k in ("served_count", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
                                        "ttft_p99_real_ms", "kv_p99_s",
                                        "throughput_emu_rps",
                                        "throughput_real_rps",
                                        "peak_streams_per_d_count", "d_credits_count",
                                        "lane_flows_count", "expander_flows_count",
                                        "lane_wait_mean_s")
            if k in summary or not k.startswith(("lane", "expander"))}})
        all_ingress += [{"fabric": name, **r} for r in served.ingress]
        all_hottest += [{"fabric": name, **r} for r in served.hottest]
        outcome.warnings += [f"{name}: {w}" for w in served.link_warnings]
        all_requests += [{"fabric": name, **r} for r in rows]
        all_streams += [{"fabric": name, **r} for r in streams]
        if summary["served_count"] < len(rows):
            outcome.warnings.append(f"{name}: {len(rows) - summary['served_count']} of "
                                    f"{len(rows)} requests not served (a KV flow failed)")
        ctx.log(f"  {name}: TTFT P50/P95/P99 " + "/".join(
            f"{summary.get(f'ttft_p{q}_s', float('nan')):.2f}" for q in (50, 95, 99))
                + f" s, {summary.get('throughput_emu_rps', 0):.2f} requests per emulated s")
    costs, notes = cost_rows(s["fabrics"], s["cost_gpus"], s["cost_radix"])
    outcome.warnings += notes
    stats = rq.summary(stream)
    metrics["stream"] = {"requests_count": stats["requests_count"],
                         "sessions_count": stats.get("sessions_count", 0),
                         "prompt_tokens_mean_count": stats.get("mean_prompt_tokens", 0.0),
                         "hit_ratio": stats.get("hit_ratio", 0.0)}
    metrics["fabrics"] = fabric_rows
    metrics["d_streams"] = all_streams
    metrics["d_ingress"] = all_ingress
    if all_hottest:
        metrics["hottest_links"] = all_hottest
    metrics["requests"] = all_requests
    if costs:
        metrics["cost"] = costs
    outcome.metrics = metrics
    return outcome


EXPERIMENT = Experiment(kind="pd-inference", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.SERIES)
