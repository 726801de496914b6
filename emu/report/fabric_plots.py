"""Plots of the calculation scenarios that compare fabrics, drawn from result.json.

* ``cost_vs_gpus.png`` and ``cost_per_gpu.png`` (the ``cost`` scenario,
  RFabric Figure 7's analogue): network cost, and cost per GPU, against the
  GPU count, one line per fabric and one panel per packet-switch radix, from
  ``metrics.network_cost`` rows ``{"radix", "gpus", "fabric", "label",
  "cost_million_usd", "cost_per_gpu_usd"}``;
* ``cost_share_of_gpu.png`` (the ``cost`` scenario, Figure 7's main claim:
  conventional fabrics push network cost toward parity with the GPUs,
  RFabric keeps it a modest fraction): network cost as a percentage of the
  GPUs' cost against the GPU count, from the rows' optional
  ``share_of_gpu_cost_pct`` (and ``gpu_price_usd`` for the title); runs
  recorded without it get no such plot.
  In every cost plot a fabric whose line coincides with one drawn before it
  (FT and ROFT cost the same) is drawn dashed with hollow markers, shifted
  right by a few percent of the GPU count, and its legend entry says so:
  "ROFT (= FT, shifted right)";
* ``fabric_counts.png`` (the ``fabrics`` scenario): per fabric at the scale
  asked, its packet switches and OCSes, optical modules and bisection
  bandwidth, from ``metrics.fabrics`` rows ``{"fabric", "switches", "ocs",
  "optical_modules", "bisection_gbps", ...}`` (a row with a ``note`` and no
  counts is a fabric not built at that scale) and ``metrics.gpus_count`` /
  ``metrics.radix_count``.

Each function returns the paths written, or nothing when the run holds no
such rows (another scenario).  A ``network_cost`` row without the numbers a
plot needs is an error naming result.json, the row and the keys it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from emu.report.load import RESULT_FILE
from emu.report.plots import new_figure

COST_VS_GPUS_PNG, COST_PER_GPU_PNG = "cost_vs_gpus.png", "cost_per_gpu.png"
COST_SHARE_PNG = "cost_share_of_gpu.png"
SHARE_KEY = "share_of_gpu_cost_pct"
# A series equal to an earlier one is drawn at x * SHIFT ** (its rank among such series).
SHIFT = 2 ** 0.07
FABRIC_COUNTS_PNG = "fabric_counts.png"

COST_KEY = "network_cost"
COST_NUMBERS = ("radix", "gpus", "cost_million_usd", "cost_per_gpu_usd")
# Keys that tell the fabrics scenario's rows apart from the P/D and RL
# comparisons, whose metrics.fabrics rows hold latencies instead of counts.
COUNT_KEYS = ("switches", "optical_modules")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cost_rows(result: dict, path: Path = Path(RESULT_FILE)) -> List[dict]:
    """``metrics.network_cost``, checked; empty when the run has none."""
    rows = (result.get("metrics") or {}).get(COST_KEY) or []
    if not isinstance(rows, list):
        raise ValueError(f"{path}: key 'metrics.{COST_KEY}' must be a list of rows")
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or "label" not in row \
                or not all(_is_number(row.get(key)) for key in COST_NUMBERS):
            raise ValueError(f"{path}: key 'metrics.{COST_KEY}[{index}]' must be an object "
                             f"with a 'label' and numbers {', '.join(COST_NUMBERS)}")
    return rows


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)


def _overlaps(points: Sequence[tuple], drawn: dict) -> tuple:
    """(the first series drawn before that shares a point with ``points``, how
    many points it shares), or (None, 0)."""
    for label, other in drawn.items():
        ys = dict(other)
        shared = sum(1 for x, y in points if x in ys and _same(y, ys[x]))
        if shared:
            return label, shared
    return None, 0


def cost_figure(rows: Sequence[dict], key: str, ylabel: str, log_y: bool,
                title: str = "") -> Figure:
    """``key`` against the GPU count, a line per fabric, a panel per radix.

    A line that coincides with one drawn before it (at one or more GPU
    counts) stays visible: dashed, hollow markers, shifted right by a factor
    `SHIFT` per such line, and its legend entry names the line it equals.
    """
    radices = list(dict.fromkeys(row["radix"] for row in rows))
    labels = list(dict.fromkeys(str(row["label"]) for row in rows))
    figure = Figure(figsize=(5.5 * len(radices), 4.2))
    FigureCanvasAgg(figure)  # render with Agg: no display, no pyplot state
    for index, radix in enumerate(radices):
        axes = figure.add_subplot(1, len(radices), index + 1)
        drawn: dict = {}
        shifted = 0
        for number, label in enumerate(labels):
            points = sorted((row["gpus"], row[key]) for row in rows
                            if row["radix"] == radix and str(row["label"]) == label)
            style = dict(label=label, marker="osD^vx*"[number % 7],
                         linestyle=("-", "--", ":", "-.")[number % 4], markersize=7 - number % 3)
            twin, shared = _overlaps(points, drawn)
            factor = 1.0
            if twin is not None:
                shifted += 1
                factor = SHIFT ** shifted
                where = "" if shared == len(points) else f" at {shared} of {len(points)} points"
                style.update(label=f"{label} (= {twin}{where}, shifted right)", linestyle="--",
                             markerfacecolor="none", markersize=8, linewidth=1.6, zorder=3)
            drawn[label] = points
            axes.plot([p[0] * factor for p in points], [p[1] for p in points], **style)
        axes.set_xscale("log", base=2)
        if log_y:
            axes.set_yscale("log")
        else:
            axes.set_ylim(bottom=0)     # a share or a price per GPU reads from zero
        axes.set_xlabel("GPUs")
        axes.set_ylabel(ylabel)
        axes.set_title(f"radix-{radix} EPS" + (f"; {title}" if title else ""), fontsize=9)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7, loc="best" if log_y else "lower right")
    figure.tight_layout()
    return figure


def plot_cost(rows: Sequence[dict], path: Path, key: str, ylabel: str,
              log_y: bool, title: str = "") -> Path:
    """`cost_figure`, saved as a PNG at ``path``."""
    cost_figure(rows, key, ylabel, log_y, title).savefig(path, dpi=120)
    return path


def write_cost_plots(result: dict, run_dir: Path) -> List[Path]:
    """cost_vs_gpus.png, cost_per_gpu.png and (when the rows hold the share of
    the GPU cost) cost_share_of_gpu.png, when result.json holds cost rows."""
    run_dir = Path(run_dir)
    rows = cost_rows(result, run_dir / RESULT_FILE)
    if not rows:
        return []
    written = [plot_cost(rows, run_dir / COST_VS_GPUS_PNG, "cost_million_usd",
                         "network cost ($M)", log_y=True),
               plot_cost(rows, run_dir / COST_PER_GPU_PNG, "cost_per_gpu_usd",
                         "network cost per GPU ($)", log_y=False)]
    if all(_is_number(row.get(SHARE_KEY)) for row in rows):
        prices = {row["gpu_price_usd"] for row in rows if _is_number(row.get("gpu_price_usd"))}
        title = f"GPU at ${prices.pop():,.0f}" if len(prices) == 1 else ""
        written.append(plot_cost(rows, run_dir / COST_SHARE_PNG, SHARE_KEY,
                                 "network cost / GPU cost (%)", log_y=False, title=title))
    return written


def count_rows(result: dict) -> List[dict]:
    """The fabrics scenario's ``metrics.fabrics`` rows, or [] for any other run."""
    rows = [row for row in (result.get("metrics") or {}).get("fabrics") or []
            if isinstance(row, dict) and "fabric" in row]
    if not any(all(key in row for key in COUNT_KEYS) for row in rows):
        return []
    return rows


def _bar_labels(rows: Sequence[dict], values: Sequence[Optional[float]], digits: int,
                extra: Sequence[str] = ()) -> List[str]:
    labels = []
    for index, (row, value) in enumerate(zip(rows, values)):
        if value is None:
            labels.append("not built" if row.get("note") else "-")
        else:
            labels.append(f"{value:,.{digits}f}" + (extra[index] if extra else ""))
    return labels


def plot_fabric_counts(result: dict, path: Path) -> Optional[Path]:
    """Switches (and OCSes), optical modules and bisection per fabric, one panel each."""
    rows = count_rows(result)
    if not rows:
        return None
    metrics = result.get("metrics") or {}
    names = [str(row["fabric"]) for row in rows]
    figure = new_figure(13.0, 0.42 * len(rows) + 1.8)
    switches_axis, modules_axis, bisection_axis = figure.subplots(1, 3, sharey=True)
    positions = list(range(len(rows)))

    def numbers(key: str, factor: float = 1.0) -> List[Optional[float]]:
        return [float(row[key]) * factor if _is_number(row.get(key)) else None
                for row in rows]

    switches, ocs = numbers("switches"), numbers("ocs")
    plain_switches = [value or 0.0 for value in switches]
    switches_axis.barh(positions, plain_switches, color="tab:blue", label="packet switches")
    ocs_bars = switches_axis.barh(positions, [value or 0.0 for value in ocs],
                                  left=plain_switches, color="tab:orange", label="OCS")
    ocs_text = [f" + {value:,.0f} OCS" if value else "" for value in ocs]
    switches_axis.bar_label(ocs_bars, labels=_bar_labels(rows, switches, 0, ocs_text),
                            fontsize=7, padding=2)
    switches_axis.set_title("switches", fontsize=9)
    switches_axis.legend(fontsize=7, loc="upper right")
    for axis, values, digits, title, color in (
            (modules_axis, numbers("optical_modules"), 0, "optical modules", "tab:green"),
            (bisection_axis, numbers("bisection_gbps", 1e-3), 1, "bisection (Tbit/s)",
             "tab:purple")):
        bars = axis.barh(positions, [value or 0.0 for value in values], color=color)
        axis.bar_label(bars, labels=_bar_labels(rows, values, digits), fontsize=7, padding=2)
        axis.set_title(title, fontsize=9)
    totals = [(s or 0.0) + (o or 0.0) for s, o in zip(switches, ocs)]
    for axis, values in ((switches_axis, totals), (modules_axis, numbers("optical_modules")),
                         (bisection_axis, numbers("bisection_gbps", 1e-3))):
        # Room right of the longest bar for its label.
        axis.set_xlim(0, max([value or 0.0 for value in values] + [1.0]) * 1.35)
        axis.grid(True, axis="x", alpha=0.3)
    switches_axis.set_yticks(positions, names, fontsize=8)
    switches_axis.invert_yaxis()        # the first fabric asked for on top
    scale = ""
    if _is_number(metrics.get("gpus_count")) and _is_number(metrics.get("radix_count")):
        scale = (f" at {metrics['gpus_count']:,} GPUs, radix-{metrics['radix_count']} "
                 f"packet switches")
    figure.suptitle(f"{result.get('scenario', '')}: what each fabric is made of{scale}",
                    fontsize=10)
    figure.savefig(path)
    return path


def write_fabric_plots(result: dict, run_dir: Path) -> List[Path]:
    """Every cost or fabric-count plot this run has data for."""
    run_dir = Path(run_dir)
    written = write_cost_plots(result, run_dir)
    counts = plot_fabric_counts(result, run_dir / FABRIC_COUNTS_PNG)
    return written + ([counts] if counts is not None else [])
