"""Read a run's ``result.json`` and ``flows.csv`` back, checking what the report needs.

Input: ``result.json``
----------------------
::

    {
      "scenario": str,                 # required; everything else is optional
      "description": str,
      "started": str,                  # ISO 8601
      "duration_s": float,             # emulated seconds
      "versions": {name: version},
      "datapath": "netdev" | "system",
      "scale": {"bw_factor": float, "tdf": float},          # see traffic.scale
      "fabric": {"spec": str, "hosts": int, "switches": int, "ocs": int,
                 "link_mbps": float},                        # emulated Mbit/s
      "config": {...},                 # the resolved scenario
      "metrics": {
        "<name>_<unit>": number,       # a headline scalar, e.g. "blackout_ms"
        "<name>": [{...}, ...],        # a table, one dict per row
        "<name>_<unit>": [number...],  # a list of values
        "<group>": {...}               # nested names print as "group.name"
      },
      "timeline": {
        "t0": float,                   # epoch s that t_rel_s counts from
        "series": [{"label": str,
                    "points": [[t_rel_s, mbps], ...]}],   # bin start, Mbit/s
        "dark_windows": [{"start": t_rel_s, "end": t_rel_s, "label": str}]
      },
      "steps": [{"label": str, "duration_s": float}],     # e.g. all-reduce steps
      "fidelity": {...},               # emu.fidelity.assess(), with "warnings"
      "warnings": [str]
    }

Metric keys name their unit by suffix (see ``emu.report.units``).  All times
in the timeline and in ``steps`` are emulated seconds.

Input: ``flows.csv``
--------------------
One row per flow, columns ``id, src, dst, bytes, start_s, end_s,
duration_s, goodput_mbps, retransmits, status`` (emulated bytes, seconds
since ``timeline.t0``, Mbit/s; ``status`` is e.g. ``ok`` or ``failed``).

Input: ``load.csv``
-------------------
The link load sampled from the switches' port counters while a testbed ran
(written by ``emu.live.loadlog``), in the run folder and/or, for a run that
opened one testbed per fabric, in ``<run>/<label>/``.  One row per direction
of a link with a switch end and sample, columns ``t, node, port, peer,
peer_port, bytes, mbps``: the sample's epoch time (s), the sending end
(``node:port``: a switch, an OCS or a host), what it is wired to, the bytes
that direction has carried so far and the emulated Mbit/s ``node`` sent
toward the peer since the previous sample.  Both directions are counted at
the switch end: a switch's side by its port's transmit counter, a host's
side (``node`` a host) by the receive counter of the switch port it sends
into.

Bad input raises ValueError (FileNotFoundError for a missing result.json)
naming the file, the key or column (or line), and what it must be.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from traffic.scale import Scale

RESULT_FILE = "result.json"
FLOWS_FILE = "flows.csv"
LOAD_FILE = "load.csv"

FLOW_COLUMNS = ("id", "src", "dst", "bytes", "start_s", "end_s", "duration_s",
                "goodput_mbps", "retransmits", "status")
# emu.live.loadlog.LOAD_COLUMNS, repeated: reports import nothing live.
LOAD_COLUMNS = ("t", "node", "port", "peer", "peer_port", "bytes", "mbps")


@dataclass(frozen=True)
class FlowRow:
    """One row of flows.csv (emulated bytes, seconds and Mbit/s)."""

    id: str
    src: str
    dst: str
    bytes: Optional[int]
    start_s: Optional[float]
    end_s: Optional[float]
    duration_s: Optional[float]
    goodput_mbps: Optional[float]
    retransmits: Optional[int]
    status: str


def _fail(path: Path, key: str, problem: str) -> ValueError:
    return ValueError(f"{path}: key '{key}' {problem}")


def load_result(run_dir) -> dict:
    """Read and check ``result.json``; errors name the file and the key."""
    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {RESULT_FILE} in {run_dir}: not a run folder?")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    except UnicodeDecodeError as error:     # its message named no file
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte "
                         f"{error.start})") from None
    if not isinstance(result, dict):
        raise ValueError(f"{path}: top level must be an object")
    if not isinstance(result.get("scenario"), str):
        raise _fail(path, "scenario", "must be a string naming the scenario")
    for key, kind in (("versions", dict), ("scale", dict), ("fabric", dict),
                      ("config", dict), ("metrics", dict), ("timeline", dict),
                      ("fidelity", dict), ("warnings", list), ("steps", list)):
        if key in result and result[key] is not None \
                and not isinstance(result[key], kind):
            raise _fail(path, key, f"must be a JSON {kind.__name__.replace('dict', 'object')}")
    timeline = result.get("timeline") or {}
    # Iterated below and by the plots: a number there failed as "not iterable".
    for key, value in (("timeline.series", timeline.get("series")),
                       ("timeline.dark_windows", timeline.get("dark_windows"))):
        if value is not None and not isinstance(value, list):
            raise _fail(path, key, "must be a JSON list")
    for index, series in enumerate(timeline.get("series") or []):
        if not isinstance(series, dict) or not isinstance(series.get("points"), list) \
                or not all(isinstance(point, list) and len(point) == 2
                           and all(_is_number(v) for v in point) for point in series["points"]):
            raise _fail(path, f"timeline.series[{index}]",
                        "must be an object with 'label' and 'points' [[t_rel_s, mbps], ...]")
    for index, window in enumerate(timeline.get("dark_windows") or []):
        if not isinstance(window, dict) or not all(
                isinstance(window.get(k), (int, float)) for k in ("start", "end")):
            raise _fail(path, f"timeline.dark_windows[{index}]",
                        "must be an object with numeric 'start' and 'end' (s)")
    for index, step in enumerate(result.get("steps") or []):
        if not isinstance(step, dict) or not isinstance(step.get("duration_s"), (int, float)):
            raise _fail(path, f"steps[{index}]",
                        "must be an object with 'label' and numeric 'duration_s'")
    return result


def _is_number(value) -> bool:
    """A finite JSON number (an infinite one left the plot's axis no limits)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def scale_of(result: dict, path: Path = Path(RESULT_FILE)) -> Scale:
    """The run's :class:`Scale` (identity if result.json has none)."""
    data = result.get("scale") or {}
    try:
        return Scale(bw_factor=data.get("bw_factor", 1.0), tdf=data.get("tdf", 1.0))
    except ValueError as error:
        raise _fail(path, "scale", str(error)) from None


def _number(text: str, kind, path: Path, row: int, column: str):
    text = text.strip()
    if text == "" or text.lower() in ("none", "null", "nan"):
        return None
    try:
        value = float(text)
        if not math.isfinite(value):    # "1e400" as an int was an OverflowError
            raise ValueError
        return kind(value) if kind is int else value
    except ValueError:
        raise ValueError(f"{path}: row {row}, column '{column}': "
                         f"{text!r} is not a finite number") from None


def load_flows(run_dir) -> Optional[List[FlowRow]]:
    """Rows of ``flows.csv``, or None if the run folder has none."""
    path = Path(run_dir) / FLOWS_FILE
    if not path.is_file():
        return None
    try:
        return _read_flows(path)
    except UnicodeDecodeError as error:     # these named no file
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte "
                         f"{error.start})") from None
    except csv.Error as error:
        raise ValueError(f"{path}: not CSV ({error})") from None


def _read_flows(path: Path) -> List[FlowRow]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in FLOW_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; "
                             f"expected {list(FLOW_COLUMNS)}")
        flows = []
        for row_number, row in enumerate(reader, start=2):
            short = [c for c in FLOW_COLUMNS if row[c] is None]
            if short:   # csv leaves the fields of a short row None: .strip() failed on them
                raise ValueError(f"{path}: row {row_number} has no value for column(s) "
                                 f"{short}")
            flows.append(FlowRow(
                id=row["id"], src=row["src"], dst=row["dst"],
                bytes=_number(row["bytes"], int, path, row_number, "bytes"),
                start_s=_number(row["start_s"], float, path, row_number, "start_s"),
                end_s=_number(row["end_s"], float, path, row_number, "end_s"),
                duration_s=_number(row["duration_s"], float, path, row_number,
                                   "duration_s"),
                goodput_mbps=_number(row["goodput_mbps"], float, path, row_number,
                                     "goodput_mbps"),
                retransmits=_number(row["retransmits"], int, path, row_number,
                                    "retransmits"),
                status=row["status"].strip()))
    return flows


@dataclass(frozen=True)
class LinkLoad:
    """One direction of a link (what ``node:port`` sends to ``peer``) over a run.

    ``node`` is the sending end: a switch, an OCS or, for what a host sends
    into its switch, the host.

    ``times`` are the samples' epoch seconds, each the end of the interval its
    rate in ``mbps`` (emulated Mbit/s) covers.
    """

    node: str
    port: int
    peer: str
    peer_port: int
    times: Tuple[float, ...]
    mbps: Tuple[float, ...]

    @property
    def label(self) -> str:
        return f"{self.node}:{self.port}->{self.peer}"


def _load_value(text: Optional[str], kind, where: str, column: str):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        kind_name = "an integer" if kind is int else "a number"
        raise ValueError(f"{where}, column '{column}': {text!r} is not {kind_name}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{where}, column '{column}': {text!r} is not a finite number")
    return value


def load_link_load(path, name: Optional[str] = None) -> List[LinkLoad]:
    """The links of one ``load.csv``, in the order the file first names them.

    Errors name the file (``name``, else ``path``) and the line.  A last line
    cut short (a run interrupted while it wrote) is left out, not an error.
    """
    path = Path(path)
    name = name or str(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            rows = [(reader.line_num, row) for row in reader]
    except UnicodeDecodeError as error:
        raise ValueError(f"{name}: not UTF-8 text ({error.reason} at byte "
                         f"{error.start})") from None
    except csv.Error as error:
        raise ValueError(f"{name}: line {reader.line_num}: {error}") from None
    if header is None:
        raise ValueError(f"{name}: line 1: empty file; expected the header "
                         f"{','.join(LOAD_COLUMNS)}")
    missing = [c for c in LOAD_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{name}: line 1: missing column(s) {missing}; "
                         f"expected {list(LOAD_COLUMNS)}")
    index = {column: header.index(column) for column in LOAD_COLUMNS}
    if rows and len(rows[-1][1]) < len(header):
        rows.pop()          # torn by an interrupted run: the samples before it stand
    series: Dict[Tuple[str, int, str, int], Tuple[List[float], List[float]]] = {}
    for line, row in rows:
        if not row:
            continue
        where = f"{name}: line {line}"
        if len(row) != len(header):
            raise ValueError(f"{where}: {len(row)} fields where the header has "
                             f"{len(header)}")
        field = {column: row[position] for column, position in index.items()}
        t = _load_value(field["t"], float, where, "t")
        port = _load_value(field["port"], int, where, "port")
        peer_port = _load_value(field["peer_port"], int, where, "peer_port")
        _load_value(field["bytes"], int, where, "bytes")
        mbps = _load_value(field["mbps"], float, where, "mbps")
        if mbps < 0:
            raise ValueError(f"{where}, column 'mbps': {mbps!r} is negative")
        if not field["node"] or not field["peer"]:
            raise ValueError(f"{where}: 'node' and 'peer' must name nodes")
        times, rates = series.setdefault((field["node"], port, field["peer"], peer_port),
                                         ([], []))
        times.append(t)
        rates.append(mbps)
    return [LinkLoad(node, port, peer, peer_port, tuple(times), tuple(rates))
            for (node, port, peer, peer_port), (times, rates) in series.items()]
