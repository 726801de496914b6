"""OCS reconfiguration under load: blackout and recovery per technology.

A TCP stream and a paced UDP probe cross an OCS circuit.  The OCS is
reconfigured once per preset between two circuit sets that join the same
ToRs over different ports, so every byte has to wait for the new circuit.
The blackout is measured from the receiver's capture, never from the
controller's timestamps (those only mark where to look and are reported
next to it): from the probe's sequence numbers and send timestamps (iperf3
stamps both into every datagram), the stretch of the sender's time whose
probes never arrived, to one probe period (0.1 ms at the default 10,000
pkt/s).  The gap between arrivals is reported too: it also holds changes in
queueing across the loss.  Outside the reconfigurations, the probe's
inter-arrival times show the data plane's jitter (P99.9 and max).

On the ``linux`` data plane with the BPF patch panel, the kernel times the
dark window itself, down to RotorNet's 10 us, which a 10,000 pkt/s probe
cannot resolve.  So each preset is also timed on the OCS's own ports
(`emu.live.panelprobe`), in a second pass after the traffic: minimum-size
frames into both of the first ToR's OCS ports at ``panel_probe_pps`` (one
frame per port every 2/pps s), captured in the OCS's namespace as they come
in and go out.  The port torn goes dark and the port lit comes back; those
two edges, each placed in the middle of the gap between the frames around
it, give the dark window at the OCS, compared with the times the kernel
held.  A pass of its own because the probe's sender busy-waits on a core:
beside the TCP stream, on two cores, it starved the other instruments (the
UDP probe missed whole windows) and was starved in turn (gaps of 0.7 ms).
"""

from __future__ import annotations

import time

import numpy

from controllers.ocs_core import TECHNOLOGIES, delay_ms_for
from controllers.pause import pause_at
from emu.experiments.base import Context, Experiment, Network, Outcome, build_fabric
from emu.schema import Field
from topologies import hybrid
from traffic.measure import pcap, probes
from emu.live.capture import Capture
from emu.live.panelprobe import PanelProbe
from traffic.measure import darkwindow
from emu.live.probe import Probe
from emu.live.replay import FlowResult, Stream

SECTION = "ocs_reconfig"
SUMMARY = "TCP + UDP probe across an OCS circuit, one reconfiguration per Table 2 preset"
FIELDS = {
    "presets": Field(list, ["rotornet", "mems", "piezo", "lc"], "technologies, in order",
                     item=str, choices=list(TECHNOLOGIES) + ["custom"]),
    "custom_delay_ms": Field(float, 50.0, "real delay of the 'custom' preset", minimum=0.0),
    "settle_s": Field(float, 3.0, "steady traffic before and after each reconfiguration",
                      minimum=0.5, maximum=600.0),
    "probe_pps": Field(int, 10000, "UDP probe packets per second: the blackout's resolution "
                       "is one period", minimum=100, maximum=20000),
    "probe_bytes": Field(int, 64, "UDP probe payload bytes", minimum=16, maximum=1400),
    "tcp": Field(bool, True, "run the TCP stream alongside the probe"),
    "src": Field(str, "h1", "sending host"),
    "dst": Field(str, "", "receiving host; empty = first host on another ToR"),
    "bin_ms": Field(float, 50.0, "throughput timeline bin", minimum=1.0, maximum=10000.0),
    "panel_probe_pps": Field(int, 100000, "BPF panel only: frames per second into the OCS's "
                             "ports to time each dark window there (0: off); the edges' "
                             "resolution is 2/pps (two ports)", minimum=0, maximum=400000),
}
PANEL_PROBE_MAX_DELAY_S = 5.0     # longer windows are timed well enough by the UDP probe
PANEL_PROBE_MARGIN_S = 0.15       # probe time before and after a window
CIRCUIT_SETS = ("ring", "ring-reverse")
PROBE_PORT, TCP_PORT = 5301, 5302


def _endpoints(scenario, fabric):
    src = scenario.section["src"]
    if src not in fabric.hosts:
        raise ValueError(f"ocs_reconfig.src {src!r} is not a host of the fabric")
    tor = fabric.host_port(src)[0]
    dst = scenario.section["dst"] or next(
        (h for h in fabric.hosts if fabric.host_port(h)[0] != tor), "")
    if dst not in fabric.hosts or fabric.host_port(dst)[0] == tor:
        raise ValueError(f"ocs_reconfig.dst {dst!r} must be a host on another ToR than {src}")
    return src, dst


def check(scenario) -> None:
    fabric = build_fabric(scenario)
    if fabric.name != "hybrid":
        raise ValueError(f"ocs-reconfig needs the 'hybrid' fabric (got {fabric.name!r}): its "
                         "circuit sets are what the reconfiguration alternates between")
    _endpoints(scenario, fabric)
    for preset in scenario.section["presets"]:
        delay_ms_for(preset, scenario.section["custom_delay_ms"] if preset == "custom" else None)


def _delay_ms(ctx, preset):
    return delay_ms_for(preset, ctx.settings["custom_delay_ms"] if preset == "custom" else None)


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    src, dst = _endpoints(ctx.scenario, ctx.fabric)
    presets = s["presets"]
    tdf = ctx.scale.tdf
    delays_s = [_delay_ms(ctx, p) * tdf / 1000 for p in presets]
    total_s = s["settle_s"] * (len(presets) + 1) + sum(delays_s) + 1.0
    link_mbps = ctx.scenario.config["scale"]["link_mbps"]
    tcp_mbps = tcp_rate_mbps(link_mbps, s["probe_pps"], s["probe_bytes"])
    ctx.log(f"{src} -> {dst}: TCP at up to {tcp_mbps:.1f} Mbit/s + UDP probe "
            f"{s['probe_pps']} pkt/s, {len(presets)} reconfiguration(s), ~{total_s:.0f} s")

    dst_intf = ctx.bed.host(dst).defaultIntf().name
    capture = Capture(ctx.bed, f"{dst}-rx", dst_intf, host=dst, bpf="ip").start(ctx.captures_dir)
    streams = []
    probe = None
    outcome = Outcome()
    events = []
    try:
        probe = Probe(ctx.bed, src, dst, PROBE_PORT, s["probe_pps"], s["probe_bytes"], total_s)
        if s["tcp"]:
            # Paced under what the probe leaves of the link: the two never queue up.
            streams.append(Stream(ctx.bed, src, dst, total_s, TCP_PORT, rate_mbps=tcp_mbps,
                                  name="tcp"))
        outcome.t0 = time.time()
        progress = ctx.progress("reconfigurations")
        pause_at("traffic")         # tests interrupt a run here
        time.sleep(s["settle_s"])  # steady state is the condition: nothing to poll for
        current = 0
        for index, preset in enumerate(presets):
            current = 1 - current
            circuits = sorted(hybrid.circuit_set(ctx.fabric, CIRCUIT_SETS[current]))
            args = {"technology": preset}
            if preset == "custom":
                args["delay_ms"] = s["custom_delay_ms"]
            result = ctx.bed.reconfigure("o1", circuits, timeout_s=60 + delays_s[index] * 2,
                                         **args)
            events.append((preset, result))
            progress(index + 1, len(presets))
            time.sleep(s["settle_s"])
        results = [st.finish(timeout_s=total_s + 30) for st in streams]
        if not probe.finish(timeout_s=total_s + 30):
            outcome.warnings.append("the probe's sender did not finish its schedule")
    finally:
        for stream in streams:
            stream.stop()
        if probe is not None:
            probe.stop()
        capture.stop()
    current = _time_each_preset_at_ocs(ctx, presets, delays_s, events, current)
    for stream, result in zip(streams, results):
        row = FlowResult(id=stream.name, src=src, dst=dst, bytes=0, step=None, group="stream")
        row.fill(result)
        row.bytes = row.bytes_received
        outcome.flows.append(row)
        if row.status != "ok":
            outcome.warnings.append(f"{stream.name} stream: {row.error}")
    _analyse(ctx, outcome, capture.path, events, src, dst, s)
    return outcome


def _time_each_preset_at_ocs(ctx, presets, delays_s, events, current) -> int:
    """The quiet pass: each preset once more, timed on the OCS's ports (its
    event gets ``ocs_ports``); returns the circuit set left lit."""
    if not ctx.settings["panel_probe_pps"] or ctx.bed.panel_kind.get("o1") != "bpf":
        return current
    progress = ctx.progress("dark windows timed at the OCS")
    for index, preset in enumerate(presets):
        probe = _panel_probe(ctx, index, delays_s[index])
        if probe is None:
            continue
        current = 1 - current
        circuits = sorted(hybrid.circuit_set(ctx.fabric, CIRCUIT_SETS[current]))
        args = {"technology": preset}
        if preset == "custom":
            args["delay_ms"] = ctx.settings["custom_delay_ms"]
        try:
            result = ctx.bed.reconfigure("o1", circuits, timeout_s=60 + delays_s[index] * 2,
                                         **args)
        except BaseException:
            probe.stop()
            raise
        events[index][1]["ocs_ports"] = _time_at_ocs(probe, result)
        progress(index + 1, len(presets))
    return current


def _panel_probe(ctx, index, delay_s):
    """The OCS-port probe of one reconfiguration, started (None where it cannot run)."""
    pps = ctx.settings["panel_probe_pps"]
    if not pps or ctx.bed.panel_kind.get("o1") != "bpf" or delay_s > PANEL_PROBE_MAX_DELAY_S:
        return None
    tor = ctx.fabric.peer("o1", 1)[0]
    ports = [p for p in sorted(ctx.fabric.ports_of("o1")) if ctx.fabric.peer("o1", p)[0] == tor]
    probe = PanelProbe(ctx.bed, "o1", ports, 2 * PANEL_PROBE_MARGIN_S + delay_s + 0.05, pps,
                       name=f"o1-ports-{index + 1}").start(ctx.captures_dir)
    time.sleep(PANEL_PROBE_MARGIN_S)   # frames before the tear: the pass->drop edge
    return probe


def _time_at_ocs(probe, result) -> dict:
    """The dark window as the OCS's ports saw it, against the kernel's written times."""
    edges = probe.finish()
    dark_ns = int(round(result["dark_from"] * 1e9))
    lit_ns = dark_ns + int(round(result["dark_s"] * 1e9))
    slack = int(max(0.005, result["dark_s"]) * 1e9)
    window = darkwindow.window_between(edges, dark_ns, lit_ns, slack)
    if window is None:
        return {"measured": False, "edges_count": len(edges), "pcap": probe.capture.path.name,
                "capture": probe.capture.summary, "sender": probe.output[-1:]}
    return {"measured": True, "dark_us": window.duration_ns / 1e3,
            "error_us": (window.duration_ns - (lit_ns - dark_ns)) / 1e3,
            "start_error_us": (window.start.at_ns - dark_ns) / 1e3,
            "end_error_us": (window.end.at_ns - lit_ns) / 1e3,
            "resolution_us": window.resolution_ns / 1e3,
            "torn_port": probe.port_name(window.start.ifindex),
            "lit_port": probe.port_name(window.end.ifindex),
            "pcap": probe.capture.path.name, "capture": probe.capture.summary,
            "sender": probe.output[-1:]}


def _analyse(ctx, outcome, pcap_path, events, src, dst, s):
    src_ip = ctx.fabric.graph.nodes[src]["ip"]
    probe = pcap.packet_records(pcap_path, proto="udp", src_ip=src_ip, dport=PROBE_PORT)
    stamped = probes.probe_records(pcap_path, src_ip=src_ip, dport=PROBE_PORT)
    tcp = pcap.packet_records(pcap_path, proto="tcp", src_ip=src_ip, dport=TCP_PORT)
    probe_ts = [r.ts for r in probe]
    period = 1.0 / s["probe_pps"]
    bin_s = s["bin_ms"] / 1000
    t0 = outcome.t0
    rows, dark = [], []
    for preset, result in events:
        stamps = result["timestamps"]
        injected_ms = result["plan"]["delay_emulated_ms"]
        gap = pcap.blackout_near(probe_ts, stamps["routes_moved"],
                                 window_s=injected_ms / 1000 + 1.0, nominal_interval_s=period,
                                 observed_until=probe_ts[-1] if probe_ts else None)
        lost = probes.sequence_blackout(stamped, stamps["routes_moved"],
                                      window_s=injected_ms / 1000 + 1.0, period_s=period)
        before = [r for r in tcp if stamps["start"] - s["settle_s"] + 0.5 <= r.ts < stamps["start"]]
        after_end = stamps["routes_restored"] + s["settle_s"]
        after = [r for r in tcp if after_end - s["settle_s"] / 2 <= r.ts < after_end]
        before_mbps = _mbps(before, s["settle_s"] - 0.5)
        after_mbps = _mbps(after, s["settle_s"] / 2)
        recovery = None
        if tcp and before_mbps > 0:
            recovery = pcap.recovery_time(tcp, stamps["lit"], before_mbps, interval_s=bin_s)
        rows.append({
            "preset": preset,
            "injected_ms": injected_ms,
            "injected_real_ms": result["plan"]["delay_real_ms"],
            "measured_blackout_ms": lost.duration_s * 1000 if lost else None,
            "error_ms": (lost.duration_s * 1000 - injected_ms) if lost else None,
            "probes_lost_count": lost.lost if lost else None,
            "arrival_gap_ms": gap.duration_s * 1000 if gap else None,
            "controller_dark_ms": result["dark_s"] * 1000,
            # How long the controller's tear took, from its first message to the
            # data plane's confirmation: the uncertainty on where darkness began.
            "tear_round_ms": (stamps["torn"] - stamps["tear_sent"]) * 1000,
            "recovery_ms": recovery * 1000 if recovery is not None else None,
            "goodput_before_mbps": before_mbps,
            "goodput_after_mbps": after_mbps,
            "kernel_timed": bool(result.get("kernel_timed")),
            **_ocs_columns(result.get("ocs_ports")),
        })
        dark.append({"start": stamps["torn"] - t0, "end": stamps["lit"] - t0, "label": preset})
        if gap is None:
            outcome.warnings.append(f"{preset}: no probe packets around the reconfiguration")
    series = [{"label": f"TCP {src}->{dst}",
               "points": [[t - t0, v] for t, v in pcap.throughput_series(tcp, bin_s, start=t0)]},
              {"label": f"UDP probe {src}->{dst}",
               "points": [[t - t0, v] for t, v in pcap.throughput_series(probe, bin_s, start=t0)]}]
    outcome.timeline = {"t0": t0, "series": series, "dark_windows": dark}
    errors = [abs(r["error_ms"]) for r in rows if r["error_ms"] is not None
              and r["injected_ms"] >= 1.0]
    at_ocs = [abs(r["ocs_error_us"]) for r in rows if r.get("ocs_error_us") is not None]
    quiet = quiet_interarrivals(probe_ts, [(e[1]["timestamps"]["start"] - QUIET_MARGIN_S,
                                            e[1]["timestamps"]["routes_restored"] + QUIET_AFTER_S)
                                           for e in events])
    outcome.metrics = {
        "reconfig": rows,
        "probe_packets_count": len(probe),
        "probe_period_ms": period * 1000,
        "probe_interarrival_p999_ms": _percentile_ms(quiet, 99.9),
        "probe_interarrival_p99_ms": _percentile_ms(quiet, 99.0),
        "probe_interarrival_max_ms": max(quiet) * 1000 if quiet else None,
        "blackout_error_mean_ms": sum(errors) / len(errors) if errors else None,
        "blackout_error_worst_ms": max(errors) if errors else None,
        "ocs_dark_error_mean_us": sum(at_ocs) / len(at_ocs) if at_ocs else None,
        "ocs_dark_error_worst_us": max(at_ocs) if at_ocs else None,
    }


def _ocs_columns(measured) -> dict:
    """The OCS-port timing's columns of a reconfiguration row (none if not timed)."""
    if not measured:
        return {}
    if not measured["measured"]:
        return {"ocs_dark_us": None, "ocs_error_us": None}
    return {"ocs_dark_us": measured["dark_us"], "ocs_error_us": measured["error_us"],
            "ocs_start_error_us": measured["start_error_us"],
            "ocs_end_error_us": measured["end_error_us"],
            "ocs_resolution_us": measured["resolution_us"]}


# Bytes a datagram or segment adds on the wire, as the links' shapers count
# frames: Ethernet (14) + IPv4 (20) + UDP (8); and TCP's full frame for 1448
# bytes of payload (with timestamps) is 1514.
UDP_OVERHEAD_BYTES = 42
TCP_PAYLOAD_SHARE = 1448 / 1514
TCP_HEADROOM = 0.9


def tcp_rate_mbps(link_mbps: float, probe_pps: int, probe_bytes: int) -> float:
    """The TCP stream's pacing rate: what the probe leaves of the link, in payload,
    with headroom, so that the two never queue up behind each other (a full
    queue would delay and drop probes, and be lost in darkness at each tear)."""
    probe_wire = probe_pps * (probe_bytes + UDP_OVERHEAD_BYTES) * 8 / 1e6
    return max(0.1, (link_mbps - probe_wire) * TCP_PAYLOAD_SHARE * TCP_HEADROOM)


# Inter-arrival times of the probe away from any reconfiguration: from this
# long before a change starts to this long after its routes are restored.
QUIET_MARGIN_S = 0.05
QUIET_AFTER_S = 0.5


def quiet_interarrivals(arrivals, busy) -> list:
    """Gaps between consecutive probe arrivals, leaving out those that touch a busy
    window (a reconfiguration and what follows it)."""
    ordered = sorted(arrivals)
    return [b - a for a, b in zip(ordered, ordered[1:])
            if not any(a < end and b > start for start, end in busy)]


def _percentile_ms(values, q):
    return float(numpy.percentile(values, q)) * 1000 if values else None


def _mbps(records, seconds):
    return sum(r.length for r in records) * 8 / 1e6 / seconds if seconds > 0 else 0.0


EXPERIMENT = Experiment(kind="ocs-reconfig", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.ONE)
