"""TCP over rotating circuits: what a rotor's duty cycle leaves TCP to use.

RotorNet's rotor switches do not wait for requests: each steps through a
fixed list of matchings, dark for a guard (its reconfiguration) at the
start of every slot.  On the `topologies.rotor` fabric every pair of ToRs
is joined by one rotor in every slot, over another rotor each slot, so a
long flow between two ToRs sees its circuit dark for the guard, then lit
for the rest of the slot, over and over.  At most the duty cycle
(slot - guard) / slot of the link's rate can get through; Etalon asked how
much of that TCP actually uses, ramping up again after every guard.  Here
the question is asked of real kernel TCP.

The kernel times everything (`controllers.netlink.bpfpanel`): each rotor's
map holds its matchings per slot, each ToR's time-flow table the uplink to
take per slot for each remote host, and no process acts at a slot boundary.
Time is dilated as much as bandwidth is scaled down (the scenario: 100
Gbit/s real = 50 Mbit/s, tdf 2000), so a slot carries the bytes it would
carry for real.  Not the round-trip time: the kernel's own path (a few
hundred microseconds emulated, a fraction of a microsecond real) is far
shorter than a real fabric's, so TCP regrows faster after each guard than
it would on a real rotor.  A tdf that kept bytes per slot far below the
real ones (1 ms slots at 50 Mbit/s: four segments) left TCP losing at
every boundary and using 2% of the bound.

The ToRs hold no per-destination queues (a RotorNet ToR does): a segment
still queued on an uplink when its slot ends drains into the guard or
reaches the wrong ToR, which drops it.  So the losses at each boundary are
those of a ToR without time-aware queues; the report says so.

Per congestion control and duty cycle, one run: the schedule starts, one
long flow per ToR to the next ToR's host (a ring: every ToR sends one and
receives one), and a capture at each receiver.  Reported: goodput against
the duty-cycle bound, the share of each slot's lit time TCP leaves unused,
retransmissions, and the goodput folded over the slot (by time since the
slot began, binned), which shows the ramp after each guard.  The receiver's
capture sees a slot's traffic one serialization later than the OCS does
(a frame's time on the ToR-to-host link); the fold is on the receiver's
clock as captured.
"""

from __future__ import annotations

import math
import time
from typing import Dict, List

from emu.experiments.base import Context, Experiment, Network, Outcome, build_fabric
from emu.live.capture import Capture
from emu.live.replay import FlowResult, Stream
from emu.live.dataplane import CONGESTION_CONTROLS
from emu.schema import Field
from traffic.measure import pcap

SECTION = "rotor"
SUMMARY = "TCP over a rotor OCS's rotating circuits: goodput against the duty-cycle bound"
FIELDS = {
    "guard_us": Field(float, 10.0, "real guard (reconfiguration) time per slot, us; "
                      "RotorNet's 10 us (the RFabric text's Table 2)", minimum=0.01,
                      maximum=1e6),
    "duty_cycles": Field(list, [0.5, 0.75, 0.9], "lit share of a slot, (slot - guard) / "
                         "slot; the slot follows from the guard; 0.9 is RotorNet's",
                         item=float),
    "congestion": Field(list, ["cubic", "bbr"], "TCP congestion controls to compare",
                        item=str, choices=list(CONGESTION_CONTROLS)),
    "duration_s": Field(float, 4.0, "each run's flows, s", minimum=1.0, maximum=600.0),
    "fold_bins": Field(int, 20, "bins of the goodput folded over one slot", minimum=4,
                       maximum=200),
    "zoom_slots": Field(int, 6, "slots shown in the timeline of one flow's goodput (the "
                        "first congestion control at the highest duty cycle)", minimum=1,
                        maximum=100),
}
PORT = 5401
TCP_PAYLOAD_SHARE = 1448 / 1514      # payload of a full frame (timestamps on)
SETTLE_S = 0.5                       # slots ignored at a flow's start (handshake, slow start)


def check(scenario) -> None:
    fabric = build_fabric(scenario)
    if fabric.name != "rotor":
        raise ValueError(f"rotor needs the 'rotor' fabric (got {fabric.name!r}): its rotors "
                         "cycle through the matchings that join every pair of ToRs")
    for duty in scenario.section["duty_cycles"]:
        if not 0.0 < duty < 1.0:
            raise ValueError(f"rotor.duty_cycles: {duty!r} must be in (0, 1)")
    testbed = scenario.config["testbed"]
    from emu.live import dataplane
    if dataplane.choose(testbed.get("dataplane", dataplane.AUTO)).dataplane != dataplane.LINUX:
        raise ValueError("rotor needs testbed.dataplane 'linux': only the kernel data "
                         "plane's BPF panel runs schedules")
    if testbed.get("panel") == "mirred":
        raise ValueError("rotor needs testbed.panel 'bpf' or 'auto': only the BPF panel "
                         "runs schedules")


def slot_us(guard_us: float, duty: float) -> float:
    """One slot, guard included, for a duty cycle: guard / (1 - duty)."""
    return guard_us / (1.0 - duty)


def ring_flows(fabric) -> List[tuple]:
    """(src host, dst host): each ToR's first host to the next ToR's first host."""
    firsts = []
    for tor in sorted(fabric.eps_switches, key=lambda name: fabric.graph.nodes[name]["server"]):
        hosts = [h for h in fabric.hosts if fabric.host_port(h)[0] == tor]   # build order
        firsts.append(hosts[0])
    return [(firsts[i], firsts[(i + 1) % len(firsts)]) for i in range(len(firsts))]


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    link_mbps = ctx.scenario.config["scale"]["link_mbps"]
    flows = ring_flows(ctx.fabric)
    runs = [(cc, duty) for cc in s["congestion"] for duty in s["duty_cycles"]]
    ctx.log(f"{len(flows)} flows in a ring of ToRs, {len(runs)} run(s) of "
            f"{s['duration_s']:g} s: {', '.join(f'{cc} at {d:g}' for cc, d in runs)}")
    kinds = set(ctx.bed.panel_kind.values())
    if kinds != {"bpf"}:
        raise RuntimeError(f"the rotors run the {sorted(kinds) or 'OpenFlow'} panel: "
                           f"{ctx.bed.panel_note or 'schedules need the BPF panel'}")
    outcome = Outcome()
    outcome.t0 = time.time()
    rows, folds, zooms = [], [], {}
    progress = ctx.progress("rotor runs")
    for index, (cc, duty) in enumerate(runs):
        schedule = ctx.bed.schedule({"rotor": True, "slot_us": slot_us(s["guard_us"], duty),
                                     "guard_us": s["guard_us"]}, start_in_s=0.05)
        label = f"{cc}-{round(duty * 100)}"
        captures, streams = [], []
        try:
            for src, dst in flows:
                intf = ctx.bed.host(dst).defaultIntf().name
                # Its own flow only: the host also sends one, to the same port.
                ip = ctx.fabric.graph.nodes[dst]["ip"]
                captures.append(Capture(ctx.bed, f"{label}-{dst}-rx", intf, host=dst,
                                        bpf=f"tcp and dst port {PORT} and dst host {ip}")
                                .start(ctx.captures_dir))
            for src, dst in flows:
                streams.append(Stream(ctx.bed, src, dst, s["duration_s"], PORT,
                                      name=f"{label}-{src}-{dst}", congestion=cc))
            results = [st.finish(timeout_s=s["duration_s"] + 60) for st in streams]
        finally:
            for stream in streams:
                stream.stop()
            for capture in captures:
                capture.stop()
            ctx.bed.stop_schedule()
        run_rows = []
        for (src, dst), stream, result, capture in zip(flows, streams, results, captures):
            row = FlowResult(id=stream.name, src=src, dst=dst, bytes=0, step=index,
                             group=label)
            row.fill(result)
            row.bytes = row.bytes_received
            outcome.flows.append(row)
            if row.status != "ok":
                outcome.warnings.append(f"{stream.name}: {row.error}")
            records = pcap.packet_records(capture.path, proto="tcp", dport=PORT)
            run_rows.append((row, records))
        row, fold, first = _analyse(run_rows, schedule, duty, cc, link_mbps, s)
        rows.append(row)
        folds.append(fold)
        zooms[(cc, duty)] = first
        progress(index + 1, len(runs))
    outcome.metrics = {"rotor": rows, "rotor_fold": folds,
                       "guard_us": s["guard_us"], "tdf": ctx.scale.tdf,
                       "assumption": "ToRs without per-destination queues: a segment queued "
                                     "on an uplink at a slot's end is lost in the guard or "
                                     "dropped by the ToR it reaches"}
    shown = zooms.get((s["congestion"][0], max(s["duty_cycles"])))
    if shown:
        outcome.timeline = shown
    return outcome


def _analyse(run_rows, schedule: dict, duty: float, cc: str, link_mbps: float, s: dict):
    """One run's row (goodput against the bound, unused share, retransmissions),
    its goodput folded over a slot, and a zoomed timeline of its first flow."""
    period = schedule["slot_emulated_s"]
    guard = schedule["guard_emulated_s"]
    epoch = schedule["epoch"]
    bound = link_mbps * TCP_PAYLOAD_SHARE * duty
    goodputs = [row.goodput_mbps for row, _ in run_rows]
    mean = sum(goodputs) / len(goodputs) if goodputs else 0.0
    bins = s["fold_bins"]
    width = period / bins
    folded = [0] * bins
    slots_seen = 0.0
    for _, records in run_rows:
        if not records:
            continue
        start = records[0].ts + SETTLE_S
        end = records[-1].ts
        used = [r for r in records if start <= r.ts < end]
        slots_seen += max(0.0, (end - start) / period)
        for r in used:
            phase = (r.ts - epoch) % period
            folded[min(bins - 1, int(phase / width))] += r.length
    # Each bin's share of the link's rate, over every slot the flows spanned.
    fold = {"congestion": cc, "duty_cycle": duty, "bin_us": width * 1e6,
            "guard_us_emulated": guard * 1e6,
            "share_of_link": [b * 8 / 1e6 / (link_mbps * width * slots_seen) if slots_seen
                              else 0.0 for b in folded]}
    row = {
        "congestion": cc, "duty_cycle": duty,
        "slot_us_emulated": period * 1e6, "guard_us_emulated": guard * 1e6,
        "goodput_mbps": mean,
        "goodput_min_mbps": min(goodputs) if goodputs else 0.0,
        "bound_mbps": bound,
        "goodput_of_bound": mean / bound if bound else None,
        "unused_lit_share": 1.0 - mean / bound if bound else None,
        "retransmits_count": sum(row.retransmits for row, _ in run_rows),
        "flows_count": len(run_rows),
    }
    first = None
    if run_rows and run_rows[0][1]:
        records = run_rows[0][1]
        # From the first slot boundary after the flow settled, whole slots.
        settled = records[0].ts + SETTLE_S
        t_start = epoch + math.ceil((settled - epoch) / period) * period
        span = s["zoom_slots"] * period
        window = [r for r in records if t_start <= r.ts < t_start + span]
        series = pcap.throughput_series(window, width, start=t_start) if window else []
        k0 = int((t_start - epoch) // period)
        guards = []
        k = k0
        while epoch + k * period < t_start + span:
            g0 = epoch + k * period
            if g0 + guard > t_start:
                guards.append({"start": max(g0, t_start) - t_start,
                               "end": g0 + guard - t_start, "label": ""})
            k += 1
        first = {"t0": t_start, "series": [{"label": f"{run_rows[0][0].id} ({cc}, duty "
                                                      f"{duty:g})",
                                            "points": [[t - t_start, v] for t, v in series]}],
                 "dark_windows": guards}
    return row, fold, first


EXPERIMENT = Experiment(kind="rotor", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.ONE)
