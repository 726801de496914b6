"""A ToR fails in the middle of a P/D request stream: ROFT, HPN and ZCube compared.

Section 2 of the 002 text (ZCube's Figure 3b): with a single ToR failure in
a 4K-GPU cluster, performance degrades 46.9% on ROFT, 9.0% on HPN and
2.8% on ZCube.  Here the same seeded stream as `pd_inference` (same
settings, same planning: placement, pairing, prefill queue, KV flows per
TP rank, D credits) is served twice on each fabric, on one testbed, and
that pair ``repeats`` times (the ToR comes back up in between; figures
are the mean over the repeats, the spread of the headline one is kept):

1. **healthy**: the stream as planned;
2. **failure**: at the arrival of request ``fail_after`` (emulated time from
   the replay start), every link of one ToR goes down at once (both veth
   ends of each, one ``ip`` batch per namespace).  The switches report the
   ports down (OpenFlow port status, or netlink link events on ``linux``)
   and the controller reroutes by itself; the replay goes on meanwhile,
   and once the controller's state lists every link down, every KV
   flow with an end behind the dead ToR moves to the NIC port that takes
   over (`traffic.failover`): the GPU's other port on ZCube (other layer)
   and HPN (other plane), a server mate's NIC over NVLink on ROFT.  A flow
   already running is cancelled and sent again in full from the new port,
   as a transfer restarted on another port would be (its processes armed
   before the stream began, so it starts at once); flows not started yet
   simply start there.

The ToR is the busiest one of the plan (``failed_switch = "auto"``: the
host-facing switch whose GPUs send and receive the most KV bytes), so
every fabric loses its worst single ToR.  Reported per fabric, for the
requests that arrive after the failure, healthy run against failure run:
throughput (served requests per emulated second), TTFT P50/P99 and mean KV
transfer time, and their degradation in percent, next to the text's
figure; plus what happened (the switch, the GPUs that failed over, the
flows moved, how long the control plane took to see the failure) and the
same figures for the requests before the failure (which should match).

Why the fabrics differ (what the emulation can show): a ROFT GPU has one
NIC port, so after its rail switch fails its traffic crosses NVLink onto a
GPU of another rail and the two GPUs share one port: half the bandwidth
for both.  An HPN or ZCube GPU keeps one of its two ports; on HPN that is
the same rail in the other plane (half the GPU's bandwidth), on ZCube a
switch of the other layer that reaches every D in two hops.  With few
requests and 16 GPUs the measured degradations are noisy and depend on how
much of the stream crosses the failed ToR; the text's figures are for a 4K
cluster running collectives, where the slowest GPU sets the pace.

Runs (as root)::

  .venv/bin/python -m emu.run pd-failure
  .venv/bin/python -m emu.run pd-failure --set pd-failure.fabrics=zcube
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from emu.experiments import pd_setup
from emu.experiments.base import Context, Experiment, Network, Outcome
from traffic.model.pd import NodeFailure
from emu.experiments.pd_serve import ServeSettings, serve, serve_modelled
from emu.schema import Field
from topologies import registry
from traffic import failover
from traffic.flows import FlowDag
from traffic.pdplan import plan
from traffic.pdstats import percentile

SECTION = "pd-failure"
SUMMARY = "one ToR fails mid-stream on ROFT, HPN and ZCube: throughput and TTFT before/after, " \
          "degradation vs the text's 46.9/9.0/2.8%"
FABRICS = ("roft", "hpn", "zcube")
#: Single ToR failure in a 4K-GPU cluster, the 002 text (ZCube's Figure 3b).
TEXT_DEGRADATION_PCT = {"roft": 46.9, "hpn": 9.0, "zcube": 2.8}
MECHANISM = {
    "roft": "one NIC port per GPU: NVLink to a server mate on another rail, sharing its port",
    "hpn": "dual-ToR NIC: the GPU's port in the other plane (same rail)",
    "zcube": "two NIC ports on two switch layers: the GPU's port on the other layer",
}

_SHARED = ("workload", "requests", "rate_per_s", "seed", "tp", "placement", "tile", "pairing",
           "path_strategy", "d_credits", "prefill_ms_per_ktoken", "path_credits", "lock_wait_s",
           "kv_window")
FIELDS = {key: pd_setup.FIELDS[key] for key in _SHARED}
FIELDS.update({
    "fabrics": Field(list, list(FABRICS), "fabrics to compare, in order, all at the GPU count "
                     "of fabric.spec", item=str),
    "requests": Field(int, 24, "requests in the stream (emulated: at most "
                      "200; the model takes up to 20,000)", minimum=4, maximum=20000),
    "rate_per_s": Field(float, 100.0, "arrival rate, real requests per second (above what "
                        "the KV links carry, so the fabric sets the pace)", minimum=0.01),
    "prefill_ms_per_ktoken": Field(float, 1.0, "prefill compute, real ms per 1K new prompt "
                                   "tokens (x tdf)", minimum=0.0),
    "fail_after": Field(int, 0, "the ToR fails when this request arrives (0: half-way)",
                        minimum=0),
    "failed_switch": Field(str, "auto", "the ToR to fail: 'auto' (the busiest of the plan) or "
                           "a switch name (one fabric only)"),
    "baseline": Field(bool, True, "serve the stream once without the failure first, on the "
                      "same testbed, to compare against"),
    "repeats": Field(int, 3, "healthy + failure pairs per fabric (the ToR comes back up "
                     "between them); figures are their mean, the spread is reported",
                     minimum=1, maximum=10),
})


# ---------------------------------------------------------------- checks (pure)
def fail_index(settings) -> int:
    return settings["fail_after"] or settings["requests"] // 2


def check(scenario) -> None:
    pd_setup.check_stream(scenario, SECTION)
    s = scenario.section
    names = s["fabrics"]
    allowed = ", ".join(FABRICS)
    if not names:
        raise ValueError(f"pd-failure.fabrics is empty; allowed: {allowed}")
    unknown = [n for n in names if n not in FABRICS]
    if unknown:
        raise ValueError(f"pd-failure.fabrics: {unknown} not supported; allowed: {allowed}")
    if len(set(names)) != len(names):
        raise ValueError(f"pd-failure.fabrics repeats a fabric: {names}")
    if not 1 <= fail_index(s) < s["requests"]:
        raise ValueError(f"pd-failure.fail_after={s['fail_after']} must be below "
                         f"pd-failure.requests={s['requests']} (0: half-way)")
    if s["failed_switch"] != "auto" and len(names) != 1:
        raise ValueError("pd-failure.failed_switch names a switch of one fabric: use it with "
                         "a single entry in pd-failure.fabrics, or 'auto'")
    specs = pd_setup.fabric_specs(scenario.config["fabric"]["spec"], names)
    for name in names:
        fabric = registry.build(specs[name])
        pd_setup.check_fabric_fits(name, specs[name], fabric, s, SECTION)
        if s["failed_switch"] != "auto":
            tors = failover.tor_switches(fabric)
            if s["failed_switch"] not in tors:
                raise ValueError(f"pd-failure.failed_switch={s['failed_switch']!r} is not a "
                                 f"ToR of {name}; allowed: auto, {', '.join(tors)}")


# ---------------------------------------------------------------- results (pure)
#: Row fields that describe the set-up, the same in every repeat.
SAME_EVERY_REPEAT = ("nic_ports_failed_over_count", "text_degradation_pct", "kv_window_bytes")

def window(rows: Sequence[dict], after: bool, t_fail: float) -> List[dict]:
    return [r for r in rows if (r["arrival_s"] >= t_fail) == after]


def window_figures(rows: Sequence[dict], t_start: Optional[float] = None) -> dict:
    """Throughput, TTFT and KV figures of some requests (emulated s).

    Throughput counts served requests over the span from ``t_start`` (the
    first arrival by default) to the last KV end.
    """
    served = [r for r in rows if r["served"]]
    figures = {"requests_count": len(rows), "served_count": len(served)}
    if not served:
        return figures
    ttft = [r["ttft_s"] for r in served]
    start = min(r["arrival_s"] for r in rows) if t_start is None else t_start
    span = max(r["kv_end_s"] for r in served) - start
    figures.update(ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
                   kv_mean_s=sum(r["kv_s"] for r in served) / len(served))
    if span > 0:
        figures["throughput_emu_rps"] = len(served) / span
    return figures


def degradation_pct(healthy: Optional[float], failed: Optional[float],
                    higher_is_better: bool) -> Optional[float]:
    """How much worse ``failed`` is than ``healthy``, in percent (negative: better)."""
    if not healthy or failed is None:
        return None
    change = (failed - healthy) / healthy * 100
    return -change if higher_is_better else change


def compare(healthy: dict, failed: dict) -> dict:
    return {"throughput_degradation_pct": degradation_pct(
                healthy.get("throughput_emu_rps"), failed.get("throughput_emu_rps"), True),
            "ttft_p50_increase_pct": degradation_pct(
                healthy.get("ttft_p50_s"), failed.get("ttft_p50_s"), False),
            "ttft_p99_increase_pct": degradation_pct(
                healthy.get("ttft_p99_s"), failed.get("ttft_p99_s"), False),
            "kv_mean_increase_pct": degradation_pct(
                healthy.get("kv_mean_s"), failed.get("kv_mean_s"), False)}


def notes(rows: Sequence[dict]) -> List[str]:
    """What the degradation of each fabric comes from, for the report."""
    lines = ["Degradation compares the requests that arrive after the failure with the same "
             "requests in the healthy run (same stream, same testbed); positive is worse. The "
             "text's figures are for a 4K-GPU cluster running collectives, where one ToR is a "
             "few percent of the cluster; here it is a quarter to a half of 16 GPUs."]
    for row in rows:
        lines.append(f"{row['fabric']}: {MECHANISM[row['fabric']]}. {row['failed_switch']} "
                     f"({row['role']}) served {row['nic_ports_failed_over_count']} NIC ports; "
                     f"{row['moved_flows_count']} KV flows moved in "
                     f"{row.get('repeats_count', 1)} run(s) (a running one is resent in "
                     f"full), the control plane saw the failure in "
                     f"{row['control_notice_ms']:.0f} ms on average.")
        if row.get("throughput_degradation_min_pct") is not None:
            lines[-1] += (f" Throughput degradation per run: "
                          f"{row['throughput_degradation_min_pct']:+.1f}% to "
                          f"{row['throughput_degradation_max_pct']:+.1f}%.")
    windows = sorted({f"{r['fabric']} {r['kv_window_bytes']}" for r in rows
                      if r.get("kv_window_bytes")})
    if windows:
        lines.append("Each KV flow's TCP window was bounded (bytes: " + ", ".join(windows) +
                     ") so that every KV flow a D admits fits in one link queue, standing in "
                     "for the texts' lossless RDMA (kv_window = bounded; 'tcp' lifts it).")
    lines.append("ZCube's second port sits on the other switch layer, which the sending rank "
                 "does not otherwise use, so moved flows find idle ports. ROFT's affected GPUs "
                 "share a server mate's NIC (half the bandwidth for both). An HPN ToR at this "
                 "scale carries one rail of the whole cluster in one plane, so every request "
                 "has a rank on it and loses half of that rank's bandwidth.")
    return lines


# ---------------------------------------------------------------- the failure
#: Longest wait, after a replay, for the controller to report the failure.
LINK_WAIT_S = 30.0


class ToRFailure:
    """The replay event: fail the ToR from Mininet, then move the flows behind it.

    The ToR's links all go down at once, and the replay goes on: other
    flows start and end while the controller notices and reroutes, as the
    rest of a cluster would.  A thread waits for the controller and then
    posts the move of the flows behind the ToR back to the replay loop.
    """

    def __init__(self, bed, switch: str, moves: Dict[str, Optional[str]]):
        self.bed = bed
        self.switch = switch
        self.moves = moves
        # Sockets opened now, not when the failure comes mid-stream.
        bed.ready_links(bed.switch_links(switch))
        self.at_s: Optional[float] = None
        self.noticed_s: Optional[float] = None
        # From the failure to the replay loop moving its flows: the notice, then
        # the loop taking the move up between its other work.
        self.moved_after_s: Optional[float] = None
        self.moved: List[str] = []        # running: cancelled, resent in full
        self.rehosted: List[str] = []     # not started yet: starts from the new port when due
        self.stranded: List[str] = []
        self._watcher: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._ends = failover.FlowEnds(bed.fabric, moves)   # the model's rule as well

    def resend_ends(self, flow) -> Optional[Tuple[str, str]]:
        """Where `move_flows` would send ``flow``: (src, dst), or None when it
        stays (no end behind the ToR, a GPU cut off, or both ends on one NIC).
        The replay's ``standby``: each such flow's resend finds its server
        listening and its client waiting, as a transfer engine on the other
        port would be ready."""
        return self._ends.resend(flow.src, flow.dst)

    def __call__(self, replayer) -> None:
        self.at_s = time.time() - replayer.t0
        change = self.bed.change_links(self.bed.switch_links(self.switch), up=False)
        self._watcher = threading.Thread(target=self._wait_then_move, args=(replayer, change),
                                         name=f"{self.switch} failure", daemon=True)
        self._watcher.start()

    def _wait_then_move(self, replayer, change) -> None:
        try:
            self.noticed_s = self.bed.wait_links_seen(change)
        except Exception as exc:   # noqa: BLE001 - handed to the replay loop, which raises it
            self._error = exc
            replayer.post(self._raise)
            return
        replayer.post(self.move_flows)

    def _raise(self, _replayer) -> None:
        raise self._error

    def finish(self, timeout_s: float = LINK_WAIT_S) -> None:
        """After the replay: wait for the controller's notice if it is still
        pending (the stream may end first), and raise what went wrong."""
        if self._watcher is not None:
            self._watcher.join(timeout_s)
            if self._watcher.is_alive():
                raise RuntimeError(f"the controller did not see {self.switch} fail "
                                   f"in {timeout_s:.0f} s")
        if self._error is not None:
            raise self._error

    def move_flows(self, replayer) -> None:
        """Every flow with an end behind the failed ToR goes to the port that
        takes over; a running one is resent in full from there, and first: it
        is due again at once, the others keep their due times."""
        self.moved_after_s = time.time() - replayer.t0 - self.at_s
        flows = sorted(replayer.flows.items(), key=lambda item: not replayer.started(item[0]))
        for fid, flow in flows:
            ends = self._ends.resend(flow.src, flow.dst)
            if ends is None:
                if self._ends.cut_off(flow.src, flow.dst):
                    self.stranded.append(fid)   # a GPU cut off: the flow will time out
                continue                        # untouched, or both ends now on one NIC
            started = replayer.started(fid)
            new_id = replayer.move(fid, *ends)
            if new_id is None:
                continue                    # it had ended
            if started:
                self.moved.append(fid)      # cancelled and resent in full
            else:
                self.rehosted.append(fid)   # not started yet: it simply starts elsewhere


# ---------------------------------------------------------------- the run
def summarize_repeats(rows: Sequence[dict]) -> dict:
    """One row for several repeats: counts summed, other figures averaged, and
    the spread of the headline degradation."""
    out = dict(rows[0])
    for key, first in rows[0].items():
        values = [r.get(key) for r in rows]
        if key in SAME_EVERY_REPEAT or isinstance(first, bool) or \
                not all(isinstance(v, (int, float)) for v in values):
            continue
        out[key] = sum(values) if key.endswith("_count") else sum(values) / len(values)
    spread = [r["throughput_degradation_pct"] for r in rows
              if r.get("throughput_degradation_pct") is not None]
    if spread:
        out["throughput_degradation_min_pct"] = min(spread)
        out["throughput_degradation_max_pct"] = max(spread)
        out["throughput_degradation_runs_pct"] = [round(v, 3) for v in spread]
    out["repeats_count"] = len(rows)
    return out


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    scale = ctx.scale
    specs = pd_setup.fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"])
    stream = pd_setup.stream_of(s)
    serving = ServeSettings.from_context(ctx)
    index = fail_index(s)
    ctx.log(f"  {len(stream)} {s['workload']} requests at {s['rate_per_s']:g}/s real, the ToR "
            f"fails when request {index} arrives; {s['pairing']} pairing, "
            f"{s['d_credits']} KV credits per D; {s['repeats']} repeat(s)")
    outcome = Outcome()
    metrics: Dict = {}
    rows_out, windows_out, requests_out = [], [], []
    for name in s["fabrics"]:
        fabric = registry.build(specs[name])
        topo = pd_setup.topology(fabric, s["tp"])
        place = pd_setup.make_placement(topo, s)
        planned = plan(topo, place, stream, scale, s["pairing"], s["prefill_ms_per_ktoken"],
                       s["seed"], s["path_strategy"])
        dag = FlowDag.merge(*(x.transfer.dag for x in planned))
        switch = s["failed_switch"] if s["failed_switch"] != "auto" else failover.busiest_tor(
            fabric, [(f.src, f.dst, f.bytes) for f in dag.flows])
        moves = failover.failover_map(fabric, [switch])
        t_fail = planned[index].arrival_s
        ctx.log(f"  {name} ({specs[name]}): {switch} fails at {t_fail:.2f} emulated s; "
                f"{len(moves)} NIC ports behind it fail over")
        repeats = []
        if ctx.scenario.models:
            # The model is deterministic: one repeat says what every repeat would.
            runs = {}
            if s["baseline"]:
                runs["healthy"] = serve_modelled(ctx, fabric, planned, serving, s["d_credits"])
            event = NodeFailure(switch, t_fail, moves)
            runs["failure"] = serve_modelled(ctx, fabric, planned, serving, s["d_credits"],
                                             failure=event)
            repeats.append(_repeat_row(name, fabric, switch, moves, event, runs, t_fail, 1,
                                       outcome, windows_out, requests_out))
        else:
            # The ports moved flows will use, each with an agent from the start:
            # the ports taking over, and those the other ends follow to (HPN:
            # the same plane).
            ends = failover.FlowEnds(fabric, moves)
            takeover = sorted({h for h in moves.values() if h} |
                              {h for f in dag.flows if f.src in moves or f.dst in moves
                               for h in ends(f.src, f.dst) if h})
            with ctx.testbeds.open(name, fabric, scale, lock_wait_s=s["lock_wait_s"]) as bed:
                for repeat in range(1, s["repeats"] + 1):
                    runs, folder = {}, ctx.run_dir / name / f"repeat{repeat}"
                    if s["baseline"]:
                        runs["healthy"] = serve(
                            bed, planned, serving, s["d_credits"], folder / "healthy",
                            progress=ctx.progress(f"{name} #{repeat} healthy KV flows"),
                            record_flows=ctx.testbeds.record_flows)
                    event = ToRFailure(bed, switch, moves)
                    runs["failure"] = serve(
                        bed, planned, serving, s["d_credits"], folder / "failure",
                        progress=ctx.progress(f"{name} #{repeat} failure KV flows"),
                        record_flows=ctx.testbeds.record_flows, events=[(t_fail, event)],
                        agent_hosts=takeover, standby=event.resend_ends)
                    event.finish()
                    bed.fail_switch(switch, up=True)     # the next repeat starts healthy
                    repeats.append(_repeat_row(name, fabric, switch, moves, event, runs, t_fail,
                                               repeat, outcome, windows_out, requests_out))
        row = summarize_repeats(repeats)
        rows_out.append(row)
        metrics[name] = row
        ctx.log(f"  {name}: {row['moved_flows_count']} flows moved in {len(repeats)} run(s), "
                f"control plane saw it in {row['control_notice_ms']:.0f} ms; throughput after "
                "the failure " + (
                    f"{row['throughput_degradation_pct']:+.1f}% worse (runs "
                    f"{row['throughput_degradation_min_pct']:+.1f}.."
                    f"{row['throughput_degradation_max_pct']:+.1f})"
                    if row.get("throughput_degradation_pct") is not None else "not compared")
                + f" (text: {TEXT_DEGRADATION_PCT[name]}%)")
    metrics["notes"] = notes(rows_out)
    metrics["failures"] = rows_out
    metrics["windows"] = windows_out
    metrics["requests"] = requests_out
    outcome.metrics = metrics
    return outcome


def _repeat_row(name, fabric, switch, moves, event, runs, t_fail, repeat, outcome,
                windows_out, requests_out) -> dict:
    """Record one repeat's flows, requests and windows; its comparison row."""
    for label, served in runs.items():
        if not outcome.t0:
            outcome.t0 = served.t0
        outcome.flows += [dataclasses.replace(f, id=f"{name}/{repeat}/{label}:{f.id}",
                                              group=f"{name}/{label}")
                          for f in served.results]
        requests_out += [{"fabric": name, "repeat": repeat, "run": label, **r}
                         for r in served.rows]
        unserved = len(served.rows) - served.summary["served_count"]
        if unserved:
            outcome.warnings.append(f"{name} #{repeat} {label}: {unserved} of "
                                    f"{len(served.rows)} requests not served")
    figures = {}
    for label, served in runs.items():
        for after in (False, True):
            key = f"{label}_{'after' if after else 'before'}"
            figures[key] = window_figures(window(served.rows, after, t_fail),
                                          t_fail if after else None)
            windows_out.append({"fabric": name, "repeat": repeat, "run": label,
                                "window": "after" if after else "before", **figures[key]})
    failure = runs["failure"]
    row = {"fabric": name, "failed_switch": switch,
           "role": fabric.graph.nodes[switch].get("role", ""),
           "failed_at_s": event.at_s, "control_notice_ms": (event.noticed_s or 0) * 1000,
           "flows_moved_ms": None if event.moved_after_s is None
           else event.moved_after_s * 1000,
           "nic_ports_failed_over_count": len(moves),
           "moved_flows_count": len(event.moved),
           "rehosted_flows_count": len(event.rehosted),
           "stranded_flows_count": len(event.stranded),
           "served_count": failure.summary["served_count"],
           "requests_count": len(failure.rows),
           "kv_window_bytes": failure.summary.get("kv_window_bytes")}
    if "healthy" in runs:
        row.update(compare(figures["healthy_after"], figures["failure_after"]))
    row["text_degradation_pct"] = TEXT_DEGRADATION_PCT[name]
    row["mechanism"] = MECHANISM[name]
    if event.stranded:
        outcome.warnings.append(f"{name} #{repeat}: {len(event.stranded)} flows had a GPU cut "
                                f"off by the failure of {switch}")
    return row


EXPERIMENT = Experiment(kind="pd-failure", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.SERIES, model=run)
