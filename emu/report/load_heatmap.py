"""The link-load heat map: where the fabric was busy, and when, from a run's ``load.csv``.

Every emulated testbed samples its switches' port counters every 0.5 s into
``load.csv`` (``emu.live.loadlog``; format in ``emu.report.load``): the run
folder's own, and one in ``<run>/<label>/`` per testbed of a run that
compares fabrics.  Each becomes ``load_heatmap.png`` beside it:

* rows: one direction of a link, labelled ``node:port->peer`` (what ``node``
  sends toward its peer: a switch's side, or a host's side of its access
  link, ``h1:1->s1``), in the order the file names them; only the
  directions that carried more than 1 % of their link's rate in some
  sample, and of those the ``MAX_LINKS`` that carried the most bytes;
* columns: the sampling intervals, against seconds since the testbed's first
  sample (emulated);
* colour: the share of the link's emulated rate it carried, when the report
  can tell each link's rate (the run folder's own file, whose fabric
  ``result.json`` names by its spec and scale), else emulated Mbit/s (a
  labelled testbed's fabric and scale are its experiment's, not recorded).

:func:`write_load_heatmaps` returns one :class:`LoadMap` per ``load.csv``,
with the plot or the reason there is none (a file it could not read, naming
the line; no samples; no busy link), for ``emu.report.markdown`` to describe.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib
import numpy as np

from emu.report.load import LOAD_FILE, LinkLoad, load_link_load
from emu.report.plots import new_figure
from topologies import registry
from topologies.fabric import FabricError
from traffic.scale import Scale

HEATMAP_PNG = "load_heatmap.png"
# Rows shown at most: more would not leave a legible label per row.
MAX_LINKS = 40
# A link that never carried more than this share of its rate (or of the
# busiest link's peak, when rates are unknown) is left out as idle.
ACTIVE_SHARE = 0.01
# The width of the first column when the file holds a single sample time
# (the sampler's default interval): there is no earlier sample to measure from.
DEFAULT_INTERVAL_S = 0.5

# {(node, port): (peer, peer_port, emulated Mbit/s)}: each wired port's link and rate,
# a host's as well as a switch's (load.csv has a row for each side of a host link).
WiredRates = Dict[Tuple[str, int], Tuple[str, int, float]]


@dataclass
class LoadMap:
    """What the report has to say about one ``load.csv``."""

    label: Optional[str]                 # the testbed's label; None for the run's own
    csv: Path
    png: Optional[Path] = None           # the heat map, when one was drawn
    error: Optional[str] = None          # why the file could not be read
    links_total: int = 0                 # links the file names
    links_active: int = 0                # of those, the ones above ACTIVE_SHARE
    links_shown: int = 0                 # of those, the rows drawn (at most MAX_LINKS)
    samples: int = 0                     # sample times in the file
    interval_s: Optional[float] = None   # the median time between samples
    utilisation: bool = False            # colour is a share of each link's rate


def load_files(run_dir: Path) -> List[Tuple[Optional[str], Path]]:
    """``(label, path)`` of every load.csv: the run folder's own first, then by label."""
    run_dir = Path(run_dir)
    found = [(None, run_dir / LOAD_FILE)] if (run_dir / LOAD_FILE).is_file() else []
    found += [(path.parent.name, path) for path in sorted(run_dir.glob(f"*/{LOAD_FILE}"))
              if path.is_file()]
    return found


def configured_rates(result: dict, scale: Scale) -> Optional[WiredRates]:
    """``{(node, port): (peer, peer_port, emulated Mbit/s)}`` of the run's fabric.

    Both ends of every link, hosts' as well as switches' (a link's rate is
    the same either way).  Rebuilt from ``fabric.spec`` and the scale, as the
    runner built and shaped it; None when result.json names no fabric or its
    spec no longer builds.
    """
    spec = (result.get("fabric") or {}).get("spec")
    if not isinstance(spec, str) or "scale" not in result:
        return None
    try:
        fabric = registry.build(spec)
    except (FabricError, ValueError, TypeError, KeyError):
        return None          # a spec from another version of the code: plot Mbit/s
    rates = {}
    for a, b, data in fabric.links():
        mbps = scale.emu_mbps(data["gbps"])
        ports = data["ports"]
        rates[(a, ports[a])] = (b, ports[b], mbps)
        rates[(b, ports[b])] = (a, ports[a], mbps)
    return rates


def _rates_for(links: Sequence[LinkLoad],
               rates: Optional[WiredRates]) -> Optional[List[float]]:
    """Each link's emulated rate, or None unless the fabric wires every link as the file says."""
    if rates is None:
        return None
    found = []
    for link in links:
        wired = rates.get((link.node, link.port))
        if wired is None or wired[:2] != (link.peer, link.peer_port) or wired[2] <= 0:
            return None      # the file is not of this fabric: its rates would mislead
        found.append(wired[2])
    return found


def _time_edges(times: Sequence[float]) -> np.ndarray:
    """Column edges: each sample's interval ends at its time and starts at the previous one.

    The first interval's start is one interval before the first time (the
    baseline sample, which has no row of its own).
    """
    first_width = times[1] - times[0] if len(times) > 1 else DEFAULT_INTERVAL_S
    return np.concatenate(([times[0] - first_width], np.asarray(times, dtype=float)))


def load_matrix(links: Sequence[LinkLoad], times: Sequence[float]) -> np.ndarray:
    """Mbit/s as a (link, sample time) matrix; NaN where a link has no sample."""
    column = {t: index for index, t in enumerate(times)}
    matrix = np.full((len(links), len(times)), np.nan)
    for row, link in enumerate(links):
        for t, mbps in zip(link.times, link.mbps):
            matrix[row, column[t]] = mbps
    return matrix


def active_links(matrix: np.ndarray, link_rates: Optional[Sequence[float]]) -> np.ndarray:
    """Which links ever carried more than ACTIVE_SHARE of their rate (or, rates
    unknown, of the busiest link's peak)."""
    peaks = np.nan_to_num(matrix).max(axis=1, initial=0.0)
    if link_rates is not None:
        return peaks > ACTIVE_SHARE * np.asarray(link_rates)
    return peaks > ACTIVE_SHARE * peaks.max(initial=0.0)


def busiest(active: np.ndarray, matrix: np.ndarray, widths: np.ndarray) -> List[int]:
    """Rows worth drawing, in file order: the active links, at most the MAX_LINKS
    that carried the most bits (Mbit/s times each column's width)."""
    carried = np.nan_to_num(matrix) @ widths
    rows = [int(row) for row in np.flatnonzero(active)]
    if len(rows) > MAX_LINKS:
        rows = sorted(sorted(rows, key=lambda row: -carried[row])[:MAX_LINKS])
    return rows


def colour_values(matrix: np.ndarray, link_rates: Optional[Sequence[float]]
                  ) -> Tuple[np.ndarray, float, str]:
    """What the colours show: ``(values, top of the colour scale, its label)``.

    Percent of each link's rate when the rates are known, else Mbit/s up to
    the highest rate drawn.
    """
    if link_rates is not None:
        return (matrix / np.asarray(link_rates, dtype=float)[:, None] * 100.0, 100.0,
                "utilisation (% of the link's emulated rate)")
    peak = float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 0.0
    return matrix, peak or 1.0, "sent (Mbit/s, emulated)"


def plot_load_heatmap(title: str, links: Sequence[LinkLoad], matrix: np.ndarray,
                      edges: np.ndarray, link_rates: Optional[Sequence[float]],
                      path: Path) -> Path:
    """Draw ``matrix`` (Mbit/s, one row per link) as a heat map into ``path``."""
    values, top, label = colour_values(matrix, link_rates)
    figure = new_figure(10, max(3.0, 0.22 * len(links) + 1.6))
    axis = figure.add_subplot()
    # A link without a sample in an interval is light grey: unknown, not idle.
    palette = matplotlib.colormaps["viridis"].with_extremes(bad="0.9")
    colours = axis.pcolormesh(edges - edges[0], np.arange(len(links) + 1),
                              np.ma.masked_invalid(values), cmap=palette,
                              vmin=0.0, vmax=top, shading="flat")
    # Measured rates can pass 100 % a little (counters read a moment apart).
    over = link_rates is not None and bool(np.nanmax(values) > top)
    figure.colorbar(colours, ax=axis, label=label, extend="max" if over else "neither")
    axis.set_yticks(np.arange(len(links)) + 0.5, [link.label for link in links],
                    fontsize=7)
    axis.invert_yaxis()                    # the file's first link on top
    axis.set_xlabel("time since the first sample (s, emulated)")
    axis.set_title(title)
    figure.savefig(path)
    return path


def write_load_heatmap(result: dict, label: Optional[str], csv_path: Path, run_dir: Path,
                       rates: Optional[WiredRates]) -> LoadMap:
    """The heat map of one load.csv, written beside it (or why there is none)."""
    entry = LoadMap(label=label, csv=csv_path)
    try:
        links = load_link_load(csv_path, name=csv_path.relative_to(run_dir).as_posix())
    except ValueError as error:
        entry.error = str(error)
        return entry
    times = sorted({t for link in links for t in link.times})
    entry.links_total, entry.samples = len(links), len(times)
    if not times:
        return entry
    if len(times) > 1:
        entry.interval_s = statistics.median(np.diff(times))
    # Only the run's own testbed is the fabric result.json describes.
    link_rates = _rates_for(links, rates) if label is None else None
    entry.utilisation = link_rates is not None
    edges = _time_edges(times)
    matrix = load_matrix(links, times)
    active = active_links(matrix, link_rates)
    entry.links_active = int(active.sum())
    rows = busiest(active, matrix, np.diff(edges))
    entry.links_shown = len(rows)
    if not rows:
        return entry
    title = f"{result.get('scenario', 'run')}: link load over time"
    if label is not None:
        title += f" ({label})"
    entry.png = plot_load_heatmap(
        title, [links[row] for row in rows], matrix[rows], edges,
        None if link_rates is None else [link_rates[row] for row in rows],
        csv_path.parent / HEATMAP_PNG)
    return entry


def write_load_heatmaps(result: dict, run_dir: Path, scale: Scale) -> List[LoadMap]:
    """One :class:`LoadMap` per load.csv of the run folder; [] when it has none."""
    run_dir = Path(run_dir)
    files = load_files(run_dir)
    rates = configured_rates(result, scale) if any(label is None for label, _ in files) \
        else None
    return [write_load_heatmap(result, label, path, run_dir, rates) for label, path in files]
