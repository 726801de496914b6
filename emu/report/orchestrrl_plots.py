"""Plots of the `orchestrrl` scenario (dynamic generation on RFabric), from a run's files.

* ``orchestrrl_step.png``: one generation step on a timeline, iteration 2
  (or the last) of the ``rfabric`` run of the most dynamic policy present
  (``switch+rebalance``, else ``switch``), seconds from the iteration's
  start (emulated):

  - top: the TP configuration over the step (a step line) and the
    sequences still running at each segment's start, from
    ``metrics.generation``'s segments (real seconds, put on the emulated
    axis: x ``tdf``, each segment anchored at its own phase where it has
    one), with the A/F split of the instances' lanes when the step has one
    (``af``); the switches and rebalances as labelled vertical lines;
  - middle: the run's phase spans (``timeline.phase_spans``) as bars, one
    row per kind, the wait from ready to start hatched, and the run's OCS
    dark windows (``timeline.dark_windows``) shaded: gen-ep, or with A/F
    the M2N phases ``gen-af{k}-tp{t}`` (their own row and colour), ride
    whatever is lit (no dark window of their own), gen-config's circuits
    change at the switch;
  - bottom: the throughput of the generation flow groups (gen-switch,
    gen-migrate, gen-config, gen-ep, gen-af) in that window, exactly from the run's
    own flows in ``flows.csv`` (each flow's bytes spread over its duration),
    or else from ``timeline.series`` (binned, and summed over every run
    that overlaps the window);

* ``orchestrrl_layers.png``: Train's layer-wise phases (``train-{f|b}{block}-{cp|ep}``,
  RFabric section 4.3) in iterations 1 and 2 of the same run, one panel
  each, seconds from the iteration's start up to the DP all-reduce's end:
  the phases as bars per kind (waits for circuits hatched) and the dark
  windows of the OCS the layer types reconfigure, with the
  reconfigurations' exposed and hidden time from ``metrics.layers``;

* ``orchestrrl_policies.png``: per fabric and policy, the throughput
  relative to ``static`` on the same fabric with the network, next to the
  compute-only gain (hatched), against the text's "up to 1.40x"; with
  ``metrics.at_scale``, a second panel of the same bars per GPU count and
  fabric (the flow-level model).

Each function returns the path written, or None when the run holds nothing
to draw (another scenario).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from matplotlib.patches import Patch

from emu.report.load import FLOWS_FILE
from emu.report.plots import new_figure

STEP_PNG, POLICIES_PNG = "orchestrrl_step.png", "orchestrrl_policies.png"
LAYERS_PNG = "orchestrrl_layers.png"

TEXT_GAIN = 1.40                  # OrchestrRL's abstract, when the result does not say
DYNAMIC = ("switch+rebalance", "switch")     # the most dynamic policy first
GEN_GROUPS = ("gen-switch", "gen-migrate", "gen-config", "gen-ep", "gen-af")
KINDS = ("train-cp", "train-ep", "train-pp", "train-dp", "gen-ep", "gen-af", "gen-config",
         "gen-migrate", "response", "weight-sync")
TRAIN_KINDS = ("train-cp", "train-ep", "train-tp", "train-pp", "train-dp")
KIND_COLORS = {"train-cp": "tab:pink", "train-ep": "tab:olive", "train-tp": "tab:gray",
               "train-pp": "goldenrod", "train-dp": "tab:green", "gen-ep": "tab:purple",
               "gen-af": "darkviolet", "gen-config": "tab:blue", "gen-migrate": "tab:orange",
               "gen-switch": "tab:red", "response": "tab:cyan", "weight-sync": "tab:brown"}
EVENT_COLORS = {"switch": "tab:red", "rebalance": "tab:orange"}
POLICY_COLORS = {"static": "tab:gray", "switch": "tab:blue", "switch+rebalance": "tab:green"}


# ---------------------------------------------------------------- reading the result
def _metrics(result: dict) -> dict:
    metrics = result.get("metrics")
    return metrics if isinstance(metrics, dict) else {}


def _rows(container: dict, key: str) -> List[dict]:
    rows = container.get(key) if isinstance(container, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def is_orchestrrl(result: dict) -> bool:
    """Whether the result holds the orchestrrl scenario's metrics."""
    metrics = _metrics(result)
    policies = [r for r in _rows(metrics, "policies")
                if "policy" in r and "throughput_vs_static_ratio" in r]
    steps = [r for r in _rows(metrics, "generation") if "segments" in r]
    return bool(policies or steps)


def _tdf(result: dict) -> float:
    scale = result.get("scale")
    tdf = _number(scale.get("tdf")) if isinstance(scale, dict) else None
    return tdf if tdf and tdf > 0 else 1.0


def _flow_prefix(label: str) -> str:
    """Flow ids of run ``fabric/policy`` start ``fabric-policy`` ('+' as '-')."""
    return label.replace("/", "-").replace("+", "-")


# ---------------------------------------------------------------- the step timeline
def pick_run(result: dict) -> Optional[Tuple[dict, int]]:
    """The generation row of the run to draw (rfabric, the most dynamic policy
    present) and its iteration (2, or the last the timeline holds)."""
    steps = [r for r in _rows(_metrics(result), "generation")
             if isinstance(r.get("segments"), list) and r["segments"]
             and r.get("fabric") is not None and r.get("policy") is not None]
    if not steps:
        return None
    fabrics = list(dict.fromkeys(r["fabric"] for r in steps))
    fabric = "rfabric" if "rfabric" in fabrics else fabrics[-1]
    mine = [r for r in steps if r["fabric"] == fabric]

    def rank(row: dict) -> Tuple[int, int]:
        policy = row["policy"]
        order = DYNAMIC.index(policy) if policy in DYNAMIC else len(DYNAMIC)
        return order, -len(row.get("events") or [])

    row = min(mine, key=rank)
    label = f"{row['fabric']}/{row['policy']}"
    spans = [s for s in _rows(result.get("timeline") or {}, "phase_spans")
             if s.get("fabric") == label and isinstance(s.get("iteration"), int)]
    iterations = sorted({s["iteration"] for s in spans})
    iteration = 2 if 2 in iterations else (iterations[-1] if iterations else 1)
    return row, iteration


def _spans(result: dict, label: str, iteration: int) -> List[dict]:
    out = []
    for span in _rows(result.get("timeline") or {}, "phase_spans"):
        if span.get("fabric") != label or span.get("iteration") != iteration:
            continue
        start, end = _number(span.get("start")), _number(span.get("end"))
        if start is None or end is None:
            continue
        ready = _number(span.get("ready"))
        out.append({"phase": str(span.get("phase", "")),
                    "kind": str(span.get("kind") or span.get("phase") or ""),
                    "ready": start if ready is None else min(ready, start),
                    "start": start, "end": max(start, end)})
    return out


def _segment_times(row: dict, spans: List[dict], origin: float,
                   tdf: float) -> List[Tuple[float, float, dict, Optional[dict]]]:
    """Per segment: (start, end) on the emulated axis (s from the iteration's
    start), the segment, and the event that opened it.

    A segment is anchored at its own phases when it has some (the rebalance's
    gen-migrate{k-1}, its gen-config{k}-tp{t} or its M2N's gen-af{k}-tp{t}:
    where the network put it, stalls included); otherwise it follows the
    previous anchor by its real offset x ``tdf``.
    """
    by_name = {s["phase"]: s for s in spans}
    events = [e for e in (row.get("events") or []) if isinstance(e, dict)]
    segments = [s for s in row["segments"] if isinstance(s, dict)
                and _number(s.get("start_s")) is not None]
    anchor_real, anchor_emu = 0.0, 0.0
    out = []
    for k, seg in enumerate(segments):
        index = seg.get("index", k) if isinstance(seg.get("index"), int) else k
        real = float(seg["start_s"])
        event = events[index - 1] if 0 < index <= len(events) else None
        names = (f"gen-migrate{index - 1}", f"gen-config{index}-tp{seg.get('tp')}",
                 f"gen-af{index}-tp{seg.get('tp')}")
        own = [by_name[n] for n in names if n in by_name]
        if own:
            anchor_real, anchor_emu = real, min(s["start"] for s in own) - origin
        start = anchor_emu + (real - anchor_real) * tdf
        compute = _number(seg.get("compute_s")) or 0.0
        out.append((start, start + compute * tdf, seg, event))
    return out


def _flow_rates(run_dir: Path, prefix: str, lo: float, hi: float
                ) -> Dict[str, List[Tuple[float, float]]]:
    """Group -> (time, Mbit/s) steps of the run's flows overlapping [lo, hi]:
    each flow's bytes spread evenly over its duration, summed exactly."""
    path = Path(run_dir) / FLOWS_FILE
    if not path.is_file():
        return {}
    changes: Dict[str, Dict[float, float]] = defaultdict(lambda: defaultdict(float))
    try:
        with path.open(newline="") as stream:
            for flow in csv.DictReader(stream):
                if not (flow.get("id") or "").startswith(prefix):
                    continue
                group = flow.get("group") or ""
                if group not in GEN_GROUPS or (flow.get("status") or "ok") != "ok":
                    continue
                try:
                    start, end = float(flow["start_s"]), float(flow["end_s"])
                    size = float(flow["bytes"])
                except (KeyError, TypeError, ValueError):
                    continue
                if end <= start or end < lo or start > hi:
                    continue
                rate = size * 8 / 1e6 / (end - start)
                changes[group][start] += rate
                changes[group][end] -= rate
    except (OSError, csv.Error):
        return {}
    out = {}
    for group, deltas in changes.items():
        level, points = 0.0, [(lo, 0.0)]
        for t in sorted(deltas):
            level += deltas[t]
            if level < 1e-9:       # the float residue of flows that all ended
                level = 0.0
            points.append((t, level))
        points.append((max(hi, points[-1][0]), 0.0))
        out[group] = points
    return out


def _series_rates(result: dict, lo: float, hi: float) -> Dict[str, List[Tuple[float, float]]]:
    """Group -> (bin start, Mbit/s) from timeline.series, bins overlapping [lo, hi]."""
    out = {}
    for series in _rows(result.get("timeline") or {}, "series"):
        if series.get("label") not in GEN_GROUPS:
            continue
        points = []
        for point in series.get("points") or []:
            if isinstance(point, (list, tuple)) and len(point) == 2:
                t, mbps = _number(point[0]), _number(point[1])
                if t is not None and mbps is not None:
                    points.append((t, mbps))
        points.sort()
        step = min((b[0] - a[0] for a, b in zip(points, points[1:]) if b[0] > a[0]),
                   default=0.0)
        kept = [p for p in points if lo - step <= p[0] <= hi]
        if kept and any(v > 0 for _, v in kept):
            out[series["label"]] = kept
    return out


def _others_overlap(result: dict, label: str, lo: float, hi: float) -> bool:
    """Whether a run other than ``label`` overlaps [lo, hi] (the series sums them)."""
    spans = _rows(result.get("timeline") or {}, "fabric_spans")
    if not spans:
        return True
    return any(s.get("fabric") != label and (_number(s.get("start")) or 0.0) < hi
               and (_number(s.get("end")) or 0.0) > lo for s in spans)


def _clusters(windows: List[Tuple[float, float, str]], gap: float
              ) -> List[Tuple[float, List[str]]]:
    """Dark windows closer than ``gap`` as one label: (first start, OCS names)."""
    out: List[Tuple[float, List[str]]] = []
    last = -math.inf
    for lo, hi, name in sorted(windows):
        if out and lo - last <= gap:
            if name not in out[-1][1]:
                out[-1][1].append(name)
            last = max(last, hi)
        else:
            out.append((lo, [name]))
            last = hi
    return out


def _switch_zoom(segments, spans: List[dict], origin: float) -> Optional[Tuple[float, float]]:
    """The window (s from the iteration's start) around the first switch: its
    gen-config phase and the generation phases just before it."""
    switch = next((start for start, _, _, e in segments
                   if e is not None and e.get("kind") == "switch"), None)
    if switch is None:
        return None
    near = [s for s in spans if s["kind"] in ("gen-config", "gen-migrate")
            and switch - 0.25 <= s["start"] - origin <= switch + 0.01]
    if not near:
        return None
    lo = min(s["ready"] for s in near) - origin
    hi = max(s["end"] for s in near) - origin
    pad = max(0.1 * (hi - lo), 0.005)
    return lo - pad, hi + pad


def _quiet_stretch(rates, origin: float, end: float) -> Optional[Tuple[float, float]]:
    """The longest stretch of [0, end] (shares of it) with no generation flow."""
    if end <= 0:
        return None
    busy = []
    for points in rates.values():
        for (t, v), (t_next, _) in zip(points, points[1:]):
            if v > 0:
                busy.append((t - origin, t_next - origin))
    busy.sort()
    best, cursor = (0.0, 0.0), 0.0
    for lo, hi in busy + [(end, end)]:
        if lo - cursor > best[1] - best[0]:
            best = (cursor, lo)
        cursor = max(cursor, hi)
    return best[0] / end, min(best[1], end) / end


def _draw_zoom(axis, rates, origin: float, end: float, zoom: Tuple[float, float],
               windows: List[Tuple[float, float, str]]) -> None:
    """An inset of ``axis`` showing the flows in ``zoom``: the switch's moves
    (gen-switch) and decode all-reduces (gen-config) last milliseconds.  It
    sits in the longest stretch without generation flows when that is wide
    enough, so it hides none."""
    lo, hi = zoom
    bounds = [0.22, 0.3, 0.3, 0.55]
    quiet = _quiet_stretch(rates, origin, end)
    if quiet is not None and quiet[1] - quiet[0] >= 0.25:
        width = min(0.4, quiet[1] - quiet[0] - 0.08)
        bounds = [(quiet[0] + quiet[1] - width) / 2, 0.12, width, 0.5]
    inset = axis.inset_axes(bounds)
    top = 0.0
    for group in GEN_GROUPS:
        points = [(t - origin, v) for t, v in rates.get(group, [])]
        if not points:
            continue
        inside = [v for t, v in points if lo <= t <= hi]
        top = max([top] + inside)
        inset.step([t for t, _ in points], [v for _, v in points], where="post",
                   linewidth=1.2, color=KIND_COLORS.get(group))
    for w_lo, w_hi, _ in windows:
        if w_hi >= lo and w_lo <= hi:
            inset.axvspan(w_lo, w_hi, color="black", alpha=0.25, linewidth=0)
    inset.set_xlim(lo, hi)
    inset.set_ylim(0, top * 1.15 or 1.0)
    inset.tick_params(labelsize=6)
    inset.set_title(f"around the switch ({(hi - lo) * 1e3:.0f} ms)", fontsize=7)
    inset.grid(alpha=0.3)
    axis.indicate_inset_zoom(inset, edgecolor="dimgray")


def _mb(value) -> str:
    value = _number(value)
    return f"{value / 1e6:,.0f} MB" if value is not None else "?"


def plot_step(result: dict, run_dir: Path, path: Path) -> Optional[Path]:
    picked = pick_run(result)
    if picked is None:
        return None
    row, iteration = picked
    label = f"{row['fabric']}/{row['policy']}"
    tdf = _tdf(result)
    spans = _spans(result, label, iteration)
    origin = min((s["ready"] for s in spans), default=0.0)
    segments = _segment_times(row, spans, origin, tdf)
    if not segments:
        return None
    end = max([s["end"] - origin for s in spans] + [e for _, e, _, _ in segments])

    figure = new_figure(11.0, 9.0)
    top, middle, bottom = figure.subplots(3, 1, sharex=True,
                                          gridspec_kw={"height_ratios": [1.1, 1.3, 1.1]})
    figure.suptitle(f"orchestrrl: one generation step, {label}, iteration {iteration} "
                    f"(times in emulated seconds from the iteration's start; "
                    f"1 s real = {tdf:g} s emulated)", fontsize=10)

    # (a) the TP configuration and the running sequences
    xs, tps = [], []
    for start, stop, seg, _ in segments:
        tp = _number(seg.get("tp")) or 0.0
        xs += [start, stop]
        tps += [tp, tp]
    af = f", A/F {row['af']} attention:FFN lanes" if row.get("af") else ""
    top.plot(xs, tps, color="black", linewidth=1.8, label=f"TP per instance{af}")
    for start, stop, seg, _ in segments:
        if stop - start > 0.06 * end and seg.get("instances") is not None:
            top.text((start + stop) / 2, _number(seg.get("tp")) or 0.0,
                     f"{seg['instances']} x TP{seg.get('tp')}", ha="center", va="bottom",
                     fontsize=8)
    top.set_ylabel("TP per instance")
    top.set_ylim(0, max(tps + [1.0]) * 1.45)
    running = top.twinx()
    counted = [(start, seg["running_at_start"]) for start, _, seg, _ in segments
               if _number(seg.get("running_at_start")) is not None]
    run_x, run_y = [x for x, _ in counted], [y for _, y in counted]
    if run_x:
        running.plot(run_x, run_y, linestyle="none", marker="o", color="tab:green",
                     label="sequences running at the segment's start")
        for i, (x, y) in enumerate(zip(run_x, run_y)):
            running.annotate(f"{y}", (x, y), textcoords="offset points",
                             xytext=(4, 3) if i % 2 == 0 else (4, -10), fontsize=7,
                             color="tab:green")
        running.set_ylim(0, max(run_y) * 1.3 or 1)
    running.set_ylabel("running sequences", color="tab:green")
    heights = (0.97, 0.84)
    count = 0
    for start, _, _, event in segments:
        if event is None:
            continue
        kind = str(event.get("kind", "event"))
        color = EVENT_COLORS.get(kind, "tab:gray")
        top.axvline(start, color=color, linestyle="--", linewidth=1.2)
        text = kind
        if kind == "switch" and event.get("tp_from") is not None:
            text += f" TP{event['tp_from']}->{event.get('tp_to')}"
        text += f", {_mb(event.get('moved_bytes'))} real"
        top.text(start, heights[count % 2], f" {text}", transform=top.get_xaxis_transform(),
                 color=color, fontsize=7.5, va="top", ha="left")
        count += 1
    handles = top.get_legend_handles_labels()[0] + running.get_legend_handles_labels()[0]
    handles += [Patch(color=c, label=k) for k, c in EVENT_COLORS.items()
                if any(e is not None and e.get("kind") == k for _, _, _, e in segments)]
    top.legend(handles=handles, fontsize=7, loc="lower left")
    top.set_title("generation configuration (metrics.generation; real seconds x tdf, "
                  "anchored at each segment's phase)", fontsize=9)
    top.grid(alpha=0.3)

    # (b) the phase spans and the dark windows
    kinds = [k for k in KINDS if any(s["kind"] == k for s in spans)]
    kinds += sorted({s["kind"] for s in spans} - set(kinds))
    rows = {k: i for i, k in enumerate(reversed(kinds))}
    for span in spans:
        y = rows[span["kind"]]
        color = KIND_COLORS.get(span["kind"], "tab:gray")
        ready, start, stop = (span[k] - origin for k in ("ready", "start", "end"))
        middle.broken_barh([(start, stop - start)], (y - 0.35, 0.7), facecolors=color,
                           edgecolors=color, linewidth=1.0, alpha=0.85)
        if start - ready > 0:
            middle.broken_barh([(ready, start - ready)], (y - 0.35, 0.7), facecolors="none",
                               edgecolors="tab:red", hatch="////", linewidth=0.6)
        if span["kind"] in ("gen-config", "gen-migrate"):
            middle.text(stop, y + 0.38, f" {span['phase']}", fontsize=6.5, va="bottom")
    middle.set_yticks(list(rows.values()), list(rows.keys()), fontsize=8)
    middle.set_ylim(-0.7, len(rows) + 0.2)
    windows = []
    for window in _rows(result.get("timeline") or {}, "dark_windows"):
        name = str(window.get("label", ""))
        lo, hi = _number(window.get("start")), _number(window.get("end"))
        if not name.startswith(label + " ") or lo is None or hi is None:
            continue
        if hi - origin < 0 or lo - origin > end:
            continue
        windows.append((lo - origin, hi - origin, name[len(label) + 1:]))
    for axis in (middle, bottom):
        for lo, hi, _ in windows:
            axis.axvspan(lo, hi, color="black", alpha=0.25, linewidth=0)
            # a dark window lasts milliseconds: a line keeps it visible
            axis.axvline((lo + hi) / 2, color="black", alpha=0.25, linewidth=1.5)
    for i, (at, names) in enumerate(_clusters(windows, 0.01 * max(end, 1e-9))):
        middle.text(at, len(rows) - 0.45 + 0.3 * (i % 2), f" {','.join(names)}",
                    fontsize=6.5, va="center", ha="left", color="dimgray")
    switches = [s for s in _rows(_metrics(result), "switches")
                if f"{s.get('fabric')}/{s.get('policy')}" == label
                and s.get("iteration") == iteration]
    notes = [f"{s.get('phase')}: {s.get('mode', '')} reconfiguration, "
             f"exposed {(_number(s.get('exposed_s')) or 0) * 1e3:.1f} ms, "
             f"hidden {(_number(s.get('hidden_s')) or 0) * 1e3:.1f} ms" for s in switches]
    if notes:
        middle.text(0.995, 0.66, "\n".join(notes), transform=middle.transAxes, fontsize=7,
                    ha="right", va="top",
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "lightgray"})
    middle.legend(handles=[Patch(facecolor="black", alpha=0.25,
                                 label=f"OCS dark window ({len(windows)})"),
                           Patch(facecolor="none", edgecolor="tab:red", hatch="////",
                                 label="ready, waiting (circuits)")],
                  fontsize=7, loc="upper right", bbox_to_anchor=(1.0, 0.88))
    middle.set_title("phases (timeline.phase_spans) and this run's OCS dark windows",
                     fontsize=9)
    middle.grid(axis="x", alpha=0.3)

    # (c) the generation flows' throughput
    lo, hi = origin, origin + end
    rates = _flow_rates(run_dir, f"{_flow_prefix(label)}-i{iteration}-", lo, hi)
    source, exact = "this run's flows (flows.csv), exact", bool(rates)
    if not rates:
        rates = _series_rates(result, lo, hi)
        source = ("timeline.series, binned"
                  + (", every run overlapping the window summed"
                     if _others_overlap(result, label, lo, hi) else ""))
    for group in GEN_GROUPS:
        if group not in rates:
            continue
        ts = [t - origin for t, _ in rates[group]]
        bottom.step(ts, [v for _, v in rates[group]], where="post", linewidth=1.3,
                    color=KIND_COLORS.get(group), label=group)
    if rates:
        bottom.legend(fontsize=7, loc="upper right", ncol=2)
    else:
        bottom.text(0.5, 0.5, "no generation flows in this window", ha="center",
                    transform=bottom.transAxes, fontsize=8, color="dimgray")
    zoom = _switch_zoom(segments, spans, origin)
    if exact and zoom is not None:     # half-second bins have nothing to zoom into
        _draw_zoom(bottom, rates, origin, end, zoom, windows)
    bottom.set_ylabel("Mbit/s (emulated)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("emulated seconds from the iteration's start")
    bottom.set_title(f"generation flows' throughput by group ({source})", fontsize=9)
    bottom.grid(alpha=0.3)
    bottom.set_xlim(0, end * 1.01 if end > 0 else 1.0)
    figure.savefig(path)
    return path


# ---------------------------------------------------------------- the layer types
def _dark(result: dict, label: str, names, lo: float, hi: float) -> List[Tuple[float, float]]:
    """The run's dark windows on OCS ``names`` overlapping [lo, hi], absolute."""
    out = []
    for window in _rows(result.get("timeline") or {}, "dark_windows"):
        name = str(window.get("label", ""))
        start, end = _number(window.get("start")), _number(window.get("end"))
        if (name.startswith(label + " ") and name[len(label) + 1:] in names
                and start is not None and end is not None and end >= lo and start <= hi):
            out.append((start, end))
    return out


def plot_layers(result: dict, path: Path) -> Optional[Path]:
    picked = pick_run(result)
    if picked is None:
        return None
    row, _ = picked
    label = f"{row['fabric']}/{row['policy']}"
    rows = [r for r in _rows(_metrics(result), "layers")
            if f"{r.get('fabric')}/{r.get('policy')}" == label]
    panels = []
    for iteration in (1, 2):
        spans = [s for s in _spans(result, label, iteration) if s["kind"] in TRAIN_KINDS]
        if any(s["phase"] != s["kind"] for s in spans):       # a layer-wise chain
            panels.append((iteration, spans))
    if not panels:
        return None
    names = {str(o) for r in rows for o in (r.get("ocs") or [])}
    figure = new_figure(11.0, 2.6 + 2.4 * len(panels))
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    figure.suptitle(f"orchestrrl: Train's layer-wise phases, {label} (emulated seconds from "
                    f"the iteration's start; circuits per layer type on "
                    f"{', '.join(sorted(names)) or 'no OCS'})", fontsize=10)
    for axis, (iteration, spans) in zip(axes, panels):
        origin = min(s["ready"] for s in spans)
        end = max(s["end"] for s in spans) - origin
        kinds = [k for k in TRAIN_KINDS if any(s["kind"] == k for s in spans)]
        level = {k: i for i, k in enumerate(reversed(kinds))}
        for span in spans:
            y, color = level[span["kind"]], KIND_COLORS.get(span["kind"], "tab:gray")
            ready, start, stop = (span[k] - origin for k in ("ready", "start", "end"))
            axis.broken_barh([(start, max(stop - start, end * 1e-3))], (y - 0.35, 0.7),
                             facecolors=color, edgecolors=color, alpha=0.85)
            if start - ready > 0:
                axis.broken_barh([(ready, start - ready)], (y - 0.35, 0.7), facecolors="none",
                                 edgecolors="tab:red", hatch="////", linewidth=0.6)
        dark = _dark(result, label, names, origin, origin + end)
        for lo, hi in dark:
            axis.axvspan(lo - origin, hi - origin, color="black", alpha=0.25, linewidth=0)
        mine = [r for r in rows if r.get("iteration") == iteration]
        exposed = sum(_number(r.get("exposed_s")) or 0.0 for r in mine)
        hidden = sum(_number(r.get("hidden_s")) or 0.0 for r in mine)
        modes = sorted({str(r.get("mode")) for r in mine})
        axis.text(0.995, 0.95, f"{len(mine)} layer-type changes ({'/'.join(modes) or '-'}): "
                  f"exposed {exposed * 1e3:.1f} ms, hidden {hidden * 1e3:.1f} ms",
                  transform=axis.transAxes, ha="right", va="top", fontsize=8,
                  bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "lightgray"})
        axis.set_yticks(list(level.values()), list(level.keys()), fontsize=8)
        axis.set_ylim(-0.7, len(level) - 0.3)
        axis.set_xlim(0, end * 1.02 if end > 0 else 1.0)
        axis.set_title(f"iteration {iteration}: {len(dark)} dark windows on those OCS",
                       fontsize=9)
        axis.grid(axis="x", alpha=0.3)
    axes[0].legend(handles=[Patch(facecolor="black", alpha=0.25, label="OCS dark window"),
                            Patch(facecolor="none", edgecolor="tab:red", hatch="////",
                                  label="ready, waiting (circuits)")],
                   fontsize=7, loc="lower right")
    axes[-1].set_xlabel("emulated seconds from the iteration's start")
    figure.savefig(path)
    return path


# ---------------------------------------------------------------- the policies
def _bars(axis, groups: List[str], policies: List[str],
          values: Dict[Tuple[str, str], Tuple[Optional[float], Optional[float]]]) -> List[float]:
    """Per group, per policy: the ratio with the network, the compute-only gain
    hatched beside it; the values drawn."""
    width = 0.8 / max(1, 2 * len(policies))
    drawn = []
    for p, policy in enumerate(policies):
        color = POLICY_COLORS.get(policy, f"C{p}")
        for kind, offset in (("network", 0), ("compute", 1)):
            xs, ys = [], []
            for g, group in enumerate(groups):
                value = values.get((group, policy), (None, None))[offset]
                if value is None:
                    continue
                xs.append(g - 0.4 + width * (2 * p + offset + 0.5))
                ys.append(value)
            if not xs:
                continue
            bars = axis.bar(xs, ys, width, color=color if kind == "network" else "white",
                            edgecolor=color, hatch="///" if kind == "compute" else None,
                            linewidth=1.0)
            axis.bar_label(bars, labels=[f"{v:.2f}" for v in ys], fontsize=6.5, padding=1,
                           rotation=90 if len(groups) * len(policies) > 8 else 0)
            drawn += ys
    axis.set_xticks(range(len(groups)), groups, fontsize=8)
    return drawn


def _policy_panel(axis, rows: List[dict], group_of, title: str, text_gain: Optional[float],
                  policies: List[str]) -> None:
    groups = list(dict.fromkeys(group_of(r) for r in rows))
    values = {(group_of(r), str(r["policy"])): (_number(r.get("throughput_vs_static_ratio")),
                                                _number(r.get("compute_only_gain_ratio")))
              for r in rows}
    drawn = _bars(axis, groups, policies, values)
    axis.axhline(1.0, color="black", linewidth=0.8)
    if text_gain is not None:
        axis.axhline(text_gain, color="tab:red", linewidth=1.0, linestyle="--")
        axis.text(0.995, text_gain, f"OrchestrRL: up to {text_gain:.2f}x",
                  transform=axis.get_yaxis_transform(), color="tab:red", fontsize=8,
                  ha="right", va="bottom")
    axis.set_ylim(0, max(drawn + [text_gain or 1.0, 1.0]) * 1.18)
    axis.set_ylabel("throughput relative to static")
    axis.set_title(title, fontsize=9)
    axis.grid(True, axis="y", alpha=0.3)


def plot_policies(result: dict, path: Path) -> Optional[Path]:
    metrics = _metrics(result)

    def usable(r: dict) -> bool:
        return (r.get("fabric") is not None and r.get("policy") is not None
                and (_number(r.get("throughput_vs_static_ratio")) is not None
                     or _number(r.get("compute_only_gain_ratio")) is not None))

    rows = [r for r in _rows(metrics, "policies") if usable(r)]
    scale_rows = [r for r in _rows(metrics, "at_scale")
                  if usable(r) and _number(r.get("gpus_count")) is not None]
    if not rows and not scale_rows:
        return None
    text_gain = _number(metrics.get("text_gain_ratio"))
    text_gain = TEXT_GAIN if text_gain is None else text_gain
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows + scale_rows))
    panels = [p for p in (rows, scale_rows) if p]
    figure = new_figure(max(7.0, 2.2 * len(policies) + 1.5 * len(panels) + 3), 4.2 * len(panels))
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    index = 0
    if rows:
        _policy_panel(axes[index], rows, lambda r: str(r["fabric"]),
                      f"{result.get('scenario', 'orchestrrl')}: throughput per policy, with the "
                      f"network (solid) and compute only (hatched), steady state",
                      text_gain, policies)
        index += 1
    if scale_rows:
        _policy_panel(axes[index], scale_rows,
                      lambda r: f"{int(r['gpus_count']):,} GPUs\n{r['fabric']}",
                      "at scale (flow-level model, real units): the same per GPU count "
                      "and fabric", text_gain, policies)
    handles = [Patch(color=POLICY_COLORS.get(p, f"C{i}"), label=p) for i, p in enumerate(policies)]
    handles += [Patch(facecolor="lightgray", edgecolor="black", label="with the network"),
                Patch(facecolor="white", edgecolor="black", hatch="///",
                      label="compute only (no network)")]
    axes[0].legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    figure.savefig(path)
    return path


def write_orchestrrl_plots(result: dict, run_dir: Path) -> List[Path]:
    """Every orchestrrl plot this run has data for ([] for another scenario)."""
    if not isinstance(result, dict) or not is_orchestrrl(result):
        return []
    run_dir = Path(run_dir)
    written = [plot_step(result, run_dir, run_dir / STEP_PNG),
               plot_layers(result, run_dir / LAYERS_PNG),
               plot_policies(result, run_dir / POLICIES_PNG)]
    return [p for p in written if p is not None]
