"""Plots of the P/D inference comparison, drawn from a run's files.

* ``ttft_cdf.png``: the CDF of TTFT (emulated s, real ms on the top axis)
  per fabric, from ``metrics.requests``;
* ``pd_bars.png``: per fabric, TTFT P99 and throughput (requests per
  emulated second), from ``metrics.fabrics``.

Each function returns the path written, or None when the run holds nothing
to draw (another scenario).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from matplotlib.figure import Figure

TTFT_CDF_PNG, PD_BARS_PNG = "ttft_cdf.png", "pd_bars.png"


def _is_pd(result: dict) -> bool:
    return (result.get("config") or {}).get("scenario", {}).get("kind") == "pd-inference" \
        or result.get("scenario") == "pd-inference" \
        or "d_streams" in (result.get("metrics") or {})


def plot_ttft_cdf(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in (result.get("metrics") or {}).get("requests") or []
            if isinstance(r, dict) and r.get("ttft_s") is not None and r.get("served")]
    if not rows or not _is_pd(result):
        return None
    tdf = float((result.get("scale") or {}).get("tdf", 1.0))
    figure = Figure(figsize=(6.0, 4.0), dpi=110)
    axis = figure.add_subplot()
    for fabric in dict.fromkeys(r["fabric"] for r in rows):
        values = sorted(float(r["ttft_s"]) for r in rows if r["fabric"] == fabric)
        ys = [(i + 1) / len(values) for i in range(len(values))]
        axis.step(values, ys, where="post", label=f"{fabric} ({len(values)} requests)")
    axis.set_xlabel(f"TTFT, emulated s (real = / {tdf:g})")
    axis.set_ylabel("fraction of requests")
    axis.set_ylim(0, 1.02)
    axis.set_title(f"{result.get('scenario', '')}: TTFT CDF per fabric")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_bars(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in (result.get("metrics") or {}).get("fabrics") or []
            if isinstance(r, dict) and r.get("ttft_p99_s") is not None]
    if not rows or not _is_pd(result):
        return None
    names = [r["fabric"] for r in rows]
    figure = Figure(figsize=(max(6.0, 1.6 * len(rows) + 3), 4.0), dpi=110)
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    p99 = [float(r["ttft_p99_s"]) for r in rows]
    bars = left.bar(names, p99, color="tab:blue")
    left.bar_label(bars, labels=[f"{v:.2f}" for v in p99], fontsize=8, padding=2)
    left.set_ylabel("TTFT P99, emulated s")
    left.set_title("TTFT P99 (lower is better)", fontsize=9)
    rps = [float(r.get("throughput_emu_rps") or 0.0) for r in rows]
    bars = right.bar(names, rps, color="tab:green")
    right.bar_label(bars, labels=[f"{v:.2f}" for v in rps], fontsize=8, padding=2)
    right.set_ylabel("requests per emulated s")
    right.set_title("throughput (higher is better)", fontsize=9)
    for axis, values in ((left, p99), (right, rps)):
        axis.set_ylim(0, max(values + [1e-9]) * 1.2)
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(f"{result.get('scenario', '')}: per fabric", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    return path


def write_pd_plots(result: dict, run_dir: Path) -> List[Path]:
    """Every P/D plot this run has data for."""
    run_dir = Path(run_dir)
    written = [plot_ttft_cdf(result, run_dir / TTFT_CDF_PNG),
               plot_bars(result, run_dir / PD_BARS_PNG)]
    return [p for p in written if p is not None]
