"""Turn a run's results folder into ``report.md``, ``report.html`` and PNG plots.

The emulation only writes raw results; this module reads them back, so a
report can be regenerated (or improved) without running anything again::

    python -m emu.report results/<run>

Input: ``result.json``
----------------------
::

    {
      "scenario": str,                 # required; everything else is optional
      "description": str,
      "started": str,                  # ISO 8601
      "duration_s": float,             # emulated seconds
      "versions": {name: version},
      "datapath": "netdev" | "system",
      "scale": {"bw_factor": float, "tdf": float},          # see traffic.scale
      "fabric": {"spec": str, "hosts": int, "switches": int, "ocs": int,
                 "link_mbps": float},                        # emulated Mbit/s
      "config": {...},                 # the resolved scenario
      "metrics": {
        "<name>_<unit>": number,       # a headline scalar, e.g. "blackout_ms"
        "<name>": [{...}, ...],        # a table, one dict per row
        "<name>_<unit>": [number...],  # a list of values
        "<group>": {...}               # nested names print as "group.name"
      },
      "timeline": {
        "t0": float,                   # epoch s that t_rel_s counts from
        "series": [{"label": str,
                    "points": [[t_rel_s, mbps], ...]}],   # bin start, Mbit/s
        "dark_windows": [{"start": t_rel_s, "end": t_rel_s, "label": str}]
      },
      "steps": [{"label": str, "duration_s": float}],     # e.g. all-reduce steps
      "fidelity": {...},               # emu.fidelity.assess(), with "warnings"
      "warnings": [str]
    }

Metric keys name their unit by suffix: ``_s``, ``_ms``, ``_us`` (time),
``_mbps``, ``_gbps`` (rate), ``_bytes`` (size), ``_pct`` (percent),
``_ratio`` (dimensionless), ``_count`` (count).  Values are *emulated*
unless the key holds the word ``real`` (``ocs_delay_real_ms``); the report
prints time, rate and size metrics in both emulated and real units using
``scale`` (real time = emulated / tdf, real rate = emulated / bw_factor,
real bytes = emulated / (bw_factor x tdf)).  All times in the timeline and
in ``steps`` are emulated seconds.

Input: ``flows.csv``
--------------------
One row per flow, columns ``id, src, dst, bytes, start_s, end_s,
duration_s, goodput_mbps, retransmits, status`` (emulated bytes, seconds
since ``timeline.t0``, Mbit/s; ``status`` is e.g. ``ok`` or ``failed``).

Output
------
``report.md``, ``timeline.png`` (throughput per series over time, dark
windows shaded) and, when ``steps`` is present, ``steps.png``; then
``report.html``, the same report as one self-contained page with the plots
embedded (see emu.report_html).  The report opens with what was run
(scenario, fabric, scale, datapath, versions), then the fidelity warnings,
the headline metrics, the plots, the flows and the run's files.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from emu.report_html import HTML_FILE, write_html
from emu.pd_plots import write_pd_plots
from emu.rl_plots import write_rl_plots
from traffic.scale import Scale, format_quantity

RESULT_FILE = "result.json"
FLOWS_FILE = "flows.csv"
REPORT_FILE = "report.md"
TIMELINE_PNG = "timeline.png"
STEPS_PNG = "steps.png"

FLOW_COLUMNS = ("id", "src", "dst", "bytes", "start_s", "end_s", "duration_s",
                "goodput_mbps", "retransmits", "status")

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".pcap.gz", ".pcapng.gz", ".cap")

# Rows shown in a table before the rest is left to result.json / flows.csv.
MAX_TABLE_ROWS = 40
# Dark windows get a text label only while labels stay legible.
MAX_LABELLED_WINDOWS = 12
MAX_LEGEND_ENTRIES = 12

# Metric key suffix -> (unit printed, kind, factor to the kind's base unit).
# Base units: seconds for time, Mbit/s for rate, bytes for size.
_UNIT_SUFFIXES = (
    ("_ms", "ms", "time", 1e-3),
    ("_us", "us", "time", 1e-6),
    ("_s", "s", "time", 1.0),
    ("_mbps", "Mbit/s", "rate", 1.0),
    ("_gbps", "Gbit/s", "rate", 1e3),
    ("_bytes", "B", "size", 1.0),
    ("_pct", "%", "plain", 1.0),
    ("_ratio", "", "plain", 1.0),
    ("_count", "", "count", 1.0),
)


@dataclass(frozen=True)
class FlowRow:
    """One row of flows.csv (emulated bytes, seconds and Mbit/s)."""

    id: str
    src: str
    dst: str
    bytes: Optional[int]
    start_s: Optional[float]
    end_s: Optional[float]
    duration_s: Optional[float]
    goodput_mbps: Optional[float]
    retransmits: Optional[int]
    status: str


@dataclass(frozen=True)
class MetricUnit:
    """What a metric key's suffix says about its value."""

    name: str       # the key without its unit suffix
    unit: str       # printed unit ("ms", "Mbit/s", "" ...)
    kind: str       # "time", "rate", "size", "plain", "count" or "unknown"
    to_base: float  # multiply to get seconds / Mbit/s / bytes
    is_real: bool   # the key says the value is in real units already


# Loading -----------------------------------------------------------------------

def _fail(path: Path, key: str, problem: str) -> ValueError:
    return ValueError(f"{path}: key '{key}' {problem}")


def load_result(run_dir) -> dict:
    """Read and check ``result.json``; errors name the file and the key."""
    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {RESULT_FILE} in {run_dir}: not a run folder?")
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(result, dict):
        raise ValueError(f"{path}: top level must be an object")
    if not isinstance(result.get("scenario"), str):
        raise _fail(path, "scenario", "must be a string naming the scenario")
    for key, kind in (("versions", dict), ("scale", dict), ("fabric", dict),
                      ("config", dict), ("metrics", dict), ("timeline", dict),
                      ("fidelity", dict), ("warnings", list), ("steps", list)):
        if key in result and result[key] is not None \
                and not isinstance(result[key], kind):
            raise _fail(path, key, f"must be a JSON {kind.__name__.replace('dict', 'object')}")
    timeline = result.get("timeline") or {}
    for index, series in enumerate(timeline.get("series") or []):
        if not isinstance(series, dict) or not isinstance(series.get("points"), list):
            raise _fail(path, f"timeline.series[{index}]",
                        "must be an object with 'label' and 'points' [[t_rel_s, mbps], ...]")
    for index, window in enumerate(timeline.get("dark_windows") or []):
        if not isinstance(window, dict) or not all(
                isinstance(window.get(k), (int, float)) for k in ("start", "end")):
            raise _fail(path, f"timeline.dark_windows[{index}]",
                        "must be an object with numeric 'start' and 'end' (s)")
    for index, step in enumerate(result.get("steps") or []):
        if not isinstance(step, dict) or not isinstance(step.get("duration_s"), (int, float)):
            raise _fail(path, f"steps[{index}]",
                        "must be an object with 'label' and numeric 'duration_s'")
    return result


def scale_of(result: dict, path: Path = Path(RESULT_FILE)) -> Scale:
    """The run's :class:`Scale` (identity if result.json has none)."""
    data = result.get("scale") or {}
    try:
        return Scale(bw_factor=data.get("bw_factor", 1.0), tdf=data.get("tdf", 1.0))
    except ValueError as error:
        raise _fail(path, "scale", str(error)) from None


def _number(text: str, kind, path: Path, row: int, column: str):
    text = text.strip()
    if text == "" or text.lower() in ("none", "null", "nan"):
        return None
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        raise ValueError(f"{path}: row {row}, column '{column}': "
                         f"{text!r} is not a number") from None


def load_flows(run_dir) -> Optional[List[FlowRow]]:
    """Rows of ``flows.csv``, or None if the run folder has none."""
    path = Path(run_dir) / FLOWS_FILE
    if not path.is_file():
        return None
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in FLOW_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; "
                             f"expected {list(FLOW_COLUMNS)}")
        flows = []
        for row_number, row in enumerate(reader, start=2):
            flows.append(FlowRow(
                id=row["id"], src=row["src"], dst=row["dst"],
                bytes=_number(row["bytes"], int, path, row_number, "bytes"),
                start_s=_number(row["start_s"], float, path, row_number, "start_s"),
                end_s=_number(row["end_s"], float, path, row_number, "end_s"),
                duration_s=_number(row["duration_s"], float, path, row_number,
                                   "duration_s"),
                goodput_mbps=_number(row["goodput_mbps"], float, path, row_number,
                                     "goodput_mbps"),
                retransmits=_number(row["retransmits"], int, path, row_number,
                                    "retransmits"),
                status=row["status"].strip()))
    return flows


# Units and formatting ------------------------------------------------------------

def metric_unit(key: str) -> MetricUnit:
    """Parse a metric key's unit suffix (see the module docstring)."""
    leaf = key.rsplit(".", 1)[-1]
    is_real = "real" in leaf.lower().split("_")
    for suffix, unit, kind, to_base in _UNIT_SUFFIXES:
        if leaf.lower().endswith(suffix) and len(leaf) > len(suffix):
            return MetricUnit(key[:len(key) - len(suffix)], unit, kind, to_base,
                              is_real)
    return MetricUnit(key, "", "unknown", 1.0, is_real)


def _to_real(unit: MetricUnit, value: float, scale: Scale) -> Tuple[float, str]:
    """(real value in the kind's base unit, base unit) of an emulated value."""
    base = value * unit.to_base
    if unit.kind == "time":
        return base / scale.tdf, "s"
    if unit.kind == "rate":
        return base / scale.bw_factor, "Mbit/s"
    return base / (scale.bw_factor * scale.tdf), "B"


def _to_emulated(unit: MetricUnit, value: float, scale: Scale) -> Tuple[float, str]:
    base = value * unit.to_base
    if unit.kind == "time":
        return base * scale.tdf, "s"
    if unit.kind == "rate":
        return base * scale.bw_factor, "Mbit/s"
    return base * scale.bw_factor * scale.tdf, "B"


def _plain(value: Any, digits: int = 4) -> str:
    """A table cell: numbers to ``digits`` significant digits, text escaped."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    if isinstance(value, (list, dict)):
        value = json.dumps(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _with_unit(value: Any, unit: MetricUnit) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if unit.kind == "count":
            return _plain(value)
        if unit.unit:
            return format_quantity(value, unit.unit)
    return _plain(value)


def _both_units(value: Any, unit: MetricUnit, scale: Scale) -> Tuple[str, str]:
    """(emulated text, real text) for one metric value."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not numeric or unit.kind not in ("time", "rate", "size"):
        return _with_unit(value, unit), ""
    if unit.is_real:
        emulated, base = _to_emulated(unit, value, scale)
        return format_quantity(emulated, base), _with_unit(value, unit)
    real, base = _to_real(unit, value, scale)
    return _with_unit(value, unit), format_quantity(real, base)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _flatten(metrics: dict, prefix: str = "") -> Iterable[Tuple[str, Any]]:
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + ".")
        else:
            yield name, value


NOTES_KEY = "notes"


def _is_identity(scale: Scale) -> bool:
    return scale.bw_factor == 1.0 and scale.tdf == 1.0


def _link(path: str) -> str:
    return urllib.parse.quote(path)


# Plots -------------------------------------------------------------------------

def _new_figure(width: float, height: float) -> Figure:
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
    figure = _new_figure(10, 4.8)
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

    if not _is_identity(scale):
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
    figure = _new_figure(max(6.0, min(0.45 * len(steps) + 3, 16.0)), 4.5)
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
    if not _is_identity(scale):
        _real_time_axis(axis, scale, max(durations or [0.0]), "y")
    figure.savefig(path)
    return path


# Markdown ----------------------------------------------------------------------

def _warnings(result: dict) -> List[str]:
    seen = []
    for text in list(result.get("warnings") or []) + \
            list((result.get("fidelity") or {}).get("warnings") or []):
        if text not in seen:
            seen.append(text)
    return seen


def _run_section(result: dict, scale: Scale) -> List[str]:
    fabric = result.get("fabric") or {}
    versions = result.get("versions") or {}
    datapath = result.get("datapath")
    datapath_text = {"netdev": "netdev (OVS userspace datapath)",
                     "system": "system (OVS kernel datapath)"}.get(
        datapath, _plain(datapath) if datapath else "not recorded")
    rows = [("Scenario", f"`{result['scenario']}`")]
    if result.get("started"):
        rows.append(("Started", _plain(result["started"])))
    if isinstance(result.get("duration_s"), (int, float)):
        rows.append(("Duration", scale.format_seconds(result["duration_s"])))
    if fabric:
        parts = [f"`{fabric['spec']}`" if fabric.get("spec") else "unnamed"]
        counts = [f"{fabric[k]} {k}" for k in ("hosts", "switches", "ocs")
                  if fabric.get(k) is not None]
        if counts:
            parts.append(", ".join(counts))
        link = fabric.get("link_mbps")
        if isinstance(link, (int, float)):
            parts.append(f"links {scale.format_rate(link)}")
        rows.append(("Fabric", "; ".join(parts)))
        rows.append(("Scale", scale.describe()))
        rows.append(("Datapath", datapath_text))
    else:
        rows.append(("Fabric", "none: this scenario builds no network (a calculation)"))
    if versions:
        rows.append(("Versions", ", ".join(f"{name} {version}" for name, version
                                           in sorted(versions.items()))))
    lines = ["## What was run", ""]
    lines += _table(("", ""), [(f"**{name}**", value) for name, value in rows])
    config = result.get("config")
    if config:
        lines += ["", "<details><summary>Resolved configuration</summary>", "",
                  "```json", json.dumps(config, indent=2, sort_keys=True,
                                        default=str), "```", "", "</details>"]
    return lines


def _fidelity_section(result: dict) -> List[str]:
    warnings = _warnings(result)
    fidelity = result.get("fidelity") or {}
    lines = [f"## Fidelity warnings ({len(warnings)})", ""]
    if warnings:
        lines += ["**These results may describe the emulator rather than the "
                  "fabric:**", ""]
        for text in warnings:
            lines += [f"> **WARNING:** {_plain(text)}", ""]
        lines.pop()
    elif fidelity:
        lines.append("None: no flow that had its links to itself fell short of "
                     "its configured rate, and the CPU did not saturate.")
    else:
        lines.append("No fidelity check was recorded for this run.")
    cpu = fidelity.get("cpu") or {}
    if cpu:
        machine = cpu.get("machine_cpu_pct") or {}
        rows = [("machine (% of all cores)", _plain(machine.get("mean"), 3),
                 _plain(machine.get("max"), 3))]
        for name, stats in sorted((cpu.get("processes") or {}).items()):
            rows.append((f"{name} (% of one core)",
                         _plain(stats.get("mean_pct_of_core"), 3),
                         _plain(stats.get("max_pct_of_core"), 3)))
        lines += ["", f"CPU use over {cpu.get('samples', '?')} samples of "
                      f"{_plain(cpu.get('interval_s'))} s on {cpu.get('cores', '?')} "
                      f"cores:", ""]
        lines += _table(("what", "mean (%)", "max (%)"), rows)
    alone = fidelity.get("alone_flows") or []
    if alone:
        lines += ["", f"Flows that had their links to themselves "
                      f"({len(alone)} of {fidelity.get('flows_checked', '?')} checked):",
                  ""]
        lines += _table(("flow", "goodput (Mbit/s)", "cap (Mbit/s)", "ratio", "ok"),
                        [(_plain(row.get("id")), _plain(row.get("goodput_mbps")),
                          _plain(row.get("cap_mbps")), _plain(row.get("ratio"), 3),
                          _plain(row.get("ok"))) for row in alone[:MAX_TABLE_ROWS]])
        if len(alone) > MAX_TABLE_ROWS:
            lines.append(f"\n... {len(alone) - MAX_TABLE_ROWS} more in {RESULT_FILE}.")
    return lines


def _value_list(values: list, unit: MetricUnit, scale: Scale) -> Tuple[str, str]:
    """(emulated, real) text for a list of values: all of them, or a summary."""
    numbers = [v for v in values if isinstance(v, (int, float))
               and not isinstance(v, bool)]
    if not values:
        return "(empty)", ""
    if len(values) <= 8 or len(numbers) != len(values):
        pairs = [_both_units(v, unit, scale) for v in values[:8]]
        more = f", ... ({len(values)} values)" if len(values) > 8 else ""
    else:
        summary = (("min", min(numbers)), ("median", statistics.median(numbers)),
                   ("max", max(numbers)))
        pairs = [tuple(f"{name} {text}" if text else "" for text in
                       _both_units(value, unit, scale)) for name, value in summary]
        more = f" ({len(values)} values)"
    emulated = ", ".join(pair[0] for pair in pairs) + more
    real = ", ".join(pair[1] for pair in pairs if pair[1])
    return emulated, (real + more) if real else ""


def _metrics_section(result: dict, scale: Scale) -> List[str]:
    metrics = result.get("metrics") or {}
    scalars, tables = [], []
    for key, value in _flatten(metrics):
        if key == NOTES_KEY:
            continue            # rendered as prose (`_notes_section`)
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append((key, value))
        else:
            scalars.append((key, value))
    lines = ["## Headline metrics", ""]
    identity = _is_identity(scale)
    if scalars:
        rows = []
        for key, value in scalars:
            unit = metric_unit(key)
            if isinstance(value, list):
                emulated, real = _value_list(value, unit, scale)
            else:
                emulated, real = _both_units(value, unit, scale)
            rows.append((f"`{key}`", emulated) if identity
                        else (f"`{key}`", emulated, real or "-"))
        header = ("metric", "value") if identity else \
            ("metric", "emulated", "real-world equivalent")
        lines += _table(header, rows)
    else:
        lines.append("No scalar metrics recorded.")
    for key, rows in tables:
        columns: List[str] = []
        for row in rows:
            columns += [column for column in row if column not in columns]
        units = {column: metric_unit(column) for column in columns}
        header = [f"{units[c].name} ({units[c].unit})" if units[c].unit else c
                  for c in columns]
        lines += ["", f"### {key}", ""]
        lines += _table(header, [[_plain(row.get(c)) for c in columns]
                                 for row in rows[:MAX_TABLE_ROWS]])
        if len(rows) > MAX_TABLE_ROWS:
            lines.append(f"\n... {len(rows) - MAX_TABLE_ROWS} more rows in "
                         f"{RESULT_FILE}.")
    if not identity and tables:
        lines += ["", "Table values are emulated; divide times by the tdf "
                      f"({scale.tdf:g}) and rates by the bandwidth factor "
                      f"({scale.bw_factor:g}) for real-world ones."]
    return lines


def _notes_section(result: dict) -> List[str]:
    """An experiment's own explanation of its figures (``metrics.notes``)."""
    notes = (result.get("metrics") or {}).get(NOTES_KEY) or []
    if not isinstance(notes, list) or not notes:
        return []
    return ["## Reading the figures", ""] + [f"- {_plain(note)}" for note in notes] + [""]


def _stat_row(name: str, values: List[float], unit: str,
              to_real) -> Tuple[str, ...]:
    if not values:
        return (name, "-", "-", "-", "-")
    stats = (min(values), statistics.median(values), statistics.fmean(values),
             max(values))
    cells = []
    for value in stats:
        text = format_quantity(value, unit)
        if to_real is not None:
            text = f"{text} ({to_real(value)} real)"
        cells.append(text)
    return (name, *cells)


def _flows_section(flows: Optional[List[FlowRow]], scale: Scale) -> List[str]:
    lines = ["## Flows", ""]
    if flows is None:
        return lines + [f"No {FLOWS_FILE} in the run folder."]
    if not flows:
        return lines + [f"{FLOWS_FILE} holds no flows."]
    identity = _is_identity(scale)
    statuses: Dict[str, int] = {}
    for flow in flows:
        statuses[flow.status or "?"] = statuses.get(flow.status or "?", 0) + 1
    total_bytes = sum(flow.bytes or 0 for flow in flows)
    starts = [f.start_s for f in flows if f.start_s is not None]
    ends = [f.end_s for f in flows if f.end_s is not None]
    retransmits = sum(flow.retransmits or 0 for flow in flows)
    status_text = ", ".join(f"{count} {status}" for status, count
                            in sorted(statuses.items()))
    lines.append(f"- **{len(flows)} flows**: {status_text}")
    lines.append("- **Flow sizes, summed**: " + (format_quantity(total_bytes, "B")
                 if identity else scale.format_bytes(total_bytes)))
    if starts and ends:
        span = max(ends) - min(starts)
        lines.append("- **First start to last end**: " + (
            format_quantity(span, "s") if identity else scale.format_seconds(span)))
    lines.append(f"- **TCP retransmits**: {retransmits}")
    goodputs = [f.goodput_mbps for f in flows if f.goodput_mbps is not None]
    durations = [f.duration_s for f in flows if f.duration_s is not None]
    real_rate = None if identity else (
        lambda mbps: format_quantity(scale.real_gbps(mbps), "Gbit/s"))
    real_time = None if identity else (
        lambda s: format_quantity(scale.real_seconds(s), "s"))
    lines += [""]
    lines += _table(("", "min", "median", "mean", "max"),
                    [_stat_row("goodput", goodputs, "Mbit/s", real_rate),
                     _stat_row("duration", durations, "s", real_time)])
    # The flows most worth a look: failed ones first, then the slowest.
    ranked = sorted(flows, key=lambda f: (f.status == "ok",
                                          f.goodput_mbps if f.goodput_mbps
                                          is not None else -1.0))
    shown = ranked[:10]
    lines += ["", f"Slowest {len(shown)} flows (failed first); all in "
                  f"[{FLOWS_FILE}]({FLOWS_FILE}):", ""]
    lines += _table(("flow", "src -> dst", "bytes", "start (s)", "duration (s)",
                     "goodput (Mbit/s)", "retransmits", "status"),
                    [(_plain(f.id), _plain(f"{f.src} -> {f.dst}"), _plain(f.bytes),
                      _plain(f.start_s), _plain(f.duration_s),
                      _plain(f.goodput_mbps), _plain(f.retransmits),
                      _plain(f.status)) for f in shown])
    return lines


def _plots_section(plots: List[Path]) -> List[str]:
    lines = ["## Plots", ""]
    for plot in plots:
        name = plot.name
        lines += [f"![{name}]({_link(name)})", ""]
    return lines[:-1]


def _files_section(run_dir: Path, plots: List[Path]) -> List[str]:
    lines = ["## Files", ""]
    captures, others = [], []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(run_dir).as_posix()
        if relative in (REPORT_FILE, HTML_FILE) or path in plots:
            continue
        if relative.lower().endswith(CAPTURE_SUFFIXES):
            captures.append((relative, path.stat().st_size))
        else:
            others.append((relative, path.stat().st_size))
    extra_plots = [r for r, _ in others if r.lower().endswith(".png")]
    if extra_plots:
        lines.append("Other plots: " + ", ".join(f"[{r}]({_link(r)})"
                                                 for r in extra_plots))
        lines.append("")
    lines.append("Captures:" if captures else "Captures: none in the run folder.")
    lines += [f"- [{r}]({_link(r)}) ({format_quantity(size, 'B')})"
              for r, size in captures]
    lines += ["", "Other files:"]
    lines += [f"- [{r}]({_link(r)}) ({format_quantity(size, 'B')})"
              for r, size in others if r not in extra_plots]
    return lines


def render_markdown(result: dict, flows: Optional[List[FlowRow]], scale: Scale,
                    run_dir: Path, plots: List[Path]) -> str:
    """The text of report.md."""
    title = f"# Run report: {result['scenario']}"
    lines = [title, ""]
    if result.get("description"):
        lines += [_plain(result["description"]), ""]
    lines += ["All figures name their unit; *emulated* values were measured "
              "on the testbed, *real* ones map them back to the modelled "
              "fabric through the scale factors below.", ""]
    # What was run first, then what may invalidate it, then the figures.
    lines += _run_section(result, scale) + [""]
    lines += _fidelity_section(result) + [""]
    lines += _metrics_section(result, scale) + [""]
    lines += _notes_section(result)
    steps = result.get("steps") or []
    if steps:
        total = sum(float(step["duration_s"]) for step in steps)
        lines += ["## Steps", "",
                  f"{len(steps)} steps, {scale.format_seconds(total)} in total"
                  f" (plot: [{STEPS_PNG}]({STEPS_PNG})).", ""]
    lines += _plots_section(plots) + [""]
    lines += _flows_section(flows, scale) + [""]
    lines += _files_section(run_dir, plots)
    return "\n".join(lines).rstrip() + "\n"


def write_report(run_dir) -> List[Path]:
    """Write report.md, timeline.png, (with steps) steps.png and report.html.

    Returns their paths, report.md first and report.html last.
    """
    run_dir = Path(run_dir)
    result = load_result(run_dir)
    scale = scale_of(result, run_dir / RESULT_FILE)
    flows = load_flows(run_dir)
    # A calculation (cost, fabrics, pd-calc) has no timeline to draw.
    plots = [plot_timeline(result, run_dir / TIMELINE_PNG, scale)] \
        if result.get("timeline") or result.get("fabric") else []
    if result.get("steps"):
        plots.append(plot_steps(result, run_dir / STEPS_PNG, scale))
    plots += write_rl_plots(result, run_dir)
    plots += write_pd_plots(result, run_dir)
    report = run_dir / REPORT_FILE
    report.write_text(render_markdown(result, flows, scale, run_dir, plots),
                      encoding="utf-8")
    return [report] + plots + [write_html(run_dir)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emu.report",
        description="Write report.md, report.html and PNG plots for a "
                    "results folder.")
    parser.add_argument("run_dir", help="folder holding result.json (and flows.csv)")
    arguments = parser.parse_args(argv)
    try:
        written = write_report(arguments.run_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
