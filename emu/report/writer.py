"""Write a run folder's plots, ``report.md`` and ``report.html``, in that order.

The plots (and the link-load heat maps, ``emu.report.load_heatmap``) come
first because report.md names them (so report.html inlines them), and
report.html last because it is rendered from report.md.

`load_result` checks what every report reads; the sections of one kind of run
read deeper into ``metrics`` on their own.  A value there of a type a section
does not expect (a hand-edited or damaged result.json) is refused with a
ValueError naming the file and the section (`ResultUnreadable`), not raised
from inside matplotlib.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

from emu.report.fabric_plots import write_fabric_plots
from emu.report.html import write_html
from emu.report.load import RESULT_FILE, load_flows, load_result, scale_of
from emu.report.load_heatmap import write_load_heatmaps
from emu.report.markdown import REPORT_FILE, render_markdown
from emu.report.orchestrrl_plots import write_orchestrrl_plots
from emu.report.pd_plots import write_pd_plots
from emu.report.plots import STEPS_PNG, TIMELINE_PNG, plot_steps, plot_timeline
from emu.report.rl_plots import write_rl_plots
from emu.report.rotor_plots import write_rotor_plots
from emu.report.scale_plots import write_scale_plots
from traffic.scale import Scale


def write_plots(result: dict, run_dir: Path, scale: Scale) -> List[Path]:
    """Every plot the run has data for, written into ``run_dir``; their paths."""
    run_dir = Path(run_dir)
    # A calculation (cost, fabrics, pd-calc) has no timeline to draw.
    plots = [plot_timeline(result, run_dir / TIMELINE_PNG, scale)] \
        if result.get("timeline") or result.get("fabric") else []
    if result.get("steps"):
        plots.append(plot_steps(result, run_dir / STEPS_PNG, scale))
    plots += write_rl_plots(result, run_dir)
    plots += write_pd_plots(result, run_dir)
    plots += write_fabric_plots(result, run_dir)
    plots += write_scale_plots(result, run_dir)
    plots += write_rotor_plots(result, run_dir)
    plots += write_orchestrrl_plots(result, run_dir)
    return plots


def write_report(run_dir) -> List[Path]:
    """Write the plots, report.md and report.html into ``run_dir``.

    Returns their paths, report.md first, then the plots and the link-load
    heat maps, report.html last.
    """
    run_dir = Path(run_dir)
    result = load_result(run_dir)
    scale = scale_of(result, run_dir / RESULT_FILE)
    flows = load_flows(run_dir)
    with _reading(run_dir, "the plots"):
        plots = write_plots(result, run_dir, scale)
    # Drawn apart from the plots: report.md gives them a section of their own.
    with _reading(run_dir, "the link-load heat maps"):
        load_maps = write_load_heatmaps(result, run_dir, scale)
    report = run_dir / REPORT_FILE
    with _reading(run_dir, "report.md"):
        text = render_markdown(result, flows, scale, run_dir, plots, load_maps)
    report.write_text(text, encoding="utf-8")
    heat_maps = [entry.png for entry in load_maps if entry.png is not None]
    return [report] + plots + heat_maps + [write_html(run_dir)]


class ResultUnreadable(ValueError):
    """A section of the report cannot be drawn from what the run folder holds."""


@contextmanager
def _reading(run_dir: Path, section: str) -> Iterator[None]:
    """Turn the errors a value of the wrong type raises deep in a section into
    one that names the file and the section (see the module's docstring)."""
    try:
        yield
    except (TypeError, KeyError, IndexError, ValueError, AttributeError,
            ArithmeticError) as error:
        raise ResultUnreadable(f"{run_dir / RESULT_FILE}: {section} cannot be drawn from it "
                               f"({type(error).__name__}: {error})") from None
