"""What the web view shows at one moment, folded from a run's events.

The live page and the replay of a finished run show the same thing: the state
of the run at a time ``t``, computed from the events of `emu.live.feed` up to
``t``.  Live, the events arrive as they happen; in a replay they are read back
from ``events.jsonl`` and ``load.csv``.  Nothing here knows about the browser:
`snapshot` returns plain JSON, which the page draws and the ``/data``
endpoint serves::

    events (testbed, load, circuit, link, phase, request, credits, warning)
        |  ViewState.add()
        v
    ViewState  --snapshot(t)-->  {"testbed", "nodes", "links", "circuits",
                                  "recent", "phase", "requests", "credits",
                                  "warnings", ...}

Nodes are placed by tier, the hop distance from the nearest host (hosts 0,
ToRs 1, aggregation or OCS above them ...), with networkx's multipartite
layout: every fabric gets the same reading, bottom to top, without a layout
of our own per fabric.
"""

from __future__ import annotations

import bisect
import csv
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import networkx as nx

from traffic.scale import Scale, format_quantity

# A circuit event stays listed this long after it happened, so that a dark
# window of 10 us is seen on a page that refreshes every 250 ms.
RECENT_S = 5.0
MIN_VISIBLE_S = 1.0
WARNINGS_SHOWN = 20
# A circuit's states in the table: lit, dark (torn, its ports dark) and this
# one, for a circuit whose ports are dark until it lights.
ABOUT_TO_LIGHT = "about to light"
TIER_OF_KIND = {"host": 0}


@dataclass
class Picture:
    """One testbed's fabric, laid out."""

    label: Optional[str]
    name: str
    scale: Scale
    dataplane: str
    nodes: List[dict]
    links: List[dict]
    circuits: Dict[str, set]
    technology: Dict[str, str]
    counts: Dict[str, int]
    port_peer: Dict[Tuple[str, int], Tuple[str, int]] = field(default_factory=dict)

    @classmethod
    def from_event(cls, event: dict) -> "Picture":
        fabric = event["fabric"]
        graph = nx.MultiGraph()
        kinds = {}
        for node in fabric["nodes"]:
            graph.add_node(node["name"])
            kinds[node["name"]] = node["kind"]
        for link in fabric["links"]:
            graph.add_edge(link["u"], link["v"])
        hosts = [n for n, k in kinds.items() if k == "host"]
        tiers = nx.multi_source_dijkstra_path_length(graph, hosts) if hosts else {}
        layers: Dict[int, List[str]] = {}
        for name in graph:
            graph.nodes[name]["tier"] = int(tiers.get(name, 0))
            layers.setdefault(graph.nodes[name]["tier"], []).append(name)
        # Each tier in the fabric's order, left to right (a subset_key naming
        # an attribute would group the nodes into sets, ordered by hash).
        positions = nx.multipartite_layout(graph, subset_key=layers, align="horizontal")
        nodes = [{"name": node["name"], "kind": node["kind"], "role": node.get("role", ""),
                  "tier": graph.nodes[node["name"]]["tier"],
                  "x": float(positions[node["name"]][0]),
                  "y": float(positions[node["name"]][1])}
                 for node in fabric["nodes"]]
        scale = Scale.from_dict(event.get("scale") or {})
        links, port_peer = [], {}
        for link in fabric["links"]:
            u, v = link["u"], link["v"]
            links.append({"a": u, "a_port": link["port_u"], "b": v, "b_port": link["port_v"],
                          "capacity_mbps": scale.emu_mbps(link["gbps"]),
                          "real_gbps": link["gbps"], "medium": link["medium"]})
            port_peer[(u, link["port_u"])] = (v, link["port_v"])
            port_peer[(v, link["port_v"])] = (u, link["port_u"])
        counts = {kind: sum(1 for k in kinds.values() if k == kind)
                  for kind in ("host", "eps", "ocs")}
        technology = {n["name"]: n.get("technology") for n in fabric["nodes"]
                      if n["kind"] == "ocs"}
        circuits = {ocs: {tuple(sorted(c)) for c in cs}
                    for ocs, cs in fabric.get("circuits", {}).items()}
        return cls(event.get("label"), fabric["name"], scale, event.get("dataplane", ""),
                   nodes, links, circuits, technology, counts, port_peer)


@dataclass
class _Reconfig:
    """One reconfiguration of one OCS, as its circuit events told it."""

    ocs: str
    started: float
    tear: List[tuple]
    light: List[tuple]
    delay_ms: float
    dark_from: Optional[float] = None
    dark_until: Optional[float] = None
    lit_at: Optional[float] = None
    dark_s: Optional[float] = None


class ViewState:
    """Every event of a run so far, and the picture of any moment of it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: List[dict] = []
        self._times: List[float] = []
        self.status = "running"

    # ------------------------------------------------------------ input
    def add(self, event: dict) -> None:
        with self._lock:
            at = bisect.bisect_right(self._times, event["t"])
            self._times.insert(at, event["t"])
            self._events.insert(at, event)

    def extend(self, events: Iterable[dict]) -> None:
        for event in events:
            self.add(event)

    @property
    def span(self) -> Tuple[float, float]:
        with self._lock:
            if not self._times:
                return 0.0, 0.0
            return self._times[0], self._times[-1]

    # ------------------------------------------------------------ output
    def snapshot(self, t: Optional[float] = None) -> dict:
        """The run as it stood at epoch time ``t`` (default: its latest event)."""
        with self._lock:
            end = len(self._events) if t is None else bisect.bisect_right(self._times, t)
            events = self._events[:end]
            first = self._times[0] if self._times else 0.0
        if t is None:
            t = events[-1]["t"] if events else 0.0
        return _fold(events, t, first, self.status)


def _fold(events: List[dict], t: float, first: float, status: str) -> dict:
    picture: Optional[Picture] = None
    # Only the latest load sample counts: it is kept, and turned into rates
    # once, after the fold (a long run holds thousands of samples).
    last_load: Optional[dict] = None
    reconfigs: Dict[str, _Reconfig] = {}
    recent: List[dict] = []
    phases: Dict[tuple, dict] = {}     # the phases running, by (iteration, name), as started
    iteration = None
    requests: Dict[str, dict] = {}
    done = failed = 0
    credits: Dict[str, dict] = {}
    warnings: List[str] = []
    cpu: Optional[dict] = None
    schedule: Optional[dict] = None
    for event in events:
        kind = event["kind"]
        if kind == "testbed":
            picture = Picture.from_event(event)
            reconfigs, requests, credits, phases = {}, {}, {}, {}
            last_load = iteration = schedule = None
        elif kind == "testbed-closed":
            picture = None
        elif kind == "load":
            last_load = event
        elif kind == "circuit" and picture is not None:
            _circuit(picture, reconfigs, recent, event)
        elif kind == "link":
            recent.append({"t": event["t"], "text": f"link {event['a']}-{event['b']} "
                                                    f"{'up' if event['up'] else 'down'}"})
        elif kind == "schedule":
            # The rotors' circuits change every slot, in the kernel, unannounced:
            # the page says the schedule runs rather than drawing stale circuits.
            schedule = None if event.get("stopped") else _schedule(event)
            recent.append({"t": event["t"], "text": "schedule stopped" if schedule is None
                           else f"schedule started: {schedule['text']}"})
        elif kind == "preset" and picture is not None:
            picture.technology[event["ocs"]] = event["technology"]
        elif kind == "iteration":
            iteration = event.get("iteration")
        elif kind == "phase":
            # The Train and Gen sides' phases overlap: one's end leaves the others running.
            key = (event.get("iteration"), event.get("name"))
            phases.pop(key, None)
            if event.get("state") == "start":
                phases[key] = dict(event)
        elif kind == "request":
            rid = str(event["id"])
            if event["state"] in ("done", "failed"):
                requests.pop(rid, None)
                done += event["state"] == "done"
                failed += event["state"] == "failed"
            else:
                requests[rid] = {"id": rid, "state": event["state"], "p": event.get("p"),
                                 "d": event.get("d"), "streams": event.get("streams", 0)}
        elif kind == "credits":
            credits[event["d"]] = {"used": event["used"], "total": event.get("total")}
        elif kind == "cpu":
            cpu = {"machine_pct": event.get("machine_pct"),
                   "softirq_pct": event.get("softirq_pct")}
        elif kind == "warning":
            warnings.append(event["text"])
        elif kind == "run":
            status = event.get("status", status)
    shown = [r for r in recent if t - r["t"] <= max(RECENT_S, MIN_VISIBLE_S)]
    return {
        "t": t, "elapsed_s": t - first, "status": status,
        "testbed": None if picture is None else _testbed(picture),
        "nodes": [] if picture is None else picture.nodes,
        "links": [] if picture is None else _links(picture, _rates(last_load), reconfigs, t),
        "load_t": None if last_load is None else last_load["t"],
        "circuits": [] if picture is None else _circuits(picture, reconfigs, t),
        "recent": [dict(r, age_s=t - r["t"]) for r in reversed(shown)],
        "phase": _phase(list(phases.values())[-1] if phases else None, iteration),
        "phases": [_phase(phase, iteration) for phase in phases.values()],
        "requests": {"in_flight": sorted(requests.values(), key=lambda r: r["id"]),
                     "done": done, "failed": failed},
        "credits": _credits(credits, requests),
        "warnings": warnings[-WARNINGS_SHOWN:],
        "cpu": cpu,
        "schedule": schedule,
    }


def _schedule(event: dict) -> dict:
    """A running cyclic schedule, as the page states it."""
    slot_ms = event.get("slot_emulated_s", 0.0) * 1000
    guard_ms = event.get("guard_emulated_s", 0.0) * 1000
    ocs = list(event.get("ocs") or [])
    text = (f"{', '.join(ocs)}: {event.get('slots')} slots of {slot_ms:g} ms, each dark "
            f"{guard_ms:g} ms first (duty {event.get('duty_cycle', 0.0):.2f})")
    return {"ocs": ocs, "slot_ms": slot_ms, "guard_ms": guard_ms, "text": text}


def _circuit(picture: Picture, reconfigs: Dict[str, _Reconfig], recent: List[dict],
             event: dict) -> None:
    ocs, step = event["ocs"], event["step"]
    if event.get("technology"):
        picture.technology[ocs] = event["technology"]
    as_pairs = lambda key: [tuple(sorted(c)) for c in event.get(key) or []]  # noqa: E731
    if step == "start":
        reconfigs[ocs] = _Reconfig(ocs, event["t"], as_pairs("tear"), as_pairs("light"),
                                   float(event.get("delay_ms") or 0.0))
        return
    current = reconfigs.get(ocs)
    if current is None:   # a watch that joined mid-reconfiguration
        current = reconfigs[ocs] = _Reconfig(ocs, event["t"], as_pairs("tear"),
                                             as_pairs("light"), 0.0)
    if step == "dark":
        current.dark_from, current.dark_until = event["t"], event.get("dark_until")
        for circuit in current.tear:
            picture.circuits.setdefault(ocs, set()).discard(circuit)
    elif step == "lit":
        current.lit_at = event["t"]
        picture.circuits.setdefault(ocs, set()).update(current.light)
    elif step == "done":
        current.dark_s = event.get("dark_s")
        dark_ms = (current.dark_s or 0.0) * 1e3
        real = picture.scale.real_seconds(current.dark_s or 0.0)
        recent.append({"t": event["t"], "ocs": ocs,
                       "text": f"{ocs}: tore {_pairs(current.tear)}, lit {_pairs(current.light)}"
                               f" after {dark_ms:.1f} ms dark "
                               f"({format_quantity(real, 's')} in the real fabric)"})
        del reconfigs[ocs]
    elif step == "failed":   # no "done" comes: its circuits are what the steps before left
        recent.append({"t": event["t"], "ocs": ocs,
                       "text": f"{ocs}: reconfiguration failed: {event.get('error', '?')}"})
        del reconfigs[ocs]


def _pairs(circuits) -> str:
    return ", ".join(f"{a}-{b}" for a, b in circuits) or "none"


def _testbed(picture: Picture) -> dict:
    rate = max((link["capacity_mbps"] for link in picture.links), default=0.0)
    return {"label": picture.label, "fabric": picture.name, "dataplane": picture.dataplane,
            "counts": picture.counts, "scale": picture.scale.to_dict(),
            "link_mbps": rate, "link_real_gbps": picture.scale.real_gbps(rate) if rate else 0,
            "technology": picture.technology}


def _rates(sample: Optional[dict]) -> Dict[Tuple[str, int], float]:
    """A load sample as {(node, port): Mbit/s that node:port sends}."""
    if sample is None:
        return {}
    return {(node, int(port)): float(mbps) for node, port, _peer, _peer_port, mbps
            in sample["links"]}


def _links(picture: Picture, load: Dict[Tuple[str, int], float],
           reconfigs: Dict[str, _Reconfig], t: float) -> List[dict]:
    states = _port_states(picture, reconfigs, t)
    rows = []
    for link in picture.links:
        forward = load.get((link["a"], link["a_port"]), 0.0)
        backward = load.get((link["b"], link["b_port"]), 0.0)
        busiest = max(forward, backward)
        capacity = link["capacity_mbps"] or 1.0
        circuit = states.get((link["a"], link["a_port"])) or \
            states.get((link["b"], link["b_port"]))
        rows.append(dict(link, mbps_ab=forward, mbps_ba=backward, mbps=busiest,
                         util=busiest / capacity, real_gbps_now=picture.scale.real_gbps(busiest),
                         circuit=circuit))
    return rows


def _port_states(picture: Picture, reconfigs: Dict[str, _Reconfig], t: float) -> dict:
    """OCS port -> "lit", "dark", "lighting" (about to light) or "idle"."""
    states = {}
    for ocs in picture.circuits:
        for port in _ocs_ports(picture, ocs):
            states[(ocs, port)] = "idle"
        for a, b in picture.circuits[ocs]:
            states[(ocs, a)] = states[(ocs, b)] = "lit"
    for ocs, reconfig in reconfigs.items():
        for a, b in reconfig.tear:
            if reconfig.dark_from is not None:
                states[(ocs, a)] = states[(ocs, b)] = "dark"
        for a, b in reconfig.light:
            if reconfig.lit_at is None:
                states[(ocs, a)] = states[(ocs, b)] = "lighting"
    return states


def _ocs_ports(picture: Picture, ocs: str) -> List[int]:
    return sorted(port for (node, port) in picture.port_peer if node == ocs)


def _circuits(picture: Picture, reconfigs: Dict[str, _Reconfig], t: float) -> List[dict]:
    rows = []
    for ocs in sorted(picture.circuits):
        reconfig = reconfigs.get(ocs)
        changing = set(reconfig.tear) | set(reconfig.light) if reconfig else set()
        for a, b in sorted(picture.circuits[ocs] - changing):
            rows.append(_circuit_row(picture, ocs, (a, b), "lit", ""))
        if reconfig is None:
            continue
        for circuit in reconfig.tear:
            if reconfig.dark_from is None:
                rows.append(_circuit_row(picture, ocs, circuit, "lit", "about to go dark"))
            else:
                rows.append(_circuit_row(picture, ocs, circuit, "dark", "torn"))
        for circuit in reconfig.light:
            if reconfig.lit_at is not None:
                rows.append(_circuit_row(picture, ocs, circuit, "lit", "just lit"))
                continue
            real = format_quantity(picture.scale.real_seconds(reconfig.delay_ms / 1e3), "s")
            note = f"lights {reconfig.delay_ms:.0f} ms after the tear ({real} real)"
            if reconfig.dark_until is not None:
                left = max(0.0, reconfig.dark_until - t)
                note = f"lights in {left * 1e3:.0f} ms of {reconfig.delay_ms:.0f} ({real} real)"
            rows.append(_circuit_row(picture, ocs, circuit, ABOUT_TO_LIGHT, note,
                                     remaining_s=None if reconfig.dark_until is None
                                     else max(0.0, reconfig.dark_until - t)))
    return rows


def _circuit_row(picture: Picture, ocs: str, circuit: tuple, state: str, note: str,
                 remaining_s: Optional[float] = None) -> dict:
    ends = [picture.port_peer.get((ocs, port), ("?", 0))[0] for port in circuit]
    return {"ocs": ocs, "a": circuit[0], "b": circuit[1], "ends": " - ".join(ends),
            "state": state, "note": note, "remaining_s": remaining_s,
            "technology": picture.technology.get(ocs) or ""}


def _phase(phase: Optional[dict], iteration) -> Optional[dict]:
    if phase is None:
        return None if iteration is None else {"name": None, "iteration": iteration}
    return {"name": phase.get("name"), "iteration": phase.get("iteration", iteration),
            "template": phase.get("template"), "circuits": phase.get("circuits"),
            "flows": phase.get("flows"), "since": phase["t"]}


def _credits(credits: Dict[str, dict], requests: Dict[str, dict]) -> List[dict]:
    streams: Dict[str, int] = {}
    for request in requests.values():
        d = request.get("d")
        if isinstance(d, list):
            d = d[0] if d else None
        if d is not None:
            streams[d] = streams.get(d, 0) + int(request.get("streams") or 0)
    names = sorted(set(credits) | set(streams))
    return [{"d": d, "used": credits.get(d, {}).get("used", 0),
             "total": credits.get(d, {}).get("total"), "streams": streams.get(d, 0)}
            for d in names]


# ------------------------------------------------------------ a finished run's files
def load_events(path: Path) -> List[dict]:
    """``load.csv`` (`emu.live.loadlog`) as the load events the live feed carried."""
    samples: Dict[str, Tuple[float, List[list]]] = {}
    try:
        with open(path, newline="", encoding="utf-8") as stream:
            reader = csv.DictReader(stream)
            missing = {"t", "node", "port", "peer", "peer_port", "mbps"} \
                - set(reader.fieldnames or [])
            if missing:
                raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
            for line, row in enumerate(reader, start=2):
                # The time is read here too: read after the loop, a bad one
                # failed without naming the file or the line.
                try:
                    t, sample = _load_sample(row)
                except (TypeError, ValueError):
                    raise ValueError(f"{path}: line {line} is not a load sample: "
                                     f"{row}") from None
                samples.setdefault(row["t"], (t, []))[1].append(sample)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: line {reader.line_num}: {exc}") from None
    return [{"kind": "load", "t": t, "links": links} for t, links in samples.values()]


def _load_sample(row: dict) -> Tuple[float, list]:
    """(time, [node, port, peer, peer_port, Mbit/s]) of a load.csv row; ValueError if
    a field is missing (a short row) or no finite number where one belongs."""
    if any(row.get(key) is None for key in ("t", "node", "port", "peer", "peer_port", "mbps")):
        raise ValueError("a field is missing")
    t, mbps = float(row["t"]), float(row["mbps"])
    if not (math.isfinite(t) and math.isfinite(mbps)):
        raise ValueError("not a finite number")
    return t, [row["node"], int(row["port"]), row["peer"], int(row["peer_port"]), mbps]
