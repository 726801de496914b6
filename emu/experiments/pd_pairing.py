"""P/D pairing strategies with and without KV ingress credits, on one fabric.

Sections 6-7 of the 002 text: how P is paired with D (fixed pairs, random,
the joint score, D-sticky sessions with P near the session's home D) and
whether D admits only a few large KV streams at once ("each D accepts 2-4
large KV streams"; a P waits for D credit).  Without credits, several P
finish prefill together and push their KV into one D at once: an incast
on that D's NIC ports, where the streams share the ports and all finish
late.  With credits the later ones wait, and the ones admitted finish at
full speed.

The same seeded stream (`traffic.pdplan`'s planning: placement, prefill FIFO
per P, KV flows per TP rank) is served once per (pairing, credits) pair
on one testbed, one after the other.  Reported per configuration: TTFT
P50/P95/P99, throughput, KV transfer P99, the peak concurrent KV streams
into any D (the incast) and into each D, the share of requests paired with
their session's home D (only the delta KV then moves), the KV bytes moved,
and D-ingress concurrency over time (``d_ingress.png``).

Runs (as root)::

  .venv/bin/python -m emu.run pd-pairing
  .venv/bin/python -m emu.run pd-pairing --set pd-pairing.pairings=score,sticky
  .venv/bin/python -m emu.run pd-pairing --set pd-pairing.credits=4,0
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, List

from emu.experiments import pd_setup
from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.experiments.pd_serve import ServeSettings, serve, serve_modelled
from emu.schema import Field
from topologies import registry
from traffic.pairing import PAIRINGS
from traffic.pdplan import plan

SECTION = "pd-pairing"
SUMMARY = "P/D pairing strategies x KV ingress credits on/off on one fabric: TTFT P99, " \
          "incast (peak KV streams per D), throughput"

_SHARED = ("workload", "seed", "tp", "placement", "tile", "path_strategy", "path_credits",
           "lock_wait_s", "kv_window")
FIELDS = {key: pd_setup.FIELDS[key] for key in _SHARED}
FIELDS.update({
    "fabric": Field(str, "zcube", "the fabric, at the GPU count of fabric.spec",
                    choices=list(pd_setup.FABRICS)),
    "pairings": Field(list, list(PAIRINGS), "pairing strategies to compare, in order",
                      item=str),
    "credits": Field(list, [2, 0], "KV streams a D accepts at once, one run each; 0: no "
                     "credits (every stream starts when its prefill ends)", item=int),
    "requests": Field(int, 24, "requests in the stream (emulated: at most "
                      "200; the model takes up to 20,000)", minimum=2, maximum=20000),
    "rate_per_s": Field(float, 100.0, "arrival rate, real requests per second (above what "
                        "the KV links carry, so streams pile up at D)", minimum=0.01),
    "prefill_ms_per_ktoken": Field(float, 1.0, "prefill compute, real ms per 1K new prompt "
                                   "tokens (x tdf)", minimum=0.0),
    "link_capture": Field(bool, False, "capture every switch port per configuration and "
                          "report the hottest links (costs CPU on a small machine)"),
})


def label(pairing: str, credits: int) -> str:
    return f"{pairing}, {'credits ' + str(credits) if credits else 'no credits'}"


def configurations(settings) -> List[tuple]:
    return [(pairing, credits) for pairing in settings["pairings"]
            for credits in settings["credits"]]


def check(scenario) -> None:
    pd_setup.check_stream(scenario, SECTION)
    s = scenario.section
    if not s["pairings"]:
        raise ValueError(f"pd-pairing.pairings is empty; allowed: {', '.join(PAIRINGS)}")
    unknown = [p for p in s["pairings"] if p not in PAIRINGS]
    if unknown:
        raise ValueError(f"pd-pairing.pairings: unknown {unknown}; allowed: "
                         f"{', '.join(PAIRINGS)}")
    if len(set(s["pairings"])) != len(s["pairings"]):
        raise ValueError(f"pd-pairing.pairings repeats a strategy: {s['pairings']}")
    if not s["credits"]:
        raise ValueError("pd-pairing.credits is empty; give D credit limits 1-8, or 0 for none")
    bad = [c for c in s["credits"] if not 0 <= c <= 8]
    if bad or len(set(s["credits"])) != len(s["credits"]):
        raise ValueError(f"pd-pairing.credits={s['credits']}: each must be 0 (no credits) to 8, "
                         "without repeats")
    spec = pd_setup.fabric_specs(scenario.config["fabric"]["spec"], [s["fabric"]])[s["fabric"]]
    pd_setup.check_fabric_fits(s["fabric"], spec, registry.build(spec), s, SECTION, key="fabric")


def notes(rows: List[dict]) -> List[str]:
    """How to read the configurations, with the incast each one measured."""
    lines = ["peak_streams_per_d is the most KV streams (requests) that flowed into one D at "
             "once, measured from the flows' start and end: without credits it is the "
             "incast; with credits it never exceeds d_credits. A stream held back waits "
             "(credit_wait_mean) instead of sharing the D's NIC ports."]
    for row in rows:
        lines.append(f"{row['config']}: peak {row['peak_streams_per_d_count']} stream(s) into "
                     f"one D, TTFT P99 {row.get('ttft_p99_s') or float('nan'):.2f} emulated s, "
                     f"{row['on_home_pct']:.0f}% of requests on their session's home D.")
    return lines


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    scale = ctx.scale
    name = s["fabric"]
    spec = pd_setup.fabric_specs(ctx.scenario.config["fabric"]["spec"], [name])[name]
    stream = pd_setup.stream_of(s)
    serving = ServeSettings.from_context(ctx)
    fabric = registry.build(spec)
    topo = pd_setup.topology(fabric, s["tp"])
    place = pd_setup.make_placement(topo, s)
    configs = configurations(s)
    ctx.log(f"  {len(stream)} {s['workload']} requests at {s['rate_per_s']:g}/s real on {name} "
            f"({spec}): P {pd_setup.nodes_text(place.prefill)}, D "
            f"{pd_setup.nodes_text(place.decode)}; {len(configs)} configurations")
    outcome = Outcome()
    rows, per_d, ingress, requests, hottest = [], [], [], [], []
    # The flow-level model (testbed.engine = "model") needs no testbed.
    opened = (contextlib.nullcontext() if ctx.scenario.models else
              ctx.testbeds.open(name, fabric, scale, lock_wait_s=s["lock_wait_s"]))
    with opened as bed:
        for index, (pairing, credits) in enumerate(configs, start=1):
            key = label(pairing, credits)
            folder = ctx.run_dir / name / f"{index:02d}-{pairing}-{credits or 'off'}"
            planned = plan(topo, place, stream, scale, pairing, s["prefill_ms_per_ktoken"],
                           s["seed"], s["path_strategy"])
            if bed is None:
                served = serve_modelled(ctx, fabric, planned, serving, credits or None)
            else:
                served = serve(bed, planned, serving, credits or None, folder / "flows",
                               progress=ctx.progress(f"[{index}/{len(configs)}] {key}: KV flows"),
                               record_flows=ctx.testbeds.record_flows,
                               links_dir=folder if s["link_capture"] else None)
            if not outcome.t0:
                outcome.t0 = served.t0
            outcome.flows += [dataclasses.replace(f, id=f"{index:02d}:{f.id}", group=key)
                              for f in served.results]
            summary = served.summary
            home = sum(1 for x in planned if x.on_home)
            rows.append({"config": key, "pairing": pairing, "d_credits_count": credits or None,
                         **{k: summary.get(k) for k in (
                             "served_count", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
                             "ttft_p99_real_ms", "kv_p99_s", "throughput_emu_rps",
                             "credit_wait_mean_s", "peak_streams_per_d_count",
                             "kv_window_bytes")},
                         "d_used_count": len({x.d for x in planned}),
                         "on_home_pct": 100.0 * home / len(planned),
                         "kv_bytes": sum(x.kv_bytes for x in planned),
                         "hottest_link": summary.get("hottest_link")})
            per_d += [{"config": key, **r} for r in served.streams]
            ingress += [{"config": key, **r} for r in served.ingress]
            requests += [{"config": key, **r} for r in served.rows]
            hottest += [{"config": key, **r} for r in served.hottest]
            outcome.warnings += [f"{key}: {w}" for w in served.link_warnings]
            if summary["served_count"] < len(served.rows):
                outcome.warnings.append(f"{key}: {len(served.rows) - summary['served_count']} "
                                        f"of {len(served.rows)} requests not served")
            ctx.log(f"  {key}: TTFT P50/P99 {summary.get('ttft_p50_s', float('nan')):.2f}/"
                    f"{summary.get('ttft_p99_s', float('nan')):.2f} s, peak "
                    f"{summary['peak_streams_per_d_count']} KV streams into one D")
    metrics: Dict = {"fabric": name, "spec": spec, "notes": notes(rows), "configs": rows,
                     "d_streams": per_d, "d_ingress": ingress, "requests": requests}
    if hottest:
        metrics["hottest_links"] = hottest
    outcome.metrics = metrics
    return outcome


EXPERIMENT = Experiment(kind="pd-pairing", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.SERIES, model=run)
