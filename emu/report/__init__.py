"""Turn a run's results folder into ``report.md``, ``report.html`` and PNG plots.

The emulation only writes raw results; this package reads them back, so a
report can be regenerated (or improved) without running anything again::

    python -m emu.report results/<run>

Input: the run folder's ``result.json`` and, when present, ``flows.csv`` and
the ``load.csv`` files (formats in ``emu.report.load``; metric units in
``emu.report.units``).

Output, in the run folder: the plots the run has data for, ``report.md``
and ``report.html``.  ``write_report`` returns their paths, report.md first,
then the plots, report.html last.  The modules, one concern each:

* ``load``: read and check result.json, flows.csv and load.csv;
* ``units``: metric-key unit suffixes, values printed emulated and real;
* ``plots``: timeline.png and steps.png (every emulated run);
* ``rl_plots``, ``pd_plots``: the RL and P/D inference comparisons;
* ``fabric_plots``: the cost and fabrics calculations;
* ``load_heatmap``: load_heatmap.png, each link's load over time (load.csv);
* ``markdown``: the sections of report.md;
* ``html``: report.md as one self-contained page (markdown-it-py);
* ``writer``: ``write_report``, all of the above for one run folder;
* ``cli``: the command line (``python -m emu.report``).

Reports are written from a results folder alone: nothing here imports the
experiments, the runner or the live testbed.
"""

from __future__ import annotations

from emu.report.cli import main
from emu.report.html import HTML_FILE, render_html, write_html
from emu.report.load import (FLOW_COLUMNS, FLOWS_FILE, RESULT_FILE, FlowRow, load_flows,
                             load_result, scale_of)
from emu.report.markdown import REPORT_FILE, render_markdown
from emu.report.units import MetricUnit, metric_unit
from emu.report.writer import write_plots, write_report

__all__ = ["FLOW_COLUMNS", "FLOWS_FILE", "HTML_FILE", "REPORT_FILE", "RESULT_FILE",
           "FlowRow", "MetricUnit", "load_flows", "load_result", "main", "metric_unit",
           "render_html", "render_markdown", "scale_of", "write_html", "write_plots",
           "write_report"]
