"""Plots of the full-scale runs of the flow-level model, drawn from result.json.

* ``figure6.png``: normalized throughput per fabric (FT's iteration time /
  the fabric's) at each GPU count, grouped bars: RFabric's Figure 6;
* ``sweep.png``: RFabric under each Table 2 technology: the reconfiguration
  it exposed per iteration and its normalized throughput, against the delay
  (log scale): where the delay stops being hidden;
* ``failure_bars.png``: the throughput lost to one ToR failure per fabric,
  next to the text's figure.

Each function returns the path written, or None when the run holds nothing
to draw (another scenario).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from matplotlib.figure import Figure

FIGURE6_PNG, SWEEP_PNG, FAILURE_PNG = "figure6.png", "sweep.png", "failure_bars.png"


def _rows(result: dict, key: str) -> List[dict]:
    rows = (result.get("metrics") or {}).get(key) or []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def plot_figure6(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in _rows(result, "figure6")
            if isinstance(r.get("normalized_throughput_ratio"), (int, float))]
    if not rows:
        return None
    scales = sorted({r["gpus_count"] for r in rows})
    fabrics = list(dict.fromkeys(r["fabric"] for r in rows))
    figure = Figure(figsize=(max(6.0, 1.3 * len(fabrics) * len(scales) / 2 + 3), 4.2), dpi=110)
    axis = figure.add_subplot()
    width = 0.8 / len(scales)
    for k, gpus in enumerate(scales):
        values = [next((r["normalized_throughput_ratio"] for r in rows
                        if r["fabric"] == f and r["gpus_count"] == gpus), 0.0) for f in fabrics]
        xs = [i + (k - (len(scales) - 1) / 2) * width for i in range(len(fabrics))]
        bars = axis.bar(xs, values, width, label=f"{gpus:,} GPUs")
        axis.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=2)
    axis.set_xticks(range(len(fabrics)), fabrics)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_ylabel("normalized throughput (FT = 1)")
    axis.set_title("Figure 6 on the flow-level model: iteration throughput relative to FT",
                   fontsize=10)
    axis.legend(fontsize=8, loc="lower right")
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_sweep(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in _rows(result, "sweep") if isinstance(r.get("delay_ms"), (int, float))]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: r["delay_ms"])
    figure = Figure(figsize=(6.5, 4.0), dpi=110)
    axis = figure.add_subplot()
    delays = [max(r["delay_ms"], 1e-3) for r in rows]
    exposed_first = [r.get("exposed_first_s") or 0.0 for r in rows]
    exposed_later = [r.get("exposed_later_s") or 0.0 for r in rows]
    axis.plot(delays, exposed_first, "o-", label="exposed, iteration 1 (profiling)")
    axis.plot(delays, exposed_later, "s--", label="exposed, later iterations (proactive)")
    for r, x in zip(rows, delays):
        axis.annotate(r["technology"], (x, 0), textcoords="offset points", xytext=(0, 4),
                      fontsize=7, ha="center")
    axis.set_xscale("log")
    # From RotorNet's microseconds to the robotic panel's hours: a log scale
    # that still shows 0.
    axis.set_yscale("symlog", linthresh=1e-3)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("OCS reconfiguration delay (ms, Table 2)")
    axis.set_ylabel("reconfiguration exposed per iteration (s)")
    twin = axis.twinx()
    twin.plot(delays, [r.get("normalized_throughput_ratio") or 0.0 for r in rows], "k:",
              marker="^", label="normalized throughput")
    twin.set_ylabel("normalized throughput (FT = 1)")
    twin.set_ylim(0, 1.2)
    gpus = rows[0].get("gpus_count")
    axis.set_title(f"RFabric at {gpus:,} GPUs: where the delay stops being hidden",
                   fontsize=10)
    lines = axis.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    axis.legend(lines[0] + extra[0], lines[1] + extra[1], fontsize=7, loc="upper left")
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_failure(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in _rows(result, "failures")
            if isinstance(r.get("throughput_degradation_pct"), (int, float))
            and isinstance(r.get("text_degradation_pct"), (int, float))]
    if not rows:
        return None
    figure = Figure(figsize=(6.0, 4.0), dpi=110)
    axis = figure.add_subplot()
    names = [r["fabric"] for r in rows]
    xs = range(len(rows))
    ours = axis.bar([x - 0.2 for x in xs], [r["throughput_degradation_pct"] for r in rows],
                    0.4, label="this run")
    text = axis.bar([x + 0.2 for x in xs], [r["text_degradation_pct"] for r in rows], 0.4,
                    label="the text (4K GPUs)", color="tab:gray")
    for bars in (ours, text):
        axis.bar_label(bars, labels=[f"{b.get_height():.1f}" for b in bars], fontsize=7)
    axis.set_xticks(list(xs), names)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_ylabel("throughput lost to one ToR failure (%)")
    axis.set_title(f"{result.get('scenario')}: one ToR failure", fontsize=10)
    axis.legend(fontsize=8)
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def write_scale_plots(result: dict, run_dir: Path) -> List[Path]:
    run_dir = Path(run_dir)
    written = [plot_figure6(result, run_dir / FIGURE6_PNG),
               plot_sweep(result, run_dir / SWEEP_PNG),
               plot_failure(result, run_dir / FAILURE_PNG)]
    return [p for p in written if p is not None]
