"""Prefill/decode inference on several fabrics: TTFT measured on real KV flows.

The same seeded request stream (`traffic.requests`, one of section 4's
profiles, ``requests`` requests at ``rate_per_s`` real requests per second)
is served on each fabric of ``fabrics``, one testbed at a time
(``OWNS_TESTBEDS``: `emu.live.series`).  Every fabric has the same GPU count
(``[fabric] spec`` is the ZCube reference: ``zcube,n=4,gpus_per_server=2``
is 16 GPUs; ROFT, RailFly, HPN and Rail-Fabric are built at its GPU count,
`pd_setup.fabric_specs`) and
is cut into nodes of ``tp`` GPUs (`traffic.placement.Topology`).

Per fabric:

* **placement** (`traffic.placement`): affinity tiles (``tile``, hashed
  across the switches) or the zone baseline (``placement = "zone"``);
* **pairing** (`traffic.pairing`): fixed, random, score or sticky;
* **prefill** on P: ``prefill_ms_per_ktoken`` real ms per 1K new tokens
  (x tdf), one request at a time per P (FIFO): the P queue is planned
  before the replay (`traffic.pdplan`), since prefill is not emulated;
* **KV transfer** (`traffic.kvflows`): one flow per TP rank, rank i -> rank
  i (on ZCube over the dual paths, ``path_strategy``; on HPN one flow per
  plane of the bonded NIC), KV bytes x bw_factor x tdf, starting when the
  prefill ends;
* **KV ingress credits** (`traffic.pdgate`) as the replayer's gate: each D
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
from typing import Dict, List, Sequence, Tuple

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.experiments.pd_serve import ServeSettings, serve, serve_modelled
from emu.experiments.pd_setup import FABRICS, FIELDS as SHARED_FIELDS
from emu.experiments.pd_setup import (check_fabric_fits, check_stream, fabric_specs,
                                      gpu_count, make_placement, nodes_text, stream_of,
                                      topology)
from emu.schema import Field
from topologies import catalog, cost, registry
from topologies.fabric import FabricError
from traffic import fastlane
from traffic import requests as rq
from traffic.flows import FlowDag
from traffic.pdplan import plan

SECTION = "pd-inference"
SUMMARY = "the same seeded P/D request stream on ZCube and ROFT (and RailFly): TTFT P50/P95/" \
          "P99, throughput, KV P99, peak KV streams per D, cost"

_SHARED = ("workload", "requests", "rate_per_s", "seed", "tp", "placement", "tile", "pairing",
           "path_strategy", "d_credits", "path_credits", "prefill_ms_per_ktoken", "kv_window")
FIELDS = {
    "fabrics": Field(list, ["zcube", "roft"], "fabrics to compare, in order, all at the GPU "
                     "count of fabric.spec", item=str),
    **{key: SHARED_FIELDS[key] for key in _SHARED},
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
    "lock_wait_s": SHARED_FIELDS["lock_wait_s"],
}


def check(scenario) -> None:
    check_stream(scenario, SECTION)
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
        check_fabric_fits(name, spec, fabric, s, SECTION)
        if gpus is not None and gpu_count(fabric) != gpus:
            raise ValueError(f"pd-inference.fabrics: {name!r} has {gpu_count(fabric)} GPUs, "
                             f"not {gpus}")
        gpus = gpu_count(fabric)


# ---------------------------------------------------------------- cost
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
def run(ctx: Context) -> Outcome:
    s = ctx.settings
    scale = ctx.scale
    specs = fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"])
    stream = stream_of(s)
    serving = ServeSettings.from_context(ctx)
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
        ctx.log(f"  {name} ({specs[name]}): P {nodes_text(place.prefill)}, D {nodes_text(place.decode)}, "
                f"{len(dag.flows)} KV flows, {dag.total_bytes() / 1e6:.2f} MB emulated")
        if ctx.scenario.models:
            served = serve_modelled(ctx, fabric, planned, serving, s["d_credits"])
        else:
            with ctx.testbeds.open(name, fabric, scale, lock_wait_s=s["lock_wait_s"]) as bed:
                served = serve(bed, planned, serving, s["d_credits"],
                               ctx.run_dir / name / "flows",
                               progress=ctx.progress(f"{name} KV flows"),
                               record_flows=ctx.testbeds.record_flows,
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
                        check=check, run=run, network=Network.SERIES, model=run)
