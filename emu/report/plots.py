"""The plots every emulated run gets: throughput over time, and step durations.

* ``timeline.png``: throughput per series over time (``timeline.series``,
  emulated Mbit/s against emulated seconds), dark windows
  (``timeline.dark_windows``) shaded and labelled; with a non-identity scale,
  real time on the top axis and real Gbit/s on the right one;
* ``steps.png``: one bar per entry of ``steps`` (emulated seconds), real
  durations on the right axis.

Figures are drawn with matplotlib's Agg canvas directly: no display and no
pyplot state, so reports can be written from any thread or process.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from emu.report.units import is_identity
from traffic.scale import Scale, format_quantity

TIMELINE_PNG = "timeline.png"
STEPS_PNG = "steps.png"

# Dark windows get a text label only while labels stay legible.
MAX_LABELLED_WINDOWS = 12
MAX_LEGEND_ENTRIES = 12


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches that lays itself out when saved."""
    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)  # render with Agg: no display, no pyplot state
    return figure


def _real_time_axis(axis, scale: Scale, span_s: float, which: str) -> None:
    """Add a second time axis in real units (ms when the real span is short)."""
    real_span = span_s / scale.tdf
    factor, unit = (1e3, "ms") if real_span < 2 else (1.0, "s")
    forward = (lambda t: t / scale.tdf * factor)
    inverse = (lambda r: r / factor * scale.tdf)
    if which == "x":
        secondary = axis.secondary_xaxis("top", functions=(forward, inverse))
        secondary.set_xlabel(f"real time ({unit})")
    else:
        secondary = axis.secondary_yaxis("right", functions=(forward, inverse))
        secondary.set_ylabel(f"real duration ({unit})")


def plot_timeline(result: dict, path: Path, scale: Scale) -> Path:
    """Throughput per series over time, dark windows shaded and labelled."""
    timeline = result.get("timeline") or {}
    series = timeline.get("series") or []
    windows = timeline.get("dark_windows") or []
    figure = new_figure(10, 4.8)
    axis = figure.add_subplot()
    axis.set_title(f"{result['scenario']}: throughput per series over time")
    axis.set_xlabel("time since start (s, emulated)")
    axis.set_ylabel("throughput (Mbit/s, emulated)")

    span_end = peak = 0.0
    for entry in series:
        points = [(float(t), float(mbps)) for t, mbps in entry["points"]]
        if not points:
            continue
        if len(points) >= 2:
            # Points are (bin start, rate): draw the last bin to its end too,
            # assuming it is as wide as the one before.
            width = points[-1][0] - points[-2][0]
            points.append((points[-1][0] + width, points[-1][1]))
        times, rates = zip(*points)
        axis.step(times, rates, where="post", linewidth=1.2,
                  label=str(entry.get("label", "?")))
        span_end = max(span_end, times[-1])
        peak = max(peak, max(rates))
    for window in windows:
        span_end = max(span_end, float(window["end"]))
    if not any(entry["points"] for entry in series):
        axis.text(0.5, 0.5, "no throughput series recorded", ha="center",
                  va="center", transform=axis.transAxes, color="0.4")

    x_span = span_end or 1.0
    for index, window in enumerate(windows):
        start, end = float(window["start"]), float(window["end"])
        axis.axvspan(start, end, color="0.25", alpha=0.18, linewidth=0)
        if end - start < 0.004 * x_span:
            # Too narrow to see as a band: mark it with a line as well.
            axis.axvline(start, color="0.25", alpha=0.6, linewidth=0.8)
        if len(windows) <= MAX_LABELLED_WINDOWS and window.get("label"):
            axis.text((start + end) / 2, 0.98, str(window["label"]),
                      transform=axis.get_xaxis_transform(), rotation=90,
                      ha="center", va="top", fontsize=7, color="0.2")
    # Headroom above the highest rate keeps the legend off the lines.
    axis.set_ylim(bottom=0, top=(peak * 1.25) or 1.0)
    axis.set_xlim(left=0, right=max(x_span, 1e-9))
    axis.grid(True, alpha=0.3)

    handles, labels = axis.get_legend_handles_labels()
    if windows:
        handles.append(Patch(color="0.25", alpha=0.18))
        labels.append(f"dark ({len(windows)} window{'s' * (len(windows) != 1)})")
    if handles and len(handles) <= MAX_LEGEND_ENTRIES:
        axis.legend(handles, labels, loc="upper right", fontsize=8,
                    framealpha=0.85)
    elif handles:
        axis.set_title(f"{result['scenario']}: throughput of {len(series)} "
                       f"series over time (legend omitted)")

    if not is_identity(scale):
        _real_time_axis(axis, scale, x_span, "x")
        to_gbps = (lambda mbps: mbps / scale.bw_factor / 1e3)
        from_gbps = (lambda gbps: gbps * scale.bw_factor * 1e3)
        secondary = axis.secondary_yaxis("right", functions=(to_gbps, from_gbps))
        secondary.set_ylabel("real throughput (Gbit/s)")
    figure.savefig(path)
    return path


def plot_steps(result: dict, path: Path, scale: Scale) -> Path:
    """Bar chart of the duration of each step."""
    steps = result["steps"]
    labels = [str(step.get("label", index)) for index, step in enumerate(steps)]
    durations = [float(step["duration_s"]) for step in steps]
    figure = new_figure(max(6.0, min(0.45 * len(steps) + 3, 16.0)), 4.5)
    axis = figure.add_subplot()
    positions = range(len(steps))
    bars = axis.bar(positions, durations, color="tab:blue")
    axis.set_xticks(list(positions), labels,
                    rotation=45 if len(steps) > 6 else 0,
                    ha="right" if len(steps) > 6 else "center", fontsize=8)
    axis.set_title(f"{result['scenario']}: duration of each step")
    axis.set_xlabel("step")
    axis.set_ylabel("duration (s, emulated)")
    if len(steps) <= 20:
        axis.bar_label(bars, labels=[format_quantity(d, "s") for d in durations],
                       fontsize=7, padding=2)
    axis.set_ylim(bottom=0, top=max(durations or [1.0]) * 1.15 or 1.0)
    axis.grid(True, axis="y", alpha=0.3)
    if not is_identity(scale):
        _real_time_axis(axis, scale, max(durations or [0.0]), "y")
    figure.savefig(path)
    return path
