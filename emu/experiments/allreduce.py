"""Ring all-reduce among N hosts, measured against the alpha-beta ideal.

Completion time is from the first flow's start to the last flow's end, as
the receivers saw them.  The ideal is 2(N-1)/N x S/B with B the emulated
host link rate (alpha = 0), so the ratio shows what the emulation (TCP, the
transport, the datapath) adds.

Two transports: ``persistent`` (the default) keeps one TCP connection per
pair of neighbours and sends each chunk the moment the one it forwards has
arrived, as a collective library's socket transport does
(`emu.live.peer_replay`); ``iperf3`` runs an iperf3 session per chunk
(`emu.live.replay`), whose set-up, result exchange and hand-over through
the runner add 20-50 ms to every step.
"""

from __future__ import annotations

from emu.experiments.base import (Context, Experiment, Network, Outcome, build_fabric,
                                  model_calibration, scale_for)
from emu.schema import Field
from traffic.flows import allreduce_ideal_s, ring_allreduce
from emu.live.peer_replay import PeerReplayer
from emu.live.replay import Replayer

SECTION = "allreduce"
SUMMARY = "ring all-reduce on a fabric: completion vs 2(N-1)/N x S/B, per-step times"
FIELDS = {
    "hosts": Field(int, 8, "ring size N (the first N hosts of the fabric)", minimum=2),
    "bytes_real": Field(float, 1e9, "all-reduce size S in real bytes", minimum=1.0),
    "ring": Field(list, [], "explicit ring order (host names); empty = h1..hN", item=str),
    "transport": Field(str, "persistent", "persistent: one kept TCP connection per neighbour, "
                       "a chunk sent as soon as the one it forwards arrived; iperf3: an "
                       "iperf3 session per chunk", choices=["persistent", "iperf3"]),
}


def ring_hosts(scenario, fabric):
    settings = scenario.section
    hosts = settings["ring"] or fabric.hosts[:settings["hosts"]]
    unknown = [h for h in hosts if h not in fabric.hosts]
    if unknown:
        raise ValueError(f"allreduce.ring names hosts {unknown} not in the fabric "
                         f"(it has {fabric.hosts[0]}..{fabric.hosts[-1]})")
    if len(hosts) < settings["hosts"] and not settings["ring"]:
        raise ValueError(f"allreduce.hosts={settings['hosts']} but the fabric has only "
                         f"{len(fabric.hosts)} hosts")
    return hosts


def check(scenario) -> None:
    fabric = build_fabric(scenario)
    ring_hosts(scenario, fabric)
    scale = scale_for(scenario, fabric)
    if scale.emu_bytes(scenario.section["bytes_real"]) < 1000 * len(fabric.hosts):
        raise ValueError("allreduce.bytes_real is too small at this scale: under 1 kB per "
                         "flow; raise it or scale.tdf")


def run(ctx: Context) -> Outcome:
    hosts = ring_hosts(ctx.scenario, ctx.fabric)
    n = len(hosts)
    total = ctx.scale.emu_bytes(ctx.settings["bytes_real"])
    rate_mbps = ctx.scenario.config["scale"]["link_mbps"]
    dag = ring_allreduce(hosts, total)
    transport = ctx.settings["transport"]
    ctx.log(f"ring all-reduce of {total / 1e6:.2f} MB over {n} hosts "
            f"({len(dag.flows)} flows, {2 * (n - 1)} steps) at {rate_mbps:g} Mbit/s, "
            f"{transport} transport")
    progress = ctx.progress("all-reduce flows")
    if transport == "persistent":
        replayer = PeerReplayer(ctx.bed, dag, rate_mbps, progress=progress)
    else:
        replayer = Replayer(ctx.bed, dag, rate_mbps, ctx.run_dir / "flows", progress=progress)
    flows = replayer.run()
    return summarize(ctx, flows, replayer.t0, total, n)


def model_run(ctx: Context) -> Outcome:
    """The same ring on the flow-level model (``testbed.engine = "model"``).  The
    persistent transport keeps its connections, so its chunks pay no set-up;
    an iperf3 session per chunk pays the calibrated ``startup_s``."""
    from dataclasses import replace

    from traffic.model.dag import replay_dag

    hosts = ring_hosts(ctx.scenario, ctx.fabric)
    total = ctx.scale.emu_bytes(ctx.settings["bytes_real"])
    cal = model_calibration(ctx)
    if ctx.settings["transport"] == "persistent":
        cal = replace(cal, startup_s=0.0)
    flows = replay_dag(ctx.fabric, ring_allreduce(hosts, total),
                       lambda g: ctx.scale.emu_mbps(g) * 1e6, cal,
                       ecmp_seed=ctx.scenario.config["testbed"]["ecmp_seed"])
    return summarize(ctx, flows, 0.0, total, len(hosts))


def summarize(ctx: Context, flows, t0: float, total: int, n: int) -> Outcome:
    """Completion, steps and the ideal, from the flows however they were replayed."""
    rate_mbps = ctx.scenario.config["scale"]["link_mbps"]
    ok = [f for f in flows if f.status == "ok"]
    outcome = Outcome(flows=flows, t0=t0)
    if len(ok) != len(flows):
        outcome.warnings.append(f"{len(flows) - len(ok)} of {len(flows)} flows failed")
    if not ok:
        return outcome
    start = min(f.start for f in ok)
    ends_by_step = {}
    for flow in ok:
        ends_by_step[flow.step] = max(ends_by_step.get(flow.step, 0.0), flow.end)
    previous = start
    for step in sorted(ends_by_step):
        outcome.steps.append({"label": f"step {step}", "duration_s": ends_by_step[step] - previous})
        previous = ends_by_step[step]
    completion = max(f.end for f in ok) - start
    chunk = total // n
    ideal = allreduce_ideal_s(n, chunk * n, rate_mbps * 1e6)
    outcome.metrics = {
        "hosts_count": n,
        "bytes_emulated_bytes": chunk * n,
        "bytes_real_bytes": ctx.settings["bytes_real"],
        "completion_s": completion,
        "ideal_s": ideal,
        "completion_over_ideal_ratio": completion / ideal,
        "step_mean_s": sum(s["duration_s"] for s in outcome.steps) / len(outcome.steps),
        "step_max_s": max(s["duration_s"] for s in outcome.steps),
        "goodput_mean_mbps": sum(f.goodput_mbps for f in ok) / len(ok),
        "retransmits_count": sum(f.retransmits for f in ok),
    }
    return outcome


EXPERIMENT = Experiment(kind="allreduce", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.ONE, model=model_run)
