"""The web view's page: Bokeh models fed from `emu.view.state` snapshots.

One document per browser session, built in Python; BokehJS draws it from the
packages installed in the virtual environment (nothing is fetched from the
internet).  The page is glue: networkx places the nodes (`emu.view.state`),
Bokeh's graph renderer draws them and colours links through a colour mapper,
its tables list the circuits and the requests, and a periodic callback
(every 250 ms) pushes the latest snapshot to the browser.  A replay adds a
time slider and a play button instead of following the clock::

    +-------------------------------------------------------------+
    | fabric name, counts, data plane, scale, clock               |
    +------------------------------------+------------------------+
    |  core / OCS        o   o   o       | circuits (lit, dark,   |
    |  aggregation     o   o   o   o     |   about to light)      |
    |  ToRs          o   o   o   o   o   | recent circuit events  |
    |  hosts        ..................   | phase / P-D requests   |
    |  (links coloured by load)          | credits per decode GPU |
    +------------------------------------+ warnings               |
    | slider (replay only)               |                        |
    +------------------------------------+------------------------+

Model names (``name=``) are the page's interface to its tests: a browser
test reads ``Bokeh.documents[0].get_model_by_name("circuits").data``.
"""

from __future__ import annotations

import html
import time
from typing import Callable, Optional

import networkx as nx
from bokeh.core.validation import silence
from bokeh.core.validation.warnings import MISSING_RENDERERS
from bokeh.layouts import column, row
from bokeh.models import (ColorBar, ColumnDataSource, DataTable, Div, EdgesAndLinkedNodes,
                          FactorRange, HoverTool, LinearColorMapper, NodesOnly, Range1d,
                          Slider, TableColumn, Toggle)
from bokeh.palettes import Inferno256
from bokeh.plotting import figure, from_networkx

# The fabric's plot has no renderer until the first testbed event draws one.
silence(MISSING_RENDERERS, True)

REFRESH_MS = 250
LOAD_PALETTE = tuple(reversed(Inferno256[40:]))  # pale = idle, dark = full
KIND_COLOR = {"host": "#4c72b0", "eps": "#55a868", "ocs": "#c44e52"}
CIRCUIT_COLOR = {"lit": None, "dark": "#d62728", "lighting": "#ff7f0e", "idle": "#bbbbbb"}


class FabricPage:
    """The models of one page and how a snapshot updates them."""

    def __init__(self, snapshot: Callable[[Optional[float]], dict], replay_span=None):
        self.snapshot = snapshot
        self.replay_span = replay_span
        self._fabric_key = None
        self.header = Div(name="header", sizing_mode="stretch_width")
        self.plot = figure(name="fabric", height=520, sizing_mode="stretch_width",
                           tools="pan,wheel_zoom,reset,save", toolbar_location="above",
                           x_range=Range1d(-1.15, 1.15), y_range=Range1d(-1.15, 1.15))
        self.plot.axis.visible = False
        self.plot.grid.visible = False
        self.mapper = LinearColorMapper(palette=LOAD_PALETTE, low=0.0, high=1.0)
        self.legend = Div(name="legend")
        self.plot.add_layout(ColorBar(color_mapper=self.mapper, title="load, share of link rate",
                                      width=12), "right")
        self.circuits = ColumnDataSource(name="circuits", data=_empty_circuits())
        self.circuit_table = DataTable(source=self.circuits, height=180, index_position=None,
                                       sizing_mode="stretch_width", columns=[
                                           TableColumn(field="ocs", title="OCS", width=35),
                                           TableColumn(field="ports", title="ports", width=40),
                                           TableColumn(field="ends", title="joins", width=70),
                                           TableColumn(field="state", title="state", width=85),
                                           TableColumn(field="preset", title="preset", width=60),
                                           TableColumn(field="note", title="", width=290)])
        self.links = ColumnDataSource(name="links", data={})
        self.recent = Div(name="recent", sizing_mode="stretch_width")
        self.activity = Div(name="activity", sizing_mode="stretch_width")
        self.credits = ColumnDataSource(name="credits", data={"d": [], "used": [], "total": [],
                                                              "streams": []})
        self.credit_plot = figure(name="credit_plot", height=180, sizing_mode="stretch_width",
                                  x_range=FactorRange(), title="KV streams and credits per decode GPU",
                                  toolbar_location=None)
        self.credit_plot.vbar(x="d", top="total", width=0.8, source=self.credits,
                              fill_alpha=0.15, line_color="#777777", legend_label="credits")
        self.credit_plot.vbar(x="d", top="used", width=0.5, source=self.credits,
                              color="#4c72b0", legend_label="in use")
        self.credit_plot.scatter(x="d", y="streams", size=9, marker="diamond", color="#dd8452",
                                 source=self.credits, legend_label="KV streams")
        self.credit_plot.legend.location = "top_left"
        self.credit_plot.visible = False
        self.warnings = Div(name="warnings", sizing_mode="stretch_width")
        self.slider = None
        self.play = None
        self.circuit_title = Div(text="<b>Circuits</b>")
        side = column(self.circuit_title, self.circuit_table, self.recent,
                      self.activity, self.credit_plot, self.warnings, width=600)
        main = column(self.plot, self.legend, sizing_mode="stretch_width")
        if replay_span is not None:
            start, end = replay_span
            self.slider = Slider(name="time", start=0.0, end=max(end - start, 0.1), step=0.05,
                                 value=0.0, title="seconds since the run's first event",
                                 sizing_mode="stretch_width")
            self.play = Toggle(label="play", button_type="success", width=80)
            main = column(self.plot, self.legend, row(self.play, self.slider,
                                                      sizing_mode="stretch_width"),
                          sizing_mode="stretch_width")
        self.layout = column(self.header, row(main, side, sizing_mode="stretch_width"),
                             sizing_mode="stretch_width")

    # ------------------------------------------------------------ updates
    def moment(self) -> Optional[float]:
        """The time to show: now (live) or the slider's (replay)."""
        if self.slider is None:
            return time.time()
        return self.replay_span[0] + self.slider.value

    def refresh(self) -> None:
        self.show(self.snapshot(self.moment()))

    def tick(self) -> None:
        """The periodic callback: a playing replay moves its slider on."""
        if self.play is not None and self.play.active:
            step = REFRESH_MS / 1000.0
            self.slider.value = min(self.slider.end, self.slider.value + step)
            if self.slider.value >= self.slider.end:
                self.play.active = False
        self.refresh()

    def show(self, snap: dict) -> None:
        testbed = snap["testbed"]
        self.header.text = _header(snap)
        if testbed is None:
            self.legend.text = ""
        else:
            key = (testbed["label"], testbed["fabric"], len(snap["nodes"]))
            if key != self._fabric_key:
                self._draw_fabric(snap)
                self._fabric_key = key
            self.links.data = _link_columns(snap["links"])   # colours and widths by load
            self.legend.text = _legend(testbed)
        self.circuits.data = _circuit_columns(snap["circuits"])
        has_ocs = testbed is None or testbed["counts"]["ocs"] > 0
        self.circuit_table.visible = has_ocs
        self.circuit_title.text = "<b>Circuits</b>" if has_ocs else \
            "<b>Circuits</b>: none, this fabric has no OCS"
        self.recent.text = _recent(snap["recent"])
        self.activity.text = _activity(snap)
        credit_rows = snap["credits"]
        self.credit_plot.visible = bool(credit_rows)
        if credit_rows:
            names = [r["d"] for r in credit_rows]
            if list(self.credit_plot.x_range.factors) != names:
                self.credit_plot.x_range.factors = names
            self.credits.data = {"d": names, "used": [r["used"] for r in credit_rows],
                                 "total": [r["total"] or 0 for r in credit_rows],
                                 "streams": [r["streams"] for r in credit_rows]}
        self.warnings.text = _warnings(snap["warnings"])

    def _draw_fabric(self, snap: dict) -> None:
        graph = nx.Graph()
        for node in snap["nodes"]:
            graph.add_node(node["name"], kind=node["kind"], role=node["role"],
                           tier=node["tier"], color=KIND_COLOR.get(node["kind"], "#999999"),
                           size=7 if node["kind"] == "host" else 13)
        for link in snap["links"]:
            graph.add_edge(link["a"], link["b"])
        positions = {node["name"]: (node["x"], node["y"]) for node in snap["nodes"]}
        for axis, bounds in ((self.plot.x_range, [p[0] for p in positions.values()]),
                             (self.plot.y_range, [p[1] for p in positions.values()])):
            low, high = (min(bounds), max(bounds)) if bounds else (-1.0, 1.0)
            pad = max(0.08, 0.08 * (high - low))
            axis.start, axis.end = low - pad, high + pad
        renderer = from_networkx(graph, positions)
        renderer.name = "graph"
        renderer.node_renderer.glyph.update(size="size", fill_color="color",
                                            line_color="white")
        renderer.edge_renderer.data_source = self.links     # filled by show()
        renderer.edge_renderer.glyph.update(line_color="color", line_width="width",
                                            line_alpha=0.9)
        renderer.inspection_policy = EdgesAndLinkedNodes()
        renderer.selection_policy = NodesOnly()
        self.plot.renderers = [renderer]
        self.plot.tools = [t for t in self.plot.tools if not isinstance(t, HoverTool)]
        self.plot.add_tools(
            HoverTool(renderers=[renderer.edge_renderer], tooltips=[
                ("link", "@label"), ("load", "@load_text"), ("circuit", "@circuit")]),
            HoverTool(renderers=[renderer.node_renderer], tooltips=[
                ("node", "@index"), ("role", "@role"), ("tier", "@tier")]))


# ------------------------------------------------------------ glue: snapshot -> columns, text
# Parallel links (two uplinks to one OCS) are drawn on one line: the later
# drawn shows, so the changing circuits go on top, then the busiest links.
DRAW_ORDER = {"idle": 0, None: 1, "": 1, "lit": 1, "lighting": 2, "dark": 3}


def _link_columns(links) -> dict:
    columns = {"start": [], "end": [], "label": [], "util": [], "mbps": [], "width": [],
               "color": [], "load_text": [], "circuit": []}
    links = sorted(links, key=lambda link: (DRAW_ORDER.get(link.get("circuit"), 1),
                                            link["util"]))
    for link in links:
        columns["start"].append(link["a"])
        columns["end"].append(link["b"])
        columns["label"].append(f"{link['a']}:{link['a_port']} - {link['b']}:{link['b_port']}")
        state = link.get("circuit") or ""
        columns["util"].append(link["util"])
        # A dark, lighting or idle OCS link carries nothing: its colour says which.
        columns["color"].append(CIRCUIT_COLOR.get(state) or _load_color(link["util"]))
        columns["mbps"].append(link["mbps"])
        columns["width"].append(1.5 + 5.0 * min(1.0, link["util"]))
        columns["load_text"].append(
            f"{link['mbps_ab']:.2f} Mbit/s {link['a']}->{link['b']}, "
            f"{link['mbps_ba']:.2f} back (of {link['capacity_mbps']:.1f}); "
            f"{link['real_gbps_now']:.1f} Gbit/s real")
        columns["circuit"].append(state or "-")
    return columns


def _load_color(util: float) -> str:
    """The colour bar's colour for a load (the same palette, 0 to 1)."""
    index = int(max(0.0, min(1.0, util)) * (len(LOAD_PALETTE) - 1))
    return LOAD_PALETTE[index]


def _empty_circuits() -> dict:
    return {key: [] for key in ("ocs", "ports", "ends", "state", "preset", "note",
                                "remaining_s")}


def _circuit_columns(rows) -> dict:
    return {"ocs": [r["ocs"] for r in rows], "ports": [f"{r['a']}-{r['b']}" for r in rows],
            "ends": [r["ends"] for r in rows], "state": [r["state"] for r in rows],
            "preset": [r.get("technology") or "" for r in rows],
            "note": [r["note"] for r in rows],
            "remaining_s": [-1.0 if r["remaining_s"] is None else r["remaining_s"]
                            for r in rows]}


def _header(snap: dict) -> str:
    testbed = snap["testbed"]
    clock = f"{snap['elapsed_s']:.1f} s since the first event; {snap['status']}"
    cpu = snap.get("cpu")
    if cpu and cpu.get("machine_pct") is not None:
        clock += f"; machine CPU {cpu['machine_pct']:.0f} %"
        if cpu.get("softirq_pct") is not None:
            clock += f" (forwarding in softirq {cpu['softirq_pct']:.0f} %)"
    if testbed is None:
        return f"<h3>waiting for a testbed</h3><p>{clock}</p>"
    schedule = snap.get("schedule")
    if schedule:
        clock += f"; schedule running on {html.escape(schedule['text'])}"
    counts = testbed["counts"]
    label = f" ({html.escape(testbed['label'])})" if testbed["label"] else ""
    return (f"<h3 style='margin:4px 0'>{html.escape(testbed['fabric'])}{label}</h3>"
            f"<p style='margin:2px 0'>{counts['host']} hosts, {counts['eps']} packet switches, "
            f"{counts['ocs']} OCS; data plane {html.escape(testbed['dataplane'] or '?')}; "
            f"time dilation x{testbed['scale']['tdf']:g}; {clock}</p>")


def _legend(testbed: dict) -> str:
    mbps, gbps = testbed["link_mbps"], testbed["link_real_gbps"]
    swatches = " ".join(f"<span style='color:{color}'>&#9632;</span> {name}"
                        for name, color in (("dark circuit", CIRCUIT_COLOR["dark"]),
                                            ("about to light", CIRCUIT_COLOR["lighting"]),
                                            ("idle OCS port", CIRCUIT_COLOR["idle"])))
    return (f"<p style='margin:2px 0'>Link colour: load as a share of the link's rate; "
            f"a full link is {mbps:g} Mbit/s emulated = {gbps:g} Gbit/s in the real fabric "
            f"(bandwidth x{testbed['scale']['bw_factor']:g}). OCS links without a lit "
            f"circuit are uncoloured; see the circuits table ({swatches}).</p>")


def _recent(rows) -> str:
    if not rows:
        return ""
    items = "".join(f"<li>{row['age_s']:.1f} s ago: {html.escape(row['text'])}</li>"
                    for row in rows[:8])
    return f"<b>Recent changes</b><ul style='margin:2px 0'>{items}</ul>"


def _activity(snap: dict) -> str:
    parts = []
    running = snap.get("phases") or []
    if not running and snap["phase"] is not None:
        parts.append(f"<p style='margin:2px 0'>iteration {snap['phase'].get('iteration')}, "
                     "between phases</p>")
    for phase in running:
        text = (f"phase <b>{html.escape(str(phase['name']))}</b>, iteration "
                f"{phase.get('iteration')}")
        if phase.get("flows") is not None:
            text += f", {phase['flows']} flows"
        template = phase.get("template")
        text += f"; proxy template: {html.escape(str(template)) if template else 'none'}"
        if phase.get("circuits"):
            text += "; circuits " + html.escape(
                "; ".join(f"{o}: {_pairs(c)}" for o, c in phase["circuits"].items()))
        parts.append(f"<p style='margin:2px 0'>{text}</p>")
    requests = snap["requests"]
    if requests["in_flight"] or requests["done"] or requests["failed"]:
        shown = requests["in_flight"][:10]
        items = "".join(
            f"<li>request {html.escape(r['id'])}: {html.escape(r['state'])}, "
            f"{html.escape(str(r['p']))} -> {html.escape(str(r['d']))}, "
            f"{r['streams']} KV stream(s)</li>" for r in shown)
        more = len(requests["in_flight"]) - len(shown)
        parts.append(f"<b>P/D requests</b>: {len(requests['in_flight'])} in flight, "
                     f"{requests['done']} done, {requests['failed']} failed"
                     f"<ul style='margin:2px 0'>{items}</ul>" + (f"and {more} more" if more > 0 else ""))
    return "".join(parts)


def _pairs(circuits) -> str:
    return ", ".join(f"{a}-{b}" for a, b in circuits) or "none"


def _warnings(warnings) -> str:
    if not warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    return f"<b style='color:#c44e52'>Fidelity warnings</b><ul style='margin:2px 0'>{items}</ul>"
