"""The text of ``report.md``: what was run, what may invalidate it, then the figures.

Input: a checked ``result.json`` (``emu.report.load``), the rows of
``flows.csv`` (or None), the run's ``Scale``, the run folder and the plots
already written into it.  Output: Markdown (CommonMark with GFM tables),
in this order:

* ``# Run report: <scenario>``, the description;
* ``## What was run``: scenario, fabric, scale, data plane, TCP and versions;
* ``## Fidelity warnings (N)``, CPU use and the flows that had their links
  to themselves;
* ``## Headline metrics``: scalars and lists with their units, emulated and
  real (``emu.report.units``), then one table per list-of-rows metric;
* ``## Reading the figures`` (``metrics.notes``), ``## Steps``, ``## Plots``
  (every plot as an image, so report.html inlines it; no section without
  plots), ``## Link load over time`` (the heat map of each load.csv,
  ``emu.report.load_heatmap``; no section without one), ``## Web view``
  (how to replay the run, and its screenshot if one was saved), ``## Flows`` and
  ``## Files`` (captures and other files, linked relative to the run folder);
* ``## Resolved configuration``: the scenario as run, as a JSON code block.
  It comes last because it is long and read only to rerun or compare a run.

The report writes no HTML.  Values that come from result.json, flows.csv
and file names are text, and none can start a Markdown block of its own:
each is written on one line (``units.plain`` flattens line breaks and escapes
``|``), and a description or note, the only values that start a line, has
its leading punctuation escaped (``_paragraph``).  So no value can open a
code fence, a heading or a quote that would swallow the rest of the report.
"""

from __future__ import annotations

import json
import statistics
import string
import urllib.parse
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from emu.report.html import CONFIG_SECTION, HTML_FILE, MARKDOWN_FILE
from emu.report.load import FLOWS_FILE, RESULT_FILE, FlowRow
from emu.report.load_heatmap import ACTIVE_SHARE, MAX_LINKS, LoadMap
from emu.report.plots import STEPS_PNG
from emu.report.units import (SCALED_KINDS, both_units, column_header, is_identity,
                              metric_unit, plain, value_list)
from traffic.scale import Scale, format_quantity

REPORT_FILE = MARKDOWN_FILE
LOAD_SECTION = "Link load over time"
WEB_SECTION = "Web view"
WEB_SCREENSHOT = "web-view.png"
EVENTS_FILE = "events.jsonl"     # emu.live.feed's, read here by name only
CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".pcap.gz", ".pcapng.gz", ".cap")
# The metric an experiment explains its figures in: prose, not a value.
NOTES_KEY = "notes"
# Rows shown in a table before the rest is left to result.json / flows.csv.
MAX_TABLE_ROWS = 40


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


def _link(path: str) -> str:
    return urllib.parse.quote(path)


def _paragraph(value: Any) -> str:
    """A value from result.json as one line of prose that starts no Markdown block.

    Line breaks are flattened, and leading punctuation (a backtick fence,
    ``#``, ``>``, ``-``, ``[`` ...) is backslash-escaped: a fence opened by a
    description would otherwise run on over the sections below it.
    """
    text = plain(value).strip()
    if text[:1] in string.punctuation and text[:1] != "\\":
        return "\\" + text
    return text


def _warnings(result: dict) -> List[str]:
    seen = []
    for text in list(result.get("warnings") or []) + \
            list((result.get("fidelity") or {}).get("warnings") or []):
        if text not in seen:
            seen.append(text)
    return seen


def _seconds(value: float, scale: Scale) -> str:
    """An emulated duration, with its real twin only when the two differ.

    A calculation (cost, fabrics, pd-calc) records no scale: its durations
    are plain wall-clock seconds, and "1 s emulated (1 s real)" would say
    there was an emulation.
    """
    return format_quantity(value, "s") if is_identity(scale) else scale.format_seconds(value)


def _run_section(result: dict, scale: Scale) -> List[str]:
    fabric = result.get("fabric") or {}
    versions = result.get("versions") or {}
    datapath = result.get("datapath")
    datapath_text = {"netdev": "Open vSwitch, userspace (netdev) datapath",
                     "system": "Open vSwitch, kernel (system) datapath"}.get(
        datapath, plain(datapath) if datapath else "")
    if result.get("dataplane") == "linux":
        datapath_text = "Linux: kernel routers and tc patch panels"
    if result.get("dataplane_reason"):
        datapath_text += f" ({plain(result['dataplane_reason'])})"
    rows = [("Scenario", f"`{plain(result['scenario'])}`")]
    if result.get("started"):
        rows.append(("Started", plain(result["started"])))
    if isinstance(result.get("duration_s"), (int, float)):
        rows.append(("Duration", _seconds(result["duration_s"], scale)))
    if fabric:
        parts = [f"`{plain(fabric['spec'])}`" if fabric.get("spec") else "unnamed"]
        counts = [f"{plain(fabric[k])} {k}" for k in ("hosts", "switches", "ocs")
                  if fabric.get(k) is not None]
        if counts:
            parts.append(", ".join(counts))
        link = fabric.get("link_mbps")
        if isinstance(link, (int, float)):
            parts.append(f"links {scale.format_rate(link)}")
        rows.append(("Fabric", "; ".join(parts)))
        rows.append(("Scale", scale.describe()))
        if result.get("mode") == "model":
            cal = (result.get("model") or {}).get("calibration") or {}
            rows.append(("Engine", "the flow-level model (`traffic.model`): max-min fair "
                         "rates on the same fabric and flows, no packets; calibration "
                         f"{plain(cal.get('measured') or 'not recorded')} (TCP share "
                         f"{plain(cal.get('efficiency'), 3)}, flow set-up "
                         f"{plain(cal.get('startup_s'), 3)} s, per hop "
                         f"{plain(cal.get('hop_latency_s'), 3)} s at "
                         f"{plain(cal.get('link_mbps'), 3)} Mbit/s)"))
        else:
            rows.append(("Data plane", datapath_text or "not recorded"))
        if result.get("congestion_control"):
            rows.append(("TCP congestion control", plain(result["congestion_control"])))
        if "ecmp_seed" in result:
            rows.append(("ECMP seed", _ecmp_text(result["ecmp_seed"])))
    else:
        rows.append(("Fabric", "none: this scenario builds no network (a calculation)"))
    if versions:
        rows.append(("Versions", ", ".join(f"{plain(name)} {plain(version)}"
                                           for name, version in sorted(versions.items()))))
    lines = ["## What was run", ""]
    lines += _table(("", ""), [(f"**{name}**", value) for name, value in rows])
    return lines


def _fidelity_section(result: dict) -> List[str]:
    warnings = _warnings(result)
    fidelity = result.get("fidelity") or {}
    lines = [f"## Fidelity warnings ({len(warnings)})", ""]
    if warnings:
        lines += ["**These results may describe the emulator rather than the "
                  "fabric:**", ""]
        for text in warnings:
            lines += [f"> **WARNING:** {plain(text)}", ""]
        lines.pop()
    elif fidelity:
        lines.append("None: no flow that had its links to itself fell short of "
                     "its configured rate, and the CPU did not saturate.")
    elif result.get("mode") == "model":
        lines.append("None apply: this run is the flow-level model, not an emulation; "
                     "its figures are computed, so nothing on this machine could "
                     "saturate them.")
    else:
        lines.append("No fidelity check was recorded for this run.")
    cpu = fidelity.get("cpu") or {}
    if cpu:
        machine = cpu.get("machine_cpu_pct") or {}
        rows = [("machine (% of all cores)", plain(machine.get("mean"), 3),
                 plain(machine.get("max"), 3))]
        softirq = cpu.get("softirq_pct") or {}
        if softirq.get("max") is not None:
            rows.append(("softirq: kernel forwarding (% of all cores)",
                         plain(softirq.get("mean"), 3), plain(softirq.get("max"), 3)))
        for name, stats in sorted((cpu.get("processes") or {}).items()):
            rows.append((f"{plain(name)} (% of one core)",
                         plain(stats.get("mean_pct_of_core"), 3),
                         plain(stats.get("max_pct_of_core"), 3)))
        lines += ["", f"CPU use over {plain(cpu.get('samples', '?'))} samples of "
                      f"{plain(cpu.get('interval_s'))} s on {plain(cpu.get('cores', '?'))} "
                      f"cores:", ""]
        lines += _table(("what", "mean (%)", "max (%)"), rows)
    drops = fidelity.get("drops") or {}
    if drops:
        lines += ["", "Packets lost while the testbed ran: at the emulated links' queues "
                      "(congestion, the fabric's own behaviour), and anywhere else (the "
                      "emulator ran short):", ""]
        lines += _table(("where", "packets"), [
            ("emulated link queues (congestion)", plain(drops.get("queue_drops"))),
            ("veth receive backlog", plain(drops.get("veth_drops"))),
            ("CPU backlog (softnet)", plain(drops.get("softnet_drops"))),
            ("softirq out of budget (time squeezes, events)",
             plain(drops.get("time_squeezes"))),
            ("ovs-vswitchd send failures (at least)", plain(drops.get("vswitchd_hidden"))),
            ("links taken down, as they failed (the failure's own loss)",
             plain(drops.get("failed_link_drops", 0)))])
    alone = fidelity.get("alone_flows") or []
    if alone:
        lines += ["", f"Flows that had their links to themselves "
                      f"({len(alone)} of {plain(fidelity.get('flows_checked', '?'))} "
                      f"checked):",
                  ""]
        lines += _table(("flow", "goodput (Mbit/s)", "cap (Mbit/s)", "ratio", "ok",
                         "not held to its rate"),
                        [(plain(row.get("id")), plain(row.get("goodput_mbps")),
                          plain(row.get("cap_mbps")), plain(row.get("ratio"), 3),
                          plain(row.get("ok")), plain(row.get("not_held")))
                         for row in alone[:MAX_TABLE_ROWS]])
        if len(alone) > MAX_TABLE_ROWS:
            lines.append(f"\n... {len(alone) - MAX_TABLE_ROWS} more in {RESULT_FILE}.")
    return lines + _shared_links_lines(fidelity)


def _ecmp_text(seed) -> str:
    if seed == 0:
        return "0: flows' ports and the routers' hash key were the kernel's (random per run)"
    return (f"{plain(seed)}: every flow's ports (and the kernel routers' hash key) were "
            "drawn from it, so each flow takes the same equal-cost path in every run of "
            "this seed; another seed draws others")


def _shared_links_lines(fidelity: dict) -> List[str]:
    """Links two flows met on (flow-hashed multipath): the fabric's behaviour."""
    known = fidelity.get("paths_known_count")
    if not known:
        return []
    shared = fidelity.get("shared_links") or []
    lines = ["", f"The data plane told the path of {plain(known)} flows (its own "
                 f"multipath hash of each flow's ports). "]
    if not shared:
        lines[-1] += "No two of them crossed one link at the same time."
        return lines
    lines[-1] += (f"{plain(fidelity.get('flows_sharing_a_link_count'))} of them shared a "
                  f"link with another flow while both ran, which slows both: the "
                  f"fabric's ECMP at work, not an emulator error.")
    lines.append("")
    lines += _table(("link (direction)", "flows", "time shared (s)"),
                    [(plain(row.get("link")), plain(", ".join(row.get("flows") or [])),
                      plain(row.get("overlap_s"), 3)) for row in shared[:MAX_TABLE_ROWS]])
    if len(shared) > MAX_TABLE_ROWS:
        lines.append(f"\n... {len(shared) - MAX_TABLE_ROWS} more in {RESULT_FILE}.")
    return lines


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
    identity = is_identity(scale)
    if scalars:
        rows = []
        for key, value in scalars:
            unit = metric_unit(key)
            if isinstance(value, list):
                emulated, real = value_list(value, unit, scale)
            else:
                emulated, real = both_units(value, unit, scale)
            # A key that says "real" has a real value only: no emulated twin.
            rows.append((f"`{plain(key)}`", emulated or real) if identity
                        else (f"`{plain(key)}`", emulated or "-", real or "-"))
        header = ("metric", "value") if identity else \
            ("metric", "emulated", "real-world equivalent")
        lines += _table(header, rows)
    else:
        lines.append("No scalar metrics recorded.")
    real_columns = False
    for key, rows in tables:
        columns: List[str] = []
        for row in rows:
            columns += [column for column in row if column not in columns]
        real_columns = real_columns or any(
            metric_unit(c).is_real and metric_unit(c).kind in SCALED_KINDS for c in columns)
        lines += ["", f"### {plain(key)}", ""]
        lines += _table([plain(column_header(c)) for c in columns],
                        [[plain(row.get(c)) for c in columns] for row in rows[:MAX_TABLE_ROWS]])
        if len(rows) > MAX_TABLE_ROWS:
            lines.append(f"\n... {len(rows) - MAX_TABLE_ROWS} more rows in "
                         f"{RESULT_FILE}.")
    if not identity and tables:
        marked = ", except in columns marked real" if real_columns else ""
        lines += ["", f"Table values are emulated{marked}; divide times by the tdf "
                      f"({scale.tdf:g}) and rates by the bandwidth factor "
                      f"({scale.bw_factor:g}) for real-world ones."]
    return lines


def _notes_section(result: dict) -> List[str]:
    """An experiment's own explanation of its figures (``metrics.notes``)."""
    notes = (result.get("metrics") or {}).get(NOTES_KEY) or []
    if not isinstance(notes, list) or not notes:
        return []
    return ["## Reading the figures", ""] + [f"- {_paragraph(note)}" for note in notes] + [""]


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
    identity = is_identity(scale)
    statuses: Dict[str, int] = {}
    for flow in flows:
        statuses[flow.status or "?"] = statuses.get(flow.status or "?", 0) + 1
    total_bytes = sum(flow.bytes or 0 for flow in flows)
    starts = [f.start_s for f in flows if f.start_s is not None]
    ends = [f.end_s for f in flows if f.end_s is not None]
    retransmits = sum(flow.retransmits or 0 for flow in flows)
    status_text = ", ".join(f"{count} {plain(status)}" for status, count
                            in sorted(statuses.items()))
    lines.append(f"- **{len(flows)} flows**: {status_text}")
    lines.append("- **Flow sizes, summed**: " + (format_quantity(total_bytes, "B")
                 if identity else scale.format_bytes(total_bytes)))
    if starts and ends:
        span = max(ends) - min(starts)
        lines.append("- **First start to last end**: " + _seconds(span, scale))
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
                    [(plain(f.id), plain(f"{f.src} -> {f.dst}"), plain(f.bytes),
                      plain(f.start_s), plain(f.duration_s),
                      plain(f.goodput_mbps), plain(f.retransmits),
                      plain(f.status)) for f in shown])
    return lines


def _plots_section(plots: List[Path]) -> List[str]:
    if not plots:
        return []           # a calculation may draw none: no empty section
    lines = ["## Plots", ""]
    for plot in plots:
        name = plot.name
        lines += [f"![{name}]({_link(name)})", ""]
    return lines[:-1]


def _load_section(load_maps: Sequence[LoadMap], run_dir: Path) -> List[str]:
    """The heat map of each load.csv, or why there is none; [] without a load.csv."""
    if not load_maps:
        return []
    lines = [f"## {LOAD_SECTION}", "",
             "Where the fabric was busy, and when: one row per direction of a link "
             "(`node:port->peer`, what that end sent toward its peer: a switch's side, "
             "or a host's side of its link, `h1:1->s1`), one column per sampling "
             "interval. The rates come from the switches' port counters, sampled every "
             "0.5 s while the testbed ran: a switch's side by the bytes its port sent, a "
             "host's side by the bytes the switch port it sends into received; the rows "
             "are the "
             f"links that carried more than {ACTIVE_SHARE:.0%} of their rate at some "
             f"point, at most the {MAX_LINKS} that carried the most.", ""]
    for entry in load_maps:
        name = entry.csv.relative_to(run_dir).as_posix()
        source = f"[{plain(name)}]({_link(name)})"
        if entry.label is not None:
            lines += [f"### {plain(entry.label)}", ""]
        if entry.error is not None:
            lines.append(f"**Not drawn:** {plain(entry.error)}")
        elif not entry.samples:
            lines.append(f"{source} holds no samples: the testbed closed within one "
                         f"sampling interval.")
        elif entry.png is None:
            lines.append(f"No link in {source} carried more than {ACTIVE_SHARE:.0%} of "
                         f"its rate: nothing to draw.")
        else:
            colour = ("the share of the link's emulated rate it carried (the rates of "
                      "the fabric and scale in result.json)" if entry.utilisation else
                      "emulated Mbit/s (the report does not know this testbed's link "
                      "rates)")
            interval = (f", every {entry.interval_s:.3g} s" if entry.interval_s
                        else "")
            picture = entry.png.relative_to(run_dir).as_posix()
            lines += [f"{entry.links_shown} of the {entry.links_total} links in {source} "
                      f"({entry.links_active} carried more than {ACTIVE_SHARE:.0%} of "
                      f"their rate), {entry.samples} samples{interval}; colour: "
                      f"{colour}.", "",
                      f"![{plain(picture)}]({_link(picture)})"]
        lines.append("")
    return lines[:-1]


def _web_section(result: dict, run_dir: Path) -> List[str]:
    """How to watch the run again in a browser, and the page as it was, where a
    test or a person saved it as ``web-view.png``; [] for a run with no events."""
    if not (run_dir / EVENTS_FILE).is_file():
        return []
    lines = [f"## {WEB_SECTION}", "",
             f"The web view was {'on' if result.get('web_view') else 'off'} during this run "
             "(a browser takes CPU from the machine). Replay the run in a browser, with a "
             f"time slider: `python -m emu.view {plain(run_dir.name)}` from the results "
             f"folder's parent (it reads [{EVENTS_FILE}]({EVENTS_FILE}) and the load.csv "
             "files).", ""]
    if (run_dir / WEB_SCREENSHOT).is_file():
        lines += [f"![The web view during the run]({WEB_SCREENSHOT})", ""]
    return lines


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
        lines.append("Other plots: " + ", ".join(f"[{plain(r)}]({_link(r)})"
                                                 for r in extra_plots))
        lines.append("")
    lines.append("Captures:" if captures else "Captures: none in the run folder.")
    lines += [f"- [{plain(r)}]({_link(r)}) ({format_quantity(size, 'B')})"
              for r, size in captures]
    lines += ["", "Other files:"]
    lines += [f"- [{plain(r)}]({_link(r)}) ({format_quantity(size, 'B')})"
              for r, size in others if r not in extra_plots]
    return lines


def _config_section(result: dict) -> List[str]:
    """The resolved configuration (``config``) as a JSON code block; [] without one."""
    config = result.get("config")
    if not config:
        return []
    # No value in it can end the fence early: json.dumps quotes every string and
    # escapes its line breaks, so each line it writes starts, after its indent, with
    # a quote, a bracket, a digit or a literal: never with the backticks of a fence.
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    return [f"## {CONFIG_SECTION}", "",
            f"The scenario as run, overrides included, as recorded under `config` in "
            f"[{RESULT_FILE}]({RESULT_FILE}):", "", "```json", text, "```"]


def render_markdown(result: dict, flows: Optional[List[FlowRow]], scale: Scale,
                    run_dir: Path, plots: List[Path],
                    load_maps: Sequence[LoadMap] = ()) -> str:
    """The text of report.md (``load_maps``: `emu.report.load_heatmap`'s, if any)."""
    title = f"# Run report: {plain(result['scenario'])}"
    lines = [title, ""]
    if result.get("description"):
        lines += [_paragraph(result["description"]), ""]
    if result.get("mode") == "model":
        lines += ["**Computed by the flow-level model, not emulated.** All figures "
                  "name their unit; *emulated* values are what the model predicts "
                  "for the testbed at its scale, *real* ones map them back to the "
                  "modelled fabric through the scale factors below.", ""]
    else:
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
                  f"{len(steps)} steps, {_seconds(total, scale)} in total"
                  f" (plot: [{STEPS_PNG}]({STEPS_PNG})).", ""]
    plots_section = _plots_section(plots)
    lines += plots_section + ([""] if plots_section else [])
    load_section = _load_section(load_maps, Path(run_dir))
    lines += load_section + ([""] if load_section else [])
    web_section = _web_section(result, Path(run_dir))
    lines += web_section + ([""] if web_section else [])
    lines += _flows_section(flows, scale) + [""]
    heat_maps = [entry.png for entry in load_maps if entry.png is not None]
    screenshot = Path(run_dir) / WEB_SCREENSHOT
    # The screenshot is left out of Files only where the Web view section shows it.
    embedded = bool(web_section) and screenshot.is_file()
    shown = plots + heat_maps + ([screenshot] if embedded else [])
    lines += _files_section(run_dir, shown) + [""]
    lines += _config_section(result)
    return "\n".join(lines).rstrip() + "\n"
