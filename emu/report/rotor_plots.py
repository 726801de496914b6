"""Plots of the `rotor` scenario (TCP over rotating circuits), from result.json.

* ``rotor_duty.png``: each congestion control's goodput as a share of the
  duty-cycle bound, against the duty cycle (the bound is 1 everywhere): how
  much of the lit time TCP uses;
* ``rotor_fold.png``: goodput folded over one slot (time since the slot's
  guard began, binned; share of the link's rate), one line per duty cycle,
  each guard shaded: where in a slot TCP gets going again.

The timeline (``timeline.png``) shows one flow's goodput over a few slots
with the guards shaded.  Each function returns the path written, or None
when the run holds nothing to draw (another scenario).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from matplotlib.figure import Figure

DUTY_PNG, FOLD_PNG = "rotor_duty.png", "rotor_fold.png"


def _rows(result: dict, key: str) -> List[dict]:
    rows = (result.get("metrics") or {}).get(key) or []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def plot_duty(result: dict, path: Path) -> Optional[Path]:
    rows = [r for r in _rows(result, "rotor") if isinstance(r.get("goodput_of_bound"), float)]
    if not rows:
        return None
    figure = Figure(figsize=(6.0, 4.0), dpi=110)
    axis = figure.add_subplot()
    for cc in dict.fromkeys(r["congestion"] for r in rows):
        mine = sorted((r for r in rows if r["congestion"] == cc), key=lambda r: r["duty_cycle"])
        axis.plot([r["duty_cycle"] for r in mine], [r["goodput_of_bound"] for r in mine],
                  marker="o", label=cc)
        for r in mine:
            axis.annotate(f"{r['goodput_mbps']:.1f}", (r["duty_cycle"], r["goodput_of_bound"]),
                          textcoords="offset points", xytext=(4, 4), fontsize=7)
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--",
                 label="duty-cycle bound")
    axis.set_xlabel("duty cycle (lit share of a slot)")
    axis.set_ylabel("goodput / bound (labels: Mbit/s, emulated)")
    axis.set_ylim(0, 1.1)
    axis.set_title("TCP over rotor circuits: goodput against the bound")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_fold(result: dict, path: Path) -> Optional[Path]:
    folds = [f for f in _rows(result, "rotor_fold") if f.get("share_of_link")]
    if not folds:
        return None
    controls = list(dict.fromkeys(f["congestion"] for f in folds))
    figure = Figure(figsize=(6.0, 2.6 * len(controls) + 0.6), dpi=110)
    for index, cc in enumerate(controls):
        axis = figure.add_subplot(len(controls), 1, index + 1)
        for fold in (f for f in folds if f["congestion"] == cc):
            shares = fold["share_of_link"]
            bins = len(shares)
            phases = [(i + 0.5) / bins for i in range(bins)]
            line, = axis.step(phases, shares, where="mid", label=f"duty {fold['duty_cycle']:g}")
            axis.axvspan(0, 1 - fold["duty_cycle"], color=line.get_color(), alpha=0.12)
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1.05)
        axis.set_ylabel("share of link rate")
        axis.set_title(f"{cc}: goodput within a slot (guards shaded)", fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower right")
    axis.set_xlabel("time since the slot began (share of the slot), at the receiver")
    figure.tight_layout()
    figure.savefig(path)
    return path


def write_rotor_plots(result: dict, run_dir: Path) -> List[Path]:
    run_dir = Path(run_dir)
    written = [plot_duty(result, run_dir / DUTY_PNG), plot_fold(result, run_dir / FOLD_PNG)]
    return [p for p in written if p is not None]
