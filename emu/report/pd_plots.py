"""Plots of the P/D inference comparison, drawn from a run's files.

* ``ttft_cdf.png``: the CDF of TTFT (emulated s, real ms on the top axis)
  per fabric, from ``metrics.requests``;
* ``pd_bars.png``: per fabric, TTFT P99 and throughput (requests per
  emulated second), from ``metrics.fabrics``;
* ``d_ingress.png``: KV streams into each D over time, per fabric (or per
  configuration), next to the credit limit, from ``metrics.d_ingress``;
* ``pd_failure.png``: the degradation after a ToR failure per fabric next
  to the text's figure, and TTFT against arrival time in the healthy and
  the failure run, from ``metrics.failures`` and ``metrics.requests``.

Each function returns the path written, or None when the run holds nothing
to draw (another scenario).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from matplotlib.figure import Figure

TTFT_CDF_PNG, PD_BARS_PNG = "ttft_cdf.png", "pd_bars.png"
D_INGRESS_PNG, PD_FAILURE_PNG = "d_ingress.png", "pd_failure.png"
PD_KINDS = ("pd-inference", "pd-failure", "pd-pairing")


def _is_pd(result: dict) -> bool:
    return (result.get("config") or {}).get("scenario", {}).get("kind") in PD_KINDS \
        or result.get("scenario") in PD_KINDS \
        or "d_streams" in (result.get("metrics") or {})


def _series_key(row: dict) -> str:
    """What one curve stands for: a fabric, or a configuration of one."""
    if row.get("config"):
        return str(row["config"])
    return " ".join(str(row[k]) for k in ("fabric", "run") if row.get(k))


def plot_ttft_cdf(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in (result.get("metrics") or {}).get("requests") or []
            if isinstance(r, dict) and r.get("ttft_s") is not None and r.get("served")]
    if not rows or not _is_pd(result):
        return None
    tdf = float((result.get("scale") or {}).get("tdf", 1.0))
    figure = Figure(figsize=(6.0, 4.0), dpi=110)
    axis = figure.add_subplot()
    for key in dict.fromkeys(_series_key(r) for r in rows):
        values = sorted(float(r["ttft_s"]) for r in rows if _series_key(r) == key)
        ys = [(i + 1) / len(values) for i in range(len(values))]
        axis.step(values, ys, where="post", label=f"{key} ({len(values)} requests)")
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
    metrics = result.get("metrics") or {}
    rows = [r for r in metrics.get("fabrics") or metrics.get("configs") or []
            if isinstance(r, dict) and r.get("ttft_p99_s") is not None]
    if not rows or not _is_pd(result):
        return None
    names = [_series_key(r) for r in rows]
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


def plot_d_ingress(result: dict, path: Path) -> Optional[Path]:
    metrics = result.get("metrics") or {}
    rows = [r for r in metrics.get("d_ingress") or [] if isinstance(r, dict)]
    if not rows or not _is_pd(result):
        return None
    limits = {_series_key(r): r.get("d_credits_count")
              for r in metrics.get("fabrics") or metrics.get("configs") or []
              if isinstance(r, dict)}
    keys = list(dict.fromkeys(_series_key(r) for r in rows))
    figure = Figure(figsize=(7.0, 1.9 * len(keys) + 1.0), dpi=110)
    axes = figure.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    for axis, key in zip(axes, keys):
        mine = [r for r in rows if _series_key(r) == key]
        for d in dict.fromkeys(r["d"] for r in mine):
            points = [r for r in mine if r["d"] == d]
            xs = [0.0] + [float(r["t_s"]) for r in points]
            ys = [0] + [int(r["streams_count"]) for r in points]
            axis.step(xs, ys, where="post", label=f"D {d}")
        if limits.get(key):
            axis.axhline(limits[key], color="black", linestyle="--", linewidth=0.8,
                         label="credit limit")
        axis.set_ylabel("KV streams in")
        axis.set_title(key, fontsize=9)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7, loc="upper right", ncol=3)
    axes[-1].set_xlabel("emulated s from the replay start")
    figure.suptitle(f"{result.get('scenario', '')}: D-ingress concurrency over time",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_failure(result: dict, path: Path) -> Optional[Path]:
    metrics = result.get("metrics") or {}
    failures = [r for r in metrics.get("failures") or [] if isinstance(r, dict)]
    if not failures:
        return None
    figure = Figure(figsize=(11.0, 4.0), dpi=110)
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    names = [r["fabric"] for r in failures]
    xs = range(len(names))
    measured = [float(r.get("throughput_degradation_pct") or 0.0) for r in failures]
    text = [float(r.get("text_degradation_pct") or 0.0) for r in failures]
    bars = left.bar([x - 0.2 for x in xs], measured, 0.4, label="measured (throughput)",
                    color="tab:red")
    left.bar_label(bars, labels=[f"{v:.1f}" for v in measured], fontsize=8, padding=2)
    bars = left.bar([x + 0.2 for x in xs], text, 0.4, label="text (4K GPUs)", color="tab:gray")
    left.bar_label(bars, labels=[f"{v:.1f}" for v in text], fontsize=8, padding=2)
    left.set_xticks(list(xs), names)
    left.axhline(0, color="black", linewidth=0.6)
    left.set_ylabel("degradation after one ToR failure, %")
    left.set_title("worse by (%)", fontsize=9)
    left.grid(True, axis="y", alpha=0.3)
    left.legend(fontsize=8)
    requests = [r for r in metrics.get("requests") or [] if isinstance(r, dict) and
                r.get("served") and r.get("ttft_s") is not None]
    for index, row in enumerate(failures):
        color = f"C{index}"
        for run, style in (("healthy", {"marker": "o", "facecolors": "none",
                                        "edgecolors": color}),
                           ("failure", {"marker": "x", "color": color})):
            points = [r for r in requests if r.get("fabric") == row["fabric"]
                      and r.get("run") == run]
            right.scatter([r["arrival_s"] for r in points], [r["ttft_s"] for r in points],
                          s=18, label=f"{row['fabric']} {run}", **style)
        if row.get("failed_at_s") is not None:
            right.axvline(float(row["failed_at_s"]), color=color, linestyle=":", linewidth=1)
    right.set_xlabel("arrival, emulated s (dotted: the ToR fails)")
    right.set_ylabel("TTFT, emulated s")
    right.set_title("TTFT per request, healthy (o) and failure (x) run", fontsize=9)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7, ncol=2)
    figure.suptitle(f"{result.get('scenario', '')}: a single ToR failure", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    return path


def write_pd_plots(result: dict, run_dir: Path) -> List[Path]:
    """Every P/D plot this run has data for."""
    run_dir = Path(run_dir)
    written = [plot_ttft_cdf(result, run_dir / TTFT_CDF_PNG),
               plot_bars(result, run_dir / PD_BARS_PNG),
               plot_d_ingress(result, run_dir / D_INGRESS_PNG),
               plot_failure(result, run_dir / PD_FAILURE_PNG)]
    return [p for p in written if p is not None]
