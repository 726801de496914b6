"""Plots of the disaggregated-RL comparison, drawn from a run's files.

* ``normalized.png``: normalized throughput per fabric (FT iteration time /
  the fabric's, steady state): the analogue of RFabric Figure 6;
* ``phases.png``: time per phase of the steady-state iteration, per fabric;
* ``interarrival.png``: per communication type, the distribution of the
  time between consecutive operations (flow starts), the analogue of
  Figure 3's "traffic window duration".

Each function returns the path written, or None when the run holds nothing
to draw (another scenario).
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

from matplotlib.figure import Figure

from emu.report.load import FLOWS_FILE

NORMALIZED_PNG, PHASES_PNG, INTERARRIVAL_PNG = "normalized.png", "phases.png", "interarrival.png"


def plot_normalized(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in (result.get("metrics") or {}).get("fabrics") or []
            if isinstance(r, dict) and r.get("normalized_throughput_ratio") is not None]
    if not rows:
        return None
    figure = Figure(figsize=(max(5.0, 1.1 * len(rows) + 2), 4.0), dpi=110)
    axis = figure.add_subplot()
    names = [r["fabric"] for r in rows]
    values = [float(r["normalized_throughput_ratio"]) for r in rows]
    bars = axis.bar(names, values, color=["tab:gray" if v >= 0.9 else "tab:red" for v in values])
    axis.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8, padding=2)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.axhline(0.9, color="tab:red", linewidth=0.8, linestyle="--", label="0.9 of FT")
    axis.set_ylabel("normalized throughput (FT = 1)")
    axis.set_title(f"{result['scenario']}: throughput relative to the fat-tree "
                   f"(Figure 6 analogue)")
    axis.set_ylim(0, max(values + [1.0]) * 1.15)
    axis.legend(fontsize=8, loc="lower right")
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_phases(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in (result.get("metrics") or {}).get("phases") or []
            if isinstance(r, dict) and {"fabric", "iteration", "phase", "duration_s"} <= set(r)]
    if not rows:
        return None
    last = max(r["iteration"] for r in rows)
    steady = [r for r in rows if r["iteration"] == last]
    fabrics = list(dict.fromkeys(r["fabric"] for r in steady))
    phases = list(dict.fromkeys(r["phase"] for r in steady))
    durations: Dict[str, Dict[str, float]] = defaultdict(dict)
    for r in steady:
        durations[r["phase"]][r["fabric"]] = float(r["duration_s"])
    figure = Figure(figsize=(max(6.0, 1.2 * len(fabrics) * len(phases) / 3 + 3), 4.5), dpi=110)
    axis = figure.add_subplot()
    width = 0.8 / max(1, len(fabrics))
    for index, fabric in enumerate(fabrics):
        positions = [p + index * width for p in range(len(phases))]
        axis.bar(positions, [durations[phase].get(fabric, 0.0) for phase in phases], width,
                 label=fabric)
    axis.set_xticks([p + width * (len(fabrics) - 1) / 2 for p in range(len(phases))], phases)
    axis.set_ylabel("phase duration (s, emulated)")
    axis.set_title(f"{result['scenario']}: time per phase, iteration {last}")
    axis.legend(fontsize=8)
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def interarrivals(flows_csv: Path) -> Dict[str, List[float]]:
    """Communication type (flow group) -> gaps between consecutive operation starts.

    An operation is a step of a collective: flows of one group and step that
    start together count once, at their earliest start.
    """
    starts: Dict[str, set] = defaultdict(set)
    with open(flows_csv, newline="") as stream:
        for row in csv.DictReader(stream):
            if row.get("status") != "ok" or not row.get("start_s") or not row.get("group"):
                continue
            # rfabric flow ids read <fabric>-i<iteration>-<phase>-...
            match = re.match(r"(.+?)-i\d+-", row["id"])
            fabric = match.group(1) if match else ""
            start = round(float(row["start_s"]), 2)
            starts[row["group"]].add((fabric, row.get("step", ""), start))
    gaps: Dict[str, List[float]] = {}
    for group, items in starts.items():
        by_fabric: Dict[str, List[float]] = defaultdict(list)
        for fabric, _, start in items:
            by_fabric[fabric].append(start)
        values = []
        for times in by_fabric.values():
            times.sort()
            values += [b - a for a, b in zip(times, times[1:]) if b > a]
        if values:
            gaps[group] = sorted(values)
    return gaps


def plot_interarrival(result: dict, flows_csv: Path, path: Path) -> Optional[Path]:
    if not flows_csv.is_file() or not (result.get("metrics") or {}).get("phases"):
        return None
    gaps = interarrivals(flows_csv)
    if not gaps:
        return None
    figure = Figure(figsize=(7.0, 4.5), dpi=110)
    axis = figure.add_subplot()
    for group, values in sorted(gaps.items()):
        n = len(values)
        axis.step(values, [(i + 1) / n for i in range(n)], where="post", label=f"{group} ({n})")
    axis.set_xscale("log")
    axis.set_xlabel("time between consecutive operations (s, emulated)")
    axis.set_ylabel("CDF")
    axis.set_title(f"{result['scenario']}: traffic window per communication type "
                   f"(Figure 3 analogue)")
    axis.legend(fontsize=8)
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def write_rl_plots(result: dict, run_dir: Path) -> List[Path]:
    """Every RL plot this run has data for."""
    run_dir = Path(run_dir)
    written = [plot_normalized(result, run_dir / NORMALIZED_PNG),
               plot_phases(result, run_dir / PHASES_PNG),
               plot_interarrival(result, run_dir / FLOWS_FILE, run_dir / INTERARRIVAL_PNG)]
    return [p for p in written if p is not None]
